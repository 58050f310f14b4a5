use std::iter;

use prost::Message;

use super::*;
use crate::crypto::CryptoMode;
use crate::wire::{self, Keyring};
use crate::{ClusterSpec, HandleError, Machine, Nanos, Node, NodeConfig, NodeId, generate_cluster};

fn cluster() -> Vec<NodeConfig> {
    generate_cluster(&ClusterSpec { crypto: CryptoMode::InsecureTest, ..ClusterSpec::new(1) }, [7; 32]).unwrap()
}

fn publish() -> Input {
    Input::Request(Request::Publish { topic: 0, payload: b"hello".to_vec(), algorithm: Algorithm::Ab })
}

/// The inputs broker 0 gets: a real AB publication from publisher 4, garbage, a timeout
/// and a request a broker refuses.
fn broker_inputs() -> Vec<(Nanos, Input)> {
    let mut publisher = Node::new(cluster()[4].clone()).unwrap();
    publisher.handle(0, publish()).unwrap();
    let frame = iter::from_fn(|| publisher.poll())
        .find_map(|o| match o {
            Output::Send { to: 0, bytes } => Some(bytes),
            _ => None,
        })
        .expect("the publisher sends to broker 0");
    vec![
        (1_000_000, Input::Message { from: 4, bytes: frame }),
        (1_500_000, Input::Message { from: 4, bytes: vec![0xff; 9] }),
        (2_000_000, Input::Timeout),
        (2_500_123, publish()),
    ]
}

/// Feeds broker 0's inputs, draining outputs after each.
fn drive(m: &mut impl Machine) -> (Vec<Result<(), HandleError>>, Vec<Output>) {
    let mut outputs = Vec::new();
    let results = broker_inputs()
        .into_iter()
        .map(|(now, input)| {
            let r = m.handle(now, input);
            outputs.extend(iter::from_fn(|| m.poll()));
            r
        })
        .collect();
    (results, outputs)
}

/// Broker 0's recorded trace and what the recorder handed out.
fn recorded() -> (Vec<u8>, Vec<Result<(), HandleError>>, Vec<Output>) {
    let mut recorder = Recorder::new(Node::new(cluster()[0].clone()).unwrap(), &cluster()[0].encode(), "broker-0");
    let (results, outputs) = drive(&mut recorder);
    assert_eq!(recorder.poll_timeout(), None);
    assert_eq!(recorder.machine().id(), 0);
    let so_far = recorder.trace().to_vec();
    let bytes = recorder.into_trace();
    assert_eq!(bytes, so_far);
    (bytes, results, outputs)
}

fn send_position(trace: &Trace) -> (usize, usize) {
    trace
        .records
        .iter()
        .enumerate()
        .find_map(|(i, r)| {
            r.outputs.iter().position(|o| matches!(o.kind, Some(pb::output_record::Kind::Send(_)))).map(|j| (i, j))
        })
        .expect("the broker forwarded the publication")
}

#[test]
fn recorder_is_transparent_and_replay_reproduces_the_run() {
    let plain = drive(&mut Node::new(cluster()[0].clone()).unwrap());
    let (bytes, results, outputs) = recorded();
    assert_eq!((results.clone(), outputs.clone()), plain);
    assert!(matches!(results[3], Err(HandleError::WrongRole { .. })));
    assert!(outputs.contains(&Output::Fault { node: 4, kind: FaultKind::Malformed }));

    let trace = Trace::parse(&bytes).unwrap();
    assert_eq!(trace.header.label, "broker-0");
    assert_eq!(trace.records.len(), 4);
    assert_eq!(trace.records[3].error, results[3].as_ref().unwrap_err().to_string());
    assert_eq!(trace.to_bytes(), bytes);

    let summary = replay(&trace).unwrap();
    let sends = outputs.iter().filter(|o| matches!(o, Output::Send { .. })).count();
    assert!(sends > 0);
    let mut digest = blake3::Hasher::new();
    for o in &outputs {
        digest.update(&output_to_pb(o).encode_length_delimited_to_vec());
    }
    assert_eq!(
        summary,
        ReplaySummary {
            records: 4,
            refused: 1,
            outputs: outputs.len(),
            sends,
            deliveries: 0,
            persists: 0,
            faults: outputs.len() - sends,
            executes: 0,
            queries: 0,
            completions: 0,
            restores: 0,
            compactions: 0,
            digest: *digest.finalize().as_bytes(),
        }
    );
    assert!(summary.to_string().ends_with(&blake3::Hash::from(summary.digest).to_hex().to_string()));
}

