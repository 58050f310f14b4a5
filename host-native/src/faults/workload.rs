//! The suite's clients: each a [`ClusterClient`] on a thread of its own, invoking one
//! operation at a time on a few shared keys (put, get, ordered get, compare-and-swap,
//! delete) and recording when each was invoked and when it completed. An operation still
//! unanswered after the timeout is left pending (outcome unknown) and the client goes on;
//! if its answer comes later, it is recorded then.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use phalanx_core::kv::{self, Reply};
use phalanx_core::sim::Rng;
use phalanx_core::{HandleError, NodeId};

use super::linearizable::{Call, Operation, Return};
use crate::client::{ClientError, ClusterClient};
use crate::config::ClusterFile;

/// What a client asked for, as the report counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Put,
    Get,
    GetOrdered,
    Cas,
    Delete,
}

impl Kind {
    pub const ALL: [Kind; 5] = [Kind::Put, Kind::Get, Kind::GetOrdered, Kind::Cas, Kind::Delete];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Put => "put",
            Kind::Get => "get",
            Kind::GetOrdered => "get --ordered",
            Kind::Cas => "cas",
            Kind::Delete => "delete",
        }
    }

    /// Whether it may change the store (what the write outages are measured on).
    pub fn writes(self) -> bool {
        matches!(self, Kind::Put | Kind::Cas | Kind::Delete)
    }
}

/// One operation a client invoked.
#[derive(Clone, Debug)]
pub struct Record {
    pub client: NodeId,
    pub key: usize,
    pub kind: Kind,
    pub op: Operation,
}

/// The keys the clients share.
pub fn key(k: usize) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

/// What every client needs: the cluster, the clock, when to stop, and how long to wait.
#[derive(Clone)]
pub struct Setup {
    pub cluster: ClusterFile,
    pub dir: PathBuf,
    pub keys: usize,
    pub epoch: Instant,
    pub stop: Arc<AtomicBool>,
    /// How long a client waits for an answer before it leaves the operation pending.
    pub op_timeout: Duration,
    /// After `stop`: how long a client waits for its pending operations' answers.
    pub drain: Duration,
}

impl Setup {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

/// A client's operations in flight, by request number, as indices into its records.
struct Client<'a> {
    setup: &'a Setup,
    id: NodeId,
    client: ClusterClient,
    records: Vec<Record>,
    pending: BTreeMap<u64, usize>,
}

impl Client<'_> {
    fn start(setup: &Setup, id: NodeId) -> Result<Client<'_>, String> {
        let dir = setup.dir.join(format!("client-{id}"));
        let client = ClusterClient::start(&setup.cluster, id, Some(dir)).map_err(|e| format!("client {id}: {e}"))?;
        Ok(Client { setup, id, client, records: Vec::new(), pending: BTreeMap::new() })
    }

    /// Invokes `call` on key `key`; `None` when the client refused it (too many pending:
    /// then it was never sent, and is not recorded).
    fn invoke(&mut self, key: usize, kind: Kind, call: Call) -> Result<Option<u64>, String> {
        let k = self::key(key);
        let op = match &call {
            Call::Put(v) => kv::put(&k, v),
            Call::Get => kv::get(&k),
            Call::Delete => kv::delete(&k),
            Call::Cas { expected, new } => kv::cas(&k, expected.as_deref(), new),
        };
        let invoked = self.setup.now();
        let taken = if kind == Kind::Get { self.client.submit_read(op) } else { self.client.submit(op) };
        let request = match taken {
            Ok(request) => request,
            Err(ClientError::Refused(HandleError::Backpressure)) => return Ok(None),
            Err(e) => return Err(format!("client {}: {e}", self.id)),
        };
        self.pending.insert(request, self.records.len());
        let op = Operation { call, invoked, completed: None };
        self.records.push(Record { client: self.id, key, kind, op });
        Ok(Some(request))
    }

    /// Waits up to `timeout` for the next answer and records it; whether one came.
    fn absorb(&mut self, timeout: Duration) -> Result<bool, String> {
        let (request, result) = match self.client.next_completion(timeout) {
            Ok(done) => done,
            Err(ClientError::Timeout { .. }) => return Ok(false),
            Err(e) => return Err(format!("client {}: {e}", self.id)),
        };
        let at = self.setup.now();
        let Some(i) = self.pending.remove(&request) else { return Ok(true) };
        let record = &mut self.records[i];
        let ret = match (Reply::decode(&result), &record.op.call) {
            (Ok(Reply::Value(v)), Call::Put(_) | Call::Get | Call::Delete) => Return::Value(v),
            (Ok(Reply::Cas { swapped, before }), Call::Cas { .. }) => Return::Cas { swapped, before },
            (reply, call) => {
                return Err(format!("client {}: {call:?} on key {} was answered {reply:?}", self.id, record.key));
            }
        };
        record.op.completed = Some((at, ret));
        Ok(true)
    }

    /// Records answers while `waiting` holds of the pending operations, at most `patience`.
    fn absorb_while(
        &mut self,
        patience: Duration,
        waiting: impl Fn(&BTreeMap<u64, usize>) -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + patience;
        while waiting(&self.pending) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.absorb(left)? {
                break;
            }
        }
        Ok(())
    }

    /// Waits for `request`'s answer (recording any other that comes first), at most the
    /// operation timeout.
    fn wait_for(&mut self, request: u64) -> Result<(), String> {
        self.absorb_while(self.setup.op_timeout, |pending| pending.contains_key(&request))
    }

    /// Waits up to `patience` for every pending operation's answer.
    fn drain(&mut self, patience: Duration) -> Result<(), String> {
        self.absorb_while(patience, |pending| !pending.is_empty())
    }

    fn stop(self) -> Vec<Record> {
        let _ = self.client.stop();
        self.records
    }
}

