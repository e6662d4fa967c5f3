//! Device-write ordering of one node: a write waits for every earlier one to
//! overlapping blocks to leave the device (a deposed primary's write still on the
//! device and the new primary's must land in version order, whatever order the
//! device would complete them in), and what is in flight is known per block and
//! per version grain (a grain's version is what its device holds, to checkpoint,
//! only while no write to it is in flight).
//!
//! Sans-IO: the engine hands each device write in as it makes it and each
//! completion as it arrives; it gets back the writes to issue now.

use crate::engines::range_lock::{Mode, RangeLock};
use crate::ids::{Lba, OpId};
use crate::io::{IoCmd, IoId};
use std::collections::BTreeMap;
use std::ops::Range;

/// The device writes of one node, in flight or waiting for an earlier one.
#[derive(Debug)]
pub struct WriteOrder {
    /// Blocks per version grain.
    grain_blocks: u64,
    /// Per block, in submission order; keyed by the write's `IoId` as an `OpId`.
    lock: RangeLock,
    /// Every write in flight (issued, or waiting in `lock`): first block, blocks.
    writes: BTreeMap<IoId, (Lba, u64)>,
    /// Writes in flight per grain.
    per_grain: BTreeMap<u64, u32>,
    /// Writes waiting for an earlier overlapping one, with their commands.
    waiting: BTreeMap<IoId, IoCmd>,
    /// Reads waiting for the writes in flight to their blocks when they were
    /// made (not for later ones): the writes each still waits for, and its
    /// command. A device completes what it holds in any order, so a read issued
    /// beside a write to its blocks may return the old data; a read whose data
    /// goes out labelled with the grains' versions must see those writes.
    reads: BTreeMap<IoId, (std::collections::BTreeSet<IoId>, IoCmd)>,
}

/// A device write that left the device.
#[derive(Debug)]
pub struct Finished {
    /// Its first block.
    pub lba: Lba,
    /// Its blocks.
    pub blocks: u64,
    /// The grains it touched.
    pub grains: Range<u64>,
    /// Of those, the ones no write is in flight to now.
    pub idle: Vec<u64>,
    /// Writes that waited for it and go to the device now, in order, then the
    /// reads that waited for it last.
    pub ready: Vec<(IoId, IoCmd)>,
}

impl WriteOrder {
    /// The writes of a node whose version grains are `grain_blocks` blocks.
    pub fn new(grain_blocks: u64) -> Self {
        assert!(grain_blocks > 0, "a grain holds at least one block");
        WriteOrder {
            grain_blocks,
            lock: RangeLock::default(),
            writes: BTreeMap::new(),
            per_grain: BTreeMap::new(),
            waiting: BTreeMap::new(),
            reads: BTreeMap::new(),
        }
    }

    fn grains(&self, lba: Lba, blocks: u64) -> Range<u64> {
        lba.0 / self.grain_blocks..(lba.0 + blocks - 1) / self.grain_blocks + 1
    }

    /// Device write `io` of `blocks` blocks: `Some` of its command if it goes to
    /// the device now, `None` if it waits for an earlier overlapping write (and
    /// comes back in that one's [`Finished::ready`]).
    pub fn submit(&mut self, io: IoId, blocks: u64, cmd: IoCmd) -> Option<IoCmd> {
        let IoCmd::Write { lba, .. } = cmd else {
            panic!("{io:?} is not a write");
        };
        assert!(blocks > 0, "{io:?} writes nothing");
        for g in self.grains(lba, blocks) {
            *self.per_grain.entry(g).or_default() += 1;
        }
        let before = self.writes.insert(io, (lba, blocks));
        assert!(before.is_none(), "{io:?} submitted twice");
        let end = lba.offset(blocks);
        if self.lock.acquire(OpId(io.0), lba, end, Mode::Exclusive) {
            Some(cmd)
        } else {
            self.waiting.insert(io, cmd);
            None
        }
    }

    /// Device read `io`: `Some` of its command if no write to its blocks is in
    /// flight, `None` if it waits for those (and comes back in the last one's
    /// [`Finished::ready`]).
    pub fn submit_read(&mut self, io: IoId, cmd: IoCmd) -> Option<IoCmd> {
        let IoCmd::Read { lba, blocks } = cmd else {
            panic!("{io:?} is not a read");
        };
        let before: std::collections::BTreeSet<IoId> = self
            .writes
            .iter()
            .filter(|(_, &(l, n))| l.0 < lba.0 + blocks && lba.0 < l.0 + n)
            .map(|(&w, _)| w)
            .collect();
        if before.is_empty() {
            return Some(cmd);
        }
        let previous = self.reads.insert(io, (before, cmd));
        assert!(previous.is_none(), "{io:?} submitted twice");
        None
    }

