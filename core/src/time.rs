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

/// The cluster clock, ns since the Unix epoch: the wall clock, which leases compare
/// across nodes (a lease granted by one node is checked by another). Production
/// assumes NTP-synchronised clocks whose skew stays below [`MAX_CLOCK_SKEW_NS`];
/// under `--cfg madsim` it is the simulator's virtual wall clock, the same on every
/// node and seeded like everything else.
pub fn cluster_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The largest clock skew between two nodes that leases tolerate: a primary stops
/// serving this long before its lease runs out.
pub const MAX_CLOCK_SKEW_NS: u64 = 2_000_000;
