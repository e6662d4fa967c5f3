//! A node's own front end (the daemon's NBD server) and the payloads it holds.
//!
//! The front end of node `n` is a client with the id [`front_end_of`]`(n)`, in
//! `n`'s process. When it writes to an extent whose primary is another node and
//! `n` holds a replica, the primary would send the data straight back to `n` as a
//! replica write: a second receive of the same bytes on `n`. Instead the front
//! end keeps each write's payload in [`HeldPayloads`] until the write is answered,
//! the primary (with [`crate::replication::ReplicationConfig::front_end_payloads`])
//! sends `n` the replica write without its payload, and `n`'s node takes the data
//! from the front end's memory. A replica write whose payload is not held (the
//! front end gave up on the request, or was full) is answered
//! [`crate::WeirError::PayloadNotHeld`], and the primary sends it again in full.

use crate::ids::{NodeId, RequestId};
use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Front ends' ids are this plus their node's id; members' ids are below it.
pub const FRONT_END_ID_BASE: u32 = 1 << 20;

/// Payloads a front end holds at most (its writes in flight); a write past it is
/// sent as usual and its payload comes back from the primary.
pub const HELD_PAYLOADS_MAX: usize = 4096;

/// The client id of `node`'s own front end.
pub fn front_end_of(node: NodeId) -> NodeId {
    assert!(node.0 < FRONT_END_ID_BASE, "{node} is a front end's id");
    NodeId(FRONT_END_ID_BASE + node.0)
}

/// Write payloads of a node's front end, by request, while the writes run.
#[derive(Debug, Default)]
pub struct HeldPayloads {
    held: Mutex<BTreeMap<RequestId, Bytes>>,
    /// Replica writes that took their data from here, and ones that found none.
    taken: AtomicU64,
    missed: AtomicU64,
}

/// A payload held until this is dropped (the write was answered, or given up).
#[derive(Debug)]
pub struct Held {
    payloads: Arc<HeldPayloads>,
    req: RequestId,
}

impl Drop for Held {
    fn drop(&mut self) {
        let gone = self.payloads.lock().remove(&self.req);
        debug_assert!(gone.is_some(), "{} held twice", self.req);
    }
}

impl HeldPayloads {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<RequestId, Bytes>> {
        // A panic elsewhere while holding the lock leaves the map whole.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hold `data` for request `req` until the returned guard drops; `None` when
    /// [`HELD_PAYLOADS_MAX`] are held already (or `req` is), and then nothing is.
    pub fn hold(self: &Arc<Self>, req: RequestId, data: Bytes) -> Option<Held> {
        let mut held = self.lock();
        if held.len() >= HELD_PAYLOADS_MAX || held.contains_key(&req) {
            return None;
        }
        held.insert(req, data);
        Some(Held {
            payloads: self.clone(),
            req,
        })
    }

    /// The payload of request `req`, if held (shared, not copied).
    pub fn take(&self, req: RequestId) -> Option<Bytes> {
        let data = self.lock().get(&req).cloned();
        let counter = if data.is_some() {
            &self.taken
        } else {
            &self.missed
        };
        counter.fetch_add(1, Ordering::Relaxed);
        data
    }

    /// Payloads held now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replica writes that took their payload from here so far, and ones that
    /// found none.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.taken.load(Ordering::Relaxed),
            self.missed.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_is_held_until_its_guard_drops_and_the_bound_holds() {
        let payloads = Arc::new(HeldPayloads::default());
        let data = Bytes::from_static(b"four");
        let guard = payloads.hold(RequestId(7), data.clone()).expect("room");
        assert!(payloads.hold(RequestId(7), data.clone()).is_none(), "twice");
        let taken = payloads.take(RequestId(7)).expect("held");
        assert_eq!(taken.as_ptr(), data.as_ptr(), "shared, not copied");
        assert!(payloads.take(RequestId(8)).is_none());
        assert_eq!(payloads.counts(), (1, 1));
        drop(guard);
        assert!(payloads.is_empty());
        assert!(payloads.take(RequestId(7)).is_none(), "released");

        let guards: Vec<Held> = (0..HELD_PAYLOADS_MAX as u64)
            .map(|r| payloads.hold(RequestId(r), data.clone()).expect("room"))
            .collect();
        assert!(payloads.hold(RequestId(u64::MAX), data).is_none(), "full");
        drop(guards);
        assert!(payloads.is_empty());
    }

    #[test]
    fn front_end_ids_lie_above_every_member() {
        assert_eq!(front_end_of(NodeId(3)), NodeId(FRONT_END_ID_BASE + 3));
        assert!(std::panic::catch_unwind(|| front_end_of(NodeId(FRONT_END_ID_BASE))).is_err());
    }
}
