//! A client of a running cluster: a core PBFT client (or pub/sub publisher or
//! subscriber) node hosted in this process, connected to every replica. A result is
//! returned once f+1 replicas agree on it — the core decides that, not this code.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::mpsc::RecvTimeoutError;
use std::time::{Duration, Instant};

use phalanx_core::{Algorithm, Delivery, HandleError, NodeId, Request};

use crate::config::ClusterFile;
use crate::driver::{AppEvent, Event};
use crate::runtime::{self, Running, StartError, StartOptions};

#[derive(Debug)]
pub enum ClientError {
    /// No f+1 matching replies within the time allowed.
    Timeout { request: Option<u64>, waited: Duration },
    /// The core refused the request (too large, wrong role, …).
    Refused(HandleError),
    /// The client's protocol thread stopped.
    Stopped(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Timeout { request: Some(r), waited } => {
                write!(f, "request {r}: no f+1 matching replies after {waited:?} (is a quorum of replicas running?)")
            }
            ClientError::Timeout { request: None, waited } => write!(f, "nothing arrived within {waited:?}"),
            ClientError::Refused(e) => write!(f, "refused: {e}"),
            ClientError::Stopped(why) => write!(f, "the client stopped: {why}"),
        }
    }
}

impl std::error::Error for ClientError {}

pub struct ClusterClient {
    node: Running,
    /// Events that arrived while waiting for another one.
    stash: VecDeque<AppEvent>,
}

impl ClusterClient {
    /// Starts client `id` of the cluster; its storage (the request numbers it used, so a
    /// restarted client never reuses one) lives in `data_dir`, by default
    /// `data/client-<id>` beside the cluster file.
    pub fn start(cluster: &ClusterFile, id: NodeId, data_dir: Option<PathBuf>) -> Result<Self, StartError> {
        let data_dir = data_dir.unwrap_or_else(|| {
            cluster.path.parent().unwrap_or(std::path::Path::new(".")).join(format!("data/client-{id}"))
        });
        let opts = StartOptions { data_dir: Some(data_dir), ..StartOptions::default() };
        Ok(ClusterClient { node: runtime::start(cluster, id, &opts)?, stash: VecDeque::new() })
    }

    pub fn id(&self) -> NodeId {
        self.node.id
    }

    fn request(&self, request: Request) -> Result<(), ClientError> {
        self.node.events.send(Event::Request(request)).map_err(|_| ClientError::Stopped("protocol thread gone".into()))
    }

    fn recv(&mut self, deadline: Instant) -> Result<AppEvent, ClientError> {
        let wait = deadline.saturating_duration_since(Instant::now());
        match self.node.app_events.recv_timeout(wait) {
            Ok(e) => Ok(e),
            Err(RecvTimeoutError::Timeout) => Err(ClientError::Timeout { request: None, waited: wait }),
            Err(RecvTimeoutError::Disconnected) => Err(ClientError::Stopped("protocol thread gone".into())),
        }
    }

    /// Submits `op` without waiting for its result; its request number, or `Refused`
    /// (`Backpressure` when `client_queue` requests are outstanding).
    pub fn submit(&mut self, op: Vec<u8>) -> Result<u64, ClientError> {
        self.request(Request::Submit { op })?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.recv(deadline)? {
                AppEvent::Submitted { request } => return Ok(request),
                AppEvent::Refused(e) => return Err(ClientError::Refused(e)),
                other => self.stash.push_back(other),
            }
        }
    }

    /// The next completed request, waiting at most `timeout`.
    pub fn next_completion(&mut self, timeout: Duration) -> Result<(u64, Vec<u8>), ClientError> {
        if let Some(i) = self.stash.iter().position(|e| matches!(e, AppEvent::Completed { .. })) {
            let Some(AppEvent::Completed { request, result }) = self.stash.remove(i) else { unreachable!() };
            return Ok((request, result));
        }
        let deadline = Instant::now() + timeout;
        loop {
            match self.recv(deadline)? {
                AppEvent::Completed { request, result } => return Ok((request, result)),
                other => self.stash.push_back(other),
            }
        }
    }

    /// Orders `op` and returns its result once f+1 replicas agree.
    pub fn execute(&mut self, op: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, ClientError> {
        let started = Instant::now();
        let request = loop {
            match self.submit(op.clone()) {
                Err(ClientError::Refused(HandleError::Backpressure)) => {
                    let (r, result) = self.next_completion(timeout.saturating_sub(started.elapsed()))?;
                    self.stash.push_back(AppEvent::Completed { request: r, result });
                }
                other => break other?,
            }
        };
        loop {
            let left = timeout.saturating_sub(started.elapsed());
            match self.next_completion(left) {
                Ok((r, result)) if r == request => return Ok(result),
                Ok(_) => {}
                Err(ClientError::Timeout { .. }) => {
                    return Err(ClientError::Timeout { request: Some(request), waited: started.elapsed() });
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Publishes on a topic (pub/sub publishers).
    pub fn publish(&mut self, topic: u64, payload: Vec<u8>, algorithm: Algorithm) -> Result<(), ClientError> {
        self.request(Request::Publish { topic, payload, algorithm })?;
        Ok(())
    }

    /// The next delivery (pub/sub subscribers).
    pub fn next_delivery(&mut self, timeout: Duration) -> Result<Delivery, ClientError> {
        if let Some(i) = self.stash.iter().position(|e| matches!(e, AppEvent::Delivered(_))) {
            let Some(AppEvent::Delivered(d)) = self.stash.remove(i) else { unreachable!() };
            return Ok(d);
        }
        let deadline = Instant::now() + timeout;
        loop {
            match self.recv(deadline)? {
                AppEvent::Delivered(d) => return Ok(d),
                AppEvent::Refused(e) => return Err(ClientError::Refused(e)),
                other => self.stash.push_back(other),
            }
        }
    }

    pub fn stop(self) -> Result<(), String> {
        self.node.stop()
    }
}
