//! The native half of `Client` and `Replica`: the core's host loop
//! ([`phalanx_core::host::HostLoop`]) with phalanxd's write-ahead log (or memory) as its
//! storage and, for a replica, the user's JavaScript object as its application.
//!
//! The event loop never waits on it: `run` takes a round of inputs and does the round
//! (recovery first, then the core, appends, the `fdatasync` before acknowledging,
//! BLS signing and verification) on the libuv thread pool, and resolves to the outputs
//! meant for the world. The application runs on the JavaScript thread: the round hands
//! each batch, snapshot, restore or query over through a thread-safe function and waits
//! for the answer, while the event loop goes on serving sockets and timers. JavaScript
//! runs one round at a time (inputs that arrive meanwhile make the next one, which
//! groups their syncs), and the functions it passes never throw (`lib/replica.js`).

use std::sync::{Arc, Mutex, mpsc};
use std::time::Instant;

use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;
use phalanx_core::host::{Application, HostError, HostLoop, MemoryStorage, NoApplication, Storage, drain};
use phalanx_core::wire::{self, Keyring, pb};
use phalanx_core::{Input as CoreInput, Nanos, Node as CoreNode, Operation as CoreOperation, Stats, Status};
use phalanx_host::config::Durability;
use phalanx_host::storage::{Recovery, Wal, WalStorage};
use prost::Message;

use crate::convert::{Bytes, U64, uint8_slice};
use crate::node::{Refusal, encode_outputs, input_batch, node_config, status_object};
use crate::{Code, Result, fail};

/// A JavaScript function the round calls and waits for.
type Hook<T, R> = ThreadsafeFunction<T, R, T, Status_, false, true>;
type Status_ = napi::Status;

/// A snapshot to restore, taken after batch `seq`.
#[napi(object)]
pub struct RestoreCall {
    #[napi(ts_type = "bigint")]
    pub seq: U64,
    #[napi(ts_type = "Buffer")]
    pub snapshot: Bytes,
}

/// A client's read-only op to evaluate.
#[napi(object)]
pub struct QueryCall {
    pub client: u32,
    #[napi(ts_type = "bigint")]
    pub request: U64,
    #[napi(ts_type = "Buffer")]
    pub op: Bytes,
}

/// Calls `hook` with `arg` from the round's thread and waits for its answer.
fn call<T: 'static + napi::bindgen_prelude::JsValuesTupleIntoVec, R: 'static + FromNapiValue + Send>(
    hook: &Hook<T, R>,
    arg: T,
) -> std::result::Result<R, String> {
    let (tx, rx) = mpsc::sync_channel(1);
    let status = hook.call_with_return_value(arg, ThreadsafeFunctionCallMode::Blocking, move |ret, _| {
        let _ = tx.send(ret.map_err(|e| e.reason.clone()));
        Ok(())
    });
    if status != napi::Status::Ok {
        return Err(format!("the application could not be called: {status}"));
    }
    rx.recv().map_err(|_| "the application did not answer (the environment is closing)".to_owned())?
}

/// The user's application, reached through thread-safe functions.
struct JsApp {
    /// Takes the batch as an encoded `execute` output's fields (`ExecuteOutput`).
    execute: Hook<Bytes, Vec<Bytes>>,
    snapshot: Hook<(), Bytes>,
    restore: Hook<RestoreCall, Option<String>>,
    /// `None` when the application answers no read (the client then has it ordered).
    query: Option<Hook<QueryCall, Option<Bytes>>>,
    /// Set when a call failed: the round then fails instead of going on with made-up
    /// results.
    failed: Arc<Mutex<Option<String>>>,
}

impl JsApp {
    fn failing<R>(&self, why: String, fallback: R) -> R {
        self.failed.lock().expect("not poisoned").get_or_insert(why);
        fallback
    }
}

