//! The daemon's transport on the loopback NIC: real tokio, real side
//! channels over TCP, queue pairs in process.

use super::loopback::LoopFabric;
use super::*;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

fn cfg() -> RdmaConfig {
    RdmaConfig {
        cluster_id: 9,
        spin: Duration::ZERO,
        ..RdmaConfig::default()
    }
}

/// A frame of `len` payload bytes of `tag`.
fn frame(tag: u8, len: usize) -> Frame {
    crate::testing::frame(u64::from(tag), len)
}

async fn recv(t: &RdmaTransport) -> (NodeId, Frame) {
    tokio::time::timeout(Duration::from_secs(5), t.recv())
        .await
        .expect("a frame within 5 s")
        .expect("open")
}

async fn node(
    fabric: &Arc<LoopFabric>,
    id: u32,
    paths: u8,
    peers: &BTreeMap<NodeId, SocketAddr>,
) -> Arc<RdmaTransport> {
    RdmaTransport::bind(
        NodeId(id),
        Some("127.0.0.1:0".parse().unwrap()),
        peers.clone(),
        cfg(),
        fabric.nic(paths),
    )
    .await
    .unwrap()
}

/// Two nodes that know each other's addresses (each bound on port 0 first).
async fn pair(fabric: &Arc<LoopFabric>, paths: u8) -> (Arc<RdmaTransport>, Arc<RdmaTransport>) {
    let l1 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let l2 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let (a1, a2) = (l1.local_addr().unwrap(), l2.local_addr().unwrap());
    drop((l1, l2));
    let peers: BTreeMap<_, _> = [(NodeId(1), a1), (NodeId(2), a2)].into();
    let bind = |id: u32, addr: SocketAddr| {
        let (fabric, peers) = (fabric.clone(), peers.clone());
        async move {
            RdmaTransport::bind(NodeId(id), Some(addr), peers, cfg(), fabric.nic(paths))
                .await
                .unwrap()
        }
    };
    (bind(1, a1).await, bind(2, a2).await)
}

#[tokio::test]
async fn frames_of_every_size_arrive_whole_and_in_order_both_ways() {
    let fabric = LoopFabric::new();
    let (a, b) = pair(&fabric, 1).await;
    // Small frames go by SEND, 512 KiB ones by WRITE_WITH_IMM into granted
    // regions; 200 of them each way use every credit and region many times.
    let sizes = [0usize, 100, 4096, 512 << 10, 8000];
    let n = 200;
    for i in 0..n {
        let f = frame(i as u8, sizes[i % sizes.len()]);
        a.send(NodeId(2), f.clone()).unwrap();
        b.send(NodeId(1), f).unwrap();
        if i % 16 == 15 {
            // Leave the driver time to drain: the outbox holds 64 MiB at most.
            tokio::task::yield_now().await;
        }
    }
    for (rx, from) in [(&b, NodeId(1)), (&a, NodeId(2))] {
        for i in 0..n {
            let (who, f) = recv(rx).await;
            assert_eq!(who, from);
            let want = frame(i as u8, sizes[i % sizes.len()]);
            assert_eq!(f.head, want.head, "frame {i}");
            assert_eq!(f.payload, want.payload, "frame {i}");
        }
    }
    assert_eq!(
        a.counters().connects,
        2,
        "one connection each way, each counted on both sides"
    );
    assert_eq!(a.counters().frames_lost, 0);
    assert!(
        a.signals(NodeId(2)).rtt_ns_last > 0,
        "the hello's round trip"
    );
}

#[tokio::test]
async fn a_client_that_only_dials_is_answered_on_its_own_connection() {
    let fabric = LoopFabric::new();
    let n = node(&fabric, 1, 1, &BTreeMap::new()).await;
    let peers: BTreeMap<_, _> = [(NodeId(1), n.local_addr().unwrap())].into();
    let c = RdmaTransport::bind(NodeId(1000), None, peers, cfg(), fabric.nic(1))
        .await
        .unwrap();
    c.send(NodeId(1), frame(7, 4096)).unwrap();
    let (from, f) = recv(&n).await;
    assert_eq!((from, f.payload.len()), (NodeId(1000), 4096));
    n.send(NodeId(1000), frame(8, 300 << 10)).unwrap();
    let (from, f) = recv(&c).await;
    assert_eq!(
        (from, f.payload[0], f.payload.len()),
        (NodeId(1), 8, 300 << 10)
    );
    // A node cannot reach a client that never dialed: the frame is lost, counted.
    n.send(NodeId(1001), frame(9, 10)).unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while n.counters().frames_lost == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the frame to an unknown client is counted lost");
}

