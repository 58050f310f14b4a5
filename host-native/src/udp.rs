//! Distillation's client ↔ broker hop over UDP: one datagram per core frame.
//!
//! A datagram is `PHU1`, the sender's node id and the recipient's (u32 LE each), then the
//! frame. Frames over [`MAX_FRAME`] bytes (a datagram's 65,507-byte IPv4 limit less the
//! header) are not sent: they are dropped and counted as oversized (a client's frames are
//! a few hundred bytes: a message of at most `max_payload`, a proof, a certificate).
//! Datagrams are read with `recvmmsg` and written with `sendmmsg` on Linux, in batches,
//! and one by one elsewhere.
//!
//! UDP adds no authentication and trusts nothing: the ids in the header only say whom to
//! answer, and the core checks every frame (clients' signatures on submissions and
//! shares, servers' certificates on deliveries). A broker gives each (source address,
//! claimed id) its own address id, which the core answers, so a stranger claiming a
//! client's id cannot cut the client off. Malformed datagrams are dropped
//! and counted (`phalanx_frames_dropped_total{reason="malformed"}`), and so are datagrams
//! from a source address past its token bucket (`reason="rate_limited"`).
//!
//! No acknowledgements or retransmission here: the core's timers already cover the loss
//! of every client ↔ broker frame. A lost submission or delivery is resent by the client
//! on `resubmit_timeout` (to the next broker; a message already delivered is certified
//! again, not delivered twice); a lost inclusion proof or reduction share makes the
//! client a straggler, whose entry is delivered with its own signature.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use mio::net::UdpSocket;
use mio::{Events, Interest, Poll, Token, Waker};
use phalanx_core::NodeId;
use phalanx_core::distill::CLIENT_ADDRESS_BASE;

use crate::metrics::{DropReason, Metrics};
use crate::net::{Divert, Received};

pub const MAGIC: [u8; 4] = *b"PHU1";
pub const HEADER: usize = 12;
/// The largest UDP payload over IPv4.
pub const MAX_DATAGRAM: usize = 65_507;
pub const MAX_FRAME: usize = MAX_DATAGRAM - HEADER;
/// A receive buffer holds any datagram, so none is ever truncated.
const BUFFER: usize = 1 << 16;
/// Socket send and receive buffers asked for, bytes.
#[cfg(target_os = "linux")]
const SOCKET_BUFFER: usize = 4 << 20;
/// Datagrams per `sendmmsg`.
const SEND_BATCH: usize = 64;
/// Most frames handed to the protocol thread in one message.
const DELIVER_FRAMES: usize = 1024;
/// Source addresses with a token bucket, and senders with address ids, at most.
const MAX_TRACKED: usize = 1 << 20;
const SOCKET: Token = Token(0);
const WAKER: Token = Token(1);

fn header(from: NodeId, to: NodeId) -> [u8; HEADER] {
    let mut h = [0; HEADER];
    h[..4].copy_from_slice(&MAGIC);
    h[4..8].copy_from_slice(&from.to_le_bytes());
    h[8..].copy_from_slice(&to.to_le_bytes());
    h
}

/// A datagram's (sender, recipient, frame), if it has the header.
pub fn parse(datagram: &[u8]) -> Option<(NodeId, NodeId, &[u8])> {
    if datagram.len() < HEADER || datagram[..4] != MAGIC {
        return None;
    }
    let id = |at: usize| NodeId::from_le_bytes(datagram[at..at + 4].try_into().expect("4 bytes"));
    Some((id(4), id(8), &datagram[HEADER..]))
}

/// A datagram to send: the header and the core's frame, written without copying.
pub struct Outgoing {
    pub addr: SocketAddr,
    header: [u8; HEADER],
    body: Vec<u8>,
}

impl Outgoing {
    pub fn new(addr: SocketAddr, from: NodeId, to: NodeId, body: Vec<u8>) -> Self {
        Outgoing { addr, header: header(from, to), body }
    }

    fn len(&self) -> usize {
        HEADER + self.body.len()
    }
}

/// A non-blocking UDP socket that reads and writes datagrams in batches.
pub struct Endpoint {
    socket: UdpSocket,
    bufs: Vec<Vec<u8>>,
}

