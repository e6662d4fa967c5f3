//! The driver: one task that owns the NIC, every connection's queue pair,
//! memory and [`Conn`], and each peer's dial state. The endpoint's `send`
//! only queues frames in an outbox and wakes it; the side-channel tasks only
//! report what they saw ([`Event`]). Everything else happens here, in order.

use super::hello::{self, Hello};
use super::nic::{Caps, Endpoint, Mem, Nic, PortCounters};
use super::ring::Ring;
use super::{Counters, RdmaConfig, Shared};

mod complete;
mod post;
mod side;
mod signals;

use super::secure::Side as SideChannel;
use crate::proto::{Backoff, Completion, Conn, SendWr};
use signals::SAMPLE_EVERY;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;
use weir_core::wire::Frame;
use weir_core::NodeId;

/// A work request id: the connection's key in the top 24 bits, then a flag
/// for receives, then the send's number or the receive slot.
const KEY_SHIFT: u32 = 40;
const RECV_BIT: u64 = 1 << 39;
const LOW_MASK: u64 = RECV_BIT - 1;
/// Connection keys wrap here (live ones are skipped).
const KEY_MAX: u32 = (1 << 24) - 1;

/// What a side-channel task saw.
#[derive(Debug)]
pub(super) enum Event {
    /// A peer dialed and said hello.
    Inbound { stream: SideChannel, hello: Hello },
    /// A dial of connection `key` ended: the peer's hello and the round trip,
    /// or why not.
    Dialed {
        key: u32,
        result: Result<(SideChannel, Hello, u64), String>,
    },
    /// The dialer of accepted connection `key` is ready to receive.
    Ready { key: u32 },
    /// The side channel of connection `key` ended.
    Closed { key: u32 },
    /// The application learned a peer's address (a node that joined).
    SetPeer { node: NodeId, addr: SocketAddr },
}

/// Which side opened a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Dialed,
    Accepted,
}

/// Aborts a side-channel task (closing its stream) when dropped.
#[derive(Debug)]
struct TaskGuard(AbortHandle);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One connection (one queue pair). Fields drop in order: the queue pair
/// before the memory it may still be using.
struct Link<N: Nic> {
    qp: N::Qp,
    recv_mem: N::Mem,
    send_mem: N::Mem,
    _pd: N::Pd,
    _task: Option<TaskGuard>,
    endpoint: Endpoint,
    peer: NodeId,
    side: Side,
    path: u8,
    /// Set once the peer's hello is known.
    conn: Option<Conn>,
    /// The peer's regions: the first one's address, their key, their size.
    remote: (u64, u32, u32),
    /// Bytes of the largest send the peer's shape allows.
    max_post: usize,
    /// May send (the peer is ready to receive).
    ready: bool,
    free_slots: Vec<u16>,
    ring: Ring,
    /// The send handed out by the connection that waits for room in the
    /// ring (the connection hands out nothing more until it is posted).
    unposted: Option<SendWr>,
    /// Receives that carry a frame, not yet fed to the connection because the
    /// inbox is full (at most its receive slots).
    parked: VecDeque<Completion>,
    /// Bytes of the pool it holds.
    bytes: usize,
    /// Bytes posted since the port's CNP or retransmission counters last
    /// grew, and received since its marked-packet counter last grew.
    tx_bytes: u64,
    rx_bytes: u64,
}

/// Where the connection this side dials to a peer stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dial {
    Idle,
    Connecting(u32),
    Up(u32),
    Backoff(Instant),
}

struct Peer {
    addr: Option<SocketAddr>,
    dial: Dial,
    backoff: Backoff,
    path: u8,
    /// The newest connection the peer opened to this side.
    accepted: Option<u32>,
}

pub(super) struct Driver<N: Nic> {
    me: NodeId,
    cfg: RdmaConfig,
    nic: N,
    shared: Arc<Shared>,
    peers: BTreeMap<NodeId, Peer>,
    links: BTreeMap<u32, Link<N>>,
    next_key: u32,
    pool_used: usize,
    /// Of it, the connections peers opened.
    inbound_used: usize,
    events_tx: mpsc::Sender<Event>,
    inbox: mpsc::Sender<(NodeId, Frame)>,
    /// Frames delivered that the inbox had no room for, oldest first. While
    /// any wait, receives that carry a frame are parked on their connection
    /// unread by its [`Conn`], which so posts no receive for them and returns
    /// no credit: the peers stop within their credits, and the driver never
    /// waits on the application (it keeps sending and completing meanwhile).
    held: VecDeque<(NodeId, Frame)>,
    /// The application dropped its end: stop.
    inbox_closed: bool,
    /// When the ports' congestion counters are read next.
    sample_due: Instant,
    /// Per path: its congestion counters as last read.
    sampled: Vec<Option<PortCounters>>,
}

