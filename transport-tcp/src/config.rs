//! Settings of one TCP endpoint.

use crate::tls::TlsIdentity;
use std::time::Duration;

/// Settings of one [`crate::TcpTransport`] endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpConfig {
    /// Cluster this endpoint belongs to. Both ends of a connection must agree: it
    /// keeps a node of one cluster from joining another's traffic by a stale
    /// address. It is a guard against mistakes, not authentication.
    pub cluster_id: u64,
    /// Budget of bytes queued towards one connection and not yet handed to the
    /// kernel. Past it `send` hands frames back (back-pressure), so a slow peer
    /// costs at most this much memory and never blocks the sender.
    pub send_queue_bytes: usize,
    /// A connection whose queue has refused frames this long without taking one
    /// (the peer stopped reading) is reset, and its queued frames dropped.
    pub send_stall_timeout: Duration,
    /// Frames received and not yet taken by `recv`, over all connections. When it
    /// is full, readers stop reading and TCP flow control pushes back on senders.
    /// Memory bound: this many maximum-size frames (about 1 MiB each).
    pub recv_queue_frames: usize,
    /// Longest wait for a connection to be set up: the TCP connect and the hello
    /// exchange together, on either side.
    pub connect_timeout: Duration,
    /// Wait after a first failed dial before the next one.
    pub backoff_min: Duration,
    /// Longest wait between dials; each failure doubles the wait up to this.
    pub backoff_max: Duration,
    /// Member authentication: mutual TLS under the cluster CA. `None`: plain
    /// TCP, where the cluster id above is the only check.
    pub tls: Option<TlsIdentity>,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            cluster_id: 0,
            send_queue_bytes: 64 << 20,
            send_stall_timeout: Duration::from_secs(5),
            recv_queue_frames: 64,
            connect_timeout: Duration::from_secs(2),
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_secs(1),
            tls: None,
        }
    }
}
