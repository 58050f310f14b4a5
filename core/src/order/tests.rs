//! Direct-routing tests of the PBFT machines: real nodes, a FIFO network and a host that
//! executes batches against a trivial application (the result of an op is the op
//! reversed; the snapshot is the list of executed ops).

use std::collections::VecDeque;

use crate::config::{ClusterSpec, Params};
use crate::crypto::CryptoMode;
use crate::{Input, Node, NodeId, Output, Request, generate_cluster};

/// Each batch a replica executed: its seq and (client, request) pairs.
type Executed = Vec<(u64, Vec<(NodeId, u64)>)>;

struct Net {
    nodes: Vec<Node>,
    apps: Vec<Vec<Vec<u8>>>,
    queue: VecDeque<(NodeId, NodeId, Vec<u8>)>,
    completed: Vec<(NodeId, u64, Vec<u8>)>,
    executed: Vec<Executed>,
    /// Frames each node received.
    received: Vec<u64>,
    /// Replicas whose outgoing frames are dropped.
    silent: Vec<NodeId>,
    /// Replicas whose incoming frames are dropped.
    deaf: Vec<NodeId>,
    /// Replicas whose host executes each batch at once but answers later (`answer_held`).
    slow_hosts: Vec<NodeId>,
    held_answers: Vec<(NodeId, Input)>,
    /// Restores each node's host made, by seq.
    restored: Vec<(NodeId, u64)>,
    /// Compactions each node allowed its host.
    compacted: Vec<u32>,
    /// Each node's persisted records by token, as its storage keeps them (compacted).
    stored: Vec<Vec<(u64, Vec<u8>)>>,
    now: u64,
}

impl Net {
    fn new(f: u32, clients: u32, params: Params) -> Net {
        let spec = ClusterSpec { crypto: CryptoMode::InsecureTest, params, ..ClusterSpec::pbft(f, clients) };
        let nodes: Vec<Node> =
            generate_cluster(&spec, [5; 32]).unwrap().into_iter().map(|c| Node::new(c).unwrap()).collect();
        let n = nodes.len();
        Net {
            nodes,
            apps: vec![vec![]; n],
            queue: VecDeque::new(),
            completed: vec![],
            executed: vec![vec![]; n],
            received: vec![0; n],
            silent: vec![],
            deaf: vec![],
            slow_hosts: vec![],
            held_answers: vec![],
            restored: vec![],
            compacted: vec![0; n],
            stored: vec![vec![]; n],
            now: 0,
        }
    }

    fn input(&mut self, id: NodeId, input: Input) {
        self.nodes[id as usize].handle(self.now, input).unwrap();
        while let Some(out) = self.nodes[id as usize].poll() {
            match out {
                Output::Send { to, bytes } if !self.silent.contains(&id) => self.queue.push_back((id, to, bytes)),
                Output::Send { .. }
                | Output::Fault { .. }
                | Output::Deliver(_)
                | Output::Query { .. }
                | Output::Delivered(_)
                | Output::Event(_) => {}
                Output::Persist { token, record } => {
                    self.stored[id as usize].push((token, record));
                    self.input(id, Input::Persisted { token })
                }
                Output::Compact { token } => {
                    self.compacted[id as usize] += 1;
                    self.stored[id as usize].retain(|(t, _)| *t >= token);
                }
                Output::Execute { seq, ops, snapshot } => {
                    self.executed[id as usize].push((seq, ops.iter().map(|o| (o.client, o.request)).collect()));
                    let results = ops.iter().map(|o| o.op.iter().rev().copied().collect()).collect();
                    self.apps[id as usize].extend(ops.into_iter().map(|o| o.op));
                    let snapshot = snapshot.then(|| self.apps[id as usize].concat());
                    let answer = Input::Executed { seq, results, snapshot };
                    if self.slow_hosts.contains(&id) {
                        self.held_answers.push((id, answer));
                    } else {
                        self.input(id, answer);
                    }
                }
                Output::Completed { request, result } => self.completed.push((id, request, result)),
                Output::Restore { seq, snapshot } => {
                    self.restored.push((id, seq));
                    self.apps[id as usize] = vec![snapshot];
                }
            }
        }
    }

    fn run(&mut self) {
        while self.step().is_some() {}
    }

    /// Delivers the next frame (unless its addressee is deaf): its sender and addressee.
    fn step(&mut self) -> Option<(NodeId, NodeId)> {
        let (from, to, bytes) = self.queue.pop_front()?;
        if !self.deaf.contains(&to) {
            self.received[to as usize] += 1;
            self.input(to, Input::Message { from, bytes });
        }
        Some((from, to))
    }

    /// Advances the clock to every pending deadline until nothing is scheduled or `until`.
    fn run_timers(&mut self, until: u64) {
        self.run();
        loop {
            let next = self.nodes.iter().filter_map(|n| n.poll_timeout()).min();
            match next {
                Some(t) if t <= until => {
                    self.now = self.now.max(t);
                    for id in 0..self.nodes.len() as NodeId {
                        if self.nodes[id as usize].poll_timeout().is_some_and(|d| d <= self.now) {
                            self.input(id, Input::Timeout);
                        }
                    }
                    self.run();
                }
                _ => return,
            }
        }
    }

    fn submit(&mut self, client: NodeId, op: &[u8]) {
        self.input(client, Input::Request(Request::Submit { op: op.to_vec() }));
    }

    /// Restarts node `id` from the records its storage kept; what it queued and had not
    /// sent is lost with the crash.
    fn restart(&mut self, id: NodeId) {
        self.queue.retain(|(from, _, _)| *from != id);
        let mut restarted = Node::new(self.nodes[id as usize].config().clone()).unwrap();
        for (_, record) in self.stored[id as usize].clone() {
            restarted.handle(self.now, Input::Recover { record }).unwrap();
        }
        while restarted.poll().is_some() {}
        self.nodes[id as usize] = restarted;
    }

