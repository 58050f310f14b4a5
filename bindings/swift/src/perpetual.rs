//! Perpetual groups (seed 002) from Swift: replicated services calling replicated
//! services. A [`PerpetualMember`] is phalanxd's own member (`phalanx_host::runtime` on
//! its network and protocol threads, with `phalanx_host::perpetual`'s executor), running
//! a [`PerpetualService`] written in Swift, or the service its cluster file names.
//!
//! The service's `run` is called on the member's service thread and uses the seed's API
//! through [`PerpetualGroup`]: `invoke` returns an [`Invocation`] whose `get` blocks until
//! the group agreed on the call's outcome; `get(timeout)` and `cancel` only *request* an
//! abort; `nextResult` takes outcomes in agreement order; `nextRequest` and `sendResult`
//! serve. These calls block the service thread on purpose: the program runs in lock-step
//! with its member's agreed events (`phalanx_host::perpetual`'s "Determinism"), so it must
//! not wait on anything else — a Swift `Task`, a queue, a lock held across a call.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use phalanx_core::Protocol;
use phalanx_core::crypto::CryptoMode;
use phalanx_host::config::ClusterFile;
use phalanx_host::local_cluster::{LocalCluster, LocalSpec};
use phalanx_host::perpetual::{self, AbortPolicy, Group, Interrupted, Outcome};
use phalanx_host::runtime::{Running, ServiceOverride, StartOptions, start};

use crate::errors::PhalanxError;
use crate::host::ApplicationError;

/// Why a blocking call of [`PerpetualGroup`] or [`Invocation`] gave no value.
#[derive(Debug, PartialEq, Eq, uniffi::Error)]
pub enum CallError {
    /// The group agreed to abort the call.
    Aborted { call: u64 },
    /// The program's state is being replaced (a restore) or its member stops: let it
    /// propagate out of `run`.
    Interrupted,
    /// `run` threw something else (uniffi's report of an error it does not know).
    Failed { reason: String },
}

impl From<uniffi::UnexpectedUniFFICallbackError> for CallError {
    fn from(e: uniffi::UnexpectedUniFFICallbackError) -> Self {
        CallError::Failed { reason: e.reason }
    }
}

impl From<Interrupted> for CallError {
    fn from(_: Interrupted) -> Self {
        CallError::Interrupted
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Aborted { call } => write!(f, "call {call} was aborted"),
            CallError::Interrupted => f.write_str("the program is interrupted"),
            CallError::Failed { reason } => f.write_str(reason),
        }
    }
}

/// A deterministic service a Perpetual group runs, written in Swift; every member runs
/// its own copy.
#[uniffi::export(callback_interface)]
pub trait PerpetualService: Send + Sync {
    /// The program: runs until its work is done, or rethrows `CallError.Interrupted`.
    fn run(&self, group: Arc<PerpetualGroup>) -> Result<(), CallError>;
    /// Its state, taken while `run` waits in a `PerpetualGroup` call.
    fn snapshot(&self) -> Vec<u8>;
    /// Replaces its state with a snapshot (`run` is not running).
    fn restore(&self, state: Vec<u8>) -> Result<(), ApplicationError>;
}

/// The Swift service, as phalanxd's executor runs it.
struct Foreign(Box<dyn PerpetualService>);

impl perpetual::Service for Foreign {
    fn run(&self, group: &Group) -> Result<(), Interrupted> {
        match self.0.run(Arc::new(PerpetualGroup { group: group.clone() })) {
            Ok(()) => Ok(()),
            Err(CallError::Interrupted) => Err(Interrupted),
            // No tracing subscriber in a Swift program: say it where its author looks.
            Err(e) => {
                eprintln!("phalanx: the Swift service's program ended: {e}");
                Ok(())
            }
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        self.0.snapshot()
    }

    fn restore(&self, state: &[u8]) -> Result<(), String> {
        self.0.restore(state.to_vec()).map_err(|e| e.to_string())
    }
}

/// A request of another group, agreed by this one.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct IncomingCall {
    pub caller: u32,
    pub call: u64,
    pub op: Vec<u8>,
}

/// An outcome from `nextResult`: `reply` is `nil` if the group agreed to abort the call.
#[derive(Clone, Debug, PartialEq, Eq, uniffi::Record)]
pub struct CallOutcome {
    pub call: u64,
    pub reply: Option<Vec<u8>>,
}

