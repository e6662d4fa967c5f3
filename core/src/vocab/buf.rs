//! The slab pool: aligned buffers carved from a few large regions.
//!
//! A [`BufPool`] reserves its memory as *regions* (slabs) of at most
//! [`REGION_BYTES_MAX`], each allocated once, when the pool first needs it, and
//! kept until the pool is dropped. In production those regions are what the NIC
//! registers (one memory registration per region) and what the device reads into
//! and writes from, so a read goes SSD -> pool -> wire with no copy. A [`Buf`] is
//! `(region, offset, len)`: what a scatter-gather entry or a DMA descriptor
//! needs. [`BufPool::locate`] finds the region and offset of any bytes inside the
//! pool (a frozen `Bytes`, a slice of one), as an RDMA stack looks up the memory
//! registration of an address.
//!
//! Inside a region, blocks come in size classes of 4 KiB times a power of two,
//! from a buddy allocator: a freed block merges with its free buddy, so memory
//! freed in small blocks serves a large request again. The last few blocks freed
//! of each class are kept unmerged for the next request of that class (the data
//! path's steady state), and merged back when a request finds nothing else. Every buffer is 4 KiB
//! aligned. The pool has a byte budget fixed at start-up and refuses to go past
//! it instead of growing without bound; a buffer counts its whole block, and the
//! regions reserved never pass the budget rounded up to a whole region.
//!
//! This file holds the only `unsafe` code of weir-core: handing out disjoint
//! ranges of a region as buffers each owned by one [`Buf`].

use bytes::Bytes;
use std::alloc::Layout;
use std::collections::BTreeSet;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Alignment and allocation granule of every buffer.
pub const BUF_ALIGN: usize = 4096;
/// The largest region a pool reserves at once (a smaller pool reserves its
/// budget, rounded up to a power of two pages). It is also the largest buffer.
pub const REGION_BYTES_MAX: usize = 64 << 20;

/// The pool refused an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("buffer pool exhausted: {requested} bytes requested, {free} of {budget} free")]
pub struct PoolExhausted {
    /// Bytes asked for (rounded up to the block that would hold them).
    pub requested: usize,
    /// Bytes still free within the budget (perhaps not in one block).
    pub free: usize,
    /// The pool's budget.
    pub budget: usize,
}

/// Where a region's memory is, for registering it with a NIC or a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    /// The region's number in its pool, from 0.
    pub id: u32,
    /// Its first byte's address.
    pub addr: usize,
    /// Its length in bytes.
    pub len: usize,
}

/// Where a pool's regions come from when the system allocator will not do:
/// memory a device can reach by DMA (SPDK's hugepage memory, say), so that a
/// read lands in a pool buffer the SSD wrote itself.
pub trait RegionSource: Send + Sync + 'static {
    /// `bytes` bytes (a whole number of [`BUF_ALIGN`] pages) aligned to at
    /// least [`BUF_ALIGN`], or `None` when the source has no more.
    fn alloc(&self, bytes: usize) -> Option<NonNull<u8>>;

    /// Give back a region.
    ///
    /// # Safety
    ///
    /// `ptr` came from [`RegionSource::alloc`] of this source with the same
    /// `bytes`, was not freed before, and nothing uses its memory any more.
    unsafe fn free(&self, ptr: NonNull<u8>, bytes: usize);
}

/// One slab: memory allocated once, aligned to [`BUF_ALIGN`]. It is not zeroed
/// as a whole: an aligned `alloc_zeroed` writes every byte (making the whole
/// region resident at once), while a large plain allocation is mapped lazily by
/// the system allocator. Each block is zeroed when it is handed out.
struct Region {
    ptr: NonNull<u8>,
    layout: Layout,
    id: u32,
    /// Where it came from: the system allocator when `None`.
    source: Option<Arc<dyn RegionSource>>,
}

// SAFETY: a region is plain memory. Its bytes are reached only through `Buf`s,
// each of which owns a range no other `Buf` overlaps (the buddy allocator hands
// each block out once until it is freed), so sharing the region's pointer across
// threads never makes two owners of one byte.
unsafe impl Send for Region {}
// SAFETY: as for `Send`: `&Region` gives no access to its bytes by itself.
unsafe impl Sync for Region {}

