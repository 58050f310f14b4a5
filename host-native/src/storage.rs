//! The replica's durable log: a write-ahead log of the core's `Persist` records.
//!
//! The host appends each record, calls [`Wal::sync`] once per round of outputs (group
//! commit: one `fdatasync` covers every record appended since the last one), and only
//! then acknowledges the records to the core. After a crash, [`Wal::open`] returns every
//! acknowledged record in order, to be fed back as `Input::Recover`.
//!
//! # Format
//!
//! `dir/wal.log` starts with a header block of [`BLOCK`] bytes: the magic `PHXWAL04`
//! (8 bytes), then two slots, each `[generation: u64 LE][start: u64 LE][checksum: 8
//! bytes]` (the checksum is the first 8 bytes of `blake3(generation ‖ start)`), then the
//! log's own key, `[key: 32 bytes][checksum: 8 bytes]` (the first 8 bytes of
//! `blake3(key)`), drawn at random when the log is created. The slot with the higher
//! generation among the intact ones says where the records start. The records follow,
//! each `[len: u32 LE][head: 4 bytes][sum: 8 bytes][record: len bytes]`: `sum` is the
//! first 8 bytes of the keyed `blake3(key; len_le ‖ record)`, `head` the first 4 of
//! `blake3(key; "head" ‖ len_le ‖ sum)`. The length field's top bit marks the first
//! record of each write (each [`Wal::write`], so each sync: a group commit), and `len_le`
//! above is the field as written, mark included. A length above [`MAX_RECORD`] is
//! corruption.
//!
//! The key is why no bytes written from outside pass for a record: a client's op, which
//! a replica persists verbatim inside its batch record, cannot be made to look like one
//! (a record torn after such an op must still read as a torn tail). The head is why
//! looking for intact records after a damaged one costs one short hash per plausible
//! place, not a hash of the length each place claims (a torn record of random bytes of a
//! few MiB has thousands of places claiming lengths that fit).
//!
//! The mark is why recovery can tell a write cut short from damage: see the recovery
//! policy.
//!
//! Logs of earlier versions are read and then rewritten in this one when opened. The third
//! (`PHXWAL03`) had no marks. The first two checked their records with an unkeyed
//! `blake3(len_le ‖ record)` and no head: the second (`PHXWAL02`) had the header block
//! without the key, the first (`PHXWAL01`) had the records right after the magic.
//!
//! # Compaction
//!
//! Dropping the records before a cut writes the cut into the older slot, syncs it, and
//! then punches a hole (`fallocate(PUNCH_HOLE)`, on a thread of its own) over the whole
//! blocks before the cut: the disk space is freed without copying what is kept, so
//! compaction costs one small sync, not a rewrite of the checkpoint state (and first a
//! sync of the records kept that were not synced yet, as a replica's checkpoint is not
//! when it asks to compact: the slot must never reach the disk before what it points
//! to, and one sync of both may persist the header block alone). A crash while the slot
//! is written leaves the other slot, and nothing was punched yet. Where the filesystem cannot punch holes,
//! and once the records start [`REWRITE_AT`] bytes into the file, the records kept are
//! copied into a new file instead, renamed over the log.
//!
//! # Recovery policy
//!
//! - **Torn tail.** A crash while writing records that were never synced (so never
//!   acknowledged) leaves the last record incomplete or failing its checksum, with no
//!   intact record after it. This is the normal result of `kill -9` or power loss:
//!   `open` truncates the file after the last intact record and logs a warning with the
//!   bytes discarded, in either [`Recovery`] mode.
//! - **Torn last write.** A power loss during a sync can also persist the pages of its
//!   write out of order, leaving an intact record after a torn one. When no intact record
//!   after the damage starts a write of its own, they were all written with the damaged
//!   one, by the last write, which was never acknowledged if the sync was cut short: a
//!   torn tail, truncated with a warning in either mode. (Were that write acknowledged
//!   and its bytes damaged later, this loses its records as a torn tail does; the log
//!   trusts that a completed sync persisted what it wrote; under `replicated`, where
//!   no write is synced, a power loss may so lose acknowledged writes, as that mode
//!   allows.) Damage with a later write's record after it is corruption, below.
//! - **Corruption.** A record that fails its checksum or has an impossible length while
//!   an intact record of a later write follows it (any intact record, in a log of an
//!   earlier version) means acknowledged data was damaged. [`Recovery::Strict`]
//!   returns [`StorageError::Corrupt`] naming the file and offset (the daemon refuses to
//!   start; an operator decides); [`Recovery::Repair`] truncates at the damaged record
//!   with a warning, keeping the intact prefix.
//! - **Wrong header.** A non-empty file that does not start with the magic is not a log
//!   this code wrote: `Corrupt` in both modes, and the file is left untouched.
//!
//! # Room ahead
//!
//! The file is longer than its records: zeros follow them, room reserved with
//! `fallocate` (as much again as they hold, 8 MiB at most). Appending then writes inside
//! the file, and a sync need not also commit a new file size to the filesystem's
//! journal: on ext4, four processes syncing 300-byte appends at once took 0.23 ms a sync
//! instead of 0.28, and `phalanxd bench --clients 1 --outstanding 1` (pinned) went from a
//! p50 of 1.28–1.36 ms to 1.14–1.23. Zeros after the last intact record are the end of
//! the log, not damage.
//!
//! Under `sync` the room is also written with zeros, by a thread of its own, while the
//! records still have half their room left and the writes are small. Why: a sync into
//! room that is only `fallocate`d also writes the extent's change from unwritten to
//! written, and the inode. On a virtual disk each write costs an exit to the hypervisor,
//! so that doubled a sync's cost. Over written zeros a sync writes the records' pages and
//! flushes, nothing else. Measured pinned to one core (`phalanxd bench`):
//! - 50 clients × 1: 18.6k → 21.0k ops/s, system time 16 → 12 µs per op;
//! - 1 client × 1: 963 → 1,013 ops/s.
//!
//! The zeros double the bytes that reach the disk, though, while what they save is a
//! fixed cost per sync: past [`FILL_BELOW`] bytes a write (the mean of the recent ones),
//! the room is only reserved. 50 clients × 1 with 256-byte operations (writes of 14 KiB)
//! gained 5% from the zeros, with 512 bytes (27 KiB) neither gained, and with 1 KiB
//! (53 KiB) the zeros cost 3% and raised the p99 latency from 14 to 16 ms: the syncs
//! queued behind them on the disk.
//!
//! How the thread writes:
//! - 16 KiB at a time: one write of the whole stretch leaves page-cache folios of up to
//!   2 MiB, and each small append into one then walks its 512 block buffers;
//! - writing each 256 KiB back before the next, so the log's own syncs meanwhile find
//!   little of it dirty; then syncing the allocation (a failed sync poisons the log);
//! - stopping before the next piece when the log needs the room, so a write waits for
//!   one piece at most (records that outrun the zeros go into room only reserved);
//! - through a file handle of its own, so a write-back error it meets is not taken from
//!   the log's handle, whose next sync must report it;
//! - only past the room the log uses, which grows only once the thread is joined; a log
//!   opened again on the file meanwhile, in this process, waits for it to finish (the
//!   node binding's restart opens the log again while the first object lives on).
//!
//! After a failed write or sync the file's contents are unknown (the kernel may have
//! dropped the dirty pages), so the [`Wal`] refuses further use: reopen it to recover.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use phalanx_core::host::Storage;

use crate::config::Durability;

/// The file header: format name and version.
pub const MAGIC: [u8; 8] = *b"PHXWAL04";
/// The earlier versions' headers: the third's records had no write marks, the second's
/// block had no key, the first's records came right after it. Read, then rewritten as
/// this one.
const MAGIC_V3: [u8; 8] = *b"PHXWAL03";
const MAGIC_V2: [u8; 8] = *b"PHXWAL02";
const MAGIC_V1: [u8; 8] = *b"PHXWAL01";
/// The header block: the magic, the two start slots and the key. Records start at or after it, so
/// compaction frees whole blocks before them and never touches the header.
pub const BLOCK: u64 = 4096;
/// A start slot: generation, start, checksum.
const SLOT: usize = 24;
/// Where the two start slots lie; generation `g` is written to slot `g % 2`.
const SLOTS: [usize; 2] = [8, 8 + SLOT];
/// Where the log's key and its checksum lie, after the slots.
const KEY_AT: usize = 8 + 2 * SLOT;
/// The largest record the log accepts; a longer length field is corruption.
pub const MAX_RECORD: usize = 64 << 20;
/// A record's header: length, head, sum.
const HEADER: usize = 4 + 4 + 8;
/// The length field's mark of a write's first record.
const OPENS_WRITE: u32 = 1 << 31;
/// A record's header in the earlier versions: length, unkeyed checksum.
const LEGACY_HEADER: usize = 4 + 8;
const LOG_NAME: &str = "wal.log";
const TMP_NAME: &str = "wal.log.tmp";
/// Bytes hashed while looking for intact records after a damaged one; past it the damage
/// is treated as corruption, the safe side. Only a log of an earlier version, whose
/// records have no head to check first, comes near it.
const SCAN_BUDGET: u64 = 256 << 20;
/// Obsolete bytes [`WalStorage`] lets build up before it compacts (and at least as many
/// as the records it keeps). Punching a hole costs a sync of the header, so this bounds
/// what a restart replays and spares the checkpoints of small states a sync each. Where
/// compaction must copy the records kept (see the module docs), that copy runs on the
/// protocol thread: with a 1 MiB state, a stall of 4-60 ms on one shared core.
const COMPACT_AFTER: u64 = 8 << 20;
/// Records starting this far into the file are compacted by a rewrite, which starts the
/// file afresh: a sparse file's offsets then stay far below any filesystem's size limit
/// (at 10 MB/s of records, a rewrite every half hour).
const REWRITE_AT: u64 = 16 << 30;
/// Room reserved past the end of the records: as much again as they hold, between these.
const PREALLOCATE_MIN: u64 = 64 << 10;
const PREALLOCATE_MAX: u64 = 8 << 20;
/// Writes from this many bytes on (their recent mean) get room only reserved, not
/// written with zeros: see the module docs.
const FILL_BELOW: u64 = 32 << 10;

/// A storage failure, naming the file involved.
#[derive(Debug)]
pub enum StorageError {
    /// An I/O call failed; `op` says which step.
    Io { path: PathBuf, op: &'static str, source: io::Error },
    /// The log's contents are damaged at byte `offset`.
    Corrupt { path: PathBuf, offset: u64, reason: String },
}

impl fmt::Display for StorageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageError::Io { path, op, source } => write!(f, "{}: {op} failed: {source}", path.display()),
            StorageError::Corrupt { path, offset, reason } => {
                write!(f, "{}: corrupt log at byte offset {offset}: {reason}", path.display())
            }
        }
    }
}

impl std::error::Error for StorageError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StorageError::Io { source, .. } => Some(source),
            StorageError::Corrupt { .. } => None,
        }
    }
}

/// What [`Wal::open`] does with a damaged record that has intact records after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// Refuse with [`StorageError::Corrupt`].
    Strict,
    /// Truncate at the damaged record, keeping the intact prefix.
    Repair,
}

