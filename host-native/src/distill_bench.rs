//! `phalanxd distill-bench`: 4 real `phalanxd run` distillation servers on this machine
//! and, in this process, a load broker (spec §8): it fabricates fully distilled batches
//! of a generated directory (the clients' multi-signature made with one signing by the
//! sum of their secret keys, [`phalanx_core::distill::load`]), offers them to the servers
//! over the authenticated TCP links like any broker (hello, offer, witness certificate),
//! and measures what the servers deliver: messages/s at each server, latency from offer
//! to each server's delivery shard, and from the servers' own metrics the signature
//! verifications and bytes received per delivered message.
//!
//! Lanes hold disjoint clients (lane l: ids `l*entries ..`), so each client's seq grows
//! with its lane's batches whatever order the lanes are ordered in. Servers 0 and 1 (f+1)
//! verify every batch; 2 and 3 check roots only. The first batch of each lane warms the
//! verifiers' directory caches and is not measured.
//!
//! Each straggler fraction's run also writes a CSV and an SVG plot, like `phalanxd bench`:
//! per second, the messages server 0 delivered and the offer-to-delivery latencies.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use clap::Args;
use phalanx_core::crypto::{BlsSignature, CryptoMode};
use phalanx_core::distill::load::{self, LoadClients};
use phalanx_core::distill::{ed_key, hello_statement, system_id};
use phalanx_core::wire::pb;
use phalanx_core::wire::pb::distill_frame::Kind as Frame;
use phalanx_core::{NodeId, Params, Protocol};
use prost::Message;

use crate::bench::Second;
use crate::distill_clients::RealClients;
use crate::local_cluster::{LocalCluster, LocalSpec};
use crate::metrics::{Metrics, scrape, value};
use crate::net::{MAX_CONNECTIONS, NetConfig, Network, Received};

const SERVERS: usize = 4;
/// f+1 = 2 servers verify each batch (margin 0).
const VERIFIERS: usize = 2;
const BROKER: NodeId = phalanx_core::config::FIRST_BROKER;
/// How long a batch may take from offer to delivery at every server: the warm-up
/// batches include the verifiers deriving every client's keys (minutes for 2^18 clients
/// on two shared cores).
const BATCH_TIMEOUT: Duration = Duration::from_secs(600);

/// Arguments of `phalanxd distill-bench`.
#[derive(Args, Clone, Debug)]
pub struct DistillBenchArgs {
    /// Entries (clients, one 8-byte message each) per batch.
    #[arg(long, default_value_t = 65_536)]
    entries: u32,
    /// Batches measured per straggler fraction, after one per lane to warm up.
    #[arg(long, default_value_t = 16)]
    batches: u32,
    /// Lanes: batches in flight at once.
    #[arg(long, default_value_t = 4)]
    lanes: u32,
    /// Straggler percentages to run, one fresh cluster each.
    #[arg(long, value_delimiter = ',', default_value = "0,1,10")]
    stragglers: Vec<u64>,
    /// Messages per second offered (default: a batch as soon as its lane is free).
    #[arg(long)]
    rate: Option<f64>,
    /// Directory for the clusters (replaced).
    #[arg(long, default_value = "distill-bench-cluster")]
    dir: PathBuf,
    /// Instead of the load broker: this many real signing clients through real broker
    /// processes over UDP ([`crate::distill_clients`]).
    #[arg(long)]
    real_clients: Option<u32>,
    /// --real-clients: threads hosting the clients.
    #[arg(long, default_value_t = 2)]
    client_threads: usize,
    /// --real-clients: messages each client submits, one after the other.
    #[arg(long, default_value_t = 4)]
    messages: u32,
    /// --real-clients: broker processes (clients spread over them).
    #[arg(long, default_value_t = 1)]
    brokers: u32,
    /// --real-clients: the brokers' pool timeout, ms (a batch also closes when every
    /// client's message is in).
    #[arg(long, default_value_t = 100)]
    pool_ms: u64,
    /// Directory for `distill-bench-<stragglers>pct-<UTC time>.csv` and `.svg`.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
}

