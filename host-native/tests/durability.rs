//! `[runtime] durability = "replicated"` on real processes: with no fsync at all, a
//! replica whose machine lost power (here: killed, its whole log gone — the worst a
//! power loss can leave of never-synced writes) rejoins and catches up from the others,
//! and no acknowledged operation is lost while at most f replicas are down at a time.
//! (`sync`'s promise, nothing acknowledged lost when the whole cluster crashes, is the
//! fault-injection suite's `crash all`: `tests/faults.rs` runs it under both settings.)

use std::path::Path;
use std::time::Duration;

use phalanx_core::crypto::CryptoMode;
use phalanx_core::kv::{self, Reply};
use phalanx_core::{NodeId, Params};
use phalanx_host::client::ClusterClient;
use phalanx_host::config::Durability;
use phalanx_host::local_cluster::{LocalCluster, LocalSpec};

const BINARY: &str = env!("CARGO_BIN_EXE_phalanxd");
const TIMEOUT: Duration = Duration::from_secs(30);

fn value(client: &mut ClusterClient, op: Vec<u8>) -> Option<Vec<u8>> {
    match Reply::decode(&client.execute(op, TIMEOUT).unwrap()).unwrap() {
        Reply::Value(v) => v,
        other => panic!("{other:?}"),
    }
}

/// Kills replica `id` and deletes its log, as a power loss may leave it under `replicated`.
fn lose_power(c: &mut LocalCluster, id: NodeId) {
    c.kill(id);
    let dir = &c.cluster.replica(id).expect("a replica").data_dir;
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn replicated_durability_survives_f_replicas_losing_their_logs() {
    let dir = std::env::temp_dir().join(format!("phalanx-e2e-durability-{}", std::process::id()));
    let params = Params {
        request_timeout_ns: 300_000_000,
        client_retry_ns: 100_000_000,
        checkpoint_interval: 16,
        ..Params::default()
    };
    let spec = LocalSpec {
        crypto: CryptoMode::InsecureTest,
        params,
        durability: Durability::Replicated,
        ..LocalSpec::default()
    };
    let mut c = LocalCluster::create(&dir, &spec, Path::new(BINARY)).unwrap();
    assert_eq!(c.cluster.runtime.durability, Durability::Replicated);
    c.start_all().unwrap();
    let id = c.cluster.clients[0];
    let mut client = ClusterClient::start(&c.cluster, id, Some(dir.join(format!("client-{id}")))).unwrap();
    let key = |i: u32| format!("k{}", i % 8);
    let mut written = 0;
    let mut put = |client: &mut ClusterClient, n: u32| {
        for _ in 0..n {
            value(client, kv::put(key(written).as_bytes(), written.to_string().as_bytes()));
            written += 1;
        }
    };
    put(&mut client, 40);
    // Each replica in turn loses its log (one at a time: f = 1); the rest keep serving.
    for lost in 0..4 {
        lose_power(&mut c, lost);
        put(&mut client, 20);
        c.start(lost).unwrap();
        put(&mut client, 20);
    }
    // Now the last one to lose its log must be part of every quorum: another is down.
    c.kill(1);
    put(&mut client, 40);
    for i in written - 8..written {
        let got = value(&mut client, kv::get(key(i).as_bytes()));
        assert_eq!(got, Some(i.to_string().into_bytes()), "key {}", key(i));
    }
    client.stop().unwrap();
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sync` after compaction: once every replica has freed the blocks of its obsolete
/// records in place, the whole cluster is killed, and every acknowledged put comes back
/// from what the logs kept (the latest checkpoint and the records after it).
#[test]
fn sync_durability_keeps_every_acknowledged_put_across_compaction_and_a_crash_of_all() {
    use std::os::unix::fs::MetadataExt;
    let dir = std::env::temp_dir().join(format!("phalanx-e2e-compaction-{}", std::process::id()));
    let params = Params { checkpoint_interval: 16, ..Params::default() };
    let spec = LocalSpec { crypto: CryptoMode::InsecureTest, params, ..LocalSpec::default() };
    let mut c = LocalCluster::create(&dir, &spec, Path::new(BINARY)).unwrap();
    assert_eq!(c.cluster.runtime.durability, Durability::Sync);
    c.start_all().unwrap();
    let id = c.cluster.clients[0];
    let mut client = ClusterClient::start(&c.cluster, id, Some(dir.join(format!("client-{id}")))).unwrap();
    let key = |i: u32| format!("k{}", i % 8);
    let val = |i: u32| [i.to_le_bytes().as_slice(), &[i as u8; 32 << 10]].concat();
    let wal = |c: &LocalCluster, r: NodeId| c.cluster.replica(r).expect("a replica").data_dir.join("wal.log");
    // Bytes of the log's length that take no disk space: holes punched by compaction.
    let freed = |c: &LocalCluster, r: NodeId| {
        let m = std::fs::metadata(wal(c, r)).unwrap();
        m.len().saturating_sub(m.blocks() * 512)
    };
    let mut written = 0;
    while (0..4).any(|r| freed(&c, r) < 4 << 20) {
        assert!(written < 2_000, "no replica compacted its log after {written} puts of 32 KiB");
        value(&mut client, kv::put(key(written).as_bytes(), &val(written)));
        written += 1;
    }
    for r in 0..4 {
        c.kill(r);
    }
    c.start_all().unwrap();
    for i in written - 8..written {
        assert_eq!(value(&mut client, kv::get(key(i).as_bytes())), Some(val(i)), "key {}", key(i));
    }
    client.stop().unwrap();
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}
