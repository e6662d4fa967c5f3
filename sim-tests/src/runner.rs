//! The scenario runner: one seed, one madsim runtime, one run.
//!
//! Builds the storage nodes (each with a simulated SSD) and the client hosts on the
//! simulated fabric, runs the workload for its simulated duration while recording
//! every operation, then reads every written block back from every replica, checks
//! the history and measures it.

use crate::checker::{check_linearizable, check_no_lost_writes, Verdict};
use crate::history::{
    decode_block, encode_block, History, OpKind, OpRecord, ReplicaRead, Tag, Value,
};
use crate::invariants::{check_acks_persisted, check_epochs, check_leases};
use crate::report::{FabricSummary, Report};
use crate::scenario::{Pattern, Scenario};
use crate::telemetry::{Sample as TelemetrySample, Telemetry};
use bytes::Bytes;
use madsim::rand::{thread_rng, Rng};
use madsim::runtime::{Handle, Runtime};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use weir_core::client::{ClientError, Volume};
use weir_core::congestion::dcqcn::CnpMode;
use weir_core::congestion::tcp::Algorithm;
use weir_core::control::{ControlPlane, Timeouts};
use weir_core::device::DevError;
use weir_core::error::WeirError;
use weir_core::map::{ClusterMap, VolumeSpec};
use weir_core::node::{AuditLog, EventLog, Events, Node};
use weir_core::replication::ReplicationConfig;
use weir_core::time::Skew;
use weir_core::{BufPool, Event, Lba, NodeId, VolumeId};
use weir_nvme_sim::{SimSsd, SsdConfig};
use weir_transport_sim::fabric::config::Topology;
use weir_transport_sim::{Fabric, FabricConfig, SimTransport};

/// Node id of the first client host; storage nodes are 1..=N.
const FIRST_CLIENT: u32 = 1000;
/// Node id of the host that reads every replica back after the workload.
const CHECKER_HOST: u32 = 999;
/// Concurrent reads of the read-back.
const READBACK_PARALLEL: usize = 64;
/// Attempts of one read-back before the replica counts as unreadable (each waits
/// up to the client's call timeout).
const READBACK_ATTEMPTS_MAX: usize = 8;
/// Events a run keeps (every node's, and the faults'): the report lists them all,
/// and a run far past this would be too long to read anyway.
const SIM_EVENTS_MAX: usize = 1 << 20;
/// Each node's buffer budget for device reads.
const NODE_POOL_BYTES: usize = 256 << 20;

/// The outcome of one run.
#[derive(Debug)]
pub struct Outcome {
    /// The report.
    pub report: Report,
    /// The full history, for determinism checks and debugging.
    pub history: History,
    /// Fabric telemetry, if it was asked for.
    pub telemetry: Option<Telemetry>,
}

/// Options of a run beyond its scenario.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// Sample the fabric at this interval.
    pub telemetry_interval: Option<Duration>,
}

/// Run `scenario` with `seed`; `name` names the scenario in the report.
pub fn run(seed: u64, scenario: &Scenario, name: &str) -> Outcome {
    run_with(seed, scenario, name, RunOptions::default())
}

/// Run `scenario` with `seed` and `options`.
///
/// The run gets a thread of its own, so no thread-local state (RNG seeds, hasher
/// keys) carries over from an earlier run in the same process.
pub fn run_with(seed: u64, scenario: &Scenario, name: &str, options: RunOptions) -> Outcome {
    let (scenario, name) = (scenario.clone(), name.to_string());
    std::thread::spawn(move || run_here(seed, &scenario, &name, options))
        .join()
        .unwrap_or_else(|panic| {
            eprintln!("note: replay with `cargo xtask sim --seed {seed}`");
            std::panic::resume_unwind(panic)
        })
}

fn run_here(seed: u64, scenario: &Scenario, name: &str, options: RunOptions) -> Outcome {
    let mut rt = Runtime::with_seed_and_config(seed, madsim::Config::default());
    rt.add_simulator::<Fabric>();
    // A run that makes no progress ends with a panic naming the seed, never a hang.
    let limit = Duration::from_millis(scenario.workload.duration_ms) + Duration::from_secs(600);
    rt.set_time_limit(limit);
    let scenario = scenario.clone();
    let name = name.to_string();
    rt.block_on(async move { run_inner(seed, scenario, name, options).await })
}

/// The fabric of a scenario: a star with a slot for every node, client and the
/// checker, RoCE v2 with the scenario's DCQCN, CNP and PFC choices.
fn fabric_config(scenario: &Scenario) -> FabricConfig {
    let f = &scenario.fabric;
    let rate_bps = f.link_gbps * 1_000_000_000;
    let mut config = match f.transport.as_str() {
        "tcp-reno" => FabricConfig::tcp(rate_bps, Algorithm::Reno),
        "tcp-dctcp" => FabricConfig::tcp(rate_bps, Algorithm::Dctcp),
        "tcp-cubic" => FabricConfig::tcp(rate_bps, Algorithm::Cubic),
        _ => FabricConfig::at_rate(rate_bps),
    };
    let hosts = scenario.cluster.nodes + scenario.workload.clients + 1;
    config.topology = Topology::Star {
        hosts: hosts as usize,
    };
    config.host_link.delay_ns = f.link_delay_ns;
    config.nic.mtu_bytes = f.mtu_bytes;
    config.nic.send_queue_bytes_max = f.send_queue_kib << 10;
    if let Some(tcp) = &mut config.tcp {
        tcp.params.mss = u64::from(f.mtu_bytes);
        config.switch.buffer_bytes = f.buffer_mib << 20;
        config.seed = thread_rng().gen();
        return config;
    }
    // The reaction point with the switches' ECN marking it was tuned with.
    if !config.set_dcqcn_preset(&f.dcqcn) {
        config.nic.dcqcn = None; // "off": the scenario check refuses other names
    }
    config.nic.cnp = match f.cnp.as_str() {
        "per-packet" => CnpMode::PerPacket { min_gap_ns: 0 },
        _ => CnpMode::PerQpInterval {
            interval_ns: 50_000,
        },
    };
    config.nic.bdp_window = f.bdp_window;
    config.switch.buffer_bytes = f.buffer_mib << 20;
    config.switch.pfc.enabled = f.pfc;
    config.seed = thread_rng().gen();
    config
}

