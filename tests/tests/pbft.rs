//! PBFT total order in the simulator, at n = 4, f = 1 and n = 7, f = 2: the normal case
//! with pipelining, Byzantine backups, retransmitting and replaying clients, a crash and
//! restart from durable storage, adversarial seed sweeps, and flat memory over many
//! checkpoints. Every run is also checked by `order_scenario::check` (agreement, total
//! order, exactly-once, validity, client results, liveness).

use std::collections::BTreeMap;

use phalanx_core::crypto::CryptoMode;
use phalanx_core::kv;
use phalanx_core::sim::adversary::{Behavior, Syncs};
use phalanx_core::sim::order_scenario::{Outcome, Scenario, sweep};
use phalanx_core::sim::{Applied, NetConfig};
use phalanx_core::{FaultKind, Nanos, Operation, Status};
use phalanx_tests::pbft::assert_clean;
use phalanx_tests::seed_count;

const MS: Nanos = 1_000_000;

/// Every request of every client completed, once each.
fn assert_all_completed(s: &Scenario, outcome: &Outcome) {
    assert_eq!(outcome.log.submitted.len(), (s.clients * s.ops) as usize, "{s}: {:?}", outcome.log.rejected_requests);
    assert_eq!(outcome.log.completed.len(), (s.clients * s.ops) as usize, "{s}");
    assert_eq!(outcome.expected_completions, (s.clients * s.ops) as usize, "{s}");
}

/// The batches the replica hosts `replicas` executed, by seq (the checker has verified
/// that they agree wherever two executed one seq).
fn batches<'a>(outcome: &'a Outcome, replicas: &[usize]) -> BTreeMap<u64, &'a [Operation]> {
    outcome
        .log
        .executed
        .iter()
        .filter(|e| replicas.contains(&e.host))
        .filter_map(|e| match &e.applied {
            Applied::Batch(ops) => Some((e.seq, ops.as_slice())),
            Applied::Snapshot(_) => None,
        })
        .collect()
}

/// The last seq a replica host executed or restored.
fn last_applied(outcome: &Outcome, host: usize) -> u64 {
    outcome.log.executed.iter().filter(|e| e.host == host).map(|e| e.seq).max().unwrap_or(0)
}

/// The correct replicas (`replicas`) executed batches 1..=last between them (each
/// executing every one itself or skipping some by state transfer), every submitted
/// operation exactly once among them, and all end at `last` with identical states.
fn assert_replicas_agree(s: &Scenario, outcome: &Outcome, replicas: &[usize]) {
    let agreed = batches(outcome, replicas);
    let ops: usize = agreed.values().map(|b| b.len()).sum();
    assert_eq!(ops, (s.clients * s.ops) as usize, "{s}: every operation executes once");
    let last = agreed.len() as u64;
    assert_eq!(agreed.keys().copied().collect::<Vec<_>>(), (1..=last).collect::<Vec<_>>(), "{s}");
    for &r in replicas {
        assert_eq!(last_applied(outcome, r), last, "{s}: replica {r} did not reach the last batch");
        assert_eq!(outcome.states[&r], outcome.states[&replicas[0]], "{s}: replica {r}'s state differs");
    }
}

/// What `Node::status` reports after a normal-case run: replica 0 stays the primary of
/// view 0, every replica saw every batch commit and each request in one of them, nothing
/// is left pending, the primary timed each request's wait for a batch, and every node
/// counted its MAC checks (replicas their signature checks too).
fn assert_normal_case_status(s: &Scenario, outcome: &Outcome) {
    let requests = (s.clients * s.ops) as u64;
    let k = s.params.checkpoint_interval as u64;
    for r in 0..s.n() as usize {
        let st = outcome.status[&r];
        assert_eq!((st.view, st.primary, st.changing_view, st.view_changes), (0, r == 0, false, 0), "{s}: {r}");
        assert_eq!(st.executed, last_applied(outcome, r), "{s}: replica {r}");
        assert_eq!(st.stable, st.executed / k * k, "{s}: replica {r}");
        assert_eq!(st.pending_requests, 0, "{s}: replica {r}");
        assert_eq!((st.batches, st.batched_requests), (st.executed, requests), "{s}: replica {r}: {st:?}");
        assert!(st.consensus_ns_total > 0, "{s}: replica {r}: {st:?}");
        assert!(st.macs_verified > 0 && st.signatures_verified > 0, "{s}: replica {r}: {st:?}");
    }
    let primary = outcome.status[&0];
    assert_eq!(primary.queue_waits, requests, "{s}");
    assert!(primary.queue_wait_ns_total > 0, "{s}");
    for c in s.client_ids() {
        let st = outcome.status[&(c as usize)];
        assert!(st.macs_verified > 0, "{s}: client {c}");
        assert_eq!(Status { macs_verified: 0, ..st }, Status::default(), "{s}: client {c}");
    }
}

