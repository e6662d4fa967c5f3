//! Replica forwarding within each peer's window (the congestion response, see
//! [`crate::flow`]): a primary counts the bytes of the writes it forwarded to
//! each replica and not yet heard back about, and a client write whose forwards
//! would take a replica past its window waits, holding its range lock, until
//! answers make room. Writes to a replica start in arrival order (a write waits
//! behind any earlier waiting write that shares one of its replicas; one whose
//! replicas have no writes waiting may pass); with nothing forwarded to a
//! replica, a write always may go to it. A forward sent without its payload
//! (the replica's front end holds it) costs no window. With no windows (the
//! response off) nothing ever waits, and the counts change nothing.

use super::*;

/// The forwards a primary has out, and the writes waiting for room.
#[derive(Debug, Default)]
pub(super) struct Forwards {
    /// Bytes forwarded to each peer and not yet answered.
    out: BTreeMap<NodeId, u64>,
    /// What each running write holds: the peers it was forwarded to, and the
    /// bytes sent to each.
    by_op: BTreeMap<OpId, Vec<(NodeId, u64)>>,
    /// Client writes holding their range lock, waiting for room, in arrival order.
    waiting: VecDeque<OpId>,
    /// Client writes that waited for room, so far.
    waited: u64,
}

impl Forwards {
    /// Whether forwarding `bytes` to `peers` keeps each within its window.
    fn fits(&self, peers: &[NodeId], bytes: u64, windows: &BTreeMap<NodeId, u64>) -> bool {
        peers.iter().all(|peer| {
            let out = self.out.get(peer).copied().unwrap_or(0);
            windows
                .get(peer)
                .is_none_or(|&w| out == 0 || out + bytes <= w)
        })
    }

    /// Write `op` forwarded these bytes to these peers.
    pub(super) fn took(&mut self, op: OpId, sent: Vec<(NodeId, u64)>) {
        for &(peer, bytes) in sent.iter().filter(|(_, b)| *b > 0) {
            *self.out.entry(peer).or_default() += bytes;
        }
        let before = self.by_op.insert(op, sent);
        debug_assert!(before.is_none(), "{op} forwarded twice");
    }

    /// `peer` answered write `op` (or gave up on it).
    pub(super) fn answered(&mut self, op: OpId, peer: NodeId) {
        let Some(sent) = self.by_op.get_mut(&op) else {
            return;
        };
        if let Some(at) = sent.iter().position(|(p, _)| *p == peer) {
            let (_, bytes) = sent.swap_remove(at);
            self.release(peer, bytes);
        }
    }

    /// Write `op` ended (or was failed while it waited): whatever it still held
    /// is free, and it leaves the line.
    pub(super) fn ended(&mut self, op: OpId) {
        for (peer, bytes) in self.by_op.remove(&op).unwrap_or_default() {
            self.release(peer, bytes);
        }
        self.waiting.retain(|w| *w != op);
    }

    /// `bytes` forwarded to `peer` are no longer out.
    fn release(&mut self, peer: NodeId, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let out = self.out.get_mut(&peer).expect("counted when forwarded");
        *out -= bytes;
        if *out == 0 {
            self.out.remove(&peer);
        }
    }

    /// Writes hold what they took, and the counts are their sums.
    pub(super) fn self_check(&self, writes: &BTreeMap<OpId, WriteOp>) {
        let mut sums: BTreeMap<NodeId, u64> = BTreeMap::new();
        for (op, sent) in &self.by_op {
            assert!(writes.contains_key(op), "{op} holds forwards but has ended");
            for (peer, bytes) in sent {
                *sums.entry(*peer).or_default() += bytes;
            }
        }
        sums.retain(|_, b| *b > 0);
        assert_eq!(sums, self.out, "forwarded bytes by peer");
        for op in &self.waiting {
            assert!(writes.contains_key(op), "{op} waits but has ended");
        }
        assert!(self.waiting.len() <= MAX_OPS_IN_FLIGHT);
    }
}

impl Replicator {
    /// Client write `op` holds its range lock: start it if its forwards fit
    /// their replicas' windows and no earlier waiting write shares a replica
    /// with it; else it waits.
    /// Client writes that waited for room in a replica's window, so far.
    pub fn writes_waited(&self) -> u64 {
        self.forwards.waited
    }

    pub(super) fn start_within_windows(&mut self, op: OpId) -> Vec<OpId> {
        if self.peer_windows.is_empty() && self.forwards.waiting.is_empty() {
            return self.start_client_write(op);
        }
        let peers = self.replicas_of(op);
        let behind = self
            .forwards
            .waiting
            .iter()
            .any(|&w| self.replicas_of(w).iter().any(|p| peers.contains(p)));
        if behind || !self.forwards_fit(op, &peers) {
            self.forwards.waited += 1;
            self.forwards.waiting.push_back(op);
            return Vec::new();
        }
        self.start_client_write(op)
    }

    /// The replicas write `op` goes to.
    fn replicas_of(&self, op: OpId) -> Vec<NodeId> {
        self.forward_to(self.map.extent(self.ops.writes[&op].extent))
    }

    fn forwards_fit(&self, op: OpId, peers: &[NodeId]) -> bool {
        let bytes = self.ops.writes[&op].data.len() as u64;
        self.forwards.fits(peers, bytes, &self.peer_windows)
    }

    /// Start the waiting writes that may go now, in arrival order per replica:
    /// a write that does not fit holds back the later ones sharing a replica
    /// with it, not the others.
    pub(super) fn start_waiting_forwards(&mut self) {
        let mut blocked: std::collections::BTreeSet<NodeId> = Default::default();
        let mut i = 0;
        while i < self.forwards.waiting.len() {
            let op = self.forwards.waiting[i];
            let peers = self.replicas_of(op);
            if peers.iter().any(|p| blocked.contains(p)) || !self.forwards_fit(op, &peers) {
                blocked.extend(peers);
                i += 1;
                continue;
            }
            self.forwards.waiting.remove(i);
            let ready = self.start_client_write(op);
            self.run_ready(ready);
        }
    }
}