/// An open write-ahead log. See the module docs for the format and recovery policy.
pub struct Wal {
    dir: PathBuf,
    path: PathBuf,
    /// Positioned at the end of the written data.
    file: File,
    /// The key of the records' checksums.
    key: Key,
    /// The generation of the header's current start slot.
    generation: u64,
    /// End of the log in the file: records start below it; zeros follow, up to `allocated`.
    written: u64,
    /// The file's length.
    allocated: u64,
    /// Where each record starts: in the file below `written`, in `pending` above it.
    starts: Vec<u64>,
    /// Encoded records appended since the last sync.
    pending: Vec<u8>,
    /// Whether the filesystem punched holes when asked; once it has not, compaction rewrites.
    punches: bool,
    /// The thread punching the last compaction's hole, and whether it did.
    punching: Option<std::thread::JoinHandle<bool>>,
    /// Whether the filesystem took written room when asked; once it has not, room is only reserved.
    fills: bool,
    /// The mean size of the recent synced writes (each weighs an eighth).
    write_mean: u64,
    /// The thread writing zeros past `allocated`, and the file length it reached.
    filling: Option<RoomFill>,
    /// Set when a write or sync failed: the file's state is unknown.
    poisoned: bool,
}

impl Wal {
    /// Opens or creates the log `dir/wal.log` (creating `dir`), returning the intact
    /// records in order. A torn tail is truncated; other damage is handled per `recovery`.
    pub fn open(dir: &Path, recovery: Recovery) -> Result<(Wal, Vec<Vec<u8>>), StorageError> {
        fs::create_dir_all(dir).map_err(io_err(dir, "create directory"))?;
        let path = dir.join(LOG_NAME);
        // A leftover temp file is a rewrite that crashed before its rename: the log is whole.
        let tmp = dir.join(TMP_NAME);
        if let Err(e) = fs::remove_file(&tmp)
            && e.kind() != io::ErrorKind::NotFound
        {
            return Err(io_err(&tmp, "remove")(e));
        }
        let mut file = match File::options().read(true).write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Created under the temp name and renamed, so the log never lacks its header.
                let key = fresh_key(&path)?;
                let (file, allocated) = install(dir, &header_block(&key))?;
                sync_dir(dir)?;
                // `dir` itself may be new: its entry must outlast a crash too.
                let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
                sync_dir(parent)?;
                return Ok((Wal::with_file(dir, file, key, 1, BLOCK, allocated, Vec::new()), Vec::new()));
            }
            Err(e) => return Err(io_err(&path, "open")(e)),
        };
        // A log still open on this file may be writing zeros past its end: where this one appends.
        Filling::wait_for(&file).map_err(io_err(&path, "stat"))?;
        let Some(LogFile { version, generation, start, sums, data }) = read_log(&path, &mut file)? else {
            // Never left by this code (logs are created with their header), and holds nothing.
            let key = fresh_key(&path)?;
            file.write_all(&header_block(&key)).map_err(io_err(&path, "write"))?;
            file.sync_data().map_err(io_err(&path, "sync"))?;
            return Ok((Wal::with_file(dir, file, key, 1, BLOCK, BLOCK, Vec::new()), Vec::new()));
        };
        let (intact, off, damage) = intact_records(&data, sums);
        let starts = intact.iter().map(|&(at, _)| start + at as u64).collect();
        let records: Vec<Vec<u8>> = intact.into_iter().map(|(_, rec)| rec.to_vec()).collect();
        let end = start + off as u64;
        let mut allocated = start + data.len() as u64;
        if let Some(reason) = damage {
            let discarded = data.len() - off;
            match intact_after(&data, off, sums) {
                Some(After::Nothing) => tracing::warn!(
                    path = %path.display(),
                    offset = end,
                    discarded,
                    "write-ahead log has a torn tail (a crash during an unacknowledged write); truncating: {reason}"
                ),
                Some(After::SameWrite) => tracing::warn!(
                    path = %path.display(),
                    offset = end,
                    discarded,
                    "write-ahead log has a torn last write (a crash during an unacknowledged write persisted part of it, out of order); truncating: {reason}"
                ),
                found => {
                    let reason = match found {
                        Some(_) => format!("{reason}, with intact records of a later write after it"),
                        None => format!("{reason}, and too much data after it to rule out intact records"),
                    };
                    if recovery == Recovery::Strict {
                        return Err(StorageError::Corrupt { path, offset: end, reason });
                    }
                    tracing::warn!(
                        path = %path.display(),
                        offset = end,
                        discarded,
                        "write-ahead log is corrupt; repairing by truncating, later records are lost: {reason}"
                    );
                }
            }
            file.set_len(end).map_err(io_err(&path, "truncate"))?;
            allocated = end;
        }
        // The records go back to the core, which acts on them (sends what they allowed):
        // they must be durable, and so must the log's name. A record written just before
        // a crash, or a rewrite's rename whose directory sync the crash cut short, may so
        // far live only in the page cache; a power loss now would take it back.
        file.sync_all().map_err(io_err(&path, "sync"))?;
        sync_dir(dir)?;
        file.seek(SeekFrom::Start(end)).map_err(io_err(&path, "seek"))?;
        // A log of an earlier version is rewritten in this one, the first two under a key of its own.
        let key = match sums {
            Sums::Marked(key) | Sums::Keyed(key) => key,
            Sums::Legacy => fresh_key(&path)?,
        };
        let mut wal = Wal::with_file(dir, file, key, generation, end, allocated, starts);
        if !matches!(sums, Sums::Marked(_)) {
            wal.rewrite(records.iter().map(Vec::as_slice))?;
            let version = String::from_utf8_lossy(&version).into_owned();
            tracing::info!(path = %path.display(), %version, "rewrote a write-ahead log of an earlier version in the current format");
        }
        Ok((wal, records))
    }

    fn with_file(
        dir: &Path,
        file: File,
        key: Key,
        generation: u64,
        written: u64,
        allocated: u64,
        starts: Vec<u64>,
    ) -> Wal {
        Wal {
            dir: dir.to_path_buf(),
            path: dir.join(LOG_NAME),
            file,
            key,
            generation,
            written,
            allocated,
            starts,
            pending: Vec::new(),
            punches: true,
            punching: None,
            fills: true,
            write_mean: 0,
            filling: None,
            poisoned: false,
        }
    }

    /// Buffers one record (not durable yet). Records longer than [`MAX_RECORD`] are refused.
    pub fn append(&mut self, record: &[u8]) -> Result<(), StorageError> {
        self.check("append")?;
        if record.len() > MAX_RECORD {
            return Err(io_err(&self.path, "append")(too_long(record.len())));
        }
        self.starts.push(self.len_bytes());
        let opens = self.pending.is_empty();
        encode(&mut self.pending, &self.key, record, opens);
        Ok(())
    }

    /// Writes buffered records and syncs data (`File::sync_data`): afterwards every
    /// appended record survives a crash. One sync per call (group commit); a call with
    /// nothing buffered does nothing.
    pub fn sync(&mut self) -> Result<(), StorageError> {
        self.write(Durability::Sync)
    }

    /// Writes buffered records to the operating system, and syncs them under
    /// [`Durability::Sync`]; without the sync they survive this process crashing, not
    /// the machine losing power.
    pub fn write(&mut self, durability: Durability) -> Result<(), StorageError> {
        self.check("sync")?;
        if self.pending.is_empty() {
            return Ok(());
        }
        let len = self.pending.len() as u64;
        let end = self.written + len;
        if end > self.allocated {
            self.finish_filling().map_err(io_err(&self.path, "write room"))?;
        }
        if end > self.allocated {
            self.allocated = reserve(&self.file, self.allocated, end, end - self.start()).max(end);
        }
        self.poisoned = true;
        self.file.write_all(&self.pending).map_err(io_err(&self.path, "write"))?;
        if durability == Durability::Sync {
            self.file.sync_data().map_err(io_err(&self.path, "sync"))?;
            self.synced();
        }
        self.poisoned = false;
        self.written = end;
        self.pending.clear();
        if durability == Durability::Sync {
            self.write_mean = self.write_mean - self.write_mean / 8 + len / 8;
            self.fill_ahead();
        }
        Ok(())
    }

    /// Starts writing zeros over the next stretch of room once the records have used half
    /// of what they want, while writes are small (see the module docs), unless that is
    /// under way.
    fn fill_ahead(&mut self) {
        // A failure poisons the log: the next call fails, and this says why.
        if self.filling.as_ref().is_some_and(|f| f.thread.is_finished())
            && let Err(e) = self.finish_filling()
        {
            tracing::error!(path = %self.path.display(), "syncing the room ahead failed, the log refuses further use: {e}");
            return;
        }
        let want = room_for(self.written - self.start());
        if !self.fills
            || self.write_mean >= FILL_BELOW
            || self.filling.is_some()
            || self.allocated - self.written >= want / 2
        {
            return;
        }
        // Its own open file, not a clone of the log's handle: see the module docs.
        let Ok(file) = File::options().write(true).open(&self.path) else { return };
        let Ok(filling) = Filling::start(&file) else { return };
        let (from, to) = (self.allocated, self.written + want);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stops = stop.clone();
        let spawned = std::thread::Builder::new().name("wal-room".into()).spawn(move || {
            let _filling = filling;
            fill(&file, from, to, &stops)
        });
        self.filling = spawned.ok().map(|thread| RoomFill { thread, stop });
    }

    /// Stops the thread writing zeros past the room before its next piece, waits for it,
    /// and takes what it reached as room; once the filesystem took none, later room is
    /// only reserved. A failed sync of the room poisons the log at once: its allocation
    /// may not be on the disk.
    fn finish_filling(&mut self) -> io::Result<()> {
        let Some(RoomFill { thread, stop }) = self.filling.take() else { return Ok(()) };
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        match thread.join() {
            Ok(Ok(Some(reached))) => self.allocated = self.allocated.max(reached),
            Ok(Err(e)) => {
                self.poisoned = true;
                return Err(e);
            }
            // Refused, or the thread panicked.
            Ok(Ok(None)) | Err(_) => self.fills = false,
        }
        Ok(())
    }

    /// Atomically replaces the whole log with `records` (write a temp file, sync, rename
    /// it over the log, sync the directory). Records appended but not yet synced are
    /// discarded: `records` is the complete new content. On an error before the rename
    /// the old log stays in use.
    pub fn rewrite<'a>(&mut self, records: impl IntoIterator<Item = &'a [u8]>) -> Result<(), StorageError> {
        self.check("rewrite")?;
        let mut content = header_block(&self.key);
        let mut starts = Vec::new();
        for r in records {
            if r.len() > MAX_RECORD {
                return Err(io_err(&self.path, "rewrite")(too_long(r.len())));
            }
            let opens = starts.is_empty();
            starts.push(content.len() as u64);
            encode(&mut content, &self.key, r, opens);
        }
        self.replace(content, starts)
    }

    /// Drops the first `n` records (the core's `Output::Compact`: records before a token
    /// are obsolete), keeping the rest in order; record `n` becomes record 0. Records
    /// appended but not yet synced are kept, written as `durability` says a sync writes
    /// them. See the module docs for how: a hole punched before the new start, or a copy.
    pub fn compact_before(&mut self, n: u64, durability: Durability) -> Result<(), StorageError> {
        self.check("compact")?;
        let Some(cut) = self.start_of(n) else {
            let msg = format!("cannot drop {n} records from a log of {}", self.records());
            return Err(io_err(&self.path, "compact")(io::Error::new(io::ErrorKind::InvalidInput, msg)));
        };
        if n == 0 {
            return Ok(());
        }
        self.finish_punching();
        if self.punches && cut < REWRITE_AT {
            // Synced before the slot is written: a power loss during one sync of both
            // could persist the slot and not them, a start past every record on the disk.
            self.write(durability)?;
            self.set_start(cut, durability)?;
            self.starts.drain(..n as usize);
            // Freeing the blocks waits on the filesystem for milliseconds (0.4 ms of CPU
            // for 8 MiB here, 2 ms of wall time): not on the caller's thread. Nothing
            // depends on when it is done, the header on disk no longer pointing there.
            let file = self.file.try_clone().map_err(io_err(&self.path, "clone handle"))?;
            let spawned = std::thread::Builder::new()
                .name("wal-punch".into())
                .spawn(move || punch_hole(&file, BLOCK, cut / BLOCK * BLOCK));
            self.punching = Some(spawned.map_err(io_err(&self.path, "start punching"))?);
            return Ok(());
        }
        self.copy_from(n)
    }

    /// Waits for the last compaction's hole punching; once the filesystem could not
    /// punch, later compactions rewrite the log.
    fn finish_punching(&mut self) {
        if let Some(punching) = self.punching.take()
            && !punching.join().unwrap_or(false)
        {
            tracing::warn!(path = %self.path.display(), "the filesystem cannot punch holes: compacting by rewriting the log");
            self.punches = false;
        }
    }

    /// Makes `start` the header's start, and writes it to the disk before anything is
    /// punched below it: the whole file under [`Durability::Sync`], only the header block
    /// otherwise (the records are not promised to survive power loss then). Under
    /// `replicated` that write does not flush the disk's cache: after a power loss the
    /// header may lag a punch the filesystem's journal already holds, and recovery then
    /// finds the old start's records gone (in `strict`, an error, or a log truncated with
    /// a warning where what follows is one write; in `repair`, an empty log), a replica
    /// that catches up from the others, as that mode promises.
    fn set_start(&mut self, start: u64, durability: Durability) -> Result<(), StorageError> {
        let generation = self.generation + 1;
        self.poisoned = true;
        std::os::unix::fs::FileExt::write_all_at(&self.file, &slot(generation, start), slot_at(generation) as u64)
            .map_err(io_err(&self.path, "write header"))?;
        match durability {
            Durability::Sync => self.file.sync_data(),
            Durability::Replicated => write_back(&self.file, 0, BLOCK),
        }
        .map_err(io_err(&self.path, "sync header"))?;
        self.synced();
        self.poisoned = false;
        self.generation = generation;
        Ok(())
    }

    /// A sync of the log's file returned. Tests keep a copy of the file at each, to build
    /// what a power loss during the next one can leave.
    fn synced(&self) {
        #[cfg(test)]
        tests::synced(&self.path);
    }

    /// Replaces the log with a copy of its records from record `n` on, pending ones
    /// included, by the same atomic replacement as [`Wal::rewrite`].
    fn copy_from(&mut self, n: u64) -> Result<(), StorageError> {
        let cut = self.start_of(n).unwrap_or(self.len_bytes());
        // The same key: the records are copied as they are.
        let mut content = header_block(&self.key);
        if cut < self.written {
            // A second handle, so the appending one keeps its position whatever happens.
            let want = self.written - cut;
            let read = File::open(&self.path).and_then(|mut f| {
                f.seek(SeekFrom::Start(cut))?;
                f.take(want).read_to_end(&mut content)
            });
            match read {
                Ok(got) if got as u64 == want => {}
                Ok(_) => {
                    let e = io::Error::new(io::ErrorKind::UnexpectedEof, "the log is shorter than written");
                    return Err(io_err(&self.path, "read")(e));
                }
                Err(e) => return Err(io_err(&self.path, "read")(e)),
            }
        }
        let in_pending = cut.saturating_sub(self.written) as usize;
        content.extend_from_slice(&self.pending[in_pending..]);
        let shift = cut - BLOCK;
        let starts = self.starts[n as usize..].iter().map(|s| s - shift).collect();
        self.replace(content, starts)
    }

    /// Installs `content` (header block and encoded records starting at `starts`) as the log.
    fn replace(&mut self, content: Vec<u8>, starts: Vec<u64>) -> Result<(), StorageError> {
        // Zeros still being written go to the file about to be replaced.
        self.finish_filling().map_err(io_err(&self.path, "write room"))?;
        // A failed rename leaves the old log in place (and the temp file for `open` to remove).
        let (file, allocated) = install(&self.dir, &content)?;
        self.file = file;
        self.generation = 1;
        self.written = content.len() as u64;
        self.allocated = allocated;
        self.starts = starts;
        self.pending.clear();
        // Until the directory is synced a crash may bring back either log.
        self.poisoned = true;
        sync_dir(&self.dir)?;
        self.poisoned = false;
        Ok(())
    }

    /// Size of the log in bytes, including records appended but not yet synced.
    pub fn len_bytes(&self) -> u64 {
        self.written + self.pending.len() as u64
    }

    /// Where the records start in the file (the header's start): what lies before was
    /// compacted away.
    pub fn start(&self) -> u64 {
        self.starts.first().copied().unwrap_or(self.len_bytes())
    }

    /// Records in the log, including those appended but not yet synced.
    pub fn records(&self) -> u64 {
        self.starts.len() as u64
    }

    /// Where record `n` starts (the end of the log for `n` = [`Wal::records`]).
    pub fn start_of(&self, n: u64) -> Option<u64> {
        let n = usize::try_from(n).ok()?;
        self.starts.get(n).copied().or((n == self.starts.len()).then(|| self.len_bytes()))
    }

    fn check(&self, op: &'static str) -> Result<(), StorageError> {
        if self.poisoned {
            let e = io::Error::other("an earlier write or sync failed; reopen the log to recover");
            return Err(io_err(&self.path, op)(e));
        }
        Ok(())
    }
}

