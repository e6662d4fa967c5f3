//! Where a store's parts sit on its device, and the encodings of its two
//! fixed-size records: the superblock and a slot's entry.
//!
//! ```text
//! | superblock (4 KiB) | journal (ring of 4 KiB pages) | table (64 B a slot) | pad | slots |
//! ```
//!
//! Every offset is a multiple of [`PAGE_BYTES`], so of both block sizes a device
//! may have (512 and 4096), and the first slot starts on a multiple of the slot
//! size or of 1 MiB, whichever is smaller. An entry is 64 bytes and never straddles
//! a 512-byte sector, so a torn table write leaves every entry wholly old or wholly
//! new (devices tear writes at logical-block boundaries).
//!
//! All integers are little-endian. A superblock or entry of another format is
//! refused with both format numbers named.

use super::StoreError;
use crate::device::Geometry;

/// The on-device format of a store, written in its superblock. A store of
/// another format is refused (no migration yet; rolling upgrades will build on it).
pub const STORE_FORMAT: u32 = 1;

/// The unit of the superblock, the journal and table writes.
pub const PAGE_BYTES: u64 = 4096;

/// One slot's entry, in the table and in a journal record.
pub const ENTRY_BYTES: u64 = 64;

/// The default slot (object) size: 4 MiB.
pub const DEFAULT_SLOT_BYTES: u64 = 4 << 20;

/// Journal size when not given: a thousandth of the device, within these bounds
/// (the largest is also the most a store may have: recovery reads it whole).
const JOURNAL_MIN_BYTES: u64 = 256 << 10;
const JOURNAL_MAX_BYTES: u64 = 64 << 20;

/// The most slots a store may have: 16 Mi, 64 TiB of 4 MiB slots, about
/// 1.6 GiB of the store's memory. A larger device takes larger slots.
pub const MAX_SLOTS: u32 = 1 << 24;

/// The first slot starts on a multiple of this (or of the slot, if smaller).
const DATA_ALIGN_BYTES: u64 = 1 << 20;

const SB_MAGIC: [u8; 8] = *b"WEIRSTOR";
const SB_CRC_AT: usize = 80;

/// How a store is laid out when it is formatted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// Size of a slot: the unit of allocation, one object. A power of two of at
    /// least 4 KiB; default [`DEFAULT_SLOT_BYTES`].
    pub slot_bytes: u64,
    /// Size of the journal (rounded down to whole pages, at least 4 pages); 0: a
    /// thousandth of the device, from 256 KiB to 64 MiB.
    pub journal_bytes: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            slot_bytes: DEFAULT_SLOT_BYTES,
            journal_bytes: 0,
        }
    }
}

/// A store's layout on its device, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Names this store: journal pages of another store (a replaced device that
    /// kept old contents) are never replayed.
    pub uuid: u128,
    /// The device's logical block size.
    pub block_size: u32,
    /// Size of a slot.
    pub slot_bytes: u64,
    /// The journal: its first byte and its pages.
    pub journal_off: u64,
    /// Pages in the journal's ring.
    pub journal_pages: u64,
    /// The table: [`ENTRY_BYTES`] per slot, from here.
    pub table_off: u64,
    /// The first slot.
    pub data_off: u64,
    /// Number of slots.
    pub slots: u32,
}

fn align_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

