//! The keyed adversary: faulty nodes that hold their real keys and lie.
//!
//! A Byzantine node is not a lossy link. Every faulty node of a run belongs to one
//! [`Coalition`]: each holds its own keys and, colluding, the others' — replicas, clients,
//! publishers and subscribers alike. What it sends is well-formed and sealed correctly:
//! the frame MAC is its own, request authenticators and Chain MACs are made by whichever
//! colluder they name, and BLS signatures are by any colluder of any role. What it cannot
//! make is a correct node's MAC or signature.
//!
//! - [`Forge::mutate`] changes one field of a body the node sends: a view, a sequence
//!   number (often at an edge of the replicas' windows, or one past), a digest, a prepared claim, a vote, a signer list, a certificate, a request
//!   number, an op, a result, a history entry, an algorithm or step.
//! - [`Forge::invent`] makes a body of any kind, including kinds the node's role must
//!   never send (a client's VIEW-CHANGE, NEW-VIEW, CHECKPOINT or PRE-PREPARE; a replica's
//!   `Requests` in its own name; a subscriber's ECHO), from what the coalition has seen
//!   ([`Pool`]), so that the lies look like the run's own messages.
//! - Signed content is signed by the sender, by a colluder of another role (a NEW-VIEW
//!   relaying clients' VIEW-CHANGEs, a certificate whose signers are clients), or with a
//!   colluder's key under the sender's name.
//!
//! Everything is drawn from the simulator's seeded generator, so a seed replays its lies.

use std::collections::BTreeMap;

use bytes::Bytes;
use prost::Message;

use super::Rng;
use crate::broadcast::chain::ChainPath;
use crate::config::Role;
use crate::crypto::{BlsSecretKey, BlsSignature, CryptoMode, aggregate, digest};
use crate::quorum::Quorums;
use crate::statement::Statement;
use crate::wire::{self, Keyring, pb};
use crate::{Algorithm, NodeConfig, NodeId};

/// One faulty node's secrets.
struct Member {
    keys: Keyring,
    bls: BlsSecretKey,
    role: Role,
}

/// Every faulty node of a run, with the secrets of each.
pub struct Coalition {
    crypto: CryptoMode,
    members: BTreeMap<NodeId, Member>,
    /// Every node of the cluster, for choosing receivers and ids.
    everyone: Vec<NodeId>,
    /// The cluster's Chain, for publications a faulty publisher sends by it.
    chain: Option<ChainPath>,
    /// A Perpetual cluster: lies also change the calls inside caller members' copies.
    perpetual: bool,
    /// The replicas' windows, for numbers at their edges: the checkpoint interval, the
    /// views ahead a replica keeps messages for (its group's size), and a view-change
    /// quorum.
    checkpoint_interval: u64,
    group: u64,
    quorum: usize,
    /// A publication stream's window.
    window: u64,
}

