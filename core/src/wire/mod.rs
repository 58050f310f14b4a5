//! Wire format (DESIGN §3): prost messages generated from `proto/phalanx.proto`, and the
//! authenticated `Frame` around every message between nodes.
//!
//! A frame's MAC entries each authenticate
//! `from (u32 LE) || to (u32 LE) || len(body) (u64 LE) || body` under the frame key of
//! `from` and `to`, derived from their pairwise key K as keyed-BLAKE3(K, "phalanx/v1/mac"):
//! the domain lives in the key, so it costs nothing per MAC. Fixed-width and
//! length-prefixed, so no two different (from, to, body) triples share an input, and a
//! tag for A→B is not a tag for B→A although the key is shared.

use std::collections::BTreeMap;

use bytes::Bytes;
use prost::Message;

use crate::crypto::{CryptoMode, MacKey, MacTag};
use crate::{FaultKind, NodeId};

/// Generated protobuf types.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/phalanx.v1.rs"));
}

const MAC_DOMAIN: &[u8] = b"phalanx/v1/mac";

/// One node's MAC keys: it computes tags from itself and verifies tags to itself.
#[derive(Clone, Debug)]
pub struct Keyring {
    pub mode: CryptoMode,
    pub me: NodeId,
    keys: BTreeMap<NodeId, MacKey>,
}

fn header(from: NodeId, to: NodeId, body: &[u8]) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&from.to_le_bytes());
    h[4..8].copy_from_slice(&to.to_le_bytes());
    h[8..].copy_from_slice(&(body.len() as u64).to_le_bytes());
    h
}

impl Keyring {
    /// From the pairwise keys; derives the frame keys from them.
    pub fn new(mode: CryptoMode, me: NodeId, pairwise: BTreeMap<NodeId, MacKey>) -> Self {
        let keys = pairwise
            .into_iter()
            .map(|(peer, k)| (peer, MacKey::from_bytes(*blake3::keyed_hash(k.as_bytes(), MAC_DOMAIN).as_bytes())))
            .collect();
        Keyring { mode, me, keys }
    }

    /// The MAC entry from this node to `to` over `body`; `None` if we share no key.
    pub fn mac_to(&self, to: NodeId, body: &[u8]) -> Option<pb::Mac> {
        let tag: MacTag = self.keys.get(&to)?.tag(self.mode, &[&header(self.me, to, body), body]);
        Some(pb::Mac { from: self.me, to, tag: Bytes::copy_from_slice(&tag) })
    }

    /// Whether `macs` holds a valid entry from `from` to this node over `body`.
    pub fn verify_from(&self, from: NodeId, body: &[u8], macs: &[pb::Mac]) -> bool {
        let Some(key) = self.keys.get(&from) else { return false };
        macs.iter()
            .find(|m| m.from == from && m.to == self.me)
            .is_some_and(|m| key.verify(self.mode, &[&header(from, self.me, body), body], &m.tag))
    }
}

/// A frame that passed the size, decoding, sender and hop-MAC checks.
#[derive(Debug)]
pub struct Opened {
    pub sender: NodeId,
    pub body: pb::body::Kind,
    /// The body exactly as received, for forwarding (Chain) and further MAC checks.
    pub raw_body: Bytes,
    pub macs: Vec<pb::Mac>,
}

/// Decodes and authenticates a frame that the host received from `from`. Total: any
/// failure is a [`FaultKind`] naming what was wrong, never a panic.
pub fn open(keys: &Keyring, from: NodeId, bytes: Vec<u8>, max_bytes: u32) -> Result<Opened, FaultKind> {
    if bytes.len() > max_bytes as usize {
        return Err(FaultKind::Oversized);
    }
    let frame = pb::Frame::decode(Bytes::from(bytes)).map_err(|_| FaultKind::Malformed)?;
    if frame.sender != from {
        return Err(FaultKind::ForgedSender);
    }
    if !keys.verify_from(from, &frame.body, &frame.macs) {
        return Err(FaultKind::BadMac);
    }
    let body = pb::Body::decode(frame.body.clone()).map_err(|_| FaultKind::Malformed)?;
    let kind = body.kind.ok_or(FaultKind::Malformed)?;
    Ok(Opened { sender: frame.sender, body: kind, raw_body: frame.body, macs: frame.macs })
}

