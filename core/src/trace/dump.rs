//! The human-readable rendering of a trace (`phalanxd trace show FILE`). Total: every
//! field comes from an untrusted file, so anything that does not decode is shown as
//! such, and free text is escaped to keep one line per record.

use std::fmt;

use prost::Message;

use super::Trace;
use crate::config::{ClusterConfig, ConfigError, Role};
use crate::wire::pb;

/// Renders `trace`: a header block, then one line per record (index, time, input) with
/// indented lines for the refusal, each output and the next timeout.
pub fn dump(trace: &Trace) -> String {
    Dump(trace).to_string()
}

struct Dump<'a>(&'a Trace);

impl fmt::Display for Dump<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Trace { header, records } = self.0;
        writeln!(
            f,
            "{} version {}, label \"{}\"",
            header.format.escape_debug(),
            header.version,
            header.label.escape_debug()
        )?;
        let decoded = cluster_of(&header.node_config);
        // What a node persists depends on its role: PBFT clients persist request-number leases.
        let client = decoded.as_ref().is_ok_and(|(id, c)| c.node(*id).is_some_and(|n| n.role == Role::Client));
        match decoded {
            Ok((id, c)) => {
                let role = c.node(id).map_or("", |n| n.role.name());
                writeln!(
                    f,
                    "node {id} ({role}) of {} nodes, {} {}s, f = {}, crypto {:?}",
                    c.nodes.len(),
                    c.n(),
                    c.protocol.replica_role().name(),
                    c.f,
                    c.crypto
                )?;
            }
            Err(e) => writeln!(f, "node configuration ({} bytes): {e}", header.node_config.len())?,
        }
        writeln!(f, "{} records", records.len())?;
        for (i, r) in records.iter().enumerate() {
            writeln!(f, "#{i} {} ms {}", ms(r.now), describe_input(r.input.as_ref(), client))?;
            if !r.error.is_empty() {
                writeln!(f, "    refused: {}", r.error.escape_debug())?;
            }
            if r.deferred {
                writeln!(f, "    (deferred: the round's outputs come with its last input)")?;
            }
            for o in &r.outputs {
                match &o.kind {
                    Some(pb::output_record::Kind::Send(s)) => {
                        writeln!(f, "    -> {}: {}", describe_output(o), frame(&s.bytes))?
                    }
                    Some(pb::output_record::Kind::Persist(p)) => {
                        writeln!(f, "    -> {}: {}", describe_output(o), persisted(&p.record, client))?
                    }
                    _ => writeln!(f, "    -> {}", describe_output(o))?,
                }
            }
            if r.next_timeout.is_some() {
                writeln!(f, "    next timeout {}", show_timeout(r.next_timeout))?;
            }
        }
        Ok(())
    }
}

/// The node's id and its cluster, checked as far as a listing needs: the layout and the
/// node's place in it, not the keys (a replay checks those; their pairings would cost a
/// listing milliseconds per node).
fn cluster_of(bytes: &[u8]) -> Result<(u32, ClusterConfig), ConfigError> {
    let pb = pb::NodeConfig::decode(bytes)
        .map_err(|e| ConfigError(format!("node configuration is not valid protobuf: {e}")))?;
    let cluster = ClusterConfig::from_pb(pb.cluster.unwrap_or_default())?;
    if cluster.node(pb.id).is_none() {
        return Err(ConfigError(format!("node {} is not in its cluster", pb.id)));
    }
    Ok((pb.id, cluster))
}

/// Milliseconds with microsecond precision.
fn ms(ns: u64) -> String {
    format!("{}.{:03}", ns / 1_000_000, ns / 1_000 % 1_000)
}

pub(super) fn show_timeout(t: Option<u64>) -> String {
    t.map_or_else(|| "none".into(), |t| format!("at {} ms", ms(t)))
}

/// The name of a protobuf enum value, or the raw number if this build does not know it.
fn name<E: TryFrom<i32>>(v: i32, as_str: fn(&E) -> &'static str) -> String {
    E::try_from(v).map_or_else(|_| format!("?{v}"), |e| as_str(&e).to_owned())
}

fn undecodable(len: usize) -> String {
    format!("<{len} undecodable bytes>")
}

/// A list, abbreviated: a subscription may name thousands of topics, a view change
/// hundreds of prepared slots.
fn list<T: fmt::Display>(items: &[T]) -> String {
    const SHOWN: usize = 8;
    let head: Vec<String> = items.iter().take(SHOWN).map(T::to_string).collect();
    let more = if items.len() > SHOWN { format!(", … ({} in all)", items.len()) } else { String::new() };
    format!("[{}{more}]", head.join(", "))
}

