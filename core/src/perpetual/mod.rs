//! Perpetual (seed 002; shared/digests/002-perpetual.md): replicated services that call
//! replicated services, with fault isolation both ways.
//!
//! A cluster has several groups, each n ≥ 3f+1 members (f may be 0) ordering with our
//! PBFT ([`crate::order`]): a member is a PBFT replica of its own group, whose
//! application is split in two. The *voter* is this module, in the core: it decides,
//! through its group's PBFT, every input the *executor* (the host's deterministic
//! application) will see, and hands them over in agreement order as [`Event`]s:
//! requests from other groups, and the outcome — a reply or an abort — of each of the
//! executor's own calls. The executor answers with [`Request`]s: calls of its own
//! (`Call`, several may be outstanding), results for requests (`Respond`, whenever it
//! likes: it may start the next request first), abort requests (`Abort`, a timeout or a
//! cancel: a *request*, the outcome is agreed) and its state at checkpoints (`Snapshot`).
//! A call is named by (caller group, call id), the call id being the caller executor's
//! call counter: correct executors being deterministic, their members issue the same
//! calls with the same ids.
//!
//! # Message flow (caller group c, target group t)
//!
//! 1. Calling. Each caller member sends its copy of the call to t's primary (as it last
//!    heard of it) as a PBFT client of t would: a `Requests` whose client is the member,
//!    request number the call id, op a [`pb::PerpetualCall`], with an authenticator entry
//!    for every target member (so a backup checks a copy the primary relays). A target
//!    member holds copies back until f_c+1 from distinct caller members match ([`gate`]),
//!    then t orders them together, in one batch
//!    ([`Replica::admit_outside_submitters`]); a copy is counted when it *executes*, and
//!    the call becomes an `Event::Request` at the execution of the (f_c+1)-th matching
//!    copy. Counting at execution keeps it deterministic across t's members (whatever a
//!    faulty primary orders), and f_c+1 copies mean a correct caller member asked for it.
//! 2. Replying. Each target member's executor responds; the member MACs the result for
//!    every caller member ([`crate::wire::Keyring::result_mac_to`]) and sends it to the
//!    call's responder, t's member at index `call mod n_t`. The responder, once f_t+1
//!    target members sent the same result, sends each caller member a bundle of those
//!    f_t+1 MACs meant for it (a [`pb::PerpetualResult`]), and once 2f_t+1 did, a bundle
//!    of theirs: the first f_t+1 may hold a faulty member's MACs, which only the caller
//!    member can check; 2f_t+1 hold f_t+1 correct members' at least.
//! 3. Vouching. A caller member that holds f_t+1 valid MACs from distinct target members
//!    on one result (so a correct target member computed it) vouches for it to its own
//!    group: a [`pb::PerpetualVouch`] it sends every fellow member, and each holds it
//!    until f_c+1 members' vouches (or abort requests) agree, which its group's PBFT then
//!    orders together. A member sends its vouch (and abort request) again every
//!    `client_retry_ns` until the call is decided: PBFT drops a request whose batches
//!    failed in two view changes, for its submitter to send again. When the vouches and
//!    abort requests of a call execute, the first outcome to gather f_c+1 from distinct
//!    caller members wins: f_c+1 vouches for one result make `Event::Reply`, f_c+1 abort
//!    requests `Event::Aborted`. Decided in execution order, the outcome is the same at
//!    every correct caller member, even if a compromised target sent different,
//!    validly-quorumed results to different caller members.
//! 4. Timeout. A caller member that has not vouched `client_retry_ns` after sending a
//!    call sends its copy to every target member, again every `client_retry_ns`: backups
//!    hold it (until f_c+1 match, as above), forward it to their primary and, if it is
//!    not ordered, change view (a faulty primary); and a target member that gets a copy
//!    while not primary sends its result straight to that caller member, bypassing the
//!    responder (a faulty one).
//!
//! # Who checks what
//!
//! - A target member orders copies only from members of groups allowed to call its
//!   group, each authenticated by the caller member's MAC; a call needs f_c+1 matching
//!   copies, so a compromised caller (more than f_c faulty) makes the target execute only
//!   calls as any client could, never one in a correct member's name.
//! - A caller member vouches only for a result f_t+1 target members MACed for it, and
//!   only for a call it made to that target; its group decides only on f_c+1 vouches or
//!   aborts, so a compromised target can at worst make the call abort.
//! - Checkpoint and view-change signatures count only from the verifier's own group
//!   ([`crate::statement`]).
//!
//! # Bounds
//!
//! `call_window` (W): an executor keeps its undecided calls within W call ids (its oldest
//! undecided call and its newest less than W apart; a call beyond that is refused with
//! `Backpressure`, which a correct executor never meets). W is at most `client_queue`
//! (validated): a caller member's copies are its requests at the target's PBFT, which
//! keeps `client_queue` of a client's executed requests and takes older ones for
//! executed, so a late copy of an undecided call still counts. A group tallies vouches
//! and aborts for calls up to 2W above its oldest undecided one; a target keeps at most
//! 2W undelivered copies per caller member and remembers 2W delivered calls per caller
//! group; it keeps results for resends for 2W calls per caller group, direct-reply marks
//! for 2W per caller member, and a responder the results of 2W per target member and
//! caller group. Each keeps the highest call ids: a caller's undecided calls are among
//! its W highest, and a busy or faulty group or member pushes out only its own.
//!
//! # Checkpoints
//!
//! At a checkpoint batch the member emits `Event::Checkpoint { seq }` and waits for the
//! executor's `Request::Snapshot`; the checkpoint state is the executor's snapshot and the
//! member's agreed state ([`pb::PerpetualState`]), restored together (`Event::Restore`).
//! The agreed state holds the executor's results too (per caller group, its 2W highest
//! calls), so a member that restarts or catches up by state transfer past a call still
//! answers its resends: were they lost, a call whose results went with more than f_t
//! members' restarts would never complete. A deterministic executor responds at the same
//! point of the event sequence at every member, so the results a checkpoint holds agree.

