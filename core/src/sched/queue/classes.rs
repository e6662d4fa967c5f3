//! Background classes in the device's queue. With `classes` on, background
//! work (rebuild copies and the scrubber: [`IoClass`]) waits behind clients'
//! requests. It holds at most [`BACKGROUND_INFLIGHT_MAX`] commands on the
//! device at once: a rebuild's large commands, once on the device, hold up
//! clients' as long as they run, whatever order they were queued in. And the
//! next command starts from the first foreground piece among the first
//! [`MERGE_SCAN_MAX`] waiting, if it passes no earlier piece it conflicts with
//! (an overlap where either writes, a flush, a piece of its own request) and is
//! no flush itself; but after [`FOREGROUND_TURNS`] such passes in a row the
//! background head goes (if it has a slot), so background work keeps a share
//! and is never starved. A merge joins pieces of one side only, so merging
//! cannot carry background work past its bound (see `take_run`).
//!
//! [`IoClass`]: crate::replication::IoClass

use super::{IoQueue, What, MERGE_SCAN_MAX};

/// With classes, foreground commands that may pass waiting background work in
/// a row before the background head goes: background keeps at least one
/// command in `FOREGROUND_TURNS + 1` while both wait.
pub const FOREGROUND_TURNS: u32 = 7;

/// With classes, background commands in flight at most (and at most half the
/// device's command slots, at least one). Two of a rebuild's 128 KiB chunks
/// keep its copy going at its bandwidth bound: in the `rebuild-under-load`
/// experiment a rebuild ran at 843 MB/s with two against 860 with sixteen,
/// and clients' read P99 while it ran was 183 us against 406.
pub const BACKGROUND_INFLIGHT_MAX: u32 = 2;

impl IoQueue {
    /// Where the next command starts: the head, or with classes on the first
    /// foreground piece that may pass the background ones before it (see the
    /// module), unless background has waited its turns; `None` if the head is
    /// background without a slot and nothing may pass it.
    pub(super) fn first_to_go(&self) -> Option<usize> {
        let head = self.waiting.front()?;
        if !self.cfg.classes || !head.class.background() {
            return Some(0);
        }
        let room = self.background < self.background_max();
        // A piece put back after its merged command failed goes first, when
        // it has a slot; nothing passes it.
        if head.again {
            return room.then_some(0);
        }
        if room && self.passes >= FOREGROUND_TURNS {
            return Some(0);
        }
        for i in 1..self.waiting.len().min(MERGE_SCAN_MAX + 1) {
            let p = &self.waiting[i];
            if matches!(p.what, What::Flush) || p.again {
                break;
            }
            if p.class.background() {
                continue;
            }
            // Nor may it pass a piece of its own request (a split read's
            // buffer is made at its first piece).
            if self
                .waiting
                .range(..i)
                .any(|q| q.io == p.io || p.conflicts(q) || q.conflicts(p))
            {
                continue;
            }
            return Some(i);
        }
        room.then_some(0)
    }

    /// Background commands in flight at most (classes on).
    pub(super) fn background_max(&self) -> u32 {
        let slots = self.depth * self.inflight.len() as u32;
        BACKGROUND_INFLIGHT_MAX.min((slots / 2).max(1))
    }
}
