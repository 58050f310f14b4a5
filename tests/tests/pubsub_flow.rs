//! Publish/subscribe with histories (DESIGN §5.4, seed 000 §2.5 and digest §5.3 items
//! 9–11): the brokers' α flow control, the publisher's history and back-pressure, the
//! subscribers' ordering and gap filling, and live subscription updates.

mod common;

use std::collections::BTreeMap;

use common::*;
use phalanx_core::sim::NetConfig;
use phalanx_core::sim::adversary::Behavior;
use phalanx_core::sim::scenario::{Outcome, Protocol, Scenario};
use phalanx_core::wire::pb;
use phalanx_core::{Algorithm, HandleError, Input, Node, NodeId, Output, Params, Request, Role};
use prost::Message;

const ALPHA: u32 = 2;
const MS: u64 = 1_000_000;

/// What broker 0 did with one regular publication: the status it answered (if any) and
/// how many subscribers it forwarded to.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    status: Option<pb::PubStatusKind>,
    forwarded: usize,
}

const QUIET: Answer = Answer { status: None, forwarded: 2 };
const HISTORY: Answer = Answer { status: Some(pb::PubStatusKind::History), forwarded: 2 };
const BLOCKED: Answer = Answer { status: Some(pb::PubStatusKind::Blocked), forwarded: 0 };

/// With α = 2, publications 1..=6 without a history: HISTORY on the α-th, BLOCKED from
/// the (2α+1)-th.
const WITHOUT_HISTORY: [Answer; 6] = [QUIET, HISTORY, QUIET, QUIET, BLOCKED, BLOCKED];

/// Feeds broker 0 the publisher's AB SEND of (topic, seq). The real publisher stops at 2α,
/// so the publications are built with its keys.
fn offer(broker: &mut Node, publisher: &Forger, topic: u64, seq: u64) -> Answer {
    let body =
        publication(PUBLISHER, topic, seq, Algorithm::Ab, pb::Step::Send, false, format!("{topic}/{seq}").into());
    let outs = feed(broker, 0, PUBLISHER, &publisher.frame(0, &body));
    let st = statuses(&outs);
    assert!(st.len() <= 1, "one status at most per publication: {st:?}");
    for (to, s) in &st {
        assert_eq!(
            (*to, s.topic, s.seq),
            (PUBLISHER, topic, seq),
            "status goes to the publisher and names the publication"
        );
    }
    let forwarded = publications(&outs)
        .iter()
        .filter(|(to, p)| {
            SUBSCRIBERS.contains(to) && p.step == pb::Step::Send as i32 && (p.topic, p.seq) == (topic, seq)
        })
        .count();
    Answer { status: st.first().map(|(_, s)| s.kind()), forwarded }
}

/// Feeds broker 0 the publisher's history SEND number `hseq` on `topic`; the broker must
/// echo it to the other brokers and answer nothing.
fn send_history(broker: &mut Node, publisher: &Forger, topic: u64, hseq: u64, entries: &[u64]) {
    let history = pb::History {
        entries: entries
            .iter()
            .map(|&seq| pb::HistoryEntry { seq, payload: format!("{topic}/{seq}").into_bytes().into() })
            .collect(),
    };
    let body = publication(PUBLISHER, topic, hseq, Algorithm::Bracha, pb::Step::Send, true, history.encode_to_vec());
    let outs = feed(broker, 0, PUBLISHER, &publisher.frame(0, &body));
    assert!(statuses(&outs).is_empty());
    let echoed: Vec<NodeId> = publications(&outs)
        .iter()
        .filter(|(_, p)| p.step == pb::Step::Echo as i32 && p.history && p.seq == hseq)
        .map(|(to, _)| *to)
        .collect();
    assert_eq!(echoed, [1, 2, 3], "the history is echoed to the other brokers");
}

