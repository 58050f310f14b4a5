//! Issue 3's named PBFT scenarios, each at n = 4, f = 1 and n = 7, f = 2: an equivocating,
//! a silent and a partitioned primary (view changes), a backup voting two ways, crashes
//! and restarts from durable storage, state transfer past two checkpoints, twins, and
//! retransmitting and replaying clients. Every run is also checked by
//! `order_scenario::check` (agreement, total order, exactly-once, validity, client
//! results, liveness and convergence); each test then asserts its own outcome.

use phalanx_core::crypto::CryptoMode;
use phalanx_core::kv;
use phalanx_core::sim::adversary::Behavior;
use phalanx_core::sim::order_scenario::{Expectations, Liveness, Outcome, Scenario, check};
use phalanx_core::sim::{Applied, NetConfig, Sim};
use phalanx_core::trace::{Trace, dump};
use phalanx_core::{ClusterSpec, Nanos, NodeId, Params, Request, generate_cluster};
use phalanx_tests::pbft::{assert_clean, assert_completed};

const MS: Nanos = 1_000_000;
/// The backups' request timer in the crash scenarios.
const REQUEST_TIMEOUT: Nanos = 50 * MS;

fn all_clients(s: &Scenario) -> Vec<NodeId> {
    s.client_ids().collect()
}

/// The last seq a replica host executed or restored.
fn last_applied(outcome: &Outcome, host: usize) -> u64 {
    outcome.log.executed.iter().filter(|e| e.host == host).map(|e| e.seq).max().unwrap_or(0)
}

/// The highest view replica `r` saw a NEW-VIEW for (sent or received), from its recorded
/// trace: the scenario must have `r` in `record`.
fn highest_new_view(s: &Scenario, outcome: &Outcome, r: NodeId) -> u64 {
    let traces = outcome.traces.get(&r).unwrap_or_else(|| panic!("{s}: replica {r} not recorded"));
    let texts = traces.iter().map(|bytes| dump(&Trace::parse(bytes).expect("the simulator records valid traces")));
    let views = |text: String| -> Vec<u64> {
        text.split("NewView view ").skip(1).filter_map(|rest| rest.split(' ').next()?.parse().ok()).collect()
    };
    texts.flat_map(views).max().unwrap_or(0)
}

/// The first time any correct client saw a request complete.
fn first_completion(outcome: &Outcome) -> Nanos {
    outcome.log.completed.iter().map(|c| c.at).min().expect("something completed")
}

/// A primary that sends odd backups one batch and even ones another: no batch gathers a
/// quorum, the backups time out and elect replica 1, and every request completes. The
/// f = 1 run uses real BLS signatures (VIEW-CHANGEs and checkpoint certificates).
#[test]
fn equivocating_primary_is_replaced() {
    for (f, crypto) in [(1, CryptoMode::Real), (1, CryptoMode::InsecureTest), (2, CryptoMode::InsecureTest)] {
        let mut s = Scenario { crypto, record: vec![1], ..Scenario::new(f, 21) };
        s.replicas[0] = Behavior::Equivocate;
        let outcome = assert_clean(&s);
        assert_completed(&s, &outcome, &all_clients(&s));
        assert!(highest_new_view(&s, &outcome, 1) >= 1, "{s}: no view change");
    }
}

/// A primary that sends nothing: the first request completes once the backups' request
/// timer fires and view 1 is installed, well within three timeouts.
#[test]
fn silent_primary_is_replaced_within_the_request_timeout() {
    for f in [1, 2] {
        let mut s = Scenario { record: vec![1], ..Scenario::new(f, 22) };
        s.params.request_timeout_ns = 100 * MS;
        s.replicas[0] = Behavior::Silent;
        let outcome = assert_clean(&s);
        assert_completed(&s, &outcome, &all_clients(&s));
        assert!(highest_new_view(&s, &outcome, 1) >= 1, "{s}: no view change");
        for r in 1..s.n() {
            let st = outcome.status[&(r as usize)];
            assert!(st.view >= 1 && st.view_changes >= 1 && !st.changing_view, "{s}: replica {r}: {st:?}");
            assert_eq!(st.primary, st.view % s.n() as u64 == r as u64, "{s}: replica {r}: {st:?}");
        }
        let took = first_completion(&outcome);
        let bound = 3 * s.params.request_timeout_ns + 50 * MS;
        assert!(took < bound, "{s}: first completion after {} ms (bound {} ms)", took / MS, bound / MS);
        eprintln!("f={f}: silent primary, first completion after {:.1} ms", took as f64 / MS as f64);
    }
}

