//! The network thread: a mio event loop that carries the core's frames over TCP.
//!
//! Every node dials every replica (so each pair of replicas has two connections, one per
//! direction of sending) and replicas accept connections. A connection opens with a
//! hello, `PHX1` and the dialer's node id (u32 LE); after it, each frame is a u32 LE
//! length and that many bytes. The hello is not trusted: every frame carries the core's
//! MACs, and the core drops and reports a frame whose MAC does not match the claimed
//! sender. A node sends to a replica on the connection it dialed, and to anyone else
//! (clients) on every connection that said hello with that id, so a stranger claiming a
//! client's id cannot cut the client off.
//!
//! A process hosting many clients ([`crate::client::event_loop`]) shares one connection
//! per replica among them: its hello is `PHXM` and a node id (ignored), and each frame
//! on it carries, after the length, a client's id (u32 LE): the sender's on the way to
//! the replica, the recipient's on the way back. So the requests and replies of many
//! clients leave in one `sendmsg` and arrive in one read. A replica learns which clients
//! a shared connection carries from the frames that arrive on it (the MACs still decide
//! who sent them): each client's proof, sent after the hello and when a client joins, or
//! an empty frame naming a client without a key for that replica (as untrusted as a
//! hello). It reaches a client on at most [`MAX_PER_ID`] connections, newest first; a
//! claim evicted from a shared connection only drops that route, so nobody can close a
//! connection other clients share by claiming ids on connections of its own. A claim
//! made while the client proved all its routes gets none until it proves itself there.
//!
//! Bounds: a frame longer than `max_frame` closes the connection (the stream cannot be
//! trusted past a lying length); connections nobody proved (below) read at most
//! [`UNPROVEN_LARGE_FRAMES`] such frames at once, the oldest closing for a newer one's
//! room; each peer's send queue holds at most
//! `send_queue_bytes`, beyond which frames are dropped and counted (the protocols
//! retransmit): the newest while connected, the oldest for a replica not connected (so
//! that it gets what was sent last when it is back); at most `max_connections` accepted
//! connections (its own dials, one per replica, come on top), [`MAX_PER_ID`] per claimed
//! client id.
//!
//! Slots: an accepted connection is proven by a node once a frame on it carries that
//! node's valid MAC ([`phalanx_core::wire::authentic`], checked until one does): the
//! node its hello named, or on a shared connection each client it carries. A dialer
//! sends a proof first ([`phalanx_core::wire::proof`]: a frame carrying nothing, MAC'd),
//! so it is proven before it has anything to say. When every slot is taken, a newcomer
//! takes the slot of the oldest connection nobody proved, so strangers holding no keys,
//! however many connections they open, cannot lock out the nodes that hold them; a node
//! holding keys keeps at most [`MAX_PER_ID`] proven connections (its oldest go), so it
//! cannot either. A peer without a MAC key for the replica (distillation's brokers and
//! clients, which sign) is never proven, and while strangers hold every slot it may have
//! to dial again. Frames for a client go on the connections it proved, once it has one:
//! a stranger claiming its id, or a key holder naming it on a shared connection of its
//! own, then gets none of them, and cannot make this node queue them for a reader that
//! never reads.
//! Frames leave in coalesced `sendmsg` calls of up to [`SEND_FRAMES`] frames, and reach
//! the protocol thread in messages of up to [`DELIVER_FRAMES`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::{self, IoSlice, Read};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use phalanx_core::NodeId;
use phalanx_core::wire::{self, Keyring};

use crate::metrics::{DropReason, Metrics};

pub const HELLO_MAGIC: [u8; 4] = *b"PHX1";
/// The hello of a connection that many clients share.
pub const SHARED_MAGIC: [u8; 4] = *b"PHXM";
pub const MAX_CONNECTIONS: usize = 1024;
/// Descriptors a node keeps beside its connections: listeners, the poll and its waker,
/// the log and its compaction, a trace, metrics scrapes, standard streams.
const FILES_BESIDE_CONNECTIONS: usize = 64;
pub const MAX_PER_ID: usize = 4;
/// Most bytes a frame takes in a send queue beside its body: its length and, on a shared
/// connection, its client's id (or a whole hello).
pub const FRAME_HEADER_BYTES: usize = 8;
const SEND_FRAMES: usize = 64;
const READ_CHUNK: usize = 64 << 10;
/// Most room a connection keeps for reading between frames (batches of requests fit it,
/// so their frames do not make it grow again each time).
const READ_BUFFER_KEPT: usize = 1 << 20;
/// Frames of up to `max_frame` that connections nobody proved may be reading at once,
/// beyond [`READ_BUFFER_KEPT`] each: distillation's brokers, which hold no MAC key, offer
/// their batches on such connections, but strangers announcing large frames and never
/// finishing them must not make the node hold `max_frame` per slot. For more, the
/// oldest of them closes.
const UNPROVEN_LARGE_FRAMES: usize = 4;
/// Most frames handed to the protocol thread in one message.
const DELIVER_FRAMES: usize = 1024;
/// Most bytes read from one connection in one turn of the loop: a peer that keeps its
/// socket full is read in turns with the others, not until it stops.
const READ_BUDGET: usize = 16 * READ_CHUNK;
const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_CONN: usize = 2;

/// Where and to whom this node connects.
#[derive(Clone, Debug)]
pub struct NetConfig {
    pub me: NodeId,
    /// Replicas listen; clients do not.
    pub listen: Option<SocketAddr>,
    /// The replicas this node dials (every replica but itself).
    pub dial: Vec<(NodeId, SocketAddr)>,
    /// Every node id of the cluster: a hello with any other id is refused.
    pub known: BTreeSet<NodeId>,
    pub max_frame: usize,
    pub send_queue_bytes: usize,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// Dial shared connections, whose frames name their client ([`Links::send`]).
    pub shared: bool,
    /// Most accepted connections open at once.
    pub max_connections: usize,
    /// This node's MAC keys, which prove the peers of accepted connections; without them
    /// none is proven.
    pub keys: Option<Arc<Keyring>>,
}

/// How many connections a node may accept with `dials` of its own: [`MAX_CONNECTIONS`], or
/// fewer where the process's limit on open files leaves less room. The limit is raised
/// to the hard one first (once per process): the usual soft limit, 1,024, would run out
/// of descriptors before the slots, and strangers could then hold every one (an accept
/// that fails takes no slot from them).
pub fn connection_room(dials: usize) -> usize {
    static LIMIT: OnceLock<u64> = OnceLock::new();
    let limit = *LIMIT.get_or_init(|| {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes the struct it is given.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
            return MAX_CONNECTIONS as u64;
        }
        // No more than this is needed, and the kernel refuses an unlimited one.
        let wanted = l.rlim_max.min(1 << 16);
        // SAFETY: setrlimit reads the struct it is given.
        if l.rlim_cur < wanted
            && unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &libc::rlimit { rlim_cur: wanted, ..l }) } == 0
        {
            l.rlim_cur = wanted;
        }
        l.rlim_cur
    });
    room_under(limit, dials)
}

/// Connections to accept under a limit of `limit` open files, with `dials` of its own.
fn room_under(limit: u64, dials: usize) -> usize {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    limit.saturating_sub(FILES_BESIDE_CONNECTIONS + dials).min(MAX_CONNECTIONS)
}

/// Another transport that carries frames to some peers (distillation's client ↔ broker
/// hop, over UDP: [`crate::udp`]).
pub trait Divert: Send + Sync {
    /// Takes the frames it carries out of `frames`.
    fn take(&self, frames: &mut Vec<(NodeId, Vec<u8>)>);
    fn shutdown(&self);
}

/// Frames from the protocol thread to the network thread.
pub struct Outbox {
    frames: Mutex<Vec<(NodeId, Vec<u8>)>>,
    waker: Waker,
    stop: AtomicBool,
    divert: OnceLock<Arc<dyn Divert>>,
}

impl Outbox {
    /// From now on, the frames `divert` carries go to it (set once, before the node runs).
    pub fn divert(&self, divert: Arc<dyn Divert>) {
        let _ = self.divert.set(divert);
    }

    /// Queues frames for sending and wakes the network thread.
    pub fn send(&self, frames: &mut Vec<(NodeId, Vec<u8>)>) {
        if let Some(d) = self.divert.get() {
            d.take(frames);
        }
        if frames.is_empty() {
            return;
        }
        self.frames.lock().expect("outbox lock").append(frames);
        // A failed wake means the loop is gone; the frames die with it.
        let _ = self.waker.wake();
    }

    /// Wakes the loop (another thread queued it an event).
    pub fn wake(&self) {
        let _ = self.waker.wake();
    }

    /// Asks the network thread to close everything and return.
    pub fn shutdown(&self) {
        if let Some(d) = self.divert.get() {
            d.shutdown();
        }
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
    }
}

/// A frame queue with a byte bound; `offset` bytes of the front frame are already written.
#[derive(Default)]
struct SendQueue {
    frames: VecDeque<Queued>,
    bytes: usize,
    offset: usize,
}

/// A frame as queued: its header (a data frame's length prefix and, on a shared
/// connection, its client's id; or the whole hello) and its body, written as separate
/// `sendmsg` slices so the core's bytes are never copied.
struct Queued {
    header: [u8; FRAME_HEADER_BYTES],
    /// The client a frame on a shared connection names.
    client: Option<NodeId>,
    hello: bool,
    /// Sent afresh with each new connection, not kept for it: the hello, and the proofs
    /// or announcements that follow it.
    opening: bool,
    body: Vec<u8>,
}

impl Queued {
    fn data(body: Vec<u8>, client: Option<NodeId>) -> Self {
        let mut header = [0; FRAME_HEADER_BYTES];
        header[..4].copy_from_slice(&(body.len() as u32).to_le_bytes());
        if let Some(id) = client {
            header[4..].copy_from_slice(&id.to_le_bytes());
        }
        Queued { header, client, hello: false, opening: false, body }
    }

