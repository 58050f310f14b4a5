//! View change. A replica whose oldest waiting request outlives `request_timeout_ns`
//! (doubled for every view change that made no progress) suspects the primary and sends
//! a signed VIEW-CHANGE for the next view, carrying its stable checkpoint certificate and
//! a certificate (2f+1 aggregated PREPARE signatures) for every slot it prepared. It joins
//! a higher view once f+1 replicas ask for one. The new primary, holding 2f+1 valid
//! VIEW-CHANGEs, sends them as NEW-VIEW; every replica derives the same re-proposals from
//! them — for each sequence number above the highest stable checkpoint, the batch of the
//! highest-view certificate, or an empty batch — and PREPAREs them in the new view. A
//! batch committed anywhere was prepared by f+1 correct replicas, one of which is in any
//! 2f+1 VIEW-CHANGEs, so it is re-proposed unchanged.

use std::collections::BTreeMap;

use prost::Message;

use super::{CHECKPOINT, Early, PREPARE, Record, Replica, Slot, public_key, record, sign, verify_certificate};
use crate::crypto::{BlsSignature, digest};
use crate::node::Ctx;
use crate::order::batch::EncodedBatch;
use crate::order::{batch_digest, primary, signed_message};
use crate::wire::pb;
use crate::{FaultKind, Nanos, NodeId};

const VIEW_CHANGE: &[u8; 4] = b"vchg";

pub(super) struct Changing {
    pub target: u64,
    pub deadline: Nanos,
}

/// A verified VIEW-CHANGE: its view and the signed bytes to relay in a NEW-VIEW.
pub(super) struct Received {
    pub view: u64,
    signed: pb::SignedViewChange,
}

impl Replica {
    /// When this replica next suspects the primary: the view change under way times out,
    /// or requests wait without a batch executing for the request timeout.
    pub(super) fn rearm(&mut self, ctx: &Ctx) {
        let timeout = ctx.cfg.cluster.params.request_timeout_ns.saturating_mul(1 << self.failed_views.min(16));
        self.suspect = match &self.changing {
            Some(c) => Some(c.deadline),
            None if self.waiting == 0 => None,
            None => Some(self.progress_at.saturating_add(timeout)),
        };
    }

    /// Moves to `target` (never back): persists it, then sends a signed VIEW-CHANGE.
    pub(super) fn start_view_change(&mut self, ctx: &mut Ctx, now: Nanos, target: u64) {
        if target <= self.view || self.changing.as_ref().is_some_and(|c| c.target >= target) {
            return;
        }
        let timeout = ctx.cfg.cluster.params.request_timeout_ns.saturating_mul(1 << self.failed_views.min(16));
        self.changing = Some(Changing { target, deadline: now.saturating_add(timeout) });
        self.batch_deadline = None;
        self.persist_view(ctx, target);
        let mut vc = pb::ViewChange {
            view: target,
            stable: self.stable.clone(),
            prepared: self.prepared_certificates(),
            signature: vec![],
        };
        vc.signature = sign(ctx, VIEW_CHANGE, target, 0, &digest(&vc.encode_to_vec()));
        ctx.send_to_brokers(pb::body::Kind::ViewChange(Box::new(vc.clone())), &[]);
        let me = ctx.me();
        self.record_view_change(ctx, now, me, vc);
    }

    /// Persists a view before anything is sent in (or for) it: a restart resumes in the
    /// highest one.
    fn persist_view(&mut self, ctx: &mut Ctx, view: u64) {
        ctx.persist(record(Record::View(view)));
        self.durable_view = self.durable_view.max(view);
    }

    /// Certificates for the prepared slots above the stable checkpoint.
    fn prepared_certificates(&self) -> Vec<pb::PreparedEntry> {
        self.prepared
            .range(self.low + 1..)
            .map(|(_, p)| pb::PreparedEntry { certificate: Some(p.certificate.clone()), batch: Some(p.batch.to_pb()) })
            .collect()
    }

    pub(super) fn on_view_change(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, vc: pb::ViewChange) {
        if vc.view <= self.view || self.view_changes.get(&from).is_some_and(|r| r.view >= vc.view) {
            return ctx.stats.stale += 1;
        }
        if !self.valid_view_change(ctx, from, &vc) {
            return ctx.fault(from, FaultKind::BadSignature);
        }
        self.record_view_change(ctx, now, from, vc);
    }

    /// Signature, stable certificate, and every prepared certificate with its batch.
    fn valid_view_change(&self, ctx: &mut Ctx, from: NodeId, vc: &pb::ViewChange) -> bool {
        let unsigned = pb::ViewChange { signature: vec![], ..vc.clone() };
        let message = signed_message(VIEW_CHANGE, vc.view, 0, &digest(&unsigned.encode_to_vec()));
        let signed = match (<[u8; 96]>::try_from(vc.signature.as_slice()), public_key(ctx, from)) {
            (Ok(s), Some(pk)) => ctx.verify_signature(&pk, &message, &BlsSignature(s)),
            _ => false,
        };
        let stable_seq = vc.stable.as_ref().map_or(0, |c| c.seq);
        let stable_ok = vc.stable.as_ref().is_none_or(|c| verify_certificate(ctx, CHECKPOINT, c, self.quorum));
        let prepared_ok = vc.prepared.iter().all(|e| {
            let (Some(c), Some(b)) = (&e.certificate, &e.batch) else { return false };
            c.seq > stable_seq
                && c.view < vc.view
                && c.digest == batch_digest(b)
                && verify_certificate(ctx, PREPARE, c, self.quorum)
        });
        signed && stable_ok && prepared_ok
    }

