//! Wire format (DESIGN §3): prost messages generated from `proto/phalanx.proto`, and the
//! authenticated `Frame` around every message between nodes.
//!
//! A frame's MAC entries each authenticate
//! `covered || from (u32 LE) || to (u32 LE) || len(body) (u64 LE)` under the frame key of
//! `from` and `to`, derived from their pairwise key K as keyed-BLAKE3(K, "phalanx/v1/mac"):
//! the domain lives in the key, so it costs nothing per MAC. `covered` is the body itself
//! while the input fits in one BLAKE3 chunk (1 KiB), and the body's BLAKE3 digest beyond
//! ([`Covered`]): a long body sent to several peers, or received alike from several (a
//! client's replies), is hashed once, and each MAC costs one compression. The length
//! comes last and fixes where the body ends, and tells a digest from a body (a digest
//! covers more than a chunk's worth), so no two different (from, to, body) triples share
//! an input, and a tag for A→B is not a tag for B→A although the key is shared.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use prost::Message;

use crate::crypto::{CryptoMode, Digest, MacKey, MacTag};
use crate::{FaultKind, NodeId};

/// Generated protobuf types.
#[allow(clippy::all, missing_docs)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/phalanx.v1.rs"));
}

const MAC_DOMAIN: &[u8] = b"phalanx/v1/mac";
const REQUEST_DOMAIN: &[u8] = b"phalanx/v1/requests";
const RESULT_DOMAIN: &[u8] = b"phalanx/v1/perpetual/results";

/// One node's MAC keys: it computes tags from itself and verifies tags to itself. Each
/// peer has two keys derived from the pairwise one: a frame key and a request key (PBFT
/// clients' authenticators), so a tag made for one purpose is never valid for the other.
#[derive(Clone, Debug)]
pub struct Keyring {
    pub mode: CryptoMode,
    pub me: NodeId,
    keys: BTreeMap<NodeId, PeerKeys>,
}

#[derive(Clone, Debug)]
struct PeerKeys {
    frame: MacKey,
    request: MacKey,
    /// Perpetual: a target member's results to a caller member.
    result: MacKey,
}

/// One BLAKE3 chunk: MAC inputs up to this long cover the body itself.
const CHUNK: usize = 1024;

/// BLAKE3 hashes whole 1 KiB chunks in parallel groups of 8, 4 or 2, and a partial or
/// leftover single chunk sequentially, several times slower per byte. A digested body is
/// zero-padded to whole chunks, and a remainder beyond groups of 8 that would need three
/// sequential steps to one group of 4 or 8: a 7 KB bundle then costs 2.1 µs instead of
/// 3.9 µs.
fn padded_len(len: usize) -> usize {
    if len <= CHUNK {
        return len;
    }
    let chunks = len.div_ceil(CHUNK);
    let extra = match chunks % 8 {
        3 => 1,
        r @ 5..=7 => 8 - r,
        _ => 0,
    };
    (chunks + extra) * CHUNK
}

/// Enough for any padding [`padded_len`] adds: under four chunks.
static ZEROS: [u8; 4096] = [0; 4096];

/// What a MAC entry authenticates of a body: the body itself while the MAC input fits in
/// one chunk, or else its digest (BLAKE3 of `body || zeros || len(body) (u64 LE)`,
/// padded as [`padded_len`] says). Test crypto covers bodies whole.
#[derive(Clone, Copy, Debug)]
pub enum Covered<'a> {
    Whole(&'a [u8]),
    Digest { len: usize, digest: Digest },
}

impl<'a> Covered<'a> {
    pub fn of(mode: CryptoMode, body: &'a [u8]) -> Self {
        if !digested(mode, body.len()) {
            return Covered::Whole(body);
        }
        let len = (body.len() as u64).to_le_bytes();
        let zeros = padded_len(body.len() + len.len()) - body.len() - len.len();
        Covered::Digest { len: body.len(), digest: crate::crypto::digest(&[body, &ZEROS[..zeros], &len].concat()) }
    }
}

fn digested(mode: CryptoMode, len: usize) -> bool {
    mode == CryptoMode::Real && len + 16 > CHUNK
}

/// How many digests [`BodyDigests`] keeps.
const RECENT_DIGESTS: usize = 4;

/// How many `Requests` digests [`BodyDigests`] keeps: a few batches' worth of bundles.
const REQUEST_DIGESTS: usize = 256;