fn recv_wr(key: u32, slot: u16) -> u64 {
    (u64::from(key) << KEY_SHIFT) | RECV_BIT | u64::from(slot)
}

/// A send's id carries its number's low bits only; the completion's full
/// number is the live ring piece's with those bits ([`Ring::full_wr`]: at most
/// `send_queue` sends are live, far fewer than 2^39).
fn send_wr(key: u32, wr: u64) -> u64 {
    (u64::from(key) << KEY_SHIFT) | (wr & LOW_MASK)
}

impl<N: Nic> Driver<N> {
    pub(super) fn new(
        me: NodeId,
        cfg: RdmaConfig,
        nic: N,
        shared: Arc<Shared>,
        addrs: BTreeMap<NodeId, SocketAddr>,
        events_tx: mpsc::Sender<Event>,
        inbox: mpsc::Sender<(NodeId, Frame)>,
    ) -> Driver<N> {
        let mut d = Driver {
            me,
            cfg,
            nic,
            shared,
            peers: BTreeMap::new(),
            links: BTreeMap::new(),
            next_key: 0,
            pool_used: 0,
            inbound_used: 0,
            events_tx,
            inbox,
            held: VecDeque::new(),
            inbox_closed: false,
            sample_due: Instant::now(),
            sampled: Vec::new(),
        };
        for (id, addr) in addrs {
            d.peer(id).addr = Some(addr);
        }
        d
    }

    fn peer(&mut self, id: NodeId) -> &mut Peer {
        let paths = self.nic.paths().max(1);
        let me = self.me;
        self.peers.entry(id).or_insert_with(|| Peer {
            addr: None,
            dial: Dial::Idle,
            backoff: Backoff::new(
                self.cfg.backoff_min.as_nanos() as u64,
                self.cfg.backoff_max.as_nanos() as u64,
            ),
            // Pairs start spread over the paths, the same from both sides.
            path: ((me.0 ^ id.0) % u32::from(paths)) as u8,
            accepted: None,
        })
    }

    fn count(&self, f: impl FnOnce(&mut Counters)) {
        f(&mut super::lock(&self.shared.counters));
    }

    /// A new connection with `peer` on `path`: its queue pair (INIT) and memory.
    fn new_link(&mut self, peer: NodeId, side: Side, path: u8) -> Result<u32, String> {
        let bytes = self.cfg.link_bytes();
        if side == Side::Accepted {
            // Connections peers open may not take the room this side's own
            // dials need (one per peer it knows, up to half the pool): a flood
            // of hellos cannot cut a node off from its replicas.
            let known = self.peers.values().filter(|p| p.addr.is_some()).count();
            let reserve = (known * bytes).min(self.cfg.pool_bytes / 2);
            if self.inbound_used + bytes > self.cfg.pool_bytes - reserve {
                return Err(format!(
                    "connections from peers fill their share of the registered pool \
                     ({} of {} bytes; {reserve} kept for this node's own); \
                     raise [rdma] pool_bytes",
                    self.inbound_used,
                    self.cfg.pool_bytes - reserve
                ));
            }
        }
        if self.pool_used + bytes > self.cfg.pool_bytes {
            return Err(format!(
                "the registered pool is full ({} of {} bytes in {} connections); \
                 raise [rdma] pool_bytes",
                self.pool_used,
                self.cfg.pool_bytes,
                self.links.len()
            ));
        }
        let p = self.cfg.proto.params;
        let pd = self.nic.domain().map_err(|e| e.0)?;
        let recv_mem = self
            .nic
            .register(&pd, self.cfg.recv_bytes(), true)
            .map_err(|e| e.0)?;
        let send_mem = self
            .nic
            .register(&pd, self.cfg.send_ring_bytes, false)
            .map_err(|e| e.0)?;
        let caps = Caps {
            send: u32::from(self.cfg.proto.send_queue),
            recv: u32::from(p.recv_slots),
            inline: self.cfg.proto.max_inline,
        };
        let (qp, endpoint) = self.nic.create_qp(&pd, path, caps).map_err(|e| e.0)?;
        let key = loop {
            self.next_key = if self.next_key >= KEY_MAX {
                1
            } else {
                self.next_key + 1
            };
            if !self.links.contains_key(&self.next_key) {
                break self.next_key;
            }
        };
        self.pool_used += bytes;
        if side == Side::Accepted {
            self.inbound_used += bytes;
        }
        self.links.insert(
            key,
            Link {
                qp,
                recv_mem,
                send_mem,
                _pd: pd,
                _task: None,
                endpoint,
                peer,
                side,
                path,
                conn: None,
                remote: (0, 0, 0),
                max_post: 0,
                ready: false,
                free_slots: (0..p.recv_slots).rev().collect(),
                ring: Ring::new(self.cfg.send_ring_bytes),
                unposted: None,
                parked: VecDeque::new(),
                bytes,
                tx_bytes: 0,
                rx_bytes: 0,
            },
        );
        Ok(key)
    }