#[test]
fn any_difference_is_a_divergence_naming_the_record() {
    let trace = Trace::parse(&recorded().0).unwrap();
    let (i, j) = send_position(&trace);
    let diverge = |edit: &dyn Fn(&mut Trace), record: usize, needle: &str| {
        let mut t = trace.clone();
        edit(&mut t);
        match replay(&Trace::parse(&t.to_bytes()).unwrap()) {
            Err(e @ TraceError::Divergence { record: r, .. }) => {
                let text = e.to_string();
                assert_eq!(r, record, "{text}");
                assert!(text.contains(needle), "{text:?} lacks {needle:?}");
            }
            other => panic!("expected a divergence, got {other:?}"),
        }
    };
    let flip = |t: &mut Trace| {
        let Some(pb::output_record::Kind::Send(s)) = &mut t.records[i].outputs[j].kind else { unreachable!() };
        s.bytes[7] ^= 1;
    };
    diverge(&flip, i, &format!("replay diverged at record {i}: output {j}: expected Send to "));
    diverge(&flip, i, "differing at byte 7");
    // The same flip made in the file itself.
    let (mut bytes, ..) = recorded();
    let Some(pb::output_record::Kind::Send(s)) = &trace.records[i].outputs[j].kind else { unreachable!() };
    let at = bytes.windows(s.bytes.len()).position(|w| w == s.bytes).unwrap();
    bytes[at + 7] ^= 1;
    assert!(
        matches!(replay(&Trace::parse(&bytes).unwrap()), Err(TraceError::Divergence { record, .. }) if record == i)
    );
    diverge(&|t| t.records[i].outputs[j] = output_to_pb(&Output::Persist { token: 1, record: vec![] }), i, "got Send");
    diverge(&|t| t.records[i].outputs.truncate(j), i, &format!("output {j}: expected none ({j} recorded)"));
    let extra = output_to_pb(&Output::Fault { node: 9, kind: FaultKind::BadMac });
    diverge(
        &|t| t.records[1].outputs.push(extra.clone()),
        1,
        "2 outputs recorded, 1 produced; output 1 missing: Fault node 9 bad_mac",
    );
    diverge(&|t| t.records[2].next_timeout = Some(5_000), 2, "next timeout: expected at 0.005 ms, got none");
    diverge(&|t| t.records[3].error.clear(), 3, "handle: expected Ok, got error \"a broker cannot");
}

#[test]
fn truncation_and_garbage_are_errors_not_panics() {
    let (bytes, ..) = recorded();
    let full = Trace::parse(&bytes).unwrap();
    for len in 0..bytes.len() {
        // A cut at a record boundary is a valid shorter trace; anywhere else is an error.
        if let Ok(t) = Trace::parse(&bytes[..len]) {
            assert_eq!(t.records[..], full.records[..t.records.len()]);
            assert_eq!(t.to_bytes(), &bytes[..len]);
        }
    }
    assert!(Trace::parse(&bytes[..bytes.len() - 1]).unwrap_err().to_string().contains("record 3"));
    assert!(Trace::parse(&[]).is_err());
    let huge = Trace::parse(&[0xff, 0xff, 0xff, 0xff, 0x7f]).unwrap_err();
    assert!(huge.to_string().contains("exceeds the limit"), "{huge}");

    // xorshift64: deterministic garbage without depending on the simulator.
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for round in 0..2_000 {
        let garbage: Vec<u8> = (0..next() % 64).map(|_| next() as u8).collect();
        let _ = Trace::parse(&garbage);
        // Corrupt one byte of the real trace: whatever still parses must replay and dump
        // without panicking.
        let mut corrupt = bytes.clone();
        corrupt[round % bytes.len()] ^= 1 << (next() % 8);
        if let Ok(t) = Trace::parse(&corrupt) {
            let _ = replay(&t);
            let _ = dump(&t);
        }
    }
}

