//! Helpers shared by the integration tests: endpoints on loopback, frames built
//! from real messages, and raw sockets that speak (or break) the hello.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use bytes::Bytes;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_real as tokio;
use weir_core::wire::Frame;
use weir_core::wire::Message;
use weir_core::{NodeId, RequestId, SendError, Transport};
use weir_transport_tcp::{TcpConfig, TcpTransport};

/// The cluster every test endpoint belongs to, unless a test says otherwise.
pub(crate) const CLUSTER: u64 = 7;
/// A failure deadline, never a speed expectation: loaded CI machines are slow.
pub(crate) const DEADLINE: Duration = Duration::from_secs(60);

/// Any free port on loopback.
pub(crate) fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// Test settings: cluster [`CLUSTER`], the rest default.
pub(crate) fn config() -> TcpConfig {
    TcpConfig {
        cluster_id: CLUSTER,
        ..TcpConfig::default()
    }
}

/// Log to the test's output when `RUST_LOG` is set (for diagnosing a failure).
pub(crate) fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A node listening on loopback that knows `peers`.
pub(crate) async fn node(id: u32, peers: &[(u32, SocketAddr)]) -> Arc<TcpTransport> {
    node_with(id, peers, config()).await
}

/// A node listening on loopback that knows `peers`, with `config`.
pub(crate) async fn node_with(
    id: u32,
    peers: &[(u32, SocketAddr)],
    config: TcpConfig,
) -> Arc<TcpTransport> {
    let peers: BTreeMap<NodeId, SocketAddr> = peers.iter().map(|&(n, a)| (NodeId(n), a)).collect();
    TcpTransport::bind(NodeId(id), Some(loopback()), peers, config)
        .await
        .expect("bind on loopback")
}

/// A client: knows `peers`, does not listen.
pub(crate) async fn client(id: u32, peers: &[(u32, SocketAddr)]) -> Arc<TcpTransport> {
    let peers: BTreeMap<NodeId, SocketAddr> = peers.iter().map(|&(n, a)| (NodeId(n), a)).collect();
    TcpTransport::bind(NodeId(id), None, peers, config())
        .await
        .expect("bind a client")
}

/// The `i`-th message of a test stream: mostly small acks, every tenth a read
/// reply of a size that varies up to 64 KiB, every thousandth a full 1 MiB
/// payload. The data is a pattern of `i`, so a swapped or damaged frame shows.
pub(crate) fn message(i: u64) -> Message {
    let len = if i % 1000 == 999 {
        1 << 20
    } else if i.is_multiple_of(10) {
        (i as usize * 7919) % (64 << 10)
    } else {
        return Message::WriteOk { req: RequestId(i) };
    };
    Message::ReadOk {
        req: RequestId(i),
        data: pattern(i, len),
    }
}

/// `len` bytes that depend on `seed`.
pub(crate) fn pattern(seed: u64, len: usize) -> Bytes {
    (0..len)
        .map(|j| (seed.wrapping_mul(31).wrapping_add(j as u64 / 7)) as u8)
        .collect::<Vec<u8>>()
        .into()
}

/// The encoded frame of [`message`]`(i)`.
pub(crate) fn frame(i: u64) -> Frame {
    message(i).encode().expect("test messages encode")
}

/// Receive the next frame, or `None` if none comes within `wait`.
pub(crate) async fn recv_within(t: &TcpTransport, wait: Duration) -> Option<(NodeId, Message)> {
    match tokio::time::timeout(wait, t.recv()).await {
        Ok(Ok((from, frame))) => {
            Some((from, Message::decode(frame).expect("frames arrive intact")))
        }
        Ok(Err(e)) => panic!("recv failed: {e}"),
        Err(_) => None,
    }
}

/// Receive the next frame; fail the test if none comes before [`DEADLINE`].
pub(crate) async fn recv(t: &TcpTransport) -> (NodeId, Message) {
    recv_within(t, DEADLINE)
        .await
        .expect("a frame before the deadline")
}

/// A hello as the crate documents it: magic, protocol version, node, cluster.
pub(crate) fn hello(node: u32, cluster: u64) -> [u8; 24] {
    let mut out = [0u8; 24];
    out[..8].copy_from_slice(b"weir-tcp");
    out[8..12].copy_from_slice(&1u32.to_le_bytes());
    out[12..16].copy_from_slice(&node.to_le_bytes());
    out[16..24].copy_from_slice(&cluster.to_le_bytes());
    out
}

/// Dial `addr` as node `node` with a raw socket and complete the hello; fails the
/// test unless the endpoint answers as `expect` in [`CLUSTER`].
pub(crate) async fn raw_dial(addr: SocketAddr, node: u32, expect: u32) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(&hello(node, CLUSTER))
        .await
        .expect("send hello");
    let mut answer = [0u8; 24];
    stream
        .read_exact(&mut answer)
        .await
        .expect("hello answered");
    assert_eq!(
        answer,
        hello(expect, CLUSTER),
        "answer is the endpoint's hello"
    );
    stream
}

/// Read until the other end closes the connection; returns the bytes read before
/// it did. Fails the test if it stays open past [`DEADLINE`].
pub(crate) async fn read_until_closed(stream: &mut TcpStream) -> usize {
    let drain = async {
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0;
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return total,
                Ok(n) => total += n,
            }
        }
    };
    tokio::time::timeout(DEADLINE, drain)
        .await
        .expect("the endpoint closes the connection")
}

/// Send `frame` to `to`, waiting for room while its queue is full; the send must
/// be accepted.
pub(crate) async fn send(t: &TcpTransport, to: u32, mut frame: Frame) {
    loop {
        match t.send(NodeId(to), frame) {
            Ok(()) => return,
            Err(SendError::Full(held)) => {
                frame = held;
                tokio::time::timeout(DEADLINE, t.writable())
                    .await
                    .expect("the queue makes room");
            }
            Err(e) => panic!("send refused: {e}"),
        }
    }
}
