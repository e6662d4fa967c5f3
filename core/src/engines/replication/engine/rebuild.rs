//! Rebuild (DESIGN.md section 4.1): a replica that comes back joins its extents as
//! `Rebuilding`. It receives every new write (not waited for) while the primary
//! copies the rest to it, by version; then it joins the in-sync set.
//!
//! Primary side, per (extent, rebuilding replica), a copy walks the version
//! grains the primary has written (see [`crate::replication::grains`]), in chunks
//! of whole grains, about [`REBUILD_CHUNK_BYTES`]:
//! - Each chunk first asks the replica which of its grains it lacks (a probe with
//!   the primary's versions, taken under the chunk's lock; the replica answers
//!   once no older write to them is in flight there): a replica that was away
//!   briefly, or a chunk it got whole from new writes meanwhile, costs no read
//!   and no copy. A grain the replica missed a write to, or failed one, it
//!   lacks. Only the part it lacks is read and sent.
//! - Each chunk holds a shared range lock from the probe until the replica
//!   acknowledges it, so a new write to those blocks reaches the replica only after
//!   the copy is on its device; device writes to one block never race.
//! - The replica keeps its own block only if it is newer than the copy's and from
//!   the primary's reign (a newer write forwarded meanwhile wins; see `takes`),
//!   and acknowledges once its own writes and any device write still in flight to
//!   those blocks are done.
//! - Bandwidth is bounded ([`ReplicationConfig::rebuild_bytes_per_sec`] over all of
//!   a primary's copies, at most [`REBUILD_CHUNKS_IN_FLIGHT`] chunks at once), so
//!   foreground latency stays close to normal. With the congestion response on,
//!   the data in flight to a replica also stays within that peer's window (see
//!   [`crate::flow`]; one chunk always may go): a congested path slows its copy.
//!   The window holds back data, not probes: a chunk the replica lacks part of
//!   waits, probed and locked, for room ([`ChunkPhase::Waiting`]), and no new
//!   chunk to that replica starts meanwhile; while the replica lacks nothing,
//!   several probes stay in flight. (One probe at a time would make every lost
//!   packet a lost tail, which TCP recovers only by its retransmission
//!   timeout: 200 ms at least, after Linux and RFC 8985, for each.)
//! - When the walk is done the replica is *joining*: new writes wait for it like
//!   for an in-sync replica. Once it has answered every write forwarded to it
//!   before, the primary asks the control plane for `RebuildDone`; from then on any
//!   write acknowledged is on the replica too. A map change restarts the walk.

use super::*;
use crate::replication::grains::Grains;
use crate::wire::RebuildCopy;

mod copies;
mod replica;

pub(super) use copies::Rebuilds;
use copies::{chunk_versions, Step};

/// Bytes per rebuild chunk.
pub const REBUILD_CHUNK_BYTES: u64 = 128 << 10;
/// Default rebuild bandwidth of one primary, bytes per second.
pub const DEFAULT_REBUILD_BYTES_PER_SEC: u64 = 1 << 30;
/// Chunks one primary has in flight at once, over all its copies.
const REBUILD_CHUNKS_IN_FLIGHT: usize = 8;
/// Chunks one copy has in flight at once: more than one keeps a lossy link's
/// retransmissions fast (a lone chunk's lost tail waits for a timeout).
const REBUILD_CHUNKS_PER_COPY: usize = 4;
/// A chunk unanswered this long is given up and sent again: its ack was lost (the
/// replica restarted too quickly to be declared down), and its range lock must
/// not hold writes to those blocks back for ever.
pub(super) const REBUILD_CHUNK_TIMEOUT_NS: u64 = 1_000_000_000;
/// A failed chunk is retried after this long.
const REBUILD_RETRY_NS: u64 = 10_000_000;
/// `RebuildDone` is asked again while the copy has not ended (the request may
/// have been lost with a leader): after [`REBUILD_RETRY_NS`], then twice as
/// long each time, up to this. Asked every 10 ms, a restarted node's dozens
/// of copies flooded the control plane with copies of their requests
/// (hundreds a second, each applied, or refused, by every member), which
/// slowed every commit and so made more of them (seen in
/// `node/tests/restarts.rs`, 2026-12-06).
const REBUILD_DONE_ASK_AGAIN_NS: u64 = 250_000_000;

