//! Writes a node applied recently, so a retried write is not applied twice: a
//! bounded log, oldest first, like a placement group's log.
//!
//! A client retries a write it got no answer to with the same request id, and the
//! retry may reach a new primary (a failover happened meanwhile). If the first
//! attempt was applied, and a newer write has since overwritten every block of it,
//! applying the retry again would bring the old data back: a reader could see the
//! blocks go A, B, A, which no order of the writes explains. So every node logs,
//! for a while, each write it applied (as primary or as replica: a client's with
//! its request, a write-back and a rebuild copy with the version of the data they
//! carry). A retry whose every block's newest record is newer data took effect
//! before that newer write: it is answered at once.
//!
//! The log drops its oldest records first, so while a write's record is kept,
//! every record after it is kept too: the answer never rests on a record that is
//! gone. Gaps, stated: a retry whose blocks were overwritten only in part is
//! applied again whole (a write split at the newer one's edges is not built); a
//! node that restarted does not know it. Records live [`APPLIED_KEEP_NS`], longer
//! than a client keeps retrying, and at most [`APPLIED_MAX`] are kept (about 100
//! bytes each, 6.4 MiB in all), so memory stays bounded under any load.

use crate::ids::{Lba, NodeId, RequestId, Version};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// How long an applied write is remembered: past the longest a client may
/// keep retrying one.
pub(super) const APPLIED_KEEP_NS: u64 =
    crate::wire::REQUEST_TIMEOUT_MAX.as_nanos() as u64 + 5_000_000_000;
/// Most applied writes remembered at once.
pub(super) const APPLIED_MAX: usize = 1 << 16;

/// One applied write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Applied {
    pub(super) lba: Lba,
    pub(super) blocks: u64,
    /// The version of the data it wrote.
    pub(super) version: Version,
}

#[derive(Debug)]
struct Record {
    seq: u64,
    at_ns: u64,
    write: Applied,
    origin: Option<(NodeId, RequestId)>,
}

/// The writes a node applied recently.
#[derive(Debug, Default)]
pub(super) struct AppliedWrites {
    /// Oldest first.
    log: VecDeque<Record>,
    /// Client writes by request: their record's `seq` (a later attempt of the
    /// same request replaces an earlier one).
    by_request: BTreeMap<(NodeId, RequestId), u64>,
    /// Records by first block: (lba, seq).
    by_lba: BTreeSet<(Lba, u64)>,
    next_seq: u64,
    /// The longest record, in blocks: how far before a block a record covering
    /// it may start.
    longest: u64,
}

impl AppliedWrites {
    /// Note that `write` was applied, for client request `origin` if given (else
    /// a write-back or a rebuild copy, whose version is that of its data).
    pub(super) fn note(
        &mut self,
        origin: Option<(NodeId, RequestId)>,
        write: Applied,
        now_ns: u64,
    ) {
        debug_assert!(write.blocks > 0, "an empty write is not applied");
        self.expire(now_ns);
        while self.log.len() >= APPLIED_MAX {
            self.pop_oldest();
        }
        self.next_seq += 1;
        let seq = self.next_seq;
        if let Some(key) = origin {
            self.by_request.insert(key, seq);
        }
        self.by_lba.insert((write.lba, seq));
        self.longest = self.longest.max(write.blocks);
        self.log.push_back(Record {
            seq,
            at_ns: now_ns,
            write,
            origin,
        });
        debug_assert_eq!(self.log.len(), self.by_lba.len());
    }

    /// The write `origin` applied, if remembered.
    pub(super) fn get(&self, origin: (NodeId, RequestId)) -> Option<Applied> {
        let seq = *self.by_request.get(&origin)?;
        self.record(seq).map(|r| r.write)
    }

    fn record(&self, seq: u64) -> Option<&Record> {
        let first = self.log.front()?.seq;
        let r = self.log.get(seq.checked_sub(first)? as usize)?;
        debug_assert_eq!(r.seq, seq, "the log's seqs are consecutive");
        Some(r)
    }

