//! Faults: hostile or broken peers, the wrong cluster, restarts, a peer that stops
//! reading, and misuse by the caller.

// Real sockets only: empty in the simulator build (see the crate docs).
#![cfg(not(madsim))]

mod common;

use common::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_real as tokio;
use weir_core::wire::{Frame, Message, HEADER_BYTES, MAX_BODY_BYTES, WIRE_VERSION};
use weir_core::{NodeId, RequestId, SendError, Transport, TransportError};
use weir_transport_tcp::{TcpConfig, TcpTransport};

/// Raw sockets that send a bad hello, garbage after a good hello, a header
/// announcing a 4 GiB body, or nothing at all are disconnected, and deliver
/// nothing; meanwhile another peer's frames keep flowing both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_connections_are_cut_while_a_good_peer_keeps_working() {
    init_tracing();
    let e = node_with(
        1,
        &[],
        TcpConfig {
            // Bounds the silent connection's life.
            connect_timeout: Duration::from_millis(500),
            ..config()
        },
    )
    .await;
    let addr = e.local_addr().expect("e listens");
    let good = client(2, &[(1, addr)]).await;

    // E echoes every frame to its sender; any frame from another node counts.
    let strangers = Arc::new(AtomicUsize::new(0));
    let echo = tokio::spawn({
        let (e, strangers) = (e.clone(), strangers.clone());
        async move {
            while let Ok((from, frame)) = e.recv().await {
                if from != NodeId(2) {
                    strangers.fetch_add(1, Ordering::Relaxed);
                }
                let _ = e.send(from, frame);
            }
        }
    });
    // The good peer ping-pongs until the attacks are over (and at least 200 times).
    let attacks_done = Arc::new(AtomicBool::new(false));
    let traffic = tokio::spawn({
        let (good, attacks_done) = (good.clone(), attacks_done.clone());
        async move {
            let mut i = 0;
            while i < 200 || !attacks_done.load(Ordering::Relaxed) {
                send(&good, 1, frame(i)).await;
                assert_eq!(recv(&good).await, (NodeId(1), message(i)), "echo {i}");
                i += 1;
            }
            i
        }
    });

    let attacks: [(&str, Vec<u8>); 2] = [
        (
            "bad magic",
            b"GET / HTTP/1.1\r\nHost: weir\r\n\r\n".to_vec(),
        ),
        ("bad version", {
            let mut h = hello(10, CLUSTER);
            h[8] = 99;
            h.to_vec()
        }),
    ];
    for (what, bytes) in attacks {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(&bytes).await.expect("write");
        assert_eq!(
            read_until_closed(&mut s).await,
            0,
            "{what}: no answer, closed"
        );
    }
    let after_hello: [(&str, Vec<u8>); 3] = [
        ("garbage", vec![0xa5; 64]),
        (
            "8 GiB body",
            [&[b'W', b'R', WIRE_VERSION, 0][..], &[0xff; 8]].concat(),
        ),
        ("body past the maximum", {
            let mut h = vec![b'W', b'R', WIRE_VERSION, 0];
            h.extend_from_slice(&(MAX_BODY_BYTES as u32 / 2).to_le_bytes());
            h.extend_from_slice(&(MAX_BODY_BYTES as u32 / 2 + 1).to_le_bytes());
            h
        }),
    ];
    for (node, (what, bytes)) in (11..).zip(after_hello) {
        let mut s = raw_dial(addr, node, 1).await;
        s.write_all(&bytes).await.expect("write");
        assert_eq!(read_until_closed(&mut s).await, 0, "{what}: closed");
    }
    let mut silent = TcpStream::connect(addr).await.expect("connect");
    assert_eq!(
        read_until_closed(&mut silent).await,
        0,
        "silent: closed at the timeout"
    );

    attacks_done.store(true, Ordering::Relaxed);
    let exchanged = tokio::time::timeout(DEADLINE, traffic)
        .await
        .expect("traffic finishes")
        .expect("every echo arrived in order");
    assert!(exchanged >= 200);
    assert_eq!(
        strangers.load(Ordering::Relaxed),
        0,
        "no hostile frame delivered"
    );
    e.close();
    tokio::time::timeout(DEADLINE, echo)
        .await
        .expect("echo ends on close")
        .expect("echo task");
}

