//! View change, the only part of ordering besides checkpoints that signs anything.
//!
//! A replica whose waiting requests see no progress for `request_timeout_ns` (at half of
//! it, it forwarded them to the primary) suspects the primary and sends a signed
//! VIEW-CHANGE for the next view. For every slot above its stable checkpoint it states
//! the latest view the slot prepared in there (the digest it sent COMMIT for) and the
//! batches it voted for, each with the latest view it did. It joins a higher view once
//! f+1 replicas ask for one.
//!
//! PBFT's timer rule: a replica gives up on the view it changes to, and moves to the next,
//! only once a quorum is at that view (VIEW-CHANGEs for it are in, or votes in it from
//! replicas that entered it) and the timeout (doubled for every view change in a row that
//! made no progress) passes without its NEW-VIEW. Before that quorum
//! it waits, however long: alone, or with fewer than a quorum, it cannot depose a working
//! primary, and no restart or lost message can carry it views ahead of the others. While
//! it waits it takes part in no vote of the old view (its VIEW-CHANGE already told what it
//! prepared there), but it re-sends its VIEW-CHANGE and asks its peers for what committed
//! (after `request_timeout_ns`, then twice as long each time), so it still executes what
//! the others order.
//!
//! The new primary relays, in a NEW-VIEW, VIEW-CHANGEs from 2f+1 or more replicas once
//! they settle every slot; every replica runs the same [`decide`] on them, so the
//! primary has no say in the outcome. A slot above the highest stable checkpoint among
//! them gets the batch `d` of a prepared claim `(v, d)` that *binds*: 2f+1 of them
//! claim nothing higher than `v` for the slot and nothing else at `v`, and f+1 voted for
//! `d` in view `v` or later (so a correct replica did, and the claim is no invention).
//! With no binding claim, 2f+1 that claim nothing prepared there, or a claim `(v, d)`
//! that f+1 contradict (they voted for another batch there in a view after `v`), settle
//! it as an empty batch; otherwise the primary waits for more VIEW-CHANGEs. A claim f+1
//! contradict does not bind either, and with no binding claim the slot gets the batch f+1
//! voted for in the highest view `v` (the (f+1)-th highest of their latest votes for it),
//! unless some replica claims another batch prepared at `v` or later. This is the
//! epoch change of Cachin, Guerraoui and Rodrigues' Byzantine read/write epoch consensus,
//! and PBFT's MAC-based view change (Castro's thesis), with signed VIEW-CHANGEs in place
//! of acknowledgements.
//!
//! Safety: a batch committed at slot s in view v prepared at f+1 correct replicas, one
//! of which is in any 2f+1 VIEW-CHANGEs with a claim of view ≥ v for `d`; a claim for
//! another batch would need a higher view and f+1 votes for it there, but correct
//! replicas vote only `d` at s after v (by induction over the views), so `d` alone can
//! bind. A correct replica votes at s in a view u only for what NEW-VIEW u chose there
//! or, if no VIEW-CHANGE in it claimed s, a new proposal: if `d` committed before u, for
//! `d`. So no correct replica contradicts a committed batch's claims, and the f+1 correct
//! replicas that prepared it keep its slot from being settled empty. For the same reason
//! any 2f+1 VIEW-CHANGEs for a view u choose at s whatever committed there before u: a
//! replica that prepared `d` at s before u withdraws that claim once it sees a valid
//! NEW-VIEW for u (entered, or relayed to it) that did not choose `d`.
//!
//! A batch `d` may also commit at s in view v on every replica's PREPARE, with no prepared
//! claim anywhere (each vote was durable before it left). Then every correct replica voted
//! for `d` at v and votes for nothing else at s after v, so any 2f+1 VIEW-CHANGEs hold
//! f+1 votes for `d` in view v or later, and another batch at most f votes (the faulty
//! replicas') in any view from v on: `d` is the batch voted for in the highest view. A
//! claim of another batch needs a view before v (at v or later it would need f+1 correct
//! votes), so f+1 contradict it and it does not bind. Conversely the voted-for batch is
//! chosen only where no claim of another batch is as high: a batch that committed through
//! COMMITs has a claim at its view in any 2f+1 VIEW-CHANGEs, and after that view correct
//! replicas vote for nothing else there, so no other batch has f+1 votes that high.
//!
//! Liveness: once the VIEW-CHANGEs of all correct replicas are in, the highest claim
//! among correct replicas binds, or 2f+1 of them claim nothing. A replica reports at most
//! `VOTED_KEPT` votes per slot, so the votes behind a claim can be pushed out: then
//! those who pushed them out voted for other batches at s in later views, so they
//! contradict the claim, and the NEW-VIEWs of those views, which did not choose it, are
//! relayed to a replica still claiming it (by every replica in such a view that gets
//! its VIEW-CHANGE), which withdraws it.
//!
//! Every replica then votes (PREPARE) for the chosen batches in the new view, fetching
//! from its peers by digest any it does not hold (f+1 voted for it, so a correct
//! replica holds it); the new primary proposes only above them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use prost::Message;

use super::checkpoint::verify_certificate;
use super::{Early, Record, Replica, VOTED_KEPT, record};
use crate::crypto::{Digest, digest};
use crate::node::Ctx;
use crate::order::{EncodedBatch, primary};
use crate::quorum::Quorums;
use crate::statement::{Signed, Statement};
use crate::wire::pb;
use crate::{FaultKind, Nanos, NodeId};

/// The statement a VIEW-CHANGE for `view` signs: the digest of its encoding without
/// the signature.
pub(crate) fn view_change(view: u64, digest: &[u8]) -> Signed<'_> {
    Signed { statement: Statement::ViewChange, view, seq: 0, digest }
}

pub(super) struct Changing {
    pub target: u64,
    /// When it moves on to the next view: set once a quorum of VIEW-CHANGEs for `target`
    /// is in.
    pub deadline: Option<Nanos>,
    /// When it next re-sends its VIEW-CHANGE and asks its peers to catch it up, and how
    /// often it has: the interval doubles each time, so a replica left alone waits quietly.
    pub retry_at: Nanos,
    retries: u32,
}

impl Changing {
    pub fn new(target: u64, now: Nanos, timeout: Nanos) -> Self {
        Changing { target, deadline: None, retry_at: now.saturating_add(timeout), retries: 0 }
    }
}

/// A verified VIEW-CHANGE: its view, the signed bytes to relay in a NEW-VIEW, and what
/// it claims.
pub(super) struct Received {
    pub view: u64,
    signed: pb::SignedViewChange,
    claims: Claims,
}

/// A NEW-VIEW this replica entered, to relay to replicas still claiming what it did not
/// choose (they may never have received it), once each.
pub(super) struct Entered {
    new_view: pb::NewView,
    decision: Decision,
    relayed_to: BTreeSet<NodeId>,
}

/// What one VIEW-CHANGE states about the slots above its stable checkpoint.
#[derive(Clone, Debug, Default)]
struct Claims {
    stable: Option<pb::Certificate>,
    /// seq → (view, digest) it prepared in last.
    prepared: BTreeMap<u64, (u64, Digest)>,
    /// seq → (view, digest) of each batch it voted for.
    voted: BTreeMap<u64, Vec<(u64, Digest)>>,
}

/// What a NEW-VIEW settles a slot with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Choice {
    Batch(Digest),
    Empty,
}

#[derive(Clone, Debug)]
struct Decision {
    /// The highest stable checkpoint among the VIEW-CHANGEs.
    stable: Option<pb::Certificate>,
    /// A choice for every slot from after it up to the highest prepared claim.
    choices: BTreeMap<u64, Choice>,
}

impl Decision {
    /// Whether a claim that `(view, d)` prepared at `seq` in a view before `entered` (this
    /// decision's) is one it did not choose: then it did not commit.
    fn withdraws(&self, entered: u64, seq: u64, (view, d): (u64, Digest)) -> bool {
        let low = self.stable.as_ref().map_or(0, |c| c.seq);
        seq > low && view < entered && self.choices.get(&seq) != Some(&Choice::Batch(d))
    }
}

