//! The run report: throughput, latency percentiles, IOPS stability, fabric counters
//! and checker verdicts. Every figure is measured in the run; nothing is computed
//! from a formula. The text depends only on the seed and the scenario.

use crate::checker::Verdict;
use crate::history::{History, OpKind};
use crate::scenario::{Pattern, Scenario, Transport};
use hdrhistogram::Histogram;
use std::fmt;

/// Width of the intervals over which IOPS stability is measured.
pub const INTERVAL_NS: u64 = 10_000_000;

/// Latency percentiles of one kind of operation, in microseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Latency {
    /// Operations measured.
    pub count: u64,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Maximum.
    pub max_us: f64,
}

impl Latency {
    fn measure(history: &History, kind: OpKind) -> Latency {
        Self::measure_invoked(history, kind, 0, u64::MAX)
    }

    /// Percentiles of the `kind` operations invoked in `[from_ns, to_ns)` (times
    /// from the workload's start) that completed.
    pub fn measure_invoked(history: &History, kind: OpKind, from_ns: u64, to_ns: u64) -> Latency {
        Self::measure_where(history, |o| {
            o.kind == kind && o.invoke_ns >= from_ns && o.invoke_ns < to_ns
        })
    }

    /// Percentiles of the `kind` operations both invoked and completed in
    /// `[from_ns, to_ns)`.
    pub fn measure_within(history: &History, kind: OpKind, from_ns: u64, to_ns: u64) -> Latency {
        Self::measure_where(history, |o| {
            o.kind == kind && o.invoke_ns >= from_ns && o.complete_ns.is_some_and(|c| c < to_ns)
        })
    }

