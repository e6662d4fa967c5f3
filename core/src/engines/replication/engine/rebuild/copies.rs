//! Rebuild, the primary side's owner: the copies to rebuilding replicas (each
//! walk, its chunks out, the bandwidth bound), the writes forwarded to those
//! replicas they have not answered, and, for a rebuilding replica, the copies
//! and probes it has yet to answer. It decides; the engine (`super`) does the
//! I/O, the locking and the sending.

use super::*;
use std::collections::BTreeSet;

/// One copy at the primary: where its walk stands, its chunks out, what it
/// moved.
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
    /// How long after the last ask `RebuildDone` is asked again: from
    /// [`REBUILD_RETRY_NS`], doubling with each ask, up to
    /// [`REBUILD_DONE_ASK_AGAIN_NS`].
    ask_gap_ns: u64,
    /// No new chunk before this time (after a failed one).
    backoff_until_ns: u64,
    bytes_done: u64,
    /// Bytes the replica already had (probed, not sent).
    bytes_skipped: u64,
    bytes_total: u64,
    started_ns: u64,
    /// TEST ONLY (`Bugs::rebuild_one_short`): the grain left out.
    skip: Option<Lba>,
    /// Copy every grain of the extent, those this node holds no version of at
    /// this version: this node restarted, and the replica may lack writes from
    /// before that (see [`Replicator::set_restored`]).
    full: Option<Version>,
}

/// A copy's key: the extent, and the replica it goes to.
type CopyKey = (ExtentId, NodeId);

/// How a copy walks, for a chunk of it: the epoch it rebuilds at, and what its
/// chunks send (see [`chunk_versions`]).
#[derive(Clone, Copy, Debug)]
pub(in crate::engines::replication::engine) struct Walk {
    pub(in crate::engines::replication::engine) epoch: Epoch,
    pub(super) full: Option<Version>,
    pub(super) skip: Option<Lba>,
}

/// What [`Rebuilds::pump`] asks the engine to do, in order.
#[derive(Debug)]
pub(in crate::engines::replication::engine) enum Step {
    /// Ask the control plane for this `RebuildDone`.
    AskDone(crate::control::Command),
    /// Start chunk `op` (it waits for its range lock first).
    Chunk { op: OpId, chunk: Chunk },
}

/// A copy that ended with a map change ([`Rebuilds::after_map`]).
#[derive(Debug)]
pub(in crate::engines::replication::engine) struct Ended {
    pub(in crate::engines::replication::engine) extent: ExtentId,
    pub(in crate::engines::replication::engine) node: NodeId,
    /// Its chunks still out: their range locks are let go.
    pub(in crate::engines::replication::engine) chunks: Vec<OpId>,
    /// The replica is in sync now (the copy was done): what it moved, and when
    /// it began.
    pub(in crate::engines::replication::engine) rebuilt: Option<(u64, u64, u64)>,
}

/// The rebuild work of one node, the one owner of its state: as a primary, its
/// copies to rebuilding replicas (where each walk stands, its chunks out, the
/// bandwidth bound) and the writes forwarded to those replicas they have not
/// answered; as a rebuilding replica, the copies and probes it has yet to
/// answer. It decides; the engine does the I/O, the locking and the sending.
#[derive(Debug, Default)]
pub(in crate::engines::replication::engine) struct Rebuilds {
    copies: BTreeMap<CopyKey, Copy>,
    /// Writes forwarded to a rebuilding replica that it has not answered, by
    /// replica: op -> extent and when it was forwarded.
    unacked: BTreeMap<NodeId, BTreeMap<OpId, (ExtentId, u64)>>,
    incoming: Vec<Incoming>,
    /// Bytes sent since `since_ns`, for the bandwidth bound.
    sent_bytes: u64,
    since_ns: Option<u64>,
}