/// The new view's re-proposals from `claims` (one per distinct replica, 2f+1 or more):
/// `None` while some slot is unsettled.
fn decide(claims: &[&Claims], q: Quorums) -> Option<Decision> {
    let quorum = q.intersecting();
    let stable = claims.iter().filter_map(|c| c.stable.as_ref()).max_by_key(|c| c.seq).cloned();
    let low = stable.as_ref().map_or(0, |c| c.seq);
    let last_claimed = claims.iter().filter_map(|c| c.prepared.range(low + 1..).next_back().map(|(&s, _)| s)).max();
    let voted: BTreeSet<u64> = claims.iter().flat_map(|c| c.voted.range(low + 1..).map(|(&s, _)| s)).collect();
    let voted_for: BTreeMap<u64, (u64, Digest)> =
        voted.into_iter().filter_map(|seq| Some((seq, most_voted(claims, seq, q)?))).collect();
    let last = last_claimed.max(voted_for.keys().next_back().copied());
    let mut choices = BTreeMap::new();
    for seq in low + 1..=last.unwrap_or(low) {
        let mut candidates: Vec<(u64, Digest)> = claims.iter().filter_map(|c| c.prepared.get(&seq).copied()).collect();
        // Highest view first; the digest only orders equal views deterministically.
        candidates.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        candidates.dedup();
        let binds = |&(view, d): &(u64, Digest)| {
            let highest = claims
                .iter()
                .filter(|c| c.prepared.get(&seq).is_none_or(|&(v, x)| v < view || (v, x) == (view, d)))
                .count();
            let vouched = claims
                .iter()
                .filter(|c| c.voted.get(&seq).is_some_and(|vs| vs.iter().any(|&(v, x)| v >= view && x == d)))
                .count();
            highest >= quorum && vouched >= q.one_correct()
        };
        // A claim f+1 contradict: they voted for another batch there in a later view.
        let defeated = |&(view, d): &(u64, Digest)| {
            let later_other =
                |c: &&&Claims| c.voted.get(&seq).is_some_and(|vs| vs.iter().any(|&(v, x)| v > view && x != d));
            claims.iter().filter(later_other).count() >= q.one_correct()
        };
        // A batch every replica voted for committed without prepared claims: f+1 of any
        // 2f+1 voted for it, in its view or later, and nobody claims another there.
        let unclaimed_other = |&(view, d): &(u64, Digest)| {
            claims.iter().all(|c| c.prepared.get(&seq).is_none_or(|&(v, x)| x == d || v < view))
        };
        let choice = match candidates.iter().find(|c| binds(c) && !defeated(c)) {
            Some(&(_, d)) => Choice::Batch(d),
            None => match voted_for.get(&seq).copied().filter(unclaimed_other) {
                Some((_, d)) => Choice::Batch(d),
                None if claims.iter().filter(|c| c.prepared.get(&seq).is_none_or(defeated)).count() >= quorum => {
                    Choice::Empty
                }
                None => return None,
            },
        };
        choices.insert(seq, choice);
    }
    Some(Decision { stable, choices })
}

/// The batch f+1 of `claims` voted for at `seq` in the highest view, and that view: the
/// (f+1)-th highest of their votes for it (a claim holds one per batch, its latest), the
/// lowest digest among equals.
fn most_voted(claims: &[&Claims], seq: u64, q: Quorums) -> Option<(u64, Digest)> {
    let mut views: BTreeMap<Digest, Vec<u64>> = BTreeMap::new();
    for &(v, d) in claims.iter().flat_map(|c| c.voted.get(&seq)).flatten() {
        views.entry(d).or_default().push(v);
    }
    let mut best: Option<(u64, Digest)> = None;
    for (d, mut vs) in views {
        vs.sort_unstable_by(|a, b| b.cmp(a));
        if let Some(&view) = vs.get(q.one_correct() - 1)
            && best.is_none_or(|(b, _)| view > b)
        {
            best = Some((view, d));
        }
    }
    best
}

impl Replica {
    /// The request timer, in two stages. While requests wait without a batch executing, a
    /// backup first forwards them to the primary after half the request timeout (a client
    /// may have sent them to some replicas only), and suspects the primary after the
    /// whole of it; a view change under way times out on its own deadline. The second
    /// stage runs too while this replica executed less than it knows is settled (say it
    /// may have executed more before a crash): if catching up brings nothing for as long,
    /// the slots must be settled anew by a view change — after a whole-cluster restart, a
    /// slot committed before it commits again only if a quorum can still vote for it in
    /// this view, which a faulty primary that equivocated can prevent, and an idle cluster
    /// has no request waiting to start the timer. It runs as well while a proposal this
    /// replica accepted waits to execute: its requests may have come in the PRE-PREPARE
    /// only (none waits in the queues), and a view in which it cannot commit (too few
    /// replicas still vote in it) must change.
    pub(super) fn rearm(&mut self, ctx: &Ctx) {
        let timeout = self.backed_off(ctx);
        let waiting = self.changing.is_none() && self.waiting > 0;
        let forwarded = self.forwarded.filter(|(progress_at, _)| *progress_at == self.progress_at).map(|(_, at)| at);
        self.forward_at = (waiting && forwarded.is_none() && !self.is_primary(ctx))
            .then(|| self.progress_at.saturating_add(timeout / 2));
        // Only read while no request waits here (the log is not scanned under load).
        let proposed = (self.changing.is_none() && self.waiting == 0).then(|| self.proposal_waiting_since()).flatten();
        self.suspect = match &self.changing {
            Some(c) => Some(c.deadline.map_or(c.retry_at, |d| d.min(c.retry_at))),
            None if self.waiting == 0 && !self.short_of_known() && proposed.is_none() => None,
            // Half the timeout after the first stage at the soonest: a backup whose first
            // stage ran late (it was paused, say) gets what queued meanwhile in first, or it
            // would suspect a working primary the moment it runs again. With no request
            // waiting here, a proposal waits from when it came (an idle spell before it is
            // no fault of the primary's).
            None => {
                let since = proposed.map_or(self.progress_at, |at| self.progress_at.max(at));
                Some(since.saturating_add(timeout)).max(forwarded.map(|at| at.saturating_add(timeout / 2)))
            }
        };
        self.watch_slots(ctx);
    }

    /// The request timer's second stage, or a view change's timer: suspects the primary,
    /// gives up on a view change whose quorum did not produce a NEW-VIEW in time, or
    /// re-sends this replica's VIEW-CHANGE and asks to be caught up while it waits.
    pub(super) fn on_view_timer(&mut self, ctx: &mut Ctx, now: Nanos) {
        let timeout = ctx.cfg.cluster.params.request_timeout_ns;
        // Maybe only this replica is behind: ask the others what committed, in any case;
        // and maybe its checkpoint votes were lost, leaving the primary at the watermark.
        self.catch_up_request(ctx);
        self.resend_checkpoint_votes(ctx);
        match &mut self.changing {
            None => {
                self.failed_views += 1;
                self.start_view_change(ctx, now, self.view.saturating_add(1));
            }
            Some(c) if c.deadline.is_some_and(|d| d <= now) && c.target < u64::MAX => {
                let next = c.target + 1;
                self.failed_views += 1;
                self.start_view_change(ctx, now, next);
            }
            Some(c) => {
                // No view after the last: its deadline passed for good (faulty replicas
                // led this one there), only the retries remain.
                c.deadline = c.deadline.filter(|&d| d > now);
                c.retries += 1;
                c.retry_at = now.saturating_add(timeout.saturating_mul(1 << c.retries.min(16)));
                self.resend_view_change(ctx, now);
            }
        }
    }

