//! The nemesis: a seeded sequence of faults on a local cluster's replica processes, one at
//! a time with quiet gaps between them, each healed before the next: SIGKILL and restart
//! of the primary or a backup, SIGSTOP/SIGCONT pauses of 2–8 s, the whole cluster killed
//! at once and restarted, and a replica killed with its write-ahead log's tail damaged —
//! torn (a partial record after the last one, as a crash in the middle of an
//! unacknowledged write leaves it) or with a byte flipped in the last record (the disk
//! lost an acknowledged record: that replica forgets its last round, which PBFT survives
//! as one faulty replica, so the nemesis flips no other replica's tail until every
//! replica's stable checkpoint has passed what the first forgot), and a power loss: every
//! replica stopped and killed at once, and the pages of their logs the kernel had not yet
//! written to the disk lost. A kill alone keeps the page cache, so only that last one
//! tells a log that syncs before it acknowledges from one that does not.
//!
//! The sequence of faults, targets and durations is a function of the seed; when they
//! happen depends on the machine. Any replica exit the nemesis did not cause stops the
//! run with that replica's own error.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::time::{Duration, Instant};

use phalanx_core::NodeId;
use phalanx_core::sim::Rng;

use crate::local_cluster::LocalCluster;
use crate::storage::{last_record, log_path};

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Fault {
    /// SIGKILL, down for 0.5–3 s, restarted.
    Kill,
    /// SIGSTOP for 2–8 s, then SIGCONT.
    Pause,
    /// Every replica killed at once, restarted 0.2–1 s later.
    CrashAll,
    /// SIGKILL, a partial record appended to the log (an unacknowledged write torn by the
    /// crash), restarted.
    TornTail,
    /// SIGKILL, a byte of the log's last record flipped (an acknowledged record lost),
    /// restarted.
    FlippedTail,
    /// Every replica stopped, killed, and its log's pages not yet written to the disk
    /// lost; restarted 0.2–1 s later.
    PowerLoss,
}

impl Fault {
    pub const ALL: [Fault; 6] =
        [Fault::Kill, Fault::Pause, Fault::CrashAll, Fault::TornTail, Fault::FlippedTail, Fault::PowerLoss];

    pub fn name(self) -> &'static str {
        match self {
            Fault::Kill => "kill",
            Fault::Pause => "pause",
            Fault::CrashAll => "crash all",
            Fault::TornTail => "torn tail",
            Fault::FlippedTail => "flipped tail",
            Fault::PowerLoss => "power loss",
        }
    }
}

/// Whom a fault struck.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// The replica that was primary when the fault began.
    Primary(NodeId),
    Backup(NodeId),
    All,
}

impl Target {
    pub fn role(self) -> &'static str {
        match self {
            Target::Primary(_) => "primary",
            Target::Backup(_) => "backup",
            Target::All => "all",
        }
    }
}

/// One fault as it happened, in nanoseconds since the run's epoch.
#[derive(Clone, Debug)]
pub struct Event {
    pub fault: Fault,
    pub target: Target,
    pub started: u64,
    pub healed: u64,
    /// The highest view a running replica had entered when the fault began (see
    /// [`Nemesis::view`]).
    pub view: u64,
}

pub struct Nemesis<'a> {
    cluster: &'a mut LocalCluster,
    rng: Rng,
    faults: Vec<Fault>,
    epoch: Instant,
    /// After a flipped tail: no other until every replica's stable checkpoint reaches this.
    forgotten: Option<u64>,
    /// The first faults: each kind once, in a seeded order, so that a run long enough for
    /// that many faults strikes with every kind.
    deck: Vec<Fault>,
    pub events: Vec<Event>,
}

/// The gauge `name` of replica `id`, if it answers.
fn gauge(cluster: &LocalCluster, id: NodeId, name: &str) -> Option<u64> {
    cluster.metric(id, name).map(|v| v as u64)
}

