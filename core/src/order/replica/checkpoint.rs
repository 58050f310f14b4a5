//! Checkpoints and catching up. Every K batches each replica signs the digest of its
//! state (the application snapshot and the exactly-once table); 2f+1 matching
//! signatures, aggregated, make a stable checkpoint that frees the log and storage below
//! it. The replicas certify it in turn, not all at once (see [`CERTIFY_TURN_NS`]).
//!
//! A replica left behind asks its peers: f+1 matching committed batches, or a checkpoint
//! state whose digest a certificate (or f+1 peers) vouches for, bring it up, and their
//! votes for what has not committed yet let it commit that with them. It asks when it
//! sees a checkpoint it has not reached become stable, when it knows a slot committed
//! that it cannot commit itself, and, a few times, when it starts: none of these needs
//! new requests, so it also catches up in an idle cluster.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use prost::Message;

use super::clients::Executed;
use super::{Record, Replica, record};
use crate::crypto::{BlsSignature, Digest, digest};
use crate::node::{Ctx, Output};
use crate::order::EncodedBatch;
use crate::statement::{Signed, Statement};
use crate::wire::pb;
use crate::{FaultKind, Nanos, NodeId};

/// Checkpoint votes kept per replica: enough to see the latest ones become stable.
const CHECKPOINT_VOTES_KEPT: usize = 4;

/// The highest checkpoint a replica installs: beyond any run (at a batch a nanosecond,
/// 146 years), and low enough that the windows above it (four checkpoint intervals,
/// each below 2^32) and the slots after it never overflow. Only f+1 faulty replicas,
/// offering one state, or a certificate 2f+1 of them signed, could name a higher one.
const MAX_CHECKPOINT: u64 = 1 << 62;

/// How long after a quorum voted for a checkpoint a replica waits, per place after the
/// primary in the group, to certify it (at most until half an interval more executed, so
/// its window never lags). Certifying costs an aggregate BLS check and persisting the
/// state (and, now and then, compacting the log). While one replica pays that the others
/// still make a quorum; all at once, they stalled every slot meanwhile: with 4 replicas
/// on one core, `phalanxd bench --clients 50 --outstanding 1` saw the slot after each
/// checkpoint take 5-25 ms instead of 1-2, and a p99 latency 5-7 times the median.
/// Longer than one certification takes (about 2 ms of CPU here).
pub(crate) const CERTIFY_TURN_NS: Nanos = 10_000_000;

/// A checkpoint a quorum voted for, waiting for this replica's turn to certify it.
pub(super) struct QuorumCheckpoint {
    seq: u64,
    digest: Digest,
    /// The quorum's votes: replica and signature.
    votes: Vec<(NodeId, Vec<u8>)>,
    /// When this replica's turn comes.
    pub(super) turn: Nanos,
}

impl Replica {
    /// Batch `seq` executed with the application snapshot `app`: signs the checkpoint.
    /// If a quorum certified it while the host was still taking the snapshot, no vote is
    /// wanted any more; the state completes the stable record instead (so storage can
    /// compact, and peers that fetch the state get it), if it is the certified one.
    pub(super) fn take_checkpoint(&mut self, ctx: &mut Ctx, now: Nanos, seq: u64, app: Vec<u8>) {
        let state = Bytes::from(self.checkpoint_state(app));
        if seq > self.low {
            self.vote_checkpoint(ctx, now, seq, state);
        } else if self.stable_snapshot.is_none()
            && self.stable.as_ref().is_some_and(|c| c.seq == seq && c.digest == digest(&state))
        {
            self.complete_stable(ctx, state);
        }
    }

    /// The state of the stable checkpoint, which this replica saw become stable without it.
    fn complete_stable(&mut self, ctx: &mut Ctx, state: Bytes) {
        self.stable_snapshot = Some(state);
        self.persist_stable(ctx);
    }