    /// Sends again this replica's VIEW-CHANGE for the view it changes to, signed anew if
    /// a restart lost the one it sent: without it, a quorum may never form.
    pub(super) fn resend_view_change(&mut self, ctx: &mut Ctx, now: Nanos) {
        let Some(target) = self.changing.as_ref().map(|c| c.target) else { return };
        match self.view_changes.get(&ctx.me()) {
            Some(own) if own.view == target => {
                if let Ok(vc) = pb::ViewChange::decode(own.signed.view_change.as_slice()) {
                    ctx.send_to_replicas(pb::body::Kind::ViewChange(Box::new(vc)), &[]);
                }
            }
            _ => self.send_view_change(ctx, now, target),
        }
    }

    /// The request timeout, doubled for every view change since this replica last saw a
    /// batch execute: a new view that brings no progress makes the next wait longer, so
    /// the timers outgrow whatever delays the network has once it stabilises.
    fn backed_off(&self, ctx: &Ctx) -> Nanos {
        ctx.cfg.cluster.params.request_timeout_ns.saturating_mul(1 << self.failed_views.min(16))
    }

    /// The request timer's first stage: every request this replica holds that no batch
    /// of its log carries goes to the primary, once per stretch without progress.
    pub(super) fn forward_waiting(&mut self, ctx: &mut Ctx, now: Nanos) {
        self.forwarded = Some((self.progress_at, now));
        let primary = primary(&self.replicas, self.view);
        let waiting: Vec<pb::Requests> = self
            .queues
            .values()
            .flat_map(|c| c.unproposed.iter().map(|first| c.pending[first].bundle.to_pb()))
            .collect();
        for requests in waiting {
            ctx.send(pb::body::Kind::Requests(requests), [primary]);
        }
    }

    /// Moves to `target` (never back): persists it, then sends a signed VIEW-CHANGE.
    pub(super) fn start_view_change(&mut self, ctx: &mut Ctx, now: Nanos, target: u64) {
        if target <= self.view || self.changing.as_ref().is_some_and(|c| c.target >= target) {
            return;
        }
        self.changing = Some(Changing::new(target, now, ctx.cfg.cluster.params.request_timeout_ns));
        self.batch_deadline = None;
        self.persist_view(ctx, target);
        self.send_view_change(ctx, now, target);
    }

    /// Signs, sends and records a VIEW-CHANGE for `target` stating what this replica
    /// prepared and voted for above its stable checkpoint.
    fn send_view_change(&mut self, ctx: &mut Ctx, now: Nanos, target: u64) {
        let above = self.low + 1;
        let slot_vote = |seq: u64, view: u64, d: &Digest| pb::SlotVote { seq, view, digest: d.to_vec() };
        let mut vc = pb::ViewChange {
            view: target,
            stable: self.stable.clone(),
            prepared: self.prepared.range(above..).map(|(&seq, (view, d))| slot_vote(seq, *view, d)).collect(),
            voted: self
                .voted
                .range(above..)
                .flat_map(|(&seq, vs)| vs.iter().map(move |v| slot_vote(seq, v.view, &v.batch.digest)))
                .collect(),
            signature: vec![],
        };
        vc.signature = ctx.sign_statement(view_change(target, &digest(&vc.encode_to_vec()))).0.to_vec();
        ctx.send_to_replicas(pb::body::Kind::ViewChange(Box::new(vc.clone())), &[]);
        // Votes are taken inside the window above the certified checkpoint, so a
        // replica's own claims are within what every replica accepts.
        let claims = self.claims(ctx, &vc);
        debug_assert!(claims.is_some(), "own VIEW-CHANGE out of bounds: {vc:?}");
        if let Some(claims) = claims {
            let me = ctx.me();
            self.record_view_change(ctx, now, me, vc, claims);
        }
    }

    /// Persists a view before anything is sent in (or for) it: a restart resumes in the
    /// highest one.
    fn persist_view(&mut self, ctx: &mut Ctx, view: u64) {
        ctx.persist(record(Record::View(view)));
        self.durable_view = self.durable_view.max(view);
    }

    pub(super) fn on_view_change(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, vc: pb::ViewChange) {
        if vc.view <= self.view {
            // It changes to a view this one entered: it may have missed the NEW-VIEW, which
            // it takes from this view's primary. (Its claims only decide whether to relay
            // to it, so they are not verified.)
            if self.is_primary(ctx) || self.claims(ctx, &vc).is_some_and(|c| self.shown_uncommitted(&c)) {
                self.relay_new_view(ctx, from);
            }
            return ctx.stats.stale += 1;
        }
        if self.view_changes.get(&from).is_some_and(|r| r.view >= vc.view) {
            return ctx.stats.stale += 1;
        }
        match self.valid_view_change(ctx, from, &vc) {
            Some(claims) => {
                if self.shown_uncommitted(&claims) {
                    self.relay_new_view(ctx, from);
                }
                self.record_view_change(ctx, now, from, vc, claims)
            }
            None => ctx.fault(from, FaultKind::BadSignature),
        }
    }

    /// Whether `claims` hold a prepared claim the NEW-VIEW this replica entered did not
    /// choose.
    fn shown_uncommitted(&self, claims: &Claims) -> bool {
        let Some(e) = &self.entered else { return false };
        claims.prepared.iter().any(|(&seq, &p)| e.decision.withdraws(self.view, seq, p))
    }

    /// Sends `to` the NEW-VIEW this replica entered its view by, once: with it, `to`
    /// enters the view (from its primary), or at least withdraws the claims it shows did
    /// not commit (which could keep their slots from ever being settled).
    fn relay_new_view(&mut self, ctx: &mut Ctx, to: NodeId) {
        if let Some(e) = self.entered.as_mut()
            && e.relayed_to.insert(to)
        {
            ctx.send(pb::body::Kind::NewView(e.new_view.clone()), [to]);
        }
    }

    /// The claims of a VIEW-CHANGE whose signature and stable certificate verify.
    fn valid_view_change(&self, ctx: &mut Ctx, from: NodeId, vc: &pb::ViewChange) -> Option<Claims> {
        let unsigned = pb::ViewChange { signature: vec![], ..vc.clone() };
        let d = digest(&unsigned.encode_to_vec());
        if !ctx.verify_statement(view_change(vc.view, &d), from, &vc.signature) {
            return None;
        }
        if let Some(c) = &vc.stable
            && !verify_certificate(ctx, c)
        {
            return None;
        }
        self.claims(ctx, vc)
    }

    /// What a VIEW-CHANGE claims, if it stays within what a correct replica reports:
    /// slots above its stable checkpoint and inside the window, views before the one it
    /// moves to, one prepared claim per slot, and at most `VOTED_KEPT` distinct votes.
    fn claims(&self, ctx: &Ctx, vc: &pb::ViewChange) -> Option<Claims> {
        let low = vc.stable.as_ref().map_or(0, |c| c.seq);
        // A stale VIEW-CHANGE's claims are read without verifying its certificate.
        let high = low.saturating_add(4 * ctx.cfg.cluster.params.checkpoint_interval as u64);
        let parse = |v: &pb::SlotVote| {
            let d = Digest::try_from(v.digest.as_slice()).ok()?;
            (v.seq > low && v.seq <= high && v.view < vc.view).then_some((v.seq, (v.view, d)))
        };
        let mut claims = Claims { stable: vc.stable.clone(), ..Claims::default() };
        for v in &vc.prepared {
            let (seq, p) = parse(v)?;
            if claims.prepared.insert(seq, p).is_some() {
                return None;
            }
        }
        for v in &vc.voted {
            let (seq, (view, d)) = parse(v)?;
            let votes = claims.voted.entry(seq).or_default();
            if votes.len() >= VOTED_KEPT || votes.iter().any(|(_, x)| *x == d) {
                return None;
            }
            votes.push((view, d));
        }
        Some(claims)
    }