/// A client that never sends to the primary: the backups' request timers first forward
/// its requests to the primary, which orders them, so everything completes without a
/// view change (the second stage of the timer never fires).
#[test]
fn requests_the_primary_never_got_are_forwarded_not_a_view_change() {
    for f in [1, 2] {
        let mut s = Scenario { clients: 2, ops: 6, ..Scenario::new(f, 24) };
        s.params.request_timeout_ns = 100 * MS;
        s.client_behaviors[0] = Behavior::DropTo(vec![0]);
        let outcome = assert_clean(&s);
        assert_completed(&s, &outcome, &all_clients(&s));
        for r in 0..s.n() {
            let st = outcome.status[&(r as usize)];
            assert_eq!((st.view, st.view_changes), (0, 0), "{s}: replica {r} changed views: {st:?}");
        }
    }
}

/// A backup that sends odd replicas PREPAREs, COMMITs and checkpoints for another digest
/// (validly MACed) and odd clients other results: safety holds and everything
/// completes. No fault is asserted: each receiver gets only one of its versions, so none
/// can see an Equivocation, and a validly signed vote for another digest is simply not
/// counted towards the quorum (today's core reports nothing against replica 2 here).
#[test]
fn backup_voting_two_ways_changes_nothing() {
    for f in [1, 2] {
        let mut s = Scenario { ops: 12, ..Scenario::new(f, 23) };
        s.replicas[2] = Behavior::Equivocate;
        let outcome = assert_clean(&s);
        assert_completed(&s, &outcome, &all_clients(&s));
    }
}

/// The primary is cut off from everyone (seed `seed`) for longer than the request
/// timeout: the others move to view 1 and go on; after the heal the old primary catches
/// up (the checker's convergence) and requests submitted after the heal complete too.
fn partitioned_primary(f: u32, seed: u64) {
    let heal = 400 * MS;
    let mut s = Scenario { ops: 12, interval: 50 * MS, record: vec![1], ..Scenario::new(f, seed) };
    s.params.request_timeout_ns = 100 * MS;
    s.partition = Some((5 * MS, heal, vec![0]));
    let outcome = assert_clean(&s);
    assert_completed(&s, &outcome, &all_clients(&s));
    assert!(highest_new_view(&s, &outcome, 1) >= 1, "{s}: no view change");
    let after = outcome.log.submitted.iter().filter(|x| x.at > heal).count();
    assert!(after > 0, "{s}: nothing submitted after the heal");
    let executed_after = outcome.log.executed.iter().filter(|e| e.host == 0 && e.at > heal).count();
    assert!(executed_after > 0, "{s}: the old primary executed nothing after the heal");
    assert_eq!(last_applied(&outcome, 0), last_applied(&outcome, 1), "{s}");
}

#[test]
fn partitioned_primary_is_replaced_and_catches_up_after_the_heal() {
    for f in [1, 2] {
        partitioned_primary(f, 24);
    }
}

/// A client request held by the partition reaches the old primary, still in view 0, just
/// before the NEW-VIEW (seed 0 at f = 1, and 16 more of seeds 0..=40): it arms its batch
/// timer, then enters view 1 as a backup. That timer must die with its primaryship; it
/// once stayed armed in the past, and the replica asked for a timeout at the same instant
/// forever.
#[test]
fn partitioned_primary_with_a_request_held_until_the_heal() {
    for seed in 0..10 {
        for f in [1, 2] {
            partitioned_primary(f, seed);
        }
    }
}

/// Replica `r` crashes at `down` and restarts from its storage at `up`, while clients
/// keep submitting: everything completes and `r` ends at the same seq and state as a
/// replica that never crashed. Returns the highest view replica 1 saw installed.
fn crash_and_restart(f: u32, r: NodeId, down: Nanos, up: Nanos) -> u64 {
    let mut s = Scenario { ops: 16, interval: 10 * MS, record: vec![1], ..Scenario::new(f, 25) };
    s.params.request_timeout_ns = REQUEST_TIMEOUT;
    s.crash = Some((r, down, up));
    let outcome = assert_clean(&s);
    assert_completed(&s, &outcome, &all_clients(&s));
    let host = r as usize;
    let other = if r == 1 { 2 } else { 1 };
    let after = outcome.log.executed.iter().filter(|e| e.host == host && e.incarnation == 1).count();
    assert!(after > 0, "{s}: replica {r} applied nothing after its restart");
    assert_eq!(last_applied(&outcome, host), last_applied(&outcome, other), "{s}: replica {r} did not converge");
    assert_eq!(outcome.states[&host], outcome.states[&other], "{s}: replica {r}'s state differs");
    highest_new_view(&s, &outcome, 1)
}

