//! The in-process shortcut between a node and its own NBD front end: the front
//! end's client endpoint and the node live in one process, so messages between
//! them go through a channel instead of through the kernel's loopback TCP (two
//! socket writes, two reads and two wake-ups less per request). Messages to every
//! other node still go over TCP.

use std::sync::Arc;
use tokio_real::sync::{mpsc, Mutex};
use weir_core::transport::{CongestionSignals, Transport, TransportError};
use weir_core::wire::Frame;
use weir_core::NodeId;
use weir_transport_tcp::TcpTransport;

/// One side of the splice: `inner` for everyone, a channel for `peer`.
pub struct Spliced {
    inner: Option<Arc<TcpTransport>>,
    me: NodeId,
    peer: NodeId,
    to_peer: mpsc::UnboundedSender<(NodeId, Frame)>,
    from_peer: Mutex<mpsc::UnboundedReceiver<(NodeId, Frame)>>,
}

/// Splice endpoint `a` (with its TCP transport) and endpoint `b` (with its own, if
/// it has one): frames between them skip TCP.
pub fn splice(
    a: NodeId,
    a_tcp: Option<Arc<TcpTransport>>,
    b: NodeId,
    b_tcp: Option<Arc<TcpTransport>>,
) -> (Arc<Spliced>, Arc<Spliced>) {
    let (to_b, from_a) = mpsc::unbounded_channel();
    let (to_a, from_b) = mpsc::unbounded_channel();
    let side = |inner, me, peer, to_peer, from_peer| {
        Arc::new(Spliced {
            inner,
            me,
            peer,
            to_peer,
            from_peer: Mutex::new(from_peer),
        })
    };
    (
        side(a_tcp, a, b, to_b, from_b),
        side(b_tcp, b, a, to_a, from_a),
    )
}

impl Transport for Spliced {
    fn local_id(&self) -> NodeId {
        self.me
    }

    async fn send(&self, to: NodeId, frame: Frame) -> Result<(), TransportError> {
        if to == self.peer {
            // The other side's receiver lives as long as the process's node; if it
            // is gone the frame is lost like on a closed connection.
            return self
                .to_peer
                .send((self.me, frame))
                .map_err(|_| TransportError::Closed);
        }
        match &self.inner {
            Some(tcp) => tcp.send(to, frame).await,
            None => Err(TransportError::UnknownPeer(to)),
        }
    }

    async fn recv(&self) -> Result<(NodeId, Frame), TransportError> {
        let mut local = self.from_peer.lock().await;
        match &self.inner {
            // Unbiased: a busy front end must not starve the node's TCP peers
            // (Raft, heartbeats, replica acks).
            Some(tcp) => tokio_real::select! {
                Some(m) = local.recv() => Ok(m),
                r = tcp.recv() => r,
            },
            None => local.recv().await.ok_or(TransportError::Closed),
        }
    }

    fn signals(&self, peer: NodeId) -> CongestionSignals {
        match &self.inner {
            Some(tcp) if peer != self.peer => tcp.signals(peer),
            _ => CongestionSignals::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio_real::test(crate = "tokio_real")]
    async fn frames_between_the_spliced_ends_skip_tcp_and_others_use_it() {
        let tcp_a = TcpTransport::bind(
            NodeId(1),
            Some("127.0.0.1:0".parse().unwrap()),
            Default::default(),
            Default::default(),
        )
        .await
        .unwrap();
        let (a, b) = splice(NodeId(1), Some(tcp_a.clone()), NodeId(900), None);
        b.send(NodeId(1), Frame::from(b"to the node".to_vec()))
            .await
            .unwrap();
        assert_eq!(
            a.recv().await.unwrap(),
            (NodeId(900), Frame::from(b"to the node".to_vec()))
        );
        a.send(NodeId(900), Frame::from(b"reply".to_vec()))
            .await
            .unwrap();
        assert_eq!(
            b.recv().await.unwrap(),
            (NodeId(1), Frame::from(b"reply".to_vec()))
        );
        // b has no TCP: any other peer is unknown to it.
        assert_eq!(
            b.send(NodeId(2), Frame::default()).await,
            Err(TransportError::UnknownPeer(NodeId(2)))
        );
        assert_eq!(a.local_id(), NodeId(1));
        tcp_a.close();
    }
}
