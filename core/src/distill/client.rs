//! The distillation client (spec §5 steps 1, 4, 11, and sign-up): one message in flight
//! at a time, submitted with the lowest seq of its range; it signs a batch root only
//! after checking its own entry under it and that the raise is justified by a certified
//! height record, and accepts a delivery only with f+1 server signatures and its entry's
//! proof. A broker that stalls is left for the next after `resubmit_timeout`, with the
//! very same submission (deduplication resolves a double delivery). A message equal to
//! the one delivered just before it is not delivered again (spec §5 step 9: the servers
//! nudge it to that one's seq); it completes with that seq. The message in flight is
//! persisted before it leaves: a restarted client resubmits it at once, before anything
//! else (its completion then reported to no one), since a new message at its seq would be
//! dropped for good had that one been delivered meanwhile.

use std::collections::{BTreeMap, VecDeque};

use prost::Message;

use super::batch::verify_proof;
use super::directory::{Directory, ed_key};
use super::{
    CLIENT_ADDRESS_BASE, Servers, assign_statement, broadcast_auth_statement, broadcast_statement, earliest,
    open_frame, record_root, reduction_auth_statement, reduction_statement, send_frame, sign_up_statement,
    verify_record,
};
use crate::config::Role;
use crate::crypto::{BlsSignature, Digest, EdSecretKey, digest};
use crate::node::{Ctx, HandleError, Output};
use crate::role::RoleMachine;
use crate::wire::pb::distill_frame::Kind as Frame;
use crate::wire::{Opened, pb};
use crate::{FaultKind, Input, Nanos, NodeId, Request};

/// The message in flight.
struct Current {
    /// None for a message resubmitted after a restart.
    request: Option<u64>,
    msg: Vec<u8>,
    submit: pb::Submit,
    deadline: Nanos,
}

pub(crate) struct Client {
    servers: Servers,
    ed: EdSecretKey,
    id: Option<u64>,
    brokers: Vec<NodeId>,
    broker: usize,
    lo: u64,
    hi: u64,
    /// The highest certified height record seen (of a delivery, or the top that
    /// justified a raise signed): it justifies the next seq, which may reach hi.
    record: Option<pb::HeightRecord>,
    queue: VecDeque<(u64, Vec<u8>)>,
    current: Option<Current>,
    /// The seq and digest of the message delivered last (persisted): the same message
    /// submitted next is delivered, nudged, at that seq.
    last: Option<(u64, Digest)>,
    next_request: u64,
    /// Sign-up: each server's assignment share, and when to ask again.
    assigned: BTreeMap<usize, (u64, BlsSignature)>,
    sign_up_at: Option<Nanos>,
    /// A signed-up client's certificate of its id, shown to brokers.
    assignment: Option<pb::Assignment>,
}

impl Client {
    pub fn new(ctx: &Ctx) -> Self {
        let mode = ctx.cfg.cluster.crypto;
        let p = &ctx.cfg.cluster.params;
        // A generated client's address names its id, if its key is that id's.
        let id = ctx.me().checked_sub(CLIENT_ADDRESS_BASE).map(u64::from).filter(|&d| {
            let mut dir = Directory::new(mode, p.directory_seed, p.directory_size);
            dir.get(d).is_some_and(|k| k.bls.bytes == ctx.cfg.bls_secret.public_key())
        });
        let brokers: Vec<NodeId> =
            ctx.cfg.cluster.nodes.iter().filter(|n| n.role == Role::DistillBroker).map(|n| n.id).collect();
        // Clients spread over the brokers.
        let broker = (ctx.me() as usize) % brokers.len().max(1);
        Client {
            servers: Servers::new(ctx),
            ed: ed_key(mode, ctx.cfg.bls_secret.key_material()),
            id,
            brokers,
            broker,
            lo: 0,
            hi: 0,
            record: None,
            queue: VecDeque::new(),
            current: None,
            last: None,
            next_request: 1,
            assigned: BTreeMap::new(),
            sign_up_at: id.is_none().then_some(0),
            assignment: None,
        }
    }

    fn per_leaf(ctx: &Ctx) -> usize {
        ctx.cfg.cluster.params.leaf_entries as usize
    }