/// Client `id`'s loop until `setup.stop`, with operations drawn from `seed`; its records.
pub fn run(setup: &Setup, id: NodeId, seed: u64) -> Result<Vec<Record>, String> {
    let mut rng = Rng::new(seed ^ (u64::from(id) << 32));
    let mut c = Client::start(setup, id)?;
    // The last value this client saw at each key: what its compare-and-swaps expect.
    let mut seen: BTreeMap<usize, Option<Vec<u8>>> = BTreeMap::new();
    let mut n = 0u64;
    while !setup.stop.load(Ordering::Relaxed) {
        let key = rng.below(setup.keys as u64) as usize;
        n += 1;
        let fresh = format!("c{id}.{n}").into_bytes();
        let (kind, call) = match rng.below(100) {
            0..30 => (Kind::Put, Call::Put(fresh)),
            30..55 => (Kind::Get, Call::Get),
            55..70 => (Kind::GetOrdered, Call::Get),
            70..90 => (Kind::Cas, Call::Cas { expected: seen.get(&key).cloned().flatten(), new: fresh }),
            _ => (Kind::Delete, Call::Delete),
        };
        let Some(request) = c.invoke(key, kind, call)? else {
            c.absorb(Duration::from_millis(200))?;
            continue;
        };
        c.wait_for(request)?;
        let Some(record) = c.records.last().filter(|r| r.op.completed.is_some()) else { continue };
        let now_at_key = match (&record.op.call, &record.op.completed) {
            (Call::Put(v), _) => Some(v.clone()),
            (Call::Get, Some((_, Return::Value(v)))) => v.clone(),
            (Call::Cas { new, .. }, Some((_, Return::Cas { swapped: true, .. }))) => Some(new.clone()),
            (Call::Cas { .. }, Some((_, Return::Cas { before, .. }))) => before.clone(),
            _ => None,
        };
        seen.insert(key, now_at_key);
    }
    c.drain(setup.drain)?;
    Ok(c.stop())
}

/// After the workload: one ordered get of every key by client `id`, recorded like the
/// others (what the store ended with, read back through consensus).
pub fn read_back(setup: &Setup, id: NodeId) -> Result<Vec<Record>, String> {
    let mut c = Client::start(setup, id)?;
    for key in 0..setup.keys {
        if let Some(request) = c.invoke(key, Kind::GetOrdered, Call::Get)? {
            c.wait_for(request)?;
        }
    }
    c.drain(setup.drain)?;
    Ok(c.stop())
}
