//! The wasm engine: the core compiled to a WebAssembly component (`guest-wasm/`,
//! exporting `wit/phalanx.wit`), run by wasmtime.
//!
//! Each call into the guest may run for `ms_per_call` milliseconds (creating a machine
//! gets longer: see [`WasmRuntime::instantiate`]), and a store limiter refuses to grow
//! linear memory past `memory_bytes`; a trap, an overrun or refused growth is an
//! [`EngineFailure`] that sticks: the machine takes no more input and yields nothing.
//!
//! The time bound is wasmtime's epoch interruption: a thread per runtime advances the
//! engine's epoch every [`EPOCH_TICK`], and a call's deadline is a number of ticks, so a
//! guest that never returns stops between `ms_per_call` and one tick later (checked at
//! every function entry and loop back-edge). Fuel, which bounds instructions instead,
//! counts in every basic block and made the guest markedly slower.
//!
//! Compiled code is cached beside the component (`phalanx_wasm.cwasm`), so a start
//! after the first reads it instead of compiling for seconds.

use std::collections::VecDeque;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use phalanx_core::boundary::{self, Round};
use phalanx_core::crypto::{
    BlsPublicKey, BlsSecretKey, BlsSignature, CryptoMode, Digest, aggregate, digest, fast_aggregate_verify,
};
use phalanx_core::{HandleError, Input, Machine, Nanos, Output, Stats, Status};
use wasmtime::component::{Component, HasSelf, Linker, ResourceAny};
use wasmtime::{Config, ResourceLimiter, Store, Trap};

use super::{CryptoBackend, Engine, EngineFailure, EngineInfo, EngineKind, WasmOptions};

wasmtime::component::bindgen!({ path: "../wit", world: "phalanx" });

use exports::phalanx::node::node::CryptoBackend as GuestCrypto;

/// How often the epoch advances: the granularity of the time bound on a call.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Time for creating a machine, per byte of the encoded configuration (at least
/// `ms_per_call`), in microseconds. Validating a configuration verifies every node's BLS
/// proof of possession in the guest's own code (the host's BLS is not plugged in until
/// the node exists), far more than any one input costs: ~0.3 s for a 7-node cluster
/// (1.4 KB), about 0.2 ms per byte. This allows twenty times that, so a guest that never
/// returns from `create` still stops, within seconds.
const CREATE_MICROS_PER_CONFIG_BYTE: u64 = 4_000;

/// Ticks for the world's `replay`, which runs a whole trace in one call: an offline
/// check, bounded by the trace it is given rather than per call.
const REPLAY_TICKS: u64 = NO_DEADLINE;

/// Ticks no run reaches (wasmtime adds a deadline to the current epoch).
const NO_DEADLINE: u64 = u64::MAX / 2;

/// The epoch deadline of a call that may run for `micros`: one tick more than its
/// whole ticks, since the epoch may advance right after the deadline is set.
fn ticks(micros: u64) -> u64 {
    (micros / EPOCH_TICK.as_micros() as u64).saturating_add(1).min(NO_DEADLINE)
}

/// Compiled code kept beside its component (`phalanx_wasm.wasm` → `phalanx_wasm.cwasm`):
/// compiling the component takes seconds at every start, reading it back milliseconds.
/// The file opens with the digest of the component and of the engine's settings (what
/// makes compiled code fit an engine), then the digest of the code that follows; any
/// mismatch, or a directory that cannot be written, means compiling as if it were absent.
struct CompiledCache {
    path: PathBuf,
    key: Digest,
}

impl CompiledCache {
    fn beside(component: &Path, engine: &wasmtime::Engine, bytes: &[u8]) -> CompiledCache {
        let mut settings = DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut settings);
        let key = digest(&[digest(bytes).as_slice(), &settings.finish().to_le_bytes()].concat());
        CompiledCache { path: component.with_extension("cwasm"), key }
    }

    fn read(&self, engine: &wasmtime::Engine) -> Option<Component> {
        let file = std::fs::read(&self.path).ok()?;
        let (key, rest) = file.split_at_checked(32)?;
        let (sum, code) = rest.split_at_checked(32)?;
        if key != self.key || sum != digest(code) {
            return None;
        }
        // SAFETY: wasmtime runs these bytes as machine code. They are what `write`
        // serialized for this very component and engine (the key), intact (the digest),
        // from beside the component: whoever could plant them could replace the
        // component itself. wasmtime also refuses code of another version or settings.
        unsafe { Component::deserialize(engine, code) }.ok()
    }

    fn write(&self, component: &Component) -> Result<(), String> {
        let code = component.serialize().map_err(|e| e.to_string())?;
        let file = [self.key.as_slice(), &digest(&code), &code].concat();
        crate::storage::replace_file(&self.path, &file).map_err(|e| e.to_string())
    }
}

