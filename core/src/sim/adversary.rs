//! Byzantine behaviours. A Byzantine node runs the real protocol with its real keys; its
//! behaviour rewrites each frame it sends. Rewritten frames are re-MACed with the node's
//! own keys (and what it signs, re-signed), so they authenticate as coming from it: the
//! protocols, not the MACs, must catch the lie. Other nodes' MACs and signatures (Chain's
//! upstream MACs, certificates) cannot be forged.

use bytes::Bytes;
use prost::Message;

use super::{NetConfig, Rng};
use crate::crypto::BlsSecretKey;
use crate::order::{header, signed_message};
use crate::wire::{Keyring, encode_body, pb};
use crate::{Nanos, NodeId};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Behavior {
    Correct,
    /// Sends nothing.
    Silent,
    /// Sends only to these nodes.
    OnlyTo(Vec<NodeId>),
    /// Drops what it sends to these nodes (seed 000's omit mode).
    DropTo(Vec<NodeId>),
    /// Alters one field of what it sends to these nodes, chosen at random per frame, and
    /// MACs the result validly (seed 000 §6.7's alter mode).
    AlterTo(Vec<NodeId>),
    /// Sends one content to even node ids and another to odd ones.
    Equivocate,
    /// Flips a bit in every MAC it sends.
    CorruptMacs,
    /// Also sends, now and then, a frame it sent or received earlier.
    Replay,
    /// Claims to be this other node, at the transport and in the frame.
    ForgeSender(NodeId),
}

impl Behavior {
    /// Short label for reports.
    pub fn label(&self) -> String {
        match self {
            Behavior::Correct => "correct".into(),
            Behavior::Silent => "silent".into(),
            Behavior::OnlyTo(to) => format!("only-to{to:?}"),
            Behavior::DropTo(to) => format!("drop-to{to:?}"),
            Behavior::AlterTo(to) => format!("alter-to{to:?}"),
            Behavior::Equivocate => "equivocate".into(),
            Behavior::CorruptMacs => "corrupt-macs".into(),
            Behavior::Replay => "replay".into(),
            Behavior::ForgeSender(id) => format!("forge-sender-as-{id}"),
        }
    }
}

/// Replica faults drawn for one adversarial run: up to f faulty replicas among `n`, each
/// with a random behaviour; a faulty one that behaves correctly becomes a twin or
/// crashes and restarts instead.
pub struct ReplicaFaults {
    pub behaviors: Vec<Behavior>,
    pub twin: Option<NodeId>,
    pub crash: Option<(NodeId, Nanos, Nanos)>,
}

/// Draws [`ReplicaFaults`]; `everyone` lists every node, for selective behaviours.
pub fn draw_replica_faults(rng: &mut Rng, n: u32, f: u32, everyone: &[NodeId]) -> ReplicaFaults {
    const MS: Nanos = 1_000_000;
    let some = |rng: &mut Rng| -> Vec<NodeId> { everyone.iter().copied().filter(|_| rng.chance(500_000)).collect() };
    let mut faulty: Vec<NodeId> = Vec::new();
    let budget = rng.below(f as u64 + 1) as usize;
    while faulty.len() < budget {
        let b = rng.below(n as u64) as NodeId;
        if !faulty.contains(&b) {
            faulty.push(b);
        }
    }
    let mut out = ReplicaFaults { behaviors: vec![Behavior::Correct; n as usize], twin: None, crash: None };
    for &b in &faulty {
        out.behaviors[b as usize] = match rng.below(9) {
            0 => Behavior::Silent,
            1 => Behavior::OnlyTo(some(rng)),
            2 => Behavior::DropTo(some(rng)),
            3 => Behavior::AlterTo(some(rng)),
            4 => Behavior::Equivocate,
            5 => Behavior::CorruptMacs,
            6 => Behavior::Replay,
            7 => Behavior::ForgeSender(*rng.pick(everyone)),
            _ => Behavior::Correct,
        };
    }
    if let Some(&b) = faulty.iter().find(|&&b| out.behaviors[b as usize] == Behavior::Correct) {
        if rng.chance(500_000) {
            out.twin = Some(b);
        } else {
            let at = rng.below(20) * MS;
            out.crash = Some((b, at, at + (1 + rng.below(40)) * MS));
        }
    }
    out
}

