//! The endpoint: routing of sends, dialing with backoff, the listener.

use crate::config::TcpConfig;
use crate::conn::{self, Conn, ConnId, ConnTask, End, Push};
use crate::hello::{self, HandshakeError, Hello};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use weir_core::wire::{Frame, Message, HEADER_BYTES, MAX_BODY_BYTES};
use weir_core::{CongestionSignals, NodeId, SendError, Transport, TransportError};

/// Most inbound connections alive at once, set up or still in their hello. One
/// per peer is the normal case; the bound keeps a flood of connections that never
/// say hello from costing unbounded tasks and sockets.
const INBOUND_CONNECTIONS_MAX: usize = 4096;
/// Pause after a failed `accept` (out of file descriptors, say), so the listener
/// does not spin on an error that persists.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// weir's [`Transport`] over TCP: one endpoint (a node or a client).
///
/// # Delivery model
///
/// Frames to one peer travel in order over one connection. When a connection
/// fails, frames queued on it are dropped, exactly as a network failure would
/// lose them; the replication engine above recovers lost messages with its
/// timeouts and retries. So, towards a peer with a known address:
///
/// - the first send dials it; frames sent while dialing are queued;
/// - a failed dial drops the queued frames and starts a backoff (from
///   [`TcpConfig::backoff_min`], doubling per failure up to
///   [`TcpConfig::backoff_max`]); sends during the backoff are dropped and return
///   `Ok`; the first send after it dials again;
/// - a connection that breaks after it was set up (the peer restarted, say) is
///   dropped, and the next send dials at once;
/// - a connection whose queue is full ([`TcpConfig::send_queue_bytes`], or
///   [`crate::conn::SEND_QUEUE_FRAMES_MAX`] frames) refuses frames: `send` hands
///   them back ([`SendError::Full`]) and [`Transport::writable`] resolves once it
///   has room, so a slow peer pushes back on its senders and costs bounded memory;
/// - a connection that has refused frames for [`TcpConfig::send_stall_timeout`]
///   without taking one is reset (closed, its queue dropped, a warning logged) and
///   a backoff starts, so a peer that stopped reading does not hold its frames
///   for ever.
///
/// A peer with no known address (a client that dialed in and does not listen) is
/// answered over the connection it opened; a newer connection from the same node
/// id replaces the older one.
///
/// Frames are delivered whole (header and body) as read; decoding the body is the
/// node's job. A frame whose body does not decode is dropped there: its header was
/// valid, so the stream is still in sync and the connection stays up. An invalid
/// header closes that connection only.
pub struct TcpTransport {
    shared: Arc<Shared>,
    inbox: tokio::sync::Mutex<mpsc::Receiver<(NodeId, Frame)>>,
    local_addr: Option<SocketAddr>,
}

/// Received payloads held at once in aligned memory (those the node still holds:
/// queued in the inbox, or in writes in flight); past it, plain memory.
pub(crate) const RECV_POOL_BYTES: usize = 256 << 20;

/// What the endpoint's tasks share with it. Tasks hold this, never the
/// [`TcpTransport`], so dropping the transport closes it.
struct Shared {
    me: NodeId,
    config: TcpConfig,
    /// Where dial tasks are spawned: the runtime `bind` ran on.
    runtime: Handle,
    state: Mutex<State>,
    inbox: mpsc::Sender<(NodeId, Frame)>,
    /// Aligned memory that received payloads are read into.
    recv_pool: weir_core::buf::BufPool,
    /// Set to `true` once, by `close`.
    shutdown: watch::Sender<bool>,
    next_conn: AtomicU64,
    /// Inbound connections alive, set up or in their hello.
    inbound_alive: Arc<AtomicUsize>,
    /// Notified when a connection's writer made room in its queue.
    space: Arc<tokio::sync::Notify>,
    /// Inbound connections refused at set-up (a bad hello, no or a foreign
    /// certificate, one naming another node).
    refused_connections: AtomicU64,
}

