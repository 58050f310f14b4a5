//! A load broker's fabrication (spec §8), for benchmarks: fully distilled batches of
//! generated clients whose multi-signature on a root is made with one signing, by the sum
//! of the non-stragglers' secret keys (the generator knows them all). Servers verify it
//! against the sum of their public keys as for any batch, so their path is measured
//! honestly. Used by `phalanx-sim distill-bench` (in process) and `phalanxd distill-bench`
//! (real server processes).

use super::batch::{Batch, Messages, Straggler};
use super::directory::generated_secrets;
use super::{broadcast_statement, reduction_statement};
use crate::crypto::{BlsSecretKey, BlsSignature, CryptoMode, Digest, EdSecretKey, aggregate, sum_secret_keys};
use crate::wire::pb;

/// Whether the `i`-th client of a batch straggles, for a fraction of `pct` percent
/// (a fixed spread, the same in every batch).
pub fn straggles(i: usize, pct: u64) -> bool {
    (i as u64).wrapping_mul(2_654_435_761) % 100 < pct
}

/// Batch `b`'s messages for `n` clients: 8 bytes each, `b << 32 | i`, all distinct.
pub fn messages(b: u64, n: usize) -> Messages {
    let msgs: Vec<[u8; 8]> = (0..n as u64).map(|i| (b << 32 | i).to_le_bytes()).collect();
    Messages::collect(msgs.iter().map(|m| &m[..]))
}

/// The generated clients `ids` of a directory, as a load broker fabricates their batches.
pub struct LoadClients {
    system_id: Digest,
    per_leaf: usize,
    ids: Vec<u64>,
    /// The stragglers' positions and Ed25519 keys (they sign their entries one by one).
    stragglers: Vec<(usize, EdSecretKey)>,
    /// The sum of the others' BLS secret keys; `None` if all straggle.
    sum: Option<BlsSecretKey>,
}

impl LoadClients {
    /// `ids` strictly increasing, in the directory generated from `directory_seed`;
    /// `straggler_pct` percent of them straggle. Derives every client's keys: slow for
    /// many clients, done once.
    pub fn new(
        mode: CryptoMode,
        system_id: Digest,
        leaf_entries: u32,
        directory_seed: u64,
        ids: Vec<u64>,
        straggler_pct: u64,
    ) -> Option<LoadClients> {
        let mut signers = Vec::new();
        let mut stragglers = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            let (ed, bls) = generated_secrets(mode, directory_seed, id);
            if straggles(i, straggler_pct) {
                stragglers.push((i, ed));
            } else {
                signers.push(bls);
            }
        }
        let sum = match signers.is_empty() {
            true => None,
            false => Some(sum_secret_keys(&signers)?),
        };
        Some(LoadClients { system_id, per_leaf: leaf_entries as usize, ids, stragglers, sum })
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The fully distilled batch of every client's `msgs[i]` at seq `raise`, and its R2.
    pub fn batch(&self, raise: u64, msgs: Messages) -> Option<(Batch, Digest)> {
        let stragglers = self
            .stragglers
            .iter()
            .map(|(i, ed)| Straggler {
                id: self.ids[*i],
                seq: raise,
                signature: ed.sign(&broadcast_statement(&self.system_id, self.ids[*i], raise, msgs.get(*i))),
            })
            .collect();
        let aggregate = match &self.sum {
            Some(sum) => {
                let unsigned = Batch::new(self.ids.clone(), msgs.clone(), raise, None, vec![])?;
                let r1 = unsigned.root_t1(self.per_leaf);
                Some(sum.sign(&reduction_statement(&self.system_id, &r1)))
            }
            None => None,
        };
        let batch = Batch::new(self.ids.clone(), msgs, raise, aggregate, stragglers)?;
        let r2 = batch.root_t2(self.per_leaf);
        Some((batch, r2))
    }
}

/// A witness certificate from shards of servers at `signers` (their indices among the
/// `servers` sorted server ids), aggregated as a broker does.
pub fn certificate(
    mode: CryptoMode,
    servers: usize,
    shards: &[(usize, BlsSignature)],
) -> Option<pb::DistillCertificate> {
    let sigs: Vec<BlsSignature> = shards.iter().map(|(_, s)| *s).collect();
    let agg = aggregate(mode, &sigs)?;
    let mut bitmap = vec![0u8; servers.div_ceil(8)];
    for &(i, _) in shards {
        bitmap[i / 8] |= 1 << (i % 8);
    }
    Some(pb::DistillCertificate { signers: bitmap, signature: agg.0.to_vec() })
}
