//! What a PBFT run must satisfy, checked on its [`Log`].
//!
//! - agreement: no two correct replicas execute different batches at one seq;
//! - total order: each correct replica incarnation executes seqs 1, 2, 3 … with no gap,
//!   except that a state transfer jumps it forward (never back) to a checkpoint;
//! - state transfer: a restored snapshot is the agreed state at its seq;
//! - checkpoints: correct replicas sign the same digest at every checkpoint;
//! - exactly-once: no (client, request) executes twice in one correct replica
//!   incarnation, nor at two seqs of the agreed order;
//! - validity: a correct client's request r executes with the r-th operation it
//!   submitted (clients number requests 1, 2, 3 … in submission order);
//! - client correctness: a correct client completes each request once, with the result
//!   its op has in the agreed order;
//! - linearizability: an ordered request that completed before another was submitted
//!   comes first in the agreed order; a read answered without ordering returns its op's
//!   result in a state of the agreed order no older than every request completed before
//!   the read was submitted, no newer than what correct replicas had executed when it
//!   completed, and no older than the state of any read that completed before it began;
//! - liveness after stabilization: every request a correct client submits completes
//!   within a bound after the network stabilises (or after its submission, if later), and
//!   every batch agreed reaches every correct replica within the bound (a replica that
//!   crashed and restarted, in the incarnation it ends with);
//! - no false accusations: no correct node reports a fault against a correct one (a
//!   duplicated read answered twice is no equivocation, a checkpoint vote of a correct
//!   replica is no bad signature).

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet};

use super::{Applied, Log};
use crate::kv::{self, Kv};
use crate::{FaultKind, Nanos, NodeId, Operation};

/// What a run must satisfy.
#[derive(Clone, Debug, Default)]
pub struct Expectations {
    /// Hosts of correct replicas: agreement, total order, exactly-once, validity.
    pub correct_replicas: BTreeSet<usize>,
    /// Hosts of correct clients: validity of their operations, correct results.
    pub correct_clients: BTreeSet<usize>,
    /// What liveness promises, where it does.
    pub liveness: Option<Liveness>,
    /// Correct replicas that must keep up with the agreed order (a restarted one in its
    /// last incarnation).
    pub converge: BTreeSet<usize>,
}

/// Liveness under eventual synchrony.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    /// When the last fault ended: partitions healed, crashed replicas back, the network
    /// lossless, faulty clients silent. (Faulty replicas go on lying.)
    pub stable_at: Nanos,
    /// Within this of `stable_at`, or of a later submission, every request of a correct
    /// client completes; within this of its agreement, every batch reaches every replica
    /// in `converge`.
    pub bound: Nanos,
    /// When the run stopped: promises due later are not judged.
    pub end: Nanos,
}

/// A request of a correct client: when it was submitted, its op, and whether as a read.
struct Submitted<'a> {
    at: Nanos,
    op: &'a [u8],
    read: bool,
}

/// Every violated property, each named with the hosts, sequence numbers and requests
/// involved.
pub fn check(log: &Log, exp: &Expectations) -> Vec<String> {
    let mut violations = Vec::new();
    let submitted = submissions(log, exp);
    let agreed = agreed_order(log, exp, &submitted, &mut violations);
    checkpoints(log, exp, &mut violations);
    let replay = replay(&agreed, log, exp, &mut violations);
    clients(log, exp, &submitted, &agreed, &replay, &mut violations);
    if let Some(l) = exp.liveness {
        liveness(log, exp, l, &submitted, &agreed, &mut violations);
    }
    accusations(log, exp, &mut violations);
    violations
}

/// Faults correct nodes reported against correct nodes. A frame whose MAC fails names a
/// sender it cannot prove (anyone can claim to be anyone), so those are left out.
fn accusations(log: &Log, exp: &Expectations, violations: &mut Vec<String>) {
    let correct = |host: usize| exp.correct_replicas.contains(&host) || exp.correct_clients.contains(&host);
    let unproven = [FaultKind::BadMac, FaultKind::ForgedSender];
    for (&(host, accused, kind), count) in &log.accusations {
        if correct(host) && correct(accused as usize) && !unproven.contains(&kind) {
            violations.push(format!(
                "accusation: correct host {host} reported {} against correct node {accused} {count} times",
                kind.name()
            ));
        }
    }
}

