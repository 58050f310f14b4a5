//! A client of a running cluster: a core PBFT client (or pub/sub publisher or
//! subscriber) node hosted in this process, connected to every replica. A result is
//! returned once a quorum of replicas (2f+1 at n = 3f+1) agree on it — the core decides that, not this code.
//!
//! The node runs in a [`ClientLoop`] ([`event_loop`]): one of its own, or one shared
//! with any number of other clients' nodes ([`ClusterClient::start_on`]).

pub mod distill;
pub mod event_loop;

use std::collections::{BTreeSet, VecDeque};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use phalanx_core::{Algorithm, Delivery, HandleError, NodeId, Request};

use crate::config::ClusterFile;
use crate::driver::{AppEvent, Event};
use crate::runtime::{self, StartError, StartOptions};
pub use event_loop::{ClientLoop, Hosted, News, NewsTo};

#[derive(Debug)]
pub enum ClientError {
    /// No quorum of matching replies within the time allowed.
    Timeout { request: Option<u64>, waited: Duration },
    /// The core refused the request (too large, wrong role, …).
    Refused(HandleError),
    /// The client's node stopped (its storage failed, or its event loop went away).
    Stopped(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Timeout { request: Some(r), waited } => {
                write!(
                    f,
                    "request {r}: no quorum of matching replies after {waited:?} (is a quorum of replicas running?)"
                )
            }
            ClientError::Timeout { request: None, waited } => write!(f, "nothing arrived within {waited:?}"),
            ClientError::Refused(e) => write!(f, "refused: {e}"),
            ClientError::Stopped(why) => write!(f, "the client stopped: {why}"),
        }
    }
}

impl std::error::Error for ClientError {}

pub struct ClusterClient {
    node: Hosted,
    /// The node's news, a turn of its loop's in each message.
    news: Receiver<Vec<News>>,
    /// Why the node stopped, once it did.
    failed: Option<String>,
    /// What the node's rounds said and nobody has taken yet, by kind.
    submitted: VecDeque<(Range<u64>, Option<HandleError>)>,
    completions: VecDeque<(u64, Vec<u8>)>,
    /// Requests whose `execute` or `read` timed out: their results are dropped when they
    /// come, as nobody can take them. At most `client_queue`: each is outstanding in the
    /// core until then.
    abandoned: BTreeSet<u64>,
    deliveries: VecDeque<Delivery>,
    refusals: VecDeque<HandleError>,
}

impl ClusterClient {
    /// Starts client `id` of the cluster in an event loop of its own; see [`prepare`] for
    /// its storage.
    pub fn start(cluster: &ClusterFile, id: NodeId, data_dir: Option<PathBuf>) -> Result<Self, StartError> {
        let event_loop = ClientLoop::start(&format!("client-{id}"))
            .map_err(|source| StartError::Io { what: "starting the client event loop".into(), source })?;
        Self::start_on(&event_loop, cluster, id, data_dir)
    }

    /// Starts client `id` in `event_loop`, beside the clients it hosts already.
    pub fn start_on(
        event_loop: &Arc<ClientLoop>,
        cluster: &ClusterFile,
        id: NodeId,
        data_dir: Option<PathBuf>,
    ) -> Result<Self, StartError> {
        let (tx, news) = NewsTo::channel();
        let node = event_loop.add(prepare(cluster, id, data_dir)?, tx).map_err(StartError::Loop)?;
        // A distillation client reaches brokers over UDP, on a thread of its own.
        if let Some((udp, carries)) = crate::distill::udp_config(cluster, id, None, 0.0) {
            let inlet = node.inlet();
            let (_, divert) =
                crate::udp::spawn(udp, carries, node.metrics().clone(), move |frames| inlet.deliver(frames), None)
                    .map_err(|source| StartError::Io { what: format!("client {id}: UDP"), source })?;
            node.divert(divert).map_err(StartError::Loop)?;
        }
        Ok(ClusterClient {
            node,
            news,
            failed: None,
            submitted: VecDeque::new(),
            completions: VecDeque::new(),
            abandoned: BTreeSet::new(),
            deliveries: VecDeque::new(),
            refusals: VecDeque::new(),
        })
    }

    pub fn id(&self) -> NodeId {
        self.node.id()
    }

    fn request(&self, request: Request) -> Result<(), ClientError> {
        self.send(Event::Request(request))
    }

    fn send(&self, event: Event) -> Result<(), ClientError> {
        if let Some(why) = &self.failed {
            return Err(ClientError::Stopped(why.clone()));
        }
        self.node.send(event).map_err(ClientError::Stopped)
    }