    /// Whether replica `id` answers from its state a read of client `client` that reaches
    /// it before anything else.
    fn answers_read(&mut self, client: NodeId, id: NodeId) -> bool {
        use crate::wire::{bodies_of, pb::body::Kind};
        self.input(client, Input::Request(Request::Read { op: b"op1".to_vec() }));
        let (from, _, bytes) = self.queue.iter().find(|(_, to, _)| *to == id).cloned().unwrap();
        assert!(bodies_of(&bytes).unwrap().iter().any(|b| matches!(b, Kind::Read(_))));
        self.queue.clear();
        self.nodes[id as usize].handle(self.now, Input::Message { from, bytes }).unwrap();
        std::iter::from_fn(|| self.nodes[id as usize].poll()).any(|o| matches!(o, Output::Query { .. }))
    }

    /// Submits `ops` operations from `client` one at a time, each given `gap` of timers:
    /// with batches of one, one batch each.
    fn submit_in_turn(&mut self, client: NodeId, ops: u32, gap: u64) {
        for i in 0..ops {
            self.submit(client, format!("op{i}").as_bytes());
            self.run_timers(self.now + gap);
        }
    }
}

/// The faulty nodes `ids` of the 1-fault, 1-client cluster `Net::new` makes with
/// `params`, colluding with their keys.
fn colluders(params: &Params, ids: &[NodeId]) -> crate::sim::keyed::Coalition {
    let spec = ClusterSpec { crypto: CryptoMode::InsecureTest, params: params.clone(), ..ClusterSpec::pbft(1, 1) };
    let cfgs = generate_cluster(&spec, [5; 32]).unwrap();
    let everyone = (0..cfgs.len() as NodeId).collect();
    crate::sim::keyed::Coalition::new(ids.iter().map(|&id| &cfgs[id as usize]), everyone)
}

fn params() -> Params {
    Params { checkpoint_interval: 4, pipeline: 4, batch_max_count: 3, batch_timeout_ns: 1_000, ..Params::default() }
}

/// Past a prepared slot's wait for unanimous PREPAREs where messages take no time.
const UNANIMITY_WAIT: u64 = 1_000;

/// Past every replica's turn to certify a checkpoint, and before any request timer.
const SETTLED: u64 = 100_000_000;

#[test]
fn every_replica_executes_the_same_batches_and_clients_complete() {
    for f in [1, 2] {
        let mut net = Net::new(f, 2, params());
        let n = 3 * f + 1;
        for i in 0..30u32 {
            net.submit(n + i % 2, format!("op{i}").as_bytes());
        }
        net.run_timers(SETTLED);
        assert_eq!(net.completed.len(), 30, "f={f}");
        for (client, request, result) in &net.completed {
            let i = (request - 1) * 2 + (*client - n) as u64;
            assert_eq!(result, &format!("op{i}").bytes().rev().collect::<Vec<u8>>());
        }
        let first = &net.executed[0];
        assert!(first.iter().map(|(_, ops)| ops.len()).sum::<usize>() == 30);
        for r in 1..n as usize {
            assert_eq!(&net.executed[r], first, "replica {r} diverged");
        }
        // Checkpoints became stable and freed the log.
        for r in 0..n as usize {
            assert!(net.nodes[r].live_instances() <= 2 * 4 + 2, "replica {r}: {}", net.nodes[r].live_instances());
        }
    }
}

/// The replicas certify a checkpoint in turn, the primary at once and each next replica
/// `CERTIFY_TURN_NS` later, not all at the same moment.
#[test]
fn replicas_certify_a_checkpoint_in_turn_the_primary_first() {
    use crate::order::replica::CERTIFY_TURN_NS;
    let mut net = Net::new(1, 1, params());
    // One request at a time, so one batch each: the fourth is checkpoint 4.
    net.submit_in_turn(4, 4, 1_000_000);
    assert_eq!(net.executed.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4, 4, 4, 0]);
    let stable = |net: &Net| (0..4).map(|r| net.nodes[r].status().stable).collect::<Vec<_>>();
    // The quorum formed in the last millisecond.
    let quorum = net.now;
    assert_eq!(stable(&net), [4, 0, 0, 0]);
    for place in 1..4 {
        net.run_timers(quorum + place * CERTIFY_TURN_NS - 1_500_000);
        assert_eq!(stable(&net).iter().filter(|&&s| s == 4).count() as u64, place, "before turn {place}");
        net.run_timers(quorum + place * CERTIFY_TURN_NS + 500_000);
        assert_eq!(stable(&net)[place as usize], 4, "after turn {place}");
    }
}

/// Every frame's hop MAC is counted; a replica also checks a client's authenticator when
/// its requests reach it inside a batch before they come from the client, and BLS
/// signatures (checkpoints).
#[test]
fn status_counts_every_mac_and_signature_check() {
    let mut net = Net::new(1, 1, params());
    for i in 0..12u32 {
        net.submit(4, format!("op{i}").as_bytes());
    }
    net.run_timers(SETTLED);
    assert_eq!(net.completed.len(), 12);
    let client = net.nodes[4].status();
    assert_eq!(client.macs_verified, net.received[4]);
    assert_eq!(client.signatures_verified, 0);
    for r in 0..4 {
        let status = net.nodes[r].status();
        let macs = status.macs_verified - net.received[r];
        assert!(macs <= 12, "replica {r}: {macs} authenticators checked for 12 requests");
        assert!(status.signatures_verified > 0, "replica {r}");
    }
}

#[test]
fn a_silent_primary_is_replaced_and_requests_complete() {
    let mut net = Net::new(1, 1, params());
    net.silent = vec![0];
    for i in 0..10u32 {
        net.submit(4, format!("op{i}").as_bytes());
    }
    net.run_timers(60_000_000_000);
    assert_eq!(net.completed.len(), 10);
    assert_eq!(net.executed[1], net.executed[2]);
    assert_eq!(net.executed[1], net.executed[3]);
}

