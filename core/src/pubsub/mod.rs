//! BFT publish/subscribe with history publications (seed 000 §4–§6, DESIGN §5.4).
//!
//! Publishers publish on topics through n brokers, choosing AB, Bracha or Chain per
//! publication. With α > 0, every α publications per (publisher, topic) brokers answer
//! HISTORY; on f+1 of those (or when publications have waited `history_flush_ns`) the
//! publisher sends a history publication over Bracha carrying every publication since
//! the previous history, with its sequence number. Brokers refuse (BLOCKED) a publisher
//! that reaches 2α without a history. Subscribers then deliver each (publisher, topic,
//! seq) exactly once and in seq order, filling what the fast path lost from histories.
//! With α = 0 there are no histories and subscribers deliver in arrival order.
//!
//! Histories protect against faulty brokers, not a faulty publisher: content that
//! contradicts a history is reported as [`crate::FaultKind::ConflictingHistory`].

mod broker;
mod publisher;
mod subscriber;

pub(crate) use broker::Broker;
pub(crate) use publisher::Publisher;
pub(crate) use subscriber::Subscriber;

use crate::config::Role;
use crate::node::Ctx;
use crate::wire::pb;
use crate::{Algorithm, FaultKind};

/// A stream within a publisher: its topic, and whether it is the history stream.
pub(crate) type StreamKey = (u64, bool);

/// Most topics a subscriber may follow.
pub const MAX_SUBSCRIBED_TOPICS: usize = 1024;

/// Checks the fields every role relies on: a known algorithm, a publisher that is one,
/// histories only over Bracha.
pub(crate) fn check_publication(ctx: &Ctx, p: &pb::Publication) -> Result<(Algorithm, pb::Step), FaultKind> {
    let alg = Algorithm::from_pb(p.algorithm).ok_or(FaultKind::Malformed)?;
    let step = pb::Step::try_from(p.step).map_err(|_| FaultKind::Malformed)?;
    if ctx.role_of(p.publisher) != Some(Role::Publisher) || (p.history && alg != Algorithm::Bracha) || p.seq == 0 {
        return Err(FaultKind::Unexpected);
    }
    Ok((alg, step))
}

/// The same publication at another step.
pub(crate) fn at_step(p: &pb::Publication, step: pb::Step) -> pb::body::Kind {
    pb::body::Kind::Publication(pb::Publication { step: step as i32, ..p.clone() })
}