/// A peer of another cluster is refused on both sides: as acceptor it gets no
/// answer, as dialer it hangs up on the answer; so does a dialer reaching an
/// address that answers as another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wrong_cluster_or_node_is_refused() {
    init_tracing();
    let a = node(1, &[]).await;
    let a_addr = a.local_addr().expect("a listens");

    // Dialing a, as a raw socket of cluster 8.
    let mut s = TcpStream::connect(a_addr).await.expect("connect");
    s.write_all(&hello(5, CLUSTER + 1)).await.expect("write");
    assert_eq!(read_until_closed(&mut s).await, 0, "no answer to cluster 8");

    // Dialing a, as a transport of cluster 8: nothing arrives, while a frame of
    // a peer of the right cluster, sent after, does.
    let other = TcpTransport::bind(
        NodeId(5),
        None,
        [(NodeId(1), a_addr)].into(),
        TcpConfig {
            cluster_id: CLUSTER + 1,
            ..config()
        },
    )
    .await
    .expect("bind");
    for i in 0..5 {
        send(&other, 1, frame(i)).await;
    }
    let good = client(6, &[(1, a_addr)]).await;
    send(&good, 1, frame(9)).await;
    assert_eq!(recv(&a).await, (NodeId(6), message(9)));
    assert_eq!(
        recv_within(&a, Duration::from_millis(300)).await,
        None,
        "nothing from cluster 8"
    );

    // a dials addresses that answer with the wrong cluster, or as the wrong node.
    for (what, answer) in [
        ("wrong cluster", hello(2, CLUSTER + 1)),
        ("wrong node", hello(3, CLUSTER)),
    ] {
        let listener = TcpListener::bind(loopback()).await.expect("bind");
        a.set_peer(NodeId(2), listener.local_addr().expect("addr"));
        send(&a, 2, frame(0)).await;
        let (mut s, _) = listener.accept().await.expect("a dials");
        let mut theirs = [0u8; 24];
        s.read_exact(&mut theirs).await.expect("a's hello");
        assert_eq!(theirs, hello(1, CLUSTER), "a says who it is");
        s.write_all(&answer).await.expect("answer");
        assert_eq!(
            read_until_closed(&mut s).await,
            0,
            "{what}: a hangs up, sends no frame"
        );
    }
}

/// Caller errors: an unknown peer, a frame past the maximum, a closed transport.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_peers_oversized_frames_and_closed_transports_are_errors() {
    init_tracing();
    let a = node(1, &[]).await;
    assert_eq!(
        a.send(NodeId(42), frame(0)),
        Err(TransportError::UnknownPeer(NodeId(42)).into())
    );
    let max = HEADER_BYTES + MAX_BODY_BYTES;
    let mut big = vec![0u8; max + 1];
    big[..4].copy_from_slice(&[b'W', b'R', WIRE_VERSION, 0]);
    assert_eq!(
        a.send(NodeId(42), big.into()),
        Err(TransportError::FrameTooLarge { len: max + 1, max }.into())
    );
    // The largest frame there is goes through.
    let b = node(2, &[]).await;
    a.set_peer(NodeId(2), b.local_addr().expect("b listens"));
    let largest = Message::ReadOk {
        req: RequestId(1),
        data: pattern(1, MAX_BODY_BYTES - 16),
    };
    let framed = largest.encode().expect("fits");
    assert!(framed.len() > max - 16);
    send(&a, 2, framed).await;
    // A malformed frame is not sent (it would break the stream for the frames
    // behind it); the next good one arrives.
    send(&a, 2, Frame::from(b"not a frame".to_vec())).await;
    send(&a, 2, frame(2)).await;
    assert_eq!(recv(&b).await, (NodeId(1), largest));
    assert_eq!(recv(&b).await, (NodeId(1), message(2)));

    a.close();
    assert_eq!(
        a.send(NodeId(2), frame(0)),
        Err(TransportError::Closed.into())
    );
    assert_eq!(a.recv().await, Err(TransportError::Closed));
}

