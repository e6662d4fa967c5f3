//! The in-memory Raft storage of one member: a compacted log behind the latest
//! snapshot of the map.
//!
//! raft-rs's own `MemStorage` builds its snapshots with no data (the application
//! state is not its to hold) and compacts without recording the term of the last
//! compacted entry, which the leader needs to send the entries after it. This one
//! holds the snapshot weir took or installed (its data is the encoded
//! `ClusterState`) and the (index, term) of the entry before the first one it
//! keeps, so a log compacted to any index at or below the snapshot's still answers
//! every question raft-rs asks of it.
//!
//! Invariants (checked by [`MapStorage::self_check`]): entries are contiguous from
//! `base.0 + 1` with terms that never decrease; the snapshot's index is at or past
//! `base.0` (nothing compacted is missing from it) and at most the commit index.

use raft::prelude::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

/// One member's Raft log, hard state and latest snapshot.
#[derive(Debug)]
pub struct MapStorage {
    hard_state: HardState,
    conf_state: ConfState,
    /// The latest snapshot (index 0 and no data until the first is taken).
    snapshot: Snapshot,
    /// (index, term) of the entry just before `entries[0]`.
    base: (u64, u64),
    entries: Vec<Entry>,
}

impl MapStorage {
    /// An empty log of a group with configuration `conf_state`.
    pub fn new(conf_state: ConfState) -> Self {
        MapStorage {
            hard_state: HardState::default(),
            conf_state,
            snapshot: Snapshot::default(),
            base: (0, 0),
            entries: Vec::new(),
        }
    }

    /// The hard state last set.
    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    /// Replace the hard state.
    pub fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    /// Record the commit index.
    pub fn set_commit(&mut self, commit: u64) {
        self.hard_state.commit = commit;
    }

    /// The group's configuration as of the last entry applied.
    pub fn conf_state(&self) -> &ConfState {
        &self.conf_state
    }

    /// A configuration change was applied.
    pub fn set_conf_state(&mut self, conf: ConfState) {
        self.conf_state = conf;
    }

    /// The latest snapshot.
    pub fn latest_snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The entries held, oldest first.
    pub fn held(&self) -> &[Entry] {
        &self.entries
    }

    /// Index of the first entry held (one past the compaction point).
    pub fn first(&self) -> u64 {
        self.base.0 + 1
    }

    /// Index of the last entry (the compaction point if none is held).
    pub fn last(&self) -> u64 {
        self.base.0 + self.entries.len() as u64
    }

    /// Append `new` (contiguous), replacing any held entries at or after its first
    /// index. Entries at or below the compaction point are already in the
    /// snapshot and are skipped. A gap is an error (raft-rs never makes one).
    pub fn append(&mut self, new: &[Entry]) -> raft::Result<()> {
        let new: Vec<&Entry> = new.iter().filter(|e| e.index > self.base.0).collect();
        let Some(first) = new.first().map(|e| e.index) else {
            return Ok(());
        };
        if first > self.last() + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        self.entries.truncate((first - self.first()) as usize);
        self.entries.extend(new.into_iter().cloned());
        Ok(())
    }

    /// Keep `snapshot` as the latest (taken here, at an applied index), without
    /// touching the log.
    pub fn set_snapshot(&mut self, snapshot: Snapshot) {
        debug_assert!(snapshot.get_metadata().index >= self.snapshot.get_metadata().index);
        self.snapshot = snapshot;
    }

    /// Drop the entries up to and including `to` (at most the snapshot's index:
    /// nothing is dropped that the snapshot does not hold).
    pub fn compact(&mut self, to: u64) -> raft::Result<()> {
        let to = to.min(self.snapshot.get_metadata().index);
        if to <= self.base.0 {
            return Ok(());
        }
        let term = self.term(to)?;
        self.entries.drain(..(to - self.base.0) as usize);
        self.base = (to, term);
        Ok(())
    }

    /// Install a snapshot from the leader (or replayed from the log file): the
    /// log restarts after it. Entries past it that agree with it are kept.
    pub fn install(&mut self, snapshot: Snapshot) {
        let meta = snapshot.get_metadata();
        let (index, term) = (meta.index, meta.term);
        if self.term(index).ok() == Some(term) && index >= self.base.0 {
            // The snapshot is a prefix of this log: keep what follows it.
            self.entries.drain(..(index - self.base.0) as usize);
        } else {
            self.entries.clear();
        }
        self.base = (index, term);
        self.hard_state.commit = self.hard_state.commit.max(index);
        self.hard_state.term = self.hard_state.term.max(term);
        self.conf_state = meta.get_conf_state().clone();
        self.snapshot = snapshot;
    }