/// Where a rebuild chunk stands at the primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChunkPhase {
    /// Waiting for its range lock.
    Locking,
    /// The replica has been asked what it lacks.
    Probing,
    /// The replica lacks part of it, which waits for room in the replica's
    /// window before it is read and sent.
    Waiting,
    /// The part the replica lacks is being read.
    Reading,
    /// Sent; waiting for the replica's ack.
    Sent,
}

/// One chunk of a copy at the primary: `versions.len()` grains from `lba`, to
/// `node`.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(super) extent: ExtentId,
    pub(super) node: NodeId,
    pub(super) lba: Lba,
    /// The primary's version of each grain.
    pub(super) versions: Vec<Version>,
    /// Where the chunk stands.
    pub(super) phase: ChunkPhase,
}

/// Progress of one copy, for status reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RebuildProgress {
    /// The extent.
    pub extent: ExtentId,
    /// The replica being rebuilt.
    pub node: NodeId,
    /// Bytes dealt with so far: sent, or found already on the replica.
    pub bytes_done: u64,
    /// Of those, bytes sent.
    pub bytes_sent: u64,
    /// Bytes to copy (the grains the primary had written when the copy began).
    pub bytes_total: u64,
    /// When the copy began (cluster clock, ns).
    pub started_ns: u64,
}

/// A copy or probe arriving at a rebuilding replica, answered once its device
/// writes and any older write to its blocks in flight here are done.
#[derive(Debug)]
pub(super) struct Incoming {
    pub(super) primary: NodeId,
    pub(super) op: OpId,
    pub(super) lba: Lba,
    pub(super) blocks: u64,
    /// Device writes of the copy still in flight.
    pub(super) ios_left: usize,
    pub(super) error: Option<WeirError>,
    /// A probe (with the primary's versions of the run), not a copy.
    pub(super) probe: Option<Vec<Version>>,
}

/// Whether a rebuilding replica holding a block at `held` takes the primary's
/// copy at `theirs`, `reign` being the floor of the primary's reign
/// (`primary_since`). It does if its own is older; and if its own is newer but
/// from before the reign: a write an earlier primary never answered, that reached
/// this copy and not the primary (its own, if this node was that primary; see
/// `reconcile`). The copy is the primary's data, what it serves. A newer block
/// from this reign is a write forwarded after the copy was read: kept.
pub(super) fn takes(held: Version, theirs: Version, reign: Version) -> bool {
    theirs > held || (held > theirs && held < reign && theirs.0 > 0)
}

impl Replicator {
    /// Copies in progress at this node as a primary.
    pub fn rebuild_progress(&self) -> Vec<RebuildProgress> {
        self.rebuild.progress()
    }

    /// Give up chunks unanswered for [`REBUILD_CHUNK_TIMEOUT_NS`]: let go of
    /// their ranges and copy those blocks again after a pause.
    pub(super) fn expire_rebuild_chunks(&mut self) {
        for ((extent, node), op) in self.rebuild.expired(self.now_ns) {
            tracing::warn!(%extent, %node, "rebuild chunk unanswered; sending it again");
            let lba = self.withdraw_chunk(extent, op);
            self.rebuild.give_up((extent, node), op, lba, self.now_ns);
        }
        self.rebuild.expire_forwards(self.now_ns, &self.map);
    }

    /// Forget chunk `op` of `extent` if it is still out, and let go of its range
    /// (or writes to those blocks would wait for an ack that never comes); the
    /// chunk's first block if it was out.
    fn withdraw_chunk(&mut self, extent: ExtentId, op: OpId) -> Option<Lba> {
        let Chunk { lba, .. } = self.ops.chunks.remove(&op)?;
        let state = self.primary.get_mut(&extent).expect("a chunk holds a lock");
        let ready = state.lock.withdraw(op);
        self.run_ready(ready);
        Some(lba)
    }