fn topics(t: &[u64]) -> String {
    format!("topics {}", list(t))
}

/// The first 4 bytes of a digest in hex: enough to match votes to their proposal by eye.
fn digest(d: &[u8]) -> String {
    if d.is_empty() {
        return "<none>".into();
    }
    d.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

/// Operation count and total op bytes of an execution.
fn ops(ops: &[pb::Operation]) -> String {
    format!("{} ops ({} bytes)", ops.len(), ops.iter().map(|o| o.op.len()).sum::<usize>())
}

/// A client's `Requests`: whose, which numbers, how many op bytes.
fn requests(r: &pb::Requests) -> String {
    match pb::RequestsBody::decode(r.body.clone()) {
        Ok(b) if !b.ops.is_empty() => format!(
            "client {} requests {}..={} ({} bytes)",
            b.client,
            b.first,
            b.first.saturating_add(b.ops.len() as u64 - 1),
            b.ops.iter().map(|o| o.len()).sum::<usize>()
        ),
        _ => format!("<requests: {}>", undecodable(r.body.len())),
    }
}

/// An encoded batch: the digest votes carry (so a PREPARE or COMMIT can be matched to
/// it), and its requests.
fn batch(encoded: &bytes::Bytes) -> String {
    match pb::Batch::decode(encoded.clone()) {
        Ok(b) => {
            let all: Vec<String> = b.requests.iter().map(requests).collect();
            format!("digest {} batch {}", digest(&crate::crypto::digest(encoded)), list(&all))
        }
        Err(_) => format!("batch {}", undecodable(encoded.len())),
    }
}

fn pre_prepare(p: &pb::PrePrepare) -> String {
    format!("view {} seq {} {}", p.view, p.seq, batch(&p.batch))
}

fn vote(v: &pb::Vote) -> String {
    format!("view {} seq {} digest {}", v.view, v.seq, digest(&v.digest))
}

fn slot_vote(v: &pb::SlotVote) -> String {
    format!("seq {} view {} digest {}", v.seq, v.view, digest(&v.digest))
}

fn certificate(c: Option<&pb::Certificate>) -> String {
    match c {
        Some(c) => format!("seq {} digest {} signers {}", c.seq, digest(&c.digest), list(&c.signers)),
        None => "<no certificate>".into(),
    }
}

/// A persisted record (what `Persist` outputs and `Recover` inputs carry): a PBFT client's
/// lease, or a replica's record (only PBFT persists).
fn persisted(bytes: &[u8], client: bool) -> String {
    if !client {
        return replica_record(bytes);
    }
    match pb::ClientLease::decode(bytes) {
        Ok(lease) => format!("lease: request numbers below {}", lease.next_request),
        Err(e) => format!("<not a ClientLease: {e}>"),
    }
}

fn replica_record(bytes: &[u8]) -> String {
    use pb::replica_record::Kind;
    match pb::ReplicaRecord::decode(bytes) {
        Ok(pb::ReplicaRecord { kind: Some(kind) }) => match kind {
            Kind::View(v) => format!("changing to view {v}"),
            Kind::Accepted(p) => format!("accepted PrePrepare {}", pre_prepare(&p)),
            Kind::Prepared(v) => format!("prepared {}", slot_vote(&v)),
            Kind::Entered(e) => format!("entered view {} (its NEW-VIEW chose slots up to {})", e.view, e.reproposed),
            Kind::Delivered(seq) => format!("executing batch {seq}, learnt from others"),
            Kind::Stable(c) => format!("stable checkpoint {}", certificate(Some(&c))),
            Kind::StableState(s) => {
                format!("stable checkpoint {} state {} bytes", certificate(s.certificate.as_ref()), s.state.len())
            }
            Kind::OwnRequests(n) => format!("own request numbers below {n} may be used"),
            Kind::Proposing(v) => format!("proposing in view {v}"),
        },
        Ok(pb::ReplicaRecord { kind: None }) => "empty record".into(),
        Err(_) => undecodable(bytes.len()),
    }
}

/// A frame decoded as far as it goes; MACs are counted, not checked (that needs keys).
fn frame(bytes: &[u8]) -> String {
    let Ok(frame) = pb::Frame::decode(bytes) else { return undecodable(bytes.len()) };
    format!("sender {} {}, {}", frame.sender, encoded_body(&frame.body), mac_count(frame.macs.len()))
}

fn encoded_body(bytes: &[u8]) -> String {
    match pb::Body::decode(bytes) {
        Ok(pb::Body { kind: Some(kind) }) => body(&kind),
        Ok(pb::Body { kind: None }) => "empty body".into(),
        Err(_) => format!("body {}", undecodable(bytes.len())),
    }
}

fn mac_count(macs: usize) -> String {
    format!("{macs} MAC{}", if macs == 1 { "" } else { "s" })
}

fn body(kind: &pb::body::Kind) -> String {
    use pb::body::Kind;
    match kind {
        Kind::Publication(p) => format!(
            "Publication {} {} publisher {} topic {} seq {}{} payload {} bytes",
            name(p.algorithm, pb::Algorithm::as_str_name),
            name(p.step, pb::Step::as_str_name),
            p.publisher,
            p.topic,
            p.seq,
            if p.history { " history" } else { "" },
            p.payload.len()
        ),
        Kind::Status(s) => {
            format!("PubStatus {} topic {} seq {}", name(s.kind, pb::PubStatusKind::as_str_name), s.topic, s.seq)
        }
        Kind::Subscribe(s) => format!("Subscribe {}", topics(&s.topics)),
        Kind::Requests(r) => format!("Requests {}", requests(r)),
        Kind::PrePrepare(p) => format!("PrePrepare {}", pre_prepare(p)),
        Kind::Prepare(v) => format!("Prepare {}", vote(v)),
        Kind::Commit(v) => format!("Commit {}", vote(v)),
        Kind::DistillFetch(f) => format!("DistillFetch lane {} seq {} root {}", f.lane, f.lane_seq, digest(&f.root)),
        Kind::DistillFetched(f) => format!("DistillFetched lane {} seq {}", f.lane, f.lane_seq),
        Kind::PerpetualResult(r) => format!(
            "PerpetualResult group {} call {} of group {}: result {} bytes, view {}, {}",
            r.target,
            r.call,
            r.caller,
            r.result.len(),
            r.view,
            mac_count(r.macs.len())
        ),
        Kind::Reply(r) => format!(
            "Reply view {} requests from {}: {} results ({} bytes)",
            r.view,
            r.first,
            r.results.len(),
            r.results.iter().map(|x| x.len()).sum::<usize>()
        ),
        Kind::Checkpoint(c) => format!("Checkpoint seq {} digest {}", c.seq, digest(&c.digest)),
        Kind::ViewChange(v) => {
            let prepared: Vec<String> = v.prepared.iter().map(slot_vote).collect();
            format!(
                "ViewChange to view {} stable {} prepared {} voted {} batches",
                v.view,
                certificate(v.stable.as_ref()),
                list(&prepared),
                v.voted.len()
            )
        }
        Kind::NewView(n) => {
            let senders: Vec<u32> = n.view_changes.iter().map(|v| v.sender).collect();
            format!("NewView view {} view changes from {}", n.view, list(&senders))
        }
        Kind::FetchState(x) => format!("FetchState seq {}", x.seq),
        Kind::Committed(x) => format!("Committed seq {} {}", x.seq, batch(&x.batch)),
        Kind::FetchBatch(x) => format!("FetchBatch seq {} digest {}", x.seq, digest(&x.digest)),
        Kind::Read(r) => format!("Read request {} op {} bytes", r.request, r.op.len()),
        Kind::ReadReply(r) => format!("ReadReply request {} result {} bytes", r.request, r.result.len()),
        Kind::Proposal(x) => format!("Proposal seq {} {}", x.seq, batch(&x.batch)),
        Kind::Bundle(b) => {
            let bodies: Vec<String> = b
                .bodies
                .iter()
                .map(|b| match b.macs.len() {
                    0 => encoded_body(&b.body),
                    n => format!("{} with {}", encoded_body(&b.body), mac_count(n)),
                })
                .collect();
            format!("Bundle of {}: {}", bodies.len(), bodies.join("; "))
        }
        Kind::State(x) => {
            let state = match pb::CheckpointState::decode(x.state.clone()) {
                Ok(s) => format!("app {} bytes, {} clients", s.app.len(), s.clients.len()),
                Err(_) => undecodable(x.state.len()),
            };
            format!("State checkpoint {} state {state}", certificate(x.checkpoint.as_ref()))
        }
    }
}

fn describe_input(input: Option<&pb::InputRecord>, client: bool) -> String {
    use pb::input_record::Kind;
    use pb::request_input::Kind as Req;
    match input.and_then(|i| i.kind.as_ref()) {
        Some(Kind::Message(m)) => format!("Message from {} ({} bytes): {}", m.from, m.bytes.len(), frame(&m.bytes)),
        Some(Kind::Request(r)) => match &r.kind {
            Some(Req::Publish(p)) => format!(
                "Request Publish topic {} {} payload {} bytes",
                p.topic,
                name(p.algorithm, pb::Algorithm::as_str_name),
                p.payload.len()
            ),
            Some(Req::Subscribe(s)) => format!("Request Subscribe {}", topics(&s.topics)),
            Some(Req::Submit(s)) => format!("Request Submit op {} bytes", s.op.len()),
            Some(Req::Read(r)) => format!("Request Read op {} bytes", r.op.len()),
            Some(Req::Call(c)) => format!("Request Call group {} op {} bytes", c.target, c.op.len()),
            Some(Req::Respond(r)) => {
                format!("Request Respond group {} call {} result {} bytes", r.caller, r.call, r.result.len())
            }
            Some(Req::Abort(a)) => format!("Request Abort call {}", a.call),
            Some(Req::Snapshot(s)) => format!("Request Snapshot seq {} state {} bytes", s.seq, s.state.len()),
            None => "Request <no kind>".into(),
        },
        Some(Kind::Timeout(_)) => "Timeout".into(),
        Some(Kind::Persisted(p)) => format!("Persisted token {}", p.token),
        Some(Kind::Executed(e)) => format!(
            "Executed seq {}: {} results ({} bytes), {}",
            e.seq,
            e.results.len(),
            e.results.iter().map(Vec::len).sum::<usize>(),
            e.snapshot.as_ref().map_or_else(|| "no snapshot".into(), |s| format!("snapshot {} bytes", s.len()))
        ),
        Some(Kind::Recover(r)) => format!("Recover ({} bytes): {}", r.record.len(), persisted(&r.record, client)),
        Some(Kind::Answered(a)) => {
            format!("Answered client {} request {}: result {} bytes", a.client, a.request, a.result.len())
        }
        None => "<no input>".into(),
    }
}

/// One line per output, without decoding frames (replay's divergence reports use it too).
pub(super) fn describe_output(o: &pb::OutputRecord) -> String {
    use pb::output_record::Kind;
    match &o.kind {
        Some(Kind::Send(s)) => format!("Send to {} ({} bytes)", s.to, s.bytes.len()),
        Some(Kind::Deliver(d)) => format!(
            "Deliver publisher {} topic {} seq {} payload {} bytes {}{}",
            d.publisher,
            d.topic,
            d.seq,
            d.payload.len(),
            name(d.algorithm, pb::Algorithm::as_str_name),
            if d.from_history { " from history" } else { "" }
        ),
        Some(Kind::Persist(p)) => format!("Persist token {} ({} bytes)", p.token, p.record.len()),
        Some(Kind::Fault(x)) => format!("Fault node {} {}", x.node, x.kind.escape_debug()),
        Some(Kind::Execute(e)) => {
            format!("Execute seq {}: {}{}", e.seq, ops(&e.ops), if e.snapshot { ", then a snapshot" } else { "" })
        }
        Some(Kind::Completed(c)) => format!("Completed request {} result {} bytes", c.request, c.result.len()),
        Some(Kind::Restore(r)) => format!("Restore seq {} snapshot {} bytes", r.seq, r.snapshot.len()),
        Some(Kind::Compact(c)) => format!("Compact: records before token {} are obsolete", c.token),
        Some(Kind::Query(q)) => format!("Query client {} request {} op {} bytes", q.client, q.request, q.op.len()),
        Some(Kind::Delivered(d)) => {
            format!("Delivered height {} with {} entries", d.height, d.ids.as_ref().map_or(0, |i| i.count))
        }
        Some(Kind::Event(e)) => {
            use pb::event_output::Kind as Ev;
            match &e.kind {
                Some(Ev::Request(r)) => {
                    format!("Event Request group {} call {} op {} bytes", r.caller, r.call, r.op.len())
                }
                Some(Ev::Reply(r)) => format!("Event Reply call {} result {} bytes", r.call, r.result.len()),
                Some(Ev::Aborted(call)) => format!("Event Aborted call {call}"),
                Some(Ev::Checkpoint(seq)) => format!("Event Checkpoint seq {seq}"),
                Some(Ev::Restore(r)) => format!("Event Restore seq {} state {} bytes", r.seq, r.state.len()),
                None => "Event <no kind>".into(),
            }
        }
        None => "<no output>".into(),
    }
}