impl Endpoint {
    /// Binds `addr`; up to `batch` datagrams are read per call.
    pub fn bind(addr: SocketAddr, batch: usize) -> io::Result<Self> {
        let socket = UdpSocket::bind(addr)?;
        #[cfg(target_os = "linux")]
        batch::grow_buffers(&socket);
        Ok(Endpoint { socket, bufs: vec![vec![0; BUFFER]; batch.max(1)] })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.socket.local_addr()
    }

    pub fn socket(&mut self) -> &mut UdpSocket {
        &mut self.socket
    }

    /// Reads what is waiting, up to a batch, into `out` as (source, datagram); 0 when
    /// nothing is.
    pub fn recv(&mut self, out: &mut Vec<(SocketAddr, Vec<u8>)>) -> io::Result<usize> {
        loop {
            match batch::recv(&self.socket, &mut self.bufs, out) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                other => return other,
            }
        }
    }

    /// Writes datagrams from the front of `queue` until it is empty (`true`) or the socket
    /// is full (`false`). A datagram the system refuses (no route, too large) is dropped
    /// and counted as `refused`.
    pub fn send(&mut self, queue: &mut VecDeque<Outgoing>, refused: &mut u64) -> bool {
        while !queue.is_empty() {
            match batch::send(&self.socket, queue.make_contiguous()) {
                Ok(n) => {
                    queue.drain(..n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    queue.pop_front();
                    *refused += 1;
                }
            }
        }
        true
    }
}

#[cfg(target_os = "linux")]
mod batch {
    //! `recvmmsg` / `sendmmsg`.
    use std::io;
    use std::mem::{size_of, zeroed};
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
    use std::os::fd::AsRawFd;

    use mio::net::UdpSocket;

    use super::{HEADER, Outgoing, SEND_BATCH, SOCKET_BUFFER};

