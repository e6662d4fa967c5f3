//! Background classes in the device's queue, shared out by dmClock's controls
//! counted in commands. With `classes` on, background work (rebuild copies and
//! the scrubber: [`IoClass`]) waits behind clients' requests:
//!
//! - **Limit.** Background holds at most [`BACKGROUND_INFLIGHT_MAX`] commands on
//!   the device at once: a rebuild's large commands, once on the device, hold
//!   up clients' as long as they run, whatever order they were queued in.
//! - **Weight.** While the background head waits, the next command starts from
//!   the first foreground piece among the first [`MERGE_SCAN_MAX`] waiting, if
//!   it passes no earlier piece it conflicts with (an overlap where either
//!   writes, a flush, a piece of its own request) and is no flush itself,
//!   unless the background class's turn has come: each class's commands carry
//!   start tags 1/weight apart (start-time fair queuing's, as in the weight
//!   phase of dmClock, Gulati et al., OSDI 2010), and background goes when its
//!   tag is earlier than the foreground's (ties go to clients). At the default weights
//!   (clients 7, rebuild 1, scrub 1) background gets one command in eight while
//!   both wait, and is never starved. A class that was idle comes back at the
//!   current tag: one command at once, no credit for the time it was away.
//! - **Reservation.** A background class with a reservation (commands per
//!   second) at the head of the line goes whenever it is owed one and has a
//!   slot, before any weight: the rebuild keeps a floor of progress however
//!   busy clients keep the device.
//!
//! A merge joins pieces of one side only, so merging cannot carry background
//! work past its bound (see `take_run`).
//!
//! [`IoClass`]: crate::replication::IoClass

use super::{IoQueue, What, MERGE_SCAN_MAX};
use crate::io::IoClass;

/// Clients' default weight: background keeps at least one command in
/// `FOREGROUND_WEIGHT + 1` while both wait (each background class's default
/// weight is 1).
pub const FOREGROUND_WEIGHT: u32 = 7;

/// With classes, background commands in flight at most (and at most half the
/// device's command slots, at least one). Two of a rebuild's 128 KiB chunks
/// keep its copy going at its bandwidth bound: in the `rebuild-under-load`
/// experiment a rebuild ran at 843 MB/s with two against 860 with sixteen,
/// and clients' read P99 while it ran was 183 us against 406.
pub const BACKGROUND_INFLIGHT_MAX: u32 = 2;

/// A class's weight and reservation, in commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    /// Relative share of commands while classes compete (at least 1).
    pub weight: u32,
    /// Commands per second it is owed before any weight (0: none).
    pub reservation: u32,
}

/// The classes' shares of the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassShares {
    /// Clients' weight.
    pub foreground_weight: u32,
    /// Rebuild copies'.
    pub rebuild: Share,
    /// The scrubber's.
    pub scrub: Share,
}

impl Default for ClassShares {
    fn default() -> Self {
        let background = Share {
            weight: 1,
            reservation: 0,
        };
        ClassShares {
            foreground_weight: FOREGROUND_WEIGHT,
            rebuild: background,
            scrub: background,
        }
    }
}

impl ClassShares {
    /// Check the settings; the error says which is wrong.
    pub fn check(&self) -> Result<(), &'static str> {
        let weights = [
            self.foreground_weight,
            self.rebuild.weight,
            self.scrub.weight,
        ];
        if weights.iter().any(|w| !(1..=WEIGHT_MAX).contains(w)) {
            return Err("class weights must be between 1 and 1000");
        }
        if self.rebuild.reservation > RESERVATION_MAX || self.scrub.reservation > RESERVATION_MAX {
            return Err("class reservations must be at most 1000000 commands per second");
        }
        Ok(())
    }

    fn share(&self, class: IoClass) -> Share {
        match class {
            IoClass::Foreground => Share {
                weight: self.foreground_weight,
                reservation: 0,
            },
            IoClass::Rebuild => self.rebuild,
            IoClass::Scrub => self.scrub,
        }
    }
}

/// The largest weight.
const WEIGHT_MAX: u32 = 1000;
/// The largest reservation, commands per second.
const RESERVATION_MAX: u32 = 1_000_000;
/// One command's tag at weight 1 (fixed point).
const TAG_ONE: u64 = 1 << 20;
/// Past this the tags are brought down (see `dispatched`).
const TAG_REBASE: u64 = 1 << 62;

/// The tag step of a command at `weight`. Rounded down: at weight 7 seven
/// steps fall 4 short of one at weight 1, so clients gain one command over
/// background's in about 2^18 rounds.
fn step(weight: u32) -> u64 {
    TAG_ONE / u64::from(weight.max(1))
}

fn index(class: IoClass) -> usize {
    match class {
        IoClass::Foreground => 0,
        IoClass::Rebuild => 1,
        IoClass::Scrub => 2,
    }
}

/// dmClock's tags of the three classes.
#[derive(Debug)]
pub(super) struct ClassClock {
    shares: ClassShares,
    /// Each class's next command's start tag (at least `vtime` once it waits).
    start: [u64; 3],
    /// The start tag of the command dispatched last.
    vtime: u64,
    /// When each class with a reservation is next owed a command (ns).
    due_ns: [u64; 3],
}