    fn measure_where(
        history: &History,
        inside: impl Fn(&&crate::history::OpRecord) -> bool,
    ) -> Latency {
        let h = latency_histogram(history, inside);
        let us = |ns: u64| ns as f64 / 1000.0;
        Latency {
            count: h.len(),
            p50_us: us(h.value_at_quantile(0.50)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }

    /// "P50 / P99 / P99.9 us" for a report line.
    pub fn percentiles(&self) -> String {
        format!(
            "{:.1} / {:.1} / {:.1} us",
            self.p50_us, self.p99_us, self.p999_us
        )
    }
}

/// Latencies (ns) of the completed operations of `history` that `inside` picks.
pub(crate) fn latency_histogram(
    history: &History,
    inside: impl Fn(&&crate::history::OpRecord) -> bool,
) -> Histogram<u64> {
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds");
    for op in history.ops.iter().filter(inside) {
        if let Some(done) = op.complete_ns {
            h.saturating_record((done - op.invoke_ns).max(1));
        }
    }
    h
}

/// Mean and standard deviation of `rates` (0 and 0 for none).
pub(crate) fn mean_stddev(rates: &[f64]) -> (f64, f64) {
    let n = rates.len().max(1) as f64;
    let mean = rates.iter().sum::<f64>() / n;
    let var = rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// Fabric counters worth a line in the report.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FabricSummary {
    /// Wire bytes sent by all NICs.
    pub nic_bytes: u64,
    /// Packets sent by all NICs.
    pub nic_packets: u64,
    /// Deepest switch egress queue seen, bytes.
    pub switch_queue_bytes_max: u64,
    /// Data packets marked ECN CE.
    pub ecn_marks: u64,
    /// CNPs received by senders.
    pub cnps: u64,
    /// PFC pause frames sent.
    pub pauses: u64,
    /// Packets dropped in the network (any reason but receiver discards).
    pub drops: u64,
    /// Data packets retransmitted.
    pub retransmits: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// QPs that failed past their retry limit.
    pub qp_errors: u64,
}

/// The report of one run.
#[derive(Clone, Debug)]
pub struct Report {
    /// Seed of the run.
    pub seed: u64,
    /// The scenario.
    pub scenario: Scenario,
    /// Name of the scenario's source.
    pub scenario_name: String,
    /// Read latency.
    pub read: Latency,
    /// Write latency.
    pub write: Latency,
    /// Operations that failed.
    pub errors: u64,
    /// Completed operations per second over the run.
    pub iops: f64,
    /// Payload megabytes (10^6) per second over the run.
    pub mb_per_sec: f64,
    /// Mean of IOPS over 10 ms intervals.
    pub interval_iops_mean: f64,
    /// Standard deviation of IOPS over 10 ms intervals.
    pub interval_iops_stddev: f64,
    /// Number of whole 10 ms intervals.
    pub intervals: usize,
    /// Fabric counters.
    pub fabric: FabricSummary,
    /// Checker verdicts.
    pub verdicts: Vec<Verdict>,
    /// The nodes' clocks (offset and drift) and the lease margin, in a line.
    pub clocks: String,
    /// Bytes per version grain (the run of blocks a node keeps one version for).
    pub grain_bytes: u64,
    /// Payload copies weir's code made during the run (see `weir_core::copies`).
    pub payload_copies: u64,
    /// The nodes' flow counts over the run: frames a full transport
    /// queue refused, held, dropped (see `weir_core::flow`).
    pub flow: weir_core::flow::FlowTotals,
    /// The nodes' I/O schedulers' counts over the run (see `weir_core::sched`).
    pub sched: weir_core::sched::SchedStats,
    /// The primaries' admission of client requests by dmClock over the run,
    /// all volumes together.
    pub admission: weir_core::sched::VolumeAdmitStats,
    /// RDMA's messenger's connection counts, summed over the hosts (their last
    /// incarnations), when the fabric carries frames through it.
    pub messenger: Option<weir_transport_rdma::messenger::Counters>,
    /// CPU utilization over the workload by role ("storage", "client"), 0..=1,
    /// when hosts are modelled.
    pub cpu: Vec<(String, f64)>,
    /// Requests the client hosts sent through the nodes' front ends
    /// (weir-core's `NamedVolumes`), by named volume, in name order.
    pub front_end: Vec<(String, u64)>,
    /// Attempts a client host sent again to another node's front end.
    pub front_end_moves: u64,
    /// Replica writes that took their payload from their node's front end,
    /// and ones that found none there.
    pub front_end_payloads: (u64, u64),
    /// Per named volume (`[[volumes]]`): its name, IOPS (operations completed
    /// within the workload's duration, not after it) and latency.
    pub volumes: Vec<(String, f64, Latency, Latency)>,
    /// Faults injected, described, in time order.
    pub faults: Vec<String>,
    /// Control-plane events (nodes down and up, failovers), in time order.
    pub events: Vec<String>,
    /// What the nodes reported (and the simulator's power cuts), typed, with
    /// their times from the cluster's start (ns): what tests match on.
    pub node_events: Vec<(u64, weir_core::Event)>,
}

impl Report {
    /// Measure `history` of a run of `scenario` with `seed`.
    pub fn new(
        seed: u64,
        scenario: &Scenario,
        scenario_name: &str,
        history: &History,
        fabric: FabricSummary,
        verdicts: Vec<Verdict>,
    ) -> Report {
        let duration_ns = scenario.workload.duration_ms * 1_000_000;
        let done: Vec<u64> = history.ops.iter().filter_map(|o| o.complete_ns).collect();
        let errors = history.ops.len() as u64 - done.len() as u64;
        let bytes: u64 = history
            .ops
            .iter()
            .filter(|o| o.complete_ns.is_some())
            .map(|o| o.values.len() as u64 * u64::from(scenario.cluster.block_size))
            .sum();
        let secs = duration_ns as f64 / 1e9;
        let intervals = (duration_ns / INTERVAL_NS) as usize;
        let mut per_interval = vec![0u64; intervals];
        for t in &done {
            if let Some(slot) = per_interval.get_mut((t / INTERVAL_NS) as usize) {
                *slot += 1;
            }
        }
        let rates: Vec<f64> = per_interval
            .iter()
            .map(|&n| n as f64 * 1e9 / INTERVAL_NS as f64)
            .collect();
        let (mean, stddev) = mean_stddev(&rates);
        Report {
            seed,
            scenario: scenario.clone(),
            scenario_name: scenario_name.to_string(),
            read: Latency::measure(history, OpKind::Read),
            write: Latency::measure(history, OpKind::Write),
            errors,
            iops: done.len() as f64 / secs,
            mb_per_sec: bytes as f64 / secs / 1e6,
            interval_iops_mean: mean,
            interval_iops_stddev: stddev,
            intervals,
            fabric,
            verdicts,
            clocks: String::new(),
            grain_bytes: 0,
            payload_copies: 0,
            flow: Default::default(),
            sched: Default::default(),
            admission: Default::default(),
            messenger: None,
            cpu: Vec::new(),
            front_end: Vec::new(),
            front_end_moves: 0,
            front_end_payloads: (0, 0),
            volumes: volume_figures(scenario, history, duration_ns),
            node_events: Vec::new(),
            faults: Vec::new(),
            events: Vec::new(),
        }
    }

    /// True if every checker passed and no operation failed.
    pub fn passed(&self) -> bool {
        self.errors == 0 && self.verdicts.iter().all(Verdict::passed)
    }
}

impl Report {
    /// The scenario: cluster, clocks, fabric, hosts, workload.
    fn fmt_setup(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.scenario;
        let (c, w) = (&s.cluster, &s.workload);
        writeln!(
            f,
            "weir-sim report: scenario {}, seed {}",
            self.scenario_name, self.seed
        )?;
        writeln!(
            f,
            "  cluster   {} nodes, {} replicas, {} MiB volume in {} MiB extents, {} B blocks, versions per {} KiB, \
             map snapshot every {} entries",
            c.nodes,
            c.replicas,
            c.volume_mib,
            c.extent_mib,
            c.block_size,
            self.grain_bytes >> 10,
            c.raft_snapshot_entries
        )?;
        if !self.clocks.is_empty() {
            writeln!(f, "  clocks    {}", self.clocks)?;
        }
        self.fmt_fabric(f)?;
        if s.host.modelled(&s.device) {
            writeln!(
                f,
                "  hosts     {} cores at {} GHz{}, network stack {}, NVMe driver {}, {} SSD(s) a node",
                s.host.cores,
                s.host.clock_ghz,
                if s.host.numa { ", two NUMA nodes" } else { "" },
                s.host.network_stack,
                s.device.driver,
                s.device.ssds
            )?;
        }
        let pattern = match w.pattern {
            Pattern::Random => "random",
            Pattern::Sequential => "sequential",
            Pattern::Stream => "stream",
        };
        writeln!(
            f,
            "  workload  {} B {pattern}, {}% reads, {} clients x QD{}, {} ms simulated",
            w.block_size, w.read_percent, w.clients, w.queue_depth, w.duration_ms
        )?;
        Ok(())
    }

    /// The fabric's line.
    fn fmt_fabric(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fs = &self.scenario.fabric;
        if fs.lossless() {
            let messenger = if fs.transport == Transport::Rdma {
                " (RDMA messenger)"
            } else {
                ""
            };
            writeln!(
                f,
                "  fabric    RoCE v2{messenger} star{}, {} Gb/s links, {} ns propagation, MTU {}, DCQCN {}, CNP {}{}{}",
                if fs.ports_per_host == 2 {
                    " of two-port hosts"
                } else {
                    ""
                },
                fs.link_gbps,
                fs.link_delay_ns,
                fs.mtu_bytes,
                fs.dcqcn,
                fs.cnp,
                if fs.pfc { ", PFC" } else { ", no PFC" },
                if fs.bdp_window { ", BDP window" } else { "" }
            )?;
        } else {
            writeln!(
                f,
                "  fabric    {} on a lossy star, {} Gb/s links, {} ns propagation, MSS {}, {} MiB buffer",
                fs.transport, fs.link_gbps, fs.link_delay_ns, fs.mtu_bytes, fs.buffer_mib
            )?;
        }
        Ok(())
    }

    /// Throughput, latency and their stability.
    fn fmt_measured(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f)?;
        writeln!(
            f,
            "  throughput  {:>10.0} IOPS  {:>9.1} MB/s   (reads {}, writes {}, errors {})",
            self.iops, self.mb_per_sec, self.read.count, self.write.count, self.errors
        )?;
        if !self.front_end.is_empty() {
            let total: u64 = self.front_end.iter().map(|(_, n)| n).sum();
            let by: Vec<String> = self
                .front_end
                .iter()
                .map(|(v, n)| format!("{v} {n}"))
                .collect();
            writeln!(
                f,
                "  front end   {total} requests through named volumes ({}), {} sent again to another node",
                by.join(", "),
                self.front_end_moves
            )?;
            let (taken, missed) = self.front_end_payloads;
            writeln!(
                f,
                "              {taken} replica writes took their payload from their node's front end, {missed} found none"
            )?;
        }
        writeln!(f, "  latency us        P50       P99     P99.9       max")?;
        for (name, l) in [("read", &self.read), ("write", &self.write)] {
            writeln!(
                f,
                "    {name:<8} {:>10.1} {:>9.1} {:>9.1} {:>9.1}",
                l.p50_us, l.p99_us, l.p999_us, l.max_us
            )?;
        }
        writeln!(
            f,
            "  IOPS per 10 ms  mean {:.0}, stddev {:.0} ({:.1}%) over {} intervals",
            self.interval_iops_mean,
            self.interval_iops_stddev,
            100.0 * self.interval_iops_stddev / self.interval_iops_mean.max(1.0),
            self.intervals
        )?;
        Ok(())
    }

    /// What the nodes, the fabric and the hosts counted.
    fn fmt_counts(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  copies  {} payload copies, {:.2} per replicated write",
            self.payload_copies,
            self.payload_copies as f64 / self.write.count.max(1) as f64
        )?;
        writeln!(
            f,
            "  flow    {} sends refused by a full queue, {} frames held until it had room, {} dropped",
            self.flow.refused, self.flow.held, self.flow.dropped
        )?;
        // Only with the congestion response on: reports of runs without it stay
        // as they were.
        if self.scenario.flow.enabled {
            writeln!(
                f,
                "  window  {} reads waited for their client's window, {} read-window cuts, \
                 {} peer-window cuts, {} writes waited for a replica's window",
                self.flow.reads_waited,
                self.flow.read_cuts,
                self.flow.peer_cuts,
                self.flow.writes_waited
            )?;
        }
        self.fmt_queues(f)?;
        if let Some(m) = &self.messenger {
            writeln!(
                f,
                "  rdma    {} connections up, {} refused (broke the protocol), {} reset, {} images dropped, {} frames lost",
                m.connects, m.refused, m.resets, m.dropped, m.frames_lost
            )?;
            writeln!(
                f,
                "          {} QPs failed past their retries, {} connections moved to the other path, {} frames sent again",
                self.fabric.qp_errors, m.failovers, m.replayed
            )?;
        }
        if !self.cpu.is_empty() {
            let roles: Vec<String> = self
                .cpu
                .iter()
                .map(|(role, u)| format!("{role} {:.1}%", 100.0 * u))
                .collect();
            writeln!(f, "  cpu     {} busy", roles.join(", "))?;
        }
        let fb = &self.fabric;
        writeln!(
            f,
            "  fabric  {} packets, {:.1} MB on the wire, deepest switch queue {} KiB",
            fb.nic_packets,
            fb.nic_bytes as f64 / 1e6,
            fb.switch_queue_bytes_max / 1024
        )?;
        writeln!(
            f,
            "          {} ECN marks, {} CNPs, {} PFC pauses, {} drops, {} retransmits",
            fb.ecn_marks, fb.cnps, fb.pauses, fb.drops, fb.retransmits
        )?;
        Ok(())
    }

