//! Time helpers shared by the simulated device and fabric.
//!
//! madsim's `sleep_until` never waits less than 1 ms, but a `Sleep` whose deadline
//! is reset before its first poll wakes at that exact deadline. Device and fabric
//! models need microsecond precision, so they sleep through [`sleep_until_exact`].
//! On real tokio it is an ordinary `sleep_until`.

use tokio::time::Instant;

/// The current time: the one place weir-core reads a clock. Under `--cfg madsim`
/// this is the simulator's virtual clock (madsim-tokio), so it is deterministic; on
/// real tokio it is the monotonic clock. Never the wall clock.
pub fn now() -> Instant {
    Instant::now()
}

/// Sleep until `deadline`, with no 1 ms floor under the simulator.
pub async fn sleep_until_exact(deadline: Instant) {
    let sleep = tokio::time::sleep_until(deadline);
    tokio::pin!(sleep);
    sleep.as_mut().reset(deadline);
    sleep.await
}

/// The true cluster clock, ns since the Unix epoch: the wall clock, which leases
/// compare across nodes (a lease granted by one node is checked by another). A
/// node reads it through its [`Skew`]; under `--cfg madsim` it is the simulator's
/// virtual wall clock, the same on every node and seeded like everything else.
pub fn cluster_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// How far apart the nodes' cluster clocks may be: every node's clock is within
/// `offset_max_ns` of the true time and runs at most `drift_max_ppm` fast or slow.
/// Leases are safe only within this bound: a primary stops serving
/// [`ClockBound::lease_margin_ns`] before its lease runs out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockBound {
    /// Largest offset of a node's clock from the true time, ns.
    pub offset_max_ns: u64,
    /// Largest rate error of a node's clock, parts per million.
    pub drift_max_ppm: u64,
}

impl ClockBound {
    /// NTP-disciplined clocks on one LAN: offsets within 1 ms (NTP "can achieve
    /// better than one millisecond accuracy in local area networks", ntp.org's
    /// NTP FAQ and the NTPv4 specification's discussion of LAN accuracy), and a rate
    /// error within RFC 5905's frequency tolerance PHI = 15 ppm.
    pub const DEFAULT: ClockBound = ClockBound {
        offset_max_ns: 1_000_000,
        drift_max_ppm: 15,
    };

    /// The margin a primary keeps before its lease ends, for leases of `lease_ns`.
    /// A lease is granted in the leader's clock, checked in the holder's, and its
    /// successor's start is checked in a third node's: two clocks at opposite ends
    /// of the offset bound are `2 * offset_max_ns` apart, and over one lease two
    /// clocks drifting apart gain `2 * drift_max_ppm` of it.
    pub fn lease_margin_ns(&self, lease_ns: u64) -> u64 {
        let drift_ns = (lease_ns as u128 * 2 * self.drift_max_ppm as u128).div_ceil(1_000_000);
        let margin = 2 * self.offset_max_ns as u128 + drift_ns;
        // Postcondition: never less than the offsets alone.
        debug_assert!(margin >= 2 * self.offset_max_ns as u128);
        u64::try_from(margin).unwrap_or(u64::MAX)
    }
}

/// One node's clock: the true cluster clock plus an offset, and a drift that
/// accumulates from `since_ns` (true time), the offset held within
/// `offset_max_ns` as an NTP-disciplined clock's is (it slews: past the bound
/// it runs at the true rate). So two clocks never differ by more than twice the
/// bound, which is what the lease margin assumes ([`ClockBound::lease_margin_ns`]);
/// a drift left to accumulate for ever would carry them apart without limit.
/// Real nodes run with no skew of their own (their clock is what NTP made it);
/// the simulator gives each node one, drawn within a [`ClockBound`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skew {
    /// The clock's offset from the true time at `since_ns`, ns.
    pub offset_ns: i64,
    /// The clock's rate error, parts per million (positive: fast).
    pub drift_ppm: i64,
    /// True time from which the drift accumulates, ns.
    pub since_ns: u64,
    /// The offset never passes this either way, ns.
    pub offset_max_ns: u64,
}

impl Skew {
    /// Whether this skew lies within `bound` (over any span).
    pub fn within(&self, bound: &ClockBound) -> bool {
        self.offset_ns.unsigned_abs() <= bound.offset_max_ns
            && self.drift_ppm.unsigned_abs() <= bound.drift_max_ppm
            && self.offset_max_ns <= bound.offset_max_ns
    }

