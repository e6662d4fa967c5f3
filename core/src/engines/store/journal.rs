//! The journal: a ring of 4 KiB pages, each a batch of entry images written
//! with Force Unit Access, one page in flight at a time.
//!
//! ```text
//! sector 0:    | magic 8 | uuid 16 | seq 8 | start 8 | count 2 | 0 2 | crc32 4 | nonce 8 | 0 8 | 7 entries |
//! sector 1..7: | seq 8 | nonce 8 | 0 48 | 7 entries |          (512-byte sectors; 64-byte entries)
//! ```
//!
//! Page `seq` sits at index `seq % pages`. `start` is the oldest page whose
//! entries may not yet be in a durable table write: replay begins there. Since
//! each page is durable when it completes (FUA) and the next is issued only then,
//! the pages from any completed page's `start` to itself are all on the device.
//! Replay therefore takes the highest page whose run `[start, seq]` is whole
//! (every page there decodes, with its own seq at its own index): the last
//! completed page, or one after it that landed before the power went. A page
//! that tore is not whole and ends the run.
//!
//! A page number is written again after a restart (the next page after the
//! run), so a torn page must never be completed by a later write: every
//! 512-byte sector carries the page's number and the writing store's `nonce`,
//! a random number drawn at each open. Sectors of two writes never decode as
//! one page, even where their other bytes agree (the crash test found such a
//! page: a header from before a restart, and zeroed sectors from after it).

use super::layout::{Entry, ENTRY_BYTES, PAGE_BYTES};

const MAGIC: [u8; 8] = *b"WEIRJRNL";
const HEADER_BYTES: usize = 64;
const CRC_AT: usize = 44;
const NONCE_AT: usize = 48;

/// Sectors of a page (the smallest a device may tear at).
const SECTOR_BYTES: usize = 512;
const SECTORS: usize = PAGE_BYTES as usize / SECTOR_BYTES;
const PER_SECTOR: usize = (SECTOR_BYTES - HEADER_BYTES) / ENTRY_BYTES as usize;

/// Page numbers stay below this (2^62: a page a nanosecond for 146 years), so
/// that a damaged page cannot make the store's arithmetic overflow.
pub const MAX_SEQ: u64 = 1 << 62;

/// Entries in one page.
pub const RECORDS_PER_PAGE: usize = SECTORS * PER_SECTOR;

/// Where record `i` sits in a page.
fn record_at(i: usize) -> usize {
    (i / PER_SECTOR) * SECTOR_BYTES + HEADER_BYTES + (i % PER_SECTOR) * ENTRY_BYTES as usize
}

/// One decoded page.
#[derive(Debug, PartialEq, Eq)]
pub struct Page {
    /// Its sequence number.
    pub seq: u64,
    /// Where replay starts, as of when it was written.
    pub start: u64,
    /// (slot, entry) images, in the order they were taken.
    pub records: Vec<(u32, Entry)>,
}

