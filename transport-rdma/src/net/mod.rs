//! The daemon's transport: weir-core's [`Transport`] over RDMA, for
//! production (RoCE v2 clusters).
//!
//! # Design
//!
//! - **One connection per direction.** A frame to a peer with a known address
//!   goes on the connection (one RC queue pair) this side dialed; a frame to a
//!   peer without one (a client that dialed in) goes on the newest connection
//!   it opened. Two nodes so hold two queue pairs, one each way (the receiving
//!   side's only sends on it are credit updates): no race between two sides
//!   dialing at once, and each peer's frames keep their order on one queue
//!   pair, as the [`Transport`] contract asks.
//! - **Connection set-up over a side channel.** The two sides exchange a
//!   [`hello::Hello`] (cluster, node, path, the receive shape, the queue pair's
//!   number, PSN and GID, the granted regions' address and key) over a TCP
//!   connection to the node's address; the dialer says [`hello::READY`] once
//!   its queue pair can receive, and only then does the acceptor send. The
//!   side channel then stays open and carries nothing: its end, on either
//!   side, ends the connection, so a peer that restarted, or closed a
//!   connection after an error completion, is seen at once, and a stale queue
//!   pair number never receives. (Not librdmacm: the exchange rides on a plain
//!   TCP connection so that it can ride on the cluster's authenticated
//!   channel, and it needs no kernel RDMA CM.)
//! - **The messenger.** Each connection's protocol is a [`crate::proto::Conn`]:
//!   SENDs under credits into pre-posted receive slots, larger frames by
//!   WRITE_WITH_IMM into regions the receiver granted, selective signalling.
//!   This module posts what it hands out and feeds it every completion.
//! - **Memory.** Each connection registers its receive slots and granted
//!   regions (remotely writable, nothing else is) and a send ring (local only)
//!   that frames are copied into for the NIC to read: one copy per frame on
//!   each side. The connections together stay within
//!   [`RdmaConfig::pool_bytes`]; one that would pass it is refused.
//! - **Paths.** With two ports, pairs of nodes start spread over them; a
//!   connection that fails on one port is dialed again at once on the other.
//! - **Completions** by hybrid polling: the driver spins for
//!   [`RdmaConfig::spin`] after the last work, then arms the completion queue
//!   and waits on its channel.
//! - **Failures.** An error completion, a broken protocol or a closed side
//!   channel closes that connection only: its queue pair is destroyed, frames
//!   on it are lost (the replication engine's timeouts recover them, as over
//!   TCP), and the next frame dials again after a backoff.
//!
//! [`Transport`]: weir_core::Transport

mod driver;
pub mod hello;
pub mod loopback;
pub mod nic;
mod ring;
pub mod secure;
#[cfg(feature = "verbs")]
pub mod verbs_nic;

use crate::proto;
use driver::{Driver, Event};
use nic::Nic;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Notify};
use weir_core::wire::Frame;
use weir_core::{CongestionSignals, NodeId, SendError, Transport, TransportError};

/// Side channels in their hello at once; more wait in the kernel's backlog.
const HANDSHAKES_MAX: usize = 256;
/// Side-channel reports waiting for the driver.
const EVENTS_MAX: usize = 1024;

/// Settings of one [`RdmaTransport`].
#[derive(Clone, Debug)]
pub struct RdmaConfig {
    /// Cluster id (both sides of a connection must agree).
    pub cluster_id: u64,
    /// Each connection's messenger settings.
    pub proto: proto::Config,
    /// Bytes of one connection's send ring (at least one largest frame).
    pub send_ring_bytes: usize,
    /// Registered memory of all connections together, at most.
    pub pool_bytes: usize,
    /// Bytes queued towards one peer before `send` hands frames back.
    pub send_queue_bytes: usize,
    /// Frames received and not yet taken by `recv`.
    pub recv_queue_frames: usize,
    /// Longest connection set-up (dial and hellos, or hello and READY).
    pub connect_timeout: Duration,
    /// First wait after a failed connection; each failure doubles it...
    pub backoff_min: Duration,
    /// ...up to this.
    pub backoff_max: Duration,
    /// How long the driver polls the completion queue after its last work
    /// before it arms the queue and sleeps.
    pub spin: Duration,
    /// How side channels are secured; `None`: plain TCP (the cluster id is
    /// the only check).
    pub security: Option<Arc<dyn secure::SideSecurity>>,
}

