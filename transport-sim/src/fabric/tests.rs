//! Engine tests, no runtime: the engine is driven directly with explicit time.

use super::config::{FabricConfig, Topology};
use super::*;

fn no_cc(hosts: usize) -> FabricConfig {
    let mut c = FabricConfig {
        topology: Topology::Star { hosts },
        ..FabricConfig::default()
    };
    c.nic.dcqcn = None;
    c
}

fn engine(config: FabricConfig) -> Engine {
    let mut e = Engine::new(config).unwrap();
    for _ in 0..e.wiring().host_ports.len() {
        e.add_host().unwrap();
    }
    e
}

#[test]
fn one_packet_costs_two_serializations_two_propagations_and_the_switch() {
    let config = no_cc(2);
    let mut e = engine(config.clone());
    e.send(0, 0, 1, Frame::from(vec![0; 1000]));
    let d = e.run_until_idle(u64::MAX);
    assert_eq!(d.len(), 1);
    let ser =
        FabricConfig::serialization_ns(1000 + u64::from(config.header_bytes), 100_000_000_000);
    let expect = 2 * ser + 2 * config.host_link.delay_ns + config.switch.forwarding_ns;
    assert_eq!(d[0].at_ns, expect);
    assert_eq!(e.counters().messages, 1);
}

#[test]
fn messages_between_a_pair_arrive_in_order_and_whole() {
    let mut e = engine(no_cc(2));
    let mut d = Vec::new();
    for i in 0..50u8 {
        let t = u64::from(i) * 10;
        d.extend(e.advance(t));
        e.send(t, 0, 1, Frame::from(vec![i; 100 + 997 * i as usize]));
    }
    d.extend(e.run_until_idle(u64::MAX));
    let order: Vec<u8> = d.iter().map(|d| d.frame.head[0]).collect();
    assert_eq!(order, (0..50).collect::<Vec<_>>());
    assert!(d
        .iter()
        .enumerate()
        .all(|(i, d)| d.frame.len() == 100 + 997 * i));
    assert_eq!(e.nic_queue_bytes(0), 0, "every message acknowledged");
}

#[test]
fn two_senders_into_one_receiver_take_twice_as_long() {
    let msg = || Frame::from(vec![0; 1 << 20]);
    let mut alone = engine(no_cc(3));
    for _ in 0..8 {
        alone.send(0, 0, 2, msg());
    }
    let t1 = alone.run_until_idle(u64::MAX).last().unwrap().at_ns;
    let mut both = engine(no_cc(3));
    for _ in 0..8 {
        both.send(0, 0, 2, msg());
        both.send(0, 1, 2, msg());
    }
    let t2 = both.run_until_idle(u64::MAX).last().unwrap().at_ns;
    let ratio = t2 as f64 / t1 as f64;
    assert!(
        (ratio - 2.0).abs() <= 0.1,
        "ratio {ratio}: {t1} ns alone, {t2} ns shared"
    );
    assert_eq!(both.counters().drops_in_network(), 0);
}

fn star_dcqcn(hosts: usize, seed: u64) -> FabricConfig {
    FabricConfig {
        topology: Topology::Star { hosts },
        seed,
        ..FabricConfig::default()
    }
}

/// Host 0 sends `n` messages of `len` bytes to host 1; returns deliveries.
fn stream(e: &mut Engine, n: usize, len: usize) -> Vec<Delivery> {
    for i in 0..n {
        e.send(0, 0, 1, Frame::from(vec![i as u8; len]));
    }
    e.run_until_idle(u64::MAX)
}

fn assert_in_order(d: &[Delivery], n: usize, len: usize) {
    assert_eq!(d.len(), n, "messages lost");
    for (i, m) in d.iter().enumerate() {
        assert_eq!(m.frame.len(), len);
        assert_eq!(m.frame.head[0], i as u8, "message {i} out of order");
    }
}

#[test]
fn random_loss_is_repaired_by_go_back_n() {
    let mut e = engine(star_dcqcn(2, 1));
    let link = e.wiring().ports[e.wiring().host_ports[0][0]].link;
    e.inject(
        0,
        Fault::LinkErrors {
            link,
            loss: 0.01,
            corrupt: 0.0,
        },
    );
    let d = stream(&mut e, 100, 20_000);
    assert_in_order(&d, 100, 20_000);
    let c = e.counters();
    assert!(c.dropped(telemetry::DropReason::LinkLoss) > 0);
    assert!(c.nacks > 0 && c.retransmits > 0, "{c:?}");
}

