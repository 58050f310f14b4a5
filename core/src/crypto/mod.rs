//! Cryptography (DESIGN §4): keyed-BLAKE3 MACs for point-to-point authentication,
//! BLAKE3 digests, and BLS12-381 (`blst`, `min_pk`) signatures with proof of possession
//! for transferable proofs.
//!
//! Every operation takes a [`CryptoMode`]. [`CryptoMode::InsecureTest`] replaces MACs and
//! signatures with cheap checksums that anyone can forge; it exists only so that large
//! simulations and benchmarks that say so run fast.

mod bls;
pub mod ed25519;
mod mac;

pub use bls::{
    BlsKey, BlsPublicKey, BlsSecretKey, BlsShare, BlsSignature, KeySum, aggregate, fast_aggregate_verify,
    sum_secret_keys, sum_shares, verify_multi,
};
pub use ed25519::{EdKey, EdPublicKey, EdSecretKey, EdSignature};
pub use mac::{MAC_LEN, MacKey, MacTag};

/// Which implementation backs MACs and signatures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CryptoMode {
    Real,
    /// Forgeable checksums. Never for anything but tests and benchmarks that say so.
    InsecureTest,
}

impl CryptoMode {
    pub const ALL: [CryptoMode; 2] = [CryptoMode::Real, CryptoMode::InsecureTest];

    /// The name configuration files and bindings use.
    pub fn name(self) -> &'static str {
        match self {
            CryptoMode::Real => "real",
            CryptoMode::InsecureTest => "insecure-test",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// Where a node's BLS operations run, when its cluster uses [`CryptoMode::Real`]: by
/// default the core's own code; a core inside a sandbox can hand them to its host, which
/// runs them natively (the wasm engine's `host-crypto` import). Answers must be those of
/// [`BlsSecretKey::sign`], [`BlsPublicKey::verify`], [`aggregate`] and
/// [`fast_aggregate_verify`] and [`BlsPublicKey::validate_with_pop`]: signatures are
/// deterministic, so traces stay identical.
pub trait BlsBackend: Send + Sync {
    fn sign(&self, sk: &BlsSecretKey, msg: &[u8]) -> BlsSignature;
    /// `sig` on `msg` under `pk`, which has not been validated: the backend checks it.
    fn verify(&self, pk: &BlsPublicKey, msg: &[u8], sig: &BlsSignature) -> bool;
    /// Signatures on one message, each checked to be in the group.
    fn aggregate(&self, sigs: &[BlsSignature]) -> Option<BlsSignature>;
    /// An aggregate by `pks` (validated with their proof of possession) on `msg`.
    fn fast_aggregate_verify(&self, pks: &[BlsPublicKey], msg: &[u8], agg: &BlsSignature) -> bool;
    /// `pk` is a valid key and `pop` proves its possession (key registration).
    fn validate_with_pop(&self, pk: &BlsPublicKey, pop: &BlsSignature) -> bool;
}

/// BLAKE3 digest.
pub type Digest = [u8; 32];

pub fn digest(data: &[u8]) -> Digest {
    *blake3::hash(data).as_bytes()
}

/// Deterministic key material for tests and `keygen`: the pairwise MAC key of nodes `a`
/// and `b` (symmetric in `a`, `b`) derived from a cluster seed.
pub fn pairwise_mac_key(seed: &[u8; 32], a: u32, b: u32) -> MacKey {
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    let mut h = blake3::Hasher::new_derive_key("phalanx v1 pairwise mac key");
    h.update(seed);
    h.update(&lo.to_le_bytes());
    h.update(&hi.to_le_bytes());
    MacKey::from_bytes(*h.finalize().as_bytes())
}

/// Key material for another purpose derived from `material` (a node's Ed25519 key from
/// its BLS key material, say): knowing one derived key reveals nothing of the others.
pub fn derive_key_material(purpose: &str, material: &[u8; 32]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key(purpose);
    h.update(material);
    *h.finalize().as_bytes()
}

/// Deterministic BLS secret key material of node `id` derived from a cluster seed.
pub fn bls_key_material(seed: &[u8; 32], id: u32) -> [u8; 32] {
    let mut h = blake3::Hasher::new_derive_key("phalanx v1 bls key material");
    h.update(seed);
    h.update(&id.to_le_bytes());
    *h.finalize().as_bytes()
}
