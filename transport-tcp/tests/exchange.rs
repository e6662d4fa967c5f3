//! Frames between healthy endpoints: volume, order, integrity, routing to clients,
//! and clean shutdown.

// Real sockets only: empty in the simulator build (see the crate docs).
#![cfg(not(madsim))]

mod common;

use common::*;
use std::time::Duration;
use tokio_real as tokio;
use weir_core::wire::Message;
use weir_core::{NodeId, RequestId, Transport, TransportError};

/// Frames each way in the bulk test.
const FRAMES: u64 = 10_000;

/// Two nodes exchange 10,000 frames each way, small and up to a 1 MiB payload;
/// every frame arrives, in order, intact, from the right sender.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_frames_each_way_arrive_in_order_and_intact() {
    init_tracing();
    let a = node(1, &[]).await;
    let b = node(2, &[(1, a.local_addr().expect("a listens"))]).await;
    a.set_peer(NodeId(2), b.local_addr().expect("b listens"));

    let senders = [(a.clone(), 2), (b.clone(), 1)].map(|(from, to)| {
        tokio::spawn(async move {
            for i in 0..FRAMES {
                send(&from, to, frame(i)).await;
                // Let the writer drain now and then, as a real node's engine would
                // between bursts; the test is about delivery, not the budget.
                if i.is_multiple_of(100) {
                    tokio::task::yield_now().await;
                }
            }
        })
    });
    let receivers = [(a.clone(), 2), (b.clone(), 1)].map(|(at, from)| {
        tokio::spawn(async move {
            for i in 0..FRAMES {
                let (sender, msg) = recv(&at).await;
                assert_eq!(sender, NodeId(from), "frame {i} comes from its sender");
                assert_eq!(msg, message(i), "frame {i} arrives in order and intact");
            }
        })
    });
    for task in senders.into_iter().chain(receivers) {
        tokio::time::timeout(DEADLINE, task)
            .await
            .expect("exchange finishes before the deadline")
            .expect("no assertion failed");
    }
    assert_eq!(a.queued_bytes(NodeId(2)), 0, "a's queue drained");
    assert_eq!(b.queued_bytes(NodeId(1)), 0, "b's queue drained");
    assert!(
        a.signals(NodeId(2)).rtt_ns_last > 0,
        "the hello's round trip is reported"
    );
}

/// A client that does not listen reaches a node, and the node's replies come back
/// over the connection the client opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_an_address_is_answered_over_its_connection() {
    init_tracing();
    let n = node(1, &[]).await;
    let c = client(100, &[(1, n.local_addr().expect("n listens"))]).await;
    assert_eq!(c.local_addr(), None, "a client does not listen");
    assert_eq!(
        n.send(NodeId(100), frame(0)),
        Err(TransportError::UnknownPeer(NodeId(100)).into()),
        "the node cannot reach a client that has not dialed it"
    );

    for i in 0..100u64 {
        let ask = Message::GetMap { req: RequestId(i) };
        send(&c, 1, ask.encode().expect("encodes")).await;
        let (from, got) = recv(&n).await;
        assert_eq!((from, &got), (NodeId(100), &ask));
        let reply = Message::MapState {
            req: RequestId(i),
            state: pattern(i, 4096),
        };
        send(&n, 100, reply.encode().expect("encodes")).await;
        assert_eq!(
            recv(&c).await,
            (NodeId(1), reply),
            "reply {i} reaches the client"
        );
    }
}

/// A client that dials again under the same node id (it restarted) takes over:
/// replies go to the new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_from_the_same_node_replaces_the_old_one() {
    init_tracing();
    let n = node(1, &[]).await;
    let addr = n.local_addr().expect("n listens");
    let old = client(100, &[(1, addr)]).await;
    send(&old, 1, frame(1)).await;
    assert_eq!(recv(&n).await, (NodeId(100), message(1)));

    let new = client(100, &[(1, addr)]).await;
    send(&new, 1, frame(2)).await;
    assert_eq!(recv(&n).await, (NodeId(100), message(2)));
    send(&n, 100, frame(3)).await;
    assert_eq!(
        recv(&new).await,
        (NodeId(1), message(3)),
        "the reply reaches the new client"
    );

    // The node closed the old connection. Frames the old client sends before it
    // notices are lost, as on a broken network; then it dials again and, being
    // the newest connection from node 100, gets the replies.
    drop(new);
    let redialed = async {
        loop {
            send(&old, 1, frame(4)).await;
            if let Some(got) = recv_within(&n, Duration::from_millis(50)).await {
                return got;
            }
        }
    };
    let got = tokio::time::timeout(DEADLINE, redialed)
        .await
        .expect("the old client gets through again");
    assert_eq!(got, (NodeId(100), message(4)));
    send(&n, 100, frame(5)).await;
    assert_eq!(recv(&old).await, (NodeId(1), message(5)));
}

/// Closing or dropping endpoints ends every task they spawned: listener, dials,
/// readers and writers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_task_ends_when_the_transports_are_dropped() {
    init_tracing();
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    {
        let a = node(1, &[]).await;
        let b = node(2, &[(1, a.local_addr().expect("a listens"))]).await;
        a.set_peer(NodeId(2), b.local_addr().expect("b listens"));
        let c = client(3, &[(1, a.local_addr().expect("a listens"))]).await;
        // A peer that never answers keeps a dial pending.
        let silent = std::net::TcpListener::bind(loopback()).expect("bind");
        c.set_peer(NodeId(9), silent.local_addr().expect("addr"));
        send(&c, 9, frame(0)).await;
        for i in 0..10 {
            send(&a, 2, frame(i)).await;
            send(&b, 1, frame(i)).await;
            send(&c, 1, frame(i)).await;
        }
        for i in 0..10 {
            assert_eq!(recv(&b).await, (NodeId(1), message(i)));
        }
        for _ in 0..20 {
            recv(&a).await;
        }
        assert!(
            metrics.num_alive_tasks() > before,
            "the endpoints run tasks"
        );
        a.close();
        assert_eq!(a.recv().await, Err(TransportError::Closed));
        assert_eq!(
            a.send(NodeId(2), frame(0)),
            Err(TransportError::Closed.into())
        );
        // b and c are dropped without close.
    }
    let drained = async {
        while metrics.num_alive_tasks() > before {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(DEADLINE, drained)
        .await
        .expect("every task ends");
}
