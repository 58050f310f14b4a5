//! One event loop — one thread, one mio poll — hosting any number of client nodes.
//!
//! Each hosted node is a whole client identity as a replica sees it: its own core (its
//! own keys and MACs), its own request-number storage, and its own TCP connections to
//! the replicas ([`Links`], with the same framing, hello and back-off as a replica's
//! network thread). Its protocol rounds are [`Driver`]'s, so storage is synced before
//! anything that depends on it is sent, as on a replica.
//!
//! Callers hand events (submissions, requests) over through a channel and wake the loop
//! only when it is not already due to look (one wake-up takes every command queued by
//! then), so submitting never waits for the loop. What each node's rounds produce comes
//! back as [`News`] tagged with the node's id, on a channel the caller chose when it
//! added the node (one per node, or one shared by many).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use mio::{Events, Poll, Registry, Token, Waker};
use phalanx_core::NodeId;

use crate::driver::{AppEvent, Driver, Event};
use crate::metrics::Metrics;
use crate::net::{Divert, Links, Received};
use crate::runtime::Prepared;

const WAKER: Token = Token(0);
/// A connection's token carries its node's slot in its low bits (slot 0 is the waker's).
const SLOT_BITS: u32 = 24;
const SLOT_MASK: usize = (1 << SLOT_BITS) - 1;
/// Longest the loop sleeps with nothing due (nodes' timers and dials wake it sooner).
const IDLE: Duration = Duration::from_secs(1);

/// What one node's round produced, or why the node stopped (it left the loop then).
#[derive(Debug)]
pub struct News {
    pub id: NodeId,
    pub events: Result<Vec<AppEvent>, String>,
}

enum Command {
    Add { slot: usize, node: Box<Prepared>, news: Sender<News> },
    Event { slot: usize, event: Event },
    Divert { slot: usize, divert: Arc<dyn Divert> },
    Remove { slot: usize, done: Sender<()> },
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
        let mut event_loop =
            EventLoop { poll, commands: rx, woken: woken.clone(), stop: stop.clone(), nodes: BTreeMap::new() };
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
    pub fn add(self: &Arc<Self>, node: Prepared, news: Sender<News>) -> Result<Hosted, String> {
        let slot = self.next_slot.fetch_add(1, Ordering::Relaxed);
        if slot > SLOT_MASK {
            return Err(format!("a client event loop hosts at most {SLOT_MASK} nodes over its life"));
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
        Inlet { event_loop: Arc::downgrade(&self.event_loop), slot: self.slot }
    }

    /// Takes the node out of the loop (closing its connections and storage) once the
    /// loop handled everything sent before.
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

/// Frames another transport received for a hosted node.
pub struct Inlet {
    event_loop: Weak<ClientLoop>,
    slot: usize,
}

impl Inlet {
    /// False once the node's loop is gone.
    pub fn deliver(&self, frames: Received) -> bool {
        let Some(event_loop) = self.event_loop.upgrade() else { return false };
        event_loop.command(Command::Event { slot: self.slot, event: Event::Messages(frames) }).is_ok()
    }
}

/// A hosted node: its connections, its protocol rounds, and where its news goes.
struct Node {
    links: Links,
    divert: Option<Arc<dyn Divert>>,
    driver: Driver,
    news: Sender<News>,
}

/// Sends `frames` through `divert` (what it carries) and `links` (the rest).
fn route(
    links: &mut Links,
    divert: &Option<Arc<dyn Divert>>,
    registry: &Registry,
    frames: &mut Vec<(NodeId, Vec<u8>)>,
) {
    if let Some(d) = divert {
        d.take(frames);
    }
    links.route(registry, frames.drain(..));
}

impl Node {
    /// Ends the node's round: settles it (sending on its links) and tells its news. False
    /// if the node failed and must leave.
    fn end_round(&mut self, registry: &Registry) -> bool {
        let Node { links, divert, driver, news } = self;
        let now = driver.now();
        let mut send = |frames: &mut Vec<(NodeId, Vec<u8>)>| route(links, divert, registry, frames);
        match driver.end_round(now, &mut send) {
            Ok(events) => {
                // A caller that went away leaves the node running until it is removed.
                if !events.is_empty() {
                    let _ = news.send(News { id: links.me(), events: Ok(events) });
                }
                true
            }
            Err(e) => {
                let _ = news.send(News { id: links.me(), events: Err(e.to_string()) });
                false
            }
        }
    }

    /// Feeds the frames its links read to its driver.
    fn deliver(&mut self) {
        let Node { links, driver, .. } = self;
        let now = driver.now();
        links.deliver_received(&mut |frames| driver.take(now, Event::Messages(frames)));
    }
}

struct EventLoop {
    poll: Poll,
    commands: Receiver<Command>,
    woken: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    nodes: BTreeMap<usize, Node>,
}

impl EventLoop {
    fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut busy = BTreeSet::new();
        while !self.stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            let mut timeout = IDLE;
            for node in self.nodes.values_mut() {
                node.links.dial_due(self.poll.registry(), now);
                let timer = node.driver.deadline().map(|at| Duration::from_nanos(at.saturating_sub(node.driver.now())));
                timeout = [Some(timeout), node.links.next_dial(now), timer].into_iter().flatten().min().unwrap_or(IDLE);
            }
            if let Err(e) = self.poll.poll(&mut events, Some(timeout)) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            for event in events.iter() {
                if event.token() == WAKER {
                    self.woken.store(false, Ordering::SeqCst);
                    self.take_commands(&mut busy);
                    continue;
                }
                let slot = event.token().0 & SLOT_MASK;
                let Some(Node { links, driver, .. }) = self.nodes.get_mut(&slot) else { continue };
                let now = driver.now();
                links.ready(self.poll.registry(), event, &mut |frames| driver.take(now, Event::Messages(frames)));
                busy.insert(slot);
            }
            // Every node whose timer is due has a round too.
            for (&slot, node) in &mut self.nodes {
                if node.driver.deadline().is_some_and(|at| at <= node.driver.now()) {
                    busy.insert(slot);
                }
            }
            for slot in std::mem::take(&mut busy) {
                let Some(node) = self.nodes.get_mut(&slot) else { continue };
                node.deliver();
                if !node.end_round(self.poll.registry()) {
                    self.leave(slot);
                }
            }
        }
        for slot in self.nodes.keys().copied().collect::<Vec<_>>() {
            self.leave(slot);
        }
        Ok(())
    }