#[test]
fn a_restarted_client_resumes_numbering_above_its_persisted_lease() {
    let spec = ClusterSpec { crypto: CryptoMode::InsecureTest, ..ClusterSpec::pbft(1, 1) };
    let cfg = generate_cluster(&spec, [5; 32]).unwrap()[4].clone();
    let mut client = Node::new(cfg.clone()).unwrap();
    client.handle(0, Input::Request(Request::Submit { op: b"a".to_vec() })).unwrap();
    let outputs: Vec<Output> = std::iter::from_fn(|| client.poll()).collect();
    // The lease is persisted first and the request waits for it.
    let Some(Output::Persist { token, record }) = outputs.first().cloned() else { panic!("{outputs:?}") };
    assert!(!outputs.iter().any(|o| matches!(o, Output::Send { .. })), "sent before the lease was durable");
    client.handle(0, Input::Persisted { token }).unwrap();
    let released: Vec<Output> = std::iter::from_fn(|| client.poll()).collect();
    assert!(released.iter().any(|o| matches!(o, Output::Compact { token: t } if *t == token)));
    assert_eq!(released.iter().filter(|o| matches!(o, Output::Send { .. })).count(), 4);
    // Later requests within the lease persist nothing.
    client.handle(0, Input::Request(Request::Submit { op: b"b".to_vec() })).unwrap();
    assert!(std::iter::from_fn(|| client.poll()).all(|o| matches!(o, Output::Send { .. })));

    let mut restarted = Node::new(cfg).unwrap();
    restarted.handle(0, Input::Recover { record }).unwrap();
    assert!(restarted.next_request().unwrap() > 2, "a restarted client would reuse request numbers");
    assert!(restarted.handle(0, Input::Recover { record: vec![0xff] }).is_err());
}

/// A client that ignores its own limit: a replica holds at most `client_queue` of its
/// requests waiting for a batch and refuses the rest, counting them in `Stats::refused`
/// (a bound met, not a fault of the client). Requests in a batch
/// no longer count, so a replica that executes behind the others still takes the new
/// requests of a client whose earlier ones completed elsewhere.
#[test]
fn a_replica_holds_at_most_client_queue_unbatched_requests_per_client() {
    use bytes::Bytes;
    use prost::Message;

    use crate::Nanos;
    use crate::order::Bundle;
    use crate::wire::{self, Keyring, pb};

    let spec = ClusterSpec {
        crypto: CryptoMode::InsecureTest,
        params: Params { client_queue: 8, ..params() },
        ..ClusterSpec::pbft(1, 1)
    };
    let cfgs = generate_cluster(&spec, [5; 32]).unwrap();
    let keys = |id: NodeId| Keyring::new(CryptoMode::InsecureTest, id, cfgs[id as usize].mac_keys.clone());
    let (client, primary) = (keys(4), keys(0));
    let mut backup = Node::new(cfgs[1].clone()).unwrap();
    let request = |r: u64| Bundle::seal(&client, &[0, 1, 2, 3], r, 0, vec![Bytes::from(format!("op{r}"))]);
    // Delivers a body to the backup, acknowledging what it persists as a host would, and
    // counts the requests it refused.
    let mut deliver = |from: &Keyring, body: pb::body::Kind, now: Nanos| -> usize {
        let body = wire::encode_body(body);
        let bytes = wire::frame(from.me, &body, &[from.mac_to(1, &body).unwrap()]);
        let before = backup.stats().refused;
        backup.handle(now, Input::Message { from: from.me, bytes }).unwrap();
        while let Some(o) = backup.poll() {
            match o {
                Output::Persist { token, .. } => backup.handle(now, Input::Persisted { token }).unwrap(),
                Output::Fault { node, kind } => panic!("a refusal reported as a fault of {node}: {kind:?}"),
                _ => {}
            }
        }
        (backup.stats().refused - before) as usize
    };
    let refused: usize = (1..=12).map(|r| deliver(&client, pb::body::Kind::Requests(request(r)), r)).sum();
    assert_eq!(refused, 4, "requests 9 to 12 are beyond client_queue");

    // The primary batches requests 1 to 3: room for three more, and no more.
    let batch = pb::Batch { requests: (1..=3).map(request).collect() };
    let pp = pb::PrePrepare { view: 0, seq: 1, batch: batch.encode_to_vec().into() };
    assert_eq!(deliver(&primary, pb::body::Kind::PrePrepare(pp), 20), 0);
    let refused: usize = (13..=16).map(|r| deliver(&client, pb::body::Kind::Requests(request(r)), r)).sum();
    assert_eq!(refused, 1, "request 16 is beyond client_queue again");
}

/// Finding 2: a replica whose host is slow to answer falls behind a stable checkpoint and
/// takes its state by state transfer while the host still owes answers for batches it
/// was handed. The host executes in order (those batches, then the restore), and its late
/// answers are superseded, not refused; nor does the replica ever install a state its host
/// would reach by executing, which would restore the store back in time.
#[test]
fn a_state_transfer_while_the_host_owes_answers_lets_them_pass() {
    let mut net = Net::new(1, 1, Params { batch_max_count: 1, ..params() });
    net.slow_hosts.push(3);
    for i in 0..12u32 {
        net.submit(4, format!("op{i}").as_bytes());
        net.run_timers(net.now + 10_000);
        net.now += 10_000;
    }
    net.run_timers(net.now + 2_000_000_000);
    assert!(net.restored.iter().any(|&(id, _)| id == 3), "replica 3 took no state: {:?}", net.nodes[3].status());
    assert!(!net.held_answers.is_empty(), "its host owed no answers when it did");
    // The host answers at last; `input` unwraps, so a refused answer fails the test.
    while !net.held_answers.is_empty() {
        for (id, answer) in std::mem::take(&mut net.held_answers) {
            net.input(id, answer);
        }
        net.run_timers(net.now + 2_000_000_000);
    }
    assert_eq!(net.nodes[3].status().executed, net.nodes[0].status().executed);
    assert_eq!(net.apps[3].concat(), net.apps[0].concat(), "the restore came after the batches it superseded");
}