impl Layout {
    /// The layout of a new store named `uuid` on a device of `geometry`.
    pub fn new(
        uuid: u128,
        geometry: &Geometry,
        options: StoreOptions,
    ) -> Result<Layout, StoreError> {
        let block_size = u64::from(geometry.block_size);
        if !matches!(block_size, 512 | 4096) {
            return Err(StoreError::BadOptions(
                "the device's block size must be 512 or 4096",
            ));
        }
        let slot_bytes = options.slot_bytes;
        if !slot_bytes.is_power_of_two() || slot_bytes < PAGE_BYTES {
            return Err(StoreError::BadOptions(
                "the slot size must be a power of two of at least 4 KiB",
            ));
        }
        let capacity = geometry
            .capacity_blocks
            .checked_mul(block_size)
            .ok_or(StoreError::BadOptions("the device is too large"))?;
        let journal_bytes = match options.journal_bytes {
            0 => (capacity / 1000).clamp(JOURNAL_MIN_BYTES, JOURNAL_MAX_BYTES),
            b => b,
        };
        let journal_pages = journal_bytes / PAGE_BYTES;
        if journal_pages < 4 || journal_bytes > JOURNAL_MAX_BYTES {
            return Err(StoreError::BadOptions(
                "the journal must be from 4 pages to 64 MiB",
            ));
        }
        if u64::from(geometry.max_transfer_blocks) * block_size < PAGE_BYTES {
            return Err(StoreError::BadOptions(
                "the device's largest transfer must be at least 4 KiB",
            ));
        }
        let journal_off = PAGE_BYTES;
        let table_off = journal_off + journal_pages * PAGE_BYTES;
        let align = slot_bytes.min(DATA_ALIGN_BYTES);
        let data_off_for =
            |slots: u64| align_up(table_off + align_up(slots * ENTRY_BYTES, PAGE_BYTES), align);
        let mut slots = capacity.saturating_sub(table_off) / (slot_bytes + ENTRY_BYTES);
        while slots > 0 && data_off_for(slots) + slots * slot_bytes > capacity {
            slots -= 1;
        }
        if slots == 0 {
            return Err(StoreError::BadOptions(
                "the device is too small for one slot",
            ));
        }
        let slots = u32::try_from(slots)
            .ok()
            .filter(|&s| s <= MAX_SLOTS)
            .ok_or(StoreError::BadOptions(
                "more than 2^24 slots: use larger slots",
            ))?;
        Ok(Layout {
            uuid,
            block_size: geometry.block_size,
            slot_bytes,
            journal_off,
            journal_pages,
            table_off,
            data_off: data_off_for(u64::from(slots)),
            slots,
        })
    }

    /// Bytes of the table, whole pages.
    pub fn table_bytes(&self) -> u64 {
        align_up(u64::from(self.slots) * ENTRY_BYTES, PAGE_BYTES)
    }

    /// The first byte of slot `slot`.
    pub fn slot_off(&self, slot: u32) -> u64 {
        self.data_off + u64::from(slot) * self.slot_bytes
    }

    /// The byte just past the store's last slot.
    pub fn end(&self) -> u64 {
        self.slot_off(self.slots)
    }

    /// Usable bytes: the slots.
    pub fn usable_bytes(&self) -> u64 {
        u64::from(self.slots) * self.slot_bytes
    }

    /// The superblock, one page.
    pub fn encode(&self) -> Vec<u8> {
        let mut p = vec![0u8; PAGE_BYTES as usize];
        p[0..8].copy_from_slice(&SB_MAGIC);
        p[8..12].copy_from_slice(&STORE_FORMAT.to_le_bytes());
        p[12..16].copy_from_slice(&self.block_size.to_le_bytes());
        p[16..32].copy_from_slice(&self.uuid.to_le_bytes());
        for (i, v) in [
            self.slot_bytes,
            self.journal_off,
            self.journal_pages,
            self.table_off,
            self.data_off,
            u64::from(self.slots),
        ]
        .into_iter()
        .enumerate()
        {
            p[32 + 8 * i..40 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
        let crc = crc32fast::hash(&p[..SB_CRC_AT]);
        p[SB_CRC_AT..SB_CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
        p
    }

    /// The layout a superblock describes, checked against the device it was read
    /// from.
    pub fn decode(page: &[u8], geometry: &Geometry) -> Result<Layout, StoreError> {
        if page.len() < PAGE_BYTES as usize || page[0..8] != SB_MAGIC {
            return Err(StoreError::NotAStore);
        }
        let format = u32::from_le_bytes(page[8..12].try_into().expect("4 bytes"));
        if format != STORE_FORMAT {
            return Err(StoreError::WrongFormat {
                found: format,
                expected: STORE_FORMAT,
            });
        }
        let crc = u32::from_le_bytes(page[SB_CRC_AT..SB_CRC_AT + 4].try_into().expect("4 bytes"));
        if crc != crc32fast::hash(&page[..SB_CRC_AT]) {
            return Err(StoreError::Corrupt("the superblock's checksum"));
        }
        let u = |i: usize| {
            u64::from_le_bytes(page[32 + 8 * i..40 + 8 * i].try_into().expect("8 bytes"))
        };
        let layout = Layout {
            uuid: u128::from_le_bytes(page[16..32].try_into().expect("16 bytes")),
            block_size: u32::from_le_bytes(page[12..16].try_into().expect("4 bytes")),
            slot_bytes: u(0),
            journal_off: u(1),
            journal_pages: u(2),
            table_off: u(3),
            data_off: u(4),
            slots: u32::try_from(u(5))
                .map_err(|_| StoreError::Corrupt("the superblock's slot count"))?,
        };
        let capacity = geometry
            .capacity_blocks
            .saturating_mul(u64::from(geometry.block_size));
        let table_end = layout
            .journal_pages
            .checked_mul(PAGE_BYTES)
            .and_then(|j| j.checked_add(layout.journal_off))
            .filter(|&t| t == layout.table_off)
            .and_then(|t| t.checked_add(u64::from(layout.slots) * ENTRY_BYTES));
        let end = u64::from(layout.slots)
            .checked_mul(layout.slot_bytes)
            .and_then(|b| b.checked_add(layout.data_off));
        let sane = layout.block_size == geometry.block_size
            && u64::from(geometry.max_transfer_blocks) * u64::from(geometry.block_size)
                >= PAGE_BYTES
            && layout.slot_bytes.is_power_of_two()
            && layout.slot_bytes >= PAGE_BYTES
            && layout.journal_off == PAGE_BYTES
            && layout.journal_pages >= 4
            && layout.journal_pages <= JOURNAL_MAX_BYTES / PAGE_BYTES
            && layout.slots <= MAX_SLOTS
            && table_end.is_some_and(|t| t <= layout.data_off)
            && layout.data_off.is_multiple_of(PAGE_BYTES)
            && layout.slots > 0
            && end.is_some_and(|end| end <= capacity);
        if !sane {
            return Err(StoreError::Corrupt(
                "the superblock does not fit this device",
            ));
        }
        Ok(layout)
    }
}

/// Names one object's data: a volume, the object's index in it, and the
/// generation (a snapshot's redirected copy has its own). The store does not
/// interpret it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// The volume.
    pub volume: u64,
    /// The object's index in the volume.
    pub object: u64,
    /// The object's generation.
    pub generation: u32,
}

/// What a slot holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SlotState {
    /// Free and known to read as zeroes: ready to allocate.
    #[default]
    Clean,
    /// An object's data.
    Used,
    /// Free, but its contents are not known to be zeroes: zeroed before reuse.
    Dirty,
}

/// One slot's entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// What the slot holds.
    pub state: SlotState,
    /// The object, when used.
    pub key: ObjectKey,
    /// The journal page that last changed this entry: replay never takes an
    /// entry back to an older page's.
    pub seq: u64,
    /// The object's version as its owner last wrote it down (a lower bound).
    pub version: u64,
    /// Which of the object's 64 parts this slot holds data for (its owner's
    /// meaning: a redirected object's parts still in an older generation are
    /// clear).
    pub fill: u64,
}