fn build_map(scenario: &Scenario) -> ClusterMap {
    let c = &scenario.cluster;
    let bs = u64::from(c.block_size);
    let volume = VolumeSpec {
        id: VolumeId(1),
        block_size: c.block_size,
        capacity_blocks: (c.volume_mib << 20) / bs,
        extent_blocks: (c.extent_mib << 20) / bs,
        max_request_blocks: (1 << 20) / c.block_size,
    };
    let nodes = (1..=c.nodes).map(NodeId).collect();
    ClusterMap::new_static(nodes, volume, c.replicas as usize).expect("validated scenario")
}

async fn run_inner(seed: u64, scenario: Scenario, name: String, options: RunOptions) -> Outcome {
    let cluster_start = Instant::now();
    let copies_before = weir_core::copies::on_this_thread();
    let flow_before = weir_core::flow::on_this_thread();
    let fabric = Fabric::current();
    fabric
        .configure(fabric_config(&scenario))
        .expect("validated scenario");
    let map = build_map(&scenario);
    let config = ReplicationConfig {
        bug_skip_last_replica: scenario.bugs.skip_last_replica,
        bug_ack_before_slowest: scenario.bugs.ack_before_slowest,
        bug_serve_before_lease: scenario.bugs.serve_before_lease,
        bug_rebuild_one_short: scenario.bugs.rebuild_one_short,
        bug_accept_stale_epoch: scenario.bugs.accept_stale_epoch,
        bug_ignore_lease_margin: scenario.bugs.ignore_lease_margin,
        lease_margin_ns: scenario
            .cluster
            .clock_bound()
            .lease_margin_ns(timeouts(&scenario).lease_ns),
        replica_timeout_ns: scenario.cluster.replica_timeout_ms * 1_000_000,
        audit: true,
        rebuild_bytes_per_sec: 0,
        scrub_bytes_per_sec: scenario.cluster.scrub_mib_per_sec << 20,
        checkpoint_every_ns: scenario.cluster.checkpoint_ms * 1_000_000,
        version_grain_bytes: scenario.cluster.version_grain_kib << 10,
    };
    let events: EventLog = Arc::new(Mutex::new(Events::with_capacity(SIM_EVENTS_MAX)));
    let audit: AuditLog = Arc::default();
    let mut skews = Vec::new();
    let hosts = start_nodes(
        &fabric,
        &map,
        config,
        &scenario,
        (&events, cluster_start),
        &audit,
        &mut skews,
    );
    // Every host attaches before traffic starts.
    let checker = Arc::new(fabric.endpoint(NodeId(CHECKER_HOST)).expect("new host"));
    let client_transports: Vec<_> = (0..scenario.workload.clients)
        .map(|c| Arc::new(fabric.endpoint(NodeId(FIRST_CLIENT + c)).expect("new host")))
        .collect();

    // The cluster comes up before clients connect: a Raft leader, the map, and a
    // lease on every node (a few heartbeat ticks).
    tokio::time::sleep(WARMUP).await;
    if let Some(interval) = options.telemetry_interval {
        fabric.enable_sampling(interval);
    }
    let mut faults = schedule_faults(&fabric, &scenario);
    let mut crashes = Vec::new();
    let kills = KillLog::default();
    let node_faults = schedule_node_faults(
        &fabric,
        &hosts,
        &scenario,
        &mut crashes,
        &FaultLogs {
            events: events.clone(),
            kills: kills.clone(),
            cluster_start,
        },
        &map,
    );
    faults.extend(node_faults.described);
    faults.sort();
    let first_fault_ns = faults.first().map_or(u64::MAX, |(at_us, _)| at_us * 1000);
    // Fault times are drawn from the workload's start; the report counts from the
    // cluster's start, like the control-plane events.
    let warmup_us = WARMUP.as_micros() as u64;
    let faults: Vec<String> = faults
        .into_iter()
        .map(|(at_us, what)| format!("{:.3} ms: {what}", (at_us + warmup_us) as f64 / 1e3))
        .collect();
    let epoch = Instant::now();
    let base_ns = weir_core::time::cluster_ns();
    let deadline = epoch + Duration::from_millis(scenario.workload.duration_ms);
    let mut clients = Vec::new();
    for (c, transport) in client_transports.into_iter().enumerate() {
        let c = c as u32;
        let (map, spec) = (map.clone(), scenario.clone());
        let host = Handle::current()
            .create_node()
            .name(format!("client-{c}"))
            .build();
        clients.push(host.spawn(async move {
            run_client(transport, map, spec, c as u16, epoch, deadline).await
        }));
    }
    let mut ops = Vec::new();
    for client in clients {
        ops.extend(client.await.expect("client task"));
    }
    ops.sort_by_key(|o| (o.complete_ns.unwrap_or(u64::MAX), o.invoke_ns, o.client));
    // Liveness counts from when the faults stop: a node may still be paused, cut
    // off or down before its restart when the workload ends.
    tokio::time::sleep_until(epoch + Duration::from_micros(node_faults.end_us)).await;
    // Media errors in written blocks neither a read nor the scrubber has found.
    let unreadable: usize = hosts
        .iter()
        .map(|(.., ssd)| ssd.unreadable_written_blocks())
        .sum();
    let workload_end_ns = (WARMUP.as_millis() as u64 + scenario.workload.duration_ms) * 1_000_000;

    let replicas = scenario.cluster.replicas as usize;
    let (replica_reads, expected_copies, liveness) =
        read_back(checker, map.clone(), &ops, replicas, node_faults.live).await;
    let history = History {
        ops,
        replica_reads,
        expected_copies,
    };
    let audit = std::mem::take(&mut *audit.lock().expect("audit log"));
    let verdicts = vec![
        check_linearizable(&history),
        check_no_lost_writes(&history, scenario.cluster.replicas as usize),
        check_leases(&audit, &kills.lock().expect("kill log"), base_ns),
        check_acks_persisted(&audit, base_ns),
        check_epochs(&audit, base_ns),
        liveness,
    ];
    let fabric_summary = summarize(&fabric);
    let mut report = Report::new(seed, &scenario, &name, &history, fabric_summary, verdicts);
    report.faults = faults;
    report.clocks = clocks_line(&skews, config.lease_margin_ns);
    report.grain_bytes = config.grain_blocks(map.volume()) * u64::from(map.volume().block_size);
    report.payload_copies = weir_core::copies::on_this_thread() - copies_before;
    let flow = weir_core::flow::on_this_thread();
    report.flow = weir_core::flow::FlowTotals {
        refused: flow.refused - flow_before.refused,
        held: flow.held - flow_before.held,
        dropped: flow.dropped - flow_before.dropped,
    };
    let node_events: Vec<(u64, Event)> =
        events.lock().expect("event log").iter().cloned().collect();
    // One line per rebuilt extent, or per repair, is too many for a report: one
    // line per node for each.
    let mut lines: Vec<(u64, String)> = node_events
        .iter()
        .filter(|(_, e)| !matches!(e, Event::Rebuilt { .. } | Event::Repaired { .. }))
        .map(|(at, e)| (*at, e.to_string()))
        .collect();
    let rebuilds = summarize_rebuilds(&audit, base_ns);
    lines.extend(rebuild_latency(&history, &rebuilds, first_fault_ns));
    lines.extend(rebuilds.into_iter().map(|r| (r.to_ns, r.line)));
    lines.extend(summarize_repairs(&node_events));
    if scenario.faults.media_errors > 0 {
        lines.push((
            workload_end_ns,
            format!(
                "media errors: {unreadable} written blocks still unreadable when the \
                 workload ended (scrubbing {} MiB/s per node)",
                scenario.cluster.scrub_mib_per_sec
            ),
        ));
    }
    // The failover time of each crash: from the crash to the node declared down.
    let slowest_us = report.read.max_us.max(report.write.max_us);
    for (node, at_us) in crashes {
        let crash_ns = (at_us + WARMUP.as_micros() as u64) * 1000;
        let down = |e: &Event| matches!(e, Event::NodeDown { node: n, .. } if *n == node);
        if let Some(&(down_ns, _)) = node_events.iter().find(|(t, e)| *t >= crash_ns && down(e)) {
            let line = format!(
                "failover of {node}: declared down {:.1} ms after its crash; the longest \
                 client operation of the run took {:.1} ms",
                (down_ns - crash_ns) as f64 / 1e6,
                slowest_us / 1e3
            );
            lines.push((down_ns + 1, line));
        }
    }
    lines.sort();
    report.node_events = node_events;
    report.events = lines
        .into_iter()
        .map(|(at, line)| format!("{:.3} ms: {line}", at as f64 / 1e6))
        .collect();
    let telemetry = options
        .telemetry_interval
        .map(|_| collect_telemetry(&fabric));
    Outcome {
        report,
        history,
        telemetry,
    }
}

