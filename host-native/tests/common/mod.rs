//! The wasm component for the tests, built once per test process by `scripts/build-wasm`
//! and compiled.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use phalanx_host::engine::WasmOptions;
use phalanx_host::engine::wasm::WasmRuntime;

/// Runs `scripts/build-wasm ARGS` and returns the component path it prints last.
fn build(args: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let out = Command::new("bash")
        .arg(root.join("scripts/build-wasm"))
        .args(args)
        .current_dir(root)
        .output()
        .expect("running scripts/build-wasm");
    assert!(out.status.success(), "scripts/build-wasm {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let component =
        PathBuf::from(stdout.lines().last().expect("scripts/build-wasm prints the component's path").trim());
    // Compiled once here, and cached beside it: replicas a test starts read the compiled
    // code, rather than compiling it each at once (tens of seconds on a loaded machine).
    let options =
        WasmOptions { component: component.clone(), ms_per_call: 10_000, memory_bytes: 1 << 30, host_crypto: true };
    WasmRuntime::load(&options).unwrap_or_else(|e| panic!("{e}"));
    component
}

/// The component `phalanxd run --engine wasm` runs.
#[allow(dead_code)]
pub fn component() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| build(&[]))
}

/// The component built with `fault-injection`: a `submit` of `phalanx:trap` traps.
#[allow(dead_code)]
pub fn fault_injection_component() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| build(&["--fault-injection"]))
}
