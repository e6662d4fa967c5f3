//! Repair of media errors (DESIGN.md section 4.1): a block a device cannot read is
//! fetched from a peer that holds the same version and written back, which makes
//! the device remap it.
//!
//! - A primary whose read fails with a media error keeps the read's shared range
//!   lock, asks its in-sync replicas in placement order ([`Message::FetchBlocks`]),
//!   answers the client with the first copy it gets and writes it back. No write to
//!   those blocks runs while it holds the lock, and every write before has been
//!   acknowledged by every in-sync replica, so a replica's copy is the current one.
//!   A rebuild chunk's read that fails starts the same repair (with no client).
//! - An in-sync replica whose read fails (a scrub) answers with the error, and
//!   asks its primary. The primary reads under a shared range lock and answers
//!   before it lets go of it, so its answer reaches the replica before any later
//!   write to those blocks, and the replica's device orders its writes per block:
//!   the repair never lands over a newer write. An answer from an older epoch is
//!   dropped.
//! - A peer that does not answer within the replica timeout, or cannot read the
//!   blocks either, is passed over for the next; with none left the read fails
//!   with the media error (a client retries).
//! - A peer that refuses for now (`NoLease`: a primary new to the extent waits
//!   out its predecessor's lease; `Busy`) is asked again after the replica
//!   timeout, up to [`REPAIR_ASKS_MAX`] times in all: a repair found by the
//!   scrubber during a failover is not left for the scrubber's next pass.

use super::*;

/// Times a repair asks a peer that refuses for now (`NoLease`, `Busy`)
/// before it passes it over: with the 100 ms replica timeout, longer than the
/// 150 ms lease a new primary waits out.
pub(super) const REPAIR_ASKS_MAX: u32 = 4;

/// A repair in progress at the node whose device failed.
#[derive(Debug)]
pub(super) struct Repair {
    pub(super) extent: ExtentId,
    pub(super) epoch: Epoch,
    pub(super) lba: Lba,
    pub(super) blocks: u64,
    /// The client read it serves (a primary's), answered with the fetched data.
    pub(super) waiter: Option<(NodeId, RequestId)>,
    /// It holds the extent's range lock (a primary's repairs do).
    pub(super) locked: bool,
    /// Peers asked, in order; the last one is being waited for.
    pub(super) tried: Vec<NodeId>,
    pub(super) asked_ns: u64,
    /// The device's error, for the waiter if no peer has the blocks.
    pub(super) error: WeirError,
    /// The fetched data is being written back.
    pub(super) writing: bool,
    /// The last peer asked refused for now: ask it again (not the next) when
    /// the replica timeout has passed.
    pub(super) again: bool,
    /// Asks of the last peer so far.
    pub(super) asks: u32,
}

/// Who answers a peer's fetch.
enum FetchRole {
    /// This node, as the extent's primary, for an in-sync replica.
    Primary,
    /// This node, as an in-sync replica, for its primary.
    Replica,
}

impl Replicator {
    /// A primary's client read `op` failed with a media error: repair instead, still
    /// holding its lock, and answer the client from the copy.
    pub(super) fn repair_read(&mut self, op: OpId, error: WeirError) {
        let ReadOp {
            client,
            req,
            extent,
            lba,
            blocks,
        } = self.ops.reads.remove(&op).expect("a read failed");
        tracing::warn!(%extent, %lba, blocks, %error, "media error on a read; fetching from a replica");
        let repair = Repair {
            extent,
            epoch: self.map.extent(extent).epoch,
            lba,
            blocks,
            waiter: Some((client, req)),
            locked: true,
            tried: Vec::new(),
            asked_ns: self.now_ns,
            error,
            writing: false,
            again: false,
            asks: 0,
        };
        self.ops.repairs.insert(op, repair);
        self.ask_next_peer(op);
    }

    /// Start a repair of `[lba, lba + blocks)` of `extent` after a media error
    /// (a primary's takes the extent's range lock first).
    pub(super) fn start_repair(
        &mut self,
        extent: ExtentId,
        lba: Lba,
        blocks: u64,
        error: WeirError,
    ) {
        debug_assert!(
            blocks > 0
                && self.map.extent_of(lba) == extent
                && lba.offset(blocks) <= self.map.extent_end(extent),
            "a repair of {blocks} blocks at {lba} outside {extent}"
        );
        let placement = self.map.extent(extent);
        let (primary, epoch) = (placement.primary == self.me, placement.epoch);
        if !placement.in_sync.contains(&self.me) || self.ops.len() >= MAX_OPS_IN_FLIGHT {
            return;
        }
        tracing::warn!(%extent, %lba, blocks, %error, "media error; repairing from a peer");
        let op = self.op_id();
        let repair = Repair {
            extent,
            epoch,
            lba,
            blocks,
            waiter: None,
            locked: primary,
            tried: Vec::new(),
            asked_ns: self.now_ns,
            error,
            writing: false,
            again: false,
            asks: 0,
        };
        self.ops.repairs.insert(op, repair);
        if !primary {
            return self.ask_next_peer(op);
        }
        let lock = &mut self.primary_state(extent).lock;
        if lock.acquire(op, lba, lba.offset(blocks), Mode::Shared) {
            self.run_ready(vec![op]);
        }
    }