    /// The device schedulers', the admission gates' and each volume's
    /// figures.
    fn fmt_queues(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only when the scenario schedules: reports of FIFO runs stay as they were.
        if self.scenario.sched != crate::scenario::SchedSpec::default() {
            let q = &self.sched;
            writeln!(
                f,
                "  sched   {} requests, {} device commands, {} merged into another's, {} split, {} refused, mean wait {:.1} us",
                q.requests,
                q.commands,
                q.merged,
                q.split,
                q.refused,
                q.waited_ns as f64 / 1000.0 / q.requests.max(1) as f64
            )?;
            if self.scenario.sched.classes {
                writeln!(
                    f,
                    "          {} commands went ahead of waiting background work",
                    q.passed
                )?;
            }
        }
        if !self.scenario.volumes.is_empty() {
            let a = &self.admission;
            writeln!(
                f,
                "  qos     {} requests admitted ({} in the reservation phase), mean wait {:.1} us, {:.1} ms held by limits in all, {} answered busy",
                a.admitted,
                a.by_reservation,
                a.waited_ns as f64 / 1000.0 / a.admitted.max(1) as f64,
                a.throttled_ns as f64 / 1e6,
                a.refused
            )?;
        }
        for (name, iops, read, write) in &self.volumes {
            writeln!(
                f,
                "  volume {name}: {iops:.0} IOPS, read P50 {:.1} P99 {:.1} us, write P50 {:.1} P99 {:.1} us",
                read.p50_us, read.p99_us, write.p50_us, write.p99_us
            )?;
        }
        Ok(())
    }

