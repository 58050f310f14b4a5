//! phalanxd's write-ahead log, for hosts that drive a `Node` themselves and keep its
//! records as phalanxd does (`Replica` and `Client` use it through the host loop).

use napi_derive::napi;
use phalanx_host::config::Durability;
use phalanx_host::storage::{Recovery, Wal as HostWal};

use crate::convert::Bytes;
use crate::{Code, Result, fail};

fn storage_error(e: phalanx_host::storage::StorageError) -> napi::Error<Code> {
    fail(Code::Storage, e)
}

/// The log in directory `dir` (`dir/wal.log`): length, checksum and record per entry; a
/// torn tail is truncated, other damage refused (`StorageError` naming the file and
/// offset) unless `repair`.
#[napi]
pub struct Wal {
    wal: HostWal,
    recovered: Vec<Vec<u8>>,
}

#[napi]
impl Wal {
    #[napi(constructor)]
    pub fn new(dir: String, repair: Option<bool>) -> Result<Self> {
        let recovery = if repair.unwrap_or(false) { Recovery::Repair } else { Recovery::Strict };
        let (wal, recovered) = HostWal::open(std::path::Path::new(&dir), recovery).map_err(storage_error)?;
        Ok(Wal { wal, recovered })
    }

    /// The records found when the log was opened, oldest first (handed out once): feed
    /// them to the node as `{ type: 'recover', record }` before anything else.
    #[napi(ts_return_type = "Array<Buffer>")]
    pub fn take_recovered(&mut self) -> Vec<Bytes> {
        std::mem::take(&mut self.recovered).into_iter().map(Bytes).collect()
    }

    /// Buffers one record; durable after the next `sync`.
    #[napi]
    pub fn append(&mut self, #[napi(ts_arg_type = "Uint8Array")] record: Bytes) -> Result<()> {
        self.wal.append(&record.0).map_err(storage_error)
    }

    /// Makes every appended record durable (one `fdatasync`).
    #[napi]
    pub fn sync(&mut self) -> Result<()> {
        self.wal.sync().map_err(storage_error)
    }

    /// Drops the first `n` records (the node declared them obsolete with `compact`).
    #[napi]
    pub fn compact_before(&mut self, n: u32) -> Result<()> {
        self.wal.compact_before(n.into(), Durability::Sync).map_err(storage_error)
    }

    /// Records in the log, appended ones included.
    #[napi(getter)]
    pub fn length(&self) -> u32 {
        self.wal.records() as u32
    }
}