mod gate;

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use gate::{CallKey, Gate, Vote};
use prost::Message;

use crate::crypto::{Digest, digest};
use crate::node::{Ctx, Event, HandleError, Output, Status};
use crate::order::{Bundle, OwnNumbers, Replica, primary};
use crate::role::RoleMachine;
use crate::wire::pb::perpetual_op::Kind as Op;
use crate::wire::{Opened, pb};
use crate::{FaultKind, Input, Nanos, NodeId, Operation, Request};

/// A group as a member sees it.
struct GroupView {
    f: usize,
    members: Vec<NodeId>,
    calls: Vec<u32>,
}

impl GroupView {
    fn responder(&self, call: u64) -> NodeId {
        self.members[(call % self.members.len() as u64) as usize]
    }

    fn contains(&self, id: NodeId) -> bool {
        self.members.binary_search(&id).is_ok()
    }
}

/// The bytes a target member MACs for a caller member: the call and its result.
pub(crate) fn result_statement(target: u32, caller: u32, call: u64, result: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(27 + 16 + 32);
    m.extend_from_slice(b"phalanx/v1/perpetual/result");
    m.extend_from_slice(&target.to_le_bytes());
    m.extend_from_slice(&caller.to_le_bytes());
    m.extend_from_slice(&call.to_le_bytes());
    m.extend_from_slice(&digest(result));
    m
}

/// One of this member's executor's calls, issued and not decided.
struct Outstanding {
    // Agreed (in checkpoints).
    target: u32,
    op: Bytes,
    // This member's own.
    copy: pb::Requests,
    resend_at: Nanos,
    /// Per target member, the result it MACed for this member.
    replies: BTreeMap<NodeId, Digest>,
    results: BTreeMap<Digest, Bytes>,
    vouched: bool,
    abort_sent: bool,
    /// This member's own votes on the call (its vouch, its abort request), sent again
    /// every `client_retry_ns` until the call is decided: its group's PBFT drops a
    /// request whose batches failed in two view changes, for its submitter to send again.
    votes: Vec<Bundle>,
}

impl Outstanding {
    /// Whether anything of this member's goes again at `resend_at`: the copy (until it
    /// vouches) or its votes.
    fn resends(&self) -> bool {
        !self.vouched || !self.votes.is_empty()
    }
}

/// Votes on one call: a member's first value, and its abort request.
#[derive(Default)]
struct Tally {
    votes: Vec<pb::PerpetualVote>,
}

impl Tally {
    /// Adds `member`'s vote unless it has one of that kind; how many agree with it then.
    fn add(&mut self, member: NodeId, abort: bool, value: Bytes) -> usize {
        if self.votes.iter().any(|v| v.member == member && v.abort == abort) {
            return 0;
        }
        let count = self.votes.iter().filter(|v| v.abort == abort && (abort || v.value == value)).count() + 1;
        self.votes.push(pb::PerpetualVote { member, abort, value });
        count
    }

    fn has(&self, member: NodeId) -> bool {
        self.votes.iter().any(|v| v.member == member)
    }
}

/// Calls of one caller group that became requests here: every one up to `floor`, and
/// `calls` above it (at most 2W: the oldest go below the floor).
#[derive(Default)]
struct Delivered {
    floor: u64,
    calls: BTreeSet<u64>,
}

impl Delivered {
    fn contains(&self, call: u64) -> bool {
        call <= self.floor || self.calls.contains(&call)
    }

    fn insert(&mut self, call: u64, cap: usize) {
        self.calls.insert(call);
        while self.calls.len() > cap {
            let oldest = self.calls.pop_first().expect("over the cap");
            self.floor = self.floor.max(oldest);
        }
    }
}

/// A result the responder collects, by target member.
struct Collected {
    digest: Digest,
    result: Bytes,
    macs: Vec<pb::Mac>,
}

/// A checkpoint batch executed here, waiting for the executor's snapshot.
struct AwaitingSnapshot {
    seq: u64,
    ops: usize,
}