impl Region {
    /// A region of `bytes`, or `None` when `source` has no more memory.
    fn new(id: u32, bytes: usize, source: Option<&Arc<dyn RegionSource>>) -> Option<Region> {
        let layout = Layout::from_size_align(bytes, BUF_ALIGN).expect("region layout");
        let ptr = match source {
            Some(source) => {
                let ptr = source.alloc(bytes)?;
                assert!(
                    (ptr.as_ptr() as usize).is_multiple_of(BUF_ALIGN),
                    "a region source hands out BUF_ALIGN-aligned memory"
                );
                ptr
            }
            None => {
                // SAFETY: `layout` has a non-zero size (at least one page). Its
                // bytes are uninitialised until a `Buf` over them is zeroed in
                // `BufPool::alloc`.
                let ptr = unsafe { std::alloc::alloc(layout) };
                NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
            }
        };
        Some(Region {
            ptr,
            layout,
            id,
            source: source.cloned(),
        })
    }

    fn info(&self) -> RegionInfo {
        RegionInfo {
            id: self.id,
            addr: self.ptr.as_ptr() as usize,
            len: self.layout.size(),
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `Region::new` with this layout, by `source` when
        // there is one; every `Buf` holds an `Arc` of its region, so none is
        // left when this runs.
        unsafe {
            match &self.source {
                Some(source) => source.free(self.ptr, self.layout.size()),
                None => std::alloc::dealloc(self.ptr.as_ptr(), self.layout),
            }
        }
    }
}

/// Pages of freed blocks kept per order without merging (64 blocks of 4 KiB, one
/// of 256 KiB, none larger), so the steady state of a data path (a block freed,
/// one of the same size taken) costs a push and a pop, not a cascade of merges
/// and splits, while the pages the cache keeps touched stay few.
const CACHED_PAGES_PER_ORDER: usize = 64;

/// Free blocks of one region by order (a block of order `k` is `2^k` pages),
/// each a set of first pages, and a small cache of freed blocks per order.
#[derive(Debug)]
struct Buddy {
    free: Vec<BTreeSet<u32>>,
    cached: Vec<Vec<u32>>,
}

impl Buddy {
    /// A region of `2^top` pages, all free.
    fn new(top: u32) -> Buddy {
        let mut free = vec![BTreeSet::new(); top as usize + 1];
        free[top as usize].insert(0);
        Buddy {
            free,
            cached: vec![Vec::new(); top as usize + 1],
        }
    }

    /// A block of `order`: a cached one, else from the free sets; when those
    /// have none, the cache is merged back and they are asked again.
    fn take(&mut self, order: u32) -> Option<u32> {
        if let Some(start) = self.cached[order as usize].pop() {
            return Some(start);
        }
        if let Some(start) = self.alloc(order) {
            return Some(start);
        }
        for k in 0..self.cached.len() {
            for start in std::mem::take(&mut self.cached[k]) {
                self.release(start, k as u32);
            }
        }
        self.alloc(order)
    }

    /// Give back a block: into the cache if it has room, else merged.
    fn put(&mut self, start: u32, order: u32) {
        let cache = &mut self.cached[order as usize];
        if (cache.len() + 1) << order <= CACHED_PAGES_PER_ORDER {
            debug_assert!(!cache.contains(&start), "block at page {start} freed twice");
            cache.push(start);
        } else {
            self.release(start, order);
        }
    }

    fn top(&self) -> u32 {
        self.free.len() as u32 - 1
    }

    /// The first page of a free block of `order`, split from a larger one if
    /// need be.
    fn alloc(&mut self, order: u32) -> Option<u32> {
        let from = (order..=self.top()).find(|&k| !self.free[k as usize].is_empty())?;
        let start = self.free[from as usize].pop_first()?;
        for k in (order..from).rev() {
            // Keep the lower half, free the upper one.
            let inserted = self.free[k as usize].insert(start + (1 << k));
            debug_assert!(inserted);
        }
        Some(start)
    }

