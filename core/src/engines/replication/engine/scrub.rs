//! The background scrubber: each node reads the blocks it holds, a run at a time at
//! a bounded rate, so a media error is found before a client needs the block (or
//! before the last other copy is lost), and repaired from a peer like one a read
//! found (see `repair`).
//!
//! - It walks the version grains this node has written, in block order, wrapping
//!   around; a run never crosses an extent, and runs of extents where this node is
//!   not in sync are skipped (a rebuilding replica is being copied anyway, and only
//!   an in-sync copy may repair from a peer).
//! - One read is in flight at a time; the next starts when it finishes if the rate
//!   allows ([`ReplicationConfig::scrub_bytes_per_sec`], 0: off; reads up to
//!   [`SCRUB_BURST_NS`] behind the rate may catch up at once), else at a tick.
//! - It reads without a range lock: the data is thrown away, only a media error
//!   matters, and the repair it starts takes the locks a repair needs.

use super::*;

/// Longest run one scrub read covers.
pub const SCRUB_RUN_BYTES: u64 = 128 << 10;
/// Reads the rate allows may be caught up this far back: the engine's clock moves
/// with its ticks, and the next read starts as soon as one finishes.
const SCRUB_BURST_NS: u64 = 10_000_000;

/// The background scrubber of one node: where it stands, its rate, its counts.
#[derive(Debug, Default)]
pub(super) struct Scrubber {
    /// Next block to look at.
    cursor: Lba,
    /// No read before this time (the rate bound).
    next_ns: u64,
    /// A read is in flight.
    reading: bool,
    /// Bytes read and media errors found so far.
    bytes: u64,
    errors: u64,
}

/// A run of blocks to read next, in one extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ScrubRun {
    pub(super) extent: ExtentId,
    pub(super) lba: Lba,
    pub(super) blocks: u64,
}

impl Scrubber {
    /// The run to read now at `rate` bytes per second (0: off), of the grains
    /// `me` has written: `None` while a read is in flight, before the rate
    /// allows, when nothing is written, or when the next run's extent is not
    /// in sync here (then that extent is skipped).
    pub(super) fn next_run(
        &mut self,
        now_ns: u64,
        rate: u64,
        grains: &crate::replication::grains::Grains,
        map: &ClusterMap,
        me: NodeId,
    ) -> Option<ScrubRun> {
        if rate == 0 || self.reading || now_ns < self.next_ns {
            return None;
        }
        let from = grains.grain_of(self.cursor);
        let first = grains
            .written(from, u64::MAX)
            .next()
            .or_else(|| grains.written(0, u64::MAX).next())
            .map(|(g, _)| grains.start_of(g))?;
        let extent = map.extent_of(first);
        let end = map.extent_end(extent);
        if !map.extent(extent).in_sync.contains(&me) {
            self.cursor = end;
            return None;
        }
        let bs = u64::from(map.volume().block_size);
        let most = (SCRUB_RUN_BYTES / bs)
            .min(u64::from(map.volume().max_request_blocks))
            .max(1);
        let gb = grains.grain_blocks();
        let limit = Lba((first.0 + most.max(gb)).min(end.0));
        let g0 = grains.grain_of(first);
        let whole = grains
            .written(g0, grains.grain_of(limit.offset(gb - 1)))
            .zip(g0..)
            .take_while(|((g, _), want)| g == want)
            .count() as u64;
        let blocks = (whole * gb).min(limit.0 - first.0);
        assert!(blocks > 0, "the run starts at a grain written");
        debug_assert!(first.offset(blocks) <= end, "a run crosses its extent");
        self.cursor = first.offset(blocks);
        self.reading = true;
        self.next_ns = self.next_ns.max(now_ns.saturating_sub(SCRUB_BURST_NS))
            + blocks * bs * 1_000_000_000 / rate;
        Some(ScrubRun {
            extent,
            lba: first,
            blocks,
        })
    }

    /// The read in flight finished after `bytes`; `found` if it found a media
    /// error no repair is under way for.
    pub(super) fn finished(&mut self, bytes: u64, found: bool) {
        assert!(self.reading, "a scrub read finished that was not issued");
        self.reading = false;
        self.bytes += bytes;
        self.errors += u64::from(found);
    }

    /// Bytes read and media errors found so far.
    pub(super) fn progress(&self) -> (u64, u64) {
        (self.bytes, self.errors)
    }
}