/// Each correct client's requests, numbered 1, 2, 3 … in submission order.
fn submissions<'a>(log: &'a Log, exp: &Expectations) -> BTreeMap<NodeId, Vec<Submitted<'a>>> {
    let mut submitted: BTreeMap<NodeId, Vec<Submitted>> = BTreeMap::new();
    for s in log.submitted.iter().filter(|s| exp.correct_clients.contains(&s.host)) {
        submitted.entry(s.node).or_default().push(Submitted { at: s.at, op: &s.op, read: s.read });
    }
    submitted
}

/// A batch of the agreed order: the first correct host to execute it, when, and its ops.
struct Agreed<'a> {
    host: usize,
    at: Nanos,
    ops: &'a [Operation],
}

/// The agreed order, from what correct replicas executed, with agreement, total order,
/// exactly-once within an incarnation and validity checked on the way; and the restores.
fn agreed_order<'a>(
    log: &'a Log,
    exp: &Expectations,
    submitted: &BTreeMap<NodeId, Vec<Submitted>>,
    violations: &mut Vec<String>,
) -> BTreeMap<u64, Agreed<'a>> {
    let mut agreed: BTreeMap<u64, Agreed> = BTreeMap::new();
    let mut next: BTreeMap<(usize, u32), u64> = BTreeMap::new();
    let mut once: BTreeSet<(usize, u32, NodeId, u64)> = BTreeSet::new();
    for e in log.executed.iter().filter(|e| exp.correct_replicas.contains(&e.host)) {
        let (host, inc, seq) = (e.host, e.incarnation, e.seq);
        let next = next.entry((host, inc)).or_insert(1);
        let Applied::Batch(ops) = &e.applied else {
            if seq + 1 < *next {
                violations.push(format!(
                    "total order: host {host} (incarnation {inc}) restored seq {seq} after executing seq {}",
                    *next - 1
                ));
            }
            *next = seq + 1;
            continue;
        };
        if seq != *next {
            violations
                .push(format!("total order: host {host} (incarnation {inc}) executed seq {seq} when {next} was next"));
        }
        *next = seq + 1;
        match agreed.entry(seq) {
            Entry::Vacant(v) => {
                v.insert(Agreed { host, at: e.at, ops });
            }
            Entry::Occupied(o) if o.get().ops != ops.as_slice() => violations.push(format!(
                "agreement: hosts {} and {host} executed different batches at seq {seq}: {:?} vs {:?}",
                o.get().host,
                requests(o.get().ops),
                requests(ops)
            )),
            Entry::Occupied(_) => {}
        }
        for op in ops {
            if !once.insert((host, inc, op.client, op.request)) {
                violations.push(format!(
                    "exactly-once: host {host} (incarnation {inc}) executed request {} of client {} again at seq {seq}",
                    op.request, op.client
                ));
            }
            if let Some(sent) = submitted.get(&op.client) {
                let genuine = op.request.checked_sub(1).and_then(|i| sent.get(i as usize)).map(|s| s.op);
                if genuine != Some(op.op.as_slice()) {
                    violations.push(format!(
                        "validity: host {host} executed request {} of correct client {} at seq {seq} with an \
                         operation the client did not submit as that request",
                        op.request, op.client
                    ));
                }
            }
        }
    }
    agreed
}

/// Correct replicas that signed different digests for one checkpoint.
fn checkpoints(log: &Log, exp: &Expectations, violations: &mut Vec<String>) {
    let mut digests: BTreeMap<u64, BTreeMap<&[u8], BTreeSet<usize>>> = BTreeMap::new();
    for (host, seq, digest) in log.checkpoint_votes.iter().filter(|(h, _, _)| exp.correct_replicas.contains(h)) {
        digests.entry(*seq).or_default().entry(digest.as_slice()).or_default().insert(*host);
    }
    for (seq, by_digest) in digests.into_iter().filter(|(_, d)| d.len() > 1) {
        let hosts: Vec<&BTreeSet<usize>> = by_digest.values().collect();
        violations.push(format!("checkpoints: correct hosts signed different digests at seq {seq}: {hosts:?}"));
    }
}