    /// Signs and sends a vote for `state` as checkpoint `seq`, the state this replica holds
    /// after batch `seq`: executed itself, or installed by state transfer (a replica that
    /// caught up that way votes too, or a checkpoint most correct replicas reached by
    /// state transfer would never become stable).
    fn vote_checkpoint(&mut self, ctx: &mut Ctx, now: Nanos, seq: u64, state: Bytes) {
        let d = digest(&state);
        self.snapshots.insert(seq, (d, state));
        let signature = ctx.sign_statement(checkpoint(seq, &d)).0.to_vec();
        let vote = pb::CheckpointVote { seq, digest: d.to_vec(), signature };
        ctx.send_to_replicas(pb::body::Kind::Checkpoint(vote.clone()), &[]);
        self.on_checkpoint(ctx, now, ctx.me(), vote);
    }

    /// Sends again this replica's votes for checkpoints not yet stable: a lost vote is
    /// otherwise never sent again, and without a stable checkpoint the primary stops at
    /// the watermark.
    pub(super) fn resend_checkpoint_votes(&mut self, ctx: &mut Ctx) {
        let Some(own) = self.checkpoint_votes.get(&ctx.me()) else { return };
        let votes: Vec<pb::CheckpointVote> = own
            .range(self.low + 1..)
            .map(|(&seq, (d, signature))| pb::CheckpointVote { seq, digest: d.to_vec(), signature: signature.clone() })
            .collect();
        for vote in votes {
            ctx.send_to_replicas(pb::body::Kind::Checkpoint(vote), &[]);
        }
    }

    pub(super) fn on_checkpoint(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, c: pb::CheckpointVote) {
        let k = ctx.cfg.cluster.params.checkpoint_interval as u64;
        let Ok(d) = Digest::try_from(c.digest.as_slice()) else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        if !c.seq.is_multiple_of(k) || c.seq <= self.low {
            return ctx.stats.stale += 1;
        }
        let votes = self.checkpoint_votes.entry(from).or_default();
        votes.insert(c.seq, (d, c.signature));
        while votes.len() > CHECKPOINT_VOTES_KEPT {
            votes.pop_first();
        }
        if self.quorum_checkpoint.as_ref().is_some_and(|q| q.seq >= c.seq) {
            return;
        }
        // The votes are kept as they are now: a faulty replica's later votes push its
        // earlier ones out of `checkpoint_votes`, and must not take the quorum away.
        let votes: Vec<(NodeId, Vec<u8>)> = self.votes_for(c.seq, d).map(|(r, s)| (r, s.clone())).collect();
        if votes.len() >= ctx.quorums.intersecting() {
            // The primary first: its watermark is the one that holds proposals back.
            let n = self.replicas.len() as u64;
            let me = self.replicas.iter().position(|&r| r == ctx.me()).unwrap_or(0) as u64;
            let place = (me + n - self.view % n) % n;
            // A checkpoint still waiting hands its turn on: a replica behind a run of them
            // waits no longer than for the first.
            let turn = now
                .saturating_add(place * CERTIFY_TURN_NS)
                .min(self.quorum_checkpoint.as_ref().map_or(Nanos::MAX, |q| q.turn));
            self.quorum_checkpoint = Some(QuorumCheckpoint { seq: c.seq, digest: d, votes, turn });
        }
    }

    /// When this replica certifies the checkpoint a quorum voted for: on its turn (see
    /// [`CERTIFY_TURN_NS`]). Not having executed that far, at once (the checkpoint is how
    /// it learns it is behind, and certifying frees the slots below it for a state
    /// transfer), unless it holds a proposal for every slot up to it: then their commits
    /// are likely on the way, and it waits for them until a turn after its own.
    pub(super) fn certify_at(&self, q: &QuorumCheckpoint) -> Nanos {
        if self.delivered >= q.seq {
            return q.turn;
        }
        let held = |seq: u64| self.log.get(&seq).is_some_and(|slot| slot.proposal.is_some());
        if (self.delivered + 1..=q.seq).all(held) { q.turn.saturating_add(CERTIFY_TURN_NS) } else { 0 }
    }