#[tokio::test]
async fn a_bad_hello_is_refused_and_a_good_peer_is_untouched() {
    let fabric = LoopFabric::new();
    let n = node(&fabric, 1, 1, &BTreeMap::new()).await;
    let addr = n.local_addr().unwrap();
    let good = hello::Hello {
        cluster_id: 9,
        node: NodeId(5),
        path: 0,
        params: proto::Params::default(),
        endpoint: nic::Endpoint {
            qpn: 1,
            psn: 0,
            gid: [0; 16],
            mtu: 4096,
        },
        regions_addr: 0,
        regions_rkey: 0,
    };
    for bad in [
        hello::Hello {
            cluster_id: 10,
            ..good
        }
        .encode(),
        hello::Hello { path: 3, ..good }.encode(),
        [0xff; hello::LEN],
    ] {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(&bad).await.unwrap();
        let mut b = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut b))
            .await
            .expect("closed at once");
        assert!(matches!(n, Ok(0) | Err(_)), "the side channel is closed");
    }
    assert_eq!(n.counters().refused, 3);
    let peers: BTreeMap<_, _> = [(NodeId(1), addr)].into();
    let c = RdmaTransport::bind(NodeId(1000), None, peers, cfg(), fabric.nic(1))
        .await
        .unwrap();
    c.send(NodeId(1), frame(1, 64)).unwrap();
    assert_eq!(recv(&n).await.0, NodeId(1000));
}

#[tokio::test]
async fn a_restarted_peer_is_dialed_again() {
    let fabric = LoopFabric::new();
    let (a, b) = pair(&fabric, 1).await;
    a.send(NodeId(2), frame(1, 64)).unwrap();
    recv(&b).await;
    let addr = b.local_addr().unwrap();
    drop(b);
    let peers: BTreeMap<_, _> = [(NodeId(1), a.local_addr().unwrap())].into();
    // The old endpoint's listener goes with its tasks; bind again until free.
    let b2 = loop {
        match RdmaTransport::bind(NodeId(2), Some(addr), peers.clone(), cfg(), fabric.nic(1)).await
        {
            Ok(t) => break t,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    // Frames sent while the old connection is seen to close are lost; a later
    // one arrives on a new connection.
    let got = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            a.send(NodeId(2), frame(2, 64)).unwrap();
            if let Ok(Ok(f)) = tokio::time::timeout(Duration::from_millis(50), b2.recv()).await {
                return f;
            }
        }
    })
    .await
    .expect("the restarted peer is reached");
    assert_eq!(got.0, NodeId(1));
    assert!(a.counters().resets >= 1, "{:?}", a.counters());
    assert!(a.counters().connects >= 2, "{:?}", a.counters());
}

#[tokio::test]
async fn a_port_that_goes_down_moves_the_connection_to_the_other() {
    let fabric = LoopFabric::new();
    let (a, b) = pair(&fabric, 2).await;
    a.send(NodeId(2), frame(1, 64)).unwrap();
    recv(&b).await;
    // Nodes 1 and 2 start on path (1 ^ 2) % 2 = 1. Take node 1's port 1 down.
    let a_nic = 1;
    fabric.set_port_down(a_nic, 1, true);
    let got = tokio::time::timeout(Duration::from_secs(5), async {
        let mut i = 0u8;
        loop {
            i = i.wrapping_add(1);
            a.send(NodeId(2), frame(i, 4096)).unwrap();
            if let Ok(Ok(f)) = tokio::time::timeout(Duration::from_millis(20), b.recv()).await {
                return f;
            }
        }
    })
    .await
    .expect("frames reach the peer over the other port");
    assert_eq!(got.0, NodeId(1));
    assert!(a.counters().resets >= 1, "{:?}", a.counters());
}