    /// Give back the block of `order` at `start`, merged with its free buddies.
    fn release(&mut self, mut start: u32, mut order: u32) {
        while order < self.top() {
            let buddy = start ^ (1 << order);
            if !self.free[order as usize].remove(&buddy) {
                break;
            }
            start = start.min(buddy);
            order += 1;
        }
        let inserted = self.free[order as usize].insert(start);
        assert!(inserted, "block at page {start} freed twice");
    }

    /// Free pages of the region (cached blocks included).
    fn free_pages(&self) -> u64 {
        self.free
            .iter()
            .zip(&self.cached)
            .enumerate()
            .map(|(k, (set, cache))| (set.len() + cache.len()) as u64 * (1 << k))
            .sum()
    }
}

/// A budgeted source of aligned buffers. Cheap to clone; clones share the pool.
#[derive(Clone)]
pub struct BufPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    budget_bytes: usize,
    used_bytes: AtomicUsize,
    /// Pages per region (a power of two).
    region_pages: u32,
    /// Regions reserved so far, each with its free blocks. Locked briefly, for an
    /// allocation or a release, never across an await.
    regions: Mutex<Vec<(Arc<Region>, Buddy)>>,
    /// Where regions come from: the system allocator when `None`.
    source: Option<Arc<dyn RegionSource>>,
}

impl std::fmt::Debug for BufPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufPool")
            .field("budget_bytes", &self.inner.budget_bytes)
            .field("used_bytes", &self.used_bytes())
            .finish()
    }
}

/// The order of the smallest block of `pages` pages or more.
fn order_of(pages: usize) -> u32 {
    pages.next_power_of_two().trailing_zeros()
}

impl BufPool {
    /// A pool that hands out at most `budget_bytes` at once (a budget below
    /// [`REGION_BYTES_MAX`] rounded up to a power of two pages), in regions of at
    /// most [`REGION_BYTES_MAX`] reserved as it needs them.
    pub fn new(budget_bytes: usize) -> Self {
        Self::build(budget_bytes, None)
    }

    /// As [`BufPool::new`], with every region taken from `source` (DMA memory,
    /// say). A region the source cannot give refuses the allocation that
    /// needed it, as the budget does.
    pub fn with_source(budget_bytes: usize, source: Arc<dyn RegionSource>) -> Self {
        Self::build(budget_bytes, Some(source))
    }

    fn build(budget_bytes: usize, source: Option<Arc<dyn RegionSource>>) -> Self {
        let pages = budget_bytes
            .div_ceil(BUF_ALIGN)
            .clamp(1, REGION_BYTES_MAX / BUF_ALIGN)
            .next_power_of_two();
        BufPool {
            inner: Arc::new(PoolInner {
                // A budget below a region is its one region: a pool made for one
                // buffer of `len` bytes holds it, whatever block it takes.
                budget_bytes: budget_bytes.max(pages * BUF_ALIGN),
                used_bytes: AtomicUsize::new(0),
                region_pages: pages as u32,
                regions: Mutex::new(Vec::new()),
                source,
            }),
        }
    }