/// A replica whose host answers a checkpoint's batch only after a quorum made the
/// checkpoint stable (it certified it without its own state): the snapshot then completes
/// its stable record, so its storage compacts, and it signs no vote nobody wants.
#[test]
fn a_snapshot_after_its_checkpoint_became_stable_completes_the_stable_record() {
    use crate::order::replica::CERTIFY_TURN_NS;
    use crate::wire::{bodies_of, pb};
    let mut net = Net::new(1, 1, Params { batch_max_count: 1, ..params() });
    net.slow_hosts.push(3);
    net.submit_in_turn(4, 4, 1_000_000);
    assert_eq!(net.executed[3].len(), 4, "replica 3 executed the batches up to checkpoint 4");
    // Deaf from now on, it gets no state from its peers: only its host can complete it.
    net.deaf.push(3);
    net.run_timers(net.now + 4 * CERTIFY_TURN_NS);
    let status = net.nodes[3].status();
    assert_eq!((status.stable, status.executed), (4, 0), "replica 3 certified checkpoint 4 at its turn");
    assert_eq!(net.compacted[3], 0, "a stable checkpoint without its state is no point to compact to");
    net.queue.clear();
    for (id, answer) in std::mem::take(&mut net.held_answers) {
        net.input(id, answer);
    }
    assert_eq!(net.nodes[3].status().executed, 4);
    assert_eq!(net.compacted[3], 1, "its own snapshot completed the stable record");
    let votes = net.queue.iter().filter(|(from, _, bytes)| {
        *from == 3 && bodies_of(bytes).unwrap().iter().any(|b| matches!(b, pb::body::Kind::Checkpoint(_)))
    });
    assert_eq!(votes.count(), 0, "no vote for a checkpoint already stable");
}

/// A backup that got the PRE-PREPARE of the last batch but none of the votes after it, in
/// a cluster that then goes idle: PREPAREs and COMMITs are never sent again, and no
/// checkpoint comes. It asks its peers within a quarter of the request timeout, rather
/// than suspect the working primary when its request timer runs out.
#[test]
fn a_backup_that_lost_the_votes_of_the_last_batch_catches_up_in_an_idle_cluster() {
    let params = Params { checkpoint_interval: 64, ..params() };
    let mut net = Net::new(1, 1, params.clone());
    // Past the asks replicas make when they start.
    net.run_timers(2_000_000_000);
    net.submit(4, b"op");
    // Until the PRE-PREPARE reached replica 3 (an idle primary proposes at once), then
    // nothing.
    while net.step().is_some_and(|(from, to)| (from, to) != (0, 3)) {}
    net.deaf = vec![3];
    net.run();
    assert_eq!(net.completed.len(), 1);
    assert!(net.executed[3].is_empty(), "replica 3 executed without the votes");
    net.deaf.clear();
    net.run_timers(net.now + params.request_timeout_ns / 2);
    assert_eq!(net.executed[3], net.executed[0], "replica 3 stayed behind");
    for r in 0..4 {
        assert_eq!(net.nodes[r].status().view_changes, 0, "replica {r} changed view");
    }
}

/// After a burst batched two requests together, an idle primary's estimate of its batch
/// size decays back to one, so a lone client's request is proposed at once again instead
/// of waiting out the batch timer every time (the estimate's decay rounded down to
/// nothing below eight requests, so it never came back).
#[test]
fn a_lone_request_after_a_burst_is_soon_proposed_at_once_again() {
    let params = Params { checkpoint_interval: 64, batch_timeout_ns: 50_000_000, ..params() };
    let mut net = Net::new(1, 3, params.clone());
    net.run_timers(2_000_000_000);
    // The first goes alone; the two that arrive while it is in flight go together.
    for client in [4, 5, 6] {
        net.submit(client, b"burst");
    }
    net.run();
    assert_eq!(net.completed.len(), 3);
    assert_eq!(net.executed[0].iter().map(|(_, ops)| ops.len()).collect::<Vec<_>>(), [1, 2]);
    let mut waited = 0;
    for i in 0..5 {
        let before = net.completed.len();
        net.submit(4, format!("lone {i}").as_bytes());
        net.run();
        if net.completed.len() == before {
            waited += 1;
            net.run_timers(net.now + params.batch_timeout_ns);
        }
        assert_eq!(net.completed.len(), before + 1, "lone request {i} did not complete");
    }
    assert!(waited <= 1, "{waited} of 5 lone requests waited out the batch timer");
}

/// Two colluding replicas (f+1 at n = 4) that change to the last view there is lead a
/// correct replica there; its view-change deadline then lapses, where it used to stay
/// in the past and have the host time the replica out at one instant forever.
#[test]
fn a_replica_led_to_the_last_view_stops_timing_out() {
    use crate::wire::{self, pb};
    let coalition = colluders(&params(), &[2, 3]);
    let mut net = Net::new(1, 1, params());
    for from in [2, 3] {
        let mut vc = pb::ViewChange { view: u64::MAX, ..Default::default() };
        coalition.sign_view_change(from, &mut vc);
        let bytes = coalition.seal(from, 0, &wire::encode_body(pb::body::Kind::ViewChange(Box::new(vc))), vec![]);
        net.input(0, Input::Message { from, bytes });
    }
    assert!(net.nodes[0].status().changing_view, "f+1 VIEW-CHANGEs lead the replica on");
    // Retries until the deadline, and past it.
    for round in 0..8 {
        let deadline = net.nodes[0].poll_timeout().expect("a view change under way has a deadline");
        net.now = net.now.max(deadline);
        net.input(0, Input::Timeout);
        let next = net.nodes[0].poll_timeout();
        assert!(next.is_some_and(|d| d > net.now), "round {round}: next deadline {next:?} at {}", net.now);
    }
}

/// A frame in flight: sender, addressee, bytes.
type Frame = (NodeId, NodeId, Vec<u8>);