    /// The faults injected and the control plane's events.
    fn fmt_log(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.faults.is_empty() {
            writeln!(f, "  faults")?;
            for fault in &self.faults {
                writeln!(f, "    {fault}")?;
            }
        }
        if !self.events.is_empty() {
            writeln!(f, "  control plane")?;
            for event in &self.events {
                writeln!(f, "    {event}")?;
            }
        }
        Ok(())
    }

    /// The checkers' verdicts, and how to replay the run.
    fn fmt_verdict(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.scenario;
        writeln!(f)?;
        writeln!(f, "  checkers")?;
        for v in &self.verdicts {
            writeln!(f, "    {}", v.render())?;
        }
        let verdict = if self.passed() { "PASS" } else { "FAIL" };
        writeln!(f, "  verdict {verdict}")?;
        write!(f, "  replay  cargo xtask sim --seed {}", self.seed)?;
        match self.scenario_name.as_str() {
            "default" => {}
            // `--rdma` where the campaign's own draw is RoCE without it.
            "campaign"
                if s.fabric.transport == Transport::Rdma
                    && Scenario::campaign(self.seed).fabric.transport != Transport::Rdma =>
            {
                write!(f, " --campaign --rdma")?
            }
            "campaign" => write!(f, " --campaign")?,
            name => write!(f, " --scenario {name}")?,
        }
        let b = &self.scenario.bugs;
        for (on, flag) in [
            (b.skip_last_replica, "skip-last-replica"),
            (b.ack_before_slowest, "ack-before-slowest"),
            (b.serve_before_lease, "serve-before-lease"),
            (b.rebuild_one_short, "rebuild-one-short"),
            (b.accept_stale_epoch, "accept-stale-epoch"),
            (b.ignore_lease_margin, "ignore-lease-margin"),
        ] {
            if on {
                write!(f, " --bug {flag}")?;
            }
        }
        writeln!(f)
    }
}

/// Each `[[volumes]]` volume's name, IOPS (operations completed within
/// the workload's `duration_ns`) and latency in `history`.
fn volume_figures(
    scenario: &Scenario,
    history: &History,
    duration_ns: u64,
) -> Vec<(String, f64, Latency, Latency)> {
    let secs = duration_ns as f64 / 1e9;
    scenario
        .volume_ranges()
        .into_iter()
        .map(|(name, first, blocks)| {
            let of = |o: &crate::history::OpRecord| o.lba >= first && o.lba < first + blocks;
            let n = history
                .ops
                .iter()
                .filter(|o| o.complete_ns.is_some_and(|t| t < duration_ns) && of(o))
                .count();
            let lat = |kind| Latency::measure_where(history, |o| o.kind == kind && of(o));
            (name, n as f64 / secs, lat(OpKind::Read), lat(OpKind::Write))
        })
        .collect()
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_setup(f)?;
        self.fmt_measured(f)?;
        self.fmt_counts(f)?;
        self.fmt_log(f)?;
        self.fmt_verdict(f)
    }
}
