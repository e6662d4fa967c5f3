//! The store of one device: which object each slot of the device holds, kept
//! on the device itself, so that nothing about where data sits is in Raft.
//!
//! Sans-IO like every engine: the owner calls [`Store::allocate`],
//! [`Store::update`], [`Store::release`] and [`Store::lookup`]; the store answers
//! at once from memory and queues what must reach the device, which the driver
//! takes with [`Store::poll_op`] and reports back with [`Store::complete`].
//!
//! # Layout and durability
//!
//! The device is cut into fixed-size slots, one object each (see [`layout`]).
//! A table holds one 64-byte entry per slot: free and clean (reads as zeroes),
//! used by an object (its key, version and filled parts), or free and dirty
//! (to zero before reuse). A change to an entry is durable once the journal page
//! carrying its image completes ([`Ticket`]): journal pages are written one at a
//! time with Force Unit Access (see [`journal`]). Table pages are written back
//! in the background; once a flush after them completes, the journal before them
//! is no longer needed, and the pages' `start` moves on.
//!
//! Recovery (in `open.rs`, with format) reads the superblock, the table and the
//! ring, replays the whole run of pages that ends last (an entry image is taken
//! only if it is newer than the table's), rebuilds the index and the free space
//! from the entries, and frees by journaled releases what damage left (an entry
//! that does not check, an object in two slots). Each opening draws a random
//! `nonce` that every sector of its journal pages carries, so a page torn
//! before a restart is never completed by the same page number written after it.
//! A checkpoint writes every table page, flushes, and writes a page of no
//! changes that carries the new start, so the next open replays that page alone.
//! A table entry newer than the journal, or a whole page past the run, means
//! the journal lost pages: recovery refuses rather than free what it holds.
//!
//! # The rules the owner keeps
//!
//! - Data is written into a newly allocated slot only once the allocation's
//!   ticket is durable: a slot never holds data the table does not give to its
//!   object, so a slot recovered as free holds nothing of anyone's.
//! - An object is released only when no device command to its slot is in
//!   flight. Its slot is zeroed (after the release is durable, and a flush after
//!   the zeroing) before another object gets it: an object never reads another's
//!   data.
//!
//! # Memory
//!
//! 56 bytes per slot (the entries) plus about 48 per used slot (the index) plus a
//! bit per slot (free space): at the default 4 MiB slot, about 14 MiB per TiB of
//! device and 12 MiB per TiB stored. Every queue is bounded: changes waiting for
//! a journal page ([`MAX_QUEUED`]; recovery's own fixes may pass it, at most one
//! a slot), table writes and slot zeroings in flight.

#[cfg(test)]
mod damage_tests;
pub mod journal;
pub mod layout;
mod open;
mod space;
#[cfg(test)]
mod tests;

use crate::device::{DevCommand, DevError, Geometry};
use crate::ids::Lba;
use bytes::Bytes;
use journal::RECORDS_PER_PAGE;
pub use layout::{
    Entry, Layout, ObjectKey, SlotState, StoreOptions, ENTRY_BYTES, PAGE_BYTES, STORE_FORMAT,
};
pub use open::FormatCmds;
use space::Space;
use std::collections::{BTreeMap, VecDeque};

/// Changes that may wait for a journal page (64 pages' worth); past it a change
/// is refused with [`StoreError::Busy`] until the journal catches up.
pub const MAX_QUEUED: usize = 64 * RECORDS_PER_PAGE;

/// Table page writes in flight at once.
const TABLE_WRITES_IN_FLIGHT: usize = 8;

/// Slots being zeroed at once, and zeroing commands in flight.
const ZEROING_SLOTS: usize = 2;
const ZEROING_COMMANDS: usize = 8;