/// Delivers the queued frames, except those `hold` picks, which stay aside in order.
fn pump(net: &mut Net, held: &mut Vec<Frame>, hold: &dyn Fn(NodeId, NodeId, &[crate::wire::pb::body::Kind]) -> bool) {
    while let Some((from, to, bytes)) = net.queue.pop_front() {
        let bodies = crate::wire::bodies_of(&bytes).unwrap_or_default();
        if hold(from, to, &bodies) {
            held.push((from, to, bytes));
        } else {
            net.received[to as usize] += 1;
            net.input(to, Input::Message { from, bytes });
        }
    }
}
/// `Net::run_timers`, with `pump` for `run`.
fn timers(
    net: &mut Net,
    held: &mut Vec<Frame>,
    until: u64,
    hold: &dyn Fn(NodeId, NodeId, &[crate::wire::pb::body::Kind]) -> bool,
) {
    pump(net, held, hold);
    while let Some(t) = net.nodes.iter().filter_map(|n| n.poll_timeout()).min().filter(|&t| t <= until) {
        net.now = net.now.max(t);
        for id in 0..net.nodes.len() as NodeId {
            if net.nodes[id as usize].poll_timeout().is_some_and(|d| d <= net.now) {
                net.input(id, Input::Timeout);
            }
        }
        pump(net, held, hold);
    }
}

/// A replica that asked for view 2 takes no NEW-VIEW for view 1: its VIEW-CHANGE for view
/// 2 told what it prepared, and voting in view 1 afterwards would leave that silent. No
/// replica is faulty, only the network slow: replicas 0 and 3 give up on view 1 and ask
/// for view 2, then view 1's NEW-VIEW and batch X reach them late. When they took it, they
/// prepared and committed X at slot 1 (replica 1 executed it), and view 2's NEW-VIEW,
/// built from their VIEW-CHANGEs, left slot 1 open: its primary proposed another batch
/// there, which the others executed.
#[test]
fn a_replica_that_asked_for_view_2_does_not_vote_in_view_1() {
    use crate::wire::pb::body::Kind;
    let timeout = Params::default().request_timeout_ns;
    let mut net = Net::new(1, 2, Params { checkpoint_interval: 64, ..params() });
    let view_of = |b: &Kind| match b {
        Kind::NewView(nv) => Some(nv.view),
        _ => None,
    };
    let any = |bodies: &[Kind], p: &dyn Fn(&Kind) -> bool| bodies.iter().any(p);
    let mut held: Vec<Frame> = Vec::new();
    // Past the asks replicas make when they start.
    timers(&mut net, &mut held, 2_000_000_000, &|_, _, _| false);

    // Phase A: view 0's primary gets nothing through, so its backups ask for view 1. Its
    // primary (1) hears them late, and its NEW-VIEW and proposals are slow to arrive; so
    // 0, 2 and 3 give up on view 1 and ask for view 2 (replica 1 hears that late too),
    // whose primary (2) takes it, its NEW-VIEW slow as well. Client 5's request never
    // reaches replica 1.
    let slow_to_1 = std::cell::Cell::new(true);
    let phase_a = |from: NodeId, to: NodeId, bodies: &[Kind]| {
        (from == 0 && any(bodies, &|b| matches!(b, Kind::PrePrepare(pp) if pp.view == 0)))
            || (from == 1 && any(bodies, &|b| !matches!(b, Kind::ViewChange(_))))
            || (from == 2 && any(bodies, &|b| view_of(b) == Some(2)))
            || (to == 1 && slow_to_1.get() && any(bodies, &|b| matches!(b, Kind::ViewChange(_))))
            || (from == 5 && to == 1)
    };
    let deadline = |net: &Net| net.nodes.iter().filter_map(|n| n.poll_timeout()).min().unwrap();
    net.submit(4, b"x");
    while !(1..4).all(|r| net.nodes[r].status().changing_view) {
        let next = deadline(&net);
        timers(&mut net, &mut held, next, &phase_a);
    }
    let until = net.now + timeout / 2;
    timers(&mut net, &mut held, until, &phase_a);
    // The VIEW-CHANGEs for view 1 reach replica 1: it enters view 1 and proposes x.
    let (to_1, rest): (Vec<Frame>, Vec<Frame>) = held.into_iter().partition(|(_, to, _)| *to == 1);
    held = rest;
    net.queue.extend(to_1);
    slow_to_1.set(false);
    pump(&mut net, &mut held, &phase_a);
    assert_eq!(net.nodes[1].status().view, 1);
    slow_to_1.set(true);
    net.submit(5, b"y");
    // One deadline at a time, until view 2's primary took it.
    while net.nodes[2].status().view != 2 {
        let next = deadline(&net);
        timers(&mut net, &mut held, next, &phase_a);
    }
    let status: Vec<_> = (0..4).map(|r| net.nodes[r].status()).collect();
    assert_eq!((status[1].view, status[1].changing_view, status[2].view), (1, false, 2), "{status:?}");
    assert!(status[0].changing_view && status[3].changing_view, "{status:?}");

    // Phase B: view 1's NEW-VIEW and proposal reach 0 and 3 at last (not 2, which is in
    // view 2 already); the COMMITs to 0 and 3 are slow.
    let (mut view_1, rest): (Vec<Frame>, Vec<Frame>) =
        held.into_iter().partition(|(from, to, _)| *from == 1 && (*to == 0 || *to == 3));
    held = rest;
    net.queue.extend(view_1.drain(..));
    let phase_b = |from: NodeId, to: NodeId, bodies: &[Kind]| {
        phase_a(from, to, bodies) && !(from == 1 && (to == 0 || to == 3))
            || ((to == 0 || to == 3) && any(bodies, &|b| matches!(b, Kind::Commit(_) | Kind::Committed(_))))
    };
    pump(&mut net, &mut held, &phase_b);
    let status: Vec<_> = (0..4).map(|r| net.nodes[r].status()).collect();
    assert!(status[0].view != 1 && status[3].view != 1, "0 and 3 entered view 1: {status:?}");
    assert!(net.executed[1].is_empty(), "replica 1 executed slot 1 in view 1 without 0 and 3");

    // Phase C: view 2's NEW-VIEW arrives everywhere (the frames still held are lost).
    net.queue.extend(held.drain(..).filter(|(from, _, _)| *from == 2));
    let until = net.now + timeout / 8;
    timers(&mut net, &mut held, until, &|_, _, _| false);
    let slot_1 = |r: usize| net.executed[r].iter().find(|(seq, _)| *seq == 1).cloned();
    assert!(slot_1(1).is_some(), "view 2 ordered slot 1");
    for r in [0, 2, 3] {
        assert_eq!(slot_1(r), slot_1(1), "replicas 1 and {r} executed different batches at slot 1");
    }
}

