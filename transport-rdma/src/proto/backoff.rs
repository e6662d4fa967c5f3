//! When to connect again after a connection failed.

/// Exponential backoff between connection attempts: the first retry after
/// `min_ns`, each failure doubling the wait up to `max_ns`, a connection that
/// came up resetting it.
#[derive(Clone, Debug)]
pub struct Backoff {
    min_ns: u64,
    max_ns: u64,
    next_ns: u64,
}

impl Default for Backoff {
    /// 1 ms, doubling up to 1 s: a peer that restarts is back within a few
    /// attempts, a peer gone for good costs one attempt a second.
    fn default() -> Self {
        Backoff::new(1_000_000, 1_000_000_000)
    }
}

impl Backoff {
    /// A backoff from `min_ns` up to `max_ns`.
    pub fn new(min_ns: u64, max_ns: u64) -> Backoff {
        assert!(
            0 < min_ns && min_ns <= max_ns,
            "backoff bounds out of order"
        );
        Backoff {
            min_ns,
            max_ns,
            next_ns: min_ns,
        }
    }

    /// A connection failed (or an attempt did): how long to wait before the next.
    pub fn failed(&mut self) -> u64 {
        let wait = self.next_ns;
        self.next_ns = self.next_ns.saturating_mul(2).min(self.max_ns);
        wait
    }

    /// A connection came up: the next failure waits the least again.
    pub fn connected(&mut self) {
        self.next_ns = self.min_ns;
    }
}
