//! The durable form of a member's Raft log: a sequence of framed records (see
//! [`crate::record`]), each a postcard `Record` of what one round of raft-rs's
//! `Ready` asked to make durable (new entries, a new hard state).
//!
//! The driver appends each record to a file and makes it durable (`fdatasync`)
//! before it sends the messages that follow it; a restarted member replays the
//! records in order. A torn or corrupt tail (a crash in the middle of an append)
//! ends the replay: [`Replayed::valid_len`] says where the intact records end, and
//! the driver cuts the file there. Nothing in a torn record was acted upon: its
//! messages were never sent.

use crate::record::{frame, Frames};
use raft::prelude::{Entry, EntryType, HardState};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct Record {
    /// (term, vote, commit), when it changed.
    hard_state: Option<(u64, u64, u64)>,
    /// (index, term, kind, data), in index order; they replace any entries at or
    /// after the first one's index.
    entries: Vec<(u64, u64, u8, Vec<u8>)>,
}

/// Encode one record of new `entries` and, if it changed, the `hard_state`.
pub fn encode_record(hard_state: Option<&HardState>, entries: &[Entry]) -> Vec<u8> {
    let record = Record {
        hard_state: hard_state.map(|hs| (hs.term, hs.vote, hs.commit)),
        entries: entries
            .iter()
            .map(|e| {
                let kind = match e.get_entry_type() {
                    EntryType::EntryNormal => 0,
                    EntryType::EntryConfChange => 1,
                    EntryType::EntryConfChangeV2 => 2,
                };
                (e.index, e.term, kind, e.data.to_vec())
            })
            .collect(),
    };
    frame(&postcard::to_allocvec(&record).expect("a record always encodes"))
}

/// What a log file holds.
#[derive(Debug, Default)]
pub struct Replayed {
    /// The last hard state recorded (default if none).
    pub hard_state: HardState,
    /// The log's entries, contiguous from index 1.
    pub entries: Vec<Entry>,
    /// Bytes of intact records from the start; anything after is a torn tail.
    pub valid_len: usize,
    /// Intact records read.
    pub records: usize,
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
        if !splice(&mut out.entries, &record.entries) {
            break;
        }
        if let Some((term, vote, commit)) = record.hard_state {
            out.hard_state.term = term;
            out.hard_state.vote = vote;
            out.hard_state.commit = commit;
        }
        out.valid_len = frames.valid_len();
        out.records += 1;
    }
    // A commit index past the entries held cannot be honoured.
    let last = out.entries.last().map_or(0, |e| e.index);
    out.hard_state.commit = out.hard_state.commit.min(last);
    out
}

/// Put `new` into `log` the way raft-rs's storage does: entries at or after the
/// first new index are replaced. False (and `log` unchanged) if that leaves a gap.
fn splice(log: &mut Vec<Entry>, new: &[(u64, u64, u8, Vec<u8>)]) -> bool {
    let Some(&(first, ..)) = new.first() else {
        return true;
    };
    let next = log.last().map_or(1, |e| e.index + 1);
    let contiguous = new.windows(2).all(|w| w[1].0 == w[0].0 + 1);
    if first == 0 || first > next || !contiguous {
        return false;
    }
    log.truncate((first - 1) as usize);
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
}
