//! Bounded state and total decoding (DESIGN §2 rule 5): whatever peers send — floods of
//! distinct instances, too many topics, replays, garbage — memory stays within the
//! documented bounds, and bad bytes become `Output::Fault` evidence, never a panic.

mod common;

use std::collections::BTreeMap;

use common::*;
use phalanx_core::crypto::{CryptoMode, pairwise_mac_key};
use phalanx_core::wire::{self, Keyring, pb};
use phalanx_core::{
    Algorithm, ClusterSpec, FaultKind, HandleError, Node, NodeConfig, NodeId, Output, Params, generate_cluster,
};
use prost::Message;

fn pub_body(topic: u64, seq: u64, alg: Algorithm, step: pb::Step, payload: &[u8]) -> pb::body::Kind {
    publication(PUBLISHER, topic, seq, alg, step, false, payload.to_vec())
}

#[test]
fn a_byzantine_broker_flooding_echoes_stays_in_the_window_and_cannot_move_it() {
    let cfgs = cluster(Params::default(), vec![0]);
    let window = cfgs[0].cluster.params.window as usize;
    let mut broker = node(&cfgs, 0);
    let byzantine = Forger::new(&cfgs[3]);
    // 100,000 authentic ECHOes from broker 3, each for a distinct seq of the publisher's
    // stream, none of which the publisher sent. Seq 1 is left for the real publication.
    const FLOOD: u64 = 100_000;
    for seq in 2..=FLOOD + 1 {
        let body = pub_body(0, seq, Algorithm::Bracha, pb::Step::Echo, &seq.to_le_bytes());
        let outs = feed(&mut broker, 0, 3, &byzantine.frame(0, &body));
        assert!(outs.is_empty(), "one ECHO triggers nothing: {outs:?}");
    }
    // Seqs 2..=window sit in the window; the rest are dropped as beyond it.
    assert_eq!(broker.live_instances(), window - 1);
    assert_eq!(broker.stats().beyond_window, FLOOD - (window as u64 - 1));

    // The window did not move: the publisher's real seq 1 is still taken and echoed.
    let mut publisher = node(&cfgs, PUBLISHER);
    let outs = request(&mut publisher, 0, publish(0, b"genuine", Algorithm::Bracha)).unwrap();
    let frame = outs
        .iter()
        .find_map(|o| match o {
            Output::Send { to: 0, bytes } => Some(bytes.clone()),
            _ => None,
        })
        .expect("the publisher sends to broker 0");
    let echoes: Vec<NodeId> = publications(&feed(&mut broker, 0, PUBLISHER, &frame))
        .into_iter()
        .filter(|(_, p)| p.step() == pb::Step::Echo && p.seq == 1 && p.payload[..] == b"genuine"[..])
        .map(|(to, _)| to)
        .collect();
    assert_eq!(echoes, [1, 2, 3]);
    assert!(broker.live_instances() <= window);
    assert_eq!(broker.stats().stale, 0);
}

#[test]
fn f_plus_one_brokers_vouching_slide_a_lagging_subscriber_window() {
    let cfgs = cluster(Params { window: 8, ..Params::default() }, vec![0]);
    let mut sub = node(&cfgs, SUB_A);
    let brokers: Vec<Forger> = BROKERS.iter().map(|&b| Forger::new(&cfgs[b as usize])).collect();
    let forward = |sub: &mut Node, b: NodeId, seq: u64| {
        let body = pub_body(0, seq, Algorithm::Ab, pb::Step::Send, format!("p{seq}").as_bytes());
        feed(sub, 0, b, &brokers[b as usize].frame(SUB_A, &body))
    };
    // Seq 1 never completes (one copy), pinning the window's low end at 1.
    assert!(forward(&mut sub, 0, 1).is_empty());
    // One broker alone, even flooding far-ahead seqs, moves nothing.
    for seq in 100..1_000 {
        assert!(forward(&mut sub, 0, seq).is_empty());
    }
    assert_eq!(sub.stats().beyond_window, 900);
    // A second broker (f+1) vouches for 100: the window slides so 100 is its last slot.
    assert!(forward(&mut sub, 1, 100).is_empty());
    assert!(forward(&mut sub, 2, 100).is_empty());
    let outs = forward(&mut sub, 3, 100);
    // Broker 0's copy came before the slide and was dropped; 1, 2, 3 make 2f+1.
    let got: Vec<(u64, Vec<u8>)> = deliveries(&outs).into_iter().map(|d| (d.seq, d.payload)).collect();
    assert_eq!(got, [(100, b"p100".to_vec())]);
    // Seq 1 was abandoned below the window: a late copy is stale, not a new instance.
    assert_eq!(sub.stats().stale, 0);
    assert!(forward(&mut sub, 1, 1).is_empty());
    assert_eq!(sub.stats().stale, 1);
    assert!(sub.live_instances() <= 8);
}