/// Each node's clock, and the margin leases keep for their disagreement.
fn clocks_line(skews: &[(NodeId, Skew)], margin_ns: u64) -> String {
    let nodes: Vec<String> = skews
        .iter()
        .map(|(n, k)| {
            format!(
                "{n} {:+.3} ms {:+} ppm",
                k.offset_ns as f64 / 1e6,
                k.drift_ppm
            )
        })
        .collect();
    format!(
        "{}; leases end {:.3} ms early",
        nodes.join(", "),
        margin_ns as f64 / 1e6
    )
}

/// One line per node for its media-error repairs (each repair is an event): how
/// many, blocks in all, and the span.
fn summarize_repairs(events: &[(u64, Event)]) -> Vec<(u64, String)> {
    let mut per_node: BTreeMap<NodeId, (usize, u64, u64, u64)> = BTreeMap::new();
    for (at, event) in events {
        let Event::Repaired { node, blocks, .. } = event else {
            continue;
        };
        let e = per_node.entry(*node).or_insert((0, 0, u64::MAX, 0));
        e.0 += 1;
        e.1 += blocks;
        e.2 = e.2.min(*at);
        e.3 = e.3.max(*at);
    }
    per_node
        .into_iter()
        .map(|(node, (count, blocks, from, to))| {
            let line = format!(
                "{node} repaired media errors {count} times ({blocks} blocks, from \
                 peers) between {:.3} ms and {:.3} ms",
                from as f64 / 1e6,
                to as f64 / 1e6
            );
            (from, line)
        })
        .collect()
}

/// The rebuild of one node, for the report: its span in event-log time (from the
/// cluster's start) and its summary line.
struct RebuildSpan {
    node: NodeId,
    from_ns: u64,
    to_ns: u64,
    line: String,
}

