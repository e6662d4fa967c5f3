//! Receiver-aware reads: a client bounds the bytes of read responses in flight
//! towards it by one [`Window`], over every primary it reads from.
//!
//! Many primaries answering one client at once converge on the client's one
//! switch port; the switch queue there grows and marks packets. Each sender's
//! DCQCN cuts its own rate, but the client still has all its reads out, so the
//! queue drains only as fast as the senders' rates recover, and the reads that
//! waited behind it make the tail. Here the client holds back reads beyond its
//! window: while its port marks packets (the transport's
//! [`crate::transport::CongestionSignals::marked_in`]) the window halves, once per
//! read response time; it grows back by one increase per window of responses.
//! Held reads go in arrival order, so no read waits behind later ones, and the
//! primaries see the client's reads spread over time instead of as one burst.
//!
//! Sans-IO: the client's glue turns tickets into wake-ups.

use super::window::{FlowConfig, Window, WindowStats};
use std::collections::VecDeque;

/// Reads waiting for the window at most; past it a read goes at once (counted),
/// so the window never holds more than this many callers.
pub const READS_WAITING_MAX: usize = 65_536;

/// The longest response time the period between cuts follows, ns.
pub const RESPONSE_NS_MAX: u64 = 10_000_000;

/// What a read asking for the window is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// Send it now: its bytes are counted in flight.
    Go,
    /// Wait until [`ReadWindow::done`], [`ReadWindow::abandon`] or
    /// [`ReadWindow::cancel`] wakes its ticket.
    Wait,
}

/// What a client's read window has done, cumulative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadFlowStats {
    /// Reads that asked.
    pub reads: u64,
    /// Of those, reads that waited for the window.
    pub waited: u64,
    /// Reads that went past a full waiting line.
    pub overflowed: u64,
    /// The window's cuts, marks and low point.
    pub window: WindowStats,
    /// The window now, bytes.
    pub window_bytes: u64,
}

/// One client's read window. Sans-IO: time comes in as `now_ns`.
#[derive(Debug)]
pub struct ReadWindow {
    window: Window,
    /// Response bytes asked for and not yet answered.
    in_flight: u64,
    /// Reads waiting, in arrival order: (ticket, bytes).
    waiting: VecDeque<(u64, u64)>,
    /// Smoothed read response time, ns (the guard between cuts).
    srtt_ns: u64,
    stats: ReadFlowStats,
}

impl ReadWindow {
    /// A window of `config`'s bounds, fully open.
    pub fn new(config: FlowConfig) -> Self {
        ReadWindow {
            window: Window::new(config),
            in_flight: 0,
            waiting: VecDeque::new(),
            srtt_ns: 0,
            stats: ReadFlowStats::default(),
        }
    }

    /// A read of `bytes` asks to go, as `ticket` (unique among those waiting).
    /// It goes if none waits before it and it fits, or if nothing is in flight.
    pub fn take(&mut self, ticket: u64, bytes: u64) -> Turn {
        self.stats.reads += 1;
        if self.waiting.is_empty() && self.fits(bytes) {
            self.in_flight += bytes;
            return Turn::Go;
        }
        if self.waiting.len() >= READS_WAITING_MAX {
            self.stats.overflowed += 1;
            self.in_flight += bytes;
            return Turn::Go;
        }
        debug_assert!(self.waiting.iter().all(|&(t, _)| t != ticket));
        self.stats.waited += 1;
        self.waiting.push_back((ticket, bytes));
        Turn::Wait
    }

    /// A waiting read gave up before its turn: `None` if it was not waiting
    /// (it was woken already, so its bytes are in flight and it must call
    /// [`ReadWindow::done`] or [`ReadWindow::abandon`]); else the tickets that
    /// may go now that it is out of the line.
    pub fn cancel(&mut self, ticket: u64) -> Option<Vec<u64>> {
        let i = self.waiting.iter().position(|&(t, _)| t == ticket)?;
        self.waiting.remove(i);
        Some(self.wake())
    }

