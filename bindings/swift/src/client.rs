//! `Client`: an async client of a `phalanxd` cluster. The networking is phalanxd's own
//! client (`phalanx_host::client`: a core PBFT client node on its network and protocol
//! threads, request-number leases in its write-ahead log), driven from a thread of its
//! own; each Swift `await` waits on a one-shot channel that thread answers, so no async
//! runtime is involved and one implementation serves every platform.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use futures_channel::oneshot;
use phalanx_core::kv::{self, Reply};
use phalanx_host::client::{ClientError, ClusterClient};
use phalanx_host::config::ClusterFile;

use crate::errors::PhalanxError;

/// The result of a compare-and-swap: whether it wrote, and the value before.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct CasResult {
    pub swapped: bool,
    pub before: Option<Vec<u8>>,
}

/// A request for the client's thread.
struct Job {
    op: Vec<u8>,
    /// Evaluated without ordering (a read), or ordered.
    read: bool,
    reply: oneshot::Sender<Result<Vec<u8>, PhalanxError>>,
}

fn client_error(e: ClientError) -> PhalanxError {
    match e {
        ClientError::Timeout { .. } => PhalanxError::Timeout { message: e.to_string() },
        e => PhalanxError::Client { message: e.to_string() },
    }
}

/// A PBFT client of a `phalanxd` cluster, connected to every replica. A result stands
/// once a quorum of replicas agree on it (the core client decides). Requests from one
/// `Client` are carried out one after another, in the order they were made.
///
/// Request numbers: the core persists a lease on them before the first request leaves,
/// in phalanxd's write-ahead log in `dataDir` (by default `data/client-<id>` beside the
/// cluster file, where `phalanxd client` keeps them), so a restarted client never reuses
/// one.
#[derive(uniffi::Object)]
pub struct Client {
    id: u32,
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

#[uniffi::export]
impl Client {
    /// Client `id` (default: the file's first client) of the cluster in `clusterFile`;
    /// each request fails with `.timeout` after `timeoutSeconds` without a quorum.
    #[uniffi::constructor(default(id = None, data_dir = None, timeout_seconds = 10.0))]
    pub fn new(
        cluster_file: String,
        id: Option<u32>,
        data_dir: Option<String>,
        timeout_seconds: f64,
    ) -> Result<Self, PhalanxError> {
        let cluster = ClusterFile::load(Path::new(&cluster_file)).map_err(PhalanxError::config)?;
        let id = match id {
            Some(id) => id,
            None => *cluster.clients.first().ok_or_else(|| {
                PhalanxError::config(format!("{}: the cluster file lists no client", cluster.path.display()))
            })?,
        };
        let timeout = Duration::try_from_secs_f64(timeout_seconds)
            .map_err(|e| PhalanxError::config(format!("timeoutSeconds = {timeout_seconds}: {e}")))?;
        let client = ClusterClient::start(&cluster, id, data_dir.map(PathBuf::from))
            .map_err(|e| PhalanxError::Client { message: e.to_string() })?;
        let (jobs, queue) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name(format!("phalanx-client-{id}"))
            .spawn(move || serve(client, queue, timeout))
            .map_err(PhalanxError::io)?;
        Ok(Client { id, jobs: Mutex::new(Some(jobs)), thread: Mutex::new(Some(thread)) })
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    /// Orders `op` and returns its result.
    pub async fn execute(&self, op: Vec<u8>) -> Result<Vec<u8>, PhalanxError> {
        self.request(op, false).await
    }

    /// Evaluates the read-only `op` at the replicas without ordering it, and returns its
    /// result once a quorum agree (the core orders it instead if they do not).
    pub async fn read(&self, op: Vec<u8>) -> Result<Vec<u8>, PhalanxError> {
        self.request(op, true).await
    }

    /// Writes `value` at `key`; the value before (`nil`: absent).
    pub async fn put(&self, key: Vec<u8>, value: Vec<u8>) -> Result<Option<Vec<u8>>, PhalanxError> {
        value_of(self.execute(kv::put(&key, &value)).await?)
    }

    /// Reads `key` through the order (`nil`: absent).
    pub async fn get(&self, key: Vec<u8>) -> Result<Option<Vec<u8>>, PhalanxError> {
        value_of(self.execute(kv::get(&key)).await?)
    }

    /// Deletes `key`; the value before.
    pub async fn delete(&self, key: Vec<u8>) -> Result<Option<Vec<u8>>, PhalanxError> {
        value_of(self.execute(kv::delete(&key)).await?)
    }

    /// Writes `new` at `key` if the value there is `expected` (`nil`: absent).
    pub async fn cas(&self, key: Vec<u8>, expected: Option<Vec<u8>>, new: Vec<u8>) -> Result<CasResult, PhalanxError> {
        match decode(self.execute(kv::cas(&key, expected.as_deref(), &new)).await?)? {
            Reply::Cas { swapped, before } => Ok(CasResult { swapped, before }),
            other => Err(unexpected("cas", &other)),
        }
    }

    /// Stops the client's threads (also when the client goes away); requests after it
    /// fail with `.client`.
    pub fn close(&self) {
        drop(self.jobs.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

impl Client {
    async fn request(&self, op: Vec<u8>, read: bool) -> Result<Vec<u8>, PhalanxError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || PhalanxError::Client { message: format!("client {} is closed", self.id) };
        {
            let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
            jobs.as_ref().ok_or_else(stopped)?.send(Job { op, read, reply }).map_err(|_| stopped())?;
        }
        answer.await.map_err(|_| stopped())?
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.close();
    }
}

/// The client's thread: one request at a time, until the `Client` closes.
fn serve(mut client: ClusterClient, queue: mpsc::Receiver<Job>, timeout: Duration) {
    for job in queue {
        let result = if job.read { client.read(job.op, timeout) } else { client.execute(job.op, timeout) };
        // The caller may have stopped waiting; the result is then nobody's.
        let _ = job.reply.send(result.map_err(client_error));
    }
    if let Err(e) = client.stop() {
        eprintln!("phalanx client: its protocol thread failed: {e}");
    }
}

fn decode(result: Vec<u8>) -> Result<Reply, PhalanxError> {
    match Reply::decode(&result) {
        Ok(Reply::Invalid(why)) => {
            Err(PhalanxError::Kv { message: format!("the replicas rejected the operation: {why}") })
        }
        Ok(reply) => Ok(reply),
        Err(e) => Err(PhalanxError::Kv { message: format!("result does not decode: {e}") }),
    }
}

fn value_of(result: Vec<u8>) -> Result<Option<Vec<u8>>, PhalanxError> {
    match decode(result)? {
        Reply::Value(v) => Ok(v),
        other => Err(unexpected("value", &other)),
    }
}

fn unexpected(wanted: &str, got: &Reply) -> PhalanxError {
    PhalanxError::Kv { message: format!("expected a {wanted} result, got {got:?}") }
}