/// Runs `net` and checks every broker and subscriber against `bound`; returns the
/// largest live count seen per node.
fn check_bounded(net: &mut Net, bound: usize, peak: &mut BTreeMap<NodeId, usize>) {
    net.run();
    for id in BROKERS.into_iter().chain(SUBSCRIBERS) {
        let live = net.nodes[id as usize].live_instances();
        assert!(live <= bound, "node {id}: {live} live instances, bound {bound}");
        let p = peak.entry(id).or_default();
        *p = (*p).max(live);
    }
}

#[test]
fn a_byzantine_publisher_flooding_its_own_stream_stays_bounded() {
    let cfgs = cluster(Params { window: 16, ..Params::default() }, vec![0]);
    let window = 16;
    let mut net = Net::new(&cfgs);
    let publisher = Forger::new(&cfgs[PUBLISHER as usize]);
    let mut peak = BTreeMap::new();
    // Every publication goes to brokers 0 and 1 only, so none ever completes anywhere:
    // Bracha ones gather 2 < 3 ECHOes at every broker, AB ones 2 < 3 copies at subscribers.
    for seq in 1..=2_000 {
        let alg = if seq % 2 == 1 { Algorithm::Bracha } else { Algorithm::Ab };
        let body = pub_body(0, seq, alg, pb::Step::Send, &seq.to_le_bytes());
        for b in [0, 1] {
            net.inject(PUBLISHER, b, publisher.frame(b, &body));
        }
        check_bounded(&mut net, window, &mut peak);
    }
    // The flood did pile up state (the window is what stopped it).
    for (id, p) in &peak {
        assert!(*p >= window / 2, "node {id} peaked at {p}: the flood never reached it");
    }
    assert!(net.delivered.is_empty());
}

#[test]
fn byzantine_histories_keep_pending_publications_bounded() {
    let window = 8;
    let cfgs = cluster(Params { alpha: 2, window, ..Params::default() }, vec![0]);
    let mut net = Net::new(&cfgs);
    let publisher = Forger::new(&cfgs[PUBLISHER as usize]);
    let mut peak = BTreeMap::new();
    // Genuine-looking histories (complete Bracha through every broker) that never carry
    // seq 1: subscribers can deliver nothing and must hold what fits in the window only.
    for h in 1..=50u64 {
        let entries = (h + 1..=h + 40).map(|seq| pb::HistoryEntry { seq, payload: seq.to_le_bytes().to_vec().into() });
        let body = publication(
            PUBLISHER,
            0,
            h,
            Algorithm::Bracha,
            pb::Step::Send,
            true,
            pb::History { entries: entries.collect() }.encode_to_vec(),
        );
        for b in BROKERS {
            net.inject(PUBLISHER, b, publisher.frame(b, &body));
        }
        check_bounded(&mut net, window as usize, &mut peak);
    }
    assert!(net.delivered.is_empty(), "nothing is deliverable without seq 1");
    for s in SUBSCRIBERS {
        assert!(peak[&s] > 0, "subscriber {s} held nothing pending: the histories never arrived");
    }
}

