//! Reconciliation when a primary takes over an extent: before it serves, every
//! in-sync copy agrees with it on the blocks a write left unacknowledged by an
//! earlier primary may have touched.
//!
//! An earlier primary's write that was in flight when it failed may have reached
//! some replicas and not others. Nobody acknowledged it, so either outcome is
//! allowed, but the copies must not disagree: the new primary serves its own copy,
//! and if a replica holding the other outcome became primary later, a reader could
//! see the block change with no write.
//!
//! - A primary tells its replicas, with every write, the version up to which every
//!   write of the extent has been answered (`settled`). Each replica keeps, per
//!   extent, the writes it took above that: its *uncertain tail*, from the oldest
//!   write not yet answered to the newest. A primary keeps that window below
//!   [`TAIL_MAX`] writes: a write that would widen it past that waits (`Busy`).
//! - When a replica sees a new primary take over an extent (a new
//!   `primary_since`), it sends that primary its tail's blocks
//!   ([`Message::ReconcileTail`]).
//! - The new primary waits for the tail of every other in-sync replica (asking the
//!   control plane to drop one silent past the replica timeout), adds its own,
//!   and writes its own copy of every block named, read from its device, to every
//!   replica at a new version, like a client write. Only then does it serve the
//!   extent. Rebuilding replicas get those writes too.
//! - Until the new primary's first write after that, its `settled` is 0, so a
//!   replica keeps its tail should this primary fail during reconciliation.
//! - A primary keeps its own writes in its tail too, so a deposed primary that
//!   comes back names its own unanswered writes. A tail that arrives late (from
//!   it, or from a replica that was rebuilding at the takeover) has its blocks
//!   written back as well.
//! - A write-back reads only once no device write to its blocks is in flight
//!   here. It gives its blocks a new version but not new data: each node logs
//!   the version of the data they hold (carried as the write-back's request id),
//!   and a retried write is answered as already applied only if the data of
//!   every block is newer than it (see `applied`).

use super::*;
use crate::replication::versions::runs_by;

/// Most writes one extent's uncertain tail keeps (a primary has at most
/// [`MAX_OPS_IN_FLIGHT`] writes in flight, of all its extents).
pub(super) const TAIL_MAX: usize = MAX_OPS_IN_FLIGHT;

/// Runs of blocks, as a tail names them: (first block, blocks).
type BlockRuns = Vec<(Lba, u32)>;

/// Reconciliation at one node, the one owner of its state: as a replica, its
/// uncertain tails and the reigns it has sent them to; as a primary, the reigns
/// it has reconciled, those in progress, tails that came early, and the
/// write-backs held up by a device write. It decides; the engine reads, locks
/// and writes back.
#[derive(Debug, Default)]
pub(super) struct Reconciler {
    /// As a replica: per extent, writes taken above the last settled version:
    /// version -> (first block, blocks).
    tails: BTreeMap<ExtentId, BTreeMap<Version, (Lba, u64)>>,
    /// As a replica: the reign (primary, `primary_since`) last seen per extent.
    seen: BTreeMap<ExtentId, (NodeId, Epoch)>,
    /// As a primary: the reign reconciled per extent.
    done: BTreeMap<ExtentId, Epoch>,
    /// As a primary: reconciliations in progress.
    running: BTreeMap<ExtentId, Run>,
    /// Tails that arrived before this node saw the reign they are for:
    /// (extent, sender) -> (reign, blocks).
    early: BTreeMap<(ExtentId, NodeId), (Epoch, BlockRuns)>,
    /// Blocks written back by reconciliations so far.
    blocks_pushed: u64,
    /// Extents and blocks written back since the last report, and since when.
    batch: Option<(u64, u64, u64)>,
    /// Write-backs waiting for a device write to their blocks to finish before
    /// they read.
    deferred: Vec<OpId>,
}

/// A reconciliation in progress.
#[derive(Debug)]
struct Run {
    /// The reign it is for (`primary_since`).
    reign: Epoch,
    /// In-sync replicas whose tail has not arrived.
    waiting: BTreeSet<NodeId>,
    /// Blocks named so far.
    blocks: BTreeSet<u64>,
    /// Write-backs still running, once every tail is in (`None` before).
    pushes_left: Option<usize>,
    /// When it began (the engine's clock).
    started_ns: u64,
}

