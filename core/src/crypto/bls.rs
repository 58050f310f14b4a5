//! BLS12-381 signatures in the proof-of-possession scheme (`blst`, `min_pk`: 48-byte public
//! keys in G1, 96-byte signatures in G2). Signatures on one message aggregate into one
//! signature that is checked against the sum of the signers' keys; that is only sound for
//! keys registered with [`BlsPublicKey::validate_with_pop`], which rules out rogue keys.
//!
//! Verification drives `blst::Pairing` directly instead of calling `Signature::verify`,
//! which hands the work to a process-wide thread pool: the core stays single-threaded.

use blst::min_pk::{AggregatePublicKey, AggregateSignature, PublicKey, SecretKey, Signature};
use blst::{BLST_ERROR, Pairing, blst_p1, blst_p1_affine, blst_p2_affine};

use super::CryptoMode;

pub const BLS_PUBLIC_KEY_LEN: usize = 48;
pub const BLS_SIGNATURE_LEN: usize = 96;

/// Keeps ordinary signatures and proofs of possession apart, so neither can stand in for
/// the other.
struct Domain {
    dst: &'static [u8],
    insecure_context: &'static str,
}

const SIG: Domain =
    Domain { dst: b"BLS_SIG_BLS12381G2_XMD:SHA-256_SSWU_RO_POP_", insecure_context: "phalanx v1 insecure bls sig" };

const POP: Domain =
    Domain { dst: b"BLS_POP_BLS12381G2_XMD:SHA-256_SSWU_RO_POP_", insecure_context: "phalanx v1 insecure bls pop" };

const INSECURE_PK_CONTEXT: &str = "phalanx v1 insecure bls pk";

/// A BLS secret key, bound to the [`CryptoMode`] it was made in.
#[derive(Clone)]
pub struct BlsSecretKey {
    key_material: [u8; 32],
    backend: Backend,
    /// Cached: deriving it is a scalar multiplication in `Real` mode.
    public_key: BlsPublicKey,
}

/// The mode a key was made in; only `Real` has a scalar (which `blst` zeroizes on drop).
#[derive(Clone)]
enum Backend {
    Real(SecretKey),
    InsecureTest,
}

impl std::fmt::Debug for BlsSecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlsSecretKey").field("public_key", &self.public_key).finish_non_exhaustive()
    }
}

/// A compressed G1 point; the bytes are only trusted once validated.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BlsPublicKey(pub [u8; BLS_PUBLIC_KEY_LEN]);

/// A compressed G2 point: one signature or an aggregate of several.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BlsSignature(pub [u8; BLS_SIGNATURE_LEN]);

impl BlsSecretKey {
    /// From 32 bytes of key material (blst `key_gen` as IKM in `Real` mode).
    pub fn from_key_material(mode: CryptoMode, ikm: &[u8; 32]) -> Self {
        let (backend, public_key) = match mode {
            CryptoMode::Real => {
                // `key_gen` only fails on fewer than 32 bytes of key material.
                let sk = SecretKey::key_gen(ikm, &[]).expect("32 bytes of key material");
                let pk = BlsPublicKey(sk.sk_to_pk().compress());
                (Backend::Real(sk), pk)
            }
            CryptoMode::InsecureTest => {
                (Backend::InsecureTest, BlsPublicKey(insecure_xof(INSECURE_PK_CONTEXT, &[ikm])))
            }
        };
        BlsSecretKey { key_material: *ikm, backend, public_key }
    }

    /// The 32 bytes the key was made from, for config files.
    pub fn key_material(&self) -> &[u8; 32] {
        &self.key_material
    }

    pub fn public_key(&self) -> BlsPublicKey {
        self.public_key
    }

    pub fn sign(&self, msg: &[u8]) -> BlsSignature {
        self.sign_in(&SIG, msg)
    }

    /// Proof of possession: a signature over the compressed public key under the PoP DST.
    pub fn prove_possession(&self) -> BlsSignature {
        self.sign_in(&POP, &self.public_key.0)
    }