impl Default for RdmaConfig {
    /// The messenger's defaults with 4 granted regions: 4.5 MiB of receive
    /// memory and a 2 MiB send ring per connection, so 256 MiB of pool holds
    /// 39 connections.
    fn default() -> Self {
        let mut proto = proto::Config::default();
        proto.params.large_slots = 4;
        RdmaConfig {
            cluster_id: 0,
            proto,
            send_ring_bytes: 2 << 20,
            pool_bytes: 256 << 20,
            send_queue_bytes: 64 << 20,
            recv_queue_frames: 64,
            connect_timeout: Duration::from_secs(2),
            backoff_min: Duration::from_millis(10),
            backoff_max: Duration::from_secs(1),
            spin: Duration::from_micros(20),
            security: None,
        }
    }
}

impl RdmaConfig {
    /// Bytes of a connection's receive slots: where its granted regions start
    /// in its receive memory.
    pub fn slots_bytes(&self) -> usize {
        let p = self.proto.params;
        usize::from(p.recv_slots) * p.slot_bytes as usize
    }

    /// Bytes of a connection's receive memory: its slots, then its regions.
    pub fn recv_bytes(&self) -> usize {
        let p = self.proto.params;
        self.slots_bytes() + usize::from(p.large_slots) * p.large_bytes as usize
    }

    /// Bytes of one connection's registered memory: receive memory and send
    /// ring.
    pub fn link_bytes(&self) -> usize {
        self.recv_bytes() + self.send_ring_bytes
    }

    /// Check the settings.
    pub fn validate(&self) -> Result<(), String> {
        self.proto.validate().map_err(|e| e.to_string())?;
        let largest = self.proto.params.large_bytes as usize;
        if self.send_ring_bytes <= largest {
            return Err(format!(
                "send_ring_bytes ({}) must exceed the largest frame ({largest})",
                self.send_ring_bytes
            ));
        }
        let link = self.link_bytes();
        if self.pool_bytes < link {
            return Err(format!(
                "pool_bytes ({}) holds no connection ({link} bytes each)",
                self.pool_bytes
            ));
        }
        if self.backoff_min.is_zero() || self.backoff_min > self.backoff_max {
            return Err("backoff_min must be above 0 and at most backoff_max".into());
        }
        Ok(())
    }
}

/// Counters of an endpoint's connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Connections that came up.
    pub connects: u64,
    /// Connections refused or closed for a peer's fault (a bad hello, a
    /// broken protocol) or for want of pool memory.
    pub refused: u64,
    /// Connections that were up and closed otherwise.
    pub resets: u64,
    /// Frames lost with a connection, or sent where none could go.
    pub frames_lost: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, Default)]
struct Queue {
    frames: VecDeque<Frame>,
    bytes: usize,
}

/// Frames `send` queued for the driver, per peer.
#[derive(Debug, Default)]
struct Outboxes {
    queues: BTreeMap<NodeId, Queue>,
    /// Peers whose queue refused a frame since it last had room.
    refused: std::collections::BTreeSet<NodeId>,
}

impl Outboxes {
    fn pop(&mut self, id: NodeId) -> Option<Frame> {
        let q = self.queues.get_mut(&id)?;
        let f = q.frames.pop_front()?;
        q.bytes -= f.len();
        Some(f)
    }
    fn push_front(&mut self, id: NodeId, f: Frame) {
        let q = self.queues.entry(id).or_default();
        q.bytes += f.len();
        q.frames.push_front(f);
    }
    fn take_all(&mut self, id: NodeId) -> usize {
        self.queues.remove(&id).map_or(0, |q| q.frames.len())
    }
    fn has(&self, id: NodeId) -> bool {
        self.queues.get(&id).is_some_and(|q| !q.frames.is_empty())
    }
}

/// What the endpoint shares with its driver and tasks.
#[derive(Debug)]
struct Shared {
    outboxes: Mutex<Outboxes>,
    counters: Mutex<Counters>,
    signals: Mutex<BTreeMap<NodeId, CongestionSignals>>,
    /// The driver has frames to move.
    work: Notify,
    /// The driver moved frames out of the outboxes, or ended.
    space: Notify,
    /// The driver ended: nothing is sent any more.
    closed: std::sync::atomic::AtomicBool,
}