use std::collections::BTreeSet;

/// What a reconciliation's owner decides on a tail that arrived
/// ([`Reconciler::tail`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum TailNext {
    /// It was waited for: write back once every tail is in
    /// ([`Replicator::push_when_ready`]).
    Push,
    /// Not waited for, and the write-backs have begun: these blocks are
    /// written back too, counted with them.
    WriteBack(BTreeSet<u64>),
    /// For a reign reconciled already: these blocks are written back.
    Late(BTreeSet<u64>),
    /// Nothing to do now (noted, kept for a reign to come, or stale).
    Nothing,
}

/// A reconciliation that finished ([`Reconciler::finish`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Finished {
    /// No other is running: extents and blocks written back since the last
    /// report, and since when.
    pub(super) batch: Option<(u64, u64, u64)>,
}

impl Reconciler {
    /// Take the reigns of `map` as reconciled (those `me` leads) or seen (the
    /// map a node starts with: nothing was in flight before it).
    pub(super) fn start_with(&mut self, map: &ClusterMap, me: NodeId) {
        for (&id, e) in &map.state().extents {
            if e.primary == me {
                self.done.insert(id, e.primary_since);
            } else {
                self.seen.insert(id, (e.primary, e.primary_since));
            }
        }
    }

    /// Whether `extent`'s reign begun at `reign` is reconciled here.
    pub(super) fn reconciled(&self, extent: ExtentId, reign: Epoch) -> bool {
        self.done.get(&extent) == Some(&reign)
    }

    /// Blocks written back by reconciliations so far.
    pub(super) fn blocks_pushed(&self) -> u64 {
        self.blocks_pushed
    }

    /// A replica took write `version` of `[lba, lba + blocks)` in `extent`,
    /// with the primary's `settled`: note it in the tail, forget what has
    /// settled, keep at most [`TAIL_MAX`].
    pub(super) fn note_tail(
        &mut self,
        extent: ExtentId,
        version: Version,
        lba: Lba,
        blocks: u64,
        settled: Version,
    ) {
        let tail = self.tails.entry(extent).or_default();
        while let Some(oldest) = tail.first_entry() {
            if *oldest.key() > settled {
                break;
            }
            oldest.remove();
        }
        tail.insert(version, (lba, blocks));
        while tail.len() > TAIL_MAX {
            tail.pop_first();
        }
        if tail.is_empty() {
            self.tails.remove(&extent);
        }
    }

    /// The blocks of this node's tail of `extent`.
    fn tail_blocks(&self, extent: ExtentId) -> BTreeSet<u64> {
        let tail = self.tails.get(&extent).into_iter().flat_map(|t| t.values());
        tail.flat_map(|&(lba, n)| lba.0..lba.0 + n).collect()
    }

    /// `extent` is led by `primary` in the reign begun at `reign`, not by this
    /// node, which holds a copy if `holds`: forget leading it, and return this
    /// node's tail for that primary, in runs of at most `max` blocks (what a
    /// receiver accepts), if it has not sent it in this reign.
    pub(super) fn follow(
        &mut self,
        extent: ExtentId,
        (primary, reign): (NodeId, Epoch),
        holds: bool,
        max: u64,
    ) -> Option<BlockRuns> {
        self.running.remove(&extent);
        self.done.remove(&extent);
        self.early
            .retain(|&(x, _), (r, _)| x != extent || *r > reign);
        if !holds || self.seen.get(&extent) == Some(&(primary, reign)) {
            return None;
        }
        self.seen.insert(extent, (primary, reign));
        let blocks = self.tail_blocks(extent).into_iter().map(|b| (b, ()));
        let runs = runs_by(blocks, max)
            .into_iter()
            .map(|(first, n, ())| (Lba(first), n as u32))
            .collect();
        Some(runs)
    }