impl Rebuilds {
    /// Copies in progress at this node as a primary.
    pub(in crate::engines::replication::engine) fn progress(&self) -> Vec<RebuildProgress> {
        self.copies
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
    pub(in crate::engines::replication::engine) fn joining(&self, extent: ExtentId) -> Vec<NodeId> {
        self.copies
            .range((extent, NodeId(0))..=(extent, NodeId(u32::MAX)))
            .filter(|(_, c)| c.joining)
            .map(|(&(_, node), _)| node)
            .collect()
    }

    /// Write `op` of `extent` went to `node`, a rebuilding replica not waited
    /// for, at `now`: its copy joins only once the replica has answered it (or
    /// the answer is given up, see [`Rebuilds::expire_forwards`]).
    pub(in crate::engines::replication::engine) fn forwarded(
        &mut self,
        node: NodeId,
        op: OpId,
        extent: ExtentId,
        now: u64,
    ) {
        self.unacked
            .entry(node)
            .or_default()
            .insert(op, (extent, now));
    }

    /// Give up answers to forwarded writes unanswered for
    /// [`REBUILD_CHUNK_TIMEOUT_NS`] at `now`: the write or its answer was lost
    /// (a connection reset loses frames), so the replica may lack those blocks,
    /// and its copy walks the extent again, as after a failed write. Without
    /// this a copy would wait for ever to join.
    pub(in crate::engines::replication::engine) fn expire_forwards(
        &mut self,
        now: u64,
        map: &ClusterMap,
    ) {
        let mut lost = Vec::new();
        for (&node, ops) in &mut self.unacked {
            ops.retain(|_, &mut (extent, since)| {
                let keep = now.saturating_sub(since) < REBUILD_CHUNK_TIMEOUT_NS;
                if !keep {
                    lost.push((extent, node));
                }
                keep
            });
        }
        lost.dedup();
        for key in lost {
            if let Some(c) = self.copies.get_mut(&key) {
                tracing::warn!(extent = %key.0, node = %key.1, "a rebuilding replica never answered a write; walking its copy again");
                c.restart(map.extent_start(key.0));
            }
        }
    }

    /// Rebuilding replica `from` answered forwarded write `op`; whether it was
    /// waited on as one. If it failed, the replica may lack those blocks
    /// whatever the walk found: its copy walks the extent again (probes make
    /// that cheap).
    pub(in crate::engines::replication::engine) fn replica_answered(
        &mut self,
        from: NodeId,
        op: OpId,
        failed: bool,
        map: &ClusterMap,
    ) -> bool {
        let Some((extent, _)) = self.unacked.get_mut(&from).and_then(|ops| ops.remove(&op)) else {
            return false;
        };
        if failed {
            if let Some(c) = self.copies.get_mut(&(extent, from)) {
                tracing::warn!(%extent, node = %from, "a rebuilding replica failed a write; walking its copy again");
                c.restart(map.extent_start(extent));
            }
        }
        true
    }

    /// Chunks unanswered for [`REBUILD_CHUNK_TIMEOUT_NS`] at `now`.
    pub(in crate::engines::replication::engine) fn expired(
        &self,
        now: u64,
    ) -> Vec<(CopyKey, OpId)> {
        self.copies
            .iter()
            .flat_map(|(&key, c)| c.chunks.iter().map(move |(&op, &t)| (key, op, t)))
            .filter(|&(_, _, since)| now.saturating_sub(since) >= REBUILD_CHUNK_TIMEOUT_NS)
            .map(|(key, op, _)| (key, op))
            .collect()
    }

    /// Chunk `op` of copy `key` is given up (it was out from `lba`, if it
    /// still was): those blocks are copied again after a pause.
    pub(in crate::engines::replication::engine) fn give_up(
        &mut self,
        key: CopyKey,
        op: OpId,
        lba: Option<Lba>,
        now: u64,
    ) {
        let c = self.copies.get_mut(&key).expect("an expired chunk's copy");
        c.chunks.remove(&op);
        c.failed_at(lba, now);
    }

    /// The map changed (`me` is this node): copies that no longer apply are
    /// taken out and returned, those whose epoch moved walk again from the
    /// start, and replicas that rebuild nowhere any more (down, or in sync)
    /// owe nothing.
    pub(in crate::engines::replication::engine) fn after_map(
        &mut self,
        map: &ClusterMap,
        me: NodeId,
    ) -> Vec<Ended> {
        let mut ended = Vec::new();
        let keys: Vec<CopyKey> = self.copies.keys().copied().collect();
        for (extent, node) in keys {
            let e = map.extent(extent);
            let leads = e.primary == me && e.in_sync.contains(&me);
            if leads && e.rebuilding.contains(&node) {
                let c = self.copies.get_mut(&(extent, node)).expect("listed");
                if c.epoch != e.epoch {
                    c.epoch = e.epoch;
                    c.restart(map.extent_start(extent));
                }
                continue;
            }
            let c = self.copies.remove(&(extent, node)).expect("listed");
            ended.push(Ended {
                extent,
                node,
                chunks: c.chunks.keys().copied().collect(),
                rebuilt: (leads && e.in_sync.contains(&node)).then_some((
                    c.bytes_done,
                    c.bytes_skipped,
                    c.started_ns,
                )),
            });
        }
        let state = map.state();
        self.unacked
            .retain(|n, _| state.extents.values().any(|e| e.rebuilding.contains(n)));
        ended
    }

    /// Copies the map asks of `me` that have not begun: (extent, replica, epoch).
    pub(in crate::engines::replication::engine) fn wanted(
        &self,
        map: &ClusterMap,
        me: NodeId,
    ) -> Vec<(ExtentId, NodeId, Epoch)> {
        map.state()
            .extents
            .iter()
            .filter(|(_, e)| e.primary == me && e.in_sync.contains(&me))
            .flat_map(|(&id, e)| e.rebuilding.iter().map(move |&n| (id, n, e.epoch)))
            .filter(|(id, n, _)| !self.copies.contains_key(&(*id, *n)))
            .collect()
    }

    /// Begin copying `extent` to `node` at `epoch` at `now`: the grains
    /// `grains` has written, or with `full` every block (see
    /// [`Replicator::copies_in_full`]); `one_short` is the test-only bug.
    pub(in crate::engines::replication::engine) fn begin(
        &mut self,
        (extent, node, epoch): (ExtentId, NodeId, Epoch),
        full: Option<Version>,
        one_short: bool,
        grains: &Grains,
        map: &ClusterMap,
        now: u64,
    ) {
        let bs = u64::from(map.volume().block_size);
        let (start, end) = (map.extent_start(extent), map.extent_end(extent));
        let (from, to) = (grains.grain_of(start), grains.grain_of(end));
        let written = match full {
            Some(_) => end.0 - start.0,
            None => grains.written(from, to).count() as u64 * grains.grain_blocks(),
        };
        let skip = one_short
            .then(|| {
                grains
                    .written(from, to)
                    .max_by_key(|(_, g)| g.version)
                    .map(|(g, _)| grains.start_of(g))
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
            ask_gap_ns: REBUILD_RETRY_NS,
            backoff_until_ns: 0,
            bytes_done: 0,
            bytes_skipped: 0,
            bytes_total: written * bs,
            started_ns: now,
            skip,
            full,
        };
        let before = self.copies.insert((extent, node), copy);
        assert!(before.is_none(), "one copy of {extent} to {node} at a time");
    }

    /// The chunks to start and the `RebuildDone`s to ask for at `now`, within
    /// the bounds: `rate` bytes per second over all copies, at most
    /// [`REBUILD_CHUNKS_IN_FLIGHT`] chunks out, [`REBUILD_CHUNKS_PER_COPY`] per
    /// copy, none towards a replica in `blocked` (one of its chunks waits for
    /// room in its window). A chunk waiting for a window counts: the bound is
    /// on chunks that hold a range lock. A copy walked to its end joins once
    /// its chunks are answered. `new_op` names each chunk.
    pub(in crate::engines::replication::engine) fn pump(
        &mut self,
        now: u64,
        (rate, blocked): (u64, &BTreeSet<NodeId>),
        grains: &Grains,
        map: &ClusterMap,
        new_op: &mut dyn FnMut() -> OpId,
    ) -> Vec<Step> {
        let mut steps = Vec::new();
        if self.copies.is_empty() {
            self.since_ns = None;
            self.sent_bytes = 0;
            return steps;
        }
        let bs = u64::from(map.volume().block_size);
        // A chunk is one message of whole grains: never longer than the largest
        // request (a grain is no longer than one).
        let gb = grains.grain_blocks();
        let chunk_blocks =
            ((REBUILD_CHUNK_BYTES / bs).min(u64::from(map.volume().max_request_blocks)) / gb)
                .max(1)
                * gb;
        let since = *self.since_ns.get_or_insert(now);
        let allowed = u128::from(rate) * u128::from(now.saturating_sub(since)) / 1_000_000_000
            + u128::from(REBUILD_CHUNK_BYTES);
        let mut in_flight: usize = self.copies.values().map(|c| c.chunks.len()).sum();
        let keys: Vec<CopyKey> = self.copies.keys().copied().collect();
        for key in keys {
            // Each round starts one chunk; bounded by the copy's chunks in flight.
            loop {
                let c = self.copies.get_mut(&key).expect("listed");
                if c.chunks.len() >= REBUILD_CHUNKS_PER_COPY || c.backoff_until_ns > now {
                    break;
                }
                if c.joining {
                    steps.extend(self.ask_done(key, now));
                    break;
                }
                if in_flight >= REBUILD_CHUNKS_IN_FLIGHT || u128::from(self.sent_bytes) >= allowed {
                    break;
                }
                let Some(first) = c.next_block(grains) else {
                    // Walked to the end: joining once every chunk is answered.
                    if c.chunks.is_empty() {
                        c.joining = true;
                        tracing::debug!(extent = %key.0, node = %key.1, "rebuild copied; joining");
                        steps.extend(self.ask_done(key, now));
                    }
                    break;
                };
                if blocked.contains(&key.1) {
                    break;
                }
                let op = new_op();
                let chunk = c.take_chunk(key, op, first, chunk_blocks, grains, now);
                in_flight += 1;
                steps.push(Step::Chunk { op, chunk });
            }
        }
        steps
    }

    /// `RebuildDone` for copy `key` at `now`, if its replica has answered every
    /// write forwarded to it and it was not asked for just now.
    fn ask_done(&mut self, key: CopyKey, now: u64) -> Option<Step> {
        let (extent, node) = key;
        let owes = self
            .unacked
            .get(&node)
            .is_some_and(|ops| ops.values().any(|&(e, _)| e == extent));
        let c = self.copies.get_mut(&key).expect("listed");
        if owes
            || c.asked_ns
                .is_some_and(|t| now.saturating_sub(t) < c.ask_gap_ns)
        {
            return None;
        }
        if c.asked_ns.is_some() {
            c.ask_gap_ns = (c.ask_gap_ns * 2).min(REBUILD_DONE_ASK_AGAIN_NS);
        }
        c.asked_ns = Some(now);
        Some(Step::AskDone(crate::control::Command::RebuildDone {
            extent,
            epoch: c.epoch,
            node,
        }))
    }

    /// How copy `key` walks; `None` if it has ended.
    pub(in crate::engines::replication::engine) fn walk(&self, key: CopyKey) -> Option<Walk> {
        self.copies.get(&key).map(|c| Walk {
            epoch: c.epoch,
            full: c.full,
            skip: c.skip,
        })
    }

    /// A chunk of copy `key` was probed: the replica had `skipped` of its
    /// bytes, and `reading` are read to be sent (they count against the rate).
    pub(in crate::engines::replication::engine) fn probed(
        &mut self,
        key: CopyKey,
        skipped: u64,
        reading: u64,
    ) {
        if let Some(c) = self.copies.get_mut(&key) {
            c.bytes_skipped += skipped;
        }
        self.sent_bytes += reading;
    }

    /// Chunk `op` of copy `key`, out from `lba`, ended at `now`: `Ok` with the
    /// bytes the replica acknowledged, or failed (its blocks are copied again
    /// after a pause).
    pub(in crate::engines::replication::engine) fn chunk_ended(
        &mut self,
        key: CopyKey,
        op: OpId,
        lba: Lba,
        result: Result<u64, &WeirError>,
        now: u64,
    ) {
        let Some(c) = self.copies.get_mut(&key) else {
            return;
        };
        if c.chunks.remove(&op).is_none() {
            return;
        }
        match result {
            Ok(bytes) => c.bytes_done += bytes,
            Err(e) => {
                tracing::debug!(extent = %key.0, node = %key.1, error = %e, "rebuild chunk failed; retrying");
                c.failed_at(Some(lba), now);
            }
        }
    }

    /// A copy or probe arrived here, a rebuilding replica: it is answered by
    /// [`Rebuilds::answerable`].
    pub(in crate::engines::replication::engine) fn arrived(&mut self, incoming: Incoming) {
        self.incoming.push(incoming);
    }

    /// Whether any copy or probe waits for an answer here.
    pub(in crate::engines::replication::engine) fn awaiting(&self) -> bool {
        !self.incoming.is_empty()
    }

    /// The copies and probes to answer now: their device writes are done, and
    /// no device write still in flight here covers their blocks (`busy`).
    pub(in crate::engines::replication::engine) fn answerable(
        &mut self,
        busy: impl Fn(Lba, u64) -> bool,
    ) -> Vec<Incoming> {
        let mut ready = Vec::new();
        let mut i = 0;
        while i < self.incoming.len() {
            let inc = &self.incoming[i];
            // Any device write of these blocks (forwarded, copied, a repair, or
            // this node's own from when it was primary) is waited for.
            if inc.ios_left > 0 || busy(inc.lba, inc.blocks) {
                i += 1;
                continue;
            }
            ready.push(self.incoming.swap_remove(i));
        }
        ready
    }

    /// A device write of copy `op` from `primary` finished; if it failed, the
    /// copy's blocks, whose grains are to be broken (what they hold is unknown
    /// now, so a probe asks for them again).
    pub(in crate::engines::replication::engine) fn copy_written(
        &mut self,
        primary: NodeId,
        op: OpId,
        error: Option<WeirError>,
    ) -> Option<(Lba, u64)> {
        let inc = self
            .incoming
            .iter_mut()
            .find(|i| i.primary == primary && i.op == op)?;
        assert!(inc.ios_left > 0, "a copy's device write finished twice");
        inc.ios_left -= 1;
        let e = error?;
        inc.error.get_or_insert(e);
        Some((inc.lba, inc.blocks))
    }

    /// Check the bookkeeping against the engine's table of rebuild chunks
    /// (`chunks`); panics on a broken invariant:
    /// - every chunk a copy has out is in the table, for that copy, and every
    ///   chunk in the table is out for its copy;
    /// - a copy has at most [`REBUILD_CHUNKS_PER_COPY`] out, and all copies at
    ///   most [`REBUILD_CHUNKS_IN_FLIGHT`]; a joining copy has none, and its
    ///   walk stays within its extent;
    /// - the bandwidth window is open exactly while there are copies;
    /// - a probe waits for no device write of its own.
    pub(in crate::engines::replication::engine) fn self_check(
        &self,
        chunks: &BTreeMap<OpId, Chunk>,
    ) {
        let mut out = 0;
        for (&(extent, node), c) in &self.copies {
            assert!(
                c.chunks.len() <= REBUILD_CHUNKS_PER_COPY,
                "copy of {extent} to {node}: {} chunks out",
                c.chunks.len()
            );
            assert!(
                !c.joining || c.chunks.is_empty(),
                "copy of {extent} to {node} joins with chunks out"
            );
            assert!(
                c.cursor <= c.end,
                "copy of {extent} to {node} walked past its extent"
            );
            for op in c.chunks.keys() {
                let chunk = chunks.get(op).unwrap_or_else(|| {
                    panic!("copy of {extent} to {node}: chunk {op} out but not in the table")
                });
                assert_eq!(
                    (chunk.extent, chunk.node),
                    (extent, node),
                    "chunk {op} listed by another copy"
                );
            }
            out += c.chunks.len();
        }
        assert!(out <= REBUILD_CHUNKS_IN_FLIGHT, "{out} rebuild chunks out");
        assert_eq!(
            out,
            chunks.len(),
            "rebuild chunks in the table not out for a copy"
        );
        assert_eq!(
            self.copies.is_empty(),
            self.since_ns.is_none(),
            "the bandwidth window is open exactly while copies run"
        );
        for inc in &self.incoming {
            assert!(
                inc.probe.is_none() || inc.ios_left == 0,
                "probe {} from {} waits for a device write",
                inc.op,
                inc.primary
            );
        }
    }
}

impl Copy {
    /// Walk again from `start`, the extent's first block: the replica may lack
    /// blocks the walk passed.
    fn restart(&mut self, start: Lba) {
        self.cursor = start;
        self.joining = false;
        self.asked_ns = None;
        self.ask_gap_ns = REBUILD_RETRY_NS;
    }

    /// A chunk from `lba` (if known) failed or was given up at `now`: walk
    /// again from there after a pause.
    fn failed_at(&mut self, lba: Option<Lba>, now: u64) {
        if let Some(lba) = lba {
            self.cursor = self.cursor.min(lba);
        }
        self.joining = false;
        self.backoff_until_ns = now + REBUILD_RETRY_NS;
    }

    /// Chunk `op` of this copy (`key`), from `first` (see [`Copy::next_block`])
    /// up to `chunk_blocks` blocks, taken out at `now`: the walk moves past it.
    fn take_chunk(
        &mut self,
        key: CopyKey,
        op: OpId,
        first: Lba,
        chunk_blocks: u64,
        grains: &Grains,
        now: u64,
    ) -> Chunk {
        let limit = Lba((first.0 + chunk_blocks).min(self.end.0));
        let versions = chunk_versions(grains, self.full, self.skip, first, limit);
        let end = first.offset(versions.len() as u64 * grains.grain_blocks());
        assert!(
            self.cursor <= first && first < end && end <= limit,
            "a chunk holds at least one block, ahead of the walk"
        );
        self.cursor = end;
        let before = self.chunks.insert(op, now);
        assert!(before.is_none(), "chunk {op} taken twice");
        Chunk {
            extent: key.0,
            node: key.1,
            lba: first,
            versions,
            phase: ChunkPhase::Locking,
        }
    }

    /// The first block of the next chunk, if the walk has not ended: the next
    /// grain written here, or for a copy in full the next block.
    fn next_block(&self, grains: &Grains) -> Option<Lba> {
        match self.full {
            Some(_) => (self.cursor < self.end).then_some(self.cursor),
            None => {
                let (from, to) = (grains.grain_of(self.cursor), grains.grain_of(self.end));
                let first = grains.written(from, to).next();
                first.map(|(g, _)| grains.start_of(g))
            }
        }
    }
}

/// The versions a chunk from `first` sends (up to `limit`), one per grain: the
/// run of consecutive grains `grains` has written (`skip` sent at 0, by the
/// test-only bug), or, for a copy in `full`, every grain at that version at least.
pub(super) fn chunk_versions(
    grains: &Grains,
    full: Option<Version>,
    skip: Option<Lba>,
    first: Lba,
    limit: Lba,
) -> Vec<Version> {
    let gb = grains.grain_blocks();
    let (from, to) = (grains.grain_of(first), limit.0.div_ceil(gb));
    debug_assert_eq!(first.0 % gb, 0, "a chunk starts at a grain");
    match full {
        // Versions from before the restart are only lower bounds (checkpoints):
        // the replica may hold a later write this node lost with its cache.
        // Every such grain is sent at `base`, above them all, so the replica
        // takes this node's.
        Some(base) => (from..to)
            .map(|g| grains.get(g).version.max(base))
            .collect(),
        None => grains
            .written(from, to)
            .zip(from..)
            .take_while(|((g, _), want)| g == want)
            .map(|((g, s), _)| {
                // A grain broken here goes at its version all the same: this
                // node, the primary, holds every acknowledged write to it (an
                // in-sync replica misses only unacknowledged ones, and those
                // were written back when it took over), and its data is what it
                // serves. Sent at 0, a replica that also lacks writes to it
                // would keep its own and miss acknowledged writes.
                if skip == Some(grains.start_of(g)) {
                    Version::default()
                } else {
                    s.version
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests;
