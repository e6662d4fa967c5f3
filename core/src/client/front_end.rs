//! A node's own front end (the daemon's NBD server) and the payloads it holds.
//!
//! The front end of node `n` is a client with the id [`front_end_of`]`(n)`, in
//! `n`'s process. When it writes to an extent whose primary is another node and
//! `n` holds an in-sync replica, the primary would send the data straight back to
//! `n` as a replica write: a second receive of the same bytes on `n`. Instead the
//! front end holds each write's payload in [`HeldPayloads`] until the write is
//! answered (or given up), the primary (with
//! [`crate::replication::ReplicationConfig::front_end_payloads`]) sends `n` the
//! replica write with an empty payload, and `n`'s node takes the data from the
//! front end's memory.
//!
//! The client's answer waits for every in-sync replica, so the payload is still
//! held when an in-sync replica's write arrives, unless the client gave the
//! request up (its retry budget ran out) or the replica left the in-sync set
//! meanwhile. (A second attempt of a request, sent while the first still ran and
//! started after the first was answered, is sent with its data: the primary
//! knows it from its applied log.) Such a replica answers [`crate::WeirError::PayloadNotHeld`], and the
//! primary has it dropped from the in-sync set, as for a device that failed the
//! write: it rebuilds. (Sending the data again instead could land it after a later
//! write to the same grain.) Rebuilding replicas always get the data.

use crate::client::{ClientOptions, Volume};
pub use crate::ids::{front_end_of, FRONT_END_ID_BASE};
use crate::ids::{Lba, RequestId};
use crate::map::ClusterMap;
use crate::named::{Control, NamedVolumes};
use crate::splice::Spliced;
use crate::transport::Transport;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Payloads a front end holds at most (its writes in flight); a write past it
/// waits for room before it is sent.
pub const HELD_PAYLOADS_MAX: usize = 4096;

/// Write payloads of a node's front end, by request, while the writes run: each
/// with its first block.
#[derive(Debug)]
pub struct HeldPayloads {
    held: Mutex<BTreeMap<RequestId, (Lba, Bytes)>>,
    /// Room for [`HELD_PAYLOADS_MAX`].
    room: Arc<Semaphore>,
    /// Replica writes that took their data from here, and ones that found none.
    taken: AtomicU64,
    missed: AtomicU64,
}

impl Default for HeldPayloads {
    fn default() -> Self {
        HeldPayloads {
            held: Mutex::new(BTreeMap::new()),
            room: Arc::new(Semaphore::new(HELD_PAYLOADS_MAX)),
            taken: AtomicU64::new(0),
            missed: AtomicU64::new(0),
        }
    }
}

/// A payload held until this is dropped (the write was answered, or given up).
#[derive(Debug)]
pub struct Held {
    payloads: Arc<HeldPayloads>,
    req: RequestId,
    _room: OwnedSemaphorePermit,
}

impl Drop for Held {
    fn drop(&mut self) {
        let gone = self.payloads.lock().remove(&self.req);
        debug_assert!(gone.is_some(), "{} held twice", self.req);
    }
}

impl HeldPayloads {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<RequestId, (Lba, Bytes)>> {
        // A panic elsewhere while holding the lock leaves the map whole.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hold `data`, written at `lba` by request `req`, until the returned guard
    /// drops; waits while [`HELD_PAYLOADS_MAX`] are held.
    pub async fn hold(self: &Arc<Self>, req: RequestId, lba: Lba, data: Bytes) -> Held {
        let room = self.room.clone().acquire_owned().await;
        self.insert(req, lba, data, room.expect("the room is never closed"))
    }

    /// [`HeldPayloads::hold`] if there is room now.
    pub fn try_hold(self: &Arc<Self>, req: RequestId, lba: Lba, data: Bytes) -> Option<Held> {
        let room = self.room.clone().try_acquire_owned().ok()?;
        Some(self.insert(req, lba, data, room))
    }