impl Coalition {
    pub fn new<'a>(faulty: impl IntoIterator<Item = &'a NodeConfig>, everyone: Vec<NodeId>) -> Self {
        // An empty coalition signs nothing, so its mode does not matter.
        let mut crypto = CryptoMode::Real;
        let mut chain = None;
        let mut perpetual = false;
        let (mut checkpoint_interval, mut group, mut quorum, mut window) = (1, 1, 1, 1);
        let members = faulty
            .into_iter()
            .map(|c| {
                crypto = c.cluster.crypto;
                perpetual = c.cluster.protocol == crate::Protocol::Perpetual;
                let replicas: Vec<NodeId> = c.cluster.replicas().map(|r| r.id).collect();
                let quorums = Quorums::new(replicas.len(), c.cluster.f as usize);
                checkpoint_interval = c.cluster.params.checkpoint_interval as u64;
                window = c.cluster.params.window as u64;
                group = replicas.len() as u64;
                quorum = quorums.intersecting();
                chain = Some(ChainPath::new(&replicas, quorums));
                let role = c.cluster.node(c.id).expect("a member of its cluster").role;
                let keys = c.keyring();
                (c.id, Member { keys, bls: c.bls_secret.clone(), role })
            })
            .collect();
        Coalition { crypto, members, everyone, chain, perpetual, checkpoint_interval, group, quorum, window }
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.members.contains_key(&id)
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Members of `role`, ascending.
    pub fn of_role(&self, role: Role) -> Vec<NodeId> {
        self.members.iter().filter(|(_, m)| m.role == role).map(|(&id, _)| id).collect()
    }

    fn pick(&self, rng: &mut Rng) -> NodeId {
        let ids: Vec<NodeId> = self.members.keys().copied().collect();
        *rng.pick(&ids)
    }

    /// `signer`'s BLS signature on `statement` about (view, seq, digest).
    pub fn sign(&self, signer: NodeId, statement: Statement, view: u64, seq: u64, digest: &[u8]) -> BlsSignature {
        self.members[&signer].bls.sign(&statement.message(view, seq, digest))
    }

    /// A VIEW-CHANGE signed by `signer` (its signature field replaced).
    pub fn sign_view_change(&self, signer: NodeId, vc: &mut pb::ViewChange) {
        vc.signature = vec![];
        let d = digest(&vc.encode_to_vec());
        vc.signature = self.sign(signer, Statement::ViewChange, vc.view, 0, &d).0.to_vec();
    }

    /// A CHECKPOINT vote signed by `signer` (its signature field replaced).
    pub fn sign_checkpoint(&self, signer: NodeId, c: &mut pb::CheckpointVote) {
        c.signature = self.sign(signer, Statement::Checkpoint, 0, c.seq, &c.digest).0.to_vec();
    }

    /// A checkpoint certificate on (seq, digest) signed by `signers` (all members).
    pub fn certificate(&self, signers: Vec<NodeId>, seq: u64, digest: Vec<u8>) -> pb::Certificate {
        let sigs: Vec<BlsSignature> =
            signers.iter().map(|&s| self.sign(s, Statement::Checkpoint, 0, seq, &digest)).collect();
        let signature = aggregate(self.crypto, &sigs).map_or_else(Vec::new, |a| a.0.to_vec());
        pb::Certificate { seq, digest, signers, signature }
    }

    /// Frame from member `from` to `to` carrying `body` with `macs`, under `from`'s hop
    /// MAC (none if they share no key: the receiver then refuses it).
    pub fn seal(&self, from: NodeId, to: NodeId, body: &[u8], mut macs: Vec<pb::Mac>) -> Vec<u8> {
        macs.extend(self.members[&from].keys.mac_to(to, body));
        wire::frame(from, body, &macs)
    }

    /// A frame from member `me`, the publisher of `p`, to `to` carrying `p` sent by
    /// `algorithm`: SEND, or a Chain hop with `me`'s MACs to the next chain positions.
    pub fn publication(&self, me: NodeId, to: NodeId, mut p: pb::Publication, algorithm: Algorithm) -> Vec<u8> {
        p.algorithm = algorithm.to_pb() as i32;
        p.step = if algorithm == Algorithm::Chain { pb::Step::Hop } else { pb::Step::Send } as i32;
        let body = wire::encode_body(pb::body::Kind::Publication(p));
        let mut macs = Vec::new();
        if let Some(chain) = self.chain.as_ref().filter(|_| algorithm == Algorithm::Chain) {
            chain.macs_for(&self.members[&me].keys, me, &body, &[], to, &[], &mut macs);
        }
        self.seal(me, to, &body, macs)
    }

    /// A frame from member `from` to `to` carrying `kind` with everything in it that
    /// colluders authenticate made valid: a colluding client's request authenticator,
    /// VIEW-CHANGEs and CHECKPOINT votes signed by their senders (those a NEW-VIEW relays
    /// too), and the Chain MACs of every colluder on a publication's path up to `from`.
    /// For a fuzzer's bodies: whatever it picks gets past authentication.
    pub fn seal_authenticated(&self, from: NodeId, to: NodeId, mut kind: pb::body::Kind) -> Vec<u8> {
        match &mut kind {
            pb::body::Kind::Checkpoint(c) if self.contains(from) => self.sign_checkpoint(from, c),
            pb::body::Kind::NewView(nv) => {
                for s in nv.view_changes.iter_mut().filter(|s| self.contains(s.sender)) {
                    if let Ok(mut vc) = pb::ViewChange::decode(&s.view_change[..]) {
                        self.sign_view_change(s.sender, &mut vc);
                        s.view_change = vc.encode_to_vec();
                    }
                }
            }
            _ => {}
        }
        self.reauthenticate(from, &mut kind);
        let chain_hop = match &kind {
            pb::body::Kind::Publication(p) if p.step == pb::Step::Hop as i32 => Some(p.publisher),
            _ => None,
        };
        let body = wire::encode_body(kind);
        let mut macs = Vec::new();
        if let (Some(chain), Some(publisher)) = (&self.chain, chain_hop) {
            // The path from the publisher through the members up to `from`, each hop
            // adding its MACs to what it carries on (a "publisher" that is a member itself
            // would lead back to itself: the path ends there).
            let mut path = vec![publisher];
            while let Some(next) = path
                .last()
                .filter(|&&at| at != from)
                .and_then(|&at| chain.successor(at, publisher))
                .filter(|next| !path.contains(next))
            {
                path.push(next);
            }
            for (i, node) in path.iter().enumerate() {
                let Some(m) = self.members.get(node) else { continue };
                let mut carried = Vec::new();
                chain.macs_for(
                    &m.keys,
                    publisher,
                    &body,
                    &macs,
                    path.get(i + 1).copied().unwrap_or(to),
                    &[to],
                    &mut carried,
                );
                macs = carried;
            }
        }
        self.seal(from, to, &body, macs)
    }

    /// `bytes`, a frame member `me` sends to `to`, with `mutate` applied to its body (to
    /// each body, in a bundle) and what the coalition authenticates in them made valid
    /// again, VIEW-CHANGEs signed by `signer`. A frame that does not decode passes as it is.
    pub fn rewrite(
        &self,
        me: NodeId,
        to: NodeId,
        signer: NodeId,
        bytes: &[u8],
        mut mutate: impl FnMut(&mut pb::body::Kind, &mut Vec<pb::Mac>),
    ) -> Vec<u8> {
        self.reseal(me, to, bytes, |kind, macs| {
            mutate(kind, macs);
            self.reauthenticate(signer, kind);
        })
    }

    /// `bytes`, a frame member `me` sends to `to`, with the MACs member `me` made inside
    /// its body (a request's authenticator, a Perpetual result's MACs for the caller
    /// members) flipped and the frame sealed validly: only those inner MACs fail. `None`
    /// if the body holds none.
    pub fn corrupt_inner(&self, me: NodeId, to: NodeId, bytes: &[u8]) -> Option<Vec<u8>> {
        let mut flipped = false;
        let sealed = self.reseal(me, to, bytes, |kind, _| {
            let inner = match kind {
                pb::body::Kind::Requests(r) => &mut r.authenticator,
                pb::body::Kind::PerpetualResult(r) => &mut r.macs,
                _ => return,
            };
            for m in inner.iter_mut().filter(|m| m.from == me) {
                m.tag = m.tag.iter().enumerate().map(|(i, b)| if i == 0 { b ^ 1 } else { *b }).collect();
                flipped = true;
            }
        });
        flipped.then_some(sealed)
    }

    /// `bytes` with `change` applied to its body (to each body, in a bundle) and the MACs
    /// over each body the coalition makes made again, the hop MAC by `seal`.
    fn reseal(
        &self,
        me: NodeId,
        to: NodeId,
        bytes: &[u8],
        mut change: impl FnMut(&mut pb::body::Kind, &mut Vec<pb::Mac>),
    ) -> Vec<u8> {
        let Ok(frame) = pb::Frame::decode(bytes) else { return bytes.to_vec() };
        let Ok(pb::Body { kind: Some(mut kind) }) = pb::Body::decode(frame.body.clone()) else { return bytes.to_vec() };
        // The hop MAC is made afresh by `seal`.
        let mut macs: Vec<pb::Mac> = frame.macs.into_iter().filter(|m| m.from != me || m.to != to).collect();
        if let pb::body::Kind::Bundle(bundle) = &mut kind {
            for b in &mut bundle.bodies {
                let Ok(pb::Body { kind: Some(mut inner) }) = pb::Body::decode(b.body.clone()) else { continue };
                change(&mut inner, &mut b.macs);
                self.remac(&inner, &mut b.macs);
                b.body = wire::encode_body(inner);
            }
        } else {
            change(&mut kind, &mut macs);
            self.remac(&kind, &mut macs);
        }
        self.seal(me, to, &wire::encode_body(kind), macs)
    }

    /// Makes valid again what colluders authenticate inside a changed body: a colluding
    /// client's request authenticator, a VIEW-CHANGE (signed by `signer`), a Perpetual
    /// result's MACs.
    fn reauthenticate(&self, signer: NodeId, kind: &mut pb::body::Kind) {
        match kind {
            pb::body::Kind::Requests(r) => {
                // Decoded whole: `header` reads no client 0 (a Perpetual member's copies).
                let client = pb::RequestsBody::decode(r.body.clone()).ok().map(|b| b.client);
                if let Some(m) = client.and_then(|client| self.members.get(&client)) {
                    let replicas = r.authenticator.iter().map(|a| a.to).collect::<Vec<_>>();
                    r.authenticator = m.keys.request_authenticator(replicas, &r.body);
                }
            }
            pb::body::Kind::ViewChange(vc) => self.sign_view_change(signer, vc),
            pb::body::Kind::PerpetualResult(r) => {
                let statement = crate::perpetual::result_statement(r.target, r.caller, r.call, &r.result);
                for m in r.macs.iter_mut() {
                    if let Some(fresh) = self.members.get(&m.from).and_then(|c| c.keys.result_mac_to(m.to, &statement))
                    {
                        *m = fresh;
                    }
                }
            }
            _ => {}
        }
    }

    /// Makes colluders' MACs over `kind` (a hop's, Chain's) valid for it.
    fn remac(&self, kind: &pb::body::Kind, macs: &mut [pb::Mac]) {
        let body = wire::encode_body(kind.clone());
        for m in macs.iter_mut() {
            if let Some(fresh) = self.members.get(&m.from).and_then(|c| c.keys.mac_to(m.to, &body)) {
                *m = fresh;
            }
        }
    }
}