    fn to_socket_addr(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
        // SAFETY: the kernel wrote a sockaddr of the family it names; both casts stay
        // within the sockaddr_storage.
        unsafe {
            match s.ss_family as libc::c_int {
                libc::AF_INET => {
                    let a = &*(s as *const _ as *const libc::sockaddr_in);
                    let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                    Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(a.sin_port))))
                }
                libc::AF_INET6 => {
                    let a = &*(s as *const _ as *const libc::sockaddr_in6);
                    let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
                    let port = u16::from_be(a.sin6_port);
                    Some(SocketAddr::V6(SocketAddrV6::new(ip, port, a.sin6_flowinfo, a.sin6_scope_id)))
                }
                _ => None,
            }
        }
    }

    fn from_socket_addr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
        // SAFETY: all-zero is a valid sockaddr_storage, and each arm writes a sockaddr
        // that fits in it.
        unsafe {
            let mut s: libc::sockaddr_storage = zeroed();
            let len = match addr {
                SocketAddr::V4(a) => {
                    let sin = &mut *(&mut s as *mut _ as *mut libc::sockaddr_in);
                    sin.sin_family = libc::AF_INET as libc::sa_family_t;
                    sin.sin_port = a.port().to_be();
                    sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
                    size_of::<libc::sockaddr_in>()
                }
                SocketAddr::V6(a) => {
                    let sin = &mut *(&mut s as *mut _ as *mut libc::sockaddr_in6);
                    sin.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                    sin.sin6_port = a.port().to_be();
                    sin.sin6_addr.s6_addr = a.ip().octets();
                    sin.sin6_flowinfo = a.flowinfo();
                    sin.sin6_scope_id = a.scope_id();
                    size_of::<libc::sockaddr_in6>()
                }
            };
            (s, len as libc::socklen_t)
        }
    }

    /// Socket buffers of [`SOCKET_BUFFER`] (as far as the system allows: best effort),
    /// so a burst of a thousand clients' datagrams waits rather than being dropped.
    pub fn grow_buffers(socket: &UdpSocket) {
        let bytes = SOCKET_BUFFER as libc::c_int;
        for option in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
            // SAFETY: the option value is a c_int that outlives the call.
            unsafe {
                libc::setsockopt(
                    socket.as_raw_fd(),
                    libc::SOL_SOCKET,
                    option,
                    (&bytes as *const libc::c_int).cast(),
                    size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
    }

    pub fn recv(socket: &UdpSocket, bufs: &mut [Vec<u8>], out: &mut Vec<(SocketAddr, Vec<u8>)>) -> io::Result<usize> {
        // SAFETY: zeroed sockaddr_storage and mmsghdr are valid; every pointer handed to
        // recvmmsg points into `bufs`, `iovs` or `names`, which outlive the call.
        unsafe {
            let mut names: Vec<libc::sockaddr_storage> = vec![zeroed(); bufs.len()];
            let mut iovs: Vec<libc::iovec> =
                bufs.iter_mut().map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }).collect();
            let mut hdrs: Vec<libc::mmsghdr> = vec![zeroed(); bufs.len()];
            for (i, h) in hdrs.iter_mut().enumerate() {
                h.msg_hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
                h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
                h.msg_hdr.msg_iov = &mut iovs[i];
                h.msg_hdr.msg_iovlen = 1;
            }
            let n = libc::recvmmsg(
                socket.as_raw_fd(),
                hdrs.as_mut_ptr(),
                hdrs.len() as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            );
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = n as usize;
            for i in 0..n {
                if let Some(addr) = to_socket_addr(&names[i]) {
                    out.push((addr, bufs[i][..hdrs[i].msg_len as usize].to_vec()));
                }
            }
            Ok(n)
        }
    }

    /// Sends up to a batch from the front of `queue`; how many went.
    pub fn send(socket: &UdpSocket, queue: &[Outgoing]) -> io::Result<usize> {
        let queue = &queue[..queue.len().min(SEND_BATCH)];
        // SAFETY: as in `recv`: every pointer points into `queue`, `names` or `iovs`, which
        // outlive the call, and sendmmsg only reads through them.
        unsafe {
            let mut names: Vec<(libc::sockaddr_storage, libc::socklen_t)> =
                queue.iter().map(|o| from_socket_addr(&o.addr)).collect();
            let mut iovs: Vec<[libc::iovec; 2]> = queue
                .iter()
                .map(|o| {
                    [
                        libc::iovec { iov_base: o.header.as_ptr() as *mut _, iov_len: HEADER },
                        libc::iovec { iov_base: o.body.as_ptr() as *mut _, iov_len: o.body.len() },
                    ]
                })
                .collect();
            let mut hdrs: Vec<libc::mmsghdr> = vec![zeroed(); queue.len()];
            for (i, h) in hdrs.iter_mut().enumerate() {
                h.msg_hdr.msg_name = (&mut names[i].0 as *mut libc::sockaddr_storage).cast();
                h.msg_hdr.msg_namelen = names[i].1;
                h.msg_hdr.msg_iov = iovs[i].as_mut_ptr();
                h.msg_hdr.msg_iovlen = 2;
            }
            let n = libc::sendmmsg(socket.as_raw_fd(), hdrs.as_mut_ptr(), hdrs.len() as libc::c_uint, 0);
            if n < 0 { Err(io::Error::last_os_error()) } else { Ok(n as usize) }
        }
    }
}

#[cfg(not(target_os = "linux"))]
use portable as batch;

#[cfg(any(not(target_os = "linux"), test))]
mod portable {
    //! One datagram per system call: elsewhere (and in Linux tests, so it is exercised
    //! here too).
    use std::io;
    use std::net::SocketAddr;

    use mio::net::UdpSocket;

    use super::Outgoing;

    pub fn recv(socket: &UdpSocket, bufs: &mut [Vec<u8>], out: &mut Vec<(SocketAddr, Vec<u8>)>) -> io::Result<usize> {
        let mut n = 0;
        for buf in bufs.iter_mut() {
            match socket.recv_from(buf) {
                Ok((len, addr)) => {
                    out.push((addr, buf[..len].to_vec()));
                    n += 1;
                }
                Err(e) if n > 0 && e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }

    pub fn send(socket: &UdpSocket, queue: &[Outgoing]) -> io::Result<usize> {
        let Some(o) = queue.first() else { return Ok(0) };
        let mut datagram = o.header.to_vec();
        datagram.extend_from_slice(&o.body);
        socket.send_to(&datagram, o.addr).map(|_| 1)
    }
}

/// `[runtime] client_datagrams_per_s` and `client_datagram_burst`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: f64,
}

/// A token bucket: `burst` tokens at most, refilled at `per_second`; a datagram takes one.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    pub fn full(limit: &RateLimit, now: Instant) -> Self {
        TokenBucket { tokens: limit.burst, at: now }
    }

    fn refill(&mut self, limit: &RateLimit, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * limit.per_second).min(limit.burst);
        self.at = self.at.max(now);
    }

    /// Takes a token if there is one.
    pub fn take(&mut self, limit: &RateLimit, now: Instant) -> bool {
        self.refill(limit, now);
        let ok = self.tokens >= 1.0;
        if ok {
            self.tokens -= 1.0;
        }
        ok
    }

    /// Whether the bucket refilled (the address has been quiet): forgetting it changes nothing.
    fn is_full(&mut self, limit: &RateLimit, now: Instant) -> bool {
        self.refill(limit, now);
        self.tokens >= limit.burst
    }
}

