//! One event loop — one thread, one mio poll — hosting any number of client nodes.
//!
//! Each hosted node is a whole client identity as a replica sees it: its own core (its
//! own keys and MACs) and its own request-number storage. The nodes that dial the same
//! replicas share one connection to each ([`Links`] with `shared` set: each frame names
//! its client), so a round of many clients' requests leaves in one write per replica
//! and their replies arrive in one read. Each node's protocol rounds are [`Driver`]'s,
//! so storage is synced before anything that depends on it is sent, as on a replica.
//!
//! Callers hand events (submissions, requests) over through a channel and wake the loop
//! only when it is not already due to look (one wake-up takes every command queued by
//! then), so submitting never waits for the loop. What each node's rounds produce comes
//! back as [`News`] tagged with the node's id, on a channel the caller chose when it
//! added the node (one per node, or one shared by many: [`NewsTo`]). Each turn sends a
//! channel all its nodes' news in one message, so a consumer sharing the loop's core is
//! woken once a turn, not once per node between the sends.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use mio::{Events, Poll, Token, Waker};
use phalanx_core::NodeId;

use crate::driver::{AppEvent, Driver, Event};
use crate::metrics::{DropReason, Metrics};
use crate::net::{Deliver, Divert, Links, NetConfig, Received};
use crate::runtime::Prepared;

const WAKER: Token = Token(0);
/// A connection's token carries its shared links' slot in its low bits (slot 0 is the
/// waker's). Nodes number their commands with slots below [`SHARED_SLOTS`], shared links
/// take theirs from there up.
const SLOT_BITS: u32 = 24;
const SLOT_MASK: usize = (1 << SLOT_BITS) - 1;
const SHARED_SLOTS: usize = 1 << (SLOT_BITS - 1);
/// Longest the loop sleeps with nothing due (nodes' timers and dials wake it sooner).
const IDLE: Duration = Duration::from_secs(1);
/// Most frames an [`Inlet`] holds for the loop to take: a transport that receives faster
/// than the loop handles (a Byzantine broker flooding a distillation client) drops the
/// rest, counted, rather than queueing without bound.
pub const INLET_FRAMES: usize = 1 << 16;

/// What one node's round produced, or why the node stopped (it left the loop then).
#[derive(Debug)]
pub struct News {
    pub id: NodeId,
    pub events: Result<Vec<AppEvent>, String>,
}

/// Where hosted nodes' news go: the nodes added with clones of one `NewsTo` share its
/// channel, and each turn of the loop sends them what all of those nodes said in one
/// message, in the order they said it.
#[derive(Clone)]
pub struct NewsTo(Arc<Sender<Vec<News>>>);

impl NewsTo {
    /// A channel for news: where nodes tell them, and where they are received.
    pub fn channel() -> (NewsTo, Receiver<Vec<News>>) {
        let (tx, rx) = mpsc::channel();
        (NewsTo(Arc::new(tx)), rx)
    }
}

enum Command {
    Add {
        slot: usize,
        node: Box<Prepared>,
        news: NewsTo,
    },
    Event {
        slot: usize,
        event: Event,
    },
    /// Frames an inlet received, `held` counting them until the loop takes them.
    Inlet {
        slot: usize,
        frames: Received,
        held: Arc<AtomicUsize>,
    },
    Divert {
        slot: usize,
        divert: Arc<dyn Divert>,
    },
    Remove {
        slot: usize,
        done: Sender<()>,
    },
}

/// The caller's side of a running loop. The loop stops when the last handle onto it
/// (this, or a [`Hosted`] node's) is dropped.
pub struct ClientLoop {
    commands: Sender<Command>,
    waker: Waker,
    /// Set while a wake-up is pending, so a burst of commands wakes the loop once.
    woken: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    next_slot: AtomicUsize,
    thread: Option<JoinHandle<()>>,
}