    /// A read of `bytes` that went was answered after `response_ns`: its bytes
    /// leave the flight and the window grows; returns the tickets that may go
    /// now, their bytes counted in flight.
    pub fn done(&mut self, bytes: u64, response_ns: u64) -> Vec<u64> {
        assert!(
            bytes <= self.in_flight,
            "{bytes} done, {} in flight",
            self.in_flight
        );
        self.in_flight -= bytes;
        self.window.answered(bytes);
        // One slow answer (a failover) must not stretch the period for long.
        let response_ns = response_ns.min(RESPONSE_NS_MAX);
        // Smoothed as TCP smooths its RTT: 7/8 old, 1/8 new.
        self.srtt_ns = match self.srtt_ns {
            0 => response_ns,
            s => (s * 7 + response_ns) / 8,
        };
        self.wake()
    }

    /// A read of `bytes` that went was given up before its answer (its caller
    /// went away): its bytes leave the flight, with nothing learnt; returns the
    /// tickets that may go now.
    pub fn abandon(&mut self, bytes: u64) -> Vec<u64> {
        assert!(
            bytes <= self.in_flight,
            "{bytes} abandoned, {} in flight",
            self.in_flight
        );
        self.in_flight -= bytes;
        self.wake()
    }

    /// Take in the count of marked packets received over every path
    /// (cumulative) and the latest RTT sample at `now_ns`; cut the window if there
    /// are new marks.
    pub fn observe(&mut self, marks: u64, rtt_ns: u64, now_ns: u64) {
        self.window.observe(marks, rtt_ns, now_ns, self.srtt_ns);
    }

    /// What it has done.
    pub fn stats(&self) -> ReadFlowStats {
        ReadFlowStats {
            window: self.window.stats(),
            window_bytes: self.window.bytes(),
            ..self.stats
        }
    }

