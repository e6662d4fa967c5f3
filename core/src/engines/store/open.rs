//! Making a store and opening one: format (the commands that lay it out, made
//! as they are taken) and recovery (the table read, the journal replayed, what
//! damage left freed by journaled releases).

use super::layout::{Entry, Layout, SlotState, StoreOptions, ENTRY_BYTES, PAGE_BYTES};
use super::{journal, Recovery, Store, StoreError};
use crate::device::{DevCommand, Geometry};
use crate::ids::Lba;
use bytes::Bytes;

/// The commands that format a store, made as they are taken (see
/// [`Store::format`]).
#[derive(Debug)]
pub struct FormatCmds {
    layout: Layout,
    fresh: bool,
    /// Largest command, in blocks.
    chunk_blocks: u64,
    /// The next byte to zero or write, up to the end of the table.
    at: u64,
    /// 0: zeroing and table, 1: the flush issued, 2: the superblock issued.
    done: u8,
}

impl Iterator for FormatCmds {
    type Item = DevCommand;

    fn next(&mut self) -> Option<DevCommand> {
        let l = &self.layout;
        let bs = u64::from(l.block_size);
        let table_end = l.table_off + l.table_bytes();
        if self.at == 0 {
            // First, durably, the old superblock goes: a format cut short
            // leaves no store, never the old one over a new journal and table.
            self.at = PAGE_BYTES;
            return Some(DevCommand::Write {
                lba: Lba(0),
                data: Bytes::from(vec![0u8; PAGE_BYTES as usize]),
                fua: true,
            });
        }
        if self.at < table_end {
            let in_table = self.at >= l.table_off;
            // Zeroes up to the table (the journal);
            // the table zeroed (all clean) or written whole pages of dirty entries.
            let end = if in_table { table_end } else { l.table_off };
            let most = (self.chunk_blocks * bs / PAGE_BYTES).max(1) * PAGE_BYTES;
            let len = (end - self.at).min(most);
            let lba = Lba(self.at / bs);
            let cmd = if !in_table || self.fresh {
                DevCommand::WriteZeroes {
                    lba,
                    blocks: len / bs,
                }
            } else {
                let mut data = vec![0u8; len as usize];
                let first = ((self.at - l.table_off) / ENTRY_BYTES) as u32;
                let dirty = Entry {
                    state: SlotState::Dirty,
                    ..Entry::default()
                };
                for (i, e) in data.chunks_mut(ENTRY_BYTES as usize).enumerate() {
                    let slot = first + i as u32;
                    if slot < l.slots {
                        dirty.encode(slot, e);
                    }
                }
                DevCommand::Write {
                    lba,
                    data: Bytes::from(data),
                    fua: false,
                }
            };
            self.at += len;
            return Some(cmd);
        }
        self.done += 1;
        match self.done {
            1 => Some(DevCommand::Flush),
            2 => Some(DevCommand::Write {
                lba: Lba(0),
                data: Bytes::from(l.encode()),
                fua: true,
            }),
            _ => None,
        }
    }
}

impl Store {
    /// A new, empty store named `uuid` on a device of `geometry`, and the
    /// commands that make it, to run in order (each after the last completes):
    /// zero the superblock's page with FUA, zero the journal, write the table
    /// (all clean if `fresh`: the device already reads as zeroes; else all
    /// dirty, and the store zeroes the slots in the background before it hands
    /// them out), flush, then write the superblock. A device whose format did
    /// not finish holds no superblock, so no store (never the old one).
    /// `nonce`, here and in [`Store::recover`]: a random number new at each
    /// opening, which every sector of its journal pages carries. The commands are made as they are
    /// taken, so a large device costs no memory for them.
    pub fn format(
        uuid: u128,
        geometry: &Geometry,
        options: StoreOptions,
        fresh: bool,
        nonce: u64,
    ) -> Result<(Store, FormatCmds), StoreError> {
        let layout = Layout::new(uuid, geometry, options)?;
        let mut store = Store::empty(layout, geometry, nonce);
        for s in 0..layout.slots {
            if fresh {
                store.space.put_clean(s);
            } else {
                store.entries[s as usize].state = SlotState::Dirty;
                store.space.put_dirty(s);
            }
        }
        store.self_check();
        let cmds = FormatCmds {
            layout,
            fresh,
            chunk_blocks: store.max_zero_blocks,
            at: 0,
            done: 0,
        };
        Ok((store, cmds))
    }