impl ClientLoop {
    /// Starts the loop's thread.
    pub fn start(name: &str) -> io::Result<Arc<Self>> {
        let poll = Poll::new()?;
        let waker = Waker::new(poll.registry(), WAKER)?;
        let (tx, rx) = mpsc::channel();
        let woken = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let mut event_loop = EventLoop {
            poll,
            commands: rx,
            woken: woken.clone(),
            stop: stop.clone(),
            nodes: BTreeMap::new(),
            shared: BTreeMap::new(),
            timers: BTreeSet::new(),
            told: Vec::new(),
        };
        let thread = thread::Builder::new().name(name.into()).spawn(move || {
            if let Err(e) = event_loop.run() {
                tracing::error!("the client event loop failed: {e}");
            }
        })?;
        Ok(Arc::new(ClientLoop {
            commands: tx,
            waker,
            woken,
            stop,
            next_slot: AtomicUsize::new(1),
            thread: Some(thread),
        }))
    }

    /// Hosts `node` in the loop; its rounds' news go to `news`.
    pub fn add(self: &Arc<Self>, node: Prepared, news: NewsTo) -> Result<Hosted, String> {
        let slot = self.next_slot.fetch_add(1, Ordering::Relaxed);
        if slot >= SHARED_SLOTS {
            return Err(format!("a client event loop hosts at most {} nodes over its life", SHARED_SLOTS - 1));
        }
        let (id, metrics) = (node.id, node.metrics.clone());
        self.command(Command::Add { slot, node: Box::new(node), news })?;
        Ok(Hosted { id, slot, metrics, event_loop: self.clone(), removed: false })
    }

    fn command(&self, command: Command) -> Result<(), String> {
        self.commands.send(command).map_err(|_| "the client event loop stopped")?;
        // The loop clears `woken` before it takes commands: either it sees this one, or
        // this sees `woken` clear and wakes it.
        if !self.woken.swap(true, Ordering::SeqCst) {
            self.waker.wake().map_err(|e| format!("waking the client event loop: {e}"))?;
        }
        Ok(())
    }
}

impl Drop for ClientLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A node hosted in a [`ClientLoop`].
pub struct Hosted {
    id: NodeId,
    slot: usize,
    metrics: Arc<Metrics>,
    event_loop: Arc<ClientLoop>,
    removed: bool,
}

