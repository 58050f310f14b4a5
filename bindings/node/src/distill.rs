//! A client of a distillation deployment: phalanxd's own
//! [`phalanx_host::client::distill::DistillClient`] (what `phalanxd client submit` runs),
//! one of the generated directory's clients, submitting through the brokers over UDP.
//!
//! Its `submit` blocks until a broker hands back a certified delivery: about a second
//! through a live deployment, the whole timeout through a dead one. That is too long to
//! hold a thread of libuv's pool, which file system calls and the hosts' rounds share, so
//! each client has a thread of its own: it takes the submissions in the order they were
//! made, one at a time, and settles each one's Promise.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use napi::bindgen_prelude::*;
use napi::{JsDeferred, JsError};
use napi_derive::napi;
use phalanx_host::client::ClientError;
use phalanx_host::client::distill;
use phalanx_host::config::ClusterFile;
use phalanx_host::runtime::StartError;

use crate::convert::{Bytes, U64};
use crate::{Code, Result, fail};

/// Where a message was delivered: its batch's height, and the seq it was delivered with
/// (the client's own numbering, increasing).
#[napi(object)]
pub struct Delivered {
    #[napi(ts_type = "bigint")]
    pub height: U64,
    #[napi(ts_type = "bigint")]
    pub seq: U64,
}

/// What a Promise is settled with, made on the JavaScript thread.
type Resolver<T> = Box<dyn FnOnce(Env) -> napi::Result<T> + Send>;

/// A Promise the client's thread settles. One dropped unsettled (its job never ran: the
/// thread panicked) rejects, as a pending one would keep the event loop alive for ever.
struct Pending<T: ToNapiValue + Send + 'static>(Option<JsDeferred<T, Resolver<T>>>);

impl<T: ToNapiValue + Send + 'static> Pending<T> {
    fn new(env: &Env) -> Result<(Self, Object<'_>)> {
        let (deferred, promise) = env.create_deferred().map_err(|e| fail(Code::Host, e))?;
        Ok((Pending(Some(deferred)), promise))
    }

    /// Settles the Promise with `outcome` on the JavaScript thread. An error is made into
    /// a JavaScript error there, which napi rejects with as it is: its `code` is ours, as
    /// on errors thrown synchronously.
    fn settle(&mut self, outcome: Result<T>) {
        if let Some(deferred) = self.0.take() {
            deferred.resolve(Box::new(move |env| {
                outcome.map_err(|e| napi::Error::from(JsError::from(e).into_unknown(env)))
            }));
        }
    }
}

impl<T: ToNapiValue + Send + 'static> Drop for Pending<T> {
    fn drop(&mut self) {
        if self.0.is_some() {
            self.settle(Err(fail(Code::Host, "the distillation client's thread panicked")));
        }
    }
}

enum Job {
    Submit { message: Vec<u8>, timeout: Duration, done: Pending<Delivered> },
    Stop { done: Pending<()> },
}

fn start_error(e: StartError) -> napi::Error<Code> {
    let code = match e {
        StartError::Config(_) => Code::Config,
        StartError::Storage(_) => Code::Storage,
        StartError::Io { .. } => Code::Io,
        StartError::Engine(_) | StartError::Loop(_) => Code::Host,
    };
    fail(code, e)
}

fn client_error(e: ClientError) -> napi::Error<Code> {
    match e {
        ClientError::Timeout { .. } => fail(Code::Timeout, e),
        ClientError::Refused(refusal) => crate::handle_error(refusal),
        ClientError::Stopped(_) => fail(Code::Host, e),
    }
}

/// The client's thread: the submissions in order, then the stop.
fn serve(mut client: distill::DistillClient, jobs: mpsc::Receiver<Job>) {
    for job in jobs {
        match job {
            Job::Submit { message, timeout, mut done } => {
                let outcome = client.submit(message, timeout).map_err(client_error);
                done.settle(outcome.map(|d| Delivered { height: U64(d.height), seq: U64(d.seq) }));
            }
            Job::Stop { mut done } => return done.settle(client.stop().map_err(|why| fail(Code::Host, why))),
        }
    }
    // The JavaScript object was collected without `close()`.
    let _ = client.stop();
}

/// One client of a distillation deployment's generated directory, on a thread of its own
/// (see the module doc).
#[napi]
pub struct DistillClient {
    id: u32,
    index: u32,
    /// To the client's thread; `None` once `close` was called.
    jobs: Option<mpsc::Sender<Job>>,
}

#[napi]
impl DistillClient {
    /// Client `index` of the directory of the deployment in `cluster` (a `phalanxd keygen
    /// --protocol distill` cluster file). Its write-ahead log is in `dataDir`, by default
    /// `data/client-<id>` beside the cluster file, where `phalanxd client` keeps it.
    /// Throws `ConfigError` for a file that is not a distillation deployment's or an index
    /// outside its directory, `StorageError` for a log that cannot be opened.
    #[napi(factory)]
    pub fn start(cluster: String, index: u32, data_dir: Option<String>) -> Result<Self> {
        let file = ClusterFile::load(Path::new(&cluster)).map_err(|e| fail(Code::Config, e))?;
        let client = distill::DistillClient::start(&file, index, data_dir.map(PathBuf::from)).map_err(start_error)?;
        let (id, index) = (client.id(), client.index());
        let (jobs, taken) = mpsc::channel();
        thread::Builder::new()
            .name(format!("distill-client-{index}"))
            .spawn(move || serve(client, taken))
            .map_err(|e| fail(Code::Host, format!("client {index}: starting its thread: {e}")))?;
        Ok(DistillClient { id, index, jobs: Some(jobs) })
    }

    /// The client's node id (`2^31 + index`).
    #[napi(getter)]
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The directory index it signs as.
    #[napi(getter)]
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Submits `message` after the submissions made before it, and resolves to where it
    /// was delivered once a broker hands back a certified delivery; rejects with
    /// `TimeoutError` when none came within `timeoutMs` of its turn (the message may
    /// still be delivered: the client resubmits it through the next broker meanwhile).
    #[napi(ts_return_type = "Promise<Delivered>")]
    pub fn submit<'env>(
        &self,
        env: &'env Env,
        #[napi(ts_arg_type = "Uint8Array")] message: Bytes,
        timeout_ms: f64,
    ) -> Result<Object<'env>> {
        let timeout = Duration::try_from_secs_f64(timeout_ms / 1000.0)
            .map_err(|_| fail(Code::Type, format!("timeout: expected milliseconds, got {timeout_ms}")))?;
        let jobs = self.jobs()?;
        let (done, promise) = Pending::new(env)?;
        // A job the thread cannot take (it panicked) is dropped, which rejects its Promise.
        let _ = jobs.send(Job::Submit { message: message.0, timeout, done });
        Ok(promise)
    }

    /// Stops the client once the submissions made before have settled; later ones throw
    /// `HostError`.
    #[napi(ts_return_type = "Promise<void>")]
    pub fn close<'env>(&mut self, env: &'env Env) -> Result<Object<'env>> {
        let jobs = self.jobs.take().ok_or_else(|| self.closed())?;
        let (done, promise) = Pending::new(env)?;
        let _ = jobs.send(Job::Stop { done });
        Ok(promise)
    }

    fn jobs(&self) -> Result<&mpsc::Sender<Job>> {
        self.jobs.as_ref().ok_or_else(|| self.closed())
    }

    fn closed(&self) -> napi::Error<Code> {
        fail(Code::Host, format!("distillation client {}: closed", self.index))
    }
}
