//! Free slots: a bitmap of clean ones (read as zeroes, ready to allocate), taken
//! next-fit, and a queue of dirty ones waiting to be zeroed. One bit a slot, plus
//! four bytes a slot waiting: 32 KiB per TiB of 4 MiB slots, whatever is stored.

use std::collections::VecDeque;

#[derive(Debug)]
pub(super) struct Space {
    /// Bit `s` set: slot `s` is clean and free.
    clean: Vec<u64>,
    clean_count: u32,
    slots: u32,
    /// Where the next search starts.
    cursor: u32,
    /// Free slots to zero, whose release is durable, oldest first.
    dirty: VecDeque<u32>,
}

impl Space {
    pub(super) fn new(slots: u32) -> Space {
        Space {
            clean: vec![0; (slots as usize).div_ceil(64)],
            clean_count: 0,
            slots,
            cursor: 0,
            dirty: VecDeque::new(),
        }
    }

    pub(super) fn is_clean(&self, slot: u32) -> bool {
        self.clean[slot as usize / 64] & (1 << (slot % 64)) != 0
    }

    /// Slot `slot` is clean and free.
    pub(super) fn put_clean(&mut self, slot: u32) {
        assert!(!self.is_clean(slot), "slot {slot} freed twice");
        self.clean[slot as usize / 64] |= 1 << (slot % 64);
        self.clean_count += 1;
    }

    /// A clean slot, taken: the next from the cursor on.
    pub(super) fn take(&mut self) -> Option<u32> {
        if self.clean_count == 0 {
            return None;
        }
        let words = self.clean.len();
        let first = self.cursor as usize / 64;
        for i in 0..=words {
            let w = (first + i) % words;
            let mut bits = self.clean[w];
            if i == 0 {
                // The cursor's own word: only bits at or past it.
                bits &= !0u64 << (self.cursor % 64);
            }
            if bits != 0 {
                let slot = (w * 64) as u32 + bits.trailing_zeros();
                self.clean[w] &= !(1 << (slot % 64));
                self.clean_count -= 1;
                self.cursor = (slot + 1) % self.slots;
                return Some(slot);
            }
        }
        unreachable!("clean_count says a slot is clean");
    }

    /// Slot `slot` is free and must be zeroed before it is used.
    pub(super) fn put_dirty(&mut self, slot: u32) {
        self.dirty.push_back(slot);
    }

    /// The next slot to zero.
    pub(super) fn next_dirty(&mut self) -> Option<u32> {
        self.dirty.pop_front()
    }

    pub(super) fn clean_count(&self) -> u32 {
        self.clean_count
    }

    pub(super) fn dirty_count(&self) -> usize {
        self.dirty.len()
    }

    /// Bytes of memory held.
    pub(super) fn memory_bytes(&self) -> usize {
        self.clean.capacity() * 8 + self.dirty.capacity() * 4
    }
}
