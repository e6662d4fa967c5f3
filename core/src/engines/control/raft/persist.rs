//! The durable form of a member's Raft log: a sequence of framed records (see
//! [`crate::record`]), each a postcard [`Record`]: what one round of raft-rs's
//! `Ready` asked to make durable (new entries, a new hard state), or a snapshot
//! of the map that replaces every entry up to its index.
//!
//! The driver appends each round's record to a file and makes it durable
//! (`fdatasync`) before it sends the messages that follow it; a restarted member
//! replays the records in order. A torn or corrupt tail (a crash in the middle of
//! an append) ends the replay: [`Replayed::valid_len`] says where the intact
//! records end, and the driver cuts the file there. Nothing in a torn record was
//! acted upon: its messages were never sent.
//!
//! When the member takes or installs a snapshot the whole file is replaced, in one
//! atomic step (write aside, sync, rename), by an [`encode_image`]: the snapshot's
//! record, then one round holding the hard state and the entries after it. A crash
//! during the replacement leaves the old file or the new one, whole; either
//! replays to a map the member had.

use crate::record::{frame, Frames};
use raft::prelude::{Entry, EntryType, HardState, Snapshot};
use serde::{Deserialize, Serialize};

/// One entry: (index, term, kind, data).
type RawEntry = (u64, u64, u8, Vec<u8>);

/// One record. The first two variants encode exactly as the records of earlier
/// versions of this file did (a struct of an optional hard state and entries:
/// postcard writes `None` and variant 0 alike, `Some` and variant 1 alike), so a
/// log written before snapshots existed still replays.
#[derive(Serialize, Deserialize)]
enum Record {
    /// New entries, no new hard state. They replace any entries at or after the
    /// first one's index.
    Entries(Vec<RawEntry>),
    /// A new hard state (term, vote, commit) and new entries.
    Round((u64, u64, u64), Vec<RawEntry>),
    /// A snapshot of the map at (index, term): every entry up to it is in `data`.
    Snapshot {
        /// Index of the last entry the snapshot holds.
        index: u64,
        /// Its term.
        term: u64,
        /// The encoded map.
        data: Vec<u8>,
    },
}

fn raw(entries: &[Entry]) -> Vec<RawEntry> {
    entries
        .iter()
        .map(|e| {
            let kind = match e.get_entry_type() {
                EntryType::EntryNormal => 0,
                EntryType::EntryConfChange => 1,
                EntryType::EntryConfChangeV2 => 2,
            };
            (e.index, e.term, kind, e.data.to_vec())
        })
        .collect()
}

/// Encode one record of new `entries` and, if it changed, the `hard_state`.
pub fn encode_record(hard_state: Option<&HardState>, entries: &[Entry]) -> Vec<u8> {
    let record = match hard_state {
        Some(hs) => Record::Round((hs.term, hs.vote, hs.commit), raw(entries)),
        None => Record::Entries(raw(entries)),
    };
    frame(&postcard::to_allocvec(&record).expect("a record always encodes"))
}

/// The whole file of a member whose latest snapshot is `snapshot`, with hard
/// state `hard_state` and log `entries` (those at or below the snapshot's index
/// are left out: the snapshot holds them).
pub fn encode_image(snapshot: &Snapshot, hard_state: &HardState, entries: &[Entry]) -> Vec<u8> {
    let meta = snapshot.get_metadata();
    let record = Record::Snapshot {
        index: meta.index,
        term: meta.term,
        data: snapshot.data.to_vec(),
    };
    let mut out = frame(&postcard::to_allocvec(&record).expect("a record always encodes"));
    let after: Vec<Entry> = entries
        .iter()
        .filter(|e| e.index > meta.index)
        .cloned()
        .collect();
    out.extend(encode_record(Some(hard_state), &after));
    out
}

/// What a log file holds.
#[derive(Debug, Default)]
pub struct Replayed {
    /// The last hard state recorded (default if none).
    pub hard_state: HardState,
    /// The latest snapshot: (index, term, encoded map).
    pub snapshot: Option<(u64, u64, Vec<u8>)>,
    /// The log's entries after the snapshot (from index 1 if there is none),
    /// contiguous.
    pub entries: Vec<Entry>,
    /// Bytes of intact records from the start; anything after is a torn tail.
    pub valid_len: usize,
    /// Intact records read.
    pub records: usize,
}

