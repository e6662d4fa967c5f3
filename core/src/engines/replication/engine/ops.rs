//! The operations this node coordinates, in one table per kind: a write is
//! looked up among the writes and comes out as a [`WriteOp`], never as a value
//! of some other kind to be told apart. An op id is in one table at most; the
//! range locks and device commands name ops by id, and [`Ops::kind`] says which
//! table holds one.

use super::*;

/// A client write this node coordinates as the extent's primary (or a
/// reconciliation's write-back, with this node as its client).
#[derive(Debug)]
pub(super) struct WriteOp {
    pub(super) client: NodeId,
    pub(super) req: RequestId,
    pub(super) extent: ExtentId,
    pub(super) lba: Lba,
    pub(super) data: Bytes,
    pub(super) fua: bool,
    /// Given when the write starts.
    pub(super) version: Version,
    /// Acks expected from the replicas and the local device; `None` until the
    /// write holds its range lock and has been sent out.
    pub(super) acks: Option<Acks>,
    /// When it was sent out (the engine's clock).
    pub(super) started_ns: u64,
}

impl WriteOp {
    /// A write of `data` at `lba` for (`client`, `req`), not started yet.
    pub(super) fn new(
        (client, req): (NodeId, RequestId),
        extent: ExtentId,
        lba: Lba,
        data: Bytes,
        fua: bool,
    ) -> WriteOp {
        WriteOp {
            client,
            req,
            extent,
            lba,
            data,
            fua,
            version: Version::default(),
            acks: None,
            started_ns: 0,
        }
    }
}

/// A client read the primary serves under a shared range lock.
#[derive(Debug)]
pub(super) struct ReadOp {
    pub(super) client: NodeId,
    pub(super) req: RequestId,
    pub(super) extent: ExtentId,
    pub(super) lba: Lba,
    pub(super) blocks: u64,
}

/// A client flush, fanned out to every node that is up.
#[derive(Debug)]
pub(super) struct FlushOp {
    pub(super) client: NodeId,
    pub(super) req: RequestId,
    pub(super) acks: Acks,
}

/// A primary reading blocks for an in-sync replica's repair, under a shared
/// range lock until the answer is sent.
#[derive(Debug)]
pub(super) struct FetchOp {
    pub(super) to: NodeId,
    pub(super) remote: OpId,
    pub(super) extent: ExtentId,
    pub(super) lba: Lba,
    pub(super) blocks: u64,
}

/// A new primary writing back its copy of blocks an earlier primary's
/// unanswered write may have touched (see `reconcile`): read under an exclusive
/// range lock, then written like a client write from this node.
#[derive(Debug)]
pub(super) struct WriteBack {
    pub(super) extent: ExtentId,
    pub(super) lba: Lba,
    pub(super) blocks: u64,
}

/// Which table an op is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Write,
    Read,
    Flush,
    /// A media error being repaired from a peer (see `repair`).
    Repair,
    Fetch,
    /// A rebuild chunk, under a shared range lock from its probe until the
    /// replica acknowledges it.
    Rebuild,
    WriteBack,
}

/// Every op in flight, by kind.
#[derive(Debug, Default)]
pub(super) struct Ops {
    pub(super) writes: BTreeMap<OpId, WriteOp>,
    pub(super) reads: BTreeMap<OpId, ReadOp>,
    pub(super) flushes: BTreeMap<OpId, FlushOp>,
    pub(super) repairs: BTreeMap<OpId, repair::Repair>,
    pub(super) fetches: BTreeMap<OpId, FetchOp>,
    pub(super) chunks: BTreeMap<OpId, rebuild::Chunk>,
    pub(super) write_backs: BTreeMap<OpId, WriteBack>,
}

impl Ops {
    /// The table `op` is in, if it is in flight.
    pub(super) fn kind(&self, op: OpId) -> Option<Kind> {
        // In the order of how often each is asked for (client I/O first).
        let kind = if self.writes.contains_key(&op) {
            Kind::Write
        } else if self.reads.contains_key(&op) {
            Kind::Read
        } else if self.chunks.contains_key(&op) {
            Kind::Rebuild
        } else if self.flushes.contains_key(&op) {
            Kind::Flush
        } else if self.write_backs.contains_key(&op) {
            Kind::WriteBack
        } else if self.repairs.contains_key(&op) {
            Kind::Repair
        } else if self.fetches.contains_key(&op) {
            Kind::Fetch
        } else {
            return None;
        };
        Some(kind)
    }

    /// Ops in flight.
    pub(super) fn len(&self) -> usize {
        self.writes.len()
            + self.reads.len()
            + self.flushes.len()
            + self.repairs.len()
            + self.fetches.len()
            + self.chunks.len()
            + self.write_backs.len()
    }

    /// Whether `op` is in flight.
    pub(super) fn contains(&self, op: OpId) -> bool {
        self.kind(op).is_some()
    }