/// A bounded list of recent values, oldest dropped first.
#[derive(Clone, Debug)]
struct Recent<T> {
    items: Vec<T>,
}

impl<T> Default for Recent<T> {
    fn default() -> Self {
        Recent { items: Vec::new() }
    }
}

const RECENT: usize = 32;

impl<T: Clone + PartialEq> Recent<T> {
    fn add(&mut self, item: T) {
        if self.items.contains(&item) {
            return;
        }
        if self.items.len() == RECENT {
            self.items.remove(0);
        }
        self.items.push(item);
    }

    fn pick(&self, rng: &mut Rng) -> Option<T> {
        (!self.items.is_empty()).then(|| rng.pick(&self.items).clone())
    }
}

/// What the coalition has seen of the run, bounded: material for lies that look real.
#[derive(Default)]
pub struct Pool {
    numbers: Recent<u64>,
    digests: Recent<Vec<u8>>,
    /// (view, seq, digest) of proposals and votes seen.
    votes: Recent<(u64, u64, Vec<u8>)>,
    batches: Recent<Bytes>,
    requests: Recent<pb::Requests>,
    certificates: Recent<pb::Certificate>,
    view_changes: Recent<pb::SignedViewChange>,
    new_views: Recent<pb::NewView>,
    states: Recent<Bytes>,
    payloads: Recent<Bytes>,
    /// The highest view, checkpoint and publication correct nodes sent: where the
    /// windows now are (a lie's would move them anywhere).
    view: u64,
    checkpoint: u64,
    publication: u64,
}

impl Pool {
    /// Takes the material of a body sent by `from`, a correct node or not.
    pub fn observe(&mut self, from: NodeId, correct: bool, kind: &pb::body::Kind) {
        use pb::body::Kind;
        if correct {
            self.note_progress(kind);
        }
        match kind {
            Kind::Publication(p) => {
                self.numbers.add(p.seq);
                self.payloads.add(p.payload.clone());
            }
            Kind::Requests(r) => self.requests.add(r.clone()),
            Kind::PrePrepare(pp) => {
                self.numbers.add(pp.view);
                self.numbers.add(pp.seq);
                self.digests.add(digest(&pp.batch).to_vec());
                self.votes.add((pp.view, pp.seq, digest(&pp.batch).to_vec()));
                self.batches.add(pp.batch.clone());
            }
            Kind::Prepare(v) | Kind::Commit(v) => {
                self.numbers.add(v.view);
                self.numbers.add(v.seq);
                self.digests.add(v.digest.clone());
                self.votes.add((v.view, v.seq, v.digest.clone()));
            }
            Kind::Reply(r) => self.payloads.extend(r.results.iter()),
            Kind::ReadReply(r) => self.payloads.add(r.result.clone()),
            Kind::Checkpoint(c) => {
                self.numbers.add(c.seq);
                self.digests.add(c.digest.clone());
            }
            Kind::ViewChange(vc) => {
                self.numbers.add(vc.view);
                self.certificates.extend(vc.stable.iter());
                self.view_changes.add(pb::SignedViewChange { sender: from, view_change: vc.encode_to_vec() });
            }
            Kind::NewView(nv) => {
                self.numbers.add(nv.view);
                nv.view_changes.iter().for_each(|s| self.view_changes.add(s.clone()));
                self.new_views.add(nv.clone());
            }
            Kind::State(s) => {
                self.certificates.extend(s.checkpoint.iter());
                self.states.add(s.state.clone());
            }
            Kind::Committed(c) => self.batches.add(c.batch.clone()),
            Kind::Proposal(p) => self.batches.add(p.batch.clone()),
            Kind::PerpetualResult(r) => {
                self.numbers.add(r.call);
                self.payloads.add(r.result.clone());
            }
            _ => {}
        }
    }