fn last_completion(outcome: &Outcome) -> Nanos {
    outcome.log.completed.iter().map(|c| c.at).max().unwrap_or(0)
}

/// Several clients submitting faster than a round trip: batches form, several are in
/// flight at once, every replica executes the same batches and every client gets the
/// result the agreed order gives (checked against a fresh store by the checker).
#[test]
fn normal_case_with_several_clients_and_pipelining() {
    for f in [1, 2] {
        for crypto in [CryptoMode::Real, CryptoMode::InsecureTest] {
            let mut s = Scenario { crypto, ops: 24, interval: 200_000, ..Scenario::new(f, 3) };
            s.params.pipeline = 8;
            let outcome = assert_clean(&s);
            assert_all_completed(&s, &outcome);
            let replicas: Vec<usize> = (0..s.n() as usize).collect();
            assert_replicas_agree(&s, &outcome, &replicas);
            let executed = batches(&outcome, &replicas);
            assert!(executed.len() < (s.clients * s.ops) as usize, "{s}: no batching");
            assert!(executed.values().all(|b| b.len() <= s.params.batch_max_count as usize), "{s}");
            assert!(outcome.log.faults.is_empty(), "{s}: {:?}", outcome.log.faults);
            assert_normal_case_status(&s, &outcome);

            // One instance at a time takes longer for the same load.
            let mut serial = s.clone();
            serial.params.pipeline = 1;
            let serial_outcome = assert_clean(&serial);
            assert_all_completed(&serial, &serial_outcome);
            assert!(
                last_completion(&outcome) < last_completion(&serial_outcome),
                "{s}: pipelined {}us, one at a time {}us",
                last_completion(&outcome) / 1000,
                last_completion(&serial_outcome) / 1000
            );
        }
    }
}

/// f backups that equivocate, corrupt MACs, stay silent, replay, forge other senders or
/// alter what they send change nothing for the correct replicas and clients.
#[test]
fn byzantine_backups_change_nothing() {
    for f in [1u32, 2] {
        let n = 3 * f + 1;
        let behaviors = [
            Behavior::Equivocate,
            Behavior::CorruptMacs,
            Behavior::Silent,
            Behavior::Replay,
            Behavior::ForgeSender(0),
            Behavior::ForgeSender(n),
            Behavior::AlterTo((0..n + 3).collect()),
        ];
        for b in behaviors {
            let mut s = Scenario { ops: 12, ..Scenario::new(f, 11) };
            s.net.duplicate_ppm = 100_000;
            let byzantine: Vec<usize> = (n - f..n).map(|r| r as usize).collect();
            for &r in &byzantine {
                s.replicas[r] = b.clone();
            }
            let outcome = assert_clean(&s);
            assert_all_completed(&s, &outcome);
            let correct: Vec<usize> = (0..(n - f) as usize).collect();
            assert_replicas_agree(&s, &outcome, &correct);
            if matches!(b, Behavior::CorruptMacs | Behavior::ForgeSender(_)) {
                let reported: u64 = outcome
                    .log
                    .faults
                    .iter()
                    .filter(|((_, kind), _)| matches!(kind, FaultKind::BadMac | FaultKind::ForgedSender))
                    .map(|(_, count)| count)
                    .sum();
                assert!(reported > 0, "{s}: nothing reported");
            }
        }
    }
}