/// A round fed in one `handle_many` is recorded as one: its inputs deferred but for the
/// last, which holds all the outputs. The node bundles the round's sends to a receiver
/// in one frame as it does unrecorded, where draining after each input would not.
#[test]
fn a_round_is_recorded_deferred_but_for_its_last_input() {
    let mut publisher = Node::new(cluster()[4].clone()).unwrap();
    let mut frames = Vec::new();
    for _ in 0..2 {
        publisher.handle(0, publish()).unwrap();
        frames.extend(iter::from_fn(|| publisher.poll()).filter_map(|o| match o {
            Output::Send { to: 0, bytes } => Some((1_000_000, Input::Message { from: 4, bytes })),
            _ => None,
        }));
    }
    let broker = || Node::new(cluster()[0].clone()).unwrap();
    let round = |m: &mut dyn Machine| {
        assert!(m.handle_many(frames.clone()).iter().all(Result::is_ok));
        iter::from_fn(|| m.poll()).collect::<Vec<_>>()
    };
    let sends = |outputs: &[Output]| outputs.iter().filter(|o| matches!(o, Output::Send { .. })).count();
    let plain = round(&mut broker());
    let mut one_by_one = broker();
    let mut drained = Vec::new();
    for (now, input) in &frames {
        one_by_one.handle(*now, input.clone()).unwrap();
        drained.extend(iter::from_fn(|| one_by_one.poll()));
    }
    assert!(sends(&plain) < sends(&drained), "the round's forwards share frames");

    let mut recorder = Recorder::new(broker(), &cluster()[0].encode(), "broker-0");
    assert_eq!(round(&mut recorder), plain);
    let trace = Trace::parse(&recorder.into_trace()).unwrap();
    assert_eq!(trace.records.iter().map(|r| r.deferred).collect::<Vec<_>>(), [true, false]);
    assert!(trace.records[0].outputs.is_empty() && trace.records[0].next_timeout.is_none());
    assert_eq!(trace.records[1].outputs.len(), plain.len());
    assert_eq!(replay(&trace).unwrap().outputs, plain.len());
    assert!(dump(&trace).contains("(deferred: the round's outputs come with its last input)"));

    let mut bad = trace.clone();
    bad.records[0].outputs = bad.records[1].outputs.clone();
    assert!(matches!(replay(&bad), Err(TraceError::Malformed(m)) if m.contains("deferred")));
}

#[test]
fn header_checks_name_the_problem() {
    let mut trace = Trace::parse(&recorded().0).unwrap();
    trace.header.version = 4;
    let err = Trace::parse(&trace.to_bytes()).unwrap_err();
    assert_eq!(err, TraceError::Version { found: 4, expected: 3 });
    assert_eq!(err.to_string(), "trace format version 4 is newer than this build reads (version 3)");
    trace.header.version = 1;
    let err = Trace::parse(&trace.to_bytes()).unwrap_err();
    assert_eq!(err.to_string(), "trace format version 1 is not supported (this build reads versions 2 to 3)");
    // Version 2 is version 3 without deferred records.
    trace.header.version = 2;
    assert!(replay(&Trace::parse(&trace.to_bytes()).unwrap()).is_ok());

    trace.header.version = VERSION;
    trace.header.format = "pcap".into();
    assert!(matches!(Trace::parse(&trace.to_bytes()), Err(TraceError::Malformed(m)) if m.contains("pcap")));

    trace.header.format = FORMAT.into();
    trace.header.node_config = vec![1, 2, 3];
    assert!(matches!(replay(&trace), Err(TraceError::Config(_))));
    assert!(dump(&trace).contains("node configuration (3 bytes)"));

    let mut trace = Trace::parse(&recorded().0).unwrap();
    trace.records[0].input = None;
    assert_eq!(replay(&trace), Err(TraceError::Malformed("record 0: no input".into())));
}

