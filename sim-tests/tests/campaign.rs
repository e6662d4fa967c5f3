//! The fault campaign: 100 seeds, each with its own mix of node crashes (sometimes
//! the Raft leader; half of them restart from their device and Raft log, half of
//! those after a power loss that empties the SSD's volatile cache), node pauses,
//! nodes cut off from the network, SSD stalls, SSDs that disappear, SSD media
//! errors (repaired from a peer), link loss, corruption and flaps, on
//! RoCE (a third of it through RDMA's messenger) or TCP, with the nodes' clocks
//! up to 5 ms apart, and on a quarter of the
//! seeds with the hosts' CPUs, network stacks and NVMe drivers modelled, and on
//! a third with the devices' I/O schedulers merging and splitting; every history must pass every checker (linearizability, no lost
//! write, leases, acked-means-persisted, epochs only grow, liveness: every extent
//! back to 3 in-sync copies, on spares where a node stayed down) with no client
//! error. A failing seed prints its report, which ends with the command that
//! replays it.
#![cfg(madsim)]

use weir_sim::scenario::{Scenario, Transport};

/// Seeds per test function; four functions so the test harness spreads them over
/// the cores.
const SEEDS_PER_PART: u64 = 25;

/// One campaign seed in a process of its own (`weir-sim --campaign`): whether it
/// passed, and its report. A process per run gives every run's memory back (a
/// run holds its simulated SSDs' data; one process running 25 in a row grew to
/// several GB).
fn run_seed(seed: u64) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weir-sim"))
        .args(["--campaign", "--seed", &seed.to_string()])
        .output()
        .expect("weir-sim runs");
    let report = String::from_utf8_lossy(&out.stdout).into_owned();
    let passed = out.status.success() && report.contains("verdict PASS");
    (passed, report)
}

/// What a set of seeds drew and did.
#[derive(Default)]
struct Tally {
    crashes: u32,
    stalls: u32,
    media: u32,
    repaired: usize,
    /// Seeds whose nodes' clocks disagree by more than drift alone.
    skewed: u32,
    /// Seeds that model the hosts' CPUs.
    hosts: u32,
    /// Seeds whose frames go through RDMA's messenger.
    rdma: u32,
    /// Seeds whose devices' schedulers merge (and the merges they made).
    merging: u32,
    merged: u64,
    /// Seeds whose primaries admit by QoS (and the requests they admitted).
    qos: u32,
    admitted: u64,
}

fn campaign(part: u64) {
    let t = check_seeds(part * SEEDS_PER_PART + 1..=(part + 1) * SEEDS_PER_PART);
    assert!(t.crashes > 0, "no seed of this part crashed a node");
    assert!(
        t.stalls > 0,
        "no seed of this part paused or cut off a node"
    );
    assert!(
        t.skewed > 0,
        "no seed of this part skewed the nodes' clocks"
    );
    assert!(t.hosts > 0, "no seed of this part modelled the hosts");
    assert!(t.rdma > 0, "no seed of this part ran over RDMA's messenger");
    assert!(
        t.merging > 0 && t.merged > 0,
        "no seed of this part merged device commands"
    );
    assert!(
        t.qos > 0 && t.admitted > 0,
        "no seed of this part admitted client requests by QoS"
    );
    assert!(
        t.media == 0 || t.repaired > 0,
        "{} seeds gave an SSD media errors, but nothing was repaired",
        t.media
    );
}

