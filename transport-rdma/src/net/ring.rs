//! The send ring: registered memory that frames are copied into for the NIC
//! to read, handed out first in, first out and given back as sends complete
//! (RC completes in order, so the oldest piece is always the first free).

use std::collections::VecDeque;

/// Pieces of one region, by send work request.
#[derive(Debug)]
pub(super) struct Ring {
    cap: usize,
    /// Where the next piece starts.
    head: usize,
    /// Pieces in use, oldest first: work request, start, end.
    live: VecDeque<(u64, usize, usize)>,
}

impl Ring {
    /// A ring over `cap` bytes.
    pub(super) fn new(cap: usize) -> Ring {
        Ring {
            cap,
            head: 0,
            live: VecDeque::new(),
        }
    }

    /// Where `len` bytes for work request `wr` go, if they fit now.
    pub(super) fn alloc(&mut self, wr: u64, len: usize) -> Option<usize> {
        let start = self.start_for(len)?;
        self.head = start + len;
        self.live.push_back((wr, start, self.head));
        Some(start)
    }

    /// Whether `len` bytes would fit now. Room only grows until the next
    /// [`Ring::alloc`], and a piece that fits fits any shorter one: so a
    /// sender that signals each send after which the largest would not fit
    /// always has a completion coming when the ring refuses one.
    pub(super) fn fits(&self, len: usize) -> bool {
        self.start_for(len).is_some()
    }

    fn start_for(&self, len: usize) -> Option<usize> {
        match self.live.front() {
            None => (len <= self.cap).then_some(0),
            // Free: [head, cap) and [0, tail). Never fill up to the tail
            // exactly, so head == tail means empty only.
            Some(&(_, tail, _)) if self.head >= tail => {
                if self.head + len <= self.cap {
                    Some(self.head)
                } else {
                    (len < tail).then_some(0)
                }
            }
            Some(&(_, tail, _)) => (self.head + len < tail).then_some(self.head),
        }
    }

    /// Work requests up to and including `wr` completed: their pieces are free.
    pub(super) fn release_through(&mut self, wr: u64) {
        while self.live.front().is_some_and(|&(w, ..)| w <= wr) {
            self.live.pop_front();
        }
        if self.live.is_empty() {
            self.head = 0;
        }
    }

    /// The number of the live piece whose number's `mask` bits are `low`.
    pub(super) fn full_wr(&self, low: u64, mask: u64) -> Option<u64> {
        self.live.iter().map(|&(w, ..)| w).find(|w| w & mask == low)
    }

    /// Bytes in use (pieces live, with any gap left at the end by a wrap).
    pub(super) fn used(&self) -> usize {
        match (self.live.front(), self.live.back()) {
            (Some(&(_, tail, _)), Some(&(_, _, end))) if end >= tail => end - tail,
            (Some(&(_, tail, _)), Some(&(_, _, end))) => self.cap - tail + end,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pieces_wrap_and_never_overlap_a_live_one() {
        let mut r = Ring::new(100);
        assert_eq!(r.alloc(1, 60), Some(0));
        assert_eq!(r.alloc(2, 30), Some(60));
        assert!(!r.fits(20) && r.fits(10));
        assert_eq!(
            r.alloc(3, 20),
            None,
            "10 left at the end, the front is live"
        );
        r.release_through(1);
        assert_eq!(r.alloc(3, 20), Some(0), "wraps to the freed front");
        assert_eq!(r.alloc(4, 40), None, "would reach the live piece at 60");
        assert_eq!(r.alloc(4, 39), Some(20));
        r.release_through(4);
        assert_eq!(r.used(), 0);
        assert_eq!(
            r.alloc(5, 100),
            Some(0),
            "an empty ring takes its whole size"
        );
        assert_eq!(r.alloc(6, 1), None);
    }

    proptest! {
        /// Under any order of allocations and in-order releases, live pieces lie
        /// inside the ring and never overlap.
        #[test]
        fn live_pieces_never_overlap(ops in proptest::collection::vec((1usize..70, any::<bool>()), 1..200)) {
            let mut r = Ring::new(128);
            let mut wr = 0;
            for (len, release) in ops {
                if release && !r.live.is_empty() {
                    let oldest = r.live[0].0;
                    r.release_through(oldest);
                } else {
                    wr += 1;
                    let _ = r.alloc(wr, len);
                }
                let mut pieces: Vec<(usize, usize)> = r.live.iter().map(|&(_, s, e)| (s, e)).collect();
                pieces.sort();
                for w in pieces.windows(2) {
                    prop_assert!(w[0].1 <= w[1].0, "overlap: {:?}", pieces);
                }
                prop_assert!(pieces.iter().all(|&(s, e)| s < e && e <= 128));
            }
        }
    }
}
