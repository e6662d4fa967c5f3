//! The per-device owner: every command the node gives its device passes through
//! one [`DeviceSched`], which chooses its queue, knows what is in flight on each,
//! and judges whether the device still answers. The engine's device writes pass
//! first through the node's [`WriteOrder`], which keeps them in order per block.
//!
//! Sans-IO and without a runtime: inputs take `now_ns` (the node's monotonic
//! clock), and the node carries the commands out. The policy is FIFO: commands go
//! to the device in the order the engine issues them, spread over its queues by
//! id. The I/O scheduler (merging, splitting, per-volume QoS, congestion response)
//! replaces the policy here, behind the same calls.
//!
//! Health: a device whose oldest timed command (flushes are not timed: under a
//! heavy write load a healthy device takes long to drain its cache) has been
//! outstanding past the timeout at two ticks in a row has stalled (one tick is
//! not enough: a node that was itself paused finds its commands old at its first
//! tick back); one that answered `Gone` is gone until the node restarts.

use crate::replication::IoId;
pub use order::{Finished, WriteOrder};
use std::collections::BTreeMap;
use std::time::Duration;

mod order;

/// What the device's health became at a tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// It answers within the timeout again.
    Answers,
    /// A command has been outstanding past the timeout.
    Stalled,
    /// It answered `Gone`.
    Gone,
}

/// One command in flight.
#[derive(Clone, Copy, Debug)]
struct Inflight {
    /// The queue it went to.
    queue: u16,
    /// When it was issued, if it is timed (flushes are not).
    issued_ns: Option<u64>,
}

/// The owner of one device's queues and health.
#[derive(Debug)]
pub struct DeviceSched {
    queues: u16,
    timeout: Duration,
    inflight: BTreeMap<IoId, Inflight>,
    /// Commands in flight on each queue.
    depth: Vec<u32>,
    /// Ticks in a row that found a timed command older than the timeout.
    stalled_ticks: u32,
    healthy: bool,
    gone: bool,
}

impl DeviceSched {
    /// The owner of a device with `queues` queues (at least one is used), which
    /// has stalled when a command is outstanding for `timeout`.
    pub fn new(queues: u16, timeout: Duration) -> Self {
        let queues = queues.max(1);
        DeviceSched {
            queues,
            timeout,
            inflight: BTreeMap::new(),
            depth: vec![0; usize::from(queues)],
            stalled_ticks: 0,
            healthy: true,
            gone: false,
        }
    }

    /// Change the stall timeout.
    pub fn set_timeout(&mut self, timeout: Duration) {
        assert!(
            !timeout.is_zero(),
            "a device timeout of zero would stall every node"
        );
        self.timeout = timeout;
    }

    /// The stall timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Admit command `io` (a flush if `flush`) at `now_ns`; returns the queue it
    /// goes to.
    pub fn issue(&mut self, io: IoId, flush: bool, now_ns: u64) -> u16 {
        let queue = (io.0 % u64::from(self.queues)) as u16;
        let issued_ns = (!flush).then_some(now_ns);
        let before = self.inflight.insert(io, Inflight { queue, issued_ns });
        assert!(before.is_none(), "{io:?} issued twice");
        self.depth[usize::from(queue)] += 1;
        queue
    }

    /// Command `io` completed (`gone`: the device answered that it is gone).
    /// Panics if `io` was not issued: completions come only from commands issued.
    pub fn complete(&mut self, io: IoId, gone: bool) {
        let done = self
            .inflight
            .remove(&io)
            .unwrap_or_else(|| panic!("a completion of {io:?}, which was not issued"));
        let depth = &mut self.depth[usize::from(done.queue)];
        debug_assert!(*depth > 0);
        *depth -= 1;
        // Gone stays gone: the node serves nothing until restarted.
        self.gone |= gone;
    }

