//! Seeded end-to-end runs of the simulated cluster, checked by the history checkers.
#![cfg(madsim)]

use weir_core::{Event, NodeId};
use weir_sim::report::Report;
use weir_sim::runner::{run, Fault};
use weir_sim::scenario::{Pattern, Scenario, Transport};

/// How many of the run's node events match `f`.
fn count(r: &Report, f: impl Fn(&Event) -> bool) -> usize {
    r.node_events.iter().filter(|(_, e)| f(e)).count()
}

/// Whether any of the run's node events matches `f`.
fn saw(r: &Report, f: impl Fn(&Event) -> bool) -> bool {
    count(r, f) > 0
}

fn short(duration_ms: u64) -> Scenario {
    let mut s = Scenario::default_scenario();
    s.workload.duration_ms = duration_ms;
    s
}

#[test]
fn a_seed_replays_exactly_and_another_seed_differs() {
    let s = short(40);
    let a = run(1, &s, "default");
    assert!(a.report.passed(), "{}", a.report);
    let again = run(1, &s, "default");
    assert_eq!(a.report.to_string(), again.report.to_string());
    assert_eq!(a.history, again.history, "same seed, different history");
    let other = run(2, &s, "default");
    assert!(other.report.passed(), "{}", other.report);
    assert_ne!(a.history, other.history, "different seeds, same history");
    assert_ne!(a.report.read.p99_us, 0.0);
    // Writes went from clients through primaries to every replica's device, and
    // no payload was copied on the way (frames carry it as its own segment).
    assert!(a.report.write.count > 0);
    assert_eq!(a.report.payload_copies, 0, "{}", a.report);
    assert_ne!(
        (a.report.iops, a.report.read.p99_us),
        (other.report.iops, other.report.read.p99_us),
        "different seeds gave the same numbers"
    );
}

/// [`short`], with one client at queue depth 8: light enough for failover runs.
fn small(duration_ms: u64) -> Scenario {
    let mut s = short(duration_ms);
    s.workload.clients = 1;
    s.workload.queue_depth = 8;
    s
}

/// The scenario of sweep seed `seed`: each seed draws its own mix (a small swarm),
/// so the sweep covers random and sequential, small and large requests, 512 B and
/// 4 KiB blocks, read-heavy and write-heavy mixes, shallow and deep queues, clean and
/// faulty fabrics, RoCE and TCP.
fn swarm(seed: u64) -> Scenario {
    let mut s = short(12);
    let pick = |salt: u64, n: u64| (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (salt * 5)) % n;
    s.workload.pattern = if pick(1, 3) == 0 {
        Pattern::Sequential
    } else {
        Pattern::Random
    };
    s.workload.read_percent = [0, 30, 50, 70, 95][pick(2, 5) as usize];
    s.cluster.block_size = if pick(3, 4) == 0 { 512 } else { 4096 };
    s.workload.block_size = [4096, 8192, 65536][pick(4, 3) as usize];
    s.workload.queue_depth = [1, 8, 32][pick(5, 3) as usize];
    s.workload.clients = 1 + pick(6, 3) as u32;
    s.cluster.nodes = 3 + pick(7, 3) as u32;
    // Small extents, so requests and extents interleave across every node.
    s.cluster.volume_mib = 1024;
    s.cluster.extent_mib = [1, 4, 64][pick(8, 3) as usize];
    // A third of the seeds run on a faulty fabric: random loss and corruption, and
    // links going down and up.
    if pick(9, 3) == 0 {
        s.faults.link_loss = 0.002;
        s.faults.link_corrupt = 0.001;
        s.faults.link_flaps = 3;
    }
    // A quarter run on the lossy TCP baseline instead of RoCE.
    if pick(10, 4) == 0 {
        s.fabric.transport = Transport::TcpDctcp;
    }
    s
}