    fn my_hello(&self, key: u32) -> Hello {
        let link = &self.links[&key];
        let endpoint = link.endpoint;
        Hello {
            cluster_id: self.cfg.cluster_id,
            node: self.me,
            path: link.path,
            params: self.cfg.proto.params,
            endpoint,
            regions_addr: link.recv_mem.addr(self.cfg.slots_bytes()),
            regions_rkey: link.recv_mem.rkey(),
        }
    }

    /// Start dialing `peer`.
    fn dial(&mut self, id: NodeId) {
        let Some(addr) = self.peer(id).addr else {
            return;
        };
        let path = self.peer(id).path;
        let key = match self.new_link(id, Side::Dialed, path) {
            Ok(k) => k,
            Err(why) => {
                tracing::warn!(peer = %id, %why, "cannot open an RDMA connection");
                self.failed_dial(id, false);
                return;
            }
        };
        let hello = self.my_hello(key);
        self.peer(id).dial = Dial::Connecting(key);
        let events = self.events_tx.clone();
        let (cluster, paths, timeout) = (
            self.cfg.cluster_id,
            self.nic.paths(),
            self.cfg.connect_timeout,
        );
        let security = self.cfg.security.clone();
        let dialing = side::dial(addr, hello, (cluster, paths, timeout), id, security);
        let task = tokio::spawn(async move {
            let result = dialing.await;
            let _ = events.send(Event::Dialed { key, result }).await;
        });
        self.links.get_mut(&key).expect("new")._task = Some(TaskGuard(task.abort_handle()));
    }

    fn failed_dial(&mut self, id: NodeId, was_up: bool) {
        let paths = self.nic.paths().max(1);
        let now = Instant::now();
        let p = self.peer(id);
        let mut wait = p.backoff.failed();
        if paths > 1 {
            p.path = (p.path + 1) % paths;
            if was_up {
                // A path failed under a working connection: the other one now.
                wait = 0;
            }
        }
        p.dial = if wait == 0 {
            Dial::Idle
        } else {
            Dial::Backoff(now + std::time::Duration::from_nanos(wait))
        };
    }

    /// The dial of `key` ended.
    fn dialed(&mut self, key: u32, result: Result<(SideChannel, Hello, u64), String>) {
        let Some(link) = self.links.get(&key) else {
            return;
        };
        let id = link.peer;
        let (stream, hello, rtt) = match result {
            Ok(r) => r,
            Err(why) => {
                tracing::debug!(peer = %id, %why, "RDMA dial failed");
                self.close(key, false);
                return;
            }
        };
        super::lock(&self.shared.signals)
            .entry(id)
            .or_default()
            .rtt_ns_last = rtt;
        if let Err(why) = self.start(key, &hello) {
            tracing::warn!(peer = %id, %why, "RDMA connection refused");
            self.count(|c| c.refused += 1);
            self.close(key, false);
            return;
        }
        let task = tokio::spawn(side::dialer(stream, key, self.events_tx.clone()));
        let link = self.links.get_mut(&key).expect("started");
        link._task = Some(TaskGuard(task.abort_handle()));
        link.ready = true;
        self.peer(id).dial = Dial::Up(key);
        self.peer(id).backoff.connected();
        self.count(|c| c.connects += 1);
        self.pump(key);
    }

    /// Connection `key` learnt its peer's `hello`: its [`Conn`], its receives
    /// posted, its queue pair connected.
    fn start(&mut self, key: u32, hello: &Hello) -> Result<(), String> {
        let conn = Conn::new(self.cfg.proto, hello.params).map_err(|e| e.to_string())?;
        let max_post = hello.params.large_bytes.max(hello.params.slot_bytes) as usize;
        if max_post >= self.cfg.send_ring_bytes {
            return Err(format!(
                "the peer takes frames of {max_post} bytes, past this side's send ring"
            ));
        }
        let link = self.links.get_mut(&key).expect("live");
        link.remote = (
            hello.regions_addr,
            hello.regions_rkey,
            hello.params.large_bytes,
        );
        link.max_post = max_post;
        link.conn = Some(conn);
        // Every receive is posted before the peer may send.
        for _ in 0..self.cfg.proto.params.recv_slots {
            self.pump_one(key)?;
        }
        let link = self.links.get_mut(&key).expect("live");
        self.nic
            .connect(&mut link.qp, link.path, &hello.endpoint)
            .map_err(|e| e.0)
    }