/// A peer that goes away and comes back on the same address is reached again:
/// sends while it is away return Ok (and are lost), and after it is back a frame
/// gets through, whose reply comes back over the same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_peer_is_reached_again() {
    init_tracing();
    let b = node(2, &[]).await;
    let b_addr = b.local_addr().expect("b listens");
    let a = client(1, &[(2, b_addr)]).await;
    send(&a, 2, frame(0)).await;
    assert_eq!(recv(&b).await, (NodeId(1), message(0)));

    drop(b);
    // Sends to a peer that is down are accepted: never an error, never a wait.
    // Spread over a while, they make a notice the close, then dial and fail, and
    // back off.
    for i in 1..50 {
        send(&a, 2, frame(i)).await;
        tokio::time::sleep(Duration::from_millis(4)).await;
    }
    // Its listener closes asynchronously: retry the bind until the port is free.
    let rebind = async {
        loop {
            match TcpTransport::bind(NodeId(2), Some(b_addr), Default::default(), config()).await {
                Ok(b) => return b,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    };
    let b = tokio::time::timeout(DEADLINE, rebind)
        .await
        .expect("the address is free again");
    let reached = async {
        for i in 100.. {
            send(&a, 2, frame(i)).await;
            if let Some((from, msg)) = recv_within(&b, Duration::from_millis(20)).await {
                return (from, msg, i);
            }
        }
        unreachable!("the loop is endless")
    };
    let (from, msg, last) = tokio::time::timeout(DEADLINE, reached)
        .await
        .expect("a reaches the restarted b");
    assert_eq!(from, NodeId(1));
    let (Message::WriteOk { req } | Message::ReadOk { req, .. }) = &msg else {
        panic!("unexpected message {msg:?}")
    };
    assert!(
        (100..=last).contains(&req.0),
        "a frame sent after the restart"
    );
    assert_eq!(msg, message(req.0), "intact");
    // b has no address for a: it answers over a's connection.
    send(&b, 1, frame(7)).await;
    assert_eq!(recv(&a).await, (NodeId(2), message(7)));
}

/// A peer that stops reading pushes back: its queue never passes its budget,
/// `send` hands frames back instead of waiting, and `writable` does not resolve
/// while the peer reads nothing. Once the queue has refused frames for the stall
/// timeout without taking one, the connection is reset and its frames dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_reads_pushes_back_and_is_reset_when_stalled() {
    init_tracing();
    let listener = TcpListener::bind(loopback()).await.expect("bind");
    let stuck_addr = listener.local_addr().expect("addr");
    let (established_tx, established_rx) = tokio::sync::oneshot::channel();
    let stuck = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.expect("dialed");
        let mut theirs = [0u8; 24];
        s.read_exact(&mut theirs).await.expect("hello");
        s.write_all(&hello(9, CLUSTER)).await.expect("answer");
        // Read the first frame, so the test knows the connection is set up.
        let first = frame(0).to_contiguous();
        let mut got = vec![0u8; first.len()];
        s.read_exact(&mut got).await.expect("first frame");
        assert_eq!(got, first);
        let _ = established_tx.send(());
        // Stop reading until the test has sent everything, then see the reset.
        // The listener stays open (and never accepts again): later dials hang in
        // the hello.
        (listener, s)
    });
    let stall = Duration::from_millis(300);
    let a = TcpTransport::bind(
        NodeId(1),
        None,
        [(NodeId(9), stuck_addr)].into(),
        TcpConfig {
            send_stall_timeout: stall,
            ..config()
        },
    )
    .await
    .expect("bind");
    send(&a, 9, frame(0)).await;
    tokio::time::timeout(DEADLINE, established_rx)
        .await
        .expect("set up")
        .expect("stuck peer set up");

    let budget = TcpConfig::default().send_queue_bytes;
    let mib = Message::ReadOk {
        req: RequestId(1),
        data: pattern(1, 1 << 20),
    }
    .encode()
    .expect("encodes");
    let mut refused = 0;
    for _ in 0..200 {
        match a.send(NodeId(9), mib.clone()) {
            Ok(()) => {}
            Err(SendError::Full(back)) => {
                assert_eq!(back, mib, "the frame is handed back whole");
                refused += 1;
            }
            Err(e) => panic!("refused for good: {e}"),
        }
        assert!(
            a.queued_bytes(NodeId(9)) <= budget,
            "queue within its budget"
        );
    }
    assert!(
        refused > 100,
        "a stuck peer's queue refuses ({refused} of 200)"
    );
    assert!(a.refusing());
    assert!(
        tokio::time::timeout(stall / 3, a.writable()).await.is_err(),
        "no room while the peer reads nothing"
    );
    // At the stall timeout `writable` resolves by itself (nothing else wakes
    // it), and the next send resets the connection.
    tokio::time::timeout(stall * 3, a.writable())
        .await
        .expect("a stalled connection wakes writable");
    assert_eq!(a.send(NodeId(9), mib.clone()), Ok(()));
    assert_eq!(a.queued_bytes(NodeId(9)), 0, "the reset dropped the queue");
    tokio::time::timeout(DEADLINE, a.writable())
        .await
        .expect("a reset connection has room");

    let (_listener, mut s) = stuck.await.expect("stuck peer");
    let drained = read_until_closed(&mut s).await;
    assert!(
        drained < 100 << 20,
        "the reset dropped most of the 200 MiB ({drained} bytes got through)"
    );
}
