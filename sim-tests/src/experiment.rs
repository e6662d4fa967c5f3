//! Experiments: a matrix of variants of one setup, each a scenario run on the
//! simulator with the same seed, measured into one table, SVG plots and JSON.
//!
//! The setups are those of the published deployments weir follows (see
//! [`setups`]): RoCE v2 against kernel TCP for small and large I/O, a mixed load,
//! incast with and without DCQCN, a polled user-space NVMe driver against the
//! kernel's, and the full stack. Every figure is measured in the run (from the
//! history of client operations, the fabric's counters and the hosts' CPUs);
//! nothing is computed from a formula. The same seed gives the same JSON, byte
//! for byte.

pub mod setups;

use crate::history::{History, OpKind};
use crate::report::Report;
use crate::scenario::Scenario;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// One variant of an experiment: a name and the scenario it runs.
#[derive(Clone, Debug)]
pub struct Variant {
    /// Its name in the table and the JSON.
    pub name: String,
    /// What it runs.
    pub scenario: Scenario,
}

/// An experiment: a name, what it asks, and its variants.
#[derive(Clone, Copy, Debug)]
pub struct Experiment {
    /// Its name on the command line.
    pub name: &'static str,
    /// The question it answers, in a line.
    pub about: &'static str,
    /// Its variants, full or quick (a few simulated milliseconds).
    pub variants: fn(quick: bool) -> Vec<Variant>,
}

/// Latency figures of one kind of operation, microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencyUs {
    /// Operations measured.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// 99.99th percentile.
    pub p9999: f64,
    /// Maximum.
    pub max: f64,
}

/// Read and write latency.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReadWrite {
    /// Reads.
    pub read: LatencyUs,
    /// Writes.
    pub write: LatencyUs,
}

/// What one variant measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Measured {
    /// The variant.
    pub name: String,
    /// Completed operations per second over the run.
    pub iops: f64,
    /// Payload MB (10^6 bytes) per second over the run.
    pub mb_s: f64,
    /// Payload throughput as a share of the clients' links' line rate, percent.
    pub line_rate_pct: f64,
    /// Latency.
    pub lat_us: ReadWrite,
    /// Width of the intervals below, ms.
    pub interval_ms: f64,
    /// Standard deviation of IOPS over the intervals.
    pub iops_stddev: f64,
    /// Largest deviation of an interval's IOPS from the mean, percent of it.
    pub iops_max_dev_pct: f64,
    /// IOPS of each interval.
    pub iops_per_interval: Vec<f64>,
    /// P99 latency (reads and writes) of the operations completed in each
    /// interval, us.
    pub p99_us_per_interval: Vec<f64>,
    /// Coefficient of variation of the intervals' P99 (standard deviation over
    /// mean, intervals with operations only): how steady the tail is.
    pub p99_cv: f64,
    /// Device commands the storage nodes' schedulers issued.
    pub device_commands: u64,
    /// Requests that joined another's device command.
    pub merged: u64,
    /// Requests cut at the device's optimal I/O boundary.
    pub split: u64,
    /// Data packets retransmitted.
    pub retransmits: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// Packets dropped in the network.
    pub drops: u64,
    /// CNPs received by senders.
    pub cnps: u64,
    /// Packets marked ECN CE.
    pub ecn_marks: u64,
    /// PFC pause frames sent.
    pub pauses: u64,
    /// CPU utilization by role (storage, client), percent.
    pub cpu_util: BTreeMap<String, f64>,
    /// Per named volume (`[[volumes]]`), by name.
    pub volumes: BTreeMap<String, VolumeMeasured>,
    /// Latency of the operations invoked after a node restarted (its replicas
    /// rebuilding meanwhile), if one did.
    pub after_restart: Option<ReadWrite>,
    /// Every checker of the run passed and no operation failed.
    pub checkers_passed: bool,
}