#[test]
fn backup_crashes_and_restarts_from_storage() {
    for f in [1, 2] {
        crash_and_restart(f, 3 * f, 20 * MS, 60 * MS);
    }
}

/// Down for twice the request timeout (the backups must elect replica 1) and down for
/// less than it (whether it is replaced then is up to the core: it comes back behind).
#[test]
fn primary_crashes_and_restarts_from_storage() {
    for f in [1, 2] {
        let view = crash_and_restart(f, 0, 20 * MS, 20 * MS + 2 * REQUEST_TIMEOUT);
        assert!(view >= 1, "f={f}: the crashed primary was not replaced");
        crash_and_restart(f, 0, 20 * MS, 30 * MS);
    }
}

/// Syncs take up to 5 ms, and the primary crashes at each of twenty times 0.5 ms apart
/// while requests come every 10 ms: some crashes fall after a PRE-PREPARE left and before
/// the record of the primary's vote for it was synced. Restarted, the primary proposes
/// nothing more in its view (another batch at a slot it proposed would be equivocation):
/// every run is safe, accuses no correct replica, and completes every request.
#[test]
fn a_primary_crashing_before_its_proposal_is_synced_equivocates_nowhere() {
    for f in [1, 2] {
        for i in 0..20 {
            let down = 20 * MS + i * MS / 2;
            let mut s = Scenario { ops: 16, interval: 10 * MS, ..Scenario::new(f, 40 + i) };
            s.params.request_timeout_ns = REQUEST_TIMEOUT;
            s.net.max_sync_latency = 5 * MS;
            s.crash = Some((0, down, down + 5 * MS));
            let outcome = assert_clean(&s);
            assert_completed(&s, &outcome, &all_clients(&s));
        }
    }
}