#[test]
fn a_sweep_of_24_seeds_passes_every_checker() {
    let mut failed = Vec::new();
    let (mut faulty, mut tcp) = (0, 0);
    for seed in 1..=24 {
        let s = swarm(seed);
        faulty += usize::from(s.faults.link_flaps > 0);
        tcp += usize::from(s.fabric.transport != Transport::Roce);
        let outcome = run(seed, &s, "swarm");
        if !outcome.report.passed() {
            failed.push(format!("seed {seed}: {:?}\n{}", s, outcome.report));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert!(
        faulty > 0 && tcp > 0,
        "the swarm never drew faults ({faulty}) or TCP ({tcp})"
    );
}

/// A NIC queue of 64 KiB per peer: a primary's forwards of 64 KiB writes fill
/// it, so the transport refuses frames and the node's flow owner holds them until
/// there is room, while the engine answers new writes towards the congested
/// replica `Busy` and clients retry. Nothing is dropped, nothing lost, and the
/// engine never waited.
#[test]
fn a_full_send_queue_pushes_back_and_loses_nothing() {
    let mut s = short(20);
    s.fabric.send_queue_kib = 64;
    s.workload.block_size = 64 << 10;
    s.workload.read_percent = 30;
    let outcome = run(3, &s, "small send queues");
    let r = &outcome.report;
    assert!(r.passed(), "{r}");
    assert!(r.flow.refused > 0, "no send was refused: {r}");
    assert!(r.flow.held > 0, "{r}");
    assert_eq!(r.flow.dropped, 0, "{r}");
}

#[test]
fn a_hot_small_volume_makes_overlapping_writes_and_still_passes() {
    // 4 MiB: with QD32 x 2 clients, writes to the same block overlap all the time,
    // which exercises the primary's ordering and the zone checker's hard cases.
    let mut s = short(20);
    s.cluster.volume_mib = 4;
    s.cluster.extent_mib = 1;
    s.workload.read_percent = 50;
    let outcome = run(5, &s, "hot");
    assert!(outcome.report.passed(), "{}", outcome.report);
    // Prove the overlap happened: some block saw a write begin before another
    // write of it was acknowledged.
    let mut writes: Vec<_> = outcome
        .history
        .ops
        .iter()
        .filter(|o| o.kind == weir_sim::history::OpKind::Write)
        .map(|o| (o.lba, o.invoke_ns, o.complete_ns.unwrap()))
        .collect();
    writes.sort();
    let overlapping = writes
        .windows(2)
        .filter(|p| p[0].0 == p[1].0 && p[1].1 < p[0].2)
        .count();
    assert!(
        overlapping > 100,
        "only {overlapping} overlapping write pairs"
    );
}

#[test]
fn skipping_a_replica_is_caught_and_named() {
    let mut s = short(10);
    s.bugs.skip_last_replica = true;
    let outcome = run(1, &s, "bug");
    let lost = verdict(&outcome.report, "no acknowledged write lost");
    assert!(!lost.passed(), "the checker missed a skipped replica");
    let first = &lost.violations[0];
    assert!(
        first.contains("block") && first.contains("holds") && first.contains("acknowledged write"),
        "unreadable violation: {first}"
    );
    assert!(!outcome.report.passed());
}

/// A small workload that runs long enough for a failover (detection takes a lease
/// timeout, 150 ms).
fn failover(seed: u64, crash_leader: bool) -> weir_sim::runner::Outcome {
    let mut s = small(400);
    s.faults.node_crashes = 1;
    s.faults.crash_leader = crash_leader;
    run(seed, &s, "failover")
}

#[test]
fn a_crashed_primary_fails_over_with_no_client_error() {
    let outcome = failover(4, false);
    let r = &outcome.report;
    assert!(r.passed(), "{r}");
    assert_eq!(r.errors, 0);
    assert!(
        saw(r, |e| matches!(e, Event::NodeDown { .. })),
        "no failover: {r}"
    );
    // The report names the failover time.
    assert!(
        r.events
            .iter()
            .any(|e| e.contains("failover of") && e.contains("after its crash")),
        "{r}"
    );
    // The stall is bounded by detection plus one call timeout, far below the retry
    // budget.
    assert!(r.write.max_us < 1_000_000.0, "{r}");
    assert!(
        r.write.max_us > 100_000.0,
        "a crash with no visible stall: {r}"
    );
}

#[test]
fn losing_the_raft_leader_and_a_replica_of_every_extent_is_survived() {
    // With 3 nodes and 3 replicas, every node holds a replica of every extent.
    let outcome = failover(9, true);
    let r = &outcome.report;
    assert!(r.passed(), "{r}");
    let crash_n1 = |f: &Fault| matches!(f, Fault::Crash { node: NodeId(1) });
    assert!(
        outcome.plan.faults.iter().any(|p| crash_n1(&p.fault)),
        "{r}"
    );
    let n1_down = |e: &Event| {
        matches!(
            e,
            Event::NodeDown {
                node: NodeId(1),
                ..
            }
        )
    };
    assert!(saw(r, n1_down), "{r}");
}

#[test]
fn a_hung_replica_device_is_dropped_from_the_in_sync_set_and_writes_go_on() {
    let mut s = small(400);
    s.faults.device_hangs = 1;
    // Drawn from 25% to 100% of this: always past the 100 ms replica timeout.
    s.faults.hang_ms = 480;
    let outcome = run(1, &s, "hang");
    let r = &outcome.report;
    assert!(r.passed(), "{r}");
    assert!(
        saw(r, |e| matches!(e, Event::ReplicaDropped { .. })),
        "no replica dropped: {r}"
    );
}

fn verdict<'a>(r: &'a weir_sim::report::Report, name: &str) -> &'a weir_sim::checker::Verdict {
    r.verdicts
        .iter()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("no {name} verdict"))
}