/// Why the store refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The device holds no store (no superblock).
    #[error("the device holds no weir store")]
    NotAStore,
    /// The store is of another format.
    #[error("the store is format {found}; this weir reads format {expected}")]
    WrongFormat {
        /// Its format.
        found: u32,
        /// The one this build reads.
        expected: u32,
    },
    /// A part of the store does not check.
    #[error("the store is damaged: {0}")]
    Corrupt(&'static str),
    /// A layout cannot be made.
    #[error("bad store options: {0}")]
    BadOptions(&'static str),
    /// The object already has a slot.
    #[error("the object already has a slot")]
    Exists,
    /// The object has no slot.
    #[error("the object has no slot")]
    NotFound,
    /// No clean slot is free (`zeroing`: free slots still to be zeroed).
    #[error("no free slot ({zeroing} being zeroed)")]
    Full {
        /// Free slots not yet zeroed: space that will come back.
        zeroing: usize,
    },
    /// Too many changes wait for the journal: try again once pages complete.
    #[error("the journal is behind")]
    Busy,
    /// A device command of the store failed: the store takes no more changes
    /// until it is opened again.
    #[error("the store's device failed: {0}")]
    Failed(DevError),
}

/// A change is durable once [`Store::durable`] says so of its ticket: the
/// sequence number of the journal page that carries it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// Where an object's slot is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    /// The slot.
    pub slot: u32,
    /// Its first block on the device.
    pub lba: Lba,
    /// Its size in blocks.
    pub blocks: u64,
}

/// An object found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    /// Its slot.
    pub placed: Placed,
    /// Its entry.
    pub entry: Entry,
    /// Every change to the entry is durable.
    pub durable: bool,
}

/// A device command the store needs done.
#[derive(Debug)]
pub struct StoreOp {
    /// Report its result with this id.
    pub id: u64,
    /// The command.
    pub cmd: DevCommand,
}

/// What recovery found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Journal pages replayed.
    pub pages: u64,
    /// Entry images replayed that were newer than the table's.
    pub applied: u64,
    /// Table entries that did not check and that no journal page replaced
    /// (their slots are zeroed and freed).
    pub corrupt: u64,
    /// Objects found in two slots (the newer kept, the other freed).
    pub duplicates: u64,
}

/// Counts, for status and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Slots in all.
    pub slots: u32,
    /// Slots holding objects.
    pub used: u32,
    /// Free slots ready for use.
    pub clean: u32,
    /// Free slots to be zeroed first (their release durable or not).
    pub dirty: u32,
    /// Journal pages between replay's start and the next page.
    pub journal_pages: u64,
    /// Bytes of memory the store holds.
    pub memory_bytes: usize,
}

/// A journal page in flight: (op, seq, the start it carries, its images).
type PageInFlight = (u64, u64, u64, Vec<(u32, Entry)>);

