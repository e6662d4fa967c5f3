//! The in-process shortcut between a node and its own front end: the front
//! end's endpoint and the node live in one process, so messages between them
//! go through a channel, handed over as they are (no encoding, no loopback
//! socket), while messages to every other node still go over the endpoint's
//! own transport (TCP, RDMA or the simulated fabric).

use crate::ids::NodeId;
use crate::transport::{CongestionSignals, SendError, Transport, TransportError};
use crate::wire::{EncodeError, Frame, Message};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, Mutex};

/// Frames in the channel towards the other side at most; past it `send` hands
/// frames back, as a full TCP queue would.
pub const SPLICE_FRAMES_MAX: usize = 4096;

/// One side of the splice: `inner` for everyone, a channel for `peer`.
pub struct Spliced<T> {
    inner: Option<Arc<T>>,
    me: NodeId,
    peer: NodeId,
    to_peer: mpsc::Sender<(NodeId, Frame)>,
    from_peer: Mutex<mpsc::Receiver<(NodeId, Frame)>>,
    /// The channel refused a frame and has not had room since.
    refused: AtomicBool,
    /// `inner` refused a frame and has not said it has room since.
    inner_refused: AtomicBool,
    /// Whether the next `recv` looks at the channel before `inner`.
    local_first: AtomicBool,
}

/// Splice endpoint `a` (with its transport) and endpoint `b` (with its own, if
/// it has one): frames between them skip the transport.
pub fn splice<T: Transport>(
    a: NodeId,
    a_net: Option<Arc<T>>,
    b: NodeId,
    b_net: Option<Arc<T>>,
) -> (Arc<Spliced<T>>, Arc<Spliced<T>>) {
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
            inner_refused: AtomicBool::new(false),
            local_first: AtomicBool::new(true),
        })
    };
    (
        side(a_net, a, b, to_b, from_b),
        side(b_net, b, a, to_a, from_a),
    )
}

impl<T> Spliced<T> {
    /// The transport to everyone but the peer.
    pub fn inner(&self) -> Option<&Arc<T>> {
        self.inner.as_ref()
    }
}

impl<T: Transport> Transport for Spliced<T> {
    fn local_id(&self) -> NodeId {
        self.me
    }

    /// Its peer lives in this process: a message to it is handed over as it is,
    /// not encoded (and [`Message::decode`] on the other side does not parse).
    fn frame(&self, to: NodeId, msg: Message) -> Result<Frame, EncodeError> {
        if to == self.peer {
            return Ok(Frame::in_process(msg));
        }
        match &self.inner {
            Some(net) => net.frame(to, msg),
            None => msg.encode(),
        }
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
            Some(net) => {
                let sent = net.send(to, frame);
                if matches!(sent, Err(SendError::Full(_))) {
                    self.inner_refused.store(true, Ordering::Release);
                }
                sent
            }
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
        let inner = self.inner_refused.load(Ordering::Acquire);
        let net = async {
            if let Some(net) = &self.inner {
                net.writable().await;
            }
            self.inner_refused.store(false, Ordering::Release);
        };
        match (local, inner) {
            (true, true) => tokio::select! {
                biased;
                () = channel => {}
                () = net => {}
            },
            (true, false) => channel.await,
            (false, true) => net.await,
            (false, false) => {}
        }
    }

    async fn recv(&self) -> Result<(NodeId, Frame), TransportError> {
        let mut local = self.from_peer.lock().await;
        let Some(net) = &self.inner else {
            return local.recv().await.ok_or(TransportError::Closed);
        };
        // Each side first in turn: a busy front end must not starve the
        // node's other peers (Raft, heartbeats, replica acks), nor they it;
        // `biased`, so no draw from tokio's unseeded RNG (the simulator
        // replays a run from its seed).
        if self.local_first.fetch_xor(true, Ordering::Relaxed) {
            tokio::select! {
                biased;
                Some(m) = local.recv() => Ok(m),
                r = net.recv() => r,
            }
        } else {
            tokio::select! {
                biased;
                r = net.recv() => r,
                Some(m) = local.recv() => Ok(m),
            }
        }
    }

    fn signals(&self, peer: NodeId) -> CongestionSignals {
        match &self.inner {
            Some(net) if peer != self.peer => net.signals(peer),
            _ => CongestionSignals::default(),
        }
    }
}
