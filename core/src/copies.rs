//! Payload copies: every time weir's own code copies the data of a block request
//! (a frame made contiguous, a payload received off a socket into memory, an
//! unaligned write copied for O_DIRECT), it says so here. The simulator's report
//! divides the count by the writes acknowledged; the daemon exports it in
//! `/metrics`. A copy by the kernel or a device model is not weir's and is not
//! counted.
//!
//! Counted twice: per process (the daemon: one node per process) and per thread
//! (the simulator runs each simulation on one thread, and tests run several at
//! once in one process).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

static TOTAL: AtomicU64 = AtomicU64::new(0);
static TOTAL_BYTES: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static HERE: Cell<u64> = const { Cell::new(0) };
}

/// One payload of `bytes` bytes was copied.
pub fn note(bytes: usize) {
    TOTAL.fetch_add(1, Ordering::Relaxed);
    TOTAL_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    HERE.with(|c| c.set(c.get() + 1));
}

/// Payload copies in this process so far, and their bytes.
pub fn total() -> (u64, u64) {
    (
        TOTAL.load(Ordering::Relaxed),
        TOTAL_BYTES.load(Ordering::Relaxed),
    )
}

/// Payload copies on this thread so far.
pub fn on_this_thread() -> u64 {
    HERE.with(Cell::get)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_copy_counts_in_the_process_and_on_its_thread() {
        let (before, bytes_before) = super::total();
        let here = super::on_this_thread();
        super::note(4096);
        super::note(512);
        assert_eq!(super::on_this_thread(), here + 2);
        let (after, bytes_after) = super::total();
        // Other tests' threads may count too, never less.
        assert!(after >= before + 2 && bytes_after >= bytes_before + 4608);
    }
}