/// Foreground latency while each node was rebuilt (operations invoked during the
/// copy), beside the latency before the first fault (operations done by then):
/// the rebuild's bandwidth bound is meant to keep the two close.
fn rebuild_latency(
    history: &History,
    rebuilds: &[RebuildSpan],
    first_fault_ns: u64,
) -> Vec<(u64, String)> {
    use crate::report::Latency;
    let warmup = WARMUP.as_nanos() as u64;
    let both = |from: u64, to: u64, within: bool| {
        let measure = if within {
            Latency::measure_within
        } else {
            Latency::measure_invoked
        };
        let read = measure(history, OpKind::Read, from, to);
        let write = measure(history, OpKind::Write, from, to);
        (read.count + write.count > 0).then(|| {
            format!(
                "read {} ({} ops), write {} ({} ops)",
                read.percentiles(),
                read.count,
                write.percentiles(),
                write.count
            )
        })
    };
    let mut lines = Vec::new();
    if rebuilds.is_empty() {
        return lines;
    }
    if let Some(latency) = both(0, first_fault_ns, true) {
        lines.push((
            first_fault_ns.saturating_add(warmup),
            format!("latency before the first fault: {latency}"),
        ));
    }
    for r in rebuilds {
        let from = r.from_ns - warmup.min(r.from_ns);
        let to = r.to_ns - warmup.min(r.to_ns);
        // Copies after the workload ended have no foreground to measure.
        if let Some(latency) = both(from, to, false) {
            lines.push((
                r.to_ns + 1,
                format!("latency while {} was rebuilt: {latency}", r.node),
            ));
        }
    }
    lines
}

/// One line per rebuilt node: extents, bytes, span and rate (times from `base_ns`,
/// which is 30 ms warm-up after the cluster's start, like the event log's zero).
fn summarize_rebuilds(
    audit: &[(NodeId, weir_core::replication::Audit)],
    base_ns: u64,
) -> Vec<RebuildSpan> {
    use weir_core::replication::Audit;
    let mut per_node: BTreeMap<NodeId, (usize, u64, u64, u64, u64)> = BTreeMap::new();
    for (_, fact) in audit {
        if let Audit::Rebuilt {
            node,
            bytes,
            skipped,
            started_ns,
            at_ns,
            ..
        } = *fact
        {
            let e = per_node.entry(node).or_insert((0, 0, 0, u64::MAX, 0));
            e.0 += 1;
            e.1 += bytes;
            e.2 += skipped;
            e.3 = e.3.min(started_ns);
            e.4 = e.4.max(at_ns);
        }
    }
    let warmup = WARMUP.as_nanos() as u64;
    let mib = |bytes: u64| bytes as f64 / f64::from(1 << 20);
    per_node
        .into_iter()
        .map(|(node, (extents, bytes, skipped, from, to))| {
            let (from, to) = (from - base_ns + warmup, to - base_ns + warmup);
            let line = format!(
                "{node} rebuilt: {extents} extents, {:.1} MiB copied from {:.3} ms to \
                 {:.3} ms ({:.0} MB/s); {:.1} MiB the primaries hold were already there",
                mib(bytes),
                from as f64 / 1e6,
                to as f64 / 1e6,
                bytes as f64 * 1e3 / (to - from).max(1) as f64,
                mib(skipped)
            );
            RebuildSpan {
                node,
                from_ns: from,
                to_ns: to,
                line,
            }
        })
        .collect()
}

/// Inject the scenario's fabric faults, drawn from the seed; returns them, described,
/// in time order. Only links that carry hosts of the run are chosen.
fn schedule_faults(fabric: &Fabric, scenario: &Scenario) -> Vec<(u64, String)> {
    use weir_transport_sim::fabric::Fault;
    let f = &scenario.faults;
    let links: Vec<(usize, String)> = fabric
        .links()
        .into_iter()
        .filter(|(_, name)| !name.contains("host"))
        .collect();
    let mut described = Vec::new();
    if f.link_loss > 0.0 || f.link_corrupt > 0.0 {
        for &(link, _) in &links {
            let fault = Fault::LinkErrors {
                link,
                loss: f.link_loss,
                corrupt: f.link_corrupt,
            };
            fabric.inject(Duration::ZERO, fault);
        }
        described.push((
            0,
            format!(
                "every link: loss {}, corruption {} per packet",
                f.link_loss, f.link_corrupt
            ),
        ));
    }
    let duration_us = scenario.workload.duration_ms * 1000;
    for _ in 0..f.link_flaps {
        let (link, name) = links[thread_rng().gen_range(0..links.len())].clone();
        let at_us = thread_rng().gen_range(0..duration_us.max(1));
        let down_us = thread_rng()
            .gen_range(f.flap_down_us / 10..=f.flap_down_us)
            .max(1);
        fabric.inject(Duration::from_micros(at_us), Fault::LinkDown { link });
        fabric.inject(
            Duration::from_micros(at_us + down_us),
            Fault::LinkUp { link },
        );
        described.push((at_us, format!("link {name} down for {down_us} us")));
    }
    described
}

/// A media error fault makes this many bytes of one SSD unreadable.
const MEDIA_ERROR_BYTES: u64 = 1 << 20;

/// When nodes were killed (cluster clock, ns), for the lease checker.
type KillLog = Arc<Mutex<Vec<(NodeId, u64)>>>;

/// Where node faults report what they did: the event log (its times count from
/// `cluster_start`) and the kill log.
struct FaultLogs {
    events: EventLog,
    kills: KillLog,
    cluster_start: Instant,
}