impl Hosted {
    pub fn id(&self) -> NodeId {
        self.id
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Hands `event` (`Submit` or `Request`) to the node without waiting; what comes of
    /// it arrives as news.
    pub fn send(&self, event: Event) -> Result<(), String> {
        self.event_loop.command(Command::Event { slot: self.slot, event })
    }

    /// From now on the frames `divert` carries leave through it, not the node's links
    /// (a distillation client's datagrams to brokers: [`crate::udp`]).
    pub fn divert(&self, divert: Arc<dyn Divert>) -> Result<(), String> {
        self.event_loop.command(Command::Divert { slot: self.slot, divert })
    }

    /// Where another transport hands the node the frames it received. It does not keep
    /// the loop running.
    pub fn inlet(&self) -> Inlet {
        Inlet {
            event_loop: Arc::downgrade(&self.event_loop),
            slot: self.slot,
            held: Arc::new(AtomicUsize::new(0)),
            metrics: self.metrics.clone(),
        }
    }

    /// Takes the node out of the loop (closing its storage, and the shared connections
    /// once no node uses them) once the loop handled everything sent before.
    pub fn remove(mut self) -> Result<(), String> {
        self.removed = true;
        let (done, removed) = mpsc::channel();
        self.event_loop.command(Command::Remove { slot: self.slot, done })?;
        removed.recv().map_err(|_| "the client event loop stopped".to_string())
    }
}

impl Drop for Hosted {
    /// A node dropped without [`Hosted::remove`] leaves the loop too, unwaited for.
    fn drop(&mut self) {
        if !self.removed {
            let (done, _) = mpsc::channel();
            let _ = self.event_loop.command(Command::Remove { slot: self.slot, done });
        }
    }
}

/// Frames another transport received for a hosted node: at most [`INLET_FRAMES`] wait
/// for the loop at once.
pub struct Inlet {
    event_loop: Weak<ClientLoop>,
    slot: usize,
    /// Frames handed over and not yet taken by the loop.
    held: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
}

impl Inlet {
    /// Hands `frames` to the loop, or drops and counts them if it holds its bound already;
    /// false once the node's loop is gone.
    pub fn deliver(&self, frames: Received) -> bool {
        let Some(event_loop) = self.event_loop.upgrade() else { return false };
        let n = frames.len();
        if self.held.fetch_add(n, Ordering::SeqCst) + n > INLET_FRAMES {
            self.held.fetch_sub(n, Ordering::SeqCst);
            self.metrics.dropped_many(DropReason::ReceiveQueueFull, n as u64);
            return true;
        }
        event_loop.command(Command::Inlet { slot: self.slot, frames, held: self.held.clone() }).is_ok()
    }
}

/// A hosted node: its protocol rounds, the shared links it sends on, and where its
/// news goes.
struct Node {
    id: NodeId,
    shared: usize,
    divert: Option<Arc<dyn Divert>>,
    driver: Driver,
    news: NewsTo,
    /// When the node's core next wants a timeout, as entered in the loop's timers.
    timer: Option<Instant>,
}

/// The connections that the nodes dialing the same replicas share, and those nodes.
struct Shared {
    links: Links,
    /// Each node's slot, by id.
    nodes: BTreeMap<NodeId, usize>,
}

impl Node {
    /// Ends the node's round: settles it (queueing on its shared links, through its
    /// divert first) and queues its news in `told`. False if the node failed and must
    /// leave.
    fn end_round(&mut self, links: &mut Links, told: &mut Vec<(NewsTo, News)>) -> bool {
        let Node { id, divert, driver, news, .. } = self;
        let now = driver.now();
        let mut send = |frames: &mut Vec<(NodeId, Vec<u8>)>| links.send(*id, divert.as_ref(), frames);
        match driver.end_round(now, &mut send) {
            Ok(events) => {
                if !events.is_empty() {
                    told.push((news.clone(), News { id: *id, events: Ok(events) }));
                }
                true
            }
            Err(e) => {
                told.push((news.clone(), News { id: *id, events: Err(e.to_string()) }));
                false
            }
        }
    }
}

/// Reads on `shared`'s links (`read`) and hands the frames to the nodes they are for,
/// marking them busy; frames for a node that left, or one never here (a replica named
/// it), are dropped and counted.
fn read_shared(
    shared: &mut Shared,
    nodes: &mut BTreeMap<usize, Node>,
    busy: &mut BTreeSet<usize>,
    read: impl FnOnce(&mut Links, &mut Deliver),
) {
    let mut unknown = 0;
    let hosted = &shared.nodes;
    let mut deliver = |to: NodeId, frames: Received| {
        if let Some(&slot) = hosted.get(&to)
            && let Some(node) = nodes.get_mut(&slot)
        {
            node.driver.take(node.driver.now(), Event::Messages(frames));
            busy.insert(slot);
        } else {
            unknown += frames.len();
        }
        true
    };
    read(&mut shared.links, &mut deliver);
    shared.links.deliver_received(&mut deliver);
    shared.links.metrics().dropped_many(DropReason::UnknownPeer, unknown as u64);
}

struct EventLoop {
    poll: Poll,
    commands: Receiver<Command>,
    woken: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    nodes: BTreeMap<usize, Node>,
    shared: BTreeMap<usize, Shared>,
    /// Every node's next timeout, soonest first, so a turn costs the same however many
    /// nodes wait: a node's deadline only moves when it has a round.
    timers: BTreeSet<(Instant, usize)>,
    /// The turn's news, told once its frames are written: a consumer woken by the first
    /// would otherwise run (on a shared core) before the rest are sent, once per node.
    told: Vec<(NewsTo, News)>,
}

impl EventLoop {
    fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut busy = BTreeSet::new();
        while !self.stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            let mut timeout = IDLE;
            for shared in self.shared.values_mut() {
                shared.links.dial_due(self.poll.registry(), now);
                timeout = timeout.min(shared.links.next_dial(now).unwrap_or(IDLE));
            }
            if let Some(&(at, _)) = self.timers.first() {
                timeout = timeout.min(at.saturating_duration_since(now));
            }
            // Connections that stopped reading at their budget are read on after this
            // turn's events; meanwhile the wait must not block.
            let unread: Vec<(usize, BTreeSet<usize>)> = self
                .shared
                .iter_mut()
                .map(|(&k, shared)| (k, shared.links.take_unread()))
                .filter(|(_, conns)| !conns.is_empty())
                .collect();
            if !unread.is_empty() {
                timeout = Duration::ZERO;
            }
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
                events.clear();
            }
            for event in events.iter() {
                if event.token() == WAKER {
                    self.woken.store(false, Ordering::SeqCst);
                    self.take_commands(&mut busy);
                    continue;
                }
                let Some(shared) = self.shared.get_mut(&(event.token().0 & SLOT_MASK)) else { continue };
                read_shared(shared, &mut self.nodes, &mut busy, |links, deliver| {
                    links.ready(self.poll.registry(), event, deliver)
                });
            }
            for (k, conns) in unread {
                if let Some(shared) = self.shared.get_mut(&k) {
                    read_shared(shared, &mut self.nodes, &mut busy, |links, deliver| {
                        links.read_unread(self.poll.registry(), conns, deliver)
                    });
                }
            }
            // Every node whose timer is due has a round too.
            busy.extend(self.timers.range(..=(Instant::now(), usize::MAX)).map(|&(_, slot)| slot));
            for slot in std::mem::take(&mut busy) {
                self.end_round(slot);
            }
            // One write per connection for every round of this turn.
            for shared in self.shared.values_mut() {
                shared.links.flush(self.poll.registry());
            }
            self.tell();
        }
        for slot in self.nodes.keys().copied().collect::<Vec<_>>() {
            self.leave(slot);
        }
        Ok(())
    }

    /// Ends node `slot`'s round; a node that failed leaves.
    fn end_round(&mut self, slot: usize) {
        let Some(node) = self.nodes.get_mut(&slot) else { return };
        let links = &mut self.shared.get_mut(&node.shared).expect("a node's shared links outlive it").links;
        if node.end_round(links, &mut self.told) {
            self.rearm(slot);
        } else {
            self.leave(slot);
        }
    }

    /// Enters node `slot`'s next timeout in the timers, in place of the one before.
    fn rearm(&mut self, slot: usize) {
        let Some(node) = self.nodes.get_mut(&slot) else { return };
        let next = node.driver.deadline_at();
        if next != node.timer {
            if let Some(at) = std::mem::replace(&mut node.timer, next) {
                self.timers.remove(&(at, slot));
            }
            self.timers.extend(next.map(|at| (at, slot)));
        }
    }

    /// Sends the turn's news, one message per channel.
    fn tell(&mut self) {
        let mut batches: Vec<(NewsTo, Vec<News>)> = Vec::new();
        let mut by_channel = HashMap::new();
        for (to, told) in self.told.drain(..) {
            let i = *by_channel.entry(Arc::as_ptr(&to.0)).or_insert(batches.len());
            if i == batches.len() {
                batches.push((to, Vec::new()));
            }
            batches[i].1.push(told);
        }
        for (to, batch) in batches {
            // A caller that went away leaves the node running until it is removed.
            let _ = to.0.send(batch);
        }
    }

    /// The slot of the shared links to `dial`, made (with `net`'s settings) if none is.
    fn shared_links(&mut self, net: NetConfig, metrics: Arc<Metrics>) -> usize {
        if let Some((&slot, _)) = self.shared.iter().find(|(_, s)| s.links.dials() == net.dial) {
            return slot;
        }
        let slot = (SHARED_SLOTS..).find(|s| !self.shared.contains_key(s)).expect("fewer shared links than slots");
        let links = Links::new(NetConfig { shared: true, ..net }, metrics, slot, 1 << SLOT_BITS);
        self.shared.insert(slot, Shared { links, nodes: BTreeMap::new() });
        slot
    }

    /// Gives `event` to node `slot`, if it is still here, which is `busy` then.
    fn take(&mut self, slot: usize, event: Event, busy: &mut BTreeSet<usize>) {
        if let Some(node) = self.nodes.get_mut(&slot) {
            let now = node.driver.now();
            node.driver.take(now, event);
            busy.insert(slot);
        }
    }

    /// Takes every command queued so far; the nodes they gave events to are `busy`.
    fn take_commands(&mut self, busy: &mut BTreeSet<usize>) {
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::Add { slot, node, news } => {
                    let Prepared { id, mut driver, net, metrics } = *node;
                    let keys = net.keys.clone();
                    let shared = self.shared_links(net, metrics.clone());
                    let Shared { links, nodes } = self.shared.get_mut(&shared).expect("made");
                    links.join(id, metrics, keys);
                    let recovered =
                        driver.recover(&mut |frames| links.send(id, None, frames)).map_err(|e| e.to_string());
                    let failed = recovered.is_err();
                    if !recovered.as_ref().is_ok_and(Vec::is_empty) {
                        self.told.push((news.clone(), News { id, events: recovered }));
                    }
                    // The same identity hosted twice: the newer one gets its frames.
                    if nodes.insert(id, slot).is_some() {
                        tracing::warn!("client {id} is hosted twice in one event loop; the older stops hearing");
                    }
                    let node = Node { id, shared, divert: None, driver, news, timer: None };
                    self.nodes.insert(slot, node);
                    if failed {
                        self.leave(slot);
                    } else {
                        self.rearm(slot);
                    }
                }
                Command::Event { slot, event } => self.take(slot, event, busy),
                Command::Inlet { slot, frames, held } => {
                    held.fetch_sub(frames.len(), Ordering::SeqCst);
                    self.take(slot, Event::Messages(frames), busy);
                }
                Command::Divert { slot, divert } => {
                    if let Some(node) = self.nodes.get_mut(&slot) {
                        node.divert = Some(divert);
                    }
                }
                Command::Remove { slot, done } => {
                    // What the node was given before leaves first.
                    if busy.remove(&slot) {
                        self.end_round(slot);
                    }
                    self.leave(slot);
                    self.tell();
                    let _ = done.send(());
                }
            }
        }
    }

    /// Takes node `slot` out; its shared links close (sending what they can first) once
    /// no node uses them.
    fn leave(&mut self, slot: usize) {
        let Some(node) = self.nodes.remove(&slot) else { return };
        if let Some(at) = node.timer {
            self.timers.remove(&(at, slot));
        }
        if let Some(d) = node.divert {
            d.shutdown();
        }
        let Some(shared) = self.shared.get_mut(&node.shared) else { return };
        if shared.nodes.get(&node.id) == Some(&slot) {
            shared.nodes.remove(&node.id);
        }
        shared.links.leave(node.id);
        if shared.nodes.is_empty() {
            shared.links.flush(self.poll.registry());
            shared.links.close_all(self.poll.registry());
            self.shared.remove(&node.shared);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::value;

    /// An inlet holds at most [`INLET_FRAMES`] for the loop: beyond, frames are dropped
    /// and counted; what the loop took makes room again.
    #[test]
    fn an_inlet_holds_a_bounded_number_of_frames() {
        let event_loop = ClientLoop::start("inlet-test").expect("a loop");
        let metrics = Arc::new(Metrics::new(7, &[0]));
        // A slot no node holds: the loop takes its frames and drops them.
        let inlet = Inlet { event_loop: Arc::downgrade(&event_loop), slot: 1, held: Arc::default(), metrics };
        let dropped = || value(&inlet.metrics.render(), "phalanx_frames_dropped_total{reason=\"receive_queue_full\"}");
        let frames = |n: usize| (0..n).map(|_| (0, vec![1, 2, 3])).collect::<Received>();
        // As if the loop were behind by the whole bound.
        inlet.held.store(INLET_FRAMES, Ordering::SeqCst);
        assert!(inlet.deliver(frames(3)));
        assert_eq!(dropped(), Some(3.0));
        assert_eq!(inlet.held.load(Ordering::SeqCst), INLET_FRAMES);
        // Once the loop caught up, frames go to it, and it takes them.
        inlet.held.store(0, Ordering::SeqCst);
        assert!(inlet.deliver(frames(INLET_FRAMES)));
        let deadline = Instant::now() + Duration::from_secs(10);
        while inlet.held.load(Ordering::SeqCst) > 0 {
            assert!(Instant::now() < deadline, "the loop did not take the frames");
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(dropped(), Some(3.0));
        drop(event_loop);
        assert!(!inlet.deliver(frames(1)), "the loop is gone");
    }
}
