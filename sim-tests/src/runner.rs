//! The scenario runner: one seed, one madsim runtime, one run.
//!
//! A run flows one way through its stages, each a module:
//! 1. [`cluster`]: the fabric, the map, and the storage nodes (each with a
//!    simulated SSD, a durable Raft log and block-version checkpoints), started
//!    and given time to elect a leader;
//! 2. [`plan`]: the fault plan, a typed value drawn from the seed, then injected;
//! 3. [`workload`]: the clients, recording every operation into a history;
//! 4. [`readback`]: once the cluster healed, every written block read back from
//!    every replica that should hold it (and the liveness verdict);
//! 5. the checkers, over the history and the nodes' audit facts, and
//!    [`summary`]: the report.

use crate::checker::{check_availability, check_linearizable, check_no_lost_writes};
use crate::history::History;
use crate::invariants::{check_acks_persisted, check_epochs, check_leases};
use crate::report::Report;
use crate::scenario::Scenario;
use crate::telemetry::Telemetry;
use madsim::runtime::Runtime;
use std::time::Duration;
use tokio::time::Instant;
use weir_core::NodeId;
use weir_transport_sim::Fabric;

mod attach;
mod cluster;
pub mod plan;
mod readback;
mod snapshots;
mod summary;
pub mod tolerance;
mod workload;

pub use plan::{Fault, FaultPlan};

/// Node id of the first client host; storage nodes are 1..=N.
const FIRST_CLIENT: u32 = 1000;
/// Node id of the host that reads every replica back after the workload.
const CHECKER_HOST: u32 = 999;
pub use crate::scenario::WARMUP;
/// [`WARMUP`] in microseconds (fault times count from the workload's start).
const WARMUP_US: u64 = WARMUP.as_micros() as u64;
/// A media error fault makes this many bytes of one SSD unreadable.
const MEDIA_ERROR_BYTES: u64 = 1 << 20;

/// The outcome of one run.
#[derive(Debug)]
pub struct Outcome {
    /// The report.
    pub report: Report,
    /// The full history, for determinism checks and debugging.
    pub history: History,
    /// The faults the run injected.
    pub plan: FaultPlan,
    /// Fabric telemetry, if it was asked for.
    pub telemetry: Option<Telemetry>,
}

/// Options of a run beyond its scenario.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions {
    /// Sample the fabric at this interval.
    pub telemetry_interval: Option<Duration>,
}