pub(crate) struct Member {
    replica: Replica,
    group: u32,
    groups: Vec<GroupView>,
    window: u64,
    /// 2W: the calls each per-call record keeps per caller group, caller member or target
    /// member, the highest ids. A caller issues no call W ids past its oldest undecided
    /// one, so its undecided calls are among its W highest; and a busy or faulty group or
    /// member pushes out only its own.
    kept: usize,
    // Agreed: what checkpoints cover.
    next_call: u64,
    outstanding: BTreeMap<u64, Outstanding>,
    /// Caller side: every call up to the floor is decided, and those in `decided` above.
    decided_floor: u64,
    decided: BTreeSet<u64>,
    outcomes: BTreeMap<u64, Tally>,
    /// Target side: copies of calls, by (caller group, call), until f_c+1 match.
    incoming: BTreeMap<(u32, u64), Tally>,
    delivered: BTreeMap<u32, Delivered>,
    /// The executor's results, per caller group and call, kept to answer resends: a
    /// group's `kept` highest calls.
    responded: BTreeMap<u32, BTreeMap<u64, Bytes>>,
    // This member's own.
    /// The undelivered copies per caller member (derived from `incoming`).
    copies_of: BTreeMap<NodeId, BTreeSet<(u32, u64)>>,
    awaiting: Option<AwaitingSnapshot>,
    /// Numbers of its own requests (vouches and aborts).
    own: OwnNumbers,
    /// Target side: copies of calls not yet ordered, held until f_c+1 match.
    copies_held: Gate,
    /// Caller side: fellow members' vouches and abort requests not yet ordered, held
    /// until f_c+1 agree.
    votes_held: Gate,
    /// Per caller member, the calls it resent to this member before the executor
    /// responded (its `kept` highest): it gets their results directly.
    direct: BTreeMap<NodeId, BTreeSet<u64>>,
    /// As a responder: per target member and caller group, the results it sent, by call
    /// (its `kept` highest). Those of a call already bundled stay, so that late ones do
    /// not make a bundle again.
    collecting: BTreeMap<(NodeId, u32), BTreeMap<u64, Collected>>,
    /// Per target group, the view its members last said they were in.
    target_view: BTreeMap<u32, u64>,
    /// Target members that, as a call's responder, left this member waiting for its
    /// resend; until one is heard from again, calls it would respond to go to every
    /// target member at once (the timeout path), not to wait `client_retry_ns` each.
    slow_responders: BTreeSet<NodeId>,
    last_now: Nanos,
}

impl Member {
    pub fn new(ctx: &Ctx) -> Self {
        let cluster = &ctx.cfg.cluster;
        let group = cluster.group_of(ctx.me()).expect("a validated perpetual member is in a group");
        let groups: Vec<GroupView> = cluster
            .groups
            .iter()
            .map(|g| GroupView { f: g.f as usize, members: g.members.clone(), calls: g.calls.clone() })
            .collect();
        let kept = 2 * cluster.params.call_window as usize;
        let mut replica = Replica::with_embedded_application(ctx);
        let callers = groups.iter().filter(|g| g.calls.contains(&group)).flat_map(|g| g.members.iter().copied());
        replica.admit_outside_submitters(callers);
        Member {
            replica,
            group,
            groups,
            window: cluster.params.call_window as u64,
            kept,
            next_call: 1,
            outstanding: BTreeMap::new(),
            decided_floor: 0,
            decided: BTreeSet::new(),
            outcomes: BTreeMap::new(),
            incoming: BTreeMap::new(),
            delivered: BTreeMap::new(),
            copies_of: BTreeMap::new(),
            awaiting: None,
            own: OwnNumbers::new(),
            copies_held: Gate::new(kept),
            votes_held: Gate::new(kept),
            responded: BTreeMap::new(),
            direct: BTreeMap::new(),
            collecting: BTreeMap::new(),
            target_view: BTreeMap::new(),
            slow_responders: BTreeSet::new(),
            last_now: 0,
        }
    }

    fn me(&self) -> &GroupView {
        &self.groups[self.group as usize]
    }

    /// The group of `id`, if it is a member of a group that may call this one.
    fn caller_group(&self, id: NodeId) -> Option<u32> {
        let g = self.groups.iter().position(|g| g.contains(id))? as u32;
        self.groups[g as usize].calls.contains(&self.group).then_some(g)
    }

    fn is_decided(&self, call: u64) -> bool {
        call <= self.decided_floor || self.decided.contains(&call)
    }

    // ------------------------------------------------------------ the executor's requests