/// weir's [`Transport`] over RDMA: one endpoint (a node, or a client that
/// only dials). See the [module docs](self) for the design.
pub struct RdmaTransport {
    me: NodeId,
    cfg: RdmaConfig,
    /// The driver's event queue (for peers learned later).
    events: mpsc::Sender<driver::Event>,
    shared: Arc<Shared>,
    inbox: tokio::sync::Mutex<mpsc::Receiver<(NodeId, Frame)>>,
    local_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
}

impl RdmaTransport {
    /// Endpoint `me` on `nic`: listens for side channels on `listen` if given
    /// (port 0 picks one; see [`RdmaTransport::local_addr`]) and dials `peers`
    /// when first sent to. Its tasks run on the current tokio runtime and end
    /// when it is closed or dropped.
    pub async fn bind<N: Nic>(
        me: NodeId,
        listen: Option<SocketAddr>,
        peers: BTreeMap<NodeId, SocketAddr>,
        cfg: RdmaConfig,
        nic: N,
    ) -> std::io::Result<Arc<RdmaTransport>> {
        cfg.validate()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let shared = Arc::new(Shared {
            outboxes: Mutex::default(),
            counters: Mutex::default(),
            signals: Mutex::default(),
            work: Notify::new(),
            space: Notify::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
        });
        let (shutdown, shutdown_rx) = watch::channel(false);
        let (events_tx, events_rx) = mpsc::channel(EVENTS_MAX);
        let (inbox_tx, inbox_rx) = mpsc::channel(cfg.recv_queue_frames.max(1));
        let mut local_addr = None;
        if let Some(addr) = listen {
            let listener = TcpListener::bind(addr).await?;
            local_addr = Some(listener.local_addr()?);
            let (cluster, paths) = (cfg.cluster_id, nic.paths());
            tokio::spawn(listen_loop(
                listener,
                shared.clone(),
                (cluster, paths, cfg.connect_timeout),
                cfg.security.clone(),
                events_tx.clone(),
                shutdown_rx.clone(),
            ));
        }
        let peers = peers.into_iter().filter(|(id, _)| *id != me).collect();
        let driver = Driver::new(
            me,
            cfg.clone(),
            nic,
            shared.clone(),
            peers,
            events_tx.clone(),
            inbox_tx,
        );
        tokio::spawn(driver.run(events_rx, shutdown_rx));
        Ok(Arc::new(RdmaTransport {
            me,
            cfg,
            events: events_tx,
            shared,
            inbox: tokio::sync::Mutex::new(inbox_rx),
            local_addr,
            shutdown,
        }))
    }

    /// The address its side channels listen on.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Add a peer's side-channel address, or replace it (a node that joined
    /// the cluster); dialed when first sent to. False if the driver's event
    /// queue is full or it has stopped (the caller asks again later).
    pub fn set_peer(&self, node: NodeId, addr: SocketAddr) -> bool {
        self.events
            .try_send(driver::Event::SetPeer { node, addr })
            .is_ok()
    }

    /// Whether a peer's queue refused a frame and has not had room since.
    pub fn refusing(&self) -> bool {
        !lock(&self.shared.outboxes).refused.is_empty()
    }

    /// Counters so far.
    pub fn counters(&self) -> Counters {
        *lock(&self.shared.counters)
    }

    /// Stop: the driver and every task end, every connection closes.
    pub fn close(&self) {
        let _ = self.shutdown.send(true);
    }
}

impl Drop for RdmaTransport {
    fn drop(&mut self) {
        self.close();
    }
}

