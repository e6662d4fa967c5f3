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

/// Where the scrubber stands.
#[derive(Debug, Default)]
pub(super) struct Scrubber {
    /// Next block to look at.
    cursor: Lba,
    /// No read before this time (the rate bound).
    next_ns: u64,
    /// A read is in flight.
    reading: bool,
    /// Bytes read and media errors found so far.
    pub(super) bytes: u64,
    pub(super) errors: u64,
}

impl Replicator {
    /// Start the next scrub read if the rate allows and none is in flight.
    pub(super) fn scrub_tick(&mut self) {
        let rate = self.config.scrub_bytes_per_sec;
        if rate == 0 || self.scrub.reading || self.now_ns < self.scrub.next_ns {
            return;
        }
        let from = self.grains.grain_of(self.scrub.cursor);
        let Some(first) = self
            .grains
            .written(from, u64::MAX)
            .next()
            .or_else(|| self.grains.written(0, u64::MAX).next())
            .map(|(g, _)| self.grains.start_of(g))
        else {
            return;
        };
        let extent = self.map.extent_of(first);
        let end = self.map.extent_end(extent);
        let placement = self.map.extent(extent);
        if !placement.in_sync.contains(&self.me) {
            self.scrub.cursor = end;
            return;
        }
        let bs = u64::from(self.map.volume().block_size);
        let most = (SCRUB_RUN_BYTES / bs)
            .min(u64::from(self.map.volume().max_request_blocks))
            .max(1);
        let gb = self.grains.grain_blocks();
        let limit = Lba((first.0 + most.max(gb)).min(end.0));
        let g0 = self.grains.grain_of(first);
        let grains = self
            .grains
            .written(g0, self.grains.grain_of(limit.offset(gb - 1)))
            .zip(g0..)
            .take_while(|((g, _), want)| g == want)
            .count() as u64;
        let blocks = (grains * gb).min(limit.0 - first.0);
        debug_assert!(blocks > 0, "the run starts at a grain written");
        self.scrub.cursor = first.offset(blocks);
        self.scrub.reading = true;
        self.scrub.next_ns = self
            .scrub
            .next_ns
            .max(self.now_ns.saturating_sub(SCRUB_BURST_NS))
            + blocks * bs * 1_000_000_000 / rate;
        let io = self.io(IoPurpose::BackgroundScrub {
            extent,
            lba: first,
            blocks,
        });
        self.actions.push_back(Action::Io {
            io,
            cmd: IoCmd::Read { lba: first, blocks },
        });
    }

    /// A scrub read finished: a media error starts a repair of its run.
    pub(super) fn scrub_done(&mut self, extent: ExtentId, lba: Lba, blocks: u64, result: IoResult) {
        self.scrub.reading = false;
        self.scrub.bytes += blocks * u64::from(self.map.volume().block_size);
        if let IoResult::Failed(e @ WeirError::Device(DevError::Media(_))) = result {
            let repairing = self
                .ops
                .repairs
                .values()
                .any(|r| r.lba.0 < lba.0 + blocks && lba.0 < r.lba.0 + r.blocks);
            if repairing {
                // Found on an earlier pass; that repair is under way.
                return self.scrub_tick();
            }
            self.scrub.errors += 1;
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
        (self.scrub.bytes, self.scrub.errors)
    }
}
