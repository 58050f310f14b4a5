//! Perpetual groups in phalanxd (seed 002): a member's executor is a program on a thread
//! of its own, written against the seed's API, [`Group`]. `invoke` returns an
//! [`Invocation`] whose `get` blocks until the group agreed on the call's outcome (a reply
//! or an abort); `get_timeout` and `cancel` only *request* an abort, as an abort policy
//! does; `next_result` takes outcomes in agreement order; `invoke_and_wait` is `invoke`
//! then `get`. Serving, `next_request` takes the next agreed request and `send_result`
//! answers it, now or after other work. There is no `is_done`: calls complete at different
//! real times at different members, so polling would split them.
//!
//! # Determinism
//! The program sees its member's agreed events only through these calls, and runs in
//! lock-step with them: the protocol thread hands it one event, then waits until the
//! program is blocked on something no event so far satisfies. What the program did — its
//! calls, results and state — is then a function of the events before, the same at every
//! correct member. That is what lets its member number its calls in the order it made
//! them, and take a checkpoint while it is blocked: its [`Service::snapshot`] with the
//! agreed events it has not taken yet. Only abort requests leave outside the lock-step (a
//! timeout is local; the group agrees on the outcome).
//!
//! A restore (state transfer, or a restart from a checkpoint) interrupts the program —
//! its blocking call returns `Err(Interrupted)`, which `run` passes on — replaces its
//! state and runs it again: a program resumes from what its state says, not from where its
//! thread was. A program must not hold a lock on its state across a [`Group`] call (the
//! snapshot takes it then), nor compute forever without one (its member waits for it).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use phalanx_core::{Event, Request};

use crate::config::ServiceSpec;
use crate::metrics::Metrics;

/// A blocking call of [`Group`] was interrupted: the program's state is being replaced
/// (or its member stops). Return it from [`Service::run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interrupted;

/// The agreed outcome of a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Reply(Vec<u8>),
    Aborted,
}

/// When to request an abort of a call that has no outcome yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AbortPolicy {
    /// Wait for the outcome however long it takes.
    #[default]
    Never,
    After(Duration),
}

/// A request of another group, agreed by this one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incoming {
    pub caller: u32,
    pub call: u64,
    pub op: Vec<u8>,
}

/// A deterministic service a Perpetual group runs; every member runs its own copy.
pub trait Service: Send + Sync + 'static {
    /// The program: runs until its work is done, or a [`Group`] call is interrupted.
    fn run(&self, group: &Group) -> Result<(), Interrupted>;
    /// Its state, taken while `run` waits in a [`Group`] call.
    fn snapshot(&self) -> Vec<u8>;
    /// Replaces its state with a snapshot (`run` is not running).
    fn restore(&self, state: &[u8]) -> Result<(), String>;
}

/// What the group agreed and the program has not consumed: part of every checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Agreed {
    next_call: u64,
    /// Calls without an outcome, and their targets.
    undecided: BTreeMap<u64, u32>,
    requests: VecDeque<Incoming>,
    /// Outcomes not taken yet, in agreement order.
    decided: VecDeque<(u64, Outcome)>,
}

struct Inner {
    agreed: Agreed,
    /// The program's requests, not yet handed to its member.
    asked: Vec<Request>,
    /// Events handed to the program, and of those, how many it had when it last blocked.
    delivered: u64,
    considered: u64,
    waiting: bool,
    running: bool,
    interrupted: bool,
    /// Most undecided calls, oldest to newest (the member's `call_window`).
    window: u64,
    policy: AbortPolicy,
    target_policy: BTreeMap<u32, AbortPolicy>,
    /// Local abort timers of undecided calls.
    abort_at: BTreeMap<u64, Instant>,
}

struct Shared {
    inner: Mutex<Inner>,
    changed: Condvar,
    /// Tells the protocol thread the program asked something outside the lock-step.
    wake: Box<dyn Fn() + Send + Sync>,
}

/// The program's side of its member: the seed's API.
#[derive(Clone)]
pub struct Group {
    shared: Arc<Shared>,
}

/// A call made with [`Group::invoke`]; its outcome is taken once, by `get` or
/// [`Group::next_result`].
#[derive(Debug, PartialEq, Eq)]
pub struct Invocation<'g> {
    group: &'g Group,
    call: u64,
}