/// What a store holds: the host-crypto switch and the memory limiter's state.
struct HostState {
    host_crypto: bool,
    memory_limit: usize,
    /// The size the guest asked its memory to grow to, when the limiter refused it.
    refused_growth: Option<usize>,
    /// The key `sign` was last asked for: making one from its material costs a scalar
    /// multiplication (the public key), and a node always signs with the same key.
    signing_key: Option<BlsSecretKey>,
}

impl phalanx::node::host_crypto::Host for HostState {
    fn offered(&mut self) -> bool {
        self.host_crypto
    }

    fn sign(&mut self, key_material: Vec<u8>, message: Vec<u8>) -> Vec<u8> {
        // The guest only passes its own 32 bytes; anything else gets a signature that
        // verifies nowhere rather than a trap in the host.
        let ikm = <[u8; 32]>::try_from(key_material).unwrap_or_default();
        let key = match self.signing_key.take() {
            Some(key) if *key.key_material() == ikm => key,
            _ => BlsSecretKey::from_key_material(CryptoMode::Real, &ikm),
        };
        let sig = key.sign(&message).0.to_vec();
        self.signing_key = Some(key);
        sig
    }

    fn aggregate(&mut self, signatures: Vec<Vec<u8>>) -> Option<Vec<u8>> {
        let sigs: Option<Vec<BlsSignature>> =
            signatures.into_iter().map(|s| <[u8; 96]>::try_from(s).ok().map(BlsSignature)).collect();
        aggregate(CryptoMode::Real, &sigs?).map(|a| a.0.to_vec())
    }

    fn verify(&mut self, public_key: Vec<u8>, message: Vec<u8>, signature: Vec<u8>) -> bool {
        let (Ok(pk), Ok(sig)) = (<[u8; 48]>::try_from(public_key), <[u8; 96]>::try_from(signature)) else {
            return false;
        };
        BlsPublicKey(pk).verify(CryptoMode::Real, &message, &BlsSignature(sig))
    }

    fn fast_aggregate_verify(&mut self, public_keys: Vec<Vec<u8>>, message: Vec<u8>, signature: Vec<u8>) -> bool {
        let keys: Option<Vec<BlsPublicKey>> =
            public_keys.into_iter().map(|k| <[u8; 48]>::try_from(k).ok().map(BlsPublicKey)).collect();
        let (Some(keys), Ok(sig)) = (keys, <[u8; 96]>::try_from(signature)) else { return false };
        fast_aggregate_verify(CryptoMode::Real, &keys, &message, &BlsSignature(sig))
    }

    fn verify_possession(&mut self, public_key: Vec<u8>, proof: Vec<u8>) -> bool {
        let (Ok(pk), Ok(proof)) = (<[u8; 48]>::try_from(public_key), <[u8; 96]>::try_from(proof)) else {
            return false;
        };
        BlsPublicKey(pk).validate_with_pop(CryptoMode::Real, &BlsSignature(proof))
    }
}

impl ResourceLimiter for HostState {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.refused_growth = Some(desired);
            // An error rather than `false`: the guest's allocator would turn a refusal
            // into a trap that no longer says why.
            wasmtime::bail!("memory limit of {} bytes exceeded", self.memory_limit);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, _desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(true)
    }
}

/// A compiled component, shared by every machine made from it.
#[derive(Clone)]
pub struct WasmRuntime {
    pre: Arc<PhalanxPre<HostState>>,
    engine: wasmtime::Engine,
    options: WasmOptions,
    /// The compiled code came from the [`CompiledCache`], not from compiling.
    cached: bool,
}