    fn call(&mut self, ctx: &mut Ctx, now: Nanos, target: u32, op: Vec<u8>) -> Result<(), HandleError> {
        if !self.me().calls.contains(&target) {
            return Err(HandleError::Invalid(format!("group {} may not call group {target}", self.group)));
        }
        let op = Bytes::from(op);
        let call_op = pb::PerpetualCall { target, op: op.clone() };
        let body = Bytes::from(pb::PerpetualOp { kind: Some(Op::Call(call_op)) }.encode_to_vec());
        let max = ctx.cfg.cluster.params.batch_max_bytes as usize;
        if body.len() > max {
            return Err(HandleError::Invalid(format!(
                "a call of {} bytes exceeds batch_max_bytes = {max}",
                body.len()
            )));
        }
        let call = self.next_call;
        let oldest = self.outstanding.first_key_value().map_or(call, |(&c, _)| c);
        if call - oldest >= self.window {
            return Err(HandleError::Backpressure);
        }
        self.next_call += 1;
        // Its outcome may be agreed already (this executor lags its member).
        if self.is_decided(call) {
            return Ok(());
        }
        let targets = &self.groups[target as usize];
        let copy = Bundle::seal(&ctx.keys, &targets.members, call, 0, vec![body]);
        if self.slow_responders.contains(&targets.responder(call)) {
            ctx.send(pb::body::Kind::Requests(copy.clone()), targets.members.clone());
        } else {
            let view = self.target_view.get(&target).copied().unwrap_or(0);
            ctx.send(pb::body::Kind::Requests(copy.clone()), [primary(&targets.members, view)]);
        }
        let retry = ctx.cfg.cluster.params.client_retry_ns;
        let o = Outstanding {
            target,
            op,
            copy,
            resend_at: now.saturating_add(retry),
            replies: BTreeMap::new(),
            results: BTreeMap::new(),
            vouched: false,
            abort_sent: false,
            votes: Vec::new(),
        };
        self.outstanding.insert(call, o);
        Ok(())
    }

    fn abort(&mut self, ctx: &mut Ctx, now: Nanos, call: u64) {
        let Some(o) = self.outstanding.get_mut(&call).filter(|o| !o.abort_sent) else { return };
        o.abort_sent = true;
        self.submit(ctx, now, call, Op::Abort(call));
    }

    fn respond(&mut self, ctx: &mut Ctx, caller: u32, call: u64, result: Vec<u8>) -> Result<(), HandleError> {
        let Some(callers) = self.groups.get(caller as usize).filter(|g| g.calls.contains(&self.group)) else {
            return Err(HandleError::Invalid(format!("group {caller} does not call group {}", self.group)));
        };
        let statement = result_statement(self.group, caller, call, &result);
        let macs: Vec<pb::Mac> =
            callers.members.iter().filter_map(|&c| ctx.keys.result_mac_to(c, &statement)).collect();
        let result = Bytes::from(result);
        let responder = self.me().responder(call);
        let view = self.replica.view();
        let msg = pb::PerpetualResult { target: self.group, caller, call, result: result.clone(), view, macs };
        if responder == ctx.me() {
            self.collect(ctx, ctx.me(), msg.clone());
        } else {
            ctx.send(pb::body::Kind::PerpetualResult(msg.clone()), [responder]);
        }
        let waiting: Vec<NodeId> = (self.groups[caller as usize].members.iter().copied())
            .filter(|m| self.direct.get_mut(m).is_some_and(|calls| calls.remove(&call)))
            .collect();
        for to in waiting {
            self.send_direct(ctx, &msg, to);
        }
        let results = self.responded.entry(caller).or_default();
        results.insert(call, result);
        if results.len() > self.kept {
            results.pop_first();
        }
        Ok(())
    }

    /// This member's result for a caller member, straight to it.
    fn send_direct(&self, ctx: &mut Ctx, msg: &pb::PerpetualResult, to: NodeId) {
        let macs = msg.macs.iter().filter(|m| m.to == to).cloned().collect();
        let view = self.replica.view();
        ctx.send(pb::body::Kind::PerpetualResult(pb::PerpetualResult { macs, view, ..msg.clone() }), [to]);
    }

    /// Sends the group a vote of this member's own on `call` (a vouch or an abort
    /// request), to be ordered through its PBFT once f_c+1 members' agree, and sent again
    /// until the call is decided.
    fn submit(&mut self, ctx: &mut Ctx, now: Nanos, call: u64, op: Op) {
        let op = Bytes::from(pb::PerpetualOp { kind: Some(op) }.encode_to_vec());
        let Some(bundle) = self.own.send(ctx, &mut self.replica, op) else { return };
        if let Some(o) = self.outstanding.get_mut(&call) {
            o.votes.push(bundle.clone());
            o.resend_at = now.saturating_add(ctx.cfg.cluster.params.client_retry_ns);
        }
        self.hold_vote(ctx, now, ctx.me(), bundle);
    }

    /// A member's request sent to its group (its own, straight from it: the frame MAC
    /// authenticated it): a vote, held until f_c+1 members' agree.
    fn hold_vote(&mut self, ctx: &mut Ctx, now: Nanos, member: NodeId, bundle: Bundle) {
        let Some((call, abort, value)) = single_op(&bundle).as_ref().and_then(vote_of) else {
            return ctx.fault(member, FaultKind::Unexpected);
        };
        if self.is_decided(call) || call > self.decided_floor + 2 * self.window {
            return ctx.stats.stale += 1;
        }
        let (f, vote) = (self.me().f, Vote { member, abort, value });
        let ready = self.votes_held.hold((self.group, call), vote, bundle, f);
        if !ready.is_empty() {
            self.replica.take_together(ctx, now, ready);
        }
    }