    fn sign_in(&self, domain: &Domain, msg: &[u8]) -> BlsSignature {
        match &self.backend {
            Backend::Real(sk) => BlsSignature(sk.sign(msg, domain.dst, &[]).compress()),
            Backend::InsecureTest => insecure_sign(domain, &self.public_key, msg),
        }
    }
}

impl BlsPublicKey {
    /// Checks that the bytes are a valid, non-identity, in-subgroup point (`Real`) and that
    /// `pop` proves possession. Key registration calls this; a key that fails is rejected.
    pub fn validate_with_pop(&self, mode: CryptoMode, pop: &BlsSignature) -> bool {
        self.verify_in(mode, &POP, &self.0, pop)
    }

    /// Checks `sig` on `msg`; the key itself is validated too, so any bytes are safe here.
    pub fn verify(&self, mode: CryptoMode, msg: &[u8], sig: &BlsSignature) -> bool {
        self.verify_in(mode, &SIG, msg, sig)
    }

    fn verify_in(&self, mode: CryptoMode, domain: &Domain, msg: &[u8], sig: &BlsSignature) -> bool {
        match mode {
            CryptoMode::Real => {
                let (Ok(pk), Ok(sig)) = (PublicKey::uncompress(&self.0), Signature::uncompress(&sig.0)) else {
                    return false;
                };
                pairing_check(&pk, &sig, domain.dst, msg)
            }
            CryptoMode::InsecureTest => insecure_sign(domain, self, msg) == *sig,
        }
    }
}

/// Aggregates signatures (on the same message, for [`fast_aggregate_verify`]). None if
/// empty or any is not a point of the curve. The points are not checked to be in the
/// signature group, as the IETF scheme's `Aggregate` does not: what an aggregate proves
/// rests on its verification, which checks the sum (one subgroup check, where one per
/// signature cost a tenth of a checkpoint's BLS time).
pub fn aggregate(mode: CryptoMode, sigs: &[BlsSignature]) -> Option<BlsSignature> {
    let (first, rest) = sigs.split_first()?;
    match mode {
        CryptoMode::Real => {
            let parse = |s: &BlsSignature| Signature::uncompress(&s.0).ok();
            let mut acc = AggregateSignature::from_signature(&parse(first)?);
            for s in rest {
                acc.add_signature(&parse(s)?, false).ok()?;
            }
            Some(BlsSignature(acc.to_signature().compress()))
        }
        CryptoMode::InsecureTest => Some(rest.iter().fold(*first, |acc, s| xor(&acc, s))),
    }
}

impl BlsSignature {
    /// The share to send to whoever sums many: in `Real`, the point uncompressed (192
    /// bytes), which [`BlsShare::parse`] reads without the square root decompression
    /// takes; the signature's own bytes in `InsecureTest`, or if they are not a point.
    pub fn share_bytes(&self, mode: CryptoMode) -> Vec<u8> {
        match (mode, Signature::uncompress(&self.0)) {
            (CryptoMode::Real, Ok(point)) => point.serialize().to_vec(),
            _ => self.0.to_vec(),
        }
    }
}

/// A signature share parsed once (`Real`: a point on the curve, not yet checked to be in
/// the signature group), so that sums over many cost additions only: for shares whose sum
/// is verified next ([`verify_multi`] checks it is in the group), where a subgroup check
/// per share would cost more than the rest.
#[derive(Clone, Copy, Debug)]
pub struct BlsShare(ShareRepr);

#[derive(Clone, Copy, Debug)]
enum ShareRepr {
    Real(Signature),
    InsecureTest(BlsSignature),
}

impl BlsShare {
    /// From the 96 bytes of a compressed point or the 192 of an uncompressed one (`Real`;
    /// the latter spares the square root that decompression takes). None if not a point.
    pub fn parse(mode: CryptoMode, bytes: &[u8]) -> Option<BlsShare> {
        match mode {
            CryptoMode::Real => Signature::deserialize(bytes).ok().map(|sig| BlsShare(ShareRepr::Real(sig))),
            CryptoMode::InsecureTest => Some(BlsShare(ShareRepr::InsecureTest(BlsSignature(bytes.try_into().ok()?)))),
        }
    }
}