/// A delivery measured: when (since measuring began), at which server, and how long
/// after its batch was offered.
type Measured = (Duration, usize, Duration);

/// Per measured second: the messages server 0 delivered (`entries` a batch), and the
/// offer-to-delivery latencies of the batches any server delivered in it.
fn per_second(measured: &[Measured], entries: u64) -> Vec<Second> {
    let seconds = measured.iter().map(|m| m.0.as_secs() + 1).max().unwrap_or(0);
    (1..=seconds)
        .map(|s| {
            let within: Vec<&Measured> = measured.iter().filter(|m| m.0.as_secs() + 1 == s).collect();
            let messages = within.iter().filter(|m| m.1 == 0).count() as u64 * entries;
            let mut latencies: Vec<Duration> = within.iter().map(|m| m.2).collect();
            Second::of(s, messages, &mut latencies)
        })
        .collect()
}

/// One run's figures for one server.
struct ServerFigures {
    messages_per_s: f64,
    verifications: f64,
    bytes: f64,
}

pub fn run(a: DistillBenchArgs) -> Result<(), String> {
    let binary = std::env::current_exe().map_err(|e| format!("finding phalanxd: {e}"))?;
    if let Some(clients) = a.real_clients {
        let r = RealClients {
            clients,
            threads: a.client_threads.max(1),
            messages: a.messages,
            brokers: a.brokers.max(1),
            pool_ms: a.pool_ms,
            dir: a.dir.clone(),
            kill_broker_after: None,
        };
        return crate::distill_clients::run(&r, &binary);
    }
    println!(
        "distill-bench: 4 server processes on this machine, a load broker in this one; {} entries of 8 bytes per batch, \
         {} lanes, {} measured batches{}",
        a.entries,
        a.lanes,
        a.batches,
        a.rate.map_or(String::new(), |r| format!(", offered at {r:.0} messages/s"))
    );
    let stamp = crate::bench::utc_stamp(std::time::SystemTime::now());
    for &pct in &a.stragglers {
        let (figures, measured) = run_one(&a, pct, &binary)?;
        println!("{pct}% stragglers:");
        for (i, f) in figures.iter().enumerate() {
            let mut lat: Vec<Duration> = measured.iter().filter(|m| m.1 == i).map(|m| m.2).collect();
            let mean = lat.iter().sum::<Duration>().checked_div(lat.len() as u32).unwrap_or_default();
            let quantiles = Second::of(0, 0, &mut lat);
            println!(
                "  server {i} ({}): {:>10.0} messages/s delivered; offer->delivery mean {:.0} ms, p50 {:.0} ms, \
                 max {:.0} ms; {:.7} verifications and {:.2} bytes received per delivered message",
                if i < VERIFIERS { "verifies" } else { "roots only" },
                f.messages_per_s,
                mean.as_secs_f64() * 1e3,
                quantiles.p50_ms,
                quantiles.max_ms,
                f.verifications,
                f.bytes,
            );
        }
        let title = format!("phalanxd distill-bench: {} entries per batch, {pct}% stragglers", a.entries);
        let setup = format!(
            "4 servers (2 verify each batch), a load broker, {} lanes, {} measured batches; messages delivered at server 0, \
             latency from offer to each server's delivery",
            a.lanes, a.batches
        );
        let series = per_second(&measured, a.entries.into());
        let name = format!("distill-bench-{pct}pct-{stamp}");
        let (csv, svg) = crate::bench::write_report(&a.out, &name, &series, &title, &[&setup], "messages")?;
        println!("  written {} and {}", csv.display(), svg.display());
    }
    Ok(())
}

/// A server's counters, scraped.
#[derive(Clone, Copy, Default)]
struct Counters {
    messages: f64,
    verifications: f64,
    bytes_in: f64,
}