    /// A peer dialed this side.
    fn inbound(&mut self, stream: SideChannel, hello: Hello) {
        let id = hello.node;
        if id == self.me {
            return;
        }
        let key = match self.new_link(id, Side::Accepted, hello.path) {
            Ok(k) => k,
            Err(why) => {
                tracing::warn!(peer = %id, %why, "RDMA connection refused");
                self.count(|c| c.refused += 1);
                return;
            }
        };
        if let Err(why) = self.start(key, &hello) {
            tracing::warn!(peer = %id, %why, "RDMA connection refused");
            self.count(|c| c.refused += 1);
            self.close(key, false);
            return;
        }
        let mine = self.my_hello(key).encode();
        let timeout = self.cfg.connect_timeout;
        let task = tokio::spawn(side::acceptor(
            stream,
            mine,
            key,
            timeout,
            self.events_tx.clone(),
        ));
        self.links.get_mut(&key).expect("live")._task = Some(TaskGuard(task.abort_handle()));
        // A newer connection from the same peer replaces the older one.
        if let Some(old) = self.peer(id).accepted.replace(key) {
            self.close(old, false);
        }
    }

    fn ready(&mut self, key: u32) {
        let Some(link) = self.links.get_mut(&key) else {
            return;
        };
        link.ready = true;
        self.count(|c| c.connects += 1);
        self.pump(key);
    }

    /// Connection `key` is gone: its queue pair destroyed, its frames lost.
    fn close(&mut self, key: u32, refused: bool) {
        let Some(mut link) = self.links.remove(&key) else {
            return;
        };
        self.pool_used -= link.bytes;
        if link.side == Side::Accepted {
            self.inbound_used -= link.bytes;
        }
        let lost = link.conn.as_mut().map_or(0, |c| {
            c.fail();
            c.take_unfinished().len()
        }) + link.parked.len();
        let was_up = link.ready;
        tracing::debug!(me = %self.me, peer = %link.peer, side = ?link.side, key, lost, refused, "RDMA connection closed");
        self.count(|c| {
            c.frames_lost += lost as u64;
            if refused {
                c.refused += 1;
            } else if was_up {
                c.resets += 1;
            }
        });
        let id = link.peer;
        drop(link);
        let dial = self.peer(id).dial;
        match dial {
            Dial::Connecting(k) | Dial::Up(k) if k == key => self.failed_dial(id, was_up),
            _ => {}
        }
        let p = self.peer(id);
        if p.accepted == Some(key) {
            p.accepted = None;
        }
        // A client gone leaves nothing behind: the table stays as large as
        // the peers with addresses and the connections alive.
        let gone = p.addr.is_none() && p.accepted.is_none();
        if gone && !super::lock(&self.shared.outboxes).has(id) {
            self.peers.remove(&id);
        }
    }

    /// The connection a frame to `id` goes on, if one is up; `Err` with what
    /// to do otherwise.
    fn route(&mut self, id: NodeId, now: Instant) -> Route {
        let p = self.peer(id);
        if p.addr.is_none() {
            return match p.accepted {
                Some(k) => Route::Link(k),
                None => Route::Drop,
            };
        }
        match p.dial {
            Dial::Up(k) => Route::Link(k),
            Dial::Connecting(_) => Route::Wait,
            Dial::Idle => Route::Dial,
            Dial::Backoff(until) if until <= now => Route::Dial,
            Dial::Backoff(_) => Route::Drop,
        }
    }