    fn record_view_change(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, vc: pb::ViewChange, claims: Claims) {
        let signed = pb::SignedViewChange { sender: from, view_change: vc.encode_to_vec() };
        self.view_changes.insert(from, Received { view: vc.view, signed, claims });
        // f+1 replicas want a higher view: at least one is correct, so join the lowest.
        let mut higher: Vec<u64> = self.view_changes.values().map(|r| r.view).filter(|&v| v > self.view).collect();
        higher.sort_unstable();
        let current = self.changing.as_ref().map_or(self.view, |c| c.target);
        let f = ctx.quorums.f();
        if higher.len() > f && higher[higher.len() - f - 1] > current {
            let join = higher.iter().copied().find(|&v| v > current).expect("some view is higher");
            self.start_view_change(ctx, now, join);
        }
        self.arm_change_deadline(ctx, now);
        // The next primary announces the view once the VIEW-CHANGEs for it settle it.
        let Some(target) = self.changing.as_ref().map(|c| c.target) else { return };
        if primary(&self.replicas, target) != ctx.me() {
            return;
        }
        let proofs: Vec<&Received> = self.view_changes.values().filter(|r| r.view == target).collect();
        if proofs.len() < ctx.quorums.intersecting() {
            return;
        }
        let claims: Vec<&Claims> = proofs.iter().map(|r| &r.claims).collect();
        let Some(decision) = decide(&claims, ctx.quorums) else { return };
        let nv = pb::NewView { view: target, view_changes: proofs.iter().map(|r| r.signed.clone()).collect() };
        self.enter_view(ctx, now, nv, decision, true);
    }

    /// Starts the timer of the view this replica changes to once a quorum is at that view:
    /// replicas that sent a VIEW-CHANGE for it, or a vote in it (they entered it, from a
    /// NEW-VIEW a faulty primary may have sent them alone, and send no VIEW-CHANGE).
    pub(super) fn arm_change_deadline(&mut self, ctx: &Ctx, now: Nanos) {
        let Some(target) = self.changing.as_ref().filter(|c| c.deadline.is_none()).map(|c| c.target) else {
            return;
        };
        let changing = self.view_changes.iter().filter(|(_, r)| r.view == target).map(|(&from, _)| from);
        let entered = self.early.keys().filter(|&&(view, _)| view == target).map(|&(_, from)| from);
        let at_target: BTreeSet<NodeId> = changing.chain(entered).collect();
        if at_target.len() >= ctx.quorums.intersecting() {
            let timeout = self.backed_off(ctx);
            self.changing.as_mut().expect("checked").deadline = Some(now.saturating_add(timeout));
        }
    }

    /// A NEW-VIEW: valid if it relays valid VIEW-CHANGEs for its view from 2f+1 distinct
    /// replicas that settle every slot. Entered only from the view's primary, and never
    /// for a view below the latest this replica asked for: its VIEW-CHANGE told what it
    /// prepared until then, and that later view's NEW-VIEW may relay it; voting in an
    /// earlier view now would leave that VIEW-CHANGE silent about a batch that may commit
    /// there. Otherwise it only withdraws this replica's prepared claims it did not choose
    /// (any 2f+1 VIEW-CHANGEs for a view choose what committed before it).
    pub(super) fn on_new_view(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, nv: pb::NewView) {
        let enters = from == primary(&self.replicas, nv.view) && nv.view >= self.durable_view;
        let withdraws =
            nv.view > self.withdrawn_through && self.prepared.range(self.low + 1..).any(|(_, &(v, _))| v < nv.view);
        if nv.view <= self.view || !(enters || withdraws) {
            return ctx.stats.stale += 1;
        }
        let mut proofs: BTreeMap<NodeId, Claims> = BTreeMap::new();
        for s in &nv.view_changes {
            let Ok(vc) = pb::ViewChange::decode(s.view_change.as_slice()) else {
                return ctx.fault(from, FaultKind::Malformed);
            };
            let known = self.view_changes.get(&s.sender).filter(|r| r.signed.view_change == s.view_change);
            let claims = match known {
                Some(r) => Some(r.claims.clone()),
                None => self.valid_view_change(ctx, s.sender, &vc),
            };
            match claims {
                Some(claims) if vc.view == nv.view => proofs.insert(s.sender, claims),
                _ => return ctx.fault(from, FaultKind::BadSignature),
            };
        }
        let claims: Vec<&Claims> = proofs.values().collect();
        match decide(&claims, ctx.quorums).filter(|_| proofs.len() >= ctx.quorums.intersecting()) {
            Some(decision) if enters => self.enter_view(ctx, now, nv, decision, false),
            Some(decision) => self.withdraw_unchosen(nv.view, &decision),
            None => ctx.fault(from, FaultKind::Unexpected),
        }
    }

    /// Withdraws the prepared claims a NEW-VIEW for `view` shows did not commit: a claim
    /// kept would only keep later view changes from settling its slot.
    fn withdraw_unchosen(&mut self, view: u64, decision: &Decision) {
        self.withdrawn_through = self.withdrawn_through.max(view);
        self.prepared.retain(|&seq, &mut p| !decision.withdraws(view, seq, p));
    }

    /// Installs `view` with `decision`: adopts its stable checkpoint if newer, returns
    /// every pending request to the queue, and votes for the chosen batches (fetching
    /// those it lacks) before the primary proposes above them. As the view's primary
    /// (`announce`), it sends the NEW-VIEW once it persisted entering the view: a restart
    /// that forgot it could announce another.
    fn enter_view(&mut self, ctx: &mut Ctx, now: Nanos, new_view: pb::NewView, decision: Decision, announce: bool) {
        let view = new_view.view;
        let last = decision.choices.keys().next_back().copied().unwrap_or(0);
        self.view = view;
        self.reproposed = last;
        self.durable_view = self.durable_view.max(view);
        ctx.persist(record(Record::Entered(pb::EnteredView { view, reproposed: last })));
        // (A crash between that sync and the write of the NEW-VIEW leaves the view
        // unannounced: the others move on to the next.)
        if announce {
            ctx.send_to_replicas(pb::body::Kind::NewView(new_view.clone()), &[]);
        }
        ctx.counters.view_changes += 1;
        self.changing = None;
        self.progress_at = now;
        self.view_changes.retain(|_, r| r.view > view);
        self.note_failed_proposals(ctx);
        self.log.clear();
        self.unanimity_waits.clear();
        self.parked.clear();
        self.withdraw_unchosen(view, &decision);
        self.entered = Some(Entered { new_view, decision: decision.clone(), relayed_to: BTreeSet::new() });
        if let Some(cert) = decision.stable.filter(|c| c.seq > self.low) {
            self.adopt_stable(ctx, cert, None);
        }
        self.next_seq = last.max(self.low) + 1;
        // Requests not chosen again may be proposed afresh; every waiting timer restarts.
        self.unproposed.clear();
        self.unproposed_requests = 0;
        self.unproposed_bytes = 0;
        let mut waiting = Vec::new();
        for (&client, c) in &mut self.queues {
            c.unproposed.clear();
            c.unproposed_requests = 0;
            for (&first, w) in &mut c.pending {
                w.arrived = now;
                waiting.push((client, first));
            }
        }
        for (client, first) in waiting {
            self.queue_unproposed(client, first);
        }
        let low = self.low;
        for (seq, choice) in decision.choices.into_iter().filter(|(seq, _)| *seq > low) {
            let batch = match choice {
                Choice::Empty => Some(EncodedBatch::empty()),
                Choice::Batch(d) => self.held_batch(seq, &d),
            };
            match (batch, choice) {
                (Some(batch), _) => self.repropose(ctx, now, seq, batch),
                (None, Choice::Batch(d)) => {
                    self.log.entry(seq).or_default().wanted = Some(d);
                    ctx.send_to_replicas(pb::body::Kind::FetchBatch(pb::FetchBatch { seq, digest: d.to_vec() }), &[]);
                }
                (None, Choice::Empty) => unreachable!("an empty batch is always at hand"),
            }
        }
        // Votes that arrived before this NEW-VIEW.
        // (A NEW-VIEW of view u64::MAX takes every early message along.)
        let later = view.checked_add(1).map(|next| self.early.split_off(&(next, 0))).unwrap_or_default();
        let early = std::mem::replace(&mut self.early, later);
        for ((v, from), kept) in early {
            for m in kept.into_iter().filter(|_| v == view) {
                match m {
                    Early::PrePrepare(pp) => self.on_pre_prepare(ctx, now, from, pp),
                    Early::Prepare(vote) => self.on_prepare(ctx, now, from, vote),
                    Early::Commit(vote) => self.on_commit(ctx, now, from, vote),
                }
            }
        }
        self.propose(ctx, now);
    }