    /// The node's tick at `now_ns`: judge the device. Returns its new health if
    /// that changed.
    pub fn tick(&mut self, now_ns: u64) -> Option<Health> {
        let timeout_ns = self.timeout.as_nanos() as u64;
        let stalled = self
            .inflight
            .values()
            .filter_map(|c| c.issued_ns)
            .min()
            .is_some_and(|oldest| now_ns.saturating_sub(oldest) >= timeout_ns);
        self.stalled_ticks = if stalled { self.stalled_ticks + 1 } else { 0 };
        let healthy = self.stalled_ticks < 2 && !self.gone;
        if healthy == self.healthy {
            return None;
        }
        self.healthy = healthy;
        Some(if healthy {
            Health::Answers
        } else if self.gone {
            Health::Gone
        } else {
            Health::Stalled
        })
    }

    /// Whether the device answered in time at the last tick (and is not gone).
    pub fn healthy(&self) -> bool {
        self.healthy
    }

    /// Commands in flight.
    pub fn inflight(&self) -> usize {
        self.inflight.len()
    }

    /// Assert the invariants: the per-queue depths count the commands in flight,
    /// and a device judged healthy had not stalled at two ticks in a row.
    pub fn self_check(&self) {
        let mut depth = vec![0u32; usize::from(self.queues)];
        for c in self.inflight.values() {
            assert!(
                c.queue < self.queues,
                "a command on a queue the device lacks"
            );
            depth[usize::from(c.queue)] += 1;
        }
        assert_eq!(
            depth, self.depth,
            "per-queue depths count the commands in flight"
        );
        // `gone` is set between ticks and judged at the next one, so only the
        // tick's own verdict is checked.
        assert!(
            !(self.healthy && self.stalled_ticks >= 2),
            "a stalled device judged healthy"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn commands_spread_over_the_queues_and_are_counted_per_queue() {
        let mut s = DeviceSched::new(4, Duration::from_millis(100));
        let queues: Vec<u16> = (0..8).map(|i| s.issue(IoId(i), false, 0)).collect();
        assert_eq!(queues, [0, 1, 2, 3, 0, 1, 2, 3]);
        s.self_check();
        s.complete(IoId(5), false);
        s.self_check();
        assert_eq!(s.inflight(), 7);
        // A device with no queues reported still has one.
        let mut one = DeviceSched::new(0, Duration::from_millis(100));
        assert_eq!(one.issue(IoId(9), false, 0), 0);
        one.self_check();
    }

    #[test]
    #[should_panic(expected = "which was not issued")]
    fn a_completion_of_a_command_never_issued_is_a_bug() {
        DeviceSched::new(1, Duration::from_millis(100)).complete(IoId(3), false);
    }

    #[test]
    fn a_command_outstanding_past_the_timeout_at_two_ticks_is_a_stall() {
        let mut s = DeviceSched::new(2, Duration::from_millis(100));
        s.issue(IoId(1), false, 0);
        assert_eq!(s.tick(50 * MS), None);
        // Old at one tick (the node may itself have been paused): not yet.
        assert_eq!(s.tick(120 * MS), None);
        assert!(s.healthy());
        assert_eq!(s.tick(130 * MS), Some(Health::Stalled));
        assert_eq!(s.tick(140 * MS), None, "reported once");
        s.complete(IoId(1), false);
        assert_eq!(s.tick(150 * MS), Some(Health::Answers));
        s.self_check();
    }

    #[test]
    fn flushes_are_not_timed_and_gone_stays_gone() {
        let mut s = DeviceSched::new(1, Duration::from_millis(100));
        s.issue(IoId(1), true, 0);
        for t in 1..10 {
            assert_eq!(s.tick(t * 100 * MS), None, "a long flush is no stall");
        }
        s.issue(IoId(2), false, 1000 * MS);
        s.complete(IoId(2), true);
        s.self_check(); // gone, not yet judged: a valid state between ticks
        assert_eq!(s.tick(1010 * MS), Some(Health::Gone));
        s.complete(IoId(1), false);
        assert_eq!(
            s.tick(1020 * MS),
            None,
            "no command stalls, but the device is gone"
        );
        assert!(!s.healthy());
        s.self_check();
        // Gone between a first late tick and the next: still a valid state.
        let mut s = DeviceSched::new(1, Duration::from_millis(100));
        s.issue(IoId(1), false, 0);
        s.issue(IoId(2), false, 0);
        assert_eq!(s.tick(120 * MS), None);
        s.complete(IoId(2), true);
        s.self_check();
        assert_eq!(s.tick(130 * MS), Some(Health::Gone));
    }
}
