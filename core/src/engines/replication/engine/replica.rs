//! The replica side: writes forwarded by a primary, checked against the map's
//! epoch, primary and membership, and the versions claimed for their blocks.

use super::*;

impl Replicator {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn replica_write(
        &mut self,
        primary: NodeId,
        op: OpId,
        extent: ExtentId,
        epoch: Epoch,
        (version, prev, settled): (Version, (Version, Version), Version),
        origin: (NodeId, RequestId),
        lba: Lba,
        data: Bytes,
        fua: bool,
    ) {
        if data.is_empty() && origin.0 .0 >= crate::ids::FRONT_END_ID_BASE {
            // The node took no data from its front end for it (see `front_end`).
            let result = Err(WeirError::PayloadNotHeld);
            return self.send(primary, Message::ReplicaWriteAck { op, result });
        }
        let checked = self.check_replica_write(primary, extent, epoch, lba, &data);
        let result = checked.and_then(|blocks| self.grains.claim(lba, blocks, version, prev));
        if let Err(e) = result {
            return self.send(primary, Message::ReplicaWriteAck { op, result: Err(e) });
        }
        let blocks = self.blocks_of(&data);
        self.reconcile
            .note_tail(extent, version, lba, blocks, settled);
        // A primary's write-back names itself as the client, and the version of
        // its data as the request.
        self.note_applied(origin, primary, lba, blocks, version);
        let fact = Audit::Accepted {
            extent,
            epoch,
            map_epoch: self.map.extent(extent).epoch,
            at_ns: self.now_ns,
        };
        self.audit(fact);
        let blocks = self.blocks_of(&data);
        let io = self.io(IoPurpose::ReplicaWrite {
            primary,
            op,
            lba,
            blocks,
            version,
        });
        self.write_device(io, IoCmd::Write { lba, data, fua });
        debug_assert!(
            self.writing_to(lba, blocks),
            "a replica write not in flight"
        );
    }

    pub(super) fn check_replica_write(
        &self,
        primary: NodeId,
        extent: ExtentId,
        epoch: Epoch,
        lba: Lba,
        data: &Bytes,
    ) -> Result<u64, WeirError> {
        let blocks = self.blocks_in_extent(extent, lba, data.len())?;
        if self.config.bugs().accept_stale_epoch && epoch < self.map.extent(extent).epoch {
            return Ok(blocks);
        }
        self.check_sender(primary, extent, epoch, true, |p, me| {
            p.in_sync.contains(&me) || p.rebuilding.contains(&me)
        })?;
        Ok(blocks)
    }

    /// The blocks of a `len`-byte request at `lba`, which must lie in `extent`.
    pub(super) fn blocks_in_extent(
        &self,
        extent: ExtentId,
        lba: Lba,
        len: usize,
    ) -> Result<u64, WeirError> {
        let blocks = self.map.blocks_in(len)?;
        if self.map.locate(self.map.volume().id, lba, blocks)? != extent {
            return Err(WeirError::CrossesExtent);
        }
        Ok(blocks)
    }

    /// Is `primary`, sending at `epoch`, the primary of `extent` to this node, and
    /// does `role` say this node takes its writes? The epoch must be this node's, or
    /// newer too if `newer_ok` (this node's map may lag).
    pub(super) fn check_sender(
        &self,
        primary: NodeId,
        extent: ExtentId,
        epoch: Epoch,
        newer_ok: bool,
        role: impl Fn(&crate::control::state::ExtentState, NodeId) -> bool,
    ) -> Result<(), WeirError> {
        let placement = self.map.extent(extent);
        if epoch < placement.epoch || (epoch > placement.epoch && !newer_ok) {
            return Err(WeirError::StaleEpoch {
                got: epoch,
                current: placement.epoch,
            });
        }
        if placement.primary != primary || !role(placement, self.me) {
            return Err(WeirError::NotPrimary(primary));
        }
        Ok(())
    }

    /// Whether the write of (`client`, `req`) at `lba` is a retry of one this node
    /// applied whose every block a newer write has overwritten since.
    pub(super) fn superseded(&self, client: NodeId, req: RequestId, lba: Lba) -> bool {
        // A block written back by a reconciliation holds older data than its
        // version says: the log compares the version of its data.
        self.applied.superseded((client, req), lba)
    }

    /// The version of the grain holding `lba`, if this node holds all of it (it
    /// was written here and no write to it was missed or failed).
    pub fn block_version(&self, lba: Lba) -> Option<Version> {
        let v = self.grains.get(self.grains.grain_of(lba)).held();
        (v.0 > 0).then_some(v)
    }
}
