//! `phalanxd bench`: load against a local cluster of real processes (being written).

use clap::Args;

#[derive(Args, Clone, Debug)]
pub struct BenchArgs {}

pub fn run(_: BenchArgs) -> Result<(), String> {
    Err("phalanxd bench is not built yet".into())
}