#[test]
fn broker_answers_history_at_alpha_blocks_at_two_alpha_and_resets_on_a_history() {
    let cfgs = cluster(params(ALPHA), vec![0]);
    let (mut broker, publisher) = (node(&cfgs, 0), Forger::new(&cfgs[PUBLISHER as usize]));
    let answers: Vec<Answer> = (1..=6).map(|seq| offer(&mut broker, &publisher, 0, seq)).collect();
    assert_eq!(answers, WITHOUT_HISTORY);

    // The history resets the count on receipt of the SEND: the next publications are
    // forwarded again and the α-th after it asks for the next history.
    send_history(&mut broker, &publisher, 0, 1, &[1, 2, 3, 4, 5, 6]);
    let answers: Vec<Answer> = (7..=12).map(|seq| offer(&mut broker, &publisher, 0, seq)).collect();
    assert_eq!(answers, WITHOUT_HISTORY);
}

#[test]
fn alpha_counters_of_four_topics_are_independent() {
    let cfgs = cluster(params(ALPHA), vec![0, 1, 2, 3]);
    let (mut broker, publisher) = (node(&cfgs, 0), Forger::new(&cfgs[PUBLISHER as usize]));
    // Interleaved: if the count were per publisher, topic 0's second publication would
    // already be the 5th and BLOCKED.
    let mut answers: BTreeMap<u64, Vec<Answer>> = BTreeMap::new();
    for seq in 1..=6 {
        for topic in 0..4 {
            answers.entry(topic).or_default().push(offer(&mut broker, &publisher, topic, seq));
        }
    }
    for (topic, a) in &answers {
        assert_eq!(a, &WITHOUT_HISTORY, "topic {topic}");
    }
    // A history on topic 2 unblocks topic 2 only.
    send_history(&mut broker, &publisher, 2, 1, &[1, 2, 3, 4]);
    for topic in 0..4 {
        let expect = if topic == 2 { QUIET } else { BLOCKED };
        assert_eq!(offer(&mut broker, &publisher, topic, 7), expect, "topic {topic}");
    }
}

/// Routes a publisher's frames to the real brokers and returns, per broker, the status
/// frames they answered.
fn broker_answers(brokers: &mut [Node], outs: &[Output]) -> Vec<(NodeId, Vec<u8>)> {
    let mut answers = Vec::new();
    for o in outs {
        if let Output::Send { to, bytes } = o {
            for out in feed(&mut brokers[*to as usize], 0, PUBLISHER, bytes) {
                if let Output::Send { to: PUBLISHER, bytes } = out {
                    answers.push((*to, bytes));
                }
            }
        }
    }
    answers
}

/// A history publication as sent: (broker, history seq, entries as (seq, payload)).
type SentHistory = (NodeId, u64, Vec<(u64, Vec<u8>)>);

/// The history publications in a publisher's outputs.
fn histories_sent(outs: &[Output]) -> Vec<SentHistory> {
    publications(outs)
        .into_iter()
        .filter(|(_, p)| p.history)
        .map(|(to, p)| {
            assert_eq!((p.algorithm(), p.step()), (pb::Algorithm::Bracha, pb::Step::Send), "histories go over Bracha");
            let h = pb::History::decode(&p.payload[..]).expect("a history payload is a History");
            (to, p.seq, h.entries.into_iter().map(|e| (e.seq, e.payload.to_vec())).collect())
        })
        .collect()
}

/// Asserts `outs` holds exactly one history, sent to every broker.
fn assert_history(outs: &[Output], hseq: u64, entries: &[(u64, &[u8])]) {
    let sent = histories_sent(outs);
    let want: Vec<(u64, Vec<u8>)> = entries.iter().map(|(s, p)| (*s, p.to_vec())).collect();
    assert_eq!(sent.iter().map(|h| h.0).collect::<Vec<_>>(), BROKERS, "one history to every broker: {sent:?}");
    for (_, seq, e) in &sent {
        assert_eq!((*seq, e), (hseq, &want));
    }
}

