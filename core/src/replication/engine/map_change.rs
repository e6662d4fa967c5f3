//! A new cluster map: extents this node no longer leads give up their
//! operations, new primaries and in-sync sets take effect.

use super::*;

impl Replicator {
    /// The control plane published a newer map. Extents this node no longer leads
    /// fail their operations (clients retry with the new map); extents it still
    /// leads stop waiting for replicas that left the in-sync set, which is when a
    /// write held up by a silent replica may be acknowledged.
    pub fn handle_map(&mut self, map: ClusterMap) {
        self.map = map;
        self.note_in_sync();
        self.claim_all();
        // A flush waits only for nodes still up.
        let up = self.map.state().up_nodes();
        let flushes: Vec<OpId> = self
            .ops
            .iter()
            .filter(|(_, o)| matches!(o, Op::Flush { .. }))
            .map(|(&id, _)| id)
            .collect();
        for op in flushes {
            let Some(Op::Flush { acks, .. }) = self.ops.get_mut(&op) else {
                continue;
            };
            if let Some(outcome) = acks.retain(|n| up.contains(&n)) {
                let Some(Op::Flush { client, req, .. }) = self.ops.remove(&op) else {
                    unreachable!("matched a flush above");
                };
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
            in_sync.extend(self.joining(extent));
            let writes: Vec<OpId> = self
                .ops
                .iter()
                .filter(|(_, o)| matches!(o, Op::Write { extent: e, acks: Some(_), .. } if *e == extent))
                .map(|(&id, _)| id)
                .collect();
            for op in writes {
                let Some(Op::Write {
                    acks: Some(acks), ..
                }) = self.ops.get_mut(&op)
                else {
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
    }

    /// Fail every operation of `extent` and forget its primary state.
    pub(super) fn abandon(&mut self, extent: ExtentId, error: WeirError) {
        let ops: Vec<OpId> = self
            .ops
            .iter()
            .filter(|(_, o)| match o {
                Op::Write { extent: e, .. }
                | Op::Read { extent: e, .. }
                | Op::Fetch { extent: e, .. }
                | Op::Rebuild(rebuild::Chunk { extent: e, .. })
                | Op::Reconcile { extent: e, .. } => *e == extent,
                Op::Repair(r) => r.locked && r.extent == extent,
                Op::Flush { .. } => false,
            })
            .map(|(&id, _)| id)
            .collect();
        for op in ops {
            match self.ops.remove(&op) {
                Some(Op::Write { client, req, .. } | Op::Read { client, req, .. }) => {
                    self.fail(client, req, error.clone())
                }
                Some(Op::Repair(r)) => {
                    if let Some((client, req)) = r.waiter {
                        self.fail(client, req, error.clone());
                    }
                }
                // The new primary rebuilds afresh; an asking replica asks it.
                Some(Op::Rebuild(_) | Op::Fetch { .. } | Op::Reconcile { .. }) => {}
                _ => unreachable!("selected above"),
            }
        }
        self.primary.remove(&extent);
    }
}