    /// The map changed: drop copies that no longer apply (their chunks still
    /// out, to a replica now down, let go of their ranges), restart those whose
    /// epoch moved, start copies for new rebuilding replicas of extents led here.
    pub(super) fn rebuilds_after_map(&mut self) {
        for ended in self.rebuild.after_map(&self.map, self.me) {
            for &op in &ended.chunks {
                self.withdraw_chunk(ended.extent, op);
            }
            if let Some((bytes, skipped, started_ns)) = ended.rebuilt {
                let (extent, node) = (ended.extent, ended.node);
                let took_ns = self.now_ns.saturating_sub(started_ns).max(1);
                self.actions
                    .push_back(Action::Event(crate::events::Event::Rebuilt {
                        node,
                        extent,
                        bytes,
                        skipped,
                        took_ns,
                    }));
                self.audit(Audit::Rebuilt {
                    extent,
                    node,
                    bytes,
                    skipped,
                    started_ns,
                    at_ns: self.now_ns,
                });
            }
        }
        for copy in self.rebuild.wanted(&self.map, self.me) {
            let full = self.copies_in_full(copy.0, copy.1);
            let one_short = self.config.bugs().rebuild_one_short;
            let (grains, map) = (&self.grains, &self.map);
            self.rebuild
                .begin(copy, full, one_short, grains, map, self.now_ns);
        }
        self.pump_rebuilds();
    }

    /// Whether a copy of `extent` to `node` must cover every block, and at what
    /// version the blocks this node knows nothing of go: only after a restart, for a
    /// replica not seen in sync since (it may lack writes this node no longer knows
    /// it holds). Their version is the floor of the first epoch after the restart:
    /// above any version given before it, below any given since.
    pub(super) fn copies_in_full(&self, extent: ExtentId, node: NodeId) -> Option<Version> {
        let restored = *self.restored.get(&extent)?;
        (!self.seen_in_sync.contains(&(extent, node)))
            .then(|| Version::epoch_floor(restored.next()))
    }

    /// Start the chunks the bandwidth bound allows; ask for `RebuildDone` where a
    /// joining replica has answered everything.
    pub(super) fn pump_rebuilds(&mut self) {
        let rate = match self.config.rebuild_bytes_per_sec {
            0 => DEFAULT_REBUILD_BYTES_PER_SEC,
            r => r,
        };
        // Chunks waiting for a window go first; no new chunk starts towards
        // a replica one still waits for.
        let blocked = self.start_waiting_chunks();
        let next_op = &mut self.next_op;
        let mut new_op = || {
            *next_op += 1;
            OpId(*next_op)
        };
        let steps = self.rebuild.pump(
            self.now_ns,
            (rate, &blocked),
            &self.grains,
            &self.map,
            &mut new_op,
        );
        for step in steps {
            match step {
                Step::AskDone(command) => self.actions.push_back(Action::Control { command }),
                Step::Chunk { op, chunk } => {
                    let (extent, first) = (chunk.extent, chunk.lba);
                    let end =
                        first.offset(chunk.versions.len() as u64 * self.grains.grain_blocks());
                    self.ops.chunks.insert(op, chunk);
                    let lock = &mut self.primary_state(extent).lock;
                    if lock.acquire(op, first, end, Mode::Shared) {
                        self.run_ready(vec![op]);
                    }
                }
            }
        }
    }

    /// What to send the replica for chunk `op` (`data` empty for a probe), at its
    /// copy's epoch; `None` if the copy has ended.
    fn chunk_copy(&self, op: OpId, data: Bytes) -> Option<(NodeId, RebuildCopy)> {
        let chunk = &self.ops.chunks[&op];
        let walk = self.rebuild.walk((chunk.extent, chunk.node))?;
        let run = RebuildCopy {
            extent: chunk.extent,
            epoch: walk.epoch,
            lba: chunk.lba,
            versions: chunk.versions.clone(),
            data,
        };
        Some((chunk.node, run))
    }

    /// Chunk `op` holds its range lock: ask the replica which blocks it lacks.
    /// Returns the ops that become ready if the chunk is dropped instead (its copy
    /// ended while it waited for the lock).
    pub(super) fn probe_chunk(&mut self, op: OpId) -> Vec<OpId> {
        let chunk = self
            .ops
            .chunks
            .get_mut(&op)
            .expect("started a rebuild chunk");
        debug_assert_eq!(chunk.phase, ChunkPhase::Locking);
        chunk.phase = ChunkPhase::Probing;
        let (extent, node, lba) = (chunk.extent, chunk.node, chunk.lba);
        let grains = chunk.versions.len() as u64;
        // The versions as of now, under the lock: writes that ran while the chunk
        // waited for it are in the data it reads.
        let gb = self.grains.grain_blocks();
        let walk = self.rebuild.walk((extent, node));
        let (full, skip) = walk.map_or((None, None), |w| (w.full, w.skip));
        let versions = chunk_versions(&self.grains, full, skip, lba, lba.offset(grains * gb));
        debug_assert_eq!(
            versions.len() as u64,
            grains,
            "the grains locked were written"
        );
        if versions.len() as u64 == grains {
            self.ops.chunks.get_mut(&op).expect("started").versions = versions;
        }
        let Some((node, copy)) = self.chunk_copy(op, Bytes::new()) else {
            // The copy was dropped while this chunk waited (its withdrawal let an
            // earlier op go, which let this one go): nothing to send.
            self.ops.chunks.remove(&op);
            return self.release(extent, op);
        };
        self.send(node, Message::RebuildProbe { op, copy });
        Vec::new()
    }