    // ------------------------------------------------------------ messages

    /// A copy of a call straight from a caller member: held until f_c+1 copies match,
    /// then they go to PBFT together. A copy that reaches this member while it is not
    /// primary, or of a call it already took, is a resend (the caller timed out, or
    /// restarted and lost the result), whose sender gets this member's result directly.
    fn on_copy(&mut self, ctx: &mut Ctx, now: Nanos, bundle: Bundle) {
        let (client, call) = (bundle.client, bundle.first);
        let Some(caller) = self.caller_group(client) else {
            return ctx.fault(client, FaultKind::Unexpected);
        };
        let op = match single_op(&bundle) {
            Some(Op::Call(c)) if c.target == self.group => c.op,
            _ => return ctx.fault(client, FaultKind::Unexpected),
        };
        if let Some(result) = self.responded.get(&caller).and_then(|results| results.get(&call)) {
            let statement = result_statement(self.group, caller, call, result);
            let macs = ctx.keys.result_mac_to(client, &statement).into_iter().collect();
            let msg = pb::PerpetualResult { target: self.group, caller, call, result: result.clone(), view: 0, macs };
            return self.send_direct(ctx, &msg, client);
        }
        // The primary gets every first copy: only one of a call it already took is a resend.
        let delivered = self.delivered.get(&caller).is_some_and(|d| d.contains(call));
        if !self.replica.primary_now(ctx) || delivered {
            let calls = self.direct.entry(client).or_default();
            calls.insert(call);
            if calls.len() > self.kept {
                calls.pop_first();
            }
        }
        if delivered {
            return ctx.stats.stale += 1;
        }
        let (f, vote) = (self.groups[caller as usize].f, Vote { member: client, abort: false, value: op });
        let ready = self.copies_held.hold((caller, call), vote, bundle, f);
        if !ready.is_empty() {
            self.replica.take_together(ctx, now, ready);
        }
    }

    fn on_result(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, r: pb::PerpetualResult) {
        if ctx.is_replica(from) {
            // A fellow member's result, for this member as the call's responder.
            if r.target != self.group
                || self.caller_group_index(r.caller).is_none()
                || self.me().responder(r.call) != ctx.me()
            {
                return ctx.fault(from, FaultKind::Unexpected);
            }
            return self.collect(ctx, from, r);
        }
        let Some(t) = self.groups.iter().position(|g| g.contains(from)).map(|t| t as u32) else {
            return ctx.fault(from, FaultKind::Unexpected);
        };
        if r.caller != self.group || r.target != t || !self.me().calls.contains(&t) {
            return ctx.fault(from, FaultKind::Unexpected);
        }
        // Heard from: a responder again (it may have restarted).
        self.slow_responders.remove(&from);
        let Some(o) = self.outstanding.get_mut(&r.call).filter(|o| o.target == t) else {
            return ctx.stats.stale += 1;
        };
        if o.vouched {
            return ctx.stats.stale += 1;
        }
        let targets = &self.groups[t as usize];
        let statement = result_statement(t, self.group, r.call, &r.result);
        let d = digest(&r.result);
        let me = ctx.me();
        let mut fresh = false;
        for m in r.macs.iter().filter(|m| m.to == me && targets.contains(m.from)) {
            if o.replies.contains_key(&m.from) {
                continue;
            }
            ctx.counters.macs_verified += 1;
            if ctx.keys.verify_result_from(m.from, &statement, std::slice::from_ref(m)) {
                o.replies.insert(m.from, d);
                fresh = true;
            }
        }
        if !fresh {
            return;
        }
        self.target_view.insert(t, r.view);
        o.results.entry(d).or_insert(r.result);
        if o.replies.values().filter(|x| **x == d).count() > targets.f {
            o.vouched = true;
            let vouch = pb::PerpetualVouch { call: r.call, target: t, result: o.results[&d].clone() };
            self.submit(ctx, now, r.call, Op::Vouch(vouch));
        }
    }

    fn caller_group_index(&self, caller: u32) -> Option<&GroupView> {
        self.groups.get(caller as usize).filter(|g| g.calls.contains(&self.group))
    }

    /// The responder: a target member's result (its MACs for the caller members); once
    /// f_t+1 members sent the same result, each caller member gets their MACs for it, and
    /// again once 2f_t+1 did: a faulty member's MACs, which only a caller member can
    /// check, may be among the first f_t+1, never among more than f of the 2f_t+1.
    fn collect(&mut self, ctx: &mut Ctx, from: NodeId, r: pb::PerpetualResult) {
        let (caller, call) = (r.caller, r.call);
        let Some(callers) = self.caller_group_index(caller) else { return };
        let d = digest(&r.result);
        let macs: Vec<pb::Mac> = r.macs.into_iter().filter(|m| m.from == from && callers.contains(m.to)).collect();
        let callers = callers.members.clone();
        let f = self.me().f;
        let sent = self.collecting.entry((from, caller)).or_default();
        if sent.contains_key(&call) {
            return;
        }
        sent.insert(call, Collected { digest: d, result: r.result, macs });
        if sent.len() > self.kept {
            sent.pop_first();
        }
        let agreeing: Vec<&Collected> = (self.me().members.iter())
            .filter_map(|&m| self.collecting.get(&(m, caller))?.get(&call))
            .filter(|c| c.digest == d)
            .collect();
        if agreeing.len() == f + 1 || (f > 0 && agreeing.len() == 2 * f + 1) {
            let view = self.replica.view();
            for &c in &callers {
                let macs = agreeing.iter().flat_map(|a| a.macs.iter().filter(|m| m.to == c).cloned()).collect();
                let result = agreeing[0].result.clone();
                let msg = pb::PerpetualResult { target: self.group, caller, call, result, view, macs };
                ctx.send(pb::body::Kind::PerpetualResult(msg), [c]);
            }
        }
    }

