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
    while level.len() > 1 {
        let pairs = level.len() / 2;
        for i in 0..pairs {
            level[i] = node_hash(&level[2 * i], &level[2 * i + 1]);
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
            hash = if index % 2 == 0 { node_hash(&hash, s) } else { node_hash(s, &hash) };
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
            for i in 0..n {
                let path = tree.siblings(i);
                assert_eq!(fold(ls[i], i, n, &path), Some(tree.root()), "{n} {i}");
                // A wrong position, a missing or an extra sibling, a flipped bit: no root.
                if n > 1 {
                    assert_ne!(fold(ls[i], i ^ 1, n, &path), Some(tree.root()), "{n} {i}");
                    let mut flipped = path.clone();
                    flipped[0][0] ^= 1;
                    assert_ne!(fold(ls[i], i, n, &flipped), Some(tree.root()));
                    assert_eq!(fold(ls[i], i, n, &path[1..]), None);
                }
                let mut extra = path.clone();
                extra.push([0; 32]);
                assert_eq!(fold(ls[i], i, n, &extra), None);
            }
            assert_eq!(fold(ls[0], n, n, &[]), None);
        }
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