/// The longest `Requests` body whose digest [`BodyDigests`] keeps, with a copy: so that
/// the copies take at most 1 MiB. Longer ones are hashed in parallel chunks, at several
/// times the speed per byte.
const REQUEST_KEPT_BYTES: usize = 4096;

/// The digests of the last few long bodies a node sent or received, with the bodies: a
/// body multicast goes to each receiver as the same `Bytes`, and the replies of replicas
/// that agree are equal byte for byte, so each is hashed once. A body counts as seen only
/// if its bytes are equal, never by address alone.
#[derive(Debug, Default)]
pub struct BodyDigests {
    recent: [Option<(Bytes, Digest)>; RECENT_DIGESTS],
    next: usize,
    /// Digests of `Requests` bodies lately verified, by client and first request, with a
    /// copy of each: a PBFT backup often checks a client's requests in a PRE-PREPARE
    /// before the client's own copy arrives, and then hashes that copy no more.
    requests: BTreeMap<(NodeId, u64), (Vec<u8>, Digest)>,
    /// The keys of `requests`, oldest first.
    request_order: VecDeque<(NodeId, u64)>,
}

impl BodyDigests {
    /// What MACs over `body` cover, hashed here only if it was not seen lately.
    pub fn cover<'a>(&mut self, mode: CryptoMode, body: &'a Bytes) -> Covered<'a> {
        if !digested(mode, body.len()) {
            return Covered::Whole(body);
        }
        let seen = |b: &Bytes| b.len() == body.len() && (b.as_ptr() == body.as_ptr() || b == body);
        if let Some((_, digest)) = self.recent.iter().flatten().find(|(b, _)| seen(b)) {
            return Covered::Digest { len: body.len(), digest: *digest };
        }
        let covered = Covered::of(mode, body);
        if let Covered::Digest { digest, .. } = covered {
            self.recent[self.next] = Some((body.clone(), digest));
            self.next = (self.next + 1) % RECENT_DIGESTS;
        }
        covered
    }

    /// The BLAKE3 digest of a `Requests` body, which its authenticator's entries cover:
    /// hashed here unless a body equal byte for byte with the same client and first
    /// request was lately.
    pub fn request(&mut self, body: &[u8]) -> Digest {
        let Some(key) = crate::order::header(body).filter(|_| body.len() <= REQUEST_KEPT_BYTES) else {
            return crate::crypto::digest(body);
        };
        if let Some((kept, digest)) = self.requests.get(&key)
            && kept.as_slice() == body
        {
            return *digest;
        }
        // New numbers, or another body under the same ones (a faulty node's, which
        // replaces the copy): hashed, and kept in the oldest entry's buffer once full.
        let digest = crate::crypto::digest(body);
        let mut spare = None;
        if !self.requests.contains_key(&key) {
            if self.request_order.len() == REQUEST_DIGESTS {
                let oldest = self.request_order.pop_front().expect("full");
                spare = self.requests.remove(&oldest).map(|(buffer, _)| buffer);
            }
            self.request_order.push_back(key);
        }
        let (kept, kept_digest) = self.requests.entry(key).or_insert_with(|| (spare.unwrap_or_default(), digest));
        kept.clear();
        kept.extend_from_slice(body);
        *kept_digest = digest;
        digest
    }
}

/// The MAC input for `covered` from `from` to `to`, as the parts [`MacKey::tag`] hashes.
fn mac_input<'a>(from: NodeId, to: NodeId, covered: &'a Covered<'a>, ends: &'a mut [u8; 16]) -> [&'a [u8]; 3] {
    let (covered, len) = match covered {
        Covered::Whole(body) => (*body, body.len()),
        Covered::Digest { len, digest } => (&digest[..], *len),
    };
    ends[..4].copy_from_slice(&from.to_le_bytes());
    ends[4..8].copy_from_slice(&to.to_le_bytes());
    ends[8..].copy_from_slice(&(len as u64).to_le_bytes());
    let (ids, len) = ends.split_at(8);
    [covered, ids, len]
}

impl Keyring {
    /// From the pairwise keys; derives the frame keys from them.
    pub fn new(mode: CryptoMode, me: NodeId, pairwise: BTreeMap<NodeId, MacKey>) -> Self {
        let derive = |k: &MacKey, domain| MacKey::from_bytes(*blake3::keyed_hash(k.as_bytes(), domain).as_bytes());
        let keys = pairwise
            .into_iter()
            .map(|(peer, k)| {
                let keys = PeerKeys {
                    frame: derive(&k, MAC_DOMAIN),
                    request: derive(&k, REQUEST_DOMAIN),
                    result: derive(&k, RESULT_DOMAIN),
                };
                (peer, keys)
            })
            .collect();
        Keyring { mode, me, keys }
    }