/// A network drawn for one adversarial run: latency spread, and sometimes duplicates
/// or drops (runs with drops check safety only).
pub fn draw_net(rng: &mut Rng) -> NetConfig {
    NetConfig {
        min_latency: 50_000,
        max_latency: 200_000 + rng.below(10) * 1_000_000,
        duplicate_ppm: if rng.chance(500_000) { 50_000 } else { 0 },
        drop_ppm: if rng.chance(100_000) { 50_000 } else { 0 },
    }
}

/// A frame to put on the network: (receiver, claimed sender, bytes).
pub type Frame = (NodeId, NodeId, Vec<u8>);

/// Applies `behavior` to one frame that node `keys.me` sends to `to`.
pub fn tamper(
    behavior: &Behavior,
    keys: &Keyring,
    bls: &BlsSecretKey,
    rng: &mut Rng,
    seen: &mut Vec<(NodeId, Vec<u8>)>,
    to: NodeId,
    bytes: Vec<u8>,
) -> Vec<Frame> {
    let me = keys.me;
    match behavior {
        Behavior::Correct => vec![(to, me, bytes)],
        Behavior::Silent => vec![],
        Behavior::OnlyTo(set) => {
            if set.contains(&to) {
                vec![(to, me, bytes)]
            } else {
                vec![]
            }
        }
        Behavior::DropTo(set) => {
            if set.contains(&to) {
                vec![]
            } else {
                vec![(to, me, bytes)]
            }
        }
        Behavior::AlterTo(set) if set.contains(&to) => {
            let field = rng.below(5);
            vec![(to, me, rewrite(keys, bls, &bytes, |kind, macs| alter(kind, macs, field, me)))]
        }
        Behavior::AlterTo(_) => vec![(to, me, bytes)],
        Behavior::Equivocate if to % 2 == 1 => {
            vec![(to, me, rewrite(keys, bls, &bytes, |kind, _| equivocate(kind)))]
        }
        Behavior::Equivocate => vec![(to, me, bytes)],
        Behavior::CorruptMacs => {
            let Ok(mut frame) = pb::Frame::decode(bytes.as_slice()) else { return vec![(to, me, bytes)] };
            for m in &mut frame.macs {
                let mut tag = m.tag.to_vec();
                if let Some(b) = tag.first_mut() {
                    *b ^= 1;
                }
                m.tag = tag.into();
            }
            vec![(to, me, frame.encode_to_vec())]
        }
        Behavior::Replay => {
            let mut out = vec![(to, me, bytes.clone())];
            if !seen.is_empty() && rng.chance(300_000) {
                let (_, old) = rng.pick(seen).clone();
                out.push((to, me, old));
            }
            if seen.len() < 64 {
                seen.push((to, bytes));
            }
            out
        }
        Behavior::ForgeSender(victim) => {
            let Ok(mut frame) = pb::Frame::decode(bytes.as_slice()) else { return vec![] };
            frame.sender = *victim;
            vec![(to, *victim, frame.encode_to_vec())]
        }
    }
}

/// Seed 000 §6.7's alterations of a publication: seq+1, publisher+1, topic+1, contents
/// replaced, or the upstream (Chain) MACs dropped (contents replaced where there are
/// none). Other messages get their content changed as by [`equivocate`].
fn alter(kind: &mut pb::body::Kind, macs: &mut Vec<pb::Mac>, field: u64, me: NodeId) {
    let pb::body::Kind::Publication(p) = kind else { return equivocate(kind) };
    match field {
        0 => p.seq += 1,
        1 => p.publisher += 1,
        2 => p.topic += 1,
        4 if macs.iter().any(|m| m.from != me) => macs.retain(|m| m.from == me),
        _ => p.payload = bytes::Bytes::from_static(b"altered by a Byzantine node"),
    }
}

