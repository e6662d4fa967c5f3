//! The `Transport` seam: reliable, ordered, message-oriented delivery between nodes.
//!
//! A message is one encoded [`crate::wire::Frame`]: a head (header and control
//! part) and a payload segment. RDMA maps a message to SEND or RDMA WRITE with
//! immediate into a registered buffer, the payload one scatter-gather entry; TCP to
//! a vectored write of the two; the simulator to MTU packets on its fabric. A
//! payload is `Bytes`, which can be a frozen [`crate::Buf`] from the registered
//! pool, so payloads move without copies.

use crate::ids::NodeId;
use crate::wire::{EncodeError, Frame, Message};
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
    /// Data packets from the peer that arrived ECN-marked: the receiver's side of
    /// congestion on the path towards it (a RoCE NIC's notification point counts
    /// them, mlx5's `np_ecn_marked_roce_packets`; 0 where the transport cannot
    /// see them, as kernel TCP does not report them per socket). A client's read
    /// window follows it ([`crate::flow::ReadWindow`]).
    pub marked_in: u64,
}

/// Why [`Transport::send`] did not take a frame.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The queue towards the peer is full: the frame is handed back, unsent.
    /// [`Transport::writable`] says when a queue that refused one has room again.
    /// This is back-pressure, not loss: the caller keeps the frame (and its order).
    #[error("the send queue towards the peer is full")]
    Full(Frame),
    /// The transport cannot send to the peer at all.
    #[error(transparent)]
    Refused(#[from] TransportError),
}

/// Message delivery between nodes. Every implementation (the simulator's fabric,
/// TCP, RDMA) keeps this one contract:
///
/// - **Order.** Frames from one endpoint to another arrive in the order sent.
/// - **Loss only at a reset.** A frame that was taken is delivered, unless the
///   connection between the two endpoints resets (the peer restarted or was
///   unreachable, a dial failed, the network lost it for good); then frames
///   queued on it are lost, and later frames travel on a new connection. The
///   replication engine recovers lost messages with its timeouts and retries.
/// - **No waiting.** [`Transport::send`] never waits on the network or on a slow
///   peer. Each peer has a bounded queue; when it is full, `send` hands the frame
///   back ([`SendError::Full`]) and the caller decides: hold it and wait for
///   [`Transport::writable`], or give up. One congested peer never stalls traffic
///   to the others.
/// - **Signals.** [`Transport::signals`] reports what the transport saw of the
///   path to a peer (CNPs, ECN echoes, retransmits, RTT), cumulative; the node's
///   flow owner ([`crate::flow`]) records them.
pub trait Transport: Send + Sync + 'static {
    /// This endpoint's node id.
    fn local_id(&self) -> NodeId;

    /// `msg` as a frame for `to`: encoded for the wire, or, by a transport whose
    /// peer `to` lives in this process, handed over as it is
    /// ([`Frame::in_process`]: a node and its own front end skip encoding and
    /// decoding).
    fn frame(&self, to: NodeId, msg: Message) -> Result<Frame, EncodeError> {
        let _ = to;
        msg.encode()
    }

    /// Queue `frame` for delivery to `to`, or hand it back if `to`'s queue is full.
    /// Never waits. A queue that is empty takes any frame that is not too large, so
    /// no frame is refused for ever.
    fn send(&self, to: NodeId, frame: Frame) -> Result<(), SendError>;

    /// Resolves once a queue that refused a frame since the last call can take a
    /// frame of any size (at once if one can now, or if none refused).
    fn writable(&self) -> impl Future<Output = ()> + Send;

    /// The next frame addressed to this endpoint, with its sender.
    fn recv(&self) -> impl Future<Output = Result<(NodeId, Frame), TransportError>> + Send;

    /// Congestion signals seen towards `peer` so far.
    fn signals(&self, peer: NodeId) -> CongestionSignals;
}