    /// A zeroed buffer of `len` bytes, in a block of the smallest size class that
    /// holds it.
    pub fn alloc(&self, len: usize) -> Result<Buf, PoolExhausted> {
        let order = order_of(len.div_ceil(BUF_ALIGN).max(1));
        let bytes = (1usize << order) * BUF_ALIGN;
        let inner = &*self.inner;
        let refuse = |used: usize| PoolExhausted {
            requested: bytes,
            free: inner.budget_bytes.saturating_sub(used),
            budget: inner.budget_bytes,
        };
        if order > inner.region_pages.trailing_zeros() {
            return Err(refuse(self.used_bytes()));
        }
        inner
            .used_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + bytes <= inner.budget_bytes).then_some(used + bytes)
            })
            .map_err(refuse)?;
        let mut regions = inner.regions.lock().unwrap_or_else(PoisonError::into_inner);
        let found = regions
            .iter_mut()
            .find_map(|(region, buddy)| Some((region.clone(), buddy.take(order)?)));
        let region_bytes = inner.region_pages as usize * BUF_ALIGN;
        let (region, page) = match found {
            Some(found) => found,
            None if regions.len() * region_bytes >= inner.budget_bytes => {
                // The regions that the budget allows are too fragmented for this
                // size class: refuse rather than reserve past the budget.
                drop(regions);
                inner.used_bytes.fetch_sub(bytes, Ordering::AcqRel);
                return Err(refuse(self.used_bytes()));
            }
            None => {
                // The others are full or too fragmented for this size class.
                let id = regions.len() as u32;
                let Some(region) = Region::new(id, region_bytes, inner.source.as_ref()) else {
                    drop(regions);
                    inner.used_bytes.fetch_sub(bytes, Ordering::AcqRel);
                    return Err(refuse(self.used_bytes()));
                };
                let region = Arc::new(region);
                let mut buddy = Buddy::new(inner.region_pages.trailing_zeros());
                let page = buddy.take(order).expect("a fresh region holds any class");
                regions.push((region.clone(), buddy));
                (region, page)
            }
        };
        drop(regions);
        let offset = page as usize * BUF_ALIGN;
        let buf = Buf {
            region,
            offset,
            len,
            owner: Owner::Block {
                order,
                pool: self.inner.clone(),
            },
        };
        // SAFETY: the block `[offset, offset + bytes)` lies inside the region (the
        // buddy allocator only hands out blocks of it) and is owned by `buf` alone.
        unsafe { buf.ptr().write_bytes(0, len) };
        Ok(buf)
    }

    /// Bytes currently handed out (whole blocks).
    pub fn used_bytes(&self) -> usize {
        self.inner.used_bytes.load(Ordering::Acquire)
    }

    /// The regions reserved so far (what a NIC or device registers).
    pub fn regions(&self) -> Vec<RegionInfo> {
        let regions = self.lock_regions();
        regions.iter().map(|(r, _)| r.info()).collect()
    }

    /// The region and offset of `bytes` if they lie inside this pool's memory
    /// (any part of a buffer from it, frozen or not).
    pub fn locate(&self, bytes: &[u8]) -> Option<(u32, usize)> {
        let (start, len) = (bytes.as_ptr() as usize, bytes.len());
        let regions = self.lock_regions();
        regions.iter().find_map(|(r, _)| {
            let info = r.info();
            let inside = start >= info.addr && start + len <= info.addr + info.len;
            inside.then(|| (info.id, start - info.addr))
        })
    }

    fn lock_regions(&self) -> std::sync::MutexGuard<'_, Vec<(Arc<Region>, Buddy)>> {
        self.inner
            .regions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The pool's accounting agrees with its free blocks: pages handed out plus
    /// pages free make up every region.
    pub fn self_check(&self) {
        let regions = self.lock_regions();
        let total: u64 = regions.len() as u64 * u64::from(self.inner.region_pages);
        let free: u64 = regions.iter().map(|(_, b)| b.free_pages()).sum();
        let used = (self.used_bytes() / BUF_ALIGN) as u64;
        assert_eq!(
            free + used,
            total,
            "pages free and in use make up the regions"
        );
        assert!(
            self.used_bytes() <= self.inner.budget_bytes,
            "within the budget"
        );
    }
}

/// An owned, 4 KiB-aligned buffer: `len` bytes at `offset` in a region of its
/// pool. Its block returns to the pool on drop.
pub struct Buf {
    region: Arc<Region>,
    /// Where its bytes start in the region.
    offset: usize,
    len: usize,
    owner: Owner,
}

/// What returns a buffer's block to the pool.
enum Owner {
    /// The buffer is its whole block (of this order, starting at its offset).
    Block { order: u32, pool: Arc<PoolInner> },
    /// The buffer is a piece of a block split between several buffers
    /// ([`Buf::split_off`]); the last piece dropped returns it.
    Piece(Arc<Block>),
}

/// A block shared by the pieces of a split buffer.
struct Block {
    region: Arc<Region>,
    offset: usize,
    order: u32,
    pool: Arc<PoolInner>,
}