    fn ids(&self) -> impl Iterator<Item = Vec<OpId>> + '_ {
        fn keys<V>(m: &BTreeMap<OpId, V>) -> Vec<OpId> {
            m.keys().copied().collect()
        }
        [
            keys(&self.writes),
            keys(&self.reads),
            keys(&self.flushes),
            keys(&self.repairs),
            keys(&self.fetches),
            keys(&self.chunks),
            keys(&self.write_backs),
        ]
        .into_iter()
    }

    /// The ops holding (or waiting for) a range lock of `extent`.
    pub(super) fn of_extent(&self, extent: ExtentId) -> Vec<OpId> {
        fn of<V>(m: &BTreeMap<OpId, V>, extent: impl Fn(&V) -> bool) -> Vec<OpId> {
            m.iter()
                .filter(|(_, v)| extent(v))
                .map(|(&id, _)| id)
                .collect()
        }
        let mut ops = of(&self.writes, |w| w.extent == extent);
        ops.extend(of(&self.reads, |r| r.extent == extent));
        ops.extend(of(&self.fetches, |f| f.extent == extent));
        ops.extend(of(&self.chunks, |c| c.extent == extent));
        ops.extend(of(&self.write_backs, |w| w.extent == extent));
        ops.extend(of(&self.repairs, |r| r.locked && r.extent == extent));
        ops.sort_unstable();
        ops
    }

    /// Check the tables; panics on a broken invariant:
    /// - an op is in one table at most, and its id was handed out (`next_op`);
    /// - a write waits for acks only once it has its version;
    /// - a fan-out waits for somebody until it is answered.
    pub(super) fn self_check(&self, next_op: u64) {
        let mut all: Vec<OpId> = self.ids().flatten().collect();
        let len = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), len, "an op in two tables");
        if let Some(last) = all.last() {
            assert!(last.0 <= next_op, "{last} not handed out");
        }
        for (op, w) in &self.writes {
            assert!(
                w.acks.is_none() || w.version.0 > 0,
                "{op} waits for acks without a version"
            );
            if let Some(acks) = &w.acks {
                assert!(!acks.waiting.is_empty(), "{op} waits for nobody");
            }
        }
        for (op, f) in &self.flushes {
            assert!(!f.acks.waiting.is_empty(), "flush {op} waits for nobody");
        }
    }
}

/// The acknowledgements a fan-out still waits for, by sender, and the first error
/// among them. Only a node asked, and only once, can acknowledge: a stray or forged
/// ack is refused, never counted.
#[derive(Debug)]
pub(super) struct Acks {
    pub(super) waiting: Vec<NodeId>,
    /// Also asked but not waited for (rebuilding replicas): their acks are taken
    /// quietly and change nothing.
    pub(super) extra: Vec<NodeId>,
    pub(super) error: Option<WeirError>,
}

impl Acks {
    pub(super) fn new(waiting: Vec<NodeId>, extra: Vec<NodeId>) -> Self {
        assert!(!waiting.is_empty(), "a fan-out to nobody");
        Acks {
            waiting,
            extra,
            error: None,
        }
    }

    /// Stop waiting for nodes no longer in `keep` (a map change removed them from
    /// the in-sync set). `Some(outcome)` if nothing is left to wait for.
    pub(super) fn retain(
        &mut self,
        keep: impl Fn(NodeId) -> bool,
    ) -> Option<Result<(), WeirError>> {
        // A dropped replica may still answer late; its ack is then taken quietly.
        let (kept, dropped): (Vec<NodeId>, Vec<NodeId>) =
            self.waiting.iter().partition(|n| keep(**n));
        self.waiting = kept;
        self.extra.extend(dropped);
        self.waiting
            .is_empty()
            .then(|| self.error.take().map_or(Ok(()), Err))
    }

    /// Wait for `node` too, if it was asked as an extra and has not answered (a
    /// rebuilt replica joined the in-sync set while this fan-out ran).
    pub(super) fn promote(&mut self, node: NodeId) {
        if let Some(at) = self.extra.iter().position(|n| *n == node) {
            self.extra.swap_remove(at);
            self.waiting.push(node);
        }
    }

    /// Count `from`'s acknowledgement. `Err` if `from` was not asked (or already
    /// answered); `Ok(Some(outcome))` once the last is in.
    pub(super) fn record(
        &mut self,
        from: NodeId,
        result: Result<(), WeirError>,
    ) -> Result<Option<Result<(), WeirError>>, ()> {
        let Some(at) = self.waiting.iter().position(|n| *n == from) else {
            let extra = self.extra.iter().position(|n| *n == from).ok_or(())?;
            self.extra.swap_remove(extra);
            return Ok(None);
        };
        self.waiting.swap_remove(at);
        if let Err(e) = result {
            self.error.get_or_insert(e);
        }
        Ok(self
            .waiting
            .is_empty()
            .then(|| self.error.take().map_or(Ok(()), Err)))
    }

    /// [`Acks::record`], with a stray ack logged and dropped.
    pub(super) fn count(
        &mut self,
        from: NodeId,
        op: OpId,
        result: Result<(), WeirError>,
    ) -> Option<Result<(), WeirError>> {
        self.record(from, result).unwrap_or_else(|()| {
            tracing::warn!(%from, %op, "ack from a node not asked; dropped");
            None
        })
    }
}