    /// This node leads `extent` in the reign begun at `reign` (at `now`);
    /// `others` are the other in-sync replicas. Whether the reign is still to
    /// be reconciled: then a run waits for each other's tail (tails that came
    /// early are taken), and no longer for a replica dropped from `others`.
    pub(super) fn lead(
        &mut self,
        extent: ExtentId,
        reign: Epoch,
        others: &[NodeId],
        now: u64,
    ) -> bool {
        self.seen.remove(&extent);
        if self.reconciled(extent, reign) {
            return false;
        }
        let running = self.running.get(&extent).is_some_and(|r| r.reign == reign);
        if !running {
            let run = Run {
                reign,
                waiting: others.iter().copied().collect(),
                blocks: self.tail_blocks(extent),
                pushes_left: None,
                started_ns: now,
            };
            self.running.insert(extent, run);
            for &node in others {
                if let Some((r, blocks)) = self.early.remove(&(extent, node)) {
                    if r == reign {
                        self.tail_arrived(extent, node, reign, &blocks);
                    }
                }
            }
        }
        // A replica dropped from the in-sync set is no longer waited for.
        if let Some(run) = self.running.get_mut(&extent) {
            run.waiting.retain(|n| others.contains(n));
        }
        true
    }

    /// `from`'s tail of `extent` for the reign begun at `reign` arrived
    /// (checked against the map by the engine); `current` is the extent's
    /// reign in this node's map.
    pub(super) fn tail(
        &mut self,
        from: NodeId,
        extent: ExtentId,
        reign: Epoch,
        blocks: BlockRuns,
        current: Epoch,
    ) -> TailNext {
        let run = self.running.get_mut(&extent).filter(|r| r.reign == reign);
        match run {
            Some(r) if r.waiting.contains(&from) => {
                self.tail_arrived(extent, from, reign, &blocks);
                TailNext::Push
            }
            // Not waited for (a rebuilding replica, or a deposed primary back):
            // its blocks are written back too, and if that has begun, after.
            Some(r) if r.pushes_left.is_none() => {
                r.blocks.extend(named_blocks(&blocks));
                TailNext::Nothing
            }
            Some(_) => TailNext::WriteBack(named_blocks(&blocks)),
            None if self.done.get(&extent) == Some(&reign) && !blocks.is_empty() => {
                tracing::debug!(%from, %extent, "a late tail: its blocks are written back");
                TailNext::Late(named_blocks(&blocks))
            }
            None if reign > current => {
                // For a reign this node's map has not reached yet (one per sender
                // and extent).
                self.early.insert((extent, from), (reign, blocks));
                TailNext::Nothing
            }
            None => TailNext::Nothing,
        }
    }

    fn tail_arrived(&mut self, extent: ExtentId, from: NodeId, reign: Epoch, blocks: &BlockRuns) {
        let Some(run) = self.running.get_mut(&extent) else {
            return;
        };
        if run.reign != reign || !run.waiting.remove(&from) {
            return;
        }
        run.blocks.extend(named_blocks(blocks));
    }

    /// The blocks to write back for `extent` now, and when its run began: once
    /// every tail is in, and only once.
    pub(super) fn to_push(&self, extent: ExtentId) -> Option<(BTreeSet<u64>, u64)> {
        let run = self.running.get(&extent)?;
        (run.waiting.is_empty() && run.pushes_left.is_none())
            .then(|| (run.blocks.clone(), run.started_ns))
    }

    /// `blocks` blocks of `extent`, in `ops` write-backs, are being written
    /// back for the run begun at `since`.
    pub(super) fn pushing(&mut self, extent: ExtentId, ops: usize, blocks: u64, since: u64) {
        if ops > 0 {
            let batch = self.batch.get_or_insert((0, 0, since));
            batch.0 += 1;
            batch.1 += blocks;
            batch.2 = batch.2.min(since);
        }
        if let Some(run) = self.running.get_mut(&extent) {
            assert!(
                run.pushes_left.is_none() && run.waiting.is_empty(),
                "{extent} written back twice, or before every tail arrived"
            );
            run.pushes_left = Some(ops);
        }
    }

    /// `ops` more write-backs of `extent` began (a tail not waited for), of
    /// `blocks` blocks; with `counted`, its run waits for them too.
    pub(super) fn wrote_back(&mut self, extent: ExtentId, ops: usize, blocks: u64, counted: bool) {
        self.blocks_pushed += blocks;
        if !counted {
            return;
        }
        if let Some(Some(left)) = self.running.get_mut(&extent).map(|r| &mut r.pushes_left) {
            *left += ops;
        }
    }