#[test]
fn publisher_sends_its_history_on_f_plus_one_history_answers_not_f() {
    let cfgs = cluster(params(ALPHA), vec![0]);
    let mut publisher = node(&cfgs, PUBLISHER);
    let mut brokers: Vec<Node> = BROKERS.iter().map(|&b| node(&cfgs, b)).collect();
    let answers = window(&mut publisher, &mut brokers, 0, [b"a", b"b"], 2);
    // f = 1 answers, even repeated, are not enough.
    for _ in 0..3 {
        assert!(histories_sent(&feed(&mut publisher, 0, answers[0].0, &answers[0].1)).is_empty());
    }
    let outs = feed(&mut publisher, 0, answers[1].0, &answers[1].1);
    assert_history(&outs, 1, &[(1, b"a"), (2, b"b")]);
    assert!(broker_answers(&mut brokers, &outs).is_empty(), "the brokers take the history and reset");
    // Late answers for a window already covered change nothing.
    assert!(drain_after(&mut publisher, &answers[2..]).is_empty());

    // The next window gets history 2 with only the new entries; topic 1 counts from 1.
    let answers = window(&mut publisher, &mut brokers, 0, [b"c", b"d"], 4);
    assert!(histories_sent(&feed(&mut publisher, 0, answers[3].0, &answers[3].1)).is_empty());
    assert_history(&feed(&mut publisher, 0, answers[0].0, &answers[0].1), 2, &[(3, b"c"), (4, b"d")]);
    let answers = window(&mut publisher, &mut brokers, 1, [b"x", b"y"], 2);
    assert_history(&drain_after(&mut publisher, &answers[..2]), 1, &[(1, b"x"), (2, b"y")]);
}

/// Publishes two AB publications (one α-window) on `topic` through real brokers and
/// returns their HISTORY answers, one per broker.
fn window(
    publisher: &mut Node,
    brokers: &mut [Node],
    topic: u64,
    payloads: [&[u8]; 2],
    last_seq: u64,
) -> Vec<(NodeId, Vec<u8>)> {
    let mut answers = Vec::new();
    for p in payloads {
        let outs = request(publisher, 0, publish(topic, p, Algorithm::Ab)).unwrap();
        answers.extend(broker_answers(brokers, &outs));
    }
    assert_eq!(answers.iter().map(|a| a.0).collect::<Vec<_>>(), BROKERS, "every broker asks once, at α");
    for (_, bytes) in &answers {
        assert_eq!(body_of(bytes), status(pb::PubStatusKind::History, topic, last_seq));
    }
    answers
}

fn drain_after(node: &mut Node, frames: &[(NodeId, Vec<u8>)]) -> Vec<Output> {
    frames.iter().flat_map(|(from, bytes)| feed(node, 0, *from, bytes)).collect()
}

#[test]
fn publisher_flushes_a_partial_history_at_its_deadline() {
    let flush = 50 * MS;
    let cfgs = cluster(Params { alpha: ALPHA, history_flush_ns: flush, ..Params::default() }, vec![0]);
    let mut publisher = node(&cfgs, PUBLISHER);
    let mut brokers: Vec<Node> = BROKERS.iter().map(|&b| node(&cfgs, b)).collect();
    assert_eq!(publisher.poll_timeout(), None);

    let t0 = 1_000;
    let outs = request(&mut publisher, t0, publish(0, b"a", Algorithm::Ab)).unwrap();
    assert!(broker_answers(&mut brokers, &outs).is_empty(), "no broker asks before α");
    assert_eq!(publisher.poll_timeout(), Some(t0 + flush), "the deadline runs from the first unflushed publication");
    let outs = request(&mut publisher, t0 + MS, publish(0, b"b", Algorithm::Ab)).unwrap();
    let answers = broker_answers(&mut brokers, &outs);
    assert_eq!(publisher.poll_timeout(), Some(t0 + flush));
    // Only f brokers' answers arrive.
    assert!(histories_sent(&drain_after(&mut publisher, &answers[..F])).is_empty());

    publisher.handle(t0 + flush - 1, Input::Timeout).unwrap();
    assert!(drain(&mut publisher).is_empty(), "nothing is due before the deadline");
    publisher.handle(t0 + flush, Input::Timeout).unwrap();
    assert_history(&drain(&mut publisher), 1, &[(1, b"a"), (2, b"b")]);
    assert_eq!(publisher.poll_timeout(), None, "nothing left to flush");

    let t1 = t0 + 2 * flush;
    request(&mut publisher, t1, publish(0, b"c", Algorithm::Ab)).unwrap();
    assert_eq!(publisher.poll_timeout(), Some(t1 + flush));
    publisher.handle(t1 + flush, Input::Timeout).unwrap();
    assert_history(&drain(&mut publisher), 2, &[(3, b"c")]);
}