    /// The view ends: requests waiting here that were in one of its proposals that did
    /// not commit failed once more, and their clients are suspected. After two such views
    /// they are dropped: a correct client sends them again, while a faulty one's lie would
    /// stall every view that proposed it. Of a proposal parked here, only the requests
    /// this replica could not authenticate count: they are why it could not vote. Their
    /// clients are suspected even if no request of theirs waits here (a lying client may
    /// have sent this replica another bundle), and the correct clients batched with them
    /// are not.
    fn note_failed_proposals(&mut self, ctx: &mut Ctx) {
        let taken = self.log.values().filter(|s| !s.committed).filter_map(|s| s.proposal.as_ref());
        let unauthenticated: BTreeSet<(NodeId, u64)> = self
            .parked
            .values()
            .flat_map(|p| p.requests.iter().filter_map(|r| r.as_ref().err()))
            .map(|b| (b.client, b.first))
            .collect();
        for &(client, _) in &unauthenticated {
            if self.submitter(ctx, client) {
                self.suspected.insert(client);
            }
        }
        let in_failed: BTreeSet<(NodeId, u64)> =
            taken.flat_map(|b| b.bundles.iter().map(|b| (b.client, b.first))).chain(unauthenticated).collect();
        let mut dropped = Vec::new();
        for (client, first) in in_failed {
            if let Some(w) = self.queues.get_mut(&client).and_then(|q| q.pending.get_mut(&first)) {
                self.suspected.insert(client);
                w.failed += 1;
                if w.failed >= 2 {
                    dropped.push((client, first));
                }
            }
        }
        for (client, first) in dropped {
            ctx.stats.refused += 1;
            self.forget_pending(client, first);
        }
    }

    /// A batch chosen by the NEW-VIEW: voted for in this view like a PRE-PREPARE.
    fn repropose(&mut self, ctx: &mut Ctx, now: Nanos, seq: u64, batch: Arc<EncodedBatch>) {
        if !self.may_vote(ctx, seq, &batch) {
            return;
        }
        self.vote(ctx, seq, &batch);
        self.accept(ctx, now, now, seq, batch);
    }

    /// The batch with digest `d` this replica voted for at `seq`, in any view.
    fn held_batch(&self, seq: u64, d: &Digest) -> Option<Arc<EncodedBatch>> {
        self.voted.get(&seq)?.iter().find(|v| v.batch.digest == *d).map(|v| v.batch.clone())
    }

    pub(super) fn on_fetch_batch(&mut self, ctx: &mut Ctx, from: NodeId, f: pb::FetchBatch) {
        let Ok(d) = Digest::try_from(f.digest.as_slice()) else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        match self.held_batch(f.seq, &d) {
            Some(b) => {
                ctx.send(pb::body::Kind::Proposal(pb::Proposal { seq: f.seq, batch: b.encoded.clone() }), [from])
            }
            // A slot a stable checkpoint settled here (its batch freed): the fetcher is
            // behind that checkpoint, and an idle cluster brings it nothing else to
            // notice (say its primary left it out): it gets what catch-up would send.
            None if f.seq <= self.low && self.stable_snapshot.is_some() => {
                self.on_fetch_state(ctx, from, pb::FetchState { seq: f.seq })
            }
            None => ctx.stats.stale += 1,
        }
    }