#[test]
fn acking_before_the_slowest_replica_is_caught_and_named() {
    let mut s = short(10);
    s.bugs.ack_before_slowest = true;
    let outcome = run(1, &s, "bug");
    let v = verdict(&outcome.report, "acked-means-persisted");
    assert!(!v.passed(), "the checker missed early acks");
    let first = &v.violations[0];
    assert!(
        first.contains("acknowledged") && first.contains("but in-sync"),
        "unreadable violation: {first}"
    );
    assert!(!outcome.report.passed());
}

#[test]
fn serving_before_the_old_lease_ends_is_caught_and_named() {
    // Campaign seed 1 cuts n4 off for 299 ms: declared down while alive, it keeps
    // its lease until it runs out, and a new primary serving before that overlaps
    // it. (A crashed node's lease ends with it, so crashes cannot catch this bug.)
    let first = first_violation(1, |s| s.bugs.serve_before_lease = true, "leases");
    assert!(
        first.contains("may serve it"),
        "unreadable violation: {first}"
    );
    // Without the bug the same seed passes.
    let r = run(1, &Scenario::campaign(1), "campaign").report;
    assert!(r.passed(), "{r}");
}

#[test]
fn a_paused_node_and_a_cut_off_node_are_survived_and_come_back() {
    let mut s = small(500);
    s.faults.node_pauses = 1;
    s.faults.pause_ms = 250;
    s.faults.partitions = 1;
    s.faults.partition_ms = 250;
    let outcome = run(2, &s, "pause-partition");
    let r = &outcome.report;
    assert!(r.passed(), "{r}");
    let planned = |f: fn(&Fault) -> bool| outcome.plan.faults.iter().any(|p| f(&p.fault));
    assert!(planned(|f| matches!(f, Fault::Pause { .. })), "{r}");
    assert!(planned(|f| matches!(f, Fault::Partition { .. })), "{r}");
    assert_eq!(
        count(r, |e| matches!(e, Event::NodeUp { .. })),
        count(r, |e| matches!(e, Event::NodeDown { .. })),
        "every node declared down came back: {r}"
    );
    // ... and was rebuilt: every replica in sync again, read back and checked.
    assert!(saw(r, |e| matches!(e, Event::Rebuilt { .. })), "{r}");
    assert!(verdict(r, "liveness").passed(), "{r}");
}

/// Campaign seed `seed` with a bug switched on: the first violation `checker`
/// names. (Seed 1 cuts n4 off long enough to be declared down and replaced; it
/// comes back with writes of its old epoch in flight.)
fn first_violation(seed: u64, bug: fn(&mut Scenario), checker: &str) -> String {
    let mut s = Scenario::campaign(seed);
    bug(&mut s);
    let outcome = run(seed, &s, "campaign");
    let v = verdict(&outcome.report, checker);
    assert!(!v.passed(), "{checker} missed the bug");
    v.violations[0].clone()
}

#[test]
fn rebuilding_one_version_short_is_caught_and_named() {
    let first = first_violation(
        1,
        |s| s.bugs.rebuild_one_short = true,
        "no acknowledged write lost",
    );
    assert!(
        first.contains("lost") || first.contains("diverge"),
        "unreadable violation: {first}"
    );
}

#[test]
fn ignoring_the_lease_margin_is_caught_when_clocks_disagree() {
    // Campaign seed 354: clock offsets up to 1 ms (n2 0.918 ms behind the true
    // time, n3 0.579 ms ahead), so leases keep a 2 ms margin. Serving to the
    // lease's end by its slow clock, n2 still serves after the leader, by its
    // own clock, let the new primary n3 start. (Seed 144 caught it until the
    // snapshot stage's draw, on 2026-12-05, gave that seed another run.)
    let first = first_violation(354, |s| s.bugs.ignore_lease_margin = true, "leases");
    assert!(
        first.contains("may serve it"),
        "unreadable violation: {first}"
    );
    let r = run(354, &Scenario::campaign(354), "campaign").report;
    assert!(r.passed(), "{r}");
    assert!(
        r.clocks.contains("leases end 2.005 ms early"),
        "{}",
        r.clocks
    );
}