    /// The MAC entry from this node to `to` over `body`; `None` if we share no key.
    pub fn mac_to(&self, to: NodeId, body: &[u8]) -> Option<pb::Mac> {
        self.mac_covering(to, &Covered::of(self.mode, body))
    }

    /// The MAC entry from this node to `to` over a body of which MACs cover `covered`: for
    /// one body to several receivers, hashed once.
    pub fn mac_covering(&self, to: NodeId, covered: &Covered) -> Option<pb::Mac> {
        self.tag_to(to, covered, |k| &k.frame)
    }

    /// Whether `macs` holds a valid entry from `from` to this node over `body`.
    pub fn verify_from(&self, from: NodeId, body: &[u8], macs: &[pb::Mac]) -> bool {
        self.verify_covering(from, &Covered::of(self.mode, body), macs)
    }

    /// [`Keyring::verify_from`] for a body of which MACs cover `covered`.
    pub fn verify_covering(&self, from: NodeId, covered: &Covered, macs: &[pb::Mac]) -> bool {
        self.verify_with(from, covered, macs, |k| &k.frame)
    }

    /// A PBFT client's authenticator for `replicas` over a `Requests` body: one entry per
    /// replica, each over the body's BLAKE3 digest, so the body is hashed once however
    /// many replicas there are.
    pub fn request_authenticator(&self, replicas: impl IntoIterator<Item = NodeId>, body: &[u8]) -> Vec<pb::Mac> {
        let digest = blake3::hash(body);
        let covered = Covered::Whole(digest.as_bytes());
        replicas.into_iter().filter_map(|to| self.tag_to(to, &covered, |k| &k.request)).collect()
    }

    /// Whether a `Requests` authenticator holds a valid entry from client `from` to this
    /// node over the body of digest `body` ([`BodyDigests::request`]).
    pub fn verify_request_from(&self, from: NodeId, body: &Digest, macs: &[pb::Mac]) -> bool {
        self.verify_with(from, &Covered::Whole(body), macs, |k| &k.request)
    }

    /// Perpetual: this target member's MAC entry for caller member `to` over a result
    /// statement.
    pub fn result_mac_to(&self, to: NodeId, statement: &[u8]) -> Option<pb::Mac> {
        self.tag_to(to, &Covered::of(self.mode, statement), |k| &k.result)
    }

    /// Perpetual: whether `macs` holds a valid entry from target member `from` to this
    /// node over a result statement.
    pub fn verify_result_from(&self, from: NodeId, statement: &[u8], macs: &[pb::Mac]) -> bool {
        self.verify_with(from, &Covered::of(self.mode, statement), macs, |k| &k.result)
    }

    fn tag_to(&self, to: NodeId, covered: &Covered, key: impl Fn(&PeerKeys) -> &MacKey) -> Option<pb::Mac> {
        let tag: MacTag = key(self.keys.get(&to)?).tag(self.mode, &mac_input(self.me, to, covered, &mut [0; 16]));
        Some(pb::Mac { from: self.me, to, tag: Bytes::copy_from_slice(&tag) })
    }

    fn verify_with(
        &self,
        from: NodeId,
        covered: &Covered,
        macs: &[pb::Mac],
        key: impl Fn(&PeerKeys) -> &MacKey,
    ) -> bool {
        let Some(keys) = self.keys.get(&from) else { return false };
        macs.iter()
            .find(|m| m.from == from && m.to == self.me)
            .is_some_and(|m| key(keys).verify(self.mode, &mac_input(from, self.me, covered, &mut [0; 16]), &m.tag))
    }
}

/// A body from a frame that passed the size, decoding, sender and hop-MAC checks.
#[derive(Debug)]
pub struct Opened {
    pub sender: NodeId,
    pub body: pb::body::Kind,
    /// The body exactly as received, for forwarding (Chain) and further MAC checks.
    pub raw_body: Bytes,
    /// The MACs that came with the body: the frame's, or a bundled body's own.
    pub macs: Vec<pb::Mac>,
}