impl Replayed {
    /// Index of the entry before the first one held: the snapshot's, or 0.
    fn base(&self) -> u64 {
        self.snapshot.as_ref().map_or(0, |s| s.0)
    }
}

/// Replay a log file's bytes. Stops at the first torn or corrupt record, or one
/// whose entries would leave a gap in the log.
pub fn replay(bytes: &[u8]) -> Replayed {
    let mut out = Replayed::default();
    let mut frames = Frames::new(bytes);
    while let Some(payload) = frames.next() {
        let Ok(record) = postcard::from_bytes::<Record>(payload) else {
            break;
        };
        let (hard_state, entries) = match record {
            Record::Entries(entries) => (None, entries),
            Record::Round(hs, entries) => (Some(hs), entries),
            Record::Snapshot { index, term, data } => {
                if index < out.base() || index == 0 {
                    break;
                }
                out.entries.retain(|e| e.index > index);
                out.snapshot = Some((index, term, data));
                (None, Vec::new())
            }
        };
        let base = out.base();
        if !splice(&mut out.entries, base, &entries) {
            break;
        }
        if let Some((term, vote, commit)) = hard_state {
            out.hard_state.term = term;
            out.hard_state.vote = vote;
            out.hard_state.commit = commit;
        }
        out.valid_len = frames.valid_len();
        out.records += 1;
    }
    // A commit index past the entries held cannot be honoured; one before the
    // snapshot is raised to it (the snapshot holds only committed entries).
    let last = out.entries.last().map_or(out.base(), |e| e.index);
    out.hard_state.commit = out.hard_state.commit.clamp(out.base(), last);
    out
}