    /// One write-back of `extent` finished (or was given up).
    pub(super) fn pushed(&mut self, extent: ExtentId) {
        if let Some(Some(left)) = self.running.get_mut(&extent).map(|r| &mut r.pushes_left) {
            *left = left.saturating_sub(1);
        }
    }

    /// If `extent`'s write-backs are all done: its reign is reconciled, its
    /// tail forgotten, and the batch reported once no run is left.
    pub(super) fn finish(&mut self, extent: ExtentId) -> Option<Finished> {
        if self.running.get(&extent)?.pushes_left != Some(0) {
            return None;
        }
        let run = self.running.remove(&extent).expect("checked");
        debug_assert!(run.waiting.is_empty(), "{extent} reconciled without a tail");
        self.done.insert(extent, run.reign);
        self.tails.remove(&extent);
        let batch = if self.running.is_empty() {
            self.batch.take()
        } else {
            None
        };
        Some(Finished { batch })
    }

    /// Write-back `op` waits for a device write to its blocks (or a buffer).
    pub(super) fn defer(&mut self, op: OpId) {
        self.deferred.push(op);
    }

    /// The write-backs that waited, to try again.
    pub(super) fn take_deferred(&mut self) -> Vec<OpId> {
        std::mem::take(&mut self.deferred)
    }

    /// In-sync replicas whose tail is overdue at `now` (`timeout` after their
    /// run began).
    pub(super) fn overdue(&self, now: u64, timeout: u64) -> Vec<(ExtentId, NodeId)> {
        self.running
            .iter()
            .filter(|(_, r)| now.saturating_sub(r.started_ns) >= timeout)
            .flat_map(|(&x, r)| r.waiting.iter().map(move |&n| (x, n)))
            .collect()
    }

    /// Check the bookkeeping; panics on a broken invariant:
    /// - a tail is never empty (an empty one is forgotten), keeps at most
    ///   [`TAIL_MAX`] writes, and each names at least one block;
    /// - a reconciliation in progress is for a reign not reconciled yet, and
    ///   writes back only once no tail is waited for;
    /// - a write-back waits for a device write once at most.
    pub(super) fn self_check(&self) {
        for (extent, tail) in &self.tails {
            assert!(!tail.is_empty(), "an empty tail of {extent} kept");
            assert!(
                tail.len() <= TAIL_MAX,
                "the tail of {extent} past its bound"
            );
            assert!(
                tail.values().all(|&(_, n)| n > 0),
                "a write of nothing in a tail"
            );
        }
        for (extent, run) in &self.running {
            assert_ne!(
                self.done.get(extent),
                Some(&run.reign),
                "{extent} reconciled twice"
            );
            assert!(
                run.pushes_left.is_none() || run.waiting.is_empty(),
                "{extent} written back before every tail arrived"
            );
        }
        let mut deferred = self.deferred.clone();
        deferred.sort_unstable();
        deferred.dedup();
        assert_eq!(
            deferred.len(),
            self.deferred.len(),
            "a write-back deferred twice"
        );
    }
}

impl Replicator {
    /// Take the reigns of `map` as already reconciled or seen (the map a node
    /// starts with: nothing was in flight before it).
    pub(super) fn reconcile_start_with(&mut self) {
        self.reconcile.start_with(&self.map, self.me);
    }

    /// Whether this primary has reconciled `extent`'s current reign.
    pub(super) fn reconciled(&self, extent: ExtentId) -> bool {
        let reign = self.map.extent(extent).primary_since;
        self.reconcile.reconciled(extent, reign)
    }

    /// The `settled` version this primary sends with a write of `extent`: every
    /// write up to it has been answered. 0 until its reign is reconciled.
    pub(super) fn settled(&self, extent: ExtentId) -> Version {
        if !self.reconciled(extent) {
            return Version::default();
        }
        let state = &self.primary[&extent];
        match state.unsettled.first() {
            Some(v) => Version(v.0 - 1),
            None => state.last_version,
        }
    }

    /// The version of the data block `lba` holds, if a write to it is still in
    /// the applied log (a write-back's is that of its data, not its own).
    pub(super) fn data_version(&self, lba: Lba) -> Option<Version> {
        self.applied.data_version(lba)
    }