impl Drop for Wal {
    /// Joins the thread writing zeros: none outlives its log (a log opened again on this
    /// file waits for it anyway, see [`Filling`]).
    fn drop(&mut self) {
        let _ = self.finish_filling();
    }
}

/// The files (device, inode) whose room a thread of this process is writing zeros over,
/// once for each thread, and the signal that one finished.
static FILLING: std::sync::Mutex<Vec<(u64, u64)>> = std::sync::Mutex::new(Vec::new());
static FILLED: std::sync::Condvar = std::sync::Condvar::new();

/// A thread writing zeros over the room of a file, while it lives: a log opened on the
/// same file meanwhile waits for it (see the module docs).
struct Filling((u64, u64));

impl Filling {
    fn start(file: &File) -> io::Result<Filling> {
        let id = file_id(file)?;
        filling().push(id);
        Ok(Filling(id))
    }

    /// Waits until no thread writes zeros over the room of `file`.
    fn wait_for(file: &File) -> io::Result<()> {
        let id = file_id(file)?;
        let mut filling = filling();
        while filling.contains(&id) {
            filling = FILLED.wait(filling).unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        Ok(())
    }
}

impl Drop for Filling {
    fn drop(&mut self) {
        let mut filling = filling();
        if let Some(at) = filling.iter().position(|&id| id == self.0) {
            filling.swap_remove(at);
        }
        FILLED.notify_all();
    }
}

fn filling() -> std::sync::MutexGuard<'static, Vec<(u64, u64)>> {
    FILLING.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The device and inode of `file`: which file it is, whatever its name.
fn file_id(file: &File) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata()?;
    Ok((meta.dev(), meta.ino()))
}

/// Writes `content` to the temp file, reserves room after it, syncs it and renames it
/// over the log (the caller syncs the directory). Returns the new log's file, positioned
/// at the end of `content`, and its length. On error before the rename the old log is
/// untouched.
fn install(dir: &Path, content: &[u8]) -> Result<(File, u64), StorageError> {
    let tmp = dir.join(TMP_NAME);
    let written = File::options().read(true).write(true).create(true).truncate(true).open(&tmp).and_then(|mut f| {
        f.write_all(content)?;
        let end = content.len() as u64;
        let allocated = reserve(&f, end, end, end - BLOCK);
        f.sync_all()?;
        Ok((f, allocated))
    });
    let installed = match written {
        Ok(installed) => installed,
        Err(e) => {
            // Best effort: `open` removes a leftover temp file anyway.
            let _ = fs::remove_file(&tmp);
            return Err(io_err(&tmp, "write")(e));
        }
    };
    let path = dir.join(LOG_NAME);
    fs::rename(&tmp, &path).map_err(io_err(&path, "rename"))?;
    Ok(installed)
}

/// Extends `file` from its length `from` with zeros, room for appending past `end` (as
/// much again as the `held` bytes of records, within [`PREALLOCATE_MIN`] and
/// [`PREALLOCATE_MAX`]), without moving its position; returns its new length. Where the
/// filesystem cannot, it stays as it is and appends extend it.
fn reserve(file: &File, from: u64, end: u64, held: u64) -> u64 {
    let target = end + room_for(held);
    if fallocate(file, from, target, false) { target } else { from }
}

/// `fallocate(2)` over `from..to`: reserves its blocks, or with `punch` frees them (they
/// read as zeros) keeping the length; whether the filesystem did.
fn fallocate(file: &File, from: u64, to: u64, punch: bool) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let mode = if punch { libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE } else { 0 };
        // SAFETY: a plain system call on a file descriptor this `File` owns.
        unsafe { libc::fallocate(file.as_raw_fd(), mode, from as libc::off_t, (to - from) as libc::off_t) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (file, from, to, punch);
        false
    }
}

/// The room wanted past records that hold `held` bytes.
fn room_for(held: u64) -> u64 {
    held.clamp(PREALLOCATE_MIN, PREALLOCATE_MAX)
}

/// A thread writing zeros past a log's room, and what tells it to stop.
struct RoomFill {
    thread: std::thread::JoinHandle<io::Result<Option<u64>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Extends `file` from its length `from` to `to` with written zeros (see the module docs):
/// reserves the stretch, writes it in small pieces, writing each back before the next so
/// the log's own syncs meanwhile find little of it dirty, then syncs it. Stops before the
/// next piece once `stop` is set (the log is waiting to write there), or when a write
/// fails (the log's own sync reports a failed write-back), and then leaves the sync to
/// the log. Returns the length up to which the file holds room (`from` if stopped before
/// the first piece), `None` if the filesystem took none (it neither reserves nor
/// writes); an error if its sync failed.
fn fill(file: &File, from: u64, to: u64, stop: &std::sync::atomic::AtomicBool) -> io::Result<Option<u64>> {
    const WRITE: u64 = 16 << 10;
    const WRITE_BACK: u64 = 256 << 10;
    static ZEROS: [u8; WRITE as usize] = [0; WRITE as usize];
    let reserved = fallocate(file, from, to, false);
    let mut at = from;
    while at < to && !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let piece = (to - at).min(WRITE_BACK);
        let wrote = (at..at + piece).step_by(WRITE as usize).try_for_each(|w| {
            std::os::unix::fs::FileExt::write_all_at(file, &ZEROS[..(at + piece - w).min(WRITE) as usize], w)
        });
        if wrote.and_then(|()| write_back(file, at, piece)).is_err() {
            if !reserved && at == from {
                return Ok(None);
            }
            break;
        }
        at += piece;
    }
    if at == to {
        file.sync_data()?;
    }
    Ok(Some(if reserved { to } else { at }))
}