/// The program's side of its member: the seed's API. Every call that waits blocks the
/// service thread and throws `CallError.Interrupted` when the program must stop.
#[derive(uniffi::Object)]
pub struct PerpetualGroup {
    group: Group,
}

/// A call made with `invoke`; its outcome is taken once, by `get` or `nextResult`.
#[derive(uniffi::Object)]
pub struct Invocation {
    group: Group,
    call: u64,
}

fn reply(call: u64, outcome: Outcome) -> Result<Vec<u8>, CallError> {
    match outcome {
        Outcome::Reply(r) => Ok(r),
        Outcome::Aborted => Err(CallError::Aborted { call }),
    }
}

/// `nil`: never; otherwise seconds (negative and NaN: at once; at most about 30 years).
fn policy(after_seconds: Option<f64>) -> AbortPolicy {
    after_seconds.map_or(AbortPolicy::Never, |s| AbortPolicy::After(seconds(s)))
}

fn seconds(s: f64) -> Duration {
    Duration::from_secs_f64(if s.is_nan() { 0.0 } else { s.clamp(0.0, 1e9) })
}

#[uniffi::export]
impl PerpetualGroup {
    /// Calls group `target` with `op`, under the abort policy set for `target` (or the
    /// group's). Blocks while the member's call window is full, until an outcome frees it.
    pub fn invoke(&self, target: u32, op: Vec<u8>) -> Result<Arc<Invocation>, CallError> {
        let call = self.group.invoke(target, op)?.call();
        Ok(self.invocation(call))
    }

    /// Calls group `target` with `op`, requesting an abort if it has no outcome after
    /// `abortAfterSeconds` (`nil`: never).
    pub fn invoke_with(
        &self,
        target: u32,
        op: Vec<u8>,
        abort_after_seconds: Option<f64>,
    ) -> Result<Arc<Invocation>, CallError> {
        let call = self.group.invoke_with(target, op, policy(abort_after_seconds))?.call();
        Ok(self.invocation(call))
    }

    /// `invoke`, then `get`.
    pub fn invoke_and_wait(&self, target: u32, op: Vec<u8>) -> Result<Vec<u8>, CallError> {
        self.invoke(target, op)?.get()
    }

    /// The next outcome in agreement order, of any call not taken yet.
    pub fn next_result(&self) -> Result<CallOutcome, CallError> {
        let (call, outcome) = self.group.next_result()?;
        let reply = match outcome {
            Outcome::Reply(r) => Some(r),
            Outcome::Aborted => None,
        };
        Ok(CallOutcome { call, reply })
    }

    /// A call made before this program's state was restored (see `undecided`), by id.
    pub fn invocation(&self, call: u64) -> Arc<Invocation> {
        Arc::new(Invocation { group: self.group.clone(), call })
    }

    /// The calls without an outcome yet, and their targets.
    pub fn undecided(&self) -> std::collections::HashMap<u64, u32> {
        self.group.undecided().into_iter().collect()
    }

    /// Request an abort of calls without an outcome `afterSeconds` after they were made
    /// (`nil`: never), for targets without a policy of their own.
    pub fn set_abort_policy(&self, after_seconds: Option<f64>) {
        self.group.set_abort_policy(policy(after_seconds));
    }

    /// The abort policy of calls to `target`.
    pub fn set_target_abort_policy(&self, target: u32, after_seconds: Option<f64>) {
        self.group.set_target_abort_policy(target, policy(after_seconds));
    }

    /// The next agreed request from another group.
    pub fn next_request(&self) -> Result<IncomingCall, CallError> {
        let r = self.group.next_request()?;
        Ok(IncomingCall { caller: r.caller, call: r.call, op: r.op })
    }

    /// Answers `request` (any time after `nextRequest` gave it).
    pub fn send_result(&self, request: IncomingCall, result: Vec<u8>) {
        let IncomingCall { caller, call, op } = request;
        self.group.send_result(&perpetual::Incoming { caller, call, op }, result);
    }
}

#[uniffi::export]
impl Invocation {
    /// The call's id (its member's call counter).
    pub fn call(&self) -> u64 {
        self.call
    }

