//! The per-peer flow owner: the one place a node's frames wait when a peer's
//! transport queue is full, and where what the transport saw of each path
//! (its [`CongestionSignals`]) is recorded.
//!
//! [`Transport::send`] never waits; when a peer's queue is full it hands the frame
//! back ([`SendError::Full`]). [`Flow`] holds such frames for that peer, in order,
//! and every later frame to the same peer behind them, until
//! [`Transport::writable`] says there is room; frames to other peers go on at
//! once. So one congested peer never stalls the node. What it holds is bounded
//! per peer ([`FLOW_HELD_BYTES_MAX`], [`FLOW_HELD_FRAMES_MAX`]); past that the
//! peer's held frames are dropped, as a connection reset would drop them. This is
//! the node giving up on frames, not the transport losing them: the connection
//! stays up, so the peer sees a gap without a reconnect, which the engine's
//! timeouts and retries cover as they cover a reset.
//!
//! Signals are recorded (in the node's report, `/metrics` and the simulator's
//! report), and with the congestion response on (`[flow] enabled`) each peer's
//! sender-side [`Window`] follows them: at each tick, by the fraction of the
//! packets sent to the peer since the last (counted from the bytes the
//! transport took) that CNPs, ECN echoes and retransmissions answered, it is
//! cut; it grows with the bytes sent. The engine bounds its replica forwards
//! and rebuild copies to a peer by that peer's window. The client's side, a window over the read responses in
//! flight towards it, is [`ReadWindow`].

mod reads;
mod window;

pub use reads::{ReadFlowStats, ReadWindow, Turn, READS_WAITING_MAX, RESPONSE_NS_MAX};
pub use window::{
    receiver_marks, sender_marks, FlowConfig, Window, WindowStats, GUARD_MIN_NS,
    INCREASE_BYTES_DEFAULT, PACKET_BYTES, WINDOW_MAX_BYTES_DEFAULT, WINDOW_MIN_BYTES_DEFAULT,
};

use crate::ids::NodeId;
use crate::transport::{CongestionSignals, SendError, Transport, TransportError};
use crate::wire::Frame;
use std::collections::{BTreeMap, VecDeque};

/// Bytes of frames held for one peer at most.
pub const FLOW_HELD_BYTES_MAX: usize = 64 << 20;
/// Frames held for one peer at most (small frames: acks, heartbeats).
pub const FLOW_HELD_FRAMES_MAX: usize = 16_384;

/// What became of a frame given to [`Flow::send`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// The transport took it.
    Taken,
    /// Held behind the peer's full queue; sent by a later [`Flow::flush`].
    Held,
    /// Held frames passed the bound: they and this one were dropped.
    Dropped,
}

/// What the node knows of its flow towards one peer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerFlow {
    /// Frames sent (taken by the transport).
    pub sent: u64,
    /// Times the transport refused a frame (its queue towards the peer full).
    pub refused: u64,
    /// Frames held now.
    pub held: usize,
    /// Frames held until the transport had room, so far.
    pub held_total: u64,
    /// Bytes held now.
    pub held_bytes: usize,
    /// Most bytes held at once.
    pub held_bytes_max: usize,
    /// Frames dropped because the held ones passed the bound.
    pub dropped: u64,
    /// The transport's signals towards the peer, as last read (cumulative).
    pub signals: CongestionSignals,
    /// The peer's sender-side window, bytes (0 with the congestion response
    /// off).
    pub window_bytes: u64,
    /// Times the peer's window was cut.
    pub window_cuts: u64,
}

/// Counts summed over flow owners (nodes' [`PeerFlow`]s, their engines'
/// waiting writes, clients' read windows): the simulator's report sums a
/// run's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowTotals {
    /// Times a transport refused a frame.
    pub refused: u64,
    /// Frames held until their queue had room.
    pub held: u64,
    /// Frames dropped with held frames past the bound.
    pub dropped: u64,
    /// Client reads that waited for their read window.
    pub reads_waited: u64,
    /// Cuts of clients' read windows.
    pub read_cuts: u64,
    /// Cuts of nodes' per-peer windows.
    pub peer_cuts: u64,
    /// Client writes that waited for room in a replica's window.
    pub writes_waited: u64,
}

