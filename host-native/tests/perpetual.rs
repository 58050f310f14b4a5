//! Perpetual on real processes: a bank group calling a ledger group, each member a
//! `phalanxd run` process hosting its group's service, a member of each group killed with
//! SIGKILL and restarted mid-run; and services of a program's own, in-process, using the
//! futures API.

use std::collections::BTreeSet;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use phalanx_core::crypto::CryptoMode;
use phalanx_core::{Params, Protocol};
use phalanx_host::config::{ClusterFile, Durability, KeygenOptions, Runtime, keygen};
use phalanx_host::local_cluster::free_ports;
use phalanx_host::perpetual::{Group, Interrupted, Outcome, Service};
use phalanx_host::runtime::{ServiceOverride, StartOptions, start};

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

/// A caller program of its own: ten calls in flight whose outcomes it takes newest first,
/// then two more whose outcomes it takes in completion order.
struct Fanout {
    told: Mutex<Option<(Vec<i64>, BTreeSet<i64>)>>,
}

fn amount(bytes: &[u8]) -> i64 {
    i64::from_le_bytes(bytes.try_into().expect("8 bytes"))
}

impl Service for Fanout {
    fn run(&self, group: &Group) -> Result<(), Interrupted> {
        let calls = (1..=10i64).map(|i| group.invoke(1, i.to_le_bytes().to_vec())).collect::<Result<Vec<_>, _>>()?;
        let mut newest_first = Vec::new();
        for call in calls.into_iter().rev() {
            match call.get()? {
                Outcome::Reply(r) => newest_first.push(amount(&r)),
                Outcome::Aborted => newest_first.push(-1),
            }
        }
        group.invoke(1, 11i64.to_le_bytes().to_vec())?;
        group.invoke(1, 12i64.to_le_bytes().to_vec())?;
        let mut last = BTreeSet::new();
        for _ in 0..2 {
            if let (_, Outcome::Reply(r)) = group.next_result()? {
                last.insert(amount(&r));
            }
        }
        *self.told.lock().unwrap() = Some((newest_first, last));
        Ok(())
    }

    fn snapshot(&self) -> Vec<u8> {
        vec![]
    }

    fn restore(&self, _: &[u8]) -> Result<(), String> {
        Ok(())
    }
}

/// A target program of its own that serves asynchronously: it takes two requests, then
/// answers the second before the first, each with its op squared.
struct SquaresInPairs;

impl Service for SquaresInPairs {
    fn run(&self, group: &Group) -> Result<(), Interrupted> {
        loop {
            let first = group.next_request()?;
            let second = group.next_request()?;
            for r in [&second, &first] {
                let x = amount(&r.op);
                group.send_result(r, (x * x).to_le_bytes().to_vec());
            }
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        vec![]
    }

    fn restore(&self, _: &[u8]) -> Result<(), String> {
        Ok(())
    }
}

#[test]
fn services_of_a_programs_own_use_the_futures_api_across_groups_of_real_nodes() {
    let dir = std::env::temp_dir().join(format!("phalanx-test-perpetual-own-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (base, held) = free_ports(5).unwrap();
    drop(held);
    let opts = KeygenOptions {
        dir: dir.clone(),
        protocol: Protocol::Perpetual,
        f: 0,
        replicas: None,
        clients: 0,
        subscribers: 0,
        groups: vec![1, 4],
        ops: 1,
        parallel: 1,
        brokers: 0,
        crypto: CryptoMode::InsecureTest,
        host: "127.0.0.1".into(),
        base_port: base,
        metrics_base_port: None,
        params: Params::default(),
        runtime: Runtime { pin_threads: false, durability: Durability::Replicated, ..Runtime::default() },
        force: true,
    };
    let cluster = ClusterFile::load(&keygen(&opts).unwrap()).unwrap();
    let fanout = Arc::new(Fanout { told: Mutex::new(None) });
    let running: Vec<_> = (0..5)
        .map(|id| {
            let service: Arc<dyn Service> = if id == 0 { fanout.clone() } else { Arc::new(SquaresInPairs) };
            let opts = StartOptions { service: Some(ServiceOverride(service)), ..StartOptions::default() };
            start(&cluster, id, &opts).unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while fanout.told.lock().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    for r in running {
        r.stop().unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
    let told = fanout.told.lock().unwrap().clone().expect("the caller's program finished within a minute");
    assert_eq!(told.0, (1..=10i64).rev().map(|i| i * i).collect::<Vec<_>>());
    assert_eq!(told.1, BTreeSet::from([121, 144]));
}