/// Run `seeds`; panic with the reports of those that fail.
fn check_seeds(seeds: impl Iterator<Item = u64>) -> Tally {
    let mut failed = Vec::new();
    let (mut crashes, mut stalls, mut media, mut repaired) = (0, 0, 0, 0);
    let (mut skewed, mut hosts, mut rdma) = (0, 0, 0);
    let (mut merging, mut merged) = (0, 0);
    let (mut qos, mut admitted) = (0, 0);
    for seed in seeds {
        let s = Scenario::campaign(seed);
        skewed += u32::from(s.cluster.clock_offset_max_us > 0);
        hosts += u32::from(s.host.modelled(&s.device));
        rdma += u32::from(s.fabric.transport == Transport::Rdma);
        crashes += s.faults.node_crashes;
        stalls += s.faults.node_pauses + s.faults.partitions;
        let (passed, r) = run_seed(seed);
        if !passed {
            failed.push(r.clone());
        }
        let said = |what: &str| r.contains(what);
        if s.sched.merge {
            merging += 1;
            merged += merges(&r);
        }
        if !s.volumes.is_empty() {
            qos += 1;
            admitted += admissions(&r);
        }
        media += s.faults.media_errors;
        repaired += r.matches(" repaired ").count();
        if s.faults.node_restarts + s.faults.power_losses > 0 && !said(" restarted: ") {
            // The restarted node replayed its log and moved its extents on.
            failed.push(format!(
                "seed {seed}: a node restarted but never asked for a new epoch\n{r}"
            ));
        }
        if s.faults.media_errors > 0
            && !said(" repaired ")
            && !said("media errors: 0 written blocks still unreadable")
        {
            // Bad blocks that hold data are found (by a client, the scrubber or
            // the read-back), fetched from a peer and written back.
            failed.push(format!("seed {seed}: media errors never repaired\n{r}"));
        }
        if s.faults.device_losses > 0 && !said("'s device is gone") {
            failed.push(format!("seed {seed}: a device disappeared unnoticed\n{r}"));
        }
        if s.faults.power_losses > 0 && !said(" lost power: ") {
            failed.push(format!("seed {seed}: no power was lost\n{r}"));
        }
        if s.faults.node_crashes > 0 {
            // The crash must have been noticed and failed over, and with a spare
            // node the crashed one replaced.
            if !said(" down: ") {
                failed.push(format!(
                    "seed {seed}: a node crashed but was never marked down\n{r}"
                ));
            }
            if s.cluster.nodes > s.cluster.replicas && !said(" replaced: ") {
                failed.push(format!(
                    "seed {seed}: a node stayed down but was never replaced\n{r}"
                ));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} failing seeds:\n{}",
        failed.len(),
        failed.join("\n")
    );
    Tally {
        crashes,
        stalls,
        media,
        repaired,
        skewed,
        hosts,
        rdma,
        merging,
        merged,
        qos,
        admitted,
    }
}

/// The client requests a report's `qos` line says were admitted.
fn admissions(report: &str) -> u64 {
    report
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("qos "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The merges a report's `sched` line counts.
fn merges(report: &str) -> u64 {
    report
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("sched "))
        .and_then(|l| l.split(" device commands, ").nth(1))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// Seeds that once failed. 9073 and 9409 crash a node for good while the Raft
/// leader has no quorum (another node is paused, or its device hangs), so the
/// dead node is declared down only after the workload; the read-back took the
/// map before that and read from it. Liveness now waits until every node lost
/// for good is down in the map. 43849265 (a commit-derived seed) restarts a
/// node after a power loss that came before the start of a claim it had made
/// ahead (as a new primary waiting out the old lease); the lease checker counted
/// that claim of a dead incarnation against the primary that took over at the
/// restart. A claim now ends at the first crash after it was made.
#[test]
fn campaign_seeds_that_once_failed() {
    // 109195376: a node that lost power caught up to epochs made while it was
    // down that still named it primary, and claimed them under its new lease
    // before its `Restarted` was applied (the lease checker caught it).
    let t = check_seeds([9073, 9409, 43849265, 109195376].into_iter());
    assert_eq!(t.crashes, 2, "two of the seeds crash a node for good");
}

#[test]
fn campaign_seeds_1_to_25() {
    campaign(0);
}

#[test]
fn campaign_seeds_26_to_50() {
    campaign(1);
}

#[test]
fn campaign_seeds_51_to_75() {
    campaign(2);
}

#[test]
fn campaign_seeds_76_to_100() {
    campaign(3);
}