#[test]
fn a_publisher_with_too_many_topics_is_refused_as_too_many_streams() {
    let max = 4u32;
    let params = Params { window: 8, max_topics_per_publisher: max, ..Params::default() };
    let cfgs = cluster(params, (0..50).collect());
    let publisher = Forger::new(&cfgs[PUBLISHER as usize]);

    // The real publisher refuses locally.
    let mut real = node(&cfgs, PUBLISHER);
    for topic in 0..max as u64 {
        request(&mut real, 0, publish(topic, b"x", Algorithm::Ab)).unwrap();
    }
    assert!(matches!(request(&mut real, 0, publish(99, b"x", Algorithm::Ab)), Err(HandleError::Invalid(_))));

    // A Byzantine one at a broker: Bracha instances on 50 topics, 3 seqs each.
    let mut broker = node(&cfgs, 0);
    let mut refused = 0;
    for topic in 0..50 {
        for seq in 1..=3 {
            let body = pub_body(topic, seq, Algorithm::Bracha, pb::Step::Send, b"x");
            let outs = feed(&mut broker, 0, PUBLISHER, &publisher.frame(0, &body));
            if topic < max as u64 {
                assert_eq!(publications(&outs).len(), 3, "echoed on an admitted topic");
            } else {
                assert_eq!(faults(&outs), [(PUBLISHER, FaultKind::TooManyStreams)]);
                assert_eq!(outs.len(), 1);
                refused += 1;
            }
        }
    }
    assert_eq!(refused, (50 - max as usize) * 3);
    assert_eq!(broker.live_instances(), max as usize * 3);

    // At a subscriber, only followed topics open streams: its subscriptions bound them.
    // It follows 50 topics; relays on 50 more open nothing.
    let mut sub = node(&cfgs, SUB_A);
    let relay = Forger::new(&cfgs[1]);
    for topic in 0..100 {
        let body = pub_body(topic, 1, Algorithm::Ab, pb::Step::Send, b"x");
        assert!(feed(&mut sub, 0, 1, &relay.frame(SUB_A, &body)).is_empty());
    }
    assert_eq!(sub.stats().unsubscribed, 50);
    assert_eq!(sub.live_instances(), 50);
}

#[test]
fn a_byzantine_broker_cannot_use_up_a_correct_publishers_stream_budget() {
    let max = 4u32;
    let params = Params { window: 8, max_topics_per_publisher: max, ..Params::default() };
    let cfgs = cluster(params, (0..50).collect());
    let mut net = Net::new(&cfgs);
    let byzantine = Forger::new(&cfgs[3]);
    // Broker 3 fills the correct publisher's stream budget at every correct node with
    // bogus topics: max at brokers, 2 * max at subscribers (their cap per publisher).
    for topic in 10..10 + 2 * max as u64 {
        if topic < 10 + max as u64 {
            let echo = pub_body(topic, 1, Algorithm::Bracha, pb::Step::Echo, b"bogus");
            for b in [0, 1, 2] {
                net.inject(3, b, byzantine.frame(b, &echo));
            }
        }
        let forward = pub_body(topic, 1, Algorithm::Ab, pb::Step::Send, b"bogus");
        for s in SUBSCRIBERS {
            net.inject(3, s, byzantine.frame(s, &forward));
        }
    }
    net.run();
    net.faults.clear();
    // The correct publisher uses one topic: well within its budget.
    net.request(PUBLISHER, publish(0, b"genuine", Algorithm::Ab)).unwrap();
    net.run();
    let refused: Vec<_> = net.faults.iter().filter(|f| f.2 == FaultKind::TooManyStreams).collect();
    assert!(refused.is_empty(), "the correct publisher was refused: {refused:?}");
    for s in SUBSCRIBERS {
        assert_eq!(net.delivered_at(s), [(0, 1, false)], "subscriber {s}");
    }
}

/// Feeds the same frame `times` times and returns every output.
fn replay(node: &mut Node, from: NodeId, frame: &[u8], times: usize) -> Vec<Output> {
    (0..times).flat_map(|_| feed(node, 0, from, frame)).collect()
}