/// Node faults, each on a distinct storage node (the scenario keeps them fewer than
/// the replicas, so every extent keeps an in-sync copy), at seeded times in the
/// first half of the run: crashes (for good), pauses and partitions (both heal),
/// device hangs and losses, crashes or power losses followed by a restart, and
/// media errors.
fn schedule_node_faults(
    fabric: &Fabric,
    hosts: &[(NodeId, madsim::task::NodeId, Arc<SimSsd>)],
    s: &Scenario,
    crashes: &mut Vec<(NodeId, u64)>,
    logs: &FaultLogs,
    map: &ClusterMap,
) -> NodeFaults {
    let (events, kills, cluster_start) = (&logs.events, &logs.kills, logs.cluster_start);
    // Nodes that end the run alive, with a device: every other is lost for good.
    let mut live: Vec<NodeId> = hosts.iter().map(|(n, ..)| *n).collect();
    // When the last fault with an end (a pause, partition, stall or restart) ends.
    let mut end_us = 0;
    let f = &s.faults;
    let mut victims: Vec<(NodeId, madsim::task::NodeId)> =
        hosts.iter().map(|(n, h, _)| (*n, *h)).collect();
    let mut out = Vec::new();
    let first_half_us = || thread_rng().gen_range(0..(s.workload.duration_ms * 500).max(1));
    let ssd_of = |node: NodeId| {
        hosts
            .iter()
            .find(|(n, ..)| *n == node)
            .map(|(_, _, ssd)| ssd.clone())
            .expect("a victim is a host")
    };
    let lasting = |longest_ms: u64| {
        let longest_us = longest_ms * 1000;
        thread_rng().gen_range(longest_us / 4..=longest_us).max(1)
    };
    for i in 0..f.node_crashes {
        let pick = if i == 0 && f.crash_leader {
            0
        } else {
            thread_rng().gen_range(0..victims.len())
        };
        let (node, host) = victims.remove(pick);
        let at_us = first_half_us();
        let kills = kills.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_micros(at_us)).await;
            Handle::current().kill(host);
            let now = weir_core::time::cluster_ns();
            kills.lock().expect("kill log").push((node, now));
        });
        out.push((at_us, format!("node {node} crashes")));
        crashes.push((node, at_us));
        live.retain(|n| *n != node);
    }
    for _ in 0..f.node_pauses {
        let (node, host) = victims.remove(thread_rng().gen_range(0..victims.len()));
        let (at_us, for_us) = (first_half_us(), lasting(f.pause_ms));
        end_us = end_us.max(at_us + for_us);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_micros(at_us)).await;
            Handle::current().pause(host);
            tokio::time::sleep(Duration::from_micros(for_us)).await;
            Handle::current().resume(host);
        });
        out.push((
            at_us,
            format!("node {node} pauses for {} ms", for_us as f64 / 1e3),
        ));
    }
    for _ in 0..f.partitions {
        use weir_transport_sim::fabric::Fault;
        let (node, _) = victims.remove(thread_rng().gen_range(0..victims.len()));
        let (at_us, for_us) = (first_half_us(), lasting(f.partition_ms));
        end_us = end_us.max(at_us + for_us);
        let suffix = format!("->{node}");
        for (link, _) in fabric
            .links()
            .into_iter()
            .filter(|(_, n)| n.ends_with(&suffix))
        {
            fabric.inject(Duration::from_micros(at_us), Fault::LinkDown { link });
            fabric.inject(
                Duration::from_micros(at_us + for_us),
                Fault::LinkUp { link },
            );
        }
        out.push((
            at_us,
            format!("node {node} cut off for {} ms", for_us as f64 / 1e3),
        ));
    }
    for _ in 0..f.device_hangs {
        let (node, _) = victims.remove(thread_rng().gen_range(0..victims.len()));
        let ssd = ssd_of(node);
        let (at_us, for_us) = (first_half_us(), lasting(f.hang_ms));
        end_us = end_us.max(at_us + for_us);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_micros(at_us)).await;
            ssd.hang();
            tokio::time::sleep(Duration::from_micros(for_us)).await;
            ssd.resume();
        });
        out.push((
            at_us,
            format!("the device of {node} hangs for {} ms", for_us as f64 / 1e3),
        ));
    }
    let restarts = (0..f.node_restarts).map(|_| false);
    for power_loss in restarts.chain((0..f.power_losses).map(|_| true)) {
        let (node, host) = victims.remove(thread_rng().gen_range(0..victims.len()));
        let ssd = ssd_of(node);
        let (events, kills) = (events.clone(), kills.clone());
        let (at_us, for_us) = (first_half_us(), lasting(f.restart_ms));
        end_us = end_us.max(at_us + for_us);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_micros(at_us)).await;
            Handle::current().kill(host);
            let now = weir_core::time::cluster_ns();
            kills.lock().expect("kill log").push((node, now));
            if power_loss {
                let dropped_blocks = ssd.power_loss() as u64;
                let lost = Event::PowerLost {
                    node,
                    dropped_blocks,
                };
                // Event times count from the cluster's start, like the nodes' own.
                let at = (Instant::now() - cluster_start).as_nanos() as u64;
                events.lock().expect("event log").push(at, lost);
            }
            tokio::time::sleep(Duration::from_micros(for_us)).await;
            ssd.power_on();
            Handle::current().restart(host);
        });
        let what = if power_loss {
            "loses power (its SSD's volatile cache is lost)"
        } else {
            "crashes"
        };
        out.push((
            at_us,
            format!(
                "node {node} {what} and restarts {} ms later",
                for_us as f64 / 1e3
            ),
        ));
    }
    for _ in 0..f.device_losses {
        let (node, _) = victims.remove(thread_rng().gen_range(0..victims.len()));
        live.retain(|n| *n != node);
        let ssd = ssd_of(node);
        let at_us = first_half_us();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_micros(at_us)).await;
            // Unpowered for good: every command fails with `Gone`.
            ssd.power_loss();
        });
        out.push((at_us, format!("the SSD of {node} disappears")));
    }
    let extent_blocks = map.volume().extent_blocks;
    let run_blocks = (MEDIA_ERROR_BYTES / u64::from(s.cluster.block_size)).min(extent_blocks);
    for _ in 0..f.media_errors {
        let (node, _) = victims.remove(thread_rng().gen_range(0..victims.len()));
        let ssd = ssd_of(node);
        let at_us = first_half_us();
        // In an extent the node holds a replica of, so the blocks are read.
        let held: Vec<u64> = map
            .state()
            .extents
            .iter()
            .filter(|(_, e)| e.replicas.contains(&node))
            .map(|(id, _)| id.0)
            .collect();
        let extent = held[thread_rng().gen_range(0..held.len())];
        let within = thread_rng().gen_range(0..extent_blocks / run_blocks) * run_blocks;
        let first = extent * extent_blocks + within;
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_micros(at_us)).await;
            ssd.media_error(Lba(first), run_blocks);
        });
        out.push((
            at_us,
            format!(
                "the SSD of {node} cannot read blocks {first}..{} (media errors)",
                first + run_blocks
            ),
        ));
    }
    NodeFaults {
        described: out,
        end_us,
        live,
    }
}