    /// The replica said which part of chunk `op` it lacks: read that part, or
    /// finish the chunk if it lacks nothing.
    pub(super) fn rebuild_probed(
        &mut self,
        from: NodeId,
        op: OpId,
        result: Result<(u32, u32), WeirError>,
    ) {
        let bs = u64::from(self.map.volume().block_size);
        let Some(chunk) = self.ops.chunks.get_mut(&op) else {
            return tracing::warn!(%from, %op, "probe answer for no chunk; dropped");
        };
        if chunk.node != from || chunk.phase != ChunkPhase::Probing {
            return tracing::warn!(%from, %op, "probe answer for no chunk asked there; dropped");
        }
        let len = chunk.versions.len();
        let (from_block, to_block) = match result {
            Ok((a, b)) if a <= b && b as usize <= len => (a as usize, b as usize),
            Ok(range) => {
                // No correct replica answers this; send it the whole run.
                tracing::warn!(%from, %op, ?range, "probe answer out of the run; copying all of it");
                (0, len)
            }
            Err(e) => return self.finish_chunk(op, Err(e)),
        };
        let gb = self.grains.grain_blocks();
        let skipped = (len - (to_block - from_block)) as u64 * gb * bs;
        chunk.lba = chunk.lba.offset(from_block as u64 * gb);
        chunk.versions = chunk.versions[from_block..to_block].to_vec();
        chunk.phase = ChunkPhase::Waiting;
        let (extent, node) = (chunk.extent, chunk.node);
        let blocks = chunk.versions.len() as u64 * gb;
        self.rebuild.probed((extent, node), skipped, blocks * bs);
        if blocks == 0 {
            return self.finish_chunk(op, Ok(()));
        }
        if self.window_has_room(node, blocks * bs) {
            self.read_chunk(op);
        }
    }

    /// Read waiting chunk `op`'s data, to send it.
    fn read_chunk(&mut self, op: OpId) {
        let chunk = self.ops.chunks.get_mut(&op).expect("a waiting chunk");
        debug_assert_eq!(chunk.phase, ChunkPhase::Waiting);
        chunk.phase = ChunkPhase::Reading;
        let start = chunk.lba;
        let blocks = chunk.versions.len() as u64 * self.grains.grain_blocks();
        let io = self.io(IoPurpose::Op(op));
        // The chunk goes out with the grains' versions: the data must hold every
        // write those count, including one still on this node's device.
        self.read_device(io, IoCmd::Read { lba: start, blocks });
    }

    /// Bytes of rebuild data being read for, or sent to, `node`.
    pub(super) fn rebuild_data_in_flight(&self, node: NodeId) -> u64 {
        let bytes_per_grain = self.grains.grain_blocks() * u64::from(self.map.volume().block_size);
        self.ops
            .chunks
            .values()
            .filter(|c| c.node == node)
            .filter(|c| matches!(c.phase, ChunkPhase::Reading | ChunkPhase::Sent))
            .map(|c| c.versions.len() as u64 * bytes_per_grain)
            .sum()
    }

    /// Whether `bytes` more of rebuild data may go to `node` now: within its
    /// window if the congestion response gave it one (one chunk always may).
    fn window_has_room(&self, node: NodeId, bytes: u64) -> bool {
        let Some(&window) = self.peer_windows.get(&node) else {
            return true;
        };
        let in_flight = self.rebuild_data_in_flight(node);
        in_flight == 0 || in_flight + bytes <= window
    }