/// Accept side channels and read their hellos (at most [`HANDSHAKES_MAX`] at
/// once); hand good ones to the driver.
async fn listen_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    (cluster, paths, timeout): (u64, u8, Duration),
    security: Option<Arc<dyn secure::SideSecurity>>,
    events: mpsc::Sender<Event>,
    mut shutdown: watch::Receiver<bool>,
) {
    let inflight = Arc::new(AtomicUsize::new(0));
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|c| *c) => return,
            a = listener.accept() => a,
        };
        let Ok((tcp, from)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        if inflight.load(Ordering::Relaxed) >= HANDSHAKES_MAX {
            tracing::warn!(%from, "too many RDMA side channels in their hello; refused");
            continue;
        }
        inflight.fetch_add(1, Ordering::Relaxed);
        let (events, inflight, shared) = (events.clone(), inflight.clone(), shared.clone());
        let security = security.clone();
        tokio::spawn(async move {
            tcp.set_nodelay(true).ok();
            let setup = async {
                let (mut stream, certifies): (secure::Side, secure::Certifies) = match &security {
                    Some(security) => security.accept(tcp).await?,
                    None => (Box::new(tcp), Box::new(|_| true)),
                };
                let mut b = [0u8; hello::LEN];
                stream.read_exact(&mut b).await?;
                Ok::<_, std::io::Error>((stream, b, certifies))
            };
            let read = tokio::time::timeout(timeout, setup).await;
            inflight.fetch_sub(1, Ordering::Relaxed);
            let (stream, b, certifies) = match read {
                Ok(Ok(read)) => read,
                Ok(Err(e)) if security.is_some() => {
                    // No certificate of the cluster CA (or no TLS at all).
                    tracing::warn!(%from, %e, "RDMA side channel refused");
                    lock(&shared.counters).refused += 1;
                    return;
                }
                _ => return,
            };
            match hello::Hello::decode(&b, cluster, paths) {
                Ok(hello) if certifies(hello.node) => {
                    let _ = events.send(Event::Inbound { stream, hello }).await;
                }
                Ok(hello) => {
                    tracing::warn!(%from, node = %hello.node,
                        "RDMA side channel refused: the certificate names another node");
                    lock(&shared.counters).refused += 1;
                }
                Err(e) => {
                    tracing::warn!(%from, %e, "RDMA side channel refused");
                    lock(&shared.counters).refused += 1;
                }
            }
        });
    }
}

impl Transport for RdmaTransport {
    fn local_id(&self) -> NodeId {
        self.me
    }

    fn send(&self, to: NodeId, frame: Frame) -> Result<(), SendError> {
        debug_assert!(
            frame.local.is_none(),
            "a frame handed over in process sent on RDMA"
        );
        if to == self.me {
            return Err(TransportError::UnknownPeer(to).into());
        }
        if self.shared.closed.load(Ordering::Acquire) {
            return Err(TransportError::Closed.into());
        }
        let max = self.cfg.proto.params.large_bytes as usize;
        if frame.len() > max {
            return Err(TransportError::FrameTooLarge {
                len: frame.len(),
                max,
            }
            .into());
        }
        let mut o = lock(&self.shared.outboxes);
        let q = o.queues.entry(to).or_default();
        if !q.frames.is_empty() && q.bytes + frame.len() > self.cfg.send_queue_bytes {
            o.refused.insert(to);
            return Err(SendError::Full(frame));
        }
        q.bytes += frame.len();
        q.frames.push_back(frame);
        drop(o);
        self.shared.work.notify_one();
        Ok(())
    }

    async fn writable(&self) {
        loop {
            let notified = self.shared.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.shared.closed.load(Ordering::Acquire) {
                return;
            }
            {
                let mut o = lock(&self.shared.outboxes);
                let Outboxes { queues, refused } = &mut *o;
                let budget = self.cfg.send_queue_bytes;
                // Room for a frame of any size: an empty queue, or one with
                // the largest frame's room left.
                let max = self.cfg.proto.params.large_bytes as usize;
                refused.retain(|id| {
                    queues
                        .get(id)
                        .is_some_and(|q| q.bytes + max > budget && !q.frames.is_empty())
                });
                if refused.is_empty() {
                    return;
                }
            }
            notified.await;
        }
    }

    async fn recv(&self) -> Result<(NodeId, Frame), TransportError> {
        let mut shutdown = self.shutdown.subscribe();
        let mut inbox = self.inbox.lock().await;
        tokio::select! {
            biased;
            _ = shutdown.wait_for(|closed| *closed) => Err(TransportError::Closed),
            frame = inbox.recv() => frame.ok_or(TransportError::Closed),
        }
    }

    /// `rtt_ns_last` is the round trip of the last hello to the peer; CNPs,
    /// retransmissions and marked packets are the NIC's per-port counters,
    /// shared among the peers by the bytes each sent or received over the
    /// port (an estimate: the NIC does not count per queue pair).
    fn signals(&self, peer: NodeId) -> CongestionSignals {
        lock(&self.shared.signals)
            .get(&peer)
            .copied()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests;