#[test]
fn corrupted_packets_fail_the_icrc_check_and_are_resent() {
    let mut e = engine(star_dcqcn(2, 2));
    let link = e.wiring().ports[e.wiring().host_ports[1][0]].link;
    e.inject(
        0,
        Fault::LinkErrors {
            link,
            loss: 0.0,
            corrupt: 0.02,
        },
    );
    let d = stream(&mut e, 50, 20_000);
    assert_in_order(&d, 50, 20_000);
    assert!(e.counters().dropped(telemetry::DropReason::Corrupt) > 0);
    assert!(e.counters().retransmits > 0);
}

#[test]
fn a_link_flap_stalls_then_the_timeout_recovers() {
    let mut e = engine(star_dcqcn(2, 3));
    let link = e.wiring().ports[e.wiring().host_ports[1][0]].link;
    e.inject(20_000, Fault::LinkDown { link });
    e.inject(520_000, Fault::LinkUp { link });
    let d = stream(&mut e, 40, 20_000);
    assert_in_order(&d, 40, 20_000);
    let c = e.counters();
    assert!(c.dropped(telemetry::DropReason::LinkDown) > 0);
    assert!(
        c.timeouts > 0,
        "only a timeout can recover a dead link: {c:?}"
    );
    assert!(d.last().unwrap().at_ns > 520_000);
}

#[test]
fn a_pfc_storm_stops_traffic_to_the_stormer_and_spreads_pauses() {
    let mut e = engine(star_dcqcn(3, 4));
    e.inject(0, Fault::PfcStorm { host: 2, on: true });
    for i in 0..20 {
        e.send(0, 0, 2, Frame::from(vec![i; 200_000]));
    }
    let d = e.run_until_idle(2_000_000);
    assert!(d.is_empty(), "a paused receiver got data");
    let c = e.counters().clone();
    assert!(c.pauses_received > 0 && c.pauses_sent > 0, "{c:?}");
    // The switch held the stormer's traffic and paused the sender in turn.
    let nic0 = e.wiring().host_ports[0][0];
    assert!(e.all_port_stats()[nic0].2.paused_ns > 0 || e.ports[nic0].paused);
    e.inject(2_000_000, Fault::PfcStorm { host: 2, on: false });
    let d = e.run_until_idle(u64::MAX);
    assert_eq!(d.len(), 20, "traffic did not resume after the storm");
    assert_eq!(e.counters().drops_in_network(), 0, "PFC lost packets");
}

#[test]
fn a_switch_reboot_drops_its_queues_and_traffic_recovers() {
    let mut e = engine(star_dcqcn(3, 5));
    e.inject(
        100_000,
        Fault::SwitchReboot {
            switch: 0,
            down_ns: 50_000,
        },
    );
    for i in 0..30 {
        e.send(0, 0, 2, Frame::from(vec![i; 50_000]));
        e.send(0, 1, 2, Frame::from(vec![i; 50_000]));
    }
    let d = e.run_until_idle(u64::MAX);
    assert_eq!(d.len(), 60);
    assert!(e.counters().dropped(telemetry::DropReason::SwitchReboot) > 0);
    for s in &e.switches {
        s.mmu.self_check();
        assert_eq!(
            s.mmu.used_bytes(),
            0,
            "buffer accounting leaked across the reboot"
        );
    }
}

#[test]
fn leaf_spine_ecmp_spreads_flows_over_every_spine() {
    let config = FabricConfig {
        topology: Topology::LeafSpine {
            leaves: 2,
            spines: 4,
            hosts_per_leaf: 16,
        },
        ..FabricConfig::default()
    };
    let mut e = engine(config);
    for src in 0..16 {
        e.send(0, src, 16 + src, Frame::from(vec![0; 100_000]));
    }
    let d = e.run_until_idle(u64::MAX);
    assert_eq!(d.len(), 16);
    let used = e
        .all_port_stats()
        .into_iter()
        .filter(|(_, info, stats)| {
            info.device == topology::Device::Switch(0) && stats.bytes > 50_000
        })
        .count();
    // Leaf 0 sends nothing big to its own hosts; its four uplinks carry the flows.
    assert_eq!(used, 4, "flows did not spread over the spines");
}

#[test]
fn the_seed_decides_everything() {
    let run = |seed| {
        let mut e = engine(star_dcqcn(5, seed));
        for src in 0..4 {
            for _ in 0..20 {
                e.send(0, src, 4, Frame::from(vec![0; 100_000]));
            }
        }
        let d = e.run_until_idle(u64::MAX);
        (
            d.iter().map(|d| d.at_ns).collect::<Vec<_>>(),
            e.counters().clone(),
        )
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1).0, run(2).0, "ECN marking ignored the seed");
}