/// The bodies of an authenticated frame, decoded one at a time as they are taken: its
/// own, or each of a bundle's. A bundled body that does not decode (or is itself a
/// bundle) yields `Err(Malformed)`; what follows it is not to be trusted either.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "returned for every received frame, mostly `Lone`: boxing it would add an allocation per frame"
)]
pub enum Bodies {
    Lone(Option<Opened>),
    Bundle { sender: NodeId, bodies: std::vec::IntoIter<pb::BundledBody> },
}

impl Iterator for Bodies {
    type Item = Result<Opened, FaultKind>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Bodies::Lone(lone) => lone.take().map(Ok),
            Bodies::Bundle { sender, bodies } => {
                let b = bodies.next()?;
                Some(match decode_body(&b.body) {
                    Ok(pb::body::Kind::Bundle(_)) | Err(_) => Err(FaultKind::Malformed),
                    Ok(body) => Ok(Opened { sender: *sender, body, raw_body: b.body, macs: b.macs }),
                })
            }
        }
    }
}

/// Decodes and authenticates a frame that the host received from `from`, and returns the
/// bodies it carries. Total: any failure is a [`FaultKind`] naming what was wrong, never
/// a panic.
pub fn open(
    keys: &Keyring,
    digests: &mut BodyDigests,
    from: NodeId,
    bytes: Vec<u8>,
    max_bytes: u32,
) -> Result<Bodies, FaultKind> {
    if bytes.len() > max_bytes as usize {
        return Err(FaultKind::Oversized);
    }
    let frame = pb::Frame::decode(Bytes::from(bytes)).map_err(|_| FaultKind::Malformed)?;
    match authenticate(keys, digests, from, &frame)? {
        Some(requests) => {
            let body = pb::body::Kind::Requests(requests);
            Ok(Bodies::Lone(Some(Opened { sender: from, body, raw_body: frame.body, macs: frame.macs })))
        }
        None => bodies(frame),
    }
}

/// Whether `bytes` is a frame from `from` with a valid MAC to this node (its hop MAC, or a
/// lone `Requests`' authenticator entry), what it carries left undecoded unless it is such
/// a `Requests`: for a host that tells a peer holding keys from a stranger before the core
/// sees its frames.
pub fn authentic(keys: &Keyring, from: NodeId, bytes: &[u8]) -> bool {
    // Frames from a node without a key here (signed, not MAC'd) are not decoded at all.
    keys.keys.contains_key(&from)
        && pb::Frame::decode(bytes)
            .is_ok_and(|frame| authenticate(keys, &mut BodyDigests::default(), from, &frame).is_ok())
}

/// A frame that carries nothing, with this node's MAC for `to`: what a host sends first
/// on a connection it opens, so that `to` tells it from strangers ([`authentic`]) before
/// it has anything to say. `None` without a key for `to`.
pub fn proof(keys: &Keyring, to: NodeId) -> Option<Vec<u8>> {
    let body = pb::Body { kind: Some(pb::body::Kind::Bundle(pb::Bundle { bodies: Vec::new() })) }.encode_to_vec();
    let mac = keys.mac_to(to, &body)?;
    Some(frame(keys.me, &body, &[mac]))
}

/// Authenticates a frame from `from` by its hop MAC. A frame without MACs authenticates
/// only as a client's own lone `Requests`, by its authenticator entry for this node (so a
/// client hashes its requests once for every replica, not once more per frame): those
/// are returned, decoded.
fn authenticate(
    keys: &Keyring,
    digests: &mut BodyDigests,
    from: NodeId,
    frame: &pb::Frame,
) -> Result<Option<pb::Requests>, FaultKind> {
    if frame.sender != from {
        return Err(FaultKind::ForgedSender);
    }
    if !frame.macs.is_empty() {
        return match keys.verify_covering(from, &digests.cover(keys.mode, &frame.body), &frame.macs) {
            true => Ok(None),
            false => Err(FaultKind::BadMac),
        };
    }
    let Ok(pb::body::Kind::Requests(r)) = decode_body(&frame.body) else { return Err(FaultKind::BadMac) };
    let client = crate::order::header(&r.body).map(|(client, _)| client);
    if client != Some(from) || !keys.verify_request_from(from, &digests.request(&r.body), &r.authenticator) {
        return Err(FaultKind::BadMac);
    }
    Ok(Some(r))
}

