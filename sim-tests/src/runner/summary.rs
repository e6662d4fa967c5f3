//! The last stage of a run: what the report says beyond the checkers' verdicts.
//! The clocks, the fabric's counters, and the event lines: every node event, one
//! line per node for its rebuilds and repairs, the latency before the first fault
//! and during each rebuild, and the failover time of each crash.

use super::plan::{Fault, FaultPlan};
use super::WARMUP;
use crate::history::{History, OpKind};
use crate::report::{FabricSummary, Report};
use crate::scenario::Scenario;
use crate::telemetry::{Sample as TelemetrySample, Telemetry};
use std::collections::BTreeMap;
use weir_core::time::Skew;
use weir_core::{Event, NodeId};
use weir_transport_sim::Fabric;

/// What the event lines are made from, beyond the report.
pub(super) struct Context<'a> {
    /// The run's history.
    pub(super) history: &'a History,
    /// Every node's audit facts.
    pub(super) audit: &'a [(NodeId, weir_core::replication::Audit)],
    /// The faults injected.
    pub(super) plan: &'a FaultPlan,
    /// The cluster clock at the workload's start.
    pub(super) base_ns: u64,
    /// Written blocks still unreadable (media errors nobody found) at the end.
    pub(super) unreadable: usize,
}

/// The report's event lines, in time order (ms from the cluster's start).
pub(super) fn event_lines(report: &Report, scenario: &Scenario, cx: Context<'_>) -> Vec<String> {
    let node_events = &report.node_events;
    // One line per rebuilt extent, or per repair, is too many for a report: one
    // line per node for each.
    let mut lines: Vec<(u64, String)> = node_events
        .iter()
        .filter(|(_, e)| !matches!(e, Event::Rebuilt { .. } | Event::Repaired { .. }))
        .map(|(at, e)| (*at, e.to_string()))
        .collect();
    let rebuilds = summarize_rebuilds(cx.audit, cx.base_ns);
    let first_fault_ns = cx.plan.first_ns().unwrap_or(u64::MAX);
    lines.extend(rebuild_latency(cx.history, &rebuilds, first_fault_ns));
    lines.extend(rebuilds.into_iter().map(|r| (r.to_ns, r.line)));
    lines.extend(summarize_repairs(node_events));
    if scenario.faults.media_errors > 0 {
        let workload_end_ns =
            (WARMUP.as_millis() as u64 + scenario.workload.duration_ms) * 1_000_000;
        lines.push((
            workload_end_ns,
            format!(
                "media errors: {} written blocks still unreadable when the \
                 workload ended (scrubbing {} MiB/s per node)",
                cx.unreadable, scenario.cluster.scrub_mib_per_sec
            ),
        ));
    }
    // The failover time of each crash: from the crash to the node declared down.
    let slowest_us = report.read.max_us.max(report.write.max_us);
    for planned in &cx.plan.faults {
        let Fault::Crash { node } = planned.fault else {
            continue;
        };
        let crash_ns = (planned.at_us + WARMUP.as_micros() as u64) * 1000;
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
    lines
        .into_iter()
        .map(|(at, line)| format!("{:.3} ms: {line}", at as f64 / 1e6))
        .collect()
}

/// Each node's clock, and the margin leases keep for their disagreement.
pub(super) fn clocks_line(skews: &[(NodeId, Skew)], margin_ns: u64) -> String {
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

/// The fabric's samples and counters, with ports and hosts by name.
pub(super) fn telemetry(fabric: &Fabric) -> Telemetry {
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

pub(super) fn fabric(fabric: &Fabric) -> FabricSummary {
    let c = fabric.counters();
    let mut sum = FabricSummary {
        ecn_marks: c.ecn_marks,
        cnps: c.cnps_received,
        pauses: c.pauses_sent,
        drops: c.drops_in_network(),
        retransmits: c.retransmits,
        timeouts: c.timeouts,
        qp_errors: c.qp_errors,
        ..FabricSummary::default()
    };
    for (_, nic, switch) in fabric.port_stats() {
        sum.nic_bytes += nic.bytes;
        sum.nic_packets += nic.packets;
        sum.switch_queue_bytes_max = sum.switch_queue_bytes_max.max(switch.queue_bytes_max);
    }
    sum
}