    /// `io` left the device. `None` if it was not a write.
    pub fn finish(&mut self, io: IoId) -> Option<Finished> {
        let (lba, blocks) = self.writes.remove(&io)?;
        assert!(!self.waiting.contains_key(&io), "{io:?} finished unissued");
        let grains = self.grains(lba, blocks);
        let mut idle = Vec::new();
        for g in grains.clone() {
            let left = self.per_grain.get_mut(&g).expect("counted when submitted");
            *left -= 1;
            if *left == 0 {
                self.per_grain.remove(&g);
                idle.push(g);
            }
        }
        let mut ready: Vec<(IoId, IoCmd)> = self
            .lock
            .release(OpId(io.0))
            .into_iter()
            .map(|next| {
                let next = IoId(next.0);
                let cmd = self.waiting.remove(&next).expect("a waiting write");
                (next, cmd)
            })
            .collect();
        let mut done_reads = Vec::new();
        for (&r, (before, _)) in self.reads.iter_mut() {
            if before.remove(&io) && before.is_empty() {
                done_reads.push(r);
            }
        }
        for r in done_reads {
            let (_, cmd) = self.reads.remove(&r).expect("a waiting read");
            ready.push((r, cmd));
        }
        Some(Finished {
            lba,
            blocks,
            grains,
            idle,
            ready,
        })
    }

    /// Whether a write to any of `[lba, lba + blocks)` is in flight.
    pub fn writing_to(&self, lba: Lba, blocks: u64) -> bool {
        self.writes
            .values()
            .any(|&(l, n)| l.0 < lba.0 + blocks && lba.0 < l.0 + n)
    }

    /// Whether a write to grain `g` is in flight.
    pub fn grain_busy(&self, g: u64) -> bool {
        self.per_grain.contains_key(&g)
    }

    /// Writes in flight (issued or waiting).
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Check the bookkeeping; panics on a broken invariant:
    /// - every waiting write is in flight, and holds no lock yet;
    /// - the per-grain counts are exactly those of the writes in flight;
    /// - the lock holds exactly the writes in flight;
    /// - every waiting read waits for writes still in flight.
    pub fn self_check(&self) {
        for io in self.waiting.keys() {
            assert!(self.writes.contains_key(io), "waiting {io:?} not in flight");
        }
        for (r, (before, _)) in &self.reads {
            assert!(!before.is_empty(), "{r:?} waits for nothing");
            assert!(
                before.iter().all(|w| self.writes.contains_key(w)),
                "{r:?} waits for a write no longer in flight"
            );
        }
        let mut per_grain: BTreeMap<u64, u32> = BTreeMap::new();
        for &(lba, blocks) in self.writes.values() {
            assert!(blocks > 0, "a write of nothing in flight");
            for g in self.grains(lba, blocks) {
                *per_grain.entry(g).or_default() += 1;
            }
        }
        assert_eq!(per_grain, self.per_grain, "grains with writes in flight");
        assert_eq!(self.lock.len(), self.writes.len(), "locked writes");
        self.lock.self_check();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn write(lba: u64, blocks: u64) -> IoCmd {
        IoCmd::Write {
            lba: Lba(lba),
            data: Bytes::from(vec![0; blocks as usize]),
            fua: false,
        }
    }

    #[test]
    fn an_overlapping_write_waits_for_the_earlier_one_and_grains_count_both() {
        let mut order = WriteOrder::new(4);
        assert!(order.submit(IoId(1), 4, write(0, 4)).is_some());
        assert!(order.submit(IoId(2), 2, write(6, 2)).is_some(), "disjoint");
        assert!(
            order.submit(IoId(3), 5, write(2, 5)).is_none(),
            "overlaps 1, 2"
        );
        assert!(order.submit(IoId(4), 1, write(3, 1)).is_none(), "behind 3");
        order.self_check();
        assert!(order.writing_to(Lba(5), 1) && !order.writing_to(Lba(8), 4));
        assert!(order.grain_busy(0) && order.grain_busy(1) && !order.grain_busy(2));

        let done = order.finish(IoId(1)).expect("a write");
        assert_eq!((done.lba, done.blocks, done.grains), (Lba(0), 4, 0..1));
        assert!(done.idle.is_empty(), "3 and 4 still write grain 0");
        assert!(done.ready.is_empty(), "3 also waits for 2");
        let done = order.finish(IoId(2)).expect("a write");
        assert!(done.idle.is_empty(), "3 still writes grain 1");
        assert_eq!(done.ready.len(), 1);
        assert_eq!(done.ready[0].0, IoId(3));
        order.self_check();
        let done = order.finish(IoId(3)).expect("a write");
        assert_eq!(done.idle, vec![1]);
        assert_eq!(done.ready[0].0, IoId(4));
        let done = order.finish(IoId(4)).expect("a write");
        assert_eq!(done.idle, vec![0]);
        assert!(order.is_empty() && order.finish(IoId(9)).is_none());
        order.self_check();
    }

    #[test]
    #[should_panic(expected = "submitted twice")]
    fn a_write_submitted_twice_is_a_bug() {
        let mut order = WriteOrder::new(1);
        order.submit(IoId(1), 1, write(0, 1));
        order.submit(IoId(1), 1, write(0, 1));
    }
}