/// The connection tables. Only ever locked briefly, never across an await.
#[derive(Default)]
struct State {
    closed: bool,
    /// Peers with a known address, dialed by us.
    outbound: BTreeMap<NodeId, Outbound>,
    /// Connections peers opened to us, by the node id of their hello.
    inbound: BTreeMap<NodeId, Conn>,
    /// Peers whose queue refused a frame since it last had room.
    refused: BTreeSet<NodeId>,
}

/// A peer we dial.
struct Outbound {
    addr: SocketAddr,
    link: Link,
    /// Backoff to apply at the next failure.
    backoff: Duration,
    /// Dial failures since the last connection was set up.
    failures: u32,
    /// Time the last hello took to be answered.
    rtt_ns_last: u64,
}

/// State of the connection to a peer we dial.
enum Link {
    /// No connection: the next send dials.
    Idle,
    /// Being dialed (frames queue) or set up.
    Open(Conn),
    /// Sends are dropped until then; the first send after dials.
    Backoff(Instant),
}

/// Which end opened a connection.
#[derive(Clone, Copy, Debug)]
enum Side {
    /// We dialed.
    Outbound,
    /// The peer dialed.
    Inbound,
}

impl TcpTransport {
    /// Endpoint `me`: listens on `listen` if given (port 0 picks a free port; see
    /// [`TcpTransport::local_addr`]) and dials `peers` by address when first sent
    /// to. Spawns its tasks on the current tokio runtime; they end when the
    /// transport is closed or dropped.
    pub async fn bind(
        me: NodeId,
        listen: Option<SocketAddr>,
        peers: BTreeMap<NodeId, SocketAddr>,
        config: TcpConfig,
    ) -> std::io::Result<Arc<Self>> {
        let listener = match listen {
            Some(addr) => Some(TcpListener::bind(addr).await?),
            None => None,
        };
        let local_addr = listener.as_ref().map(TcpListener::local_addr).transpose()?;
        let (inbox_tx, inbox_rx) = mpsc::channel(config.recv_queue_frames.max(1));
        let outbound = peers
            .into_iter()
            .map(|(node, addr)| (node, Outbound::new(addr, &config)))
            .collect();
        let shared = Arc::new(Shared {
            me,
            config,
            runtime: Handle::current(),
            state: Mutex::new(State {
                outbound,
                ..State::default()
            }),
            inbox: inbox_tx,
            recv_pool: weir_core::buf::BufPool::new(RECV_POOL_BYTES),
            shutdown: watch::Sender::new(false),
            next_conn: AtomicU64::new(0),
            inbound_alive: Arc::new(AtomicUsize::new(0)),
            space: Arc::new(tokio::sync::Notify::new()),
            refused_connections: AtomicU64::new(0),
        });
        if let Some(listener) = listener {
            tracing::debug!(node = %me, addr = ?local_addr, "listening");
            shared
                .runtime
                .spawn(accept_loop(Arc::clone(&shared), listener));
        }
        Ok(Arc::new(TcpTransport {
            shared,
            inbox: tokio::sync::Mutex::new(inbox_rx),
            local_addr,
        }))
    }

