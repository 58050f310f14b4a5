//! The Merkle tree of spec §2 against its published test vectors
//! (`tests/vectors/distill-merkle.json`), so that another implementation can check itself
//! against ours. `PHALANX_WRITE_VECTORS=1` writes the file anew.
//!
//! The batches: entry i is (id 3i+1, seq i mod 5, msg = i as 8 bytes little-endian), 16
//! entries per leaf; roots for 1..=33 full leaves, for 33 leaves whose last holds 5
//! entries, for 65,536 entries, and for 65,536 entries with every third one dropped;
//! proofs of a few entries.

use std::fmt::Write;
use std::path::PathBuf;

use phalanx_core::distill::{Batch, Fate, Messages, verify_proof};

const PER_LEAF: usize = 16;

fn batch(n: usize) -> Batch {
    let ids: Vec<u64> = (0..n as u64).map(|i| 3 * i + 1).collect();
    let msgs: Vec<[u8; 8]> = (0..n as u64).map(u64::to_le_bytes).collect();
    Batch::new(ids, Messages::collect(msgs.iter().map(|m| &m[..])), 0, None, vec![]).expect("a valid batch")
}

fn seq(i: usize) -> Fate {
    Fate::Seq(i as u64 % 5)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn vectors() -> String {
    let mut out = String::from(
        "{\n  \"leaf_entries\": 16,\n  \"entry\": \"id 3i+1, seq i mod 5, msg i as u64 little-endian\",\n  \"roots\": [\n",
    );
    let mut cases: Vec<(String, usize, bool)> =
        (1..=33).map(|l| (format!("{l} leaves"), l * PER_LEAF, false)).collect();
    cases.push(("32 leaves and one of 5 entries".into(), 32 * PER_LEAF + 5, false));
    cases.push(("65536 entries".into(), 65_536, false));
    cases.push(("65536 entries, every third dropped".into(), 65_536, true));
    for (k, (name, n, dropped)) in cases.iter().enumerate() {
        let b = batch(*n);
        let fate = |i: usize| if *dropped && i % 3 == 2 { Fate::Dropped } else { seq(i) };
        let root = b.root_of(PER_LEAF, fate);
        let comma = if k + 1 < cases.len() { "," } else { "" };
        writeln!(out, "    {{\"case\": \"{name}\", \"entries\": {n}, \"root\": \"{}\"}}{comma}", hex(&root)).unwrap();
    }
    out.push_str("  ],\n  \"proofs\": [\n");
    let proofs = [(5 * PER_LEAF, 0), (5 * PER_LEAF, 17), (5 * PER_LEAF + 3, 81), (65_536, 40_000)];
    for (k, &(n, i)) in proofs.iter().enumerate() {
        let b = batch(n);
        let tree = b.tree(PER_LEAF, &seq);
        let p = b.proof(&tree, PER_LEAF, i, &seq);
        assert!(verify_proof(&tree.root(), PER_LEAF, 3 * i as u64 + 1, i as u64 % 5, &(i as u64).to_le_bytes(), &p));
        let siblings: Vec<String> = p.siblings.iter().map(|s| format!("\"{}\"", hex(s))).collect();
        let comma = if k + 1 < proofs.len() { "," } else { "" };
        writeln!(
            out,
            "    {{\"entries\": {n}, \"index\": {i}, \"root\": \"{}\", \"before\": \"{}\", \"after\": \"{}\", \"siblings\": [{}]}}{comma}",
            hex(&tree.root()),
            hex(&p.before),
            hex(&p.after),
            siblings.join(", ")
        )
        .unwrap();
    }
    out.push_str("  ]\n}\n");
    out
}

#[test]
fn the_merkle_tree_matches_its_published_vectors() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("vectors/distill-merkle.json");
    let now = vectors();
    if std::env::var_os("PHALANX_WRITE_VECTORS").is_some() {
        std::fs::write(&path, &now).unwrap();
    }
    let published = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(now, published, "the tree no longer matches {}", path.display());
}
