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

impl Checkpoints {
    /// The last write in flight to grain `g` completed: the device holds
    /// `version` there now (not yet durable for sure).
    fn completed(&mut self, g: u64, version: Version) {
        self.dirty.insert(g, version);
    }

    /// Grain `g`'s contents are unknown (a write to it failed): forget it, in
    /// the next checkpoint and in the one in flight, which must not write it.
    fn forget(&mut self, g: u64) {
        self.dirty.insert(g, Version(0));
        if let Some((_, pending, _)) = &mut self.pending {
            pending.remove(&g);
        }
    }

    /// Whether a checkpoint is due at `now_ns`: none in flight, the interval
    /// passed, and something to write (a first, full one always has).
    fn due(&self, now_ns: u64) -> bool {
        self.pending.is_none() && now_ns >= self.next_ns && !(self.based && self.dirty.is_empty())
    }

    /// Whether the next checkpoint must be full: the first since the start, or
    /// the deltas since the last full one have outgrown it.
    fn next_is_full(&self) -> bool {
        !self.based || self.delta_runs > 2 * self.full_runs + FULL_SLACK_RUNS
    }

    /// Checkpoint `flush` is taken, of `versions` (the dirty ones if `None`):
    /// its flush goes to the device now; the next is due `every_ns` after `now_ns`.
    fn take(
        &mut self,
        flush: IoId,
        all: Option<BTreeMap<u64, Version>>,
        now_ns: u64,
        every_ns: u64,
    ) {
        assert!(self.pending.is_none(), "one checkpoint at a time");
        let dirty = std::mem::take(&mut self.dirty);
        let full = all.is_some();
        self.pending = Some((flush, all.unwrap_or(dirty), full));
        self.taken += 1;
        self.next_ns = now_ns + every_ns;
    }

    /// The flush of the checkpoint in flight finished: its versions and whether
    /// it is full, if `io` was that flush.
    fn flushed(&mut self, io: IoId) -> Option<(BTreeMap<u64, Version>, bool)> {
        let (flush, versions, full) = self.pending.take()?;
        assert_eq!(flush, io, "one checkpoint at a time");
        Some((versions, full))
    }

    /// The flush of a delta failed: its versions are taken again next time,
    /// unless a later completion or forget replaced them.
    fn put_back(&mut self, versions: BTreeMap<u64, Version>) {
        for (g, v) in versions {
            self.dirty.entry(g).or_insert(v);
        }
    }

    /// A checkpoint of `runs` runs (full or a delta) whose versions cover
    /// `blocks` blocks is written down (a delta of no runs is not written).
    fn written(&mut self, runs: usize, full: bool, blocks: u64) {
        if full {
            self.based = true;
            self.full_runs = runs;
            self.delta_runs = 0;
        } else {
            self.delta_runs += runs;
        }
        if runs > 0 || full {
            self.written += 1;
            self.blocks_written += blocks;
        }
    }

    /// Forgotten grains were written down at once, in `runs` runs: counted like
    /// a delta's, so a device that keeps failing writes still gets its file
    /// compacted.
    fn forgotten(&mut self, runs: usize) {
        self.delta_runs += runs;
    }

    /// A checkpoint is asked for now: `Some` of its number if one is in flight
    /// (it was taken before now: the next one, taken when it ends, covers now);
    /// `None` if one may be taken at once.
    fn ask(&mut self) -> Option<u64> {
        self.pending.is_some().then(|| {
            self.again = true;
            self.taken + 1
        })
    }

    /// The checkpoint in flight finished (written, or failed); whether another
    /// was asked for meanwhile.
    fn finish(&mut self) -> bool {
        self.finished += 1;
        std::mem::take(&mut self.again)
    }

    /// One asked for cannot be taken (the device is gone): it counts as taken
    /// and finished, so whoever waits for it is answered.
    fn skip(&mut self) {
        self.taken += 1;
        self.finished += 1;
    }

