//! The fabric driven through the `Transport` seam on madsim time.
#![cfg(madsim)]

use madsim::runtime::{Handle, Runtime};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use weir_core::transport::{SendError, Transport, TransportError};
use weir_core::wire::Frame;
use weir_core::NodeId;
use weir_transport_sim::{Fabric, FabricConfig};

/// Send, waiting for room while the queue towards `to` is full.
async fn send(tx: &impl Transport, to: NodeId, mut frame: Frame) {
    loop {
        match tx.send(to, frame) {
            Ok(()) => return,
            Err(SendError::Full(held)) => {
                frame = held;
                tx.writable().await;
            }
            Err(e) => panic!("send refused: {e}"),
        }
    }
}

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
                    send(&*tx, NodeId(0), Frame::from(vec![7u8; len])).await;
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
        let err = a.send(NodeId(9), Frame::from(b"x".to_vec())).unwrap_err();
        assert_eq!(err, TransportError::UnknownPeer(NodeId(9)).into());
        let huge = Frame::from(vec![0u8; 2 << 20]);
        let err = a.send(NodeId(1), huge).unwrap_err();
        assert!(matches!(
            err,
            SendError::Refused(TransportError::FrameTooLarge { .. })
        ));
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
                    send(&*tx, NodeId(0), Frame::from(vec![1u8; 256 << 10])).await;
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

/// A receiver that takes nothing pushes back on its sender: its inbox fills, the
/// frames delivered after wait and count against the sender's queue, and `send`
/// hands frames back (never waits); once the receiver takes its frames, the
/// sender's `writable` resolves and every frame arrives, in order.
#[test]
fn a_receiver_that_takes_nothing_pushes_back_on_its_sender() {
    runtime(3).block_on(async {
        let fabric = Fabric::current();
        let mut config = FabricConfig::default();
        config.nic.dcqcn = None;
        let limit = config.nic.send_queue_bytes_max;
        fabric.configure(config).unwrap();
        let rx = Arc::new(fabric.endpoint(NodeId(0)).unwrap());
        let tx = Arc::new(fabric.endpoint(NodeId(1)).unwrap());
        let len = 256usize << 10;
        let frame = move |i: u32| {
            let mut v = vec![0u8; len];
            v[..4].copy_from_slice(&i.to_le_bytes());
            Frame::from(v)
        };
        // Offer frames until one is refused, letting the fabric run in between.
        let mut accepted = 0u32;
        let refused = loop {
            match tx.send(NodeId(0), frame(accepted)) {
                Ok(()) => accepted += 1,
                Err(SendError::Full(back)) => break back,
                Err(e) => panic!("{e}"),
            }
            tokio::time::sleep(Duration::from_micros(30)).await;
            assert!(accepted < 4096, "the sender was never pushed back");
        };
        assert_eq!(
            refused,
            frame(accepted),
            "the refused frame comes back whole"
        );
        // What the sender got rid of: the receiver's inbox plus its own queue.
        let bound = weir_transport_sim::sim::INBOX_FRAMES_MAX as u64 + limit / len as u64 + 1;
        println!("accepted {accepted} frames before push-back (bound {bound})");
        assert!(u64::from(accepted) <= bound, "{accepted} frames > {bound}");
        assert!(
            tokio::time::timeout(Duration::from_millis(5), tx.writable())
                .await
                .is_err(),
            "no room while the receiver takes nothing"
        );
        let taker = {
            let rx = rx.clone();
            Handle::current().create_node().build().spawn(async move {
                for i in 0..=accepted {
                    let (_, got) = rx.recv().await.unwrap();
                    assert_eq!(got, frame(i), "frame {i} in order");
                }
            })
        };
        tx.writable().await;
        send(&*tx, NodeId(0), refused).await;
        taker.await.unwrap();
    });
}