    /// A batch this replica fetched: taken if it is the one the NEW-VIEW chose.
    pub(super) fn on_proposal(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, p: pb::Proposal) {
        let wanted = self.log.get(&p.seq).and_then(|s| s.wanted);
        if self.changing.is_some() || wanted != Some(digest(&p.batch)) {
            return ctx.stats.stale += 1;
        }
        // f+1 replicas voted for it, so a correct one authenticated its requests.
        match EncodedBatch::vouched(p.batch) {
            Some(batch) => self.repropose(ctx, now, p.seq, batch),
            None => ctx.fault(from, FaultKind::Malformed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClusterSpec, Node, NodeConfig, Output, crypto::CryptoMode, generate_cluster, wire::bodies_of};

    const A: Digest = [1; 32];
    const B: Digest = [2; 32];

    fn stable(seq: u64) -> Option<pb::Certificate> {
        Some(pb::Certificate { seq, ..Default::default() })
    }

    /// Claims above a stable checkpoint at 4.
    fn claims(prepared: &[(u64, u64, Digest)], voted: &[(u64, u64, Digest)]) -> Claims {
        let mut c = Claims { stable: stable(4), ..Claims::default() };
        for &(seq, view, d) in prepared {
            c.prepared.insert(seq, (view, d));
        }
        for &(seq, view, d) in voted {
            c.voted.entry(seq).or_default().push((view, d));
        }
        c
    }

    fn choices(all: &[Claims], f: usize) -> Option<Vec<(u64, Choice)>> {
        let refs: Vec<&Claims> = all.iter().collect();
        decide(&refs, Quorums::new(3 * f + 1, f)).map(|d| d.choices.into_iter().collect())
    }

    /// A cluster of four replicas (f = 1) and a client: the configurations, and the
    /// replicas' nodes with a `Replica` each.
    fn cluster() -> (Vec<NodeConfig>, Vec<Node>, Vec<Replica>) {
        let spec = ClusterSpec { crypto: CryptoMode::InsecureTest, ..ClusterSpec::pbft(1, 1) };
        let cfgs = generate_cluster(&spec, [5; 32]).unwrap();
        let mut nodes: Vec<Node> = cfgs.iter().take(4).map(|c| Node::new(c.clone()).unwrap()).collect();
        let replicas = nodes.iter_mut().map(|n| Replica::new(n.ctx_mut())).collect();
        (cfgs, nodes, replicas)
    }

    /// What a node sent (each body, with its addressee), and the records it persisted
    /// (at once).
    fn drain(node: &mut Node, records: &mut Vec<Vec<u8>>) -> Vec<(NodeId, pb::body::Kind)> {
        let mut bodies = Vec::new();
        while let Some(o) = node.poll() {
            match o {
                Output::Send { to, bytes } => bodies.extend(bodies_of(&bytes).unwrap().into_iter().map(|b| (to, b))),
                Output::Persist { token, record } => {
                    records.push(record);
                    node.handle(0, crate::Input::Persisted { token }).unwrap()
                }
                _ => {}
            }
        }
        bodies
    }

    /// A request `op` numbered `first`, sealed for the four replicas by the cluster's
    /// client (`cfgs[4]`).
    fn request(cfgs: &[NodeConfig], first: u64, op: &[u8]) -> crate::order::Bundle {
        let mut client = Node::new(cfgs[4].clone()).unwrap();
        let ids: Vec<NodeId> = (0..4).collect();
        let ops = vec![bytes::Bytes::copy_from_slice(op)];
        crate::order::Bundle::parse(crate::order::Bundle::seal(&client.ctx_mut().keys, &ids, first, 0, ops)).unwrap()
    }

    /// f = 1. In view 1 the primary (replica 0) sent A to replicas 1 and 2 and B to 3; 1
    /// and 2 prepared and committed A. Replica 0 now lies that B prepared.
    fn equivocation() -> Vec<Claims> {
        vec![
            claims(&[(5, 1, B)], &[(5, 1, B)]),
            claims(&[(5, 1, A)], &[(5, 1, A)]),
            claims(&[(5, 1, A)], &[(5, 1, A)]),
            claims(&[], &[(5, 1, B)]),
        ]
    }

    #[test]
    fn a_committed_batch_is_chosen_and_a_lie_is_not() {
        let all = equivocation();
        assert_eq!(choices(&all, 1), Some(vec![(5, Choice::Batch(A))]));
        // Replica 2's claim alone with the liar's and 3's: neither A nor B binds, and too
        // few claim nothing, so the primary waits.
        assert_eq!(choices(&[all[0].clone(), all[1].clone(), all[3].clone()], 1), None);
        // Any three that settle the slot settle it on A.
        assert_eq!(choices(&[all[1].clone(), all[2].clone(), all[3].clone()], 1), Some(vec![(5, Choice::Batch(A))]));
    }

    #[test]
    fn a_claim_needs_f_plus_one_votes_behind_it() {
        // Only the liar voted for B at view 3: nothing binds, and three claim nothing.
        let all =
            vec![claims(&[(5, 3, B)], &[(5, 3, B)]), claims(&[], &[]), claims(&[], &[(5, 2, A)]), claims(&[], &[])];
        assert_eq!(choices(&all, 1), Some(vec![(5, Choice::Empty)]));
    }

    #[test]
    fn the_highest_binding_view_wins_and_unclaimed_slots_below_are_empty() {
        // A prepared at view 1 somewhere, B at view 2 (voted by 2 of them): B binds.
        let all = vec![
            claims(&[(7, 1, A)], &[(7, 1, A)]),
            claims(&[(7, 2, B)], &[(7, 2, B), (7, 1, A)]),
            claims(&[], &[(7, 2, B)]),
        ];
        // Slots up to the highest claim are settled; 5 and 6 had no claims at all.
        let got = choices(&all, 1).unwrap();
        assert_eq!(got, vec![(5, Choice::Empty), (6, Choice::Empty), (7, Choice::Batch(B))]);
        // Above a stable checkpoint at 6, only 7 is left.
        let mut later = all.clone();
        later[0].stable = stable(6);
        assert_eq!(choices(&later, 1), Some(vec![(7, Choice::Batch(B))]));
    }

    #[test]
    fn slots_at_or_below_the_highest_stable_checkpoint_are_settled_already() {
        let mut all = equivocation();
        all[3].stable = stable(5);
        assert_eq!(choices(&all, 1), Some(vec![]));
    }

    /// f = 1, replica 0 faulty and silent. Replica 3 prepared D at slot 5 in view 1 (the
    /// PREPAREs reached it alone). Views 2, 5, 6 and 9 were decided from VIEW-CHANGEs of
    /// 0, 1 and 2 (3's was slow): slot 5 was open there, and 1, 2 and 3 voted for four
    /// other batches, none of which prepared; 3 re-proposed D alone as primary of view 7.
    /// Keeping `VOTED_KEPT` = 4 votes per slot, 1 and 2 no longer report their vote for D,
    /// so D binds nowhere (one vote behind it). But both voted for another batch at slot 5
    /// after view 1: D cannot have committed, and the slot is settled with the batch all
    /// three voted for last (it may have committed on every replica's vote).
    #[test]
    fn the_correct_replicas_view_changes_settle_a_slot_whose_old_votes_were_pushed_out() {
        const D: Digest = [9; 32];
        let (x2, x5, x6, x9) = ([12; 32], [15; 32], [16; 32], [19; 32]);
        let others = [(5, 2, x2), (5, 5, x5), (5, 6, x6), (5, 9, x9)];
        let correct = vec![
            claims(&[], &others),
            claims(&[], &others),
            claims(&[(5, 1, D)], &[(5, 9, x9), (5, 7, D), (5, 6, x6), (5, 5, x5)]),
        ];
        assert_eq!(choices(&correct, 1), Some(vec![(5, Choice::Batch(x9))]));
    }

    /// A batch every replica voted for commits without a prepared claim anywhere (f = 1):
    /// any 2f+1 VIEW-CHANGEs, a faulty one that tells nothing among them, show f+1 votes
    /// for it, and it is chosen.
    #[test]
    fn a_batch_every_replica_voted_for_is_chosen_without_a_prepared_claim() {
        let all = vec![claims(&[], &[(5, 1, A)]), claims(&[], &[(5, 1, A)]), claims(&[], &[])];
        assert_eq!(choices(&all, 1), Some(vec![(5, Choice::Batch(A))]));
        // One vote may be a faulty replica's word alone: the slot stays open.
        let lone = vec![claims(&[], &[(5, 1, A)]), claims(&[], &[]), claims(&[], &[])];
        assert_eq!(choices(&lone, 1), Some(vec![]));
    }

    /// B prepared at slot 5 in view 1 at replica 0 without committing, then every replica
    /// voted for A there in view 2, which so committed. B's claim still has f+1 votes
    /// behind it and nothing higher claimed, but f+1 later votes for A contradict it: A is
    /// chosen, not B.
    #[test]
    fn a_claim_that_later_unanimous_votes_contradict_does_not_bind() {
        let all = vec![
            claims(&[(5, 1, B)], &[(5, 2, A), (5, 1, B)]),
            claims(&[], &[(5, 2, A), (5, 1, B)]),
            claims(&[], &[(5, 2, A)]),
        ];
        assert_eq!(choices(&all, 1), Some(vec![(5, Choice::Batch(A))]));
    }

    /// A committed batch's claim is never set aside by f replicas that say they voted for
    /// another batch later: f = 1, replicas 1 and 2 prepared and committed A in view 1
    /// (with the faulty replica 0's vote), replica 2's VIEW-CHANGE is slow, and replica 0
    /// now claims a later vote for B. A binds nowhere yet, and the slot waits for 2.
    #[test]
    fn a_claim_only_f_contradict_keeps_its_slot_from_being_settled_empty() {
        let all = vec![claims(&[], &[(5, 3, B)]), claims(&[(5, 1, A)], &[(5, 1, A)]), claims(&[], &[])];
        assert_eq!(choices(&all, 1), None);
    }

    /// Entering a view withdraws the prepared claims its NEW-VIEW did not choose (empty,
    /// another batch, or left open above every claim), and keeps the one it chose.
    #[test]
    fn entering_a_view_withdraws_the_prepared_claims_it_did_not_choose() {
        let (_, mut nodes, mut replicas) = cluster();
        let (ctx, mut replica) = (nodes[1].ctx_mut(), replicas.remove(1));
        for (seq, d) in [(5, A), (6, A), (7, B), (8, A)] {
            replica.prepared.insert(seq, (1, d));
        }
        let choices = [(5, Choice::Empty), (6, Choice::Batch(A)), (7, Choice::Batch(A))].into_iter().collect();
        let new_view = pb::NewView { view: 2, view_changes: vec![] };
        replica.enter_view(ctx, 0, new_view, Decision { stable: None, choices }, false);
        assert_eq!(replica.prepared.into_iter().collect::<Vec<_>>(), vec![(6, (1, A))]);
    }

    /// f = 1. Replica 3 prepared D at slot 1 in view 0 and missed view 1, whose NEW-VIEW
    /// (from the VIEW-CHANGEs of 0, 1 and 2) left slot 1 open. When 3's VIEW-CHANGE for
    /// view 2 still claims D, replica 0 relays that NEW-VIEW, and 3 withdraws the claim
    /// (not entering view 1, which it left already, from a replica not its primary).
    #[test]
    fn a_replica_that_missed_a_new_view_withdraws_the_claims_it_did_not_choose() {
        const D: Digest = [9; 32];
        let (_, mut nodes, mut replicas) = cluster();
        let sent = |node: &mut Node| drain(node, &mut Vec::new());
        replicas[3].prepared.insert(1, (0, D));
        let mut view_changes = Vec::new();
        for r in 0..3 {
            replicas[r].start_view_change(nodes[r].ctx_mut(), 0, 1);
            view_changes.extend(sent(&mut nodes[r]).into_iter().filter_map(|(_, b)| match b {
                pb::body::Kind::ViewChange(vc) => Some((r as NodeId, *vc)),
                _ => None,
            }));
        }
        for (from, vc) in view_changes.iter().filter(|(from, _)| *from != 1) {
            replicas[1].on_view_change(nodes[1].ctx_mut(), 0, *from, vc.clone());
        }
        let new_view = sent(&mut nodes[1]).into_iter().find_map(|(_, b)| match b {
            pb::body::Kind::NewView(nv) => Some(nv),
            _ => None,
        });
        replicas[0].on_new_view(nodes[0].ctx_mut(), 0, 1, new_view.expect("replica 1's NEW-VIEW"));
        assert_eq!(replicas[0].view, 1);
        sent(&mut nodes[0]);

        replicas[3].start_view_change(nodes[3].ctx_mut(), 0, 2);
        let own = sent(&mut nodes[3]).into_iter().find_map(|(_, b)| match b {
            pb::body::Kind::ViewChange(vc) => Some(*vc),
            _ => None,
        });
        replicas[0].on_view_change(nodes[0].ctx_mut(), 0, 3, own.expect("replica 3's VIEW-CHANGE"));
        let relayed: Vec<pb::NewView> = sent(&mut nodes[0])
            .into_iter()
            .filter_map(|(to, b)| match b {
                pb::body::Kind::NewView(nv) if to == 3 => Some(nv),
                _ => None,
            })
            .collect();
        let [relayed] = &relayed[..] else { panic!("{} NEW-VIEWs relayed to 3", relayed.len()) };
        assert_eq!(replicas[3].prepared.len(), 1);
        replicas[3].on_new_view(nodes[3].ctx_mut(), 0, 0, relayed.clone());
        assert!(replicas[3].prepared.is_empty(), "replica 3 still claims {:?}", replicas[3].prepared);
        assert_eq!((replicas[3].view, replicas[3].changing.as_ref().map(|c| c.target)), (0, Some(2)));
        // The same NEW-VIEW again is not checked again (a faulty replica could send it
        // forever), even with a claim it would withdraw.
        replicas[3].prepared.insert(2, (0, D));
        let stale = nodes[3].ctx_mut().stats.stale;
        replicas[3].on_new_view(nodes[3].ctx_mut(), 0, 0, relayed.clone());
        assert_eq!((replicas[3].prepared.len(), nodes[3].ctx_mut().stats.stale), (1, stale + 1));
    }

    /// A stale VIEW-CHANGE's claims are read unverified (only to decide whether to relay
    /// to its sender): a stable checkpoint at the last seq is no overflow.
    #[test]
    fn a_stale_view_change_with_any_stable_seq_is_read_safely() {
        let (_, mut nodes, mut replicas) = cluster();
        let (ctx, replica) = (nodes[0].ctx_mut(), &mut replicas[0]);
        replica.view = 1;
        let vc = pb::ViewChange { view: 1, stable: stable(u64::MAX), ..Default::default() };
        replica.on_view_change(ctx, 0, 3, vc);
        assert_eq!(ctx.stats.stale, 1);
    }

    /// A backup parked a PRE-PREPARE of view 0 (its request's authenticator failed here)
    /// and then started changing to view 1. The client's own copy of the request arrives,
    /// and a PREPARE for the slot: the backup takes no part in view 0 any more (its
    /// VIEW-CHANGE told what it voted for there), so it neither votes nor prepares.
    #[test]
    fn a_replica_changing_views_does_not_vote_for_a_batch_it_parked_in_the_old_view() {
        let (cfgs, mut nodes, mut replicas) = cluster();
        let request = request(&cfgs, 1, b"op");
        let batch = EncodedBatch::new(vec![Arc::new(request.clone())]);
        let parked = super::super::Parked {
            seen_at: 0,
            encoded: batch.encoded.clone(),
            digest: batch.digest,
            requests: vec![Err(request.clone())],
        };
        let (ctx, backup) = (nodes[3].ctx_mut(), &mut replicas[3]);
        backup.parked.insert(1, parked);
        backup.start_view_change(ctx, 0, 1);
        drain(&mut nodes[3], &mut Vec::new());

        let (ctx, backup) = (nodes[3].ctx_mut(), &mut replicas[3]);
        backup.queue_requests(ctx, 0, request);
        for from in [0, 1, 2] {
            backup.on_prepare(ctx, 0, from, pb::Vote { view: 0, seq: 1, digest: batch.digest.to_vec() });
        }
        let mut records = Vec::new();
        let votes: Vec<_> = drain(&mut nodes[3], &mut records)
            .into_iter()
            .filter(|(_, b)| matches!(b, pb::body::Kind::Prepare(_) | pb::body::Kind::Commit(_)))
            .collect();
        assert!(votes.is_empty() && records.is_empty(), "voted in view 0 while changing: {votes:?}");
        assert!(replicas[3].voted.is_empty() && replicas[3].prepared.is_empty());
    }

    /// A replica votes for one batch per slot and view, whatever its log holds: here its
    /// vote for A in view 1 was read before the record of entering view 1 (which empties
    /// the log), so no slot shows it, and it must still refuse the primary's B there.
    #[test]
    fn a_replica_never_votes_for_two_batches_at_one_slot_in_one_view() {
        let (cfgs, _, _) = cluster();
        let a = EncodedBatch::new(vec![Arc::new(request(&cfgs, 1, b"a"))]);
        let b = EncodedBatch::new(vec![]);
        let mut node = Node::new(cfgs[3].clone()).unwrap();
        let mut replica = Replica::new(node.ctx_mut());
        let records = [
            record(Record::View(1)),
            a.accepted_record(1, 2),
            record(Record::Entered(pb::EnteredView { view: 1, reproposed: 1 })),
        ];
        for r in &records {
            replica.recover(node.ctx_mut(), 0, r).unwrap();
        }
        std::iter::from_fn(|| node.poll()).for_each(drop);
        let Some(Record::Accepted(pp)) = pb::ReplicaRecord::decode(&b.accepted_record(1, 2)[..]).unwrap().kind else {
            unreachable!("an accepted record")
        };
        replica.on_pre_prepare(node.ctx_mut(), 0, 1, pp);
        let out: Vec<_> = std::iter::from_fn(|| node.poll()).collect();
        assert!(
            out.iter().all(|o| !matches!(o, Output::Persist { .. } | Output::Send { .. })),
            "voted for a second batch: {out:?}"
        );
    }

    /// Replica 3 prepared P at slot 1 in view 0 (and sent COMMIT for it); the NEW-VIEW for
    /// view 1 settled slot 1 empty, and 3 voted for that, then restarted. Recovered, its
    /// slot holds view 1's batch alone: it sends again its PREPARE for the empty batch and
    /// no COMMIT (it sent none in view 1), and takes view 1's votes without calling
    /// anyone an equivocator.
    #[test]
    fn a_replica_restarted_in_a_new_view_keeps_nothing_of_the_old_views_slots() {
        let (cfgs, _, _) = cluster();
        let p = EncodedBatch::new(vec![Arc::new(request(&cfgs, 1, b"p"))]);
        let mut node = Node::new(cfgs[3].clone()).unwrap();
        let mut replica = Replica::new(node.ctx_mut());
        let prepared = pb::SlotVote { seq: 1, view: 0, digest: p.digest.to_vec() };
        let empty = EncodedBatch::new(vec![]);
        let records = [
            p.accepted_record(0, 1),
            record(Record::Prepared(prepared)),
            record(Record::View(1)),
            record(Record::Entered(pb::EnteredView { view: 1, reproposed: 1 })),
            empty.accepted_record(1, 1),
        ];
        for r in &records {
            replica.recover(node.ctx_mut(), 0, r).unwrap();
        }
        let votes: Vec<(u64, Vec<u8>, bool)> = replica
            .own_votes(node.ctx_mut(), 1)
            .into_iter()
            .filter_map(|b| match b {
                pb::body::Kind::Prepare(v) => Some((v.view, v.digest, false)),
                pb::body::Kind::Commit(v) => Some((v.view, v.digest, true)),
                _ => None,
            })
            .collect();
        assert_eq!(votes, vec![(1, empty.digest.to_vec(), false)]);
        let vote = pb::Vote { view: 1, seq: 1, digest: empty.digest.to_vec() };
        replica.on_prepare(node.ctx_mut(), 0, 0, vote);
        let faults: Vec<_> = std::iter::from_fn(|| node.poll()).filter(|o| matches!(o, Output::Fault { .. })).collect();
        assert!(faults.is_empty(), "{faults:?}");
    }

    /// f = 1. Slot 1 prepared D in view 0 at replicas 0 and 2 (and committed there, with
    /// the faulty replica 3's votes); replica 1, primary of view 1, never got it. The
    /// NEW-VIEW for view 1 chose D there, and 1 went to fetch it, but restarted before it
    /// came. Back in view 1, it must not propose a batch of its own at slot 1: that vote,
    /// reported in its next VIEW-CHANGE, contradicts D's claims, and with one made-up
    /// vote of the faulty replica it settles slot 1 empty (or, with a made-up prepared
    /// claim, binds another batch) though D committed.
    #[test]
    fn a_primary_restarted_while_fetching_a_chosen_batch_proposes_nothing_of_its_own_there() {
        let (cfgs, mut nodes, mut replicas) = cluster();
        let d = EncodedBatch::new(vec![Arc::new(request(&cfgs, 1, b"d"))]);
        for r in [0, 2] {
            replicas[r].note_voted(1, 0, d.clone());
            replicas[r].prepared.insert(1, (0, d.digest));
        }
        let (mut records, mut ignored) = (Vec::new(), Vec::new());
        let mut view_changes = Vec::new();
        for r in 0..3 {
            replicas[r].start_view_change(nodes[r].ctx_mut(), 0, 1);
            let out = if r == 1 { &mut records } else { &mut ignored };
            view_changes.extend(drain(&mut nodes[r], out).into_iter().filter_map(|(_, b)| match b {
                pb::body::Kind::ViewChange(vc) => Some((r as NodeId, *vc)),
                _ => None,
            }));
        }
        for (from, vc) in view_changes.into_iter().filter(|(from, _)| *from != 1) {
            replicas[1].on_view_change(nodes[1].ctx_mut(), 0, from, vc);
        }
        drain(&mut nodes[1], &mut records);
        assert_eq!((replicas[1].view, replicas[1].reproposed), (1, 1), "view 1 chose D at slot 1");
        assert!(replicas[1].held_batch(1, &d.digest).is_none(), "replica 1 fetches D");

        // Replica 1 restarts from its records, and a request comes in.
        let mut node = Node::new(cfgs[1].clone()).unwrap();
        let mut restarted = Replica::new(node.ctx_mut());
        for record in &records {
            restarted.recover(node.ctx_mut(), 0, record).unwrap();
        }
        assert_eq!((restarted.view, restarted.reproposed, restarted.changing.is_none()), (1, 1, true));
        restarted.queue_requests(node.ctx_mut(), 0, request(&cfgs, 2, b"x"));
        restarted.propose(node.ctx_mut(), 1 << 40);
        let proposed: Vec<u64> = drain(&mut node, &mut Vec::new())
            .into_iter()
            .filter_map(|(_, b)| match b {
                pb::body::Kind::PrePrepare(pp) => Some(pp.seq),
                _ => None,
            })
            .collect();
        let own: Vec<(u64, Digest)> =
            restarted.voted.get(&1).into_iter().flatten().map(|v| (v.view, v.batch.digest)).collect();
        // The VIEW-CHANGEs for view 2 of replicas 1 and 0 (which claims D), and the faulty
        // replica 3's, which makes up a vote at slot 1 in view 1.
        let view_change_claims = |replica: &mut Replica, node: &mut Node| {
            replica.start_view_change(node.ctx_mut(), 1 << 40, 2);
            let vc = drain(node, &mut Vec::new()).into_iter().find_map(|(_, b)| match b {
                pb::body::Kind::ViewChange(vc) => Some(*vc),
                _ => None,
            });
            replica.claims(node.ctx_mut(), &vc.expect("a VIEW-CHANGE")).expect("valid claims")
        };
        let faulty = Claims { voted: [(1, vec![(1, [7; 32])])].into_iter().collect(), ..Claims::default() };
        let all = [
            view_change_claims(&mut restarted, &mut node),
            faulty,
            view_change_claims(&mut replicas[0], &mut nodes[0]),
        ];
        let chosen = decide(&all.iter().collect::<Vec<_>>(), Quorums::new(4, 1)).map(|d| d.choices);
        assert_ne!(chosen.and_then(|c| c.get(&1).copied()), Some(Choice::Empty), "D committed at slot 1");
        assert!(
            own.iter().all(|&(_, x)| x == d.digest) && proposed.iter().all(|&s| s > 1),
            "replica 1 proposed at {proposed:?} and voted {own:?} at slot 1, which view 1 gave D"
        );
    }

    /// The primary's PRE-PREPARE leaves before its vote is durable (its PREPARE waits for
    /// that). Restarted after a crash that lost the vote's record, the primary cannot know
    /// what it proposed, so it proposes nothing more in that view: another batch at the
    /// slot would be equivocation.
    #[test]
    fn a_primary_restarted_before_its_proposal_was_synced_proposes_nothing_more_in_its_view() {
        let (cfgs, mut nodes, mut replicas) = cluster();
        let (node, replica) = (&mut nodes[0], &mut replicas[0]);
        replica.queue_requests(node.ctx_mut(), 0, request(&cfgs, 1, b"a"));
        replica.propose(node.ctx_mut(), 0);
        // Syncs the record that it proposes in view 0, and not the vote's.
        let (mut synced, mut sent, mut unsynced) = (Vec::new(), Vec::new(), Vec::new());
        while let Some(o) = node.poll() {
            match o {
                Output::Send { bytes, .. } => sent.extend(bodies_of(&bytes).unwrap()),
                Output::Persist { token, record } if synced.is_empty() => {
                    synced.push(record);
                    node.handle(0, crate::Input::Persisted { token }).unwrap();
                }
                Output::Persist { record, .. } => unsynced.push(record),
                _ => {}
            }
        }
        let kind = |r: &Vec<u8>| pb::ReplicaRecord::decode(&r[..]).unwrap().kind;
        assert!(matches!(kind(&synced[0]), Some(Record::Proposing(0))));
        assert!(matches!(unsynced.iter().map(kind).collect::<Vec<_>>()[..], [Some(Record::Accepted(_))]));
        let proposed = sent.iter().filter(|b| matches!(b, pb::body::Kind::PrePrepare(_))).count();
        assert_eq!((proposed, sent.len()), (3, 3), "a PRE-PREPARE to each backup, and no PREPARE: {sent:?}");

        let mut node = Node::new(cfgs[0].clone()).unwrap();
        let mut restarted = Replica::new(node.ctx_mut());
        for record in &synced {
            restarted.recover(node.ctx_mut(), 0, record).unwrap();
        }
        restarted.queue_requests(node.ctx_mut(), 0, request(&cfgs, 1, b"b"));
        restarted.propose(node.ctx_mut(), 1 << 40);
        let sent = drain(&mut node, &mut Vec::new());
        assert!(sent.is_empty(), "proposed again in view 0: {sent:?}");
        assert_eq!(restarted.view, 0);
    }
}
