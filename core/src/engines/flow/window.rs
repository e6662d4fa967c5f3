//! The congestion response's window: bytes allowed in flight on one path, cut
//! when the path says it is congested, grown while it does not (AIMD).
//!
//! The evidence is the transport's [`CongestionSignals`], as deltas of their
//! cumulative counts: ECN marks (on packets received, or echoed and CNPs on
//! packets sent), retransmissions, and where a target is set an RTT sample above
//! it. The response is DCTCP's (Alizadeh et al., SIGCOMM 2010), moved to the
//! window's owner: over each *period* (the time the path takes to show the effect
//! of a cut, its owner's measured response time) it counts the marks and the
//! packets answered, keeps a moving fraction of marked packets `alpha` (gain
//! 1/16, starting at 1), and at the end of a period that saw marks cuts the
//! window by `alpha / 2`. A path the switch marks now and then loses a little
//! window; one that marks everything halves it. A fabric whose own congestion
//! control keeps its queues at the marking threshold (DCQCN, DCTCP) marks a few
//! packets all the time, and a halving on every mark would starve the owner.
//! Between cuts the window grows by [`FlowConfig::increase_bytes`] per window's
//! worth of answers, so about that much per round trip. An owner that counts no
//! packets (a sender on a clock) treats a period with marks as all marked.
//!
//! The window starts fully open: a path that is never congested is never limited,
//! and with nothing in flight one request always goes, whatever its size, so no
//! request waits for ever.

use crate::transport::CongestionSignals;

/// The congestion response's settings (`[flow]` in the node's config and in
/// scenarios).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FlowConfig {
    /// Whether clients bound their reads' response bytes by a window, and
    /// primaries their replica forwards and rebuild copies by each peer's.
    pub enabled: bool,
    /// The smallest window, bytes: what a cut never goes below.
    pub window_min_bytes: u64,
    /// The largest window, bytes, and where a window starts.
    pub window_max_bytes: u64,
    /// Growth, bytes, per window's worth answered (a client's read window) or
    /// sent (a peer's window): about one increase per round trip.
    pub increase_bytes: u64,
    /// An RTT sample above this counts as congestion, microseconds; 0: RTT is
    /// recorded but not acted on.
    pub rtt_target_us: u64,
}

/// Default smallest window: two 128 KiB requests, enough to keep a 100 Gb/s
/// port busy across one 20 us fabric round trip (12.5 GB/s x 20 us = 250 KB).
pub const WINDOW_MIN_BYTES_DEFAULT: u64 = 256 << 10;
/// Default largest window: 16 MiB, beyond any one client's reads in flight in
/// the experiments (32 x 128 KiB = 4 MiB), so an uncongested client is unlimited.
pub const WINDOW_MAX_BYTES_DEFAULT: u64 = 16 << 20;
/// Default growth per round trip: one 128 KiB request.
pub const INCREASE_BYTES_DEFAULT: u64 = 128 << 10;
/// The shortest period, ns, whatever the owner measured.
pub const GUARD_MIN_NS: u64 = 10_000;
/// Bytes of one packet when counting packets from bytes answered: RoCE's
/// largest MTU (4096), so a fabric of smaller packets shows a smaller marked
/// fraction and a gentler cut, never a harsher one.
pub const PACKET_BYTES: u64 = 4096;
/// `alpha` in fixed point: 1.0 is this.
const ALPHA_ONE: u64 = 1 << 16;
/// `alpha`'s gain per period, as a shift: 1/16, DCTCP's published value.
const ALPHA_GAIN_SHIFT: u32 = 4;

impl Default for FlowConfig {
    fn default() -> Self {
        FlowConfig {
            enabled: false,
            window_min_bytes: WINDOW_MIN_BYTES_DEFAULT,
            window_max_bytes: WINDOW_MAX_BYTES_DEFAULT,
            increase_bytes: INCREASE_BYTES_DEFAULT,
            rtt_target_us: 0,
        }
    }
}

