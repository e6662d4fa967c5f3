//! The `Transport` seam: reliable, ordered, message-oriented delivery between nodes.
//!
//! A message is one encoded [`crate::wire::Frame`]: a head (header and control
//! part) and a payload segment. RDMA maps a message to SEND or RDMA WRITE with
//! immediate into a registered buffer, the payload one scatter-gather entry; TCP to
//! a vectored write of the two; the simulator to MTU packets on its fabric. A
//! payload is `Bytes`, which can be a frozen [`crate::Buf`] from the registered
//! pool, so payloads move without copies.

use crate::ids::NodeId;
use crate::wire::Frame;
use std::future::Future;

/// Why a transport operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// The destination is not known to this transport.
    #[error("unknown peer {0}")]
    UnknownPeer(NodeId),
    /// The frame is larger than the transport accepts.
    #[error("frame of {len} bytes exceeds the maximum of {max}")]
    FrameTooLarge {
        /// Frame length.
        len: usize,
        /// Maximum frame length.
        max: usize,
    },
    /// The transport has shut down.
    #[error("transport closed")]
    Closed,
}

/// Congestion signals observed towards one peer, cumulative since start.
/// The core's congestion engine turns their deltas into a per-peer window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CongestionSignals {
    /// Congestion notification packets (RoCE) received from the peer.
    pub cnps: u64,
    /// ECN echoes (TCP) received from the peer.
    pub ecn_echoes: u64,
    /// Packets retransmitted towards the peer.
    pub retransmits: u64,
    /// Most recent round-trip time sample in nanoseconds, 0 if none yet.
    pub rtt_ns_last: u64,
}

/// Reliable, ordered message delivery between nodes.
pub trait Transport: Send + Sync + 'static {
    /// This endpoint's node id.
    fn local_id(&self) -> NodeId;

    /// Queue `frame` for delivery to `to`. Returns once the transport has taken it;
    /// delivery is reliable and in order per peer pair.
    fn send(
        &self,
        to: NodeId,
        frame: Frame,
    ) -> impl Future<Output = Result<(), TransportError>> + Send;

    /// The next frame addressed to this endpoint, with its sender.
    fn recv(&self) -> impl Future<Output = Result<(NodeId, Frame), TransportError>> + Send;

    /// Congestion signals seen towards `peer` so far.
    fn signals(&self, peer: NodeId) -> CongestionSignals;
}
