//! The protocol thread's inbox: what the network thread (and a node's other threads) hand
//! it, bounded in events and in the bytes of the frames they carry. A sender that would
//! pass either bound waits, which pushes back on its peers through TCP. A bound in events
//! alone let each event carry a whole turn's reading (up to a MiB per connection), so
//! peers sending faster than the protocol thread checks their MACs could queue gigabytes.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use crate::driver::Event;

/// An inbox of at most `events` events and `bytes` bytes of frames (one event larger
/// than `bytes` still passes, alone).
pub fn inbox(events: usize, bytes: usize) -> (InboxSender, InboxReceiver) {
    let (tx, rx) = mpsc::sync_channel(events);
    let room = Arc::new(Room { cap: bytes, held: Mutex::default(), freed: Condvar::new() });
    (InboxSender { tx, room: room.clone() }, InboxReceiver { rx, room })
}

/// The handing side; clones share the bounds.
#[derive(Clone)]
pub struct InboxSender {
    tx: SyncSender<Event>,
    room: Arc<Room>,
}

impl InboxSender {
    /// Queues `event`, waiting while the inbox is full; false once the receiver is gone.
    pub fn send(&self, event: Event) -> bool {
        self.room.hold(frame_bytes(&event)) && self.tx.send(event).is_ok()
    }

    /// Queues `event` if that needs no wait; false if it was dropped.
    pub fn try_send(&self, event: Event) -> bool {
        let n = frame_bytes(&event);
        if !self.room.try_hold(n) {
            return false;
        }
        let queued = self.tx.try_send(event).is_ok();
        if !queued {
            self.room.free(n);
        }
        queued
    }
}

/// The protocol thread's side: taking an event frees its room. Dropping it wakes and
/// refuses every sender.
pub struct InboxReceiver {
    rx: Receiver<Event>,
    room: Arc<Room>,
}

impl InboxReceiver {
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Event, RecvTimeoutError> {
        self.rx.recv_timeout(timeout).inspect(|event| self.room.free(frame_bytes(event)))
    }

    /// The events waiting now, without blocking.
    pub fn try_iter(&self) -> impl Iterator<Item = Event> + '_ {
        self.rx.try_iter().inspect(|event| self.room.free(frame_bytes(event)))
    }
}

impl Drop for InboxReceiver {
    fn drop(&mut self) {
        self.room.lock().closed = true;
        self.room.freed.notify_all();
    }
}

/// The bytes of frames queued and not yet taken.
struct Room {
    cap: usize,
    held: Mutex<Held>,
    freed: Condvar,
}

#[derive(Default)]
struct Held {
    bytes: usize,
    closed: bool,
}

impl Room {
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether `n` more bytes may be held: events without frames (a stop, a request) and
    /// a lone event larger than the bound always may.
    fn fits(&self, held: &Held, n: usize) -> bool {
        held.closed || n == 0 || held.bytes == 0 || held.bytes + n <= self.cap
    }

    /// Waits until `n` more bytes fit, and holds them; false once the receiver is gone.
    fn hold(&self, n: usize) -> bool {
        let mut held = self.lock();
        while !self.fits(&held, n) {
            held = self.freed.wait(held).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        held.bytes += n;
        !held.closed
    }

    /// Holds `n` more bytes if they fit now.
    fn try_hold(&self, n: usize) -> bool {
        let mut held = self.lock();
        if held.closed || !self.fits(&held, n) {
            return false;
        }
        held.bytes += n;
        true
    }

    fn free(&self, n: usize) {
        if n > 0 {
            self.lock().bytes -= n;
            self.freed.notify_all();
        }
    }
}

fn frame_bytes(event: &Event) -> usize {
    match event {
        Event::Messages(frames) => frames.iter().map(|(_, bytes)| bytes.len()).sum(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use super::*;

    fn frames(len: usize) -> Event {
        Event::Messages(vec![(1, vec![0; len])])
    }

    /// A sender waits once the frames queued would pass the byte bound, and goes on when
    /// the protocol thread takes them; a lone event larger than the bound still passes.
    #[test]
    fn frames_beyond_the_byte_bound_wait_until_the_protocol_thread_takes_some() {
        let (tx, rx) = inbox(1024, 100);
        assert!(tx.send(frames(60)));
        assert!(!tx.try_send(frames(60)), "60 + 60 bytes pass the bound");
        let (sent_tx, sent) = mpsc::channel();
        let sender = {
            let tx = tx.clone();
            thread::spawn(move || sent_tx.send(tx.send(frames(60))).unwrap())
        };
        assert!(sent.recv_timeout(Duration::from_millis(200)).is_err(), "the second 60 bytes wait");
        assert!(matches!(rx.recv_timeout(Duration::ZERO), Ok(Event::Messages(f)) if f[0].1.len() == 60));
        assert_eq!(sent.recv_timeout(Duration::from_secs(10)), Ok(true), "taking the first made room");
        sender.join().unwrap();
        // Room for requests, which carry no frames, is never short.
        assert!(tx.try_send(Event::Service));
        assert_eq!(rx.try_iter().count(), 2);
        assert!(tx.send(frames(500)), "alone, an event larger than the bound passes");
        assert!(tx.send(Event::Stop), "past the bound, an event without frames still passes");
        assert_eq!(rx.try_iter().count(), 2);
        // An event the channel cannot take holds no room.
        let (tx, rx) = inbox(1, 100);
        assert!(tx.try_send(frames(10)));
        assert!(!tx.try_send(frames(10)), "one event at most");
        assert_eq!(rx.try_iter().count(), 1);
        assert!(tx.try_send(frames(100)), "all 100 bytes are free again");
    }

    /// A sender waiting for room gives up once the protocol thread is gone.
    #[test]
    fn a_waiting_sender_is_refused_once_the_protocol_thread_is_gone() {
        let (tx, rx) = inbox(1024, 100);
        assert!(tx.send(frames(100)));
        let sender = thread::spawn(move || tx.send(frames(1)));
        thread::sleep(Duration::from_millis(50));
        drop(rx);
        assert!(!sender.join().unwrap());
    }
}