/// The sum of `shares` (their aggregate signature). None if empty or the modes differ.
pub fn sum_shares<'a>(shares: impl IntoIterator<Item = &'a BlsShare>) -> Option<BlsSignature> {
    let mut shares = shares.into_iter();
    match shares.next()?.0 {
        ShareRepr::Real(first) => {
            let mut acc = AggregateSignature::from_signature(&first);
            for s in shares {
                let ShareRepr::Real(sig) = &s.0 else { return None };
                acc.add_signature(sig, false).ok()?;
            }
            Some(BlsSignature(acc.to_signature().compress()))
        }
        ShareRepr::InsecureTest(first) => shares.try_fold(first, |acc, s| match &s.0 {
            ShareRepr::InsecureTest(sig) => Some(xor(&acc, sig)),
            ShareRepr::Real(_) => None,
        }),
    }
}

/// Verifies an aggregate of signatures by `pks` on one message. Keys must have been
/// validated with their PoP beforehand: without that, colluding keys can forge.
pub fn fast_aggregate_verify(mode: CryptoMode, pks: &[BlsPublicKey], msg: &[u8], agg: &BlsSignature) -> bool {
    let Some((first, rest)) = pks.split_first() else {
        return false;
    };
    match mode {
        CryptoMode::Real => {
            let Ok(first) = PublicKey::uncompress(&first.0) else {
                return false;
            };
            let mut acc = AggregatePublicKey::from_public_key(&first);
            for pk in rest {
                let Ok(pk) = PublicKey::uncompress(&pk.0) else {
                    return false;
                };
                if acc.add_public_key(&pk, false).is_err() {
                    return false;
                }
            }
            let Ok(sig) = Signature::uncompress(&agg.0) else {
                return false;
            };
            // The check validates the sum: one subgroup check rather than one per key.
            pairing_check(&acc.to_public_key(), &sig, SIG.dst, msg)
        }
        CryptoMode::InsecureTest => {
            let expected =
                rest.iter().fold(insecure_sign(&SIG, first, msg), |acc, pk| xor(&acc, &insecure_sign(&SIG, pk, msg)));
            expected == *agg
        }
    }
}

/// BLS12-381's group order r, as little-endian 64-bit limbs.
const ORDER: [u64; 4] = [0xffff_ffff_0000_0001, 0x53bd_a402_fffe_5bfe, 0x3339_d808_09a1_d805, 0x73ed_a753_299d_7d48];

/// The secret key Σ sk (mod r) of `keys`, whose signature on a message is the
/// multi-signature of all of them: what a load generator that made the keys signs with
/// (distillation spec §8), one signing instead of one per key. `Real` keys only.
pub fn sum_secret_keys(keys: &[BlsSecretKey]) -> Option<BlsSecretKey> {
    let mut acc = [0u64; 4];
    for k in keys {
        let Backend::Real(sk) = &k.backend else { return None };
        let be = sk.to_bytes();
        let x: [u64; 4] =
            std::array::from_fn(|i| u64::from_be_bytes(be[24 - 8 * i..32 - 8 * i].try_into().expect("8")));
        // Both below r < 2^255: the sum fits, then at most one subtraction of r.
        let mut carry = 0u128;
        for i in 0..4 {
            let s = acc[i] as u128 + x[i] as u128 + carry;
            acc[i] = s as u64;
            carry = s >> 64;
        }
        if (0..4).rev().map(|i| acc[i].cmp(&ORDER[i])).find(|o| o.is_ne()) != Some(std::cmp::Ordering::Less) {
            let mut borrow = 0i128;
            for i in 0..4 {
                let d = acc[i] as i128 - ORDER[i] as i128 - borrow;
                acc[i] = d as u64;
                borrow = i128::from(d < 0);
            }
        }
    }
    let mut be = [0u8; 32];
    for i in 0..4 {
        be[24 - 8 * i..32 - 8 * i].copy_from_slice(&acc[i].to_be_bytes());
    }
    let sk = SecretKey::from_bytes(&be).ok()?;
    let public_key = BlsPublicKey(sk.sk_to_pk().compress());
    Some(BlsSecretKey { key_material: [0; 32], backend: Backend::Real(sk), public_key })
}

