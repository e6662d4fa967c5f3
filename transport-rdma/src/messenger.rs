//! A node's messenger: a [`Conn`] per peer, and the connection manager that sets
//! each up, tears it down and sets it up again, sans-IO.
//!
//! It speaks in *images*: one per work request or connection-manager message,
//! each a [`Frame`] for a wire that keeps order between two hosts and says, in
//! order, whether each image arrived (the simulator's RC queue pairs; see
//! [`image`]). A real verbs backend posts the same work requests and runs the
//! same manager over librdmacm.
//!
//! Connections. Each side numbers its connections (`gen`, unique across its
//! restarts: the host gives each incarnation a `boot`). A side that has a frame
//! for a peer it has no connection with sends `Connect{gen, params}`; the peer
//! makes a fresh [`Conn`] (its receives posted first) and answers
//! `Accept{gen, to, params}`; every later message names both numbers, and one
//! naming a connection that no longer exists is dropped and answered with
//! `Reset{to}` (a stale queue pair number). Two sides connecting at once: the
//! lower node id keeps its own attempt, and a `Connect` numbered at or below
//! the peer's connection this side already took up is one the peer gave up (it
//! can arrive late, on the other path). A `Connect` from a peer that was up
//! means it restarted or failed: its old connection is given up. A connection
//! that fails (a hostile message, an error completion, an image lost) or a
//! `Reset` leaves the peer down until a [`Backoff`]; frames sent to a peer that
//! is down are lost, frames sent while connecting wait (bounded) for the
//! connection.
//!
//! Sessions. Frames a failed connection gave up are not lost at once: each side
//! counts the frames it delivered from the peer's incarnation, and `Connect`
//! and `Accept` carry that count, so the next connection with the same
//! incarnation sends again exactly the frames that never arrived, first and in
//! order (RC delivers a prefix; a work request for a connection gone at the
//! receiver completes in error at the sender, see [`Messenger::arrived`]).
//! Nothing arrives twice. A peer that restarted starts a new session: frames
//! for its old incarnation are lost (weir-core's `Transport` contract), and
//! frames in flight when the peer was declared down are lost too.
//!
//! Paths. A host with two NIC ports has two paths to each peer (port `k` to the
//! peer's port `k`). A connection lives on one path at a time: the Transport
//! contract keeps each peer's frames in order, and one RC QP keeps order where
//! two would race. Peers are spread over the paths (each pair starts on the
//! path its ids pick, the same from both sides), so a host's traffic uses both
//! ports. A connection that fails on one path (an error completion: the NIC
//! gave up after its retries) is set up again at once on the other, and its
//! frames in flight go again on it (see Sessions). A failure of a connection
//! that never came up moves to the other path after the backoff, so a peer
//! reachable on either path is found.

use crate::proto::{Backoff, Completion, Config, Conn, Params, Post, ProtoError, SendWr};
use std::collections::{BTreeMap, VecDeque};
use weir_core::wire::Frame;
use weir_core::{NodeId, SendError, TransportError};

pub mod image;

use image::Image;

/// How long a connection attempt waits for its `Accept`.
pub const CONNECT_TIMEOUT_NS: u64 = 20_000_000;

/// A connection with frames waiting and nothing heard from the peer for this
/// long is probed (a zero-length RDMA WRITE: it needs no credit, and a peer
/// that restarted answers it with a reset). Without it a side out of credits
/// towards a peer that restarted and never speaks first would wait for ever.
pub const PROBE_AFTER_NS: u64 = 10_000_000;

/// One of a host's NIC ports, by index: images on path `k` leave this host's
/// port `k` for the peer's port `k`.
pub type Path = u8;

/// Most paths (NIC ports) per host.
pub const PATHS_MAX: Path = 2;

/// Where the connection with one peer stands.
#[derive(Debug)]
enum State {
    /// No connection; the next attempt not before `retry_ns`.
    Down { retry_ns: u64 },
    /// `Connect` sent at `since_ns`; frames wait in `pending`.
    Connecting {
        since_ns: u64,
        pending: VecDeque<Frame>,
        pending_bytes: usize,
    },
    /// Connected with the peer's connection `peer_gen`.
    Up { peer_gen: u64, conn: Box<Conn> },
}

/// What this side sent a peer and the wire has not yet reported on.
#[derive(Clone, Copy, Debug)]
struct Sent {
    gen: u64,
    /// A send work request's id and whether it was signalled; none for a
    /// connection-manager message.
    wr: Option<(u64, bool)>,
}