    /// Certifies the checkpoint a quorum voted for when `certify_at` says, or once half an
    /// interval of batches executed since, or at once if this replica changes views.
    pub(super) fn certify_if_due(&mut self, ctx: &mut Ctx, now: Nanos) {
        let half_interval = ctx.cfg.cluster.params.checkpoint_interval as u64 / 2;
        let due = self.quorum_checkpoint.as_ref().is_some_and(|q| {
            self.certify_at(q) <= now || self.executed >= q.seq + half_interval || self.changing.is_some()
        });
        let Some(q) = self.quorum_checkpoint.take_if(|_| due) else { return };
        if q.seq > self.low {
            // The quorum's votes, and those that came since: if a vote in the quorum
            // proves invalid, the later ones may still make one, and no vote may come again.
            let mut votes: BTreeMap<NodeId, Vec<u8>> = q.votes.into_iter().collect();
            for (r, s) in self.votes_for(q.seq, q.digest) {
                votes.entry(r).or_insert_with(|| s.clone());
            }
            self.make_stable(ctx, q.seq, q.digest, &votes.into_iter().collect::<Vec<_>>());
        }
        // The watermark window moved: the primary may have batches waiting for it.
        self.propose(ctx, now);
    }

    /// Each replica's vote for checkpoint `seq` with digest `d`: its signature.
    fn votes_for(&self, seq: u64, d: Digest) -> impl Iterator<Item = (NodeId, &Vec<u8>)> {
        self.checkpoint_votes
            .iter()
            .filter_map(move |(r, v)| v.get(&seq).filter(|(x, _)| *x == d).map(|(_, s)| (*r, s)))
    }

    /// 2f+1 replicas signed checkpoint (seq, digest): verifies and aggregates their
    /// signatures into a certificate, and frees the log up to it.
    fn make_stable(&mut self, ctx: &mut Ctx, seq: u64, d: Digest, votes: &[(NodeId, Vec<u8>)]) {
        match certify(ctx, seq, &d, votes) {
            Ok(cert) => self.adopt_stable(ctx, cert, None),
            Err(bad) => {
                for r in bad {
                    if let Some(v) = self.checkpoint_votes.get_mut(&r) {
                        v.remove(&seq);
                    }
                }
            }
        }
    }

    /// A checkpoint certificate newer than ours: frees the log below it, persists it with
    /// its state if known (`state`, or this replica's own snapshot), and fetches the state
    /// if this replica has not executed that far.
    pub(super) fn adopt_stable(&mut self, ctx: &mut Ctx, cert: pb::Certificate, state: Option<Bytes>) {
        let seq = cert.seq;
        // Never an older checkpoint's state, nor this replica's own if its digest is not
        // the certified one: either would be served, and persisted, with this certificate.
        let own = self.snapshots.get(&seq).filter(|(d, _)| d.as_slice() == cert.digest).map(|(_, s)| s.clone());
        self.stable_snapshot = state.or(own);
        self.stable = Some(cert);
        self.low = seq;
        self.free_below(seq);
        self.next_seq = self.next_seq.max(seq + 1);
        self.persist_stable(ctx);
        self.fetch_state(ctx);
    }

    /// Drops everything about slots at or below `seq`, now settled by a checkpoint.
    pub(super) fn free_below(&mut self, seq: u64) {
        let above = seq + 1;
        let kept = self.log.split_off(&above);
        self.settled = std::mem::replace(&mut self.log, kept);
        self.parked = self.parked.split_off(&above);
        self.snapshots = self.snapshots.split_off(&above);
        self.prepared = self.prepared.split_off(&above);
        self.voted = self.voted.split_off(&above);
        self.catch_up = self.catch_up.split_off(&above);
        for votes in self.checkpoint_votes.values_mut() {
            *votes = votes.split_off(&above);
        }
    }

