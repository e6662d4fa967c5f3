//! What carries frames between nodes: TCP or RDMA, as `[transport] kind`
//! says. One type for both, so the rest of the daemon is the same for each.

use std::sync::Arc;
use weir_core::transport::{CongestionSignals, SendError, Transport, TransportError};
use weir_core::wire::Frame;
use weir_core::NodeId;
use weir_transport_rdma::net::{Counters, RdmaTransport};
use weir_transport_tcp::TcpTransport;

/// A node's (or its front end's) endpoint.
pub enum Net {
    /// Over TCP.
    Tcp(Arc<TcpTransport>),
    /// Over RDMA.
    Rdma(Arc<RdmaTransport>),
}

impl Net {
    /// Whether a peer's queue refused a frame and has not had room since.
    pub fn refusing(&self) -> bool {
        match self {
            Net::Tcp(t) => t.refusing(),
            Net::Rdma(t) => t.refusing(),
        }
    }

    /// Learn a peer's replication address (a node that joined); false if the
    /// endpoint could not take it now (ask again).
    pub fn set_peer(&self, node: weir_core::NodeId, addr: std::net::SocketAddr) -> bool {
        match self {
            Net::Tcp(t) => {
                t.set_peer(node, addr);
                true
            }
            Net::Rdma(t) => t.set_peer(node, addr),
        }
    }

    /// Close every connection and end the endpoint's tasks.
    pub fn close(&self) {
        match self {
            Net::Tcp(t) => t.close(),
            Net::Rdma(t) => t.close(),
        }
    }
}

/// The RDMA connection counters of `nets` together; none if none is RDMA.
pub fn rdma_counters(nets: &[&Net]) -> Option<Counters> {
    let mut all = None::<Counters>;
    for net in nets {
        if let Net::Rdma(t) = net {
            let c = t.counters();
            let sum = all.get_or_insert_with(Counters::default);
            sum.connects += c.connects;
            sum.refused += c.refused;
            sum.resets += c.resets;
            sum.frames_lost += c.frames_lost;
        }
    }
    all
}

/// TCP connections refused at set-up by `nets` together.
pub fn tcp_refused(nets: &[&Net]) -> u64 {
    nets.iter()
        .map(|net| match net {
            Net::Tcp(t) => t.refused_connections(),
            Net::Rdma(_) => 0,
        })
        .sum()
}

impl Transport for Net {
    fn local_id(&self) -> NodeId {
        match self {
            Net::Tcp(t) => t.local_id(),
            Net::Rdma(t) => t.local_id(),
        }
    }

    fn send(&self, to: NodeId, frame: Frame) -> Result<(), SendError> {
        match self {
            Net::Tcp(t) => t.send(to, frame),
            Net::Rdma(t) => t.send(to, frame),
        }
    }

    async fn writable(&self) {
        match self {
            Net::Tcp(t) => t.writable().await,
            Net::Rdma(t) => t.writable().await,
        }
    }

    async fn recv(&self) -> Result<(NodeId, Frame), TransportError> {
        match self {
            Net::Tcp(t) => t.recv().await,
            Net::Rdma(t) => t.recv().await,
        }
    }

    fn signals(&self, peer: NodeId) -> CongestionSignals {
        match self {
            Net::Tcp(t) => t.signals(peer),
            Net::Rdma(t) => t.signals(peer),
        }
    }
}
