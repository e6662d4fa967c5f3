//! The slab pool: its accounting, alignment, splitting and region sources.

use super::*;

/// A source of at most `limit` regions, counting what it hands out.
struct Counted {
    limit: usize,
    live: Mutex<Vec<(usize, usize)>>,
    freed: AtomicUsize,
}

impl RegionSource for Counted {
    fn alloc(&self, bytes: usize) -> Option<NonNull<u8>> {
        let mut live = self.live.lock().unwrap();
        if live.len() == self.limit {
            return None;
        }
        let layout = Layout::from_size_align(bytes, BUF_ALIGN).unwrap();
        // SAFETY: non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc(layout) })?;
        live.push((ptr.as_ptr() as usize, bytes));
        Some(ptr)
    }

    unsafe fn free(&self, ptr: NonNull<u8>, bytes: usize) {
        let mut live = self.live.lock().unwrap();
        let at = live
            .iter()
            .position(|&(p, b)| p == ptr.as_ptr() as usize && b == bytes)
            .expect("freed what was handed out, with its size");
        live.remove(at);
        self.freed.fetch_add(1, Ordering::Relaxed);
        let layout = Layout::from_size_align(bytes, BUF_ALIGN).unwrap();
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) }
    }
}

#[test]
fn regions_come_from_the_source_and_go_back_to_it_and_a_dry_source_refuses() {
    let source = Arc::new(Counted {
        limit: 1,
        live: Mutex::new(Vec::new()),
        freed: AtomicUsize::new(0),
    });
    // Two regions' budget, but a source of one.
    let pool = BufPool::with_source(2 * REGION_BYTES_MAX, source.clone());
    let a = pool.alloc(REGION_BYTES_MAX).unwrap();
    let (addr, bytes) = source.live.lock().unwrap()[0];
    assert_eq!(bytes, REGION_BYTES_MAX);
    assert_eq!(a.as_ref().as_ptr() as usize, addr, "the buffer is in it");
    assert_eq!(pool.regions()[0].addr, addr);
    let refused = pool.alloc(BUF_ALIGN).unwrap_err();
    assert_eq!(refused.requested, BUF_ALIGN);
    assert_eq!(
        pool.used_bytes(),
        REGION_BYTES_MAX,
        "the refusal took nothing"
    );
    pool.self_check();
    drop(a);
    let b = pool.alloc(BUF_ALIGN).expect("room again in the one region");
    drop(b);
    assert_eq!(
        source.freed.load(Ordering::Relaxed),
        0,
        "kept while the pool lives"
    );
    drop(pool);
    assert_eq!(source.freed.load(Ordering::Relaxed), 1);
    assert!(source.live.lock().unwrap().is_empty());
}

#[test]
fn a_split_buffer_owns_disjoint_pieces_and_its_block_returns_with_the_last() {
    let pool = BufPool::new(64 * BUF_ALIGN);
    let mut a = pool.alloc(3 * BUF_ALIGN).unwrap();
    let used = pool.used_bytes();
    assert_eq!(used, 4 * BUF_ALIGN, "a block of 4 pages");
    let mut b = a.split_off(BUF_ALIGN);
    let c = b.split_off(BUF_ALIGN);
    assert_eq!(
        (a.len(), b.len(), c.len()),
        (BUF_ALIGN, BUF_ALIGN, BUF_ALIGN)
    );
    assert_eq!(b.offset(), a.offset() + BUF_ALIGN);
    assert_eq!(c.offset(), b.offset() + BUF_ALIGN);
    b.as_mut().fill(7);
    assert!(a.as_ref().iter().all(|&x| x == 0), "pieces are disjoint");
    // Only the following piece of the same block joins.
    let c = a.unsplit(c).expect_err("c does not follow a");
    let other = pool.alloc(BUF_ALIGN).unwrap();
    let other = b.unsplit(other).expect_err("another block");
    drop(other);
    b.unsplit(c).expect("c follows b");
    a.unsplit(b).expect("b follows a");
    assert_eq!(a.len(), 3 * BUF_ALIGN);
    assert!(a.as_ref()[BUF_ALIGN..2 * BUF_ALIGN].iter().all(|&x| x == 7));
    let mut d = a.split_off(2 * BUF_ALIGN);
    drop(a);
    assert_eq!(
        pool.used_bytes(),
        used,
        "the block is held by its last piece"
    );
    d.as_mut().fill(1);
    drop(d);
    assert_eq!(pool.used_bytes(), 0);
    pool.self_check();
}

#[test]
#[should_panic(expected = "a split at 100")]
fn a_split_off_the_page_grid_is_a_bug() {
    BufPool::new(BUF_ALIGN)
        .alloc(BUF_ALIGN)
        .unwrap()
        .split_off(100);
}