/// A token bucket per source address, for at most [`MAX_TRACKED`] addresses (beyond
/// that, quiet ones are forgotten; if none is quiet, new addresses wait).
pub struct Limiter {
    limit: RateLimit,
    buckets: HashMap<SocketAddr, TokenBucket>,
    max: usize,
}

impl Limiter {
    pub fn new(limit: RateLimit, max: usize) -> Self {
        Limiter { limit, buckets: HashMap::new(), max }
    }

    pub fn allow(&mut self, addr: SocketAddr, now: Instant) -> bool {
        let limit = self.limit;
        if !self.buckets.contains_key(&addr) && self.buckets.len() >= self.max {
            self.buckets.retain(|_, b| !b.is_full(&limit, now));
            if self.buckets.len() >= self.max {
                return false;
            }
        }
        self.buckets.entry(addr).or_insert_with(|| TokenBucket::full(&limit, now)).take(&limit, now)
    }
}

/// Whom a node talks to over UDP, and how.
#[derive(Clone, Debug)]
pub struct UdpConfig {
    pub me: NodeId,
    pub bind: SocketAddr,
    /// Peers at known addresses (a client's brokers); other peers' addresses are learned
    /// from their datagrams (a broker's clients).
    pub fixed: BTreeMap<NodeId, SocketAddr>,
    /// The ids whose datagrams are taken.
    pub known: BTreeSet<NodeId>,
    /// A broker's limit per client address.
    pub limit: Option<RateLimit>,
    /// Datagrams read per system call.
    pub batch: usize,
    pub send_queue_bytes: usize,
    /// Tests only: the fraction of datagrams dropped, each way (`broker --drop-datagrams`).
    pub loss: f64,
}

/// Whether a frame to a peer goes over UDP.
pub type Carries = Box<dyn Fn(NodeId) -> bool + Send + Sync>;

/// Frames from the protocol thread for peers reached over UDP.
pub struct UdpOutbox {
    frames: Mutex<Vec<(NodeId, Vec<u8>)>>,
    carries: Carries,
    waker: Waker,
    stop: AtomicBool,
}

impl Divert for UdpOutbox {
    fn take(&self, frames: &mut Vec<(NodeId, Vec<u8>)>) {
        let before = frames.len();
        let mut mine = Vec::new();
        frames.retain_mut(|(to, bytes)| {
            let carried = (self.carries)(*to);
            if carried {
                mine.push((*to, std::mem::take(bytes)));
            }
            !carried
        });
        if frames.len() < before {
            self.frames.lock().expect("udp outbox lock").append(&mut mine);
            let _ = self.waker.wake();
        }
    }

    fn shutdown(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
    }
}

/// Where peers reached over UDP are. A fixed peer (a client's broker) is at its address.
/// Any other sender is a (source address, claimed id) pair with an *address id* of its
/// own, which the core sees as the frame's sender and answers: a stranger claiming a
/// client's id is a sender of its own and cannot take the client's answers. (The core
/// answers a submission at its newest few senders, so it bounds them, not this table.)
/// A pair's address id is its claimed id while no other pair holds that, so a client
/// seen from one address keeps its own id.
struct Peers {
    fixed: BTreeMap<NodeId, SocketAddr>,
    ids: HashMap<(SocketAddr, NodeId), NodeId>,
    routes: HashMap<NodeId, (SocketAddr, NodeId)>,
    /// The next address id tried for a pair whose claimed id is held: counting down
    /// through the clients' half of the ids, never reaching a server's.
    next: NodeId,
}

