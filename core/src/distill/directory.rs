//! The directory: client id → (Ed25519 key, BLS key). Ids `0 .. directory_size` are
//! generated from `directory_seed` (tests and benchmarks, as the reference artifact
//! does: anyone who knows the seed knows their secrets), derived when first needed;
//! later ids come from sign-ups ordered by the TOB, in order.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::crypto::{
    BlsKey, BlsPublicKey, BlsSecretKey, CryptoMode, EdKey, EdPublicKey, EdSecretKey, derive_key_material,
};

/// The purpose a node's Ed25519 key material is derived for from its BLS key material.
pub const ED25519_PURPOSE: &str = "phalanx v1 distill ed25519 key";

/// A client's keys, both parsed once.
#[derive(Clone, Debug)]
pub struct Keys {
    pub ed: EdKey,
    pub bls: BlsKey,
}

#[derive(Clone, Debug)]
pub struct Directory {
    mode: CryptoMode,
    seed: u64,
    generated: u64,
    /// Generated entries derived so far, by id: pages of [`PAGE`] ids, each allocated
    /// when an id in it is first derived (a verifying server looks up one key an entry).
    derived: Vec<Option<Box<Page>>>,
    /// One bit per generated id, set once it is derived: [`Directory::prepare`] walks a
    /// batch's ids through these 128 KiB (for 2^20 ids) rather than through the pages.
    is_derived: Vec<u64>,
    /// Ids from `generated` on, in order.
    signed_up: Vec<Arc<Keys>>,
    by_ed: BTreeMap<EdPublicKey, u64>,
    /// A broker's: signed-up entries it learned from their certificates, in any order.
    learned: BTreeMap<u64, Arc<Keys>>,
}

/// Ids a page of derived entries holds.
const PAGE: usize = 1024;

type Page = [Option<Arc<Keys>>; PAGE];

/// The BLS key material of generated client `id`.
pub fn generated_material(seed: u64, id: u64) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key("phalanx v1 distill generated directory");
    h.update(&seed.to_le_bytes());
    h.update(&id.to_le_bytes());
    *h.finalize().as_bytes()
}

/// A client's Ed25519 key from its BLS key material.
pub fn ed_key(mode: CryptoMode, bls_material: &[u8; 32]) -> EdSecretKey {
    EdSecretKey::from_key_material(mode, &derive_key_material(ED25519_PURPOSE, bls_material))
}

/// The secrets of generated client `id` (for tests, benchmarks and load generators).
pub fn generated_secrets(mode: CryptoMode, seed: u64, id: u64) -> (EdSecretKey, BlsSecretKey) {
    let material = generated_material(seed, id);
    (ed_key(mode, &material), BlsSecretKey::from_key_material(mode, &material))
}

/// The word and bit of `id` in [`Directory`]'s `is_derived` bitmap.
fn derived_bit(id: u64) -> (usize, u64) {
    ((id / 64) as usize, 1 << (id % 64))
}

impl Directory {
    pub fn new(mode: CryptoMode, seed: u64, generated: u64) -> Self {
        Directory {
            mode,
            seed,
            generated,
            derived: Vec::new(),
            is_derived: Vec::new(),
            signed_up: Vec::new(),
            by_ed: BTreeMap::new(),
            learned: BTreeMap::new(),
        }
    }