/// The bodies a frame carries, in order, without authenticating it: for reading a node's
/// own output. `None` if anything in it does not decode.
pub fn bodies_of(bytes: &[u8]) -> Option<Vec<pb::body::Kind>> {
    let frame = pb::Frame::decode(bytes).ok()?;
    bodies(frame).ok()?.map(|b| b.ok().map(|o| o.body)).collect()
}

fn bodies(frame: pb::Frame) -> Result<Bodies, FaultKind> {
    let sender = frame.sender;
    Ok(match decode_body(&frame.body)? {
        pb::body::Kind::Bundle(bundle) => Bodies::Bundle { sender, bodies: bundle.bodies.into_iter() },
        body => Bodies::Lone(Some(Opened { sender, body, raw_body: frame.body, macs: frame.macs })),
    })
}

fn decode_body(bytes: &Bytes) -> Result<pb::body::Kind, FaultKind> {
    pb::Body::decode(bytes.clone()).ok().and_then(|b| b.kind).ok_or(FaultKind::Malformed)
}

/// The wire encoding of one body.
pub fn encode_body(kind: pb::body::Kind) -> Bytes {
    pb::Body { kind: Some(kind) }.encode_to_vec().into()
}

/// A frame from `sender` carrying `body` with the MAC entries `macs`, written directly
/// rather than through a `Frame` that would need its own copy of the body.
pub fn frame(sender: NodeId, body: &[u8], macs: &[pb::Mac]) -> Vec<u8> {
    let mut out = frame_start(sender, body.len(), macs.len());
    out.extend_from_slice(body);
    append_macs(&mut out, macs);
    out
}

/// A frame's fields 1 and 2 up to the body's first byte.
fn frame_start(sender: NodeId, body_len: usize, macs: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(body_len + 16 + macs * 32);
    prost::encoding::uint32::encode(1, &sender, &mut out);
    prost::encoding::encode_key(2, prost::encoding::WireType::LengthDelimited, &mut out);
    prost::encoding::encode_varint(body_len as u64, &mut out);
    out
}

fn append_macs(out: &mut Vec<u8>, macs: &[pb::Mac]) {
    for m in macs {
        prost::encoding::message::encode(3, m, out);
    }
}

/// A body waiting in a node's output queue for its receiver, with the MACs its protocol
/// carries beyond the hop MAC.
#[derive(Debug)]
pub struct Unsealed {
    pub to: NodeId,
    pub body: Bytes,
    pub macs: Vec<pb::Mac>,
    /// Whether a frame of this body alone needs a hop MAC: not a client's own `Requests`,
    /// which its authenticator covers ([`open`]).
    pub hop: bool,
}

impl Unsealed {
    /// Its size inside a bundle, an upper bound.
    pub fn bundled_len(&self) -> usize {
        self.body.len() + self.macs.iter().map(|m| m.encoded_len() + 2).sum::<usize>() + 12
    }
}

/// Frame overhead around a bundle's bodies, an upper bound: sender, lengths, hop MAC.
pub const BUNDLE_OVERHEAD: usize = 64;