/// A replica that executed batches it learnt by catch-up (it never prepared them, so only
/// a `Delivered` record says how far it went) and then certified an earlier checkpoint
/// keeps how far it went past the compaction: restarted, it answers no read from the
/// checkpoint's state, older than the state it replied from before the crash. (Persisting
/// the stable checkpoint wrote its votes and prepared slots again, and not that.)
#[test]
fn a_restarted_replica_answers_no_read_from_before_what_it_executed() {
    use crate::wire::{bodies_of, pb::body::Kind};
    let params = Params { checkpoint_interval: 4, pipeline: 1, batch_max_count: 1, ..params() };
    let mut net = Net::new(1, 1, params);
    let mut held: Vec<Frame> = Vec::new();
    // Past the asks replicas make when they start.
    net.run_timers(2_000_000_000);
    // Batches 1 to 4, everywhere; the others' votes for checkpoint 4 are slow to reach 3.
    let votes_to_3 =
        |_: NodeId, to: NodeId, bodies: &[Kind]| to == 3 && bodies.iter().any(|b| matches!(b, Kind::Checkpoint(_)));
    for i in 1..=4 {
        net.submit(4, format!("op{i}").as_bytes());
        pump(&mut net, &mut held, &votes_to_3);
    }
    let until = net.now + 200_000_000;
    timers(&mut net, &mut held, until, &votes_to_3);
    assert_eq!(net.executed[3].len(), 4);
    // Replica 3 hears nothing of batches 5 to 7.
    let deaf_3 = |_: NodeId, to: NodeId, _: &[Kind]| to == 3;
    let mut lost = Vec::new();
    for i in 5..=7 {
        net.submit(4, format!("op{i}").as_bytes());
        // Past the wait for replica 3's PREPARE.
        let until = net.now + UNANIMITY_WAIT;
        timers(&mut net, &mut lost, until, &deaf_3);
    }
    // Then it hears batch 8's votes, far ahead of what it executed, and asks; the primary's
    // frames to it and the batch itself are lost, the backups' answers arrive: it catches
    // up on what committed.
    let catch_up = |from: NodeId, to: NodeId, bodies: &[Kind]| {
        votes_to_3(from, to, bodies)
            || (from, to) == (0, 3)
            || (to == 3 && bodies.iter().any(|b| matches!(b, Kind::Proposal(_))))
    };
    net.submit(4, b"op8");
    pump(&mut net, &mut lost, &catch_up);
    let executed_before = net.nodes[3].status().executed;
    assert!(executed_before >= 7, "replica 3 caught up: {:?}", net.nodes[3].status());
    assert_eq!(net.compacted[3], 0);
    // The votes for checkpoint 4 arrive: it certifies it (it executed past it by half an
    // interval), persisting the stable checkpoint and compacting its storage.
    let (fours, _): (Vec<Frame>, Vec<Frame>) = held.into_iter().partition(|(_, _, bytes)| {
        bodies_of(bytes).unwrap().iter().any(|b| matches!(b, Kind::Checkpoint(c) if c.seq == 4))
    });
    for (from, to, bytes) in fours {
        net.input(to, Input::Message { from, bytes });
    }
    assert_eq!(net.nodes[3].status().stable, 4, "replica 3 certified checkpoint 4");
    assert!(net.compacted[3] > 0);

    net.restart(3);
    assert_eq!(net.nodes[3].status().executed, 4, "restored from checkpoint 4");
    assert!(
        !net.answers_read(4, 3),
        "replica 3 answers a read from the state after batch 4, having executed (and replied to) up to batch \
         {executed_before} before its restart"
    );
}

/// Fault-free: view 0's primary gets nothing through, replicas 1, 2 and 3 ask for view 1,
/// and 1 and 2 crash right after persisting that, before their VIEW-CHANGEs leave;
/// 3's is lost. Restarted, 1 and 2 sign and send a VIEW-CHANGE for view 1 again (they
/// used to re-send only one kept in memory, lost with the crash: no quorum ever formed
/// and the cluster halted for good with every node up and the network reliable).
#[test]
fn replicas_restarted_during_a_view_change_send_their_view_change_again() {
    use crate::wire::pb::body::Kind;
    let timeout = Params::default().request_timeout_ns;
    let mut net = Net::new(1, 1, Params { checkpoint_interval: 64, ..params() });
    let mut held: Vec<Frame> = Vec::new();
    // Past the asks replicas make when they start.
    net.run_timers(2_000_000_000);
    net.silent = vec![0];
    net.submit(4, b"x");
    let vcs = |_: NodeId, _: NodeId, bodies: &[Kind]| bodies.iter().any(|b| matches!(b, Kind::ViewChange(_)));
    while !(1..4).all(|r| net.nodes[r].status().changing_view) {
        let next = net.nodes.iter().filter_map(|n| n.poll_timeout()).min().unwrap();
        timers(&mut net, &mut held, next, &vcs);
    }
    held.clear();
    net.restart(1);
    net.restart(2);
    assert!(net.nodes[1].status().changing_view && net.nodes[2].status().changing_view);
    // Every node up, the network reliable from now on.
    net.silent.clear();
    let until = net.now + 400 * timeout;
    timers(&mut net, &mut held, until, &|_, _, _| false);
    let status: Vec<_> = (0..4).map(|r| net.nodes[r].status()).map(|s| (s.view, s.changing_view, s.executed)).collect();
    assert_eq!(net.completed.len(), 1, "the request never completed, (view, changing, executed): {status:?}");
}