impl WasmRuntime {
    /// Reads and compiles the component.
    pub fn load(options: &WasmOptions) -> Result<WasmRuntime, EngineFailure> {
        let path = options.component.display();
        let load = |what: &str, e: wasmtime::Error| EngineFailure::Load(format!("{path}: {what}: {e:#}"));
        let mut config = Config::new();
        config.epoch_interruption(true);
        // For profiling the guest: `perf` then names its functions.
        if std::env::var_os("PHALANX_WASM_PERFMAP").is_some() {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = wasmtime::Engine::new(&config).map_err(|e| load("configuring wasmtime", e))?;
        let bytes = std::fs::read(&options.component).map_err(|e| EngineFailure::Load(format!("{path}: {e}")))?;
        let cache = CompiledCache::beside(&options.component, &engine, &bytes);
        let (component, cached) = match cache.read(&engine) {
            Some(component) => {
                tracing::info!("wasm engine: {path}: compiled code read from {}", cache.path.display());
                (component, true)
            }
            None => {
                let component = Component::new(&engine, &bytes).map_err(|e| load("compiling", e))?;
                match cache.write(&component) {
                    Ok(()) => tracing::info!("wasm engine: {path}: compiled, and cached in {}", cache.path.display()),
                    Err(e) => {
                        tracing::info!("wasm engine: {path}: compiled; not cached ({}: {e})", cache.path.display())
                    }
                }
                (component, false)
            }
        };
        let mut linker = Linker::new(&engine);
        phalanx::node::host_crypto::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .map_err(|e| load("linking host-crypto", e))?;
        let pre = linker.instantiate_pre(&component).map_err(|e| load("linking", e))?;
        let pre = PhalanxPre::new(pre).map_err(|e| load("finding the exports", e))?;
        let weak = engine.weak();
        std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                // Ends with the last clone of the engine.
                while let Some(engine) = weak.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(EPOCH_TICK);
                }
            })
            .map_err(|e| EngineFailure::Load(format!("starting the epoch thread: {e}")))?;
        Ok(WasmRuntime { pre: Arc::new(pre), engine, options: options.clone(), cached })
    }

    /// Whether the component's compiled code was read from the cache beside it.
    pub fn cached(&self) -> bool {
        self.cached
    }

    /// The component's imports, by name.
    pub fn imports(&self) -> Vec<String> {
        let ty = self.pre.instance_pre().component().component_type();
        ty.imports(&self.engine).map(|(name, _)| name.to_string()).collect()
    }

    /// A store with the limiter on and `ticks` for instantiation and the first call.
    fn store(&self, ticks: u64) -> Store<HostState> {
        let state = HostState {
            host_crypto: self.options.host_crypto,
            memory_limit: self.options.memory_bytes,
            refused_growth: None,
            signing_key: None,
        };
        let mut store = Store::new(&self.engine, state);
        store.limiter(|s| s);
        store.set_epoch_deadline(ticks);
        store
    }

    /// A machine running the node of `node_config` (an encoded `NodeConfig`).
    /// Instantiation, `create` and asking who runs BLS share one bound, longer than
    /// `ms_per_call` (see [`CREATE_MICROS_PER_CONFIG_BYTE`]); every later call gets
    /// `ms_per_call`.
    pub fn instantiate(&self, node_config: &[u8]) -> Result<WasmNode, EngineFailure> {
        let ms = self.options.ms_per_call;
        let create_micros =
            ms.saturating_mul(1_000).max(CREATE_MICROS_PER_CONFIG_BYTE.saturating_mul(node_config.len() as u64));
        let mut store = self.store(ticks(create_micros));
        let failed = |store: &mut Store<HostState>, e| classify(store, create_micros / 1_000, e);
        let instance = self.pre.instantiate(&mut store).map_err(|e| failed(&mut store, e))?;
        let created = instance.phalanx_node_node().machine().call_create(&mut store, node_config);
        let machine = created.map_err(|e| failed(&mut store, e))?.map_err(EngineFailure::Config)?;
        let crypto = instance
            .phalanx_node_node()
            .machine()
            .call_crypto_backend(&mut store, machine)
            .map_err(|e| failed(&mut store, e))?;
        let crypto = match crypto {
            GuestCrypto::Host => CryptoBackend::Host,
            GuestCrypto::Guest => CryptoBackend::Guest,
            GuestCrypto::InsecureTest => CryptoBackend::InsecureTest,
        };
        Ok(WasmNode {
            store,
            instance,
            machine,
            crypto,
            ms_per_call: ms,
            outputs: VecDeque::new(),
            next_timeout: None,
            status: None,
            failed: None,
        })
    }

    /// Replays a trace file inside the guest (the world's `replay`): its summary as
    /// `phalanxd trace replay` prints it, or the guest's error text.
    pub fn replay(&self, trace: &[u8]) -> Result<Result<String, String>, EngineFailure> {
        let mut store = self.store(REPLAY_TICKS);
        let instance = self.pre.instantiate(&mut store).map_err(|e| classify(&mut store, u64::MAX, e))?;
        instance.phalanx_node_node().call_replay(&mut store, trace).map_err(|e| classify(&mut store, u64::MAX, e))
    }
}