/// A public key parsed and checked once (a valid point of G1, not the identity), so that
/// a sum of many costs additions only. Only for keys whose possession was proven.
#[derive(Clone, Debug)]
pub struct BlsKey {
    pub bytes: BlsPublicKey,
    point: Option<PublicKey>,
}

impl BlsKey {
    /// `None` if the bytes are not a valid key (`Real`).
    pub fn parse(mode: CryptoMode, pk: &BlsPublicKey) -> Option<BlsKey> {
        let point = match mode {
            CryptoMode::Real => Some(PublicKey::key_validate(&pk.0).ok()?),
            CryptoMode::InsecureTest => None,
        };
        Some(BlsKey { bytes: *pk, point })
    }
}

/// Verifies a multi-signature by every one of `keys` on `msg`: the keys are summed, then
/// one pairing check. False for no keys.
pub fn verify_multi<'a>(
    mode: CryptoMode,
    mut keys: impl Iterator<Item = &'a BlsKey>,
    msg: &[u8],
    sig: &BlsSignature,
) -> bool {
    match mode {
        CryptoMode::Real => KeySum::of(keys).is_some_and(|sum| sum.verifies(msg, sig)),
        CryptoMode::InsecureTest => {
            let Some(first) = keys.next() else { return false };
            let expected = keys
                .fold(insecure_sign(&SIG, &first.bytes, msg), |acc, k| xor(&acc, &insecure_sign(&SIG, &k.bytes, msg)));
            expected == *sig
        }
    }
}

/// The sum of many parsed keys (`Real` only), kept by whoever verifies many
/// multi-signatures by mostly the same signers: the next sum costs one addition per key
/// that differs ([`KeySum::moved`]) instead of one per key.
#[derive(Clone, Copy, Debug)]
pub struct KeySum(blst_p1);

impl KeySum {
    /// The sum of `keys`. None if there are none or one has no point (not `Real`).
    pub fn of<'a>(keys: impl Iterator<Item = &'a BlsKey>) -> Option<KeySum> {
        let points = points_of(keys)?;
        (!points.is_empty()).then(|| KeySum(sum_points(&points)))
    }

    /// This sum with `added` keys added and `removed` ones (each in this sum) taken out.
    /// None if a key has no point.
    pub fn moved<'a>(
        &self,
        added: impl Iterator<Item = &'a BlsKey>,
        removed: impl Iterator<Item = &'a BlsKey>,
    ) -> Option<KeySum> {
        let (added, removed) = (points_of(added)?, points_of(removed)?);
        let mut out = sum_points(&removed);
        // SAFETY: each pointer is to a live, initialised `blst_p1` on this stack frame;
        // blst's addition allows its output to alias an input.
        unsafe {
            blst::blst_p1_cneg(&mut out, true);
            blst::blst_p1_add_or_double(&mut out, &out, &self.0);
            blst::blst_p1_add_or_double(&mut out, &out, &sum_points(&added));
        }
        Some(KeySum(out))
    }

    /// Whether `sig` is the multi-signature on `msg` of the keys summed. False if the sum
    /// is the identity.
    pub fn verifies(&self, msg: &[u8], sig: &BlsSignature) -> bool {
        let Ok(sig) = Signature::uncompress(&sig.0) else { return false };
        pairing_check(&AggregatePublicKey::from(self.0).to_public_key(), &sig, SIG.dst, msg)
    }
}

/// The points of `keys`; None if one has none.
fn points_of<'a>(keys: impl Iterator<Item = &'a BlsKey>) -> Option<Vec<*const blst_p1_affine>> {
    let mut points = Vec::with_capacity(keys.size_hint().0);
    for k in keys {
        points.push(<&blst_p1_affine>::from(k.point.as_ref()?) as *const _);
    }
    Some(points)
}

