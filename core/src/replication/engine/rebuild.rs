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
//!   foreground latency stays close to normal.
//! - When the walk is done the replica is *joining*: new writes wait for it like
//!   for an in-sync replica. Once it has answered every write forwarded to it
//!   before, the primary asks the control plane for `RebuildDone`; from then on any
//!   write acknowledged is on the replica too. A map change restarts the walk.

use super::*;
use crate::wire::RebuildCopy;

mod replica;

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
/// `RebuildDone` is asked again after this long if the map has not moved (the
/// request may have been lost with a leader); a failed chunk is retried after it.
const REBUILD_RETRY_NS: u64 = 10_000_000;

/// Where a rebuild chunk stands at the primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChunkPhase {
    /// Waiting for its range lock.
    Locking,
    /// The replica has been asked what it lacks.
    Probing,
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

#[derive(Debug)]
struct Copy {
    epoch: Epoch,
    /// Next block to copy, and the extent's end.
    cursor: Lba,
    end: Lba,
    /// The chunks in flight, with when each was started.
    chunks: BTreeMap<OpId, u64>,
    /// The walk is done: new writes wait for this replica.
    joining: bool,
    /// When `RebuildDone` was last asked for.
    asked_ns: Option<u64>,
    /// No new chunk before this time (after a failed one).
    backoff_until_ns: u64,
    bytes_done: u64,
    /// Bytes the replica already had (probed, not sent).
    bytes_skipped: u64,
    bytes_total: u64,
    started_ns: u64,
    /// TEST ONLY (`bug_rebuild_one_short`): the grain left out.
    skip: Option<Lba>,
    /// Copy every grain of the extent, those this node holds no version of at
    /// this version: this node restarted, and the replica may lack writes from
    /// before that (see [`Replicator::set_restored`]).
    full: Option<Version>,
}

/// A copy arriving at a rebuilding replica, acknowledged once persisted.
#[derive(Debug)]
struct Incoming {
    primary: NodeId,
    op: OpId,
    lba: Lba,
    blocks: u64,
    ios_left: usize,
    error: Option<WeirError>,
    /// A probe (with the primary's versions of the run), not a copy.
    probe: Option<Vec<Version>>,
}