/// The other content an equivocating node sends some receivers: a different payload,
/// op, result or digest, for a PRE-PREPARE another batch of the same requests, and for a
/// VIEW-CHANGE claims that other batches prepared (and that it voted for them).
fn equivocate(kind: &mut pb::body::Kind) {
    fn flip(digest: &mut [u8]) {
        if let Some(b) = digest.first_mut() {
            *b ^= 0xff;
        }
    }
    fn altered(b: &[u8]) -> Bytes {
        [b, b"/equivocated"].concat().into()
    }
    match kind {
        pb::body::Kind::Publication(p) => p.payload = altered(&p.payload),
        pb::body::Kind::Requests(r) => {
            if let Ok(mut body) = pb::RequestsBody::decode(r.body.clone())
                && let Some(op) = body.ops.first_mut()
            {
                *op = altered(op);
                r.body = body.encode_to_vec().into();
            }
        }
        pb::body::Kind::PrePrepare(pp) => {
            let mut batch = pb::Batch::decode(pp.batch.clone()).unwrap_or_default();
            if batch.requests.len() > 1 {
                batch.requests.reverse();
            } else {
                batch.requests.clear();
            }
            pp.batch = batch.encode_to_vec().into();
        }
        pb::body::Kind::Prepare(v) | pb::body::Kind::Commit(v) => flip(&mut v.digest),
        pb::body::Kind::Checkpoint(c) => flip(&mut c.digest),
        pb::body::Kind::Reply(r) => {
            if let Some(result) = r.results.first_mut() {
                *result = altered(result);
            }
        }
        pb::body::Kind::ReadReply(r) => r.result = altered(&r.result),
        pb::body::Kind::ViewChange(vc) => {
            for v in vc.prepared.iter_mut().chain(vc.voted.iter_mut()) {
                flip(&mut v.digest);
            }
        }
        _ => {}
    }
}

/// Decodes a frame, lets `mutate` change its body and MAC list (each body and its MACs,
/// in a bundle), and makes what the node itself authenticates valid again with its own
/// keys.
fn rewrite(
    keys: &Keyring,
    bls: &BlsSecretKey,
    bytes: &[u8],
    mut mutate: impl FnMut(&mut pb::body::Kind, &mut Vec<pb::Mac>),
) -> Vec<u8> {
    let Ok(mut frame) = pb::Frame::decode(bytes) else { return bytes.to_vec() };
    let Ok(pb::Body { kind: Some(mut kind) }) = pb::Body::decode(frame.body.clone()) else { return bytes.to_vec() };
    if let pb::body::Kind::Bundle(bundle) = &mut kind {
        for b in &mut bundle.bodies {
            let Ok(pb::Body { kind: Some(mut inner) }) = pb::Body::decode(b.body.clone()) else { continue };
            mutate(&mut inner, &mut b.macs);
            b.body = reauthenticate(keys, bls, inner, &mut b.macs);
        }
    } else {
        mutate(&mut kind, &mut frame.macs);
    }
    frame.body = reauthenticate(keys, bls, kind, &mut frame.macs);
    frame.encode_to_vec()
}

/// Encodes a changed body after making valid again what the node authenticates inside
/// it (a client's authenticator, a replica's VIEW-CHANGE signature) and, in `macs`, its
/// own MACs over the body.
fn reauthenticate(keys: &Keyring, bls: &BlsSecretKey, mut kind: pb::body::Kind, macs: &mut [pb::Mac]) -> Bytes {
    match &mut kind {
        pb::body::Kind::Requests(r) if header(&r.body).is_some_and(|(client, _)| client == keys.me) => {
            r.authenticator = r.authenticator.iter().filter_map(|m| keys.request_mac_to(m.to, &r.body)).collect();
        }
        pb::body::Kind::ViewChange(vc) => {
            vc.signature = vec![];
            let d = crate::crypto::digest(&vc.encode_to_vec());
            vc.signature = bls.sign(&signed_message(b"vchg", vc.view, 0, &d)).0.to_vec();
        }
        _ => {}
    }
    let body = encode_body(kind);
    for m in macs.iter_mut() {
        if m.from == keys.me
            && let Some(fresh) = keys.mac_to(m.to, &body)
        {
            *m = fresh;
        }
    }
    body
}
