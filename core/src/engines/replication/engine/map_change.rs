//! A new cluster map: extents this node no longer leads give up their
//! operations, new primaries and in-sync sets take effect.

use super::*;

impl Replicator {
    /// The control plane published a newer map. Extents this node no longer leads
    /// fail their operations (clients retry with the new map); extents it still
    /// leads stop waiting for replicas that left the in-sync set, which is when a
    /// write held up by a silent replica may be acknowledged.
    pub fn handle_map(&mut self, map: ClusterMap) {
        // Maps only move forward: an extent's epoch never goes back.
        debug_assert!(
            map.state()
                .extents
                .iter()
                .all(|(id, e)| e.epoch >= self.map.extent(*id).epoch),
            "a map from the past"
        );
        self.map = map;
        self.note_in_sync();
        self.claim_all();
        // A flush waits only for nodes still up.
        let up = self.map.state().up_nodes();
        let flushes: Vec<OpId> = self.ops.flushes.keys().copied().collect();
        for op in flushes {
            let acks = &mut self.ops.flushes.get_mut(&op).expect("listed").acks;
            if let Some(outcome) = acks.retain(|n| up.contains(&n)) {
                let FlushOp { client, req, .. } = self.ops.flushes.remove(&op).expect("listed");
                self.reply(client, req, outcome.map(|()| Message::FlushOk { req }));
            }
        }
        let led: Vec<ExtentId> = self.primary.keys().copied().collect();
        for extent in led {
            let now = self.map.extent(extent);
            if now.primary != self.me || !now.in_sync.contains(&self.me) {
                self.abandon(extent, WeirError::NotPrimary(self.me));
                continue;
            }
            let mut in_sync = now.in_sync.clone();
            let joined = in_sync.clone();
            in_sync.extend(self.rebuild.joining(extent));
            let writes: Vec<OpId> = self
                .ops
                .writes
                .iter()
                .filter(|(_, w)| w.extent == extent && w.acks.is_some())
                .map(|(&id, _)| id)
                .collect();
            for op in writes {
                // Each finished write unlocks others, which may finish at once.
                let Some(acks) = self.ops.writes.get_mut(&op).and_then(|w| w.acks.as_mut()) else {
                    continue;
                };
                // A replica that joined the in-sync set while this write ran is
                // waited for too, unless it already answered.
                for &node in &joined {
                    acks.promote(node);
                }
                if let Some(outcome) = acks.retain(|n| in_sync.contains(&n)) {
                    self.finish_write(op, outcome);
                }
            }
        }
        self.rebuilds_after_map();
        self.reconcile_after_map();
        // Writes failed meanwhile may have made room in a replica's window.
        self.start_waiting_forwards();
    }

    /// Fail every operation of `extent` and forget its primary state.
    pub(super) fn abandon(&mut self, extent: ExtentId, error: WeirError) {
        for op in self.ops.of_extent(extent) {
            let waiter = match self.ops.kind(op) {
                Some(Kind::Write) => {
                    self.forwards.ended(op);
                    self.ops.writes.remove(&op).map(|w| (w.client, w.req))
                }
                Some(Kind::Read) => self.ops.reads.remove(&op).map(|r| (r.client, r.req)),
                Some(Kind::Repair) => self.ops.repairs.remove(&op).and_then(|r| r.waiter),
                // The new primary rebuilds afresh; an asking replica asks it.
                Some(Kind::Rebuild) => {
                    self.ops.chunks.remove(&op);
                    None
                }
                Some(Kind::Fetch) => {
                    self.ops.fetches.remove(&op);
                    None
                }
                Some(Kind::WriteBack) => {
                    self.ops.write_backs.remove(&op);
                    None
                }
                // A flush holds no range lock; an op already gone is let be.
                Some(Kind::Flush) | None => None,
            };
            if let Some((client, req)) = waiter {
                self.fail(client, req, error.clone());
            }
        }
        self.primary.remove(&extent);
    }
}