/// Read-only requests complete without ordering on 2f+1 matching answers, also with f
/// backups that lie in theirs; a read the replicas disagree on (they executed to different
/// points while writes go on) is ordered instead. The checker holds every read to a
/// result of some state of the agreed order, and an ordered one to its execution.
#[test]
fn reads_complete_without_ordering_and_are_ordered_when_replicas_disagree() {
    for f in [1u32, 2] {
        let n = 3 * f + 1;
        for b in [Behavior::Correct, Behavior::Equivocate, Behavior::Silent] {
            let mut s = Scenario { ops: 16, reads: true, burst: 2, ..Scenario::new(f, 13) };
            for r in n - f..n {
                s.replicas[r as usize] = b.clone();
            }
            let outcome = assert_clean(&s);
            assert_all_completed(&s, &outcome);
            // Gets are every fourth op; those not ordered never reached the agreed order.
            let reads = s.clients as usize * (s.ops as usize).div_ceil(4);
            let ordered: usize = batches(&outcome, &[0])
                .values()
                .flat_map(|ops| ops.iter())
                .filter(|o| matches!(kv::Op::decode(&o.op), Ok(kv::Op::Get { .. })))
                .count();
            assert!(ordered < reads, "{s}: {b:?}: all {reads} reads were ordered");
        }
    }
}

/// Replies clients received after their request had completed.
fn stale_replies(s: &Scenario, outcome: &Outcome) -> u64 {
    s.client_ids().map(|c| outcome.stats[&(c as usize)].stale).sum()
}

/// A client that retransmits every millisecond, over a network slower than that, makes
/// the replicas see each request many times: each executes once, and retransmissions
/// that arrive after execution are answered from the reply cache with the same result.
#[test]
fn retransmitting_client_gets_its_cached_result_and_executes_once() {
    for f in [1u32, 2] {
        let n = 3 * f + 1;
        let mut s = Scenario { clients: 2, ops: 10, ..Scenario::new(f, 5) };
        s.net = NetConfig { min_latency: 2 * MS, max_latency: 5 * MS, ..NetConfig::default() };
        let patient = assert_clean(&s);
        s.params.client_retry_ns = MS;
        let eager = assert_clean(&s);
        assert_all_completed(&s, &eager);
        assert_replicas_agree(&s, &eager, &(0..n as usize).collect::<Vec<_>>());
        assert!(eager.log.messages_sent > patient.log.messages_sent + (s.clients * s.ops * n) as u64, "{s}");
        // Without retransmissions a request gets n replies, 2f+1 of which complete it.
        let normal = ((n - 2 * f - 1) * s.clients * s.ops) as u64;
        assert_eq!(stale_replies(&s, &patient), normal, "{s}");
        assert!(stale_replies(&s, &eager) > normal, "{s}: no cached reply reached a client");
    }
}

/// A client that replays frames it sent or received earlier (old requests among them)
/// gets nothing executed twice (the checker's exactly-once), and its requests still
/// complete.
#[test]
fn replaying_client_executes_nothing_twice() {
    for f in [1u32, 2] {
        let n = 3 * f + 1;
        let mut s = Scenario { clients: 2, ops: 40, ..Scenario::new(f, 9) };
        let replayer = n;
        s.client_behaviors[0] = Behavior::Replay;
        let outcome = assert_clean(&s);
        assert_replicas_agree(&s, &outcome, &(0..n as usize).collect::<Vec<_>>());
        assert_eq!(outcome.log.completed.len(), (s.clients * s.ops) as usize, "{s}");
        // Replays that reach another replica than their first receiver are reported;
        // those to the same one are valid frames, only their content is old.
        let reported: u64 = outcome.log.faults.iter().filter(|((node, _), _)| *node == replayer).map(|(_, c)| c).sum();
        assert!(reported > 0, "{s}: nothing replayed");
    }
}