/// Rebuild work of one node.
#[derive(Debug, Default)]
pub(super) struct RebuildState {
    copies: BTreeMap<(ExtentId, NodeId), Copy>,
    /// Writes forwarded to a rebuilding replica that it has not answered, by
    /// replica: op -> extent.
    pub(super) unacked: BTreeMap<NodeId, BTreeMap<OpId, ExtentId>>,
    incoming: Vec<Incoming>,
    /// Bytes sent since `since_ns`, for the bandwidth bound.
    sent_bytes: u64,
    since_ns: Option<u64>,
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
        self.rebuild
            .copies
            .iter()
            .map(|(&(extent, node), c)| RebuildProgress {
                extent,
                node,
                bytes_done: c.bytes_done + c.bytes_skipped,
                bytes_sent: c.bytes_done,
                bytes_total: c.bytes_total,
                started_ns: c.started_ns,
            })
            .collect()
    }

    /// Rebuilding replicas of `extent` whose copy is complete.
    pub(super) fn joining(&self, extent: ExtentId) -> Vec<NodeId> {
        self.rebuild
            .copies
            .range((extent, NodeId(0))..=(extent, NodeId(u32::MAX)))
            .filter(|(_, c)| c.joining)
            .map(|(&(_, node), _)| node)
            .collect()
    }

    /// A rebuilding replica answered write `op`; true if it was waited on as one.
    /// If it failed, the replica may lack those blocks whatever the walk found:
    /// its copy walks the extent again (probes make that cheap).
    pub(super) fn rebuild_replica_acked(&mut self, from: NodeId, op: OpId, failed: bool) -> bool {
        let Some(ops) = self.rebuild.unacked.get_mut(&from) else {
            return false;
        };
        let Some(extent) = ops.remove(&op) else {
            return false;
        };
        if failed {
            let start = self.extent_start(extent);
            if let Some(c) = self.rebuild.copies.get_mut(&(extent, from)) {
                tracing::warn!(%extent, node = %from, "a rebuilding replica failed a write; walking its copy again");
                c.cursor = start;
                c.joining = false;
                c.asked_ns = None;
            }
        }
        self.pump_rebuilds();
        true
    }

    /// Give up chunks unanswered for [`REBUILD_CHUNK_TIMEOUT_NS`]: let go of
    /// their ranges and copy those blocks again after a pause.
    pub(super) fn expire_rebuild_chunks(&mut self) {
        let now = self.now_ns;
        let stale: Vec<((ExtentId, NodeId), OpId)> = self
            .rebuild
            .copies
            .iter()
            .flat_map(|(&key, c)| c.chunks.iter().map(move |(&op, &t)| (key, op, t)))
            .filter(|&(_, _, since)| now.saturating_sub(since) >= REBUILD_CHUNK_TIMEOUT_NS)
            .map(|(key, op, _)| (key, op))
            .collect();
        for ((extent, node), op) in stale {
            tracing::warn!(%extent, %node, "rebuild chunk unanswered; sending it again");
            let lba = self.withdraw_chunk(extent, op);
            let c = self
                .rebuild
                .copies
                .get_mut(&(extent, node))
                .expect("listed");
            c.chunks.remove(&op);
            c.joining = false;
            c.backoff_until_ns = now + REBUILD_RETRY_NS;
            if let Some(lba) = lba {
                c.cursor = c.cursor.min(lba);
            }
        }
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

    /// The map changed: drop copies that no longer apply, restart those whose
    /// epoch moved, start copies for new rebuilding replicas of extents led here.
    pub(super) fn rebuilds_after_map(&mut self) {
        let keys: Vec<(ExtentId, NodeId)> = self.rebuild.copies.keys().copied().collect();
        for (extent, node) in keys {
            let e = self.map.extent(extent).clone();
            let leads = e.primary == self.me && e.in_sync.contains(&self.me);
            if leads && e.rebuilding.contains(&node) {
                let start = self.extent_start(extent);
                let c = self
                    .rebuild
                    .copies
                    .get_mut(&(extent, node))
                    .expect("listed");
                if c.epoch != e.epoch {
                    c.epoch = e.epoch;
                    c.cursor = start;
                    c.joining = false;
                    c.asked_ns = None;
                }
                continue;
            }
            let c = self.rebuild.copies.remove(&(extent, node)).expect("listed");
            // Chunks still out (to a replica now down) let go of their ranges.
            for &op in c.chunks.keys() {
                self.withdraw_chunk(extent, op);
            }
            if leads && e.in_sync.contains(&node) {
                self.copy_finished(extent, node, &c);
            }
        }
        let new: Vec<(ExtentId, NodeId, Epoch)> = self
            .map
            .state()
            .extents
            .iter()
            .filter(|(_, e)| e.primary == self.me && e.in_sync.contains(&self.me))
            .flat_map(|(&id, e)| e.rebuilding.iter().map(move |&n| (id, n, e.epoch)))
            .filter(|(id, n, _)| !self.rebuild.copies.contains_key(&(*id, *n)))
            .collect();
        for (extent, node, epoch) in new {
            self.start_copy(extent, node, epoch);
        }
        // Replicas that rebuild nowhere any more (down, or in sync) owe nothing.
        let state = self.map.state();
        self.rebuild
            .unacked
            .retain(|n, _| state.extents.values().any(|e| e.rebuilding.contains(n)));
        self.pump_rebuilds();
    }

    /// The copy `c` of `extent` to `node` is done: the node is in sync.
    fn copy_finished(&mut self, extent: ExtentId, node: NodeId, c: &Copy) {
        let took_ns = self.now_ns.saturating_sub(c.started_ns).max(1);
        self.actions
            .push_back(Action::Event(crate::events::Event::Rebuilt {
                node,
                extent,
                bytes: c.bytes_done,
                skipped: c.bytes_skipped,
                took_ns,
            }));
        self.audit(Audit::Rebuilt {
            extent,
            node,
            bytes: c.bytes_done,
            skipped: c.bytes_skipped,
            started_ns: c.started_ns,
            at_ns: self.now_ns,
        });
    }

    /// Start copying `extent` to `node`, rebuilding at `epoch`.
    fn start_copy(&mut self, extent: ExtentId, node: NodeId, epoch: Epoch) {
        let bs = u64::from(self.map.volume().block_size);
        let (start, end) = (self.extent_start(extent), self.map.extent_end(extent));
        let full = self.copies_in_full(extent, node);
        let (from, to) = (self.grains.grain_of(start), self.grains.grain_of(end));
        let gb = self.grains.grain_blocks();
        let written = match full {
            Some(_) => end.0 - start.0,
            None => self.grains.written(from, to).count() as u64 * gb,
        };
        let skip = self
            .config
            .bug_rebuild_one_short
            .then(|| {
                self.grains
                    .written(from, to)
                    .max_by_key(|(_, g)| g.version)
                    .map(|(g, _)| self.grains.start_of(g))
            })
            .flatten();
        tracing::info!(%extent, %node, bytes = written * bs, "rebuild starts");
        let copy = Copy {
            epoch,
            cursor: start,
            end,
            chunks: BTreeMap::new(),
            joining: false,
            asked_ns: None,
            backoff_until_ns: 0,
            bytes_done: 0,
            bytes_skipped: 0,
            bytes_total: written * bs,
            started_ns: self.now_ns,
            skip,
            full,
        };
        let before = self.rebuild.copies.insert((extent, node), copy);
        assert!(before.is_none(), "one copy of {extent} to {node} at a time");
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

    fn extent_start(&self, extent: ExtentId) -> Lba {
        Lba(extent.0 * self.map.volume().extent_blocks)
    }

    /// Start the chunks the bandwidth bound allows; ask for `RebuildDone` where a
    /// joining replica has answered everything.
    pub(super) fn pump_rebuilds(&mut self) {
        if self.rebuild.copies.is_empty() {
            self.rebuild.since_ns = None;
            self.rebuild.sent_bytes = 0;
            return;
        }
        let now = self.now_ns;
        let bs = u64::from(self.map.volume().block_size);
        // A chunk is one message of whole grains: never longer than the largest
        // request (a grain is no longer than one).
        let gb = self.grains.grain_blocks();
        let chunk_blocks =
            ((REBUILD_CHUNK_BYTES / bs).min(u64::from(self.map.volume().max_request_blocks)) / gb)
                .max(1)
                * gb;
        let rate = match self.config.rebuild_bytes_per_sec {
            0 => DEFAULT_REBUILD_BYTES_PER_SEC,
            r => r,
        };
        let since = *self.rebuild.since_ns.get_or_insert(now);
        let keys: Vec<(ExtentId, NodeId)> = self.rebuild.copies.keys().copied().collect();
        let allowed = u128::from(rate) * u128::from(now.saturating_sub(since)) / 1_000_000_000
            + u128::from(REBUILD_CHUNK_BYTES);
        let mut in_flight: usize = self.rebuild.copies.values().map(|c| c.chunks.len()).sum();
        for key in keys {
            // Each round starts one chunk; bounded by the copy's chunks in flight.
            while self.pump_copy(key, chunk_blocks, allowed, &mut in_flight) {}
        }
    }

    /// Start the next chunk of the copy `key` if its bounds and the primary's
    /// allow (`allowed` bytes sent so far, [`REBUILD_CHUNKS_IN_FLIGHT`]); a copy
    /// walked to its end joins. Whether a chunk started.
    fn pump_copy(
        &mut self,
        key: (ExtentId, NodeId),
        chunk_blocks: u64,
        allowed: u128,
        in_flight: &mut usize,
    ) -> bool {
        let (extent, node) = key;
        let now = self.now_ns;
        let c = self.rebuild.copies.get_mut(&key).expect("listed");
        if c.chunks.len() >= REBUILD_CHUNKS_PER_COPY || c.backoff_until_ns > now {
            return false;
        }
        if c.joining {
            self.ask_rebuild_done(extent, node);
            return false;
        }
        if *in_flight >= REBUILD_CHUNKS_IN_FLIGHT || u128::from(self.rebuild.sent_bytes) >= allowed
        {
            return false;
        }
        let (full, skip, cursor, walk_end) = (c.full, c.skip, c.cursor, c.end);
        let next = match full {
            Some(_) => (cursor < walk_end).then_some(cursor),
            None => {
                let (from, to) = (self.grains.grain_of(cursor), self.grains.grain_of(walk_end));
                let first = self.grains.written(from, to).next();
                first.map(|(g, _)| self.grains.start_of(g))
            }
        };
        let Some(first) = next else {
            // Walked to the end: joining once every chunk is answered.
            let c = self.rebuild.copies.get_mut(&key).expect("listed");
            if c.chunks.is_empty() {
                c.joining = true;
                tracing::debug!(%extent, %node, "rebuild copied; joining");
                self.ask_rebuild_done(extent, node);
            }
            return false;
        };
        let limit = Lba((first.0 + chunk_blocks).min(walk_end.0));
        let versions = self.chunk_versions(full, skip, first, limit);
        let end = first.offset(versions.len() as u64 * self.grains.grain_blocks());
        debug_assert!(
            first < end && end <= limit,
            "a chunk holds at least one block"
        );
        let op = self.op_id();
        let c = self.rebuild.copies.get_mut(&key).expect("listed");
        c.cursor = end;
        c.chunks.insert(op, now);
        *in_flight += 1;
        let chunk = Chunk {
            extent,
            node,
            lba: first,
            versions,
            phase: ChunkPhase::Locking,
        };
        self.ops.chunks.insert(op, chunk);
        let lock = &mut self.primary_state(extent).lock;
        if lock.acquire(op, first, end, Mode::Shared) {
            self.run_ready(vec![op]);
        }
        true
    }

    /// The versions a chunk from `first` sends (up to `limit`), one per grain:
    /// the run of consecutive grains this node has written (`skip` sent at 0, by
    /// the test-only bug), or, for a copy in `full`, every grain at that version
    /// at least.
    fn chunk_versions(
        &self,
        full: Option<Version>,
        skip: Option<Lba>,
        first: Lba,
        limit: Lba,
    ) -> Vec<Version> {
        let gb = self.grains.grain_blocks();
        let (from, to) = (self.grains.grain_of(first), limit.0.div_ceil(gb));
        debug_assert_eq!(first.0 % gb, 0, "a chunk starts at a grain");
        match full {
            // Versions from before the restart are only lower bounds
            // (checkpoints): the replica may hold a later write this
            // node lost with its cache. Every such grain is sent at
            // `base`, above them all, so the replica takes this node's.
            Some(base) => (from..to)
                .map(|g| self.grains.get(g).held().max(base))
                .collect(),
            None => self
                .grains
                .written(from, to)
                .zip(from..)
                .take_while(|((g, _), want)| g == want)
                .map(|((g, s), _)| {
                    // A grain broken here (a write to it failed) goes at 0: the
                    // replica keeps its own, as for a block never written here.
                    if skip == Some(self.grains.start_of(g)) {
                        Version::default()
                    } else {
                        s.held()
                    }
                })
                .collect(),
        }
    }

    /// Ask for `RebuildDone` if `node` has answered every write forwarded to it.
    fn ask_rebuild_done(&mut self, extent: ExtentId, node: NodeId) {
        let owes = self
            .rebuild
            .unacked
            .get(&node)
            .is_some_and(|ops| ops.values().any(|e| *e == extent));
        let now = self.now_ns;
        let c = self
            .rebuild
            .copies
            .get_mut(&(extent, node))
            .expect("listed");
        if owes
            || c.asked_ns
                .is_some_and(|t| now.saturating_sub(t) < REBUILD_RETRY_NS)
        {
            return;
        }
        c.asked_ns = Some(now);
        let command = crate::control::Command::RebuildDone {
            extent,
            epoch: c.epoch,
            node,
        };
        self.actions.push_back(Action::Control { command });
    }

    /// Rebuild chunk `op`, if it is one still out.
    fn chunk_mut(&mut self, op: OpId) -> Option<&mut Chunk> {
        self.ops.chunks.get_mut(&op)
    }

    /// What to send the replica for chunk `op` (`data` empty for a probe), at its
    /// copy's epoch; `None` if the copy has ended.
    fn chunk_copy(&self, op: OpId, data: Bytes) -> Option<(NodeId, RebuildCopy)> {
        let chunk = &self.ops.chunks[&op];
        let copy = self.rebuild.copies.get(&(chunk.extent, chunk.node))?;
        let run = RebuildCopy {
            extent: chunk.extent,
            epoch: copy.epoch,
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
        let chunk = self.chunk_mut(op).expect("started a rebuild chunk");
        debug_assert_eq!(chunk.phase, ChunkPhase::Locking);
        chunk.phase = ChunkPhase::Probing;
        let (extent, node, lba) = (chunk.extent, chunk.node, chunk.lba);
        let grains = chunk.versions.len() as u64;
        // The versions as of now, under the lock: writes that ran while the chunk
        // waited for it are in the data it reads.
        let gb = self.grains.grain_blocks();
        let copy = self.rebuild.copies.get(&(extent, node));
        let (full, skip) = copy.map_or((None, None), |c| (c.full, c.skip));
        let versions = self.chunk_versions(full, skip, lba, lba.offset(grains * gb));
        debug_assert_eq!(
            versions.len() as u64,
            grains,
            "the grains locked were written"
        );
        if versions.len() as u64 == grains {
            self.chunk_mut(op).expect("started").versions = versions;
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
        let Some(chunk) = self.chunk_mut(op) else {
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
        let chunk = self.chunk_mut(op).expect("looked up above");
        let skipped = (len - (to_block - from_block)) as u64 * gb * bs;
        chunk.lba = chunk.lba.offset(from_block as u64 * gb);
        chunk.versions = chunk.versions[from_block..to_block].to_vec();
        chunk.phase = ChunkPhase::Reading;
        let (extent, node, start) = (chunk.extent, chunk.node, chunk.lba);
        let blocks = chunk.versions.len() as u64 * gb;
        if let Some(c) = self.rebuild.copies.get_mut(&(extent, node)) {
            c.bytes_skipped += skipped;
        }
        if blocks == 0 {
            return self.finish_chunk(op, Ok(()));
        }
        self.rebuild.sent_bytes += blocks * bs;
        let io = self.io(IoPurpose::Op(op));
        let cmd = IoCmd::Read { lba: start, blocks };
        self.actions.push_back(Action::Io { io, cmd });
    }

    /// The local read of rebuild chunk `op` finished: send it.
    pub(super) fn rebuild_read_done(&mut self, op: OpId, result: IoResult) {
        let gb = self.grains.grain_blocks();
        let chunk = self.chunk_mut(op).expect("matched a rebuild chunk");
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
        let bs = u64::from(self.map.volume().block_size);
        let now = self.now_ns;
        if let Some(c) = self.rebuild.copies.get_mut(&(extent, node)) {
            if c.chunks.remove(&op).is_some() {
                match result {
                    Ok(()) => {
                        c.bytes_done += versions.len() as u64 * self.grains.grain_blocks() * bs
                    }
                    Err(e) => {
                        tracing::debug!(%extent, %node, error = %e, "rebuild chunk failed; retrying");
                        c.cursor = c.cursor.min(lba);
                        c.joining = false;
                        c.backoff_until_ns = now + REBUILD_RETRY_NS;
                    }
                }
            }
        }
        self.unlock(extent, op);
        self.pump_rebuilds();
    }

    /// Answer every copy whose writes are done, and every probe, whose blocks no
    /// device write still in flight here covers (`handle_io` calls this after each
    /// device write).
    pub(super) fn answer_rebuilds(&mut self) {
        if self.rebuild.incoming.is_empty() {
            return;
        }
        let mut i = 0;
        while i < self.rebuild.incoming.len() {
            let inc = &self.rebuild.incoming[i];
            // Any device write of these blocks (forwarded, copied, a repair, or
            // this node's own from when it was primary) is waited for.
            if inc.ios_left > 0 || self.writing_to(inc.lba, inc.blocks) {
                i += 1;
                continue;
            }
            let inc = self.rebuild.incoming.swap_remove(i);
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