impl ClassClock {
    pub(super) fn new(shares: ClassShares) -> Self {
        // Each class starts one command in: from the first, clients go
        // `weight` times before a background class of weight 1.
        let mut start = [0; 3];
        for class in [IoClass::Foreground, IoClass::Rebuild, IoClass::Scrub] {
            start[index(class)] = step(shares.share(class).weight);
        }
        ClassClock {
            shares,
            start,
            vtime: 0,
            due_ns: [0; 3],
        }
    }

    /// Whether background class `class`, at the head, is owed a command by its
    /// reservation at `now_ns`.
    fn owed(&self, class: IoClass, now_ns: u64) -> bool {
        self.shares.share(class).reservation > 0 && self.due_ns[index(class)] <= now_ns
    }

    /// The start tag of `class`'s next command: a class back from idle starts
    /// at the current tag.
    fn tag(&self, class: IoClass) -> u64 {
        self.start[index(class)].max(self.vtime)
    }

    /// Whether background class `class`, at the head, goes before clients'
    /// waiting requests at `now_ns`.
    pub(super) fn background_first(&self, class: IoClass, now_ns: u64) -> bool {
        self.owed(class, now_ns) || self.tag(class) < self.tag(IoClass::Foreground)
    }

    /// A command of `class` went at `now_ns`.
    pub(super) fn dispatched(&mut self, class: IoClass, now_ns: u64) {
        let share = self.shares.share(class);
        let i = index(class);
        if self.owed(class, now_ns) {
            // Late by less than a period keeps the schedule (the rate holds);
            // more is a class back from idle: no burst for the time it was away.
            let period = 1_000_000_000 / u64::from(share.reservation);
            let due = self.due_ns[i];
            self.due_ns[i] = if now_ns - due > period {
                now_ns + period
            } else {
                due + period
            };
        }
        let start = self.tag(class);
        self.vtime = start;
        self.start[i] = start + step(share.weight);
        // Tags only grow: long before they could overflow (2^63 is about 2^23
        // commands a second for 30 years), bring them all down together; a tag
        // below the base was stale (its class idle) and becomes 0.
        if self.vtime > TAG_REBASE {
            let base = self.vtime;
            for t in &mut self.start {
                *t = t.saturating_sub(base);
            }
            self.vtime = 0;
        }
    }
}

impl IoQueue {
    /// Where the next command starts at `now_ns`: the head, or with classes on
    /// the first foreground piece that may pass the background ones before it
    /// (see the module), unless background's turn has come; `None` if the head
    /// is background without a slot and nothing may pass it.
    pub(super) fn first_to_go(&self, now_ns: u64) -> Option<usize> {
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
        if room && self.clock.background_first(head.class, now_ns) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_share_commands_and_a_reservation_goes_first_when_owed() {
        let mut c = ClassClock::new(ClassShares::default());
        // Clients 7, rebuild 1: seven clients' commands, then the rebuild's.
        let mut order = Vec::new();
        for _ in 0..16 {
            let class = if c.background_first(IoClass::Rebuild, 0) {
                IoClass::Rebuild
            } else {
                IoClass::Foreground
            };
            order.push(index(class));
            c.dispatched(class, 0);
        }
        assert_eq!(order, [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1]);
        // A rebuild reserved 1,000 commands a second is owed one each ms,
        // whatever the weights say.
        let mut c = ClassClock::new(ClassShares {
            rebuild: Share {
                weight: 1,
                reservation: 1000,
            },
            ..ClassShares::default()
        });
        const MS: u64 = 1_000_000;
        assert!(c.background_first(IoClass::Rebuild, 5 * MS));
        c.dispatched(IoClass::Rebuild, 5 * MS);
        assert!(
            !c.background_first(IoClass::Rebuild, 5 * MS + MS / 2),
            "not owed, and its tag is past the clients'"
        );
        assert!(c.background_first(IoClass::Rebuild, 6 * MS));
        // Late by half a period: the schedule holds (next at 7 ms).
        c.dispatched(IoClass::Rebuild, 6 * MS + MS / 2);
        assert!(!c.background_first(IoClass::Rebuild, 7 * MS - 1));
        assert!(c.background_first(IoClass::Rebuild, 7 * MS));
        // The scrubber, idle so far, comes back at the current tag: one
        // command at once, then its turn among the others.
        for _ in 0..50 {
            c.dispatched(IoClass::Foreground, 7 * MS);
        }
        assert!(c.background_first(IoClass::Scrub, 7 * MS));
        c.dispatched(IoClass::Scrub, 7 * MS);
        assert!(!c.background_first(IoClass::Scrub, 7 * MS));
    }

    #[test]
    fn shares_are_checked() {
        assert!(ClassShares::default().check().is_ok());
        let bad = ClassShares {
            foreground_weight: 0,
            ..ClassShares::default()
        };
        assert!(bad.check().is_err());
        let bad = ClassShares {
            scrub: Share {
                weight: 1,
                reservation: 2_000_000,
            },
            ..ClassShares::default()
        };
        assert!(bad.check().is_err());
    }
}
