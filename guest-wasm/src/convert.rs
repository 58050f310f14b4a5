//! Between the core's types and the WIT world's: every field, both ways where both ways
//! cross the boundary.

use phalanx_core::trace::ReplaySummary;
use phalanx_core::{
    Algorithm, Delivery, FaultKind, HandleError, Input, Operation, Output, Request, Role, Stats, Status,
};

use crate::wit;

fn algorithm_in(a: wit::Algorithm) -> Algorithm {
    match a {
        wit::Algorithm::Ab => Algorithm::Ab,
        wit::Algorithm::Bracha => Algorithm::Bracha,
        wit::Algorithm::Chain => Algorithm::Chain,
    }
}

fn algorithm_out(a: Algorithm) -> wit::Algorithm {
    match a {
        Algorithm::Ab => wit::Algorithm::Ab,
        Algorithm::Bracha => wit::Algorithm::Bracha,
        Algorithm::Chain => wit::Algorithm::Chain,
    }
}

pub fn input(i: wit::Input) -> Input {
    match i {
        wit::Input::Message(m) => Input::Message { from: m.peer, bytes: m.bytes },
        wit::Input::Request(wit::Request::Publish(p)) => Input::Request(Request::Publish {
            topic: p.topic,
            payload: p.payload,
            algorithm: algorithm_in(p.algorithm),
        }),
        wit::Input::Request(wit::Request::Subscribe(topics)) => Input::Request(Request::Subscribe { topics }),
        wit::Input::Request(wit::Request::Submit(op)) => Input::Request(Request::Submit { op }),
        wit::Input::Request(wit::Request::Read(op)) => Input::Request(Request::Read { op }),
        wit::Input::Timeout => Input::Timeout,
        wit::Input::Persisted(token) => Input::Persisted { token },
        wit::Input::Executed(e) => Input::Executed { seq: e.seq, results: e.results, snapshot: e.snapshot },
        wit::Input::Recover(record) => Input::Recover { record },
        wit::Input::Answered(a) => Input::Answered { client: a.client, request: a.request, result: a.result },
    }
}

fn fault_kind(k: FaultKind) -> wit::FaultKind {
    match k {
        FaultKind::Oversized => wit::FaultKind::Oversized,
        FaultKind::Malformed => wit::FaultKind::Malformed,
        FaultKind::ForgedSender => wit::FaultKind::ForgedSender,
        FaultKind::BadMac => wit::FaultKind::BadMac,
        FaultKind::Unexpected => wit::FaultKind::Unexpected,
        FaultKind::BadChainMac => wit::FaultKind::BadChainMac,
        FaultKind::Equivocation => wit::FaultKind::Equivocation,
        FaultKind::ConflictingHistory => wit::FaultKind::ConflictingHistory,
        FaultKind::TooManyStreams => wit::FaultKind::TooManyStreams,
        FaultKind::BadSignature => wit::FaultKind::BadSignature,
    }
}

fn operation(o: Operation) -> wit::Operation {
    wit::Operation { client: o.client, request: o.request, op: o.op }
}

fn delivery(d: Delivery) -> wit::Delivery {
    wit::Delivery {
        publisher: d.publisher,
        topic: d.topic,
        seq: d.seq,
        payload: d.payload,
        algorithm: algorithm_out(d.algorithm),
        from_history: d.from_history,
    }
}

pub fn output(o: Output) -> wit::Output {
    match o {
        Output::Send { to, bytes } => wit::Output::Send(wit::Message { peer: to, bytes }),
        Output::Deliver(d) => wit::Output::Deliver(delivery(d)),
        Output::Persist { token, record } => wit::Output::Persist(wit::Persist { token, record }),
        Output::Fault { node, kind } => wit::Output::Fault(wit::Fault { node, kind: fault_kind(kind) }),
        Output::Execute { seq, ops } => {
            wit::Output::Execute(wit::Execute { seq, ops: ops.into_iter().map(operation).collect() })
        }
        Output::Completed { request, result } => wit::Output::Completed(wit::Completed { request, result }),
        Output::Restore { seq, snapshot } => wit::Output::Restore(wit::Restore { seq, snapshot }),
        Output::Compact { token } => wit::Output::Compact(token),
        Output::Query { client, request, op } => wit::Output::Query(wit::Query { client, request, op }),
    }
}

pub fn handle_error(e: HandleError) -> wit::HandleError {
    match e {
        HandleError::WrongRole { role, request } => {
            let role = match role {
                Role::Broker => wit::Role::Broker,
                Role::Publisher => wit::Role::Publisher,
                Role::Subscriber => wit::Role::Subscriber,
            };
            wit::HandleError::WrongRole(wit::WrongRole { role, request: request.to_string() })
        }
        HandleError::Backpressure => wit::HandleError::Backpressure,
        HandleError::Invalid(why) => wit::HandleError::Invalid(why),
    }
}

// Destructured, so that a field added to the core's types fails to compile here.
pub fn status(status: Status, stats: &Stats) -> wit::Status {
    let Status {
        view,
        primary,
        changing_view,
        view_changes,
        executed,
        stable,
        pending_requests,
        batches,
        batched_requests,
        consensus_ns_total,
        queue_wait_ns_total,
        queue_waits,
        macs_verified,
        signatures_verified,
    } = status;
    let Stats { stale, beyond_window, unsubscribed, refused } = *stats;
    wit::Status {
        view,
        primary,
        changing_view,
        view_changes,
        executed,
        stable,
        pending_requests,
        batches,
        batched_requests,
        consensus_ns_total,
        queue_wait_ns_total,
        queue_waits,
        macs_verified,
        signatures_verified,
        stale,
        beyond_window,
        unsubscribed,
        refused,
    }
}

pub fn summary(s: ReplaySummary) -> wit::ReplaySummary {
    let ReplaySummary {
        records,
        refused,
        outputs,
        sends,
        deliveries,
        persists,
        faults,
        executes,
        queries,
        completions,
        restores,
        compactions,
        digest,
    } = s;
    let n = |v: usize| v as u64;
    wit::ReplaySummary {
        records: n(records),
        refused: n(refused),
        outputs: n(outputs),
        sends: n(sends),
        deliveries: n(deliveries),
        persists: n(persists),
        faults: n(faults),
        executes: n(executes),
        queries: n(queries),
        completions: n(completions),
        restores: n(restores),
        compactions: n(compactions),
        digest: digest.to_vec(),
    }
}
