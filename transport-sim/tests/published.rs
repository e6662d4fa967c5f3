//! The RoCE fabric checked against published behaviour. Deterministic: the engine
//! runs with explicit time and a fixed seed, no runtime.

use weir_core::wire::Frame;
use weir_transport_sim::fabric::config::{FabricConfig, LinkSpec, Topology};
use weir_transport_sim::fabric::telemetry::DropReason;
use weir_transport_sim::fabric::{Delivery, Engine};

const G100: u64 = 100_000_000_000;

fn engine(config: FabricConfig) -> Engine {
    let mut e = Engine::new(config).unwrap();
    for _ in 0..e.wiring().host_ports.len() {
        e.add_host().unwrap();
    }
    e
}

fn star(hosts: usize) -> FabricConfig {
    FabricConfig {
        topology: Topology::Star { hosts },
        seed: 7,
        ..FabricConfig::at_rate(G100)
    }
}

/// Payload bytes each sender got delivered in `[from_ns, to_ns)`.
fn delivered_between(d: &[Delivery], src: usize, from_ns: u64, to_ns: u64) -> u64 {
    d.iter()
        .filter(|d| d.src == src && d.at_ns >= from_ns && d.at_ns < to_ns)
        .map(|d| d.frame.len() as u64)
        .sum()
}

fn gbps(bytes: u64, ns: u64) -> f64 {
    bytes as f64 * 8.0 / ns as f64
}

/// Two long flows into one receiver; returns the engine after the run, the
/// deliveries, and the bottleneck port.
fn two_to_one(config: FabricConfig) -> (Engine, Vec<Delivery>, usize) {
    let mut e = engine(config);
    e.enable_sampling(10_000);
    for _ in 0..400 {
        e.send(0, 0, 2, Frame::from(vec![0; 64 << 10]));
        e.send(0, 1, 2, Frame::from(vec![0; 64 << 10]));
    }
    let d = e.run_until_idle(u64::MAX);
    let bottleneck = e.wiring().ports[e.wiring().host_ports[2][0]].peer;
    (e, d, bottleneck)
}

fn queue_between(e: &Engine, port: usize, from: u64, to: u64) -> Vec<u64> {
    e.samples()
        .iter()
        .filter(|s| s.at_ns >= from && s.at_ns < to)
        .map(|s| s.queue_bytes.iter().find(|(p, _)| *p == port).unwrap().1)
        .collect()
}

/// What one 2:1 run showed over the steady-state window.
struct TwoToOne {
    a: f64,
    b: f64,
    line: f64,
    kmin: u64,
    kmax: u64,
    max: u64,
    pauses: u64,
    drops: u64,
}

/// Run the 2:1 under `config` and print what it showed over `[from, to)`.
fn measure_two_to_one(label: &str, config: FabricConfig, from: u64, to: u64) -> TwoToOne {
    let (kmin, kmax) = config.switch.ecn.thresholds(G100);
    let header = f64::from(config.header_bytes);
    let (e, d, bottleneck) = two_to_one(config);
    let a = gbps(delivered_between(&d, 0, from, to), to - from);
    let b = gbps(delivered_between(&d, 1, from, to), to - from);
    // Line rate in payload terms: every 4096-byte packet carries its headers.
    let line = 100.0 * 4096.0 / (4096.0 + header);
    println!("2:1 {label}: flow A {a:.1} Gb/s, flow B {b:.1} Gb/s, sum {:.1} (payload line rate {line:.1})", a + b);
    let queue = queue_between(&e, bottleneck, from, to);
    let (min, max) = (*queue.iter().min().unwrap(), *queue.iter().max().unwrap());
    let inside = queue.iter().filter(|&&q| q >= kmin && q <= kmax).count();
    let mean = queue.iter().sum::<u64>() / queue.len() as u64;
    let inside_pct = 100.0 * inside as f64 / queue.len() as f64;
    println!(
        "2:1 {label}: bottleneck queue min {min} B, mean {mean} B, max {max} B; {inside_pct:.1}% of samples in [Kmin {kmin}, Kmax {kmax}]"
    );
    let c = e.counters();
    println!(
        "2:1 {label}: {} ECN marks, {} CNPs, {} pauses, {} drops",
        c.ecn_marks,
        c.cnps_received,
        c.pauses_sent,
        c.drops_in_network()
    );
    assert!(
        c.cnps_received > 0 && c.ecn_marks > 0,
        "{label}: ECN never engaged"
    );
    TwoToOne {
        a,
        b,
        line,
        kmin,
        kmax,
        max,
        pauses: c.pauses_sent,
        drops: c.drops_in_network(),
    }
}