/// What one named volume's clients measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VolumeMeasured {
    /// Completed operations per second.
    pub iops: f64,
    /// Read P50 and P99, us.
    pub read_p50_us: f64,
    /// Read P99, us.
    pub read_p99_us: f64,
    /// Write P50, us.
    pub write_p50_us: f64,
    /// Write P99, us.
    pub write_p99_us: f64,
}

/// A whole experiment's results.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Results {
    /// The experiment.
    pub experiment: String,
    /// The seed every variant ran with.
    pub seed: u64,
    /// Quick form (a few simulated milliseconds).
    pub quick: bool,
    /// Per variant, in the experiment's order.
    pub variants: Vec<Measured>,
}

/// Percentiles and mean of the latencies of operations matching `pick`.
fn latency(history: &History, pick: impl Fn(&crate::history::OpRecord) -> bool) -> LatencyUs {
    let h = crate::report::latency_histogram(history, |o| pick(o));
    if h.is_empty() {
        return LatencyUs::default();
    }
    let us = |ns: u64| ns as f64 / 1000.0;
    LatencyUs {
        count: h.len(),
        mean: h.mean() / 1000.0,
        p50: us(h.value_at_quantile(0.5)),
        p99: us(h.value_at_quantile(0.99)),
        p999: us(h.value_at_quantile(0.999)),
        p9999: us(h.value_at_quantile(0.9999)),
        max: us(h.max()),
    }
}

/// IOPS and P99 latency (us) of each `interval_ns` of the workload's
/// `duration_ns`, by when operations completed.
fn per_interval(history: &History, interval_ns: u64, duration_ns: u64) -> (Vec<f64>, Vec<f64>) {
    let intervals = (duration_ns / interval_ns).max(1) as usize;
    let mut per_interval: Vec<Vec<u64>> = vec![Vec::new(); intervals];
    for op in &history.ops {
        if let Some(done) = op.complete_ns {
            let i = (done / interval_ns) as usize;
            if i < intervals {
                per_interval[i].push(done - op.invoke_ns);
            }
        }
    }
    let secs = interval_ns as f64 / 1e9;
    let iops = per_interval.iter().map(|v| v.len() as f64 / secs).collect();
    let p99_us = per_interval
        .iter_mut()
        .map(|v| {
            if v.is_empty() {
                return 0.0;
            }
            v.sort_unstable();
            let rank = ((v.len() as f64 * 0.99).ceil() as usize).clamp(1, v.len());
            v[rank - 1] as f64 / 1000.0
        })
        .collect();
    (iops, p99_us)
}

/// Each named volume's figures.
fn volumes(report: &Report) -> BTreeMap<String, VolumeMeasured> {
    report
        .volumes
        .iter()
        .map(|(name, iops, r, w)| {
            let v = VolumeMeasured {
                iops: *iops,
                read_p50_us: r.p50_us,
                read_p99_us: r.p99_us,
                write_p50_us: w.p50_us,
                write_p99_us: w.p99_us,
            };
            (name.clone(), v)
        })
        .collect()
}

/// Latency from a warm-up before the first node restart on, if one did.
fn after_restart(report: &Report, history: &History) -> Option<ReadWrite> {
    report
        .node_events
        .iter()
        .find(|(_, e)| matches!(e, weir_core::Event::Restarted { .. }))
        .map(|&(at, _)| {
            let from = at.saturating_sub(crate::scenario::WARMUP.as_nanos() as u64);
            ReadWrite {
                read: latency(history, |o| o.kind == OpKind::Read && o.invoke_ns >= from),
                write: latency(history, |o| o.kind == OpKind::Write && o.invoke_ns >= from),
            }
        })
}