#[derive(Debug)]
struct Peer {
    /// This side's number of its current (or last) connection with the peer.
    gen: u64,
    state: State,
    backoff: Backoff,
    /// When anything last arrived from the peer.
    heard_ns: u64,
    /// When it was last probed.
    probed_ns: u64,
    /// The path of its current (or last) connection.
    path: Path,
    /// The peer's incarnation this side last set a connection up with (the
    /// high half of its connection numbers): the session the counts are of.
    boot: Option<u32>,
    /// The peer's newest connection number this side took up: a `Connect`
    /// numbered at or below it is an attempt the peer gave up (it crossed this
    /// side's own on another path), not a new one.
    seen_gen: u64,
    /// Frames handed to connections with that incarnation, in all.
    handed: u64,
    /// Frames delivered from that incarnation, in all.
    delivered: u64,
    /// Frames failed connections gave up, oldest first: the last
    /// `replay.len()` of `handed`, sent again on the next connection with the
    /// same incarnation (less those the peer says it delivered).
    replay: VecDeque<Frame>,
}

impl Peer {
    fn new(gen: u64, now_ns: u64, path: Path) -> Peer {
        Peer {
            gen,
            state: State::Down { retry_ns: 0 },
            backoff: Backoff::default(),
            heard_ns: now_ns,
            probed_ns: now_ns,
            path,
            boot: None,
            seen_gen: 0,
            handed: 0,
            delivered: 0,
            replay: VecDeque::new(),
        }
    }
}

/// Counters of a messenger's connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Connections that came up.
    pub connects: u64,
    /// Connections failed by a message that broke the protocol.
    pub refused: u64,
    /// Connections failed otherwise (error completion, image lost, reset, peer
    /// restarted).
    pub resets: u64,
    /// Images dropped: stale (an old connection's) or malformed.
    pub dropped: u64,
    /// Frames lost with a connection, or sent to a peer that was down.
    pub frames_lost: u64,
    /// Connections that failed on one path and were set up again on the other.
    pub failovers: u64,
    /// Frames a failed connection gave up and its successor sent again.
    pub replayed: u64,
}

impl std::iter::Sum for Counters {
    fn sum<I: Iterator<Item = Counters>>(iter: I) -> Counters {
        iter.fold(Counters::default(), |a, b| Counters {
            connects: a.connects + b.connects,
            refused: a.refused + b.refused,
            resets: a.resets + b.resets,
            dropped: a.dropped + b.dropped,
            frames_lost: a.frames_lost + b.frames_lost,
            failovers: a.failovers + b.failovers,
            replayed: a.replayed + b.replayed,
        })
    }
}

/// Images to put on the wire, and frames delivered.
#[derive(Debug, Default)]
pub struct Out {
    /// Images for the wire, in order, with the path each goes on.
    pub images: Vec<(NodeId, Path, Frame)>,
    /// Frames for the application, in order.
    pub frames: Vec<(NodeId, Frame)>,
}

/// A node's messenger.
#[derive(Debug)]
pub struct Messenger {
    me: NodeId,
    cfg: Config,
    /// The next connection number: this incarnation's `boot` in the high bits.
    next_gen: u64,
    peers: BTreeMap<NodeId, Peer>,
    /// By destination and path: images sent that the wire has not reported on,
    /// oldest first.
    sent: BTreeMap<(NodeId, Path), VecDeque<Sent>>,
    counters: Counters,
    /// Paths to every peer (NIC ports).
    paths: Path,
}

impl Messenger {
    /// The messenger of node `me` in its incarnation `boot` (distinct per restart).
    pub fn new(me: NodeId, cfg: Config, boot: u32) -> Result<Messenger, ProtoError> {
        cfg.validate()?;
        Ok(Messenger {
            me,
            cfg,
            next_gen: (u64::from(boot) << 32) + 1,
            peers: BTreeMap::new(),
            sent: BTreeMap::new(),
            counters: Counters::default(),
            paths: 1,
        })
    }

    /// The same messenger on a host with `paths` NIC ports (1 to [`PATHS_MAX`]).
    pub fn with_paths(mut self, paths: Path) -> Result<Messenger, ProtoError> {
        if !(1..=PATHS_MAX).contains(&paths) {
            return Err(ProtoError::BadParams("paths must be 1 or 2"));
        }
        self.paths = paths;
        Ok(self)
    }

    /// The path a pair of nodes starts on: the same from both sides, spread
    /// over the paths by the pair's ids.
    fn home_path(&self, peer: NodeId) -> Path {
        ((self.me.0 ^ peer.0) % u32::from(self.paths)) as Path
    }