impl Entry {
    /// The 64-byte form, naming `slot`. A clean entry never changed (seq 0) is
    /// all zero bytes, as a table reads when it was just zeroed; every other
    /// entry carries its slot and a checksum.
    pub fn encode(&self, slot: u32, out: &mut [u8]) {
        out[..ENTRY_BYTES as usize].fill(0);
        if *self == Entry::default() {
            return;
        }
        out[0..4].copy_from_slice(&slot.to_le_bytes());
        out[4] = match self.state {
            SlotState::Clean => 1,
            SlotState::Used => 2,
            SlotState::Dirty => 3,
        };
        out[8..16].copy_from_slice(&self.key.volume.to_le_bytes());
        out[16..24].copy_from_slice(&self.key.object.to_le_bytes());
        out[24..28].copy_from_slice(&self.key.generation.to_le_bytes());
        out[32..40].copy_from_slice(&self.seq.to_le_bytes());
        out[40..48].copy_from_slice(&self.version.to_le_bytes());
        out[48..56].copy_from_slice(&self.fill.to_le_bytes());
        let crc = crc32fast::hash(&out[..60]);
        out[60..64].copy_from_slice(&crc.to_le_bytes());
    }

    /// The entry `bytes` encode for `slot`; `None` if it is not one (a checksum,
    /// slot number or state that does not hold).
    pub fn decode(slot: u32, bytes: &[u8]) -> Option<Entry> {
        let bytes = &bytes[..ENTRY_BYTES as usize];
        if bytes.iter().all(|&b| b == 0) {
            return Some(Entry::default());
        }
        let crc = u32::from_le_bytes(bytes[60..64].try_into().expect("4 bytes"));
        if crc != crc32fast::hash(&bytes[..60])
            || u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")) != slot
        {
            return None;
        }
        let u = |a: usize| u64::from_le_bytes(bytes[a..a + 8].try_into().expect("8 bytes"));
        let state = match bytes[4] {
            1 => SlotState::Clean,
            2 => SlotState::Used,
            3 => SlotState::Dirty,
            _ => return None,
        };
        Some(Entry {
            state,
            key: ObjectKey {
                volume: u(8),
                object: u(16),
                generation: u32::from_le_bytes(bytes[24..28].try_into().expect("4 bytes")),
            },
            seq: u(32),
            version: u(40),
            fill: u(48),
        })
    }
}
