//! Block-version checkpoints: what a node writes down so that, restarted, it
//! knows which versions its device holds, and a rebuild's probe asks only for
//! blocks written since (see `rebuild`).
//!
//! A version may be written down only once its data is durable. So:
//!
//! - Every device write carries the versions claimed for its blocks. When it
//!   completes, those versions become *dirty* (completed, not yet durable for
//!   sure: the device may still hold them in its volatile cache).
//! - Every [`ReplicationConfig::checkpoint_every_ns`], if anything is dirty, the
//!   engine takes the dirty versions and issues a device flush. A flush makes
//!   durable every write completed before it was issued, so once it completes the
//!   versions taken are durable: the driver writes them down
//!   ([`Action::Checkpoint`]). One checkpoint is in flight at a time; a failed flush
//!   puts a delta's versions back (a failed full checkpoint is taken again whole).
//! - A device write that fails leaves its blocks' contents unknown. Their versions
//!   are forgotten at once (written down without a flush: forgetting is always
//!   safe), and taken out of the checkpoint in flight, which must not write them
//!   back.
//!
//! A restored version is a lower bound: the device holds that version of the block
//! or a later one (a later write may have reached the device after the checkpoint,
//! or been lost with its cache). A probe then asks for anything newer, so a lower
//! bound never makes a replica skip a block it lacks.
//!
//! The first checkpoint after a start, and one whenever the deltas written since
//! the last full checkpoint outgrow it, is full: every version the node holds,
//! except blocks with a write still in flight (their completed version is not
//! known here; leaving them out is safe), replacing the file.

use super::*;
use crate::replication::versions::{runs, VersionRun};

/// Deltas may add up to this many runs, plus twice the last full checkpoint's,
/// before the next checkpoint is a full one.
const FULL_SLACK_RUNS: usize = 1 << 16;

/// Checkpoint state of one node.
#[derive(Debug, Default)]
pub(super) struct Checkpoints {
    /// Versions of writes completed since the last checkpoint was taken (0:
    /// forgotten).
    dirty: BTreeMap<Lba, Version>,
    /// The checkpoint whose flush is in flight: its flush, its versions, and
    /// whether it is full.
    pending: Option<(IoId, BTreeMap<Lba, Version>, bool)>,
    /// No checkpoint is taken before this time.
    next_ns: u64,
    /// A full checkpoint was written since the start.
    based: bool,
    /// Runs written in deltas since the last full checkpoint, and in it.
    delta_runs: usize,
    full_runs: usize,
    /// Checkpoints written, and versions (blocks) in them.
    pub(super) written: u64,
    pub(super) blocks_written: u64,
    /// Checkpoints taken (flush issued), and finished (written, empty or failed).
    taken: u64,
    finished: u64,
    /// One was asked for while another was in flight: take it when that ends.
    again: bool,
}

impl Replicator {
    /// Restart from checkpointed `versions` (see `versions::replay`): each is a
    /// lower bound on what the device holds for its block. The first checkpoint
    /// after this is a full one.
    pub fn restore_versions(&mut self, versions: BTreeMap<Lba, Version>) {
        let capacity = self.map.volume().capacity_blocks;
        self.block_versions = versions
            .into_iter()
            .filter(|(l, v)| l.0 < capacity && v.0 > 0)
            .collect();
    }

    /// Block versions this node holds, in block order (for checks).
    pub fn block_versions(&self) -> impl Iterator<Item = (Lba, Version)> + '_ {
        self.block_versions.iter().map(|(&l, &v)| (l, v))
    }

    /// Checkpoints written so far, and the block versions they held.
    pub fn checkpoints_written(&self) -> (u64, u64) {
        (self.checkpoint.written, self.checkpoint.blocks_written)
    }

    /// A device write at `lba` carrying `versions` finished: its versions are
    /// completed, or, if it failed, forgotten (here, in the checkpoint in flight,
    /// and in the file at once).
    pub(super) fn device_write_done(&mut self, lba: Lba, versions: Vec<Version>, ok: bool) {
        let enabled = self.config.checkpoint_every_ns > 0;
        let mut forgotten = BTreeMap::new();
        for (i, v) in versions.into_iter().enumerate() {
            let b = Lba(lba.0 + i as u64);
            if v.0 == 0 {
                continue;
            }
            if ok {
                if enabled {
                    // Writes to a block complete in the order they were issued
                    // (`write_device`): the last one is what the block holds.
                    self.checkpoint.dirty.insert(b, v);
                }
                continue;
            }
            // Unless a later write has claimed the block since.
            if self.block_versions.get(&b) == Some(&v) {
                self.block_versions.remove(&b);
            }
            if enabled {
                self.checkpoint.dirty.insert(b, Version(0));
                if let Some((_, pending, _)) = &mut self.checkpoint.pending {
                    pending.remove(&b);
                }
                forgotten.insert(b, Version(0));
            }
        }
        if !forgotten.is_empty() {
            let runs = runs(&forgotten);
            // Counted like a delta's, so a device that keeps failing writes still
            // gets its file compacted.
            self.checkpoint.delta_runs += runs.len();
            self.actions
                .push_back(Action::Checkpoint { runs, full: false });
        }
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
            let mut all = self.block_versions.clone();
            for (lba, vs) in self.device_writes.values() {
                for b in lba.0..lba.0 + vs.len() as u64 {
                    all.remove(&Lba(b));
                }
            }
            all
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
        versions: BTreeMap<Lba, Version>,
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
        let runs: Vec<VersionRun> = runs(&versions);
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
        c.blocks_written += versions.len() as u64;
        self.actions.push_back(Action::Checkpoint { runs, full });
    }
}
