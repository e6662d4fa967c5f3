//! The journal: a ring of 4 KiB pages, each a batch of entry images written
//! with Force Unit Access, one page in flight at a time.
//!
//! ```text
//! page: | magic 8 | store uuid 16 | seq 8 | start 8 | count 2 | 0 2 | crc32 4 | 0 16 | count x entry (64 B) |
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

use super::layout::{Entry, ENTRY_BYTES, PAGE_BYTES};

const MAGIC: [u8; 8] = *b"WEIRJRNL";
const HEADER_BYTES: usize = 64;
const CRC_AT: usize = 44;

/// Entries in one page.
pub const RECORDS_PER_PAGE: usize = (PAGE_BYTES as usize - HEADER_BYTES) / ENTRY_BYTES as usize;

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

/// Page `seq` of store `uuid`, replay from `start`, holding `records`
/// (at most [`RECORDS_PER_PAGE`]).
pub fn encode_page(uuid: u128, seq: u64, start: u64, records: &[(u32, Entry)]) -> Vec<u8> {
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
    for (i, (slot, entry)) in records.iter().enumerate() {
        let at = HEADER_BYTES + i * ENTRY_BYTES as usize;
        entry.encode(*slot, &mut p[at..at + ENTRY_BYTES as usize]);
    }
    let crc = crc32fast::hash(&p);
    p[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_le_bytes());
    p
}

/// The page `bytes` hold, if it is a whole page of store `uuid` with slots
/// below `slots`.
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
    let count = usize::from(u16::from_le_bytes(p[40..42].try_into().expect("2 bytes")));
    if count > RECORDS_PER_PAGE {
        return None;
    }
    let mut records = Vec::with_capacity(count);
    for i in 0..count {
        let at = HEADER_BYTES + i * ENTRY_BYTES as usize;
        let bytes = &p[at..at + ENTRY_BYTES as usize];
        let slot = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
        if slot >= slots {
            return None;
        }
        records.push((slot, Entry::decode(slot, bytes)?));
    }
    Some(Page {
        seq: u(24),
        start: u(32),
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
/// `uuid`; `None` if pages exist but no run is whole (the journal is damaged).
pub fn find_chain(uuid: u128, slots: u32, ring: &[u8]) -> Option<Chain> {
    let n = (ring.len() as u64 / PAGE_BYTES) as usize;
    let mut pages: Vec<Option<Page>> = (0..n)
        .map(|i| {
            let at = i * PAGE_BYTES as usize;
            decode_page(uuid, slots, &ring[at..at + PAGE_BYTES as usize])
                .filter(|p| p.seq as usize % n == i && p.seq > 0 && p.start <= p.seq)
        })
        .collect();
    let mut by_seq: Vec<(u64, u64)> = pages.iter().flatten().map(|p| (p.seq, p.start)).collect();
    if by_seq.is_empty() {
        return Some(Chain::default());
    }
    by_seq.sort_unstable_by(|a, b| b.cmp(a));
    let holds =
        |pages: &[Option<Page>], s: u64| pages[s as usize % n].as_ref().is_some_and(|p| p.seq == s);
    let (last, start) = by_seq
        .into_iter()
        .find(|&(seq, start)| seq - start < n as u64 && (start..=seq).all(|s| holds(&pages, s)))?;
    let chain = (start..=last)
        .map(|s| pages[s as usize % n].take().expect("checked whole"))
        .collect();
    Some(Chain {
        pages: chain,
        last,
        start,
    })
}