    /// The path `peer`'s connection is on, if the peer is known.
    pub fn path(&self, peer: NodeId) -> Option<Path> {
        self.peers.get(&peer).map(|p| p.path)
    }

    /// Counters so far.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Whether the connection with `peer` is up.
    pub fn is_up(&self, peer: NodeId) -> bool {
        matches!(
            self.peers.get(&peer).map(|p| &p.state),
            Some(State::Up { .. })
        )
    }

    fn gen(&mut self) -> u64 {
        let g = self.next_gen;
        self.next_gen += 1;
        g
    }

    /// Queue `frame` for `to`, connecting first if need be; the images to send.
    pub fn send(
        &mut self,
        to: NodeId,
        frame: Frame,
        now_ns: u64,
        out: &mut Out,
    ) -> Result<(), SendError> {
        if to == self.me {
            return Err(TransportError::UnknownPeer(to).into());
        }
        if !self.peers.contains_key(&to) {
            let gen = self.gen();
            let path = self.home_path(to);
            self.peers.insert(to, Peer::new(gen, now_ns, path));
        }
        if matches!(self.peers[&to].state, State::Down { retry_ns } if retry_ns <= now_ns) {
            self.connect(to, now_ns, out);
        }
        let cfg = self.cfg;
        let peer = self.peers.get_mut(&to).expect("added");
        match &mut peer.state {
            State::Down { .. } => {
                // Lost, as frames on a connection that reset are.
                self.counters.frames_lost += 1;
                Ok(())
            }
            State::Connecting {
                pending,
                pending_bytes,
                ..
            } => {
                if frame.len() > crate::proto::MAX_FRAME_BYTES {
                    return Err(TransportError::FrameTooLarge {
                        len: frame.len(),
                        max: crate::proto::MAX_FRAME_BYTES,
                    }
                    .into());
                }
                if !pending.is_empty() && *pending_bytes + frame.len() > cfg.queue_bytes {
                    return Err(SendError::Full(frame));
                }
                *pending_bytes += frame.len();
                pending.push_back(frame);
                Ok(())
            }
            State::Up { conn, .. } => {
                conn.send(frame)?;
                peer.handed += 1;
                self.pump(to, out);
                Ok(())
            }
        }
    }

    /// Start a connection attempt with `to`.
    fn connect(&mut self, to: NodeId, now_ns: u64, out: &mut Out) {
        let gen = self.gen();
        tracing::debug!(me = %self.me, peer = %to, gen, "connecting");
        let params = self.cfg.params;
        let peer = self.peers.get_mut(&to).expect("known peer");
        peer.gen = gen;
        peer.state = State::Connecting {
            since_ns: now_ns,
            pending: VecDeque::new(),
            pending_bytes: 0,
        };
        let (path, delivered) = (peer.path, peer.delivered);
        self.sent_to(to, path, Sent { gen, wr: None });
        let image = Image::Connect {
            gen,
            delivered,
            params,
        };
        out.images.push((to, path, image.encode()));
    }

    fn sent_to(&mut self, to: NodeId, path: Path, sent: Sent) {
        self.sent.entry((to, path)).or_default().push_back(sent);
    }

    /// Post what `to`'s connection hands out.
    fn pump(&mut self, to: NodeId, out: &mut Out) {
        let peer = self.peers.get_mut(&to).expect("known peer");
        let State::Up { peer_gen, conn } = &mut peer.state else {
            return;
        };
        while let Some(post) = conn.poll_post() {
            // Receives are the NIC's business: the simulated one counts them in
            // the connection itself.
            let Post::Send(SendWr { wr, signaled, op }) = post else {
                continue;
            };
            self.sent
                .entry((to, peer.path))
                .or_default()
                .push_back(Sent {
                    gen: peer.gen,
                    wr: Some((wr, signaled)),
                });
            let image = Image::Work {
                from: peer.gen,
                to: *peer_gen,
                op: image::Work::Op(op),
            };
            out.images.push((to, peer.path, image.encode()));
        }
    }