    /// A frame a connection opens with, after its hello: a sender's proof
    /// ([`wire::proof`]), or an empty frame announcing a client of a shared connection
    /// that holds no key for the replica.
    fn opening(body: Vec<u8>, client: Option<NodeId>) -> Self {
        Queued { opening: true, ..Queued::data(body, client) }
    }

    fn header_len(&self) -> usize {
        if self.hello || self.client.is_some() { FRAME_HEADER_BYTES } else { 4 }
    }

    fn hello(magic: [u8; 4], me: NodeId) -> Self {
        let mut header = [0; FRAME_HEADER_BYTES];
        header[..4].copy_from_slice(&magic);
        header[4..].copy_from_slice(&me.to_le_bytes());
        Queued { header, client: None, hello: true, opening: true, body: Vec::new() }
    }

    fn len(&self) -> usize {
        self.header_len() + self.body.len()
    }

    /// What is left to write after `offset` bytes, as (header, body) slices.
    fn unwritten(&self, offset: usize) -> [&[u8]; 2] {
        let header = &self.header[..self.header_len()];
        [&header[offset.min(header.len())..], &self.body[offset.saturating_sub(header.len())..]]
    }
}

impl SendQueue {
    fn push(&mut self, frame: Queued, cap: usize, metrics: &Metrics) {
        if self.bytes + frame.len() > cap {
            return metrics.dropped(DropReason::SendQueueFull);
        }
        self.bytes += frame.len();
        self.frames.push_back(frame);
    }

    /// Queues `frame` in a queue nothing is being written from, and drops the oldest
    /// frames, each told to `dropped`, until it is within `cap` again.
    fn push_newest(&mut self, frame: Queued, cap: usize, mut dropped: impl FnMut(&Queued)) {
        self.bytes += frame.len();
        self.frames.push_back(frame);
        while self.bytes > cap {
            let oldest = self.frames.pop_front().expect("over the cap, so not empty");
            self.bytes -= oldest.len();
            dropped(&oldest);
        }
    }

    /// Writes as much as the socket takes, `sent` told of each whole frame; `Ok(true)`
    /// when the queue emptied.
    fn flush(&mut self, stream: &mut TcpStream, sent: &mut dyn FnMut(&Queued)) -> io::Result<bool> {
        while !self.frames.is_empty() {
            let slices: Vec<IoSlice> = self
                .frames
                .iter()
                .take(SEND_FRAMES)
                .enumerate()
                .flat_map(|(i, f)| f.unwritten(if i == 0 { self.offset } else { 0 }))
                .filter(|s| !s.is_empty())
                .map(IoSlice::new)
                .collect();
            let mut written = match send_vectored(stream, &slices) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            while written > 0 {
                let front = self.frames.front().expect("written bytes belong to queued frames");
                let left = front.len() - self.offset;
                if written >= left {
                    written -= left;
                    self.bytes -= front.len();
                    sent(front);
                    self.frames.pop_front();
                    self.offset = 0;
                } else {
                    self.offset += written;
                    written = 0;
                }
            }
        }
        Ok(true)
    }

    /// What a dropped connection leaves to resend: whole frames, the partial one again.
    fn take(&mut self) -> SendQueue {
        self.offset = 0;
        std::mem::take(self)
    }
}

/// `writev` on a socket, but a peer that closed it is an error, not a SIGPIPE: a process
/// that embeds a node (a Swift program) may not ignore that signal, as Rust binaries do.
fn send_vectored(stream: &TcpStream, slices: &[IoSlice]) -> io::Result<usize> {
    use std::os::fd::AsRawFd;
    // SAFETY: `IoSlice` is ABI-compatible with `iovec` on Unix, and `msghdr` only borrows
    // `slices` for the call.
    let sent = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = slices.as_ptr() as *mut libc::iovec;
        // At most 2 × SEND_FRAMES slices, far below IOV_MAX.
        msg.msg_iovlen = slices.len() as _;
        libc::sendmsg(stream.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 { Err(io::Error::last_os_error()) } else { Ok(sent as usize) }
}

/// Who is at the other end of a connection.
enum Peer {
    /// An accepted connection before its hello.
    Unknown,
    /// The id its hello claimed, or the replica we dialed.
    Node(NodeId),
    /// An accepted shared connection: the clients reached through it (as their frames
    /// arrived on it, and not evicted since).
    Clients(BTreeSet<NodeId>),
}

struct Conn {
    stream: TcpStream,
    peer: Peer,
    /// Set on connections this node dialed: until the connect completes, nothing is sent.
    dialed: Option<NodeId>,
    connected: bool,
    /// The nodes whose valid MAC a frame on this accepted connection carried: the id of
    /// its hello, or clients of a shared one. Any keeps it its slot, as dialed ones keep
    /// theirs; a node proven here is reached here, and not through mere claims of it.
    proven: BTreeSet<NodeId>,
    /// Received bytes: `rbuf[rstart..rend]` is unparsed; the rest is room, zeroed once
    /// when the buffer grew rather than before every read.
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    queue: SendQueue,
}

impl Conn {
    /// Whether a newcomer may not take this connection's slot: this node dialed it, or a
    /// key holder proved it.
    fn keeps_slot(&self) -> bool {
        self.dialed.is_some() || !self.proven.is_empty()
    }
}

/// A replica this node dials: its address, reconnect schedule and frames waiting for a
/// connection (all that was sent while it was not connected, the newest within the
/// send queue's bound).
struct Dialer {
    addr: SocketAddr,
    conn: Option<usize>,
    next_attempt: Instant,
    backoff: Duration,
    pending: SendQueue,
}

/// The metrics a frame naming `client` counts in: that client's on shared links, else
/// the node's own.
fn metrics_of<'a>(
    clients: &'a BTreeMap<NodeId, Arc<Metrics>>,
    own: &'a Metrics,
    client: Option<NodeId>,
) -> &'a Metrics {
    client.and_then(|c| clients.get(&c)).map_or(own, |m| m)
}

/// Counts a frame a full queue dropped against its client's metrics, or `own`.
fn count_dropped<'a>(clients: &'a BTreeMap<NodeId, Arc<Metrics>>, own: &'a Metrics) -> impl Fn(&Queued) + 'a {
    move |f| metrics_of(clients, own, f.client).dropped(DropReason::SendQueueFull)
}

/// Takes connection `t` off `id`'s list in `lists`.
fn forget(lists: &mut BTreeMap<NodeId, Vec<usize>>, id: NodeId, t: usize) {
    if let Some(ts) = lists.get_mut(&id) {
        ts.retain(|&x| x != t);
        if ts.is_empty() {
            lists.remove(&id);
        }
    }
}

/// Frames received, each with the peer it came from.
pub type Received = Vec<(NodeId, Vec<u8>)>;

/// Takes the frames read for one recipient (the node itself, or a client of a shared
/// connection); false when their consumer is gone.
pub type Deliver<'a> = dyn FnMut(NodeId, Received) -> bool + 'a;

/// One node's links to its peers: the connections it dialed and accepted, the replicas it
/// dials with their back-off, and the frames read but not yet handed on. It owns no
/// poll: whoever runs the event loop passes its registry, so one loop can serve many
/// nodes' links ([`crate::client::event_loop`]) as well as one ([`Network`]). Its
/// connections' tokens are `first_token + k * token_step`.
pub struct Links {
    cfg: NetConfig,
    conns: BTreeMap<usize, Conn>,
    next_token: usize,
    token_step: usize,
    dialers: BTreeMap<NodeId, Dialer>,
    /// Connections that said hello with an id, or carried its frames shared, oldest
    /// first (clients reached this way).
    by_id: BTreeMap<NodeId, Vec<usize>>,
    metrics: Arc<Metrics>,
    /// Shared links: the metrics of each client whose frames they carry.
    clients: BTreeMap<NodeId, Arc<Metrics>>,
    /// Shared links: the MAC keys of each client that has them, for its proofs.
    client_keys: BTreeMap<NodeId, Arc<Keyring>>,
    /// Connections with frames queued since they were last written.
    touched: BTreeSet<usize>,
    /// Frames read in this turn of the loop, not yet delivered, by recipient.
    received: BTreeMap<NodeId, Received>,
    received_count: usize,
    /// Set once `deliver` refused frames: whoever consumes them is gone.
    receiver_gone: bool,
    /// Connections whose last read stopped at [`READ_BUDGET`], bytes perhaps still
    /// waiting: read again next turn (readiness is edge-triggered, so no event will say).
    unread: BTreeSet<usize>,
}

/// How far [`Links::on_readable`] reads.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Drain {
    /// Until the socket has nothing more (`WouldBlock`).
    UntilBlocked,
    /// Until a read returns less than it had room for: the socket held no more then, and
    /// what arrives after it raises a new edge-triggered event, so the read that would
    /// only say `WouldBlock` is saved.
    UntilShort,
}

impl Links {
    pub fn new(cfg: NetConfig, metrics: Arc<Metrics>, first_token: usize, token_step: usize) -> Self {
        let now = Instant::now();
        let dialers = cfg
            .dial
            .iter()
            .map(|&(id, addr)| {
                let d = Dialer {
                    addr,
                    conn: None,
                    next_attempt: now,
                    backoff: cfg.reconnect_min,
                    pending: SendQueue::default(),
                };
                (id, d)
            })
            .collect();
        Links {
            cfg,
            conns: BTreeMap::new(),
            next_token: first_token,
            token_step,
            dialers,
            by_id: BTreeMap::new(),
            metrics,
            clients: BTreeMap::new(),
            client_keys: BTreeMap::new(),
            touched: BTreeSet::new(),
            received: BTreeMap::new(),
            received_count: 0,
            receiver_gone: false,
            unread: BTreeSet::new(),
        }
    }

    pub fn me(&self) -> NodeId {
        self.cfg.me
    }