    /// Persists the stable checkpoint. With its state, it is a point to restart from: the
    /// records before it become obsolete once everything else a restart needs follows it
    /// (the view it changes to and the one it is in, the votes and prepared slots above
    /// the checkpoint, how far it executed), so the host is told it may compact its storage.
    pub(super) fn persist_stable(&self, ctx: &mut Ctx) {
        let Some(cert) = self.stable.clone() else { return };
        let stable = cert.seq;
        let Some(state) = self.stable_snapshot.clone() else {
            ctx.persist(record(Record::Stable(cert)));
            return;
        };
        let token = ctx.persist(record(Record::StableState(pb::StableState { certificate: Some(cert), state })));
        if self.own_lease > 0 {
            ctx.persist(record(Record::OwnRequests(self.own_lease)));
        }
        ctx.persist(record(Record::View(self.durable_view)));
        ctx.persist(record(Record::Entered(pb::EnteredView { view: self.view, reproposed: self.reproposed })));
        if self.proposing == Some(self.view) || self.proposed_before == Some(self.view) {
            ctx.persist(record(Record::Proposing(self.view)));
        }
        for (&seq, votes) in &self.voted {
            for v in votes {
                ctx.persist(v.batch.accepted_record(v.view, seq));
            }
        }
        for (&seq, &(view, d)) in &self.prepared {
            ctx.persist(record(Record::Prepared(pb::SlotVote { seq, view, digest: d.to_vec() })));
        }
        // How far it may have answered, where the prepared slots do not say it (batches
        // above them executed without preparing here, caught up): a restart answers no
        // read before that.
        let answered = self.delivered.max(self.answer_from);
        let prepared = self.prepared.keys().next_back().copied().unwrap_or(0);
        if answered > stable.max(prepared) {
            ctx.persist(record(Record::Delivered(answered)));
        }
        ctx.push(Output::Compact { token });
    }

    /// The state a checkpoint certifies: the application snapshot and the exactly-once
    /// table, encoded deterministically.
    fn checkpoint_state(&self, app: Vec<u8>) -> Vec<u8> {
        // A `pb::CheckpointState { app, clients }`, its records written in place.
        let mut state = Vec::with_capacity(app.len() + 64 * self.table.len());
        if !app.is_empty() {
            prost::encoding::bytes::encode(1, &app, &mut state);
        }
        for (&client, c) in &self.table {
            c.encode_record(client, 2, &mut state);
        }
        state
    }

    /// Asks the other replicas for what this replica has not executed: the state of the
    /// stable checkpoint if it is behind it, or batches it knows committed elsewhere
    /// (`behind`, which after a restart covers what it may have executed before); asked
    /// again every `request_timeout_ns / 4` until done. It also asks as often as it owes
    /// (`asks_owed`), regardless.
    pub(super) fn fetch_state(&mut self, ctx: &mut Ctx) {
        self.fetch_at = None;
        if self.short_of_known() || self.asks_owed > 0 {
            self.asks_owed = self.asks_owed.saturating_sub(1);
            self.catch_up_request(ctx);
            self.fetch_at = Some(self.last_now.saturating_add(ctx.cfg.cluster.params.request_timeout_ns / 4));
        }
    }

    /// Watches the slots above what this replica handed over, if any wait: lost PREPAREs
    /// or COMMITs are never sent again, and in an idle cluster nothing else would tell
    /// it that its peers went on without it (no client waits on it, no checkpoint comes).
    /// Not during a view change, whose timer asks already.
    pub(super) fn watch_slots(&mut self, ctx: &Ctx) {
        if self.fetch_at.is_none() && self.changing.is_none() && self.slots_waiting() {
            self.fetch_at = Some(self.last_now.saturating_add(ctx.cfg.cluster.params.request_timeout_ns / 4));
            self.stall_watch = Some(self.delivered);
        }
    }

    /// Whether the slots watched since `fetch_at` was armed still wait, nothing handed
    /// over meanwhile.
    pub(super) fn stalled(&self) -> bool {
        self.changing.is_none() && self.stall_watch == Some(self.delivered) && self.slots_waiting()
    }

    /// Whether slots above what this replica handed over are in its log.
    fn slots_waiting(&self) -> bool {
        self.log.range(self.delivered + 1..).next().is_some()
    }

    /// When this replica first saw the earliest of the proposals it accepted above what
    /// it handed over, if there are any.
    pub(super) fn proposal_waiting_since(&self) -> Option<Nanos> {
        self.log.range(self.delivered + 1..).filter(|(_, slot)| slot.proposal.is_some()).map(|(_, s)| s.seen_at).min()
    }

    /// Whether this replica executed less than it knows is settled: the stable checkpoint,
    /// or a slot it knows committed elsewhere.
    pub(super) fn short_of_known(&self) -> bool {
        self.executed < self.low.max(self.behind)
    }