/// Names why a call into the guest failed.
fn classify(store: &mut Store<HostState>, ms_per_call: u64, e: wasmtime::Error) -> EngineFailure {
    if let Some(requested) = store.data_mut().refused_growth.take() {
        return EngineFailure::MemoryLimit { limit: store.data().memory_limit, requested };
    }
    match e.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => EngineFailure::TimeLimit { ms_per_call },
        _ => EngineFailure::Trap(format!("{e:#}")),
    }
}

/// One node in the sandbox.
pub struct WasmNode {
    store: Store<HostState>,
    instance: Phalanx,
    machine: ResourceAny,
    crypto: CryptoBackend,
    ms_per_call: u64,
    /// Outputs of the last round, served one by one by `poll`.
    outputs: VecDeque<Output>,
    /// The deadline after the last round; `None` before the first.
    next_timeout: Option<Option<Nanos>>,
    /// The node's status after the last round.
    status: Option<(Status, Stats)>,
    failed: Option<EngineFailure>,
}

impl WasmNode {
    /// Why the machine stopped, if it did.
    pub fn failed(&self) -> Option<&EngineFailure> {
        self.failed.as_ref()
    }

    /// One call into the guest with a fresh time bound; `None` once failed.
    fn call<R>(
        &mut self,
        f: impl FnOnce(
            exports::phalanx::node::node::GuestMachine<'_>,
            &mut Store<HostState>,
            ResourceAny,
        ) -> wasmtime::Result<R>,
    ) -> Option<R> {
        if self.failed.is_some() {
            return None;
        }
        self.store.set_epoch_deadline(ticks(self.ms_per_call.saturating_mul(1_000)));
        match f(self.instance.phalanx_node_node().machine(), &mut self.store, self.machine) {
            Ok(r) => Some(r),
            Err(e) => {
                self.failed = Some(classify(&mut self.store, self.ms_per_call, e));
                self.outputs.clear();
                None
            }
        }
    }

    /// A round in the guest, one crossing: the results of `inputs`; the outputs wait for
    /// `poll`. A guest whose answer does not decode is broken, and fails for good.
    fn round(&mut self, inputs: Vec<(Nanos, Input)>) -> Vec<Result<(), HandleError>> {
        let count = inputs.len();
        let encoded = boundary::encode_inputs(inputs);
        let answer = self.call(|m, s, r| m.call_run(s, r, &encoded));
        let round = match answer {
            Some(Ok(bytes)) => Round::decode(bytes).map_err(|e| e.to_string()),
            Some(Err(why)) => Err(why),
            None => return vec![Ok(()); count],
        };
        match round {
            Ok(round) => {
                self.outputs.extend(round.outputs);
                self.next_timeout = Some(round.next_timeout);
                self.status = round.status;
                round.results
            }
            Err(why) => {
                self.failed = Some(EngineFailure::Trap(format!("the guest's round does not decode: {why}")));
                vec![Ok(()); count]
            }
        }
    }
}

impl Machine for WasmNode {
    fn handle(&mut self, now: Nanos, input: Input) -> Result<(), HandleError> {
        self.round(vec![(now, input)]).pop().unwrap_or(Ok(()))
    }

    fn handle_many(&mut self, inputs: Vec<(Nanos, Input)>) -> Vec<Result<(), HandleError>> {
        self.round(inputs)
    }

    fn poll(&mut self) -> Option<Output> {
        self.outputs.pop_front()
    }

    fn poll_timeout(&mut self) -> Option<Nanos> {
        if self.failed.is_some() {
            return None;
        }
        if self.next_timeout.is_none() {
            self.round(vec![]);
        }
        self.next_timeout.flatten()
    }

    fn failure(&self) -> Option<String> {
        self.failed.as_ref().map(|e| e.to_string())
    }
}

impl Engine for WasmNode {
    fn next_request(&mut self) -> Option<u64> {
        self.call(|m, s, r| m.call_next_request(s, r)).flatten()
    }

    /// As the last round left it (no crossing), or asked of the guest before any round.
    fn status(&mut self) -> (Status, Stats) {
        if let Some(status) = &self.status {
            return status.clone();
        }
        let Some(bytes) = self.call(|m, s, r| m.call_status(s, r)) else { return Default::default() };
        boundary::decode_status(&bytes).unwrap_or_default()
    }

    fn info(&self) -> EngineInfo {
        EngineInfo { kind: EngineKind::Wasm, crypto: self.crypto }
    }
}