    /// Reads waiting now.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    fn fits(&self, bytes: u64) -> bool {
        self.in_flight == 0 || self.in_flight + bytes <= self.window.bytes()
    }

    fn wake(&mut self) -> Vec<u64> {
        let mut go = Vec::new();
        while let Some(&(ticket, bytes)) = self.waiting.front() {
            if !self.fits(bytes) {
                break;
            }
            self.waiting.pop_front();
            self.in_flight += bytes;
            go.push(ticket);
        }
        go
    }

    /// Something is in flight whenever a read waits (else it would have been
    /// woken), and the window is within its bounds.
    pub fn self_check(&self) {
        assert!(self.waiting.is_empty() || self.in_flight > 0, "{self:?}");
        assert!(self.waiting.len() <= READS_WAITING_MAX);
        self.window.self_check();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config(min: u64, max: u64) -> FlowConfig {
        FlowConfig {
            enabled: true,
            window_min_bytes: min,
            window_max_bytes: max,
            increase_bytes: min,
            rtt_target_us: 0,
        }
    }

    #[test]
    fn reads_past_the_window_wait_in_order_and_a_lone_large_read_goes() {
        let mut r = ReadWindow::new(config(100, 400));
        assert_eq!(
            r.take(1, 1000),
            Turn::Go,
            "nothing in flight: any size goes"
        );
        assert_eq!(r.take(2, 100), Turn::Wait);
        assert_eq!(r.take(3, 100), Turn::Wait);
        assert_eq!(r.done(1000, 50), vec![2, 3]);
        assert_eq!(r.take(4, 300), Turn::Wait, "200 + 300 is past 400");
        assert_eq!(r.take(5, 10), Turn::Wait, "behind a waiting read");
        assert_eq!(r.done(100, 50), vec![4], "the window is 400 at most");
        assert_eq!(r.done(300, 50), vec![5]);
        r.self_check();
        let s = r.stats();
        assert_eq!((s.reads, s.waited, s.overflowed), (5, 4, 0));
    }

    #[test]
    fn marks_cut_the_window_and_a_cancelled_read_leaves_no_trace() {
        let mut r = ReadWindow::new(config(100, 400));
        r.observe(0, 0, 0);
        assert_eq!(r.take(1, 100), Turn::Go);
        assert_eq!(r.done(100, 1_000_000), vec![]);
        r.observe(3, 0, 1);
        assert_eq!(r.stats().window_bytes, 400, "within the first period");
        r.observe(3, 0, 20_000);
        assert_eq!(r.stats().window_bytes, 200, "all marked: halved");
        assert_eq!(r.take(2, 150), Turn::Go);
        assert_eq!(r.take(3, 100), Turn::Wait);
        assert_eq!(r.take(4, 10), Turn::Wait);
        assert_eq!(r.take(5, 100), Turn::Wait);
        assert_eq!(r.cancel(3), Some(vec![4]), "the read behind it fits");
        assert_eq!(r.cancel(3), None, "gone already");
        // 150 answered of a 200 window: grown by 3/4 of an increase.
        assert_eq!(r.done(150, 1000), vec![5]);
        assert_eq!(r.stats().window_bytes, 275);
        r.observe(9, 0, 500_000);
        assert_eq!(r.stats().window_bytes, 275, "within the guard (about 1 ms)");
        r.observe(10, 0, 1_200_000);
        assert_eq!(r.stats().window_bytes, 138);
        r.self_check();
    }

    proptest! {
        /// Under any sequence of reads, answers, cancels and marks, bytes in
        /// flight are exactly those of reads that went and have not ended; a read
        /// goes past the window only alone; every read that waited
        /// goes once everything that went has ended.
        #[test]
        fn in_flight_is_exact_and_no_read_waits_for_ever(
            steps in proptest::collection::vec((0u8..6, 1u64..600), 1..200),
        ) {
            let mut r = ReadWindow::new(config(100, 800));
            let mut went: Vec<(u64, u64)> = Vec::new();
            let mut waiting: Vec<(u64, u64)> = Vec::new();
            let mut marks = 0;
            let woken = |go: Vec<u64>, went: &mut Vec<(u64, u64)>, waiting: &mut Vec<(u64, u64)>| {
                for w in go {
                    let at = waiting.iter().position(|&(x, _)| x == w).unwrap();
                    went.push(waiting.remove(at));
                }
            };
            for (i, &(op, n)) in steps.iter().enumerate() {
                let t = i as u64;
                match op {
                    0 | 1 => {
                        let (before, window) = (r.in_flight, r.window.bytes());
                        match r.take(t, n) {
                            Turn::Go => {
                                prop_assert!(before == 0 || before + n <= window);
                                went.push((t, n));
                            }
                            Turn::Wait => waiting.push((t, n)),
                        }
                    }
                    // Answered, or given up after it went.
                    2 | 3 if !went.is_empty() => {
                        let (_, b) = went.remove((n as usize) % went.len());
                        let go = if op == 2 { r.done(b, n) } else { r.abandon(b) };
                        woken(go, &mut went, &mut waiting);
                    }
                    // Given up while waiting.
                    4 if !waiting.is_empty() => {
                        let (t, _) = waiting.remove((n as usize) % waiting.len());
                        let go = r.cancel(t);
                        prop_assert!(go.is_some());
                        woken(go.unwrap(), &mut went, &mut waiting);
                    }
                    _ => {
                        marks += n % 3;
                        r.observe(marks, 0, t * 20_000);
                    }
                }
                let in_flight: u64 = went.iter().map(|&(_, b)| b).sum();
                prop_assert_eq!(in_flight, r.in_flight);
                r.self_check();
            }
            while let Some((_, b)) = went.pop() {
                let go = r.done(b, 1);
                woken(go, &mut went, &mut waiting);
            }
            prop_assert!(waiting.is_empty(), "left waiting: {:?}", waiting);
            prop_assert_eq!(r.in_flight, 0);
        }
    }
}