    /// A vote for slot `seq` of this view: if it is more than twice the pipeline beyond
    /// what this replica handed to its host, its peers executed past that (a correct
    /// primary proposes at most `pipeline` batches beyond what it executed), so this
    /// replica asks for what it misses rather than wait for slots whose messages it never
    /// got (say they were sent while it was down). One ask more is owed per such vote, at
    /// most one every `request_timeout_ns / 4`: a faulty voter gets no more asks than it
    /// sends votes, and nothing it says is adopted on its word.
    pub(super) fn note_vote_ahead(&mut self, ctx: &mut Ctx, seq: u64) {
        if seq <= self.delivered + 2 * ctx.cfg.cluster.params.pipeline as u64 {
            return;
        }
        self.asks_owed = self.asks_owed.max(1);
        if self.fetch_at.is_none() {
            self.fetch_state(ctx);
        }
    }

    /// Asks for what follows what this replica executed; with every slot of its window
    /// executed, from its stable point on instead: then what it lacks is the certificate
    /// of a checkpoint it executed (too few matching votes reached it to certify one), and
    /// a peer answers with its stable state and certificate first.
    pub(super) fn catch_up_request(&mut self, ctx: &mut Ctx) {
        let window_done = self.executed >= self.low && !self.in_window(ctx, self.executed + 1);
        let seq = if window_done { self.low + 1 } else { self.executed + 1 };
        ctx.send_to_replicas(pb::body::Kind::FetchState(pb::FetchState { seq }), &[]);
    }

    /// Answers a replica that lacks `f.seq` onwards: the state of the stable checkpoint if
    /// it is at or after `f.seq`, with its certificate, else the state at the newest
    /// checkpoint at or after it this replica took, bare (the fetcher checks it against its
    /// own certificate or f+1 matching offers); then the committed batches after, then its
    /// votes for the slots after those. The certified state is sent rather than a newer
    /// bare one: it needs nobody else's word, and a fetcher that hears fewer than
    /// f+1 peers (say their connections to it are not back yet) gets no other.
    pub(super) fn on_fetch_state(&mut self, ctx: &mut Ctx, from: NodeId, f: pb::FetchState) {
        let stable = match (&self.stable, &self.stable_snapshot) {
            (Some(cert), Some(state)) if cert.seq >= f.seq => Some((cert.seq, Some(cert.clone()), state.clone())),
            _ => None,
        };
        let state = stable
            .or_else(|| self.snapshots.range(f.seq..).next_back().map(|(&seq, (_, state))| (seq, None, state.clone())));
        let after = state.as_ref().map_or(f.seq, |(seq, _, _)| seq + 1);
        if let Some((seq, checkpoint, state)) = state {
            ctx.send(pb::body::Kind::State(Box::new(pb::State { seq, checkpoint, state })), [from]);
        }
        let committed: Vec<pb::Committed> = self
            .log
            .range(after..)
            .take_while(|(seq, _)| **seq <= self.delivered)
            .filter(|(_, s)| s.committed)
            .filter_map(|(&seq, s)| s.proposal.as_ref().map(|b| pb::Committed { seq, batch: b.encoded.clone() }))
            .collect();
        for c in committed {
            ctx.send(pb::body::Kind::Committed(c), [from]);
        }
        // And this replica's votes in its view from there on, committed here or not: a
        // peer that restarted (or whose restart came after this replica's) lost them, and
        // where this replica alone committed a slot its COMMIT is what the others lack
        // (its Committed offer is one of the f+1 they would need otherwise).
        if self.changing.is_none() {
            for vote in self.own_votes(ctx, after) {
                ctx.send(vote, [from]);
            }
        }
    }

    /// A committed batch offered in catch-up: adopted once f+1 replicas offer the same.
    pub(super) fn on_committed(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, c: pb::Committed) {
        if c.seq <= self.delivered || !self.in_window(ctx, c.seq) {
            return ctx.stats.stale += 1;
        }
        // Offers for slots executed since are moot: without this they stayed, one per slot,
        // in a replica that never needed catching up.
        self.catch_up = self.catch_up.split_off(&(self.delivered + 1));
        let d = digest(&c.batch);
        let offers = self.catch_up.entry(c.seq).or_default();
        offers.insert(from, (d, c.batch));
        if offers.values().filter(|(x, _)| *x == d).count() < ctx.quorums.one_correct() {
            return;
        }
        let (_, encoded) = offers.remove(&from).expect("just inserted");
        self.catch_up.remove(&c.seq);
        // f+1 offers include a correct replica's: its requests were authenticated.
        let Some(batch) = EncodedBatch::vouched(encoded) else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        let Some(slot) = self.slot(c.seq) else { return };
        slot.proposal = Some(batch);
        slot.committed = true;
        self.caught_up(ctx, now);
    }

