//! A client's requests as they travel and wait: consecutive request numbers in one
//! `Requests` message, authenticated once for all of them.

use bytes::Bytes;
use prost::Message;

use crate::wire::{BodyDigests, Keyring, pb};
use crate::{NodeId, Operation};

/// A parsed `Requests`: requests `first ..= last()` of `client`. Immutable once made, and
/// shared by a replica's queue, its log and the batches that carry it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Bundle {
    pub client: NodeId,
    pub first: u64,
    /// Every request of the client below it has completed there (at most `first`).
    pub completed_below: u64,
    /// Slices of `body`.
    pub ops: Vec<Bytes>,
    /// The sum of the ops' lengths: what batches are capped by.
    pub op_bytes: usize,
    /// The encoded `RequestsBody`, exactly as the client sent it.
    pub body: Bytes,
    pub authenticator: Vec<pb::Mac>,
}

impl Bundle {
    /// The client's side: numbers `ops` from `first`, says every request below
    /// `completed_below` completed, and MACs the body for every replica.
    pub fn seal(
        keys: &Keyring,
        replicas: &[NodeId],
        first: u64,
        completed_below: u64,
        ops: Vec<Bytes>,
    ) -> pb::Requests {
        let body = Bytes::from(pb::RequestsBody { client: keys.me, first, ops, completed_below }.encode_to_vec());
        let authenticator = keys.request_authenticator(replicas.iter().copied(), &body);
        pb::Requests { body, authenticator }
    }

    /// A received `Requests`, unauthenticated; `None` unless its body decodes to at least
    /// one request whose numbers neither start at 0 nor overflow.
    pub fn parse(r: pb::Requests) -> Option<Bundle> {
        let b = pb::RequestsBody::decode(r.body.clone()).ok()?;
        let count = b.ops.len() as u64;
        if count == 0 || b.first == 0 || b.first.checked_add(count).is_none() {
            return None;
        }
        let op_bytes = b.ops.iter().map(Bytes::len).sum();
        Some(Bundle {
            client: b.client,
            first: b.first,
            completed_below: b.completed_below.min(b.first),
            ops: b.ops,
            op_bytes,
            body: r.body,
            authenticator: r.authenticator,
        })
    }

    pub fn count(&self) -> u64 {
        self.ops.len() as u64
    }

    pub fn last(&self) -> u64 {
        self.first + self.count() - 1
    }

    /// Whether the client's authenticator entry for this node verifies.
    pub fn authentic(&self, keys: &Keyring, digests: &mut BodyDigests) -> bool {
        keys.verify_request_from(self.client, &digests.request(&self.body), &self.authenticator)
    }

    pub fn to_pb(&self) -> pb::Requests {
        pb::Requests { body: self.body.clone(), authenticator: self.authenticator.clone() }
    }

    /// The operations, numbered, as the host executes them.
    pub fn operations(&self) -> impl Iterator<Item = Operation> + '_ {
        (self.first..).zip(&self.ops).map(|(request, op)| Operation { client: self.client, request, op: op.to_vec() })
    }
}

/// Client and first request of a `Requests` body, read from the fields a correct client
/// writes first, without decoding its ops: enough to find the copy a replica holds,
/// which is then compared byte for byte. `None` for any other layout.
pub(crate) fn header(body: &[u8]) -> Option<(NodeId, u64)> {
    use prost::encoding::{WireType, decode_key, decode_varint};
    let mut buf = body;
    let (1, WireType::Varint) = decode_key(&mut buf).ok()? else { return None };
    let client = u32::try_from(decode_varint(&mut buf).ok()?).ok()?;
    let (2, WireType::Varint) = decode_key(&mut buf).ok()? else { return None };
    Some((client, decode_varint(&mut buf).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::{CryptoMode, pairwise_mac_key};

    fn keyring(me: NodeId) -> Keyring {
        let keys = (0..6).filter(|&p| p != me).map(|p| (p, pairwise_mac_key(&[3; 32], me, p))).collect();
        Keyring::new(CryptoMode::Real, me, keys)
    }

    #[test]
    fn sealed_requests_parse_number_and_authenticate_at_each_replica_only() {
        let ops: Vec<Bytes> = [&b"a"[..], b"bc", b""].iter().map(|o| Bytes::copy_from_slice(o)).collect();
        let b = Bundle::parse(Bundle::seal(&keyring(4), &[0, 1, 2, 3], 7, 9, ops)).unwrap();
        assert_eq!(b.completed_below, 7, "a client says no more than that its earlier requests completed");
        assert_eq!((b.client, b.first, b.last(), b.op_bytes), (4, 7, 9, 3));
        assert_eq!(header(&b.body), Some((4, 7)));
        let requests: Vec<u64> = b.operations().map(|o| o.request).collect();
        assert_eq!(requests, [7, 8, 9]);
        for r in 0..4 {
            assert!(b.authentic(&keyring(r), &mut BodyDigests::default()), "replica {r}");
        }
        // Not for a node outside the vector, nor as a frame MAC, nor over another body.
        assert!(!b.authentic(&keyring(5), &mut BodyDigests::default()));
        assert!(!keyring(0).verify_from(4, &b.body, &b.authenticator));
        let mut other = Bundle::parse(b.to_pb()).unwrap();
        other.body = Bytes::from(
            pb::RequestsBody { client: 4, first: 8, ops: other.ops.clone(), completed_below: 0 }.encode_to_vec(),
        );
        assert!(!other.authentic(&keyring(0), &mut BodyDigests::default()));
    }

    #[test]
    fn bodies_without_requests_or_with_overflowing_numbers_do_not_parse() {
        let body = |first, ops: usize| pb::Requests {
            body: pb::RequestsBody { client: 4, first, ops: vec![Bytes::new(); ops], completed_below: 0 }
                .encode_to_vec()
                .into(),
            authenticator: vec![],
        };
        assert!(Bundle::parse(body(1, 1)).is_some());
        assert!(Bundle::parse(body(1, 0)).is_none());
        assert!(Bundle::parse(body(0, 1)).is_none());
        assert!(Bundle::parse(body(u64::MAX, 1)).is_none());
        assert!(Bundle::parse(pb::Requests { body: Bytes::from_static(&[0xff; 3]), authenticator: vec![] }).is_none());
        assert_eq!(header(&[0xff; 3]), None);
    }
}
