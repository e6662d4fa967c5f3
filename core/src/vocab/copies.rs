//! Payload copies: every time weir's own code copies the data of a block request
//! (a frame made contiguous, a payload received off a socket into memory, an
//! unaligned write copied for O_DIRECT), it says so here. The simulator's report
//! divides the count by the writes acknowledged; the daemon exports it in
//! `/metrics`. A copy by the kernel or a device model is not weir's and is not
//! counted.
//!
//! Counted per process: the daemon runs one node per process; the simulator
//! takes the difference over a run (runs in parallel in one process are
//! counted together, which its tests, expecting none, allow).

use std::sync::atomic::{AtomicU64, Ordering};

static TOTAL: AtomicU64 = AtomicU64::new(0);
static TOTAL_BYTES: AtomicU64 = AtomicU64::new(0);
static RECEIVED: AtomicU64 = AtomicU64::new(0);

/// Why a payload was copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Copy {
    /// Received off a socket (TCP, NBD) into pool memory: the one copy a
    /// kernel-socket transport cannot avoid, and the only one weir allows itself.
    Receive,
    /// Anything else: a frame made contiguous, an unaligned write copied for
    /// O_DIRECT.
    Other,
}

/// One payload of `bytes` bytes was copied, for `why`.
pub fn note(bytes: usize, why: Copy) {
    if why == Copy::Receive {
        RECEIVED.fetch_add(1, Ordering::Relaxed);
    }
    TOTAL.fetch_add(1, Ordering::Relaxed);
    TOTAL_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Payload copies in this process so far, and their bytes.
pub fn total() -> (u64, u64) {
    (
        TOTAL.load(Ordering::Relaxed),
        TOTAL_BYTES.load(Ordering::Relaxed),
    )
}

/// Payload copies in this process so far that were not a receipt off a socket.
pub fn beyond_receive() -> u64 {
    TOTAL.load(Ordering::Relaxed) - RECEIVED.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_copy_counts_in_the_process() {
        let (before, bytes_before) = super::total();
        super::note(4096, super::Copy::Receive);
        super::note(512, super::Copy::Other);
        assert!(super::beyond_receive() >= 1);
        let (after, bytes_after) = super::total();
        // Other tests' threads may count too, never less.
        assert!(after >= before + 2 && bytes_after >= bytes_before + 4608);
    }
}