    /// Ids `0 .. len()` exist.
    pub fn len(&self) -> u64 {
        self.generated + self.signed_up.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn generated(&self) -> u64 {
        self.generated
    }

    /// `id`'s keys, if it exists.
    pub fn get(&mut self, id: u64) -> Option<Arc<Keys>> {
        if id < self.generated {
            return Some(self.derive(id).clone());
        }
        self.peek(id).cloned()
    }

    /// Derives generated entry `id` (below `generated()`) unless it was already.
    fn derive(&mut self, id: u64) -> &Arc<Keys> {
        let (page, at) = ((id / PAGE as u64) as usize, (id % PAGE as u64) as usize);
        if page >= self.derived.len() {
            self.derived.resize_with(page + 1, || None);
        }
        let (word, bit) = derived_bit(id);
        if word >= self.is_derived.len() {
            self.is_derived.resize(word + 1, 0);
        }
        self.is_derived[word] |= bit;
        let (mode, seed) = (self.mode, self.seed);
        self.derived[page].get_or_insert_with(|| Box::new([const { None }; PAGE]))[at].get_or_insert_with(|| {
            let (ed, bls) = generated_secrets(mode, seed, id);
            let bls = BlsKey::parse(mode, &bls.public_key()).expect("a generated key is valid");
            let ed = EdKey::parse(mode, &ed.public_key()).expect("a generated key is valid");
            Arc::new(Keys { ed, bls })
        })
    }

    /// Whether every one of `ids` exists, deriving the generated ones not derived yet, so
    /// that [`Directory::peek`] finds them all.
    pub fn prepare(&mut self, ids: &[u64]) -> bool {
        ids.iter().all(|&id| {
            if id < self.generated {
                let (word, bit) = derived_bit(id);
                if self.is_derived.get(word).is_none_or(|w| w & bit == 0) {
                    self.derive(id);
                }
                true
            } else {
                self.peek(id).is_some()
            }
        })
    }

    /// `id`'s keys if it exists and, when generated, was derived already.
    pub fn peek(&self, id: u64) -> Option<&Arc<Keys>> {
        if id < self.generated {
            let (page, at) = ((id / PAGE as u64) as usize, (id % PAGE as u64) as usize);
            return self.derived.get(page)?.as_ref()?[at].as_ref();
        }
        let signed_up = usize::try_from(id - self.generated).ok().and_then(|i| self.signed_up.get(i));
        signed_up.or_else(|| self.learned.get(&id))
    }

    /// The id of a signed-up client with this Ed25519 key.
    pub fn id_of(&self, ed: &EdPublicKey) -> Option<u64> {
        self.by_ed.get(ed).copied()
    }

    /// Adds a signed-up client (its proofs of possession checked) under the next id, or
    /// returns the id it has. `None` if either key is not a valid key.
    pub fn sign_up(&mut self, ed: EdPublicKey, bls: &BlsPublicKey) -> Option<u64> {
        if let Some(id) = self.id_of(&ed) {
            return Some(id);
        }
        let bls = BlsKey::parse(self.mode, bls)?;
        let ed_key = EdKey::parse(self.mode, &ed)?;
        let id = self.len();
        self.signed_up.push(Arc::new(Keys { ed: ed_key, bls }));
        self.by_ed.insert(ed, id);
        Some(id)
    }

    /// The signed-up entries, in id order (replicated state).
    pub fn signed_up(&self) -> impl Iterator<Item = &Keys> {
        self.signed_up.iter().map(|k| k.as_ref())
    }

    /// Forgets the sign-ups (before a restore replays them).
    pub fn clear_sign_ups(&mut self) {
        self.signed_up.clear();
        self.by_ed.clear();
    }

    /// A broker learns an entry f+1 servers certified (an `Assignment`), bounded by
    /// `max` entries learned.
    pub fn learn(&mut self, id: u64, ed: EdPublicKey, bls: &BlsPublicKey, max: usize) -> bool {
        if id < self.generated || self.learned.len() >= max {
            return false;
        }
        let (Some(bls), Some(ed)) = (BlsKey::parse(self.mode, bls), EdKey::parse(self.mode, &ed)) else {
            return false;
        };
        self.learned.insert(id, Arc::new(Keys { ed, bls }));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_entries_match_their_secrets_and_sign_ups_follow() {
        for mode in CryptoMode::ALL {
            let mut d = Directory::new(mode, 7, 3);
            let (ed, bls) = generated_secrets(mode, 7, 2);
            let k = d.get(2).unwrap();
            assert_eq!((k.ed.bytes, k.bls.bytes), (ed.public_key(), bls.public_key()));
            assert!(d.get(3).is_none());
            let (ed, bls) = generated_secrets(mode, 8, 0);
            assert_eq!(d.sign_up(ed.public_key(), &bls.public_key()), Some(3));
            assert_eq!(d.sign_up(ed.public_key(), &bls.public_key()), Some(3));
            assert_eq!(d.get(3).unwrap().ed.bytes, ed.public_key());
            assert_eq!(d.len(), 4);
        }
    }

    #[test]
    fn prepare_derives_each_generated_id_once_and_refuses_unknown_ones() {
        let mut d = Directory::new(CryptoMode::InsecureTest, 7, 200);
        assert!(d.peek(130).is_none());
        assert!(d.prepare(&[3, 64, 130]));
        let first = d.peek(130).cloned().expect("derived");
        assert!(d.prepare(&[130, 199]));
        assert!(Arc::ptr_eq(&first, d.peek(130).expect("kept")), "derived again");
        assert!(d.peek(4).is_none() && d.peek(199).is_some());
        assert!(!d.prepare(&[5, 200]));
    }
}