/// The parts of the 2:1 check that hold under every configuration measured: the
/// aggregate within 5% of line rate, each flow within 10% of half of it, the queue
/// never above Kmax, no pause, no drop.
fn assert_shares_fairly_below_kmax(label: &str, r: &TwoToOne) {
    let (a, b, line) = (r.a, r.b, r.line);
    assert!(
        ((a + b) - line).abs() <= 0.05 * line,
        "{label}: aggregate {:.1} Gb/s",
        a + b
    );
    for x in [a, b] {
        assert!(
            (x - line / 2.0).abs() <= 0.1 * line / 2.0,
            "{label}: unfair share: {a:.1} / {b:.1} Gb/s"
        );
    }
    assert!(r.max <= r.kmax, "{label}: queue {} B above Kmax", r.max);
    assert!(r.max >= r.kmin, "{label}: the queue never reached Kmin");
    assert_eq!(r.pauses, 0, "{label}: PFC paused a 2:1 flow pair");
    assert_eq!(r.drops, 0, "{label}: dropped packets");
}

#[test]
fn two_to_one_with_dcqcn_shares_fairly_and_holds_the_queue_between_kmin_and_kmax() {
    // Steady state: after DCQCN's first cuts, before either flow runs dry.
    let (from, to) = (1_000_000, 4_000_000);
    // The reference simulator's configuration (the default): hpcc preset, ECN
    // 400 / 1600 KB at 100 Gb/s, pmax 0.2.
    let hpcc = measure_two_to_one("hpcc", star(3), from, to);
    assert_shares_fairly_below_kmax("hpcc", &hpcc);
    // The queue does not pass Kmax here: ECN marking, not PFC, holds it. It does not
    // stay above Kmin, even with the reference simulator's thresholds and reaction
    // point: with the 300 us increase timer (restarted by every cut, no byte
    // counter) a QP's rate only falls while CNPs keep coming and only rises after
    // 300 us without one, which needs the queue at Kmin or below; meanwhile the cuts
    // go on while the queue drains from its peak, so the aggregate falls to ~85 Gb/s
    // and the queue sits under Kmin for ~300-600 us per 1-2.5 ms cycle (about 80% of
    // samples inside here). Measured and printed, not asserted; see the README.

    // The DCQCN paper's own configuration: its reaction point, 50 us CNP pacing
    // (the default) and its marking, 5 / 200 KB and pmax 1% at 40 Gb/s, scaled to
    // 12.5 / 500 KB at 100 Gb/s. Share, line rate, the Kmax bound, no pause and no
    // drop hold. The queue does not stay above Kmin either (about 70% of samples
    // inside here, 75-82% at 50-100 ms once alpha has settled), and not through a
    // modelling slip: alpha falls by g = 1/256 per 55 us (a 14 ms time constant)
    // from 1, so the first cuts halve a flow; settled (alpha ~0.09), one cut leaves
    // a deficit that fast recovery repays over ~110 us, ~30 KB, about the standing
    // queue above Kmin, and a second CNP within fast recovery clamps the target
    // lower, which only additive increase (40 Mb/s per 55 us) wins back, with the
    // queue empty meanwhile. The paper's authors say as much of their own packet
    // simulator ("The random marking on switches can't keep the queue as stable as
    // fluid model analysis", bobzhuyb/ns3-rdma issue 9). Printed, not asserted.
    let mut config = star(3);
    assert!(config.set_dcqcn_preset("paper"));
    let paper = measure_two_to_one("paper", config, from, to);
    assert_eq!((paper.kmin, paper.kmax), (12_500, 500_000));
    assert_shares_fairly_below_kmax("paper", &paper);
}

