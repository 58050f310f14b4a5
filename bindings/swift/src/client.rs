//! `Client`: an async client of a `phalanxd` cluster. The networking is phalanxd's own
//! client (`phalanx_host::client`: a core PBFT client node on its network and protocol
//! threads, request-number leases in its write-ahead log), driven from a thread of its
//! own ([`ClientThread`], which the distillation client shares); each Swift `await` waits
//! on a one-shot channel that thread answers, so no async runtime is involved and one
//! implementation serves every platform.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use futures_channel::oneshot;
use phalanx_core::kv::{self, Reply};
use phalanx_host::client::{ClientError, ClusterClient};
use phalanx_host::config::ClusterFile;
use phalanx_host::runtime::StartError;

use crate::errors::PhalanxError;

/// The result of a compare-and-swap: whether it wrote, and the value before.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct CasResult {
    pub swapped: bool,
    pub before: Option<Vec<u8>>,
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
    timeout: Duration,
    thread: ClientThread<ClusterClient>,
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
        let timeout = request_timeout(timeout_seconds)?;
        let client = ClusterClient::start(&cluster, id, data_dir.map(PathBuf::from)).map_err(start_error)?;
        let thread = ClientThread::start(format!("client {id}"), client, ClusterClient::stop)?;
        Ok(Client { id, timeout, thread })
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
        self.thread.close();
    }
}

impl Client {
    async fn request(&self, op: Vec<u8>, read: bool) -> Result<Vec<u8>, PhalanxError> {
        let timeout = self.timeout;
        self.thread
            .call(move |client| {
                if read { client.read(op, timeout) } else { client.execute(op, timeout) }.map_err(client_error)
            })
            .await
    }
}

/// A job for a client's thread.
type Job<C> = Box<dyn FnOnce(&mut C) + Send>;

/// A thread that owns a blocking client `C` and runs the calls made on it one at a
/// time, in the order made, until it is closed (or dropped); then it stops the client.
pub(crate) struct ClientThread<C> {
    /// The client, as errors name it ("client 4").
    name: String,
    jobs: Mutex<Option<mpsc::Sender<Job<C>>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl<C: Send + 'static> ClientThread<C> {
    pub(crate) fn start(
        name: String,
        mut client: C,
        stop: impl FnOnce(C) -> Result<(), String> + Send + 'static,
    ) -> Result<Self, PhalanxError> {
        let (jobs, queue) = mpsc::channel::<Job<C>>();
        let thread = std::thread::Builder::new()
            .name(format!("phalanx-{}", name.replace(' ', "-")))
            .spawn(move || {
                for job in queue {
                    job(&mut client);
                }
                if let Err(e) = stop(client) {
                    eprintln!("phalanx client: its protocol thread failed: {e}");
                }
            })
            .map_err(PhalanxError::io)?;
        Ok(ClientThread { name, jobs: Mutex::new(Some(jobs)), thread: Mutex::new(Some(thread)) })
    }

    /// Runs `call` on the client's thread and waits for its answer without blocking;
    /// fails with `.client` once the thread is closed.
    pub(crate) async fn call<R: Send + 'static>(
        &self,
        call: impl FnOnce(&mut C) -> Result<R, PhalanxError> + Send + 'static,
    ) -> Result<R, PhalanxError> {
        let (reply, answer) = oneshot::channel();
        let closed = || PhalanxError::Client { message: format!("{} is closed", self.name) };
        let job: Job<C> = Box::new(move |client| {
            // The caller may have stopped waiting; the result is then nobody's.
            let _ = reply.send(call(client));
        });
        {
            let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
            jobs.as_ref().ok_or_else(closed)?.send(job).map_err(|_| closed())?;
        }
        answer.await.map_err(|_| closed())?
    }
}

impl<C> ClientThread<C> {
    /// Lets the calls already made finish, then stops the client and its thread.
    pub(crate) fn close(&self) {
        drop(self.jobs.lock().unwrap_or_else(|p| p.into_inner()).take());
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

impl<C> Drop for ClientThread<C> {
    fn drop(&mut self) {
        self.close();
    }
}

/// `timeoutSeconds`, as a duration.
pub(crate) fn request_timeout(seconds: f64) -> Result<Duration, PhalanxError> {
    Duration::try_from_secs_f64(seconds).map_err(|e| PhalanxError::config(format!("timeoutSeconds = {seconds}: {e}")))
}

/// A client that could not start: its configuration (`.config`), or anything else.
pub(crate) fn start_error(e: StartError) -> PhalanxError {
    match e {
        StartError::Config(e) => PhalanxError::config(e),
        e => PhalanxError::Client { message: e.to_string() },
    }
}

pub(crate) fn client_error(e: ClientError) -> PhalanxError {
    match e {
        ClientError::Timeout { .. } => PhalanxError::Timeout { message: e.to_string() },
        e => PhalanxError::Client { message: e.to_string() },
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
