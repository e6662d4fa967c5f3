//! The in-process shortcut between a node and its own NBD front end: the front
//! end's client endpoint and the node live in one process, so messages between
//! them go through a channel instead of through the kernel's loopback TCP (two
//! socket writes, two reads and two wake-ups less per request). Messages to every
//! other node still go over the node's transport (TCP or RDMA).

use crate::net::Net;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio_real::sync::{mpsc, Mutex};
use weir_core::transport::{CongestionSignals, SendError, Transport, TransportError};
use weir_core::wire::{EncodeError, Frame, Message};
use weir_core::NodeId;

/// Frames in the channel towards the other side at most; past it `send` hands
/// frames back, as a full TCP queue would.
pub const SPLICE_FRAMES_MAX: usize = 4096;

/// One side of the splice: `inner` for everyone, a channel for `peer`.
pub struct Spliced {
    inner: Option<Arc<Net>>,
    me: NodeId,
    peer: NodeId,
    to_peer: mpsc::Sender<(NodeId, Frame)>,
    from_peer: Mutex<mpsc::Receiver<(NodeId, Frame)>>,
    /// The channel refused a frame and has not had room since.
    refused: AtomicBool,
}

/// Splice endpoint `a` (with its transport) and endpoint `b` (with its own, if
/// it has one): frames between them skip the transport.
pub fn splice(
    a: NodeId,
    a_net: Option<Arc<Net>>,
    b: NodeId,
    b_net: Option<Arc<Net>>,
) -> (Arc<Spliced>, Arc<Spliced>) {
    let (to_b, from_a) = mpsc::channel(SPLICE_FRAMES_MAX);
    let (to_a, from_b) = mpsc::channel(SPLICE_FRAMES_MAX);
    let side = |inner, me, peer, to_peer, from_peer| {
        Arc::new(Spliced {
            inner,
            me,
            peer,
            to_peer,
            from_peer: Mutex::new(from_peer),
            refused: AtomicBool::new(false),
        })
    };
    (
        side(a_net, a, b, to_b, from_b),
        side(b_net, b, a, to_a, from_a),
    )
}

impl Transport for Spliced {
    fn local_id(&self) -> NodeId {
        self.me
    }

    /// Its peer lives in this process: a message to it is handed over as it is,
    /// not encoded (and [`Message::decode`] on the other side does not parse).
    fn frame(&self, to: NodeId, msg: Message) -> Result<Frame, EncodeError> {
        if to == self.peer {
            return Ok(Frame::in_process(msg));
        }
        msg.encode()
    }

    fn send(&self, to: NodeId, frame: Frame) -> Result<(), SendError> {
        if to == self.peer {
            return match self.to_peer.try_send((self.me, frame)) {
                Ok(()) => Ok(()),
                Err(mpsc::error::TrySendError::Full((_, frame))) => {
                    self.refused.store(true, Ordering::Release);
                    Err(SendError::Full(frame))
                }
                // The other side's receiver lives as long as the process's node;
                // if it is gone the frame is lost like on a closed connection.
                Err(mpsc::error::TrySendError::Closed(_)) => Err(TransportError::Closed.into()),
            };
        }
        match &self.inner {
            Some(net) => net.send(to, frame),
            None => Err(TransportError::UnknownPeer(to).into()),
        }
    }

    async fn writable(&self) {
        let channel = async {
            // A permit means room; dropping it gives the slot back.
            let _ = self.to_peer.reserve().await;
            self.refused.store(false, Ordering::Release);
        };
        let local = self.refused.load(Ordering::Acquire);
        match &self.inner {
            Some(net) if net.refusing() && local => tokio_real::select! {
                () = channel => {}
                () = net.writable() => {}
            },
            Some(net) if net.refusing() => net.writable().await,
            _ if local => channel.await,
            _ => {}
        }
    }

    async fn recv(&self) -> Result<(NodeId, Frame), TransportError> {
        let mut local = self.from_peer.lock().await;
        match &self.inner {
            // Unbiased: a busy front end must not starve the node's TCP peers
            // (Raft, heartbeats, replica acks).
            Some(net) => tokio_real::select! {
                Some(m) = local.recv() => Ok(m),
                r = net.recv() => r,
            },
            None => local.recv().await.ok_or(TransportError::Closed),
        }
    }

    fn signals(&self, peer: NodeId) -> CongestionSignals {
        match &self.inner {
            Some(net) if peer != self.peer => net.signals(peer),
            _ => CongestionSignals::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_transport_tcp::TcpTransport;

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
        let net = Arc::new(Net::Tcp(tcp_a.clone()));
        let (a, b) = splice(NodeId(1), Some(net), NodeId(900), None);
        b.send(NodeId(1), Frame::from(b"to the node".to_vec()))
            .unwrap();
        assert_eq!(
            a.recv().await.unwrap(),
            (NodeId(900), Frame::from(b"to the node".to_vec()))
        );
        a.send(NodeId(900), Frame::from(b"reply".to_vec())).unwrap();
        assert_eq!(
            b.recv().await.unwrap(),
            (NodeId(1), Frame::from(b"reply".to_vec()))
        );
        // b has no TCP: any other peer is unknown to it.
        assert_eq!(
            b.send(NodeId(2), Frame::default()),
            Err(TransportError::UnknownPeer(NodeId(2)).into())
        );
        assert_eq!(a.local_id(), NodeId(1));
        tcp_a.close();
    }

    #[tokio_real::test(crate = "tokio_real")]
    async fn messages_to_the_spliced_peer_are_handed_over_not_encoded() {
        let (a, b) = splice(NodeId(1), None, NodeId(900), None);
        let data = bytes::Bytes::from(vec![7u8; 4096]);
        let msg = Message::fetched(weir_core::OpId(3), Ok(data.clone()));
        let frame = b.frame(NodeId(1), msg.clone()).unwrap();
        assert!(frame.head.is_empty() && frame.payload.is_empty() && frame.local.is_some());
        b.send(NodeId(1), frame).unwrap();
        let (from, frame) = a.recv().await.unwrap();
        let got = Message::decode(frame).unwrap();
        assert_eq!((from, &got), (NodeId(900), &msg));
        // The payload is the same memory, not a copy.
        assert_eq!(got.payload().unwrap().as_ptr(), data.as_ptr());
        // To anyone else, the message is encoded for the wire.
        let other = b.frame(NodeId(2), msg.clone()).unwrap();
        assert!(other.local.is_none() && !other.head.is_empty());
        assert_eq!(Message::decode(other).unwrap(), msg);
    }

    #[tokio_real::test(crate = "tokio_real")]
    async fn a_full_channel_hands_frames_back_until_the_other_side_takes_one() {
        let (a, b) = splice(NodeId(1), None, NodeId(900), None);
        // Nothing refused yet: writable at once.
        a.writable().await;
        for i in 0..SPLICE_FRAMES_MAX {
            a.send(NodeId(900), Frame::from(vec![i as u8])).unwrap();
        }
        let last = Frame::from(b"one more".to_vec());
        assert_eq!(
            a.send(NodeId(900), last.clone()),
            Err(SendError::Full(last.clone()))
        );
        let waiting = tokio_real::time::timeout(std::time::Duration::from_millis(50), a.writable());
        assert!(waiting.await.is_err(), "no room until b takes a frame");
        assert_eq!(b.recv().await.unwrap(), (NodeId(1), Frame::from(vec![0])));
        a.writable().await;
        a.send(NodeId(900), last).unwrap();
    }
}