    fn insert(
        self: &Arc<Self>,
        req: RequestId,
        lba: Lba,
        data: Bytes,
        room: OwnedSemaphorePermit,
    ) -> Held {
        let mut held = self.lock();
        let before = held.insert(req, (lba, data));
        assert!(before.is_none(), "{req} held twice");
        debug_assert!(held.len() <= HELD_PAYLOADS_MAX, "held past the bound");
        Held {
            payloads: self.clone(),
            req,
            _room: room,
        }
    }

    /// The payload request `req` writes at `lba`, if held (shared, not copied).
    pub fn take(&self, req: RequestId, lba: Lba) -> Option<Bytes> {
        let data = self
            .lock()
            .get(&req)
            .filter(|(at, _)| *at == lba)
            .map(|(_, data)| data.clone());
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

    /// Whether none is.
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

/// A node's own front end, as the daemon and the simulator both run it: its
/// pool client on its end of the splice (so it reaches its own node in
/// process, see [`crate::splice`]), holding its writes' payloads for that
/// node, and the named volumes over it.
pub struct NodeFrontEnd<T: Transport> {
    /// The pool client.
    pub volume: Arc<Volume<Spliced<T>>>,
    /// The named volumes, which NBD (the daemon) or the simulator's hosts use.
    pub named: Arc<NamedVolumes<Spliced<T>>>,
}

/// A node's front end before it opens: its end of the splice, and the
/// payloads it will hold for its node (which the node already takes them
/// from). Made by [`crate::node::boot::boot_with_front_end`].
pub struct FrontEndParts<T> {
    /// The front end's end of the splice.
    pub client: Arc<Spliced<T>>,
    /// Its writes' payloads.
    pub held: Arc<HeldPayloads>,
}

impl<T: Transport> FrontEndParts<T> {
    /// Open the front end over `map`, asking `control` (its node's handle) for
    /// map changes; `incarnation` tells its request ids from an earlier
    /// run's, and `options` (whose `held` it sets) bound its requests.
    pub fn open(
        self,
        map: ClusterMap,
        control: Arc<dyn Control>,
        (incarnation, options): (u32, ClientOptions),
    ) -> NodeFrontEnd<T> {
        let pool = *map.volume();
        let extent_bytes = pool.extent_blocks * u64::from(pool.block_size);
        let options = ClientOptions {
            held: Some(self.held),
            ..options
        };
        let volume = Volume::open_with(self.client, map, incarnation, options);
        let named = Arc::new(NamedVolumes::new(volume.clone(), control, extent_bytes));
        NodeFrontEnd { volume, named }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_is_held_until_its_guard_drops_and_the_bound_holds() {
        let payloads = Arc::new(HeldPayloads::default());
        let data = Bytes::from_static(b"four");
        let guard = payloads
            .try_hold(RequestId(7), Lba(3), data.clone())
            .expect("room");
        let taken = payloads.take(RequestId(7), Lba(3)).expect("held");
        assert_eq!(taken.as_ptr(), data.as_ptr(), "shared, not copied");
        assert!(
            payloads.take(RequestId(8), Lba(3)).is_none(),
            "another request"
        );
        assert!(
            payloads.take(RequestId(7), Lba(4)).is_none(),
            "another block"
        );
        assert_eq!(payloads.counts(), (1, 2));
        drop(guard);
        assert!(payloads.is_empty());
        assert!(payloads.take(RequestId(7), Lba(3)).is_none(), "released");

        let guards: Vec<Held> = (0..HELD_PAYLOADS_MAX as u64)
            .map(|r| {
                payloads
                    .try_hold(RequestId(r), Lba(r), data.clone())
                    .expect("room")
            })
            .collect();
        assert!(
            payloads
                .try_hold(RequestId(u64::MAX), Lba(0), data.clone())
                .is_none(),
            "full"
        );
        drop(guards);
        assert!(payloads.is_empty());
        assert!(
            payloads
                .try_hold(RequestId(u64::MAX), Lba(0), data)
                .is_some(),
            "room again"
        );
    }
}