    /// The counters of this node's (or, shared, the hosting process's) links.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Shared links: carries `client`'s frames from now on, counted in `metrics`, and
    /// proves it (with `keys`) or announces it on every connection.
    pub fn join(&mut self, client: NodeId, metrics: Arc<Metrics>, keys: Option<Arc<Keyring>>) {
        self.clients.insert(client, metrics);
        self.client_keys.extend(keys.map(|k| (client, k)));
        for (&to, d) in &self.dialers {
            if let Some(t) = d.conn
                && let Some(c) = self.conns.get_mut(&t)
            {
                c.queue.push(
                    opening(self.client_keys.get(&client), client, to),
                    self.cfg.send_queue_bytes,
                    &self.metrics,
                );
                self.touched.insert(t);
            }
        }
    }

    /// Shared links: stops counting `client`'s frames.
    pub fn leave(&mut self, client: NodeId) {
        self.clients.remove(&client);
        self.client_keys.remove(&client);
    }

    /// Whether `deliver` refused frames (its consumer went away).
    pub fn receiver_gone(&self) -> bool {
        self.receiver_gone
    }

    /// How long until the next dial is due, if a dialed replica is not connected.
    pub fn next_dial(&self, now: Instant) -> Option<Duration> {
        self.dialers.values().filter(|d| d.conn.is_none()).map(|d| d.next_attempt.saturating_duration_since(now)).min()
    }

    /// Takes the connections that stopped reading at their budget, for
    /// [`Links::read_unread`] once this turn's events are handled.
    pub fn take_unread(&mut self) -> BTreeSet<usize> {
        std::mem::take(&mut self.unread)
    }

    /// Reads on, each within its budget, the connections [`Links::take_unread`] gave.
    pub fn read_unread(&mut self, registry: &Registry, conns: BTreeSet<usize>, deliver: &mut Deliver) {
        for t in conns {
            if !self.on_readable(registry, t, Drain::UntilBlocked, deliver) {
                self.close(registry, t);
            }
        }
    }

    /// Handles a readiness event of one of this node's connections.
    pub fn ready(&mut self, registry: &Registry, event: &Event, deliver: &mut Deliver) {
        let t = event.token().0;
        let mut alive = true;
        if event.is_writable() || event.is_error() {
            alive = self.on_writable(t);
        }
        if alive && (event.is_readable() || event.is_read_closed()) {
            // A close or error this event reports would raise no further event.
            let drain =
                if event.is_read_closed() || event.is_error() { Drain::UntilBlocked } else { Drain::UntilShort };
            alive = self.on_readable(registry, t, drain, deliver);
        }
        if !alive {
            self.close(registry, t);
        }
    }

    fn register(&mut self, registry: &Registry, mut stream: TcpStream, dialed: Option<NodeId>) -> io::Result<usize> {
        let token = self.next_token;
        self.next_token += self.token_step;
        registry.register(&mut stream, Token(token), Interest::READABLE | Interest::WRITABLE)?;
        let _ = stream.set_nodelay(true);
        let conn = Conn {
            stream,
            peer: dialed.map_or(Peer::Unknown, Peer::Node),
            dialed,
            connected: dialed.is_none(),
            proven: BTreeSet::new(),
            rbuf: Vec::new(),
            rstart: 0,
            rend: 0,
            queue: SendQueue::default(),
        };
        self.conns.insert(token, conn);
        self.metrics.connections(1);
        Ok(token)
    }

    /// Takes a connection a listener accepted. When `max_connections` are open, it takes
    /// the slot of the oldest one not proven, or is refused if every one is.
    pub fn accepted(&mut self, registry: &Registry, stream: TcpStream) -> io::Result<()> {
        // Each dialer holds at most one connection: the rest were accepted.
        let dialed = self.dialers.values().filter(|d| d.conn.is_some()).count();
        if self.conns.len() - dialed >= self.cfg.max_connections {
            // Tokens grow, so the first found is the oldest.
            match self.conns.iter().find(|(_, c)| !c.keeps_slot()).map(|(&t, _)| t) {
                Some(t) => {
                    self.metrics.dropped(DropReason::Unproven);
                    self.close(registry, t);
                }
                None => {
                    self.metrics.dropped(DropReason::BadHandshake);
                    return Ok(());
                }
            }
        }
        self.register(registry, stream, None).map(drop)
    }

    /// Connection `t` carried a frame with `id`'s valid MAC: it keeps its slot, takes the
    /// route its claim of `id` was refused ([`Links::reach`]), and `id`'s other proven
    /// connections beyond [`MAX_PER_ID`] go, the oldest first (a shared one only stops
    /// carrying `id`). Never `t`: it is being parsed, and it just showed it is live.
    fn prove(&mut self, registry: &Registry, id: NodeId, t: usize) {
        let c = self.conns.get_mut(&t).expect("a live connection");
        c.proven.insert(id);
        let claims = match &c.peer {
            // A replica is never reached through a claim (see `parse`).
            Peer::Node(_) => !self.dialers.contains_key(&id),
            Peer::Clients(carried) => carried.contains(&id),
            Peer::Unknown => false,
        };
        if claims && !self.by_id.get(&id).is_some_and(|ts| ts.contains(&t)) {
            self.reach(registry, id, t);
        }
        // Tokens grow, so the first is the oldest. Proofs are rare (one per connection and
        // sender), so the scan is not on any frame's path.
        let mut others = self.conns.iter().filter(|&(&x, c)| x != t && c.proven.contains(&id)).map(|(&x, _)| x);
        if let (Some(oldest), Some(_)) = (others.next(), others.nth(MAX_PER_ID - 2)) {
            self.drop_route(registry, id, oldest);
        }
    }

    /// Stops reaching `id` through connection `t`: a shared connection only stops
    /// carrying it (its other clients keep it); any other closes.
    fn drop_route(&mut self, registry: &Registry, id: NodeId, t: usize) {
        if let Some(c) = self.conns.get_mut(&t)
            && let Peer::Clients(carried) = &mut c.peer
        {
            carried.remove(&id);
            c.proven.remove(&id);
            forget(&mut self.by_id, id, t);
        } else {
            self.close(registry, t);
        }
    }

    /// Dials every replica whose back-off ran out.
    pub fn dial_due(&mut self, registry: &Registry, now: Instant) {
        let due: Vec<NodeId> =
            self.dialers.iter().filter(|(_, d)| d.conn.is_none() && d.next_attempt <= now).map(|(&id, _)| id).collect();
        for id in due {
            let d = self.dialers.get_mut(&id).expect("listed");
            d.next_attempt = now + d.backoff;
            d.backoff = (d.backoff * 2).min(self.cfg.reconnect_max);
            let addr = d.addr;
            match TcpStream::connect(addr).and_then(|s| self.register(registry, s, Some(id))) {
                Ok(token) => {
                    let d = self.dialers.get_mut(&id).expect("listed");
                    d.conn = Some(token);
                    let conn = self.conns.get_mut(&token).expect("registered");
                    let magic = if self.cfg.shared { SHARED_MAGIC } else { HELLO_MAGIC };
                    conn.queue.frames.push_back(Queued::hello(magic, self.cfg.me));
                    conn.queue.bytes += 8;
                    // Then each sender proves itself (or, shared, announces itself without a
                    // key): the replica tells it from strangers before it has anything to say.
                    let cap = self.cfg.send_queue_bytes;
                    if self.cfg.shared {
                        for &client in self.clients.keys() {
                            conn.queue.push(opening(self.client_keys.get(&client), client, id), cap, &self.metrics);
                        }
                    } else if let Some(proof) = self.cfg.keys.as_ref().and_then(|k| wire::proof(k, id)) {
                        conn.queue.push(Queued::opening(proof, None), cap, &self.metrics);
                    }
                }
                Err(e) => tracing::debug!("connecting to replica {id} at {addr}: {e}"),
            }
        }
    }

    /// Queues frames to their peers and writes what the sockets take now.
    pub fn route(&mut self, registry: &Registry, frames: impl IntoIterator<Item = (NodeId, Vec<u8>)>) {
        self.queue(self.cfg.me, frames);
        self.flush(registry);
    }

    /// Queues frames from `from` (this node, or a client of shared links) to their
    /// peers, to be written by the next [`Links::flush`].
    fn queue(&mut self, from: NodeId, frames: impl IntoIterator<Item = (NodeId, Vec<u8>)>) {
        let cap = self.cfg.send_queue_bytes;
        let tag = self.cfg.shared.then_some(from);
        for (to, bytes) in frames {
            let metrics = metrics_of(&self.clients, &self.metrics, tag);
            if bytes.len() > self.cfg.max_frame {
                metrics.dropped(DropReason::Oversized);
                continue;
            }
            if let Some(d) = self.dialers.get_mut(&to) {
                match d.conn.and_then(|t| self.conns.get_mut(&t).filter(|c| c.connected).map(|c| (t, c))) {
                    Some((t, c)) => {
                        c.queue.push(Queued::data(bytes, tag), cap, metrics);
                        self.touched.insert(t);
                    }
                    // Until a dial connects, its frames wait with those of failed ones.
                    None => d.pending.push_newest(
                        Queued::data(bytes, tag),
                        cap,
                        count_dropped(&self.clients, &self.metrics),
                    ),
                }
            } else if let Some(tokens) = self.by_id.get(&to) {
                // Once a connection proven by `to`'s MAC reaches it, claims of it (strangers',
                // or a key holder's naming another client on its shared connection) get
                // nothing: neither `to`'s frames nor room in memory for them.
                let proven = tokens.iter().any(|t| self.conns.get(t).is_some_and(|c| c.proven.contains(&to)));
                for t in tokens {
                    if let Some(c) = self.conns.get_mut(t).filter(|c| !proven || c.proven.contains(&to)) {
                        let client = matches!(c.peer, Peer::Clients(_)).then_some(to);
                        c.queue.push(Queued::data(bytes.clone(), client), cap, metrics);
                        self.touched.insert(*t);
                    }
                }
            } else {
                // A client that is not connected: it retransmits, and gets the reply then.
                metrics.dropped(DropReason::UnknownPeer);
            }
        }
    }

