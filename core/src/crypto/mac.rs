//! Keyed-BLAKE3 MACs, truncated to 16 bytes.

use super::CryptoMode;

pub const MAC_LEN: usize = 16;
pub type MacTag = [u8; MAC_LEN];

/// A 32-byte pairwise MAC key.
#[derive(Clone, PartialEq, Eq)]
pub struct MacKey([u8; 32]);

impl std::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MacKey(..)")
    }
}

impl MacKey {
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        MacKey(bytes)
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// MAC over the concatenation of `parts`. Callers make the concatenation unambiguous
    /// (fixed-width fields and length prefixes).
    pub fn tag(&self, mode: CryptoMode, parts: &[&[u8]]) -> MacTag {
        let mut out = [0u8; MAC_LEN];
        match mode {
            CryptoMode::Real => {
                let mut h = blake3::Hasher::new_keyed(&self.0);
                for p in parts {
                    h.update(p);
                }
                out.copy_from_slice(&h.finalize().as_bytes()[..MAC_LEN]);
            }
            CryptoMode::InsecureTest => {
                // FNV-1a over the key's first word and the input: a checksum, not a MAC.
                let mut x: u64 = 0xcbf2_9ce4_8422_2325 ^ u64::from_le_bytes(self.0[..8].try_into().unwrap());
                for p in parts {
                    for &b in *p {
                        x = (x ^ b as u64).wrapping_mul(0x0100_0000_01b3);
                    }
                }
                out[..8].copy_from_slice(&x.to_le_bytes());
                out[8..].copy_from_slice(&(!x).to_le_bytes());
            }
        }
        out
    }

    /// Constant-time check of `tag` against the MAC of `parts`.
    pub fn verify(&self, mode: CryptoMode, parts: &[&[u8]], tag: &[u8]) -> bool {
        if tag.len() != MAC_LEN {
            return false;
        }
        let expect = self.tag(mode, parts);
        expect.iter().zip(tag).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_blake3_matches_reference_and_detects_changes() {
        let key = MacKey::from_bytes([7; 32]);
        let tag = key.tag(CryptoMode::Real, &[b"ab", b"c"]);
        let reference = blake3::keyed_hash(&[7; 32], b"abc");
        assert_eq!(&tag[..], &reference.as_bytes()[..MAC_LEN]);
        assert!(key.verify(CryptoMode::Real, &[b"abc"], &tag));
        assert!(!key.verify(CryptoMode::Real, &[b"abd"], &tag));
        assert!(!MacKey::from_bytes([8; 32]).verify(CryptoMode::Real, &[b"abc"], &tag));
        assert!(!key.verify(CryptoMode::Real, &[b"abc"], &tag[..15]));
    }

    #[test]
    fn insecure_mode_is_a_different_function() {
        let key = MacKey::from_bytes([1; 32]);
        let real = key.tag(CryptoMode::Real, &[b"x"]);
        let fake = key.tag(CryptoMode::InsecureTest, &[b"x"]);
        assert_ne!(real, fake);
        assert!(key.verify(CryptoMode::InsecureTest, &[b"x"], &fake));
        assert!(!key.verify(CryptoMode::InsecureTest, &[b"y"], &fake));
    }
}
