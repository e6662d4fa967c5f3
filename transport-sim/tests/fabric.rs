//! The fabric driven through the `Transport` seam on madsim time.
#![cfg(madsim)]

use madsim::runtime::{Handle, Runtime};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use weir_core::transport::{Transport, TransportError};
use weir_core::wire::Frame;
use weir_core::NodeId;
use weir_transport_sim::{Fabric, FabricConfig};

fn runtime(seed: u64) -> Runtime {
    let rt = Runtime::with_seed_and_config(seed, madsim::Config::default());
    rt.add_simulator::<Fabric>();
    rt
}

/// `senders` hosts each push `count` frames of `len` bytes to one receiver; returns
/// the simulated time until the receiver has them all.
fn fan_in(senders: u32, count: usize, len: usize) -> Duration {
    runtime(1).block_on(async move {
        let fabric = Fabric::current();
        // The engine's queues alone: no congestion control on top.
        let mut config = FabricConfig::default();
        config.nic.dcqcn = None;
        fabric.configure(config).unwrap();
        let rx = Arc::new(fabric.endpoint(NodeId(0)).unwrap());
        let txs: Vec<_> = (1..=senders)
            .map(|i| Arc::new(fabric.endpoint(NodeId(i)).unwrap()))
            .collect();
        let start = Instant::now();
        for tx in txs {
            let node = Handle::current().create_node().build();
            node.spawn(async move {
                for _ in 0..count {
                    tx.send(NodeId(0), Frame::from(vec![7u8; len]))
                        .await
                        .unwrap();
                }
            });
        }
        for _ in 0..senders as usize * count {
            let (_, frame) = rx.recv().await.unwrap();
            assert_eq!(frame.len(), len);
        }
        start.elapsed()
    })
}

#[test]
fn two_senders_at_line_rate_into_one_receiver_take_twice_as_long() {
    let one = fan_in(1, 16, 1 << 20);
    let two = fan_in(2, 16, 1 << 20);
    let ratio = two.as_secs_f64() / one.as_secs_f64();
    println!("1 sender {one:?}, 2 senders {two:?}, ratio {ratio:.3}");
    assert!(
        (ratio - 2.0).abs() <= 0.1,
        "ratio {ratio:.3} (want 2 +- 5%)"
    );
    // And one sender runs at line rate: 16 MiB of payload in about 16 MiB / 100 Gb/s.
    let ideal = (16u64 << 20) as f64 * 8.0 / 100e9;
    assert!(
        one.as_secs_f64() < ideal * 1.05,
        "{one:?} vs ideal {ideal} s"
    );
}

#[test]
fn unknown_peers_and_oversized_frames_are_typed_errors() {
    runtime(1).block_on(async {
        let fabric = Fabric::current();
        let a = fabric.endpoint(NodeId(1)).unwrap();
        let err = a
            .send(NodeId(9), Frame::from(b"x".to_vec()))
            .await
            .unwrap_err();
        assert_eq!(err, TransportError::UnknownPeer(NodeId(9)));
        let huge = Frame::from(vec![0u8; 2 << 20]);
        let err = a.send(NodeId(1), huge).await.unwrap_err();
        assert!(matches!(err, TransportError::FrameTooLarge { .. }));
        assert!(fabric.endpoint(NodeId(1)).is_err(), "a host attached twice");
    });
}

#[test]
fn congestion_signals_reach_the_transport_seam() {
    runtime(2).block_on(async {
        let fabric = Fabric::current();
        fabric.configure(FabricConfig::default()).unwrap();
        let rx = Arc::new(fabric.endpoint(NodeId(0)).unwrap());
        let txs: Vec<_> = (1..=4)
            .map(|i| Arc::new(fabric.endpoint(NodeId(i)).unwrap()))
            .collect();
        for tx in &txs {
            let tx = tx.clone();
            Handle::current().create_node().build().spawn(async move {
                for _ in 0..64 {
                    tx.send(NodeId(0), Frame::from(vec![1u8; 256 << 10]))
                        .await
                        .unwrap();
                }
            });
        }
        for _ in 0..4 * 64 {
            rx.recv().await.unwrap();
        }
        let s = txs[0].signals(NodeId(0));
        println!("4:1 signals of one sender: {s:?}");
        assert!(s.cnps > 0, "a 4:1 fan-in produced no CNPs");
        assert!(
            s.rtt_ns_last > 2_000,
            "RTT below two link delays: {}",
            s.rtt_ns_last
        );
        assert_eq!(
            txs[0].signals(NodeId(3)),
            Default::default(),
            "signals for an unused peer"
        );
    });
}