/// Each role's CPU utilization since the workload started.
fn cpu_by_role(cluster: &cluster::Cluster) -> Vec<(String, f64)> {
    let now = cluster.fabric.now_since_epoch_ns();
    let mut by_role: std::collections::BTreeMap<cluster::Role, weir_host_sim::Usage> =
        Default::default();
    for (role, cpu) in &cluster.cpus {
        let usage = cpu.lock().expect("cpu").usage(now);
        let sum = by_role.entry(*role).or_default();
        *sum = sum.plus(usage);
    }
    by_role
        .into_iter()
        .map(|(role, usage)| {
            let name = match role {
                cluster::Role::Storage => "storage",
                cluster::Role::Client => "client",
            };
            (name.to_string(), usage.utilization())
        })
        .collect()
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

/// The stages, in order.
async fn run_inner(seed: u64, scenario: Scenario, name: String, options: RunOptions) -> Outcome {
    let copies_before = weir_core::copies::total().0;
    let cluster = cluster::Cluster::start(&scenario).await;
    if let Some(interval) = options.telemetry_interval {
        cluster.fabric.enable_sampling(interval);
    }
    let (plan, kills) = inject_faults(&cluster, &scenario);

    let epoch = Instant::now();
    let base_ns = weir_core::time::cluster_ns();
    for (_, cpu) in &cluster.cpus {
        let now = cluster.fabric.now_since_epoch_ns();
        cpu.lock().expect("cpu").start_window(now);
    }
    let stage = start_snapshot_stage(&cluster, &scenario, &plan, epoch);
    let (ops, front_end, read_flow) = workload::drive(&cluster, &scenario, epoch).await;
    let cpu = cpu_by_role(&cluster);
    // Liveness counts from when the faults stop: a node may still be paused, cut
    // off or down before its restart when the workload ends.
    tokio::time::sleep_until(epoch + Duration::from_micros(plan.end_us())).await;
    // Media errors in written blocks neither a read nor the scrubber has found.
    let unreadable: usize = cluster
        .hosts
        .iter()
        .map(|(.., ssd)| ssd.unreadable_written_blocks())
        .sum();
    let (history, liveness) = read_back(&cluster, &scenario, ops, &plan).await;
    let snapshots = match stage {
        Some(stage) => Some(stage.await.expect("the snapshot stage")),
        None => None,
    };
    let audit = std::mem::take(&mut *cluster.audit.lock().expect("audit log"));
    let mut verdicts = judge(
        &cluster,
        &scenario,
        (&history, &audit),
        (&plan, &kills),
        base_ns,
    );
    verdicts.push(liveness);
    verdicts.extend(snapshots);
    let fabric_summary = summary::fabric(&cluster.fabric);
    let mut report = Report::new(seed, &scenario, &name, &history, fabric_summary, verdicts);
    report.faults = plan.lines();
    report.payload_copies = weir_core::copies::total().0 - copies_before;
    report.cpu = cpu;
    report.front_end = front_end.requests;
    report.front_end_moves = front_end.moved;
    report.front_end_payloads = cluster.node_counts().payloads;
    fill_counts(&mut report, &cluster, &read_flow);
    let context = summary::Context {
        history: &history,
        audit: &audit,
        plan: &plan,
        base_ns,
        unreadable,
    };
    report.events = summary::event_lines(&report, &scenario, context);
    let telemetry = options
        .telemetry_interval
        .map(|_| summary::telemetry(&cluster.fabric));
    Outcome {
        report,
        history,
        plan,
        telemetry,
    }
}

/// Draw the run's fault plan from the cluster's links and nodes, and inject
/// it; the plan and the log of the crashes it made.
fn inject_faults(cluster: &cluster::Cluster, scenario: &Scenario) -> (FaultPlan, plan::KillLog) {
    let links: Vec<(usize, String)> = cluster
        .fabric
        .links()
        .into_iter()
        .filter(|(_, name)| !name.contains("host"))
        .collect();
    let nodes: Vec<NodeId> = cluster.hosts.iter().map(|(n, ..)| *n).collect();
    let plan = FaultPlan::draw(&links, &nodes, scenario, &cluster.map);
    let kills = plan::KillLog::default();
    plan.inject(
        &cluster.fabric,
        (&cluster.hosts, &cluster.handles),
        (&cluster.events, &kills, cluster.start),
    );
    (plan, kills)
}

/// The snapshot stage, if the scenario has one, on a client host of its own
/// beside the workload (which starts at `epoch`).
fn start_snapshot_stage(
    cluster: &cluster::Cluster,
    scenario: &Scenario,
    plan: &FaultPlan,
    epoch: Instant,
) -> Option<madsim::task::JoinHandle<crate::checker::Verdict>> {
    (scenario.snapshots.rounds > 0).then(|| {
        let transport = cluster.clients.last().cloned().expect("the stage's host");
        let args = (transport, cluster.handles.clone(), cluster.map.clone());
        let deadline = epoch + Duration::from_millis(scenario.workload.duration_ms);
        let at = snapshot_times(plan, scenario);
        let s = scenario.clone();
        madsim::runtime::Handle::current()
            .create_node()
            .name("snapshots")
            .build()
            .spawn(async move { snapshots::run(args, &s, (epoch, deadline), at).await })
    })
}

/// Read back what `ops` wrote from every replica that should hold it: the
/// run's history, and the liveness verdict.
async fn read_back(
    cluster: &cluster::Cluster,
    scenario: &Scenario,
    ops: Vec<crate::history::OpRecord>,
    plan: &FaultPlan,
) -> (History, crate::checker::Verdict) {
    let nodes: Vec<NodeId> = cluster.hosts.iter().map(|(n, ..)| *n).collect();
    let (replica_reads, expected_copies, liveness) = readback::read_back(
        cluster.checker.clone(),
        cluster.map.clone(),
        &ops,
        scenario.cluster.replicas as usize,
        (plan.live(&nodes), plan.removed()),
    )
    .await;
    let history = History {
        ops,
        replica_reads,
        expected_copies,
    };
    (history, liveness)
}

/// The checkers' verdicts on the history and the nodes' audit facts (but
/// liveness, the read-back's, and the snapshot stage's).
fn judge(
    cluster: &cluster::Cluster,
    scenario: &Scenario,
    (history, audit): (&History, &[(NodeId, weir_core::replication::Audit)]),
    (plan, kills): (&FaultPlan, &plan::KillLog),
    base_ns: u64,
) -> Vec<crate::checker::Verdict> {
    let voters = weir_core::control::raft::voters_of(cluster.map.nodes());
    let tolerance = tolerance::judge(plan, &voters);
    vec![
        check_availability(
            history,
            tolerance == tolerance::Tolerance::Within,
            &tolerance.to_string(),
        ),
        check_linearizable(history),
        check_no_lost_writes(history, scenario.cluster.replicas as usize),
        check_leases(audit, &kills.lock().expect("kill log"), base_ns),
        check_acks_persisted(audit, base_ns),
        check_epochs(audit, base_ns),
    ]
}

/// The nodes' settings and counts in `report`, and the clients' read
/// windows' counts.
fn fill_counts(
    report: &mut Report,
    cluster: &cluster::Cluster,
    read_flow: &[weir_core::flow::ReadFlowStats],
) {
    report.clocks = summary::clocks_line(&cluster.skews, cluster.config.lease_margin_ns);
    let volume = cluster.map.volume();
    report.grain_bytes = cluster.config.grain_blocks(volume) * u64::from(volume.block_size);
    let counts = cluster.node_counts();
    report.messenger = cluster.fabric.messenger_totals();
    report.flow = counts.flow;
    for reads in read_flow {
        report.flow.add_reads(reads);
    }
    report.sched = counts.sched;
    report.admission = counts.admission;
    report.node_events = cluster
        .events
        .lock()
        .expect("event log")
        .iter()
        .cloned()
        .collect();
}

/// When the snapshot stage takes its snapshots (from the workload's start):
/// at the plan's node crashes and restarts first (a primary may go down
/// while one is taken), then spread evenly over the workload.
fn snapshot_times(plan: &FaultPlan, scenario: &Scenario) -> Vec<Duration> {
    let duration_us = scenario.workload.duration_ms * 1000;
    let rounds = scenario.snapshots.rounds as usize;
    let mut at: Vec<u64> = plan
        .faults
        .iter()
        .filter(|p| matches!(p.fault, Fault::Crash { .. } | Fault::Restart { .. }))
        .map(|p| p.at_us)
        .filter(|&t| t < duration_us)
        .take(rounds)
        .collect();
    let mut i = 1;
    while at.len() < rounds {
        at.push(duration_us * i / (rounds as u64 + 1));
        i += 1;
    }
    at.sort_unstable();
    at.into_iter().map(Duration::from_micros).collect()
}