impl FlowConfig {
    /// Check the settings; the error is (the key, what is wrong).
    pub fn check(&self) -> Result<(), (&'static str, &'static str)> {
        if self.window_min_bytes == 0 {
            return Err(("flow.window_min_bytes", "must be above 0"));
        }
        if self.window_max_bytes < self.window_min_bytes {
            return Err(("flow.window_max_bytes", "must be at least window_min_bytes"));
        }
        if self.window_max_bytes > 1 << 40 {
            return Err(("flow.window_max_bytes", "must be at most 1 TiB"));
        }
        if self.increase_bytes == 0 || self.increase_bytes > self.window_max_bytes {
            return Err((
                "flow.increase_bytes",
                "must be above 0 and at most window_max_bytes",
            ));
        }
        if self.rtt_target_us > 1_000_000 {
            return Err(("flow.rtt_target_us", "must be at most 1000000 (1 s)"));
        }
        Ok(())
    }
}

/// What a window has done, cumulative.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowStats {
    /// Times it was cut.
    pub cuts: u64,
    /// Congestion marks seen (deltas of the counts it follows).
    pub marks: u64,
    /// Its smallest size so far, bytes.
    pub low_bytes: u64,
}

/// One AIMD window. Sans-IO: time comes in as `now_ns`.
#[derive(Clone, Debug)]
pub struct Window {
    config: FlowConfig,
    bytes: u64,
    /// The counts last seen, to take deltas of.
    last_marks: Option<u64>,
    /// When the current period ends.
    guard_until_ns: u64,
    /// The last RTT sample seen (a transport repeats its last one until it
    /// takes another: only a new sample counts).
    last_rtt_ns: u64,
    /// Marks and bytes answered in the current period; an RTT over target seen.
    period_marks: u64,
    period_bytes: u64,
    period_slow: bool,
    /// The moving fraction of marked packets, of [`ALPHA_ONE`].
    alpha: u64,
    /// Growth owed but below one byte of window.
    grown_frac: u64,
    stats: WindowStats,
}

impl Window {
    /// A fully open window.
    pub fn new(config: FlowConfig) -> Self {
        debug_assert!(config.check().is_ok(), "{config:?}");
        Window {
            config,
            bytes: config.window_max_bytes,
            last_marks: None,
            guard_until_ns: 0,
            last_rtt_ns: 0,
            period_marks: 0,
            period_bytes: 0,
            period_slow: false,
            alpha: ALPHA_ONE,
            grown_frac: 0,
            stats: WindowStats {
                low_bytes: config.window_max_bytes,
                ..WindowStats::default()
            },
        }
    }

    /// The window now, bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// What it has done.
    pub fn stats(&self) -> WindowStats {
        self.stats
    }

    /// Take in the path's signals at `now_ns`, counting as marks the ones `marks`
    /// picks out (a receiver follows marked packets in, a sender CNPs, echoes and
    /// retransmits). At the end of a period (`guard_ns` long, from the owner's
    /// response time) update `alpha` and, if the period saw marks (or an RTT over
    /// target), cut by `alpha / 2`. Returns whether it cut.
    pub fn observe(&mut self, marks: u64, rtt_ns: u64, now_ns: u64, guard_ns: u64) -> bool {
        // Counts that went back belong to a new connection: start the deltas anew.
        let new = match self.last_marks {
            Some(last) if marks >= last => marks - last,
            Some(_) => 0,
            None => {
                // The first reading is the baseline, and starts the first period.
                self.last_marks = Some(marks);
                self.guard_until_ns = now_ns + guard_ns.max(GUARD_MIN_NS);
                return false;
            }
        };
        self.last_marks = Some(marks);
        self.stats.marks += new;
        self.period_marks += new;
        let target = self.config.rtt_target_us * 1000;
        let sample = std::mem::replace(&mut self.last_rtt_ns, rtt_ns) != rtt_ns;
        self.period_slow |= sample && target > 0 && rtt_ns > target;
        if now_ns < self.guard_until_ns {
            return false;
        }
        // The period is over: the fraction marked, then the cut.
        let marked = std::mem::take(&mut self.period_marks);
        let bytes = std::mem::take(&mut self.period_bytes);
        let slow = std::mem::take(&mut self.period_slow);
        let fraction = match bytes.div_ceil(PACKET_BYTES) {
            0 if marked > 0 || slow => ALPHA_ONE,
            0 => 0,
            packets => (marked.min(packets) * ALPHA_ONE) / packets,
        };
        let fraction = if slow { ALPHA_ONE } else { fraction };
        self.alpha = self.alpha - (self.alpha >> ALPHA_GAIN_SHIFT) + (fraction >> ALPHA_GAIN_SHIFT);
        self.guard_until_ns = now_ns + guard_ns.max(GUARD_MIN_NS);
        if marked == 0 && !slow {
            return false;
        }
        let cut =
            (u128::from(self.bytes) * u128::from(self.alpha) / u128::from(2 * ALPHA_ONE)) as u64;
        self.bytes = (self.bytes - cut).max(self.config.window_min_bytes);
        self.grown_frac = 0;
        self.stats.cuts += 1;
        self.stats.low_bytes = self.stats.low_bytes.min(self.bytes);
        true
    }