    /// Waits until the node says something (at most until `deadline`, if any) and sorts
    /// what it said.
    fn receive(&mut self, deadline: Option<Instant>) -> Result<(), ClientError> {
        if let Some(why) = &self.failed {
            return Err(ClientError::Stopped(why.clone()));
        }
        let loop_gone = || ClientError::Stopped("the client event loop stopped".into());
        let batch = match deadline {
            Some(deadline) => {
                let wait = deadline.saturating_duration_since(Instant::now());
                self.news.recv_timeout(wait).map_err(|e| match e {
                    RecvTimeoutError::Timeout => ClientError::Timeout { request: None, waited: wait },
                    RecvTimeoutError::Disconnected => loop_gone(),
                })
            }
            None => self.news.recv().map_err(|_| loop_gone()),
        }?;
        for news in batch {
            self.sort(news)?;
        }
        Ok(())
    }

    /// Sorts what the node said in one round.
    fn sort(&mut self, news: News) -> Result<(), ClientError> {
        let events = match news.events {
            Ok(events) => events,
            Err(why) => {
                self.failed = Some(why.clone());
                return Err(ClientError::Stopped(why));
            }
        };
        for e in events {
            match e {
                AppEvent::Submitted { requests, refused } => self.submitted.push_back((requests, refused)),
                AppEvent::Completed { request, result } => {
                    if !self.abandoned.remove(&request) {
                        self.completions.push_back((request, result));
                    }
                }
                AppEvent::Delivered(d) => self.deliveries.push_back(d),
                AppEvent::Refused(e) => self.refusals.push_back(e),
            }
        }
        Ok(())
    }

    /// Submits `op` without waiting for its result; its request number, or `Refused`
    /// (`Backpressure` when `client_queue` requests are outstanding).
    pub fn submit(&mut self, op: Vec<u8>) -> Result<u64, ClientError> {
        let requests = self.submit_burst(vec![op])?;
        Ok(requests.start)
    }

    /// Submits the read-only `op` without waiting for its result (answered without
    /// ordering by a quorum of matching answers, or ordered if they differ).
    pub fn submit_read(&mut self, op: Vec<u8>) -> Result<u64, ClientError> {
        Ok(self.take(vec![Request::Read { op }])?.start)
    }

    /// Frames this client has written to replicas' connections so far: unchanged since a
    /// request was taken means nothing of it left this process.
    pub fn frames_sent(&self) -> u64 {
        self.node.metrics().frames_out_total()
    }

    /// Submits `ops` together, without waiting for their results: they leave as one
    /// message, as far as a batch holds them. Returns the numbers of the ops accepted, a
    /// prefix of `ops`: shorter once `client_queue` requests are outstanding
    /// (`Backpressure`), and `Refused` if the first op is refused for any reason.
    pub fn submit_burst(&mut self, ops: Vec<Vec<u8>>) -> Result<Range<u64>, ClientError> {
        self.take(ops.into_iter().map(|op| Request::Submit { op }).collect())
    }

    /// Hands `requests` to the core in one round; the numbers of those it accepted.
    ///
    /// Waits without a deadline: the node's round answers every submit, in order, with
    /// no need of the network, unless the node fails or its loop goes (which `receive`
    /// reports). A round slower than a deadline (a slow lease `fdatasync`, a busy shared
    /// loop) still accepts the requests, so giving up would leave its answer to the next
    /// submit, and report requests that will be sent as never taken.
    fn take(&mut self, requests: Vec<Request>) -> Result<Range<u64>, ClientError> {
        self.send(Event::Submit(requests))?;
        loop {
            match self.submitted.pop_front() {
                Some((requests, Some(e))) if requests.is_empty() => return Err(ClientError::Refused(e)),
                Some((requests, _)) => return Ok(requests),
                None => self.receive(None)?,
            }
        }
    }