    /// Where a correct node's body says the run is.
    fn note_progress(&mut self, kind: &pb::body::Kind) {
        use pb::body::Kind;
        match kind {
            Kind::Publication(p) => self.publication = self.publication.max(p.seq),
            Kind::PrePrepare(pp) => self.view = self.view.max(pp.view),
            Kind::Prepare(v) | Kind::Commit(v) => self.view = self.view.max(v.view),
            Kind::Checkpoint(c) => self.checkpoint = self.checkpoint.max(c.seq),
            Kind::ViewChange(vc) => self.view = self.view.max(vc.view),
            Kind::NewView(nv) => self.view = self.view.max(nv.view),
            _ => {}
        }
    }
}

trait Extend<T> {
    fn extend<'a>(&mut self, items: impl Iterator<Item = &'a T>)
    where
        T: 'a;
}

impl<T: Clone + PartialEq> Extend<T> for Recent<T> {
    fn extend<'a>(&mut self, items: impl Iterator<Item = &'a T>)
    where
        T: 'a,
    {
        items.for_each(|i| self.add(i.clone()));
    }
}

/// One faulty node forging a body, with the run's generator, the coalition's secrets and
/// what it has seen.
pub struct Forge<'a> {
    pub rng: &'a mut Rng,
    pub pool: &'a Pool,
    pub coalition: &'a Coalition,
    /// The faulty node that sends.
    pub me: NodeId,
}

/// Body kinds [`Forge::invent`] makes.
const KINDS: u64 = 22;

