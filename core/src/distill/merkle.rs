//! The Merkle tree of a distilled batch (spec §2, decided): RFC 6962's shape over
//! BLAKE3, leaf = H(0x00 ‖ leaf bytes), node = H(0x01 ‖ left ‖ right), built bottom-up
//! pairing neighbours and carrying an odd last node up unchanged (the same tree as
//! splitting at the largest power of two below the count). A leaf packs `leaf_entries`
//! consecutive entries; an entry is `0x01 ‖ id_le64 ‖ seq_le64 ‖ len_le32 ‖ msg`, or
//! `0x00 ‖ id_le64` once deduplication dropped it.

use crate::crypto::Digest;

pub const PRESENT: u8 = 0x01;
pub const DROPPED: u8 = 0x00;
/// Bytes of a present entry besides its message.
pub const ENTRY_HEADER: usize = 1 + 8 + 8 + 4;

/// Appends a present entry's bytes.
pub fn push_entry(out: &mut Vec<u8>, id: u64, seq: u64, msg: &[u8]) {
    out.push(PRESENT);
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    out.extend_from_slice(msg);
}

/// Appends a dropped entry's bytes.
pub fn push_dropped(out: &mut Vec<u8>, id: u64) {
    out.push(DROPPED);
    out.extend_from_slice(&id.to_le_bytes());
}

/// How many well-formed entries `bytes` holds end to end; `None` if it is anything else.
/// (Entries are self-delimiting, so a leaf's bytes parse one way only.)
pub fn count_entries(mut bytes: &[u8]) -> Option<usize> {
    let mut n = 0;
    while let Some((&tag, rest)) = bytes.split_first() {
        bytes = match tag {
            DROPPED if rest.len() >= 8 => &rest[8..],
            PRESENT if rest.len() >= ENTRY_HEADER - 1 => {
                let len = u32::from_le_bytes(rest[16..20].try_into().expect("4 bytes")) as usize;
                rest.get(20 + len..)?
            }
            _ => return None,
        };
        n += 1;
    }
    Some(n)
}

/// H(0x00 ‖ leaf) for a buffer whose first byte is already the 0x00 prefix.
pub fn prefixed_leaf_hash(prefixed: &[u8]) -> Digest {
    debug_assert_eq!(prefixed.first(), Some(&0));
    *blake3::hash(prefixed).as_bytes()
}

/// BLAKE3 (spec §2.1 of BLAKE3): the IV and the flags of a chunk's blocks.
const IV: [u32; 8] = [0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19];
const CHUNK_START: u8 = 1;
const CHUNK_END: u8 = 2;
const ROOT: u8 = 8;
const BLOCK: usize = 64;
const CHUNK: usize = 1024;

/// BLAKE3 of every input in `buf` (input i ends at `ends[i]`, the next starts there),
/// appended to `out`: what `blake3::hash` gives one input at a time. Inputs of one chunk
/// at most (a leaf of a few dozen entries, a node) are hashed side by side where
/// neighbours have as many blocks: the blocks before their last in BLAKE3's SIMD lanes
/// (`hash_many`, as BLAKE3 hashes the chunks of one long input), each last block alone.
pub fn hash_each(buf: &[u8], ends: &[usize], out: &mut Vec<Digest>) {
    // Whole blocks before the last one; `None` for what goes to `blake3::hash` as it is.
    let lead = |len: usize| (1..=CHUNK).contains(&len).then(|| (len - 1) / BLOCK).filter(|&k| k > 0);
    let platform = blake3::platform::Platform::detect();
    let mut cvs = Vec::new();
    let mut inputs: Vec<&[u8]> = Vec::new();
    let mut i = 0;
    while i < ends.len() {
        let input = |j: usize| &buf[if j == 0 { 0 } else { ends[j - 1] }..ends[j]];
        let Some(k) = lead(input(i).len()) else {
            out.push(*blake3::hash(input(i)).as_bytes());
            i += 1;
            continue;
        };
        inputs.clear();
        while i < ends.len() && lead(input(i).len()) == Some(k) {
            inputs.push(input(i));
            i += 1;
        }
        cvs.clear();
        cvs.resize(inputs.len() * 32, 0);
        lead_blocks(&platform, k, &inputs, &mut cvs);
        for (input, cv) in inputs.iter().zip(cvs.chunks_exact(32)) {
            let mut cv = blake3::platform::words_from_le_bytes_32(cv.try_into().expect("32 bytes"));
            let last = &input[k * BLOCK..];
            let mut block = [0u8; BLOCK];
            block[..last.len()].copy_from_slice(last);
            platform.compress_in_place(&mut cv, &block, last.len() as u8, 0, CHUNK_END | ROOT);
            out.push(blake3::platform::le_bytes_from_words_32(&cv));
        }
    }
}

