//! Ed25519 (`ed25519-dalek` 2): the individual signatures of distillation's clients and
//! the identity keys of its brokers. Bursts are checked with batch verification, which
//! is deterministic here (`ed25519-dalek` seeds it from a transcript of the inputs), so
//! every node that checks the same burst reaches the same answer.

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};

use super::CryptoMode;
use super::bls::insecure_xof as xof;

pub const ED_PUBLIC_KEY_LEN: usize = 32;
pub const ED_SIGNATURE_LEN: usize = 64;

const INSECURE_PK_CONTEXT: &str = "phalanx v1 insecure ed25519 pk";
const INSECURE_SIG_CONTEXT: &str = "phalanx v1 insecure ed25519 sig";

/// An Ed25519 secret key, bound to the [`CryptoMode`] it was made in.
#[derive(Clone)]
pub struct EdSecretKey {
    backend: Backend,
    public_key: EdPublicKey,
}

#[derive(Clone)]
enum Backend {
    Real(Box<SigningKey>),
    InsecureTest,
}

impl std::fmt::Debug for EdSecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdSecretKey").field("public_key", &self.public_key).finish_non_exhaustive()
    }
}

/// A compressed Edwards point; trusted only once a signature verifies under it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct EdPublicKey(pub [u8; ED_PUBLIC_KEY_LEN]);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct EdSignature(pub [u8; ED_SIGNATURE_LEN]);

impl EdSecretKey {
    /// From 32 bytes of key material (the Ed25519 seed in `Real` mode).
    pub fn from_key_material(mode: CryptoMode, ikm: &[u8; 32]) -> Self {
        match mode {
            CryptoMode::Real => {
                let sk = SigningKey::from_bytes(ikm);
                let public_key = EdPublicKey(sk.verifying_key().to_bytes());
                EdSecretKey { backend: Backend::Real(Box::new(sk)), public_key }
            }
            CryptoMode::InsecureTest => {
                let public_key = EdPublicKey(xof(INSECURE_PK_CONTEXT, &[ikm]));
                EdSecretKey { backend: Backend::InsecureTest, public_key }
            }
        }
    }

    pub fn public_key(&self) -> EdPublicKey {
        self.public_key
    }

    pub fn sign(&self, msg: &[u8]) -> EdSignature {
        match &self.backend {
            Backend::Real(sk) => EdSignature(sk.sign(msg).to_bytes()),
            Backend::InsecureTest => EdSignature(xof(INSECURE_SIG_CONTEXT, &[&self.public_key.0, msg])),
        }
    }
}

impl EdPublicKey {
    /// Checks `sig` on `msg`; any bytes are safe here (a key that is no point fails).
    pub fn verify(&self, mode: CryptoMode, msg: &[u8], sig: &EdSignature) -> bool {
        match mode {
            CryptoMode::Real => {
                VerifyingKey::from_bytes(&self.0).is_ok_and(|pk| pk.verify(msg, &Signature::from_bytes(&sig.0)).is_ok())
            }
            CryptoMode::InsecureTest => xof::<ED_SIGNATURE_LEN>(INSECURE_SIG_CONTEXT, &[&self.0, msg]) == sig.0,
        }
    }
}

/// A public key decompressed once (`Real`), so that verifying under it many times does
/// not pay the square root each time: about a quarter of a batch verification's cost
/// per signature. Only for keys checked to be points (a directory's).
#[derive(Clone, Debug)]
pub struct EdKey {
    pub bytes: EdPublicKey,
    point: Option<VerifyingKey>,
}

impl EdKey {
    /// `None` if the bytes are not a point (`Real`).
    pub fn parse(mode: CryptoMode, pk: &EdPublicKey) -> Option<EdKey> {
        let point = match mode {
            CryptoMode::Real => Some(VerifyingKey::from_bytes(&pk.0).ok()?),
            CryptoMode::InsecureTest => None,
        };
        Some(EdKey { bytes: *pk, point })
    }

    /// Checks `sig` on `msg`.
    pub fn verify(&self, mode: CryptoMode, msg: &[u8], sig: &EdSignature) -> bool {
        match (mode, &self.point) {
            (CryptoMode::Real, Some(pk)) => pk.verify(msg, &Signature::from_bytes(&sig.0)).is_ok(),
            (CryptoMode::Real, None) => false,
            (CryptoMode::InsecureTest, _) => self.bytes.verify(mode, msg, sig),
        }
    }
}

/// One signed item of a burst.
pub struct EdItem<'a> {
    pub key: &'a EdKey,
    pub msg: &'a [u8],
    pub sig: &'a EdSignature,
}