    /// Start the waiting chunks whose replica's window has room now, oldest
    /// first; the replicas some chunk still waits for.
    fn start_waiting_chunks(&mut self) -> std::collections::BTreeSet<NodeId> {
        let waiting: Vec<(OpId, NodeId, u64)> = self
            .ops
            .chunks
            .iter()
            .filter(|(_, c)| c.phase == ChunkPhase::Waiting)
            .map(|(&op, c)| (op, c.node, c.versions.len() as u64))
            .collect();
        let bytes_per_grain = self.grains.grain_blocks() * u64::from(self.map.volume().block_size);
        let mut blocked = std::collections::BTreeSet::new();
        for (op, node, grains) in waiting {
            if !blocked.contains(&node) && self.window_has_room(node, grains * bytes_per_grain) {
                self.read_chunk(op);
            } else {
                blocked.insert(node);
            }
        }
        blocked
    }

    /// The local read of rebuild chunk `op` finished: send it.
    pub(super) fn rebuild_read_done(&mut self, op: OpId, result: IoResult) {
        let gb = self.grains.grain_blocks();
        let chunk = self
            .ops
            .chunks
            .get_mut(&op)
            .expect("matched a rebuild chunk");
        debug_assert_eq!(chunk.phase, ChunkPhase::Reading);
        let data = match result {
            IoResult::Read(data) => data,
            IoResult::Failed(e) => {
                let blocks = chunk.versions.len() as u64 * gb;
                let (extent, lba) = (chunk.extent, chunk.lba);
                self.finish_chunk(op, Err(e.clone()));
                // The chunk is sent again after a pause; by then the blocks are
                // fetched from another in-sync replica and written back.
                if matches!(e, WeirError::Device(crate::device::DevError::Media(_))) {
                    self.start_repair(extent, lba, blocks, e);
                }
                return;
            }
            IoResult::Done => panic!("a rebuild read completed without data"),
        };
        chunk.phase = ChunkPhase::Sent;
        let Some((node, copy)) = self.chunk_copy(op, data) else {
            return self.finish_chunk(op, Err(WeirError::NotPrimary(self.me)));
        };
        self.send(node, Message::RebuildWrite { op, copy });
    }

    /// The rebuilding replica answered chunk `op`.
    pub(super) fn rebuild_acked(&mut self, from: NodeId, op: OpId, result: Result<(), WeirError>) {
        match self.ops.chunks.get(&op) {
            Some(Chunk {
                node,
                phase: ChunkPhase::Sent,
                ..
            }) if *node == from => self.finish_chunk(op, result),
            _ => tracing::warn!(%from, %op, "rebuild ack for no chunk sent there; dropped"),
        }
    }

    fn finish_chunk(&mut self, op: OpId, result: Result<(), WeirError>) {
        let Chunk {
            extent,
            node,
            lba,
            versions,
            ..
        } = self.ops.chunks.remove(&op).expect("a chunk still out");
        let bytes = versions.len() as u64
            * self.grains.grain_blocks()
            * u64::from(self.map.volume().block_size);
        let result = result.as_ref().map(|_| bytes);
        self.rebuild
            .chunk_ended((extent, node), op, lba, result, self.now_ns);
        self.unlock(extent, op);
        self.pump_rebuilds();
    }

    /// A rebuilding replica answered write `op`; true if it was waited on as one.
    pub(super) fn rebuild_replica_acked(&mut self, from: NodeId, op: OpId, failed: bool) -> bool {
        let waited = self.rebuild.replica_answered(from, op, failed, &self.map);
        if waited {
            self.pump_rebuilds();
        }
        waited
    }

    /// Answer every copy whose writes are done, and every probe, whose blocks no
    /// device write still in flight here covers (`handle_io` calls this after each
    /// device write).
    pub(super) fn answer_rebuilds(&mut self) {
        if !self.rebuild.awaiting() {
            return;
        }
        let writes = &self.writes;
        for inc in self
            .rebuild
            .answerable(|lba, blocks| writes.writing_to(lba, blocks))
        {
            let msg = match &inc.probe {
                Some(versions) => Message::RebuildProbeOk {
                    op: inc.op,
                    result: Ok(self.lacking(self.map.extent_of(inc.lba), inc.lba, versions)),
                },
                None => Message::RebuildAck {
                    op: inc.op,
                    result: inc.error.map_or(Ok(()), Err),
                },
            };
            self.send(inc.primary, msg);
        }
    }
}