impl Invocation<'_> {
    /// The call's id (its member's call counter).
    pub fn call(&self) -> u64 {
        self.call
    }

    /// Waits for the agreed outcome.
    pub fn get(self) -> Result<Outcome, Interrupted> {
        self.group.outcome(self.call, None)
    }

    /// Waits at least `timeout`, then requests an abort and waits for the agreed outcome
    /// (which may still be the reply).
    pub fn get_timeout(self, timeout: Duration) -> Result<Outcome, Interrupted> {
        self.group.outcome(self.call, Some(Instant::now() + timeout))
    }

    /// Requests an abort; the outcome is still agreed (`get` says which).
    pub fn cancel(&self) {
        self.group.ask(Request::Abort { call: self.call });
    }
}

impl PartialEq for Group {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl Eq for Group {}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Group")
    }
}

impl Group {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.shared.inner.lock().expect("perpetual group lock")
    }

    /// Blocks until `ready` gives something (`Ok(None)` once `deadline` passed first).
    fn wait<T>(
        &self,
        deadline: Option<Instant>,
        mut ready: impl FnMut(&mut Inner) -> Option<T>,
    ) -> Result<Option<T>, Interrupted> {
        let mut inner = self.lock();
        loop {
            if inner.interrupted {
                return Err(Interrupted);
            }
            if let Some(t) = ready(&mut inner) {
                return Ok(Some(t));
            }
            inner.waiting = true;
            inner.considered = inner.delivered;
            self.shared.changed.notify_all();
            inner = match deadline {
                None => self.shared.changed.wait(inner).expect("perpetual group lock"),
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        inner.waiting = false;
                        return Ok(None);
                    }
                    self.shared.changed.wait_timeout(inner, left).expect("perpetual group lock").0
                }
            };
            inner.waiting = false;
        }
    }

    /// Requests something outside the lock-step (an abort) and wakes the member.
    fn ask(&self, request: Request) {
        self.lock().asked.push(request);
        (self.shared.wake)();
    }

    fn outcome(&self, call: u64, deadline: Option<Instant>) -> Result<Outcome, Interrupted> {
        let take = |inner: &mut Inner| {
            let d = &mut inner.agreed.decided;
            match d.iter().position(|(c, _)| *c == call) {
                Some(i) => d.remove(i).map(|(_, o)| o),
                // Never made, or taken before: nothing will come.
                None if !inner.agreed.undecided.contains_key(&call) => Some(Outcome::Aborted),
                None => None,
            }
        };
        if let Some(outcome) = self.wait(deadline, take)? {
            return Ok(outcome);
        }
        self.ask(Request::Abort { call });
        Ok(self.wait(None, take)?.expect("no deadline"))
    }

    /// Calls group `target` with `op` under the abort policy set for it (or the default).
    /// Blocks while the member's call window is full, until an outcome frees it.
    pub fn invoke(&self, target: u32, op: Vec<u8>) -> Result<Invocation<'_>, Interrupted> {
        let policy = {
            let inner = self.lock();
            inner.target_policy.get(&target).copied().unwrap_or(inner.policy)
        };
        self.invoke_with(target, op, policy)
    }

    /// Calls group `target` with `op` under `policy`.
    pub fn invoke_with(&self, target: u32, op: Vec<u8>, policy: AbortPolicy) -> Result<Invocation<'_>, Interrupted> {
        let call = self
            .wait(None, |inner| {
                let a = &mut inner.agreed;
                let oldest = a.undecided.keys().next().copied().unwrap_or(a.next_call);
                (a.next_call - oldest < inner.window).then(|| {
                    let call = a.next_call;
                    a.next_call += 1;
                    a.undecided.insert(call, target);
                    call
                })
            })?
            .expect("no deadline");
        let mut inner = self.lock();
        if let AbortPolicy::After(after) = policy {
            inner.abort_at.insert(call, Instant::now() + after);
        }
        inner.asked.push(Request::Call { target, op });
        Ok(Invocation { group: self, call })
    }

    /// `invoke` and `get`.
    pub fn invoke_and_wait(&self, target: u32, op: Vec<u8>) -> Result<Outcome, Interrupted> {
        self.invoke(target, op)?.get()
    }

    /// The next outcome in agreement order, of any call not taken yet.
    pub fn next_result(&self) -> Result<(u64, Outcome), Interrupted> {
        Ok(self.wait(None, |inner| inner.agreed.decided.pop_front())?.expect("no deadline"))
    }

    /// A call made before this program's state was restored (or any other), by id.
    pub fn invocation(&self, call: u64) -> Invocation<'_> {
        Invocation { group: self, call }
    }

    /// The calls without an outcome yet, and their targets.
    pub fn undecided(&self) -> BTreeMap<u64, u32> {
        self.lock().agreed.undecided.clone()
    }

    /// The policy of calls to targets without one of their own.
    pub fn set_abort_policy(&self, policy: AbortPolicy) {
        self.lock().policy = policy;
    }

    /// The policy of calls to `target`.
    pub fn set_target_abort_policy(&self, target: u32, policy: AbortPolicy) {
        self.lock().target_policy.insert(target, policy);
    }

    /// The next agreed request from another group.
    pub fn next_request(&self) -> Result<Incoming, Interrupted> {
        Ok(self.wait(None, |inner| inner.agreed.requests.pop_front())?.expect("no deadline"))
    }

    /// Answers `request` (any time after `next_request` gave it).
    pub fn send_result(&self, request: &Incoming, result: Vec<u8>) {
        self.lock().asked.push(Request::Respond { caller: request.caller, call: request.call, result });
    }
}