    /// The address this endpoint listens on, if it listens.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.local_addr
    }

    /// Add a peer's address, or replace it. A new address drops the connection to
    /// the old one (and its queued frames) and clears the backoff.
    pub fn set_peer(&self, node: NodeId, addr: SocketAddr) {
        let mut state = self.shared.lock();
        if state.closed {
            return;
        }
        match state.outbound.get(&node) {
            Some(peer) if peer.addr == addr => {}
            _ => {
                state
                    .outbound
                    .insert(node, Outbound::new(addr, &self.shared.config));
            }
        }
    }

    /// Shut down: every connection and the listener close, every task ends, and
    /// `send` and `recv` return [`TransportError::Closed`] from now on. Frames
    /// received and not yet taken are dropped. Dropping the transport does this too.
    pub fn close(&self) {
        let (outbound, inbound) = {
            let mut state = self.shared.lock();
            state.closed = true;
            (
                std::mem::take(&mut state.outbound),
                std::mem::take(&mut state.inbound),
            )
        };
        // Dropping the handles (outside the lock) stops every connection task.
        drop((outbound, inbound));
        self.shared.space.notify_waiters();
        self.shared.shutdown.send_replace(true);
    }

    /// Bytes queued towards `peer` and not yet written to a socket (on the
    /// connection we dialed and the one it opened, if any). At most
    /// [`TcpConfig::send_queue_bytes`] per connection (or one frame, if a frame
    /// is larger than that), counting a small overhead per frame.
    pub fn queued_bytes(&self, peer: NodeId) -> usize {
        let state = self.shared.lock();
        let outbound = match state.outbound.get(&peer).map(|p| &p.link) {
            Some(Link::Open(conn)) => conn.queued_bytes(),
            _ => 0,
        };
        let inbound = state.inbound.get(&peer).map_or(0, Conn::queued_bytes);
        outbound + inbound
    }

    /// Inbound connections refused at set-up so far: a bad hello, or (with
    /// TLS) no certificate of this cluster, or one naming another node.
    pub fn refused_connections(&self) -> u64 {
        self.shared.refused_connections.load(Ordering::Relaxed)
    }

    /// Whether a queue has refused a frame and not had room since.
    pub fn refusing(&self) -> bool {
        !self.shared.lock().refused.is_empty()
    }

    /// The body of `send`: never waits.
    fn send_now(&self, to: NodeId, frame: Frame) -> Result<(), SendError> {
        let max = HEADER_BYTES + MAX_BODY_BYTES;
        if frame.len() > max {
            return Err(TransportError::FrameTooLarge {
                len: frame.len(),
                max,
            }
            .into());
        }
        let mut state = self.shared.lock();
        if state.closed {
            return Err(TransportError::Closed.into());
        }
        if !well_formed(&frame) {
            // On the stream it would desynchronise the connection and lose every
            // frame behind it. Only a caller's bug makes one: say so, drop it.
            tracing::error!(peer = %to, len = frame.len(), "malformed frame not sent");
            return Ok(());
        }
        let State {
            outbound,
            inbound,
            refused,
            ..
        } = &mut *state;
        if let Some(peer) = outbound.get_mut(&to) {
            return self.shared.send_outbound(to, peer, frame).inspect_err(|_| {
                refused.insert(to);
            });
        }
        let Some(conn) = inbound.get_mut(&to) else {
            return Err(TransportError::UnknownPeer(to).into());
        };
        match conn.push(frame, self.shared.config.send_queue_bytes) {
            Push::Queued => {}
            Push::Full(frame) => {
                if !self.shared.stalled(conn) {
                    refused.insert(to);
                    return Err(SendError::Full(frame));
                }
                tracing::warn!(
                    peer = %to,
                    queued_bytes = conn.queued_bytes(),
                    stall = ?self.shared.config.send_stall_timeout,
                    "send queue full and not draining: inbound connection reset"
                );
                inbound.remove(&to);
            }
            Push::Gone(_) => {
                tracing::debug!(peer = %to, "inbound connection gone: frame dropped");
                inbound.remove(&to);
            }
        }
        Ok(())
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.close();
    }
}

impl Transport for TcpTransport {
    fn local_id(&self) -> NodeId {
        self.shared.me
    }

    /// Never waits on the network: the frame is queued, handed back (a full
    /// queue), or dropped as a network failure would drop it (see the type's
    /// delivery model).
    fn send(&self, to: NodeId, frame: Frame) -> Result<(), SendError> {
        debug_assert!(
            frame.local.is_none(),
            "a frame handed over in process sent on TCP"
        );
        self.send_now(to, frame)
    }