    /// Progress through catch-up: execute what came. A view change under way stays: this
    /// replica's VIEW-CHANGE told what it prepared in the old view, so it votes there no
    /// more, even if nobody else joins it.
    pub(super) fn caught_up(&mut self, ctx: &mut Ctx, now: Nanos) {
        let before = self.delivered;
        self.execute_ready(ctx);
        if self.delivered > before {
            self.progress_at = now;
        }
        self.catch_up = self.catch_up.split_off(&(self.delivered + 1));
        self.propose(ctx, now);
    }

    /// State transfer: a state beyond what this replica executed whose digest a
    /// checkpoint certificate names (the one sent along, or our own stable one).
    pub(super) fn on_state(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, s: pb::State) {
        // A state this replica's host will reach by executing what it was handed: a
        // restore to it would come after those batches and take the store back in time
        // (its certificate may still be news).
        if s.seq <= self.delivered {
            return self.on_certificate_of_executed(ctx, from, s);
        }
        if s.seq > MAX_CHECKPOINT {
            return ctx.fault(from, FaultKind::Unexpected);
        }
        let d = digest(&s.state);
        let certified = match &s.checkpoint {
            Some(cert) if cert.seq == s.seq && verify_certificate(ctx, cert) => Some(cert.clone()),
            Some(_) => return ctx.fault(from, FaultKind::BadSignature),
            None => self.stable.clone().filter(|c| c.seq == s.seq),
        };
        if let Some(cert) = &certified
            && d.as_slice() != cert.digest
        {
            return ctx.fault(from, FaultKind::BadSignature);
        }
        // Without a certificate, f+1 replicas offering the same state include a correct one.
        if certified.is_none() {
            self.offered_states.insert(from, (s.seq, d, s.state.clone()));
            let matching = self.offered_states.values().filter(|(seq, x, _)| *seq == s.seq && *x == d).count();
            if matching < ctx.quorums.one_correct() {
                return;
            }
        }
        self.offered_states.clear();
        let Ok(state) = pb::CheckpointState::decode(s.state.clone()) else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        let newer = certified.filter(|c| c.seq > self.low);
        self.install_state(ctx, s.seq, state);
        // Execution moved on (the requests the state holds are done): progress for the
        // request timer, or a replica that can catch up only by state transfer (it hears
        // too few peers for f+1 matching batches) suspects a working primary.
        self.progress_at = now;
        match newer {
            Some(cert) => self.adopt_stable(ctx, cert, Some(s.state)),
            // The state of the checkpoint this replica saw become stable without it.
            None if self.stable.as_ref().is_some_and(|c| c.seq == s.seq) => self.complete_stable(ctx, s.state),
            None => {
                // Uncertified, so not persisted: a restart must answer no read before it.
                ctx.persist(record(Record::Delivered(s.seq)));
                // Older than the stable checkpoint this replica knows of (the peer had
                // not reached it when it answered): a step toward it, asked for again below.
                if s.seq >= self.low {
                    self.vote_checkpoint(ctx, now, s.seq, s.state);
                }
            }
        }
        self.fetch_at = None;
        self.caught_up(ctx, now);
        if self.short_of_known() {
            self.fetch_state(ctx);
        }
    }

    /// A state this replica handed over already: nothing to install, but if its host
    /// executed that far, the state's certificate, newer than the stable checkpoint, moves
    /// the window on.
    fn on_certificate_of_executed(&mut self, ctx: &mut Ctx, from: NodeId, s: pb::State) {
        let Some(cert) = s.checkpoint.filter(|c| c.seq == s.seq && c.seq > self.low && c.seq <= self.executed) else {
            return ctx.stats.stale += 1;
        };
        if digest(&s.state).as_slice() != cert.digest || !verify_certificate(ctx, &cert) {
            return ctx.fault(from, FaultKind::BadSignature);
        }
        self.adopt_stable(ctx, cert, Some(s.state));
    }