/// What [`schedule_node_faults`] scheduled.
struct NodeFaults {
    /// Each fault, with its time from the workload's start (us).
    described: Vec<(u64, String)>,
    /// When the last fault with an end ends (us from the workload's start).
    end_us: u64,
    /// Nodes that end the run alive, with a device.
    live: Vec<NodeId>,
}

/// The fabric's samples and counters, with ports and hosts by name.
fn collect_telemetry(fabric: &Fabric) -> Telemetry {
    let names = fabric.port_names();
    let node = |h: usize| {
        fabric
            .node_of(h)
            .map_or(format!("host{h}"), |n| n.to_string())
    };
    let samples = fabric
        .samples()
        .into_iter()
        .map(|s| TelemetrySample {
            time_us: s.at_ns as f64 / 1000.0,
            ports: s
                .queue_bytes
                .iter()
                .map(|&(p, bytes)| (names[&p].clone(), bytes, s.paused.contains(&p)))
                .collect(),
            qps: s
                .qp_rates
                .iter()
                .map(|&(src, dst, rate, alpha)| (node(src), node(dst), rate / 1e9, alpha))
                .collect(),
        })
        .collect();
    let c = fabric.counters();
    let mut counters = vec![
        ("packets".to_string(), c.packets),
        ("bytes".into(), c.bytes),
        ("ecn_marks".into(), c.ecn_marks),
        ("cnps_sent".into(), c.cnps_sent),
        ("cnps_received".into(), c.cnps_received),
        ("pauses_sent".into(), c.pauses_sent),
        ("pauses_received".into(), c.pauses_received),
        ("resumes_sent".into(), c.resumes_sent),
        ("nacks".into(), c.nacks),
        ("retransmits".into(), c.retransmits),
        ("timeouts".into(), c.timeouts),
        ("messages".into(), c.messages),
    ];
    for (reason, n) in &c.drops {
        counters.push((format!("drops_{reason:?}"), *n));
    }
    Telemetry { samples, counters }
}

/// Time the cluster has to come up before the workload and the faults start.
const WARMUP: Duration = Duration::from_millis(30);
/// Control-plane tick.
const TICK: Duration = Duration::from_millis(10);
/// Leases and failure detection: a node silent for 100 ms is declared down; its
/// extents' new primaries serve once its 150 ms lease has run out; it is replaced
/// after the scenario's `replace_after_ms`.
fn timeouts(s: &Scenario) -> Timeouts {
    Timeouts {
        lease_ns: 150_000_000,
        detect_ns: 100_000_000,
        replace_ns: s.cluster.replace_after_ms * 1_000_000,
    }
}

/// Start every storage node (data path + control plane); returns the madsim node of
/// each, for crash faults.
fn start_nodes(
    fabric: &Arc<Fabric>,
    map: &ClusterMap,
    config: ReplicationConfig,
    s: &Scenario,
    (events, cluster_start): (&EventLog, Instant),
    audit: &AuditLog,
    skews: &mut Vec<(NodeId, Skew)>,
) -> Vec<(NodeId, madsim::task::NodeId, Arc<SimSsd>)> {
    let voters = map.nodes().to_vec();
    let timeouts = timeouts(s);
    let bootstrap = weir_core::control::plane::bootstrap(map, s.cluster.replicas as u8);
    let mut hosts = Vec::new();
    let bound = s.cluster.clock_bound();
    let device_timeout = Duration::from_millis(s.cluster.device_timeout_ms);
    let since_ns = weir_core::time::cluster_ns();
    for &id in map.nodes() {
        let transport = Arc::new(fabric.endpoint(id).expect("new host"));
        // The node's clock, the same in every incarnation (it is the host's).
        let skew = Skew {
            offset_ns: thread_rng()
                .gen_range(-(bound.offset_max_ns as i64)..=bound.offset_max_ns as i64),
            drift_ppm: thread_rng()
                .gen_range(-(bound.drift_max_ppm as i64)..=bound.drift_max_ppm as i64),
            since_ns,
        };
        assert!(skew.within(&bound));
        skews.push((id, skew));
        let ssd = SsdConfig {
            block_size: s.cluster.block_size,
            ..SsdConfig::default()
        };
        let ssd = Arc::new(SimSsd::new(ssd, thread_rng().gen()).expect("valid SSD config"));
        let device = ssd.clone();
        // What survives a crash: the device, the durable Raft log and the
        // block-version checkpoints.
        let log = MemLog::default();
        let versions = MemLog::default();
        let volume_blocks = map.volume().capacity_blocks;
        let snapshot_entries = s.cluster.raft_snapshot_entries;
        let grain_blocks = config.grain_blocks(map.volume());
        let (map, voters, bootstrap) = (map.clone(), voters.clone(), bootstrap.clone());
        let (events, audit) = (events.clone(), audit.clone());
        // Run at start and again at every restart: a new incarnation of the node
        // from what survived.
        let incarnation = move || {
            let bytes = log.0.lock().expect("raft log").clone();
            let device = format!("sim-ssd-{id}");
            let restored = {
                let file = versions.0.lock().expect("versions");
                weir_core::replication::versions::replay(
                    &file,
                    &device,
                    volume_blocks,
                    grain_blocks,
                )
                .versions
            };
            let (plane, _) = ControlPlane::open(
                id,
                &voters,
                bootstrap.clone(),
                timeouts,
                thread_rng().gen(),
                &bytes,
            )
            .expect("valid raft group");
            let plane = plane.with_snapshot_entries(snapshot_entries);
            let node = Node::new(
                transport.clone(),
                ssd.clone(),
                map.clone(),
                config,
                BufPool::new(NODE_POOL_BYTES),
            )
            .expect("node fits")
            .with_control(plane, TICK, events.clone())
            .with_events_since(cluster_start)
            .with_skew(skew)
            .with_device_timeout(device_timeout)
            .with_audit(audit.clone())
            .with_log_store(Box::new(log.clone()))
            .with_version_store(Box::new(versions.clone()), device, restored);
            async move {
                if let Err(e) = node.run().await {
                    tracing::error!(error = %e, "node stopped");
                }
            }
        };
        let host = Handle::current()
            .create_node()
            .name(format!("node-{}", id.0))
            .init(incarnation)
            .build();
        hosts.push((id, host.id(), device));
    }
    hosts
}