#[test]
fn replayed_frames_at_a_broker_are_stale_and_do_not_count_toward_alpha() {
    let cfgs = cluster(params(2), vec![0]);
    let mut broker = node(&cfgs, 0);
    let publisher = Forger::new(&cfgs[PUBLISHER as usize]);
    let send = |seq: u64| publisher.frame(0, &pub_body(0, seq, Algorithm::Ab, pb::Step::Send, b"x"));
    let status_of = |outs: &[Output]| statuses(outs).into_iter().map(|(_, s)| s.kind()).collect::<Vec<_>>();

    assert_eq!(publications(&feed(&mut broker, 0, PUBLISHER, &send(1))).len(), 2, "forwarded to both subscribers");
    assert!(replay(&mut broker, PUBLISHER, &send(1), 1_000).is_empty());
    assert_eq!(broker.stats().stale, 1_000);
    // Had the replays counted, seq 2 would be BLOCKED instead of the α-th.
    assert_eq!(status_of(&feed(&mut broker, 0, PUBLISHER, &send(2))), [pb::PubStatusKind::History]);

    // A replayed history resets the count once only.
    let history = publisher.frame(0, &publication(PUBLISHER, 0, 1, Algorithm::Bracha, pb::Step::Send, true, vec![]));
    assert_eq!(publications(&feed(&mut broker, 0, PUBLISHER, &history)).len(), 3, "echoed");
    for seq in 3..=6 {
        feed(&mut broker, 0, PUBLISHER, &send(seq));
    }
    assert!(replay(&mut broker, PUBLISHER, &history, 1_000).is_empty());
    assert_eq!(status_of(&feed(&mut broker, 0, PUBLISHER, &send(7))), [pb::PubStatusKind::Blocked]);

    // A broker's ECHO replayed counts once: no READY until a second broker echoes.
    // (On topic 1: topic 0 is blocked, and Bracha publications count toward α too.)
    let bracha = |seq| pub_body(1, seq, Algorithm::Bracha, pb::Step::Send, b"b");
    let echo = |from: NodeId| {
        Forger::new(&cfgs[from as usize]).frame(0, &pub_body(1, 100, Algorithm::Bracha, pb::Step::Echo, b"b"))
    };
    feed(&mut broker, 0, PUBLISHER, &publisher.frame(0, &bracha(100)));
    assert!(replay(&mut broker, 1, &echo(1), 1_000).is_empty());
    let readies = publications(&feed(&mut broker, 0, 2, &echo(2)));
    // READY to the three other brokers; no subscriber follows topic 1.
    assert!(readies.iter().all(|(_, p)| p.step() == pb::Step::Ready) && readies.len() == 3, "{readies:?}");
}

#[test]
fn replayed_frames_at_a_subscriber_deliver_once_and_count_as_stale() {
    let cfgs = cluster(Params::default(), vec![0]);
    let mut sub = node(&cfgs, SUB_A);
    let forward =
        |b: NodeId| Forger::new(&cfgs[b as usize]).frame(SUB_A, &pub_body(0, 1, Algorithm::Ab, pb::Step::Send, b"x"));
    // Before delivery a repeated copy is a duplicate vote: it neither counts nor is stale.
    assert!(replay(&mut sub, 0, &forward(0), 1_000).is_empty());
    assert_eq!(sub.stats().stale, 0);
    assert!(feed(&mut sub, 0, 1, &forward(1)).is_empty());
    assert_eq!(deliveries(&feed(&mut sub, 0, 2, &forward(2))).len(), 1);
    assert!(feed(&mut sub, 0, 3, &forward(3)).is_empty());
    assert!(replay(&mut sub, 0, &forward(0), 1_000).is_empty());
    assert_eq!(sub.stats().stale, 1_001, "the late fourth copy and the 1,000 replays");
}

#[test]
fn replayed_history_requests_from_one_broker_count_once_at_the_publisher() {
    let cfgs = cluster(params(2), vec![0]);
    let mut publisher = node(&cfgs, PUBLISHER);
    for p in [b"a", b"b"] {
        request(&mut publisher, 0, publish(0, p, Algorithm::Ab)).unwrap();
    }
    let ask = |b: NodeId| Forger::new(&cfgs[b as usize]).frame(PUBLISHER, &status(pb::PubStatusKind::History, 0, 2));
    assert!(replay(&mut publisher, 2, &ask(2), 1_000).is_empty());
    let outs = feed(&mut publisher, 0, 3, &ask(3));
    assert_eq!(publications(&outs).iter().filter(|(_, p)| p.history).count(), BROKERS.len());
}

/// One valid frame per role: (receiver, sender, frame).
fn valid_frames(cfgs: &[NodeConfig]) -> Vec<(NodeId, NodeId, Vec<u8>)> {
    let p = Forger::new(&cfgs[PUBLISHER as usize]);
    let b = Forger::new(&cfgs[1]);
    vec![
        (0, PUBLISHER, p.frame(0, &pub_body(0, 1, Algorithm::Ab, pb::Step::Send, b"payload"))),
        (PUBLISHER, 1, b.frame(PUBLISHER, &status(pb::PubStatusKind::History, 0, 1))),
        (SUB_A, 1, b.frame(SUB_A, &pub_body(0, 1, Algorithm::Ab, pb::Step::Send, b"payload"))),
    ]
}

/// Feeds bytes from `from` and returns the one fault they must cause, naming `from`.
fn fault_of(node: &mut Node, from: NodeId, bytes: &[u8]) -> FaultKind {
    match feed(node, 0, from, bytes).as_slice() {
        [Output::Fault { node: culprit, kind }] if *culprit == from => *kind,
        other => panic!("expected exactly one fault naming {from} at node {}, got {other:?}", node.id()),
    }
}

