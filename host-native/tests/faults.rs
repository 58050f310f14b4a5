//! The fault-injection suite, short: one seeded run of `phalanxd faults` (four replica
//! processes on loopback, five clients, the nemesis killing, pausing and crashing them and
//! damaging their logs; bounded by its duration), which must pass every check: every
//! key's history linearizable, no acknowledged write lost, no replica exit the nemesis
//! did not cause, equal state digests at the end. Long runs are offline (README).

use std::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_phalanxd");

/// Runs `phalanxd faults` with `args` (and a directory of its own) and returns what it
/// printed, once it passed every check.
fn passing_run(name: &str, args: &[&str]) -> String {
    let dir = std::env::temp_dir().join(format!("phalanx-e2e-{name}-{}", std::process::id()));
    let out =
        Command::new(BINARY).arg("faults").args(args).arg("--dir").arg(&dir).output().expect("running phalanxd faults");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("linearizable: yes") && stdout.contains("passed: yes"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
    stdout.into_owned()
}

#[test]
fn a_short_seeded_fault_injection_run_passes_every_check() {
    let stdout = passing_run("faults", &["--seed", "3", "--duration", "45"]);
    // The seed draws every kind of fault within the run.
    for fault in ["kill", "pause", "crash all", "torn tail", "flipped tail"] {
        assert!(stdout.lines().any(|l| l.trim_start().starts_with(fault)), "no {fault} in:\n{stdout}");
    }
}

/// `[runtime] durability = "replicated"` (no fsync): processes crashing, the whole cluster
/// at once included, lose nothing the operating system was given.
#[test]
fn a_short_run_passes_every_check_under_replicated_durability() {
    let stdout = passing_run("faults-replicated", &["--seed", "3", "--duration", "30", "--durability", "replicated"]);
    assert!(stdout.lines().any(|l| l.trim_start().starts_with("crash all")), "no crash all in:\n{stdout}");
}