    /// The store on a device of `geometry`, from its superblock page, its table
    /// (`layout.table_bytes()` from `table_off`) and its journal (the whole
    /// ring). Read the superblock first ([`Layout::decode`]) to know where the
    /// others are.
    pub fn recover(
        geometry: &Geometry,
        superblock: &[u8],
        table: &[u8],
        ring: &[u8],
        nonce: u64,
    ) -> Result<(Store, Recovery), StoreError> {
        let layout = Layout::decode(superblock, geometry)?;
        if (table.len() as u64) < u64::from(layout.slots) * ENTRY_BYTES
            || ring.len() as u64 != layout.journal_pages * PAGE_BYTES
        {
            return Err(StoreError::Corrupt("the table or journal read is short"));
        }
        let mut store = Store::empty(layout, geometry, nonce);
        let mut found = Recovery::default();
        let chain = journal::find_chain(layout.uuid, layout.slots, ring)
            .ok_or(StoreError::Corrupt("no whole run of journal pages"))?;
        if chain.last >= journal::MAX_SEQ - (1 << 32) {
            return Err(StoreError::Corrupt("journal page numbers near their end"));
        }
        // Entries that do not check: dirty until replay says otherwise.
        let mut damaged = Vec::new();
        for s in 0..layout.slots {
            let at = s as usize * ENTRY_BYTES as usize;
            store.entries[s as usize] = match Entry::decode(s, &table[at..]) {
                // The table holds journaled images only, so none past the
                // journal's last page: one that is means the journal lost
                // pages, and freeing what it holds would lose data for good.
                Some(e) if e.seq > chain.last => {
                    return Err(StoreError::Corrupt("the table is ahead of the journal"));
                }
                Some(e) => e,
                None => {
                    damaged.push(s);
                    Entry {
                        state: SlotState::Dirty,
                        ..Entry::default()
                    }
                }
            };
        }
        for page in &chain.pages {
            found.pages += 1;
            for &(slot, image) in &page.records {
                let e = &mut store.entries[slot as usize];
                if image.seq > e.seq {
                    *e = image;
                    found.applied += 1;
                }
                // Replayed changes are not in the table yet: replay needs them
                // until a write of their page is durable.
                let p = store.table_page(slot);
                let min = store.dirty_pages.entry(p).or_insert(u64::MAX);
                *min = (*min).min(page.seq);
            }
        }
        store.next_seq = chain.last + 1;
        store.disk_start = chain.start;
        store.done_seq = chain.last;
        // Slots recovery frees: damaged entries no page replaced, and an
        // object's second slot. Their release is journaled like any other, so a
        // restart does not find them again, then they are zeroed.
        let damaged: Vec<u32> = damaged
            .into_iter()
            .filter(|&s| store.entries[s as usize].seq == 0)
            .collect();
        found.corrupt = damaged.len() as u64;
        let mut fixes = damaged.clone();
        for s in 0..layout.slots {
            let e = store.entries[s as usize];
            match e.state {
                SlotState::Clean => store.space.put_clean(s),
                SlotState::Dirty if e.seq == 0 && damaged.binary_search(&s).is_ok() => {}
                SlotState::Dirty => store.space.put_dirty(s),
                SlotState::Used => {
                    if let Some(other) = store.index.insert(e.key, s) {
                        // Only damage makes these (the journal's start stays at
                        // a release until its table page is durable): keep the
                        // newer, so that every restart would keep the same one.
                        let (keep, drop) =
                            if (store.entries[other as usize].seq, other) > (e.seq, s) {
                                (other, s)
                            } else {
                                (s, other)
                            };
                        store.index.insert(e.key, keep);
                        found.duplicates += 1;
                        fixes.push(drop);
                        store.changing(drop);
                        store.entries[drop as usize] = Entry {
                            state: SlotState::Dirty,
                            seq: store.entries[drop as usize].seq,
                            ..Entry::default()
                        };
                    }
                }
            }
        }
        // Past the queue's bound if need be: here it is bounded by the slots.
        for s in fixes {
            store.changing(s);
            let t = store.enqueue_unbounded(s);
            store.released.push_back((t, s));
        }
        store.self_check();
        Ok((store, found))
    }
}