    /// The offset's bound, as a signed number.
    fn held(&self) -> i128 {
        self.offset_max_ns.min(i64::MAX as u64) as i128
    }

    /// The offset, unheld, at true time `true_ns`.
    fn drifted(&self, true_ns: i128) -> i128 {
        let elapsed = (true_ns - self.since_ns as i128).max(0);
        self.offset_ns as i128 + elapsed * self.drift_ppm as i128 / 1_000_000
    }

    /// This clock's reading at true time `true_ns`.
    pub fn read(&self, true_ns: u64) -> u64 {
        let max = self.held();
        let local = true_ns as i128 + self.drifted(true_ns as i128).clamp(-max, max);
        local.clamp(0, u64::MAX as i128) as u64
    }

    /// The true time at which this clock reads `local_ns` (the inverse of
    /// [`Skew::read`], to the nanosecond: for the simulator's checkers, which
    /// compare what different nodes did in one time).
    pub fn to_true(&self, local_ns: u64) -> u64 {
        // Unheld: local = t + o + (t - s) * d / 1e6, so
        // t = (local - o + s * d / 1e6) / (1 + d / 1e6).
        let (o, d, s) = (
            self.offset_ns as i128,
            self.drift_ppm as i128,
            self.since_ns as i128,
        );
        let max = self.held();
        let local = local_ns as i128;
        let t = ((local - o) * 1_000_000 + s * d) / (1_000_000 + d);
        // Where the offset is held at the bound, the clock reads t + bound.
        let t = match self.drifted(t) {
            off if off > max => local - max,
            off if off < -max => local + max,
            _ => t,
        };
        t.clamp(0, u64::MAX as i128) as u64
    }

    /// This node's cluster clock now.
    pub fn now_ns(&self) -> u64 {
        self.read(cluster_ns())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skewed_clock_reads_back_to_the_true_time() {
        let skews = [
            Skew::default(),
            Skew {
                offset_ns: 1_500_000,
                drift_ppm: 15,
                since_ns: 1_000,
                offset_max_ns: u64::MAX,
            },
            Skew {
                offset_ns: -2_000_000,
                drift_ppm: -100,
                since_ns: 7,
                offset_max_ns: u64::MAX,
            },
            // Held at its bound from 100 s on.
            Skew {
                offset_ns: 0,
                drift_ppm: 10,
                since_ns: 0,
                offset_max_ns: 1_000_000,
            },
            Skew {
                offset_ns: 500_000,
                drift_ppm: -15,
                since_ns: 0,
                offset_max_ns: 1_000_000,
            },
        ];
        for skew in skews {
            for t in [10_000_000u64, 1_700_000_000_000_000_000, 123_456_789_012] {
                let local = skew.read(t);
                let back = skew.to_true(local);
                assert!(
                    back.abs_diff(t) <= 1,
                    "{skew:?}: {t} read {local}, back {back}"
                );
            }
        }
        let fast = Skew {
            offset_ns: 0,
            drift_ppm: 10,
            since_ns: 0,
            offset_max_ns: 20_000,
        };
        assert_eq!(
            fast.read(1_000_000_000),
            1_000_010_000,
            "10 ppm of 1 s is 10 us"
        );
        assert_eq!(
            fast.read(5_000_000_000),
            5_000_020_000,
            "held at the 20 us bound"
        );
        let behind = Skew {
            offset_ns: -5,
            drift_ppm: 0,
            since_ns: 0,
            offset_max_ns: 5,
        };
        assert_eq!(behind.read(100), 95);
    }

    #[test]
    fn the_lease_margin_covers_two_offsets_and_two_drifts() {
        assert_eq!(
            ClockBound::DEFAULT.lease_margin_ns(150_000_000),
            2_000_000 + 4_500
        );
        let none = ClockBound {
            offset_max_ns: 0,
            drift_max_ppm: 0,
        };
        assert_eq!(none.lease_margin_ns(1_500_000_000), 0);
        let skew = Skew {
            offset_ns: -1_000_000,
            drift_ppm: 15,
            since_ns: 0,
            offset_max_ns: 1_000_000,
        };
        assert!(skew.within(&ClockBound::DEFAULT));
        assert!(!Skew {
            offset_ns: 1_000_001,
            ..skew
        }
        .within(&ClockBound::DEFAULT));
    }
}