/// Measure one variant's run.
pub fn measure(name: &str, report: &Report, history: &History, interval_ns: u64) -> Measured {
    let s = &report.scenario;
    let duration_ns = s.workload.duration_ms * 1_000_000;
    let (iops_per_interval, p99_us_per_interval) = per_interval(history, interval_ns, duration_ns);
    let (mean, stddev) = crate::report::mean_stddev(&iops_per_interval);
    let max_dev = iops_per_interval
        .iter()
        .map(|r| (r - mean).abs())
        .fold(0.0, f64::max);
    let busy: Vec<f64> = p99_us_per_interval
        .iter()
        .copied()
        .filter(|&p| p > 0.0)
        .collect();
    let (p99_mean, p99_sd) = crate::report::mean_stddev(&busy);
    let line_bps = f64::from(s.client_hosts()) * s.fabric.link_gbps as f64 * 1e9;
    let fb = &report.fabric;
    Measured {
        name: name.to_string(),
        iops: report.iops,
        mb_s: report.mb_per_sec,
        line_rate_pct: 100.0 * report.mb_per_sec * 8e6 / line_bps,
        lat_us: ReadWrite {
            read: latency(history, |o| o.kind == OpKind::Read),
            write: latency(history, |o| o.kind == OpKind::Write),
        },
        interval_ms: interval_ns as f64 / 1e6,
        iops_stddev: stddev,
        iops_max_dev_pct: 100.0 * max_dev / mean.max(1.0),
        iops_per_interval,
        p99_us_per_interval,
        p99_cv: if p99_mean > 0.0 {
            p99_sd / p99_mean
        } else {
            0.0
        },
        device_commands: report.sched.commands,
        merged: report.sched.merged,
        split: report.sched.split,
        retransmits: fb.retransmits,
        timeouts: fb.timeouts,
        drops: fb.drops,
        cnps: fb.cnps,
        ecn_marks: fb.ecn_marks,
        pauses: fb.pauses,
        cpu_util: report
            .cpu
            .iter()
            .map(|(role, u)| (role.clone(), 100.0 * u))
            .collect(),
        volumes: volumes(report),
        after_restart: after_restart(report, history),
        checkers_passed: report.passed(),
    }
}