#[test]
fn dump_shows_every_record_decoded() {
    let trace = Trace::parse(&recorded().0).unwrap();
    let text = dump(&trace);
    for needle in [
        "phalanx-trace version 3, label \"broker-0\"",
        "node 0 (broker) of 7 nodes, 4 brokers, f = 1",
        "4 records",
        "#0 1.000 ms Message from 4",
        "Publication AB SEND publisher 4 topic 0 seq",
        "payload 5 bytes, 1 MAC",
        "-> Send to",
        "-> Send to 5 (43 bytes): sender 0 Publication AB SEND publisher 4",
        "#1 1.500 ms Message from 4 (9 bytes): <9 undecodable bytes>",
        "-> Fault node 4 malformed",
        "#2 2.000 ms Timeout",
        "#3 2.500 ms Request Publish topic 0 AB payload 5 bytes",
        "refused: a broker cannot handle a publish request",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from\n{text}");
    }
    assert_eq!(text.lines().filter(|l| l.starts_with('#')).count(), 4);
}

fn pbft_cluster() -> Vec<NodeConfig> {
    let spec = ClusterSpec { crypto: CryptoMode::InsecureTest, ..ClusterSpec::pbft(1, 1) };
    generate_cluster(&spec, [7; 32]).unwrap()
}

/// `body` as node `from` sends it to `to`, authenticated with `from`'s own key.
fn frame_from(cfgs: &[NodeConfig], from: NodeId, to: NodeId, body: pb::body::Kind) -> Input {
    let cfg = &cfgs[from as usize];
    let keys = Keyring::new(cfg.cluster.crypto, from, cfg.mac_keys.clone());
    let body = wire::encode_body(body);
    Input::Message { from, bytes: wire::frame(from, &body, &[keys.mac_to(to, &body).unwrap()]) }
}

/// PBFT client 4 submits one op; replicas 1, 2 and 3 answer it, which completes it.
fn client_trace() -> Vec<u8> {
    let cfgs = pbft_cluster();
    let mut recorder = Recorder::new(Node::new(cfgs[4].clone()).unwrap(), &cfgs[4].encode(), "client-4");
    let reply = |from| {
        let reply = pb::Reply { view: 0, first: 1, results: vec![bytes::Bytes::from_static(b"done")] };
        frame_from(&cfgs, from, 4, pb::body::Kind::Reply(reply))
    };
    // The request leaves once the lease on its number is durable.
    let inputs = [
        (1_000, Input::Request(Request::Submit { op: b"incr".to_vec() })),
        (1_500, Input::Persisted { token: 1 }),
        (2_000, reply(1)),
        (2_500, reply(2)),
        (3_000, reply(3)),
    ];
    for (now, input) in inputs {
        recorder.handle(now, input).unwrap();
        while recorder.poll().is_some() {}
    }
    recorder.into_trace()
}

#[test]
fn pbft_client_trace_replays_and_dumps() {
    let trace = Trace::parse(&client_trace()).unwrap();
    let summary = replay(&trace).unwrap();
    assert_eq!((summary.records, summary.sends, summary.completions, summary.outputs), (5, 4, 1, 7));
    assert!(
        summary
            .to_string()
            .contains("4 sends, 0 deliveries, 1 persists, 0 faults, 0 executes, 0 queries, 1 completions")
    );
    let text = dump(&trace);
    for needle in [
        "node 4 (client) of 5 nodes, 4 replicas, f = 1",
        "#0 0.001 ms Request Submit op 4 bytes",
        "-> Send to 0 (",
        "sender 4 Requests client 4 requests 1..=1 (4 bytes), 0 MACs",
        "-> Persist token 1 (3 bytes): lease: request numbers below 1025",
        "#2 0.002 ms Message from 1",
        "sender 1 Reply view 0 requests from 1: 1 results (4 bytes), 1 MAC",
        "-> Completed request 1 result 4 bytes",
    ] {
        assert!(text.contains(needle), "{needle:?} missing from\n{text}");
    }

    // A different result is a divergence that points at the byte.
    let mut t = trace.clone();
    let Some(pb::output_record::Kind::Completed(c)) = &mut t.records[4].outputs[0].kind else { unreachable!() };
    c.result[2] ^= 1;
    let err = replay(&t).unwrap_err().to_string();
    assert!(
        err.contains("expected Completed request 1 result 4 bytes, got Completed") && err.contains("byte 2"),
        "{err}"
    );
}