#[tokio::test]
async fn connections_past_the_pool_are_refused_and_the_rest_carry_on() {
    let fabric = LoopFabric::new();
    let one = cfg().link_bytes();
    let small = RdmaConfig {
        pool_bytes: one,
        ..cfg()
    };
    let n = RdmaTransport::bind(
        NodeId(1),
        Some("127.0.0.1:0".parse().unwrap()),
        BTreeMap::new(),
        small,
        fabric.nic(1),
    )
    .await
    .unwrap();
    let peers: BTreeMap<_, _> = [(NodeId(1), n.local_addr().unwrap())].into();
    let c1 = RdmaTransport::bind(NodeId(1000), None, peers.clone(), cfg(), fabric.nic(1))
        .await
        .unwrap();
    c1.send(NodeId(1), frame(1, 64)).unwrap();
    assert_eq!(recv(&n).await.0, NodeId(1000));
    let c2 = RdmaTransport::bind(NodeId(1001), None, peers, cfg(), fabric.nic(1))
        .await
        .unwrap();
    c2.send(NodeId(1), frame(2, 64)).unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while n.counters().refused == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the second connection is refused");
    c1.send(NodeId(1), frame(3, 64)).unwrap();
    let (from, f) = recv(&n).await;
    assert_eq!((from, f.payload[0]), (NodeId(1000), 3));
}

#[tokio::test]
async fn the_ports_congestion_counters_are_shared_among_peers_by_their_bytes() {
    let fabric = LoopFabric::new();
    let b = node(&fabric, 2, 1, &BTreeMap::new()).await;
    let c = node(&fabric, 3, 1, &BTreeMap::new()).await;
    let peers: BTreeMap<_, _> = [
        (NodeId(2), b.local_addr().unwrap()),
        (NodeId(3), c.local_addr().unwrap()),
    ]
    .into();
    let a_nic = fabric.nic(1);
    let a_id = a_nic.id();
    let a = RdmaTransport::bind(NodeId(1), None, peers, cfg(), a_nic)
        .await
        .unwrap();
    // Three times the bytes to node 2 as to node 3.
    for i in 0..40u8 {
        let to = if i % 4 == 3 { NodeId(3) } else { NodeId(2) };
        a.send(to, frame(i, 64 << 10)).unwrap();
    }
    for _ in 0..30 {
        recv(&b).await;
    }
    for _ in 0..10 {
        recv(&c).await;
    }
    let more = nic::PortCounters {
        cnps: 40,
        marked_in: 0,
        retransmits: 8,
    };
    fabric.add_counters(a_id, 0, more);
    let (s2, s3) = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            // Wake the driver, which reads the counters as it works.
            a.send(NodeId(2), frame(0, 0)).unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
            let (s2, s3) = (a.signals(NodeId(2)), a.signals(NodeId(3)));
            if s2.cnps + s3.cnps == 40 {
                return (s2, s3);
            }
        }
    })
    .await
    .expect("the counters are read and shared");
    assert!((28..=32).contains(&s2.cnps), "{s2:?} {s3:?}");
    assert_eq!(s2.retransmits + s3.retransmits, 8);
    assert!((5..=7).contains(&s2.retransmits), "{s2:?} {s3:?}");
    assert_eq!(s2.marked_in + s3.marked_in, 0);
}

