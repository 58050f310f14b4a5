//! Distilled batches as they travel and are kept: ids sorted and bit-packed, messages in
//! one buffer (one shared length when all are equal, no per-entry lengths then), the
//! shared `raise`, the clients' multi-signature and the stragglers. Decoding is total and
//! bounded: anything malformed, oversized or inconsistent is `None`.

use super::merkle::{self, Tree};
use crate::crypto::{BlsSignature, Digest, EdSignature};
use crate::wire::pb;

/// Ids packed at a fixed width: id i occupies bits `i*bits .. (i+1)*bits`, little-endian.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackedIds {
    pub bits: u32,
    pub count: u32,
    pub packed: Vec<u8>,
}

/// ⌈log2(max + 1)⌉, at least 1.
fn width(max: u64) -> u32 {
    (64 - max.leading_zeros()).max(1)
}

impl PackedIds {
    pub fn pack(ids: &[u64]) -> PackedIds {
        let bits = width(ids.iter().copied().max().unwrap_or(0));
        let mut packed = vec![0u8; (ids.len() * bits as usize).div_ceil(8)];
        let (mut acc, mut filled, mut at) = (0u128, 0u32, 0usize);
        for &id in ids {
            acc |= (id as u128) << filled;
            filled += bits;
            while filled >= 8 {
                packed[at] = acc as u8;
                at += 1;
                acc >>= 8;
                filled -= 8;
            }
        }
        if filled > 0 {
            packed[at] = acc as u8;
        }
        PackedIds { bits, count: ids.len() as u32, packed }
    }

    /// The ids; `None` unless the width and length agree.
    pub fn unpack(&self) -> Option<Vec<u64>> {
        let (bits, count) = (self.bits as usize, self.count as usize);
        if !(1..=64).contains(&bits) || self.packed.len() != (count * bits).div_ceil(8) {
            return None;
        }
        let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
        let mut ids = Vec::with_capacity(count);
        let (mut acc, mut filled, mut bytes) = (0u128, 0usize, self.packed.iter());
        for _ in 0..count {
            while filled < bits {
                acc |= (*bytes.next()? as u128) << filled;
                filled += 8;
            }
            ids.push(acc as u64 & mask);
            acc >>= bits;
            filled -= bits;
        }
        Some(ids)
    }

    /// Whether these are what [`PackedIds::pack`] makes of `ids`, the sorted ids they
    /// unpack to: the width of the largest, and no bit set past the last id.
    fn packs_sorted(&self, ids: &[u64]) -> bool {
        let used = ids.len() * self.bits as usize;
        self.bits == width(ids.last().copied().unwrap_or(0))
            && (used.is_multiple_of(8) || self.packed.last().is_some_and(|&b| b >> (used % 8) == 0))
    }

    pub fn to_pb(&self) -> pb::PackedIds {
        pb::PackedIds { bits: self.bits, count: self.count, packed: self.packed.clone() }
    }

    pub fn from_pb(p: pb::PackedIds) -> PackedIds {
        PackedIds { bits: p.bits, count: p.count, packed: p.packed }
    }
}

/// Messages in order, in one buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Messages {
    /// Every message has this length (and `ends` is empty).
    pub shared_len: Option<u32>,
    /// Otherwise where each ends in `bytes`.
    pub ends: Vec<u32>,
    pub bytes: Vec<u8>,
}