/// The same 2:1 under every reaction-point preset and both CNP styles: a table for
/// the record. Every variant must stay lossless and finish; the figures are printed.
#[test]
fn two_to_one_under_each_preset_is_lossless_and_reported() {
    use weir_transport_sim::congestion::dcqcn::{CnpMode, DcqcnParams};
    for (preset, own_ecn) in [
        ("hpcc", true),
        ("paper", false),
        ("paper", true),
        ("connectx", true),
    ] {
        for (style, cnp) in [
            (
                "per-QP 50 us",
                CnpMode::PerQpInterval {
                    interval_ns: 50_000,
                },
            ),
            ("per packet", CnpMode::PerPacket { min_gap_ns: 0 }),
        ] {
            let mut config = star(3);
            if own_ecn {
                assert!(config.set_dcqcn_preset(preset));
            } else {
                config.nic.dcqcn = DcqcnParams::preset(preset, 100e9);
            }
            let ecn = if own_ecn { "own ECN" } else { "hpcc ECN" };
            config.nic.cnp = cnp;
            let (e, d, bottleneck) = two_to_one(config);
            assert_eq!(d.len(), 800, "{preset}/{style}: flows did not finish");
            let (from, to) = (1_000_000, 3_000_000);
            let sum = gbps(
                delivered_between(&d, 0, from, to) + delivered_between(&d, 1, from, to),
                to - from,
            );
            let queue = queue_between(&e, bottleneck, from, to);
            let mean = queue.iter().sum::<u64>() / queue.len().max(1) as u64;
            let c = e.counters();
            println!(
                "2:1 {preset:<8} {ecn:<8} {style:<12}: {sum:5.1} Gb/s, queue mean {:>5} KB, {} CNPs, {} pauses",
                mean / 1000,
                c.cnps_received,
                c.pauses_sent
            );
            assert_eq!(c.drops_in_network(), 0, "{preset}/{style} dropped packets");
        }
    }
}

/// 60 senders x 500 KB into one receiver at 100 Gb/s.
fn incast(window: bool) -> (u64, u64, u64, u64) {
    let mut config = star(61);
    config.nic.bdp_window = window;
    let mut e = engine(config);
    for src in 0..60 {
        e.send(0, src, 60, Frame::from(vec![0; 500_000]));
    }
    let d = e.run_until_idle(u64::MAX);
    assert_eq!(d.len(), 60, "every flow completes");
    let last_fct = d.iter().map(|d| d.at_ns - d.sent_ns).max().unwrap();
    let bottleneck = e.wiring().ports[e.wiring().host_ports[60][0]].peer;
    let max_queue = e.all_port_stats()[bottleneck].2.queue_bytes_max;
    let c = e.counters();
    (last_fct, c.pauses_sent, max_queue, c.drops_in_network())
}

#[test]
fn incast_60_to_1_finishes_no_sooner_than_the_physics_allows_and_drops_nothing() {
    let bound_ns = 30_000_000u64 * 8 * 1_000_000_000 / G100; // 30 MB at 100 Gb/s
    let (fct, pauses, queue, drops) = incast(false);
    println!(
        "incast DCQCN: last FCT {fct} ns, {pauses} pauses, max queue {queue} B, {drops} drops"
    );
    let (fct_w, pauses_w, queue_w, drops_w) = incast(true);
    println!(
        "incast DCQCN + BDP window: last FCT {fct_w} ns, {pauses_w} pauses, max queue {queue_w} B, {drops_w} drops"
    );
    assert!(
        fct >= bound_ns && fct_w >= bound_ns,
        "faster than the link: {fct} / {fct_w}"
    );
    assert_eq!(drops, 0, "a lossless incast dropped packets");
    assert_eq!(drops_w, 0, "a lossless incast dropped packets");
    assert!(pauses > 0, "60:1 without a window should need PFC");
    assert!(
        pauses_w * 4 <= pauses,
        "the window did not cut pauses sharply: {pauses_w} vs {pauses}"
    );
    assert!(queue_w < queue);
}

/// Leaf-spine: 16 incast senders and one victim sender on leaf 0; the incast
/// receiver and the victim's receiver on leaf 1. Returns the victim's throughput
/// while the incast runs and the pauses sent.
fn spreading(dcqcn: bool, incast: bool) -> (f64, u64) {
    let mut config = FabricConfig {
        topology: Topology::LeafSpine {
            leaves: 2,
            spines: 1,
            hosts_per_leaf: 17,
        },
        fabric_link: LinkSpec {
            rate_bps: 4 * G100,
            delay_ns: 1_000,
        },
        seed: 3,
        ..FabricConfig::at_rate(G100)
    };
    config.switch.buffer_bytes = 4 << 20;
    if !dcqcn {
        config.nic.dcqcn = None;
    }
    let mut e = engine(config);
    let (victim, victim_rx, incast_rx) = (16, 17, 18);
    for _ in 0..400 {
        e.send(0, victim, victim_rx, Frame::from(vec![0; 64 << 10]));
    }
    if incast {
        for src in 0..16 {
            for _ in 0..8 {
                e.send(0, src, incast_rx, Frame::from(vec![0; 250_000]));
            }
        }
    }
    let d = e.run_until_idle(u64::MAX);
    let (from, to) = (200_000, 1_500_000);
    let victim_gbps = gbps(delivered_between(&d, victim, from, to), to - from);
    assert_eq!(e.counters().dropped(DropReason::HeadroomOverflow), 0);
    (victim_gbps, e.counters().pauses_sent)
}