impl Peers {
    fn new(fixed: BTreeMap<NodeId, SocketAddr>) -> Self {
        Peers { fixed, ids: HashMap::new(), routes: HashMap::new(), next: NodeId::MAX }
    }

    /// The address id of datagrams from `addr` claiming `claimed`.
    fn sender(&mut self, claimed: NodeId, addr: SocketAddr) -> NodeId {
        if self.fixed.contains_key(&claimed) {
            return claimed;
        }
        if let Some(&id) = self.ids.get(&(addr, claimed)) {
            return id;
        }
        if self.routes.len() >= MAX_TRACKED {
            // A sender forgotten here gets an address id again from its next datagram.
            let any = *self.routes.keys().next().expect("full");
            let route = self.routes.remove(&any).expect("present");
            self.ids.remove(&route);
        }
        let mut id = claimed;
        while self.routes.contains_key(&id) || self.fixed.contains_key(&id) {
            id = self.next;
            self.next = if self.next > CLIENT_ADDRESS_BASE { self.next - 1 } else { NodeId::MAX };
        }
        self.ids.insert((addr, claimed), id);
        self.routes.insert(id, (addr, claimed));
        id
    }

    /// Where a frame for address id `to` goes, and the id its header names.
    fn route(&self, to: NodeId) -> Option<(SocketAddr, NodeId)> {
        match self.fixed.get(&to) {
            Some(&addr) => Some((addr, to)),
            None => self.routes.get(&to).copied(),
        }
    }
}

/// A small generator for the loss shim (tests only).
struct Loss {
    fraction: f64,
    state: u64,
}

impl Loss {
    fn drops(&mut self) -> bool {
        if self.fraction <= 0.0 {
            return false;
        }
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        ((self.state >> 11) as f64 / (1u64 << 53) as f64) < self.fraction
    }
}

/// The UDP thread's event loop.
pub struct UdpTransport<D: FnMut(Received) -> bool> {
    me: NodeId,
    known: BTreeSet<NodeId>,
    poll: Poll,
    endpoint: Endpoint,
    outbox: Arc<UdpOutbox>,
    peers: Peers,
    limiter: Option<Limiter>,
    queue: VecDeque<Outgoing>,
    queued_bytes: usize,
    send_queue_bytes: usize,
    loss: Loss,
    metrics: Arc<Metrics>,
    deliver: D,
    received: Received,
}