impl Messages {
    pub fn collect<'a>(msgs: impl ExactSizeIterator<Item = &'a [u8]> + Clone) -> Messages {
        let mut lens = msgs.clone().map(<[u8]>::len);
        let first = lens.next();
        let shared = match first {
            Some(l) if lens.all(|x| x == l) => Some(l as u32),
            None => Some(0),
            _ => None,
        };
        let mut bytes = Vec::with_capacity(msgs.clone().map(<[u8]>::len).sum());
        let mut ends = Vec::with_capacity(if shared.is_some() { 0 } else { msgs.len() });
        for m in msgs {
            bytes.extend_from_slice(m);
            if shared.is_none() {
                ends.push(bytes.len() as u32);
            }
        }
        Messages { shared_len: shared, ends, bytes }
    }

    /// What [`Messages::collect`] makes of the `count` messages these hold: a copy,
    /// unless they have their own lengths that are all equal (then one shared length).
    pub fn collected(&self, count: usize) -> Messages {
        let own_lengths_differ = || (1..count).any(|i| self.get(i).len() != self.get(0).len());
        if count > 0 && (self.shared_len.is_some() || own_lengths_differ()) {
            return self.clone();
        }
        Messages::collect((0..count).map(|i| self.get(i)))
    }

    pub fn get(&self, i: usize) -> &[u8] {
        match self.shared_len {
            Some(l) => &self.bytes[i * l as usize..(i + 1) * l as usize],
            None => {
                let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
                &self.bytes[start..self.ends[i] as usize]
            }
        }
    }

    pub fn to_pb(&self) -> pb::Messages {
        let mut prev = 0;
        let lens = self
            .ends
            .iter()
            .map(|&e| {
                let l = e - prev;
                prev = e;
                l
            })
            .collect();
        pb::Messages { shared_len: self.shared_len, lens, bytes: self.bytes.clone() }
    }

    /// `count` messages of at most `max_len` bytes each; `None` if they are not that.
    pub fn from_pb(p: pb::Messages, count: usize, max_len: u32) -> Option<Messages> {
        match p.shared_len {
            Some(l) => {
                (l <= max_len && p.lens.is_empty() && p.bytes.len() == count.checked_mul(l as usize)?).then_some(())?;
                Some(Messages { shared_len: Some(l), ends: vec![], bytes: p.bytes })
            }
            None => {
                if p.lens.len() != count || p.lens.iter().any(|&l| l > max_len) {
                    return None;
                }
                let mut end = 0u64;
                let ends = p
                    .lens
                    .iter()
                    .map(|&l| {
                        end += l as u64;
                        end as u32
                    })
                    .collect();
                (end == p.bytes.len() as u64).then_some(Messages { shared_len: None, ends, bytes: p.bytes })
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Straggler {
    pub id: u64,
    pub seq: u64,
    pub signature: EdSignature,
}

/// A distilled batch, checked for shape: ids strictly increasing, as many messages,
/// stragglers strictly increasing and among the ids (their positions known).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub ids: Vec<u64>,
    pub packed: PackedIds,
    pub msgs: Messages,
    pub raise: u64,
    pub aggregate: Option<BlsSignature>,
    pub stragglers: Vec<Straggler>,
    /// Position of each straggler among the ids.
    pub straggler_at: Vec<usize>,
}

/// What becomes of an entry in the tree a delivery certifies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Present with this seq.
    Seq(u64),
    Dropped,
}

impl Batch {
    /// From sorted ids with their messages, the raise, the aggregate and the stragglers
    /// (sorted by id, among the ids). `None` if they are not that.
    pub fn new(
        ids: Vec<u64>,
        msgs: Messages,
        raise: u64,
        aggregate: Option<BlsSignature>,
        stragglers: Vec<Straggler>,
    ) -> Option<Batch> {
        Batch::with_packing(ids, None, msgs, raise, aggregate, stragglers)
    }

    /// As [`Batch::new`], with `packed` the packing of `ids` if it is known already.
    fn with_packing(
        ids: Vec<u64>,
        packed: Option<PackedIds>,
        msgs: Messages,
        raise: u64,
        aggregate: Option<BlsSignature>,
        stragglers: Vec<Straggler>,
    ) -> Option<Batch> {
        if ids.is_empty() || !ids.windows(2).all(|w| w[0] < w[1]) {
            return None;
        }
        let count_ok = match msgs.shared_len {
            Some(l) => msgs.bytes.len() == ids.len() * l as usize,
            None => msgs.ends.len() == ids.len(),
        };
        if !count_ok || !stragglers.windows(2).all(|w| w[0].id < w[1].id) {
            return None;
        }
        let mut straggler_at = Vec::with_capacity(stragglers.len());
        let mut from = 0;
        for s in &stragglers {
            let at = from + ids[from..].binary_search(&s.id).ok()?;
            straggler_at.push(at);
            from = at + 1;
        }
        let packed = packed.unwrap_or_else(|| PackedIds::pack(&ids));
        Some(Batch { ids, packed, msgs, raise, aggregate, stragglers, straggler_at })
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Whether every entry straggles (no multi-signature needed).
    pub fn all_straggle(&self) -> bool {
        self.stragglers.len() == self.ids.len()
    }

    pub fn to_pb(&self) -> pb::DistilledBatch {
        pb::DistilledBatch {
            ids: Some(self.packed.to_pb()),
            msgs: Some(self.msgs.to_pb()),
            raise: self.raise,
            aggregate: self.aggregate.map(|a| a.0.to_vec()).unwrap_or_default(),
            stragglers: self
                .stragglers
                .iter()
                .map(|s| pb::Straggler { id: s.id, seq: s.seq, signature: s.signature.0.to_vec() })
                .collect(),
        }
    }

    /// A received batch of at most `max_count` entries and `max_payload`-byte messages.
    pub fn from_pb(p: pb::DistilledBatch, max_count: u32, max_payload: u32) -> Option<Batch> {
        let packed = PackedIds::from_pb(p.ids?);
        if packed.count > max_count {
            return None;
        }
        let ids = packed.unpack()?;
        let msgs = Messages::from_pb(p.msgs?, ids.len(), max_payload)?;
        let aggregate = match p.aggregate.len() {
            0 => None,
            _ => Some(BlsSignature(p.aggregate.as_slice().try_into().ok()?)),
        };
        if p.stragglers.len() > ids.len() {
            return None;
        }
        let stragglers = p
            .stragglers
            .into_iter()
            .map(|s| Some(Straggler { id: s.id, seq: s.seq, signature: EdSignature(s.signature.try_into().ok()?) }))
            .collect::<Option<Vec<_>>>()?;
        // The received packing, unless another one packs these ids (then ours, as always).
        let packed = packed.packs_sorted(&ids).then_some(packed);
        Batch::with_packing(ids, packed, msgs, p.raise, aggregate, stragglers)
    }

    /// The seq of each entry in T2: `raise`, or a straggler's own.
    pub fn seqs(&self) -> Vec<u64> {
        let mut seqs = vec![self.raise; self.ids.len()];
        for (s, &at) in self.stragglers.iter().zip(&self.straggler_at) {
            seqs[at] = s.seq;
        }
        seqs
    }

    /// Leaf hashes over the entries, entry i written by `entry(i, out)`: a group of
    /// leaves at a time, hashed side by side.
    pub fn leaf_hashes(&self, per_leaf: usize, mut entry: impl FnMut(usize, &mut Vec<u8>)) -> Vec<Digest> {
        /// Leaves written before they are hashed together (a multiple of SIMD lanes).
        const GROUP: usize = 32;
        let mut leaves = Vec::with_capacity(merkle::leaf_count(self.len(), per_leaf));
        let mut buf = Vec::with_capacity(GROUP * (1 + per_leaf * (merkle::ENTRY_HEADER + 16)));
        let mut ends = Vec::with_capacity(GROUP);
        for start in (0..self.len()).step_by(per_leaf) {
            buf.push(0);
            for i in start..(start + per_leaf).min(self.len()) {
                entry(i, &mut buf);
            }
            ends.push(buf.len());
            if ends.len() == GROUP {
                merkle::hash_each(&buf, &ends, &mut leaves);
                buf.clear();
                ends.clear();
            }
        }
        merkle::hash_each(&buf, &ends, &mut leaves);
        leaves
    }

    /// Writes entry `i` as it stands with `fate`.
    pub fn write_entry(&self, i: usize, fate: Fate, out: &mut Vec<u8>) {
        match fate {
            Fate::Seq(seq) => merkle::push_entry(out, self.ids[i], seq, self.msgs.get(i)),
            Fate::Dropped => merkle::push_dropped(out, self.ids[i]),
        }
    }

    /// R1: every entry at `raise`.
    pub fn root_t1(&self, per_leaf: usize) -> Digest {
        let raise = self.raise;
        self.root_of(per_leaf, |_| Fate::Seq(raise))
    }

    /// R2: stragglers at their own seq (R1 without stragglers).
    pub fn root_t2(&self, per_leaf: usize) -> Digest {
        if self.stragglers.is_empty() {
            return self.root_t1(per_leaf);
        }
        let seqs = self.seqs();
        self.root_of(per_leaf, |i| Fate::Seq(seqs[i]))
    }

    pub fn root_of(&self, per_leaf: usize, fate: impl Fn(usize) -> Fate) -> Digest {
        let mut leaves = self.leaf_hashes(per_leaf, |i, out| self.write_entry(i, fate(i), out));
        merkle::root_in_place(&mut leaves).expect("a batch has entries")
    }

    /// The tree with each entry as `fate` says, for proofs.
    pub fn tree(&self, per_leaf: usize, fate: &impl Fn(usize) -> Fate) -> Tree {
        Tree::new(self.leaf_hashes(per_leaf, |i, out| self.write_entry(i, fate(i), out)))
    }

    /// The proof of entry `i` in `tree` (built with `fate`).
    pub fn proof(&self, tree: &Tree, per_leaf: usize, i: usize, fate: &impl Fn(usize) -> Fate) -> pb::MerkleProof {
        let start = i / per_leaf * per_leaf;
        let end = (start + per_leaf).min(self.len());
        let (mut before, mut after) = (Vec::new(), Vec::new());
        for j in start..i {
            self.write_entry(j, fate(j), &mut before);
        }
        for j in i + 1..end {
            self.write_entry(j, fate(j), &mut after);
        }
        pb::MerkleProof {
            index: i as u64,
            count: self.len() as u64,
            before,
            after,
            siblings: tree.siblings(i / per_leaf).into_iter().map(|s| s.to_vec()).collect(),
        }
    }
}

/// Whether `proof` shows entry (id, seq, msg) under `root`, with `per_leaf` entries per
/// leaf: its leaf holds exactly the entries the position says, itself at its place.
pub fn verify_proof(root: &Digest, per_leaf: usize, id: u64, seq: u64, msg: &[u8], proof: &pb::MerkleProof) -> bool {
    let (Ok(index), Ok(count)) = (usize::try_from(proof.index), usize::try_from(proof.count)) else {
        return false;
    };
    if index >= count || per_leaf == 0 {
        return false;
    }
    let leaf = index / per_leaf;
    let in_leaf = (count - leaf * per_leaf).min(per_leaf);
    let position = index % per_leaf;
    if merkle::count_entries(&proof.before) != Some(position)
        || merkle::count_entries(&proof.after) != Some(in_leaf - position - 1)
    {
        return false;
    }
    let Some(siblings) = proof.siblings.iter().map(|s| Digest::try_from(s.as_slice()).ok()).collect::<Option<Vec<_>>>()
    else {
        return false;
    };
    let mut bytes = Vec::with_capacity(1 + proof.before.len() + proof.after.len() + merkle::ENTRY_HEADER + msg.len());
    bytes.push(0);
    bytes.extend_from_slice(&proof.before);
    merkle::push_entry(&mut bytes, id, seq, msg);
    bytes.extend_from_slice(&proof.after);
    merkle::fold(merkle::prefixed_leaf_hash(&bytes), leaf, merkle::leaf_count(count, per_leaf), &siblings)
        == Some(*root)
}

/// The batch a server delivered (spec §5 step 9): its height and the entries it
/// delivered, in id order — one output per batch, ids bit-packed, messages in one buffer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeliveredBatch {
    pub height: u64,
    pub ids: PackedIds,
    pub seqs: Vec<u64>,
    pub msgs: Messages,
}

impl DeliveredBatch {
    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// The entries as (id, seq, msg).
    pub fn entries(&self) -> impl Iterator<Item = (u64, u64, &[u8])> {
        let ids = self.ids.unpack().unwrap_or_default();
        ids.into_iter().zip(&self.seqs).enumerate().map(|(i, (id, &seq))| (id, seq, self.msgs.get(i)))
    }

    pub fn to_pb(&self) -> pb::DeliveredOutput {
        pb::DeliveredOutput {
            height: self.height,
            ids: Some(self.ids.to_pb()),
            seqs: self.seqs.clone(),
            msgs: Some(self.msgs.to_pb()),
        }
    }

    /// `None` if the ids, seqs and messages do not agree in number.
    pub fn from_pb(p: pb::DeliveredOutput) -> Option<DeliveredBatch> {
        let ids = PackedIds::from_pb(p.ids?);
        let count = ids.unpack()?.len();
        if p.seqs.len() != count {
            return None;
        }
        let msgs = Messages::from_pb(p.msgs?, count, u32::MAX)?;
        Some(DeliveredBatch { height: p.height, ids, seqs: p.seqs, msgs })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_pack_at_the_width_of_the_largest_and_unpack() {
        for ids in [
            vec![0u64],
            vec![1, 2, 3],
            vec![5, 1 << 20, (1 << 20) + 1],
            vec![0, u64::MAX],
            (0..1000).map(|i| i * 37).collect(),
        ] {
            let p = PackedIds::pack(&ids);
            assert_eq!(p.bits, width(*ids.iter().max().unwrap()));
            assert_eq!(p.packed.len(), (ids.len() * p.bits as usize).div_ceil(8));
            assert_eq!(p.unpack(), Some(ids));
        }
        assert_eq!(PackedIds::pack(&(0..65_536).collect::<Vec<u64>>()).bits, 16);
        let mut bad = PackedIds::pack(&[1, 2, 3]);
        bad.packed.pop();
        assert_eq!(bad.unpack(), None);
        assert_eq!(PackedIds { bits: 65, count: 0, packed: vec![] }.unpack(), None);
    }

    #[test]
    fn messages_share_a_length_when_they_can() {
        let same: Vec<&[u8]> = vec![b"abcd", b"efgh"];
        let m = Messages::collect(same.iter().copied());
        assert_eq!((m.shared_len, m.ends.len(), m.get(1)), (Some(4), 0, &b"efgh"[..]));
        let mixed: Vec<&[u8]> = vec![b"a", b"", b"xyz"];
        let m = Messages::collect(mixed.iter().copied());
        assert_eq!((m.shared_len, m.get(0), m.get(1), m.get(2)), (None, &b"a"[..], &b""[..], &b"xyz"[..]));
        assert_eq!(Messages::from_pb(m.to_pb(), 3, 3), Some(m.clone()));
        assert_eq!(Messages::from_pb(m.to_pb(), 3, 2), None);
        assert_eq!(Messages::from_pb(m.to_pb(), 2, 3), None);
    }

    #[test]
    fn proofs_verify_for_every_entry_and_nothing_else() {
        let ids: Vec<u64> = (0..37).map(|i| i * 3 + 1).collect();
        let msgs: Vec<Vec<u8>> = (0..37).map(|i| vec![i as u8; i % 5]).collect();
        let m = Messages::collect(msgs.iter().map(Vec::as_slice));
        let b = Batch::new(ids.clone(), m, 9, None, vec![]).unwrap();
        for per_leaf in [1, 4, 16] {
            let fate = |_| Fate::Seq(9);
            let tree = b.tree(per_leaf, &fate);
            assert_eq!(tree.root(), b.root_t1(per_leaf));
            for i in 0..ids.len() {
                let p = b.proof(&tree, per_leaf, i, &fate);
                assert!(verify_proof(&tree.root(), per_leaf, ids[i], 9, &msgs[i], &p), "{per_leaf} {i}");
                assert!(!verify_proof(&tree.root(), per_leaf, ids[i], 8, &msgs[i], &p));
                assert!(!verify_proof(&tree.root(), per_leaf, ids[i] + 1, 9, &msgs[i], &p));
                let mut shifted = p.clone();
                shifted.index = (i as u64 + 1) % ids.len() as u64;
                assert!(!verify_proof(&tree.root(), per_leaf, ids[i], 9, &msgs[i], &shifted));
            }
        }
    }

    #[test]
    fn batches_roundtrip_and_refuse_bad_shapes() {
        let m = Messages::collect([&b"aa"[..], b"bb", b"cc"].into_iter());
        let s = Straggler { id: 5, seq: 2, signature: EdSignature([3; 64]) };
        let b = Batch::new(vec![1, 5, 9], m.clone(), 4, None, vec![s.clone()]).unwrap();
        assert_eq!(b.seqs(), [4, 2, 4]);
        assert_eq!(Batch::from_pb(b.to_pb(), 3, 2), Some(b.clone()));
        assert_eq!(Batch::from_pb(b.to_pb(), 2, 2), None);
        assert_eq!(Batch::from_pb(b.to_pb(), 3, 1), None);
        assert!(Batch::new(vec![1, 1, 9], m.clone(), 4, None, vec![]).is_none());
        let outside = Straggler { id: 6, ..s.clone() };
        assert!(Batch::new(vec![1, 5, 9], m.clone(), 4, None, vec![outside]).is_none());
        assert!(Batch::new(vec![1, 5, 9], m, 4, None, vec![s.clone(), s]).is_none());
        assert_ne!(b.root_t1(2), b.root_t2(2));
    }
}