#[test]
fn publisher_holds_publications_at_two_alpha_and_refuses_when_its_queue_is_full() {
    let cfgs = cluster(Params { alpha: ALPHA, publish_queue: 3, ..Params::default() }, vec![0]);
    let mut publisher = node(&cfgs, PUBLISHER);
    let mut brokers: Vec<Node> = BROKERS.iter().map(|&b| node(&cfgs, b)).collect();
    let mut answers = Vec::new();
    for i in 1..=2 * ALPHA as u64 {
        let outs = request(&mut publisher, 0, publish(0, format!("p{i}").as_bytes(), Algorithm::Ab)).unwrap();
        assert_eq!(publications(&outs).len(), BROKERS.len(), "publication {i} goes out");
        answers.extend(broker_answers(&mut brokers, &outs));
    }
    for i in 5..=7 {
        let outs = request(&mut publisher, 0, publish(0, format!("p{i}").as_bytes(), Algorithm::Ab)).unwrap();
        assert!(outs.is_empty(), "publication {i} is held back: {outs:?}");
    }
    assert_eq!(request(&mut publisher, 0, publish(0, b"p8", Algorithm::Ab)), Err(HandleError::Backpressure));
    // Another topic has its own budget.
    assert_eq!(publications(&request(&mut publisher, 0, publish(1, b"t1", Algorithm::Ab)).unwrap()).len(), 4);

    // f+1 HISTORY answers: the history goes out, then the held publications, numbered on.
    let outs = drain_after(&mut publisher, &answers[..F + 1]);
    let sent: Vec<(bool, u64, Vec<u8>)> = publications(&outs)
        .into_iter()
        .filter(|(to, _)| *to == 0)
        .map(|(_, p)| (p.history, p.seq, p.payload.to_vec()))
        .collect();
    assert_eq!(sent.len(), 4, "{sent:?}");
    assert_eq!((sent[0].0, sent[0].1), (true, 1));
    let released: Vec<(bool, u64, Vec<u8>)> = (5..=7).map(|i| (false, i, format!("p{i}").into_bytes())).collect();
    assert_eq!(sent[1..], released[..]);
    assert!(request(&mut publisher, 0, publish(0, b"p9", Algorithm::Ab)).is_ok(), "room in the queue again");
}

/// For every subscriber, the deliveries of each publisher in the order they came.
fn per_publisher(outcome: &Outcome) -> BTreeMap<(NodeId, NodeId), Vec<(u64, bool)>> {
    let mut seen: BTreeMap<(NodeId, NodeId), Vec<(u64, bool)>> = BTreeMap::new();
    for o in &outcome.log.deliveries {
        seen.entry((o.node, o.delivery.publisher)).or_default().push((o.delivery.seq, o.delivery.from_history));
    }
    seen
}

fn seqs(v: &[(u64, bool)]) -> Vec<u64> {
    v.iter().map(|d| d.0).collect()
}

#[test]
fn subscribers_deliver_in_per_publisher_seq_order_over_a_reordering_network() {
    // Publications every 0.1 ms over links of 0.05..10 ms latency: copies overtake.
    let run = |alpha| {
        let mut s = Scenario::new(Protocol::Ab, 1, 11);
        s.alpha = alpha;
        s.publishers = 2;
        s.publisher_behaviors = vec![Behavior::Correct; 2];
        s.publications = 12;
        s.interval = MS / 10;
        s.net = NetConfig { min_latency: MS / 20, max_latency: 10 * MS, ..NetConfig::default() };
        let outcome = s.run();
        assert!(outcome.violations.is_empty(), "{:?}", outcome.violations);
        per_publisher(&outcome)
    };
    let in_order: Vec<u64> = (1..=12).collect();
    // Control: without histories (α = 0) deliveries follow arrival, so the network does reorder.
    let unordered = run(0);
    assert!(unordered.values().any(|d| seqs(d) != in_order), "the network never reordered: the test proves nothing");
    let ordered = run(4);
    assert_eq!(ordered.len(), 4, "2 subscribers x 2 publishers");
    for (key, d) in &ordered {
        assert_eq!(seqs(d), in_order, "(subscriber, publisher) {key:?}");
    }
}