    /// Waits for the agreed outcome: the reply, or `CallError.Aborted`.
    pub fn get(&self) -> Result<Vec<u8>, CallError> {
        reply(self.call, self.group.invocation(self.call).get()?)
    }

    /// Waits at least `seconds`, then requests an abort and waits for the agreed outcome,
    /// which may still be the reply.
    pub fn get_timeout(&self, seconds: f64) -> Result<Vec<u8>, CallError> {
        reply(self.call, self.group.invocation(self.call).get_timeout(self::seconds(seconds))?)
    }

    /// Requests an abort; `get` says what the group agreed.
    pub fn cancel(&self) {
        self.group.invocation(self.call).cancel();
    }
}

/// A member of a Perpetual group of a cluster file, hosted in this process as `phalanxd
/// run` hosts one: its network and protocol threads, its write-ahead log in the file's
/// `data_dir`, and `service` (`nil`: the service the file names for its group, so Swift
/// and native members can share a group). Stops when `stop` is called or it goes away.
#[derive(uniffi::Object)]
pub struct PerpetualMember {
    id: u32,
    group: u32,
    running: Mutex<Option<Running>>,
}

#[uniffi::export]
impl PerpetualMember {
    /// Starts member `id` of `clusterFile`; a `.config` error names the file and field.
    #[uniffi::constructor(default(service = None))]
    pub fn new(
        cluster_file: String,
        id: u32,
        service: Option<Box<dyn PerpetualService>>,
    ) -> Result<Arc<Self>, PhalanxError> {
        let cluster = ClusterFile::load(Path::new(&cluster_file)).map_err(PhalanxError::config)?;
        let Some((group, _)) = cluster.group_of(id) else {
            return Err(PhalanxError::config(format!(
                "{}: node {id} is not a member of a Perpetual group",
                cluster.path.display()
            )));
        };
        let service = service.map(|s| ServiceOverride(Arc::new(Foreign(s))));
        let running = start(&cluster, id, &StartOptions { service, ..StartOptions::default() })
            .map_err(|e| PhalanxError::Io { message: e.to_string() })?;
        Ok(Arc::new(PerpetualMember { id, group, running: Mutex::new(Some(running)) }))
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    /// Its group's index in the cluster file.
    pub fn group(&self) -> u32 {
        self.group
    }

    /// Stops the program (interrupted), the protocol and network threads; the protocol
    /// thread's error, if it failed. Stopping twice does nothing.
    pub fn stop(&self) -> Result<(), PhalanxError> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner()).take();
        running.map_or(Ok(()), |r| r.stop().map_err(|message| PhalanxError::Host { message }))
    }
}

impl Drop for PerpetualMember {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("phalanx: member {}: {e}", self.id);
        }
    }
}

/// Generates a Perpetual cluster file in `dir` (replaced) on loopback ports that are free
/// now, as `phalanxd keygen --protocol perpetual` does: groups of `groups[i]` members
/// (n = 3f+1, or 1), group 0 calling group 1. The file names a bank service for group 0
/// (`ops` increments then as many decrements, `parallel` in flight) and ledgers for the
/// others, which members started without a service of their own run. Returns the path of
/// `cluster.toml`.
#[uniffi::export(default(ops = 100, parallel = 1, real_crypto = false))]
pub fn keygen_perpetual(
    dir: String,
    groups: Vec<u32>,
    ops: u64,
    parallel: u32,
    real_crypto: bool,
) -> Result<String, PhalanxError> {
    let members: u32 = groups.iter().sum();
    if !(1..=u32::from(u16::MAX)).contains(&members) {
        return Err(PhalanxError::config(format!("groups {groups:?}: between 1 and 65535 members in all")));
    }
    let spec = LocalSpec {
        protocol: Protocol::Perpetual,
        groups,
        ops,
        parallel,
        clients: 0,
        crypto: if real_crypto { CryptoMode::Real } else { CryptoMode::InsecureTest },
        metrics: false,
        ..LocalSpec::default()
    };
    // The cluster's processes are never started here (hence no phalanxd), and its ports
    // are let go when it is dropped, for the members to bind.
    let cluster = LocalCluster::create(Path::new(&dir), &spec, Path::new("phalanxd")).map_err(PhalanxError::io)?;
    Ok(cluster.config_path().display().to_string())
}
