//! Keyed-BLAKE3 MACs, truncated to 16 bytes.

use super::CryptoMode;

pub const MAC_LEN: usize = 16;
pub type MacTag = [u8; MAC_LEN];

/// Inputs up to this size are gathered on the stack, longer ones on the heap.
const SHORT_INPUT: usize = 512;

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
                let len: usize = parts.iter().map(|p| p.len()).sum();
                // BLAKE3 hashes a contiguous input in one call: no incremental hasher to
                // set up, and all whole chunks of a long input in parallel.
                let hash = if let [whole] = parts {
                    blake3::keyed_hash(&self.0, whole)
                } else if len <= SHORT_INPUT {
                    let mut buf = [0u8; SHORT_INPUT];
                    let mut at = 0;
                    for p in parts {
                        buf[at..at + p.len()].copy_from_slice(p);
                        at += p.len();
                    }
                    blake3::keyed_hash(&self.0, &buf[..len])
                } else {
                    blake3::keyed_hash(&self.0, &parts.concat())
                };
                out.copy_from_slice(&hash.as_bytes()[..MAC_LEN]);
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
        // Inputs on either side of the one-shot limit hash the same as the reference.
        for len in [SHORT_INPUT, SHORT_INPUT + 1, 3 * SHORT_INPUT] {
            let input = vec![0x5a; len];
            let tag = key.tag(CryptoMode::Real, &[&input[..7], &input[7..]]);
            assert_eq!(&tag[..], &blake3::keyed_hash(&[7; 32], &input).as_bytes()[..MAC_LEN]);
        }
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
