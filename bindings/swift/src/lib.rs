//! The Swift binding of Phalanx, through uniffi: the adapter that `bindings/swift`'s
//! package links (DESIGN §2 rule 6: one API, bindings are adapters). The core's types
//! cross as they are ([`vocabulary`]); what is here is the shape Swift calls:
//!
//! - [`node`]: `Node`, one input per call or one round per call;
//! - [`host`]: `HostLoop`, a node with the core's host loop and a Swift `Application`;
//! - [`cluster`]: generated configurations, cluster files, local `phalanxd` clusters;
//! - [`trace`]: traces, their records and the core's replay;
//! - [`kv`]: the key-value application `phalanxd` serves;
//! - [`client`]: an async client of a `phalanxd` cluster;
//! - [`distill`]: an async client of a distillation deployment;
//! - [`perpetual`]: Perpetual group members running Swift services (seed 002's API);
//! - [`bench`]: the core alone, the baseline of the Swift benchmark.

uniffi::setup_scaffolding!("phalanx");

pub mod bench;
pub mod client;
pub mod cluster;
pub mod distill;
pub mod errors;
pub mod host;
pub mod kv;
pub mod node;
pub mod perpetual;
pub mod trace;
pub mod vocabulary;
