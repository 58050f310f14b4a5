//! # phalanx-host
//!
//! The native host of the Phalanx core and the library behind `phalanxd`: TOML
//! configuration and key generation ([`config`]), a mio network thread with
//! length-delimited TCP frames ([`net`]), a protocol thread that owns the core node
//! ([`driver`]) and its bounded inbox ([`inbox`]), a checksummed write-ahead log
//! ([`storage`]), Prometheus metrics ([`metrics`]), node start-up and thread pinning
//! ([`runtime`]), a cluster client ([`client`]), local clusters of real processes
//! ([`local_cluster`]), distillation's client ↔ broker hop over UDP ([`udp`]), the `bench`
//! and `demo` commands, and fault injection on real processes ([`faults`]).

pub mod bench;
pub mod client;
pub mod config;
pub mod demo;
pub mod distill;
pub mod distill_bench;
pub mod distill_clients;
pub mod driver;
pub mod engine;
pub mod faults;
pub mod inbox;
pub mod local_cluster;
pub mod metrics;
pub mod net;
pub mod perpetual;
pub mod perpetual_demo;
pub mod runtime;
pub mod storage;
pub mod udp;
