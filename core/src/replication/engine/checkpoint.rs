//! Version checkpoints: what a node writes down so that, restarted, it knows
//! which versions its device holds, and a rebuild's probe asks only for grains
//! written since (see `rebuild`). The file holds runs of blocks (see
//! `versions`); the engine writes whole version grains.
//!
//! A version may be written down only once its data is durable. So:
//!
//! - When the last device write in flight to a grain completes, the grain's
//!   version is what the device holds: it becomes *dirty* (completed, not yet
//!   durable for sure: the device may still hold it in its volatile cache).
//! - Every [`ReplicationConfig::checkpoint_every_ns`], if anything is dirty, the
//!   engine takes the dirty versions and issues a device flush. A flush makes
//!   durable every write completed before it was issued, so once it completes the
//!   versions taken are durable: the driver writes them down
//!   ([`Action::Checkpoint`]). One checkpoint is in flight at a time; a failed flush
//!   puts a delta's versions back (a failed full checkpoint is taken again whole).
//! - A device write that fails leaves its blocks' contents unknown. Their grains
//!   are broken and forgotten at once (written down without a flush: forgetting
//!   is always safe), and taken out of the checkpoint in flight, which must not
//!   write them back.
//!
//! A restored version is a lower bound: the device holds that version of the block
//! or a later one (a later write may have reached the device after the checkpoint,
//! or been lost with its cache). A probe then asks for anything newer, so a lower
//! bound never makes a replica skip a block it lacks.
//!
//! The first checkpoint after a start, and one whenever the deltas written since
//! the last full checkpoint outgrow it, is full: every version the node holds,
//! except grains with a write still in flight (their completed version is not
//! known here; leaving them out is safe) and broken ones, replacing the file.

use super::*;
use crate::replication::versions::{runs_by, VersionRun};

/// Deltas may add up to this many runs, plus twice the last full checkpoint's,
/// before the next checkpoint is a full one.
const FULL_SLACK_RUNS: usize = 1 << 16;

/// Checkpoint state of one node.
#[derive(Debug, Default)]
pub(super) struct Checkpoints {
    /// Versions of grains whose writes completed since the last checkpoint was
    /// taken, by grain (0: forgotten).
    dirty: BTreeMap<u64, Version>,
    /// The checkpoint whose flush is in flight: its flush, its versions, and
    /// whether it is full.
    pending: Option<(IoId, BTreeMap<u64, Version>, bool)>,
    /// No checkpoint is taken before this time.
    next_ns: u64,
    /// A full checkpoint was written since the start.
    based: bool,
    /// Runs written in deltas since the last full checkpoint, and in it.
    delta_runs: usize,
    full_runs: usize,
    /// Checkpoints written, and the blocks their versions covered.
    pub(super) written: u64,
    pub(super) blocks_written: u64,
    /// Checkpoints taken (flush issued), and finished (written, empty or failed).
    taken: u64,
    finished: u64,
    /// One was asked for while another was in flight: take it when that ends.
    again: bool,
}

impl Replicator {
    /// Restart from checkpointed `versions`, by first block of each grain (see
    /// `versions::replay`): each is a lower bound on what the device holds for
    /// its grain. The first checkpoint after this is a full one.
    pub fn restore_versions(&mut self, versions: BTreeMap<Lba, Version>) {
        let capacity = self.map.volume().capacity_blocks;
        let gb = self.grains.grain_blocks();
        for (l, v) in versions {
            let fits = crate::replication::grains::Grains::in_range(v);
            if l.0 < capacity && l.0.is_multiple_of(gb) && v.0 > 0 && fits {
                self.grains.set(self.grains.grain_of(l), v, true);
            }
        }
    }