impl<'a> Nemesis<'a> {
    pub fn new(cluster: &'a mut LocalCluster, seed: u64, faults: Vec<Fault>, epoch: Instant) -> Self {
        let mut rng = Rng::new(seed);
        let mut deck = faults.clone();
        for i in (1..deck.len()).rev() {
            deck.swap(i, rng.below(i as u64 + 1) as usize);
        }
        Nemesis { cluster, rng, faults, epoch, forgotten: None, deck, events: Vec::new() }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn replicas(&self) -> Vec<NodeId> {
        (0..self.cluster.replicas() as NodeId).collect()
    }

    /// The highest view a running replica has entered (it is not changing views): a
    /// replica that suspects the primary alone moves its own view gauge ahead while it
    /// waits for a quorum to join, which is no view change of the cluster.
    pub fn view(&self) -> u64 {
        let entered = |r| match gauge(self.cluster, r, "phalanx_view_changing") {
            Some(0) => gauge(self.cluster, r, "phalanx_view"),
            _ => None,
        };
        self.replicas().into_iter().filter_map(entered).max().unwrap_or(0)
    }

    /// Sleeps `d`, checking every 100 ms that no replica exited on its own.
    fn watch(&mut self, d: Duration) -> Result<(), String> {
        let until = Instant::now() + d;
        loop {
            self.cluster.check_running()?;
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            std::thread::sleep(left.min(Duration::from_millis(100)));
        }
    }

    fn between(&mut self, low_ms: u64, high_ms: u64) -> Duration {
        Duration::from_millis(low_ms + self.rng.below(high_ms - low_ms + 1))
    }

    /// Faults, one after another, until `until`; the cluster is whole when it returns Ok.
    pub fn run(&mut self, until: Instant) -> Result<(), String> {
        loop {
            let gap = self.between(1_000, 3_000);
            self.watch(gap)?;
            if Instant::now() >= until {
                return Ok(());
            }
            let fault = self.draw();
            let target = self.target(fault);
            let (view, started) = (self.view(), self.now());
            self.strike(fault, target)?;
            let healed = self.now();
            tracing::info!(
                "nemesis: {} of {target:?} healed after {} ms",
                fault.name(),
                (healed - started) / 1_000_000
            );
            self.events.push(Event { fault, target, started, healed, view });
        }
    }

    /// The next fault: the deck's while it lasts, then any; a flipped tail only once the
    /// last one's forgotten round is stable everywhere (otherwise another kind).
    fn draw(&mut self) -> Fault {
        let fault = self.deck.pop().unwrap_or_else(|| *self.rng.pick(&self.faults));
        if fault != Fault::FlippedTail {
            return fault;
        }
        let stable = self.replicas().into_iter().map(|r| gauge(self.cluster, r, "phalanx_stable_checkpoint_seq"));
        let settled = match self.forgotten {
            None => true,
            Some(seq) => stable.into_iter().all(|s| s.is_some_and(|s| s >= seq)),
        };
        if settled || self.faults.len() == 1 {
            return fault;
        }
        let others: Vec<Fault> = self.faults.iter().copied().filter(|&f| f != Fault::FlippedTail).collect();
        *self.rng.pick(&others)
    }

    /// The primary half the time, a backup otherwise (the whole cluster for a crash).
    fn target(&mut self, fault: Fault) -> Target {
        if matches!(fault, Fault::CrashAll | Fault::PowerLoss) {
            return Target::All;
        }
        let replicas = self.replicas();
        let leader = replicas.iter().copied().find(|&r| gauge(self.cluster, r, "phalanx_leader") == Some(1));
        let backups: Vec<NodeId> = replicas.iter().copied().filter(|&r| Some(r) != leader).collect();
        match leader {
            Some(p) if self.rng.chance(500_000) => Target::Primary(p),
            _ => Target::Backup(*self.rng.pick(&backups)),
        }
    }

    fn strike(&mut self, fault: Fault, target: Target) -> Result<(), String> {
        let id = match target {
            Target::Primary(id) | Target::Backup(id) => id,
            Target::All => {
                // Stopped first, so that none writes while the others die.
                if fault == Fault::PowerLoss {
                    for r in self.replicas() {
                        self.cluster.pause(r)?;
                    }
                }
                for r in self.replicas() {
                    self.cluster.kill(r);
                }
                if fault == Fault::PowerLoss {
                    for r in self.replicas() {
                        let dir = self.cluster.cluster.replica(r).expect("a replica").data_dir.clone();
                        lose_unwritten(&dir)?;
                    }
                }
                let down = self.between(200, 1_000);
                std::thread::sleep(down);
                return self.cluster.start_all();
            }
        };
        match fault {
            Fault::Pause => {
                self.cluster.pause(id)?;
                let paused = self.between(2_000, 8_000);
                let watched = self.watch(paused);
                self.cluster.resume(id)?;
                watched
            }
            Fault::Kill | Fault::TornTail | Fault::FlippedTail => {
                if fault == Fault::FlippedTail {
                    let executed =
                        self.replicas().into_iter().filter_map(|r| gauge(self.cluster, r, "phalanx_executed_seq"));
                    self.forgotten = executed.max();
                }
                self.cluster.kill(id);
                let dir = self.cluster.cluster.replica(id).expect("a replica").data_dir.clone();
                match fault {
                    Fault::TornTail => self.tear(&dir)?,
                    Fault::FlippedTail => self.flip(&dir)?,
                    _ => {}
                }
                let down = self.between(500, 3_000);
                self.watch(down)?;
                self.cluster.start(id)
            }
            Fault::CrashAll | Fault::PowerLoss => unreachable!("struck above"),
        }
    }

    /// Appends a prefix of the last record: what a crash in the middle of writing a copy
    /// of it would leave.
    fn tear(&mut self, dir: &std::path::Path) -> Result<(), String> {
        let path = log_path(dir);
        let Some(range) = last_record(dir).map_err(|e| e.to_string())? else { return Ok(()) };
        let mut record = vec![0; (range.end - range.start) as usize];
        let mut file =
            File::options().read(true).append(true).open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        file.seek(SeekFrom::Start(range.start))
            .and_then(|_| file.read_exact(&mut record))
            .map_err(|e| e.to_string())?;
        let torn = 1 + self.rng.below(record.len() as u64 - 1) as usize;
        file.write_all(&record[..torn]).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Flips one byte of the last record.
    fn flip(&mut self, dir: &std::path::Path) -> Result<(), String> {
        let path = log_path(dir);
        let Some(range) = last_record(dir).map_err(|e| e.to_string())? else { return Ok(()) };
        let mut bytes = fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let at = (range.start + self.rng.below(range.end - range.start)) as usize;
        bytes[at] ^= 1 + self.rng.below(255) as u8;
        fs::write(&path, bytes).map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// What a power loss does to the log in `dir` once its writer is dead: the pages the
/// kernel still holds dirty (written, never synced nor written back) are lost. The lowest
/// of them is kept, as if it alone reached the disk: it may also hold synced bytes, and
/// what the disk had there before is unknown. The others read as zeros, the room reserved
/// ahead that they were written over.
fn lose_unwritten(dir: &std::path::Path) -> Result<(), String> {
    let path = log_path(dir);
    let file = File::options().read(true).write(true).open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let len = file.metadata().map_err(|e| format!("{}: {e}", path.display()))?.len();
    let pages: std::io::Result<Vec<Option<u64>>> =
        (0..len.div_ceil(PAGE)).map(|p| dirty_page(&file, p).map(|d| d.then_some(p))).collect();
    let dirty: Vec<u64> = match pages {
        Ok(pages) => pages.into_iter().flatten().collect(),
        Err(e) => {
            tracing::warn!("nemesis: no power loss, only a crash, for {}: cachestat: {e}", path.display());
            return Ok(());
        }
    };
    let zeros = [0u8; PAGE as usize];
    for &p in dirty.iter().skip(1) {
        let n = (len - p * PAGE).min(PAGE) as usize;
        std::os::unix::fs::FileExt::write_all_at(&file, &zeros[..n], p * PAGE)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if dirty.len() > 1 {
        tracing::info!("nemesis: power loss took {} unwritten pages of {}", dirty.len() - 1, path.display());
    }
    Ok(())
}

const PAGE: u64 = 4096;

/// Whether page `p` of `file` is dirty in the page cache (`cachestat(2)`, Linux 6.5 on;
/// where it is missing the fault loses nothing a kill would not).
fn dirty_page(file: &File, p: u64) -> std::io::Result<bool> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        #[repr(C)]
        struct Range {
            off: u64,
            len: u64,
        }
        #[repr(C)]
        #[derive(Default)]
        struct Stat {
            _cache: u64,
            dirty: u64,
            _writeback: u64,
            _evicted: u64,
            _recently_evicted: u64,
        }
        const SYS_CACHESTAT: libc::c_long = 451;
        let range = Range { off: p * PAGE, len: PAGE };
        let mut stat = Stat::default();
        // SAFETY: the kernel reads `range` and writes `stat`, both live for the call.
        let done = unsafe {
            libc::syscall(SYS_CACHESTAT, file.as_raw_fd(), &range as *const Range, &mut stat as *mut Stat, 0u32)
        };
        if done != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stat.dirty > 0)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (file, p);
        Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Durability;
    use crate::storage::{Recovery, Wal};

    /// What a sync made durable survives; what was written after it and still sits dirty
    /// in the page cache is gone (unless the kernel wrote it back first, which it may).
    #[test]
    fn a_power_loss_keeps_what_was_synced_and_takes_what_was_only_written() {
        let dir = std::env::temp_dir().join(format!("phalanx-power-loss-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let synced: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 1000]).collect();
        let written: Vec<Vec<u8>> = (8..40u8).map(|i| vec![i; 1000]).collect();
        let (mut wal, _) = Wal::open(&dir, Recovery::Strict).unwrap();
        for r in &synced {
            wal.append(r).unwrap();
        }
        wal.sync().unwrap();
        for r in &written {
            wal.append(r).unwrap();
        }
        wal.write(Durability::Replicated).unwrap();
        let file = File::open(log_path(&dir)).unwrap();
        let dirty = (0..64).filter(|&p| dirty_page(&file, p).unwrap_or(false)).count();
        drop((wal, file));
        lose_unwritten(&dir).unwrap();
        let (_, got) = Wal::open(&dir, Recovery::Strict).unwrap();
        assert_eq!(got[..synced.len()], synced[..], "a synced record was lost");
        if dirty > 1 {
            assert!(got.len() < synced.len() + written.len(), "{dirty} dirty pages, yet nothing was lost");
        }
        let _ = fs::remove_dir_all(&dir);
    }
}
