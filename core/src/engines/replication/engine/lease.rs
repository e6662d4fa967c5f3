//! Leases: the engine's clock, when this node may serve an extent as its primary
//! (under its lease less the clocks' margin, after the previous primary's lease
//! has run out), and the claims it reports to the checkers.

use super::*;

impl Replicator {
    /// Record the replicas in sync at epochs after the restored ones.
    pub(super) fn note_in_sync(&mut self) {
        if self.restored.is_empty() {
            return;
        }
        for (&id, ext) in &self.map.state().extents {
            if self.restored.get(&id).is_none_or(|&e| ext.epoch > e) {
                self.seen_in_sync
                    .extend(ext.in_sync.iter().map(|&n| (id, n)));
            }
        }
    }

    /// The cluster clock reads `now_ns` and this node's lease runs until
    /// `lease_until_ns`. The driver calls this before every event.
    pub fn set_clock(&mut self, now_ns: u64, lease_until_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
        if lease_until_ns > self.lease_until_ns {
            self.lease_until_ns = lease_until_ns;
            self.claim_all();
        }
    }

    /// The time until which this node may serve, as a primary, under its lease.
    pub(super) fn lease_end(&self) -> u64 {
        if self.config.bugs().ignore_lease_margin {
            return self.lease_until_ns;
        }
        self.lease_until_ns
            .saturating_sub(self.config.lease_margin_ns)
    }

    /// The earliest time this node may serve `extent` as its primary.
    pub(super) fn serve_from(&self, extent: ExtentId) -> u64 {
        if self.config.bugs().serve_before_lease {
            return 0;
        }
        self.map.extent(extent).serve_after_ns
    }

    /// Whether this node, restarted, may not lead `extent` yet: its
    /// `Restarted` is not applied, or the extent's epoch has not moved past
    /// the one its log ended at (what it held then, it may have lost).
    pub(super) fn fenced_by_restart(&self, extent: ExtentId) -> bool {
        self.restart_fence
            || self
                .restored
                .get(&extent)
                .is_some_and(|&e| self.map.extent(extent).epoch <= e)
    }

    /// May this node serve `extent` now? (It is the primary: checked before.)
    pub(super) fn may_serve(&self, extent: ExtentId) -> Result<(), WeirError> {
        debug_assert_eq!(
            self.map.extent(extent).primary,
            self.me,
            "may_serve asked of {extent}'s replica"
        );
        if self.now_ns < self.lease_end()
            && self.now_ns >= self.serve_from(extent)
            && !self.fenced_by_restart(extent)
            && self.reconciled(extent)
        {
            Ok(())
        } else {
            Err(WeirError::NoLease(self.me))
        }
    }

    /// Report, for the checkers, every extent this node may now serve, and until when.
    pub(super) fn claim_all(&mut self) {
        if !self.config.audit || self.restart_fence {
            return;
        }
        let led: Vec<(ExtentId, Epoch)> = self
            .map
            .state()
            .extents
            .iter()
            .filter(|(_, e)| e.primary == self.me && e.in_sync.contains(&self.me))
            .map(|(&id, e)| (id, e.epoch))
            // Not at an epoch it may have served in before a restart.
            .filter(|(id, epoch)| self.restored.get(id).is_none_or(|r| epoch > r))
            .filter(|(id, _)| self.reconciled(*id))
            .collect();
        let until_ns = self.lease_end();
        for (extent, epoch) in led {
            let from_ns = self.now_ns.max(self.serve_from(extent));
            if from_ns < until_ns {
                self.actions.push_back(Action::Audit(Audit::Claim {
                    extent,
                    epoch,
                    made_ns: self.now_ns,
                    from_ns,
                    until_ns,
                }));
            }
        }
    }

    pub(super) fn audit(&mut self, fact: Audit) {
        if self.config.audit {
            self.actions.push_back(Action::Audit(fact));
        }
    }
}