/// The agreed order replayed on a reference store: each request's result and position,
/// and what every read-only op returns in each state.
struct Replay {
    results: BTreeMap<(NodeId, u64), (u64, Vec<u8>)>,
    /// Per state (after the batch at each seq, from 0): the results of every read op.
    reads: BTreeMap<Vec<u8>, Vec<Vec<u8>>>,
    /// The last seq replayed without a gap.
    last: u64,
}

fn replay(agreed: &BTreeMap<u64, Agreed>, log: &Log, exp: &Expectations, violations: &mut Vec<String>) -> Replay {
    let mut restores: BTreeMap<u64, Vec<(usize, &[u8])>> = BTreeMap::new();
    for e in log.executed.iter().filter(|e| exp.correct_replicas.contains(&e.host)) {
        if let Applied::Snapshot(snapshot) = &e.applied {
            restores.entry(e.seq).or_default().push((e.host, snapshot));
        }
    }
    let read_ops: BTreeSet<&[u8]> = log.submitted.iter().filter(|s| s.read).map(|s| s.op.as_slice()).collect();
    let mut out = Replay { results: BTreeMap::new(), reads: BTreeMap::new(), last: 0 };
    let mut reference = Kv::new();
    let mut state = |reference: &Kv, seq: u64, out: &mut Replay, violations: &mut Vec<String>| {
        for (host, snapshot) in restores.remove(&seq).unwrap_or_default() {
            if snapshot != reference.snapshot() {
                violations.push(format!(
                    "state transfer: host {host} restored a snapshot at seq {seq} that is not the agreed state"
                ));
            }
        }
        for op in &read_ops {
            out.reads.entry(op.to_vec()).or_default().push(reference.query(op));
        }
    };
    state(&reference, 0, &mut out, violations);
    for (&seq, batch) in agreed {
        if seq != out.last + 1 {
            violations.push(format!(
                "agreement: no correct replica executed seq {}, yet seq {seq} was executed",
                out.last + 1
            ));
            break;
        }
        for op in batch.ops {
            let result = reference.execute(&op.op);
            if out.results.insert((op.client, op.request), (seq, result)).is_some() {
                violations.push(format!(
                    "exactly-once: the agreed order executes request {} of client {} twice (again at seq {seq})",
                    op.request, op.client
                ));
            }
        }
        out.last = seq;
        state(&reference, seq, &mut out, violations);
    }
    for (seq, hosts) in restores {
        violations.push(format!(
            "state transfer: hosts {:?} restored seq {seq}, beyond the agreed order's {}",
            hosts.iter().map(|h| h.0).collect::<Vec<_>>(),
            out.last
        ));
    }
    out
}