#[test]
fn accepting_a_stale_epoch_is_caught_and_named() {
    // Seed 12 (seed 25 caught it from 2026-12-04 until 2026-12-05, when the
    // Raft group's genesis entry and the membership draws changed the runs;
    // seed 1 until 2026-12-07, when the clients' requests began to go through
    // the nodes' front ends; 1 of seeds 1-16 catches it now).
    let first = first_violation(12, |s| s.bugs.accept_stale_epoch = true, "epochs only grow");
    assert!(
        first.contains("took a write of") && first.contains("its map was at"),
        "unreadable violation: {first}"
    );
}

#[test]
fn a_client_giving_up_at_once_is_caught_by_the_availability_checker() {
    // Campaign seed 1 (2026-12-07: 7 of seeds 1-16 catch it): its faults stay
    // within tolerance, so every request must succeed; a client that gives
    // a request up at the first refusal (a stale epoch, a busy node) fails
    // some, and the checker names each with its error.
    let first = first_violation(1, |s| s.bugs.give_up_at_once = true, "availability");
    assert!(
        first.contains("failed: gave up after 0ns and 1 attempts"),
        "unreadable violation: {first}"
    );
    let r = run(1, &Scenario::campaign(1), "campaign").report;
    assert!(r.passed(), "{r}");
}

#[test]
fn a_rebuild_over_lossy_tcp_keeps_probes_in_flight() {
    // Campaign seed 20274 (5 nodes, TCP with loss, a small congestion
    // window): until 2026-12-06 a rebuild sent one probe at a time to a
    // replica whose window had been cut, so every lost packet was a lost
    // tail that TCP recovers only after its 200 ms minimum RTO: n3's rebuild
    // of three extents it already held took 2,011 ms, past liveness's bound.
    let r = run(20274, &Scenario::campaign(20274), "campaign").report;
    assert!(r.passed(), "{r}");
}

#[test]
fn a_write_leaking_into_a_snapshot_is_caught_and_named() {
    // Campaign seed 4 runs the snapshot stage (16 MiB extents); without the
    // bug it passes (the campaign's seeds 1-100 run in `cargo xtask test`).
    let first = first_violation(4, |s| s.bugs.leak_into_snapshot = true, "snapshots");
    assert!(
        first.starts_with("snapshot s") && first.contains("may hold only"),
        "unreadable violation: {first}"
    );
}

#[test]
fn a_crashed_node_restarts_from_its_log_and_its_replicas_rebuild() {
    let mut s = small(600);
    s.faults.node_restarts = 1;
    s.faults.restart_ms = 300;
    let outcome = run(2, &s, "restart");
    let r = &outcome.report;
    assert!(r.passed(), "{r}");
    assert!(r.faults.iter().any(|f| f.contains("restarts")), "{r}");
    // It replayed its Raft log and asked for a new epoch for its extents; declared
    // down while away, it came back up and was rebuilt.
    assert!(saw(r, |e| matches!(e, Event::Restarted { .. })), "{r}");
    assert!(saw(r, |e| matches!(e, Event::NodeUp { .. })), "{r}");
    assert!(saw(r, |e| matches!(e, Event::Rebuilt { .. })), "{r}");
    assert!(verdict(r, "liveness").passed(), "{r}");
}

#[test]
fn a_node_that_stays_down_is_replaced_by_spares_and_every_extent_gets_back_to_three() {
    let mut s = small(600);
    s.cluster.nodes = 4;
    s.faults.node_crashes = 1;
    let outcome = run(3, &s, "replace");
    let r = &outcome.report;
    assert!(r.passed(), "{r}");
    // Down, then past `replace_after_ms` its replicas moved to the other nodes,
    // which rebuilt them: liveness holds every extent at 3 in-sync copies.
    assert!(saw(r, |e| matches!(e, Event::Replaced { .. })), "{r}");
    assert!(saw(r, |e| matches!(e, Event::Rebuilt { .. })), "{r}");
    let live = verdict(r, "liveness");
    assert!(live.passed() && live.scope.contains("back to 3"), "{r}");
}