/// Where a frame's body and sender sit: `Frame` is sender (field 1, varint), then body
/// (field 2, length-delimited), then the MAC entries.
fn layout(frame: &[u8]) -> (usize, std::ops::Range<usize>) {
    assert_eq!(frame[0], 0x08, "sender is encoded first (non-zero ids only)");
    assert!(frame[1] < 0x80 && frame[2] == 0x12 && frame[3] < 0x80, "one-byte sender and body length");
    (1, 4..4 + frame[3] as usize)
}

#[test]
fn corrupted_frames_are_faults_of_the_right_kind_at_every_role() {
    let cfgs = cluster(Params::default(), vec![0]);
    for (to, from, frame) in valid_frames(&cfgs) {
        let mut n = node(&cfgs, to);
        let forger = Forger::new(&cfgs[from as usize]);
        let (sender_at, body) = layout(&frame);
        let flip = |i: usize, bit: u8| {
            let mut c = frame.clone();
            c[i] ^= bit;
            c
        };
        let prefix =
            pb::Frame { sender: from, body: frame[body.clone()].to_vec().into(), macs: vec![] }.encode_to_vec();
        let cases: Vec<(&str, Vec<u8>, FaultKind)> = vec![
            ("garbage", vec![0xff; 9], FaultKind::Malformed),
            ("cut inside the MAC tag", frame[..frame.len() - 3].to_vec(), FaultKind::Malformed),
            ("cut inside the body", frame[..body.start + 2].to_vec(), FaultKind::Malformed),
            ("MAC entry cut off", prefix.clone(), FaultKind::BadMac),
            ("flipped tag bit", flip(frame.len() - 1, 0x01), FaultKind::BadMac),
            ("flipped body bit", flip(body.end - 1, 0x04), FaultKind::BadMac),
            ("flipped sender bit", flip(sender_at, 0x02), FaultKind::ForgedSender),
            ("validly MACed non-Body", forger.raw_frame(to, vec![0xff; 5]), FaultKind::Malformed),
            ("validly MACed empty Body", forger.raw_frame(to, vec![]), FaultKind::Malformed),
            ("unknown sender", wire::frame(99, &frame[body.clone()], &[]), FaultKind::BadMac),
        ];
        for (what, bytes, want) in cases {
            let claimed = if what == "unknown sender" { 99 } else { from };
            assert_eq!(fault_of(&mut n, claimed, &bytes), want, "{what} at node {to}");
        }
        // The bad frames left no trace: the valid one is still taken.
        assert!(faults(&feed(&mut n, 0, from, &frame)).iter().all(|f| f.1 == FaultKind::Unexpected));
    }
}

#[test]
fn every_truncation_bit_flip_and_garbage_frame_is_a_fault_never_a_panic() {
    let cfgs = cluster(Params::default(), vec![0]);
    let allowed = [FaultKind::Malformed, FaultKind::ForgedSender, FaultKind::BadMac];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for (to, from, frame) in valid_frames(&cfgs) {
        let mut n = node(&cfgs, to);
        let mut check = |bytes: &[u8], what: &str| {
            let kind = fault_of(&mut n, from, bytes);
            assert!(allowed.contains(&kind), "{what} at node {to}: {kind:?}");
        };
        for len in 0..frame.len() {
            check(&frame[..len], &format!("truncated to {len}"));
        }
        for i in 0..frame.len() {
            for bit in 0..8 {
                let mut c = frame.clone();
                c[i] ^= 1 << bit;
                check(&c, &format!("bit {bit} of byte {i} flipped"));
            }
        }
        for k in 0..300 {
            let bytes: Vec<u8> = (0..k % 97)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            check(&bytes, &format!("garbage {bytes:02x?}"));
        }
    }
}

/// `frame` padded with a junk MAC entry to exactly `len` bytes (still a valid frame).
fn padded(frame: &[u8], len: usize) -> Vec<u8> {
    let mut f = pb::Frame::decode(frame).unwrap();
    f.macs.push(pb::Mac { from: 0, to: 0, tag: Vec::new().into() });
    let base = f.encode_to_vec().len();
    for extra in 0..len {
        f.macs.last_mut().unwrap().tag = vec![0; extra].into();
        let bytes = f.encode_to_vec();
        if bytes.len() == len {
            return bytes;
        }
        assert!(bytes.len() < len, "cannot pad {base} bytes to exactly {len}");
    }
    unreachable!()
}