    // ------------------------------------------------------------ execution

    /// Takes what the replica handed over: executes batches, restores states.
    fn run(&mut self, ctx: &mut Ctx, now: Nanos) {
        while let Some(handed) = self.replica.take_handed() {
            match handed {
                Output::Execute { seq, ops, snapshot } => {
                    for op in &ops {
                        self.execute(ctx, op);
                    }
                    if snapshot {
                        ctx.push(Output::Event(Event::Checkpoint { seq }));
                        self.awaiting = Some(AwaitingSnapshot { seq, ops: ops.len() });
                    } else {
                        self.executed(ctx, now, seq, ops.len(), None);
                    }
                }
                Output::Restore { seq, snapshot } => {
                    self.awaiting = None;
                    self.restore(ctx, seq, &snapshot);
                }
                _ => unreachable!("a replica hands over executions and restores only"),
            }
        }
    }

    fn executed(&mut self, ctx: &mut Ctx, now: Nanos, seq: u64, ops: usize, snapshot: Option<Vec<u8>>) {
        let done = Input::Executed { seq, results: vec![vec![]; ops], snapshot };
        if let Err(e) = self.replica.on_input(ctx, now, done) {
            unreachable!("the replica refused its own execution: {e}");
        }
    }

    /// One ordered operation: a fellow member's vouch or abort request, or a caller
    /// member's copy of a call. Anything else (a faulty submitter's) does nothing.
    fn execute(&mut self, ctx: &mut Ctx, o: &Operation) {
        let Some(kind) = pb::PerpetualOp::decode(o.op.as_slice()).ok().and_then(|op| op.kind) else { return };
        if ctx.is_replica(o.client)
            && let Some((call, abort, value)) = vote_of(&kind)
        {
            return self.vote(ctx, o.client, call, abort, value);
        }
        match kind {
            Op::Call(c) if c.target == self.group => {
                if let Some(caller) = self.caller_group(o.client) {
                    self.copy(ctx, caller, o.client, o.request, c.op);
                }
            }
            _ => {}
        }
    }

    /// Caller side: a member's vouch (`value`: target and result) or abort request; the
    /// first outcome with f_c+1 votes is the call's.
    fn vote(&mut self, ctx: &mut Ctx, member: NodeId, call: u64, abort: bool, value: Bytes) {
        if self.is_decided(call) || call > self.decided_floor + 2 * self.window {
            return;
        }
        let count = self.outcomes.entry(call).or_default().add(member, abort, value.clone());
        if count <= self.me().f {
            return;
        }
        self.outcomes.remove(&call);
        self.votes_held.settle((self.group, call), &mut self.replica, ctx);
        self.decided.insert(call);
        while self.decided.remove(&(self.decided_floor + 1)) {
            self.decided_floor += 1;
        }
        self.outstanding.remove(&call);
        let event = if abort { Event::Aborted { call } } else { Event::Reply { call, result: value[4..].to_vec() } };
        ctx.push(Output::Event(event));
    }

    /// Target side: a caller member's copy of `call`; at f_c+1 matching ones, the call is
    /// a request.
    fn copy(&mut self, ctx: &mut Ctx, caller: u32, member: NodeId, call: u64, op: Bytes) {
        if self.delivered.get(&caller).is_some_and(|d| d.contains(call)) {
            return;
        }
        let key = (caller, call);
        let tally = self.incoming.entry(key).or_default();
        if tally.has(member) {
            return;
        }
        let count = tally.add(member, false, op.clone());
        if count > self.groups[caller as usize].f {
            if let Some(t) = self.incoming.remove(&key) {
                for v in t.votes {
                    self.forget_copy(v.member, key);
                }
            }
            self.delivered.entry(caller).or_default().insert(call, self.kept);
            self.copies_held.settle(key, &mut self.replica, ctx);
            ctx.push(Output::Event(Event::Request { caller, call, op: op.to_vec() }));
            return;
        }
        let copies = self.copies_of.entry(member).or_default();
        copies.insert(key);
        if copies.len() > self.kept {
            let oldest = copies.pop_first().expect("over the cap");
            if let Some(t) = self.incoming.get_mut(&oldest) {
                t.votes.retain(|v| v.member != member);
                if t.votes.is_empty() {
                    self.incoming.remove(&oldest);
                }
            }
        }
    }