#[test]
fn a_power_loss_drops_unflushed_writes_and_the_node_rebuilds_them() {
    let mut s = small(400);
    s.faults.power_losses = 1;
    s.faults.restart_ms = 60;
    let outcome = run(2, &s, "power");
    let r = &outcome.report;
    assert!(r.passed(), "{r}");
    // Its device lost writes it had acknowledged (they were in the volatile
    // cache); back before it was declared down, it left the in-sync sets at its
    // restart, and its rebuild put them back: the read-back finds every copy.
    let lost_writes =
        |e: &Event| matches!(e, Event::PowerLost { dropped_blocks, .. } if *dropped_blocks > 0);
    assert!(saw(r, lost_writes), "{r}");
    assert!(!saw(r, |e| matches!(e, Event::NodeDown { .. })), "{r}");
    assert!(saw(r, |e| matches!(e, Event::Restarted { .. })), "{r}");
    assert!(saw(r, |e| matches!(e, Event::Rebuilt { .. })), "{r}");
}

#[test]
fn an_ssd_media_error_is_served_around_and_repaired_from_a_peer() {
    let mut s = small(300);
    s.cluster.volume_mib = 64;
    s.cluster.extent_mib = 16;
    s.faults.media_errors = 1;
    let outcome = run(1, &s, "media");
    let r = &outcome.report;
    // No client error: reads of the bad blocks were served from another copy, and
    // the read-back finds every copy readable and right.
    assert!(r.passed(), "{r}");
    assert!(r.faults.iter().any(|f| f.contains("media errors")), "{r}");
    assert!(saw(r, |e| matches!(e, Event::Repaired { .. })), "{r}");
}

#[test]
fn the_default_scenario_runs_over_rdmas_messenger_as_over_roce() {
    let mut s = short(40);
    let roce = run(1, &s, "default").report;
    s.fabric.transport = Transport::Rdma;
    let r = run(1, &s, "rdma").report;
    assert!(r.passed(), "{r}");
    let m = r.messenger.expect("the messenger carried the frames");
    // Clients and checker connected to the nodes, the nodes to each other; no
    // connection reset, none refused, no frame lost.
    assert!(m.connects >= 6, "{r}");
    assert_eq!((m.refused, m.resets, m.frames_lost), (0, 0, 0), "{r}");
    assert_eq!(r.payload_copies, 0, "{r}");
    // Credits, grants and credit updates cost the workload little on this
    // fabric: IOPS within 5% of RoCE's without the messenger.
    let ratio = r.iops / roce.iops;
    assert!((0.95..=1.05).contains(&ratio), "{ratio}: {r}\n{roce}");
}

#[test]
fn a_node_restarting_over_rdma_is_connected_again_and_caught_up() {
    let mut s = small(400);
    s.fabric.transport = Transport::Rdma;
    s.faults.node_restarts = 1;
    let r = run(3, &s, "rdma-restart").report;
    assert!(r.passed(), "{r}");
    assert_eq!(r.errors, 0, "{r}");
    let m = r.messenger.expect("the messenger carried the frames");
    // The restarted node's peers found its old connections gone and set up new
    // ones.
    assert!(m.resets > 0, "{r}");
    assert_eq!(m.refused, 0, "{r}");
    assert!(saw(&r, |e| matches!(e, Event::Rebuilt { .. })), "{r}");
}

#[test]
fn a_one_port_link_flap_on_two_port_hosts_moves_connections_and_no_io_fails() {
    let mut s = small(400);
    s.fabric.transport = Transport::Rdma;
    s.fabric.ports_per_host = 2;
    // Each flap takes one port of a node or client down for 15..150 ms, far
    // longer than the 8 ms (8 timeouts of 1 ms) a QP retries before it fails.
    s.faults.link_flaps = 3;
    s.faults.flap_down_us = 150_000;
    let r = run(5, &s, "rdma-two-port-flap").report;
    assert!(r.passed(), "{r}");
    assert_eq!(r.errors, 0, "{r}");
    assert!(
        r.faults.iter().filter(|f| f.contains("link")).count() == 3,
        "{r}"
    );
    let m = r.messenger.expect("the messenger carried the frames");
    // The QPs of the dead ports failed, and their connections moved to the
    // other path at once instead of waiting for the link.
    assert!(r.fabric.qp_errors > 0, "{r}");
    assert!(m.failovers > 0, "{r}");
    assert_eq!(m.refused, 0, "{r}");
    // The bound on a client's wait: a dead path is found when a QP has timed
    // out 8 times (its first try and 7 retries, 1 ms each); the connection is
    // set up again on the other path at once and sends again what never
    // arrived. Nothing is lost, so nothing waits for a client's call timeout.
    // A request crosses the fabric up to three times one way (host to a
    // node's front end, front end to primary, primary to replica), so two of
    // its hops may find the flapped port dead one after the other: 2 x 8 ms,
    // and the set-up and replay (a write took 10.04 ms on 2026-12-07).
    assert_eq!(m.frames_lost, 0, "{r}");
    assert!(m.replayed > 0, "{r}");
    assert!(r.read.max_us.max(r.write.max_us) < 20_000.0, "{r}");
    // Most I/O never noticed.
    assert!(r.read.p99_us < 1_000.0 && r.write.p99_us < 1_000.0, "{r}");
}

