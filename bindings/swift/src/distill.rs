//! `DistillClient`: an async client of a distillation deployment (`phalanxd keygen
//! --protocol distill`), one of its generated directory's clients. It is phalanxd's own
//! (`phalanx_host::client::distill`, as `phalanxd client submit` runs it) on a
//! [`ClientThread`] of its own, like [`crate::client::Client`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use phalanx_host::client::distill::{Delivered, DistillClient as HostDistillClient};
use phalanx_host::config::ClusterFile;

use crate::client::{ClientThread, client_error, request_timeout, start_error};
use crate::errors::PhalanxError;

/// Where a submitted message was delivered: the height of its batch, and the seq the
/// client gave it (a client's seqs increase with each message it submits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, uniffi::Record)]
pub struct DistillDelivery {
    pub height: u64,
    pub seq: u64,
}

impl From<Delivered> for DistillDelivery {
    fn from(d: Delivered) -> Self {
        DistillDelivery { height: d.height, seq: d.seq }
    }
}

/// A client of the generated directory of a distillation deployment, submitting through
/// its brokers over UDP. Messages from one `DistillClient` are submitted one after
/// another, in the order made; use several clients (indices) for parallel load.
///
/// Its seq range and last height record live in phalanxd's write-ahead log in `dataDir`
/// (by default `data/client-<id>` beside the cluster file, where `phalanxd client submit`
/// keeps them), so a restarted client goes on from there.
#[derive(uniffi::Object)]
pub struct DistillClient {
    id: u32,
    index: u32,
    timeout: Duration,
    thread: ClientThread<HostDistillClient>,
}

#[uniffi::export]
impl DistillClient {
    /// Client `index` of the directory of the deployment in `clusterFile` (`.config` if
    /// the directory has no such client); each submission fails with `.timeout` after
    /// `timeoutSeconds` without a certified delivery.
    #[uniffi::constructor(default(index = 0, data_dir = None, timeout_seconds = 10.0))]
    pub fn new(
        cluster_file: String,
        index: u32,
        data_dir: Option<String>,
        timeout_seconds: f64,
    ) -> Result<Self, PhalanxError> {
        let cluster = ClusterFile::load(Path::new(&cluster_file)).map_err(PhalanxError::config)?;
        let timeout = request_timeout(timeout_seconds)?;
        let client = HostDistillClient::start(&cluster, index, data_dir.map(PathBuf::from)).map_err(start_error)?;
        let (id, index) = (client.id(), client.index());
        let thread = ClientThread::start(format!("distillation client {index}"), client, HostDistillClient::stop)?;
        Ok(DistillClient { id, index, timeout, thread })
    }

    /// Its node id: 2^31 + its index.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Its index in the generated directory.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Submits `message` and returns its certified delivery. A `.timeout` leaves the
    /// outcome unknown: the message may still be delivered (the client keeps resubmitting
    /// it through the next broker meanwhile).
    pub async fn submit(&self, message: Vec<u8>) -> Result<DistillDelivery, PhalanxError> {
        let timeout = self.timeout;
        self.thread
            .call(move |client| client.submit(message, timeout).map(DistillDelivery::from).map_err(client_error))
            .await
    }

    /// Stops the client's threads (also when the client goes away); submissions after it
    /// fail with `.client`.
    pub fn close(&self) {
        self.thread.close();
    }
}