    /// Whether a new write of `extent` keeps the window from the oldest unanswered
    /// write to the newest within [`TAIL_MAX`].
    pub(super) fn tail_has_room(&self, extent: ExtentId) -> bool {
        let state = &self.primary[&extent];
        state
            .unsettled
            .first()
            .is_none_or(|oldest| state.last_version.0 - oldest.0 + 1 < TAIL_MAX as u64)
    }

    /// After a map change: send this node's tail to each new primary of an extent
    /// it holds, and start (or go on with) reconciling each extent it now leads.
    pub(super) fn reconcile_after_map(&mut self) {
        let extents: Vec<(ExtentId, NodeId, Epoch, bool, bool, Vec<NodeId>)> = self
            .map
            .state()
            .extents
            .iter()
            .map(|(&id, e)| {
                let in_sync = e.in_sync.contains(&self.me);
                let holds = in_sync || e.rebuilding.contains(&self.me);
                let others = e
                    .in_sync
                    .iter()
                    .copied()
                    .filter(|n| *n != self.me)
                    .collect();
                (id, e.primary, e.primary_since, in_sync, holds, others)
            })
            .collect();
        let max = u64::from(self.map.volume().max_request_blocks);
        for (extent, primary, reign, in_sync, holds, others) in extents {
            if primary == self.me && in_sync {
                // A restarted node's replayed map still names it primary of
                // extents long failed over: their replicas follow newer reigns
                // and send it no tail, and asking to drop them for it (every
                // such extent, at once) would flood the control plane. It
                // leads once the fence is down and the epoch has moved on.
                if self.fenced_by_restart(extent) {
                    continue;
                }
                if self.reconcile.lead(extent, reign, &others, self.now_ns) {
                    self.push_when_ready(extent);
                }
                continue;
            }
            if let Some(blocks) = self.reconcile.follow(extent, (primary, reign), holds, max) {
                let tail = Message::ReconcileTail {
                    extent,
                    reign,
                    blocks,
                };
                self.send(primary, tail);
            }
        }
    }

    /// A replica's tail arrived.
    pub(super) fn reconcile_tail(
        &mut self,
        from: NodeId,
        extent: ExtentId,
        reign: Epoch,
        blocks: BlockRuns,
    ) {
        let in_extent = self.map.state().extents.contains_key(&extent)
            && blocks.len() <= TAIL_MAX
            && blocks.iter().all(|&(l, n)| {
                n > 0
                    && self
                        .map
                        .locate(self.map.volume().id, l, u64::from(n))
                        .is_ok_and(|x| x == extent)
            });
        if !self.map.nodes().contains(&from) || !in_extent {
            return tracing::warn!(%from, %extent, "tail from a non-member or outside the extent; dropped");
        }
        let current = self.map.extent(extent).primary_since;
        match self.reconcile.tail(from, extent, reign, blocks, current) {
            TailNext::Push => self.push_when_ready(extent),
            TailNext::WriteBack(blocks) => {
                let ops = self.write_back(extent, &blocks);
                self.reconcile
                    .wrote_back(extent, ops, blocks.len() as u64, true);
            }
            TailNext::Late(blocks) => {
                let ops = self.write_back(extent, &blocks);
                self.reconcile
                    .wrote_back(extent, ops, blocks.len() as u64, false);
            }
            TailNext::Nothing => {}
        }
    }

    /// Once every tail is in, write back every block named; once those are done,
    /// the reign is reconciled.
    fn push_when_ready(&mut self, extent: ExtentId) {
        if let Some((blocks, since)) = self.reconcile.to_push(extent) {
            let ops = self.write_back(extent, &blocks);
            let n = blocks.len() as u64;
            self.reconcile.wrote_back(extent, ops, n, false);
            self.reconcile.pushing(extent, ops, n, since);
        }
        self.finish_reconcile(extent);
    }

    /// Write this node's copy of `blocks` of `extent` back to every replica, in
    /// runs of one data version no longer than a request; returns the runs.
    fn write_back(&mut self, extent: ExtentId, blocks: &BTreeSet<u64>) -> usize {
        let max = u64::from(self.map.volume().max_request_blocks);
        let runs = runs_by(blocks.iter().map(|&b| (b, self.data_version(Lba(b)))), max);
        let count = runs.len();
        for (first, blocks, _) in runs {
            let lba = Lba(first);
            let op = self.op_id();
            let write_back = WriteBack {
                extent,
                lba,
                blocks,
            };
            self.ops.write_backs.insert(op, write_back);
            let lock = &mut self.primary_state(extent).lock;
            if lock.acquire(op, lba, lba.offset(blocks), Mode::Exclusive) {
                self.run_ready(vec![op]);
            }
        }
        count
    }

