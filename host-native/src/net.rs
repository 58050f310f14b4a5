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
//! Bounds: a frame longer than `max_frame` closes the connection (the stream cannot be
//! trusted past a lying length); each peer's send queue holds at most
//! `send_queue_bytes`, beyond which frames are dropped and counted (the protocols
//! retransmit); at most [`MAX_CONNECTIONS`] connections, [`MAX_PER_ID`] per claimed id.
//! Frames leave in coalesced `writev` calls of up to [`WRITEV_FRAMES`] frames, and reach
//! the protocol thread in messages of up to [`DELIVER_FRAMES`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::{self, IoSlice, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use mio::event::Event;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Registry, Token, Waker};
use phalanx_core::NodeId;

use crate::metrics::{DropReason, Metrics};

pub const HELLO_MAGIC: [u8; 4] = *b"PHX1";
pub const MAX_CONNECTIONS: usize = 1024;
pub const MAX_PER_ID: usize = 4;
const WRITEV_FRAMES: usize = 64;
const READ_CHUNK: usize = 64 << 10;
/// Most frames handed to the protocol thread in one message.
const DELIVER_FRAMES: usize = 1024;
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

/// A frame as queued: its header (a data frame's length prefix, or the whole hello) and
/// its body, written as separate `writev` slices so the core's bytes are never copied.
struct Queued {
    header: [u8; 8],
    header_len: usize,
    body: Vec<u8>,
}

impl Queued {
    fn data(body: Vec<u8>) -> Self {
        let mut header = [0; 8];
        header[..4].copy_from_slice(&(body.len() as u32).to_le_bytes());
        Queued { header, header_len: 4, body }
    }

    fn hello(me: NodeId) -> Self {
        let mut header = [0; 8];
        header[..4].copy_from_slice(&HELLO_MAGIC);
        header[4..].copy_from_slice(&me.to_le_bytes());
        Queued { header, header_len: 8, body: Vec::new() }
    }

    fn is_hello(&self) -> bool {
        self.header_len == 8
    }

    fn len(&self) -> usize {
        self.header_len + self.body.len()
    }