    async fn writable(&self) {
        let max = HEADER_BYTES + MAX_BODY_BYTES;
        let budget = self.shared.config.send_queue_bytes;
        let stall = self.shared.config.send_stall_timeout;
        loop {
            let notified = self.shared.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // When the first refusing connection will count as stalled (then the
            // caller's next send resets it).
            let stalled_at;
            {
                let mut state = self.shared.lock();
                let State {
                    outbound,
                    inbound,
                    refused,
                    ..
                } = &mut *state;
                if refused.is_empty() {
                    return;
                }
                let before = refused.len();
                let now = Instant::now();
                let mut first_stall: Option<Instant> = None;
                // A peer whose connection is gone has room: its next send dials or
                // is dropped. So has one whose connection stalled: its next send
                // resets it.
                refused.retain(|peer| {
                    let conn = match outbound.get(peer) {
                        Some(Outbound {
                            link: Link::Open(conn),
                            ..
                        }) => Some(conn),
                        Some(_) => None,
                        None => inbound.get(peer),
                    };
                    conn.is_some_and(|c| {
                        let at = c.full_since.map(|t| t + stall);
                        let stalled = at.is_some_and(|at| at <= now);
                        if let (Some(at), false) = (at, stalled) {
                            first_stall = Some(first_stall.map_or(at, |f| f.min(at)));
                        }
                        !stalled && !c.takes(max, budget)
                    })
                });
                if refused.len() < before {
                    return;
                }
                stalled_at = first_stall;
            }
            match stalled_at {
                Some(at) => {
                    tokio::select! {
                        () = &mut notified => {}
                        () = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Cancel-safe: a frame is taken from the inbox only when this returns it.
    async fn recv(&self) -> Result<(NodeId, Frame), TransportError> {
        let mut shutdown = self.shared.shutdown.subscribe();
        let mut inbox = self.inbox.lock().await;
        tokio::select! {
            biased;
            _ = shutdown.wait_for(|closed| *closed) => Err(TransportError::Closed),
            frame = inbox.recv() => frame.ok_or(TransportError::Closed),
        }
    }

    /// Kernel TCP keeps its retransmissions and ECN echoes to itself, so those
    /// stay 0. `rtt_ns_last` is the time the last hello to the peer took to be
    /// answered (0 for a peer that only dialed us).
    fn signals(&self, peer: NodeId) -> CongestionSignals {
        let state = self.shared.lock();
        state
            .outbound
            .get(&peer)
            .map_or_else(CongestionSignals::default, |p| CongestionSignals {
                rtt_ns_last: p.rtt_ns_last,
                ..CongestionSignals::default()
            })
    }
}

/// Whether `frame` is exactly one frame: a valid header, the control part it
/// announces in its head and the payload it announces as its payload.
fn well_formed(frame: &Frame) -> bool {
    frame
        .head
        .split_first_chunk::<HEADER_BYTES>()
        .is_some_and(|(header, control)| {
            Message::frame_lens(header) == Ok((control.len(), frame.payload.len()))
        })
}

impl Outbound {
    fn new(addr: SocketAddr, config: &TcpConfig) -> Self {
        Outbound {
            addr,
            link: Link::Idle,
            backoff: config.backoff_min,
            failures: 0,
            rtt_ns_last: 0,
        }
    }

    /// Stop sending until the backoff has passed; the next one is twice as long.
    fn back_off(&mut self, now: Instant, config: &TcpConfig) {
        self.link = Link::Backoff(now + self.backoff);
        self.backoff = (self.backoff * 2).min(config.backoff_max);
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock, and the tables are consistent
        // between statements, so a poisoned lock's state is still usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn hello(&self) -> Hello {
        Hello {
            node: self.me,
            cluster: self.config.cluster_id,
        }
    }

    /// A new connection's two sides.
    fn new_conn(&self) -> (Conn, ConnTask) {
        conn::pair(
            self.next_conn.fetch_add(1, Ordering::Relaxed),
            Arc::clone(&self.space),
        )
    }

    /// Whether `conn` has refused frames for the stall timeout without taking one.
    fn stalled(&self, conn: &Conn) -> bool {
        conn.full_since
            .is_some_and(|t| t.elapsed() >= self.config.send_stall_timeout)
    }

    /// Send to a peer we dial: queue on its connection, dial it, or drop the
    /// frame during a backoff.
    fn send_outbound(
        self: &Arc<Self>,
        to: NodeId,
        peer: &mut Outbound,
        frame: Frame,
    ) -> Result<(), SendError> {
        let budget_bytes = self.config.send_queue_bytes;
        let now = Instant::now();
        let frame = match &mut peer.link {
            Link::Backoff(until) if now < *until => {
                tracing::trace!(peer = %to, "in dial backoff: frame dropped");
                return Ok(());
            }
            Link::Open(conn) => match conn.push(frame, budget_bytes) {
                Push::Queued => return Ok(()),
                Push::Full(frame) => {
                    if !self.stalled(conn) {
                        return Err(SendError::Full(frame));
                    }
                    tracing::warn!(
                        peer = %to,
                        queued_bytes = conn.queued_bytes(),
                        stall = ?self.config.send_stall_timeout,
                        "send queue full and not draining: connection reset"
                    );
                    peer.back_off(now, &self.config);
                    return Ok(());
                }
                // Its task ended without a word (the runtime is shutting down):
                // dial afresh.
                Push::Gone(frame) => frame,
            },
            Link::Idle | Link::Backoff(_) => frame,
        };
        let (mut conn, task) = self.new_conn();
        // An empty queue takes any frame.
        let _ = conn.push(frame, budget_bytes);
        peer.link = Link::Open(conn);
        tracing::debug!(peer = %to, addr = %peer.addr, "dialing");
        self.runtime
            .spawn(dial_task(Arc::clone(self), to, peer.addr, task));
        Ok(())
    }

    /// The dial of connection `id` to `peer` failed: drop its queue, back off.
    fn dial_failed(&self, peer: NodeId, id: ConnId, error: &HandshakeError) {
        let mut state = self.lock();
        let Some(out) = state.outbound.get_mut(&peer) else {
            return;
        };
        let Link::Open(conn) = &out.link else { return };
        if conn.id != id {
            return;
        }
        let dropped_bytes = conn.queued_bytes();
        out.failures += 1;
        let refused = !matches!(error, HandshakeError::Io(_));
        if refused || out.failures == 1 {
            tracing::warn!(
                %peer, addr = %out.addr, %error, dropped_bytes, backoff = ?out.backoff,
                "dial failed: queued frames dropped"
            );
        } else {
            tracing::debug!(
                %peer, addr = %out.addr, %error, failures = out.failures, backoff = ?out.backoff,
                "dial failed again"
            );
        }
        out.back_off(Instant::now(), &self.config);
        drop(state);
        // A refused peer in backoff has room (its sends are dropped): wake
        // `writable`.
        self.space.notify_waiters();
    }

    /// Connection `id` to `peer` is set up. False if it was replaced or dropped
    /// meanwhile (the caller then closes it).
    fn dial_succeeded(&self, peer: NodeId, id: ConnId, rtt: Duration) -> bool {
        let mut state = self.lock();
        let Some(out) = state.outbound.get_mut(&peer) else {
            return false;
        };
        match &out.link {
            Link::Open(conn) if conn.id == id => {
                tracing::debug!(%peer, addr = %out.addr, ?rtt, "connected");
                out.backoff = self.config.backoff_min;
                out.failures = 0;
                out.rtt_ns_last = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
                true
            }
            _ => false,
        }
    }

    /// Register an inbound connection from `peer`, replacing any older one.
    /// `None` once closed.
    fn register_inbound(&self, peer: NodeId, from: SocketAddr) -> Option<ConnTask> {
        let mut state = self.lock();
        if state.closed {
            return None;
        }
        let (conn, task) = self.new_conn();
        if state.inbound.insert(peer, conn).is_some() {
            tracing::debug!(%peer, %from, "new inbound connection replaces the older one");
            drop(state);
            // The replaced connection's queue is gone: a new, empty one has room.
            self.space.notify_waiters();
        } else {
            tracing::debug!(%peer, %from, "inbound connection");
        }
        Some(task)
    }

    /// Run set-up connection `task` with `peer` on `stream` until it ends, then
    /// forget it (see [`Shared::conn_ended`]).
    async fn run_conn(
        &self,
        stream: crate::tls::Link,
        (peer, side): (NodeId, Side),
        task: ConnTask,
        shutdown: watch::Receiver<bool>,
    ) {
        let id = task.id;
        let (inbox, pool) = (self.inbox.clone(), self.recv_pool.clone());
        let end = conn::run(stream, peer, task, inbox, pool, shutdown).await;
        self.conn_ended(peer, id, side, &end);
    }

    /// Connection `id` with `peer` has ended: forget it unless it was already
    /// replaced. The next send to a peer we dial dials again at once.
    fn conn_ended(&self, peer: NodeId, id: ConnId, side: Side, end: &End) {
        match end {
            End::Stopped => tracing::debug!(%peer, ?side, "connection closed"),
            End::PeerClosed => tracing::info!(%peer, ?side, "connection closed by peer"),
            End::Write(error) | End::Read(error) => {
                tracing::info!(%peer, ?side, %error, "connection lost")
            }
            End::BadHeader(error) => {
                tracing::warn!(%peer, ?side, %error, "invalid frame header: connection closed")
            }
        }
        let mut state = self.lock();
        match side {
            Side::Outbound => {
                if let Some(out) = state.outbound.get_mut(&peer) {
                    if matches!(&out.link, Link::Open(conn) if conn.id == id) {
                        out.link = Link::Idle;
                    }
                }
            }
            Side::Inbound => {
                if state.inbound.get(&peer).is_some_and(|conn| conn.id == id) {
                    state.inbound.remove(&peer);
                }
            }
        }
        drop(state);
        // A refused peer whose connection ended has room (the next send dials or
        // is dropped): wake `writable`.
        self.space.notify_waiters();
    }
}

/// Dial `peer` at `addr` for connection `task`, then run the connection.
async fn dial_task(shared: Arc<Shared>, peer: NodeId, addr: SocketAddr, mut task: ConnTask) {
    let mut shutdown = shared.shutdown.subscribe();
    let timeout = shared.config.connect_timeout;
    let dialed = tokio::select! {
        dialed = hello::dial(addr, shared.hello(), peer, timeout, shared.config.tls.as_ref()) => dialed,
        // Reset, replaced or closed while dialing.
        _ = task.stopped() => return,
        _ = shutdown.wait_for(|closed| *closed) => return,
    };
    let id = task.id;
    match dialed {
        Err(error) => shared.dial_failed(peer, id, &error),
        Ok((stream, rtt)) => {
            if shared.dial_succeeded(peer, id, rtt) {
                shared
                    .run_conn(stream, (peer, Side::Outbound), task, shutdown)
                    .await;
            }
        }
    }
}

/// Accept connections until shutdown; each sets up and runs in its own task.
async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        let accepted = tokio::select! {
            _ = shutdown.wait_for(|closed| *closed) => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, from)) => match InboundSlot::take(&shared.inbound_alive) {
                Some(slot) => {
                    tokio::spawn(inbound_task(Arc::clone(&shared), stream, from, slot));
                }
                None => tracing::warn!(
                    %from,
                    limit = INBOUND_CONNECTIONS_MAX,
                    "too many inbound connections: refused"
                ),
            },
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::select! {
                    _ = shutdown.wait_for(|closed| *closed) => return,
                    _ = tokio::time::sleep(ACCEPT_ERROR_PAUSE) => {}
                }
            }
        }
    }
}