    /// Check the bookkeeping; panics on a broken invariant.
    pub(super) fn self_check(&self) {
        assert!(self.finished <= self.taken, "finished more than taken");
        assert_eq!(
            self.taken - self.finished,
            u64::from(self.pending.is_some()),
            "checkpoints in flight"
        );
        assert!(
            self.pending.is_some() || !self.again,
            "again without one in flight"
        );
        assert!(
            self.based || self.full_runs == 0,
            "runs of no full checkpoint"
        );
    }
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
                    self.checkpoint.forget(g);
                    forgotten.insert(g, Version(0));
                }
            } else if enabled && done.idle.contains(&g) {
                self.checkpoint.completed(g, self.grains.get(g).held());
            }
        }
        if !forgotten.is_empty() {
            let runs = self.grain_runs(&forgotten);
            self.checkpoint.forgotten(runs.len());
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
        if let Some(next) = self.checkpoint.ask() {
            return Some(next);
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
        if self.config.checkpoint_every_ns == 0 || self.device_gone {
            return;
        }
        if self.checkpoint.due(self.now_ns) {
            self.take_checkpoint();
        }
    }

    /// Take the dirty versions (or all of them, for a full checkpoint) and issue
    /// the flush that makes them durable.
    fn take_checkpoint(&mut self) {
        let all = self.checkpoint.next_is_full().then(|| {
            self.grains
                .written(0, u64::MAX)
                .filter(|(g, s)| s.whole && !self.writes.grain_busy(*g))
                .map(|(g, s)| (g, s.version))
                .collect()
        });
        let io = self.io(IoPurpose::Checkpoint);
        let every = self.config.checkpoint_every_ns;
        self.checkpoint.take(io, all, self.now_ns, every);
        self.actions.push_back(Action::Io {
            io,
            cmd: IoCmd::Flush,
        });
    }

    /// The flush of the checkpoint in flight finished.
    pub(super) fn checkpoint_flushed(&mut self, io: IoId, result: IoResult) {
        let Some((versions, full)) = self.checkpoint.flushed(io) else {
            return;
        };
        self.write_checkpoint(versions, full, result);
        if self.checkpoint.finish() {
            if self.device_gone {
                self.checkpoint.skip();
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
                self.checkpoint.put_back(versions);
            }
            return;
        }
        let runs: Vec<VersionRun> = self.grain_runs(&versions);
        let blocks = versions.len() as u64 * self.grains.grain_blocks();
        self.checkpoint.written(runs.len(), full, blocks);
        if runs.is_empty() && !full {
            // Everything taken was forgotten since (or nothing was dirty).
            return;
        }
        self.actions.push_back(Action::Checkpoint { runs, full });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_takes_what_completed_and_a_failed_delta_puts_it_back() {
        let mut c = Checkpoints::default();
        assert!(c.due(0) && c.next_is_full(), "the first one is full");
        let all = BTreeMap::from([(0, Version(5)), (1, Version(6))]);
        c.take(IoId(1), Some(all.clone()), 0, 100);
        c.self_check();
        assert!(!c.due(1_000), "one at a time");
        assert_eq!(c.ask(), Some(2), "the next one covers now");
        // A write to grain 1 fails while the flush runs: not written back.
        c.forget(1);
        c.completed(2, Version(7));
        let (versions, full) = c.flushed(IoId(1)).expect("in flight");
        assert!(full);
        assert_eq!(versions, BTreeMap::from([(0, Version(5))]));
        c.written(1, true, 4);
        assert!(c.finish(), "another was asked for");
        assert!(!c.next_is_full());
        c.take(IoId(2), None, 50, 100);
        let (delta, full) = c.flushed(IoId(2)).expect("in flight");
        assert!(!full);
        assert_eq!(delta, BTreeMap::from([(1, Version(0)), (2, Version(7))]));
        // Its flush failed, and grain 2 completed again since: the newer stays.
        c.completed(2, Version(8));
        c.put_back(delta);
        assert!(!c.finish());
        c.self_check();
        assert!(!c.due(149) && c.due(150), "the interval");
        c.take(IoId(3), None, 150, 100);
        let (delta, _) = c.flushed(IoId(3)).expect("in flight");
        assert_eq!(delta, BTreeMap::from([(1, Version(0)), (2, Version(8))]));
        c.written(0, false, 0);
        c.finish();
        assert_eq!((c.taken, c.finished, c.written), (3, 3, 1));
        c.self_check();
    }

    #[test]
    fn deltas_that_outgrow_the_full_checkpoint_make_the_next_one_full() {
        let mut c = Checkpoints::default();
        c.written(10, true, 40);
        assert!(!c.next_is_full());
        c.forgotten(FULL_SLACK_RUNS);
        c.written(20, false, 80);
        assert!(!c.next_is_full(), "{} runs of deltas", c.delta_runs);
        c.written(1, false, 4);
        assert!(c.next_is_full());
        c.written(12, true, 48);
        assert!(!c.next_is_full(), "a full one starts the count again");
    }
}
