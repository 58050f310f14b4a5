//! Byzantine behaviours. A Byzantine node runs the real protocol with its real keys; its
//! behaviour rewrites each frame it sends. Rewritten frames are re-MACed with the node's
//! own keys, so they authenticate as coming from it: the protocols, not the MACs, must
//! catch the lie. MACs of other nodes (Chain's upstream MACs) cannot be forged.

use prost::Message;

use super::Rng;
use crate::NodeId;
use crate::wire::{Keyring, pb};

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

/// A frame to put on the network: (receiver, claimed sender, bytes).
pub type Frame = (NodeId, NodeId, Vec<u8>);

/// Applies `behavior` to one frame that node `keys.me` sends to `to`.
pub fn tamper(
    behavior: &Behavior,
    keys: &Keyring,
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
            vec![(to, me, rewrite(keys, &bytes, |p, macs| alter(p, macs, field, me)))]
        }
        Behavior::AlterTo(_) => vec![(to, me, bytes)],
        Behavior::Equivocate if to % 2 == 1 => {
            vec![(to, me, rewrite(keys, &bytes, |p, _| p.payload = [&p.payload[..], b"/equivocated"].concat().into()))]
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

/// Seed 000 §6.7's alterations: seq+1, publisher+1, topic+1, contents replaced, or the
/// upstream (Chain) MACs dropped (contents replaced where there are none).
fn alter(p: &mut pb::Publication, macs: &mut Vec<pb::Mac>, field: u64, me: NodeId) {
    match field {
        0 => p.seq += 1,
        1 => p.publisher += 1,
        2 => p.topic += 1,
        4 if macs.iter().any(|m| m.from != me) => macs.retain(|m| m.from == me),
        _ => p.payload = bytes::Bytes::from_static(b"altered by a Byzantine node"),
    }
}

/// Decodes a frame, lets `mutate` change its publication (other bodies pass unchanged)
/// and MAC list, and re-MACs the new body with this node's own keys.
fn rewrite(keys: &Keyring, bytes: &[u8], mutate: impl FnOnce(&mut pb::Publication, &mut Vec<pb::Mac>)) -> Vec<u8> {
    let Ok(mut frame) = pb::Frame::decode(bytes) else { return bytes.to_vec() };
    let Ok(mut body) = pb::Body::decode(frame.body.clone()) else { return bytes.to_vec() };
    let Some(pb::body::Kind::Publication(p)) = &mut body.kind else { return bytes.to_vec() };
    mutate(p, &mut frame.macs);
    frame.body = body.encode_to_vec().into();
    for m in &mut frame.macs {
        if m.from == keys.me
            && let Some(fresh) = keys.mac_to(m.to, &frame.body)
        {
            *m = fresh;
        }
    }
    frame.encode_to_vec()
}