    fn forget_copy(&mut self, member: NodeId, key: (u32, u64)) {
        if let Some(copies) = self.copies_of.get_mut(&member) {
            copies.remove(&key);
            if copies.is_empty() {
                self.copies_of.remove(&member);
            }
        }
    }

    // ------------------------------------------------------------ checkpoints

    fn on_snapshot(&mut self, ctx: &mut Ctx, now: Nanos, seq: u64, state: Vec<u8>) -> Result<(), HandleError> {
        match &self.awaiting {
            Some(a) if a.seq == seq => {}
            // A checkpoint a state transfer superseded: nothing waits for it.
            None => return Ok(()),
            Some(a) => {
                return Err(HandleError::Invalid(format!("a snapshot for checkpoint {seq}, but {} awaits one", a.seq)));
            }
        }
        let a = self.awaiting.take().expect("matched above");
        let snapshot = self.state(state).encode_to_vec();
        self.executed(ctx, now, a.seq, a.ops, Some(snapshot));
        self.run(ctx, now);
        Ok(())
    }

    /// The agreed state with the executor's: what a checkpoint signs.
    fn state(&self, executor: Vec<u8>) -> pb::PerpetualState {
        let tally = |group: u32, call: u64, t: &Tally| pb::PerpetualTally { group, call, votes: t.votes.clone() };
        pb::PerpetualState {
            executor,
            next_call: self.next_call,
            outstanding: self
                .outstanding
                .iter()
                .map(|(&call, o)| pb::PerpetualOutstanding { call, target: o.target, op: o.op.to_vec() })
                .collect(),
            decided_floor: self.decided_floor,
            decided: self.decided.iter().copied().collect(),
            outcomes: self.outcomes.iter().map(|(&call, t)| tally(self.group, call, t)).collect(),
            incoming: self.incoming.iter().map(|(&(g, call), t)| tally(g, call, t)).collect(),
            delivered: self
                .delivered
                .iter()
                .map(|(&group, d)| pb::PerpetualDelivered {
                    group,
                    floor: d.floor,
                    calls: d.calls.iter().copied().collect(),
                })
                .collect(),
            responded: (self.responded.iter())
                .flat_map(|(&group, results)| results.iter().map(move |(&call, result)| (group, call, result)))
                .map(|(group, call, result)| pb::PerpetualResponded { group, call, result: result.to_vec() })
                .collect(),
        }
    }

    /// State transfer or a restart: the agreed state of a certified checkpoint, and the
    /// executor's, handed to it.
    fn restore(&mut self, ctx: &mut Ctx, seq: u64, snapshot: &[u8]) {
        // The certificate vouched for these bytes: they are a correct member's snapshot.
        let Ok(s) = pb::PerpetualState::decode(snapshot) else {
            return ctx.fault(ctx.me(), FaultKind::Malformed);
        };
        self.next_call = s.next_call;
        let now = self.last_now;
        self.outstanding.clear();
        for o in s.outstanding {
            let Some(members) = self.groups.get(o.target as usize).map(|g| g.members.clone()) else { continue };
            let body = pb::PerpetualOp {
                kind: Some(Op::Call(pb::PerpetualCall { target: o.target, op: o.op.clone().into() })),
            };
            let copy = Bundle::seal(&ctx.keys, &members, o.call, 0, vec![body.encode_to_vec().into()]);
            let entry = Outstanding {
                target: o.target,
                op: o.op.into(),
                copy,
                // Sent to every target member at once: they have the result, if any.
                resend_at: now,
                replies: BTreeMap::new(),
                results: BTreeMap::new(),
                vouched: false,
                abort_sent: false,
                votes: Vec::new(),
            };
            self.outstanding.insert(o.call, entry);
        }
        self.decided_floor = s.decided_floor;
        self.decided = s.decided.into_iter().collect();
        let tally = |t: pb::PerpetualTally| Tally { votes: t.votes };
        self.outcomes = s.outcomes.into_iter().map(|t| (t.call, tally(t))).collect();
        self.incoming = s.incoming.into_iter().map(|t| ((t.group, t.call), tally(t))).collect();
        self.copies_of.clear();
        for (&key, t) in &self.incoming {
            for v in &t.votes {
                self.copies_of.entry(v.member).or_default().insert(key);
            }
        }
        self.delivered = s
            .delivered
            .into_iter()
            .map(|d| (d.group, Delivered { floor: d.floor, calls: d.calls.into_iter().collect() }))
            .collect();
        self.responded.clear();
        for r in s.responded {
            self.responded.entry(r.group).or_default().insert(r.call, r.result.into());
        }
        // What the restored state settled needs no ordering here any more.
        let decided: Vec<CallKey> = self.votes_held.calls().filter(|&(_, call)| self.is_decided(call)).collect();
        let delivered: Vec<CallKey> = (self.copies_held.calls())
            .filter(|(caller, call)| self.delivered.get(caller).is_some_and(|d| d.contains(*call)))
            .collect();
        for key in decided {
            self.votes_held.settle(key, &mut self.replica, ctx);
        }
        for key in delivered {
            self.copies_held.settle(key, &mut self.replica, ctx);
        }
        ctx.push(Output::Event(Event::Restore { seq, state: s.executor }));
    }