/// Check an inbound connection's hello, answer it, then run the connection.
async fn inbound_task(
    shared: Arc<Shared>,
    stream: TcpStream,
    from: SocketAddr,
    _slot: InboundSlot,
) {
    let mut shutdown = shared.shutdown.subscribe();
    let timeout = shared.config.connect_timeout;
    let accepted = tokio::select! {
        accepted = hello::accept(stream, shared.hello(), timeout, shared.config.tls.as_ref()) => accepted,
        _ = shutdown.wait_for(|closed| *closed) => return,
    };
    let (stream, peer) = match accepted {
        Ok(accepted) => accepted,
        Err(error) => {
            shared.refused_connections.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%from, %error, "inbound connection refused");
            return;
        }
    };
    let Some(task) = shared.register_inbound(peer, from) else {
        return;
    };
    shared
        .run_conn(stream, (peer, Side::Inbound), task, shutdown)
        .await;
}

/// One of the [`INBOUND_CONNECTIONS_MAX`] places for an inbound connection, given
/// back when dropped.
struct InboundSlot(Arc<AtomicUsize>);

impl InboundSlot {
    fn take(alive: &Arc<AtomicUsize>) -> Option<InboundSlot> {
        alive
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < INBOUND_CONNECTIONS_MAX).then_some(n + 1)
            })
            .ok()
            .map(|_| InboundSlot(Arc::clone(alive)))
    }
}

impl Drop for InboundSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}