fn tcp(hosts: usize, algorithm: crate::congestion::tcp::Algorithm) -> FabricConfig {
    FabricConfig {
        topology: Topology::Star { hosts },
        seed: 9,
        ..FabricConfig::tcp(100_000_000_000, algorithm)
    }
}

#[test]
fn tcp_delivers_in_order_and_repairs_loss_with_fast_retransmit() {
    use crate::congestion::tcp::Algorithm;
    let mut e = engine(tcp(2, Algorithm::Reno));
    let link = e.wiring().ports[e.wiring().host_ports[0][0]].link;
    e.inject(
        0,
        Fault::LinkErrors {
            link,
            loss: 0.005,
            corrupt: 0.0,
        },
    );
    let d = stream(&mut e, 100, 20_000);
    assert_in_order(&d, 100, 20_000);
    let c = e.counters();
    assert!(c.dropped(telemetry::DropReason::LinkLoss) > 0);
    assert!(c.retransmits > 0);
    assert_eq!(c.pauses_sent, 0, "TCP mode sent PFC pauses");
    assert_eq!(c.cnps_sent, 0, "TCP mode sent CNPs");
}

#[test]
fn a_tcp_timeout_waits_the_minimum_rto() {
    use crate::congestion::tcp::Algorithm;
    let mut e = engine(tcp(2, Algorithm::Dctcp));
    let link = e.wiring().ports[e.wiring().host_ports[1][0]].link;
    e.inject(20_000, Fault::LinkDown { link });
    e.inject(100_000, Fault::LinkUp { link });
    let d = stream(&mut e, 40, 20_000);
    assert_in_order(&d, 40, 20_000);
    assert!(e.counters().timeouts > 0);
    assert!(
        d.last().unwrap().at_ns > 200_000_000,
        "recovered before the 200 ms minimum RTO"
    );
}

#[test]
fn a_queued_xon_never_overtakes_its_xoff() {
    let mut e = engine(star_dcqcn(2, 1));
    let sw_port = e.wiring().ports[e.wiring().host_ports[0][0]].peer;
    // Keep the switch port busy so both frames queue behind a packet.
    e.send(0, 1, 0, Frame::from(vec![0; 4096]));
    e.run_until_idle(2_200);
    e.send_pause(sw_port, true);
    e.send_pause(sw_port, false);
    e.send_pause(sw_port, true);
    let pauses: Vec<bool> = e.ports[sw_port].queues[packet::PRIO_CONTROL]
        .iter()
        .filter_map(|p| match p.kind {
            packet::Kind::Pause { on } => Some(on),
            _ => None,
        })
        .collect();
    assert_eq!(pauses, vec![true], "only the newest state is queued");
    e.run_until_idle(u64::MAX);
    assert!(
        e.ports[e.wiring().host_ports[0][0]].paused,
        "the host ended in the wrong state"
    );
}

#[test]
fn ecn_thresholds_come_from_the_row_of_the_port_speed() {
    use super::config::EcnSpec;
    const G: u64 = 1_000_000_000;
    let e = EcnSpec::hpcc();
    assert_eq!(e.thresholds(25 * G), (100_000, 400_000));
    assert_eq!(e.thresholds(100 * G), (400_000, 1_600_000));
    assert_eq!(e.thresholds(400 * G), (1_600_000, 6_400_000));
    assert_eq!(e.level(100 * G).pmax, 0.2);
    // Unlisted speeds scale the row below them, or the lowest row.
    assert_eq!(e.thresholds(200 * G), (800_000, 3_200_000));
    assert_eq!(e.thresholds(10 * G), (40_000, 160_000));
    let one = EcnSpec::at_100g(100_000, 100_000, 1.0);
    assert_eq!(one.thresholds(25 * G), (25_000, 25_000));
    assert_eq!(one.thresholds(400 * G), (400_000, 400_000));
    let mut bad = FabricConfig::default();
    bad.switch.ecn.by_rate.reverse();
    assert!(bad.validate().unwrap_err().contains("switch.ecn"));
    bad.switch.ecn.by_rate.clear();
    assert!(bad.validate().is_err());
}

