//! Writes a node applied, by the client request they served, so a retried write
//! is not applied twice.
//!
//! A client retries a write it got no answer to with the same request id, and the
//! retry may reach a new primary (a failover happened meanwhile). If the first
//! attempt was applied, and a newer write has since overwritten every block of it,
//! applying the retry again would bring the old data back: a reader could see the
//! blocks go A, B, A, which no order of the writes explains. So every node
//! remembers, for a while, which request each write it applied (as primary or as
//! replica) served and at what version. A retry whose every block now holds a
//! newer version took effect before that newer write: it is answered at once.
//!
//! Gaps, stated: a retry whose blocks were overwritten only in part is applied
//! again whole (a write split at the newer one's edges is not built); a node that
//! restarted, or got the first attempt only through a rebuild copy, does not know
//! it. Entries live [`APPLIED_KEEP_NS`], longer than a client keeps retrying, and
//! at most [`APPLIED_MAX`] are kept, so memory stays bounded under any load.

use crate::ids::{Lba, NodeId, RequestId, Version};
use std::collections::{BTreeMap, VecDeque};

/// How long an applied write is remembered: past the client's whole retry budget.
pub(super) const APPLIED_KEEP_NS: u64 =
    crate::client::RETRY_BUDGET.as_nanos() as u64 + 5_000_000_000;
/// Most applied writes remembered at once (about 64 bytes each).
pub(super) const APPLIED_MAX: usize = 1 << 18;

/// One applied write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Applied {
    pub(super) lba: Lba,
    pub(super) blocks: u64,
    pub(super) version: Version,
}

/// The writes a node applied recently, by (client, request).
#[derive(Debug, Default)]
pub(super) struct AppliedWrites {
    /// Each write, with when it was noted.
    by_request: BTreeMap<(NodeId, RequestId), (Applied, u64)>,
    /// Oldest first: (when, key), for expiry.
    order: VecDeque<(u64, (NodeId, RequestId))>,
}

impl AppliedWrites {
    /// Note that the write of `origin` was applied at `version`.
    pub(super) fn note(&mut self, origin: (NodeId, RequestId), write: Applied, now_ns: u64) {
        self.expire(now_ns);
        while self.order.len() >= APPLIED_MAX {
            self.pop_oldest();
        }
        // A later attempt of the same request (a retry applied again) replaces
        // the earlier one; its old place in `order` expires harmlessly.
        self.by_request.insert(origin, (write, now_ns));
        self.order.push_back((now_ns, origin));
    }

    /// The write `origin` applied, if remembered.
    pub(super) fn get(&self, origin: (NodeId, RequestId)) -> Option<Applied> {
        self.by_request.get(&origin).map(|&(w, _)| w)
    }

    /// Entries remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.by_request.len()
    }

    fn expire(&mut self, now_ns: u64) {
        while self
            .order
            .front()
            .is_some_and(|&(at, _)| now_ns.saturating_sub(at) > APPLIED_KEEP_NS)
        {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some((at, key)) = self.order.pop_front() {
            // Only if no later attempt replaced it (that one has its own place).
            if self
                .by_request
                .get(&key)
                .is_some_and(|&(_, noted)| noted == at)
            {
                self.by_request.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(v: u64) -> Applied {
        Applied {
            lba: Lba(8),
            blocks: 2,
            version: Version(v),
        }
    }

    #[test]
    fn writes_are_remembered_for_a_while_and_within_a_bound() {
        let mut a = AppliedWrites::default();
        let key = (NodeId(1000), RequestId(7));
        a.note(key, w(3), 0);
        assert_eq!(a.get(key), Some(w(3)));
        assert_eq!(a.get((NodeId(1001), RequestId(7))), None);
        // A retry applied again replaces the first attempt.
        a.note(key, w(5), 10);
        assert_eq!(a.get(key), Some(w(5)));
        // Expired once older than the keep time.
        a.note((NodeId(1), RequestId(1)), w(1), APPLIED_KEEP_NS + 11);
        assert_eq!(a.get(key), None);
        assert_eq!(a.len(), 1);
        // Bounded: the oldest go first.
        let mut a = AppliedWrites::default();
        for r in 0..APPLIED_MAX as u64 + 10 {
            a.note((NodeId(1), RequestId(r)), w(r), 0);
        }
        assert_eq!(a.len(), APPLIED_MAX);
        assert_eq!(a.get((NodeId(1), RequestId(9))), None);
        assert!(a.get((NodeId(1), RequestId(10))).is_some());
    }
}
