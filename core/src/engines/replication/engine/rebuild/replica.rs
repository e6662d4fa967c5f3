//! Rebuild, the replica side: probes answered with the grains this replica lacks
//! (once no older write to them is in flight here), and copies written where the
//! copy's version wins (see [`super::takes`]; a broken grain always takes it),
//! acknowledged once on the device.

use super::*;

impl Replicator {
    /// A primary's copy arrived.
    pub(in crate::engines::replication::engine) fn rebuild_write(
        &mut self,
        primary: NodeId,
        op: OpId,
        copy: RebuildCopy,
    ) {
        let blocks = match self.check_rebuild_write(primary, &copy) {
            Ok(blocks) => blocks,
            Err(e) => {
                return self.send(primary, Message::RebuildAck { op, result: Err(e) });
            }
        };
        let RebuildCopy {
            lba,
            versions,
            data,
            ..
        } = copy;
        let gb = self.grains.grain_blocks();
        let bs = self.map.volume().block_size as usize * gb as usize;
        // Keep each grain the copy should replace (see `takes`), in contiguous runs.
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let reign = Version::epoch_floor(self.map.extent(copy.extent).primary_since);
        let first = self.grains.grain_of(lba);
        for (i, &v) in versions.iter().enumerate() {
            let g = first + i as u64;
            if !takes(self.grains.get(g).held(), v, reign) {
                continue;
            }
            self.grains.set(g, v, true);
            // Its data is the copy's now, of a version not known per block (the
            // grain's is only the newest of its blocks'): logged as the oldest,
            // so a retry of a write to it is applied again rather than taken as
            // done.
            let write = applied::Applied {
                lba: self.grains.start_of(g),
                blocks: gb,
                version: Version(0),
            };
            self.applied.note(None, write, self.now_ns);
            match runs.last_mut() {
                Some((start, len)) if *start + *len == i => *len += 1,
                _ => runs.push((i, 1)),
            }
        }
        self.rebuild.arrived(Incoming {
            primary,
            op,
            lba,
            blocks,
            ios_left: runs.len(),
            error: None,
            probe: None,
        });
        for (start, len) in runs {
            let io = self.io(IoPurpose::RebuildWrite { primary, op });
            let cmd = IoCmd::Write {
                lba: lba.offset(start as u64 * gb),
                data: data.slice(start * bs..(start + len) * bs),
                fua: false,
            };
            self.write_device(io, cmd);
        }
        self.answer_rebuilds();
    }

    /// A primary asks which part of a run of blocks this replica lacks: the blocks
    /// from the first it holds older than the primary's version to the last. The
    /// answer waits, like a copy's ack, for any older write to those blocks still
    /// in flight here (the versions it holds are claimed when a write arrives).
    pub(in crate::engines::replication::engine) fn rebuild_probe(
        &mut self,
        primary: NodeId,
        op: OpId,
        copy: RebuildCopy,
    ) {
        let gb = self.grains.grain_blocks();
        let blocks = copy.versions.len() as u64 * gb;
        let checked = if self.device_gone {
            Err(WeirError::Device(DevError::Gone))
        } else if !copy.lba.0.is_multiple_of(gb) {
            Err(WeirError::CrossesExtent)
        } else if copy.data.is_empty() {
            self.blocks_in_extent(
                copy.extent,
                copy.lba,
                blocks as usize * self.map.volume().block_size as usize,
            )
            .and_then(|_| {
                self.check_sender(primary, copy.extent, copy.epoch, false, |p, me| {
                    p.rebuilding.contains(&me)
                })
            })
        } else {
            Err(WeirError::BadLength {
                len: copy.data.len() as u64,
                block_size: self.map.volume().block_size,
                max_bytes: 0,
            })
        };
        if let Err(e) = checked {
            return self.send(primary, Message::RebuildProbeOk { op, result: Err(e) });
        }
        self.rebuild.arrived(Incoming {
            primary,
            op,
            lba: copy.lba,
            blocks,
            ios_left: 0,
            error: None,
            probe: Some(copy.versions),
        });
        self.answer_rebuilds();
    }

    /// The part of a probed run of grains at `lba` this replica lacks, as grain
    /// offsets: from the first it holds older than the primary's `versions` (or
    /// broken) to the last. Asked when the answer goes out, after the writes it
    /// waited for: one that failed has broken its grains by then.
    pub(super) fn lacking(&self, extent: ExtentId, lba: Lba, versions: &[Version]) -> (u32, u32) {
        let reign = Version::epoch_floor(self.map.extent(extent).primary_since);
        let first_grain = self.grains.grain_of(lba);
        let lacks = |(i, v): (usize, &Version)| {
            let held = self.grains.get(first_grain + i as u64).held();
            takes(held, *v, reign).then_some(i as u32)
        };
        let first = versions.iter().enumerate().find_map(lacks);
        let last = versions.iter().enumerate().rev().find_map(lacks);
        match (first, last) {
            (Some(a), Some(b)) => (a, b + 1),
            _ => (0, 0),
        }
    }

    fn check_rebuild_write(&self, primary: NodeId, copy: &RebuildCopy) -> Result<u64, WeirError> {
        let RebuildCopy {
            extent,
            epoch,
            lba,
            versions,
            data,
        } = copy;
        let blocks = self.blocks_in_extent(*extent, *lba, data.len())?;
        if !versions
            .iter()
            .all(|&v| crate::replication::grains::Grains::in_range(v))
        {
            return Err(WeirError::VersionRegression);
        }
        let gb = self.grains.grain_blocks();
        if !lba.0.is_multiple_of(gb) {
            return Err(WeirError::CrossesExtent);
        }
        if blocks != versions.len() as u64 * gb {
            return Err(WeirError::BadLength {
                len: data.len() as u64,
                block_size: self.map.volume().block_size,
                max_bytes: (versions.len() * gb as usize * self.map.volume().block_size as usize)
                    as u32,
            });
        }
        self.check_sender(primary, *extent, *epoch, false, |p, me| {
            p.rebuilding.contains(&me)
        })?;
        Ok(blocks)
    }

    /// A device write of copy `op` from `primary` finished.
    pub(in crate::engines::replication::engine) fn rebuild_io_done(
        &mut self,
        primary: NodeId,
        op: OpId,
        result: IoResult,
    ) {
        let error = match result {
            IoResult::Failed(e) => Some(e),
            _ => None,
        };
        if let Some((lba, blocks)) = self.rebuild.copy_written(primary, op, error) {
            // What the copy's grains hold is unknown now: break them, so a
            // probe asks for them again.
            for g in self.grains.touched(lba, blocks) {
                self.grains.break_grain(g);
            }
        }
    }
}
