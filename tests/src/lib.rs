//! Shared helpers for the cross-crate tests.

/// Seeds per (protocol, f) in a sweep: `PHALANX_SEEDS` or the CI default.
pub fn seed_count(default: u64) -> u64 {
    std::env::var("PHALANX_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}