/// Every replica crashes at once and restarts from its storage. With K = 4 and one batch
/// per request, 18 writes make checkpoint 16 stable and leave batches 17 and 18 above
/// it: each replica restores the state of checkpoint 16 it persisted, and batches 17 and
/// 18 commit again as the replicas send again the votes they persisted, without a view
/// change. The primary proposes nothing more in its view (a proposal it sent may not have
/// been synced), so the new writes wait for exactly one view change. Every value written
/// before the crash reads back after it through unordered
/// reads (finding 1: a restarted replica used to answer them from its checkpoint, and
/// 2f+1 restarted replicas agreed on the stale value), and new writes complete. Storage
/// stays compacted to what a restart needs.
#[test]
fn whole_cluster_restart_loses_nothing_and_reads_see_every_acknowledged_write() {
    const WRITES: u32 = 9;
    for f in [1u32, 2] {
        let n = 3 * f + 1;
        let clients = 2;
        let params = Params {
            batch_max_count: 1,
            checkpoint_interval: 4,
            pipeline: 4,
            request_timeout_ns: REQUEST_TIMEOUT,
            client_retry_ns: 100 * MS,
            ..Params::default()
        };
        let k = params.checkpoint_interval as u64;
        let spec =
            ClusterSpec { replicas: n, params, crypto: CryptoMode::InsecureTest, ..ClusterSpec::pbft(f, clients) };
        let mut sim = Sim::new(30, NetConfig::default());
        for cfg in generate_cluster(&spec, [30; 32]).expect("valid cluster") {
            sim.add(cfg, Behavior::Correct, None);
        }
        let (down, up) = (100 * MS, 150 * MS);
        let key = |c: NodeId, i: u32| format!("key {c}.{i}").into_bytes();
        let value = |c: NodeId, i: u32| format!("value {c}.{i}").into_bytes();
        for c in n..n + clients {
            let offset = (c - n) as Nanos * MS;
            for i in 0..WRITES {
                let at = i as Nanos * 5 * MS + offset;
                sim.request_at(at, c as usize, Request::Submit { op: kv::put(&key(c, i), &value(c, i)) });
                // Read at once, before the batches above the checkpoint commit again.
                let at = up + i as Nanos * 10_000 + offset / 100;
                sim.request_at(at, c as usize, Request::Read { op: kv::get(&key(c, i)) });
                let at = up + 100 * MS + i as Nanos * 5 * MS + offset;
                sim.request_at(at, c as usize, Request::Submit { op: kv::put(&key(c, i + WRITES), b"new") });
            }
        }
        for r in 0..n as usize {
            sim.crash_at(down, r);
            sim.restart_at(up, r);
        }
        sim.run(5_000 * MS);
        let replicas: Vec<usize> = (0..n as usize).collect();
        let exp = Expectations {
            correct_replicas: replicas.iter().copied().collect(),
            correct_clients: (n..n + clients).map(|c| c as usize).collect(),
            liveness: Some(Liveness { stable_at: up, bound: 2_000 * MS, end: sim.now() }),
            converge: replicas.iter().copied().collect(),
        };
        let violations = check(&sim.log, &exp);
        assert!(violations.is_empty(), "f={f}:\n{}", violations.join("\n"));

        let writes_before = (clients * WRITES) as u64;
        for &r in &replicas {
            let before = sim.log.executed.iter().filter(|e| e.host == r && e.incarnation == 0).map(|e| e.seq).max();
            assert_eq!(before, Some(writes_before), "f={f}: replica {r} had not executed every write at the crash");
            let first = sim.log.executed.iter().find(|e| e.host == r && e.incarnation == 1);
            let first = first.unwrap_or_else(|| panic!("f={f}: replica {r} applied nothing after the restart"));
            assert!(
                first.at == up && first.seq == writes_before / k * k && matches!(first.applied, Applied::Snapshot(_)),
                "f={f}: replica {r} restarted from {first:?}, not from its last stable checkpoint"
            );
            // Before any view change could end: a whole request timeout at least.
            let again = |seq: u64| sim.log.executed.iter().find(|e| e.host == r && e.incarnation == 1 && e.seq == seq);
            for seq in writes_before / k * k + 1..=writes_before {
                let at = again(seq).unwrap_or_else(|| panic!("f={f}: replica {r} never executed {seq} again")).at;
                assert!(at < up + REQUEST_TIMEOUT, "f={f}: replica {r} executed {seq} again only at {at}");
            }
        }

        // Client requests are numbered 1, 2, 3 … in submission order.
        for c in n..n + clients {
            let ops: Vec<&[u8]> = sim.log.submitted.iter().filter(|s| s.node == c).map(|s| s.op.as_slice()).collect();
            assert_eq!(ops.len(), 3 * WRITES as usize, "f={f}: {:?}", sim.log.rejected_requests);
            for i in 0..WRITES {
                let request = ops.iter().position(|&op| op == kv::get(&key(c, i))).expect("submitted") as u64 + 1;
                let done = sim.log.completed.iter().find(|x| x.node == c && x.request == request);
                let done = done.unwrap_or_else(|| panic!("f={f}: client {c} never read key {i} back"));
                assert_eq!(
                    kv::Reply::decode(&done.result),
                    Ok(kv::Reply::Value(Some(value(c, i)))),
                    "f={f}: client {c} read key {i} back wrong after the restart"
                );
            }
        }
        let done = sim.log.completed.len();
        assert_eq!(done, (3 * WRITES * clients) as usize, "f={f}: {done} requests completed");
        for &r in &replicas {
            assert_eq!(sim.app(r).len(), 2 * (clients * WRITES) as usize, "f={f}: replica {r}'s store");
            let view_changes = sim.node(r).status().view_changes;
            assert_eq!(view_changes, 1, "f={f}: replica {r} changed views {view_changes} times after the restart");
            let stored = sim.stored_records(r);
            assert!(stored <= 4 * k as usize, "f={f}: replica {r} still stores {stored} records");
        }
    }
}

