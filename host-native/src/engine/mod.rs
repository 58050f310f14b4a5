//! Engines: what runs the core for the protocol thread. The native engine is the core
//! linked in ([`Node`]); the wasm engine ([`wasm`]) runs the same core compiled to a
//! WebAssembly component (`wit/phalanx.wit`) inside wasmtime, with time and memory
//! limits, so that a runaway guest is a reported error rather than a hung host.

use std::fmt;
use std::path::PathBuf;

use phalanx_core::trace::Recorder;
use phalanx_core::{DistillCounters, Machine, Node, NodeConfig, Protocol, Role, Stats, Status};

#[cfg(feature = "wasm")]
pub mod bench;
#[cfg(feature = "wasm")]
pub mod wasm;

/// What the protocol thread needs from whatever runs the core.
pub trait Engine: Machine + Send {
    /// PBFT client: the number the next accepted `Submit` gets.
    fn next_request(&mut self) -> Option<u64>;
    /// The core's gauges and counters, for metrics.
    fn status(&mut self) -> (Status, Stats);
    /// A distillation server's counters, for metrics; `None` for other nodes (and the
    /// wasm engine, whose interface does not carry them).
    fn distill_counters(&mut self) -> Option<DistillCounters> {
        None
    }
    /// Which engine and which BLS implementation run the node.
    fn info(&self) -> EngineInfo;
    /// The trace recorded since the last call, for an engine wrapped in a [`Recorder`].
    fn recorded(&mut self) -> Vec<u8> {
        Vec::new()
    }
}

impl<E: Engine + ?Sized> Engine for Recorder<Box<E>> {
    fn next_request(&mut self) -> Option<u64> {
        self.machine_mut().next_request()
    }

    fn status(&mut self) -> (Status, Stats) {
        self.machine_mut().status()
    }

    fn distill_counters(&mut self) -> Option<DistillCounters> {
        self.machine_mut().distill_counters()
    }

    fn info(&self) -> EngineInfo {
        self.machine().info()
    }

    fn recorded(&mut self) -> Vec<u8> {
        self.take_recorded()
    }
}

impl Engine for Node {
    fn next_request(&mut self) -> Option<u64> {
        Node::next_request(self)
    }

    fn status(&mut self) -> (Status, Stats) {
        (Node::status(self), self.stats().clone())
    }

    fn distill_counters(&mut self) -> Option<DistillCounters> {
        let server = self.config().cluster.protocol == Protocol::Distill && self.role() == Role::Server;
        server.then(|| Node::distill_counters(self))
    }

    fn info(&self) -> EngineInfo {
        EngineInfo { kind: EngineKind::Native, crypto: CryptoBackend::Native }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// The core linked into the host.
    Native,
    /// The core as a WebAssembly component, in wasmtime.
    Wasm,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Native => "native",
            EngineKind::Wasm => "wasm",
        }
    }
}

/// Which code runs BLS (signing, aggregation, verification).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CryptoBackend {
    /// The core's own code, natively (the native engine).
    Native,
    /// The host, natively, through the guest's `host-crypto` import.
    Host,
    /// The guest's own code, inside the sandbox.
    Guest,
    /// No BLS: the cluster runs the insecure test crypto.
    InsecureTest,
}

impl CryptoBackend {
    pub fn name(self) -> &'static str {
        match self {
            CryptoBackend::Native => "native",
            CryptoBackend::Host => "host",
            CryptoBackend::Guest => "guest",
            CryptoBackend::InsecureTest => "insecure-test",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineInfo {
    pub kind: EngineKind,
    pub crypto: CryptoBackend,
}

impl fmt::Display for EngineInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} engine, BLS run by {}", self.kind.name(), self.crypto.name())
    }
}

/// Which engine runs a node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum EngineChoice {
    #[default]
    Native,
    Wasm(WasmOptions),
}

impl EngineChoice {
    /// A node of `cfg`, in this engine. `keys_verified`: the host verified the BLS keys the
    /// node relies on before, so the native engine skips their pairings (the wasm guest
    /// verifies everything it decodes).
    pub fn create(&self, cfg: NodeConfig, keys_verified: bool) -> Result<Box<dyn Engine>, EngineFailure> {
        let native = if keys_verified { Node::with_verified_keys } else { Node::new };
        match self {
            EngineChoice::Native => Ok(Box::new(native(cfg).map_err(|e| EngineFailure::Config(e.0))?)),
            #[cfg(feature = "wasm")]
            EngineChoice::Wasm(opts) => Ok(Box::new(wasm::WasmRuntime::load(opts)?.instantiate(&cfg.encode())?)),
            #[cfg(not(feature = "wasm"))]
            EngineChoice::Wasm(_) => Err(EngineFailure::Load("this build has no wasm engine (feature `wasm`)".into())),
        }
    }
}

/// Where `run --engine wasm` looks for the component when not told: beside the
/// executable, then where `scripts/build-wasm` puts it in the same cargo target
/// directory (`<target>/release/phalanxd` → `<target>/wasm32-unknown-unknown/release/`).
pub fn default_component() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let candidates =
        [dir.join(COMPONENT_FILE), dir.parent()?.join("wasm32-unknown-unknown/release").join(COMPONENT_FILE)];
    candidates.into_iter().find(|p| p.is_file())
}

/// The file name `scripts/build-wasm` gives the component.
pub const COMPONENT_FILE: &str = "phalanx_wasm.wasm";

/// How to run the wasm engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WasmOptions {
    /// The component (`scripts/build-wasm` builds it).
    pub component: PathBuf,
    /// Milliseconds one call into the guest may run (give or take the wasm engine's
    /// epoch tick, 5 ms).
    pub ms_per_call: u64,
    /// Linear memory the guest may grow to, bytes.
    pub memory_bytes: usize,
    /// Offer the guest the `host-crypto` import (BLS run natively by the host).
    pub host_crypto: bool,
}

/// Why the wasm engine could not start, or stopped: the documented errors of a guest
/// that misbehaves. After any of them the machine takes no more input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineFailure {
    /// The component could not be read, compiled or instantiated.
    Load(String),
    /// The guest refused the node's configuration.
    Config(String),
    /// The guest trapped: a panic in the core, or any other wasm trap.
    Trap(String),
    /// One call ran longer than its bound.
    TimeLimit { ms_per_call: u64 },
    /// The guest tried to grow its linear memory past the limit.
    MemoryLimit { limit: usize, requested: usize },
}

impl fmt::Display for EngineFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineFailure::Load(why) => write!(f, "wasm engine: cannot load the component: {why}"),
            EngineFailure::Config(why) => write!(f, "wasm engine: the guest refused the configuration: {why}"),
            EngineFailure::Trap(why) => write!(f, "wasm engine: the guest trapped: {why}"),
            EngineFailure::TimeLimit { ms_per_call } => {
                write!(f, "wasm engine: the guest ran out of time ({ms_per_call} ms per call)")
            }
            EngineFailure::MemoryLimit { limit, requested } => write!(
                f,
                "wasm engine: the guest exceeded its memory limit (asked for {requested} bytes, limit {limit})"
            ),
        }
    }
}

impl std::error::Error for EngineFailure {}