/// The member's side: runs the program and hands it the agreed events.
pub struct Executor {
    service: Arc<dyn Service>,
    group: Group,
    thread: Option<JoinHandle<()>>,
}

impl Executor {
    /// `window`: the member's call window; `wake`: wakes the protocol thread.
    pub fn new(service: Arc<dyn Service>, window: u64, wake: Box<dyn Fn() + Send + Sync>) -> Self {
        let inner = Inner {
            agreed: Agreed { next_call: 1, ..Agreed::default() },
            asked: Vec::new(),
            delivered: 0,
            considered: 0,
            waiting: false,
            running: false,
            interrupted: false,
            window: window.max(1),
            policy: AbortPolicy::Never,
            target_policy: BTreeMap::new(),
            abort_at: BTreeMap::new(),
        };
        let shared = Arc::new(Shared { inner: Mutex::new(inner), changed: Condvar::new(), wake });
        Executor { service, group: Group { shared }, thread: None }
    }

    /// Runs the program from its initial state; its first calls are numbered from
    /// `next_call` (its member's).
    pub fn start(&mut self, next_call: u64) {
        self.group.lock().agreed.next_call = next_call;
        self.spawn();
    }

    fn spawn(&mut self) {
        let (service, group) = (self.service.clone(), self.group.clone());
        self.group.lock().running = true;
        let thread = std::thread::Builder::new().name("perpetual-service".into()).spawn(move || {
            // Running stays true until the program is out, even if it panicked.
            struct Out(Group);
            impl Drop for Out {
                fn drop(&mut self) {
                    self.0.lock().running = false;
                    self.0.shared.changed.notify_all();
                }
            }
            let out = Out(group);
            match service.run(&out.0) {
                Ok(()) => tracing::info!("the service's program finished"),
                Err(Interrupted) => tracing::debug!("the service's program was interrupted"),
            }
        });
        match thread {
            Ok(t) => self.thread = Some(t),
            Err(e) => {
                tracing::error!("cannot start the service's thread: {e}");
                self.group.lock().running = false;
            }
        }
        drop(self.settled());
    }