#[test]
fn buffers_are_aligned_and_budgeted() {
    let pool = BufPool::new(4 * BUF_ALIGN);
    let mut a = pool.alloc(5000).unwrap();
    assert_eq!(a.as_ref().as_ptr() as usize % BUF_ALIGN, 0);
    assert_eq!(a.len(), 5000);
    assert_eq!(pool.used_bytes(), 2 * BUF_ALIGN);
    // Three pages take a four-page block: more than is left.
    let err = pool.alloc(3 * BUF_ALIGN).unwrap_err();
    assert_eq!((err.requested, err.free), (4 * BUF_ALIGN, 2 * BUF_ALIGN));
    a.as_mut()[4999] = 7;
    let frozen = a.freeze();
    assert_eq!(frozen[4999], 7);
    assert_eq!(pool.used_bytes(), 2 * BUF_ALIGN);
    drop(frozen);
    assert_eq!(pool.used_bytes(), 0);
    assert!(pool.alloc(3 * BUF_ALIGN).is_ok());
    pool.self_check();
}

#[test]
fn a_buffer_knows_its_region_and_offset_and_bytes_inside_are_located() {
    let pool = BufPool::new(2 * REGION_BYTES_MAX);
    let a = pool.alloc(BUF_ALIGN).unwrap();
    let b = pool.alloc(3 * BUF_ALIGN).unwrap();
    assert_eq!((a.region(), a.offset()), (0, 0));
    assert_eq!(
        (b.region(), b.offset()),
        (0, 4 * BUF_ALIGN),
        "buddy of order 2"
    );
    let frozen = b.freeze();
    assert_eq!(
        pool.locate(&frozen[100..200]),
        Some((0, 4 * BUF_ALIGN + 100))
    );
    assert_eq!(pool.locate(&[1u8, 2, 3]), None, "memory from elsewhere");
    // A block as large as a region goes to a second region.
    let big = pool.alloc(REGION_BYTES_MAX).unwrap();
    assert_eq!((big.region(), big.offset()), (1, 0));
    let regions = pool.regions();
    assert_eq!(regions.len(), 2);
    assert_eq!(regions[1].len, REGION_BYTES_MAX);
    assert_eq!(regions[0].addr % BUF_ALIGN, 0);
    assert!(pool.alloc(REGION_BYTES_MAX + 1).is_err(), "past a region");
    pool.self_check();
}

#[test]
fn freed_blocks_merge_so_a_large_request_fits_again() {
    let pool = BufPool::new(64 * BUF_ALIGN);
    // Fill the region with single pages, dirty them, free them all.
    let mut small: Vec<Buf> = (0..64).map(|_| pool.alloc(BUF_ALIGN).unwrap()).collect();
    for b in &mut small {
        b.as_mut().fill(0xAB);
    }
    assert!(pool.alloc(BUF_ALIGN).is_err(), "full");
    // Free every other page: no two free pages are buddies.
    let odd: Vec<Buf> = small
        .drain(..)
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, b)| b)
        .collect();
    assert!(pool.alloc(2 * BUF_ALIGN).is_err(), "fragmented");
    drop(odd);
    pool.self_check();
    let whole = pool.alloc(64 * BUF_ALIGN).unwrap();
    assert_eq!(whole.offset(), 0);
    assert!(whole.as_ref().iter().all(|&b| b == 0), "handed out zeroed");
    assert_eq!(pool.regions().len(), 1, "no second region was needed");
    pool.self_check();
}

#[test]
fn random_allocations_and_frees_keep_the_accounting_and_never_overlap() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let pool = BufPool::new(256 * BUF_ALIGN);
    let mut held: Vec<Buf> = Vec::new();
    for step in 0..5_000 {
        if rng.gen_bool(0.55) {
            let len = rng.gen_range(1..=40 * BUF_ALIGN);
            if let Ok(mut b) = pool.alloc(len) {
                b.as_mut().fill((step % 251) as u8);
                held.push(b);
            }
        } else if !held.is_empty() {
            let i = rng.gen_range(0..held.len());
            let b = held.swap_remove(i);
            let tag = b.as_ref()[0];
            assert!(
                b.as_ref().iter().all(|&x| x == tag),
                "no other buffer wrote here"
            );
        }
        if step % 500 == 0 {
            pool.self_check();
        }
    }
    let mut spans: Vec<(usize, usize)> = held
        .iter()
        .map(|b| (b.offset(), b.offset() + b.len()))
        .collect();
    spans.sort_unstable();
    assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0), "disjoint");
    drop(held);
    assert_eq!(pool.used_bytes(), 0);
    pool.self_check();
}