impl Application for JsApp {
    fn execute(&mut self, seq: u64, ops: &[CoreOperation]) -> Vec<Vec<u8>> {
        let batch = pb::ExecuteOutput { seq, ops: ops.iter().map(pb::Operation::from).collect(), snapshot: false };
        match call(&self.execute, Bytes(batch.encode_to_vec())) {
            Ok(results) => results.into_iter().map(|b| b.0).collect(),
            Err(why) => self.failing(why, vec![Vec::new(); ops.len()]),
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        call(&self.snapshot, ()).map(|b| b.0).unwrap_or_else(|why| self.failing(why, Vec::new()))
    }

    fn restore(&mut self, seq: u64, snapshot: &[u8]) -> std::result::Result<(), String> {
        match call(&self.restore, RestoreCall { seq: U64(seq), snapshot: Bytes(snapshot.to_vec()) })? {
            None => Ok(()),
            Some(why) => Err(why),
        }
    }

    fn query(&self, op: &[u8]) -> Option<Vec<u8>> {
        // The client and request are not part of the trait, and the application does not
        // need them.
        let call_ = QueryCall { client: 0, request: U64(0), op: Bytes(op.to_vec()) };
        match call(self.query.as_ref()?, call_) {
            Ok(result) => result.map(|r| r.0),
            Err(why) => self.failing(why, None),
        }
    }
}

type Loop = HostLoop<CoreNode, Box<dyn Storage + Send>, Box<dyn Application + Send>>;

struct State {
    host: Loop,
    /// Why a call to the application failed, if one did (shared with [`JsApp`]).
    app_failed: Arc<Mutex<Option<String>>>,
    recovered: bool,
    /// Why an earlier round failed: the host stops for good.
    failed: Option<(Code, String)>,
}

/// An error of a round, for the JavaScript side to throw as its class.
#[napi(object)]
pub struct RoundError {
    pub code: String,
    pub message: String,
}

/// What a round did: the outputs meant for the world (sends, completions, deliveries,
/// faults) as an encoded `RoundRecord`, for each input the request number it got (a
/// client's accepted `submit` or `read`) or `null`, the inputs refused, the next deadline
/// on the host's clock, and the error that stopped the host, if one did.
#[napi(object)]
pub struct RoundResult {
    #[napi(ts_type = "Buffer")]
    pub outputs: Bytes,
    #[napi(ts_type = "Array<bigint | null>")]
    pub requests: Vec<Option<U64>>,
    pub refused: Vec<Refusal>,
    #[napi(ts_type = "bigint | null")]
    pub next_timeout: Option<U64>,
    pub error: Option<RoundError>,
}

pub struct RoundTask {
    state: Arc<Mutex<State>>,
    snapshot: Arc<Mutex<(Status, Stats)>>,
    inputs: Vec<CoreInput>,
    now: Nanos,
}

fn host_error(e: HostError) -> (Code, String) {
    let code = if matches!(e, HostError::Storage(_)) { Code::Storage } else { Code::Host };
    (code, e.to_string())
}

impl RoundTask {
    fn round(&mut self, st: &mut State) -> std::result::Result<RoundResult, (Code, String)> {
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        let now = self.now;
        if !st.recovered {
            st.host.recover(now).map_err(host_error)?;
            st.recovered = true;
        }
        let mut requests = Vec::with_capacity(self.inputs.len());
        let mut refused = Vec::new();
        for (i, input) in std::mem::take(&mut self.inputs).into_iter().enumerate() {
            let number = st.host.machine().next_request();
            match st.host.handle(now, input) {
                Ok(()) => requests.push(number.map(U64)),
                Err(e) => {
                    requests.push(None);
                    refused.push(Refusal::new(i, e));
                }
            }
        }
        let outputs = drain(&mut st.host, now).map_err(host_error)?;
        let next_timeout = st.host.poll_timeout().map(U64);
        let node = st.host.machine();
        *self.snapshot.lock().expect("not poisoned") = (node.status(), node.stats().clone());
        Ok(RoundResult { outputs: encode_outputs(outputs), requests, refused, next_timeout, error: None })
    }
}

impl Task for RoundTask {
    type Output = RoundResult;
    type JsValue = RoundResult;