    /// Grains this node holds whole, by first block, with their versions, in
    /// block order (for checks).
    pub fn grain_versions(&self) -> impl Iterator<Item = (Lba, Version)> + '_ {
        self.grains
            .written(0, u64::MAX)
            .filter(|(_, g)| g.whole && g.version.0 > 0)
            .map(|(i, g)| (self.grains.start_of(i), g.version))
    }

    /// Blocks per version grain.
    pub fn grain_blocks(&self) -> u64 {
        self.grains.grain_blocks()
    }

    /// Bytes of version state this node keeps per data written (its grains),
    /// and the records of its applied log (bounded, see `applied`).
    pub fn version_memory(&self) -> (u64, u64) {
        (
            self.grains.footprint().1 as u64,
            self.applied.records() as u64,
        )
    }

    /// Checkpoints written so far, and the blocks their versions covered.
    pub fn checkpoints_written(&self) -> (u64, u64) {
        (self.checkpoint.written, self.checkpoint.blocks_written)
    }

    /// A device write finished: each grain it touched with no other write in
    /// flight holds its version now (dirty); if it failed, the grains are broken
    /// and forgotten (here, in the checkpoint in flight, and in the file at once).
    pub(super) fn device_write_done(&mut self, done: &crate::sched::Finished, ok: bool) {
        debug_assert_eq!(done.grains, self.grains.touched(done.lba, done.blocks));
        let enabled = self.config.checkpoint_every_ns > 0;
        let mut forgotten = BTreeMap::new();
        for g in done.grains.clone() {
            if !ok {
                self.grains.break_grain(g);
                if enabled {
                    self.checkpoint.dirty.insert(g, Version(0));
                    if let Some((_, pending, _)) = &mut self.checkpoint.pending {
                        pending.remove(&g);
                    }
                    forgotten.insert(g, Version(0));
                }
            } else if enabled && done.idle.contains(&g) {
                self.checkpoint.dirty.insert(g, self.grains.get(g).held());
            }
        }
        if !forgotten.is_empty() {
            let runs = self.grain_runs(&forgotten);
            // Counted like a delta's, so a device that keeps failing writes still
            // gets its file compacted.
            self.checkpoint.delta_runs += runs.len();
            self.actions
                .push_back(Action::Checkpoint { runs, full: false });
        }
    }

    /// Runs of blocks at one version, from versions by grain.
    fn grain_runs(&self, versions: &BTreeMap<u64, Version>) -> Vec<VersionRun> {
        let gb = self.grains.grain_blocks();
        runs_by(versions.iter().map(|(&g, &v)| (g, v)), u64::MAX)
            .into_iter()
            .map(|(g, n, v)| (Lba(g * gb), n * gb, v))
            .collect()
    }

    /// Take a checkpoint now, of every write completed so far (a clean shutdown
    /// asks for one). Returns its number: it is written down (or has failed) once
    /// [`Replicator::checkpoints_finished`] reaches it. `None` if checkpoints are
    /// off or the device is gone.
    pub fn checkpoint_now(&mut self) -> Option<u64> {
        if self.config.checkpoint_every_ns == 0 || self.device_gone {
            return None;
        }
        if self.checkpoint.pending.is_some() {
            // That one was taken before now: the next one covers now.
            self.checkpoint.again = true;
            return Some(self.checkpoint.taken + 1);
        }
        self.take_checkpoint();
        Some(self.checkpoint.taken)
    }

    /// Checkpoints finished so far (see [`Replicator::checkpoint_now`]).
    pub fn checkpoints_finished(&self) -> u64 {
        self.checkpoint.finished
    }

    /// Take a checkpoint if one is due.
    pub(super) fn checkpoint_tick(&mut self) {
        let every = self.config.checkpoint_every_ns;
        let c = &self.checkpoint;
        if every == 0
            || self.device_gone
            || c.pending.is_some()
            || self.now_ns < c.next_ns
            || (c.based && c.dirty.is_empty())
        {
            return;
        }
        self.take_checkpoint();
    }

    /// Take the dirty versions (or all of them, for a full checkpoint) and issue
    /// the flush that makes them durable.
    fn take_checkpoint(&mut self) {
        let c = &self.checkpoint;
        let full = !c.based || c.delta_runs > 2 * c.full_runs + FULL_SLACK_RUNS;
        let dirty = std::mem::take(&mut self.checkpoint.dirty);
        let versions = if full {
            self.grains
                .written(0, u64::MAX)
                .filter(|(g, s)| s.whole && !self.writes.grain_busy(*g))
                .map(|(g, s)| (g, s.version))
                .collect()
        } else {
            dirty
        };
        let io = self.io(IoPurpose::Checkpoint);
        self.checkpoint.pending = Some((io, versions, full));
        self.checkpoint.taken += 1;
        self.checkpoint.next_ns = self.now_ns + self.config.checkpoint_every_ns;
        self.actions.push_back(Action::Io {
            io,
            cmd: IoCmd::Flush,
        });
    }

    /// The flush of the checkpoint in flight finished.
    pub(super) fn checkpoint_flushed(&mut self, io: IoId, result: IoResult) {
        let Some((flush, versions, full)) = self.checkpoint.pending.take() else {
            return;
        };
        debug_assert_eq!(flush, io, "one checkpoint at a time");
        self.write_checkpoint(versions, full, result);
        self.checkpoint.finished += 1;
        if std::mem::take(&mut self.checkpoint.again) {
            if self.device_gone {
                // The one asked for cannot be taken: it counts as finished, so
                // whoever waits for it is answered.
                self.checkpoint.taken += 1;
                self.checkpoint.finished += 1;
            } else {
                self.take_checkpoint();
            }
        }
    }

    /// Write down a checkpoint whose flush completed, or put its versions back if
    /// the flush failed.
    fn write_checkpoint(
        &mut self,
        versions: BTreeMap<u64, Version>,
        full: bool,
        flushed: IoResult,
    ) {
        if let Err(e) = io_unit(flushed) {
            tracing::warn!(error = %e, "checkpoint flush failed; versions kept for the next");
            if !full {
                for (b, v) in versions {
                    // A later completion or forget is newer than what was taken.
                    self.checkpoint.dirty.entry(b).or_insert(v);
                }
            }
            return;
        }
        let runs: Vec<VersionRun> = self.grain_runs(&versions);
        let c = &mut self.checkpoint;
        if full {
            c.based = true;
            c.full_runs = runs.len();
            c.delta_runs = 0;
        } else {
            c.delta_runs += runs.len();
        }
        if runs.is_empty() && !full {
            // Everything taken was forgotten since (or nothing was dirty).
            return;
        }
        c.written += 1;
        c.blocks_written += versions.len() as u64 * self.grains.grain_blocks();
        self.actions.push_back(Action::Checkpoint { runs, full });
    }
}