    fn sign_up(&mut self, ctx: &mut Ctx, now: Nanos) {
        let (ed, bls) = (self.ed.public_key().0, ctx.cfg.bls_secret.public_key().0);
        let msg = sign_up_statement(&self.servers.system_id, &ed, &bls);
        let s = pb::SignUp {
            ed_key: ed.to_vec(),
            bls_key: bls.to_vec(),
            ed_pop: self.ed.sign(&msg).0.to_vec(),
            bls_pop: ctx.sign(&msg).0.to_vec(),
        };
        for &server in &self.servers.ids.clone() {
            send_frame(ctx, server, Frame::SignUp(s.clone()));
        }
        self.sign_up_at = Some(now + ctx.cfg.cluster.params.resubmit_timeout_ns);
    }

    /// S1: f+1 servers assigned the same id to our keys.
    fn on_assigned(&mut self, ctx: &mut Ctx, now: Nanos, server: usize, a: pb::Assigned) {
        let (ed, bls) = (self.ed.public_key().0, ctx.cfg.bls_secret.public_key().0);
        if self.id.is_some() || a.ed_key[..] != ed[..] || a.bls_key[..] != bls[..] {
            return ctx.stats.stale += 1;
        }
        let Ok(sig) = <[u8; 96]>::try_from(a.signature.as_slice()) else {
            return ctx.fault(self.servers.ids[server], FaultKind::Malformed);
        };
        let msg = assign_statement(&self.servers.system_id, a.id, &ed, &bls);
        if !self.servers.verify_share(ctx, server, &msg, &BlsSignature(sig)) {
            return ctx.fault(self.servers.ids[server], FaultKind::BadSignature);
        }
        self.assigned.insert(server, (a.id, BlsSignature(sig)));
        let matching: Vec<(usize, BlsSignature)> =
            self.assigned.iter().filter(|(_, (id, _))| *id == a.id).map(|(i, (_, s))| (*i, *s)).collect();
        if matching.len() < self.servers.p {
            return;
        }
        let (signers, sigs): (Vec<usize>, Vec<BlsSignature>) = matching.into_iter().unzip();
        let certificate = self.servers.certificate(&signers, &sigs);
        self.assignment = Some(pb::Assignment { id: a.id, ed_key: ed.to_vec(), bls_key: bls.to_vec(), certificate });
        self.id = Some(a.id);
        self.sign_up_at = None;
        self.assigned.clear();
        if !self.next(ctx, now) {
            self.persist(ctx);
        }
    }

    fn persist(&self, ctx: &mut Ctx) {
        let Some(id) = self.id else { return };
        let in_flight = self.current.as_ref().map(|c| pb::InFlight { seq: c.submit.seq, msg: c.msg.clone() });
        let r = pb::DistillClientRecord {
            id,
            lo: self.lo,
            hi: self.hi,
            record: self.record.clone(),
            assignment: self.assignment.clone(),
            last: self.last.map(|(seq, d)| pb::LastDelivered { seq, digest: d.to_vec() }),
            in_flight,
        };
        ctx.persist(r.encode_to_vec());
    }

    /// Step 1: the next message goes out with seq = lo, to the current broker, persisted
    /// first. Whether one went out.
    fn next(&mut self, ctx: &mut Ctx, now: Nanos) -> bool {
        let Some(id) = self.id.filter(|_| self.current.is_none() && !self.brokers.is_empty()) else { return false };
        let Some((request, msg)) = self.queue.pop_front() else { return false };
        let submit = self.submission(id, self.lo, msg.clone());
        let deadline = now + ctx.cfg.cluster.params.resubmit_timeout_ns;
        self.current = Some(Current { request: Some(request), msg, submit: submit.clone(), deadline });
        self.persist(ctx);
        send_frame(ctx, self.brokers[self.broker], Frame::Submit(submit));
        true
    }

    /// M1 for `msg` at `seq`, with the height record that justifies it.
    fn submission(&self, id: u64, seq: u64, msg: Vec<u8>) -> pb::Submit {
        let signature = self.ed.sign(&broadcast_statement(&self.servers.system_id, id, seq, &msg)).0.to_vec();
        let (record, auth) = match &self.record {
            Some(r) if seq > 0 => {
                let auth = self.ed.sign(&broadcast_auth_statement(&self.servers.system_id, id, r.height, &r.root));
                (Some(r.clone()), auth.0.to_vec())
            }
            _ => (None, vec![]),
        };
        let assignment = self.assignment.clone();
        pb::Submit { id, seq, msg, signature, record, auth, assignment }
    }