impl<D: FnMut(Received) -> bool> UdpTransport<D> {
    /// Binds (so a bad address fails in the caller's thread). `carries(to)`: whether a
    /// frame to `to` goes over UDP.
    pub fn new(
        cfg: UdpConfig,
        carries: Carries,
        metrics: Arc<Metrics>,
        deliver: D,
    ) -> io::Result<(Self, Arc<UdpOutbox>)> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let mut endpoint = Endpoint::bind(cfg.bind, cfg.batch)?;
        poll.registry().register(endpoint.socket(), SOCKET, Interest::READABLE | Interest::WRITABLE)?;
        let outbox =
            Arc::new(UdpOutbox { frames: Mutex::new(Vec::new()), carries, waker, stop: AtomicBool::new(false) });
        let seed = 0x9e37_79b9_7f4a_7c15 ^ u64::from(cfg.me);
        let transport = UdpTransport {
            me: cfg.me,
            known: cfg.known,
            poll,
            endpoint,
            outbox: outbox.clone(),
            peers: Peers::new(cfg.fixed),
            limiter: cfg.limit.map(|l| Limiter::new(l, MAX_TRACKED)),
            queue: VecDeque::new(),
            queued_bytes: 0,
            send_queue_bytes: cfg.send_queue_bytes,
            loss: Loss { fraction: cfg.loss, state: seed },
            metrics,
            deliver,
            received: Vec::new(),
        };
        Ok((transport, outbox))
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.endpoint.local_addr()
    }

    /// Runs until [`Divert::shutdown`] or the protocol thread goes away.
    pub fn run(mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(64);
        loop {
            if let Err(e) = self.poll.poll(&mut events, None) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            for event in events.iter() {
                if event.token() == WAKER {
                    self.route();
                } else {
                    if event.is_readable() && !self.read()? {
                        return Ok(());
                    }
                    if event.is_writable() {
                        self.flush();
                    }
                }
            }
            if self.outbox.stop.load(Ordering::SeqCst) || !self.deliver_received() {
                return Ok(());
            }
        }
    }

    /// Reads until nothing is waiting; false if the protocol thread is gone.
    fn read(&mut self) -> io::Result<bool> {
        let mut got = Vec::new();
        loop {
            match self.endpoint.recv(&mut got) {
                Ok(0) => return Ok(true),
                Ok(_) => {}
                // An error queued on the socket (an ICMP report, say) says nothing of the
                // datagrams behind it: reading goes on.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::HostUnreachable
                            | io::ErrorKind::NetworkUnreachable
                    ) =>
                {
                    tracing::debug!("node {}: reading datagrams: {e}", self.me);
                    continue;
                }
                Err(e) => return Err(e),
            }
            let now = Instant::now();
            for (addr, datagram) in got.drain(..) {
                self.accept(addr, datagram, now);
            }
            if self.received.len() >= DELIVER_FRAMES && !self.deliver_received() {
                return Ok(false);
            }
        }
    }

    fn accept(&mut self, addr: SocketAddr, mut datagram: Vec<u8>, now: Instant) {
        if self.loss.drops() {
            return;
        }
        if let Some(l) = self.limiter.as_mut()
            && !l.allow(addr, now)
        {
            return self.metrics.dropped(DropReason::RateLimited);
        }
        let Some((from, to, _)) = parse(&datagram) else { return self.metrics.dropped(DropReason::Malformed) };
        if to != self.me || from == self.me || !self.known.contains(&from) {
            return self.metrics.dropped(DropReason::Malformed);
        }
        self.metrics.bytes_in(Some(from), datagram.len() as u64);
        let sender = self.peers.sender(from, addr);
        datagram.drain(..HEADER);
        self.received.push((sender, datagram));
    }

    fn route(&mut self) {
        let frames = std::mem::take(&mut *self.outbox.frames.lock().expect("udp outbox lock"));
        for (to, bytes) in frames {
            if bytes.len() > MAX_FRAME {
                self.metrics.dropped(DropReason::Oversized);
                continue;
            }
            let Some((addr, named)) = self.peers.route(to) else {
                // A client not heard from: it resubmits, and is answered then.
                self.metrics.dropped(DropReason::UnknownPeer);
                continue;
            };
            if self.loss.drops() {
                continue;
            }
            let out = Outgoing::new(addr, self.me, named, bytes);
            if self.queued_bytes + out.len() > self.send_queue_bytes {
                self.metrics.dropped(DropReason::SendQueueFull);
                continue;
            }
            self.metrics.bytes_out(named, out.len() as u64);
            self.queued_bytes += out.len();
            self.queue.push_back(out);
        }
        self.flush();
    }

    fn flush(&mut self) {
        let mut refused = 0;
        self.endpoint.send(&mut self.queue, &mut refused);
        self.metrics.dropped_many(DropReason::UnknownPeer, refused);
        self.queued_bytes = self.queue.iter().map(Outgoing::len).sum();
    }

    fn deliver_received(&mut self) -> bool {
        self.received.is_empty() || (self.deliver)(std::mem::take(&mut self.received))
    }
}