#[test]
fn congestion_spreads_to_a_victim_through_pauses_and_dcqcn_limits_it() {
    let (alone, _) = spreading(true, false);
    let (pfc_only, pauses_pfc) = spreading(false, true);
    let (with_dcqcn, pauses_dcqcn) = spreading(true, true);
    println!(
        "victim flow: alone {alone:.1} Gb/s; beside the incast with PFC only {pfc_only:.1} Gb/s \
         ({pauses_pfc} pauses); with DCQCN {with_dcqcn:.1} Gb/s ({pauses_dcqcn} pauses)"
    );
    assert!(
        alone > 90.0,
        "the victim alone should run at line rate: {alone:.1}"
    );
    assert!(pauses_pfc > 0, "the incast never paused anyone");
    assert!(
        pfc_only < alone * 0.8,
        "no spreading: {pfc_only:.1} vs {alone:.1}"
    );
    assert!(
        with_dcqcn > pfc_only,
        "DCQCN did not reduce the victim's loss"
    );
}

/// The TCP baseline on the same star.
fn tcp_star(
    hosts: usize,
    algorithm: weir_transport_sim::congestion::tcp::Algorithm,
) -> FabricConfig {
    FabricConfig {
        topology: Topology::Star { hosts },
        seed: 7,
        ..FabricConfig::tcp(G100, algorithm)
    }
}

#[test]
fn dctcp_two_to_one_fills_the_link_and_holds_the_queue_at_k() {
    use weir_transport_sim::congestion::tcp::Algorithm;
    let config = tcp_star(3, Algorithm::Dctcp);
    let (k, _) = config.switch.ecn.thresholds(G100);
    let frame = u64::from(config.nic.mtu_bytes + config.header_bytes);
    let (e, d, bottleneck) = two_to_one(config);
    let (from, to) = (1_000_000, 3_000_000);
    let a = gbps(delivered_between(&d, 0, from, to), to - from);
    let b = gbps(delivered_between(&d, 1, from, to), to - from);
    let q = queue_between(&e, bottleneck, from, to);
    let mean = q.iter().sum::<u64>() / q.len() as u64;
    let max = *q.iter().max().unwrap();
    println!("DCTCP 2:1: {a:.1} + {b:.1} Gb/s, queue mean {mean} B, max {max} B (K {k})");
    assert!(
        a + b >= 0.95 * 98.0,
        "DCTCP left the link idle: {:.1}",
        a + b
    );
    assert!(max <= k + 2 * frame, "DCTCP let the queue pass K: {max}");
    assert_eq!(e.counters().drops_in_network(), 0);
}

/// 60 x 500 KB into one receiver behind a shallow port (4 MiB here: 61 ports of
/// RoCE headroom need 2.8 MB).
fn shallow_incast(config: FabricConfig) -> (u64, u64, u64) {
    let mut config = shallow(config);
    config.switch.buffer_bytes = 4 << 20;
    let mut e = engine(config);
    for src in 0..60 {
        e.send(0, src, 60, Frame::from(vec![0; 500_000]));
    }
    let d = e.run_until_idle(u64::MAX);
    assert_eq!(d.len(), 60, "every flow completes");
    let last = d.iter().map(|d| d.at_ns - d.sent_ns).max().unwrap();
    let c = e.counters();
    (last, c.drops_in_network(), c.timeouts)
}