    /// The connection with `peer` failed (`refused`: by the peer's fault): it is
    /// down until its backoff ends; frames on it are lost. With two paths, a
    /// working connection that failed is set up again on the other path at once
    /// (on the next frame), an attempt that failed after its backoff.
    fn down(&mut self, from: NodeId, now_ns: u64, refused: bool) {
        let paths = self.paths;
        let peer = self.peers.get_mut(&from).expect("known peer");
        let was_up = matches!(peer.state, State::Up { .. });
        let lost = match &mut peer.state {
            State::Up { conn, .. } => {
                // Not lost yet: sent again on the next connection, unless the
                // peer turns out to have restarted.
                conn.fail();
                peer.replay.extend(conn.take_unfinished());
                0
            }
            State::Connecting { pending, .. } => pending.len() as u64,
            State::Down { .. } => return,
        };
        self.counters.frames_lost += lost;
        if refused {
            self.counters.refused += 1;
        } else {
            self.counters.resets += 1;
        }
        let mut wait = peer.backoff.failed();
        if paths > 1 && !refused {
            peer.path = (peer.path + 1) % paths;
            if was_up {
                wait = 0;
                self.counters.failovers += 1;
            }
        }
        tracing::debug!(me = %self.me, peer = %from, gen = peer.gen, refused, lost, wait_ns = wait, path = peer.path, "connection down");
        peer.state = State::Down {
            retry_ns: now_ns + wait,
        };
    }

    /// An image arrived from `from` on `path`. Whether a live connection took
    /// it: a work request for a connection gone here is not (a real NIC finds
    /// no queue pair for it, and its sender gets an error completion, not a
    /// success), and the wire must tell the sender so.
    pub fn arrived(
        &mut self,
        from: NodeId,
        path: Path,
        image: Frame,
        now_ns: u64,
        out: &mut Out,
    ) -> bool {
        let Ok(image) = Image::decode(image) else {
            // Not an image at all: only a broken or hostile host sends that.
            self.counters.dropped += 1;
            return false;
        };
        if from == self.me || path >= self.paths {
            self.counters.dropped += 1;
            return false;
        }
        if let Some(p) = self.peers.get_mut(&from) {
            p.heard_ns = now_ns;
        }
        match image {
            Image::Connect {
                gen,
                delivered,
                params,
            } => self.accept(from, path, (gen, delivered), params, now_ns, out),
            Image::Accept {
                gen,
                to,
                delivered,
                params,
            } => {
                let Some(peer) = self.peers.get_mut(&from) else {
                    self.counters.dropped += 1;
                    return false;
                };
                if peer.gen != to || !matches!(peer.state, State::Connecting { .. }) {
                    self.counters.dropped += 1;
                    return false;
                }
                match Conn::new(self.cfg, params) {
                    Ok(conn) => {
                        self.resume(from, gen, delivered);
                        self.up(from, gen, conn, out)
                    }
                    Err(_) => {
                        self.reset_peer(from, path, gen, out);
                        self.down(from, now_ns, true);
                    }
                }
            }
            Image::Reset { to } => match self.peers.get(&from) {
                Some(p) if p.gen == to && !matches!(p.state, State::Down { .. }) => {
                    self.down(from, now_ns, false);
                    self.resend_soon(from, now_ns, out);
                }
                _ => self.counters.dropped += 1,
            },
            Image::Probe { from: f, to } => {
                if !self.current(from, f, to) {
                    self.counters.dropped += 1;
                    self.reset_peer(from, path, f, out);
                }
            }
            Image::Work { from: f, to, op } => {
                if !self.current(from, f, to) {
                    tracing::debug!(me = %self.me, peer = %from, from = f, to, "stale message");
                    // A message for a connection gone here: tell its sender.
                    self.counters.dropped += 1;
                    self.reset_peer(from, path, f, out);
                    return false;
                }
                let peer = self.peers.get_mut(&from).expect("current");
                let State::Up { conn, .. } = &mut peer.state else {
                    unreachable!("current")
                };
                match image::receive(conn, op) {
                    Ok(Some(frame)) => {
                        peer.delivered += 1;
                        out.frames.push((from, frame))
                    }
                    Ok(None) => {}
                    Err(_) => {
                        self.reset_peer(from, path, f, out);
                        self.down(from, now_ns, true);
                        return false;
                    }
                }
                self.pump(from, out);
            }
        }
        true
    }

    /// Whether `from`'s connection `f` is this side's current connection `to`.
    fn current(&self, from: NodeId, f: u64, to: u64) -> bool {
        match self.peers.get(&from) {
            Some(Peer {
                gen,
                state: State::Up { peer_gen, .. },
                ..
            }) => *gen == to && *peer_gen == f,
            _ => false,
        }
    }