    /// What is left to write after `offset` bytes, as (header, body) slices.
    fn unwritten(&self, offset: usize) -> [&[u8]; 2] {
        let header = &self.header[..self.header_len];
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

    /// Writes as much as the socket takes; `Ok(true)` when the queue emptied.
    fn flush(&mut self, stream: &mut TcpStream, peer: Option<NodeId>, metrics: &Metrics) -> io::Result<bool> {
        while !self.frames.is_empty() {
            let slices: Vec<IoSlice> = self
                .frames
                .iter()
                .take(WRITEV_FRAMES)
                .enumerate()
                .flat_map(|(i, f)| f.unwritten(if i == 0 { self.offset } else { 0 }))
                .filter(|s| !s.is_empty())
                .map(IoSlice::new)
                .collect();
            let mut written = match stream.write_vectored(&slices) {
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
                    // Counted per whole frame sent (the hello included).
                    if let Some(p) = peer {
                        metrics.bytes_out(p, front.len() as u64);
                    }
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

struct Conn {
    stream: TcpStream,
    /// The id its hello claimed (or the replica we dialed).
    peer: Option<NodeId>,
    /// Set on connections this node dialed: until the connect completes, nothing is sent.
    dialed: Option<NodeId>,
    connected: bool,
    /// Received bytes: `rbuf[rstart..rend]` is unparsed; the rest is room, zeroed once
    /// when the buffer grew rather than before every read.
    rbuf: Vec<u8>,
    rstart: usize,
    rend: usize,
    queue: SendQueue,
}

/// A replica this node dials: its address, reconnect schedule and frames waiting for a
/// connection.
struct Dialer {
    addr: SocketAddr,
    conn: Option<usize>,
    next_attempt: Instant,
    backoff: Duration,
    pending: SendQueue,
}

/// Frames received, each with the peer it came from.
pub type Received = Vec<(NodeId, Vec<u8>)>;

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
    /// Connections that said hello with an id, oldest first (clients reached this way).
    by_id: BTreeMap<NodeId, Vec<usize>>,
    metrics: Arc<Metrics>,
    /// Frames read in this turn of the loop, not yet delivered.
    received: Received,
    /// Set once `deliver` refused frames: whoever consumes them is gone.
    receiver_gone: bool,
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
            received: Vec::new(),
            receiver_gone: false,
        }
    }

    pub fn me(&self) -> NodeId {
        self.cfg.me
    }

    /// Whether `deliver` refused frames (its consumer went away).
    pub fn receiver_gone(&self) -> bool {
        self.receiver_gone
    }

    /// How long until the next dial is due, if a dialed replica is not connected.
    pub fn next_dial(&self, now: Instant) -> Option<Duration> {
        self.dialers.values().filter(|d| d.conn.is_none()).map(|d| d.next_attempt.saturating_duration_since(now)).min()
    }

    /// Handles a readiness event of one of this node's connections.
    pub fn ready(&mut self, registry: &Registry, event: &Event, deliver: &mut dyn FnMut(Received) -> bool) {
        let t = event.token().0;
        let mut alive = true;
        if event.is_writable() || event.is_error() {
            alive = self.on_writable(t);
        }
        if alive && (event.is_readable() || event.is_read_closed()) {
            alive = self.on_readable(registry, t, deliver);
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
            peer: dialed,
            dialed,
            connected: dialed.is_none(),
            rbuf: Vec::new(),
            rstart: 0,
            rend: 0,
            queue: SendQueue::default(),
        };
        self.conns.insert(token, conn);
        self.metrics.connections(1);
        Ok(token)
    }

    /// Takes a connection a listener accepted, unless [`MAX_CONNECTIONS`] are open.
    pub fn accepted(&mut self, registry: &Registry, stream: TcpStream) -> io::Result<()> {
        if self.conns.len() >= MAX_CONNECTIONS {
            self.metrics.dropped(DropReason::BadHandshake);
            return Ok(());
        }
        self.register(registry, stream, None).map(drop)
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
                    conn.queue.frames.push_back(Queued::hello(self.cfg.me));
                    conn.queue.bytes += 8;
                }
                Err(e) => tracing::debug!("connecting to replica {id} at {addr}: {e}"),
            }
        }
    }

    /// Queues frames to their peers and writes what the sockets take now.
    pub fn route(&mut self, registry: &Registry, frames: impl IntoIterator<Item = (NodeId, Vec<u8>)>) {
        let mut touched = BTreeSet::new();
        for (to, bytes) in frames {
            if bytes.len() > self.cfg.max_frame {
                self.metrics.dropped(DropReason::Oversized);
                continue;
            }
            let cap = self.cfg.send_queue_bytes;
            if let Some(d) = self.dialers.get_mut(&to) {
                match d.conn.and_then(|t| self.conns.get_mut(&t)) {
                    Some(c) => {
                        c.queue.push(Queued::data(bytes), cap, &self.metrics);
                        touched.insert(d.conn.expect("connected"));
                    }
                    None => d.pending.push(Queued::data(bytes), cap, &self.metrics),
                }
            } else if let Some(tokens) = self.by_id.get(&to) {
                for t in tokens {
                    if let Some(c) = self.conns.get_mut(t) {
                        c.queue.push(Queued::data(bytes.clone()), cap, &self.metrics);
                        touched.insert(*t);
                    }
                }
            } else {
                // A client that is not connected: it retransmits, and gets the reply then.
                self.metrics.dropped(DropReason::UnknownPeer);
            }
        }
        for t in touched {
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
        c.queue.flush(&mut c.stream, c.peer, &self.metrics).is_ok()
    }

    /// Reads what arrived and delivers whole frames; false if the connection is done.
    fn on_readable(&mut self, registry: &Registry, t: usize, deliver: &mut dyn FnMut(Received) -> bool) -> bool {
        loop {
            let Some(c) = self.conns.get_mut(&t) else { return false };
            // Room for a chunk: the unparsed bytes move to the front, or the buffer grows
            // (to at most a chunk beyond the largest frame, as parsing goes on per read).
            if c.rbuf.len() - c.rend < READ_CHUNK {
                c.rbuf.copy_within(c.rstart..c.rend, 0);
                c.rend -= c.rstart;
                c.rstart = 0;
                if c.rbuf.len() - c.rend < READ_CHUNK {
                    c.rbuf.resize(c.rend + READ_CHUNK, 0);
                }
            }
            let read = c.stream.read(&mut c.rbuf[c.rend..]);
            match read {
                Ok(0) => return false,
                // Deliver as we go, so one busy peer cannot grow the buffer unbounded.
                Ok(n) => {
                    c.rend += n;
                    if !self.parse(registry, t, deliver) {
                        return false;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }

    /// Takes the hello and whole frames off the read buffer; false closes the connection.
    fn parse(&mut self, registry: &Registry, t: usize, deliver: &mut dyn FnMut(Received) -> bool) -> bool {
        let max = self.cfg.max_frame;
        loop {
            let c = self.conns.get_mut(&t).expect("parsing a live connection");
            let buf = &c.rbuf[c.rstart..c.rend];
            if c.peer.is_none() {
                if buf.len() < 8 {
                    break;
                }
                let id = NodeId::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
                if buf[..4] != HELLO_MAGIC || !self.cfg.known.contains(&id) || id == self.cfg.me {
                    let reason =
                        if buf[..4] != HELLO_MAGIC { DropReason::BadHandshake } else { DropReason::UnknownPeer };
                    self.metrics.dropped(reason);
                    return false;
                }
                c.peer = Some(id);
                c.rstart += 8;
                // A replica that dials us is up: dial it back now, not when our back-off
                // runs out (up to `reconnect_max`), or after a restart it hears nothing
                // from us meanwhile while we hear it. Once per hello, so a peer claiming
                // the id can cause no more dials than it makes connections.
                if let Some(d) = self.dialers.get_mut(&id).filter(|d| d.conn.is_none()) {
                    d.next_attempt = Instant::now();
                }
                let ids = self.by_id.entry(id).or_default();
                ids.push(t);
                // The newest connections claiming an id win; the oldest beyond the cap go.
                if ids.len() > MAX_PER_ID {
                    let oldest = ids.remove(0);
                    self.close(registry, oldest);
                }
                continue;
            }
            if buf.len() < 4 {
                break;
            }
            let len = u32::from_le_bytes(buf[..4].try_into().expect("4 bytes")) as usize;
            if len > max {
                self.metrics.dropped(DropReason::Oversized);
                return false;
            }
            if buf.len() < 4 + len {
                break;
            }
            let bytes = buf[4..4 + len].to_vec();
            let from = c.peer.expect("after the hello");
            c.rstart += 4 + len;
            self.metrics.bytes_in(Some(from), 4 + len as u64);
            self.received.push((from, bytes));
            // A peer that keeps the socket full is delivered in parts, as the channel
            // takes them.
            if self.received.len() >= DELIVER_FRAMES && !self.deliver_received(deliver) {
                return false;
            }
        }
        let c = self.conns.get_mut(&t).expect("parsing a live connection");
        if c.rstart == c.rend {
            (c.rstart, c.rend) = (0, 0);
        }
        true
    }

    /// Hands what was read on; false (and [`Links::receiver_gone`] from now on) if its
    /// consumer is gone.
    pub fn deliver_received(&mut self, deliver: &mut dyn FnMut(Received) -> bool) -> bool {
        if !self.received.is_empty() && !deliver(std::mem::take(&mut self.received)) {
            self.receiver_gone = true;
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
        if let Some(id) = c.peer
            && let Some(ids) = self.by_id.get_mut(&id)
        {
            ids.retain(|&x| x != t);
            if ids.is_empty() {
                self.by_id.remove(&id);
            }
        }
        if let Some(id) = c.dialed
            && let Some(d) = self.dialers.get_mut(&id)
            && d.conn == Some(t)
        {
            d.conn = None;
            // Unsent frames wait for the next connection; the hello is resent with it.
            let mut left = c.queue.take();
            if left.frames.front().is_some_and(Queued::is_hello) {
                left.bytes -= 8;
                left.frames.pop_front();
            }
            left.frames.extend(d.pending.frames.drain(..));
            left.bytes += d.pending.bytes;
            d.pending = left;
            if c.connected {
                tracing::info!("node {}: connection to replica {id} lost", self.cfg.me);
            }
        }
    }
}

/// The network thread of one node: its [`Links`] in a mio loop of their own, with the
/// listener (replicas) and the [`Outbox`] waker. `deliver(frames)` hands the frames read
/// in one turn of the loop to the protocol thread at once, waking it once rather than
/// per frame (blocking when it is behind, which pushes back on the senders through
/// TCP); it returns false when the protocol thread is gone.
pub struct Network<D: FnMut(Received) -> bool> {
    poll: Poll,
    outbox: Arc<Outbox>,
    listener: Option<TcpListener>,
    links: Links,
    deliver: D,
}

impl<D: FnMut(Received) -> bool> Network<D> {
    /// Binds the listener (so a bad address fails here, in the caller's thread).
    pub fn new(cfg: NetConfig, metrics: Arc<Metrics>, deliver: D) -> io::Result<(Self, Arc<Outbox>)> {
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
        Ok((Network { poll, outbox: outbox.clone(), listener, links, deliver }, outbox))
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Runs until [`Outbox::shutdown`] or the protocol thread goes away.
    pub fn run(mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        loop {
            let now = Instant::now();
            self.links.dial_due(self.poll.registry(), now);
            if let Err(e) = self.poll.poll(&mut events, self.links.next_dial(now)) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept()?,
                    WAKER => {
                        if self.stopped() {
                            return Ok(());
                        }
                        let frames = std::mem::take(&mut *self.outbox.frames.lock().expect("outbox lock"));
                        self.links.route(self.poll.registry(), frames);
                    }
                    _ => self.links.ready(self.poll.registry(), event, &mut self.deliver),
                }
            }
            if !self.links.deliver_received(&mut self.deliver) || self.stopped() {
                return Ok(());
            }
        }
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
    use std::sync::mpsc;
    use std::thread;

    use super::*;
    use crate::local_cluster::free_ports;

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
            me,
            listen: Some(loopback(port)),
            dial: vec![(peer, loopback(peer_port))],
            known: [me, peer].into(),
            max_frame: 1024,
            send_queue_bytes: 1 << 20,
            reconnect_min: hour,
            reconnect_max: hour,
        };
        let (tx, rx) = mpsc::channel();
        let metrics = Arc::new(Metrics::new(me, &[me, peer]));
        let (net, outbox) = Network::new(cfg, metrics, move |frames| tx.send(frames).is_ok()).expect("binds");
        (outbox, rx, thread::spawn(move || net.run()))
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
}