    /// The version of the data the newest record covering `lba` wrote, if any.
    pub(super) fn data_version(&self, lba: Lba) -> Option<Version> {
        let from = Lba(lba.0.saturating_sub(self.longest.saturating_sub(1)));
        self.by_lba
            .range((from, 0)..=(lba, u64::MAX))
            .filter_map(|&(_, seq)| self.record(seq))
            .filter(|r| r.write.lba.0 + r.write.blocks > lba.0)
            .max_by_key(|r| r.seq)
            .map(|r| r.write.version)
    }

    /// Whether the write of `origin` at `lba` was applied here and every one of
    /// its blocks has newer data since.
    pub(super) fn superseded(&self, origin: (NodeId, RequestId), lba: Lba) -> bool {
        let Some(first) = self.get(origin) else {
            return false;
        };
        first.lba == lba
            && (lba.0..lba.0 + first.blocks)
                .all(|b| self.data_version(Lba(b)).is_some_and(|v| v > first.version))
    }

    /// Records kept.
    pub(super) fn records(&self) -> usize {
        self.log.len()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.records()
    }

    fn expire(&mut self, now_ns: u64) {
        while self
            .log
            .front()
            .is_some_and(|r| now_ns.saturating_sub(r.at_ns) > APPLIED_KEEP_NS)
        {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        let Some(r) = self.log.pop_front() else {
            return;
        };
        self.by_lba.remove(&(r.write.lba, r.seq));
        if let Some(key) = r.origin {
            // Only if no later attempt replaced it.
            if self.by_request.get(&key) == Some(&r.seq) {
                self.by_request.remove(&key);
            }
        }
        if self.log.is_empty() {
            self.longest = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(lba: u64, blocks: u64, v: u64) -> Applied {
        Applied {
            lba: Lba(lba),
            blocks,
            version: Version(v),
        }
    }

    #[test]
    fn writes_are_remembered_for_a_while_and_within_a_bound() {
        let mut a = AppliedWrites::default();
        let key = (NodeId(1000), RequestId(7));
        a.note(Some(key), w(8, 2, 3), 0);
        assert_eq!(a.get(key), Some(w(8, 2, 3)));
        assert_eq!(a.get((NodeId(1001), RequestId(7))), None);
        // A retry applied again replaces the first attempt.
        a.note(Some(key), w(8, 2, 5), 10);
        assert_eq!(a.get(key), Some(w(8, 2, 5)));
        // Expired once older than the keep time.
        a.note(
            Some((NodeId(1), RequestId(1))),
            w(0, 1, 1),
            APPLIED_KEEP_NS + 11,
        );
        assert_eq!(a.get(key), None);
        assert_eq!(a.len(), 1);
        // Bounded: the oldest go first.
        let mut a = AppliedWrites::default();
        for r in 0..APPLIED_MAX as u64 + 10 {
            a.note(Some((NodeId(1), RequestId(r))), w(r, 1, r + 1), 0);
        }
        assert_eq!(a.len(), APPLIED_MAX);
        assert_eq!(a.get((NodeId(1), RequestId(9))), None);
        assert!(a.get((NodeId(1), RequestId(10))).is_some());
    }

    #[test]
    fn a_write_is_superseded_only_when_every_block_has_newer_data() {
        let mut a = AppliedWrites::default();
        let key = (NodeId(1000), RequestId(1));
        a.note(Some(key), w(10, 4, 5), 0);
        assert!(!a.superseded(key, Lba(10)));
        // Blocks 10-11 overwritten by a client write, 12 by a write-back of newer
        // data: 13 is still the retry's.
        a.note(Some((NodeId(1000), RequestId(2))), w(8, 4, 6), 1);
        a.note(None, w(12, 1, 7), 2);
        assert!(!a.superseded(key, Lba(10)));
        assert_eq!(a.data_version(Lba(13)), Some(Version(5)));
        // A write-back of older data over 13 makes its data older, not newer.
        a.note(None, w(13, 1, 4), 3);
        assert!(!a.superseded(key, Lba(10)));
        // Then a newer write covers it.
        a.note(Some((NodeId(1001), RequestId(1))), w(13, 1, 8), 4);
        assert!(a.superseded(key, Lba(10)));
        // Not at another first block, nor for a request never seen.
        assert!(!a.superseded(key, Lba(11)));
        assert!(!a.superseded((NodeId(9), RequestId(9)), Lba(10)));
        assert_eq!(a.data_version(Lba(99)), None);
    }
}