/// Binds and starts the UDP thread of a node (pinned to `core` if given). Its local
/// address, and where the frames the node sends to peers that `carries` names go (an
/// [`crate::net::Outbox`]'s or a client loop's divert).
pub fn spawn(
    cfg: UdpConfig,
    carries: Carries,
    metrics: Arc<Metrics>,
    deliver: impl FnMut(Received) -> bool + Send + 'static,
    core: Option<core_affinity::CoreId>,
) -> io::Result<(SocketAddr, Arc<dyn Divert>)> {
    let me = cfg.me;
    let (transport, udp_outbox) = UdpTransport::new(cfg, carries, metrics, deliver)?;
    let addr = transport.local_addr()?;
    std::thread::Builder::new().name(format!("udp-{me}")).spawn(move || {
        if let Some(core) = core {
            core_affinity::set_for_current(core);
        }
        if let Err(e) = transport.run() {
            tracing::error!("node {me}: the UDP thread failed: {e}");
        }
    })?;
    Ok((addr, udp_outbox))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_token_bucket_allows_its_burst_then_its_rate() {
        let limit = RateLimit { per_second: 10.0, burst: 3.0 };
        let t0 = Instant::now();
        let mut b = TokenBucket::full(&limit, t0);
        assert!((0..3).all(|_| b.take(&limit, t0)));
        assert!(!b.take(&limit, t0));
        // 10 a second: one more after 100 ms, not two.
        let t1 = t0 + Duration::from_millis(100);
        assert!(b.take(&limit, t1));
        assert!(!b.take(&limit, t1));
        // A long quiet spell refills to the burst, no further.
        let t2 = t1 + Duration::from_secs(60);
        assert_eq!((0..10).filter(|_| b.take(&limit, t2)).count(), 3);
    }

    #[test]
    fn the_limiter_keeps_a_bucket_per_address_and_forgets_quiet_ones() {
        let limit = RateLimit { per_second: 1.0, burst: 2.0 };
        let (a, b, c): (SocketAddr, SocketAddr, SocketAddr) =
            ("127.0.0.1:1".parse().unwrap(), "127.0.0.1:2".parse().unwrap(), "127.0.0.1:3".parse().unwrap());
        let mut l = Limiter::new(limit, 2);
        let t0 = Instant::now();
        assert_eq!((0..5).filter(|_| l.allow(a, t0)).count(), 2);
        // Another address is not held back by a's flood.
        assert!(l.allow(b, t0));
        // Two addresses tracked, both busy: a third waits...
        assert!(!l.allow(c, t0));
        // ...until one has been quiet long enough to be forgotten.
        assert!(l.allow(c, t0 + Duration::from_secs(3)));
    }

    /// 100 frames of 0 to 396 bytes from one endpoint to another, written and read with
    /// `send` and `recv` (batched on Linux), or with the portable one-by-one calls.
    fn round_trip(portable: bool) {
        let mut a = Endpoint::bind("127.0.0.1:0".parse().unwrap(), 8).unwrap();
        let mut b = Endpoint::bind("127.0.0.1:0".parse().unwrap(), 8).unwrap();
        let to = b.local_addr().unwrap();
        let mut queue: VecDeque<Outgoing> =
            (0..100u32).map(|i| Outgoing::new(to, 7, 9, i.to_le_bytes().repeat(i as usize))).collect();
        if portable {
            while !queue.is_empty() {
                let n = super::portable::send(&a.socket, queue.make_contiguous()).unwrap();
                queue.drain(..n);
            }
        } else {
            let mut refused = 0;
            assert!(a.send(&mut queue, &mut refused));
            assert_eq!(refused, 0);
        }
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < 100 && Instant::now() < deadline {
            let read = match portable {
                true => super::portable::recv(&b.socket, &mut b.bufs, &mut got).unwrap_or(0),
                false => b.recv(&mut got).unwrap(),
            };
            if read == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let frames: Vec<Vec<u8>> = got
            .iter()
            .map(|(from, d)| {
                assert_eq!(*from, a.local_addr().unwrap());
                let (f, t, frame) = parse(d).unwrap();
                assert_eq!((f, t), (7, 9));
                frame.to_vec()
            })
            .collect();
        let sent: Vec<Vec<u8>> = (0..100u32).map(|i| i.to_le_bytes().repeat(i as usize)).collect();
        assert_eq!(frames, sent);
    }

    /// A broker answers a client at the address its submission came from. A stranger who
    /// knows only the id (ids are dense) and the broker's address sends a junk datagram
    /// claiming it from each of many ports of its own, after the client's submission: each
    /// is a sender of its own, and the broker's answer (an inclusion proof, a delivery)
    /// still reaches the client.
    #[test]
    fn a_stranger_claiming_a_clients_id_from_many_ports_does_not_cut_it_off() {
        const BROKER: NodeId = 100;
        const CLIENT: NodeId = 1 << 31;
        const STRANGERS: usize = 8;
        let local = |port| SocketAddr::from(([127, 0, 0, 1], port));
        let cfg = UdpConfig {
            me: BROKER,
            bind: local(0),
            fixed: BTreeMap::new(),
            known: [CLIENT].into_iter().collect(),
            limit: Some(RateLimit { per_second: 1000.0, burst: 1000.0 }),
            batch: 8,
            send_queue_bytes: 1 << 20,
            loss: 0.0,
        };
        let senders = Arc::new(Mutex::new(Vec::new()));
        let seen = senders.clone();
        let deliver = move |r: Received| {
            seen.lock().unwrap().extend(r.into_iter().map(|(from, _)| from));
            true
        };
        let metrics = Arc::new(Metrics::new(BROKER, &[]));
        let (broker, outbox) = spawn(cfg, Box::new(|to| to != BROKER), metrics, deliver, None).unwrap();
        let client = std::net::UdpSocket::bind(local(0)).unwrap();
        client.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let datagram = |body: &[u8]| [&header(CLIENT, BROKER)[..], body].concat();
        client.send_to(&datagram(b"a submission"), broker).unwrap();
        let strangers: Vec<_> = (0..STRANGERS).map(|_| std::net::UdpSocket::bind(local(0)).unwrap()).collect();
        let wait_for = |n: usize| {
            let deadline = Instant::now() + Duration::from_secs(2);
            while senders.lock().unwrap().len() < n && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
        };
        wait_for(1);
        for s in &strangers {
            s.send_to(&datagram(b"junk"), broker).unwrap();
        }
        wait_for(1 + STRANGERS);
        let senders = senders.lock().unwrap().clone();
        assert_eq!(senders.len(), 1 + STRANGERS);
        assert_eq!(senders[0], CLIENT, "a client alone at its id keeps it");
        assert_eq!(senders.iter().collect::<BTreeSet<_>>().len(), senders.len(), "a sender per address");
        // The core answers the client's submission at its sender, and a stranger's at its own.
        outbox.take(&mut vec![(CLIENT, b"an inclusion proof".to_vec()), (senders[1], b"an answer".to_vec())]);
        let mut buf = [0u8; 256];
        let got = |socket: &std::net::UdpSocket, buf: &mut [u8]| {
            socket.recv_from(buf).ok().and_then(|(len, _)| parse(&buf[..len]).map(|(f, t, b)| (f, t, b.to_vec())))
        };
        assert_eq!(got(&client, &mut buf), Some((BROKER, CLIENT, b"an inclusion proof".to_vec())));
        let answered: Vec<_> = strangers
            .iter()
            .filter_map(|s| {
                s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                got(s, &mut buf)
            })
            .collect();
        outbox.shutdown();
        // Named by the id it claimed: it reads as an answer to that id.
        assert_eq!(answered, vec![(BROKER, CLIENT, b"an answer".to_vec())]);
    }

    #[test]
    fn senders_get_address_ids_of_their_own_and_fixed_peers_keep_theirs() {
        let addr = |port| SocketAddr::from(([127, 0, 0, 1], port));
        let mut peers = Peers::new([(7, addr(7))].into_iter().collect());
        assert_eq!(peers.sender(7, addr(99)), 7, "a fixed peer is itself from anywhere");
        assert_eq!(peers.route(7), Some((addr(7), 7)));
        assert_eq!(peers.sender(20, addr(1)), 20);
        assert_eq!(peers.sender(20, addr(1)), 20, "stable");
        let other = peers.sender(20, addr(2));
        assert_ne!(other, 20);
        // A client claiming the id taken by another's address gets one of its own.
        let taken = peers.sender(other, addr(3));
        assert!(![20, other, 7].contains(&taken));
        assert_eq!(peers.route(20), Some((addr(1), 20)));
        assert_eq!(peers.route(other), Some((addr(2), 20)));
        assert_eq!(peers.route(taken), Some((addr(3), other)));
        assert_eq!(peers.route(21), None);
        // A stranger claiming a fixed peer's id from elsewhere gets no new route to it.
        assert_eq!(peers.sender(7, addr(4)), 7);
        assert_eq!(peers.route(7), Some((addr(7), 7)));
    }

    #[test]
    fn datagrams_carry_their_ids_and_a_batch_goes_out_and_comes_back_whole() {
        assert_eq!(parse(b"PHU1"), None);
        assert_eq!(parse(b"XXXX\x01\0\0\0\x02\0\0\0"), None);
        round_trip(false);
        round_trip(true);
    }
}