    /// Ask the next peer for repair `op`'s blocks, or give up if none is left.
    pub(super) fn ask_next_peer(&mut self, op: OpId) {
        let Some(r) = self.ops.repairs.get(&op) else {
            return;
        };
        let placement = self.map.extent(r.extent);
        let again = r.tried.last().copied().filter(|_| r.again);
        let peer =
            if placement.epoch != r.epoch {
                None
            } else if let Some(peer) = again {
                Some(peer)
            } else if placement.primary == self.me {
                placement.replicas.iter().copied().find(|n| {
                    *n != self.me && placement.in_sync.contains(n) && !r.tried.contains(n)
                })
            } else {
                Some(placement.primary).filter(|p| !r.tried.contains(p))
            };
        let Some(peer) = peer else {
            return self.give_up_repair(op);
        };
        assert!(
            peer != self.me && !r.writing,
            "repair {op} asks itself, or asks again while writing back"
        );
        let msg = Message::FetchBlocks {
            op,
            extent: r.extent,
            epoch: r.epoch,
            lba: r.lba,
            blocks: r.blocks as u32,
        };
        if let Some(r) = self.ops.repairs.get_mut(&op) {
            if r.again {
                r.again = false;
                r.asks += 1;
            } else {
                r.tried.push(peer);
                r.asks = 1;
            }
            r.asked_ns = self.now_ns;
        }
        self.send(peer, msg);
    }

    fn give_up_repair(&mut self, op: OpId) {
        let Some(r) = self.ops.repairs.remove(&op) else {
            return;
        };
        tracing::warn!(extent = %r.extent, lba = %r.lba, "no peer could supply the blocks; not repaired");
        if let Some((client, req)) = r.waiter {
            self.fail(client, req, r.error);
        }
        if r.locked && self.primary.contains_key(&r.extent) {
            self.unlock(r.extent, op);
        }
    }

    /// Repairs whose peer has been silent past the replica timeout ask the next.
    pub(super) fn expire_repairs(&mut self) {
        let (now, timeout_ns) = (self.now_ns, self.config.replica_timeout_ns);
        let stale: Vec<OpId> = self
            .ops
            .repairs
            .iter()
            .filter(|(_, r)| {
                !r.writing && !r.tried.is_empty() && now.saturating_sub(r.asked_ns) >= timeout_ns
            })
            .map(|(&op, _)| op)
            .collect();
        for op in stale {
            self.ask_next_peer(op);
        }
    }

    /// A peer asks for blocks its device could not read.
    pub(super) fn fetch_blocks(
        &mut self,
        from: NodeId,
        op: OpId,
        extent: ExtentId,
        epoch: Epoch,
        lba: Lba,
        blocks: u32,
    ) {
        if !self.map.nodes().contains(&from) {
            return tracing::warn!(%from, "fetch from a non-member; dropped");
        }
        let blocks = u64::from(blocks);
        match self.check_fetch(from, extent, epoch, lba, blocks) {
            Err(e) => self.send(from, Message::fetched(op, Err(e))),
            // An in-sync replica asks its primary: answered under a shared lock.
            Ok(FetchRole::Primary) => {
                let mine = self.op_id();
                let fetch = FetchOp {
                    to: from,
                    remote: op,
                    extent,
                    lba,
                    blocks,
                };
                self.ops.fetches.insert(mine, fetch);
                let lock = &mut self.primary_state(extent).lock;
                if lock.acquire(mine, lba, lba.offset(blocks), Mode::Shared) {
                    self.run_ready(vec![mine]);
                }
            }
            // The primary asks an in-sync replica: it holds the lock itself.
            Ok(FetchRole::Replica) => {
                let io = self.io(IoPurpose::Fetch { to: from, op });
                self.read_device(io, IoCmd::Read { lba, blocks });
            }
        }
    }