    /// Step 4: signs R1 only for its own entry at a justified raise.
    fn on_inclusion(&mut self, ctx: &mut Ctx, from: NodeId, inc: pb::Inclusion) {
        let (Some(id), Some(cur)) = (self.id, &self.current) else { return ctx.stats.stale += 1 };
        let (Some(proof), Ok(root)) = (&inc.proof, <[u8; 32]>::try_from(inc.root.as_slice())) else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        if !verify_proof(&root, Self::per_leaf(ctx), id, inc.raise, &cur.msg, proof) || inc.raise < self.lo {
            return ctx.fault(from, FaultKind::Unexpected);
        }
        if inc.raise > 0 {
            let justified = inc.top.as_ref().is_some_and(|t| {
                inc.raise <= t.height && record_root(t).is_some() && verify_record(&self.servers, ctx, t)
            });
            if !justified {
                return ctx.fault(from, FaultKind::Unexpected);
            }
        }
        if inc.raise > self.hi {
            // Durable before the share leaves: a restart must not reuse a seq up to it.
            self.hi = inc.raise;
            // Verified above (the raise is above 0): it justifies a next seq up to it.
            self.keep_higher(inc.top);
            self.persist(ctx);
        }
        // Uncompressed: the client takes the square root the broker would.
        let share = ctx.sign(&reduction_statement(&self.servers.system_id, &root)).share_bytes(self.servers.mode);
        let auth = self.ed.sign(&reduction_auth_statement(&self.servers.system_id, id, &root, &share));
        let r = pb::Reduction { id, root: root.to_vec(), share, auth: auth.0.to_vec() };
        send_frame(ctx, from, Frame::Reduction(r));
    }

    /// Step 11: a delivery certified by f+1 servers with our entry under its root.
    fn on_delivery(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, d: pb::Delivery) {
        let (Some(id), Some(cur)) = (self.id, &self.current) else { return ctx.stats.stale += 1 };
        let (Some(record), Some(proof)) = (&d.record, &d.proof) else {
            return ctx.fault(from, FaultKind::Malformed);
        };
        let Some(root) = record_root(record) else { return ctx.fault(from, FaultKind::Malformed) };
        let sent = digest(&cur.msg);
        let nudged = self.last == Some((d.seq, sent));
        if !(nudged || (self.lo..=self.hi).contains(&d.seq))
            || !verify_proof(&root, Self::per_leaf(ctx), id, d.seq, &cur.msg, proof)
        {
            return ctx.fault(from, FaultKind::Unexpected);
        }
        if !verify_record(&self.servers, ctx, record) {
            return ctx.fault(from, FaultKind::BadSignature);
        }
        let request = cur.request;
        let height = record.height;
        self.keep_higher(Some(record.clone()));
        self.last = Some((d.seq, sent));
        // The next seq: at least every raise this message was signed at, so that a copy
        // of it at a seq up to hi, ordered later, is nudged to d.seq until the next
        // message is delivered and dropped after (that one's seq is at least hi); above
        // the seq delivered (the next is not dropped) and its own (one message a seq).
        // Not hi + 1: after a faulty broker's raise to its top and a lower delivery, that
        // outruns every certified height, and no correct broker takes it.
        self.lo = self.hi.max(d.seq.max(self.lo) + 1);
        self.hi = self.lo;
        self.current = None;
        // One record for the delivery and the next message, if one goes out.
        if !self.next(ctx, now) {
            self.persist(ctx);
        }
        if let Some(request) = request {
            let mut result = height.to_le_bytes().to_vec();
            result.extend_from_slice(&d.seq.to_le_bytes());
            ctx.push(Output::Completed { request, result });
        }
    }

    /// Keeps `record` if it is higher than the one kept.
    fn keep_higher(&mut self, record: Option<pb::HeightRecord>) {
        if record.as_ref().map(|r| r.height) > self.record.as_ref().map(|r| r.height) {
            self.record = record;
        }
    }

    /// The broker stalled: the same submission goes to the next broker.
    fn resubmit(&mut self, ctx: &mut Ctx, now: Nanos) {
        let Some(cur) = self.current.as_mut().filter(|c| c.deadline <= now) else { return };
        self.broker = (self.broker + 1) % self.brokers.len();
        cur.deadline = now + ctx.cfg.cluster.params.resubmit_timeout_ns;
        let submit = cur.submit.clone();
        send_frame(ctx, self.brokers[self.broker], Frame::Submit(submit));
    }