/// The sum of affine G1 points (the identity for none), by `blst`'s bulk addition: affine
/// additions with one batched inversion per round (about 5M+1S a point against 8M+5S for
/// adding them one by one), single-threaded. The verifying server of a distilled batch
/// sums one key per entry; this is most of its time.
fn sum_points(points: &[*const blst_p1_affine]) -> blst_p1 {
    let mut sum = blst_p1::default();
    // SAFETY: every pointer comes from a live `&blst_p1_affine` borrowed for the caller's
    // whole call, none is null (null means "the next point in memory" to blst), and
    // `points.len()` is their number (none: blst leaves the identity). blst writes `sum`
    // only and reads the points only.
    unsafe { blst::blst_p1s_add(&mut sum, points.as_ptr(), points.len()) };
    sum
}

/// e(pk, H(msg)) == e(g1, sig), with `pk` checked to be in G1 and not the identity, and
/// `sig` checked to be in G2.
fn pairing_check(pk: &PublicKey, sig: &Signature, dst: &[u8], msg: &[u8]) -> bool {
    let pk: &blst_p1_affine = pk.into();
    let sig: &blst_p2_affine = sig.into();
    let mut pairing = Pairing::new(true, dst);
    if pairing.aggregate(pk, true, sig, true, msg, &[]) != BLST_ERROR::BLST_SUCCESS {
        return false;
    }
    pairing.commit();
    pairing.finalverify(None)
}

/// A checksum anyone who knows the public key can compute: not a signature.
fn insecure_sign(domain: &Domain, pk: &BlsPublicKey, msg: &[u8]) -> BlsSignature {
    BlsSignature(insecure_xof(domain.insecure_context, &[&pk.0, msg]))
}

/// A checksum of `parts` in its own context: the insecure test crypto's stand-in.
pub(super) fn insecure_xof<const N: usize>(context: &str, parts: &[&[u8]]) -> [u8; N] {
    let mut h = blake3::Hasher::new_derive_key(context);
    for p in parts {
        h.update(p);
    }
    let mut out = [0u8; N];
    h.finalize_xof().fill(&mut out);
    out
}

