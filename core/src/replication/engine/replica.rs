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
        (version, settled): (Version, Version),
        origin: (NodeId, RequestId),
        lba: Lba,
        data: Bytes,
        fua: bool,
    ) {
        let checked = self.check_replica_write(primary, extent, epoch, lba, &data);
        let result = checked.and_then(|blocks| self.claim_version(lba, blocks, version));
        if let Err(e) = result {
            return self.send(primary, Message::ReplicaWriteAck { op, result: Err(e) });
        }
        let blocks = self.blocks_of(&data);
        self.note_tail(extent, version, lba, blocks, settled);
        // A primary's write-back names itself as the client, and the version of
        // its data as the request.
        let internal = origin.0 == primary;
        self.note_renumbered(lba, blocks, internal.then_some(Version(origin.1 .0)));
        if !internal {
            let write = applied::Applied {
                lba,
                blocks,
                version,
            };
            self.applied.note(origin, write, self.now_ns);
        }
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
        if self.config.bug_accept_stale_epoch && epoch < self.map.extent(extent).epoch {
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
        let Some(first) = self.applied.get((client, req)) else {
            return false;
        };
        // A block written back by a reconciliation holds older data than its
        // version says: what counts is the version of its data.
        let newer = |b: u64| self.data_version(Lba(b)).is_some_and(|v| v > first.version);
        first.lba == lba && (lba.0..lba.0 + first.blocks).all(newer)
    }

    /// Record that `version` is written to `[lba, lba + blocks)`, refusing to go
    /// backwards on any block: the primary orders overlapping writes, so a replica
    /// that sees an older version over a newer one has been sent messages out of order.
    pub(super) fn claim_version(
        &mut self,
        lba: Lba,
        blocks: u64,
        version: Version,
    ) -> Result<(), WeirError> {
        let end = lba.offset(blocks);
        if self
            .block_versions
            .range(lba..end)
            .any(|(_, &v)| v >= version)
        {
            return Err(WeirError::VersionRegression);
        }
        for b in lba.0..end.0 {
            self.block_versions.insert(Lba(b), version);
        }
        Ok(())
    }

    /// Version of the last write this node applied to `lba`, if any.
    pub fn block_version(&self, lba: Lba) -> Option<Version> {
        self.block_versions.get(&lba).copied()
    }
}