    /// Every `client_retry_ns` while a call is undecided: its copy to every target
    /// member until this member vouches, and this member's votes on it to its group (and
    /// through its own gate, which lets a vote it let through before go on again).
    fn resend(&mut self, ctx: &mut Ctx, now: Nanos) {
        let retry = ctx.cfg.cluster.params.client_retry_ns;
        let mut votes = Vec::new();
        for (&call, o) in self.outstanding.iter_mut().filter(|(_, o)| o.resend_at <= now && o.resends()) {
            o.resend_at = now.saturating_add(retry);
            votes.extend(o.votes.iter().cloned());
            if o.vouched {
                continue;
            }
            let targets = &self.groups[o.target as usize];
            self.slow_responders.insert(targets.responder(call));
            ctx.send(pb::body::Kind::Requests(o.copy.clone()), targets.members.clone());
        }
        for vote in votes {
            ctx.send_to_replicas(pb::body::Kind::Requests(vote.to_pb()), &[]);
            self.hold_vote(ctx, now, ctx.me(), vote);
        }
    }
}

impl RoleMachine for Member {
    fn on_message(&mut self, ctx: &mut Ctx, now: Nanos, msg: Opened) {
        self.last_now = now;
        let from = msg.sender;
        match msg.body {
            pb::body::Kind::PerpetualResult(r) => self.on_result(ctx, now, from, r),
            // Straight from its submitter: a caller member's copy, or a fellow's vote.
            pb::body::Kind::Requests(ref r) => match Bundle::parse(r.clone()) {
                Some(b) if b.client == from && !ctx.is_replica(from) => self.on_copy(ctx, now, b),
                Some(b) if b.client == from => self.hold_vote(ctx, now, from, b),
                // Forwarded by a fellow, or malformed: PBFT's rules.
                _ => self.replica.on_message(ctx, now, msg),
            },
            _ => self.replica.on_message(ctx, now, msg),
        }
        self.run(ctx, now);
    }

    fn on_input(&mut self, ctx: &mut Ctx, now: Nanos, input: Input) -> Result<(), HandleError> {
        self.last_now = now;
        let result = match input {
            Input::Request(Request::Call { target, op }) => self.call(ctx, now, target, op),
            Input::Request(Request::Respond { caller, call, result }) => self.respond(ctx, caller, call, result),
            Input::Request(Request::Abort { call }) => {
                self.abort(ctx, now, call);
                Ok(())
            }
            Input::Request(Request::Snapshot { seq, state }) => self.on_snapshot(ctx, now, seq, state),
            Input::Recover { record } => self.replica.on_input(ctx, now, Input::Recover { record }),
            // The voter runs here; the executor answers with requests, never batches.
            other => Err(HandleError::WrongRole { role: ctx.role(), request: other.name() }),
        };
        self.run(ctx, now);
        result
    }

    fn on_timeout(&mut self, ctx: &mut Ctx, now: Nanos) {
        self.last_now = now;
        self.replica.on_timeout(ctx, now);
        self.resend(ctx, now);
        self.run(ctx, now);
    }

    fn next_deadline(&self) -> Option<Nanos> {
        let resend = self.outstanding.values().filter(|o| o.resends()).map(|o| o.resend_at).min();
        crate::distill::earliest([self.replica.next_deadline(), resend])
    }

    fn before_poll(&mut self, ctx: &mut Ctx) {
        self.replica.before_poll(ctx);
    }

    fn status(&self, ctx: &Ctx) -> Status {
        self.replica.status(ctx)
    }

    fn live_instances(&self) -> usize {
        self.replica.live_instances()
            + self.outstanding.len()
            + self.outcomes.len()
            + self.incoming.len()
            + self.copies_held.len()
            + self.votes_held.len()
            + self.responded.values().map(BTreeMap::len).sum::<usize>()
            + self.direct.values().map(BTreeSet::len).sum::<usize>()
            + self.collecting.values().map(BTreeMap::len).sum::<usize>()
    }

    fn next_request(&self) -> Option<u64> {
        Some(self.next_call)
    }
}

/// The one operation of a bundle, decoded; `None` for any other shape.
fn single_op(bundle: &Bundle) -> Option<Op> {
    let [op] = bundle.ops.as_slice() else { return None };
    pb::PerpetualOp::decode(op.clone()).ok()?.kind
}

/// A vote on a call's outcome: (call, abort, value), the value of a vouch being the
/// target group and the result.
fn vote_of(op: &Op) -> Option<(u64, bool, Bytes)> {
    match op {
        Op::Vouch(v) => {
            let mut value = v.target.to_le_bytes().to_vec();
            value.extend_from_slice(&v.result);
            Some((v.call, false, value.into()))
        }
        Op::Abort(call) => Some((*call, true, Bytes::new())),
        Op::Call(_) => None,
    }
}