/// Frees the blocks of `file` in `from..to` (they read as zeros), keeping its length;
/// whether the filesystem did.
fn punch_hole(file: &File, from: u64, to: u64) -> bool {
    to <= from || fallocate(file, from, to, true)
}

/// Writes `len` bytes of `file`'s dirty pages from `from` to the disk and waits for them,
/// without the metadata or a flush of the disk's cache (`sync_data` elsewhere).
fn write_back(file: &File, from: u64, len: u64) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: a plain system call on a file descriptor this `File` owns.
        if unsafe { libc::sync_file_range(file.as_raw_fd(), from as libc::off64_t, len as libc::off64_t, flags) } == 0 {
            return Ok(());
        }
        Err(io::Error::last_os_error())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (from, len);
        file.sync_data()
    }
}

/// A fresh log's header block: the magic, the records starting right after it, and `key`.
fn header_block(key: &Key) -> Vec<u8> {
    let mut block = vec![0; BLOCK as usize];
    block[..MAGIC.len()].copy_from_slice(&MAGIC);
    block[slot_at(1)..slot_at(1) + SLOT].copy_from_slice(&slot(1, BLOCK));
    block[KEY_AT..KEY_AT + 32].copy_from_slice(key);
    block[KEY_AT + 32..KEY_AT + 40].copy_from_slice(&blake3::hash(key).as_bytes()[..8]);
    block
}

/// The key of `header`, if intact.
fn key_of(header: &[u8]) -> Option<Key> {
    let key: Key = header.get(KEY_AT..KEY_AT + 32)?.try_into().ok()?;
    (header.get(KEY_AT + 32..KEY_AT + 40)? == &blake3::hash(&key).as_bytes()[..8]).then_some(key)
}

/// A new log's key, from the operating system's randomness.
fn fresh_key(path: &Path) -> Result<Key, StorageError> {
    let mut key = [0; 32];
    getrandom::fill(&mut key).map_err(|e| io_err(path, "draw a key")(io::Error::other(e.to_string())))?;
    Ok(key)
}

fn slot_at(generation: u64) -> usize {
    SLOTS[(generation % 2) as usize]
}

/// A start slot: `generation`, `start`, and their checksum.
fn slot(generation: u64, start: u64) -> [u8; SLOT] {
    let mut slot = [0; SLOT];
    slot[..8].copy_from_slice(&generation.to_le_bytes());
    slot[8..16].copy_from_slice(&start.to_le_bytes());
    let sum = blake3::hash(&slot[..16]);
    slot[16..].copy_from_slice(&sum.as_bytes()[..8]);
    slot
}

/// The intact slot of `header` with the highest generation: (generation, start).
fn current_slot(header: &[u8]) -> Option<(u64, u64)> {
    SLOTS
        .iter()
        .filter_map(|&at| {
            let bytes: [u8; SLOT] = header.get(at..at + SLOT)?.try_into().ok()?;
            let generation = u64::from_le_bytes(bytes[..8].try_into().ok()?);
            let start = u64::from_le_bytes(bytes[8..16].try_into().ok()?);
            // Compaction only ever moves the start within these bounds.
            let plausible = generation > 0 && (BLOCK..REWRITE_AT).contains(&start);
            (plausible && slot(generation, start) == bytes).then_some((generation, start))
        })
        .max()
}

/// What an open log file holds.
struct LogFile {
    /// Its version's magic.
    version: [u8; 8],
    /// The current start slot's generation (0 for the first version).
    generation: u64,
    /// Where the records start.
    start: u64,
    /// How its records are checked.
    sums: Sums,
    /// The bytes from the start to the end of the file.
    data: Vec<u8>,
}

/// Reads the log `file` at `path`: `None` for an empty file.
fn read_log(path: &Path, file: &mut File) -> Result<Option<LogFile>, StorageError> {
    let corrupt =
        |offset, reason: &str| StorageError::Corrupt { path: path.to_path_buf(), offset, reason: reason.to_string() };
    let mut header = Vec::new();
    file.seek(SeekFrom::Start(0)).map_err(io_err(path, "seek"))?;
    (&mut *file).take(BLOCK).read_to_end(&mut header).map_err(io_err(path, "read"))?;
    if header.is_empty() {
        return Ok(None);
    }
    let magic: [u8; 8] = header.get(..8).and_then(|m| m.try_into().ok()).unwrap_or_default();
    let slots = || current_slot(&header).ok_or_else(|| corrupt(SLOTS[0] as u64, "no intact start slot in the header"));
    let (generation, start, sums) = match magic {
        MAGIC | MAGIC_V3 => {
            let key = key_of(&header).ok_or_else(|| corrupt(KEY_AT as u64, "the log's key fails its checksum"))?;
            let (generation, start) = slots()?;
            (generation, start, if magic == MAGIC { Sums::Marked(key) } else { Sums::Keyed(key) })
        }
        MAGIC_V2 => {
            let (generation, start) = slots()?;
            (generation, start, Sums::Legacy)
        }
        MAGIC_V1 => (0, MAGIC_V1.len() as u64, Sums::Legacy),
        _ => return Err(corrupt(0, "missing PHXWAL04 header (not a Phalanx log?)")),
    };
    let mut data = Vec::new();
    file.seek(SeekFrom::Start(start)).map_err(io_err(path, "seek"))?;
    file.read_to_end(&mut data).map_err(io_err(path, "read"))?;
    Ok(Some(LogFile { version: magic, generation, start, sums, data }))
}

/// Replaces the file at `path` with `contents` (no sync): written whole under a name of
/// this writer's own, then renamed over it, so concurrent readers and writers of a cache
/// file (other processes, other threads) see one whole version or another.
pub fn replace_file(path: &Path, contents: &[u8]) -> io::Result<()> {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.{n}.tmp", std::process::id()));
    let tmp = path.with_file_name(name);
    fs::write(&tmp, contents).and_then(|()| fs::rename(&tmp, path)).inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })
}

/// A rename or file creation is durable only once the directory entry is.
fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir, "sync directory"))
}

fn too_long(len: usize) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("record of {len} bytes exceeds the {MAX_RECORD}-byte limit"))
}

/// The byte range, header included, of the last intact record of the log in `dir`
/// (`None` if it holds none): for tools that damage a log on purpose, as the
/// fault-injection suite does.
pub fn last_record(dir: &Path) -> Result<Option<std::ops::Range<u64>>, StorageError> {
    let path = log_path(dir);
    let mut file = File::open(&path).map_err(io_err(&path, "open"))?;
    let Some(LogFile { start, sums, data, .. }) = read_log(&path, &mut file)? else { return Ok(None) };
    let (intact, end, _) = intact_records(&data, sums);
    Ok(intact.last().map(|&(at, _)| start + at as u64..start + end as u64))
}

/// The path of the log in `dir`.
pub fn log_path(dir: &Path) -> PathBuf {
    dir.join(LOG_NAME)
}

/// The log as the core's host loop uses it ([`phalanx_core::host::Storage`]): a record's
/// position counts every record of the log since it was created, compacted ones
/// included, so positions stay valid across compactions. Obsolete records are dropped
/// once they hold [`COMPACT_AFTER`] bytes and as many as the records kept; until then
/// recovery reads them too, as it would after a crash just before compacting.
pub struct WalStorage {
    wal: Wal,
    /// What [`Wal::open`] found, until the host loop takes it.
    recovered: Vec<Vec<u8>>,
    /// Records compacted away: the position of the log's first record.
    dropped: u64,
    /// Whether a round's records are synced before they are acknowledged.
    durability: Durability,
}

impl WalStorage {
    /// The log `Wal::open` opened, with the records it found there.
    pub fn new(wal: Wal, recovered: Vec<Vec<u8>>, durability: Durability) -> Self {
        WalStorage { wal, recovered, dropped: 0, durability }
    }
}

impl Storage for WalStorage {
    fn append(&mut self, record: &[u8]) -> Result<u64, String> {
        self.wal.append(record).map_err(|e| e.to_string())?;
        Ok(self.dropped + self.wal.records() - 1)
    }

    fn sync(&mut self) -> Result<(), String> {
        self.wal.write(self.durability).map_err(|e| e.to_string())
    }

    fn compact(&mut self, position: u64) -> Result<(), String> {
        let Some(cut) = position.checked_sub(self.dropped).filter(|&n| n > 0) else { return Ok(()) };
        let at = self.wal.start_of(cut).ok_or_else(|| format!("no record at position {position} to compact before"))?;
        let (obsolete, kept) = (at - self.wal.start(), self.wal.len_bytes() - at);
        if obsolete >= COMPACT_AFTER.max(kept) {
            self.wal.compact_before(cut, self.durability).map_err(|e| e.to_string())?;
            self.dropped = position;
        }
        Ok(())
    }

    fn recovered(&mut self) -> Result<Vec<(u64, Vec<u8>)>, String> {
        Ok((self.dropped..).zip(std::mem::take(&mut self.recovered)).collect())
    }
}

fn io_err<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> StorageError + 'a {
    move |source| StorageError::Io { path: path.to_path_buf(), op, source }
}

/// The key of a log's record checksums.
type Key = [u8; 32];

/// How a log's records are checked: see the module docs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sums {
    /// This version's: keyed by the log's key, each header with a head of its own, and
    /// each write's first record marked.
    Marked(Key),
    /// The third version's: keyed and headed, no marks.
    Keyed(Key),
    /// The first two versions': unkeyed, no head.
    Legacy,
}

impl Sums {
    /// A record header's length.
    fn header(self) -> usize {
        match self {
            Sums::Marked(_) | Sums::Keyed(_) => HEADER,
            Sums::Legacy => LEGACY_HEADER,
        }
    }

    /// Whether `header` (of [`Sums::header`] bytes) has an intact head: whether a record
    /// may start with it (always, in the earlier versions).
    fn head_holds(self, header: &[u8]) -> bool {
        match self {
            Sums::Marked(key) | Sums::Keyed(key) => header[4..8] == head(&key, &header[..4], &header[8..HEADER]),
            Sums::Legacy => true,
        }
    }

    /// Whether `header`'s checksum holds for `record`.
    fn sum_holds(self, header: &[u8], record: &[u8]) -> bool {
        match self {
            Sums::Marked(key) | Sums::Keyed(key) => {
                self.head_holds(header) && header[8..HEADER] == sum(&key, &header[..4], record)
            }
            Sums::Legacy => header[4..LEGACY_HEADER] == legacy_sum(&header[..4], record),
        }
    }