    /// Answer a `Connect` from `from` that came on `path`: the connection lives
    /// there.
    fn accept(
        &mut self,
        from: NodeId,
        path: Path,
        (gen, delivered): (u64, u64),
        params: Params,
        now_ns: u64,
        out: &mut Out,
    ) {
        if self.peers.get(&from).is_some_and(|p| gen <= p.seen_gen) {
            // An attempt the peer gave up: its own side took up this side's.
            self.counters.dropped += 1;
            return;
        }
        let pending = match self.peers.get_mut(&from).map(|p| &mut p.state) {
            // Both connecting at once: the lower id keeps its own attempt.
            Some(State::Connecting { .. }) if self.me < from => {
                self.counters.dropped += 1;
                return;
            }
            Some(State::Connecting { pending, .. }) => std::mem::take(pending),
            Some(State::Up { .. }) => {
                // The peer restarted or gave up the connection.
                self.down(from, now_ns, false);
                VecDeque::new()
            }
            Some(State::Down { .. }) | None => VecDeque::new(),
        };
        let conn = match Conn::new(self.cfg, params) {
            Ok(c) => c,
            Err(_) => {
                self.counters.refused += 1;
                self.reset_peer(from, path, gen, out);
                return;
            }
        };
        let mine = self.gen();
        let peer = self
            .peers
            .entry(from)
            .or_insert_with(|| Peer::new(mine, now_ns, path));
        peer.gen = mine;
        peer.path = path;
        self.resume(from, gen, delivered);
        // Not an attempt of this side's: its loss is not watched.
        self.sent_to(from, path, Sent { gen: 0, wr: None });
        let image = Image::Accept {
            gen: mine,
            to: gen,
            delivered: self.peers[&from].delivered,
            params: self.cfg.params,
        };
        out.images.push((from, path, image.encode()));
        self.up(from, gen, conn, out);
        self.requeue(from, pending);
        self.pump(from, out);
    }

    /// The connection with `from` is up with its connection `peer_gen`.
    fn up(&mut self, from: NodeId, peer_gen: u64, conn: Conn, out: &mut Out) {
        let peer = self.peers.get_mut(&from).expect("known peer");
        let pending = match std::mem::replace(
            &mut peer.state,
            State::Up {
                peer_gen,
                conn: Box::new(conn),
            },
        ) {
            State::Connecting { pending, .. } => pending,
            _ => VecDeque::new(),
        };
        peer.backoff.connected();
        peer.seen_gen = peer.seen_gen.max(peer_gen);
        tracing::debug!(me = %self.me, peer = %from, gen = peer.gen, peer_gen, "connection up");
        self.counters.connects += 1;
        self.requeue(from, pending);
        self.pump(from, out);
    }

    /// A connection with `from`'s connection `their_gen` is being set up; the
    /// peer delivered `their_delivered` of this side's frames. A new
    /// incarnation of the peer starts a new session (frames for the old one
    /// are lost, as at any reset); the same one drops from the replay the
    /// frames that arrived.
    fn resume(&mut self, from: NodeId, their_gen: u64, their_delivered: u64) {
        let boot = (their_gen >> 32) as u32;
        let peer = self.peers.get_mut(&from).expect("known peer");
        if peer.boot != Some(boot) {
            self.counters.frames_lost += peer.replay.len() as u64;
            peer.replay.clear();
            (peer.handed, peer.delivered, peer.boot) = (0, 0, Some(boot));
            return;
        }
        let first = peer.handed - peer.replay.len() as u64;
        let arrived = their_delivered.saturating_sub(first);
        let arrived = arrived.min(peer.replay.len() as u64) as usize;
        peer.replay.drain(..arrived);
        if !peer.replay.is_empty() {
            self.counters.replayed += peer.replay.len() as u64;
        }
    }

    /// Frames a failed connection gave up, then frames that waited for the
    /// connection, go into it, in order.
    fn requeue(&mut self, to: NodeId, pending: VecDeque<Frame>) {
        let peer = self.peers.get_mut(&to).expect("known peer");
        let State::Up { conn, .. } = &mut peer.state else {
            return;
        };
        for frame in peer.replay.drain(..) {
            if conn.send_again(frame).is_err() {
                // Larger than the new connection's regions: lost.
                self.counters.frames_lost += 1;
            }
        }
        for frame in pending {
            if conn.send(frame).is_err() {
                // Over the connection's bound: lost, as at a reset.
                self.counters.frames_lost += 1;
            } else {
                peer.handed += 1;
            }
        }
    }