/// Whether every item verifies, checked as one batch (`Real`): about half the cost of
/// checking them one by one. False if any fails (then check them one by one to find
/// which, as [`verify_each`] does).
pub fn verify_batch(mode: CryptoMode, items: &[EdItem<'_>]) -> bool {
    match mode {
        CryptoMode::Real => {
            let keys: Option<Vec<VerifyingKey>> = items.iter().map(|i| i.key.point).collect();
            let Some(keys) = keys else { return false };
            let msgs: Vec<&[u8]> = items.iter().map(|i| i.msg).collect();
            let sigs: Vec<Signature> = items.iter().map(|i| Signature::from_bytes(&i.sig.0)).collect();
            ed25519_dalek::verify_batch(&msgs, &sigs, &keys).is_ok()
        }
        CryptoMode::InsecureTest => items.iter().all(|i| i.key.verify(mode, i.msg, i.sig)),
    }
}

/// Which items verify: the burst as one batch, and only if that fails, each on its own.
/// Also the number of verification operations it took (a batch counts as one).
pub fn verify_each(mode: CryptoMode, items: &[EdItem<'_>]) -> (Vec<bool>, u64) {
    if items.is_empty() {
        return (vec![], 0);
    }
    if items.len() > 1 && verify_batch(mode, items) {
        return (vec![true; items.len()], 1);
    }
    let ok: Vec<bool> = items.iter().map(|i| i.key.verify(mode, i.msg, i.sig)).collect();
    (ok, items.len() as u64 + u64::from(items.len() > 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_verify_and_batches_in_both_modes() {
        for mode in CryptoMode::ALL {
            let keys: Vec<EdSecretKey> = (0..5u8).map(|i| EdSecretKey::from_key_material(mode, &[i; 32])).collect();
            let msgs: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; i as usize * 7]).collect();
            let pks: Vec<EdKey> = keys.iter().map(|k| EdKey::parse(mode, &k.public_key()).unwrap()).collect();
            let mut sigs: Vec<EdSignature> = keys.iter().zip(&msgs).map(|(k, m)| k.sign(m)).collect();
            assert!(pks[1].verify(mode, &msgs[1], &sigs[1]), "{mode:?}");
            assert!(!pks[1].verify(mode, &msgs[2], &sigs[1]), "{mode:?}");
            assert!(!pks[2].verify(mode, &msgs[1], &sigs[1]), "{mode:?}");
            let items = |sigs: &[EdSignature]| -> Vec<(EdKey, Vec<u8>, EdSignature)> {
                (0..5).map(|i| (pks[i].clone(), msgs[i].clone(), sigs[i])).collect()
            };
            let owned = items(&sigs);
            let burst: Vec<EdItem> = owned.iter().map(|(k, m, s)| EdItem { key: k, msg: m, sig: s }).collect();
            assert!(verify_batch(mode, &burst));
            assert_eq!(verify_each(mode, &burst), (vec![true; 5], 1));
            sigs[3].0[5] ^= 1;
            let owned = items(&sigs);
            let burst: Vec<EdItem> = owned.iter().map(|(k, m, s)| EdItem { key: k, msg: m, sig: s }).collect();
            assert!(!verify_batch(mode, &burst));
            assert_eq!(verify_each(mode, &burst).0, [true, true, true, false, true]);
        }
    }

    #[test]
    fn garbage_keys_and_modes_do_not_cross_verify() {
        let real = EdSecretKey::from_key_material(CryptoMode::Real, &[9; 32]);
        let fake = EdSecretKey::from_key_material(CryptoMode::InsecureTest, &[9; 32]);
        assert!(!fake.public_key().verify(CryptoMode::Real, b"m", &fake.sign(b"m")));
        assert!(!real.public_key().verify(CryptoMode::InsecureTest, b"m", &real.sign(b"m")));
        let garbage = EdPublicKey([0xff; 32]);
        assert!(!garbage.verify(CryptoMode::Real, b"m", &real.sign(b"m")));
        // Some bytes are no point: a directory refuses them, as a sign-up's proof would fail.
        let not_a_point =
            (0..=255u8).map(|b| EdPublicKey([b; 32])).find(|k| EdKey::parse(CryptoMode::Real, k).is_none());
        let not_a_point = not_a_point.expect("about half of all encodings are no point");
        assert!(!not_a_point.verify(CryptoMode::Real, b"m", &real.sign(b"m")));
        let other = EdSecretKey::from_key_material(CryptoMode::Real, &[8; 32]).public_key();
        let other = EdKey::parse(CryptoMode::Real, &other).expect("a point");
        let item = [EdItem { key: &other, msg: b"m", sig: &real.sign(b"m") }];
        assert!(!verify_batch(CryptoMode::Real, &item));
        assert!(!other.verify(CryptoMode::Real, b"m", &real.sign(b"m")));
    }
}