    /// Move frames from the outboxes into their connections; whether any moved.
    fn drain_outboxes(&mut self) -> bool {
        let now = Instant::now();
        let waiting: Vec<NodeId> = {
            let o = super::lock(&self.shared.outboxes);
            o.queues
                .iter()
                .filter(|(_, q)| !q.frames.is_empty())
                .map(|(id, _)| *id)
                .collect()
        };
        let mut moved = false;
        for id in waiting {
            match self.route(id, now) {
                Route::Wait => continue,
                Route::Dial => {
                    self.dial(id);
                    continue;
                }
                Route::Drop => {
                    let n = super::lock(&self.shared.outboxes).take_all(id);
                    self.count(|c| c.frames_lost += n as u64);
                    moved = true;
                }
                Route::Link(key) => {
                    let Some(conn) = self.links.get_mut(&key).and_then(|l| l.conn.as_mut()) else {
                        continue;
                    };
                    let mut o = super::lock(&self.shared.outboxes);
                    let mut refused = 0;
                    while let Some(f) = o.pop(id) {
                        match conn.send(f) {
                            Ok(()) => moved = true,
                            // Not moved: the connection waits for credits, and
                            // its completions wake the driver again.
                            Err(weir_core::SendError::Full(f)) => {
                                o.push_front(id, f);
                                break;
                            }
                            Err(weir_core::SendError::Refused(e)) => {
                                moved = true;
                                refused += 1;
                                tracing::warn!(peer = %id, %e, "frame refused by its RDMA connection");
                            }
                        }
                    }
                    drop(o);
                    self.count(|c| c.frames_lost += refused);
                    self.pump(key);
                }
            }
        }
        if moved {
            self.shared.space.notify_waiters();
        }
        moved
    }

    fn event(&mut self, ev: Event) {
        match ev {
            Event::Inbound { stream, hello } => self.inbound(stream, hello),
            Event::Dialed { key, result } => self.dialed(key, result),
            Event::Ready { key } => self.ready(key),
            Event::Closed { key } => self.close(key, false),
            Event::SetPeer { node, addr } => {
                if node != self.me {
                    // Dialed from the next frame on; a live connection stays.
                    self.peer(node).addr = Some(addr);
                }
            }
        }
    }

    /// When a peer in backoff with frames waiting may be dialed again.
    fn next_deadline(&self) -> Option<Instant> {
        let o = super::lock(&self.shared.outboxes);
        self.peers
            .iter()
            .filter_map(|(id, p)| match p.dial {
                Dial::Backoff(t) if o.has(*id) => Some(t),
                _ => None,
            })
            .min()
    }

    /// Run until `shutdown`: completions by hybrid polling (spin for
    /// `cfg.spin`, then arm and wait).
    pub(super) async fn run(self, events: mpsc::Receiver<Event>, shutdown: watch::Receiver<bool>) {
        let shared = self.shared.clone();
        self.run_loop(events, shutdown).await;
        // Whatever ended it (shutdown, the application gone, a NIC failure),
        // the endpoint is closed: sends are refused, waiters woken.
        shared
            .closed
            .store(true, std::sync::atomic::Ordering::Release);
        shared.space.notify_waiters();
    }

    async fn run_loop(
        mut self,
        mut events: mpsc::Receiver<Event>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut wcs = Vec::new();
        let mut idle_since = Instant::now();
        loop {
            if *shutdown.borrow() {
                return;
            }
            let mut busy = false;
            let now = Instant::now();
            if now >= self.sample_due {
                self.sample_due = now + SAMPLE_EVERY;
                self.sample();
            }
            while let Ok(ev) = events.try_recv() {
                self.event(ev);
                busy = true;
            }
            if let Err(e) = self.nic.poll(&mut wcs) {
                tracing::error!(%e, "RDMA completion queue failed; the transport stops");
                return;
            }
            busy |= !wcs.is_empty();
            for wc in wcs.drain(..) {
                self.completion(wc);
            }
            busy |= self.drain_outboxes();
            busy |= self.unhold();
            if self.inbox_closed {
                return;
            }
            if busy {
                idle_since = Instant::now();
                tokio::task::yield_now().await;
                continue;
            }
            if idle_since.elapsed() < self.cfg.spin {
                tokio::task::yield_now().await;
                continue;
            }
            if let Err(e) = self.nic.arm() {
                tracing::error!(%e, "arming the RDMA completion queue failed; the transport stops");
                return;
            }
            self.nic.poll(&mut wcs).ok();
            if !wcs.is_empty() {
                continue;
            }
            let deadline = self.next_deadline();
            let sleep = async {
                match deadline {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            let inbox = self.inbox.clone();
            let room = async {
                if self.held.is_empty() {
                    std::future::pending::<()>().await;
                }
                // A permit dropped at once: room for the next try_send (this
                // task is the only sender).
                let _ = inbox.reserve().await;
            };
            let ev = tokio::select! {
                _ = room => None,
                _ = shutdown.changed() => None,
                r = self.nic.wait() => {
                    if let Err(e) = r {
                        tracing::error!(%e, "waiting on the RDMA completion channel failed; the transport stops");
                        return;
                    }
                    None
                }
                ev = events.recv() => ev,
                _ = self.shared.work.notified() => None,
                _ = sleep => None,
            };
            if let Some(ev) = ev {
                self.event(ev);
            }
        }
    }
}

enum Route {
    Link(u32),
    Wait,
    Dial,
    Drop,
}
