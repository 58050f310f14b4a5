//! Seeds the fuzz corpora from the recorded traces: `seed_corpus TRACES_DIR CORPUS_DIR`.
//!
//! - `trace`: each trace file as it is;
//! - `decode`: a trace's node config, inputs, outputs and frames, behind their selectors;
//! - `open`: the frames a traced node received, behind their sender;
//! - `pubsub_node`, `pbft_node`, `distill_node` and `perpetual_node`: each trace whose
//!   cluster has as many nodes as the harness's as events for the same node of it (same
//!   ids): its bodies as sealed bodies from their senders, its other inputs as API inputs.

use std::path::Path;

use phalanx_core::trace::Trace;
use phalanx_core::wire::{self, pb};
use phalanx_core::{NodeConfig, Protocol};
use phalanx_fuzz_harness::{Cluster, distill, event, pbft, perpetual, pubsub};
use prost::Message;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, traces, corpus] = &args[..] else {
        eprintln!("usage: seed_corpus TRACES_DIR CORPUS_DIR");
        std::process::exit(2);
    };
    let mut names: Vec<_> = std::fs::read_dir(traces).expect("traces dir").flatten().map(|e| e.path()).collect();
    names.sort();
    for path in names.iter().filter(|p| p.extension().is_some_and(|e| e == "trace")) {
        let bytes = std::fs::read(path).expect("readable trace");
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let trace = Trace::parse(&bytes).expect("a valid reference trace");
        write(corpus, "trace", &name, &bytes);
        let mut decode = vec![4];
        decode.extend_from_slice(&trace.header.node_config);
        write(corpus, "decode", &format!("{name}-config"), &decode);
        let mut frames = 0;
        for (i, r) in trace.records.iter().enumerate().take(40) {
            let Some(input) = &r.input else { continue };
            write(corpus, "decode", &format!("{name}-{i}-inputs"), &[&[5], &input.encode_to_vec()[..]].concat());
            for (j, o) in r.outputs.iter().enumerate().take(2) {
                write(corpus, "decode", &format!("{name}-{i}-{j}-output"), &[&[8], &o.encode_to_vec()[..]].concat());
            }
            if let Some(pb::input_record::Kind::Message(m)) = &input.kind
                && frames < 20
            {
                frames += 1;
                write(corpus, "open", &format!("{name}-{i}"), &[&[m.from as u8], &m.bytes[..]].concat());
                write(corpus, "decode", &format!("{name}-{i}-frame"), &[&[0], &m.bytes[..]].concat());
            }
        }
        let cfg = NodeConfig::decode(&trace.header.node_config).expect("the trace's own config");
        let (cluster, target) = match cfg.cluster.protocol {
            Protocol::PubSub => (pubsub(), "pubsub_node"),
            Protocol::Pbft => (pbft(), "pbft_node"),
            Protocol::Distill => (distill(), "distill_node"),
            Protocol::Perpetual => (perpetual(), "perpetual_node"),
        };
        if cfg.cluster.nodes.len() == cluster.configs.len() {
            write(corpus, target, &name, &events(cluster, cfg.id, &trace));
        }
    }
}

/// The trace's inputs as the harness's events for node `me`.
fn events(cluster: &Cluster, me: u32, trace: &Trace) -> Vec<u8> {
    let mut out = vec![cluster.configs.iter().position(|c| c.id == me).expect("same ids") as u8];
    let mut last = 0;
    for r in &trace.records {
        let Some(input) = &r.input else { continue };
        let advance = (r.now.saturating_sub(last) / 100_000).min(255) as u8;
        last = r.now;
        match &input.kind {
            Some(pb::input_record::Kind::Message(m)) => {
                // The sender's index among the node's peers (every other id, in order).
                let peers = cluster.configs.iter().map(|c| c.id).filter(|&id| id != me);
                let Some(sender) = peers.clone().position(|id| id == m.from) else { continue };
                let sender = sender as u8;
                for (k, body) in wire::bodies_of(&m.bytes).unwrap_or_default().into_iter().enumerate() {
                    let body = pb::Body { kind: Some(body) }.encode_to_vec();
                    out.extend(event(0, sender, if k == 0 { advance } else { 0 }, &body));
                }
            }
            _ => out.extend(event(2, 0, advance, &input.encode_to_vec())),
        }
    }
    out
}

fn write(corpus: &str, target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(corpus).join(target);
    std::fs::create_dir_all(&dir).expect("corpus dir");
    std::fs::write(dir.join(name), bytes).expect("corpus file");
}