impl Results {
    /// The table printed at the end of a run.
    pub fn table(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "experiment {} (seed {}{})",
            self.experiment,
            self.seed,
            if self.quick { ", quick" } else { "" }
        );
        let _ = writeln!(
            t,
            "  {:<18} {:>9} {:>8} {:>5} | {:>7} {:>7} {:>8} | {:>7} {:>7} {:>8} | {:>6} {:>6} | {:>6} {:>6} {:>6} {:>6} | {:>5} {:>5} | checks",
            "variant", "IOPS", "MB/s", "line%", "rd mean", "rd P99", "rd P99.9", "wr mean",
            "wr P99", "wr P99.9", "sd%", "maxdv%", "retx", "CNPs", "ECN", "pauses", "cpuS%", "cpuC%"
        );
        for m in &self.variants {
            let (r, w) = (&m.lat_us.read, &m.lat_us.write);
            let cpu = |role: &str| {
                m.cpu_util
                    .get(role)
                    .map_or("-".to_string(), |u| format!("{u:.1}"))
            };
            let _ = writeln!(
                t,
                "  {:<18} {:>9.0} {:>8.1} {:>5.1} | {:>7.1} {:>7.1} {:>8.1} | {:>7.1} {:>7.1} {:>8.1} | {:>6.1} {:>6.1} | {:>6} {:>6} {:>6} {:>6} | {:>5} {:>5} | {}",
                m.name,
                m.iops,
                m.mb_s,
                m.line_rate_pct,
                r.mean,
                r.p99,
                r.p999,
                w.mean,
                w.p99,
                w.p999,
                100.0 * m.iops_stddev / m.iops.max(1.0),
                m.iops_max_dev_pct,
                m.retransmits,
                m.cnps,
                m.ecn_marks,
                m.pauses,
                cpu("storage"),
                cpu("client"),
                if m.checkers_passed { "pass" } else { "FAIL" }
            );
        }
        let _ = writeln!(
            t,
            "  (latency in us; sd% and maxdv% of IOPS over {} ms intervals; cpuS/cpuC: storage nodes' and clients' CPU busy)",
            self.variants.first().map_or(0.0, |m| m.interval_ms)
        );
        self.table_after_restart(&mut t);
        self.table_volumes(&mut t);
        t
    }

    /// The table's lines of latency after a restart, where one was.
    fn table_after_restart(&self, t: &mut String) {
        if self.variants.iter().any(|m| m.after_restart.is_some()) {
            let _ = writeln!(
                t,
                "  after the restart   {:>7} {:>7} {:>8} | {:>7} {:>7} {:>8}",
                "rd P50", "rd P99", "rd P99.9", "wr P50", "wr P99", "wr P99.9"
            );
            for m in &self.variants {
                if let Some(rw) = &m.after_restart {
                    let (r, w) = (&rw.read, &rw.write);
                    let _ = writeln!(
                        t,
                        "  {:<18} {:>7.1} {:>7.1} {:>8.1} | {:>7.1} {:>7.1} {:>8.1}",
                        m.name, r.p50, r.p99, r.p999, w.p50, w.p99, w.p999
                    );
                }
            }
        }
    }

    /// The table's lines of each named volume.
    fn table_volumes(&self, t: &mut String) {
        if self.variants.iter().any(|m| !m.volumes.is_empty()) {
            let _ = writeln!(
                t,
                "  {:<18} {:<10} {:>9} | {:>7} {:>8} | {:>7} {:>8}",
                "variant", "volume", "IOPS", "rd P50", "rd P99", "wr P50", "wr P99"
            );
            for m in &self.variants {
                for (name, v) in &m.volumes {
                    let _ = writeln!(
                        t,
                        "  {:<18} {:<10} {:>9.0} | {:>7.1} {:>8.1} | {:>7.1} {:>8.1}",
                        m.name,
                        name,
                        v.iops,
                        v.read_p50_us,
                        v.read_p99_us,
                        v.write_p50_us,
                        v.write_p99_us
                    );
                }
            }
        }
    }

    /// The JSON form.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).expect("results serialize") + "\n"
    }

    /// Write `iops.svg` and `p99.svg` (per interval, one line per variant) into
    /// `dir`; returns the files written.
    pub fn plot(&self, dir: &Path) -> Result<Vec<String>, crate::telemetry::TelemetryError> {
        std::fs::create_dir_all(dir).map_err(|source| crate::telemetry::TelemetryError::Io {
            path: dir.display().to_string(),
            source,
        })?;
        let mut files = Vec::new();
        let x_max = self
            .variants
            .iter()
            .map(|m| m.interval_ms * m.iops_per_interval.len() as f64)
            .fold(1.0, f64::max);
        type Pick = fn(&Measured) -> &[f64];
        let charts: [(&str, &str, Pick); 2] = [
            ("iops.svg", "IOPS", |m| &m.iops_per_interval),
            ("p99.svg", "P99 latency us", |m| &m.p99_us_per_interval),
        ];
        for (file, label, pick) in charts {
            let series = self
                .variants
                .iter()
                .map(|m| {
                    let points = pick(m)
                        .iter()
                        .enumerate()
                        .map(|(i, &v)| ((i as f64 + 0.5) * m.interval_ms, v))
                        .collect();
                    (m.name.clone(), points)
                })
                .collect();
            let path = dir.join(file);
            let title = format!("{}: {label} per interval", self.experiment);
            crate::telemetry::line_chart(&path, &title, ("time ms", x_max), label, series)?;
            files.push(path.display().to_string());
        }
        Ok(files)
    }
}

/// The experiment called `name`.
pub fn find(name: &str) -> Option<Experiment> {
    setups::ALL.iter().copied().find(|e| e.name == name)
}