#[test]
fn the_dcqcn_papers_marking_scales_from_its_40g_row_and_follows_the_paper_preset() {
    use super::config::EcnSpec;
    const G: u64 = 1_000_000_000;
    let e = EcnSpec::dcqcn_paper();
    assert_eq!(e.thresholds(40 * G), (5_000, 200_000));
    assert_eq!(e.thresholds(100 * G), (12_500, 500_000));
    assert_eq!(e.level(100 * G).pmax, 0.01);
    assert_eq!(EcnSpec::for_dcqcn_preset("paper"), Some(e));
    assert_eq!(EcnSpec::for_dcqcn_preset("hpcc"), Some(EcnSpec::hpcc()));
    assert_eq!(EcnSpec::for_dcqcn_preset("off"), None);
    let mut c = FabricConfig::at_rate(25 * G);
    assert!(c.set_dcqcn_preset("paper"));
    assert_eq!(c.switch.ecn.thresholds(25 * G), (3_125, 125_000));
    let d = c.nic.dcqcn.as_ref().unwrap();
    assert_eq!((d.line_rate_bps, d.timer_ns), (25e9, 55_000));
    assert!(c.validate().is_ok());
    let before = c.clone();
    assert!(!c.set_dcqcn_preset("nonsense"));
    assert_eq!(c, before);
}

/// A host CPU of `cores` cores at the profiles' reference clock.
fn cpu(cores: u32) -> std::sync::Arc<std::sync::Mutex<weir_host_sim::Cpu>> {
    let spec = weir_host_sim::HostSpec {
        cores,
        clock_mhz: weir_host_sim::profile::REFERENCE_MHZ,
        numa: false,
        remote_cost_pct: 100,
        poll_cores: 0,
    };
    let cpu = weir_host_sim::Cpu::new(spec, weir_host_sim::profile::REFERENCE_MHZ).unwrap();
    std::sync::Arc::new(std::sync::Mutex::new(cpu))
}

/// When one `bytes`-byte message from host 0 reaches host 1, with `net` on both.
fn one_message_ns(net: Option<weir_host_sim::NetStack>, bytes: usize) -> u64 {
    let mut e = engine(no_cc(2));
    if let Some(net) = net {
        e.attach_stack(0, cpu(4), net);
        e.attach_stack(1, cpu(4), net);
    }
    e.send(0, 0, 1, Frame::from(vec![7; bytes]));
    let d = e.run_until_idle(u64::MAX);
    assert_eq!(d.len(), 1);
    d[0].at_ns
}

#[test]
fn a_kernel_tcp_message_costs_its_profile_on_both_hosts() {
    use weir_host_sim::profile::KernelTcp;
    let t = KernelTcp::LINUX;
    let wire = one_message_ns(None, 1000);
    let with = one_message_ns(Some(weir_host_sim::NetStack::KernelTcp(t)), 1000);
    // Idle cores: the sender's call, the interrupt's coalescing delay, the
    // softirq and the woken receiver, one after the other.
    let expected =
        t.send_ns(1000, 1) + t.coalesce_us * 1000 + t.softirq_ns(1000, 1) + t.receive_ns(1000, 1);
    assert_eq!(with - wire, expected);
}

#[test]
fn an_rdma_message_costs_a_post_a_poll_and_the_nic() {
    use weir_host_sim::profile::Rdma;
    let r = Rdma::VERBS;
    let wire = one_message_ns(None, 1 << 20);
    let with = one_message_ns(Some(weir_host_sim::NetStack::Rdma(r)), 1 << 20);
    // No per-byte CPU: a 1 MiB message costs what a small one does.
    let expected = r.send_ns() + 2 * r.nic_ns_per_message() + r.receive_ns();
    assert_eq!(with - wire, expected);
    let tcp = weir_host_sim::NetStack::KernelTcp(weir_host_sim::profile::KernelTcp::LINUX);
    assert!(one_message_ns(Some(tcp), 1 << 20) - wire > 10 * expected);
}

#[test]
fn a_one_core_kernel_tcp_receiver_caps_throughput_and_keeps_order() {
    use weir_host_sim::profile::KernelTcp;
    let t = KernelTcp::LINUX;
    let mut e = engine(no_cc(3));
    let receiver = cpu(1);
    e.attach_stack(2, receiver.clone(), weir_host_sim::NetStack::KernelTcp(t));
    let n = 200u64;
    for i in 0..n {
        for src in [0, 1] {
            e.send(0, src, 2, Frame::from(vec![i as u8; 64 << 10]));
        }
    }
    let d = e.run_until_idle(u64::MAX);
    assert_eq!(d.len() as u64, 2 * n);
    for src in [0, 1] {
        let order: Vec<u8> = d
            .iter()
            .filter(|d| d.src == src)
            .map(|d| d.frame.head[0])
            .collect();
        assert_eq!(order, (0..n).map(|i| i as u8).collect::<Vec<_>>());
    }
    // The one core did every byte's receive work: the last message cannot
    // arrive before that much CPU time has passed.
    let packets = (64u64 << 10).div_ceil(u64::from(FabricConfig::default().nic.mtu_bytes));
    let per_message = t.softirq_ns(64 << 10, packets)
        + t.syscall_ns
        + (t.copy_ps_per_byte * (64 << 10)).div_ceil(1000);
    let last = d.iter().map(|d| d.at_ns).max().unwrap();
    assert!(
        last >= 2 * n * per_message,
        "{last} < {}",
        2 * n * per_message
    );
    // And it is the bottleneck: the wire alone would have taken far less.
    let wire = 2 * n * (64 << 10) * 8 * 1_000_000_000 / 100_000_000_000;
    assert!(last > 2 * wire, "{last} vs wire {wire}");
    receiver.lock().unwrap().self_check();
}