/// The chaining values of `inputs` after their first `k` blocks (1 ≤ k < 16), as a
/// chunk's first blocks, side by side.
fn lead_blocks(platform: &blake3::platform::Platform, k: usize, inputs: &[&[u8]], cvs: &mut [u8]) {
    fn lanes<const N: usize>(platform: &blake3::platform::Platform, inputs: &[&[u8]], cvs: &mut [u8]) {
        let blocks: Vec<&[u8; N]> = inputs.iter().map(|i| i[..N].try_into().expect("N bytes")).collect();
        let no = blake3::IncrementCounter::No;
        platform.hash_many(&blocks, &IV, 0, no, 0, CHUNK_START, 0, cvs);
    }
    match k {
        1 => lanes::<64>(platform, inputs, cvs),
        2 => lanes::<128>(platform, inputs, cvs),
        3 => lanes::<192>(platform, inputs, cvs),
        4 => lanes::<256>(platform, inputs, cvs),
        5 => lanes::<320>(platform, inputs, cvs),
        6 => lanes::<384>(platform, inputs, cvs),
        7 => lanes::<448>(platform, inputs, cvs),
        8 => lanes::<512>(platform, inputs, cvs),
        9 => lanes::<576>(platform, inputs, cvs),
        10 => lanes::<640>(platform, inputs, cvs),
        11 => lanes::<704>(platform, inputs, cvs),
        12 => lanes::<768>(platform, inputs, cvs),
        13 => lanes::<832>(platform, inputs, cvs),
        14 => lanes::<896>(platform, inputs, cvs),
        15 => lanes::<960>(platform, inputs, cvs),
        _ => unreachable!("an input of one chunk has 1 to 15 blocks before its last"),
    }
}

pub fn leaf_hash(leaf: &[u8]) -> Digest {
    let mut h = blake3::Hasher::new();
    h.update(&[0]);
    h.update(leaf);
    *h.finalize().as_bytes()
}

pub fn node_hash(left: &Digest, right: &Digest) -> Digest {
    let mut buf = [0u8; 65];
    buf[0] = 1;
    buf[1..33].copy_from_slice(left);
    buf[33..].copy_from_slice(right);
    *blake3::hash(&buf).as_bytes()
}

/// The root over leaf hashes, reusing `level` as the working row. `None` for no leaves.
pub fn root_in_place(level: &mut Vec<Digest>) -> Option<Digest> {
    /// Pairs written before they are hashed together.
    const GROUP: usize = 64;
    let mut buf = Vec::with_capacity(GROUP * 65);
    let mut ends = Vec::with_capacity(GROUP);
    let mut up = Vec::with_capacity(GROUP);
    while level.len() > 1 {
        let pairs = level.len() / 2;
        for first in (0..pairs).step_by(GROUP) {
            buf.clear();
            ends.clear();
            up.clear();
            for i in first..pairs.min(first + GROUP) {
                buf.push(1);
                buf.extend_from_slice(&level[2 * i]);
                buf.extend_from_slice(&level[2 * i + 1]);
                ends.push(buf.len());
            }
            hash_each(&buf, &ends, &mut up);
            level[first..first + up.len()].copy_from_slice(&up);
        }
        if level.len() % 2 == 1 {
            level[pairs] = level[level.len() - 1];
            level.truncate(pairs + 1);
        } else {
            level.truncate(pairs);
        }
    }
    level.first().copied()
}

/// Every level of a tree, leaves first, for proofs.
#[derive(Clone, Debug)]
pub struct Tree {
    levels: Vec<Vec<Digest>>,
}

impl Tree {
    /// Over at least one leaf.
    pub fn new(leaves: Vec<Digest>) -> Tree {
        assert!(!leaves.is_empty(), "a tree has leaves");
        let mut levels = vec![leaves];
        while let Some(last) = levels.last().filter(|l| l.len() > 1) {
            let mut up: Vec<Digest> =
                last.chunks(2).map(|p| if p.len() == 2 { node_hash(&p[0], &p[1]) } else { p[0] }).collect();
            up.shrink_to_fit();
            levels.push(up);
        }
        Tree { levels }
    }

    pub fn root(&self) -> Digest {
        self.levels.last().expect("at least the leaves")[0]
    }

    /// The sibling hashes of leaf `index`, bottom-up (none where a node is carried up).
    pub fn siblings(&self, mut index: usize) -> Vec<Digest> {
        let mut out = Vec::with_capacity(self.levels.len());
        for level in &self.levels[..self.levels.len() - 1] {
            let sibling = index ^ 1;
            if sibling < level.len() {
                out.push(level[sibling]);
            }
            index /= 2;
        }
        out
    }
}