/// A backup that crashes and restarts gets its persisted records back and an empty
/// application; it catches up (re-executing or by state transfer) without breaking any
/// property, while the others carry on.
#[test]
fn backup_restarts_from_durable_storage() {
    for f in [1u32, 2] {
        let n = 3 * f + 1;
        let mut s = Scenario { ops: 40, ..Scenario::new(f, 13) };
        let backup = n - 1;
        s.crash = Some((backup, 10 * MS, 25 * MS));
        let outcome = assert_clean(&s);
        assert_all_completed(&s, &outcome);
        let before = outcome.log.executed.iter().filter(|e| e.host == backup as usize && e.incarnation == 0).count();
        let after = outcome.log.executed.iter().filter(|e| e.host == backup as usize && e.incarnation == 1).count();
        assert!(before > 0 && after > 0, "{s}: executed {before} before the crash and {after} after");
        assert_replicas_agree(&s, &outcome, &(0..n as usize).collect::<Vec<_>>());
    }
}

/// A replica that falls just behind while the others make a checkpoint stable (its last
/// COMMITs still in flight, or dropped once below the new low watermark) must still catch
/// up, by state transfer or from its log. All-correct clusters over a network that
/// duplicates and reorders, many seeds each: the checker's liveness includes every
/// correct replica reaching the last agreed seq.
#[test]
fn every_correct_replica_catches_up() {
    for f in [1, 2] {
        let failures: Vec<String> = (0..200)
            .filter_map(|seed| {
                let mut s = Scenario { ops: 12, ..Scenario::new(f, seed) };
                s.net.duplicate_ppm = 100_000;
                let outcome = s.run();
                (!outcome.violations.is_empty()).then(|| format!("{s}\n  {}", outcome.violations.join("\n  ")))
            })
            .collect();
        assert!(failures.is_empty(), "{} seeds failed:\n{}", failures.len(), failures.join("\n"));
    }
}

/// Many adversarial seeds per f (`PHALANX_SEEDS`, default 1000), real crypto on every
/// 25th: zero violations.
#[test]
fn pbft_survives_adversarial_seeds() {
    let count = seed_count(1000);
    for f in [1, 2] {
        let result = sweep(f, 0..count, 25, Syncs::Drawn);
        assert!(
            result.failures.is_empty(),
            "{} of {count} seeds failed at f={f}:\n{}",
            result.failures.len(),
            result.failures.join("\n")
        );
        // The sweep must exercise ordering, not just survive: most seeds complete requests.
        assert!(result.completions as u64 > count, "f={f}: only {} completions", result.completions);
    }
}

/// Seeds the 10,000-seed offline sweep found failing (n=5 and 7–9, a primary lying to some
/// replicas): a replica that had voted for a slot, then installed a state past it from
/// f+1 replicas (which frees the slot but not the window), took the primary's late
/// conflicting PRE-PREPARE for that slot as new and voted again: equivocation by a
/// correct replica.
#[test]
fn pbft_seeds_the_offline_sweep_found() {
    for (f, seed) in [(1, 7239), (1, 8588), (2, 4578), (2, 9064)] {
        let result = sweep(f, seed..seed + 1, 25, Syncs::Instant);
        assert!(result.failures.is_empty(), "{}", result.failures.join("\n"));
    }
}

/// f = 2, seed 3,800,890 of stop 51's sweep: the primary told replica 7 another batch
/// than the rest for slot 7, so 7 PREPAREd its own and sent COMMIT for the one that
/// prepared. Restarted, 7 sent its votes again with a COMMIT for its own batch, not the
/// one it had committed to: equivocation by a correct replica (and, with enough replicas
/// lied to, COMMITs for a batch that never prepared).
#[test]
fn a_replica_sends_its_commit_again_for_the_batch_that_prepared() {
    let result = sweep(2, 3_800_890..3_800_891, 25, Syncs::Instant);
    assert!(result.failures.is_empty(), "{}", result.failures.join("\n"));
}