/// A replica that caught up by state transfer from f+1 matching *uncertified* checkpoint
/// states (no checkpoint was stable yet) notes how far it executed: restarted, it answers
/// no read from an older state than it answered from before (it persisted nothing of it).
#[test]
fn a_replica_restarted_after_an_uncertified_state_transfer_answers_no_older_read() {
    use crate::wire::pb::body::Kind;
    let params = Params { checkpoint_interval: 4, pipeline: 1, batch_max_count: 1, ..params() };
    let mut net = Net::new(1, 1, params);
    let mut lost: Vec<Frame> = Vec::new();
    // Past the asks replicas make when they start.
    net.run_timers(2_000_000_000);
    // Batches 1 to 4 without replica 3; checkpoint votes are lost, so no checkpoint
    // becomes stable anywhere.
    let checkpoints = |_: NodeId, _: NodeId, bodies: &[Kind]| bodies.iter().any(|b| matches!(b, Kind::Checkpoint(_)));
    let without_3 = |from: NodeId, to: NodeId, bodies: &[Kind]| to == 3 || checkpoints(from, to, bodies);
    for i in 1..=4 {
        net.submit(4, format!("op{i}").as_bytes());
        let until = net.now + UNANIMITY_WAIT;
        timers(&mut net, &mut lost, until, &without_3);
    }
    assert_eq!(net.executed[0].len(), 4);
    assert!(net.executed[3].is_empty());
    // Replica 3 was down: it starts with nothing stored and asks its peers, which answer
    // with their checkpoint 4 state, uncertified.
    net.restart(3);
    let until = net.now + 10_000_000;
    timers(&mut net, &mut lost, until, &checkpoints);
    assert!(net.restored.contains(&(3, 4)), "replica 3 took the state at 4: {:?}", net.nodes[3].status());
    assert_eq!(net.nodes[3].status().stable, 0, "no checkpoint is stable");
    assert!(net.answers_read(4, 3), "replica 3 answers reads from the state after batch 4");
    net.restart(3);
    let executed = net.nodes[3].status().executed;
    assert!(
        !net.answers_read(4, 3),
        "restarted replica 3 answers a read from the state after batch {executed}, having answered from the state \
         after batch 4 before"
    );
}

/// A faulty primary that never proposes one client's requests, while it keeps ordering
/// another client's: the backups hold the starved client's request, forward it to the
/// primary (which ignores it), and must suspect the primary — requests executing for
/// others is no progress for a request that has waited a whole timeout. (Modelled by a
/// correct primary that never hears client 5's requests: the frames to it that carry
/// them, from the client or forwarded by backups, are lost, which a faulty primary
/// ignoring them is indistinguishable from.)
#[test]
fn a_primary_that_censors_one_client_while_serving_another_is_replaced() {
    use crate::order::header;
    use crate::wire::pb::body::Kind;
    let timeout = Params::default().request_timeout_ns;
    let mut net = Net::new(1, 2, Params { checkpoint_interval: 64, ..params() });
    let mut held: Vec<Frame> = Vec::new();
    // Past the asks replicas make when they start.
    net.run_timers(2_000_000_000);
    let censored = |_: NodeId, to: NodeId, bodies: &[Kind]| {
        to == 0 && bodies.iter().any(|b| matches!(b, Kind::Requests(r) if header(&r.body).is_some_and(|(c, _)| c == 5)))
    };
    net.submit(5, b"starved");
    // Client 4 submits a request every fifth of the request timeout, for 40 timeouts.
    for i in 0..200u32 {
        net.submit(4, format!("busy {i}").as_bytes());
        let until = net.now + timeout / 5;
        timers(&mut net, &mut held, until, &censored);
        net.now = until;
    }
    let done = |c: NodeId| net.completed.iter().filter(|(id, _, _)| *id == c).count();
    assert!(done(4) >= 190, "client 4 completed {}", done(4));
    let views: Vec<u64> = (0..4).map(|r| net.nodes[r].status().view).collect();
    assert_eq!(done(5), 1, "client 5's request starved for 40 request timeouts; views {views:?}");
}

/// A faulty replica offers, as committed in catch-up, a junk batch for the slot after
/// what a correct replica executed, slot after slot while the cluster runs. The replica
/// never asked, nobody else offers the same, and the slots execute normally: the offers
/// must not stay in its memory once their slots are past (they did, one per slot, for
/// good: only a catch-up that succeeded pruned them).
#[test]
fn catch_up_offers_from_a_faulty_replica_do_not_pile_up() {
    use crate::wire::{self, pb};
    let params = Params { checkpoint_interval: 4, pipeline: 1, batch_max_count: 1, ..params() };
    let coalition = colluders(&params, &[3]);
    let mut net = Net::new(1, 1, params);
    net.silent = vec![3];
    net.run_timers(2_000_000_000);
    for i in 0..100u32 {
        let seq = net.nodes[1].status().executed + 1;
        let offer = pb::Committed { seq, batch: vec![0xab; 1_000].into() };
        let bytes = coalition.seal(3, 1, &wire::encode_body(pb::body::Kind::Committed(offer)), vec![]);
        net.input(1, Input::Message { from: 3, bytes });
        net.submit(4, format!("op{i}").as_bytes());
        net.run_timers(net.now + 1_000_000);
    }
    assert_eq!(net.nodes[1].status().executed, 100);
    let live = net.nodes[1].live_instances();
    assert!(live <= 40, "replica 1 holds {live} items after 100 slots");
}