    /// Answer an image of `to`'s connection `their_gen` (gone here) on the path
    /// it came on.
    fn reset_peer(&mut self, to: NodeId, path: Path, their_gen: u64, out: &mut Out) {
        tracing::debug!(me = %self.me, peer = %to, their_gen, "reset sent");
        self.sent_to(to, path, Sent { gen: 0, wr: None });
        out.images
            .push((to, path, Image::Reset { to: their_gen }.encode()));
    }

    /// The wire's report on the oldest image sent to `to` on `path` not yet
    /// reported: whether it arrived.
    pub fn wire_done(&mut self, to: NodeId, path: Path, arrived: bool, now_ns: u64, out: &mut Out) {
        let Some(sent) = self.sent.get_mut(&(to, path)).and_then(|q| q.pop_front()) else {
            return;
        };
        let Some(peer) = self.peers.get_mut(&to) else {
            return;
        };
        if sent.gen != peer.gen {
            return;
        }
        match (&mut peer.state, sent.wr) {
            (State::Up { conn, .. }, Some((wr, signaled))) => {
                let c = if !arrived {
                    Completion::Error { wr }
                } else if signaled {
                    Completion::Sent { wr }
                } else {
                    return;
                };
                if conn.complete(c).is_err() {
                    self.down(to, now_ns, false);
                    self.resend_soon(to, now_ns, out);
                } else {
                    self.pump(to, out);
                }
            }
            (State::Connecting { .. }, None) if !arrived => {
                self.down(to, now_ns, false);
                self.resend_soon(to, now_ns, out);
            }
            _ => {}
        }
    }

    /// A peer just gone down with frames to send again: connect at once if its
    /// backoff allows (a failover), not on the next frame, which may be long
    /// in coming (the frames waiting may be the answers its sender waits for).
    fn resend_soon(&mut self, to: NodeId, now_ns: u64, out: &mut Out) {
        let peer = &self.peers[&to];
        if !peer.replay.is_empty()
            && matches!(peer.state, State::Down { retry_ns } if retry_ns <= now_ns)
        {
            self.connect(to, now_ns, out);
        }
    }

    /// Time-driven work due at `now_ns` (attempts that timed out, probes of
    /// peers silent while frames wait for them, connections again to peers
    /// with frames to send again once their backoff ends); the next time
    /// anything is due, if any.
    pub fn poll(&mut self, now_ns: u64, out: &mut Out) -> Option<u64> {
        let timed_out: Vec<NodeId> = self
            .peers
            .iter()
            .filter_map(|(&id, p)| match p.state {
                State::Connecting { since_ns, .. } if since_ns + CONNECT_TIMEOUT_NS <= now_ns => {
                    Some(id)
                }
                _ => None,
            })
            .collect();
        for id in timed_out {
            self.down(id, now_ns, false);
        }
        let resend: Vec<NodeId> = self
            .peers
            .iter()
            .filter(|(_, p)| {
                !p.replay.is_empty()
                    && matches!(p.state, State::Down { retry_ns } if retry_ns <= now_ns)
            })
            .map(|(&id, _)| id)
            .collect();
        for id in resend {
            self.connect(id, now_ns, out);
        }
        let mut probes = Vec::new();
        let mut next = None::<u64>;
        for (&id, p) in &mut self.peers {
            let due = match &p.state {
                State::Down { retry_ns } if !p.replay.is_empty() => *retry_ns,
                State::Connecting { since_ns, .. } => since_ns + CONNECT_TIMEOUT_NS,
                State::Up { peer_gen, conn } if conn.queued() > 0 => {
                    let due = p.heard_ns.max(p.probed_ns) + PROBE_AFTER_NS;
                    if due > now_ns {
                        due
                    } else {
                        p.probed_ns = now_ns;
                        probes.push((id, p.path, p.gen, *peer_gen));
                        now_ns + PROBE_AFTER_NS
                    }
                }
                _ => continue,
            };
            next = Some(next.map_or(due, |n| n.min(due)));
        }
        for (id, path, gen, peer_gen) in probes {
            tracing::debug!(me = %self.me, peer = %id, gen, "probe");
            self.sent_to(id, path, Sent { gen: 0, wr: None });
            out.images.push((
                id,
                path,
                Image::Probe {
                    from: gen,
                    to: peer_gen,
                }
                .encode(),
            ));
        }
        next
    }

    /// Whether `to` would take a frame now without handing it back.
    pub fn writable(&self, to: NodeId) -> bool {
        match self.peers.get(&to).map(|p| &p.state) {
            Some(State::Up { conn, .. }) => conn.queued() == 0,
            Some(State::Connecting { pending, .. }) => pending.is_empty(),
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests;