#[test]
fn publications_missed_on_the_fast_path_come_from_histories_exactly_once() {
    // Seed 000 §7.3.4: the publisher ignores broker 3 and broker 0 drops what it sends
    // to subscriber 5, so subscriber 5 sees 2 < 2f+1 AB copies of every publication.
    let mut s = Scenario::new(Protocol::Ab, 1, 3);
    s.alpha = 4;
    s.publications = 10; // two full windows and a partial one, flushed on the timer
    s.publisher_behaviors = vec![Behavior::DropTo(vec![3])];
    s.brokers[0] = Behavior::DropTo(vec![SUB_A]);
    let outcome = s.run();
    assert!(outcome.violations.is_empty(), "{:?}", outcome.violations);
    let got = per_publisher(&outcome);
    let all: Vec<u64> = (1..=10).collect();
    let a = &got[&(SUB_A, PUBLISHER)];
    assert_eq!(seqs(a), all, "subscriber 5 gets every publication once, in order");
    assert!(a.iter().all(|d| d.1), "subscriber 5 can only learn them from histories: {a:?}");
    // Subscriber 6 got the same histories too but delivers nothing twice.
    let b = &got[&(SUB_B, PUBLISHER)];
    assert_eq!(seqs(b), all);
    assert!(b.iter().all(|d| !d.1), "subscriber 6 had every publication from the fast path first: {b:?}");
}

#[test]
fn a_subscription_update_mid_stream_changes_what_is_delivered() {
    let cfgs = cluster(params(ALPHA), vec![0]);
    let mut net = Net::new(&cfgs);
    let publish_both = |net: &mut Net, round: u64| {
        for topic in [0, 1] {
            net.request(PUBLISHER, publish(topic, format!("{topic}/{round}").as_bytes(), Algorithm::Ab)).unwrap();
        }
        net.run();
    };
    publish_both(&mut net, 1);
    assert_eq!(net.delivered_at(SUB_A), [(0, 1, false)]);

    net.request(SUB_A, Request::Subscribe { topics: vec![1] }).unwrap();
    net.run();
    publish_both(&mut net, 2);
    // A topic followed at runtime starts at the first publication delivered on it: seq 2,
    // from the fast path. Seq 1, published before the join, arrives later in topic 1's
    // first history and is not delivered out of order. Topic 0 no longer reaches it.
    assert_eq!(net.delivered_at(SUB_A), [(0, 1, false), (1, 2, false)]);
    let b: Vec<(u64, u64)> = net.delivered_at(SUB_B).iter().map(|d| (d.0, d.1)).collect();
    assert_eq!(b, [(0, 1), (0, 2)], "subscriber 6 still follows topic 0 only");
    assert!(net.faults.is_empty(), "{:?}", net.faults);
}

#[test]
fn a_subscriber_joining_a_busy_topic_delivers_what_is_published_after_it_joins() {
    let cfgs = cluster(Params { alpha: ALPHA, window: 4 * ALPHA, ..Params::default() }, vec![0]);
    let mut net = Net::new(&cfgs);
    let publish_on_1 = |net: &mut Net, seqs: std::ops::RangeInclusive<u64>| {
        for seq in seqs {
            net.request(PUBLISHER, publish(1, format!("1/{seq}").as_bytes(), Algorithm::Ab)).unwrap();
            net.run();
        }
    };
    // Topic 1 runs well past one window (and its histories) before subscriber 5 joins.
    publish_on_1(&mut net, 1..=20);
    net.request(SUB_A, Request::Subscribe { topics: vec![0, 1] }).unwrap();
    net.run();
    publish_on_1(&mut net, 21..=24);
    // A topic joined at runtime starts at the first publication delivered after the join
    // (a history may bring a few earlier ones): contiguous, in order, through 24.
    let got: Vec<u64> = net.delivered_at(SUB_A).iter().filter(|d| d.0 == 1).map(|d| d.1).collect();
    let first = *got.first().expect("the new subscriber delivers on topic 1");
    assert!(first <= 21, "validity: every publication after the join reaches the new subscriber: {got:?}");
    assert_eq!(got, (first..=24).collect::<Vec<_>>());
}