impl Replicator {
    /// Start the next scrub read if the rate allows and none is in flight.
    pub(super) fn scrub_tick(&mut self) {
        let rate = self.config.scrub_bytes_per_sec;
        let Some(run) = self
            .scrub
            .next_run(self.now_ns, rate, &self.grains, &self.map, self.me)
        else {
            return;
        };
        let io = self.io(IoPurpose::BackgroundScrub {
            extent: run.extent,
            lba: run.lba,
            blocks: run.blocks,
        });
        let cmd = IoCmd::Read {
            lba: run.lba,
            blocks: run.blocks,
        };
        self.actions.push_back(Action::Io { io, cmd });
    }

    /// A scrub read finished: a media error starts a repair of its run.
    pub(super) fn scrub_done(&mut self, extent: ExtentId, lba: Lba, blocks: u64, result: IoResult) {
        let bytes = blocks * u64::from(self.map.volume().block_size);
        let media = match result {
            IoResult::Failed(e @ WeirError::Device(DevError::Media(_))) => Some(e),
            _ => None,
        };
        // One found on an earlier pass may be under repair already.
        let repairing = media.is_some()
            && self
                .ops
                .repairs
                .values()
                .any(|r| r.lba.0 < lba.0 + blocks && lba.0 < r.lba.0 + r.blocks);
        self.scrub.finished(bytes, media.is_some() && !repairing);
        if let Some(e) = media.filter(|_| !repairing) {
            self.actions
                .push_back(Action::Event(crate::events::Event::ScrubFound {
                    node: self.me,
                    extent,
                    lba,
                    blocks,
                }));
            self.start_repair(extent, lba, blocks, e);
        }
        self.scrub_tick();
    }

    /// Bytes the scrubber has read and media errors it has found.
    pub fn scrub_progress(&self) -> (u64, u64) {
        self.scrub.progress()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::grains::Grains;

    const BS: u64 = 4096;

    fn setup() -> (Grains, ClusterMap) {
        super::super::small_cluster()
    }

    #[test]
    fn runs_follow_the_grains_written_at_the_rate_and_wrap_around() {
        let (mut grains, map) = setup();
        let mut s = Scrubber::default();
        let me = NodeId(1);
        let rate = 16 * BS * 1000; // 16 blocks per ms
        assert_eq!(
            s.next_run(0, rate, &grains, &map, me),
            None,
            "nothing written"
        );
        for g in [0, 1, 2, 20, 21] {
            grains.set(g, Version(7), true);
        }
        assert_eq!(s.next_run(0, 0, &grains, &map, me), None, "off");
        let run = s.next_run(0, rate, &grains, &map, me).expect("a run");
        assert_eq!(
            run,
            ScrubRun {
                extent: ExtentId(0),
                lba: Lba(0),
                blocks: 12
            }
        );
        assert_eq!(
            s.next_run(0, rate, &grains, &map, me),
            None,
            "one read at a time"
        );
        s.finished(12 * BS, false);
        // 12 blocks at 16 per ms: the next read is due at 0.75 ms.
        assert_eq!(
            s.next_run(700_000, rate, &grains, &map, me),
            None,
            "the rate"
        );
        let run = s.next_run(750_000, rate, &grains, &map, me).expect("a run");
        assert_eq!(
            run,
            ScrubRun {
                extent: ExtentId(1),
                lba: Lba(80),
                blocks: 8
            }
        );
        s.finished(8 * BS, true);
        let run = s
            .next_run(2_000_000, rate, &grains, &map, me)
            .expect("wrapped");
        assert_eq!(run.lba, Lba(0));
        s.finished(12 * BS, false);
        assert_eq!(s.progress(), (32 * BS, 1));
    }

    #[test]
    fn an_extent_not_in_sync_here_is_skipped_and_a_run_never_crosses_an_extent() {
        let (mut grains, map) = setup();
        for g in 0..32 {
            grains.set(g, Version(3), true);
        }
        let mut s = Scrubber::default();
        let rate = u64::MAX / (1 << 40);
        // A node holding no replica skips each extent it finds.
        assert_eq!(s.next_run(0, rate, &grains, &map, NodeId(9)), None);
        assert_eq!(s.cursor, Lba(64), "past extent 0");
        let mut s = Scrubber::default();
        let mut now = 0;
        let mut seen = 0;
        while seen < 128 {
            now += 1_000_000_000;
            let run = s
                .next_run(now, rate, &grains, &map, NodeId(2))
                .expect("a run");
            assert_eq!(map.extent_of(run.lba), run.extent);
            assert_eq!(map.extent_of(run.lba.offset(run.blocks - 1)), run.extent);
            assert!(run.blocks <= 16, "at most one request's worth");
            seen += run.blocks;
            s.finished(run.blocks * BS, false);
        }
        assert_eq!(seen, 128, "both extents, every block written");
    }
}