    fn record_view_change(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, vc: pb::ViewChange) {
        let signed = pb::SignedViewChange { sender: from, view_change: vc.encode_to_vec() };
        self.view_changes.insert(from, Received { view: vc.view, signed });
        // f+1 replicas want a higher view: at least one is correct, so join the lowest.
        let mut higher: Vec<u64> = self.view_changes.values().map(|r| r.view).filter(|&v| v > self.view).collect();
        higher.sort_unstable();
        let current = self.changing.as_ref().map_or(self.view, |c| c.target);
        if higher.len() > ctx.f && higher[higher.len() - ctx.f - 1] > current {
            let join = higher.iter().copied().find(|&v| v > current).expect("some view is higher");
            self.start_view_change(ctx, now, join);
        }
        // The next primary announces the view once 2f+1 ask for it.
        let Some(target) = self.changing.as_ref().map(|c| c.target) else { return };
        if primary(&self.replicas, target) != ctx.me() {
            return;
        }
        let proofs: Vec<pb::SignedViewChange> =
            self.view_changes.values().filter(|r| r.view == target).map(|r| r.signed.clone()).collect();
        if proofs.len() >= self.quorum {
            let nv = pb::NewView { view: target, view_changes: proofs };
            ctx.send_to_brokers(pb::body::Kind::NewView(nv.clone()), &[]);
            let me = ctx.me();
            self.on_new_view(ctx, now, me, nv);
        }
    }

    pub(super) fn on_new_view(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, nv: pb::NewView) {
        if nv.view <= self.view || from != primary(&self.replicas, nv.view) {
            return ctx.stats.stale += 1;
        }
        let mut proofs: BTreeMap<NodeId, pb::ViewChange> = BTreeMap::new();
        for s in &nv.view_changes {
            let Ok(vc) = pb::ViewChange::decode(s.view_change.as_slice()) else {
                return ctx.fault(from, FaultKind::Malformed);
            };
            let known = self.view_changes.get(&s.sender).is_some_and(|r| r.signed.view_change == s.view_change);
            if vc.view != nv.view || !(known || self.valid_view_change(ctx, s.sender, &vc)) {
                return ctx.fault(from, FaultKind::BadSignature);
            }
            proofs.insert(s.sender, vc);
        }
        if proofs.len() < self.quorum {
            return ctx.fault(from, FaultKind::Unexpected);
        }
        self.enter_view(ctx, now, nv.view, proofs.into_values().collect());
    }

    /// Installs view `view` from 2f+1 valid VIEW-CHANGEs: adopts the highest stable
    /// checkpoint among them and re-proposes, for each later sequence number, the batch
    /// of the highest-view prepared certificate, or an empty batch.
    fn enter_view(&mut self, ctx: &mut Ctx, now: Nanos, view: u64, proofs: Vec<pb::ViewChange>) {
        self.persist_view(ctx, view);
        ctx.counters.view_changes += 1;
        let stable = proofs.iter().filter_map(|vc| vc.stable.clone()).max_by_key(|c| c.seq);
        let stable_seq = stable.as_ref().map_or(0, |c| c.seq).max(self.low);
        let mut chosen: BTreeMap<u64, (u64, Vec<pb::Operation>)> = BTreeMap::new();
        for e in proofs.iter().flat_map(|vc| &vc.prepared) {
            let (Some(c), Some(b)) = (&e.certificate, &e.batch) else { continue };
            if c.seq > stable_seq && chosen.get(&c.seq).is_none_or(|(v, _)| c.view > *v) {
                chosen.insert(c.seq, (c.view, b.ops.clone()));
            }
        }
        let last = chosen.keys().next_back().copied().unwrap_or(stable_seq);
        self.view = view;
        self.changing = None;
        self.progress_at = now;
        self.failed_views = 0;
        self.view_changes.retain(|_, r| r.view > view);
        self.log.clear();
        self.parked.clear();
        if let Some(cert) = stable.filter(|c| c.seq > self.low) {
            self.adopt_stable(ctx, cert, None);
        }
        self.next_seq = last + 1;
        // Requests not re-proposed may be proposed afresh; every waiting timer restarts.
        self.unproposed_bytes = 0;
        for c in self.clients.values_mut() {
            c.unproposed = c.pending.keys().copied().collect();
            for p in c.pending.values_mut() {
                p.arrived = now;
                self.unproposed_bytes += p.size;
            }
        }
        self.waiting = self.clients.values().map(|c| c.pending.len()).sum();
        self.unproposed = self.clients.iter().flat_map(|(&c, s)| s.pending.keys().map(move |&r| (now, c, r))).collect();
        for seq in stable_seq + 1..=last {
            let ops = chosen.remove(&seq).map(|(_, ops)| ops).unwrap_or_default();
            let batch = EncodedBatch::new(pb::Batch { ops });
            let d = batch.digest;
            for o in &batch.ops {
                self.mark_in_log(o.client, o.request);
            }
            self.log.insert(seq, Slot { proposal: Some(batch), seen_at: now, ..Slot::default() });
            let vote = pb::Vote { view, seq, digest: d.to_vec(), signature: sign(ctx, PREPARE, view, seq, &d) };
            ctx.send_to_brokers(pb::body::Kind::Prepare(vote.clone()), &[]);
            let me = ctx.me();
            self.on_prepare(ctx, now, me, vote);
        }
        // Votes that arrived before this NEW-VIEW.
        let later = self.early.split_off(&(view + 1, 0));
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
}