    /// Queues a round's frames from `from`: through `divert` what it carries (it takes
    /// them out of `frames`), the rest on these links.
    pub fn send(&mut self, from: NodeId, divert: Option<&Arc<dyn Divert>>, frames: &mut Vec<(NodeId, Vec<u8>)>) {
        if let Some(d) = divert {
            d.take(frames);
        }
        self.queue(from, frames.drain(..));
    }

    /// The replicas these links dial.
    pub fn dials(&self) -> &[(NodeId, SocketAddr)] {
        &self.cfg.dial
    }

    /// Writes what was queued since the last flush, as far as the sockets take it.
    pub fn flush(&mut self, registry: &Registry) {
        for t in std::mem::take(&mut self.touched) {
            if !self.on_writable(t) {
                self.close(registry, t);
            }
        }
    }

    /// Completes a connect and writes what is queued; false if the connection is dead.
    fn on_writable(&mut self, t: usize) -> bool {
        let Some(c) = self.conns.get_mut(&t) else { return true };
        if !c.connected {
            match c.stream.take_error() {
                Ok(None) => {}
                Ok(Some(_)) | Err(_) => return false,
            }
            match c.stream.peer_addr() {
                Ok(_) => c.connected = true,
                Err(e) if e.kind() == io::ErrorKind::NotConnected => return true,
                Err(_) => return false,
            }
            let id = c.dialed.expect("only dialed connections wait to connect");
            let d = self.dialers.get_mut(&id).expect("dialed");
            d.backoff = self.cfg.reconnect_min;
            // Frames queued while disconnected follow the hello.
            let pending = d.pending.take();
            c.queue.bytes += pending.bytes;
            c.queue.frames.extend(pending.frames);
            tracing::info!("node {}: connected to replica {id}", self.cfg.me);
        }
        let (metrics, clients) = (&self.metrics, &self.clients);
        // Counted per whole frame sent, to the peer it went to (the hello included).
        let mut sent = |f: &Queued| match &c.peer {
            Peer::Node(p) => metrics_of(clients, metrics, f.client).bytes_out(*p, f.len() as u64),
            Peer::Clients(_) => metrics.bytes_out(f.client.expect("a shared frame names its client"), f.len() as u64),
            Peer::Unknown => {}
        };
        c.queue.flush(&mut c.stream, &mut sent).is_ok()
    }