    fn recover(&mut self, record: &[u8]) -> Result<(), HandleError> {
        let r = pb::DistillClientRecord::decode(record)
            .map_err(|e| HandleError::Invalid(format!("persisted record: not a DistillClientRecord: {e}")))?;
        self.id = Some(r.id);
        self.sign_up_at = None;
        (self.lo, self.hi, self.record, self.assignment) = (r.lo, r.hi, r.record, r.assignment);
        self.last = match r.last {
            None => None,
            Some(l) => Some((
                l.seq,
                l.digest.try_into().map_err(|_| {
                    HandleError::Invalid("persisted record: a last delivered digest not of 32 bytes".into())
                })?,
            )),
        };
        self.current = None;
        match r.in_flight {
            // Delivered or not, at a seq in [lo, hi]: it goes out again at once (due now).
            Some(m) if m.seq == self.lo => {
                let submit = self.submission(r.id, m.seq, m.msg.clone());
                self.current = Some(Current { request: None, msg: m.msg, submit, deadline: 0 });
            }
            // What was in flight (unknown to a record of an earlier version) may have been
            // signed at a raise up to hi and be delivered there yet: the next message goes
            // above it.
            _ if self.hi > self.lo => {
                self.lo = self.hi + 1;
                self.hi = self.lo;
            }
            _ => {}
        }
        Ok(())
    }
}

impl RoleMachine for Client {
    fn on_message(&mut self, ctx: &mut Ctx, _now: Nanos, msg: Opened) {
        ctx.fault(msg.sender, FaultKind::Unexpected);
    }

    fn reads_unkeyed(&self) -> bool {
        true
    }

    fn on_unkeyed(&mut self, ctx: &mut Ctx, now: Nanos, from: NodeId, bytes: Vec<u8>) {
        let Some(kind) = open_frame(ctx, from, &bytes) else { return };
        match (kind, self.servers.index(from)) {
            (Frame::Assigned(a), Some(server)) => self.on_assigned(ctx, now, server, a),
            (Frame::Inclusion(inc), None) => self.on_inclusion(ctx, from, inc),
            (Frame::Delivery(d), None) => self.on_delivery(ctx, now, from, d),
            _ => ctx.fault(from, FaultKind::Unexpected),
        }
    }

    fn on_input(&mut self, ctx: &mut Ctx, now: Nanos, input: Input) -> Result<(), HandleError> {
        match input {
            Input::Request(Request::Submit { op }) => {
                if op.len() > ctx.cfg.cluster.params.max_payload as usize {
                    return Err(HandleError::Invalid(format!(
                        "a message of {} bytes is longer than max_payload = {}",
                        op.len(),
                        ctx.cfg.cluster.params.max_payload
                    )));
                }
                if self.queue.len() >= ctx.cfg.cluster.params.client_queue as usize {
                    return Err(HandleError::Backpressure);
                }
                self.queue.push_back((self.next_request, op));
                self.next_request += 1;
                self.next(ctx, now);
                Ok(())
            }
            Input::Recover { record } => self.recover(&record),
            other => Err(HandleError::WrongRole { role: ctx.role(), request: other.name() }),
        }
    }

    fn on_timeout(&mut self, ctx: &mut Ctx, now: Nanos) {
        if self.sign_up_at.is_some_and(|t| t <= now) {
            self.sign_up(ctx, now);
        }
        self.resubmit(ctx, now);
    }

    fn next_deadline(&self) -> Option<Nanos> {
        earliest([self.sign_up_at, self.current.as_ref().map(|c| c.deadline)])
    }

    fn live_instances(&self) -> usize {
        self.queue.len() + usize::from(self.current.is_some())
    }