#[test]
fn requests_for_another_role_are_wrong_role_errors() {
    let cfgs = cluster(params(ALPHA), vec![0]);
    let cases = [
        (SUB_A, publish(0, b"x", Algorithm::Ab), Role::Subscriber, "publish"),
        (0, publish(0, b"x", Algorithm::Ab), Role::Broker, "publish"),
        (0, Request::Subscribe { topics: vec![1] }, Role::Broker, "subscribe"),
        (PUBLISHER, Request::Subscribe { topics: vec![1] }, Role::Publisher, "subscribe"),
    ];
    for (id, req, role, name) in cases {
        let mut n = node(&cfgs, id);
        assert_eq!(n.handle(0, Input::Request(req)), Err(HandleError::WrongRole { role, request: name }));
        assert!(drain(&mut n).is_empty(), "a refused request has no effect");
    }
}

#[test]
fn a_publisher_using_bracha_is_not_throttled_to_the_flush_timer() {
    // DESIGN §5.4: every α publications of a (publisher, topic), whatever their
    // algorithm, brokers ask for a history. The publisher counts Bracha publications
    // toward its 2α budget, so the brokers must count them too, or the publisher stalls
    // until `history_flush_ns` every 2α publications.
    let cfgs = cluster(params(ALPHA), vec![0]);
    let mut net = Net::new(&cfgs);
    for i in 0..3 * ALPHA {
        net.request(PUBLISHER, publish(0, format!("p{i}").as_bytes(), Algorithm::Bracha)).unwrap();
        net.run();
    }
    let delivered: Vec<u64> = net.delivered_at(SUB_A).iter().map(|d| d.1).collect();
    assert_eq!(delivered, (1..=3 * ALPHA as u64).collect::<Vec<_>>(), "all delivered with no timeout");
}

/// Finding 9 of issue 15, at one broker: the publisher's first word on an instance binds
/// it. Broker 0 relays the AB SEND, refuses the same seq's Bracha SEND as the publisher's
/// equivocation (no ECHO), yet on f+1 READYs for the Bracha payload sends its own READY
/// to brokers and subscribers: without that a subscriber could miss a Bracha delivery
/// that another made (totality).
#[test]
fn a_broker_relays_one_algorithm_per_instance_and_still_amplifies_readies() {
    let cfgs = cluster(params(0), vec![0]);
    let mut broker = node(&cfgs, 0);
    let publisher = Forger::new(&cfgs[PUBLISHER as usize]);
    let send = |alg, payload: &[u8]| publication(PUBLISHER, 0, 1, alg, pb::Step::Send, false, payload.to_vec());
    let outs = feed(&mut broker, 0, PUBLISHER, &publisher.frame(0, &send(Algorithm::Ab, b"x")));
    let relayed: Vec<NodeId> = publications(&outs).into_iter().map(|(to, _)| to).collect();
    assert_eq!(relayed, SUBSCRIBERS);
    let outs = feed(&mut broker, 0, PUBLISHER, &publisher.frame(0, &send(Algorithm::Bracha, b"y")));
    assert_eq!(faults(&outs), [(PUBLISHER, phalanx_core::FaultKind::Equivocation)]);
    assert!(publications(&outs).is_empty(), "no ECHO for a second algorithm");
    // A replayed AB SEND is a duplicate, not a second relay.
    assert!(feed(&mut broker, 0, PUBLISHER, &publisher.frame(0, &send(Algorithm::Ab, b"x"))).is_empty());
    let ready = |b: NodeId| {
        let body = publication(PUBLISHER, 0, 1, Algorithm::Bracha, pb::Step::Ready, false, b"y".to_vec());
        Forger::new(&cfgs[b as usize]).frame(0, &body)
    };
    assert!(feed(&mut broker, 0, 1, &ready(1)).is_empty());
    let readies: Vec<NodeId> = publications(&feed(&mut broker, 0, 2, &ready(2)))
        .into_iter()
        .filter(|(_, p)| p.step() == pb::Step::Ready && p.payload[..] == b"y"[..])
        .map(|(to, _)| to)
        .collect();
    assert_eq!(readies, [1, 2, 3, SUB_A, SUB_B]);
    assert_eq!(broker.stats().stale, 1);
}