/// Encodes `body` once and seals it for many receivers: the frame prefix is shared and
/// only the MAC entries differ per receiver.
pub struct Sealer {
    prefix: Vec<u8>,
    pub body: Bytes,
}

impl Sealer {
    pub fn new(sender: NodeId, body: pb::body::Kind) -> Self {
        let body = pb::Body { kind: Some(body) }.encode_to_vec();
        Self::from_raw(sender, Bytes::from(body))
    }

    /// For a body that is forwarded verbatim.
    pub fn from_raw(sender: NodeId, body: Bytes) -> Self {
        // Fields 1 and 2 of `Frame`, written directly rather than via a Frame that
        // would need its own copy of the body.
        let mut prefix = Vec::with_capacity(body.len() + 16);
        prost::encoding::uint32::encode(1, &sender, &mut prefix);
        prost::encoding::bytes::encode(2, &body, &mut prefix);
        Sealer { prefix, body }
    }

    /// The frame with the given MAC entries appended (repeated field 3 of `Frame`).
    pub fn seal(&self, macs: &[pb::Mac]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.prefix.len() + macs.len() * 32);
        out.extend_from_slice(&self.prefix);
        for m in macs {
            prost::encoding::message::encode(3, m, &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::pairwise_mac_key;

    fn rings() -> (Keyring, Keyring) {
        let k = |a, b| pairwise_mac_key(&[9; 32], a, b);
        let a = Keyring::new(CryptoMode::Real, 1, [(2, k(1, 2))].into_iter().collect());
        let b = Keyring::new(CryptoMode::Real, 2, [(1, k(1, 2))].into_iter().collect());
        (a, b)
    }

    fn subscribe() -> pb::body::Kind {
        pb::body::Kind::Subscribe(pb::Subscribe { topics: vec![7] })
    }

    #[test]
    fn sealed_frame_opens_at_the_receiver_only() {
        let (a, b) = rings();
        let s = Sealer::new(1, subscribe());
        let bytes = s.seal(&[a.mac_to(2, &s.body).unwrap()]);
        let opened = open(&b, 1, bytes.clone(), 1 << 20).unwrap();
        assert_eq!(opened.body, subscribe());
        // The same tag does not authenticate the reverse direction.
        assert_eq!(
            open(&a, 2, Sealer::new(2, subscribe()).seal(&[a.mac_to(2, &s.body).unwrap()]), 1 << 20).unwrap_err(),
            FaultKind::BadMac
        );
    }

    #[test]
    fn every_corruption_is_a_fault_not_a_panic() {
        let (a, b) = rings();
        let s = Sealer::new(1, subscribe());
        let bytes = s.seal(&[a.mac_to(2, &s.body).unwrap()]);
        assert_eq!(open(&b, 3, bytes.clone(), 1 << 20).unwrap_err(), FaultKind::ForgedSender);
        assert_eq!(open(&b, 1, bytes.clone(), 4).unwrap_err(), FaultKind::Oversized);
        assert_eq!(open(&b, 1, vec![0xff; 9], 1 << 20).unwrap_err(), FaultKind::Malformed);
        for i in 0..bytes.len() {
            let mut c = bytes.clone();
            c[i] ^= 0x20;
            assert!(open(&b, 1, c, 1 << 20).is_err(), "flip at {i} accepted");
        }
        for len in 0..bytes.len() {
            assert!(open(&b, 1, bytes[..len].to_vec(), 1 << 20).is_err());
        }
    }
}