/// One device's store. See the module docs.
#[derive(Debug)]
pub struct Store {
    layout: Layout,
    /// This opening's random number, in every sector of its journal pages.
    nonce: u64,
    /// Largest zeroing command, in blocks.
    max_zero_blocks: u64,
    entries: Vec<Entry>,
    index: BTreeMap<ObjectKey, u32>,
    space: Space,
    /// The next journal page to build, and the last completed (all below it too).
    next_seq: u64,
    done_seq: u64,
    /// Slots whose entries wait for a page, in order, and the page each goes in.
    queued: VecDeque<u32>,
    queued_at: BTreeMap<u32, u64>,
    /// The page in flight.
    journal_op: Option<PageInFlight>,
    /// The start the last completed page carries: what replay would use now.
    /// A page may overwrite only pages below it.
    disk_start: u64,
    /// Table pages changed since last written: the oldest journal page whose
    /// change they hold (u64::MAX: none that replay needs).
    dirty_pages: BTreeMap<u64, u64>,
    /// Table writes in flight, by op: (page, oldest journal page covered).
    table_ops: BTreeMap<u64, (u64, u64)>,
    /// Table writes completed, waiting for a flush: oldest journal page covered.
    unflushed: Vec<u64>,
    /// The flush in flight: (op, table writes and zeroed slots it covers).
    flush_op: Option<(u64, Vec<u64>, Vec<u32>)>,
    /// A sweep of table writes: every dirty page whose oldest change is at or
    /// below this page is written back, then flushed (asked: all of them; or
    /// started when the journal is half full).
    sweep: Option<u64>,
    /// The durable images of entries changed since, while their change waits
    /// for its journal page: the table is only ever written journaled images.
    shadow: BTreeMap<u32, Entry>,
    /// After a checkpoint's sweep, write a page of no changes that carries
    /// the new start, so that the next open replays only that page.
    carry_start: bool,
    /// Shutting down: no slot starts being zeroed (those left are zeroed
    /// after the next open).
    stopping: bool,
    /// Released slots whose release is not durable yet: (ticket, slot).
    released: VecDeque<(u64, u32)>,
    /// Zeroing commands in flight, by op: their slot; and commands left per slot.
    zero_ops: BTreeMap<u64, u32>,
    zero_left: BTreeMap<u32, (u64, u64)>,
    /// Slots zeroed, waiting for a flush.
    zeroed: Vec<u32>,
    next_op: u64,
    failed: Option<DevError>,
}