/// Variant `name` of experiment `experiment`, seed 1, for `ms` simulated ms;
/// every checker passes.
fn run_experiment_variant(experiment: &str, name: &str, ms: u64) -> Report {
    let variants = (weir_sim::experiment::find(experiment).unwrap().variants)(false);
    let mut s = variants
        .into_iter()
        .find(|v| v.name == name)
        .unwrap()
        .scenario;
    s.workload.duration_ms = ms;
    let r = run(1, &s, name).report;
    assert!(r.passed(), "{r}");
    r
}

/// The `qos` experiment's variants, 20 simulated ms each: a noisy neighbour's
/// limit holds over the three primaries, and a reservation lifts the quiet
/// volume from what it gets without QoS to above what it reserved.
#[test]
fn a_limit_holds_over_the_primaries_and_a_reservation_is_kept() {
    use weir_sim::experiment::setups::{QOS_NOISY_LIMIT, QOS_QUIET_RESERVATION};
    // Each variant's IOPS per volume (quiet, noisy).
    let run_variant = |name: &str| {
        let r = run_experiment_variant("qos", name, 20);
        let iops = |volume: &str| r.volumes.iter().find(|v| v.0 == volume).unwrap().1;
        println!(
            "{name}: quiet {:.0}, noisy {:.0} IOPS",
            iops("quiet"),
            iops("noisy")
        );
        (iops("quiet"), iops("noisy"))
    };
    let (free, off) = run_variant("off");
    let (_, limited) = run_variant("limit");
    let (reserved, _) = run_variant("reserve");
    let limit = QOS_NOISY_LIMIT as f64;
    assert!(
        off > 2.0 * limit,
        "without QoS the neighbour runs at {off:.0}"
    );
    assert!(
        (limited - limit).abs() <= 0.02 * limit,
        "limited to {limit}, ran at {limited:.0}"
    );
    let reservation = QOS_QUIET_RESERVATION as f64;
    assert!(
        free < reservation,
        "the check can fail: {free:.0} without QoS"
    );
    assert!(
        reserved >= reservation,
        "{reserved:.0} IOPS with {reservation} reserved"
    );
}

/// The `incast` experiment's fan-in, 20 simulated ms: with the congestion
/// response on, each client's read window follows the marks on packets reaching
/// it, so the switch marks far fewer packets at the clients' ports, at about the
/// same IOPS (the clients' links bind either way).
#[test]
fn a_clients_read_window_drains_the_fan_in_queue_without_losing_its_rate() {
    let run_variant = |name: &str| {
        let r = run_experiment_variant("incast", name, 20);
        println!(
            "{name}: {:.0} IOPS, {} ECN marks, read P99 {} us, {} reads waited, {} cuts",
            r.iops, r.fabric.ecn_marks, r.read.p99_us, r.flow.reads_waited, r.flow.read_cuts
        );
        r
    };
    let off = run_variant("dcqcn-on-fan-in");
    let on = run_variant("dcqcn-on-flow-fan-in");
    assert_eq!(
        off.flow.reads_waited + off.flow.read_cuts,
        0,
        "off: no window"
    );
    assert!(on.flow.read_cuts > 0 && on.flow.reads_waited > 0);
    assert!(
        off.fabric.ecn_marks > 1000,
        "the check can fail: {} marks without the window",
        off.fabric.ecn_marks
    );
    assert!(
        on.fabric.ecn_marks * 2 < off.fabric.ecn_marks,
        "{} marks with the window, {} without",
        on.fabric.ecn_marks,
        off.fabric.ecn_marks
    );
    assert!(
        on.iops > 0.9 * off.iops,
        "{:.0} IOPS with the window, {:.0} without",
        on.iops,
        off.iops
    );
}
