//! The fault-injection suite, short: one seeded run of `phalanxd faults` (four replica
//! processes on loopback, five clients, the nemesis killing, pausing and crashing them and
//! damaging their logs; bounded by its duration), which must pass every check: every
//! key's history linearizable, no acknowledged write lost, no replica exit the nemesis
//! did not cause, equal state digests at the end. Long runs are offline (README).

use std::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_phalanxd");

#[test]
fn a_short_seeded_fault_injection_run_passes_every_check() {
    let dir = std::env::temp_dir().join(format!("phalanx-e2e-faults-{}", std::process::id()));
    let out = Command::new(BINARY)
        .args(["faults", "--seed", "3", "--duration", "45", "--dir"])
        .arg(&dir)
        .output()
        .expect("running phalanxd faults");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("linearizable: yes") && stdout.contains("passed: yes"), "{stdout}");
    // The seed draws every kind of fault within the run.
    for fault in ["kill", "pause", "crash all", "torn tail", "flipped tail"] {
        assert!(stdout.lines().any(|l| l.trim_start().starts_with(fault)), "no {fault} in:\n{stdout}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