impl FlowTotals {
    /// Add a node's counts: its flow owner's, peer by peer, and the
    /// client writes its engine held back for a replica's window.
    pub fn add_node(&mut self, peers: &[(NodeId, PeerFlow)], writes_waited: u64) {
        for (_, p) in peers {
            self.refused += p.refused;
            self.held += p.held_total;
            self.dropped += p.dropped;
            self.peer_cuts += p.window_cuts;
        }
        self.writes_waited += writes_waited;
    }

    /// Add a client's read window's counts.
    pub fn add_reads(&mut self, reads: &ReadFlowStats) {
        self.reads_waited += reads.waited;
        self.read_cuts += reads.window.cuts;
    }
}

#[derive(Debug, Default)]
struct Peer {
    held: VecDeque<Frame>,
    stats: PeerFlow,
    /// The sender-side window, with the congestion response on.
    window: Option<Window>,
}

impl Peer {
    /// A frame of `bytes` was taken by the transport: the window's period
    /// counts its packets, and it grows.
    fn sent(&mut self, bytes: usize) {
        self.stats.sent += 1;
        if let Some(w) = &mut self.window {
            w.answered(bytes as u64);
        }
    }

    /// Drop every held frame, and count `more` dropped with them.
    fn drop_held(&mut self, more: u64) {
        let dropped = self.held.len() as u64 + more;
        self.stats.dropped += dropped;
        self.held.clear();
        self.stats.held_bytes = 0;
    }

    fn hold(&mut self, frame: Frame) -> Sent {
        let bytes = frame.len();
        if self.held.len() >= FLOW_HELD_FRAMES_MAX
            || self.stats.held_bytes + bytes > FLOW_HELD_BYTES_MAX
        {
            self.drop_held(1);
            return Sent::Dropped;
        }
        self.stats.held_total += 1;
        self.stats.held_bytes += bytes;
        self.stats.held_bytes_max = self.stats.held_bytes_max.max(self.stats.held_bytes);
        self.held.push_back(frame);
        Sent::Held
    }
}

/// Per-peer flow state of one node. Sans-IO apart from the transport it is
/// handed, whose `send` never waits.
#[derive(Debug, Default)]
pub struct Flow {
    config: FlowConfig,
    peers: BTreeMap<NodeId, Peer>,
    /// A peer started or stopped having frames held since the engine was last
    /// told ([`Flow::congestion_changed`]).
    changed: bool,
}

impl Flow {
    /// A flow owner that holds nothing yet.
    pub fn new() -> Self {
        Flow::default()
    }

    /// A flow owner with the congestion response's settings.
    pub fn with_config(config: FlowConfig) -> Self {
        Flow {
            config,
            ..Flow::default()
        }
    }

    /// Send `frame` to `to`, or hold it behind the frames already held for `to` (so
    /// the order per peer stays the send order). An error is the transport's
    /// refusal for good (an unknown peer, a closed transport): the frame is gone.
    pub fn send<T: Transport>(
        &mut self,
        transport: &T,
        to: NodeId,
        frame: Frame,
    ) -> Result<Sent, TransportError> {
        let peer = self.peers.entry(to).or_default();
        let was_holding = !peer.held.is_empty();
        let sent = if was_holding {
            peer.hold(frame)
        } else {
            let bytes = frame.len();
            match transport.send(to, frame) {
                Ok(()) => {
                    peer.sent(bytes);
                    Sent::Taken
                }
                Err(SendError::Full(frame)) => {
                    peer.stats.refused += 1;
                    peer.hold(frame)
                }
                Err(SendError::Refused(e)) => return Err(e),
            }
        };
        peer.stats.held = peer.held.len();
        let holding = !peer.held.is_empty();
        self.changed |= holding != was_holding;
        Ok(sent)
    }

