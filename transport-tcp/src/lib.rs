//! weir-transport-tcp: weir-core's [`Transport`](weir_core::Transport) over real
//! TCP sockets, so a weir node runs on any Linux box (the TCP/IP baseline of
//! DESIGN.md; production fabrics use RDMA).
//!
//! # Design
//!
//! - **Endpoints.** A [`TcpTransport`] is one node or client. A node listens; a
//!   client may not. Each peer with a known address is dialed on the first send
//!   to it; a peer without one (a client) is answered over the connection it
//!   opened. Connections set up with a 24-byte hello each way (magic, protocol
//!   version, node id, cluster id; see `hello.rs`), checked on both sides with a
//!   timeout; TCP_NODELAY is set on every socket, since messages are latency
//!   bound and already batched by the writer.
//! - **Frames.** A message is one `weir_core::wire::Frame`, written as is: the
//!   frame's own 12-byte header is the length prefix. Per connection, a writer
//!   task drains a queue of frames into the socket with vectored writes straight
//!   from each frame's head and payload (no payload copy in user space), and a
//!   reader task reads a header, checks it with `Message::frame_lens` (bad magic,
//!   version or lengths past `MAX_BODY_BYTES` close that connection only), reads
//!   the control part into a buffer sized once and the payload straight into
//!   page-aligned memory (the one copy of it here, counted in `weir_core::copies`),
//!   and hands the frame to a bounded inbox that `recv` drains. A hostile peer costs at most one frame of memory; a slow
//!   node makes readers wait, and TCP flow control pushes back on the senders.
//! - **Never blocking the engine.** `send` only queues: the node's single engine
//!   task awaits it, so it must not wait on a slow or dead peer. Each connection's
//!   queue has a byte budget; a connection that would pass it is reset. Frames
//!   lost to a reset or a failed connection are lost as on a failed network, and
//!   the replication engine's timeouts recover them. See [`TcpTransport`] for the
//!   full delivery model (dialing, backoff, reconnection).
//! - **Shutdown.** Every task (listener, dials, readers, writers) ends when the
//!   transport is closed or dropped: connection tasks stop when the endpoint drops
//!   their handle, the rest watch one shutdown signal.
//! - **Authentication.** With [`TcpConfig::tls`], every connection is a
//!   mutually authenticated TLS 1.3 session under the cluster's CA before its
//!   hello: a peer without a certificate of the cluster, or whose certificate
//!   does not name the node its hello claims (or the node dialed), is refused
//!   before any frame, and counted ([`TcpTransport::refused_connections`]).
//! - **Congestion signals.** Kernel TCP hides retransmissions and ECN echoes, so
//!   only an RTT sample (the hello's round trip) is reported.
//!
//! This crate uses the real tokio (the dependency `tokio_real`, renamed below).
//! weir-core's driver spawns through madsim-tokio, which in a normal build is
//! this same runtime. Under `--cfg madsim` (the simulator build of the
//! workspace) the crate is empty: it opens real sockets, which the simulator
//! must never see; there, weir-transport-sim is the transport.

#![cfg(not(madsim))]

// The workspace's `tokio` is the madsim shim; this crate needs real sockets.
extern crate tokio_real as tokio;

mod config;
mod conn;
mod hello;
mod tls;
mod transport;

pub use config::TcpConfig;
pub use tls::{member_name, peer_names, TlsError, TlsIdentity};
pub use transport::TcpTransport;