    fn finish_reconcile(&mut self, extent: ExtentId) {
        let Some(Finished { batch }) = self.reconcile.finish(extent) else {
            return;
        };
        self.claim_all();
        if let Some((extents, blocks, since)) = batch {
            let event = crate::events::Event::Reconciled {
                node: self.me,
                blocks,
                extents,
                took_ns: self.now_ns.saturating_sub(since),
            };
            self.actions.push_back(Action::Event(event));
        }
    }

    /// A write-back op starts: read this node's copy of the blocks, once no
    /// device write to them is in flight here (a write it took as a replica may
    /// still be on the device; one that fails is forgotten first).
    pub(super) fn start_reconcile_read(&mut self, op: OpId, lba: Lba, blocks: u64) {
        if self.writing_to(lba, blocks) {
            self.reconcile.defer(op);
            return;
        }
        let io = self.io(IoPurpose::Op(op));
        self.actions.push_back(Action::Io {
            io,
            cmd: IoCmd::Read { lba, blocks },
        });
    }

    /// Start the write-back reads no device write holds up any more.
    pub(super) fn retry_reconcile_reads(&mut self) {
        for op in self.reconcile.take_deferred() {
            if let Some(&WriteBack { lba, blocks, .. }) = self.ops.write_backs.get(&op) {
                self.start_reconcile_read(op, lba, blocks);
            }
        }
    }

    /// A write-back's read finished: write the data to every replica at a new
    /// version, as a client write would be.
    pub(super) fn reconcile_read_done(&mut self, op: OpId, result: IoResult) {
        let &WriteBack {
            extent,
            lba,
            blocks,
        } = &self.ops.write_backs[&op];
        if matches!(result, IoResult::Failed(WeirError::Busy)) {
            // No buffer to read into now: read again at the next tick.
            self.reconcile.defer(op);
            return;
        }
        self.ops.write_backs.remove(&op);
        match result {
            IoResult::Read(data) => {
                // The version of the data read: the oldest of its blocks' (a run
                // is cut where versions differ; one that changed since is rare,
                // and an older version only lets a retry apply again).
                let data_version = (lba.0..lba.0 + blocks)
                    .map(|b| self.data_version(Lba(b)).unwrap_or_default())
                    .min()
                    .unwrap_or_default();
                let origin = (self.me, RequestId(data_version.0));
                let write = WriteOp::new(origin, extent, lba, data, false);
                self.ops.writes.insert(op, write);
                self.start_write(op);
            }
            IoResult::Failed(e) => {
                // A media error (or a lost device): its copies may still disagree;
                // a later write to them settles it.
                tracing::warn!(%extent, %lba, blocks, error = %e, "reconcile read failed; blocks left as they are");
                self.reconcile_pushed(extent);
                self.unlock(extent, op);
            }
            IoResult::Done => unreachable!("a read answers with data"),
        }
    }

    /// One write-back of `extent` finished (or was given up).
    pub(super) fn reconcile_pushed(&mut self, extent: ExtentId) {
        self.reconcile.pushed(extent);
        self.finish_reconcile(extent);
    }

    /// Ask to drop in-sync replicas whose tail is overdue; read again for
    /// write-backs that found no buffer.
    pub(super) fn reconcile_tick(&mut self) {
        self.retry_reconcile_reads();
        let overdue = self
            .reconcile
            .overdue(self.now_ns, self.config.replica_timeout_ns);
        for (extent, node) in overdue {
            let epoch = self.map.extent(extent).epoch;
            self.ask_drop(extent, epoch, node, "sent no tail in time");
        }
    }

    /// Blocks written back by reconciliations so far.
    pub fn blocks_reconciled(&self) -> u64 {
        self.reconcile.blocks_pushed()
    }
}

/// The blocks a tail's runs name.
fn named_blocks(runs: &BlockRuns) -> BTreeSet<u64> {
    runs.iter()
        .flat_map(|&(l, n)| l.0..l.0 + u64::from(n))
        .collect()
}

#[cfg(test)]
mod tests;