/// Folds a leaf hash at `index` among `leaves` with its siblings into a root; `None` if
/// the siblings are too few or too many for that position.
pub fn fold(mut hash: Digest, mut index: usize, mut leaves: usize, siblings: &[Digest]) -> Option<Digest> {
    if index >= leaves {
        return None;
    }
    let mut siblings = siblings.iter();
    while leaves > 1 {
        let sibling = index ^ 1;
        if sibling < leaves {
            let s = siblings.next()?;
            hash = if index.is_multiple_of(2) { node_hash(&hash, s) } else { node_hash(s, &hash) };
        }
        index /= 2;
        leaves = leaves.div_ceil(2);
    }
    siblings.next().is_none().then_some(hash)
}

/// Leaves of `count` entries at `per_leaf` entries each.
pub fn leaf_count(count: usize, per_leaf: usize) -> usize {
    count.div_ceil(per_leaf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6962's recursive definition, to check the bottom-up one against.
    fn rfc6962(leaves: &[Digest]) -> Digest {
        if leaves.len() == 1 {
            return leaves[0];
        }
        let mut k = 1;
        while k * 2 < leaves.len() {
            k *= 2;
        }
        node_hash(&rfc6962(&leaves[..k]), &rfc6962(&leaves[k..]))
    }

    fn leaves(n: usize) -> Vec<Digest> {
        (0..n).map(|i| leaf_hash(&(i as u64).to_le_bytes())).collect()
    }

    #[test]
    fn bottom_up_is_rfc6962_and_proofs_fold_to_the_root() {
        for n in 1..=70 {
            let ls = leaves(n);
            let tree = Tree::new(ls.clone());
            assert_eq!(tree.root(), rfc6962(&ls), "{n}");
            assert_eq!(root_in_place(&mut ls.clone()), Some(tree.root()));
            for (i, &leaf) in ls.iter().enumerate() {
                let path = tree.siblings(i);
                assert_eq!(fold(leaf, i, n, &path), Some(tree.root()), "{n} {i}");
                // A wrong position, a missing or an extra sibling, a flipped bit: no root.
                if n > 1 {
                    assert_ne!(fold(leaf, i ^ 1, n, &path), Some(tree.root()), "{n} {i}");
                    let mut flipped = path.clone();
                    flipped[0][0] ^= 1;
                    assert_ne!(fold(leaf, i, n, &flipped), Some(tree.root()));
                    assert_eq!(fold(leaf, i, n, &path[1..]), None);
                }
                let mut extra = path.clone();
                extra.push([0; 32]);
                assert_eq!(fold(leaf, i, n, &extra), None);
            }
            assert_eq!(fold(ls[0], n, n, &[]), None);
        }
    }

    #[test]
    fn hashing_side_by_side_is_blake3() {
        // Every length from empty to past one chunk, in runs of equal lengths and alone.
        let data: Vec<u8> = (0..40_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let mut lens: Vec<usize> = (0..=1100).collect();
        lens.extend([465; 37]);
        lens.extend([64; 9]);
        lens.extend([1024; 5]);
        lens.extend([65, 65, 128, 129, 129, 2048]);
        let mut ends = Vec::new();
        let mut at = 0;
        let mut expected = Vec::new();
        let mut buf = Vec::new();
        for (n, &len) in lens.iter().enumerate() {
            let input = &data[n % 1000..n % 1000 + len];
            buf.extend_from_slice(input);
            at += len;
            ends.push(at);
            expected.push(*blake3::hash(input).as_bytes());
        }
        let mut got = Vec::new();
        hash_each(&buf, &ends, &mut got);
        assert_eq!(got, expected);
    }

    #[test]
    fn a_leaf_is_not_a_node() {
        let (a, b) = (leaf_hash(b"a"), leaf_hash(b"b"));
        let node = node_hash(&a, &b);
        let mut as_leaf = a.to_vec();
        as_leaf.extend_from_slice(&b);
        let mut prefixed = vec![1];
        prefixed.extend_from_slice(&as_leaf);
        assert_ne!(leaf_hash(&prefixed[1..]), node);
        assert_ne!(leaf_hash(&as_leaf), node);
    }

    #[test]
    fn entries_parse_one_way() {
        let mut b = Vec::new();
        push_entry(&mut b, 7, 3, b"hello");
        push_dropped(&mut b, 9);
        push_entry(&mut b, 11, 0, b"");
        assert_eq!(count_entries(&b), Some(3));
        assert_eq!(count_entries(&b[..b.len() - 1]), None);
        assert_eq!(count_entries(&[2]), None);
        assert_eq!(count_entries(&[]), Some(0));
    }
}
