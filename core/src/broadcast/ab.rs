//! Authenticated Broadcast (seed 000 §3.1, DESIGN §5.1).
//!
//! The source sends `m` to all n replicas; each replica forwards `m` once per instance
//! to every destination; a destination delivers after ⌈(n+f+1)/2⌉ (2f+1 at n = 3f+1)
//! *matching* copies from distinct replicas (the thesis' pseudocode counts any copies; we count matching ones).
//!
//! Properties, with at most f Byzantine replicas: validity and integrity for a correct
//! source, no duplication, and consistency (two correct destinations never deliver
//! different contents: two such quorums share a correct replica). Not
//! totality: a faulty source can make one destination deliver and another not (Fig 3.2).

use super::votes::Votes;

/// A destination's state for one instance: copies per distinct replica, delivered at
/// [`crate::quorum::Quorums::intersecting`] matching ones.
pub type AbDestination = Votes;