/// A node's durable Raft log, or its block-version checkpoints, in the simulator:
/// they survive the node's crashes.
#[derive(Clone, Debug, Default)]
struct MemLog(Arc<Mutex<Vec<u8>>>);

impl weir_core::node::LogStore for MemLog {
    fn append(&mut self, record: &[u8]) -> std::io::Result<()> {
        self.0
            .lock()
            .expect("durable file")
            .extend_from_slice(record);
        Ok(())
    }

    fn replace(&mut self, record: &[u8]) -> std::io::Result<()> {
        *self.0.lock().expect("durable file") = record.to_vec();
        Ok(())
    }
}

fn summarize(fabric: &Fabric) -> FabricSummary {
    let c = fabric.counters();
    let mut sum = FabricSummary {
        ecn_marks: c.ecn_marks,
        cnps: c.cnps_received,
        pauses: c.pauses_sent,
        drops: c.drops_in_network(),
        retransmits: c.retransmits,
        ..FabricSummary::default()
    };
    for (_, nic, switch) in fabric.port_stats() {
        sum.nic_bytes += nic.bytes;
        sum.nic_packets += nic.packets;
        sum.switch_queue_bytes_max = sum.switch_queue_bytes_max.max(switch.queue_bytes_max);
    }
    sum
}

async fn run_client(
    transport: Arc<SimTransport>,
    map: ClusterMap,
    spec: Scenario,
    client: u16,
    epoch: Instant,
    deadline: Instant,
) -> Vec<OpRecord> {
    let volume = Volume::open(transport, map, thread_rng().gen());
    let seq = Arc::new(AtomicU64::new(0));
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut workers = Vec::new();
    for w in 0..spec.workload.queue_depth {
        let (volume, spec, seq, log) = (volume.clone(), spec.clone(), seq.clone(), log.clone());
        workers.push(tokio::spawn(async move {
            let worker = Worker {
                volume,
                spec,
                client,
                index: w,
                seq,
                epoch,
            };
            worker.run(deadline, log).await
        }));
    }
    for w in workers {
        w.await.expect("worker task");
    }
    let mut log = log.lock().expect("log lock");
    std::mem::take(&mut *log)
}

struct Worker {
    volume: Arc<Volume<SimTransport>>,
    spec: Scenario,
    client: u16,
    index: u32,
    seq: Arc<AtomicU64>,
    epoch: Instant,
}

impl Worker {
    fn now_ns(&self) -> u64 {
        (Instant::now() - self.epoch).as_nanos() as u64
    }

    async fn run(self, deadline: Instant, log: Arc<Mutex<Vec<OpRecord>>>) {
        let w = &self.spec.workload;
        let bs = u64::from(self.spec.cluster.block_size);
        let req_blocks = u64::from(w.block_size) / bs;
        let capacity = self.volume.map().volume().capacity_blocks;
        let slots = capacity / req_blocks;
        // Sequential workers each stream through a region of their own.
        let workers = u64::from(w.clients * w.queue_depth);
        let me = u64::from(self.client) * u64::from(w.queue_depth) + u64::from(self.index);
        let region = (slots / workers).max(1);
        let mut cursor = 0u64;
        while Instant::now() < deadline {
            let slot = match w.pattern {
                Pattern::Random => thread_rng().gen_range(0..slots),
                Pattern::Sequential => {
                    cursor += 1;
                    (me * region + cursor % region) % slots
                }
            };
            let lba = slot * req_blocks;
            let is_read = thread_rng().gen_range(0..100) < w.read_percent;
            let record = if is_read {
                self.read(lba, req_blocks).await
            } else {
                self.write(lba, req_blocks, bs as usize).await
            };
            log.lock().expect("log lock").push(record);
        }
    }

    async fn read(&self, lba: u64, blocks: u64) -> OpRecord {
        let invoke_ns = self.now_ns();
        let result = self.volume.read(Lba(lba), blocks).await;
        let complete_ns = self.now_ns();
        let bs = self.volume.block_size();
        let (values, complete_ns) = match result {
            Ok(data) => {
                let values = data
                    .chunks_exact(bs)
                    .enumerate()
                    .map(|(i, b)| decode_block(b, lba + i as u64))
                    .collect();
                (values, Some(complete_ns))
            }
            Err(e) => {
                tracing::warn!(lba, error = %e, "read failed");
                (Vec::new(), None)
            }
        };
        OpRecord {
            client: self.client,
            kind: OpKind::Read,
            lba,
            values,
            invoke_ns,
            complete_ns,
        }
    }

    async fn write(&self, lba: u64, blocks: u64, bs: usize) -> OpRecord {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let mut data = vec![0u8; blocks as usize * bs];
        let mut values = Vec::with_capacity(blocks as usize);
        for (i, block) in data.chunks_exact_mut(bs).enumerate() {
            let tag = Tag::new(self.client, seq, i as u8);
            encode_block(block, tag, lba + i as u64);
            values.push(Value::Tag(tag));
        }
        let invoke_ns = self.now_ns();
        let result = self.volume.write(Lba(lba), Bytes::from(data), false).await;
        let complete_ns = match result {
            Ok(()) => Some(self.now_ns()),
            Err(e) => {
                tracing::warn!(lba, error = %e, "write failed");
                None
            }
        };
        OpRecord {
            client: self.client,
            kind: OpKind::Write,
            lba,
            values,
            invoke_ns,
            complete_ns,
        }
    }
}