    /// A header's record length, and whether the record may open a write (any may, in the
    /// earlier versions: their records carry no mark, and a set top bit is an impossible
    /// length).
    fn length(self, header: &[u8]) -> (usize, bool) {
        let field = u32::from_le_bytes(header[..4].try_into().unwrap_or_default());
        match self {
            Sums::Marked(_) => ((field & !OPENS_WRITE) as usize, field & OPENS_WRITE != 0),
            Sums::Keyed(_) | Sums::Legacy => (field as usize, true),
        }
    }
}

/// Appends `record` in this version's encoding, marked if it opens a write.
fn encode(out: &mut Vec<u8>, key: &Key, record: &[u8], opens_write: bool) {
    let len = (record.len() as u32 | if opens_write { OPENS_WRITE } else { 0 }).to_le_bytes();
    let sum = sum(key, &len, record);
    out.extend_from_slice(&len);
    out.extend_from_slice(&head(key, &len, &sum));
    out.extend_from_slice(&sum);
    out.extend_from_slice(record);
}

fn sum(key: &Key, len: &[u8], record: &[u8]) -> [u8; 8] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(len);
    h.update(record);
    h.finalize().as_bytes()[..8].try_into().unwrap_or_default()
}

fn head(key: &Key, len: &[u8], sum: &[u8]) -> [u8; 4] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(b"head");
    h.update(len);
    h.update(sum);
    h.finalize().as_bytes()[..4].try_into().unwrap_or_default()
}

fn legacy_sum(len: &[u8], record: &[u8]) -> [u8; 8] {
    let mut h = blake3::Hasher::new();
    h.update(len);
    h.update(record);
    h.finalize().as_bytes()[..8].try_into().unwrap_or_default()
}

/// A log's intact records, each with its offset; where they end; why, if before the end.
type Intact<'a> = (Vec<(usize, &'a [u8])>, usize, Option<String>);

/// The intact records of `data`, the bytes of a log from its start, each with its offset
/// in `data`, up to the end or the first damage: where they end, and why if before the
/// end. Zeros from there on are the room reserved ahead (see the module docs): the end,
/// not damage.
fn intact_records(data: &[u8], sums: Sums) -> Intact<'_> {
    let (mut intact, mut off) = (Vec::new(), 0);
    while off < data.len() {
        match parse(data, off, sums) {
            Ok((rec, _)) => {
                intact.push((off, rec));
                off += sums.header() + rec.len();
            }
            Err(_) if data[off..].iter().all(|&b| b == 0) => break,
            Err(reason) => return (intact, off, Some(reason)),
        }
    }
    (intact, off, None)
}

/// The record at `off` and whether it may open a write, or why there is no intact record
/// there.
fn parse(data: &[u8], off: usize, sums: Sums) -> Result<(&[u8], bool), String> {
    let (rest, header) = (&data[off..], sums.header());
    if rest.len() < header {
        return Err(format!("incomplete record header ({} of {header} bytes)", rest.len()));
    }
    let (len, opens_write) = sums.length(rest);
    if len > MAX_RECORD {
        return Err(format!("impossible record length {len} (limit {MAX_RECORD})"));
    }
    let Some(record) = rest.get(header..header + len) else {
        return Err(format!("incomplete record ({} of {len} bytes)", rest.len() - header));
    };
    if !sums.sum_holds(&rest[..header], record) {
        return Err(format!("checksum mismatch in record of {len} bytes"));
    }
    Ok((record, opens_write))
}

/// What lies after a damaged record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum After {
    /// No intact record: a torn tail.
    Nothing,
    /// Intact records, none of which opens a write: all were written with the damaged one.
    SameWrite,
    /// An intact record that opens a later write, or any intact record in a log without
    /// marks (which cannot tell).
    Other,
}