#[test]
fn on_a_shallow_buffer_tcp_incast_waits_out_the_minimum_rto_and_roce_does_not() {
    use weir_transport_sim::congestion::tcp::Algorithm;
    let (roce, roce_drops, _) = shallow_incast(star(61));
    let (reno, reno_drops, reno_timeouts) = shallow_incast(tcp_star(61, Algorithm::Reno));
    let (dctcp, dctcp_drops, dctcp_timeouts) = shallow_incast(tcp_star(61, Algorithm::Dctcp));
    println!("shallow incast: RoCE last FCT {roce} ns ({roce_drops} drops)");
    println!("shallow incast: TCP Reno last FCT {reno} ns ({reno_drops} drops, {reno_timeouts} timeouts)");
    println!("shallow incast: DCTCP last FCT {dctcp} ns ({dctcp_drops} drops, {dctcp_timeouts} timeouts)");
    assert_eq!(roce_drops, 0, "PFC lost packets");
    assert!(roce < 3_000_000, "RoCE far from the 2.4 ms bound: {roce}");
    assert!(
        reno_drops > 0 && reno_timeouts > 0,
        "Reno incast without loss"
    );
    assert!(
        reno >= 200_000_000,
        "a timeout shorter than the minimum RTO: {reno}"
    );
}

/// A shallow-buffered port: a 2 MiB switch buffer (the least that holds RoCE's PFC
/// headroom for 33 ports), of which a lossy egress queue may take 1/16 of what is
/// free (the dynamic threshold of shallow ToR switches).
fn shallow(mut config: FabricConfig) -> FabricConfig {
    config.switch.buffer_bytes = 2 << 20;
    if let Some(tcp) = &mut config.tcp {
        tcp.queue_share = 1.0 / 16.0;
    }
    config
}

/// `senders` x 64 KB into one receiver behind a shallow port; returns (goodput
/// Gb/s, drops, timeouts).
fn shallow_fan_in(config: FabricConfig, senders: usize) -> (f64, u64, u64) {
    let mut config = shallow(config);
    config.topology = Topology::Star { hosts: senders + 1 };
    let mut e = engine(config);
    for src in 0..senders {
        e.send(0, src, senders, Frame::from(vec![0; 64 << 10]));
    }
    let d = e.run_until_idle(u64::MAX);
    assert_eq!(d.len(), senders, "every flow completes");
    let last = d.iter().map(|d| d.at_ns).max().unwrap();
    let c = e.counters();
    (
        gbps((senders as u64) << 16, last),
        c.drops_in_network(),
        c.timeouts,
    )
}

#[test]
fn tcp_incast_collapses_on_a_shallow_port_and_roce_does_not() {
    use weir_transport_sim::congestion::tcp::Algorithm;
    let (tcp4, drops4, _) = shallow_fan_in(tcp_star(5, Algorithm::Reno), 4);
    let (tcp32, drops32, timeouts32) = shallow_fan_in(tcp_star(33, Algorithm::Reno), 32);
    let (roce32, roce_drops, _) = shallow_fan_in(star(33), 32);
    println!("shallow fan-in, TCP Reno: 4 senders {tcp4:.2} Gb/s ({drops4} drops); 32 senders {tcp32:.3} Gb/s ({drops32} drops, {timeouts32} timeouts)");
    println!("shallow fan-in, RoCE: 32 senders {roce32:.2} Gb/s ({roce_drops} drops)");
    assert_eq!(drops4, 0);
    assert!(
        drops32 > 0 && timeouts32 > 0,
        "32:1 TCP incast without loss"
    );
    assert!(
        tcp32 < tcp4 / 10.0,
        "no goodput collapse: {tcp32:.3} vs {tcp4:.2} Gb/s"
    );
    assert_eq!(roce_drops, 0, "RoCE dropped in the same pattern");
    assert!(roce32 > 50.0, "RoCE goodput {roce32:.2} Gb/s");
}

#[test]
fn every_published_scenario_replays_its_counters_exactly() {
    use weir_transport_sim::congestion::tcp::Algorithm;
    type Flows = Vec<(usize, usize, usize)>;
    let counters = |config: FabricConfig, flows: &[(usize, usize, usize)]| {
        let mut e = engine(config);
        for &(src, dst, n) in flows {
            for _ in 0..n {
                e.send(0, src, dst, Frame::from(vec![0; 64 << 10]));
            }
        }
        e.run_until_idle(u64::MAX);
        e.counters().clone()
    };
    let incast: Flows = (0..60).map(|s| (s, 60, 8)).collect();
    let cases: Vec<(FabricConfig, Flows)> = vec![
        (star(3), vec![(0, 2, 100), (1, 2, 100)]),
        (star(61), incast.clone()),
        (tcp_star(61, Algorithm::Dctcp), incast),
    ];
    for (config, flows) in cases {
        let a = counters(config.clone(), &flows);
        let b = counters(config, &flows);
        assert_eq!(a, b, "same seed, different counters");
        assert!(a.packets > 0);
    }
}