fn xor(a: &BlsSignature, b: &BlsSignature) -> BlsSignature {
    BlsSignature(std::array::from_fn(|i| a.0[i] ^ b.0[i]))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODES: [CryptoMode; 2] = [CryptoMode::Real, CryptoMode::InsecureTest];

    fn key(mode: CryptoMode, seed: u8) -> BlsSecretKey {
        BlsSecretKey::from_key_material(mode, &[seed; 32])
    }

    fn hex<const N: usize>(s: &str) -> [u8; N] {
        std::array::from_fn(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
    }

    /// The first x (compressed-point flag set) that lands on the curve: with overwhelming
    /// probability outside the prime-order subgroup, given the huge cofactors.
    fn on_curve_outside_subgroup<const N: usize>(on_curve: impl Fn(&[u8]) -> bool) -> [u8; N] {
        (1u8..=255)
            .map(|x| {
                let mut b = [0u8; N];
                b[0] = 0x80;
                b[N - 1] = x;
                b
            })
            .find(|b| on_curve(b))
            .unwrap()
    }

    fn garbage_public_keys() -> Vec<BlsPublicKey> {
        let mut identity = [0u8; 48];
        identity[0] = 0xc0;
        let off_group: [u8; 48] =
            on_curve_outside_subgroup(|b| PublicKey::uncompress(b).is_ok_and(|pk| pk.validate().is_err()));
        [[0u8; 48], [0xff; 48], identity, off_group].map(BlsPublicKey).to_vec()
    }

    fn garbage_signatures() -> Vec<BlsSignature> {
        let mut identity = [0u8; 96];
        identity[0] = 0xc0;
        let off_group: [u8; 96] =
            on_curve_outside_subgroup(|b| Signature::uncompress(b).is_ok_and(|sig| !sig.subgroup_check()));
        [[0u8; 96], [0xff; 96], identity, off_group].map(BlsSignature).to_vec()
    }

    #[test]
    fn sign_verify_roundtrip_and_rejections() {
        for mode in MODES {
            let (a, b) = (key(mode, 1), key(mode, 2));
            let sig = a.sign(b"hello");
            assert!(a.public_key().verify(mode, b"hello", &sig), "{mode:?}");
            assert!(!a.public_key().verify(mode, b"hellp", &sig), "{mode:?}");
            assert!(!b.public_key().verify(mode, b"hello", &sig), "{mode:?}");
            assert!(!a.public_key().verify(mode, b"hello", &b.sign(b"hello")), "{mode:?}");
            assert!(a.public_key().verify(mode, b"", &a.sign(b"")), "{mode:?}");
        }
    }

    #[test]
    fn deterministic_from_key_material() {
        for mode in MODES {
            let (a1, a2) = (key(mode, 3), key(mode, 3));
            assert_eq!(a1.key_material(), &[3; 32]);
            assert_eq!(a1.public_key(), a2.public_key());
            assert_eq!(a1.sign(b"m"), a2.sign(b"m"));
            assert_eq!(a1.prove_possession(), a2.prove_possession());
            assert_ne!(a1.public_key(), key(mode, 4).public_key());
            assert_ne!(a1.sign(b"m"), a1.sign(b"n"));
            let restored = BlsSecretKey::from_key_material(mode, a1.key_material());
            assert_eq!(restored.public_key(), a1.public_key());
        }
    }

    #[test]
    fn modes_are_distinct_and_do_not_cross_verify() {
        let (real, fake) = (key(CryptoMode::Real, 5), key(CryptoMode::InsecureTest, 5));
        assert_ne!(real.public_key(), fake.public_key());
        let fake_sig = fake.sign(b"m");
        assert!(!fake.public_key().verify(CryptoMode::Real, b"m", &fake_sig));
        assert!(!real.public_key().verify(CryptoMode::Real, b"m", &fake_sig));
        assert!(!real.public_key().verify(CryptoMode::InsecureTest, b"m", &real.sign(b"m")));
    }

    #[test]
    fn debug_does_not_print_the_secret() {
        let k = key(CryptoMode::Real, 0xab);
        let s = format!("{k:?}");
        assert!(s.starts_with("BlsSecretKey"));
        assert!(!s.contains(&format!("{:?}", k.key_material())), "{s}");
        assert!(!s.contains("value"), "{s}");
    }

    #[test]
    fn proof_of_possession() {
        for mode in MODES {
            let (a, b) = (key(mode, 6), key(mode, 7));
            let (pk_a, pk_b) = (a.public_key(), b.public_key());
            assert!(pk_a.validate_with_pop(mode, &a.prove_possession()), "{mode:?}");
            assert!(!pk_a.validate_with_pop(mode, &b.prove_possession()), "{mode:?}");
            assert!(!pk_b.validate_with_pop(mode, &a.prove_possession()), "{mode:?}");
            // Domain separation: a signature over one's own key is not a PoP, nor vice versa.
            assert!(!pk_a.validate_with_pop(mode, &a.sign(&pk_a.0)), "{mode:?}");
            assert!(!pk_a.verify(mode, &pk_a.0, &a.prove_possession()), "{mode:?}");
        }
    }

    #[test]
    fn aggregate_of_three_verifies_and_detects_changes() {
        for mode in MODES {
            let keys: Vec<_> = (10..13).map(|s| key(mode, s)).collect();
            let pks: Vec<_> = keys.iter().map(BlsSecretKey::public_key).collect();
            let sigs: Vec<_> = keys.iter().map(|k| k.sign(b"block 7")).collect();
            let agg = aggregate(mode, &sigs).unwrap();
            assert!(fast_aggregate_verify(mode, &pks, b"block 7", &agg), "{mode:?}");
            // Order of keys and signatures does not matter.
            let rev_pks: Vec<_> = pks.iter().rev().copied().collect();
            assert!(fast_aggregate_verify(mode, &rev_pks, b"block 7", &agg), "{mode:?}");
            let rev_sigs: Vec<_> = sigs.iter().rev().copied().collect();
            assert_eq!(aggregate(mode, &rev_sigs), Some(agg), "{mode:?}");

            assert!(!fast_aggregate_verify(mode, &pks, b"block 8", &agg), "{mode:?}");
            let mut swapped = pks.clone();
            swapped[1] = key(mode, 99).public_key();
            assert!(!fast_aggregate_verify(mode, &swapped, b"block 7", &agg), "{mode:?}");
            assert!(!fast_aggregate_verify(mode, &pks[..2], b"block 7", &agg), "{mode:?}");
            let partial = aggregate(mode, &sigs[..2]).unwrap();
            assert!(!fast_aggregate_verify(mode, &pks, b"block 7", &partial), "{mode:?}");
            assert!(fast_aggregate_verify(mode, &pks[..2], b"block 7", &partial), "{mode:?}");

            // A single signature is its own aggregate.
            assert_eq!(aggregate(mode, &sigs[..1]), Some(sigs[0]), "{mode:?}");
            assert!(fast_aggregate_verify(mode, &pks[..1], b"block 7", &sigs[0]), "{mode:?}");
        }
    }

    #[test]
    fn shares_sum_to_the_aggregate_in_either_encoding() {
        for mode in MODES {
            let sigs: Vec<_> = (60..64).map(|s| key(mode, s).sign(b"root")).collect();
            let agg = aggregate(mode, &sigs);
            let compressed: Vec<_> = sigs.iter().map(|s| BlsShare::parse(mode, &s.0).unwrap()).collect();
            assert_eq!(sum_shares(&compressed), agg, "{mode:?}");
            assert_eq!(sum_shares(&compressed[..1]), Some(sigs[0]), "{mode:?}");
            assert_eq!(sum_shares(&[]), None, "{mode:?}");
            assert_eq!(BlsShare::parse(mode, &[7; 95]).map(|_| ()), None, "{mode:?}");
        }
        let mode = CryptoMode::Real;
        let sigs: Vec<_> = (60..64).map(|s| key(mode, s).sign(b"root")).collect();
        let uncompressed: Vec<_> = sigs.iter().map(|s| s.share_bytes(mode)).collect();
        assert!(uncompressed.iter().all(|b| b.len() == 192));
        let shares: Vec<_> = uncompressed.iter().map(|b| BlsShare::parse(mode, b).unwrap()).collect();
        assert_eq!(sum_shares(&shares), aggregate(mode, &sigs));
        assert_eq!(sigs[0].share_bytes(CryptoMode::InsecureTest), sigs[0].0.to_vec());
        assert_eq!(BlsSignature([0xff; 96]).share_bytes(mode), vec![0xff; 96]);
        // Not points: refused when parsed, where a sum would otherwise fail.
        for bad in [[0u8; 96], [0xff; 96]] {
            assert!(BlsShare::parse(mode, &bad).is_none());
        }
        assert!(BlsShare::parse(mode, &[0x11; 192]).is_none());
        // Shares of different modes do not sum.
        let insecure = BlsShare::parse(CryptoMode::InsecureTest, &sigs[0].0).unwrap();
        assert_eq!(sum_shares([&shares[0], &insecure]), None);
        assert_eq!(sum_shares([&insecure, &shares[0]]), None);
    }

    #[test]
    fn the_sum_of_secret_keys_signs_their_multi_signature() {
        let keys: Vec<BlsSecretKey> = (40..50).map(|s| key(CryptoMode::Real, s)).collect();
        let sum = sum_secret_keys(&keys).unwrap();
        let parsed: Vec<BlsKey> =
            keys.iter().map(|k| BlsKey::parse(CryptoMode::Real, &k.public_key()).unwrap()).collect();
        let sig = sum.sign(b"root");
        assert!(verify_multi(CryptoMode::Real, parsed.iter(), b"root", &sig));
        assert_eq!(Some(sig), aggregate(CryptoMode::Real, &keys.iter().map(|k| k.sign(b"root")).collect::<Vec<_>>()));
        assert!(!verify_multi(CryptoMode::Real, parsed[1..].iter(), b"root", &sig));
    }

    #[test]
    fn empty_inputs() {
        for mode in MODES {
            assert_eq!(aggregate(mode, &[]), None, "{mode:?}");
            let sig = key(mode, 1).sign(b"m");
            assert!(!fast_aggregate_verify(mode, &[], b"m", &sig), "{mode:?}");
        }
    }

    #[test]
    fn garbage_public_keys_are_rejected() {
        let mode = CryptoMode::Real;
        let k = key(mode, 20);
        let (sig, pop) = (k.sign(b"m"), k.prove_possession());
        for pk in garbage_public_keys() {
            assert!(!pk.validate_with_pop(mode, &pop), "{pk:?}");
            assert!(!pk.verify(mode, b"m", &sig), "{pk:?}");
            assert!(!fast_aggregate_verify(mode, &[pk], b"m", &sig), "{pk:?}");
            for bad_sig in garbage_signatures() {
                assert!(!pk.validate_with_pop(mode, &bad_sig));
                assert!(!pk.verify(mode, b"m", &bad_sig));
            }
        }
        // Insecure mode accepts any 48 bytes as a key, but not without its checksum.
        for pk in garbage_public_keys() {
            assert!(!pk.validate_with_pop(CryptoMode::InsecureTest, &pop));
            assert!(!pk.verify(CryptoMode::InsecureTest, b"m", &sig));
        }
    }

    #[test]
    fn garbage_signatures_are_rejected() {
        for mode in MODES {
            let k = key(mode, 21);
            let (pk, good) = (k.public_key(), k.sign(b"m"));
            for bad in garbage_signatures() {
                assert!(!pk.verify(mode, b"m", &bad), "{mode:?} {bad:?}");
                assert!(!pk.validate_with_pop(mode, &bad), "{mode:?} {bad:?}");
                assert!(!fast_aggregate_verify(mode, &[pk], b"m", &bad), "{mode:?} {bad:?}");
                // An aggregate that takes it in never verifies.
                for sigs in [vec![bad], vec![good, bad], vec![bad, good]] {
                    let agg = aggregate(mode, &sigs);
                    let pks = vec![pk; sigs.len()];
                    assert!(agg.is_none_or(|agg| !fast_aggregate_verify(mode, &pks, b"m", &agg)), "{mode:?} {bad:?}");
                }
            }
        }
    }

    #[test]
    fn keys_summing_to_identity_prove_nothing() {
        // A key and its negation can both be registered by whoever knows the scalar; their
        // sum is the identity, under which the identity "signature" must not verify.
        let pk = key(CryptoMode::Real, 30).public_key();
        let mut neg = pk;
        neg.0[0] ^= 0x20; // flip the sign bit of the compressed point: -pk
        assert!(PublicKey::uncompress(&neg.0).is_ok());
        let mut identity = [0u8; 96];
        identity[0] = 0xc0;
        assert!(!fast_aggregate_verify(CryptoMode::Real, &[pk, neg], b"m", &BlsSignature(identity)));
    }

    #[test]
    fn matches_ethereum_test_vector() {
        // ethereum/bls12-381-tests sign case: the standard PoP-scheme DST in `SIG`.
        let sk = SecretKey::from_bytes(&hex::<32>("263dbd792f5b1be47ed85f8938c0f29586af0d3ac7b977f21c278fe1462040e3"))
            .unwrap();
        let public_key = BlsPublicKey(sk.sk_to_pk().compress());
        let k = BlsSecretKey { key_material: [0; 32], backend: Backend::Real(sk), public_key };
        assert_eq!(
            public_key.0,
            hex::<48>(
                "a491d1b0ecd9bb917989f0e74f0dea0422eac4a873e5e2644f368dffb9a6e20fd6e10c1b77654d067c0618f6e5a7f79a"
            )
        );
        let expected = BlsSignature(hex::<96>(
            "b6ed936746e01f8ecf281f020953fbf1f01debd5657c4a383940b020b26507f6076334f91e2366c96e9ab279fb5158090352ea1c5b0c9274504f4f0e7053af24802e51e4568d164fe986834f41e55c8e850ce1f98458c0cfc9ab380b55285a55",
        ));
        assert_eq!(k.sign(&[0; 32]), expected);
        assert!(public_key.verify(CryptoMode::Real, &[0; 32], &expected));
    }
}