    /// May `from`'s fetch of `blocks` at `lba` be answered, and in which role?
    fn check_fetch(
        &self,
        from: NodeId,
        extent: ExtentId,
        epoch: Epoch,
        lba: Lba,
        blocks: u64,
    ) -> Result<FetchRole, WeirError> {
        let volume = self.map.volume();
        let bs = u64::from(volume.block_size);
        self.blocks_in_extent(extent, lba, (blocks * bs) as usize)?;
        if blocks > u64::from(volume.max_request_blocks) {
            return Err(WeirError::BadLength {
                len: blocks * bs,
                block_size: bs as u32,
                max_bytes: volume.max_request_bytes(),
            });
        }
        let placement = self.map.extent(extent);
        if epoch != placement.epoch {
            let current = placement.epoch;
            return Err(WeirError::StaleEpoch {
                got: epoch,
                current,
            });
        }
        if placement.primary == self.me {
            if !placement.in_sync.contains(&from) || from == self.me {
                return Err(WeirError::NotPrimary(self.me));
            }
            self.may_serve(extent)?;
            if self.ops.len() >= MAX_OPS_IN_FLIGHT {
                return Err(WeirError::Busy);
            }
            return Ok(FetchRole::Primary);
        }
        if placement.primary != from || !placement.in_sync.contains(&self.me) {
            return Err(WeirError::NotPrimary(from));
        }
        if self.ios.len() >= MAX_OPS_IN_FLIGHT {
            return Err(WeirError::Busy);
        }
        Ok(FetchRole::Replica)
    }

    /// A primary's answer to a replica's fetch finished its read: answer, then
    /// let go of the range (so the answer goes before any later write).
    pub(super) fn fetch_read_done(&mut self, op: OpId, result: IoResult) {
        let FetchOp {
            to, remote, extent, ..
        } = self.ops.fetches.remove(&op).expect("a fetch read");
        debug_assert_ne!(to, self.me, "a primary fetches from itself");
        let result = io_data(result);
        self.send(to, Message::fetched(remote, result));
        self.unlock(extent, op);
    }

    /// A peer answered repair `op`.
    pub(super) fn fetched(&mut self, from: NodeId, op: OpId, result: Result<Bytes, WeirError>) {
        let bs = self.map.volume().block_size as usize;
        let Some(r) = self.ops.repairs.get_mut(&op) else {
            return tracing::debug!(%from, %op, "blocks for no repair; dropped");
        };
        if r.writing || r.tried.last() != Some(&from) {
            return tracing::debug!(%from, %op, "blocks from a peer not asked; dropped");
        }
        let data = match result {
            Ok(data) if data.len() == r.blocks as usize * bs => data,
            Ok(_) => return self.ask_next_peer(op),
            Err(e @ (WeirError::NoLease(_) | WeirError::Busy)) if r.asks < REPAIR_ASKS_MAX => {
                // Asked again by `expire_repairs` once the replica timeout passed.
                tracing::debug!(%from, %op, error = %e, "peer refused the fetch for now");
                r.again = true;
                r.asked_ns = self.now_ns;
                return;
            }
            Err(e) => {
                tracing::debug!(%from, %op, error = %e, "peer could not supply the blocks");
                return self.ask_next_peer(op);
            }
        };
        if !r.locked && self.map.extent(r.extent).epoch != r.epoch {
            // A replica's: a newer epoch may have written these blocks since (a
            // later read finds the error again). A primary's holds the lock.
            return self.give_up_repair(op);
        }
        debug_assert!(
            !r.locked || self.primary.contains_key(&r.extent),
            "a locked repair of {} outlived its primary state",
            r.extent
        );
        r.writing = true;
        let (lba, waiter) = (r.lba, r.waiter.take());
        if let Some((client, req)) = waiter {
            self.reply_read(client, req, IoResult::Read(data.clone()));
        }
        let io = self.io(IoPurpose::Op(op));
        self.write_device(
            io,
            IoCmd::Write {
                lba,
                data,
                fua: false,
            },
        );
    }

    /// Repair `op`'s write-back finished.
    pub(super) fn repair_written(&mut self, op: OpId, result: IoResult) {
        let r = self.ops.repairs.remove(&op).expect("a repair's write-back");
        assert!(r.writing, "repair {op} wrote back before a peer answered");
        match io_unit(result) {
            Ok(()) => {
                let from = r.tried.last().copied().expect("a peer answered");
                self.actions
                    .push_back(Action::Event(crate::events::Event::Repaired {
                        node: self.me,
                        blocks: r.blocks,
                        lba: r.lba,
                        extent: r.extent,
                        from,
                    }));
            }
            Err(e) => {
                tracing::warn!(extent = %r.extent, lba = %r.lba, error = %e, "repair write failed")
            }
        }
        if r.locked && self.primary.contains_key(&r.extent) {
            self.unlock(r.extent, op);
        }
    }
}