    fn compute(&mut self) -> napi::Result<RoundResult> {
        let state = self.state.clone();
        let mut st = state.lock().expect("a round never panics holding the state");
        let result = self.round(&mut st);
        let app_failure = st.app_failed.lock().expect("not poisoned").clone();
        let result = match (result, app_failure) {
            (_, Some(why)) => Err((Code::Host, format!("the application failed: {why}"))),
            (r, None) => r,
        };
        Ok(result.unwrap_or_else(|(code, message)| {
            st.failed = Some((code, message.clone()));
            RoundResult {
                outputs: Bytes::default(),
                requests: Vec::new(),
                refused: Vec::new(),
                next_timeout: None,
                error: Some(RoundError { code: code.as_ref().to_owned(), message }),
            }
        }))
    }

    fn resolve(&mut self, _: Env, output: RoundResult) -> napi::Result<RoundResult> {
        Ok(output)
    }
}

/// The functions a replica's application is reached through (`lib/replica.js` makes them
/// from the user's object; they never throw).
#[napi(object)]
pub struct AppHooks<'env> {
    /// Takes the batch as an encoded `ExecuteOutput` (`lib/records.js` decodes it).
    #[napi(ts_type = "(batch: Buffer) => Array<Uint8Array>")]
    pub execute: Function<'env, Bytes, Vec<Bytes>>,
    #[napi(ts_type = "() => Uint8Array")]
    pub snapshot: Function<'env, (), Bytes>,
    /// Returns `null`, or why the snapshot was refused.
    #[napi(ts_type = "(call: RestoreCall) => string | null")]
    pub restore: Function<'env, RestoreCall, Option<String>>,
    /// Absent when the application answers no read.
    #[napi(ts_type = "(call: QueryCall) => Uint8Array | null")]
    pub query: Option<Function<'env, QueryCall, Option<Bytes>>>,
}

/// Where a host keeps the records its node persists.
#[napi(object)]
pub struct HostOptions {
    /// A directory for phalanxd's write-ahead log (`dir/wal.log`), synced before records
    /// are acknowledged and fed back on start; without it, records live in memory.
    pub storage: Option<String>,
    /// Truncate a damaged log at the damage instead of refusing it.
    pub repair: Option<bool>,
}

/// A node in its host loop, driven in rounds off the event loop (see the module doc).
#[napi]
pub struct Host {
    state: Arc<Mutex<State>>,
    snapshot: Arc<Mutex<(Status, Stats)>>,
    started: Instant,
    id: u32,
    role: &'static str,
    protocol: &'static str,
    replicas: Vec<u32>,
    call_window: u32,
    persistent: bool,
    /// The node's MAC keys, apart from the state a round holds locked, for `authentic`.
    keys: Keyring,
}

fn hook<T: 'static + napi::bindgen_prelude::JsValuesTupleIntoVec, R: 'static + FromNapiValue>(
    f: &Function<'_, T, R>,
) -> Result<Hook<T, R>> {
    f.build_threadsafe_function().weak::<true>().build().map_err(crate::napi_error)
}

#[napi]
impl Host {
    /// A host for the node `config`, with `app` for a PBFT replica (none for a client).
    /// Throws `ConfigError`, or `StorageError` for a log that cannot be opened.
    #[napi(constructor)]
    pub fn new(
        env: Env,
        #[napi(ts_arg_type = "Uint8Array")] config: Unknown,
        options: Option<HostOptions>,
        app: Option<AppHooks>,
    ) -> Result<Self> {
        let config = node_config(&env, config)?;
        let node = CoreNode::new(config).map_err(|e| fail(Code::Config, e))?;
        let options = options.unwrap_or(HostOptions { storage: None, repair: None });
        let storage: Box<dyn Storage + Send> = match &options.storage {
            Some(dir) => {
                let recovery = if options.repair.unwrap_or(false) { Recovery::Repair } else { Recovery::Strict };
                let (wal, recovered) =
                    Wal::open(std::path::Path::new(dir), recovery).map_err(|e| fail(Code::Storage, e))?;
                Box::new(WalStorage::new(wal, recovered, Durability::Sync))
            }
            None => Box::new(MemoryStorage::default()),
        };
        let app_failed = Arc::new(Mutex::new(None));
        let application: Box<dyn Application + Send> = match &app {
            Some(a) => Box::new(JsApp {
                execute: hook(&a.execute)?,
                snapshot: hook(&a.snapshot)?,
                restore: hook(&a.restore)?,
                query: a.query.as_ref().map(hook).transpose()?,
                failed: app_failed.clone(),
            }),
            None => Box::new(NoApplication),
        };
        let (id, role, protocol) = (node.id(), node.role().name(), node.config().cluster.protocol.name());
        let replicas = node.config().cluster.replicas().map(|n| n.id).collect();
        let call_window = node.config().cluster.params.call_window;
        let keys = node.config().keyring();
        let snapshot = Arc::new(Mutex::new((node.status(), node.stats().clone())));
        let host = HostLoop::new(node, storage, application);
        let state = State { host, app_failed, recovered: false, failed: None };
        Ok(Host {
            state: Arc::new(Mutex::new(state)),
            snapshot,
            started: Instant::now(),
            id,
            role,
            protocol,
            replicas,
            call_window,
            persistent: options.storage.is_some(),
            keys,
        })
    }

