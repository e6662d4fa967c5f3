//! Registered (fixed) buffers: the node's buffer pool, its regions registered
//! with a ring as they appear, so reads and writes into pool memory skip the
//! kernel's page pinning per command (`IORING_OP_READ_FIXED`/`WRITE_FIXED`).
//!
//! The ring's table is sparse, [`FIXED_BUFFERS_MAX`] entries, entry `k` the
//! pool's region `k`. The regions the pool holds when the ring is set up are
//! registered then; one reserved later is registered the first time a command
//! touches it (registering pins the whole region, which takes a while for
//! 64 MiB: a node reserves its pool's regions before it opens the device).
//! Memory outside the pool (a bounce buffer, another pool's) goes by plain
//! read and write.

use io_uring::IoUring;
use weir_core::buf::BufPool;

/// Entries of a ring's buffer table: pool regions past it are not registered
/// (64 regions of at most 64 MiB: a 4 GiB pool).
pub(crate) const FIXED_BUFFERS_MAX: u32 = 64;

/// One ring's registered buffers.
pub(crate) struct FixedBufs {
    pool: Option<BufPool>,
    /// Registered: the region's address, length and table index.
    ranges: Vec<(usize, usize, u16)>,
    /// Regions of the pool seen so far (registered or not).
    seen: usize,
    /// Commands in memory of no registered region since the pool was last
    /// asked for new regions (asking locks the pool).
    misses: u32,
}

/// Misses between two looks at the pool for new regions: memory outside the
/// pool (a transport's receive buffers) is common, and each look locks it.
const MISSES_PER_REFRESH: u32 = 4096;

impl FixedBufs {
    /// Buffers of `pool`, the regions it holds now registered at once. A
    /// kernel without a sparse table (before 5.19) or a registration that
    /// fails (past `RLIMIT_MEMLOCK` without CAP_IPC_LOCK: each ring counts
    /// the whole pool) is an error: asked for, registered buffers are there.
    pub(crate) fn new(ring: &IoUring, pool: Option<BufPool>) -> std::io::Result<FixedBufs> {
        if pool.is_some() {
            ring.submitter()
                .register_buffers_sparse(FIXED_BUFFERS_MAX)?;
        }
        let mut fixed = FixedBufs {
            pool,
            ranges: Vec::new(),
            seen: 0,
            misses: 0,
        };
        fixed.refresh(ring)?;
        Ok(fixed)
    }

    /// The table index of the registered region holding `[ptr, ptr + len)`,
    /// registering the pool's new regions first if it is in none known.
    pub(crate) fn index(&mut self, ring: &IoUring, ptr: *const u8, len: usize) -> Option<u16> {
        let find = |ranges: &[(usize, usize, u16)]| {
            let (start, end) = (ptr as usize, ptr as usize + len);
            ranges
                .iter()
                .find(|&&(addr, rlen, _)| start >= addr && end <= addr + rlen)
                .map(|r| r.2)
        };
        if let Some(i) = find(&self.ranges) {
            return Some(i);
        }
        self.misses += 1;
        if self.misses < MISSES_PER_REFRESH && self.seen > 0 {
            return None;
        }
        self.misses = 0;
        match self.refresh(ring) {
            Ok(true) => find(&self.ranges),
            Ok(false) => None,
            Err(e) => {
                tracing::warn!(error = %e, "registering a new pool region failed; its commands go plain");
                None
            }
        }
    }

    /// Register the pool's regions not registered yet; whether there were any.
    fn refresh(&mut self, ring: &IoUring) -> std::io::Result<bool> {
        let Some(pool) = self.pool.as_ref() else {
            return Ok(false);
        };
        let regions = pool.regions();
        if regions.len() == self.seen {
            return Ok(false);
        }
        self.seen = regions.len();
        for r in regions {
            if r.id >= FIXED_BUFFERS_MAX || self.ranges.iter().any(|x| x.2 == r.id as u16) {
                continue;
            }
            let iov = libc::iovec {
                iov_base: r.addr as *mut libc::c_void,
                iov_len: r.len,
            };
            // SAFETY: the region is the pool's memory, which lives as long as the
            // pool (this struct holds a clone, and the worker declares its
            // rings before this struct, so they are dropped first) and so as
            // long as the ring's registration of it; the ring only reads or
            // writes it for commands whose buffers lie in it.
            unsafe { ring.submitter().register_buffers_update(r.id, &[iov], None) }?;
            self.ranges.push((r.addr, r.len, r.id as u16));
        }
        Ok(true)
    }
}