    /// Hand held frames to the transport, oldest first per peer, until it refuses
    /// one. Frames to a peer the transport no longer knows are dropped; a closed
    /// transport is an error.
    pub fn flush<T: Transport>(&mut self, transport: &T) -> Result<(), TransportError> {
        for (&to, peer) in &mut self.peers {
            let was_holding = !peer.held.is_empty();
            while let Some(frame) = peer.held.pop_front() {
                let bytes = frame.len();
                match transport.send(to, frame) {
                    Ok(()) => {
                        peer.sent(bytes);
                        peer.stats.held_bytes -= bytes;
                    }
                    Err(SendError::Full(frame)) => {
                        peer.stats.refused += 1;
                        peer.held.push_front(frame);
                        break;
                    }
                    Err(SendError::Refused(TransportError::Closed)) => {
                        return Err(TransportError::Closed)
                    }
                    Err(SendError::Refused(e)) => {
                        tracing::warn!(%to, error = %e, "held frames dropped");
                        peer.drop_held(1);
                    }
                }
            }
            peer.stats.held = peer.held.len();
            let holding = !peer.held.is_empty();
            self.changed |= holding != was_holding;
        }
        self.self_check();
        Ok(())
    }

    /// The peers frames are held for now, if that set may have changed since the
    /// last call (a peer started or stopped having frames held): O(1) otherwise,
    /// so the node can ask after every send.
    pub fn congestion_changed(&mut self) -> Option<std::collections::BTreeSet<NodeId>> {
        std::mem::take(&mut self.changed).then(|| self.congested())
    }

    /// The peers frames are held for now.
    pub fn congested(&self) -> std::collections::BTreeSet<NodeId> {
        self.peers
            .iter()
            .filter(|(_, p)| !p.held.is_empty())
            .map(|(&id, _)| id)
            .collect()
    }

    /// Whether any frame is held (then the node waits for the transport's
    /// [`Transport::writable`] and flushes).
    pub fn holding(&self) -> bool {
        self.peers.values().any(|p| !p.held.is_empty())
    }

    /// Record the transport's signals towards `peer` at `now_ns` (the node's
    /// tick). Cumulative counters never go back, except when the transport
    /// forgot the path (a new connection). With the congestion response on, the
    /// peer's window is cut by the fraction of packets sent since that new
    /// congestion marks answered (it grows as frames are sent).
    pub fn record_signals(&mut self, peer: NodeId, signals: CongestionSignals, now_ns: u64) {
        let config = self.config;
        let p = self.peers.entry(peer).or_default();
        p.stats.signals = signals;
        if config.enabled {
            let w = p.window.get_or_insert_with(|| Window::new(config));
            w.observe(sender_marks(&signals), signals.rtt_ns_last, now_ns, 0);
            p.stats.window_bytes = w.bytes();
            p.stats.window_cuts = w.stats().cuts;
        }
    }

    /// Each peer's sender-side window, bytes: empty with the congestion response
    /// off (no peer is limited).
    pub fn windows(&self) -> BTreeMap<NodeId, u64> {
        self.peers
            .iter()
            .filter_map(|(&id, p)| Some((id, p.window.as_ref()?.bytes())))
            .collect()
    }

    /// Every peer's flow, by peer id.
    pub fn report(&self) -> Vec<(NodeId, PeerFlow)> {
        self.peers.iter().map(|(&id, p)| (id, p.stats)).collect()
    }

