//! A client of a distillation deployment: one of the generated directory's clients,
//! submitting messages through the brokers over UDP and waiting for each one's certified
//! delivery. `phalanxd client submit` and the bindings' distillation clients run this.

use std::path::PathBuf;
use std::time::Duration;

use phalanx_core::NodeId;
use phalanx_core::distill::CLIENT_ADDRESS_BASE;

use super::{ClientError, ClusterClient};
use crate::config::{ClusterFile, ConfigError};
use crate::runtime::StartError;

/// Where a message was delivered: the batch's height, and the seq it was delivered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivered {
    pub height: u64,
    pub seq: u64,
}

impl Delivered {
    /// A distillation client's completion result (height, then seq, little-endian).
    pub fn decode(result: &[u8]) -> Option<Delivered> {
        let height = u64::from_le_bytes(result.get(..8)?.try_into().ok()?);
        let seq = u64::from_le_bytes(result.get(8..16)?.try_into().ok()?);
        Some(Delivered { height, seq })
    }
}

pub struct DistillClient {
    client: ClusterClient,
}

impl DistillClient {
    /// Client `index` of the generated directory of the deployment in `cluster` (node id
    /// `CLIENT_ADDRESS_BASE + index`). It keeps its seq range, last height record and
    /// message in flight in phalanxd's write-ahead log in `data_dir` (default
    /// `data/client-<id>` beside the cluster file, as `phalanxd client submit`), so a
    /// restarted client goes on from there, its message in flight first.
    pub fn start(cluster: &ClusterFile, index: u32, data_dir: Option<PathBuf>) -> Result<DistillClient, StartError> {
        let id = CLIENT_ADDRESS_BASE
            .checked_add(index)
            .filter(|&id| cluster.generated_client(id).is_some())
            .ok_or_else(|| {
                StartError::Config(ConfigError {
                    file: cluster.path.clone(),
                    field: None,
                    problem: format!(
                        "client {index}: the deployment's directory has {} clients (is it a distill cluster?)",
                        cluster.params.directory_size
                    ),
                })
            })?;
        Ok(DistillClient { client: ClusterClient::start(cluster, id, data_dir)? })
    }

    pub fn id(&self) -> NodeId {
        self.client.id()
    }

    /// The directory index this client signs as.
    pub fn index(&self) -> u32 {
        self.client.id() - CLIENT_ADDRESS_BASE
    }

    /// Submits `message` and waits, at most `timeout`, until a broker hands back a
    /// certified delivery of it. A timeout leaves the outcome unknown: the message may
    /// still be delivered (the client resubmits it through the next broker meanwhile).
    pub fn submit(&mut self, message: Vec<u8>, timeout: Duration) -> Result<Delivered, ClientError> {
        let result = self.client.execute(message, timeout)?;
        Delivered::decode(&result)
            .ok_or_else(|| ClientError::Stopped("the client core completed with a malformed delivery".into()))
    }

    pub fn stop(self) -> Result<(), String> {
        self.client.stop()
    }
}