#[test]
fn a_many_core_sender_keeps_each_pairs_order() {
    // A large message then small ones to the same peer: on four idle cores the
    // small ones' send work would end first; the stack holds them behind it.
    let mut e = engine(no_cc(2));
    let net = weir_host_sim::NetStack::KernelTcp(weir_host_sim::profile::KernelTcp::LINUX);
    e.attach_stack(0, cpu(4), net);
    e.attach_stack(1, cpu(4), net);
    e.send(0, 0, 1, Frame::from(vec![0u8; 1 << 20]));
    for i in 1..8u8 {
        e.send(0, 0, 1, Frame::from(vec![i; 64]));
    }
    let d = e.run_until_idle(u64::MAX);
    let order: Vec<u8> = d.iter().map(|d| d.frame.head[0]).collect();
    assert_eq!(order, (0..8).collect::<Vec<_>>());
}

#[test]
fn a_qp_past_its_retry_limit_fails_and_its_path_starts_afresh_while_the_other_carries_on() {
    let mut config = no_cc(2);
    config.ports_per_host = 2;
    config.nic.retry_limit = Some(3);
    let rto = config.nic.rto_ns;
    let mut e = engine(config);
    // Host 1's port 1 goes down: path 1 between the hosts is cut, path 0 is not.
    let link = e.wiring().ports[e.wiring().host_ports[1][1]].link;
    e.inject(0, Fault::LinkDown { link });
    e.advance(0);
    e.send_on(0, 0, 1, 1, Frame::from(vec![1; 10_000]));
    e.send_on(0, 0, 1, 1, Frame::from(vec![2; 100]));
    e.send_on(0, 0, 1, 0, Frame::from(vec![3; 100]));
    let d = e.advance(rto / 2);
    assert_eq!(d.len(), 1, "path 0 delivers at once");
    assert_eq!((d[0].frame.head[0], d[0].path), (3, 0));
    // Three retries, then the fourth timeout fails the QP.
    let d = e.advance(4 * rto + rto / 2);
    assert!(d.is_empty());
    assert_eq!(
        e.take_failures(),
        [Failure {
            src: 0,
            dst: 1,
            path: 1,
            messages: 2
        }]
    );
    assert_eq!(e.counters().qp_errors, 1);
    assert_eq!(
        e.qp_queue_bytes(0, 1),
        0,
        "given-up messages are not queued"
    );
    assert_eq!(e.nic_queue_bytes(0), 0);
    // The link comes back: the next message goes on a new QP (PSNs from 0
    // again) and the receiver, which had seen part of the old one, takes it.
    e.inject(4 * rto + rto / 2, Fault::LinkUp { link });
    e.send_on(5 * rto, 0, 1, 1, Frame::from(vec![4; 5_000]));
    let d = e.run_until_idle(u64::MAX);
    assert_eq!(d.len(), 1);
    assert_eq!((d[0].frame.head[0], d[0].path), (4, 1));
    assert!(e.take_failures().is_empty());
}

#[test]
fn each_path_addresses_its_own_port_and_a_dead_one_is_not_routed_around() {
    let mut config = no_cc(2);
    config.ports_per_host = 2;
    let mut e = engine(config);
    let link = e.wiring().ports[e.wiring().host_ports[1][1]].link;
    e.inject(0, Fault::LinkDown { link });
    e.advance(0);
    e.send_on(0, 0, 1, 0, Frame::from(vec![0; 100]));
    e.send_on(0, 0, 1, 1, Frame::from(vec![1; 100]));
    let d = e.run_until_idle(10_000_000);
    // Without a retry limit the QP of path 1 retries for ever: only path 0's
    // message arrives, on host 1's port 0.
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].path, 0);
    let port0 = e.wiring().host_ports[1][0];
    assert_eq!(e.ports[port0].stats.packets, 1, "one ACK out of port 0");
    assert!(e.counters().timeouts > 0);
    assert!(e.counters().dropped(telemetry::DropReason::NoRoute) > 0);
}