/// Every PBFT input, output and frame body, as a replica's trace would hold them.
#[test]
fn dump_shows_pbft_messages() {
    use pb::body::Kind as B;
    use pb::replica_record::Kind as R;
    let cfgs = pbft_cluster();
    let keys = Keyring::new(cfgs[4].cluster.crypto, 4, cfgs[4].mac_keys.clone());
    let ops: Vec<bytes::Bytes> = [&b"abc"[..], b"de"].iter().map(|o| bytes::Bytes::copy_from_slice(o)).collect();
    let requests = crate::order::Bundle::seal(&keys, &[0, 1, 2, 3], 1, 1, ops);
    let batch = bytes::Bytes::from(pb::Batch { requests: vec![requests.clone()] }.encode_to_vec());
    let d = crate::crypto::digest(&batch);
    let hex: String = d[..4].iter().map(|b| format!("{b:02x}")).collect();
    let vote = pb::Vote { view: 1, seq: 7, digest: d.to_vec() };
    let slot_vote = |seq, view| pb::SlotVote { seq, view, digest: d.to_vec() };
    let cert = |seq, signers| pb::Certificate { seq, digest: d.to_vec(), signers, signature: vec![1] };
    let pre_prepare = pb::PrePrepare { view: 1, seq: 7, batch: batch.clone() };
    let view_change = pb::ViewChange {
        view: 2,
        stable: Some(cert(128, vec![0, 1, 3])),
        prepared: vec![slot_vote(129, 1)],
        voted: vec![slot_vote(129, 1), slot_vote(130, 0)],
        signature: vec![],
    };
    let new_view = pb::NewView {
        view: 2,
        view_changes: [0, 2, 3].map(|sender| pb::SignedViewChange { sender, view_change: vec![] }).to_vec(),
    };
    let state = pb::CheckpointState { app: vec![5; 10], clients: vec![pb::ClientRecord::default()] };
    let state = pb::State { seq: 128, checkpoint: Some(cert(128, vec![1, 2, 3])), state: state.encode_to_vec().into() };
    let record = |kind| pb::ReplicaRecord { kind: Some(kind) }.encode_to_vec();
    let bodies = [
        B::Requests(requests),
        B::PrePrepare(pre_prepare.clone()),
        B::PrePrepare(pb::PrePrepare { batch: bytes::Bytes::from_static(&[0xff]), ..pre_prepare.clone() }),
        B::Prepare(vote.clone()),
        B::Commit(vote.clone()),
        B::Checkpoint(pb::CheckpointVote { seq: 128, digest: d.to_vec(), signature: vec![] }),
        B::ViewChange(Box::new(view_change)),
        B::NewView(new_view),
        B::FetchBatch(pb::FetchBatch { seq: 129, digest: d.to_vec() }),
        B::Proposal(pb::Proposal { seq: 129, batch: batch.clone() }),
        B::Committed(pb::Committed { seq: 7, batch: batch.clone() }),
        B::FetchState(pb::FetchState { seq: 256 }),
        B::State(Box::new(state)),
        B::State(Box::new(pb::State { seq: 0, checkpoint: None, state: vec![0xff].into() })),
    ];
    let mut writer = TraceWriter::new(&cfgs[0].encode(), "replica-0");
    for (i, body) in bodies.into_iter().enumerate() {
        writer.record(i as Nanos, &frame_from(&cfgs, 1, 0, body), &Ok(()), &[], None);
    }
    let execute = Output::Execute {
        seq: 7,
        ops: vec![
            Operation { client: 4, request: 1, op: b"abc".to_vec() },
            Operation { client: 4, request: 2, op: b"de".to_vec() },
        ],
        snapshot: true,
    };
    let stable_state = pb::StableState { certificate: Some(cert(128, vec![0, 1, 2])), state: vec![0; 12].into() };
    let mut persists = [
        R::View(2),
        R::Entered(pb::EnteredView { view: 2, reproposed: 9 }),
        R::Accepted(pre_prepare),
        R::Prepared(slot_vote(7, 1)),
        R::Stable(cert(128, vec![0, 1, 2])),
        R::StableState(stable_state),
    ]
    .map(|kind| Output::Persist { token: 1, record: record(kind) })
    .to_vec();
    persists.push(Output::Compact { token: 1 });
    writer.record(20, &Input::Timeout, &Ok(()), &[execute, Output::Restore { seq: 128, snapshot: vec![0; 9] }], None);
    writer.record(21, &Input::Timeout, &Ok(()), &persists, None);
    writer.record(
        22,
        &Input::Executed { seq: 7, results: vec![b"ok".to_vec(), vec![]], snapshot: None },
        &Ok(()),
        &[],
        None,
    );
    writer.record(23, &Input::Executed { seq: 128, results: vec![], snapshot: Some(vec![1; 3]) }, &Ok(()), &[], None);
    writer.record(24, &Input::Recover { record: record(R::View(3)) }, &Ok(()), &[], None);
    writer.record(25, &Input::Recover { record: vec![0xff] }, &Ok(()), &[], None);
    let text = dump(&Trace::parse(&writer.into_bytes()).unwrap());
    for needle in [
        "sender 1 Requests client 4 requests 1..=2 (5 bytes), 1 MAC".into(),
        format!("sender 1 PrePrepare view 1 seq 7 digest {hex} batch [client 4 requests 1..=2 (5 bytes)], 1 MAC"),
        "PrePrepare view 1 seq 7 batch <1 undecodable bytes>".into(),
        format!("Prepare view 1 seq 7 digest {hex}, 1 MAC"),
        format!("Commit view 1 seq 7 digest {hex}, 1 MAC"),
        format!("Checkpoint seq 128 digest {hex}"),
        format!(
            "ViewChange to view 2 stable seq 128 digest {hex} signers [0, 1, 3] prepared [seq 129 view 1 digest {hex}] \
             voted 2 batches"
        ),
        "NewView view 2 view changes from [0, 2, 3]".into(),
        format!("FetchBatch seq 129 digest {hex}"),
        format!("Proposal seq 129 digest {hex} batch [client 4 requests 1..=2 (5 bytes)]"),
        format!("Committed seq 7 digest {hex} batch"),
        "FetchState seq 256".into(),
        format!("State checkpoint seq 128 digest {hex} signers [1, 2, 3] state app 10 bytes, 1 clients"),
        "State checkpoint <no certificate> state <1 undecodable bytes>".into(),
        "-> Execute seq 7: 2 ops (5 bytes)".into(),
        "-> Restore seq 128 snapshot 9 bytes".into(),
        "-> Persist token 1 (2 bytes): changing to view 2".into(),
        "entered view 2 (its NEW-VIEW chose slots up to 9)".into(),
        format!("accepted PrePrepare view 1 seq 7 digest {hex} batch [client 4"),
        format!("prepared seq 7 view 1 digest {hex}"),
        format!("stable checkpoint seq 128 digest {hex} signers [0, 1, 2]"),
        format!("stable checkpoint seq 128 digest {hex} signers [0, 1, 2] state 12 bytes"),
        "-> Compact: records before token 1 are obsolete".into(),
        "Executed seq 7: 2 results (2 bytes), no snapshot".into(),
        "Executed seq 128: 0 results (0 bytes), snapshot 3 bytes".into(),
        "Recover (2 bytes): changing to view 3".into(),
        "Recover (1 bytes): <1 undecodable bytes>".into(),
    ] {
        assert!(text.contains(&needle), "{needle:?} missing from\n{text}");
    }
}