/// Client correctness and linearizability.
fn clients(
    log: &Log,
    exp: &Expectations,
    submitted: &BTreeMap<NodeId, Vec<Submitted>>,
    agreed: &BTreeMap<u64, Agreed>,
    replay: &Replay,
    violations: &mut Vec<String>,
) {
    let replayed_all = replay.last == agreed.last_key_value().map_or(0, |(&seq, _)| seq);
    // The highest seq correct replicas had executed at each time, for reads' upper bounds.
    let mut executed_by: Vec<(Nanos, u64)> = agreed.values().zip(agreed.keys()).map(|(a, &s)| (a.at, s)).collect();
    executed_by.sort_unstable();
    let highest_by = |t: Nanos| executed_by.iter().take_while(|(at, _)| *at <= t).map(|(_, s)| *s).max().unwrap_or(0);
    let mut done: BTreeSet<(NodeId, u64)> = BTreeSet::new();
    // Ordered completions as (completed at, seq), and reads answered unordered.
    let mut ordered: Vec<(Nanos, u64)> = Vec::new();
    let mut reads: Vec<(Nanos, Nanos, NodeId, u64, &[u8])> = Vec::new();
    for c in log.completed.iter().filter(|c| exp.correct_clients.contains(&c.host)) {
        let (client, request) = (c.node, c.request);
        if !done.insert((client, request)) {
            violations.push(format!("client: client {client} completed request {request} twice"));
        }
        let sent = request.checked_sub(1).and_then(|i| submitted.get(&client)?.get(i as usize));
        match (replay.results.get(&(client, request)), sent) {
            (Some((seq, r)), _) if *r == c.result => ordered.push((c.at, *seq)),
            (Some((_, r)), _) => violations.push(format!(
                "client: client {client} completed request {request} with {:?}, but the agreed order gives {:?}",
                kv::Reply::decode(&c.result),
                kv::Reply::decode(r)
            )),
            (None, Some(s)) if s.read => reads.push((s.at, c.at, client, request, &c.result)),
            (None, _) if replayed_all => violations.push(format!(
                "client: client {client} completed request {request}, which no correct replica executed"
            )),
            (None, _) => {}
        }
    }
    // Ordered requests in real-time order: one that completed before another was
    // submitted comes first.
    for s in submitted.iter().flat_map(|(&client, sent)| (1..).zip(sent).map(move |(r, s)| (client, r, s))) {
        let (client, request, sub) = s;
        let Some((seq, _)) = replay.results.get(&(client, request)) else { continue };
        if let Some((at, before)) = ordered.iter().find(|(at, before)| *at < sub.at && before > seq) {
            violations.push(format!(
                "linearizability: client {client}'s request {request}, submitted at {} ns, is ordered at seq {seq}, \
                 before seq {before}, which completed earlier at {at} ns",
                sub.at
            ));
        }
    }
    // Reads, in completion order, each at the oldest state its result allows.
    reads.sort_by_key(|r| r.1);
    let mut placed: Vec<(Nanos, u64)> = Vec::new();
    for (invoked, completed, client, request, result) in reads {
        let after_ordered = ordered.iter().filter(|(at, _)| *at < invoked).map(|(_, s)| *s).max().unwrap_or(0);
        let after_reads = placed.iter().filter(|(at, _)| *at < invoked).map(|(_, s)| *s).max().unwrap_or(0);
        let low = after_ordered.max(after_reads);
        let high = highest_by(completed);
        let op = submitted[&client][request as usize - 1].op;
        let states = replay.reads.get(op).map_or(&[][..], Vec::as_slice);
        let fits = (low..=high.min(states.len().saturating_sub(1) as u64)).find(|&k| states[k as usize] == result);
        match fits {
            Some(k) => placed.push((completed, k)),
            None => violations.push(format!(
                "linearizability: client {client} read {:?} as request {request}, which no state of the agreed order \
                 from seq {low} to seq {high} gives",
                kv::Reply::decode(result)
            )),
        }
    }
}

/// Liveness after stabilization, within the bound.
fn liveness(
    log: &Log,
    exp: &Expectations,
    l: Liveness,
    submitted: &BTreeMap<NodeId, Vec<Submitted>>,
    agreed: &BTreeMap<u64, Agreed>,
    violations: &mut Vec<String>,
) {
    let due = |from: Nanos| from.max(l.stable_at).saturating_add(l.bound);
    let completed: BTreeMap<(NodeId, u64), Nanos> = log
        .completed
        .iter()
        .filter(|c| exp.correct_clients.contains(&c.host))
        .map(|c| ((c.node, c.request), c.at))
        .collect();
    for (&client, sent) in submitted {
        let late: Vec<u64> = (1..)
            .zip(sent)
            .filter(|(r, s)| due(s.at) <= l.end && completed.get(&(client, *r)).is_none_or(|&at| at > due(s.at)))
            .map(|(r, _)| r)
            .collect();
        if !late.is_empty() {
            violations.push(format!(
                "liveness: client {client} did not complete requests {late:?} of {} within {} ms of stabilization",
                sent.len(),
                l.bound / 1_000_000
            ));
        }
    }
    for &host in &exp.converge {
        let last = log.restarts.iter().filter(|&&h| h == host).count() as u32;
        let mut applied: BTreeMap<u64, Nanos> = BTreeMap::new();
        for e in log.executed.iter().filter(|e| e.host == host && e.incarnation == last) {
            applied.entry(e.seq).or_insert(e.at);
        }
        // A restore to seq k stands for every seq up to k.
        let reached = |seq: u64, by: Nanos| applied.range(seq..).any(|(_, &at)| at <= by);
        if let Some((seq, a)) = agreed.iter().find(|(seq, a)| due(a.at) <= l.end && !reached(**seq, due(a.at))) {
            violations.push(format!(
                "liveness: host {host} had not reached seq {seq} {} ms after it was agreed (at {} ms)",
                l.bound / 1_000_000,
                a.at / 1_000_000
            ));
        }
    }
}