/// Liveness failures the 100,000-seed offline sweep found at f = 1, each a seed:
/// - 26455, 34196: a replica that alone committed a slot answered a peer's catch-up with
///   the batch (one offer of the f+1 needed) but not its COMMIT, which the peers that
///   restarted or lost it needed: an idle cluster left them behind for good.
/// - 46911: after a whole-cluster restart, a slot a faulty primary had equivocated on
///   could not commit again in its view, and with no request waiting nothing started a
///   view change; now a replica short of what it knows settled runs the request timer.
/// - 10200, 21962: a client lying to every replica made each new view's first batch (its
///   bundle first, by client number) fail, for 8 view changes with back-off; now a client
///   whose requests failed a view has its bundles proposed after the others', alone.
#[test]
fn pbft_seeds_the_100k_sweep_found() {
    for seed in [10200, 21962, 26455, 34196, 46911] {
        let result = sweep(1, seed..seed + 1, 25, Syncs::Instant);
        assert!(result.failures.is_empty(), "{}", result.failures.join("\n"));
    }
}

/// Seeds the sweeps of certifying checkpoints in turn found, f = 2:
/// - 7032: a replica that waited for its turn took the votes as they were then, after a
///   faulty replica's later votes had pushed its vote out, and made a certificate of five
///   signatures where eight replicas need six; a peer it sent that to in a state transfer
///   accused it. The votes are now kept as they were when the quorum formed.
/// - 23876: a faulty replica's vote in the quorum proved invalid at the replica's turn,
///   and the valid votes that had come since were not looked at again: in an idle
///   cluster no vote came after them, and the replica stayed behind. Now they are.
#[test]
fn a_faulty_vote_in_a_checkpoint_quorum_delays_no_certificate() {
    for seed in [7032, 23876] {
        let result = sweep(2, seed..seed + 1, 25, Syncs::Instant);
        assert!(result.failures.is_empty(), "{}", result.failures.join("\n"));
    }
}

/// Thousands of requests over hundreds of checkpoints: the state each node holds stays
/// bounded by the watermark window and the client queues, not by the run's length.
#[test]
fn memory_stays_flat_over_many_checkpoints() {
    let run = |ops: u32| {
        let mut s = Scenario { clients: 2, ops, interval: 500_000, ..Scenario::new(1, 17) };
        s.params.checkpoint_interval = 8;
        s.params.pipeline = 8;
        let outcome = assert_clean(&s);
        assert_all_completed(&s, &outcome);
        (s, outcome)
    };
    let (_, short) = run(100);
    let (s, long) = run(3000);
    let last = last_applied(&long, 0);
    assert!(last >= 100 * s.params.checkpoint_interval as u64, "{s}: only {last} batches");
    let peak = |o: &Outcome, host: usize| o.peak_live_instances[&host];
    for host in 0..(s.n() + s.clients) as usize {
        let bound = 2 * peak(&short, host).max(2 * s.params.checkpoint_interval as usize);
        assert!(peak(&long, host) <= bound, "{s}: host {host} held {} (short run: {})", peak(&long, host), bound);
    }
    for (host, live) in &long.final_live_instances {
        assert!(*live <= 2 * s.params.checkpoint_interval as usize, "{s}: host {host} still holds {live} at the end");
    }
}

/// PHALANX_DEBUG="f seed [node...]": one adversarial seed as the sweep runs it (its syncs
/// drawn from the seed, real crypto on every 25th; PHALANX_INSTANT_SYNCS set for the
/// seeds pinned before syncs took time), with its violations, every host's status and
/// counters, and the traces of the nodes named.
#[test]
#[ignore]
fn debug_seed() {
    let v = phalanx_tests::debug_numbers();
    let (f, seed) = (v[0] as u32, v[1]);
    let crypto = if seed % 25 == 0 { CryptoMode::Real } else { CryptoMode::InsecureTest };
    let mut s = Scenario::adversarial(f, seed, crypto);
    let syncs = if std::env::var_os("PHALANX_INSTANT_SYNCS").is_some() { Syncs::Instant } else { Syncs::Drawn };
    s.net.max_sync_latency = syncs.max_latency(seed);
    s.record = v[2..].iter().map(|&id| id as u32).collect();
    println!("{s}");
    let out = s.run();
    phalanx_tests::print_traces(&out.traces);
    for host in out.status.keys() {
        println!("host {host}: {:?}\n  {:?}", out.status[host], out.stats[host]);
    }
    println!("{:#?}", out.violations);
}