impl Store {
    fn empty(layout: Layout, geometry: &Geometry, nonce: u64) -> Store {
        Store {
            layout,
            nonce,
            max_zero_blocks: u64::from(geometry.max_transfer_blocks.max(1)),
            entries: vec![Entry::default(); layout.slots as usize],
            index: BTreeMap::new(),
            space: Space::new(layout.slots),
            next_seq: 1,
            done_seq: 0,
            queued: VecDeque::new(),
            queued_at: BTreeMap::new(),
            journal_op: None,
            disk_start: 0,
            dirty_pages: BTreeMap::new(),
            table_ops: BTreeMap::new(),
            unflushed: Vec::new(),
            flush_op: None,
            sweep: None,
            shadow: BTreeMap::new(),
            carry_start: false,
            stopping: false,
            released: VecDeque::new(),
            zero_ops: BTreeMap::new(),
            zero_left: BTreeMap::new(),
            zeroed: Vec::new(),
            next_op: 1,
            failed: None,
        }
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    fn table_page(&self, slot: u32) -> u64 {
        u64::from(slot) * ENTRY_BYTES / PAGE_BYTES
    }

    fn placed(&self, slot: u32) -> Placed {
        let bs = u64::from(self.layout.block_size);
        Placed {
            slot,
            lba: Lba(self.layout.slot_off(slot) / bs),
            blocks: self.layout.slot_bytes / bs,
        }
    }

    fn live(&self) -> Result<(), StoreError> {
        match self.failed {
            Some(e) => Err(StoreError::Failed(e)),
            None => Ok(()),
        }
    }

    /// Slot `slot`'s entry is about to change: keep its durable image for the
    /// table until the change is journaled.
    fn changing(&mut self, slot: u32) {
        let e = self.entries[slot as usize];
        if e.seq <= self.done_seq {
            self.shadow.insert(slot, e);
        }
    }

    /// Queue slot `slot`'s entry (changed since [`Store::changing`]) for a
    /// journal page: the page's ticket.
    fn enqueue(&mut self, slot: u32) -> Result<u64, StoreError> {
        if !self.queued_at.contains_key(&slot) && self.queued.len() >= MAX_QUEUED {
            return Err(StoreError::Busy);
        }
        Ok(self.enqueue_unbounded(slot))
    }

    /// [`Store::enqueue`] past the bound (recovery's fixes, at most one a slot).
    fn enqueue_unbounded(&mut self, slot: u32) -> u64 {
        if let Some(&t) = self.queued_at.get(&slot) {
            self.entries[slot as usize].seq = t;
            return t;
        }
        let t = self.next_seq + (self.queued.len() / RECORDS_PER_PAGE) as u64;
        self.queued.push_back(slot);
        self.queued_at.insert(slot, t);
        self.entries[slot as usize].seq = t;
        t
    }

    fn can_queue(&self, slot: Option<u32>) -> Result<(), StoreError> {
        self.live()?;
        if slot.is_some_and(|s| self.queued_at.contains_key(&s)) || self.queued.len() < MAX_QUEUED {
            Ok(())
        } else {
            Err(StoreError::Busy)
        }
    }

    /// Give `key` a clean slot, with `fill` parts and `version`. Write data into
    /// it only once the ticket is durable.
    pub fn allocate(
        &mut self,
        key: ObjectKey,
        fill: u64,
        version: u64,
    ) -> Result<(Placed, Ticket), StoreError> {
        self.can_queue(None)?;
        if self.index.contains_key(&key) {
            return Err(StoreError::Exists);
        }
        let slot = self.space.take().ok_or(StoreError::Full {
            zeroing: self.released.len()
                + self.space.dirty_count()
                + self.zero_left.len()
                + self.zeroed.len(),
        })?;
        debug_assert_eq!(self.entries[slot as usize].state, SlotState::Clean);
        self.changing(slot);
        self.entries[slot as usize] = Entry {
            state: SlotState::Used,
            key,
            seq: 0,
            version,
            fill,
        };
        self.index.insert(key, slot);
        let t = self.enqueue(slot).expect("checked it can queue");
        Ok((self.placed(slot), Ticket(t)))
    }

    /// Where `key`'s data is.
    pub fn lookup(&self, key: &ObjectKey) -> Option<Found> {
        let &slot = self.index.get(key)?;
        let entry = self.entries[slot as usize];
        Some(Found {
            placed: self.placed(slot),
            entry,
            durable: entry.seq <= self.done_seq,
        })
    }

    /// Write down `key`'s `version` (never backwards) and more filled parts.
    pub fn update(
        &mut self,
        key: &ObjectKey,
        version: u64,
        fill: u64,
    ) -> Result<Ticket, StoreError> {
        let &slot = self.index.get(key).ok_or(StoreError::NotFound)?;
        self.can_queue(Some(slot))?;
        self.changing(slot);
        let e = &mut self.entries[slot as usize];
        e.version = e.version.max(version);
        e.fill |= fill;
        Ok(Ticket(self.enqueue(slot).expect("checked it can queue")))
    }

    /// Free `key`'s slot. No device command to it may be in flight.
    pub fn release(&mut self, key: &ObjectKey) -> Result<Ticket, StoreError> {
        let &slot = self.index.get(key).ok_or(StoreError::NotFound)?;
        self.can_queue(Some(slot))?;
        self.changing(slot);
        self.index.remove(key);
        self.entries[slot as usize] = Entry {
            state: SlotState::Dirty,
            ..Entry::default()
        };
        let t = self.enqueue(slot).expect("checked it can queue");
        self.released.push_back((t, slot));
        Ok(Ticket(t))
    }

    /// Whether the change that gave `ticket` is durable.
    pub fn durable(&self, ticket: Ticket) -> bool {
        ticket.0 <= self.done_seq
    }

    /// Write every changed table page back and flush, so that replay after a
    /// restart is short.
    pub fn checkpoint(&mut self) {
        self.sweep = Some(u64::MAX);
        self.carry_start = true;
    }

    /// A clean shutdown: a checkpoint, and no more slots start being zeroed
    /// (a large device formatted over old data would otherwise be zeroed
    /// whole first; what is left is zeroed after the next open). Run ops
    /// until idle, then drop the store.
    pub fn shutdown(&mut self) {
        self.checkpoint();
        self.stopping = true;
    }

    /// Nothing is in flight or waiting to be issued (or the store failed: then
    /// nothing more will be).
    pub fn idle(&self) -> bool {
        if self.failed.is_some() {
            return true;
        }
        self.journal_op.is_none()
            && self.queued.is_empty()
            && self.table_ops.is_empty()
            && self.flush_op.is_none()
            && self.zero_ops.is_empty()
            && self.unflushed.is_empty()
            && self.zeroed.is_empty()
            && (self.stopping || self.space.dirty_count() == 0)
            && self.zero_left.is_empty()
            && self.released.is_empty()
            && self.sweep.is_none()
            && !self.carry_start
    }

    /// The oldest journal page replay may still need.
    fn start(&self) -> u64 {
        let pending = self
            .dirty_pages
            .values()
            .chain(self.table_ops.values().map(|(_, s)| s));
        let flushing = self.flush_op.iter().flat_map(|(_, seqs, _)| seqs);
        pending
            .chain(self.unflushed.iter())
            .chain(flushing)
            .copied()
            .fold(self.done_seq + 1, u64::min)
    }

    fn op(&mut self, cmd: DevCommand) -> StoreOp {
        let id = self.next_op;
        self.next_op += 1;
        StoreOp { id, cmd }
    }

    /// The next device command to issue, if any. Issue each at once; report its
    /// result with [`Store::complete`].
    pub fn poll_op(&mut self) -> Option<StoreOp> {
        if self.failed.is_some() {
            return None;
        }
        let start = self.start();
        let ring = self.layout.journal_pages;
        if self.sweep.is_none() && self.next_seq - self.disk_start >= ring / 2 {
            self.sweep = Some(self.done_seq);
        }
        // A journal page may overwrite only pages older than the start the
        // device holds (a page in flight may tear, and replay then goes by the
        // last whole one's start). The last place left goes only to a page that
        // carries a start that has moved on, so that once it completes there is
        // room again; till then the sweep moves the start.
        let room = self.disk_start + ring - self.next_seq;
        let fits = room > 1 || (room == 1 && start > self.disk_start);
        if self.journal_op.is_none() && !self.queued.is_empty() && fits {
            let seq = self.next_seq;
            let n = self.queued.len().min(RECORDS_PER_PAGE);
            let slots: Vec<u32> = self.queued.drain(..n).collect();
            let records: Vec<(u32, Entry)> = slots
                .iter()
                .map(|&s| {
                    self.queued_at.remove(&s);
                    (s, self.entries[s as usize])
                })
                .collect();
            debug_assert!(records.iter().all(|(_, e)| e.seq == seq));
            return Some(self.journal_write(start, records));
        }
        // The sweep's table pages, one write per page at a time, each of
        // journaled images only.
        if let Some(bound) = self.sweep {
            if self.table_ops.len() < TABLE_WRITES_IN_FLIGHT {
                let busy: Vec<u64> = self.table_ops.values().map(|&(p, _)| p).collect();
                let next = self
                    .dirty_pages
                    .iter()
                    .find(|&(p, &min)| min <= bound && !busy.contains(p))
                    .map(|(&p, &min)| (p, min));
                if let Some((page, min)) = next {
                    self.dirty_pages.remove(&page);
                    let op = self.table_write(page);
                    self.table_ops.insert(op.id, (page, min));
                    return Some(op);
                }
            }
        }
        // A flush, once table writes or zeroings wait for one and none is
        // running. It covers every write completed before it.
        let table_waits = !self.unflushed.is_empty() && self.table_ops.is_empty();
        let zero_waits = !self.zeroed.is_empty();
        if self.flush_op.is_none() && (table_waits || zero_waits) {
            let seqs = std::mem::take(&mut self.unflushed);
            let zeroed = std::mem::take(&mut self.zeroed);
            let op = self.op(DevCommand::Flush);
            self.flush_op = Some((op.id, seqs, zeroed));
            return Some(op);
        }
        if let Some(bound) = self.sweep {
            // A checkpoint's sweep (of everything) also waits out the journal,
            // whose changes it must write too.
            let drained = bound < u64::MAX || (self.journal_op.is_none() && self.queued.is_empty());
            let done = drained
                && self.table_ops.is_empty()
                && self.unflushed.is_empty()
                && self.flush_op.is_none()
                && self.dirty_pages.values().all(|&min| min > bound);
            if done {
                self.sweep = None;
            }
        }
        // The checkpoint's start, carried by a page of no changes (no change
        // waits for a page, so no ticket moves).
        if self.carry_start
            && self.sweep.is_none()
            && self.journal_op.is_none()
            && self.queued.is_empty()
        {
            self.carry_start = false;
            let start = self.start();
            if start > self.disk_start && self.disk_start + ring > self.next_seq {
                return Some(self.journal_write(start, Vec::new()));
            }
        }
        // Zero a dirty slot, in commands no larger than the device takes.
        if self.zero_ops.len() < ZEROING_COMMANDS {
            if let Some((&slot, &(next, left))) =
                self.zero_left.iter().find(|(_, &(_, left))| left > 0)
            {
                let placed = self.placed(slot);
                let blocks = (placed.blocks - (next - placed.lba.0)).min(self.max_zero_blocks);
                self.zero_left.insert(slot, (next + blocks, left - 1));
                let op = self.op(DevCommand::WriteZeroes {
                    lba: Lba(next),
                    blocks,
                });
                self.zero_ops.insert(op.id, slot);
                return Some(op);
            }
            if self.zero_left.len() < ZEROING_SLOTS && !self.stopping {
                if let Some(slot) = self.space.next_dirty() {
                    let placed = self.placed(slot);
                    let cmds = placed.blocks.div_ceil(self.max_zero_blocks);
                    self.zero_left.insert(slot, (placed.lba.0, cmds));
                    return self.poll_op();
                }
            }
        }
        None
    }

    /// The next journal page, carrying `start` and `records` (their entries'
    /// seq is the page's), written with FUA; the one page in flight.
    fn journal_write(&mut self, start: u64, records: Vec<(u32, Entry)>) -> StoreOp {
        let seq = self.next_seq;
        // Recovery refuses a journal within 2^32 pages of the end.
        assert!(seq < journal::MAX_SEQ, "journal page numbers exhausted");
        self.next_seq += 1;
        let ring = self.layout.journal_pages;
        let lba = (self.layout.journal_off + (seq % ring) * PAGE_BYTES)
            / u64::from(self.layout.block_size);
        let data = journal::encode_page(self.layout.uuid, self.nonce, seq, start, &records);
        let op = self.op(DevCommand::Write {
            lba: Lba(lba),
            data: Bytes::from(data),
            fua: true,
        });
        self.journal_op = Some((op.id, seq, start, records));
        op
    }

    /// A write of table page `page`, of journaled images only.
    fn table_write(&mut self, page: u64) -> StoreOp {
        let per_page = (PAGE_BYTES / ENTRY_BYTES) as u32;
        let mut data = vec![0u8; PAGE_BYTES as usize];
        let first = page as u32 * per_page;
        for s in first..(first + per_page).min(self.layout.slots) {
            let at = ((s - first) as u64 * ENTRY_BYTES) as usize;
            let e = self.shadow.get(&s).unwrap_or(&self.entries[s as usize]);
            debug_assert!(e.seq <= self.done_seq, "slot {s}: an image not journaled");
            e.encode(s, &mut data[at..at + ENTRY_BYTES as usize]);
        }
        let lba = (self.layout.table_off + page * PAGE_BYTES) / u64::from(self.layout.block_size);
        self.op(DevCommand::Write {
            lba: Lba(lba),
            data: Bytes::from(data),
            fua: false,
        })
    }

    /// Op `id` finished with `result`. A failed command fails the store: what
    /// the device holds is then unknown until the store is opened again.
    pub fn complete(&mut self, id: u64, result: Result<(), DevError>) {
        if let Err(e) = result {
            self.failed.get_or_insert(e);
            return;
        }
        if self
            .journal_op
            .as_ref()
            .is_some_and(|(op, _, _, _)| *op == id)
        {
            let (_, seq, start, records) = self.journal_op.take().expect("checked");
            self.done_seq = seq;
            self.disk_start = start;
            for (s, image) in records {
                // The image is durable now: the table may have it, unless the
                // entry changed again (then it is the shadow until that lands).
                if self.entries[s as usize].seq == seq {
                    self.shadow.remove(&s);
                } else {
                    self.shadow.insert(s, image);
                }
                let p = self.table_page(s);
                let min = self.dirty_pages.entry(p).or_insert(u64::MAX);
                *min = (*min).min(seq);
            }
            while let Some(&(t, slot)) = self.released.front() {
                if t > self.done_seq {
                    break;
                }
                self.released.pop_front();
                // Released again and reallocated meanwhile? Then it is not free.
                if self.entries[slot as usize].state == SlotState::Dirty {
                    self.space.put_dirty(slot);
                }
            }
        } else if let Some((_, min)) = self.table_ops.remove(&id) {
            self.unflushed.push(min);
        } else if self.flush_op.as_ref().is_some_and(|(op, _, _)| *op == id) {
            let (_, _, zeroed) = self.flush_op.take().expect("checked");
            for s in zeroed {
                let e = &mut self.entries[s as usize];
                debug_assert_eq!(e.state, SlotState::Dirty);
                e.state = SlotState::Clean;
                let p = self.table_page(s);
                self.dirty_pages.entry(p).or_insert(u64::MAX);
                self.space.put_clean(s);
            }
        } else if let Some(slot) = self.zero_ops.remove(&id) {
            if self.zero_left[&slot].1 == 0 && !self.zero_ops.values().any(|&s| s == slot) {
                self.zero_left.remove(&slot);
                self.zeroed.push(slot);
            }
        } else {
            debug_assert!(false, "completion of unknown store op {id}");
        }
    }

    /// Counts.
    pub fn usage(&self) -> Usage {
        let index_bytes = self.index.len() * (std::mem::size_of::<(ObjectKey, u32)>() * 3 / 2);
        Usage {
            slots: self.layout.slots,
            used: self.index.len() as u32,
            clean: self.space.clean_count(),
            dirty: self.layout.slots - self.index.len() as u32 - self.space.clean_count(),
            journal_pages: self.next_seq - self.start(),
            memory_bytes: self.entries.capacity() * std::mem::size_of::<Entry>()
                + index_bytes
                + self.space.memory_bytes(),
        }
    }

    /// The store's invariants: the index and the entries agree, and every free
    /// slot is counted once.
    pub fn self_check(&self) {
        let mut used = 0usize;
        let mut clean = 0u32;
        for (s, e) in self.entries.iter().enumerate() {
            match e.state {
                SlotState::Used => {
                    used += 1;
                    assert_eq!(
                        self.index.get(&e.key),
                        Some(&(s as u32)),
                        "slot {s} is not its object's"
                    );
                }
                SlotState::Clean => {
                    clean += 1;
                    assert!(self.space.is_clean(s as u32), "clean slot {s} is not free");
                }
                SlotState::Dirty => {
                    assert!(!self.space.is_clean(s as u32), "dirty slot {s} is free")
                }
            }
        }
        assert_eq!(used, self.index.len(), "an object's slot is not used");
        assert_eq!(clean, self.space.clean_count(), "free count");
        assert!(self.done_seq < self.next_seq);
        assert!(
            self.next_seq <= self.disk_start + self.layout.journal_pages,
            "the ring overran replay's start"
        );
        assert!(self.queued.len() <= MAX_QUEUED.max(self.layout.slots as usize));
        assert_eq!(self.queued.len(), self.queued_at.len());
    }
}