/// f+1 faulty replicas (one more than the group tolerates, as in a compromised Perpetual
/// group) offer the same uncertified state at the last sequence number. A replica takes
/// f+1 matching offers for a correct one's; here it must at least not overflow its
/// windows (it panicked in the sweep, 4x4 seed 870): a checkpoint that far is refused.
#[test]
fn a_state_offered_at_the_last_sequence_number_is_refused() {
    use crate::wire::{self, pb};
    use prost::Message;
    let coalition = colluders(&params(), &[2, 3]);
    let mut net = Net::new(1, 1, params());
    net.submit(4, b"op");
    net.run();
    let state = pb::CheckpointState { app: vec![], clients: vec![] }.encode_to_vec();
    for from in [2, 3] {
        let offer = pb::State { seq: u64::MAX, checkpoint: None, state: state.clone().into() };
        let bytes = coalition.seal(from, 1, &wire::encode_body(pb::body::Kind::State(Box::new(offer))), vec![]);
        net.input(1, Input::Message { from, bytes });
    }
    assert_eq!(net.nodes[1].status().executed, 1);
    net.submit(4, b"op2");
    net.run();
    assert_eq!(net.nodes[1].status().executed, 2);
}

/// No CHECKPOINT vote reaches replica 3 (in the sweep, a lying replica's and those of
/// replicas that skipped the slots by state transfer were missing), so it certifies
/// nothing and its window stays at the start; it executes every slot of that window, and
/// the batch after it is beyond. The others certified the last checkpoint, and nothing
/// else moves on: the client's last request is done. Replica 3 asked for the slots after
/// what it executed, and the peers, holding no checkpoint that far, sent the committed
/// batch (beyond its window, dropped) but not the certificate it lacked; a state it had
/// executed was dropped whole (8x2 seed 7401977 stalled for good). It now asks from its
/// stable point once its window is done, and takes the certificate of a state it executed.
#[test]
fn a_replica_that_could_not_certify_its_window_takes_a_peers_certificate() {
    use crate::wire::pb::body::Kind;
    let params = Params { checkpoint_interval: 2, pipeline: 1, batch_max_count: 1, ..params() };
    let mut net = Net::new(1, 1, params);
    let mut held = Vec::new();
    let no_votes_to_3 =
        |_: NodeId, to: NodeId, bodies: &[Kind]| to == 3 && bodies.iter().any(|b| matches!(b, Kind::Checkpoint(_)));
    for i in 0..9 {
        net.submit(4, format!("op{i}").as_bytes());
        let until = net.now + 5_000_000;
        timers(&mut net, &mut held, until, &no_votes_to_3);
    }
    assert_eq!(net.nodes[0].status().stable, 8);
    assert_eq!(net.nodes[3].status().stable, 0);
    let until = net.now + 10 * Params::default().request_timeout_ns;
    timers(&mut net, &mut held, until, &no_votes_to_3);
    assert_eq!(net.nodes[3].status().executed, 9);
    assert_eq!(net.nodes[3].status().stable, 8);
}

/// How many of the records replica `replica`'s storage kept are `Prepared` ones.
fn prepared_records(net: &Net, replica: NodeId) -> usize {
    use crate::wire::pb::{ReplicaRecord, replica_record::Kind};
    use prost::Message;
    net.stored[replica as usize]
        .iter()
        .filter(|(_, r)| ReplicaRecord::decode(r.as_slice()).is_ok_and(|r| matches!(r.kind, Some(Kind::Prepared(_)))))
        .count()
}

/// With every replica's PREPARE in, a batch commits without the COMMIT round: no replica
/// persists a `Prepared` record (one fsync on a request's path, its vote's) or sends a
/// COMMIT.
#[test]
fn a_batch_every_replica_voted_for_commits_without_the_commit_round() {
    use crate::wire::pb::body::Kind;
    use std::cell::Cell;
    let mut net = Net::new(1, 1, Params { checkpoint_interval: 64, ..params() });
    net.run_timers(2_000_000_000);
    let commits = Cell::new(0);
    let count = |_: NodeId, _: NodeId, bodies: &[Kind]| {
        commits.set(commits.get() + bodies.iter().filter(|b| matches!(b, Kind::Commit(_))).count());
        false
    };
    for i in 0..3u8 {
        net.submit(4, &[b'a' + i]);
        let until = net.now + 10_000_000;
        timers(&mut net, &mut vec![], until, &count);
    }
    assert_eq!(net.completed.len(), 3);
    assert_eq!(commits.get(), 0, "COMMITs were sent");
    for r in 0..4 {
        assert_eq!(net.executed[r].len(), 3, "replica {r}");
        assert_eq!(prepared_records(&net, r as NodeId), 0, "replica {r} persisted a prepared record");
    }
}

/// A PREPARE that does not reach replica 3: it prepares on the others' but waits in vain
/// for unanimity, then takes the COMMIT round (its `Prepared` record first), and the
/// replicas that committed on unanimous PREPAREs join it, so it commits without a view
/// change.
#[test]
fn a_replica_that_missed_a_prepare_commits_on_the_commit_round_the_others_join() {
    use crate::wire::pb::body::Kind;
    let mut net = Net::new(1, 1, Params { checkpoint_interval: 64, ..params() });
    net.run_timers(2_000_000_000);
    net.submit(4, b"op");
    let lost = |from: NodeId, to: NodeId, bodies: &[Kind]| {
        (from, to) == (1, 3) && bodies.iter().any(|b| matches!(b, Kind::Prepare(_)))
    };
    let mut held = vec![];
    let until = net.now + 10_000_000;
    timers(&mut net, &mut held, until, &lost);
    assert_eq!(held.len(), 1, "one PREPARE held");
    assert_eq!(net.completed.len(), 1);
    assert_eq!(net.executed[3], net.executed[0], "replica 3 did not commit");
    assert_eq!(prepared_records(&net, 3), 1);
    for r in 0..3 {
        assert_eq!(prepared_records(&net, r), 0, "replica {r}");
    }
    for r in 0..4 {
        assert_eq!(net.nodes[r].status().view_changes, 0, "replica {r} changed view");
    }
}