/// Seals bodies queued for one receiver into one frame, a lone body as itself and
/// several as a [`pb::Bundle`], with this node's hop MAC to the receiver last.
pub fn seal(keys: &Keyring, digests: &mut BodyDigests, mut bodies: Vec<Unsealed>) -> Vec<u8> {
    let to = bodies.first().expect("something to seal").to;
    if bodies.len() == 1 {
        let Unsealed { body, mut macs, hop, .. } = bodies.pop().expect("one body");
        if hop {
            macs.extend(keys.mac_covering(to, &digests.cover(keys.mode, &body)));
        }
        return frame(keys.me, &body, &macs);
    }
    // The bundle is encoded in place in the frame, and MACed there.
    let bodies = bodies.into_iter().map(|b| pb::BundledBody { body: b.body, macs: b.macs }).collect();
    let bundle = pb::Body { kind: Some(pb::body::Kind::Bundle(pb::Bundle { bodies })) };
    let mut out = frame_start(keys.me, bundle.encoded_len(), 1);
    let start = out.len();
    bundle.encode_raw(&mut out);
    let hop = keys.mac_to(to, &out[start..]);
    append_macs(&mut out, hop.as_slice());
    out
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

    fn queued(to: NodeId, kind: pb::body::Kind) -> Unsealed {
        Unsealed { to, body: encode_body(kind), macs: Vec::new(), hop: true }
    }

    fn bodies(opened: Bodies) -> Vec<pb::body::Kind> {
        opened.map(|o| o.unwrap().body).collect()
    }

    #[test]
    fn padding_fills_whole_chunks_in_cheap_groups_within_the_zeros() {
        for len in 0..40_000 {
            let padded = padded_len(len);
            assert!(padded >= len && padded - len < ZEROS.len(), "{len}");
            if len > 1024 {
                assert_eq!(padded % 1024, 0);
                assert!(matches!((padded / 1024) % 8, 0 | 1 | 2 | 4), "{len}");
            } else {
                assert_eq!(padded, len);
            }
        }
    }

    #[test]
    fn long_bodies_are_macd_by_their_padded_digest() {
        let (a, b) = rings();
        let body = vec![0x42u8; 5000];
        let mac = a.mac_to(2, &body).unwrap();
        // 5008 bytes of digest input make five chunks, hashed as eight.
        let mut padded = body.clone();
        padded.resize(8 * 1024 - 8, 0);
        padded.extend_from_slice(&5000u64.to_le_bytes());
        let mut input = blake3::hash(&padded).as_bytes().to_vec();
        input.extend_from_slice(&1u32.to_le_bytes());
        input.extend_from_slice(&2u32.to_le_bytes());
        input.extend_from_slice(&5000u64.to_le_bytes());
        let key = pairwise_mac_key(&[9; 32], 1, 2);
        let frame_key = blake3::keyed_hash(key.as_bytes(), MAC_DOMAIN);
        assert_eq!(&mac.tag[..], &blake3::keyed_hash(frame_key.as_bytes(), &input).as_bytes()[..16]);
        assert!(b.verify_from(1, &body, std::slice::from_ref(&mac)));
        assert!(!b.verify_from(1, &body[1..], &[mac]));
    }

    #[test]
    fn a_remembered_digest_serves_equal_bytes_only() {
        let (a, b) = rings();
        let body = Bytes::from(vec![7u8; 3000]);
        let mac = a.mac_to(2, &body).unwrap();
        let mut digests = BodyDigests::default();
        let check = |digests: &mut BodyDigests, body: &Bytes| {
            b.verify_covering(1, &digests.cover(CryptoMode::Real, body), std::slice::from_ref(&mac))
        };
        assert!(check(&mut digests, &body));
        // The same bytes in another buffer (a second replica's reply) hit; other bytes of
        // the same length, even where the first ones were, do not.
        assert!(check(&mut digests, &Bytes::from(body.to_vec())));
        let mut other = body.to_vec();
        other[2999] = 8;
        assert!(!check(&mut digests, &Bytes::from(other)));
        assert!(digests.recent.iter().flatten().count() == 2);
        for i in 0..RECENT_DIGESTS {
            digests.cover(CryptoMode::Real, &Bytes::from(vec![i as u8; 2000]));
        }
        assert!(digests.recent.iter().flatten().all(|(b, _)| b.len() == 2000));
        assert!(check(&mut digests, &body));
    }

    #[test]
    fn a_remembered_request_digest_serves_the_same_body_only() {
        let (a, b) = rings();
        let requests = |first, op: Vec<u8>| {
            let body = pb::RequestsBody { client: 1, first, ops: vec![op.into()], completed_below: 0 };
            Bytes::from(body.encode_to_vec())
        };
        let body = requests(5, vec![1; 1000]);
        let authenticator = a.request_authenticator([2], &body);
        let mut digests = BodyDigests::default();
        let verify =
            |digests: &mut BodyDigests, body: &[u8]| b.verify_request_from(1, &digests.request(body), &authenticator);
        assert!(verify(&mut digests, &body));
        let kept = |digests: &BodyDigests, body: &[u8]| digests.requests.values().any(|(k, _)| k == body);
        assert!(kept(&digests, &body));
        // Another body with the same client and first request: hashed
        // itself, never served the digest kept there.
        let forged = requests(5, vec![2; 1000]);
        assert!(!verify(&mut digests, &forged));
        assert!(kept(&digests, &forged) && !kept(&digests, &body));
        assert!(verify(&mut digests, &body));
        let long = requests(6, vec![3; REQUEST_KEPT_BYTES]);
        for body in [&body, &forged, &long, &Bytes::from_static(b"no requests")] {
            assert_eq!(digests.request(body), crate::crypto::digest(body));
            assert_eq!(digests.request(body), crate::crypto::digest(body));
        }
        assert!(!kept(&digests, &long));
        // The oldest copies go first, so that at most a bounded number are kept.
        for first in 10..10 + REQUEST_DIGESTS as u64 {
            digests.request(&requests(first, vec![4; 10]));
        }
        assert_eq!(digests.requests.len(), REQUEST_DIGESTS);
        assert!(!kept(&digests, &body) && kept(&digests, &requests(10, vec![4; 10])));
    }

    #[test]
    fn sealed_frame_opens_at_the_receiver_only() {
        let (a, b) = rings();
        let bytes = seal(&a, &mut BodyDigests::default(), vec![queued(2, subscribe())]);
        assert_eq!(bodies(open(&b, &mut BodyDigests::default(), 1, bytes.clone(), 1 << 20).unwrap()), [subscribe()]);
        // The same tag does not authenticate the reverse direction.
        let frame = pb::Frame::decode(bytes.as_slice()).unwrap();
        let reversed = super::frame(2, &frame.body, &frame.macs);
        assert_eq!(open(&a, &mut BodyDigests::default(), 2, reversed, 1 << 20).unwrap_err(), FaultKind::BadMac);
    }

    /// A host's check of who sent a frame agrees with the core's, without decoding what
    /// the frame carries.
    #[test]
    fn a_proof_is_authentic_to_its_receiver_and_carries_nothing() {
        let (a, b) = rings();
        let proof = super::proof(&a, 2).expect("a key for node 2");
        assert!(authentic(&b, 1, &proof));
        assert_eq!(
            bodies(open(&b, &mut BodyDigests::default(), 1, proof.clone(), 1 << 20).expect("opens")),
            Vec::new()
        );
        assert!(!authentic(&a, 1, &proof), "not a proof to its own sender");
        assert_eq!(super::proof(&a, 3), None, "no key for node 3");
    }

    #[test]
    fn authentic_frames_are_those_that_open() {
        let (a, b) = rings();
        let bytes = seal(&a, &mut BodyDigests::default(), vec![queued(2, subscribe())]);
        assert!(authentic(&b, 1, &bytes));
        assert!(!authentic(&b, 3, &bytes), "another sender's claim");
        assert!(!authentic(&a, 1, &bytes), "not a frame to its own sender");
        let undecodable = frame(1, b"no body", &[a.mac_to(2, b"no body").unwrap()]);
        assert!(authentic(&b, 1, &undecodable));
        for i in 0..bytes.len() {
            let mut c = bytes.clone();
            c[i] ^= 0x20;
            assert_eq!(
                authentic(&b, 1, &c),
                open(&b, &mut BodyDigests::default(), 1, c, 1 << 20).is_ok(),
                "flip at {i}"
            );
        }
    }

    #[test]
    fn a_bundle_opens_into_its_bodies_in_order_with_their_own_macs() {
        let (a, b) = rings();
        let carried = pb::Mac { from: 5, to: 2, tag: Bytes::from_static(&[1; 16]) };
        let kinds: Vec<pb::body::Kind> =
            (0..3).map(|t| pb::body::Kind::Subscribe(pb::Subscribe { topics: vec![t] })).collect();
        let mut queue: Vec<Unsealed> = kinds.iter().map(|k| queued(2, k.clone())).collect();
        queue[1].macs.push(carried.clone());
        let opened: Vec<Opened> =
            open(&b, &mut BodyDigests::default(), 1, seal(&a, &mut BodyDigests::default(), queue), 1 << 20)
                .unwrap()
                .map(Result::unwrap)
                .collect();
        assert_eq!(opened.iter().map(|o| o.macs.clone()).collect::<Vec<_>>(), [vec![], vec![carried], vec![]]);
        assert_eq!(opened.into_iter().map(|o| o.body).collect::<Vec<_>>(), kinds);

        // A bundle inside a bundle is malformed, even when authenticated.
        let inner = pb::BundledBody { body: encode_body(pb::body::Kind::Bundle(pb::Bundle::default())), macs: vec![] };
        let nested = encode_body(pb::body::Kind::Bundle(pb::Bundle { bodies: vec![inner] }));
        let bytes = frame(1, &nested, &[a.mac_to(2, &nested).unwrap()]);
        let mut opened = open(&b, &mut BodyDigests::default(), 1, bytes, 1 << 20).unwrap();
        assert_eq!(opened.next().unwrap().unwrap_err(), FaultKind::Malformed);
    }

    #[test]
    fn every_corruption_is_a_fault_not_a_panic() {
        let (a, b) = rings();
        let lone = seal(&a, &mut BodyDigests::default(), vec![queued(2, subscribe())]);
        let bundle = seal(&a, &mut BodyDigests::default(), vec![queued(2, subscribe()), queued(2, subscribe())]);
        assert_eq!(
            open(&b, &mut BodyDigests::default(), 3, lone.clone(), 1 << 20).unwrap_err(),
            FaultKind::ForgedSender
        );
        assert_eq!(open(&b, &mut BodyDigests::default(), 1, lone.clone(), 4).unwrap_err(), FaultKind::Oversized);
        assert_eq!(open(&b, &mut BodyDigests::default(), 1, vec![0xff; 9], 1 << 20).unwrap_err(), FaultKind::Malformed);
        for bytes in [lone, bundle] {
            for i in 0..bytes.len() {
                let mut c = bytes.clone();
                c[i] ^= 0x20;
                assert!(open(&b, &mut BodyDigests::default(), 1, c, 1 << 20).is_err(), "flip at {i} accepted");
            }
            for len in 0..bytes.len() {
                assert!(open(&b, &mut BodyDigests::default(), 1, bytes[..len].to_vec(), 1 << 20).is_err());
            }
        }
    }

    /// Client 1's requests for replica 2 (as `keys` authenticates them), naming `client`.
    fn requests(keys: &Keyring, client: NodeId) -> pb::body::Kind {
        let ops = vec![Bytes::from_static(b"op")];
        let body = Bytes::from(pb::RequestsBody { client, first: 1, ops, completed_below: 0 }.encode_to_vec());
        let authenticator = keys.request_authenticator([2], &body);
        pb::body::Kind::Requests(pb::Requests { body, authenticator })
    }

    #[test]
    fn a_clients_own_requests_travel_without_a_hop_mac_under_their_authenticator() {
        let (a, b) = rings();
        let own = || Unsealed { hop: false, ..queued(2, requests(&a, 1)) };
        let lone = seal(&a, &mut BodyDigests::default(), vec![own()]);
        assert!(pb::Frame::decode(&lone[..]).unwrap().macs.is_empty());
        assert_eq!(bodies(open(&b, &mut BodyDigests::default(), 1, lone.clone(), 1 << 20).unwrap()), [requests(&a, 1)]);
        // Bundled, it travels under the bundle's hop MAC like any body.
        let bundle = seal(&a, &mut BodyDigests::default(), vec![own(), queued(2, subscribe())]);
        assert_eq!(pb::Frame::decode(&bundle[..]).unwrap().macs.len(), 1);
        assert_eq!(
            bodies(open(&b, &mut BodyDigests::default(), 1, bundle, 1 << 20).unwrap()),
            [requests(&a, 1), subscribe()]
        );
        // Without a hop MAC nothing else opens: requests naming another client, a body of
        // another kind, a changed authenticator entry or body, or a sender it is not from.
        let bare = |kind| frame(1, &encode_body(kind), &[]);
        let mut forged = requests(&a, 1);
        let pb::body::Kind::Requests(r) = &mut forged else { unreachable!() };
        let mut tampered = r.clone();
        r.authenticator[0].tag = Bytes::from(vec![0; 16]);
        tampered.body = Bytes::from(pb::RequestsBody { client: 1, first: 2, ..Default::default() }.encode_to_vec());
        for kind in [requests(&a, 3), subscribe(), forged, pb::body::Kind::Requests(tampered)] {
            assert_eq!(open(&b, &mut BodyDigests::default(), 1, bare(kind), 1 << 20).unwrap_err(), FaultKind::BadMac);
        }
        assert_eq!(
            open(&b, &mut BodyDigests::default(), 3, lone.clone(), 1 << 20).unwrap_err(),
            FaultKind::ForgedSender
        );
        // It proves its sender to a host as a hop MAC would.
        assert!(authentic(&b, 1, &lone) && !authentic(&b, 3, &lone));
        for i in 0..lone.len() {
            let mut c = lone.clone();
            c[i] ^= 0x20;
            assert!(
                !authentic(&b, 1, &c) && open(&b, &mut BodyDigests::default(), 1, c, 1 << 20).is_err(),
                "flip at {i} accepted"
            );
        }
    }
}