    /// `bytes` in flight were answered: grow by `increase_bytes` per window's
    /// worth answered.
    pub fn answered(&mut self, bytes: u64) {
        self.period_bytes += bytes;
        // increase x bytes / window, keeping the remainder so small answers add up.
        let owed = u128::from(self.config.increase_bytes) * u128::from(bytes)
            + u128::from(self.grown_frac);
        let window = u128::from(self.bytes);
        self.grown_frac = (owed % window) as u64;
        let max = u128::from(self.config.window_max_bytes);
        self.bytes = (window + owed / window).min(max) as u64;
    }

    /// The window within its bounds.
    pub fn self_check(&self) {
        assert!(self.bytes >= self.config.window_min_bytes, "{self:?}");
        assert!(self.bytes <= self.config.window_max_bytes, "{self:?}");
        assert!(self.stats.low_bytes <= self.bytes, "{self:?}");
        assert!(self.alpha <= ALPHA_ONE, "{self:?}");
    }
}

/// The counts a receiver follows: data packets that arrived marked.
pub fn receiver_marks(s: &CongestionSignals) -> u64 {
    s.marked_in
}

/// The counts a sender follows: CNPs, ECN echoes and retransmissions.
pub fn sender_marks(s: &CongestionSignals) -> u64 {
    s.cnps + s.ecn_echoes + s.retransmits
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1024;

    fn config() -> FlowConfig {
        FlowConfig {
            enabled: true,
            window_min_bytes: 64 * K,
            window_max_bytes: 1024 * K,
            increase_bytes: 64 * K,
            rtt_target_us: 0,
        }
    }

    /// Run `periods` periods of 100 us, each answering a full window and
    /// seeing `marks_per_mib` marks per MiB answered; the marks so far.
    fn periods(w: &mut Window, mut marks: u64, periods: u64, marks_per_mib: u64) -> u64 {
        for _ in 0..periods {
            let bytes = w.bytes();
            w.answered(bytes);
            marks += bytes * marks_per_mib / (1024 * K);
            let now = w.guard_until_ns;
            w.observe(marks, 0, now, 100_000);
            w.self_check();
        }
        marks
    }

    #[test]
    fn marks_cut_once_per_period_and_answers_grow_it_back() {
        let mut w = Window::new(config());
        assert_eq!(w.bytes(), 1024 * K, "starts open");
        assert!(
            !w.observe(5, 0, 0, 50_000),
            "the first reading is a baseline"
        );
        assert!(!w.observe(7, 0, 20_000, 50_000), "within the first period");
        // A period with marks and nothing answered: all marked, alpha stays 1.
        assert!(w.observe(7, 0, 50_000, 50_000));
        assert_eq!(w.bytes(), 512 * K);
        assert!(!w.observe(9, 0, 60_000, 50_000), "within the period");
        assert!(
            w.observe(9, 0, 100_000, 50_000),
            "the marks of the period count"
        );
        assert_eq!(w.bytes(), 256 * K);
        assert!(!w.observe(9, 0, 150_000, 50_000), "a period without marks");
        // A window's worth answered grows it by one increase.
        w.answered(256 * K);
        assert_eq!(w.bytes(), 320 * K);
        // Small answers add up (the remainder is kept).
        for _ in 0..320 {
            w.answered(K);
        }
        // Grown by 320 KiB over a window of about 350 KiB: most of an increase.
        assert!((376 * K..=384 * K).contains(&w.bytes()), "{}", w.bytes());
        w.self_check();
        assert_eq!(w.stats().cuts, 2);
        assert_eq!(w.stats().marks, 4);
        assert_eq!(w.stats().low_bytes, 256 * K);
    }

    #[test]
    fn the_cut_follows_the_fraction_marked() {
        // 1 packet in 256 marked: the window stays near its top.
        let mut rare = Window::new(config());
        rare.observe(0, 0, 0, 100_000);
        periods(&mut rare, 0, 100, 1);
        assert!(rare.bytes() >= 960 * K, "{}", rare.bytes());
        assert!(rare.stats().cuts >= 30, "{:?}", rare.stats());
        // Every packet marked: down to the floor.
        let mut all = Window::new(config());
        all.observe(0, 0, 0, 100_000);
        periods(&mut all, 0, 20, 256);
        assert!(all.bytes() < 72 * K, "near the floor: {}", all.bytes());
        assert!(all.stats().low_bytes < 68 * K);
        // And back up once the marks stop: one increase per window answered.
        periods(&mut all, 0, 30, 0);
        assert_eq!(all.bytes(), 1024 * K);
    }

    #[test]
    fn it_stays_within_its_bounds_and_counts_that_go_back_are_a_new_baseline() {
        let mut w = Window::new(config());
        w.observe(0, 0, 0, 0);
        for i in 1..40 {
            w.observe(i, 0, i * GUARD_MIN_NS, 0);
        }
        assert_eq!(w.bytes(), 64 * K, "never below the minimum");
        let cuts = w.stats().cuts;
        assert!(
            !w.observe(3, 0, 40 * GUARD_MIN_NS, 0),
            "a new connection's counts"
        );
        assert_eq!(w.stats().cuts, cuts);
        assert!(w.observe(4, 0, 41 * GUARD_MIN_NS, 0));
        for _ in 0..1000 {
            w.answered(1024 * K);
        }
        assert_eq!(w.bytes(), 1024 * K, "never above the maximum");
        w.self_check();
    }

    #[test]
    fn an_rtt_over_target_cuts_only_when_a_target_is_set_and_only_once_per_sample() {
        let mut w = Window::new(config());
        assert!(!w.observe(0, 0, 0, 0), "the baseline");
        assert!(!w.observe(0, 900_000, GUARD_MIN_NS, 0), "no target");
        let mut w = Window::new(FlowConfig {
            rtt_target_us: 100,
            ..config()
        });
        assert!(!w.observe(0, 0, 0, 0), "the baseline");
        assert!(!w.observe(0, 100_000, GUARD_MIN_NS, 0), "at target");
        assert!(w.observe(0, 100_001, 2 * GUARD_MIN_NS, 0));
        assert!(
            !w.observe(0, 100_001, 3 * GUARD_MIN_NS, 0),
            "the same sample again is no news"
        );
        assert!(w.observe(0, 100_002, 4 * GUARD_MIN_NS, 0));
    }

    #[test]
    fn settings_are_checked() {
        assert!(FlowConfig::default().check().is_ok());
        for bad in [
            FlowConfig {
                window_min_bytes: 0,
                ..config()
            },
            FlowConfig {
                window_max_bytes: 50 * K,
                ..config()
            },
            FlowConfig {
                increase_bytes: 0,
                ..config()
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