fn counters(addr: SocketAddr) -> Result<Counters, String> {
    let text = scrape(addr).map_err(|e| format!("metrics at {addr}: {e}"))?;
    let bytes_in = text
        .lines()
        .filter(|l| l.starts_with("phalanx_bytes_in_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    Ok(Counters {
        messages: value(&text, "phalanx_distill_messages_delivered_total").unwrap_or(0.0),
        verifications: value(&text, "phalanx_signatures_verified_total").unwrap_or(0.0),
        bytes_in,
    })
}

/// A batch made before the run: its lane and seq there, and its offer encoded without
/// and with the verify flag.
struct Fabricated {
    lane: u32,
    lane_seq: u64,
    offers: [Vec<u8>; 2],
}

/// A batch offered: its lane, root, and when each server's delivery shard came.
struct InFlight {
    lane: u32,
    lane_seq: u64,
    offered: Instant,
    shards: Vec<(usize, BlsSignature)>,
    delivered: [Option<Instant>; SERVERS],
}

fn run_one(
    a: &DistillBenchArgs,
    pct: u64,
    binary: &std::path::Path,
) -> Result<(Vec<ServerFigures>, Vec<Measured>), String> {
    let params = Params {
        distill_batch_size: a.entries,
        max_payload: 8,
        lanes: a.lanes,
        directory_size: a.lanes as u64 * a.entries as u64,
        ..Params::default()
    };
    let spec = LocalSpec {
        protocol: Protocol::Distill,
        clients: (a.lanes as u64 * a.entries as u64) as u32,
        brokers: 1,
        crypto: CryptoMode::Real,
        params,
        ..LocalSpec::default()
    };
    let mut c = LocalCluster::create(&a.dir, &spec, binary)?;
    for id in 0..SERVERS as NodeId {
        c.start(id)?;
    }
    let cfg = c.cluster.node_config(BROKER).map_err(|e| e.to_string())?;
    let mode = cfg.cluster.crypto;
    let sys = system_id(&cfg.cluster);
    let identity = ed_key(mode, cfg.bls_secret.key_material());
    let broker = identity.public_key().0;
    let p = &c.cluster.params;

    eprint!("  {pct}% stragglers: making {} client keys and the batches...", p.directory_size);
    let t = Instant::now();
    let clients: Vec<LoadClients> = (0..a.lanes as u64)
        .map(|l| {
            let ids = (l * a.entries as u64..(l + 1) * a.entries as u64).collect();
            LoadClients::new(mode, sys, p.leaf_entries, p.directory_seed, ids, pct).ok_or("summing client keys")
        })
        .collect::<Result<_, _>>()?;
    let total = a.lanes + a.batches;
    // Each batch's offers (verifying and not) and root, made before any is sent.
    let batches: Vec<Fabricated> = (0..total as u64)
        .map(|k| {
            let (lane, lane_seq) = ((k % a.lanes as u64) as u32, k / a.lanes as u64);
            let (batch, root) = clients[lane as usize]
                .batch(lane_seq, load::messages(k, a.entries as usize))
                .ok_or("a fabricated batch is malformed")?;
            let encoded = batch.to_pb();
            let offer = |verify| {
                let o = pb::Offer { lane, lane_seq, root: root.to_vec(), batch: Some(encoded.clone()), verify };
                pb::DistillFrame { kind: Some(Frame::Offer(o)) }.encode_to_vec()
            };
            Ok(Fabricated { lane, lane_seq, offers: [offer(false), offer(true)] })
        })
        .collect::<Result<_, String>>()?;
    eprintln!(" {:.1?}", t.elapsed());

    let servers: Vec<(NodeId, SocketAddr)> = c.cluster.replicas.iter().map(|r| (r.id, r.address)).collect();
    let metrics_addrs: Vec<SocketAddr> = (0..SERVERS as NodeId)
        .map(|id| c.metrics_addr(id).ok_or("a server without metrics"))
        .collect::<Result<_, _>>()?;
    let ids: Vec<NodeId> = servers.iter().map(|s| s.0).collect();
    let net_cfg = NetConfig {
        me: BROKER,
        listen: None,
        dial: servers.clone(),
        known: ids.iter().copied().collect(),
        max_frame: c.cluster.max_frame_bytes(),
        send_queue_bytes: 1 << 30,
        reconnect_min: Duration::from_millis(50),
        reconnect_max: Duration::from_millis(500),
        shared: false,
        max_connections: MAX_CONNECTIONS,
        keys: None,
    };
    let (tx, rx) = mpsc::channel::<Received>();
    let (network, outbox) = Network::new(net_cfg, Arc::new(Metrics::new(BROKER, &ids)))
        .map_err(|e| format!("the load broker's network: {e}"))?;
    let net = thread::spawn(move || network.run(move |f| tx.send(f).is_ok()));
    let send = |frames: &mut Vec<(NodeId, Vec<u8>)>| outbox.send(frames);
    let frame = |kind: Frame| pb::DistillFrame { kind: Some(kind) }.encode_to_vec();

    // Sessions: a signed hello to each server, again until every one answered.
    let nonce = std::time::UNIX_EPOCH.elapsed().unwrap_or_default().as_nanos() as u64;
    let mut answered = [false; SERVERS];
    let deadline = Instant::now() + Duration::from_secs(30);
    while !answered.iter().all(|&x| x) {
        if Instant::now() > deadline {
            return Err("the servers did not answer the load broker's hello".into());
        }
        let mut hellos: Vec<(NodeId, Vec<u8>)> = (0..SERVERS)
            .filter(|&i| !answered[i])
            .map(|i| {
                let signature = identity.sign(&hello_statement(&sys, &broker, ids[i], nonce)).0.to_vec();
                (ids[i], frame(Frame::Hello(pb::BrokerHello { broker: broker.to_vec(), nonce, signature })))
            })
            .collect();
        send(&mut hellos);
        let until = Instant::now() + Duration::from_secs(1);
        while let Ok(frames) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            for (from, bytes) in frames {
                if let Some(Frame::Lanes(_)) = pb::DistillFrame::decode(bytes.as_slice()).ok().and_then(|f| f.kind) {
                    answered[from as usize] = true;
                }
            }
        }
    }

    let interval = a.rate.map(|r| Duration::from_secs_f64(a.entries as f64 / r));
    let mut flights: BTreeMap<(u32, u64), InFlight> = BTreeMap::new();
    let mut lane_busy = vec![false; a.lanes as usize];
    let mut next = 0usize;
    let mut start: Option<(Instant, Vec<Counters>)> = None;
    let mut measured: Vec<Measured> = Vec::new();
    let mut done = 0usize;
    let begun = Instant::now();
    while done < batches.len() {
        // Measuring starts once the warm-up batches are delivered everywhere.
        if start.is_none() && done >= a.lanes as usize {
            let before = metrics_addrs.iter().map(|&m| counters(m)).collect::<Result<Vec<_>, _>>()?;
            start = Some((Instant::now(), before));
        }
        // The warm-up batches at once; the measured ones once they are done, on the
        // rate's schedule if there is one.
        let warm = next < a.lanes as usize;
        let due = match (interval, &start) {
            (Some(every), Some((t0, _))) if !warm => *t0 + every * (next - a.lanes as usize) as u32,
            _ => Instant::now(),
        };
        let may_offer = next < batches.len() && !lane_busy[batches[next].lane as usize] && (warm || start.is_some());
        if may_offer && Instant::now() >= due {
            let b = &batches[next];
            let mut out: Vec<(NodeId, Vec<u8>)> =
                (0..SERVERS).map(|i| (ids[i], b.offers[usize::from(i < VERIFIERS)].clone())).collect();
            send(&mut out);
            lane_busy[b.lane as usize] = true;
            let flight = InFlight {
                lane: b.lane,
                lane_seq: b.lane_seq,
                offered: Instant::now(),
                shards: vec![],
                delivered: [None; SERVERS],
            };
            flights.insert((b.lane, b.lane_seq), flight);
            next += 1;
            continue;
        }
        let wait = if may_offer { due.saturating_duration_since(Instant::now()) } else { Duration::from_millis(100) };
        let frames = match rx.recv_timeout(wait) {
            Ok(frames) => frames,
            Err(RecvTimeoutError::Timeout) => {
                if flights.values().any(|f| f.offered.elapsed() > BATCH_TIMEOUT) {
                    return Err(format!("a batch was not delivered at every server within {BATCH_TIMEOUT:?}"));
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return Err("the load broker's network stopped".into()),
        };
        for (from, bytes) in frames {
            let server = from as usize;
            match pb::DistillFrame::decode(bytes.as_slice()).ok().and_then(|f| f.kind) {
                Some(Frame::WitnessShard(w)) => {
                    let Some(f) = flights.get_mut(&(w.lane, w.lane_seq)) else { continue };
                    let Ok(sig) = <[u8; 96]>::try_from(w.signature.as_slice()) else { continue };
                    f.shards.push((server, BlsSignature(sig)));
                    if f.shards.len() == VERIFIERS {
                        let r = pb::Reference {
                            broker: broker.to_vec(),
                            lane: f.lane,
                            lane_seq: f.lane_seq,
                            root: w.root,
                            witness: load::certificate(mode, SERVERS, &f.shards),
                        };
                        let mut out: Vec<(NodeId, Vec<u8>)> =
                            ids.iter().map(|&s| (s, frame(Frame::Witness(r.clone())))).collect();
                        send(&mut out);
                    }
                }
                Some(Frame::DeliveryShard(d)) => {
                    let Some(f) = flights.get_mut(&(d.lane, d.lane_seq)) else { continue };
                    if f.delivered[server].is_none() {
                        let now = Instant::now();
                        f.delivered[server] = Some(now);
                        if let Some((t0, _)) = &start {
                            measured.push((now - *t0, server, now - f.offered));
                        }
                    }
                    if f.delivered.iter().all(Option::is_some) {
                        lane_busy[f.lane as usize] = false;
                        flights.remove(&(d.lane, d.lane_seq));
                        done += 1;
                        if done.is_multiple_of(4) {
                            eprintln!(
                                "  {done}/{} batches delivered at every server ({:.1?})",
                                batches.len(),
                                begun.elapsed()
                            );
                        }
                    }
                }
                _ => {}
            }
        }
    }
    let (_, before) = start.ok_or("nothing was measured")?;
    // The servers' counters settle with their last delivery: read them a moment later.
    thread::sleep(Duration::from_millis(300));
    let after = metrics_addrs.iter().map(|&m| counters(m)).collect::<Result<Vec<_>, _>>()?;
    outbox.shutdown();
    let _ = net.join();
    let figures = (0..SERVERS)
        .map(|i| {
            let delivered = after[i].messages - before[i].messages;
            let took = measured.iter().filter(|m| m.1 == i).map(|m| m.0).max().unwrap_or_default();
            ServerFigures {
                messages_per_s: delivered / took.as_secs_f64().max(1e-9),
                verifications: (after[i].verifications - before[i].verifications) / delivered.max(1.0),
                bytes: (after[i].bytes_in - before[i].bytes_in) / delivered.max(1.0),
            }
        })
        .collect();
    Ok((figures, measured))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_second_counts_server_zeros_messages_and_every_servers_latencies() {
        let ms = Duration::from_millis;
        let measured = [
            (ms(100), 0, ms(40)),
            (ms(200), 1, ms(50)),
            (ms(900), 0, ms(60)),
            // Nothing in the second second.
            (ms(2_500), 2, ms(70)),
        ];
        let series = per_second(&measured, 1_000);
        assert_eq!(series.iter().map(|s| (s.second, s.ops)).collect::<Vec<_>>(), [(1, 2_000), (2, 0), (3, 0)]);
        assert_eq!((series[0].p50_ms, series[0].max_ms), (50.0, 60.0));
        assert_eq!(series[2].max_ms, 70.0);
    }
}