impl Forge<'_> {
    /// A number that looks like the run's (one it saw, or one off), or an extreme.
    fn number(&mut self) -> u64 {
        let seen = self.pool.numbers.pick(self.rng).unwrap_or(1);
        match self.rng.below(8) {
            0 => 0,
            1 => u64::MAX,
            2 => u64::MAX - self.rng.below(3),
            3 => seen.wrapping_add(1),
            4 => seen.saturating_sub(1),
            5 => self.rng.below(1 << 20),
            _ => seen,
        }
    }

    /// One time in four, `base` (where the run is) plus one of `offsets` (the edges of a
    /// window, and one past each); otherwise a [`Self::number`].
    fn near(&mut self, base: u64, offsets: &[u64]) -> u64 {
        if !self.rng.chance(250_000) {
            return self.number();
        }
        base.saturating_add(*self.rng.pick(offsets))
    }

    /// A PBFT sequence number, often at an edge of a replica's windows reckoned from the
    /// latest checkpoint seen: the stable point, the end of the proposal window (twice
    /// the checkpoint interval) and of the acceptance window (four times).
    fn seq(&mut self) -> u64 {
        let k = self.coalition.checkpoint_interval;
        self.near(self.pool.checkpoint, &[0, 1, 2 * k, 2 * k + 1, 4 * k, 4 * k + 1])
    }

    /// A view, often the latest seen or the furthest ahead a replica keeps early messages
    /// for (its group's size), or one past either.
    fn view(&mut self) -> u64 {
        let n = self.coalition.group;
        self.near(self.pool.view, &[0, 1, n, n + 1])
    }

    /// A publication's sequence number, often at the end of a stream's window reckoned
    /// from the highest seen.
    fn publication_seq(&mut self) -> u64 {
        let w = self.coalition.window;
        self.near(self.pool.publication, &[0, 1, w - 1, w])
    }

    fn node(&mut self) -> NodeId {
        match self.rng.below(4) {
            0 => self.coalition.pick(self.rng),
            1 => self.rng.next_u64() as NodeId,
            _ => *self.rng.pick(&self.coalition.everyone),
        }
    }

    fn digest(&mut self) -> Vec<u8> {
        match (self.rng.below(5), self.pool.digests.pick(self.rng)) {
            (0, _) | (_, None) => digest(&self.rng.next_u64().to_le_bytes()).to_vec(),
            (1, Some(mut d)) => {
                if let Some(b) = d.first_mut() {
                    *b ^= 1;
                }
                d
            }
            (2, _) => vec![7; self.rng.below(40) as usize],
            (_, Some(d)) => d,
        }
    }

    fn bytes(&mut self) -> Bytes {
        match (self.rng.below(3), self.pool.payloads.pick(self.rng)) {
            (0, Some(p)) => p,
            (1, Some(p)) => [&p[..], b"/lie"].concat().into(),
            _ => Bytes::from(self.rng.next_u64().to_le_bytes()[..self.rng.below(9) as usize].to_vec()),
        }
    }

    /// An encoded batch: one seen, one rearranged, empty, or of requests seen or made up.
    fn batch(&mut self) -> Bytes {
        let seen = self.pool.batches.pick(self.rng);
        match (self.rng.below(5), seen) {
            (0, _) => pb::Batch::default().encode_to_vec().into(),
            (1, Some(b)) => {
                let mut batch = pb::Batch::decode(b).unwrap_or_default();
                batch.requests.reverse();
                batch.requests.truncate(1 + self.rng.below(3) as usize);
                batch.encode_to_vec().into()
            }
            (2, _) => {
                let requests = (0..1 + self.rng.below(3)).map(|_| self.requests()).collect();
                pb::Batch { requests }.encode_to_vec().into()
            }
            (_, Some(b)) => b,
            (_, None) => pb::Batch { requests: vec![self.requests()] }.encode_to_vec().into(),
        }
    }

    /// Requests seen, or new ones in a colluding client's name with a valid authenticator
    /// (or anyone's name, unauthenticated).
    fn requests(&mut self) -> pb::Requests {
        if let Some(r) = self.pool.requests.pick(self.rng).filter(|_| self.rng.chance(400_000)) {
            return r;
        }
        let client = if self.rng.chance(700_000) { self.coalition.pick(self.rng) } else { self.node() };
        let first = self.number();
        let ops = (0..self.rng.below(3)).map(|_| self.bytes()).collect();
        // A lie about its own completed requests harms only the client: it may say any.
        let completed_below = if self.rng.chance(500_000) { self.number() } else { 0 };
        let body = Bytes::from(pb::RequestsBody { client, first, ops, completed_below }.encode_to_vec());
        let authenticator = match self.coalition.members.get(&client) {
            Some(m) => m.keys.request_authenticator(self.coalition.everyone.iter().copied(), &body),
            None => vec![],
        };
        pb::Requests { body, authenticator }
    }

    /// A certificate seen, or one on (seq, digest) "signed" by colluders of any role, or
    /// one whose signer list was tampered with.
    fn certificate(&mut self) -> pb::Certificate {
        let seen = self.pool.certificates.pick(self.rng);
        match (self.rng.below(4), seen) {
            (0, Some(mut c)) => {
                match self.rng.below(3) {
                    0 => c.signers.push(self.node()),
                    1 => c.signers.truncate(c.signers.len().saturating_sub(1)),
                    _ => c.seq = self.seq(),
                }
                c
            }
            (1, Some(c)) => c,
            _ => {
                let mut signers: Vec<NodeId> = self.coalition.members.keys().copied().collect();
                signers.truncate(1 + self.rng.below(signers.len() as u64) as usize);
                let (seq, d) = (self.seq(), self.digest());
                self.coalition.certificate(signers, seq, d)
            }
        }
    }

    fn slot_votes(&mut self) -> Vec<pb::SlotVote> {
        (0..self.rng.below(4))
            .map(|_| pb::SlotVote { seq: self.seq(), view: self.view(), digest: self.digest() })
            .collect()
    }

    /// The coalition's shared story for a view change to `view`: a real slot, claimed
    /// prepared and voted in a view just below `view` (or the one it was seen in), for
    /// the batch seen there or another. Every colluder telling it for `view` tells the
    /// same one while they have seen the same votes, so their claims add up.
    fn story(&self, view: u64) -> Option<pb::SlotVote> {
        let votes = &self.pool.votes.items;
        let (seen_view, seq, mut d) = votes.get((view % votes.len().max(1) as u64) as usize)?.clone();
        match view % 4 {
            0 => {}
            1 => d.iter_mut().take(1).for_each(|b| *b ^= 0xff),
            _ if seen_view < view => return Some(pb::SlotVote { seq, view: seen_view, digest: d }),
            _ => {}
        }
        Some(pb::SlotVote { seq, view: view.saturating_sub(1), digest: d })
    }

    /// A VIEW-CHANGE for `view` claiming what the forger likes, signed by `signer`.
    fn view_change(&mut self, view: u64, signer: NodeId) -> pb::ViewChange {
        let stable = self.rng.chance(500_000).then(|| self.certificate());
        let (prepared, voted) = match self.rng.below(4) {
            0 => (vec![], vec![]),
            1 => {
                let story: Vec<pb::SlotVote> = self.story(view).into_iter().collect();
                (story.clone(), story)
            }
            _ => (self.slot_votes(), self.slot_votes()),
        };
        let mut vc = pb::ViewChange { view, stable, prepared, voted, signature: vec![] };
        self.coalition.sign_view_change(signer, &mut vc);
        vc
    }

    /// A NEW-VIEW for `view` relaying VIEW-CHANGEs by colluders (clients among them if the
    /// coalition has any) and ones seen.
    pub fn new_view(&mut self, view: u64) -> pb::NewView {
        let mut view_changes: Vec<pb::SignedViewChange> = Vec::new();
        let signers: Vec<NodeId> = self.coalition.members.keys().copied().collect();
        for signer in signers {
            let vc = self.view_change(view, signer);
            view_changes.push(pb::SignedViewChange { sender: signer, view_change: vc.encode_to_vec() });
        }
        if let Some(seen) = self.pool.view_changes.pick(self.rng) {
            view_changes.push(seen);
        }
        pb::NewView { view, view_changes }
    }

    /// `nv` relaying instead another set of the VIEW-CHANGEs seen for its view, one per
    /// sender: a primary choosing per receiver which valid quorum settles the view. Half
    /// the time the set is a bare quorum of those that claim least (prepared and voted
    /// slots), the one most likely to let the new view forget a batch.
    pub fn regroup(&mut self, nv: &mut pb::NewView) {
        let mut by_sender: BTreeMap<NodeId, pb::SignedViewChange> = BTreeMap::new();
        for s in self.pool.view_changes.items.iter().chain(&nv.view_changes) {
            let view = pb::ViewChange::decode(&s.view_change[..]).map(|vc| vc.view);
            if view == Ok(nv.view) && (!by_sender.contains_key(&s.sender) || self.rng.chance(500_000)) {
                by_sender.insert(s.sender, s.clone());
            }
        }
        let mut chosen: Vec<pb::SignedViewChange> = by_sender.into_values().collect();
        if self.rng.chance(500_000) {
            let claims = |s: &pb::SignedViewChange| {
                pb::ViewChange::decode(&s.view_change[..]).map_or(0, |vc| vc.prepared.len() + vc.voted.len())
            };
            chosen.sort_by_cached_key(claims);
            chosen.truncate(self.coalition.quorum);
        } else {
            let rng = &mut *self.rng;
            chosen.retain(|_| rng.chance(800_000));
        }
        let turn = self.rng.below(chosen.len().max(1) as u64) as usize;
        chosen.rotate_left(turn);
        nv.view_changes = chosen;
    }

    /// A checkpoint's state transfer that holds together: a certificate seen, with its
    /// seq and a state seen that has its digest, whether asked for or not.
    fn certified_state(&mut self) -> Option<pb::State> {
        let checkpoint = self.pool.certificates.pick(self.rng)?;
        let state = self.pool.states.items.iter().find(|s| digest(s)[..] == checkpoint.digest[..])?.clone();
        Some(pb::State { seq: checkpoint.seq, checkpoint: Some(checkpoint), state })
    }

    /// A Perpetual result from a colluding member, MACed for a few nodes.
    fn perpetual_result(&mut self) -> pb::PerpetualResult {
        let (target, caller, call, result) =
            (self.rng.below(3) as u32, self.rng.below(3) as u32, self.number(), self.bytes());
        let statement = crate::perpetual::result_statement(target, caller, call, &result);
        let from = self.coalition.pick(self.rng);
        let macs = (0..1 + self.rng.below(4))
            .filter_map(|_| {
                let to = self.node();
                self.coalition.members[&from].keys.result_mac_to(to, &statement)
            })
            .collect();
        pb::PerpetualResult { target, caller, call, result, view: self.view(), macs }
    }

    fn publication(&mut self) -> pb::Publication {
        pb::Publication {
            algorithm: self.rng.below(5) as i32,
            step: self.rng.below(7) as i32,
            publisher: self.node(),
            topic: if self.rng.chance(800_000) { 0 } else { self.number() },
            seq: self.publication_seq(),
            history: self.rng.chance(300_000),
            payload: if self.rng.chance(300_000) { self.history() } else { self.bytes() },
        }
    }

    fn history(&mut self) -> Bytes {
        let entries =
            (0..self.rng.below(5)).map(|_| pb::HistoryEntry { seq: self.number(), payload: self.bytes() }).collect();
        pb::History { entries }.encode_to_vec().into()
    }

    /// A body of any kind, whatever the sender's role.
    pub fn invent(&mut self) -> pb::body::Kind {
        use pb::body::Kind;
        match self.rng.below(KINDS) {
            0 => Kind::Publication(self.publication()),
            1 => {
                Kind::Status(pb::PubStatus { kind: self.rng.below(4) as i32, topic: self.number(), seq: self.number() })
            }
            2 => Kind::Subscribe(pb::Subscribe { topics: (0..self.rng.below(4)).map(|_| self.number()).collect() }),
            3 => Kind::Requests(self.requests()),
            4 => Kind::PrePrepare(pb::PrePrepare { view: self.view(), seq: self.seq(), batch: self.batch() }),
            5 => Kind::Prepare(pb::Vote { view: self.view(), seq: self.seq(), digest: self.digest() }),
            6 => Kind::Commit(pb::Vote { view: self.view(), seq: self.seq(), digest: self.digest() }),
            7 => Kind::Reply(pb::Reply { view: self.view(), first: self.number(), results: vec![self.bytes()] }),
            8 => {
                let mut vote = pb::CheckpointVote { seq: self.seq(), digest: self.digest(), signature: vec![] };
                self.coalition.sign_checkpoint(self.coalition.pick(self.rng), &mut vote);
                Kind::Checkpoint(vote)
            }
            9 => {
                let (view, signer) =
                    (self.view(), if self.rng.chance(700_000) { self.me } else { self.coalition.pick(self.rng) });
                Kind::ViewChange(Box::new(self.view_change(view, signer)))
            }
            10 if self.rng.chance(300_000)
                && let Some(nv) = self.pool.new_views.pick(self.rng) =>
            {
                Kind::NewView(nv)
            }
            10 => {
                let view = self.view();
                Kind::NewView(self.new_view(view))
            }
            11 => Kind::FetchState(pb::FetchState { seq: self.seq() }),
            12 if self.rng.chance(300_000)
                && let Some(s) = self.certified_state() =>
            {
                Kind::State(Box::new(s))
            }
            12 => {
                let state = match self.pool.states.pick(self.rng) {
                    Some(s) if self.rng.chance(500_000) => s,
                    _ => pb::CheckpointState { app: self.bytes().to_vec(), clients: vec![] }.encode_to_vec().into(),
                };
                let checkpoint = self.rng.chance(600_000).then(|| self.certificate());
                Kind::State(Box::new(pb::State { seq: self.seq(), checkpoint, state }))
            }
            13 => Kind::Committed(pb::Committed { seq: self.seq(), batch: self.batch() }),
            14 => Kind::FetchBatch(pb::FetchBatch { seq: self.seq(), digest: self.digest() }),
            15 => Kind::Proposal(pb::Proposal { seq: self.seq(), batch: self.batch() }),
            16 => Kind::Read(pb::Read { request: self.number(), op: self.bytes() }),
            17 => Kind::ReadReply(pb::ReadReply { request: self.number(), result: self.bytes() }),
            18 => Kind::PerpetualResult(self.perpetual_result()),
            19 => Kind::DistillFetch(pb::DistillFetch {
                broker: self.bytes().to_vec(),
                lane: self.rng.below(4) as u32,
                lane_seq: self.number(),
                root: self.digest(),
            }),
            20 => Kind::DistillFetched(pb::DistillFetched {
                broker: self.bytes().to_vec(),
                lane: self.rng.below(4) as u32,
                lane_seq: self.number(),
                batch: self.rng.chance(500_000).then(pb::DistilledBatch::default),
            }),
            _ => {
                // A bundle of invented bodies, each under the sender's MAC to someone.
                let bodies = (0..1 + self.rng.below(3))
                    .map(|_| pb::BundledBody { body: wire::encode_body(self.invent_flat()), macs: vec![] })
                    .collect();
                Kind::Bundle(pb::Bundle { bodies })
            }
        }
    }

    fn invent_flat(&mut self) -> pb::body::Kind {
        loop {
            let kind = self.invent();
            if !matches!(kind, pb::body::Kind::Bundle(_)) {
                return kind;
            }
        }
    }

    /// Changes one field of `kind`, a body the node sends, keeping it well-formed.
    pub fn mutate(&mut self, kind: &mut pb::body::Kind) {
        use pb::body::Kind;
        let pick = self.rng.below(4);
        match kind {
            Kind::Publication(p) => match self.rng.below(8) {
                0 => p.seq = self.publication_seq(),
                1 => p.publisher = self.node(),
                2 => p.topic = self.number(),
                3 => p.algorithm = self.rng.below(4) as i32,
                4 => p.step = self.rng.below(6) as i32,
                5 => p.history = !p.history,
                6 if p.history => p.payload = self.history(),
                _ => p.payload = self.bytes(),
            },
            Kind::Status(s) => match pick {
                0 => s.kind = self.rng.below(4) as i32,
                1 => s.topic = self.number(),
                _ => s.seq = self.number(),
            },
            Kind::Subscribe(s) => s.topics.push(self.number()),
            Kind::Requests(r) => match pick {
                _ if self.coalition.perpetual && pick > 0 && self.lie_in_call(r) => {}
                0 => *r = self.requests(),
                1 if self.rng.chance(500_000) => r.authenticator.clear(),
                // Valid for some replicas only: the MAC attack on PBFT's authenticators.
                1 => {
                    let rng = &mut *self.rng;
                    r.authenticator.retain(|_| rng.chance(500_000));
                }
                _ => {
                    if let Ok(mut body) = pb::RequestsBody::decode(r.body.clone()) {
                        match self.rng.below(3) {
                            0 => body.first = self.number(),
                            1 => body.client = self.node(),
                            _ => body.ops.push(self.bytes()),
                        }
                        r.body = body.encode_to_vec().into();
                    }
                }
            },
            Kind::PrePrepare(pp) => match pick {
                0 => pp.view = self.view(),
                1 => pp.seq = self.seq(),
                _ => pp.batch = self.batch(),
            },
            Kind::Prepare(v) | Kind::Commit(v) => match pick {
                0 => v.view = self.view(),
                1 => v.seq = self.seq(),
                _ => v.digest = self.digest(),
            },
            Kind::Reply(r) => match pick {
                0 => r.first = self.number(),
                1 => r.results.push(self.bytes()),
                _ => {
                    if let Some(x) = r.results.first_mut() {
                        *x = [&x[..], b"/lie"].concat().into();
                    }
                }
            },
            // A changed vote validly signed by the sender, or the vote signed by another
            // colluder (valid only if it happens to pick the sender).
            Kind::Checkpoint(c) => {
                match pick {
                    0 => c.seq = self.seq(),
                    1 => c.digest = self.digest(),
                    2 => (c.seq, c.digest) = (self.seq(), self.digest()),
                    _ => {}
                }
                let signer = if pick < 3 { self.me } else { self.coalition.pick(self.rng) };
                self.coalition.sign_checkpoint(signer, c);
            }
            Kind::ViewChange(vc) => match self.rng.below(5) {
                4 => {
                    vc.prepared = self.story(vc.view).into_iter().collect();
                    vc.voted = vc.prepared.clone();
                }
                0 => vc.view = self.view(),
                1 => vc.stable = self.rng.chance(500_000).then(|| self.certificate()),
                2 => vc.prepared = self.slot_votes(),
                _ => {
                    vc.prepared.clear();
                    vc.voted = self.slot_votes();
                }
            },
            Kind::NewView(nv) => match self.rng.below(6) {
                0 => nv.view_changes.truncate(nv.view_changes.len().saturating_sub(1)),
                4 | 5 => self.regroup(nv),
                1 => {
                    let view = nv.view;
                    *nv = self.new_view(view);
                }
                2 => {
                    if let Some(s) = self.pool.view_changes.pick(self.rng) {
                        nv.view_changes.push(s);
                    }
                }
                _ => {
                    if let Some(first) = nv.view_changes.first().cloned() {
                        nv.view_changes.push(first);
                    }
                }
            },
            Kind::FetchState(f) => f.seq = self.seq(),
            Kind::State(s) => match pick {
                0 => s.seq = self.seq(),
                1 => s.checkpoint = self.rng.chance(500_000).then(|| self.certificate()),
                _ => s.state = self.bytes(),
            },
            Kind::Committed(c) => match pick {
                0 => c.seq = self.seq(),
                _ => c.batch = self.batch(),
            },
            Kind::FetchBatch(f) => match pick {
                0 => f.seq = self.seq(),
                _ => f.digest = self.digest(),
            },
            Kind::Proposal(p) => match pick {
                0 => p.seq = self.seq(),
                _ => p.batch = self.batch(),
            },
            Kind::Read(r) => match pick {
                0 => r.request = self.number(),
                _ => r.op = self.bytes(),
            },
            Kind::ReadReply(r) => match pick {
                0 => r.request = self.number(),
                _ => r.result = self.bytes(),
            },
            Kind::DistillFetch(f) => match pick {
                0 => f.lane_seq = self.number(),
                _ => f.root = self.digest(),
            },
            Kind::DistillFetched(f) => match pick {
                0 => f.lane_seq = self.number(),
                _ => f.batch = None,
            },
            Kind::PerpetualResult(r) => match self.rng.below(5) {
                0 => r.call = self.number(),
                1 => r.view = self.view(),
                2 => r.macs.clear(),
                3 => r.caller = self.rng.below(3) as u32,
                _ => r.result = [&r.result[..], b"/lie"].concat().into(),
            },
            Kind::Bundle(_) => {}
        }
    }

    /// A Perpetual caller member's copy of a call with another op (or for another group,
    /// or under another call id), its vouch for another result (or call, or target), or
    /// its abort of another call or turned into a vouch; false if `r` holds none of them.
    fn lie_in_call(&mut self, r: &mut pb::Requests) -> bool {
        use crate::wire::pb::perpetual_op::Kind as Op;
        let Ok(mut body) = pb::RequestsBody::decode(r.body.clone()) else { return false };
        let Some(first) = body.ops.first_mut() else { return false };
        let Ok(pb::PerpetualOp { kind: Some(mut op) }) = pb::PerpetualOp::decode(first.clone()) else {
            return false;
        };
        match (&mut op, self.rng.below(4)) {
            (_, 0) => body.first = self.number(),
            (Op::Call(call), 1) => call.target = self.rng.below(3) as u32,
            (Op::Call(call), _) => call.op = [&call.op[..], b"/lie"].concat().into(),
            (Op::Vouch(vouch), 1) => vouch.call = self.number(),
            (Op::Vouch(vouch), 2) => vouch.target = self.rng.below(3) as u32,
            (Op::Vouch(vouch), _) => vouch.result = [&vouch.result[..], b"/lie"].concat().into(),
            (Op::Abort(call), 1) => *call = self.number(),
            (Op::Abort(call), _) => {
                let (call, result) = (*call, self.bytes());
                op = Op::Vouch(pb::PerpetualVouch { call, target: self.rng.below(3) as u32, result });
            }
        }
        *first = pb::PerpetualOp { kind: Some(op) }.encode_to_vec().into();
        r.body = body.encode_to_vec().into();
        true
    }

    /// `bytes`, a frame the node sends to `to`, with its bodies changed by [`Self::mutate`]
    /// and sealed validly; its VIEW-CHANGEs signed by itself, or one time in four by
    /// another colluder under its name.
    pub fn rewrite(&mut self, to: NodeId, bytes: &[u8]) -> Vec<u8> {
        let coalition = self.coalition;
        let signer = if self.rng.chance(250_000) { coalition.pick(self.rng) } else { self.me };
        coalition.rewrite(self.me, to, signer, bytes, |kind, _| self.mutate(kind))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::CryptoMode;
    use crate::{ClusterSpec, Input, Node, Output, generate_cluster};

    /// Invented bodies from a colluding client reach a replica past authentication (the
    /// frame MAC is the client's own): the replica refuses them on their merits.
    #[test]
    fn invented_bodies_pass_authentication_and_are_refused_on_their_merits() {
        let spec = ClusterSpec { crypto: CryptoMode::InsecureTest, ..ClusterSpec::pbft(1, 1) };
        let cfgs = generate_cluster(&spec, [4; 32]).unwrap();
        let coalition = Coalition::new([&cfgs[3], &cfgs[4]], (0..cfgs.len() as NodeId).collect());
        let (mut rng, pool) = (Rng::new(1), Pool::default());
        let mut replica = Node::new(cfgs[0].clone()).unwrap();
        let mut bad_macs = 0;
        for i in 0..500 {
            let me = [3, 4][i % 2];
            let body = Forge { rng: &mut rng, pool: &pool, coalition: &coalition, me }.invent();
            let bytes = coalition.seal(me, 0, &wire::encode_body(body), vec![]);
            replica.handle(i as u64, Input::Message { from: me, bytes }).unwrap();
            while let Some(o) = replica.poll() {
                if let Output::Fault { kind: crate::FaultKind::BadMac, .. } = o {
                    bad_macs += 1;
                }
                if let Output::Persist { token, .. } = o {
                    replica.handle(i as u64, Input::Persisted { token }).unwrap();
                }
            }
        }
        assert_eq!(bad_macs, 0, "every frame carries its sender's valid MAC");
    }

    /// Found by the pubsub_node fuzzer: a Chain hop whose "publisher" is a chain member
    /// led the path back to that member, and sealing it never ended.
    #[test]
    fn sealing_a_chain_hop_that_names_a_member_as_publisher_ends() {
        let spec = ClusterSpec { clients: 1, subscribers: 1, crypto: CryptoMode::InsecureTest, ..ClusterSpec::new(1) };
        let cfgs = generate_cluster(&spec, [5; 32]).unwrap();
        let everyone: Vec<NodeId> = cfgs.iter().map(|c| c.id).collect();
        let coalition = Coalition::new(&cfgs, everyone.clone());
        let subscriber = *everyone.last().unwrap();
        for publisher in 0..4 {
            let hop = pb::Publication { publisher, seq: 1, step: pb::Step::Hop as i32, ..Default::default() };
            let frame = coalition.seal_authenticated(4, subscriber, pb::body::Kind::Publication(hop));
            assert!(!frame.is_empty());
        }
    }
}
