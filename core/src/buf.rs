//! Aligned buffers from a budgeted pool.
//!
//! In production one pool is registered with the NIC and used as the device's DMA
//! target, so a read goes SSD -> pool -> wire with no copy. The simulator and TCP use
//! the same type over plain memory. Every buffer is 4 KiB-aligned and a whole number
//! of 4 KiB pages; the pool has a byte budget fixed at start-up and refuses to go
//! past it instead of growing without bound.

use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Alignment and allocation granule of every buffer.
pub const BUF_ALIGN: usize = 4096;

#[derive(Clone, Copy, bytemuck::Zeroable, bytemuck::Pod)]
#[repr(C, align(4096))]
struct Page([u8; BUF_ALIGN]);

/// The pool refused an allocation because its budget is spent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("buffer pool exhausted: {requested} bytes requested, {free} of {budget} free")]
pub struct PoolExhausted {
    /// Bytes asked for (rounded up to pages).
    pub requested: usize,
    /// Bytes still free.
    pub free: usize,
    /// The pool's budget.
    pub budget: usize,
}

/// A budgeted source of aligned buffers. Cheap to clone; clones share the budget.
#[derive(Clone, Debug)]
pub struct BufPool {
    inner: Arc<PoolInner>,
}

#[derive(Debug)]
struct PoolInner {
    budget_bytes: usize,
    used_bytes: AtomicUsize,
}

impl BufPool {
    /// A pool that hands out at most `budget_bytes` at once.
    pub fn new(budget_bytes: usize) -> Self {
        BufPool {
            inner: Arc::new(PoolInner {
                budget_bytes,
                used_bytes: AtomicUsize::new(0),
            }),
        }
    }

    /// A zeroed buffer of `len` bytes (capacity rounded up to whole pages).
    pub fn alloc(&self, len: usize) -> Result<Buf, PoolExhausted> {
        let pages = len.div_ceil(BUF_ALIGN).max(1);
        let bytes = pages * BUF_ALIGN;
        let prev = self
            .inner
            .used_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + bytes <= self.inner.budget_bytes).then_some(used + bytes)
            })
            .map_err(|used| PoolExhausted {
                requested: bytes,
                free: self.inner.budget_bytes - used,
                budget: self.inner.budget_bytes,
            })?;
        debug_assert!(prev + bytes <= self.inner.budget_bytes);
        Ok(Buf {
            pages: vec![Page([0; BUF_ALIGN]); pages],
            len,
            pool: self.inner.clone(),
        })
    }

    /// Bytes currently handed out.
    pub fn used_bytes(&self) -> usize {
        self.inner.used_bytes.load(Ordering::Acquire)
    }
}

/// An owned, 4 KiB-aligned buffer. Its bytes return to the pool's budget on drop.
pub struct Buf {
    pages: Vec<Page>,
    len: usize,
    pool: Arc<PoolInner>,
}

impl Buf {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Freeze into `Bytes` without copying; the budget is returned when the last
    /// `Bytes` clone is dropped.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        &bytemuck::cast_slice::<Page, u8>(&self.pages)[..self.len]
    }
}

impl AsMut<[u8]> for Buf {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<Page, u8>(&mut self.pages)[..self.len]
    }
}

impl std::fmt::Debug for Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buf").field("len", &self.len).finish()
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let bytes = self.pages.len() * BUF_ALIGN;
        let prev = self.pool.used_bytes.fetch_sub(bytes, Ordering::AcqRel);
        assert!(prev >= bytes, "buffer pool accounting underflow");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_and_budgeted() {
        let pool = BufPool::new(3 * BUF_ALIGN);
        let mut a = pool.alloc(5000).unwrap();
        assert_eq!(a.as_ref().as_ptr() as usize % BUF_ALIGN, 0);
        assert_eq!(a.len(), 5000);
        assert_eq!(pool.used_bytes(), 2 * BUF_ALIGN);
        let err = pool.alloc(2 * BUF_ALIGN).unwrap_err();
        assert_eq!(err.free, BUF_ALIGN);
        a.as_mut()[4999] = 7;
        let frozen = a.freeze();
        assert_eq!(frozen[4999], 7);
        assert_eq!(pool.used_bytes(), 2 * BUF_ALIGN);
        drop(frozen);
        assert_eq!(pool.used_bytes(), 0);
        assert!(pool.alloc(3 * BUF_ALIGN).is_ok());
    }
}