#[test]
fn pb_conversion_roundtrips_every_variant() {
    let algorithms = [Algorithm::Ab, Algorithm::Bracha, Algorithm::Chain];
    let mut inputs = vec![
        Input::Message { from: 3, bytes: vec![1, 2, 3] },
        Input::Message { from: 0, bytes: vec![] },
        Input::Request(Request::Subscribe { topics: vec![1, u64::MAX] }),
        Input::Request(Request::Subscribe { topics: vec![] }),
        Input::Timeout,
        Input::Persisted { token: 9 },
    ];
    inputs
        .extend(algorithms.map(|algorithm| Input::Request(Request::Publish { topic: 5, payload: vec![7], algorithm })));
    inputs.extend([
        Input::Request(Request::Submit { op: vec![1, 2] }),
        Input::Request(Request::Submit { op: vec![] }),
        Input::Executed { seq: 3, results: vec![vec![1], vec![]], snapshot: None },
        // An empty snapshot is not a missing one.
        Input::Executed { seq: 128, results: vec![], snapshot: Some(vec![]) },
        Input::Executed { seq: u64::MAX, results: vec![vec![2; 3]], snapshot: Some(vec![9; 4]) },
        Input::Recover { record: vec![8, 1] },
        Input::Recover { record: vec![] },
    ]);
    for input in inputs {
        let wire = input_to_pb(&input).encode_to_vec();
        assert_eq!(input_from_pb(pb::InputRecord::decode(wire.as_slice()).unwrap()).unwrap(), input);
    }

    let mut outputs = vec![Output::Send { to: 2, bytes: vec![4; 10] }, Output::Persist { token: 1, record: vec![5] }];
    outputs.extend(FaultKind::ALL.map(|kind| Output::Fault { node: 6, kind }));
    for algorithm in algorithms {
        for from_history in [false, true] {
            let d = Delivery { publisher: 4, topic: 1, seq: 2, payload: b"x".to_vec(), algorithm, from_history };
            outputs.push(Output::Deliver(d));
        }
    }
    let op = |client, request, op: &[u8]| Operation { client, request, op: op.to_vec() };
    outputs.extend([
        Output::Execute { seq: 1, ops: vec![], snapshot: false },
        Output::Execute { seq: 2, ops: vec![op(4, 1, b"x"), op(5, u64::MAX, b""), op(4, 2, b"yz")], snapshot: true },
        Output::Completed { request: 7, result: vec![] },
        Output::Completed { request: 1, result: b"ok".to_vec() },
        Output::Restore { seq: 128, snapshot: vec![3; 5] },
        Output::Restore { seq: 0, snapshot: vec![] },
        Output::Compact { token: 3 },
    ]);
    for output in outputs {
        let wire = output_to_pb(&output).encode_to_vec();
        assert_eq!(output_from_pb(pb::OutputRecord::decode(wire.as_slice()).unwrap()).unwrap(), output);
    }
}

#[test]
fn pb_conversion_rejects_what_the_node_api_cannot_express() {
    use pb::{input_record, output_record, request_input};
    assert!(input_from_pb(pb::InputRecord::default()).is_err());
    let request = |kind| pb::InputRecord { kind: Some(input_record::Kind::Request(pb::RequestInput { kind })) };
    assert!(input_from_pb(request(None)).is_err());
    for algorithm in [0, 4, -1] {
        let publish = pb::PublishRequest { topic: 0, payload: vec![], algorithm };
        let err = input_from_pb(request(Some(request_input::Kind::Publish(publish)))).unwrap_err();
        assert_eq!(err, TraceError::Malformed(format!("unknown algorithm {algorithm}")));
    }
    assert!(output_from_pb(pb::OutputRecord::default()).is_err());
    let fault = pb::FaultOutput { node: 1, kind: "rude".into() };
    let err = output_from_pb(pb::OutputRecord { kind: Some(output_record::Kind::Fault(fault)) }).unwrap_err();
    assert_eq!(err.to_string(), "malformed trace: unknown fault kind \"rude\"");
}