    /// Waits until the program is blocked on something no event so far satisfies, or out.
    fn settled(&self) -> MutexGuard<'_, Inner> {
        let mut inner = self.group.lock();
        while inner.running && !(inner.waiting && inner.considered == inner.delivered) {
            inner = self.group.shared.changed.wait(inner).expect("perpetual group lock");
        }
        inner
    }

    /// Stops the program (it is interrupted) and waits until it is out.
    fn stop(&mut self) {
        self.group.lock().interrupted = true;
        self.group.shared.changed.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.group.lock().interrupted = false;
    }

    /// Hands the program one agreed event and waits until it settled; what it asked.
    pub fn deliver(&mut self, event: Event) -> Vec<Request> {
        match event {
            Event::Checkpoint { seq } => {
                let inner = self.settled();
                let state = encode(&inner.agreed, &self.service.snapshot());
                drop(inner);
                let mut asked = self.asked();
                asked.push(Request::Snapshot { seq, state });
                return asked;
            }
            Event::Restore { seq, state } => {
                let Some((agreed, service)) = decode(&state) else {
                    tracing::error!("the state certified at checkpoint {seq} does not decode: not restored");
                    return self.asked();
                };
                self.stop();
                if let Err(e) = self.service.restore(service) {
                    tracing::error!("the service refused the state certified at checkpoint {seq}: {e}");
                }
                {
                    let mut inner = self.group.lock();
                    inner.asked.clear();
                    inner.abort_at.clear();
                    inner.agreed = agreed;
                }
                tracing::info!("restored the service's state of checkpoint {seq}");
                self.spawn();
                return self.asked();
            }
            Event::Request { caller, call, op } => {
                self.group.lock().agreed.requests.push_back(Incoming { caller, call, op });
            }
            Event::Reply { call, result } => self.decided(call, Outcome::Reply(result)),
            Event::Aborted { call } => self.decided(call, Outcome::Aborted),
        }
        self.group.lock().delivered += 1;
        self.group.shared.changed.notify_all();
        drop(self.settled());
        self.asked()
    }

    fn decided(&mut self, call: u64, outcome: Outcome) {
        let mut inner = self.group.lock();
        if inner.agreed.undecided.remove(&call).is_some() {
            inner.abort_at.remove(&call);
            inner.agreed.decided.push_back((call, outcome));
        }
    }

    /// What the program asked since last taken, with aborts of calls whose policy's time
    /// is up.
    pub fn asked(&mut self) -> Vec<Request> {
        let mut inner = self.group.lock();
        let now = Instant::now();
        let due: Vec<u64> = inner.abort_at.iter().filter(|(_, at)| **at <= now).map(|(c, _)| *c).collect();
        for call in due {
            inner.abort_at.remove(&call);
            inner.asked.push(Request::Abort { call });
        }
        std::mem::take(&mut inner.asked)
    }

    /// When the next abort policy's time is up.
    pub fn deadline(&self) -> Option<Instant> {
        self.group.lock().abort_at.values().min().copied()
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A checkpoint's executor state: what the group agreed and the program had not taken,
/// then the service's own snapshot.
fn encode(a: &Agreed, service: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let bytes = |out: &mut Vec<u8>, b: &[u8]| {
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
    };
    out.extend_from_slice(&a.next_call.to_le_bytes());
    out.extend_from_slice(&(a.undecided.len() as u32).to_le_bytes());
    for (call, target) in &a.undecided {
        out.extend_from_slice(&call.to_le_bytes());
        out.extend_from_slice(&target.to_le_bytes());
    }
    out.extend_from_slice(&(a.requests.len() as u32).to_le_bytes());
    for r in &a.requests {
        out.extend_from_slice(&r.caller.to_le_bytes());
        out.extend_from_slice(&r.call.to_le_bytes());
        bytes(&mut out, &r.op);
    }
    out.extend_from_slice(&(a.decided.len() as u32).to_le_bytes());
    for (call, outcome) in &a.decided {
        out.extend_from_slice(&call.to_le_bytes());
        match outcome {
            Outcome::Reply(result) => {
                out.push(1);
                bytes(&mut out, result);
            }
            Outcome::Aborted => out.push(0),
        }
    }
    out.extend_from_slice(service);
    out
}

/// Reads what [`encode`] wrote; `None` if it is not that.
fn decode(mut b: &[u8]) -> Option<(Agreed, &[u8])> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = b.split_at_checked(n)?;
        *b = rest;
        Some(head)
    }
    let u32_ = |b: &mut &[u8]| take(b, 4).map(|h| u32::from_le_bytes(h.try_into().expect("4 bytes")));
    let u64_ = |b: &mut &[u8]| take(b, 8).map(|h| u64::from_le_bytes(h.try_into().expect("8 bytes")));
    let bytes = |b: &mut &[u8]| {
        let n = u32_(b)? as usize;
        take(b, n).map(<[u8]>::to_vec)
    };
    let mut a = Agreed { next_call: u64_(&mut b)?, ..Agreed::default() };
    for _ in 0..u32_(&mut b)? {
        a.undecided.insert(u64_(&mut b)?, u32_(&mut b)?);
    }
    for _ in 0..u32_(&mut b)? {
        a.requests.push_back(Incoming { caller: u32_(&mut b)?, call: u64_(&mut b)?, op: bytes(&mut b)? });
    }
    for _ in 0..u32_(&mut b)? {
        let call = u64_(&mut b)?;
        let outcome = match take(&mut b, 1)?[0] {
            1 => Outcome::Reply(bytes(&mut b)?),
            0 => Outcome::Aborted,
            _ => return None,
        };
        a.decided.push_back((call, outcome));
    }
    Some((a, b))
}

