//! Replica forwarding within each peer's window (the congestion response, see
//! [`crate::flow`]): a primary counts the bytes of the writes it forwarded to
//! each replica and not yet heard back about, and a client write whose forwards
//! would take a replica past its window waits, holding its range lock, until
//! answers make room. Waiting writes start in arrival order; with nothing
//! forwarded to a replica, a write always may go to it. With no windows (the
//! response off) nothing ever waits, and the counts change nothing.

use super::*;

/// The forwards a primary has out, and the writes waiting for room.
#[derive(Debug, Default)]
pub(super) struct Forwards {
    /// Bytes forwarded to each peer and not yet answered.
    out: BTreeMap<NodeId, u64>,
    /// What each running write holds: the peers it was forwarded to, its bytes.
    by_op: BTreeMap<OpId, (Vec<NodeId>, u64)>,
    /// Client writes holding their range lock, waiting for room, in arrival order.
    waiting: VecDeque<OpId>,
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

    /// Write `op` forwarded `bytes` to `peers`.
    pub(super) fn took(&mut self, op: OpId, peers: Vec<NodeId>, bytes: u64) {
        for peer in &peers {
            *self.out.entry(*peer).or_default() += bytes;
        }
        let before = self.by_op.insert(op, (peers, bytes));
        debug_assert!(before.is_none(), "{op} forwarded twice");
    }

    /// `peer` answered write `op` (or gave up on it).
    pub(super) fn answered(&mut self, op: OpId, peer: NodeId) {
        let Some((peers, bytes)) = self.by_op.get_mut(&op) else {
            return;
        };
        if let Some(at) = peers.iter().position(|p| *p == peer) {
            peers.swap_remove(at);
            let out = self.out.get_mut(&peer).expect("counted when forwarded");
            *out -= *bytes;
            if *out == 0 {
                self.out.remove(&peer);
            }
        }
    }

    /// Write `op` ended: whatever it still held is free.
    pub(super) fn ended(&mut self, op: OpId) {
        if let Some((peers, _)) = self.by_op.get(&op).cloned() {
            for peer in peers {
                self.answered(op, peer);
            }
            self.by_op.remove(&op);
        }
    }

    /// Writes hold what they took, and the counts are their sums.
    pub(super) fn self_check(&self, writes: &BTreeMap<OpId, WriteOp>) {
        let mut sums: BTreeMap<NodeId, u64> = BTreeMap::new();
        for (op, (peers, bytes)) in &self.by_op {
            assert!(writes.contains_key(op), "{op} holds forwards but has ended");
            for peer in peers {
                *sums.entry(*peer).or_default() += bytes;
            }
        }
        assert_eq!(sums, self.out, "forwarded bytes by peer");
        assert!(self.waiting.len() <= MAX_OPS_IN_FLIGHT);
    }
}

impl Replicator {
    /// Client write `op` holds its range lock: start it if its forwards fit
    /// their replicas' windows and no earlier write waits; else it waits.
    pub(super) fn start_within_windows(&mut self, op: OpId) -> Vec<OpId> {
        if !self.forwards.waiting.is_empty() || !self.forwards_fit(op) {
            crate::flow::tally(|t| t.writes_waited += 1);
            self.forwards.waiting.push_back(op);
            return Vec::new();
        }
        self.start_client_write(op)
    }

    fn forwards_fit(&self, op: OpId) -> bool {
        if self.peer_windows.is_empty() {
            return true;
        }
        let w = &self.ops.writes[&op];
        let peers = self.forward_to(self.map.extent(w.extent));
        self.forwards
            .fits(&peers, w.data.len() as u64, &self.peer_windows)
    }

    /// Start the waiting writes that fit now, oldest first; one that was failed
    /// while it waited (a map change) is passed over.
    pub(super) fn start_waiting_forwards(&mut self) {
        while let Some(&op) = self.forwards.waiting.front() {
            if !self.ops.writes.contains_key(&op) {
                self.forwards.waiting.pop_front();
                continue;
            }
            if !self.forwards_fit(op) {
                break;
            }
            self.forwards.waiting.pop_front();
            let ready = self.start_client_write(op);
            self.run_ready(ready);
        }
    }
}
