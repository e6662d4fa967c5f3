//! Rebuild, the replica side: probes answered with the blocks this replica lacks
//! (once no older write to them is in flight here), and copies written where the
//! copy's version wins (see [`super::takes`]), acknowledged once on the device.

use super::*;

impl Replicator {
    /// A primary's copy arrived.
    pub(in crate::replication::engine) fn rebuild_write(
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
        let bs = self.map.volume().block_size as usize;
        // Keep each block the copy should replace (see `takes`), in contiguous runs.
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let reign = Version::epoch_floor(self.map.extent(copy.extent).primary_since);
        for (i, &v) in versions.iter().enumerate() {
            let b = Lba(lba.0 + i as u64);
            if !takes(
                self.block_versions.get(&b).copied().unwrap_or_default(),
                v,
                reign,
            ) {
                continue;
            }
            self.note_renumbered(b, 1, None);
            self.block_versions.insert(b, v);
            match runs.last_mut() {
                Some((start, len)) if *start + *len == i => *len += 1,
                _ => runs.push((i, 1)),
            }
        }
        self.rebuild.incoming.push(Incoming {
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
                lba: Lba(lba.0 + start as u64),
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
    pub(in crate::replication::engine) fn rebuild_probe(
        &mut self,
        primary: NodeId,
        op: OpId,
        copy: RebuildCopy,
    ) {
        let blocks = copy.versions.len() as u64;
        let checked = if self.device_gone {
            Err(WeirError::Device(DevError::Gone))
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
        self.rebuild.incoming.push(Incoming {
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

    /// The part of a probed run at `lba` this replica lacks, as offsets: from the
    /// first block it holds older than the primary's `versions` to the last. Asked
    /// when the answer goes out, after the writes it waited for: one that failed
    /// has made its blocks' versions forgotten by then.
    pub(super) fn lacking(&self, extent: ExtentId, lba: Lba, versions: &[Version]) -> (u32, u32) {
        let reign = Version::epoch_floor(self.map.extent(extent).primary_since);
        let lacks = |(i, v): (usize, &Version)| {
            let held = self.block_versions.get(&Lba(lba.0 + i as u64));
            takes(held.copied().unwrap_or_default(), *v, reign).then_some(i as u32)
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
        if blocks != versions.len() as u64 {
            return Err(WeirError::BadLength {
                len: data.len() as u64,
                block_size: self.map.volume().block_size,
                max_bytes: (versions.len() * self.map.volume().block_size as usize) as u32,
            });
        }
        self.check_sender(primary, *extent, *epoch, false, |p, me| {
            p.rebuilding.contains(&me)
        })?;
        Ok(blocks)
    }

    /// A device write of copy `op` from `primary` finished.
    pub(in crate::replication::engine) fn rebuild_io_done(
        &mut self,
        primary: NodeId,
        op: OpId,
        result: IoResult,
    ) {
        if let Some(inc) = self
            .rebuild
            .incoming
            .iter_mut()
            .find(|i| i.primary == primary && i.op == op)
        {
            inc.ios_left -= 1;
            if let IoResult::Failed(e) = result {
                inc.error.get_or_insert(e);
                // What the copy's blocks hold is unknown now: forget their
                // versions, so a probe asks for them again.
                let (lba, blocks) = (inc.lba, inc.blocks);
                let stale: Vec<Lba> = self
                    .block_versions
                    .range(lba..lba.offset(blocks))
                    .map(|(&l, _)| l)
                    .collect();
                for l in stale {
                    self.block_versions.remove(&l);
                }
            }
        }
    }
}