    /// Nanoseconds on the host's monotonic clock (the clock of `nextTimeout`).
    #[napi(ts_return_type = "bigint")]
    pub fn now(&self) -> U64 {
        U64(self.started.elapsed().as_nanos() as u64)
    }

    /// Runs one round with the inputs of an encoded `InputBatch` (fed in order at the
    /// current time of the host's clock: the batch's times are not used) on the thread
    /// pool. The first round recovers from the log first. One round at a time.
    #[napi(ts_return_type = "Promise<RoundResult>")]
    pub fn run(&self, env: Env, #[napi(ts_arg_type = "Uint8Array")] batch: Unknown) -> Result<AsyncTask<RoundTask>> {
        let inputs = input_batch(&env, batch)?.into_iter().map(|(_, input)| input).collect();
        Ok(AsyncTask::new(RoundTask {
            state: self.state.clone(),
            snapshot: self.snapshot.clone(),
            inputs,
            now: self.now().0,
        }))
    }

    /// Whether `frame` (one frame's bytes, without its length prefix) carries a valid MAC
    /// from node `sender` to this node (as `Node.authentic`), answered on the event loop
    /// even while a round runs.
    #[napi]
    pub fn authentic(&self, env: Env, sender: u32, #[napi(ts_arg_type = "Uint8Array")] frame: Unknown) -> Result<bool> {
        let bytes = unsafe { uint8_slice(env.raw(), frame.raw()) }.map_err(crate::napi_error)?;
        Ok(wire::authentic(&self.keys, sender, bytes))
    }

    /// A frame carrying nothing, with this node's MAC for node `to` (as `Node.proof`),
    /// made on the event loop even while a round runs. `null` without a key for `to`.
    #[napi(ts_return_type = "Buffer | null")]
    pub fn proof(&self, to: u32) -> Option<Bytes> {
        wire::proof(&self.keys, to).map(Bytes)
    }

    /// The node's gauges and counters after the last round (as `Node.status()`).
    #[napi(ts_return_type = "Record<string, bigint | boolean>")]
    pub fn status<'env>(&self, env: &'env Env) -> napi::Result<Object<'env>> {
        let (status, stats) = self.snapshot.lock().expect("not poisoned").clone();
        status_object(env, &status, &stats)
    }

    #[napi(getter)]
    pub fn id(&self) -> u32 {
        self.id
    }

    #[napi(getter)]
    pub fn role(&self) -> &'static str {
        self.role
    }

    #[napi(getter)]
    pub fn protocol(&self) -> &'static str {
        self.protocol
    }

    #[napi(getter)]
    pub fn replica_ids(&self) -> Vec<u32> {
        self.replicas.clone()
    }

    /// Perpetual: most undecided calls of a member's executor, oldest to newest.
    #[napi(getter)]
    pub fn call_window(&self) -> u32 {
        self.call_window
    }

    /// Whether records go to a write-ahead log.
    #[napi(getter)]
    pub fn persistent(&self) -> bool {
        self.persistent
    }
}