/// With K = 4, one batch per request, the last replica is cut off while more than 3K
/// batches execute: after the heal the others have garbage-collected that part of their
/// log, so it takes a certified snapshot (state transfer), then orders the later batches
/// with the others and ends with their state.
#[test]
fn replica_partitioned_past_two_checkpoints_catches_up_by_state_transfer() {
    for f in [1, 2] {
        let lagging = 3 * f;
        let heal = 120 * MS;
        let mut s = Scenario { ops: 20, interval: 10 * MS, ..Scenario::new(f, 26) };
        s.params.batch_max_count = 1;
        s.params.checkpoint_interval = 4;
        s.partition = Some((MS, heal, vec![lagging]));
        let outcome = assert_clean(&s);
        assert_completed(&s, &outcome, &all_clients(&s));
        let k = s.params.checkpoint_interval as u64;
        let executed_before_heal = outcome.log.executed.iter().filter(|e| e.host == 0 && e.at < heal).count() as u64;
        assert!(executed_before_heal >= 3 * k, "{s}: only {executed_before_heal} batches during the partition");
        let mine: Vec<_> = outcome.log.executed.iter().filter(|e| e.host == lagging as usize).collect();
        let restored = mine.iter().find(|e| matches!(e.applied, Applied::Snapshot(_)));
        let restored = restored.unwrap_or_else(|| panic!("{s}: replica {lagging} caught up without a state transfer"));
        let later = mine.iter().filter(|e| e.seq > restored.seq && matches!(e.applied, Applied::Batch(_))).count();
        assert!(later > 0, "{s}: replica {lagging} executed nothing after its state transfer at {}", restored.seq);
        let states: Vec<_> = outcome.states.values().collect();
        assert!(states.windows(2).all(|w| w[0] == w[1]), "{s}: final states differ");
    }
}

/// Replica 2 run twice with one identity (each copy gets some of the messages meant for
/// it): within f faults, nothing changes for the correct replicas and clients.
#[test]
fn twin_replica_breaks_nothing() {
    for f in [1, 2] {
        let s = Scenario { ops: 12, twin: Some(2), ..Scenario::new(f, 27) };
        let outcome = assert_clean(&s);
        assert_completed(&s, &outcome, &all_clients(&s));
    }
}

/// Client n run twice with one identity, each copy submitting its own operations under
/// the same request numbers: safety holds and the other clients complete.
#[test]
fn twin_client_breaks_nothing_for_the_others() {
    for f in [1, 2] {
        let n = 3 * f + 1;
        let s = Scenario { ops: 12, twin: Some(n), ..Scenario::new(f, 28) };
        let outcome = assert_clean(&s);
        let others: Vec<NodeId> = s.client_ids().filter(|&c| c != n).collect();
        assert_completed(&s, &outcome, &others);
    }
}

/// Two clients over a slow network (2 to 5 ms a hop) that retransmit after `retry_ns`,
/// client n also replaying old frames if `replay`: each request executes once (the checker's exactly-once; here also one batch
/// entry per request at replica 1) and completes, the replayer's included.
fn clients_resend(f: u32, retry_ns: Nanos, replay: bool) -> Outcome {
    let mut s = Scenario { clients: 2, ops: 16, ..Scenario::new(f, 29) };
    s.net = NetConfig { min_latency: 2 * MS, max_latency: 5 * MS, ..NetConfig::default() };
    s.params.client_retry_ns = retry_ns;
    // Wide enough that no replica sees votes far ahead of what it executed, which makes it
    // ask its peers and count their offers stale: `replaying_client_executes_once` counts
    // the stale frames replays cause.
    s.params.pipeline = 8;
    if replay {
        s.client_behaviors[0] = Behavior::Replay;
    }
    let outcome = assert_clean(&s);
    assert_completed(&s, &outcome, &all_clients(&s));
    let ops: usize = outcome
        .log
        .executed
        .iter()
        .filter(|e| e.host == 1)
        .map(|e| match &e.applied {
            Applied::Batch(ops) => ops.len(),
            Applied::Snapshot(_) => 0,
        })
        .sum();
    assert_eq!(ops, (s.clients * s.ops) as usize, "{s}");
    outcome
}

/// Every millisecond, against a round trip of 4 to 10 ms: replicas see each request many
/// times, before and after executing it.
#[test]
fn retransmitting_client_executes_once() {
    for f in [1, 2] {
        let patient = clients_resend(f, 100 * MS, false);
        let eager = clients_resend(f, MS, false);
        // Frames: a client's retransmissions to one replica share a frame.
        assert!(eager.log.messages_sent > 3 * patient.log.messages_sent / 2, "f={f}: no retransmissions");
    }
}

#[test]
fn replaying_client_executes_once() {
    for f in [1, 2] {
        let honest = clients_resend(f, 100 * MS, false);
        let outcome = clients_resend(f, 100 * MS, true);
        // Replays reach other replicas than their first receivers. A lone request travels
        // under its authenticator, valid at every replica, so there it is a duplicate.
        let duplicates = |o: &Outcome| (0..3 * f + 1).map(|r| o.stats[&(r as usize)].stale).sum::<u64>();
        assert!(duplicates(&outcome) > duplicates(&honest), "f={f}: nothing replayed");
    }
}