#[test]
fn frames_over_max_message_bytes_are_dropped_unread_at_every_role() {
    let max = 1024;
    let cfgs = cluster(Params { max_message_bytes: max, ..Params::default() }, vec![0]);
    for (to, from, frame) in valid_frames(&cfgs) {
        let mut n = node(&cfgs, to);
        assert_eq!(fault_of(&mut n, from, &padded(&frame, max as usize + 1)), FaultKind::Oversized, "node {to}");
        assert_eq!(fault_of(&mut n, from, &[0u8; 4096]), FaultKind::Oversized, "node {to}");
    }
    // At exactly the limit a frame is read: the broker forwards it.
    let (to, from, frame) = valid_frames(&cfgs).remove(0);
    let outs = feed(&mut node(&cfgs, to), 0, from, &padded(&frame, max as usize));
    assert_eq!(publications(&outs).len(), 2, "{outs:?}");
}

#[test]
fn a_mac_under_the_wrong_pairwise_key_is_bad_mac() {
    for crypto in [CryptoMode::InsecureTest, CryptoMode::Real] {
        let spec = ClusterSpec { crypto, ..ClusterSpec::new(1) };
        let cfgs = generate_cluster(&spec, [7; 32]).unwrap();
        for (to, from, frame) in valid_frames(&cfgs) {
            let body = pb::Frame::decode(frame.as_slice()).unwrap().body;
            // The sender's key with another node, and the right pair's key in another cluster.
            let other = if to == 2 { 3 } else { 2 };
            let wrong_keys = [cfgs[from as usize].mac_keys[&other].clone(), pairwise_mac_key(&[8; 32], from, to)];
            for key in wrong_keys {
                let keys = Keyring::new(crypto, from, [(to, key)].into_iter().collect());
                let bytes = wire::frame(from, &body, &[keys.mac_to(to, &body).unwrap()]);
                assert_eq!(fault_of(&mut node(&cfgs, to), from, &bytes), FaultKind::BadMac, "{crypto:?} node {to}");
            }
        }
    }
}

/// Finding C (issue 14): a publication numbered u64::MAX, the last sequence number there
/// is, overflowed the window arithmetic (`seq + 1` when the source slides a broker's
/// window, `next += 1` when a subscriber that joined late delivers it): a panic in debug
/// builds, a wrap-around to seq 0 in release. It is a valid number like any other: the
/// broker relays it once, subscribers deliver it once, and its replays are stale.
#[test]
fn finding_c_a_publication_numbered_u64_max_is_relayed_and_delivered_once() {
    const LAST: u64 = u64::MAX;
    for alpha in [0, 2] {
        let cfgs = cluster(params(alpha), vec![]);
        let mut net = Net::new(&cfgs);
        // The subscribers follow topic 0 from now on: a late join, whose order starts at
        // the first publication delivered.
        for s in SUBSCRIBERS {
            net.request(s, phalanx_core::Request::Subscribe { topics: vec![0] }).unwrap();
        }
        net.run();
        let publisher = Forger::new(&cfgs[PUBLISHER as usize]);
        for (seq, alg) in [(LAST, Algorithm::Ab), (LAST - 1, Algorithm::Bracha)] {
            let body = pub_body(0, seq, alg, pb::Step::Send, &seq.to_le_bytes());
            for b in BROKERS {
                net.inject(PUBLISHER, b, publisher.frame(b, &body));
            }
            net.run();
        }
        // Replays change nothing.
        for b in BROKERS {
            let body = pub_body(0, LAST, Algorithm::Ab, pb::Step::Send, &LAST.to_le_bytes());
            net.inject(PUBLISHER, b, publisher.frame(b, &body));
        }
        net.run();
        for s in SUBSCRIBERS {
            let got = net.delivered_at(s);
            let expected: &[(u64, u64, bool)] =
                if alpha == 0 { &[(0, LAST, false), (0, LAST - 1, false)] } else { &[(0, LAST, false)] };
            assert_eq!(got, expected, "alpha {alpha}, subscriber {s}");
        }
        // (The real publisher node, which did not send these, refuses the brokers' HISTORY.)
        let faults: Vec<_> = net.faults.iter().filter(|f| f.0 != PUBLISHER).collect();
        assert!(faults.is_empty(), "alpha {alpha}: {faults:?}");
    }
}