/// Run every variant of `experiment` with `seed`; `progress` hears of each as it
/// finishes.
#[cfg(madsim)]
pub fn run(
    experiment: &Experiment,
    seed: u64,
    quick: bool,
    progress: impl Fn(&Measured),
) -> Results {
    let interval_ns = if quick {
        1_000_000
    } else {
        crate::report::INTERVAL_NS
    };
    let variants = (experiment.variants)(quick)
        .into_iter()
        .map(|v| {
            let outcome = crate::runner::run(seed, &v.scenario, &v.name);
            let m = measure(&v.name, &outcome.report, &outcome.history, interval_ns);
            progress(&m);
            m
        })
        .collect();
    Results {
        experiment: experiment.name.to_string(),
        seed,
        quick,
        variants,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_experiment_has_its_variants_and_valid_scenarios() {
        let names: Vec<&str> = setups::ALL.iter().map(|e| e.name).collect();
        for want in [
            "roce-vs-tcp-small",
            "roce-vs-tcp-large",
            "mixed",
            "incast",
            "spdk-vs-kernel",
            "full-stack",
            "rdma-messenger",
        ] {
            assert!(names.contains(&want), "{want} missing");
        }
        for e in setups::ALL {
            for quick in [false, true] {
                let variants = (e.variants)(quick);
                assert!(!variants.is_empty());
                for v in variants {
                    v.scenario
                        .checked(&v.name)
                        .unwrap_or_else(|err| panic!("{}: {err}", e.name));
                }
            }
        }
        let wanted = |e: &str| -> Vec<String> {
            (find(e).unwrap().variants)(true)
                .into_iter()
                .map(|v| v.name)
                .collect()
        };
        for (e, vs) in [
            (
                "roce-vs-tcp-small",
                &["tcp-read", "tcp-write", "roce-read", "roce-write"][..],
            ),
            (
                "roce-vs-tcp-large",
                &["tcp-read", "tcp-write", "roce-read", "roce-write"][..],
            ),
            (
                "mixed",
                &[
                    "tcp-mixed",
                    "tcp-read-alone",
                    "tcp-write-alone",
                    "roce-mixed",
                    "roce-read-alone",
                    "roce-write-alone",
                ][..],
            ),
            (
                "incast",
                &[
                    "dcqcn-on",
                    "dcqcn-off",
                    "tcp",
                    "dcqcn-on-flow-fan-in",
                    "dcqcn-off-flow-fan-in",
                ][..],
            ),
            ("spdk-vs-kernel", &["polled", "kernel"][..]),
            (
                "rdma-messenger",
                &["roce-4k", "rdma-4k", "roce-128k", "rdma-128k"][..],
            ),
            (
                "full-stack",
                &[
                    "kernel-tcp",
                    "polled-roce",
                    "kernel-tcp-burst",
                    "polled-roce-burst",
                ][..],
            ),
        ] {
            let have = wanted(e);
            for v in vs {
                assert!(have.iter().any(|h| h == v), "{e}: variant {v} missing");
            }
        }
    }

    #[test]
    fn measuring_counts_intervals_and_deviation() {
        use crate::history::OpRecord;
        let op = |invoke_ns: u64, complete_ns: u64| OpRecord {
            client: 0,
            kind: OpKind::Read,
            lba: 0,
            values: Vec::new(),
            invoke_ns,
            complete_ns: Some(complete_ns),
            error: None,
        };
        let mut s = Scenario::default();
        s.workload.duration_ms = 3;
        // Interval 0: 2 ops, 1: 4 ops, 2: 0 ops.
        let ops = vec![
            op(0, 100_000),
            op(0, 200_000),
            op(1_000_000, 1_100_000),
            op(1_000_000, 1_200_000),
            op(1_000_000, 1_300_000),
            op(1_000_000, 1_900_000),
        ];
        let history = History {
            ops,
            replica_reads: Vec::new(),
            expected_copies: Default::default(),
        };
        let report = Report::new(1, &s, "t", &history, Default::default(), Vec::new());
        let m = measure("v", &report, &history, 1_000_000);
        assert_eq!(m.iops_per_interval, vec![2000.0, 4000.0, 0.0]);
        // Mean 2000: the largest deviation is 2000, 100% of it.
        assert!((m.iops_max_dev_pct - 100.0).abs() < 1e-9);
        assert_eq!(m.p99_us_per_interval[1], 900.0);
        assert_eq!(m.p99_us_per_interval[2], 0.0);
        assert_eq!(m.lat_us.read.count, 6);
        assert_eq!(m.lat_us.write.count, 0);
    }
}