    fn next_request(&self) -> Option<u64> {
        Some(self.next_request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DistillSpec, FIRST_BROKER, generate_distill};
    use crate::crypto::BlsSecretKey;
    use crate::distill::{Batch, Fate, Messages, delivery_statement, load, system_id};
    use crate::{Node, NodeConfig};

    /// A record at `height` certified by f+1 of `servers`, over a batch of the one entry
    /// (id, seq, msg), and that entry's proof.
    fn certified(
        servers: &[BlsSecretKey],
        cfg: &NodeConfig,
        height: u64,
        entry: (u64, u64, &[u8]),
    ) -> (pb::HeightRecord, pb::MerkleProof) {
        let (id, seq, msg) = entry;
        let per_leaf = cfg.cluster.params.leaf_entries as usize;
        let batch = Batch::new(vec![id], Messages::collect([msg].into_iter()), seq, None, vec![]).unwrap();
        let fate = |_| Fate::Seq(seq);
        let tree = batch.tree(per_leaf, &fate);
        let root = tree.root();
        let statement = delivery_statement(&system_id(&cfg.cluster), height, &root);
        let shards: Vec<(usize, BlsSignature)> = (0..2).map(|i| (i, servers[i].sign(&statement))).collect();
        let certificate = load::certificate(cfg.cluster.crypto, servers.len(), &shards);
        let record = pb::HeightRecord { height, root: root.to_vec(), certificate };
        (record, batch.proof(&tree, per_leaf, 0, &fate))
    }

    /// Feeds `input`, acknowledges persists at once, and returns the frames sent.
    fn drive(node: &mut Node, input: Input) -> Vec<(NodeId, Frame)> {
        node.handle(1, input).unwrap();
        let mut sent = vec![];
        while let Some(o) = node.poll() {
            match o {
                Output::Persist { token, .. } => node.handle(1, Input::Persisted { token }).unwrap(),
                Output::Send { to, bytes } => {
                    sent.push((to, pb::DistillFrame::decode(bytes.as_slice()).unwrap().kind.unwrap()))
                }
                _ => {}
            }
        }
        sent
    }

    fn frame(kind: Frame) -> Vec<u8> {
        pb::DistillFrame { kind: Some(kind) }.encode_to_vec()
    }

    /// A faulty broker has the client sign its entry at a raise up to the highest height
    /// certified (50, say) and withholds the batch; a correct broker's older batch
    /// delivers the message at height 40. The height record the client's next message
    /// carries must justify its seq, or every correct broker refuses it (seq > top) until
    /// some batch is delivered at that seq or above, which, with no other client sending,
    /// never happens (as with seq 51 = raise + 1). That seq must still be at least the
    /// raise, so that the withheld batch, ordered later, cannot deliver the message again.
    #[test]
    fn a_clients_next_submission_is_justified_by_the_record_it_carries() {
        let configs = generate_distill(&DistillSpec::new(1, 2, 1), [3; 32]).unwrap();
        let servers: Vec<BlsSecretKey> = configs.iter().filter(|c| c.id < 4).map(|c| c.bls_secret.clone()).collect();
        let cfg = configs.into_iter().find(|c| c.id == CLIENT_ADDRESS_BASE).unwrap();
        let mut node = Node::new(cfg.clone()).unwrap();
        let (correct, faulty) = (FIRST_BROKER, FIRST_BROKER + 1);
        let sent = drive(&mut node, Input::Request(Request::Submit { op: b"m".to_vec() }));
        assert!(matches!(&sent[..], [(_, Frame::Submit(s))] if s.seq == 0));
        // The faulty broker: the entry at raise 50, justified by a record at 50.
        let (top, _) = certified(&servers, &cfg, 50, (7, 50, b"other"));
        let (r1, proof) = certified(&servers, &cfg, 0, (0, 50, b"m"));
        let inc = pb::Inclusion { root: r1.root, raise: 50, proof: Some(proof), top: Some(top) };
        let sent = drive(&mut node, Input::Message { from: faulty, bytes: frame(Frame::Inclusion(inc)) });
        assert!(matches!(&sent[..], [(_, Frame::Reduction(_))]), "the client signs");
        // The correct broker's delivery, at height 40 and seq 0.
        let (record, proof) = certified(&servers, &cfg, 40, (0, 0, b"m"));
        let d = pb::Delivery { record: Some(record), seq: 0, proof: Some(proof) };
        drive(&mut node, Input::Message { from: correct, bytes: frame(Frame::Delivery(d)) });
        let sent = drive(&mut node, Input::Request(Request::Submit { op: b"n".to_vec() }));
        let [(_, Frame::Submit(s))] = &sent[..] else { panic!("one submission: {sent:?}") };
        let height = s.record.as_ref().map_or(0, |r| r.height);
        assert!(s.seq <= height, "seq {} with a record at height {height}", s.seq);
        assert!(s.seq >= 50, "seq {} below the raise signed at 50", s.seq);
    }
}
