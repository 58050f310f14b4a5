//! # phalanx-core
//!
//! Sans-IO Byzantine-fault-tolerant broadcast and ordering. Every protocol is a pure
//! state machine behind one shape ([`Node::handle`], [`Node::poll`],
//! [`Node::poll_timeout`]); hosts own sockets, threads, clocks and disks. See
//! `DESIGN.md` §2 for the contract: no IO, clocks, threads, OS randomness or hash-order
//! iteration in this crate; persist before send; total decoders; bounded buffers.
//!
//! - [`broadcast`]: Authenticated Broadcast, Bracha's Reliable Broadcast and Chain.
//! - [`pubsub`]: the publish/subscribe service with history publications built on them.
//! - [`order`]: PBFT total-order state machine replication.
//! - [`distill`]: distillation (Chop Chop): clients, untrusted brokers, servers over PBFT.
//! - [`perpetual`]: Perpetual: replica groups, each ordering with PBFT, calling each other.
//! - [`wire`]: protobuf messages and authenticated frames.
//! - [`crypto`]: keyed-BLAKE3 MACs, BLAKE3 digests, BLS12-381 signatures.
//! - [`sim`]: deterministic simulator with Byzantine adversaries and property checkers.
//! - [`trace`]: recording and byte-for-byte replay of a node's inputs and outputs.

pub mod boundary;
pub mod broadcast;
pub mod config;
pub mod crypto;
pub mod distill;
pub mod host;
pub mod kv;
mod node;
pub mod order;
pub mod perpetual;
pub mod pubsub;
pub mod quorum;
pub mod role;
pub mod sim;
pub mod statement;
pub mod trace;
pub mod wire;

pub use config::{
    ClusterConfig, ClusterSpec, ConfigError, DistillSpec, Group, NodeConfig, Params, PerpetualSpec, Protocol, Role,
    generate_cluster, generate_distill, generate_perpetual,
};
pub use node::{
    Algorithm, Delivery, DistillCounters, Event, FaultKind, HandleError, Input, Machine, Nanos, Node, NodeId,
    Operation, Output, Request, Stats, Status,
};