fn i64_of(bytes: &[u8]) -> Option<i64> {
    bytes.try_into().ok().map(i64::from_le_bytes)
}

/// Holds a balance: each request's op is an amount (i64, little-endian) added to it, and
/// the answer is the new balance. A malformed op adds nothing.
pub struct Ledger {
    balance: Mutex<i64>,
    metrics: Arc<Metrics>,
}

impl Service for Ledger {
    fn run(&self, group: &Group) -> Result<(), Interrupted> {
        loop {
            let request = group.next_request()?;
            let balance = {
                let mut b = self.balance.lock().expect("ledger lock");
                *b = b.wrapping_add(i64_of(&request.op).unwrap_or(0));
                *b
            };
            self.metrics.service.served.fetch_add(1, Relaxed);
            self.metrics.service.value.store(balance, Relaxed);
            group.send_result(&request, balance.to_le_bytes().to_vec());
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        self.balance.lock().expect("ledger lock").to_le_bytes().to_vec()
    }

    fn restore(&self, state: &[u8]) -> Result<(), String> {
        let balance = i64_of(state).ok_or("a ledger's state is 8 bytes")?;
        *self.balance.lock().expect("ledger lock") = balance;
        self.metrics.service.value.store(balance, Relaxed);
        Ok(())
    }
}

/// The seed's workload: calls `target` to add 1, `ops` times, then to add −1 as many
/// times, at most `parallel` calls in flight; an aborted call is made again.
pub struct Bank {
    target: u32,
    ops: u64,
    parallel: u64,
    progress: Mutex<BankProgress>,
    metrics: Arc<Metrics>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct BankProgress {
    /// Amounts made so far (the first `ops` are +1).
    made: u64,
    /// Calls in flight and their amounts.
    in_flight: BTreeMap<u64, i64>,
    /// Amounts whose call was aborted, to make again.
    again: Vec<i64>,
    completed: u64,
    aborted: u64,
    /// The balance the last reply gave.
    last: i64,
}

impl Bank {
    fn finished(p: &BankProgress, ops: u64) -> bool {
        p.made == 2 * ops && p.in_flight.is_empty() && p.again.is_empty()
    }