/// Page `seq` of store `uuid` written by the store opened with `nonce`, replay
/// from `start`, holding `records` (at most [`RECORDS_PER_PAGE`]).
pub fn encode_page(
    uuid: u128,
    nonce: u64,
    seq: u64,
    start: u64,
    records: &[(u32, Entry)],
) -> Vec<u8> {
    assert!(
        records.len() <= RECORDS_PER_PAGE,
        "a page holds {RECORDS_PER_PAGE} records"
    );
    let mut p = vec![0u8; PAGE_BYTES as usize];
    p[0..8].copy_from_slice(&MAGIC);
    p[8..24].copy_from_slice(&uuid.to_le_bytes());
    p[24..32].copy_from_slice(&seq.to_le_bytes());
    p[32..40].copy_from_slice(&start.to_le_bytes());
    p[40..42].copy_from_slice(&(records.len() as u16).to_le_bytes());
    p[NONCE_AT..NONCE_AT + 8].copy_from_slice(&nonce.to_le_bytes());
    for sector in 1..SECTORS {
        let at = sector * SECTOR_BYTES;
        p[at..at + 8].copy_from_slice(&seq.to_le_bytes());
        p[at + 8..at + 16].copy_from_slice(&nonce.to_le_bytes());
    }
    for (i, (slot, entry)) in records.iter().enumerate() {
        let at = record_at(i);
        entry.encode(*slot, &mut p[at..at + ENTRY_BYTES as usize]);
    }
    let crc = crc32fast::hash(&p);
    p[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    p
}

/// The page `bytes` hold, if it is a whole page of store `uuid` (every
/// sector of one write) with slots below `slots`.
pub fn decode_page(uuid: u128, slots: u32, bytes: &[u8]) -> Option<Page> {
    if bytes.len() < PAGE_BYTES as usize || bytes[0..8] != MAGIC {
        return None;
    }
    let mut p = bytes[..PAGE_BYTES as usize].to_vec();
    let crc = u32::from_le_bytes(p[CRC_AT..CRC_AT + 4].try_into().expect("4 bytes"));
    p[CRC_AT..CRC_AT + 4].fill(0);
    if crc != crc32fast::hash(&p)
        || u128::from_le_bytes(p[8..24].try_into().expect("16 bytes")) != uuid
    {
        return None;
    }
    let u = |a: usize| u64::from_le_bytes(p[a..a + 8].try_into().expect("8 bytes"));
    let (seq, start, nonce) = (u(24), u(32), u(NONCE_AT));
    if seq == 0 || seq >= MAX_SEQ || start > seq {
        return None;
    }
    if (1..SECTORS).any(|s| u(s * SECTOR_BYTES) != seq || u(s * SECTOR_BYTES + 8) != nonce) {
        return None;
    }
    let count = usize::from(u16::from_le_bytes(p[40..42].try_into().expect("2 bytes")));
    if count > RECORDS_PER_PAGE {
        return None;
    }
    let mut records = Vec::with_capacity(count);
    for i in 0..count {
        let at = record_at(i);
        let bytes = &p[at..at + ENTRY_BYTES as usize];
        let slot = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
        if slot >= slots {
            return None;
        }
        // Every image a page carries was changed by that page.
        let entry = Entry::decode(slot, bytes).filter(|e| e.seq == seq)?;
        records.push((slot, entry));
    }
    Some(Page {
        seq,
        start,
        records,
    })
}

/// What replay found in the ring.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// The pages to replay, oldest first.
    pub pages: Vec<Page>,
    /// The last page of the run (0: the journal is empty).
    pub last: u64,
    /// Where replay started.
    pub start: u64,
}

/// The run to replay from a ring of `ring.len() / PAGE_BYTES` pages of store
/// `uuid`; `None` if pages exist but no run is whole, or a whole page lies
/// past the run (the journal is damaged).
/// A run is at most `pages - 2` long after its first page, as the store writes
/// them (one place is kept for a page that carries a newer start). One pass
/// over the pages in order: O(n log n).
pub fn find_chain(uuid: u128, slots: u32, ring: &[u8]) -> Option<Chain> {
    let n = (ring.len() as u64 / PAGE_BYTES) as usize;
    let mut pages: Vec<Option<Page>> = (0..n)
        .map(|i| {
            let at = i * PAGE_BYTES as usize;
            decode_page(uuid, slots, &ring[at..at + PAGE_BYTES as usize])
                .filter(|p| p.seq % n as u64 == i as u64)
        })
        .collect();
    let mut by_seq: Vec<(u64, u64)> = pages.iter().flatten().map(|p| (p.seq, p.start)).collect();
    if by_seq.is_empty() {
        return Some(Chain::default());
    }
    by_seq.sort_unstable();
    // The highest page whose pages from its start on are all present.
    let mut best = None;
    let mut run_from = 0;
    let mut prev = None;
    for &(seq, start) in &by_seq {
        if prev != Some(seq - 1) {
            run_from = seq;
        }
        prev = Some(seq);
        if start >= run_from && seq - start <= (n as u64).saturating_sub(2) {
            best = Some((seq, start));
        }
    }
    let (last, start) = best?;
    // A whole page above the run is one the store never left there: the
    // journal is damaged (a page torn before a restart cannot decode, its
    // sectors carrying another opening's nonce).
    if by_seq.last().is_some_and(|&(seq, _)| seq > last) {
        return None;
    }
    let chain = (start..=last)
        .map(|s| {
            pages[(s % n as u64) as usize]
                .take()
                .expect("present: in the run")
        })
        .collect();
    Some(Chain {
        pages: chain,
        last,
        start,
    })
}