/// What intact records start anywhere after the damaged one at `off` (see [`After`]);
/// `None` when [`SCAN_BUDGET`] ran out before an answer.
fn intact_after(data: &[u8], off: usize, sums: Sums) -> Option<After> {
    let header = sums.header();
    let (mut hashed, mut found, mut p) = (0u64, After::Nothing, off + 1);
    while p + header <= data.len() {
        let (len, _) = sums.length(&data[p..]);
        // Only plausible headers cost a hash of their record: garbage mostly has lengths
        // past the end or (this version) a head that does not hold, and zero checksums
        // are reserved room (a real one is zero once in 2^64).
        let plausible = len <= MAX_RECORD && p + header + len <= data.len();
        if !plausible || data[p + 4..p + header].iter().all(|&b| b == 0) || !sums.head_holds(&data[p..p + header]) {
            p += 1;
            continue;
        }
        hashed += (4 + len) as u64;
        if hashed > SCAN_BUDGET {
            return None;
        }
        match parse(data, p, sums) {
            Ok((_, true)) => return Some(After::Other),
            Ok(_) => {
                found = After::SameWrite;
                p += header + len;
            }
            Err(_) => p += 1,
        }
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A unique directory under the system temp dir, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("phalanx-wal-{name}-{}-{n}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            TempDir(dir)
        }

        fn log(&self) -> PathBuf {
            self.0.join(LOG_NAME)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// The key of the log in `d`.
    fn key(d: &TempDir) -> Key {
        key_of(&fs::read(d.log()).unwrap()).expect("an intact key")
    }

    /// `record` as the earlier versions encoded it.
    fn legacy_encode(out: &mut Vec<u8>, record: &[u8]) {
        let len = (record.len() as u32).to_le_bytes();
        out.extend_from_slice(&len);
        out.extend_from_slice(&legacy_sum(&len, record));
        out.extend_from_slice(record);
    }

    fn recs(n: usize) -> Vec<Vec<u8>> {
        (0..n).map(|i| format!("record {i} {}", "x".repeat(i * 7)).into_bytes()).collect()
    }

    /// A new log of `records`, each synced by a write of its own.
    fn write(dir: &Path, records: &[Vec<u8>]) -> Wal {
        let (mut wal, got) = Wal::open(dir, Recovery::Strict).unwrap();
        assert!(got.is_empty());
        for r in records {
            wal.append(r).unwrap();
            wal.sync().unwrap();
        }
        wal
    }

    /// Byte offset of record `i` in a log holding `records`.
    fn offset_of(records: &[Vec<u8>], i: usize) -> u64 {
        BLOCK + records[..i].iter().map(|r| (HEADER + r.len()) as u64).sum::<u64>()
    }

    /// Asserts that the log at `path` ends at `len`: the file holds at least that, and
    /// only the zeros of reserved room after it.
    fn assert_ends_at(path: &Path, len: u64) {
        let data = fs::read(path).unwrap();
        assert!(data.len() as u64 >= len, "{} bytes, the log holds {len}", data.len());
        assert!(data[len as usize..].iter().all(|&b| b == 0), "bytes after the log's end at {len}");
    }

    #[test]
    fn round_trip_and_reopen() {
        let d = TempDir::new("roundtrip");
        let records = recs(20);
        let mut wal = write(&d.0, &records[..10]);
        // A second group commit, with an empty record among them.
        wal.append(&[]).unwrap();
        for r in &records[10..] {
            wal.append(r).unwrap();
        }
        assert_eq!(wal.records(), 21);
        wal.sync().unwrap();
        let len = wal.len_bytes();
        assert_ends_at(&d.log(), len);
        drop(wal);

        let mut want = records[..10].to_vec();
        want.push(Vec::new());
        want.extend_from_slice(&records[10..]);
        let (wal, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        assert_eq!(got, want);
        assert_eq!((wal.records(), wal.len_bytes()), (21, len));
    }

    #[test]
    fn last_record_is_the_last_intact_one() {
        let d = TempDir::new("last");
        let records = recs(3);
        drop(write(&d.0, &records));
        let last = offset_of(&records, 2)..offset_of(&records, 3);
        assert_eq!(last_record(&d.0).unwrap(), Some(last.clone()));
        // A torn copy of it after it is no record.
        let mut f = File::options().append(true).open(d.log()).unwrap();
        f.write_all(&fs::read(d.log()).unwrap()[last.start as usize..last.end as usize - 1]).unwrap();
        assert_eq!(last_record(&d.0).unwrap(), Some(last));
    }

    #[test]
    fn unsynced_appends_are_not_written() {
        let d = TempDir::new("unsynced");
        let mut wal = write(&d.0, &recs(2));
        wal.append(b"pending").unwrap();
        drop(wal);
        let (_, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        assert_eq!(got, recs(2));
    }

    #[test]
    fn replicated_writes_reach_the_file_unsynced() {
        let d = TempDir::new("replicated");
        let (mut wal, _) = Wal::open(&d.0, Recovery::Strict).unwrap();
        wal.append(b"one").unwrap();
        wal.write(Durability::Replicated).unwrap();
        // Written to the operating system: a process crash after this loses nothing.
        assert!(fs::read(d.log()).unwrap()[..wal.len_bytes() as usize].ends_with(b"one"));
        assert_ends_at(&d.log(), wal.len_bytes());
        drop(wal);
        assert_eq!(Wal::open(&d.0, Recovery::Strict).unwrap().1, vec![b"one".to_vec()]);
    }

    #[test]
    fn torn_tail_is_truncated() {
        let d = TempDir::new("torn");
        let records = recs(5);
        drop(write(&d.0, &records));
        let full = offset_of(&records, 5);
        // Cut into the last record, then into the last record's header.
        for cut in [3, records[4].len() as u64 + 5] {
            let f = File::options().write(true).open(d.log()).unwrap();
            f.set_len(full - cut).unwrap();
            drop(f);
            let (wal, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
            assert_eq!(got, records[..4]);
            assert_eq!(wal.len_bytes(), offset_of(&records, 4));
            assert_eq!(fs::metadata(d.log()).unwrap().len(), offset_of(&records, 4));
            drop(wal);
            // Restore the last record for the next cut.
            let mut wal = Wal::open(&d.0, Recovery::Strict).unwrap().0;
            wal.append(&records[4]).unwrap();
            wal.sync().unwrap();
        }
    }

    #[test]
    fn reserved_room_is_the_end_of_the_log_and_a_torn_write_in_it_is_truncated() {
        let d = TempDir::new("room");
        let records = recs(5);
        drop(write(&d.0, &records[..4]));
        let (end, length) = (offset_of(&records, 4), fs::metadata(d.log()).unwrap().len());
        assert_ends_at(&d.log(), end);
        // Reopening finds the end where the records stop, and keeps the room.
        let (wal, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        assert_eq!((got, wal.len_bytes()), (records[..4].to_vec(), end));
        assert_eq!(fs::metadata(d.log()).unwrap().len(), length);
        drop(wal);
        // A crash while writing the next record leaves part of it in the room.
        let mut torn = Vec::new();
        encode(&mut torn, &key(&d), &records[4], true);
        let f = File::options().write(true).open(d.log()).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &torn[..torn.len() - 2], end).unwrap();
        drop(f);
        let (mut wal, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        assert_eq!((got, wal.len_bytes()), (records[..4].to_vec(), end));
        wal.append(&records[4]).unwrap();
        wal.sync().unwrap();
        drop(wal);
        assert_eq!(Wal::open(&d.0, Recovery::Strict).unwrap().1, records);
        assert_ends_at(&d.log(), offset_of(&records, 5));
    }

    /// Lets the thread writing the room ahead, if any, run to its end, and takes its room.
    fn finish_filling_once_done(wal: &mut Wal) {
        while wal.filling.as_ref().is_some_and(|f| !f.thread.is_finished()) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        wal.finish_filling().unwrap();
    }

    #[test]
    fn under_sync_the_room_ahead_is_written_zeros_that_never_cover_a_record() {
        let d = TempDir::new("filled");
        let (mut wal, _) = Wal::open(&d.0, Recovery::Strict).unwrap();
        // 1.6 MB in syncs of one to three records: the room is filled many times over.
        let records: Vec<Vec<u8>> = (0..3000usize).map(|i| vec![(i % 251) as u8 + 1; 100 + i * 37 % 900]).collect();
        for (i, r) in records.iter().enumerate() {
            wal.append(r).unwrap();
            if i % 3 != 1 {
                wal.sync().unwrap();
            }
        }
        finish_filling_once_done(&mut wal);
        let (written, allocated) = (wal.written, wal.allocated);
        assert!(allocated - written >= PREALLOCATE_MIN, "room {written}..{allocated}");
        // Room that is only reserved reads as a hole where the filesystem keeps unwritten
        // extents (ext4, XFS); written zeros are data.
        use std::os::fd::AsRawFd;
        // SAFETY: a plain system call on a file descriptor the log owns.
        let hole = unsafe { libc::lseek(wal.file.as_raw_fd(), written as libc::off_t, libc::SEEK_HOLE) };
        assert_eq!(hole as u64, allocated, "the room from {written} is not all written");
        drop(wal);
        assert_eq!(fs::metadata(d.log()).unwrap().len(), allocated);
        assert_eq!(Wal::open(&d.0, Recovery::Strict).unwrap().1, records);
    }

    #[test]
    fn large_writes_get_room_reserved_not_written() {
        let d = TempDir::new("large");
        let (mut wal, _) = Wal::open(&d.0, Recovery::Strict).unwrap();
        let records: Vec<Vec<u8>> = (0..160usize).map(|i| vec![(i % 251) as u8 + 1; 48 << 10]).collect();
        let (early, late) = records.split_at(32);
        for r in early {
            wal.append(r).unwrap();
            wal.sync().unwrap();
        }
        assert!(wal.write_mean >= FILL_BELOW, "mean {}", wal.write_mean);
        // A thread the first writes started, while their mean was small, may still run.
        finish_filling_once_done(&mut wal);
        // 6 MiB more, past the room many times over: reserved, never written ahead.
        for r in late {
            wal.append(r).unwrap();
            wal.sync().unwrap();
            assert!(wal.filling.is_none(), "zeros written ahead of large writes at {}", wal.written);
        }
        assert!(wal.allocated >= wal.written);
        drop(wal);
        assert_eq!(Wal::open(&d.0, Recovery::Strict).unwrap().1, records);
    }

    /// Stops a thread where it is, inside a signal handler, until [`Held::release`]: the
    /// thread writing a log's room ahead, made to take as long as a slower disk would.
    struct Held {
        release: std::os::fd::OwnedFd,
    }

    /// The write end of the pipe a held thread says it is held on, and the read end of
    /// the one it waits on.
    static HOLDING: [std::sync::atomic::AtomicI32; 2] =
        [std::sync::atomic::AtomicI32::new(-1), std::sync::atomic::AtomicI32::new(-1)];

    extern "C" fn held(_: libc::c_int) {
        let mut byte = 0u8;
        // SAFETY: `write` and `read` are async-signal-safe, on pipes `Held::hold` made.
        unsafe {
            libc::write(HOLDING[0].load(Ordering::SeqCst), (&raw const byte).cast(), 1);
            libc::read(HOLDING[1].load(Ordering::SeqCst), (&raw mut byte).cast(), 1);
        }
    }

    impl Held {
        /// Holds `thread`, which must not have finished, until released.
        fn hold<T>(thread: &std::thread::JoinHandle<T>) -> Held {
            use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
            use std::os::unix::thread::JoinHandleExt;
            let pipe = || {
                let mut fds = [0; 2];
                // SAFETY: `pipe` fills `fds` with two new descriptors, each owned once.
                unsafe {
                    assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
                    (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
                }
            };
            let ((told, tell), (wait, release)) = (pipe(), pipe());
            HOLDING[0].store(tell.as_raw_fd(), Ordering::SeqCst);
            HOLDING[1].store(wait.as_raw_fd(), Ordering::SeqCst);
            // SAFETY: a handler of async-signal-safe calls, for a signal only this test sends.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = held as *const () as usize;
                action.sa_flags = libc::SA_RESTART;
                assert_eq!(libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut()), 0);
                assert_eq!(libc::pthread_kill(thread.as_pthread_t(), libc::SIGUSR2), 0);
            }
            let mut poll = libc::pollfd { fd: told.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one live `pollfd`.
            assert_eq!(unsafe { libc::poll(&mut poll, 1, 10_000) }, 1, "the thread finished before it was held");
            // Open for good: a handler may still use them.
            std::mem::forget((told, tell, wait));
            Held { release }
        }

        fn release(self) {
            let byte = 0u8;
            // SAFETY: one byte of a live buffer, to a pipe this owns.
            let wrote =
                unsafe { libc::write(std::os::fd::AsRawFd::as_raw_fd(&self.release), (&raw const byte).cast(), 1) };
            assert_eq!(wrote, 1);
        }
    }

    #[test]
    fn a_log_opened_again_while_the_first_lives_on_keeps_what_it_syncs() {
        // What the node binding's `new Wal(dir)` does after a restart: the first object
        // lives on until the garbage collector takes it, and so may its thread writing
        // the room ahead.
        let d = TempDir::new("twice");
        let (mut first, _) = Wal::open(&d.0, Recovery::Strict).unwrap();
        // Writes small enough to have zeros written ahead.
        let record = vec![7u8; 16 << 10];
        let thread = |wal: &Wal| wal.filling.as_ref().map(|f| f.thread.thread().id());
        let mut n = 0;
        loop {
            assert!(n < 4 * PREALLOCATE_MAX as usize / record.len(), "no zeros were written ahead");
            first.append(&record).unwrap();
            let before = thread(&first);
            first.sync().unwrap();
            n += 1;
            if first.written >= PREALLOCATE_MAX && thread(&first).is_some_and(|t| Some(t) != before) {
                break;
            }
        }
        // It has just started on 4 to 8 MiB of zeros; held there, as a slower disk would.
        let held = Held::hold(&first.filling.as_ref().unwrap().thread);
        let to = first.written + room_for(first.written - first.start());
        let (release, released) = std::sync::mpsc::channel::<()>();
        let releasing = std::thread::spawn(move || {
            let _ = released.recv_timeout(std::time::Duration::from_secs(1));
            held.release();
        });
        let (mut again, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        assert_eq!(got.len(), n);
        // One record through the room the first log's thread is still to write.
        let long = vec![9u8; (to - (64 << 10) - again.written) as usize];
        again.append(&long).unwrap();
        again.sync().unwrap();
        let _ = release.send(());
        releasing.join().unwrap();
        drop((first, again));
        let (_, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        assert_eq!(got.len(), n + 1, "the record the log opened again synced is lost");
        assert!(got[n] == long, "the record the log opened again synced is damaged");
    }

    #[test]
    fn any_tail_after_the_records_recovers_them_and_the_log_continues() {
        let d = TempDir::new("tails");
        let records = recs(6);
        drop(write(&d.0, &records));
        let log = fs::read(d.log()).unwrap();
        let end = offset_of(&records, 6) as usize;
        let mut torn = Vec::new();
        encode(&mut torn, &key(&d), b"a record cut short", true);
        let noise: Vec<u8> = (0..3000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        let tails: Vec<Vec<u8>> = vec![
            vec![0; 1],
            vec![0; HEADER - 1],
            vec![0; 70_000],
            [&torn[..torn.len() - 1], &[0; 5000][..]].concat(),
            [&[0; 5000][..], &torn[..7]].concat(),
            [&noise[..], &[0; 9000][..]].concat(),
            [&[0; 100][..], &noise[..], &[0; 100][..]].concat(),
        ];
        for (i, tail) in tails.iter().enumerate() {
            recovers_then_continues(&d, &[&log[..end], &tail[..]].concat(), &records, end as u64, &format!("tail {i}"));
        }
    }

    /// Opens the log in `d`, holding `data`, in either mode: it recovers `records` and ends
    /// at `end`, and a record appended then follows them.
    fn recovers_then_continues(d: &TempDir, data: &[u8], records: &[Vec<u8>], end: u64, what: &str) {
        for recovery in [Recovery::Strict, Recovery::Repair] {
            fs::write(d.log(), data).unwrap();
            let (mut wal, got) = Wal::open(&d.0, recovery).unwrap_or_else(|e| panic!("{what}, {recovery:?}: {e}"));
            assert_eq!((got, wal.len_bytes()), (records.to_vec(), end), "{what}, {recovery:?}");
            wal.append(b"after").unwrap();
            wal.sync().unwrap();
            drop(wal);
            let (_, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
            assert_eq!(got, [records, &[b"after".to_vec()]].concat(), "{what}, {recovery:?}");
        }
    }

    #[test]
    fn storage_compacts_once_obsolete_records_outweigh_the_rest() {
        let d = TempDir::new("deferred");
        let (wal, _) = Wal::open(&d.0, Recovery::Strict).unwrap();
        let mut storage = WalStorage::new(wal, Vec::new(), Durability::Sync);
        let big = |i: u8| vec![i; (COMPACT_AFTER / 4) as usize];
        for i in 0..4 {
            assert_eq!(storage.append(&big(i)).unwrap(), u64::from(i));
        }
        storage.sync().unwrap();
        // Three records obsolete: fewer bytes than COMPACT_AFTER, so they stay, and a
        // restart reads them (with their positions, which stay as they were).
        storage.compact(3).unwrap();
        assert_eq!(storage.wal.records(), 4);
        let reopen = |d: &TempDir| {
            let (wal, recovered) = Wal::open(&d.0, Recovery::Strict).unwrap();
            WalStorage::new(wal, recovered, Durability::Sync)
        };
        let mut storage = reopen(&d);
        assert_eq!(
            storage.recovered().unwrap().iter().map(|(p, r)| (*p, r[0])).collect::<Vec<_>>(),
            [(0, 0), (1, 1), (2, 2), (3, 3)]
        );
        // Five obsolete make COMPACT_AFTER and outweigh the one kept: compacted.
        storage.append(&big(4)).unwrap();
        storage.append(&big(5)).unwrap();
        storage.sync().unwrap();
        storage.compact(5).unwrap();
        assert_eq!(storage.wal.records(), 1);
        assert_eq!(storage.append(b"next").unwrap(), 6);
        storage.sync().unwrap();
        // A compaction point before what was dropped is no error, and changes nothing.
        storage.compact(2).unwrap();
        assert_eq!(reopen(&d).recovered().unwrap(), [(0, big(5)), (1, b"next".to_vec())]);
    }

    #[test]
    fn garbage_tail_is_truncated() {
        let d = TempDir::new("garbage");
        let records = recs(5);
        drop(write(&d.0, &records));
        let mut garbage = vec![0u8; 4096];
        garbage.extend((0..5000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
        // A plausible length whose checksum fails, as a half-written record leaves.
        garbage.extend_from_slice(&[3, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, b'a', b'b', b'c']);
        for tail in [&garbage[..], &garbage[4096..], &garbage[garbage.len() - 15..]] {
            let mut f = File::options().append(true).open(d.log()).unwrap();
            f.write_all(tail).unwrap();
            drop(f);
            for recovery in [Recovery::Strict, Recovery::Repair] {
                let (_, got) = Wal::open(&d.0, recovery).unwrap();
                assert_eq!(got, records);
            }
            assert_eq!(fs::metadata(d.log()).unwrap().len(), offset_of(&records, 5));
        }
    }

    #[test]
    fn middle_corruption_strict_errors_repair_keeps_prefix() {
        let d = TempDir::new("corrupt");
        let records = recs(6);
        drop(write(&d.0, &records));
        let bad = offset_of(&records, 2);
        let mut data = fs::read(d.log()).unwrap();
        data[bad as usize + HEADER + 3] ^= 0x40;
        fs::write(d.log(), &data).unwrap();

        let err = Wal::open(&d.0, Recovery::Strict).err().unwrap();
        match &err {
            StorageError::Corrupt { path, offset, .. } => assert_eq!((path, *offset), (&d.log(), bad)),
            e => panic!("expected corruption, got {e}"),
        }
        let msg = err.to_string();
        assert!(msg.contains(&bad.to_string()) && msg.contains("wal.log") && msg.contains("checksum"), "{msg}");
        // Strict leaves the file alone.
        assert_eq!(fs::read(d.log()).unwrap(), data);

        let (wal, got) = Wal::open(&d.0, Recovery::Repair).unwrap();
        assert_eq!(got, records[..2]);
        assert_eq!(wal.records(), 2);
        drop(wal);
        let (_, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        assert_eq!(got, records[..2]);
    }

    #[test]
    fn impossible_length_in_the_middle_is_corruption() {
        let d = TempDir::new("badlen");
        let records = recs(4);
        drop(write(&d.0, &records));
        let bad = offset_of(&records, 1) as usize;
        let mut data = fs::read(d.log()).unwrap();
        data[bad..bad + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        fs::write(d.log(), &data).unwrap();
        match Wal::open(&d.0, Recovery::Strict) {
            Err(StorageError::Corrupt { offset, reason, .. }) => {
                assert_eq!(offset, bad as u64);
                assert!(reason.contains("length"), "{reason}");
            }
            _ => panic!("expected corruption"),
        }
        let (_, got) = Wal::open(&d.0, Recovery::Repair).unwrap();
        assert_eq!(got, records[..1]);
    }

    #[test]
    fn wrong_magic_is_corrupt_in_both_modes() {
        let d = TempDir::new("magic");
        fs::create_dir_all(&d.0).unwrap();
        fs::write(d.log(), b"NOTAWAL!rest").unwrap();
        for recovery in [Recovery::Strict, Recovery::Repair] {
            match Wal::open(&d.0, recovery) {
                Err(StorageError::Corrupt { offset: 0, .. }) => {}
                _ => panic!("expected corruption"),
            }
        }
        assert_eq!(fs::read(d.log()).unwrap(), b"NOTAWAL!rest");
        // An empty file (never held an acknowledged record) becomes a fresh log.
        fs::write(d.log(), b"").unwrap();
        let (mut wal, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        assert!(got.is_empty());
        wal.append(b"a").unwrap();
        wal.sync().unwrap();
        drop(wal);
        assert_eq!(Wal::open(&d.0, Recovery::Strict).unwrap().1, [b"a".to_vec()]);
    }

    #[test]
    fn rewrite_then_reopen() {
        let d = TempDir::new("rewrite");
        let records = recs(8);
        let mut wal = write(&d.0, &records);
        wal.append(b"dropped by the rewrite").unwrap();
        wal.rewrite(records[5..].iter().map(|r| &r[..])).unwrap();
        assert_eq!(wal.records(), 3);
        assert_ends_at(&d.log(), wal.len_bytes());
        assert!(!d.0.join(TMP_NAME).exists());
        // The log continues after the rewritten content.
        wal.append(b"after").unwrap();
        wal.sync().unwrap();
        drop(wal);
        let (wal, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        let mut want = records[5..].to_vec();
        want.push(b"after".to_vec());
        assert_eq!(got, want);
        assert_eq!(wal.records(), 4);
        drop(wal);

        // A rewrite that crashed before its rename leaves a temp file; the log wins.
        fs::write(d.0.join(TMP_NAME), b"PHXWAL01partial").unwrap();
        let (mut wal, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        assert_eq!(got, want);
        assert!(!d.0.join(TMP_NAME).exists());
        wal.rewrite(std::iter::empty()).unwrap();
        drop(wal);
        let (wal, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        assert!(got.is_empty());
        assert_eq!((wal.records(), wal.len_bytes()), (0, BLOCK));
    }

    thread_local! {
        /// Copies of the log at each sync this thread made, while a test collects them.
        static SYNCED: std::cell::RefCell<Option<Vec<Vec<u8>>>> = const { std::cell::RefCell::new(None) };
    }

    /// See [`Wal::synced`].
    pub(super) fn synced(path: &Path) {
        SYNCED.with(|s| {
            if let Some(copies) = s.borrow_mut().as_mut() {
                copies.push(fs::read(path).unwrap());
            }
        });
    }

    /// The log's file as each sync that `run` made left it on the disk.
    fn syncs_of(run: impl FnOnce()) -> Vec<Vec<u8>> {
        SYNCED.with(|s| *s.borrow_mut() = Some(Vec::new()));
        run();
        SYNCED.with(|s| s.borrow_mut().take().unwrap())
    }

    /// A replica persists its checkpoint and asks to compact before it syncs, so the
    /// records a compaction keeps may not be on the disk yet. A power loss during the sync
    /// that writes the new start can persist the header block and not those records
    /// (writeback even writes the header first): the log must then still hold either the
    /// old records or the new ones, never neither.
    #[test]
    fn a_compaction_cut_short_never_leaves_a_start_past_what_is_on_the_disk() {
        let d = TempDir::new("compaction-order");
        let records = recs(6);
        let mut wal = write(&d.0, &records);
        let before = fs::read(d.log()).unwrap();
        let checkpoint = [b"checkpoint".to_vec(), b"what a restart needs with it".to_vec()];
        for r in &checkpoint {
            wal.append(r).unwrap();
        }
        let syncs = syncs_of(|| wal.compact_before(6, Durability::Sync).unwrap());
        wal.finish_punching();
        assert!(wal.punches, "the filesystem under {} punches holes", d.0.display());
        drop(wal);
        // The last sync cut short: the header block it wrote landed, nothing else it wrote did.
        let (last, durable) = match &syncs[..] {
            [.., durable, last] => (last, durable),
            [last] => (last, &before),
            [] => panic!("the compaction synced nothing"),
        };
        let mut crashed = durable.clone();
        crashed.resize(crashed.len().max(BLOCK as usize), 0);
        crashed[..BLOCK as usize].copy_from_slice(&last[..BLOCK as usize]);
        fs::write(d.log(), &crashed).unwrap();
        let (_, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        let all = [&records[..], &checkpoint[..]].concat();
        assert!(got == checkpoint || got == all, "recovered {} records, the acknowledged ones gone", got.len());
    }

    /// Runs `compaction` on a log that punches holes, and on one that rewrites.
    fn both_ways(name: &str, compaction: impl Fn(&TempDir, &dyn Fn(&mut Wal))) {
        compaction(&TempDir::new(&format!("{name}-punch")), &|_| {});
        compaction(&TempDir::new(&format!("{name}-copy")), &|wal| wal.punches = false);
    }

    #[test]
    fn compact_before_keeps_the_suffix() {
        both_ways("compact", |d, setup| {
            let records = recs(10);
            let mut wal = write(&d.0, &records[..6]);
            setup(&mut wal);
            for r in &records[6..] {
                wal.append(r).unwrap();
            }
            // Nothing to drop: the log is untouched and the pending records stay pending.
            wal.compact_before(0, Durability::Sync).unwrap();
            assert_eq!(wal.records(), 10);
            assert_ends_at(&d.log(), offset_of(&records, 6));
            // The cut falls in the synced part; the unsynced records survive and become durable.
            wal.compact_before(4, Durability::Sync).unwrap();
            assert_eq!(wal.records(), 6);
            drop(wal);
            let (mut wal, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
            setup(&mut wal);
            assert_eq!(got, records[4..]);
            assert_ends_at(&d.log(), wal.len_bytes());

            // Positions count from the new start, and may fall among unsynced records.
            wal.append(b"x").unwrap();
            wal.append(b"y").unwrap();
            wal.compact_before(7, Durability::Sync).unwrap();
            wal.append(b"z").unwrap();
            wal.sync().unwrap();
            assert_eq!(wal.records(), 2);
            assert!(wal.compact_before(3, Durability::Sync).is_err());
            wal.compact_before(2, Durability::Sync).unwrap();
            assert_eq!((wal.records(), wal.start()), (0, wal.len_bytes()));
            wal.append(b"last").unwrap();
            wal.sync().unwrap();
            drop(wal);
            assert_eq!(Wal::open(&d.0, Recovery::Strict).unwrap().1, [b"last".to_vec()]);
        });
    }

    #[test]
    fn compaction_frees_the_blocks_before_the_cut_in_place() {
        use std::os::unix::fs::MetadataExt;
        let d = TempDir::new("punch");
        let records: Vec<Vec<u8>> = (0..64u8).map(|i| vec![i; 16 << 10]).collect();
        let mut wal = write(&d.0, &records);
        // The thread writing the room ahead may still be reserving it: counted before or
        // after, its blocks would pass for blocks the compaction did not free.
        wal.finish_filling().unwrap();
        let allocated = |d: &TempDir| fs::metadata(d.log()).unwrap().blocks() * 512;
        let before = allocated(&d);
        for durability in [Durability::Replicated, Durability::Sync] {
            wal.compact_before(24, durability).unwrap();
        }
        wal.finish_punching();
        assert!(wal.punches, "the filesystem under {} punches holes", d.0.display());
        // The same file, its first 48 records' blocks freed: all but the header block and
        // one straddling the cut, give or take blocks of the filesystem's extent tree.
        assert_eq!(wal.start(), offset_of(&records, 48));
        assert!(before - allocated(&d) >= offset_of(&records, 48) - 4 * BLOCK, "{before} -> {}", allocated(&d));
        wal.append(b"after").unwrap();
        wal.sync().unwrap();
        drop(wal);
        let (wal, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        assert_eq!(got[..16], records[48..]);
        assert_eq!(got[16], b"after");
        assert_eq!(wal.start(), offset_of(&records, 48));
    }

    /// The crash points of a compaction: after the new start's slot is synced but before
    /// the hole is punched, and after a rewrite's temp file is written but before its
    /// rename. Neither loses a kept record; the first brings back no dropped one.
    #[test]
    fn a_compaction_cut_short_loses_no_kept_record_and_brings_back_no_dropped_one() {
        let d = TempDir::new("compaction-crash");
        let records = recs(8);
        let mut wal = write(&d.0, &records);
        // Slot synced, nothing punched: the dropped records' bytes are still in the file.
        wal.set_start(offset_of(&records, 3), Durability::Sync).unwrap();
        wal.append(b"after").unwrap();
        wal.sync().unwrap();
        drop(wal);
        let (mut wal, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        let mut want = records[3..].to_vec();
        want.push(b"after".to_vec());
        assert_eq!(got, want);
        // A rewrite's temp file, written whole and synced, left unrenamed: the log wins.
        wal.punches = false;
        let mut content = header_block(&wal.key);
        encode(&mut content, &wal.key, b"only in the temp file", true);
        fs::write(d.0.join(TMP_NAME), &content).unwrap();
        drop(wal);
        let (_, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        assert_eq!(got, want);
        assert!(!d.0.join(TMP_NAME).exists());
    }

    #[test]
    fn a_torn_start_slot_leaves_the_other() {
        let d = TempDir::new("slots");
        let records = recs(6);
        let mut wal = write(&d.0, &records);
        wal.punches = false;
        // A crash while writing the next slot, before anything was punched: the older
        // slot, one generation back, still points at every record.
        wal.set_start(offset_of(&records, 2), Durability::Sync).unwrap();
        drop(wal);
        let mut header = fs::read(d.log()).unwrap();
        let newest = slot_at(2);
        header[newest + 10] ^= 1;
        fs::write(d.log(), &header).unwrap();
        assert_eq!(Wal::open(&d.0, Recovery::Strict).unwrap().1, records);
        // Neither slot intact: corruption, named.
        let older = slot_at(1);
        header[older + 3] ^= 1;
        fs::write(d.log(), &header).unwrap();
        match Wal::open(&d.0, Recovery::Repair) {
            Err(StorageError::Corrupt { offset, reason, .. }) => {
                assert!(offset == 8 && reason.contains("slot"), "{reason}")
            }
            _ => panic!("expected corruption"),
        }
    }

    /// A power loss during a sync persisted the pages of its write out of order: its first
    /// record torn, the next two intact. They were all written together and never
    /// acknowledged, so the log ends before them, in either mode.
    #[test]
    fn a_write_torn_out_of_order_is_a_torn_tail_in_either_mode() {
        let d = TempDir::new("torn-write");
        let records = recs(3);
        let mut wal = write(&d.0, &records);
        for r in [&b"first of the write"[..], b"second", b"third"] {
            wal.append(r).unwrap();
        }
        wal.sync().unwrap();
        drop(wal);
        let mut data = fs::read(d.log()).unwrap();
        let first = offset_of(&records, 3);
        data[first as usize + HEADER + 2] ^= 0x40;
        recovers_then_continues(&d, &data, &records, first, "the torn write");
    }

    /// The same damage with a record of a later write after it: that write began once the
    /// damaged one was synced, so the damage is to acknowledged records.
    #[test]
    fn damage_with_a_later_write_after_it_is_corruption() {
        let d = TempDir::new("later-write");
        let records = recs(3);
        let mut wal = write(&d.0, &records);
        for r in [&b"first of the write"[..], b"second"] {
            wal.append(r).unwrap();
        }
        wal.sync().unwrap();
        wal.append(b"a later write").unwrap();
        wal.sync().unwrap();
        drop(wal);
        let mut data = fs::read(d.log()).unwrap();
        let first = offset_of(&records, 3);
        data[first as usize + HEADER + 2] ^= 0x40;
        fs::write(d.log(), &data).unwrap();
        match Wal::open(&d.0, Recovery::Strict) {
            Err(StorageError::Corrupt { offset, reason, .. }) => {
                assert_eq!(offset, first);
                assert!(reason.contains("later write"), "{reason}");
            }
            other => panic!("expected corruption, got {:?}", other.map(|(_, got)| got)),
        }
    }

    /// A log of the third version (no write marks): read, with damage before intact records
    /// still corruption (it cannot tell writes apart), and rewritten in this version.
    #[test]
    fn a_log_of_the_third_version_is_read_and_rewritten_in_this_one() {
        let records = recs(4);
        let key = [9; 32];
        let mut log = header_block(&key);
        log[..8].copy_from_slice(&MAGIC_V3);
        for r in &records {
            encode(&mut log, &key, r, false);
        }
        let d = TempDir::new("v3");
        fs::create_dir_all(&d.0).unwrap();
        let mut damaged = log.clone();
        damaged[offset_of(&records, 1) as usize + HEADER + 2] ^= 0x40;
        fs::write(d.log(), &damaged).unwrap();
        assert!(matches!(Wal::open(&d.0, Recovery::Strict), Err(StorageError::Corrupt { .. })));
        fs::write(d.log(), &log).unwrap();
        let (mut wal, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        assert_eq!(got, records);
        let written = fs::read(d.log()).unwrap();
        assert_eq!((&written[..8], key_of(&written)), (&MAGIC[..], Some(key)));
        wal.append(b"more").unwrap();
        wal.sync().unwrap();
        drop(wal);
        let (_, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        assert_eq!(got, [&records[..], &[b"more".to_vec()]].concat());
    }

    #[test]
    fn logs_of_earlier_versions_are_read_and_rewritten_in_this_one() {
        let records = recs(5);
        let mut v2 = vec![0; BLOCK as usize];
        v2[..8].copy_from_slice(&MAGIC_V2);
        v2[slot_at(1)..slot_at(1) + SLOT].copy_from_slice(&slot(1, BLOCK));
        for (name, mut log) in [("v1", MAGIC_V1.to_vec()), ("v2", v2)] {
            let d = TempDir::new(name);
            fs::create_dir_all(&d.0).unwrap();
            for r in &records {
                legacy_encode(&mut log, r);
            }
            // A torn tail, as a crash leaves it.
            log.extend_from_slice(&[7, 0, 0, 0, 1]);
            fs::write(d.log(), &log).unwrap();
            let (mut wal, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
            assert_eq!(got, records, "{name}");
            assert_eq!(fs::read(d.log()).unwrap()[..8], MAGIC, "{name}");
            wal.append(b"more").unwrap();
            wal.sync().unwrap();
            drop(wal);
            let (_, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
            assert_eq!(got[..5], records, "{name}");
            assert_eq!(got[5], b"more", "{name}");
        }
    }

    #[test]
    fn a_damaged_key_is_corruption_not_an_empty_log() {
        let d = TempDir::new("key");
        drop(write(&d.0, &recs(3)));
        let mut data = fs::read(d.log()).unwrap();
        data[KEY_AT + 5] ^= 1;
        fs::write(d.log(), &data).unwrap();
        for recovery in [Recovery::Strict, Recovery::Repair] {
            match Wal::open(&d.0, recovery) {
                Err(StorageError::Corrupt { offset, reason, .. }) => {
                    assert!(offset == KEY_AT as u64 && reason.contains("key"), "{reason}")
                }
                _ => panic!("expected corruption"),
            }
        }
    }

    /// Writes `records` and then `last`, and leaves `last` as a crash during its write
    /// leaves it: its first `kept` encoded bytes landed, the rest of it is the zeros of
    /// the room the log reserved. Returns the offset where `last` starts.
    fn tear_last(d: &TempDir, records: &[Vec<u8>], last: &[u8], kept: usize) -> u64 {
        let mut wal = write(&d.0, records);
        let end = wal.len_bytes();
        wal.append(last).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let f = File::options().write(true).open(d.log()).unwrap();
        let zeros = vec![0; HEADER + last.len() - kept];
        std::os::unix::fs::FileExt::write_all_at(&f, &zeros, end + kept as u64).unwrap();
        end
    }

    #[test]
    fn a_large_record_of_random_bytes_torn_by_a_crash_is_a_torn_tail() {
        // A checkpoint's state of 1 MiB of random values, its write cut short by `kill -9`
        // (which can end a large write early) or by a power loss before its sync: never
        // acknowledged. Thousands of places in it claim lengths that fit.
        let d = TempDir::new("torn-large");
        let records = recs(6);
        let mut big = vec![0u8; 1 << 20];
        blake3::Hasher::new().update(b"state").finalize_xof().fill(&mut big);
        let end = tear_last(&d, &records, &big, 3 << 18);
        let (mut wal, got) = Wal::open(&d.0, Recovery::Strict).unwrap_or_else(|e| panic!("restart refused: {e}"));
        assert_eq!((got, wal.len_bytes()), (records.clone(), end));
        wal.append(b"after").unwrap();
        wal.sync().unwrap();
    }

    #[test]
    fn a_torn_record_carrying_a_clients_forged_records_is_a_torn_tail() {
        // A Byzantine client's op holds log records as it can make them: under keys of its
        // own, or unkeyed as the earlier versions wrote. A replica persists the op verbatim
        // inside its batch record, and a crash tears that record after the op.
        let d = TempDir::new("torn-forged");
        let records = recs(6);
        let mut op = Vec::new();
        for key in [[0; 32], [7; 32]] {
            encode(&mut op, &key, b"any bytes at all", true);
        }
        legacy_encode(&mut op, b"any bytes at all");
        let batch = [&b"\x0a\x40batch header"[..], &op, &[0x55; 300][..]].concat();
        let end = tear_last(&d, &records, &batch, HEADER + 14 + op.len() + 10);
        let (_, got) = Wal::open(&d.0, Recovery::Strict).unwrap_or_else(|e| panic!("restart refused: {e}"));
        assert_eq!(got, records);
        assert_eq!(Wal::open(&d.0, Recovery::Strict).unwrap().0.len_bytes(), end);
    }

    #[test]
    fn appending_after_recovery_continues() {
        let d = TempDir::new("continue");
        let records = recs(4);
        drop(write(&d.0, &records));
        let mut f = File::options().append(true).open(d.log()).unwrap();
        f.write_all(&[9, 0, 0, 0, 1, 2]).unwrap();
        drop(f);
        let (mut wal, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        assert_eq!(got, records);
        wal.append(b"five").unwrap();
        wal.append(b"six").unwrap();
        wal.sync().unwrap();
        assert_eq!(wal.records(), 6);
        drop(wal);
        let (_, got) = Wal::open(&d.0, Recovery::Strict).unwrap();
        let mut want = records.clone();
        want.extend([b"five".to_vec(), b"six".to_vec()]);
        assert_eq!(got, want);
    }

    #[test]
    fn oversized_record_is_refused() {
        let d = TempDir::new("oversized");
        let mut wal = write(&d.0, &[]);
        let big = vec![0u8; MAX_RECORD + 1];
        assert!(matches!(wal.append(&big), Err(StorageError::Io { .. })));
        assert!(wal.rewrite([&big[..]]).is_err());
        // Neither failure damaged the log.
        assert_eq!(wal.records(), 0);
        wal.append(b"ok").unwrap();
        wal.sync().unwrap();
        drop(wal);
        assert_eq!(Wal::open(&d.0, Recovery::Strict).unwrap().1, [b"ok".to_vec()]);
    }
}