/// (client, request) of each operation, for reports.
fn requests(ops: &[Operation]) -> Vec<(NodeId, u64)> {
    ops.iter().map(|o| (o.client, o.request)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{Completion, Execution, Submission};

    const MS: Nanos = 1_000_000;

    fn op(client: NodeId, request: u64, op: Vec<u8>) -> Operation {
        Operation { client, request, op }
    }

    fn batch(host: usize, incarnation: u32, seq: u64, ops: Vec<Operation>) -> Execution {
        Execution { at: seq * MS, host, node: host as NodeId, incarnation, seq, applied: Applied::Batch(ops) }
    }

    fn restore(host: usize, incarnation: u32, seq: u64, state: &Kv) -> Execution {
        let applied = Applied::Snapshot(state.snapshot());
        Execution { at: seq * MS, host, node: host as NodeId, incarnation, seq, applied }
    }

    fn submission(at: Nanos, op: Vec<u8>, read: bool) -> Submission {
        Submission { at, host: 4, node: 4, incarnation: 0, op, read }
    }

    fn completion(at: Nanos, request: u64, result: Vec<u8>) -> Completion {
        Completion { at, host: 4, node: 4, incarnation: 0, request, result }
    }

    /// Two correct replicas (hosts 0, 1) and one correct client (host 4) that submitted
    /// put(a, 1) then get(a), executed at seqs 1 and 2 (at 1 and 2 ms) and completed
    /// correctly just after.
    fn clean() -> (Log, Expectations) {
        let mut log = Log::default();
        let ops = [kv::put(b"a", b"1"), kv::get(b"a")];
        let mut reference = Kv::new();
        for (i, o) in ops.iter().enumerate() {
            let r = i as u64 + 1;
            log.submitted.push(submission(i as u64 * MS, o.clone(), false));
            log.completed.push(completion(r * MS + 1, r, reference.execute(o)));
        }
        for host in [0, 1] {
            log.executed.push(batch(host, 0, 1, vec![op(4, 1, ops[0].clone())]));
            log.executed.push(batch(host, 0, 2, vec![op(4, 2, ops[1].clone())]));
        }
        for host in [0, 1] {
            log.checkpoint_votes.push((host, 2, vec![7; 32]));
        }
        let liveness = Some(Liveness { stable_at: 0, bound: 10 * MS, end: 100 * MS });
        let exp = Expectations {
            correct_replicas: [0, 1].into(),
            correct_clients: [4].into(),
            liveness,
            converge: [0, 1].into(),
        };
        (log, exp)
    }

    fn violations(log: &Log, exp: &Expectations) -> String {
        check(log, exp).join("\n")
    }

    #[test]
    fn a_clean_run_passes() {
        let (log, exp) = clean();
        assert_eq!(violations(&log, &exp), "");
    }

    #[test]
    fn the_checker_catches_each_violation() {
        let (base, exp) = clean();
        type Corrupt = Box<dyn Fn(&mut Log)>;
        let cases: Vec<(&str, Corrupt)> = vec![
            ("agreement", Box::new(|l: &mut Log| l.executed[3] = batch(1, 0, 2, vec![]))),
            ("total order", Box::new(|l: &mut Log| l.executed[1].seq = 3)),
            (
                "exactly-once",
                Box::new(|l: &mut Log| l.executed.push(batch(0, 0, 3, vec![op(4, 1, kv::put(b"a", b"1"))]))),
            ),
            ("validity", Box::new(|l: &mut Log| l.executed[0] = batch(0, 0, 1, vec![op(4, 1, kv::put(b"a", b"2"))]))),
            ("client", Box::new(|l: &mut Log| l.completed[1].result = kv::Reply::Value(None).encode())),
            ("checkpoints", Box::new(|l: &mut Log| l.checkpoint_votes[1].2 = vec![8; 32])),
            (
                "accusation",
                Box::new(|l: &mut Log| *l.accusations.entry((4, 1, FaultKind::Equivocation)).or_default() += 1),
            ),
            ("liveness", Box::new(|l: &mut Log| drop(l.completed.pop()))),
            ("liveness", Box::new(|l: &mut Log| l.completed[1].at = 20 * MS)),
            ("liveness", Box::new(|l: &mut Log| drop(l.executed.pop()))),
            ("state transfer", Box::new(|l: &mut Log| l.executed.push(restore(1, 1, 1, &Kv::new())))),
            // Request 2 was submitted after request 1 completed, yet ordered first.
            (
                "linearizability",
                Box::new(|l: &mut Log| {
                    l.submitted[0].at = 3 * MS;
                    l.submitted[1].at = 0;
                    l.completed[1].at = 2 * MS;
                }),
            ),
        ];
        for (property, corrupt) in cases {
            let mut log = Log { submitted: base.submitted.clone(), ..Log::default() };
            log.executed = base.executed.clone();
            log.completed = base.completed.clone();
            log.checkpoint_votes = base.checkpoint_votes.clone();
            corrupt(&mut log);
            let found = violations(&log, &exp);
            assert!(found.starts_with(property), "{property}: {found}");
        }
    }

    /// put(a, 1) ordered at seq 1 and completed at 1 ms; then a read of a, answered
    /// without ordering: what it may return depends on when it was submitted.
    #[test]
    fn a_read_must_see_every_write_completed_before_it_began() {
        let (mut log, exp) = clean();
        log.submitted.truncate(1);
        log.completed.truncate(1);
        for e in &mut log.executed {
            e.applied = Applied::Batch(if e.seq == 1 { vec![op(4, 1, kv::put(b"a", b"1"))] } else { vec![] });
        }
        log.submitted.push(submission(5 * MS, kv::get(b"a"), true));
        let absent = kv::Reply::Value(None).encode();
        log.completed.push(completion(6 * MS, 2, absent.clone()));
        assert!(violations(&log, &exp).starts_with("linearizability"), "{}", violations(&log, &exp));
        // Submitted before the write completed, the same answer is fine.
        log.submitted[1].at = 0;
        assert_eq!(violations(&log, &exp), "");
        // A read that completed before a later one began bounds it from below.
        log.completed[1].result = kv::Reply::Value(Some(b"1".to_vec())).encode();
        log.submitted.push(submission(7 * MS, kv::get(b"a"), true));
        log.completed.push(completion(8 * MS, 3, absent));
        log.completed[0].at = 50 * MS;
        assert!(violations(&log, &exp).starts_with("linearizability"), "{}", violations(&log, &exp));
    }

    #[test]
    fn liveness_is_judged_only_after_stabilization_and_before_the_end() {
        let (mut log, mut exp) = clean();
        log.completed[1].at = 30 * MS;
        assert!(violations(&log, &exp).starts_with("liveness"));
        exp.liveness = Some(Liveness { stable_at: 25 * MS, ..exp.liveness.unwrap() });
        assert_eq!(violations(&log, &exp), "");
        log.completed.pop();
        exp.liveness = Some(Liveness { end: 30 * MS, ..exp.liveness.unwrap() });
        assert_eq!(violations(&log, &exp), "");
    }

    #[test]
    fn faulty_nodes_are_not_held_to_the_properties() {
        let (mut log, mut exp) = clean();
        log.executed.push(batch(2, 0, 1, vec![op(4, 7, b"junk".to_vec())]));
        log.completed.push(Completion { at: 0, host: 5, node: 5, incarnation: 0, request: 1, result: vec![] });
        log.checkpoint_votes.push((2, 2, vec![9; 32]));
        log.accusations.insert((2, 0, FaultKind::Equivocation), 1);
        log.accusations.insert((0, 2, FaultKind::Equivocation), 1);
        log.accusations.insert((0, 1, FaultKind::BadMac), 1);
        assert_eq!(violations(&log, &exp), "");
        exp.liveness = None;
        log.completed.clear();
        assert_eq!(violations(&log, &exp), "");
    }

    #[test]
    fn a_restart_begins_a_new_incarnation_that_may_restore_forward() {
        let (mut log, exp) = clean();
        let mut reference = Kv::new();
        reference.execute(&kv::put(b"a", b"1"));
        log.restarts.push(0);
        log.executed.push(restore(0, 1, 1, &reference));
        log.executed.push(batch(0, 1, 2, vec![op(4, 2, kv::get(b"a"))]));
        assert_eq!(violations(&log, &exp), "");
        // A restarted replica must catch up again: what it executed before counts no more.
        log.executed.pop();
        assert!(
            violations(&log, &exp).starts_with("liveness: host 0 had not reached seq 2"),
            "{}",
            violations(&log, &exp)
        );
    }
}
