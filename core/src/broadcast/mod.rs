//! The three broadcasts of seed 000 between a source (publisher), n replicas (brokers)
//! and destinations (subscribers), one instance per (source, topic, history, seq).
//!
//! This module holds the per-instance decision logic, free of encoding and MACs:
//! [`ab`], [`bracha`] and [`chain`], the matching-vote counter they share ([`votes`]) and
//! the bounded per-stream instance table ([`window`]); thresholds come from
//! [`crate::quorum::Quorums`]. The pub/sub roles in
//! `crate::pubsub` drive them.

pub mod ab;
pub mod bracha;
pub mod chain;
pub mod votes;
pub mod window;