    /// The held counts agree with the frames held, and stay within the bounds.
    pub fn self_check(&self) {
        for (id, p) in &self.peers {
            let bytes: usize = p.held.iter().map(Frame::len).sum();
            assert_eq!(bytes, p.stats.held_bytes, "held bytes of {id}");
            assert_eq!(p.held.len(), p.stats.held, "held frames of {id}");
            assert!(p.held.len() <= FLOW_HELD_FRAMES_MAX, "frames held for {id}");
            assert!(
                p.stats.held_bytes <= FLOW_HELD_BYTES_MAX,
                "bytes held for {id}"
            );
            if let Some(w) = &p.window {
                w.self_check();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::sync::Mutex;

    /// A transport whose queue towards each peer takes `room` frames until
    /// `drain` empties it.
    struct Fake {
        room: usize,
        queued: Mutex<BTreeMap<NodeId, Vec<Frame>>>,
        closed: bool,
    }

    impl Fake {
        fn new(room: usize) -> Self {
            Fake {
                room,
                queued: Mutex::new(BTreeMap::new()),
                closed: false,
            }
        }

        fn drain(&self, peer: NodeId) -> Vec<u8> {
            let mut q = self.queued.lock().unwrap();
            let frames = q.remove(&peer).unwrap_or_default();
            frames.iter().map(|f| f.payload[0]).collect()
        }
    }

    impl Transport for Fake {
        fn local_id(&self) -> NodeId {
            NodeId(0)
        }
        fn send(&self, to: NodeId, frame: Frame) -> Result<(), SendError> {
            if self.closed {
                return Err(TransportError::Closed.into());
            }
            if to == NodeId(99) {
                return Err(TransportError::UnknownPeer(to).into());
            }
            let mut q = self.queued.lock().unwrap();
            let queue = q.entry(to).or_default();
            if queue.len() >= self.room {
                return Err(SendError::Full(frame));
            }
            queue.push(frame);
            Ok(())
        }
        async fn writable(&self) {}
        async fn recv(&self) -> Result<(NodeId, Frame), TransportError> {
            Err(TransportError::Closed)
        }
        fn signals(&self, _: NodeId) -> CongestionSignals {
            CongestionSignals::default()
        }
    }

    fn frame(tag: u8, len: usize) -> Frame {
        let mut payload = vec![0u8; len.max(1)];
        payload[0] = tag;
        Frame {
            payload: Bytes::from(payload),
            ..Frame::default()
        }
    }

    #[test]
    fn a_full_peer_holds_its_frames_in_order_and_others_go_on() {
        let t = Fake::new(2);
        let mut flow = Flow::new();
        let (slow, fast) = (NodeId(1), NodeId(2));
        for tag in 0..5 {
            flow.send(&t, slow, frame(tag, 10)).unwrap();
        }
        assert_eq!(flow.send(&t, fast, frame(9, 10)), Ok(Sent::Taken));
        assert!(flow.holding());
        let stats = flow.report()[0].1;
        assert_eq!((stats.sent, stats.held, stats.refused), (2, 3, 1));
        assert_eq!(t.drain(fast), vec![9]);
        assert_eq!(t.drain(slow), vec![0, 1]);
        flow.flush(&t).unwrap();
        assert_eq!(t.drain(slow), vec![2, 3]);
        // A frame sent while others are held waits behind them.
        assert_eq!(flow.send(&t, slow, frame(5, 10)), Ok(Sent::Held));
        flow.flush(&t).unwrap();
        assert!(!flow.holding());
        assert_eq!(t.drain(slow), vec![4, 5]);
        flow.self_check();
    }

    #[test]
    fn held_frames_past_the_bound_are_dropped_as_a_reset_would() {
        let t = Fake::new(0);
        let mut flow = Flow::new();
        let big = FLOW_HELD_BYTES_MAX / 4;
        for tag in 0..4 {
            assert_eq!(flow.send(&t, NodeId(1), frame(tag, big)), Ok(Sent::Held));
        }
        assert_eq!(flow.send(&t, NodeId(1), frame(4, 1)), Ok(Sent::Dropped));
        let stats = flow.report()[0].1;
        assert_eq!((stats.held, stats.held_bytes, stats.dropped), (0, 0, 5));
        assert_eq!(stats.held_bytes_max, FLOW_HELD_BYTES_MAX);
        // The next frame starts afresh.
        assert_eq!(flow.send(&t, NodeId(1), frame(5, 1)), Ok(Sent::Held));
        flow.self_check();
    }

    #[test]
    fn refusals_for_good_are_errors_and_a_closed_transport_ends_the_flush() {
        let mut t = Fake::new(0);
        let mut flow = Flow::new();
        assert_eq!(
            flow.send(&t, NodeId(99), frame(0, 1)),
            Err(TransportError::UnknownPeer(NodeId(99)))
        );
        flow.send(&t, NodeId(1), frame(0, 1)).unwrap();
        t.closed = true;
        assert_eq!(flow.flush(&t), Err(TransportError::Closed));
    }

    #[test]
    fn a_peers_window_follows_its_cnps_only_with_the_response_on() {
        let signals = |cnps| CongestionSignals {
            cnps,
            ..CongestionSignals::default()
        };
        let mut off = Flow::new();
        off.record_signals(NodeId(1), signals(0), 0);
        off.record_signals(NodeId(1), signals(9), 1_000_000);
        assert!(off.windows().is_empty(), "off: nothing limited");
        let config = FlowConfig {
            enabled: true,
            ..FlowConfig::default()
        };
        let mut on = Flow::with_config(config);
        let max = config.window_max_bytes;
        on.record_signals(NodeId(1), signals(0), 0);
        on.record_signals(NodeId(2), signals(0), 0);
        on.record_signals(NodeId(1), signals(4), 1_000_000);
        on.record_signals(NodeId(2), signals(0), 1_000_000);
        assert_eq!(
            on.windows(),
            [(NodeId(1), max / 2), (NodeId(2), max)].into()
        );
        // Sending grows it: a window's worth of bytes, one increase.
        let t = Fake::new(usize::MAX);
        on.send(&t, NodeId(1), frame(0, (max / 2) as usize))
            .unwrap();
        assert_eq!(on.windows()[&NodeId(1)], max / 2 + config.increase_bytes);
        // A tick whose sends were mostly unmarked cuts it by little: alpha
        // (starting at 1) moves 1/16 of the way to the fraction marked.
        on.record_signals(NodeId(1), signals(5), 2_000_000);
        let w = on.windows()[&NodeId(1)];
        assert!(w < max / 2 + config.increase_bytes && w > max / 4, "{w}");
        assert_eq!(on.report()[0].1.window_cuts, 2);
        on.self_check();
    }

    #[test]
    fn the_congested_set_is_reported_only_when_a_peer_starts_or_stops_holding() {
        let t = Fake::new(1);
        let mut flow = Flow::new();
        let (slow, fast) = (NodeId(1), NodeId(2));
        flow.send(&t, slow, frame(0, 1)).unwrap();
        assert_eq!(flow.congestion_changed(), None, "taken: nothing held");
        flow.send(&t, slow, frame(1, 1)).unwrap();
        assert_eq!(flow.congestion_changed(), Some([slow].into()));
        flow.send(&t, slow, frame(2, 1)).unwrap();
        flow.send(&t, fast, frame(3, 1)).unwrap();
        assert_eq!(flow.congestion_changed(), None, "still holding: no new set");
        flow.flush(&t).unwrap();
        assert_eq!(flow.congestion_changed(), None, "the queue is still full");
        t.drain(slow);
        flow.flush(&t).unwrap();
        assert_eq!(flow.congestion_changed(), None, "one of two held went out");
        t.drain(slow);
        flow.flush(&t).unwrap();
        assert_eq!(
            flow.congestion_changed(),
            Some([].into()),
            "nothing held any more"
        );
        assert_eq!(flow.congestion_changed(), None);
    }
}