impl Drop for Block {
    fn drop(&mut self) {
        release(&self.pool, &self.region, self.offset, self.order);
    }
}

/// Give the block of `order` at `offset` in `region` back to its pool.
fn release(pool: &PoolInner, region: &Region, offset: usize, order: u32) {
    let bytes = (1usize << order) * BUF_ALIGN;
    {
        let mut regions = pool.regions.lock().unwrap_or_else(PoisonError::into_inner);
        let (_, buddy) = &mut regions[region.id as usize];
        buddy.put((offset / BUF_ALIGN) as u32, order);
    }
    let prev = pool.used_bytes.fetch_sub(bytes, Ordering::AcqRel);
    assert!(prev >= bytes, "buffer pool accounting underflow");
}

// SAFETY: a `Buf` owns its bytes exclusively (see `Region`; the pieces of a
// split block own disjoint ranges of it); moving it to another thread moves that
// ownership, and `&Buf` only reads.
unsafe impl Send for Buf {}
// SAFETY: as above: shared references only read the block.
unsafe impl Sync for Buf {}

impl Buf {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The region of its pool this buffer is in.
    pub fn region(&self) -> u32 {
        self.region.id
    }

    /// Its offset in that region, in bytes (a multiple of [`BUF_ALIGN`]).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Split the buffer in two at `at` bytes: `self` keeps `[0, at)` and the
    /// returned buffer owns `[at, len)`, both in the same block, which returns to
    /// the pool when both are gone. `at` is a multiple of [`BUF_ALIGN`] (each
    /// piece stays aligned for DMA) and at most `len`.
    pub fn split_off(&mut self, at: usize) -> Buf {
        assert!(
            at <= self.len && at.is_multiple_of(BUF_ALIGN),
            "a split at {at} of a {}-byte buffer",
            self.len
        );
        let block = match &self.owner {
            Owner::Piece(block) => block.clone(),
            Owner::Block { order, pool } => Arc::new(Block {
                region: self.region.clone(),
                offset: self.offset,
                order: *order,
                pool: pool.clone(),
            }),
        };
        // Replacing `Owner::Block` releases nothing: only `Buf`'s and `Block`'s
        // drops give blocks back.
        self.owner = Owner::Piece(block.clone());
        let tail = Buf {
            region: self.region.clone(),
            offset: self.offset + at,
            len: self.len - at,
            owner: Owner::Piece(block),
        };
        self.len = at;
        tail
    }

    /// Join `next`, the piece that follows this one in their block, back onto
    /// it (the inverse of [`Buf::split_off`]); hands `next` back if it is not
    /// that piece.
    pub fn unsplit(&mut self, next: Buf) -> Result<(), Buf> {
        let same_block = match (&self.owner, &next.owner) {
            (Owner::Piece(a), Owner::Piece(b)) => Arc::ptr_eq(a, b),
            _ => false,
        };
        if !same_block || self.offset + self.len != next.offset {
            return Err(next);
        }
        self.len += next.len;
        // `next`'s drop only lets go of its share of the block.
        drop(next);
        Ok(())
    }

    /// Freeze into `Bytes` without copying; the block returns to the pool when the
    /// last `Bytes` clone is dropped.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }

    fn ptr(&self) -> *mut u8 {
        // SAFETY: `offset` is inside the region's allocation (see `BufPool::alloc`;
        // a piece's offset is inside its block, see `split_off`).
        unsafe { self.region.ptr.as_ptr().add(self.offset) }
    }
}

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len` bytes from `ptr` lie in this buffer's block, which only this
        // `Buf` reaches, and were initialised (zeroed) at allocation.
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }
}

impl AsMut<[u8]> for Buf {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_ref`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.len) }
    }
}

impl std::fmt::Debug for Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buf")
            .field("region", &self.region.id)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // A piece's block goes back when its last piece's `Arc` drops.
        if let Owner::Block { order, pool } = &self.owner {
            release(pool, &self.region, self.offset, *order);
        }
    }
}

#[cfg(test)]
mod tests;