    /// Replaces what this replica executed with the state of checkpoint `seq`: the
    /// exactly-once table, the application (the host restores it) and the execution point.
    /// State transfer and a restart from a persisted stable checkpoint both install so.
    pub(super) fn install_state(&mut self, ctx: &mut Ctx, seq: u64, state: pb::CheckpointState) {
        self.table = state.clients.into_iter().map(|r| (r.client, Executed::installed(r))).collect();
        let superseded: Vec<(NodeId, u64)> = self
            .queues
            .iter()
            .flat_map(|(&client, q)| {
                let executed = self.table.get(&client);
                executed.map(|e| q.superseded(e)).unwrap_or_default().into_iter().map(move |first| (client, first))
            })
            .collect();
        for (client, first) in superseded {
            self.forget_pending(client, first);
        }
        self.hand(ctx, Output::Restore { seq, snapshot: state.app });
        // Batches handed over before are superseded: their answers are let pass.
        self.superseded = self.delivered;
        self.executing.clear();
        self.executed = seq;
        self.delivered = seq;
        // The window stays at the certified checkpoint: what this replica voted for above
        // it still goes into its VIEW-CHANGEs. Nothing at or below `seq` is voted for again.
        self.log = self.log.split_off(&(seq + 1));
        self.parked = self.parked.split_off(&(seq + 1));
    }
}

/// The statement a checkpoint vote signs.
fn checkpoint(seq: u64, digest: &[u8]) -> Signed<'_> {
    Signed { statement: Statement::Checkpoint, view: 0, seq, digest }
}

/// Aggregates checkpoint signatures on (seq, digest) into a certificate: a single
/// aggregate check when all are valid; otherwise each is checked, invalid signers are
/// reported as faults, and if fewer than a quorum remain valid they are returned so
/// their votes can be dropped.
fn certify(ctx: &mut Ctx, seq: u64, d: &Digest, votes: &[(NodeId, Vec<u8>)]) -> Result<pb::Certificate, Vec<NodeId>> {
    debug_assert!(votes.len() >= ctx.quorums.intersecting(), "no replica accepts a certificate from fewer");
    let statement = checkpoint(seq, d);
    let certificate =
        |signers, agg: BlsSignature| pb::Certificate { seq, digest: d.to_vec(), signers, signature: agg.0.to_vec() };
    let signature = |s: &[u8]| <[u8; 96]>::try_from(s).ok().map(BlsSignature);
    let signers: Vec<NodeId> = votes.iter().map(|(r, _)| *r).collect();
    let all: Option<Vec<BlsSignature>> = votes.iter().map(|(_, s)| signature(s)).collect();
    if let Some(agg) = all.and_then(|sigs| ctx.aggregate(&sigs))
        && ctx.verify_statement_aggregate(statement, &signers, &agg.0)
    {
        return Ok(certificate(signers, agg));
    }
    let (good, bad): (Vec<_>, Vec<_>) = votes.iter().partition(|(r, s)| ctx.verify_statement(statement, *r, s));
    let bad: Vec<NodeId> = bad.into_iter().map(|(r, _)| *r).collect();
    for &r in &bad {
        ctx.fault(r, FaultKind::BadSignature);
    }
    if good.len() < ctx.quorums.intersecting() {
        return Err(bad);
    }
    let sigs: Vec<BlsSignature> = good.iter().filter_map(|(_, s)| signature(s)).collect();
    let agg = ctx.aggregate(&sigs).ok_or_else(|| bad.clone())?;
    Ok(certificate(good.iter().map(|(r, _)| *r).collect(), agg))
}

/// Verifies a checkpoint certificate: a quorum of distinct replicas' signatures on its
/// statement.
pub(super) fn verify_certificate(ctx: &mut Ctx, cert: &pb::Certificate) -> bool {
    let signers: BTreeSet<NodeId> = cert.signers.iter().copied().collect();
    if signers.len() != cert.signers.len() || signers.len() < ctx.quorums.intersecting() || cert.seq > MAX_CHECKPOINT {
        return false;
    }
    ctx.verify_statement_aggregate(checkpoint(cert.seq, &cert.digest), &cert.signers, &cert.signature)
}