    /// The next completed request, waiting at most `timeout`.
    pub fn next_completion(&mut self, timeout: Duration) -> Result<(u64, Vec<u8>), ClientError> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.completions.pop_front() {
                Some(c) => return Ok(c),
                None => self.receive(Some(deadline))?,
            }
        }
    }

    /// Every request completed so far, waiting at most `timeout` for the first.
    pub fn completions(&mut self, timeout: Duration) -> Result<Vec<(u64, Vec<u8>)>, ClientError> {
        if self.completions.is_empty() {
            let first = self.next_completion(timeout)?;
            self.completions.push_front(first);
        }
        Ok(self.completions.drain(..).collect())
    }

    /// Orders `op` and returns its result once a quorum of replicas agree. After a
    /// `Timeout` the outcome is unknown: the request may still be ordered (the core keeps
    /// retransmitting it), and its result is then dropped, not kept for `next_completion`.
    pub fn execute(&mut self, op: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, ClientError> {
        self.result_of(Request::Submit { op }, timeout)
    }

    /// Evaluates the read-only `op` without ordering it and returns its result once 2f+1
    /// replicas agree (ordered instead if they do not).
    pub fn read(&mut self, op: Vec<u8>, timeout: Duration) -> Result<Vec<u8>, ClientError> {
        self.result_of(Request::Read { op }, timeout)
    }

    /// Hands over one request, waiting for room if `client_queue` requests are
    /// outstanding, and waits for its result.
    fn result_of(&mut self, request: Request, timeout: Duration) -> Result<Vec<u8>, ClientError> {
        let started = Instant::now();
        let left = |started: Instant| timeout.saturating_sub(started.elapsed());
        let number = loop {
            match self.take(vec![request.clone()]) {
                // Wait for a completion to make room, and keep it for its taker.
                Err(ClientError::Refused(HandleError::Backpressure)) => {
                    let done = self.next_completion(left(started))?;
                    self.completions.push_back(done);
                }
                other => break other?.start,
            }
        };
        let deadline = started + timeout;
        loop {
            if let Some(i) = self.completions.iter().position(|(r, _)| *r == number) {
                return Ok(self.completions.remove(i).expect("found").1);
            }
            match self.receive(Some(deadline)) {
                Err(ClientError::Timeout { .. }) => {
                    self.abandoned.insert(number);
                    return Err(ClientError::Timeout { request: Some(number), waited: started.elapsed() });
                }
                other => other?,
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
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.refusals.pop_front() {
                return Err(ClientError::Refused(e));
            }
            match self.deliveries.pop_front() {
                Some(d) => return Ok(d),
                None => self.receive(Some(deadline))?,
            }
        }
    }

    /// Takes the node out of its loop; why it failed, if it did.
    pub fn stop(mut self) -> Result<(), String> {
        self.node.remove()?;
        // Everything the node said came before its removal was acknowledged.
        while let Ok(batch) = self.news.try_recv() {
            for why in batch.into_iter().filter_map(|news| news.events.err()) {
                self.failed = Some(why);
            }
        }
        self.failed.map_or(Ok(()), Err)
    }
}

/// Client `id`'s node, ready for a loop; its storage (the request numbers it used, so a
/// restarted client never reuses one) lives in `data_dir`, by default
/// `data/client-<id>` beside the cluster file.
pub fn prepare(cluster: &ClusterFile, id: NodeId, data_dir: Option<PathBuf>) -> Result<runtime::Prepared, StartError> {
    let data_dir = data_dir.unwrap_or_else(|| {
        cluster.path.parent().unwrap_or(std::path::Path::new(".")).join(format!("data/client-{id}"))
    });
    let opts = StartOptions { data_dir: Some(data_dir), ..StartOptions::default() };
    runtime::prepare(cluster, id, &opts)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::config::{KeygenOptions, keygen};
    use crate::net::Divert;

    /// Holds up the first round of the node that sends something, as a slow lease
    /// `fdatasync` or a busy shared event loop would, for 11 seconds. It carries no frames.
    struct Stall(AtomicBool);

    impl Divert for Stall {
        fn take(&self, frames: &mut Vec<(NodeId, Vec<u8>)>) {
            if !frames.is_empty() && !self.0.swap(true, Ordering::SeqCst) {
                std::thread::sleep(Duration::from_secs(11));
            }
        }

        fn shutdown(&self) {}
    }

    /// A submit whose round is slow gets its request number, and the next its own: one
    /// that gave up on its news after 10 seconds left it to the next submit, which took
    /// the previous op's number (every later op one behind, answered with its result).
    #[test]
    fn a_submit_in_a_slow_round_gets_its_own_request_number_and_so_does_the_next() {
        let dir = std::env::temp_dir().join(format!("phalanx-client-slow-round-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // Replica ports nothing listens on: the client's frames only wait for them.
        let (base_port, held) = crate::local_cluster::free_ports(4).expect("free loopback ports");
        drop(held);
        let opts = KeygenOptions { base_port, metrics_base_port: None, ..crate::config::tests::options(&dir) };
        let cluster = ClusterFile::load(&keygen(&opts).unwrap()).unwrap();
        let mut client = ClusterClient::start(&cluster, 4, Some(dir.join("client-4"))).unwrap();
        client.node.divert(Arc::new(Stall(AtomicBool::new(false)))).unwrap();
        // A fresh client numbers its requests from 1.
        assert_eq!(client.submit(b"op one".to_vec()).expect("accepted"), 1);
        assert_eq!(client.submit(b"op two".to_vec()).expect("accepted"), 2);
        let _ = client.stop();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