    /// Takes every command queued so far; the nodes they gave events to are `busy`.
    fn take_commands(&mut self, busy: &mut BTreeSet<usize>) {
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::Add { slot, node, news } => {
                    let Prepared { driver, net, metrics, .. } = *node;
                    let links = Links::new(net, metrics, slot, 1 << SLOT_BITS);
                    let mut node = Node { links, divert: None, driver, news };
                    let Node { links, divert, driver, news } = &mut node;
                    let registry = self.poll.registry();
                    let mut send = |frames: &mut Vec<(NodeId, Vec<u8>)>| route(links, divert, registry, frames);
                    let recovered = driver.recover(&mut send).map_err(|e| e.to_string());
                    let failed = recovered.is_err();
                    if !recovered.as_ref().is_ok_and(Vec::is_empty) {
                        let _ = news.send(News { id: links.me(), events: recovered });
                    }
                    if !failed {
                        self.nodes.insert(slot, node);
                    }
                }
                Command::Event { slot, event } => {
                    if let Some(node) = self.nodes.get_mut(&slot) {
                        let now = node.driver.now();
                        node.driver.take(now, event);
                        busy.insert(slot);
                    }
                }
                Command::Divert { slot, divert } => {
                    if let Some(node) = self.nodes.get_mut(&slot) {
                        node.divert = Some(divert);
                    }
                }
                Command::Remove { slot, done } => {
                    // What the node was given before leaves first.
                    if busy.remove(&slot)
                        && let Some(node) = self.nodes.get_mut(&slot)
                    {
                        node.end_round(self.poll.registry());
                    }
                    self.leave(slot);
                    let _ = done.send(());
                }
            }
        }
    }

    fn leave(&mut self, slot: usize) {
        if let Some(mut node) = self.nodes.remove(&slot) {
            node.links.close_all(self.poll.registry());
            if let Some(d) = node.divert {
                d.shutdown();
            }
        }
    }
}