    /// Reads what arrived, up to [`READ_BUDGET`], and delivers whole frames; false if the
    /// connection is done.
    fn on_readable(&mut self, registry: &Registry, t: usize, drain: Drain, deliver: &mut Deliver) -> bool {
        let mut taken = 0;
        loop {
            if taken >= READ_BUDGET {
                self.unread.insert(t);
                return true;
            }
            let Some(c) = self.conns.get_mut(&t) else { return false };
            // Room for a chunk: the unparsed bytes move to the front, or the buffer grows
            // (to at most a chunk beyond the largest frame, as parsing goes on per read).
            if c.rbuf.len() - c.rend < READ_CHUNK {
                c.rbuf.copy_within(c.rstart..c.rend, 0);
                c.rend -= c.rstart;
                c.rstart = 0;
            }
            let wanted = c.rend + READ_CHUNK;
            if c.rbuf.len() < wanted && wanted > READ_BUFFER_KEPT && !c.keeps_slot() {
                self.room_for_unproven(registry, t, wanted);
            }
            let c = self.conns.get_mut(&t).expect("room is made by closing other connections");
            if c.rbuf.len() < wanted {
                c.rbuf.resize(wanted, 0);
            }
            let room = c.rbuf.len() - c.rend;
            let read = c.stream.read(&mut c.rbuf[c.rend..]);
            match read {
                Ok(0) => return false,
                // Deliver as we go, so one busy peer cannot grow the buffer unbounded.
                Ok(n) => {
                    c.rend += n;
                    taken += n;
                    if !self.parse(registry, t, deliver) {
                        return false;
                    }
                    if n < room && drain == Drain::UntilShort {
                        return true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }

    /// Makes room for the read buffer of connection `t`, which nobody proved, to grow to
    /// `len`: beyond [`READ_BUFFER_KEPT`] each, such connections hold at most
    /// [`UNPROVEN_LARGE_FRAMES`] times `max_frame` together, so the oldest others holding
    /// some close until it fits.
    fn room_for_unproven(&mut self, registry: &Registry, t: usize, len: usize) {
        let room = UNPROVEN_LARGE_FRAMES * self.cfg.max_frame;
        let beyond_kept = |c: &Conn| c.rbuf.len().saturating_sub(READ_BUFFER_KEPT);
        loop {
            // Tokens grow, so the first is the oldest. Only large frames from unproven
            // peers scan, once per chunk they grow by.
            let mut holders = self.conns.iter().filter(|&(&x, c)| x != t && !c.keeps_slot() && beyond_kept(c) > 0);
            let held: usize = holders.clone().map(|(_, c)| beyond_kept(c)).sum();
            if held + (len - READ_BUFFER_KEPT) <= room {
                return;
            }
            let Some((&oldest, _)) = holders.next() else { return };
            self.metrics.dropped(DropReason::Unproven);
            self.close(registry, oldest);
        }
    }

    /// Takes the hello and whole frames off the read buffer; false closes the connection.
    fn parse(&mut self, registry: &Registry, t: usize, deliver: &mut Deliver) -> bool {
        let max = self.cfg.max_frame;
        loop {
            let c = self.conns.get_mut(&t).expect("parsing a live connection");
            let buf = &c.rbuf[c.rstart..c.rend];
            if matches!(c.peer, Peer::Unknown) {
                if buf.len() < 8 {
                    break;
                }
                let magic: [u8; 4] = buf[..4].try_into().expect("4 bytes");
                c.rstart += 8;
                if magic == SHARED_MAGIC {
                    c.peer = Peer::Clients(BTreeSet::new());
                    continue;
                }
                let id = NodeId::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
                if magic != HELLO_MAGIC || !self.cfg.known.contains(&id) || id == self.cfg.me {
                    let reason = if magic != HELLO_MAGIC { DropReason::BadHandshake } else { DropReason::UnknownPeer };
                    self.metrics.dropped(reason);
                    return false;
                }
                c.peer = Peer::Node(id);
                // A replica that dials us is up: dial it back now, not when our back-off
                // runs out (up to `reconnect_max`), or after a restart it hears nothing
                // from us meanwhile while we hear it. Once per hello, so a peer claiming
                // the id can cause no more dials than it makes connections.
                match self.dialers.get_mut(&id) {
                    Some(d) if d.conn.is_none() => d.next_attempt = Instant::now(),
                    // A replica is sent to on the connection we dial, never on one it
                    // dialed: a claim to be it takes no route, so it evicts nothing (a
                    // client claiming a replica's id would otherwise close that replica's
                    // connection to us, as often as it liked).
                    Some(_) => {}
                    None => self.reach(registry, id, t),
                }
                continue;
            }
            let shared = self.cfg.shared || matches!(c.peer, Peer::Clients(_));
            let head = if shared { 8 } else { 4 };
            if buf.len() < head {
                break;
            }
            let len = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes")) as usize;
            if len > max {
                self.metrics.dropped(DropReason::Oversized);
                return false;
            }
            if buf.len() < head + len {
                break;
            }
            let client = shared.then(|| NodeId::from_le_bytes(buf[4..8].try_into().expect("4 bytes")));
            let bytes = buf[head..head + len].to_vec();
            c.rstart += head + len;
            let (to, from) = match &mut c.peer {
                // On our shared connection to a replica, the frame is for `client`.
                Peer::Node(p) => (client.unwrap_or(self.cfg.me), *p),
                Peer::Clients(carried) => {
                    let client = client.expect("a shared connection's frames name their client");
                    if !self.cfg.known.contains(&client) || client == self.cfg.me {
                        self.metrics.dropped(DropReason::UnknownPeer);
                        continue;
                    }
                    if carried.insert(client) {
                        self.reach(registry, client, t);
                    }
                    if len == 0 {
                        continue; // an announcement
                    }
                    (self.cfg.me, client)
                }
                Peer::Unknown => unreachable!("the hello came first"),
            };
            // Checked until a frame of `from` proves it here (on accepted connections:
            // dialed ones keep their slot and route).
            let unproven = self.conns.get(&t).is_some_and(|c| c.dialed.is_none() && !c.proven.contains(&from));
            if unproven && self.cfg.keys.as_ref().is_some_and(|k| wire::authentic(k, from, &bytes)) {
                self.prove(registry, from, t);
            }
            metrics_of(&self.clients, &self.metrics, self.cfg.shared.then_some(to))
                .bytes_in(Some(from), (head + len) as u64);
            self.received.entry(to).or_default().push((from, bytes));
            self.received_count += 1;
            // A peer that keeps the socket full is delivered in parts, as the channel
            // takes them.
            if self.received_count >= DELIVER_FRAMES && !self.deliver_received(deliver) {
                return false;
            }
        }
        let c = self.conns.get_mut(&t).expect("parsing a live connection");
        if c.rstart == c.rend {
            (c.rstart, c.rend) = (0, 0);
            // Room a large frame took goes back once it is parsed: otherwise every
            // connection, a stranger's too, could keep `max_frame` bytes resident.
            if c.rbuf.len() > READ_BUFFER_KEPT {
                c.rbuf = Vec::new();
            }
        }
        true
    }

    /// Reaches `id` (not a replica: see [`Links::queue`]) through connection `t` from now
    /// on. The newest connections win; the oldest beyond [`MAX_PER_ID`] go (a shared one
    /// only stops carrying `id`), mere claims before connections `id`'s MAC proved. So
    /// while `id` proved all its routes, `t`'s mere claim is refused: `t` stays open
    /// without a route (closing it would pull it from under `parse`) until `id` proves
    /// itself on it too ([`Links::prove`]).
    fn reach(&mut self, registry: &Registry, id: NodeId, t: usize) {
        let ids = self.by_id.entry(id).or_default();
        ids.push(t);
        if ids.len() > MAX_PER_ID {
            let unproven = ids.iter().position(|x| self.conns.get(x).is_none_or(|c| !c.proven.contains(&id)));
            let oldest = ids.remove(unproven.unwrap_or(0));
            if oldest != t {
                self.drop_route(registry, id, oldest);
            }
        }
    }

    /// Hands what was read on, each recipient's frames together; false (and
    /// [`Links::receiver_gone`] from now on) if a consumer is gone.
    pub fn deliver_received(&mut self, deliver: &mut Deliver) -> bool {
        self.received_count = 0;
        for (to, frames) in std::mem::take(&mut self.received) {
            if !self.receiver_gone && !deliver(to, frames) {
                self.receiver_gone = true;
            }
        }
        !self.receiver_gone
    }

    /// Closes every connection (the node leaves the loop).
    pub fn close_all(&mut self, registry: &Registry) {
        let tokens: Vec<usize> = self.conns.keys().copied().collect();
        for t in tokens {
            self.close(registry, t);
        }
    }

    fn close(&mut self, registry: &Registry, t: usize) {
        let Some(mut c) = self.conns.remove(&t) else { return };
        let _ = registry.deregister(&mut c.stream);
        self.metrics.connections(-1);
        let reached = match &c.peer {
            Peer::Node(id) => vec![*id],
            Peer::Clients(carried) => carried.iter().copied().collect(),
            Peer::Unknown => Vec::new(),
        };
        for id in reached {
            forget(&mut self.by_id, id, t);
        }
        if let Some(id) = c.dialed
            && let Some(d) = self.dialers.get_mut(&id)
            && d.conn == Some(t)
        {
            d.conn = None;
            // Unsent frames wait for the next connection, within the bound; its opening
            // frames (the hello, then proofs or announcements) are sent afresh with it.
            let unsent = c.queue.take().frames.into_iter().chain(std::mem::take(&mut d.pending).frames);
            for f in unsent.filter(|f| !f.opening) {
                d.pending.push_newest(f, self.cfg.send_queue_bytes, count_dropped(&self.clients, &self.metrics));
            }
            if c.connected {
                tracing::info!("node {}: connection to replica {id} lost", self.cfg.me);
            }
        }
    }
}

/// The frame a shared connection to replica `to` carries for `client` after its hello:
/// its proof, with `keys`, or without a key for `to` an empty frame announcing it.
fn opening(keys: Option<&Arc<Keyring>>, client: NodeId, to: NodeId) -> Queued {
    Queued::opening(keys.and_then(|k| wire::proof(k, to)).unwrap_or_default(), Some(client))
}

/// The network of one node: its [`Links`] in a mio loop of their own, with the listener
/// (replicas) and the [`Outbox`] waker. Run on a thread of its own ([`Network::run`]),
/// it hands the frames read in one turn of the loop to the protocol thread at once; or
/// the protocol thread turns it itself ([`crate::driver::Driver::run_with_network`]).
pub struct Network {
    poll: Poll,
    outbox: Arc<Outbox>,
    listener: Option<TcpListener>,
    links: Links,
}

impl Network {
    /// Binds the listener (so a bad address fails here, in the caller's thread).
    pub fn new(cfg: NetConfig, metrics: Arc<Metrics>) -> io::Result<(Self, Arc<Outbox>)> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let outbox = Arc::new(Outbox {
            frames: Mutex::new(Vec::new()),
            waker,
            stop: AtomicBool::new(false),
            divert: OnceLock::new(),
        });
        let mut listener = match cfg.listen {
            Some(addr) => Some(TcpListener::bind(addr)?),
            None => None,
        };
        if let Some(l) = listener.as_mut() {
            poll.registry().register(l, LISTENER, Interest::READABLE)?;
        }
        let links = Links::new(cfg, metrics, FIRST_CONN, 1);
        Ok((Network { poll, outbox: outbox.clone(), listener, links }, outbox))
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Runs until [`Outbox::shutdown`] or `deliver` refuses frames: `deliver(frames)`
    /// takes the frames read in one turn of the loop together, waking the protocol thread
    /// once rather than per frame (blocking when it is behind, which pushes back on the
    /// senders through TCP).
    pub fn run(mut self, mut deliver: impl FnMut(Received) -> bool) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        while self.turn(&mut events, None, &mut |_, frames| deliver(frames))? {}
        Ok(())
    }

    /// One turn of the loop: waits for readiness at most `timeout` (or until a dial is
    /// due), accepts, reads and delivers, and sends what the outbox holds. False once
    /// stopped.
    pub fn turn(&mut self, events: &mut Events, timeout: Option<Duration>, deliver: &mut Deliver) -> io::Result<bool> {
        let now = Instant::now();
        self.links.dial_due(self.poll.registry(), now);
        let unread = self.links.take_unread();
        let wait = if unread.is_empty() { timeout } else { Some(Duration::ZERO) };
        let timeout = [wait, self.links.next_dial(now)].into_iter().flatten().min();
        match self.poll.poll(events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => events.clear(),
            Err(e) => return Err(e),
        }
        for event in events.iter() {
            match event.token() {
                LISTENER => self.accept()?,
                WAKER => {
                    let frames = std::mem::take(&mut *self.outbox.frames.lock().expect("outbox lock"));
                    self.links.route(self.poll.registry(), frames);
                }
                _ => self.links.ready(self.poll.registry(), event, deliver),
            }
        }
        self.links.read_unread(self.poll.registry(), unread, deliver);
        Ok(self.links.deliver_received(deliver) && !self.stopped())
    }

    /// Queues a round's frames (through the outbox's divert first), to be written by
    /// [`Network::flush`].
    pub fn send(&mut self, frames: &mut Vec<(NodeId, Vec<u8>)>) {
        self.links.send(self.links.me(), self.outbox.divert.get(), frames);
    }

    /// Writes what [`Network::send`] queued, as far as the sockets take it.
    pub fn flush(&mut self) {
        self.links.flush(self.poll.registry());
    }

    fn stopped(&self) -> bool {
        self.outbox.stop.load(Ordering::SeqCst) || self.links.receiver_gone()
    }

    fn accept(&mut self) -> io::Result<()> {
        loop {
            let Some(listener) = self.listener.as_ref() else { return Ok(()) };
            match listener.accept() {
                Ok((stream, _)) => self.links.accepted(self.poll.registry(), stream)?,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // A connection that failed before we took it (reset, out of descriptors):
                // nothing to do but go on serving.
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::mpsc;
    use std::thread;

    use super::*;
    use crate::local_cluster::free_ports;

    /// The configuration of node `me`, knowing `known`, that neither listens nor dials:
    /// tests set the fields they are about over it.
    fn config(me: NodeId, known: &[NodeId]) -> NetConfig {
        NetConfig {
            me,
            listen: None,
            dial: Vec::new(),
            known: known.iter().copied().collect(),
            max_frame: 1024,
            send_queue_bytes: 1 << 20,
            reconnect_min: Duration::from_secs(1),
            reconnect_max: Duration::from_secs(1),
            shared: false,
            max_connections: MAX_CONNECTIONS,
            keys: None,
        }
    }

    /// A node on `port` that dials `peer` on `peer_port`, retrying at most once an hour.
    fn node(
        me: NodeId,
        port: u16,
        peer: NodeId,
        peer_port: u16,
    ) -> (Arc<Outbox>, mpsc::Receiver<Received>, thread::JoinHandle<io::Result<()>>) {
        let loopback = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let hour = Duration::from_secs(3600);
        let cfg = NetConfig {
            listen: Some(loopback(port)),
            dial: vec![(peer, loopback(peer_port))],
            reconnect_min: hour,
            reconnect_max: hour,
            ..config(me, &[me, peer])
        };
        let (tx, rx) = mpsc::channel();
        let metrics = Arc::new(Metrics::new(me, &[me, peer]));
        let (net, outbox) = Network::new(cfg, metrics).expect("binds");
        (outbox, rx, thread::spawn(move || net.run(move |frames| tx.send(frames).is_ok())))
    }

    /// A write to a peer that closed its end is an error, not a SIGPIPE: a process that
    /// embeds a node may leave that signal's action at its default, which kills it (a
    /// Swift program does). Runs again in a child process with the default action.
    #[test]
    fn a_write_to_a_closed_peer_is_an_error_not_a_signal() {
        const CHILD: &str = "PHALANX_TEST_SIGPIPE_DEFAULT";
        if std::env::var_os(CHILD).is_none() {
            let name = "net::tests::a_write_to_a_closed_peer_is_an_error_not_a_signal";
            let status = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", name, "--test-threads=1"])
                .env(CHILD, "1")
                .status()
                .expect("the test binary runs again");
            assert!(status.success(), "the child with SIGPIPE at its default action: {status}");
            return;
        }
        // SAFETY: this child process runs this one test on one thread.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let mut stream = TcpStream::from_std(std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap());
        drop(listener.accept().unwrap());
        let metrics = Metrics::new(0, &[0]);
        let mut queue = SendQueue::default();
        let error = (0..1000)
            .find_map(|_| {
                queue.push(Queued::data(vec![7; 4096], None), usize::MAX, &metrics);
                let result = queue.flush(&mut stream, &mut |_| {}).err();
                thread::sleep(Duration::from_millis(5));
                result
            })
            .expect("writes to a closed peer fail within 1000 tries");
        assert!(matches!(error.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset), "{error}");
    }

    /// A process hosting many clients shares one connection to a replica among them: the
    /// replica hears each client's frames as that client's, reaches a client that only
    /// announced itself, and tells apart the clients it answers by the id each frame
    /// names. Strangers claiming a client's id on connections of their own take that
    /// client's route (as they would from a connection of its own) but cannot close the
    /// shared connection: its other clients are still reached through it.
    #[test]
    fn a_shared_connection_carries_many_clients_and_survives_claims_on_them() {
        use std::net::TcpStream as StdStream;

        let (port, held) = free_ports(1).expect("a free loopback port");
        drop(held);
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let cfg = NetConfig { listen: Some(addr), ..config(0, &[0, 5, 6]) };
        let (tx, rx) = mpsc::channel();
        let metrics = Arc::new(Metrics::new(0, &[0, 5, 6]));
        let (net, outbox) = Network::new(cfg, metrics).expect("binds");
        let run = thread::spawn(move || net.run(move |frames| tx.send(frames).is_ok()));
        let frame = |len: u32, id: u32, body: &[u8]| [&len.to_le_bytes()[..], &id.to_le_bytes(), body].concat();
        let received = || {
            let mut got = Vec::new();
            while let Ok(frames) = rx.recv_timeout(Duration::from_millis(500)) {
                got.extend(frames);
            }
            got
        };
        let read_frames = |s: &mut StdStream, n: usize| -> Vec<(u32, Vec<u8>)> {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            (0..n)
                .map(|_| {
                    let mut head = [0; 8];
                    s.read_exact(&mut head).unwrap();
                    let mut body = vec![0; u32::from_le_bytes(head[..4].try_into().unwrap()) as usize];
                    s.read_exact(&mut body).unwrap();
                    (u32::from_le_bytes(head[4..].try_into().unwrap()), body)
                })
                .collect()
        };

        let mut shared = StdStream::connect(addr).unwrap();
        let hello = [&SHARED_MAGIC[..], &0u32.to_le_bytes()].concat();
        // Client 5 only announces itself; client 6 sends a frame; id 9 is no client here.
        shared.write_all(&[hello, frame(0, 5, b""), frame(3, 6, b"abc"), frame(3, 9, b"xyz")].concat()).unwrap();
        assert_eq!(received(), vec![(6, b"abc".to_vec())]);
        outbox.send(&mut vec![(5, b"hi".to_vec()), (6, b"yo".to_vec())]);
        assert_eq!(read_frames(&mut shared, 2), vec![(5, b"hi".to_vec()), (6, b"yo".to_vec())]);

        // Four connections of its own claiming client 5 push the shared one off its route.
        let mut claims: Vec<StdStream> = (0..MAX_PER_ID).map(|_| StdStream::connect(addr).unwrap()).collect();
        for c in &mut claims {
            c.write_all(&[&HELLO_MAGIC[..], &5u32.to_le_bytes(), &frame(1, 0, b"")[..4], b"!"].concat()).unwrap();
        }
        assert_eq!(received().len(), MAX_PER_ID);
        outbox.send(&mut vec![(5, b"to 5".to_vec()), (6, b"to 6".to_vec())]);
        assert_eq!(read_frames(&mut shared, 1), vec![(6, b"to 6".to_vec())], "client 6 is still reached");
        // The shared connection is open: client 5 speaking on it again wins its route back.
        shared.write_all(&frame(2, 5, b"ok")).unwrap();
        assert_eq!(received(), vec![(5, b"ok".to_vec())]);
        outbox.send(&mut vec![(5, b"back".to_vec())]);
        assert_eq!(read_frames(&mut shared, 1), vec![(5, b"back".to_vec())]);
        outbox.shutdown();
        run.join().expect("network thread").expect("network ran");
    }

    /// Frames for a replica out of reach wait in one queue of at most `send_queue_bytes`,
    /// however many dials fail (what was sent while each was under way joins it), and the
    /// newest stay: a replica down for long gets what was sent last, not what its peers
    /// have long since moved past.
    #[test]
    fn frames_for_a_replica_out_of_reach_stay_within_one_send_queue() {
        // The dials reach a listener, but each fails (closes) before it connects.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let cap = 4096;
        let cfg = NetConfig {
            dial: vec![(1, listener.local_addr().unwrap())],
            send_queue_bytes: cap,
            reconnect_min: Duration::ZERO,
            reconnect_max: Duration::ZERO,
            ..config(0, &[0, 1])
        };
        let mut links = Links::new(cfg, Arc::new(Metrics::new(0, &[0, 1])), FIRST_CONN, 1);
        let poll = Poll::new().unwrap();
        for round in 0..20u8 {
            links.route(poll.registry(), (0..30).map(|_| (1, vec![round; 100])));
            links.dial_due(poll.registry(), Instant::now());
            let dial = links.dialers[&1].conn.expect("a dial under way");
            // Queued, not written: the connect has not completed.
            links.queue(0, (0..30).map(|_| (1, vec![round; 100])));
            links.close(poll.registry(), dial);
        }
        let pending = &links.dialers[&1].pending;
        assert_eq!(pending.bytes, pending.frames.iter().map(Queued::len).sum::<usize>());
        assert!(pending.bytes <= cap, "{} bytes wait after 20 failed dials, beyond {cap}", pending.bytes);
        assert_eq!(pending.frames.back().map(|f| f.body.clone()), Some(vec![19; 100]), "the newest stay");
    }

    /// Connections claiming to be a replica, as many as there are, leave that replica's
    /// own connection to us open: its frames keep arriving.
    #[test]
    fn claims_to_be_a_replica_do_not_cut_it_off() {
        use std::net::TcpStream as StdStream;

        let (base, held) = free_ports(2).expect("free loopback ports");
        drop(held);
        // Node 0 listens (and dials replica 1, which is not up: its frames are not read).
        let (out, received, run) = node(0, base, 1, base + 1);
        let addr = SocketAddr::from(([127, 0, 0, 1], base));
        let hello = [&HELLO_MAGIC[..], &1u32.to_le_bytes()].concat();
        let frame = |body: &[u8]| [&(body.len() as u32).to_le_bytes()[..], body].concat();
        let mut replica = StdStream::connect(addr).unwrap();
        replica.write_all(&[hello.clone(), frame(b"first")].concat()).unwrap();
        let next = || received.recv_timeout(Duration::from_secs(10)).expect("a frame from replica 1");
        assert_eq!(next(), vec![(1, b"first".to_vec())]);
        let claims: Vec<StdStream> = (0..2 * MAX_PER_ID)
            .map(|i| {
                let mut c = StdStream::connect(addr).unwrap();
                c.write_all(&[hello.clone(), frame(format!("claim {i}").as_bytes())].concat()).unwrap();
                c
            })
            .collect();
        // Every claim was heard before replica 1 speaks again.
        let mut heard = 0;
        while heard < claims.len() {
            heard += next().len();
        }
        replica.write_all(&frame(b"still here")).unwrap();
        assert_eq!(next(), vec![(1, b"still here".to_vec())]);
        out.shutdown();
        run.join().expect("network thread").expect("network ran");
    }

    /// Links of node 0 (knowing nodes 1 and 2) that accept the connections of a loopback
    /// listener, with frames of up to `max_frame`.
    fn accepting(max_frame: usize) -> (Links, Poll, std::net::TcpListener) {
        let cfg = NetConfig { max_frame, ..config(0, &[0, 1, 2]) };
        let links = Links::new(cfg, Arc::new(Metrics::new(0, &[0, 1, 2])), FIRST_CONN, 1);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        (links, Poll::new().unwrap(), listener)
    }

    /// A peer connected to `links` that said hello as node `id`.
    fn dial_in(links: &mut Links, poll: &Poll, listener: &std::net::TcpListener, id: NodeId) -> std::net::TcpStream {
        dial_in_saying(links, poll, listener, HELLO_MAGIC, id)
    }

    /// [`dial_in`] with the hello `magic` (a shared connection's, say).
    fn dial_in_saying(
        links: &mut Links,
        poll: &Poll,
        listener: &std::net::TcpListener,
        magic: [u8; 4],
        id: NodeId,
    ) -> std::net::TcpStream {
        let mut peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        accepted.set_nonblocking(true).unwrap();
        links.accepted(poll.registry(), TcpStream::from_std(accepted)).unwrap();
        peer.write_all(&[&magic[..], &id.to_le_bytes()].concat()).unwrap();
        peer
    }

    /// One turn of a loop over `links`, as [`Network::turn`] takes it: the frames it read.
    fn turn(links: &mut Links, poll: &mut Poll) -> Received {
        let mut events = Events::with_capacity(16);
        let mut frames = Vec::new();
        let mut deliver = |_, mut got: Received| {
            frames.append(&mut got);
            true
        };
        let unread = links.take_unread();
        let wait = if unread.is_empty() { Duration::from_secs(10) } else { Duration::ZERO };
        poll.poll(&mut events, Some(wait)).unwrap();
        assert!(!events.is_empty() || !unread.is_empty(), "nothing arrived");
        for e in &events {
            links.ready(poll.registry(), e, &mut deliver);
        }
        links.read_unread(poll.registry(), unread, &mut deliver);
        links.deliver_received(&mut deliver);
        frames
    }

    /// A peer that keeps its socket full is read in turns with the others: a turn takes
    /// about [`READ_BUDGET`] from it, and the next turns read on.
    #[test]
    fn a_peer_that_keeps_sending_is_read_in_turns() {
        let (mut links, mut poll, listener) = accepting(1 << 20);
        let mut flood = dial_in(&mut links, &poll, &listener, 1);
        let mut other = dial_in(&mut links, &poll, &listener, 2);
        let frame = [&(60u32 << 10).to_le_bytes()[..], &[1; 60 << 10]].concat();
        let frames = 4 * READ_BUDGET / frame.len();
        let flooding = std::thread::spawn(move || {
            for _ in 0..frames {
                flood.write_all(&frame).unwrap();
            }
            flood
        });
        other.write_all(&[&3u32.to_le_bytes()[..], b"hi!"].concat()).unwrap();
        // Both sockets hold more than a turn's budget by now.
        std::thread::sleep(Duration::from_millis(300));
        let first = turn(&mut links, &mut poll);
        assert!(first.contains(&(2, b"hi!".to_vec())), "the other peer was read in the same turn");
        let flooded: usize = first.iter().filter(|(from, _)| *from == 1).map(|(_, f)| f.len()).sum();
        // Its last read may fill what room the buffer had: up to a frame and a chunk.
        let bound = READ_BUDGET + (60 << 10) + READ_CHUNK;
        assert!(flooded <= bound, "one turn read {flooded} bytes from one peer, beyond {bound}");
        let mut got = first.iter().filter(|(from, _)| *from == 1).count();
        while got < frames {
            got += turn(&mut links, &mut poll).len();
        }
        drop(flooding.join().expect("the flood was written"));
    }

    /// A read that took less than it had room for ends the turn's reading without a read
    /// that only says `WouldBlock`: what arrives later raises an event of its own, and a
    /// close that comes with the last frame is seen too.
    #[test]
    fn reading_stops_at_a_short_read_and_hears_what_comes_after() {
        let (mut links, mut poll, listener) = accepting(1 << 20);
        let mut peer = dial_in(&mut links, &poll, &listener, 1);
        let frame = |b: &[u8]| [&(b.len() as u32).to_le_bytes()[..], b].concat();
        for body in [&b"one"[..], b"two"] {
            peer.write_all(&frame(body)).unwrap();
            let mut frames = Vec::new();
            while frames.is_empty() {
                frames = turn(&mut links, &mut poll);
            }
            assert_eq!(frames, vec![(1, body.to_vec())]);
        }
        peer.write_all(&frame(b"last")).unwrap();
        drop(peer);
        std::thread::sleep(Duration::from_millis(100));
        let mut frames = Vec::new();
        while !links.conns.is_empty() {
            frames.extend(turn(&mut links, &mut poll));
        }
        assert_eq!(frames, vec![(1, b"last".to_vec())]);
    }

    /// A connection's read buffer grows to take a large frame and gives the room back
    /// once it is parsed.
    #[test]
    fn a_large_frame_leaves_no_large_buffer_behind() {
        let (mut links, mut poll, listener) = accepting(4 * READ_BUFFER_KEPT);
        let mut peer = dial_in(&mut links, &poll, &listener, 1);
        let body = vec![7; 3 * READ_BUFFER_KEPT];
        peer.write_all(&[&(body.len() as u32).to_le_bytes()[..], &body].concat()).unwrap();
        let mut frames = Vec::new();
        while frames.is_empty() {
            frames = turn(&mut links, &mut poll);
        }
        assert_eq!(frames, vec![(1, body)]);
        let conn = links.conns.values().next().expect("the connection is open");
        assert!(conn.rbuf.len() <= READ_BUFFER_KEPT, "{} bytes kept for reading", conn.rbuf.len());
    }

    /// Strangers holding no keys that announce large frames and send all but their last
    /// byte cannot make the node hold `max_frame` per slot (32 GiB with the defaults):
    /// connections nobody proved share room for [`UNPROVEN_LARGE_FRAMES`] beyond
    /// [`READ_BUFFER_KEPT`] each, the oldest closing for a newer one. A peer that proves
    /// nothing (a distillation broker) still gets its large frame through.
    #[test]
    fn connections_nobody_proved_share_a_bounded_room_for_large_frames() {
        const MAX_FRAME: usize = 4 << 20;
        const STRANGERS: usize = 16;
        let (mut links, mut poll, listener) = accepting(MAX_FRAME);
        let partial = [&(MAX_FRAME as u32).to_le_bytes()[..], &1u32.to_le_bytes(), &vec![0; MAX_FRAME - 1]].concat();
        let strangers: Vec<_> = (0..STRANGERS)
            .map(|_| {
                let mut s = dial_in_saying(&mut links, &poll, &listener, SHARED_MAGIC, 0);
                let partial = partial.clone();
                // Fails once the node closed it for room; open until joined.
                std::thread::spawn(move || {
                    let _ = s.write_all(&partial);
                    s
                })
            })
            .collect();
        // Read every connection, each within its budget, until the strangers wrote it all
        // and nothing is left to read.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut deliver = |_, _| true;
        let mut quiet = 0;
        while quiet < 20 {
            assert!(Instant::now() < deadline, "the strangers' bytes were not read");
            let before: usize = links.conns.values().map(|c| c.rend).sum();
            let all = links.conns.keys().copied().collect();
            links.read_unread(poll.registry(), all, &mut deliver);
            let after: usize = links.conns.values().map(|c| c.rend).sum();
            let done = strangers.iter().all(|w| w.is_finished());
            quiet = if done && after == before { quiet + 1 } else { 0 };
            std::thread::sleep(Duration::from_millis(5));
        }
        let held: Vec<usize> = links.conns.values().map(|c| c.rbuf.len()).collect();
        let bound = held.len() * READ_BUFFER_KEPT + UNPROVEN_LARGE_FRAMES * MAX_FRAME;
        assert!(held.iter().sum::<usize>() <= bound, "strangers pin {held:?} bytes of read buffer, beyond {bound}");
        assert!(held.len() < STRANGERS, "the oldest strangers closed for room");

        let mut broker = dial_in(&mut links, &poll, &listener, 2);
        let body = vec![7; MAX_FRAME];
        let sending =
            std::thread::spawn(move || broker.write_all(&[&(MAX_FRAME as u32).to_le_bytes()[..], &body].concat()));
        assert_eq!(read_frames(&mut links, &mut poll, 1), vec![(2, vec![7; MAX_FRAME])]);
        sending.join().expect("the broker wrote").expect("its frame was read");
        strangers.into_iter().for_each(|w| drop(w.join().expect("a stranger wrote")));
    }

    /// A replica that restarts dials its peers at once; a peer whose own dial to it failed
    /// while it was down dials back as soon as it hears it, not when its back-off runs
    /// out (an hour here), so the restarted replica hears it too.
    #[test]
    fn a_peer_that_dials_in_is_dialled_back_at_once() {
        let (base, held) = free_ports(2).expect("free loopback ports");
        drop(held);
        let (a_out, _a_in, a) = node(0, base, 1, base + 1);
        a_out.send(&mut vec![(1, b"from a".to_vec())]);
        // Node 1 is not up yet: node 0's first dial fails, the next is an hour away.
        thread::sleep(Duration::from_millis(300));
        let (b_out, b_in, b) = node(1, base + 1, 0, base);
        let frames = b_in.recv_timeout(Duration::from_secs(20)).expect("node 0 dialled node 1 back");
        assert_eq!(frames, vec![(0, b"from a".to_vec())]);
        for (out, run) in [(a_out, a), (b_out, b)] {
            out.shutdown();
            run.join().expect("network thread").expect("network ran");
        }
    }

    /// Node 0's links as [`accepting`] gives them, with `slots` connections at most and a
    /// MAC key shared with node 1 (node 2 holds none), a replica (node 0 would dial it but
    /// does not here) or a client; and node 1's framing, whose frames carry a valid MAC to
    /// node 0.
    fn keyed(slots: usize, replica: bool) -> (Links, Poll, std::net::TcpListener, impl Fn(&[u8]) -> Vec<u8>) {
        use phalanx_core::crypto::{CryptoMode, MacKey};
        let ring = |me, peer| Keyring::new(CryptoMode::Real, me, [(peer, MacKey::from_bytes([7; 32]))].into());
        let cfg = NetConfig {
            max_connections: slots,
            keys: Some(Arc::new(ring(0, 1))),
            dial: if replica { vec![(1, SocketAddr::from(([127, 0, 0, 1], 9)))] } else { Vec::new() },
            ..config(0, &[0, 1, 2])
        };
        let links = Links::new(cfg, Arc::new(Metrics::new(0, &[0, 1, 2])), FIRST_CONN, 1);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let node1 = ring(1, 0);
        let framed = move |body: &[u8]| {
            let frame = wire::frame(1, body, &[node1.mac_to(0, body).expect("a key for node 0")]);
            [&(frame.len() as u32).to_le_bytes()[..], &frame].concat()
        };
        (links, Poll::new().unwrap(), listener, framed)
    }

    /// Whether the other end closed `s` (an orderly close, or a reset if it left bytes
    /// unread) rather than leaving it open and silent.
    fn closed(s: &mut std::net::TcpStream) -> bool {
        s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        match s.read(&mut [0; 64]) {
            Ok(n) => n == 0,
            Err(e) => !matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut),
        }
    }

    /// Turns of the loop until `n` frames were read.
    fn read_frames(links: &mut Links, poll: &mut Poll, n: usize) -> Received {
        let mut got = Vec::new();
        while got.len() < n {
            got.extend(turn(links, poll));
        }
        got
    }

    /// Strangers holding no keys, on as many connections as there are slots and more
    /// (silent, or saying hello as node 1 and sending frames it did not MAC), cannot
    /// take the slot of node 1's connection, which a frame with its MAC proved: each
    /// newcomer takes the oldest stranger's. Once key holders prove every slot, newcomers
    /// are refused.
    #[test]
    fn strangers_cannot_take_the_slots_of_peers_that_prove_their_keys() {
        let (mut links, mut poll, listener, framed) = keyed(4, true);
        let mut node1 = dial_in(&mut links, &poll, &listener, 1);
        node1.write_all(&framed(b"first")).unwrap();
        assert_eq!(read_frames(&mut links, &mut poll, 1).len(), 1);
        let mut strangers: Vec<std::net::TcpStream> = (0..9)
            .map(|i| {
                let mut s = dial_in(&mut links, &poll, &listener, 1);
                if i % 3 != 0 {
                    s.write_all(&[&4u32.to_le_bytes()[..], b"junk"].concat()).unwrap();
                }
                s
            })
            .collect();
        assert_eq!(links.conns.len(), 4);
        node1.write_all(&framed(b"still here")).unwrap();
        let got = read_frames(&mut links, &mut poll, 1 + 2);
        assert!(got.contains(&(1, framed(b"still here")[4..].to_vec())), "node 1 was read: {got:?}");
        for (i, s) in strangers.iter_mut().enumerate() {
            assert_eq!(closed(s), i < 6, "stranger {i}");
        }
        // Node 1 proves three more connections: every slot is proven, and a newcomer is
        // refused rather than taking one.
        let mut more: Vec<_> = (0..3).map(|_| dial_in(&mut links, &poll, &listener, 1)).collect();
        for s in &mut more {
            s.write_all(&framed(b"me too")).unwrap();
        }
        read_frames(&mut links, &mut poll, 3);
        let mut late = dial_in(&mut links, &poll, &listener, 2);
        assert!(closed(&mut late), "refused");
        assert_eq!(links.conns.values().filter(|c| c.proven.contains(&1)).count(), 4);
    }

    /// A node holding keys proves at most [`MAX_PER_ID`] connections: each one beyond
    /// closes its oldest, so it cannot hold the slots the others need either.
    #[test]
    fn a_key_holder_keeps_at_most_four_proven_connections() {
        let (mut links, mut poll, listener, framed) = keyed(MAX_CONNECTIONS, true);
        let mut conns: Vec<_> = (0..MAX_PER_ID + 2).map(|_| dial_in(&mut links, &poll, &listener, 1)).collect();
        for (i, s) in conns.iter_mut().enumerate() {
            s.write_all(&framed(format!("conn {i}").as_bytes())).unwrap();
            read_frames(&mut links, &mut poll, 1);
        }
        for (i, s) in conns.iter_mut().enumerate() {
            assert_eq!(closed(s), i < 2, "connection {i}");
        }
        assert_eq!(links.conns.len(), MAX_PER_ID);
    }

    /// A client with [`MAX_PER_ID`] proven connections that opens one more (reconnecting
    /// while stale ones are open) is not closed by its own hello mid-parse: the hello gets
    /// no route, and the connection takes the oldest's once the client proves itself on it.
    #[test]
    fn a_fifth_connection_of_a_client_gets_a_route_once_proven_in_place_of_its_oldest() {
        let (mut links, mut poll, listener, framed) = keyed(MAX_CONNECTIONS, false);
        let mut proven: Vec<_> = (0..MAX_PER_ID).map(|_| dial_in(&mut links, &poll, &listener, 1)).collect();
        for (i, s) in proven.iter_mut().enumerate() {
            s.write_all(&framed(format!("conn {i}").as_bytes())).unwrap();
            read_frames(&mut links, &mut poll, 1);
        }
        let mut fifth = dial_in(&mut links, &poll, &listener, 1);
        assert!(turn(&mut links, &mut poll).is_empty(), "a hello carries no frame");
        reply_reaches_only(&mut links, &poll, 1, &mut proven[0], b"\x05\0\0\0reply", [&mut fifth].into_iter());
        fifth.write_all(&framed(b"conn 4")).unwrap();
        read_frames(&mut links, &mut poll, 1);
        assert!(closed(&mut proven[0]), "the oldest proven connection went");
        reply_reaches_only(&mut links, &poll, 1, &mut fifth, b"\x05\0\0\0reply", std::iter::empty());
        assert_eq!(links.conns.values().filter(|c| c.proven.contains(&1)).count(), MAX_PER_ID);
    }

    /// Strangers claiming client 1, before it connects and after (more claims than it may
    /// have routes), do not take its route once a frame with its MAC proved its
    /// connection: its frames reach it, and none go to them.
    #[test]
    fn frames_for_a_client_skip_strangers_claiming_it() {
        let (mut links, mut poll, listener, framed) = keyed(MAX_CONNECTIONS, false);
        let mut early = dial_in(&mut links, &poll, &listener, 1);
        let mut client = dial_in(&mut links, &poll, &listener, 1);
        client.write_all(&framed(b"request")).unwrap();
        read_frames(&mut links, &mut poll, 1);
        let mut strangers: Vec<_> = (0..MAX_PER_ID + 1)
            .map(|_| {
                let mut s = dial_in(&mut links, &poll, &listener, 1);
                s.write_all(&[&4u32.to_le_bytes()[..], b"junk"].concat()).unwrap();
                s
            })
            .collect();
        read_frames(&mut links, &mut poll, strangers.len());
        reply_reaches_only(
            &mut links,
            &poll,
            1,
            &mut client,
            b"\x05\0\0\0reply",
            strangers.iter_mut().chain([&mut early]),
        );
    }

    /// Routes a reply to `id`: `reached` reads `expected` (with its framing), and none of
    /// `others` reads a byte.
    fn reply_reaches_only<'a>(
        links: &mut Links,
        poll: &Poll,
        id: NodeId,
        reached: &mut std::net::TcpStream,
        expected: &[u8],
        others: impl Iterator<Item = &'a mut std::net::TcpStream>,
    ) {
        links.route(poll.registry(), [(id, b"reply".to_vec())]);
        reached.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut reply = vec![0; expected.len()];
        reached.read_exact(&mut reply).unwrap();
        assert_eq!(reply, expected);
        for s in others {
            s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
            assert!(!matches!(s.read(&mut [0; 16]), Ok(n) if n > 0), "a frame for {id} reached another");
        }
    }

    /// A client holding keys cannot take another client's frames by naming it on shared
    /// connections it proved with its own MAC, however many: the other client's proof
    /// on its own shared connection keeps them there. Without that proof the key holder's
    /// claims would count as proven routes, push the client's off, and get its frames.
    #[test]
    fn a_key_holder_naming_another_client_on_its_shared_connections_gets_none_of_its_frames() {
        use phalanx_core::crypto::{CryptoMode, MacKey};
        let key = |client: NodeId| MacKey::from_bytes([client as u8; 32]);
        let replica = Keyring::new(CryptoMode::Real, 0, [(1, key(1)), (2, key(2))].into());
        let cfg = NetConfig { keys: Some(Arc::new(replica)), ..config(0, &[0, 1, 2]) };
        let mut links = Links::new(cfg, Arc::new(Metrics::new(0, &[0, 1, 2])), FIRST_CONN, 1);
        let mut poll = Poll::new().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let frame = |client: NodeId, body: &[u8]| {
            [&(body.len() as u32).to_le_bytes()[..], &client.to_le_bytes(), body].concat()
        };
        let proof = |client: NodeId| {
            let ring = Keyring::new(CryptoMode::Real, client, [(0, key(client))].into());
            frame(client, &wire::proof(&ring, 0).expect("a key for node 0"))
        };
        let mut victim = dial_in_saying(&mut links, &poll, &listener, SHARED_MAGIC, 0);
        let mut attackers: Vec<_> =
            (0..MAX_PER_ID + 1).map(|_| dial_in_saying(&mut links, &poll, &listener, SHARED_MAGIC, 0)).collect();
        victim.write_all(&proof(2)).unwrap();
        read_frames(&mut links, &mut poll, 1);
        for a in &mut attackers {
            a.write_all(&[proof(1), frame(2, b"")].concat()).unwrap();
        }
        read_frames(&mut links, &mut poll, attackers.len());
        reply_reaches_only(&mut links, &poll, 2, &mut victim, b"\x05\0\0\0\x02\0\0\0reply", attackers.iter_mut());
    }

    /// A dialer proves itself right after its hello, before it has anything to say (a
    /// subscriber may never say anything); on shared links each client holding a key for
    /// the replica does, and one holding none announces itself.
    #[test]
    fn dialers_prove_themselves_before_they_say_anything() {
        use phalanx_core::crypto::{CryptoMode, MacKey};
        let key = |id: NodeId| MacKey::from_bytes([id as u8; 32]);
        let ring = |me: NodeId| Arc::new(Keyring::new(CryptoMode::Real, me, [(0, key(me))].into()));
        let replica = Keyring::new(CryptoMode::Real, 0, [(1, key(1)), (5, key(5))].into());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let opening = |cfg: NetConfig, clients: &[(NodeId, Option<Arc<Keyring>>)], len: usize| {
            let metrics = || Arc::new(Metrics::new(1, &[0, 1]));
            let mut links = Links::new(cfg, metrics(), FIRST_CONN, 1);
            for (id, keys) in clients {
                links.join(*id, metrics(), keys.clone());
            }
            let mut poll = Poll::new().unwrap();
            links.dial_due(poll.registry(), Instant::now());
            let (mut accepted, _) = listener.accept().unwrap();
            turn(&mut links, &mut poll);
            accepted.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut got = vec![0; len];
            accepted.read_exact(&mut got).unwrap();
            got
        };
        let dial = vec![(0, listener.local_addr().unwrap())];
        let proof = |id| wire::proof(&ring(id), 0).expect("a key for node 0");
        let len = |p: &[u8]| (p.len() as u32).to_le_bytes();

        let one = NetConfig { dial: dial.clone(), keys: Some(ring(1)), ..config(1, &[0, 1]) };
        let expected = [&HELLO_MAGIC[..], &1u32.to_le_bytes(), &len(&proof(1)), &proof(1)].concat();
        assert_eq!(opening(one, &[], expected.len()), expected);
        assert!(wire::authentic(&replica, 1, &proof(1)));

        let shared = NetConfig { dial, shared: true, ..config(1, &[0, 1]) };
        let expected = [
            &SHARED_MAGIC[..],
            &1u32.to_le_bytes(),
            &len(&proof(5)),
            &5u32.to_le_bytes(),
            &proof(5),
            &0u32.to_le_bytes(),
            &6u32.to_le_bytes(),
        ]
        .concat();
        assert_eq!(opening(shared, &[(5, Some(ring(5))), (6, None)], expected.len()), expected);
        assert!(wire::authentic(&replica, 5, &proof(5)));
    }

    /// The slots fit the descriptors left beside the node's own files and dials.
    #[test]
    fn slots_fit_the_open_file_limit() {
        assert_eq!(room_under(1 << 20, 3), MAX_CONNECTIONS);
        assert_eq!(room_under(1024, 3), 1024 - FILES_BESIDE_CONNECTIONS - 3);
        assert_eq!(room_under(16, 3), 0);
        assert!(connection_room(3) > 0);
    }
}