    fn publish(&self, p: &BankProgress) {
        let m = &self.metrics.service;
        m.completed.store(p.completed, Relaxed);
        m.aborted.store(p.aborted, Relaxed);
        m.value.store(p.last, Relaxed);
        m.finished.store(Self::finished(p, self.ops), Relaxed);
    }
}

impl Service for Bank {
    fn run(&self, group: &Group) -> Result<(), Interrupted> {
        loop {
            // The next amount to send, while there is room (taken without holding the lock
            // across the call, which may block on the window).
            let next = |p: &mut BankProgress| {
                if p.in_flight.len() as u64 >= self.parallel {
                    return None;
                }
                p.again.pop().or_else(|| {
                    (p.made < 2 * self.ops).then(|| {
                        p.made += 1;
                        if p.made <= self.ops { 1 } else { -1 }
                    })
                })
            };
            loop {
                let Some(amount) = next(&mut self.progress.lock().expect("bank lock")) else { break };
                let call = group.invoke(self.target, amount.to_le_bytes().to_vec())?.call();
                self.progress.lock().expect("bank lock").in_flight.insert(call, amount);
            }
            if Self::finished(&self.progress.lock().expect("bank lock"), self.ops) {
                let p = self.progress.lock().expect("bank lock").clone();
                tracing::info!(
                    "bank: {} calls completed, {} aborted; the ledger's balance is {}",
                    p.completed,
                    p.aborted,
                    p.last
                );
                return Ok(());
            }
            let (call, outcome) = group.next_result()?;
            let mut p = self.progress.lock().expect("bank lock");
            if let Some(amount) = p.in_flight.remove(&call) {
                match outcome {
                    Outcome::Reply(balance) => {
                        p.completed += 1;
                        p.last = i64_of(&balance).unwrap_or(p.last);
                    }
                    Outcome::Aborted => {
                        p.aborted += 1;
                        p.again.push(amount);
                    }
                }
            }
            self.publish(&p);
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        let p = self.progress.lock().expect("bank lock");
        let mut words = vec![p.made, p.completed, p.aborted, p.last as u64, p.in_flight.len() as u64];
        words.extend(p.in_flight.iter().flat_map(|(call, amount)| [*call, *amount as u64]));
        words.extend(p.again.iter().map(|a| *a as u64));
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    fn restore(&self, state: &[u8]) -> Result<(), String> {
        let bad = || "not a bank's state".to_string();
        if !state.len().is_multiple_of(8) {
            return Err(bad());
        }
        let words: Vec<u64> = state.chunks(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect();
        let (head, rest) = words.split_at_checked(5).ok_or_else(bad)?;
        let pairs = usize::try_from(head[4]).ok().and_then(|n| n.checked_mul(2)).ok_or_else(bad)?;
        let (flight, again) = rest.split_at_checked(pairs).ok_or_else(bad)?;
        let p = BankProgress {
            made: head[0],
            completed: head[1],
            aborted: head[2],
            last: head[3] as i64,
            in_flight: flight.chunks(2).map(|c| (c[0], c[1] as i64)).collect(),
            again: again.iter().map(|a| *a as i64).collect(),
        };
        self.publish(&p);
        *self.progress.lock().expect("bank lock") = p;
        Ok(())
    }
}

/// The service a group's configuration names, reporting to `metrics`.
pub fn service(spec: &ServiceSpec, metrics: Arc<Metrics>) -> Arc<dyn Service> {
    metrics.service.present.store(true, Relaxed);
    match *spec {
        ServiceSpec::Ledger => Arc::new(Ledger { balance: Mutex::new(0), metrics }),
        ServiceSpec::Bank { target, ops, parallel } => {
            Arc::new(Bank { target, ops, parallel: parallel.into(), progress: Mutex::default(), metrics })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn executor(service: Arc<dyn Service>) -> Executor {
        let mut e = Executor::new(service, 8, Box::new(|| {}));
        e.start(1);
        e
    }

    fn bank(ops: u64, parallel: u32) -> Arc<dyn Service> {
        service(&ServiceSpec::Bank { target: 1, ops, parallel }, Arc::new(Metrics::new(0, &[])))
    }

    fn call(amount: i64) -> Request {
        Request::Call { target: 1, op: amount.to_le_bytes().to_vec() }
    }

    fn reply(call: u64, balance: i64) -> Event {
        Event::Reply { call, result: balance.to_le_bytes().to_vec() }
    }

    /// Serves each request by calling group 1 with its op and answering with the reply.
    struct Relay;

    impl Service for Relay {
        fn run(&self, group: &Group) -> Result<(), Interrupted> {
            loop {
                let request = group.next_request()?;
                let result = match group.invoke_and_wait(1, request.op.clone())? {
                    Outcome::Reply(r) => r,
                    Outcome::Aborted => b"aborted".to_vec(),
                };
                group.send_result(&request, result);
            }
        }

        fn snapshot(&self) -> Vec<u8> {
            vec![]
        }

        fn restore(&self, _: &[u8]) -> Result<(), String> {
            Ok(())
        }
    }

    #[test]
    fn a_program_answers_each_event_before_the_next_is_handed_over() {
        let mut e = executor(Arc::new(Relay));
        assert_eq!(e.asked(), vec![]);
        assert_eq!(
            e.deliver(Event::Request { caller: 0, call: 4, op: vec![7] }),
            vec![Request::Call { target: 1, op: vec![7] }]
        );
        // Another request waits: the program is still in its call.
        assert_eq!(e.deliver(Event::Request { caller: 0, call: 5, op: vec![8] }), vec![]);
        assert_eq!(
            e.deliver(Event::Reply { call: 1, result: vec![9] }),
            vec![Request::Respond { caller: 0, call: 4, result: vec![9] }, Request::Call { target: 1, op: vec![8] },]
        );
        assert_eq!(
            e.deliver(Event::Aborted { call: 2 }),
            vec![Request::Respond { caller: 0, call: 5, result: b"aborted".to_vec() }]
        );
    }

    #[test]
    fn a_restored_program_continues_as_the_one_whose_checkpoint_it_is() {
        let mut first = executor(bank(2, 1));
        assert_eq!(first.asked(), vec![call(1)]);
        assert_eq!(first.deliver(reply(1, 1)), vec![call(1)]);
        let [Request::Snapshot { seq: 9, state }] = &first.deliver(Event::Checkpoint { seq: 9 })[..] else {
            panic!("a checkpoint is answered with a snapshot")
        };
        // A member that restarted: its program starts afresh, then its checkpoint arrives.
        let mut second = executor(bank(2, 1));
        assert_eq!(second.asked(), vec![call(1)]);
        assert_eq!(second.deliver(Event::Restore { seq: 9, state: state.clone() }), vec![]);
        for e in [&mut first, &mut second] {
            assert_eq!(e.deliver(reply(2, 2)), vec![call(-1)]);
            assert_eq!(e.deliver(Event::Aborted { call: 3 }), vec![call(-1)]);
            assert_eq!(e.deliver(reply(4, 1)), vec![call(-1)]);
            assert_eq!(e.deliver(reply(5, 0)), vec![]);
        }
    }

    #[test]
    fn timeouts_and_policies_request_aborts_and_the_group_decides() {
        struct Impatient;
        impl Service for Impatient {
            fn run(&self, group: &Group) -> Result<(), Interrupted> {
                group.set_target_abort_policy(2, AbortPolicy::After(Duration::from_millis(5)));
                let patient = group.invoke(1, vec![1])?;
                let _ = group.invoke(2, vec![2])?;
                let outcome = patient.get_timeout(Duration::from_millis(5))?;
                group.send_result(&Incoming { caller: 9, call: 9, op: vec![] }, format!("{outcome:?}").into_bytes());
                Ok(())
            }
            fn snapshot(&self) -> Vec<u8> {
                vec![]
            }
            fn restore(&self, _: &[u8]) -> Result<(), String> {
                Ok(())
            }
        }
        let mut e = executor(Arc::new(Impatient));
        assert_eq!(e.asked(), vec![Request::Call { target: 1, op: vec![1] }, Request::Call { target: 2, op: vec![2] }]);
        assert!(e.deadline().is_some());
        std::thread::sleep(Duration::from_millis(30));
        let mut asked = e.asked();
        asked.sort_by_key(|r| format!("{r:?}"));
        assert_eq!(asked, vec![Request::Abort { call: 1 }, Request::Abort { call: 2 }]);
        // The reply was agreed before the abort: the program gets the reply.
        assert_eq!(
            e.deliver(Event::Reply { call: 1, result: vec![5] }),
            vec![Request::Respond { caller: 9, call: 9, result: b"Reply([5])".to_vec() }]
        );
    }

    #[test]
    fn executor_state_round_trips_and_garbage_is_refused() {
        let mut a = Agreed { next_call: 7, ..Agreed::default() };
        a.undecided.insert(5, 1);
        a.requests.push_back(Incoming { caller: 2, call: 9, op: vec![1, 2, 3] });
        a.decided.push_back((4, Outcome::Reply(vec![8; 8])));
        a.decided.push_back((3, Outcome::Aborted));
        let bytes = encode(&a, b"service");
        assert_eq!(decode(&bytes), Some((a, &b"service"[..])));
        for cut in 0..bytes.len() - 7 {
            // Every prefix shorter than the agreed part is refused, never a panic.
            assert_eq!(decode(&bytes[..cut]), None, "prefix {cut}");
        }
    }
}
