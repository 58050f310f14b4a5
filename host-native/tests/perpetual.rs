//! Perpetual on real processes: a bank group calling a ledger group, each member a
//! `phalanxd run` process hosting its group's service, a member of each group killed with
//! SIGKILL and restarted mid-run.

use std::process::Command;

const BINARY: &str = env!("CARGO_BIN_EXE_phalanxd");

fn demo(groups: &str, increments: u32) -> String {
    let dir = std::env::temp_dir().join(format!("phalanx-test-perpetual-{groups}-{}", std::process::id()));
    let out = Command::new(BINARY)
        .args(["demo", "--perpetual", "--groups", groups, "--increments", &increments.to_string()])
        .args(["--dir", dir.to_str().unwrap()])
        .output()
        .expect("phalanxd runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn a_replicated_bank_ends_at_balance_zero_through_a_replicated_ledger_despite_killed_members() {
    let out = demo("4,4", 200);
    assert!(out.contains("killed members [3, 7]") && out.contains("restarted member 7"), "{out}");
    assert!(out.contains("all 400 calls complete and the final balance 0"), "{out}");
}

#[test]
fn a_single_bank_calls_a_single_ledger() {
    let out = demo("1,1", 30);
    assert!(out.contains("all 60 calls complete and the final balance 0"), "{out}");
}
