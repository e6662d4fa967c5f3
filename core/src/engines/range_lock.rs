//! FIFO range lock: orders overlapping operations on one extent.
//!
//! Writes are exclusive, reads shared. An operation may start when no operation
//! queued before it overlaps it in a conflicting mode, so overlapping writes reach
//! every replica in the order the primary gave them versions, and a read never
//! overtakes an earlier overlapping write. Non-overlapping operations run in parallel.

use crate::ids::{Lba, OpId};
use std::collections::VecDeque;

/// How an operation holds its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Readers share.
    Shared,
    /// A writer excludes everyone overlapping.
    Exclusive,
}

#[derive(Clone, Debug)]
struct Entry {
    op: OpId,
    start: Lba,
    end: Lba,
    mode: Mode,
    started: bool,
}

impl Entry {
    fn conflicts(&self, other: &Entry) -> bool {
        let overlap = self.start < other.end && other.start < self.end;
        overlap && (self.mode == Mode::Exclusive || other.mode == Mode::Exclusive)
    }
}

/// The lock of one extent.
#[derive(Clone, Debug, Default)]
pub struct RangeLock {
    queue: VecDeque<Entry>,
}

impl RangeLock {
    /// Queue `op` for `[start, end)`. Returns true if it may start now.
    pub fn acquire(&mut self, op: OpId, start: Lba, end: Lba, mode: Mode) -> bool {
        assert!(start < end, "empty range");
        debug_assert!(self.queue.iter().all(|e| e.op != op), "{op} queued twice");
        let mut entry = Entry {
            op,
            start,
            end,
            mode,
            started: false,
        };
        entry.started = !self.queue.iter().any(|e| e.conflicts(&entry));
        let started = entry.started;
        self.queue.push_back(entry);
        started
    }

    /// Release `op`, which must have started. Returns the operations that may start
    /// now, in queue order.
    pub fn release(&mut self, op: OpId) -> Vec<OpId> {
        let started = self.queue.iter().find(|e| e.op == op).map(|e| e.started);
        assert!(started != Some(false), "{op} released before it started");
        self.withdraw(op)
    }

    /// Remove `op`, started or still waiting (a waiting operation given up).
    /// Returns the operations that may start now, in queue order.
    pub fn withdraw(&mut self, op: OpId) -> Vec<OpId> {
        let at = self
            .queue
            .iter()
            .position(|e| e.op == op)
            .unwrap_or_else(|| panic!("{op} released but not held"));
        self.queue.remove(at).expect("position is in range");
        let mut ready = Vec::new();
        for i in 0..self.queue.len() {
            if self.queue[i].started {
                continue;
            }
            let blocked = self.queue.range(..i).any(|e| e.conflicts(&self.queue[i]));
            if !blocked {
                self.queue[i].started = true;
                ready.push(self.queue[i].op);
            }
        }
        ready
    }

    /// Operations queued or running.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// True if nothing is queued or running.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Assert the lock's invariant: no two started entries conflict, and every
    /// waiting entry conflicts with some entry ahead of it.
    pub fn self_check(&self) {
        for (i, e) in self.queue.iter().enumerate() {
            let ahead = self.queue.range(..i);
            if e.started {
                assert!(
                    !self.queue.range(..i).any(|a| a.started && a.conflicts(e)),
                    "{} runs alongside a conflicting operation",
                    e.op
                );
            } else {
                assert!(
                    ahead.clone().any(|a| a.conflicts(e)),
                    "{} waits for nothing",
                    e.op
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn overlapping_writes_run_in_order_and_reads_share() {
        let mut l = RangeLock::default();
        assert!(l.acquire(OpId(1), Lba(0), Lba(8), Mode::Exclusive));
        assert!(!l.acquire(OpId(2), Lba(4), Lba(12), Mode::Exclusive));
        assert!(l.acquire(OpId(3), Lba(12), Lba(16), Mode::Shared));
        assert!(!l.acquire(OpId(4), Lba(10), Lba(11), Mode::Shared));
        assert!(l.acquire(OpId(5), Lba(12), Lba(13), Mode::Shared));
        l.self_check();
        assert_eq!(l.release(OpId(1)), vec![OpId(2)]);
        assert_eq!(l.release(OpId(2)), vec![OpId(4)]);
        assert_eq!(l.release(OpId(3)), Vec::<OpId>::new());
        l.self_check();
    }

    #[test]
    fn a_waiting_op_withdrawn_lets_those_behind_it_go() {
        let mut l = RangeLock::default();
        assert!(l.acquire(OpId(1), Lba(0), Lba(4), Mode::Exclusive));
        assert!(!l.acquire(OpId(2), Lba(2), Lba(6), Mode::Exclusive));
        assert!(!l.acquire(OpId(3), Lba(5), Lba(8), Mode::Exclusive));
        assert_eq!(l.withdraw(OpId(2)), vec![OpId(3)]);
        l.self_check();
        assert_eq!(l.release(OpId(1)), Vec::<OpId>::new());
        assert_eq!(l.release(OpId(3)), Vec::<OpId>::new());
        assert!(l.is_empty());
    }

    proptest! {
        /// Against an oracle: a run of random acquires and releases never lets two
        /// conflicting operations run together, never starves one, and starts
        /// conflicting operations in arrival order.
        #[test]
        fn never_runs_conflicts_together(
            ops in prop::collection::vec((0u64..32, 1u64..8, any::<bool>(), any::<bool>()), 1..60)
        ) {
            let mut l = RangeLock::default();
            let mut running: Vec<(OpId, u64, u64, bool)> = Vec::new();
            let mut all: Vec<(OpId, u64, u64, bool)> = Vec::new();
            let mut start_order: Vec<OpId> = Vec::new();
            for (i, (start, len, write, release_one)) in ops.into_iter().enumerate() {
                let op = OpId(i as u64);
                let mode = if write { Mode::Exclusive } else { Mode::Shared };
                all.push((op, start, start + len, write));
                if l.acquire(op, Lba(start), Lba(start + len), mode) {
                    running.push(all[i]);
                    start_order.push(op);
                }
                if release_one && !running.is_empty() {
                    let (op, ..) = running.remove(0);
                    for next in l.release(op) {
                        running.push(*all.iter().find(|e| e.0 == next).unwrap());
                        start_order.push(next);
                    }
                }
                l.self_check();
            }
            while !running.is_empty() {
                let (op, ..) = running.remove(0);
                for next in l.release(op) {
                    running.push(*all.iter().find(|e| e.0 == next).unwrap());
                    start_order.push(next);
                }
            }
            prop_assert!(l.is_empty(), "operations starved");
            prop_assert_eq!(start_order.len(), all.len());
            let pos = |op: OpId| start_order.iter().position(|o| *o == op).unwrap();
            for a in &all {
                for b in &all {
                    let conflict = a.1 < b.2 && b.1 < a.2 && (a.3 || b.3);
                    if a.0 < b.0 && conflict {
                        prop_assert!(pos(a.0) < pos(b.0), "{} started before {}", b.0, a.0);
                    }
                }
            }
        }
    }
}