    /// Assert the invariants in the module comment.
    pub fn self_check(&self) {
        for (i, e) in self.entries.iter().enumerate() {
            assert_eq!(e.index, self.base.0 + 1 + i as u64, "entries contiguous");
        }
        assert!(
            self.entries.windows(2).all(|w| w[0].term <= w[1].term)
                && self.entries.first().is_none_or(|e| e.term >= self.base.1),
            "terms never decrease along the log"
        );
        let snap = self.snapshot.get_metadata().index;
        assert!(snap >= self.base.0, "a compacted entry is in the snapshot");
        assert!(
            snap <= self.hard_state.commit,
            "a snapshot holds only committed entries"
        );
    }
}

impl Storage for MapStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state.clone(),
            self.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let from = (low - self.first()) as usize;
        let to = (high - self.first()) as usize;
        let mut out = self.entries[from..to].to_vec();
        raft::util::limit_size(&mut out, max_size.into());
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.base.0 {
            return Ok(self.base.1);
        }
        if idx < self.base.0 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        match self.entries.get((idx - self.first()) as usize) {
            Some(e) => Ok(e.term),
            None => Err(raft::Error::Store(StorageError::Unavailable)),
        }
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        if self.snapshot.get_metadata().index < request_index.max(1) {
            // No snapshot yet (or an older one than asked for): raft-rs asks again.
            return Err(raft::Error::Store(
                StorageError::SnapshotTemporarilyUnavailable,
            ));
        }
        Ok(self.snapshot.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            index,
            term,
            ..Default::default()
        }
    }

    fn snapshot(index: u64, term: u64) -> Snapshot {
        let mut s = Snapshot::default();
        s.mut_metadata().index = index;
        s.mut_metadata().term = term;
        s.data = vec![1, 2, 3].into();
        s
    }

    #[test]
    fn a_compacted_log_answers_for_its_compaction_point_and_refuses_before_it() {
        let mut s = MapStorage::new(ConfState::default());
        let log: Vec<Entry> = (1..=10).map(|i| entry(i, 1 + i / 4)).collect();
        s.append(&log).unwrap();
        s.set_commit(10);
        // Compaction stops at the snapshot.
        s.compact(6).unwrap();
        assert_eq!(s.first(), 1, "nothing dropped before a snapshot holds it");
        s.set_snapshot(snapshot(8, 3));
        s.compact(6).unwrap();
        s.self_check();
        assert_eq!((s.first(), s.last()), (7, 10));
        assert_eq!(s.term(6).unwrap(), 2, "the compaction point's term is kept");
        assert!(matches!(
            s.term(5),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        assert!(matches!(
            s.entries(6, 8, None, GetEntriesContext::empty(false)),
            Err(raft::Error::Store(StorageError::Compacted))
        ));
        let got = s
            .entries(7, 11, None, GetEntriesContext::empty(false))
            .unwrap();
        assert_eq!(
            got.iter().map(|e| e.index).collect::<Vec<_>>(),
            [7, 8, 9, 10]
        );
        assert!(s
            .entries(7, 12, None, GetEntriesContext::empty(false))
            .is_err());
        assert_eq!(s.snapshot(0, 2).unwrap().get_metadata().index, 8);
        assert!(
            s.snapshot(9, 2).is_err(),
            "an older snapshot than asked for"
        );
        // A new leader rewrites entry 9 onwards.
        s.append(&[entry(9, 4), entry(10, 4), entry(11, 4)])
            .unwrap();
        assert_eq!(s.last(), 11);
        assert_eq!(s.term(9).unwrap(), 4);
        assert!(s.append(&[entry(13, 4)]).is_err(), "a gap is refused");
        s.self_check();
    }

    #[test]
    fn an_installed_snapshot_keeps_the_entries_that_follow_it_only_if_they_agree() {
        let mut s = MapStorage::new(ConfState::default());
        s.append(&(1..=6).map(|i| entry(i, 1)).collect::<Vec<_>>())
            .unwrap();
        s.install(snapshot(4, 1));
        s.self_check();
        assert_eq!((s.first(), s.last()), (5, 6));
        assert_eq!(s.hard_state().commit, 4);
        // A snapshot from a later term that this log does not hold: all go.
        s.install(snapshot(9, 3));
        s.self_check();
        assert_eq!((s.first(), s.last()), (10, 9));
        assert_eq!(s.term(9).unwrap(), 3);
        assert_eq!(s.hard_state().term, 3);
    }
}