/// How long after the workload and the last fault every replica on an up node must be back in sync.
const LIVENESS_BOUND: Duration = Duration::from_secs(2);

/// Wait until the cluster has healed (at most [`LIVENESS_BOUND`]): every `live`
/// node (alive with a device at the end) is up in the map, every other node is
/// down in it (campaign seeds 9073 and 9409 read back from a node that crashed
/// for good and that a leader without a quorum had not yet declared down), no up
/// node is still
/// rebuilding an extent, and every extent has `replicas` in-sync copies, or one on
/// every up node where fewer are up (a spare replaced every node down past the
/// replacement timeout).
async fn await_in_sync(volume: &Volume<SimTransport>, replicas: usize, live: &[NodeId]) -> Verdict {
    use weir_core::control::NodeStatus;
    let start = Instant::now();
    loop {
        volume.refresh().await;
        let map = volume.map();
        let state = map.state();
        let want = replicas.min(state.up_nodes().len());
        let mut behind: Vec<String> = state
            .extents
            .iter()
            .flat_map(|(id, e)| e.rebuilding.iter().map(move |n| (id, n)))
            .filter(|(_, n)| state.nodes.get(n) == Some(&NodeStatus::Up))
            .map(|(id, n)| format!("{n} still rebuilding {id}"))
            .collect();
        behind.extend(
            live.iter()
                .filter(|n| state.nodes.get(n) != Some(&NodeStatus::Up))
                .map(|n| format!("{n}, alive, is not up")),
        );
        // A node lost for good must be declared down: until it is, it stays in
        // the in-sync sets it was in, and the map does not say where the data is.
        behind.extend(
            state
                .nodes
                .iter()
                .filter(|(n, s)| **s == NodeStatus::Up && !live.contains(n))
                .map(|(n, _)| format!("{n}, lost for good, is still up")),
        );
        behind.extend(
            state
                .extents
                .iter()
                .filter(|(_, e)| e.in_sync.len() < want)
                .map(|(id, e)| format!("{id} has {} of {want} copies in sync", e.in_sync.len())),
        );
        let waited = Instant::now() - start;
        if behind.is_empty() || waited >= LIVENESS_BOUND {
            let violations = behind
                .into_iter()
                .map(|b| {
                    format!(
                        "{b} {} ms after the workload and the faults",
                        waited.as_millis()
                    )
                })
                .collect();
            return Verdict {
                name: "liveness",
                scope: format!(
                    "every extent back to {replicas} in-sync copies (or all up nodes) {:.1} ms \
                     after the workload and the faults (bound {} ms)",
                    waited.as_secs_f64() * 1e3,
                    LIVENESS_BOUND.as_millis()
                ),
                violations,
            };
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Wait for the cluster to heal ([`await_in_sync`]), then read every written block
/// from every replica that should hold it.
async fn read_back(
    transport: Arc<SimTransport>,
    map: ClusterMap,
    ops: &[OpRecord],
    replicas: usize,
    live: Vec<NodeId>,
) -> (Vec<ReplicaRead>, BTreeMap<u64, usize>, Verdict) {
    let written: BTreeSet<u64> = ops
        .iter()
        .filter(|o| o.kind == OpKind::Write)
        .flat_map(|o| o.lba..o.lba + o.values.len() as u64)
        .collect();
    let host = Handle::current().create_node().name("checker").build();
    host.spawn(async move {
        let volume = Volume::open(transport, map, thread_rng().gen());
        let liveness = await_in_sync(&volume, replicas, &live).await;
        // Read back from the replicas the final map counts as in sync: the ones that
        // must hold every acknowledged write.
        volume.refresh().await;
        let map = volume.map();
        let mut work: Vec<(u64, NodeId)> = Vec::new();
        let mut expected = BTreeMap::new();
        for &lba in &written {
            let ext = map.extent(map.extent_of(Lba(lba)));
            expected.insert(lba, ext.in_sync.len());
            for &node in &ext.in_sync {
                work.push((lba, node));
            }
        }
        let work = Arc::new(Mutex::new(work.into_iter()));
        let results = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        for _ in 0..READBACK_PARALLEL {
            let (volume, work, results) = (volume.clone(), work.clone(), results.clone());
            readers.push(tokio::spawn(async move {
                loop {
                    let next = work.lock().expect("work lock").next();
                    let Some((lba, node)) = next else { break };
                    let mut value = None;
                    // A slow answer (a TCP timeout, a flapping link) is retried; only
                    // a replica that never answers counts as unreadable.
                    for _ in 0..READBACK_ATTEMPTS_MAX {
                        match volume.scrub_read(node, Lba(lba), 1).await {
                            Ok(data) => {
                                value = Some(decode_block(&data, lba));
                                break;
                            }
                            Err(ClientError::Timeout(_)) => continue,
                            // The replica repairs the block from a peer meanwhile.
                            Err(ClientError::Weir(WeirError::Device(DevError::Media(_)))) => {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                                continue;
                            }
                            Err(e) => {
                                tracing::warn!(lba, %node, error = %e, "read-back failed");
                                break;
                            }
                        }
                    }
                    results.lock().expect("results lock").push(ReplicaRead {
                        lba,
                        node: node.0,
                        value,
                    });
                }
            }));
        }
        for r in readers {
            r.await.expect("reader task");
        }
        let mut results = std::mem::take(&mut *results.lock().expect("results lock"));
        results.sort_by_key(|r| (r.lba, r.node));
        (results, expected, liveness)
    })
    .await
    .expect("checker task")
}