#[tokio::test]
async fn a_peer_whose_side_channel_falls_silent_loses_its_connection() {
    use nic::{Mem as _, Nic as _};
    let fabric = LoopFabric::new();
    let n = node(&fabric, 1, 1, &BTreeMap::new()).await;
    // A peer by hand: a queue pair on the fabric with receives posted, and a
    // side channel that says hello and READY, then nothing.
    let mut peer = fabric.nic(1);
    let pd = peer.domain().unwrap();
    let params = cfg().proto.params;
    let mem = peer
        .register(&pd, 64 * params.slot_bytes as usize, true)
        .unwrap();
    let caps = nic::Caps {
        send: 16,
        recv: 64,
        inline: 0,
    };
    let (mut qp, endpoint) = peer.create_qp(&pd, 0, caps).unwrap();
    for i in 0..64u64 {
        let off = i as usize * params.slot_bytes as usize;
        // SAFETY: `mem` outlives `qp` (dropped after it, at the end).
        unsafe { peer.post_recv(&qp, i, &mem, off, params.slot_bytes) }.unwrap();
    }
    let mut s = tokio::net::TcpStream::connect(n.local_addr().unwrap())
        .await
        .unwrap();
    let mine = hello::Hello {
        cluster_id: 9,
        node: NodeId(5),
        path: 0,
        params,
        endpoint,
        regions_addr: mem.addr(0),
        regions_rkey: mem.rkey(),
    };
    s.write_all(&mine.encode()).await.unwrap();
    let mut theirs = [0u8; hello::LEN];
    s.read_exact(&mut theirs).await.unwrap();
    let theirs = hello::Hello::decode(&theirs, 9, 1).unwrap();
    peer.connect(&mut qp, 0, &theirs.endpoint).unwrap();
    s.write_all(&[hello::READY]).await.unwrap();
    // Up, then nothing: no heartbeat from this side. The node gives the
    // connection up after SILENT_MAX (5 s) and closes the side channel.
    let started = std::time::Instant::now();
    let mut b = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match s.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {} // its heartbeats
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the silent connection is closed");
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let c = n.counters();
    assert_eq!((c.connects, c.resets), (1, 1), "{c:?}");
    drop(qp);
}

/// A stand-in for TLS: plain streams, but the acceptor's check vouches only
/// for the nodes listed (as a certificate names only its node), and a dial to
/// a node not listed fails (as a certificate that does not name it would).
#[derive(Debug)]
struct Vouch(Vec<u32>);

impl secure::SideSecurity for Vouch {
    fn connect(&self, tcp: tokio::net::TcpStream, to: NodeId) -> secure::Setup<secure::Side> {
        let ok = self.0.contains(&to.0);
        Box::pin(async move {
            if !ok {
                return Err(std::io::Error::other("the certificate names another node"));
            }
            Ok(Box::new(tcp) as secure::Side)
        })
    }

    fn accept(
        &self,
        tcp: tokio::net::TcpStream,
    ) -> secure::Setup<(secure::Side, secure::Certifies)> {
        let vouched = self.0.clone();
        Box::pin(async move {
            let certifies: secure::Certifies = Box::new(move |n: NodeId| vouched.contains(&n.0));
            Ok((Box::new(tcp) as secure::Side, certifies))
        })
    }
}

#[tokio::test]
async fn a_side_channel_whose_credentials_name_another_node_is_refused() {
    let fabric = LoopFabric::new();
    let secured = |vouch: Vec<u32>| RdmaConfig {
        security: Some(Arc::new(Vouch(vouch))),
        ..cfg()
    };
    // Node 1 vouches for node 2 only.
    let n = RdmaTransport::bind(
        NodeId(1),
        Some("127.0.0.1:0".parse().unwrap()),
        BTreeMap::new(),
        secured(vec![1, 2]),
        fabric.nic(1),
    )
    .await
    .unwrap();
    let peers: BTreeMap<_, _> = [(NodeId(1), n.local_addr().unwrap())].into();
    // Node 3's hello is not vouched for: refused, counted, nothing arrives.
    let intruder = RdmaTransport::bind(
        NodeId(3),
        None,
        peers.clone(),
        secured(vec![1]),
        fabric.nic(1),
    )
    .await
    .unwrap();
    intruder.send(NodeId(1), frame(3, 64)).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while n.counters().refused == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never refused");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A dialer whose check of node 1 fails never sends its hello.
    let wary = RdmaTransport::bind(
        NodeId(2),
        None,
        peers.clone(),
        secured(vec![]),
        fabric.nic(1),
    )
    .await
    .unwrap();
    wary.send(NodeId(1), frame(4, 64)).unwrap();
    // Node 2, vouched for both ways, gets through.
    let good = RdmaTransport::bind(NodeId(2), None, peers, secured(vec![1]), fabric.nic(1))
        .await
        .unwrap();
    good.send(NodeId(1), frame(2, 64)).unwrap();
    let (from, got) = recv(&n).await;
    assert_eq!((from, got), (NodeId(2), frame(2, 64)));
    assert!(
        tokio::time::timeout(Duration::from_millis(300), n.recv())
            .await
            .is_err(),
        "nothing from node 3, nor from the wary dialer"
    );
}