/// Put `new` into `log` (whose entries follow index `base`) the way raft-rs's
/// storage does: entries at or after the first new index are replaced; any at or
/// below `base` are in the snapshot already. False (and `log` unchanged) if that
/// leaves a gap.
fn splice(log: &mut Vec<Entry>, base: u64, new: &[RawEntry]) -> bool {
    let new: Vec<&RawEntry> = new.iter().filter(|e| e.0 > base).collect();
    let Some(&&(first, ..)) = new.first() else {
        return true;
    };
    let next = log.last().map_or(base + 1, |e| e.index + 1);
    let contiguous = new.windows(2).all(|w| w[1].0 == w[0].0 + 1);
    if first > next || !contiguous {
        return false;
    }
    log.truncate((first - base - 1) as usize);
    for (index, term, kind, data) in new {
        let mut e = Entry {
            index: *index,
            term: *term,
            data: data.clone().into(),
            ..Default::default()
        };
        e.set_entry_type(match kind {
            1 => EntryType::EntryConfChange,
            2 => EntryType::EntryConfChangeV2,
            _ => EntryType::EntryNormal,
        });
        log.push(e);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
        Entry {
            index,
            term,
            data: data.to_vec().into(),
            ..Default::default()
        }
    }

    fn hs(term: u64, vote: u64, commit: u64) -> HardState {
        HardState {
            term,
            vote,
            commit,
            ..Default::default()
        }
    }

    #[test]
    fn records_replay_with_replacement_and_a_torn_tail_is_cut() {
        let mut file = Vec::new();
        file.extend(encode_record(
            Some(&hs(1, 1, 0)),
            &[entry(1, 1, b"a"), entry(2, 1, b"b"), entry(3, 1, b"c")],
        ));
        // A new leader overwrites entry 3 and appends 4.
        file.extend(encode_record(
            Some(&hs(2, 2, 3)),
            &[entry(3, 2, b"C"), entry(4, 2, b"D")],
        ));
        let intact = file.len();
        let torn = encode_record(None, &[entry(5, 2, b"E")]);
        file.extend_from_slice(&torn[..torn.len() - 1]);
        let r = replay(&file);
        assert_eq!(r.records, 2);
        assert_eq!(r.valid_len, intact);
        let got: Vec<(u64, u64, Vec<u8>)> = r
            .entries
            .iter()
            .map(|e| (e.index, e.term, e.data.to_vec()))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, 1, b"a".to_vec()),
                (2, 1, b"b".to_vec()),
                (3, 2, b"C".to_vec()),
                (4, 2, b"D".to_vec())
            ]
        );
        assert_eq!((r.hard_state.term, r.hard_state.vote), (2, 2));
        assert_eq!(r.hard_state.commit, 3);
    }

    #[test]
    fn corruption_and_gaps_end_the_replay_without_panicking() {
        let first = encode_record(Some(&hs(1, 1, 1)), &[entry(1, 1, b"a")]);
        let mut flipped = first.clone();
        flipped.extend(encode_record(None, &[entry(2, 1, b"b")]));
        let last = flipped.len() - 1;
        flipped[last] ^= 0xff;
        assert_eq!(replay(&flipped).valid_len, first.len(), "bad checksum");

        let mut gap = first.clone();
        gap.extend(encode_record(None, &[entry(5, 1, b"e")]));
        let r = replay(&gap);
        assert_eq!((r.records, r.entries.len()), (1, 1), "gap");

        let mut huge = first.clone();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        huge.extend_from_slice(&[0; 12]);
        assert_eq!(replay(&huge).valid_len, first.len(), "hostile length");

        // A commit index past the log is capped.
        let r = replay(&encode_record(Some(&hs(1, 1, 9)), &[entry(1, 1, b"a")]));
        assert_eq!(r.hard_state.commit, 1);
        assert_eq!(replay(&[]).records, 0);
        assert_eq!(replay(&[1, 2, 3]).valid_len, 0);
    }

    #[test]
    fn a_log_written_before_snapshots_existed_replays() {
        // The record layout of earlier versions: a struct, not an enum.
        #[derive(Serialize)]
        struct Old {
            hard_state: Option<(u64, u64, u64)>,
            entries: Vec<RawEntry>,
        }
        let old = |hard_state, entries| {
            frame(
                &postcard::to_allocvec(&Old {
                    hard_state,
                    entries,
                })
                .unwrap(),
            )
        };
        let mut file = old(Some((1, 1, 0)), vec![(1, 1, 0, b"a".to_vec())]);
        file.extend(old(None, vec![(2, 1, 0, b"b".to_vec())]));
        file.extend(old(Some((1, 1, 2)), vec![]));
        let r = replay(&file);
        assert_eq!((r.records, r.valid_len), (3, file.len()));
        assert_eq!(r.entries.len(), 2);
        assert_eq!(r.hard_state.commit, 2);
        assert!(r.snapshot.is_none());
    }

    #[test]
    fn an_image_replays_to_its_snapshot_and_the_entries_after_it() {
        let mut snap = Snapshot::default();
        snap.mut_metadata().index = 5;
        snap.mut_metadata().term = 2;
        snap.data = b"map".to_vec().into();
        let log: Vec<Entry> = (3..=7).map(|i| entry(i, 2, b"x")).collect();
        let mut file = encode_image(&snap, &hs(2, 1, 6), &log);
        // Rounds appended after the image.
        file.extend(encode_record(Some(&hs(2, 1, 8)), &[entry(8, 2, b"y")]));
        let r = replay(&file);
        assert_eq!(r.records, 3);
        assert_eq!(r.snapshot, Some((5, 2, b"map".to_vec())));
        let indexes: Vec<u64> = r.entries.iter().map(|e| e.index).collect();
        assert_eq!(indexes, [6, 7, 8], "only entries after the snapshot");
        assert_eq!(r.hard_state.commit, 8);
        // An image with no entries after its snapshot, and a commit index from
        // before the snapshot (raised to it).
        let r = replay(&encode_image(&snap, &hs(2, 1, 1), &[]));
        assert!(r.entries.is_empty());
        assert_eq!(r.hard_state.commit, 5);
        // Entries after an image must follow the snapshot with no gap.
        let mut gap = encode_image(&snap, &hs(2, 1, 5), &[]);
        let intact = gap.len();
        gap.extend(encode_record(None, &[entry(7, 2, b"z")]));
        assert_eq!(replay(&gap).valid_len, intact);
    }
}
