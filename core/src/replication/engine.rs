//! The replication state machine of one node.
//!
//! Events in: [`Replicator::handle_message`] (a decoded frame from a peer or client)
//! and [`Replicator::handle_io`] (a device completion). Actions out:
//! [`Replicator::poll_action`] yields frames to send and device commands to issue. No
//! I/O, no clock, no tasks: the async [`crate::node::Node`] driver does those.
//!
//! Write path at the primary: validate, take the extent's range lock (overlapping
//! writes queue in arrival order), give the write the extent's next version, write
//! locally and forward to every other replica in parallel, and acknowledge the client
//! only when every replica has reported the data on its device. Reads are served by
//! the primary under a shared range lock, so a read never overtakes an earlier
//! overlapping write. Flush fans out to every node holding a replica of the volume.
//!
//! A primary serves only while it holds a lease from the control plane (the driver
//! passes it in with the clock, [`Replicator::set_clock`]) and, after a failover,
//! only once the previous primary's lease has run out (`serve_after_ns` of the
//! extent). Both are checked when a request is admitted and again when it starts
//! (it may have queued behind others).
//!
//! With [`ReplicationConfig::audit`] on, the engine also reports what the simulator's
//! invariant checkers need ([`Audit`]): when it may serve each extent, each write it
//! acknowledged and each write its device completed.

use super::range_lock::{Mode, RangeLock};
pub use rebuild::{RebuildProgress, DEFAULT_REBUILD_BYTES_PER_SEC, REBUILD_CHUNK_BYTES};
pub use scrub::SCRUB_RUN_BYTES;

mod applied;
mod checkpoint;
mod rebuild;
mod reconcile;
mod repair;
mod scrub;
use crate::device::DevError;
use crate::error::WeirError;
use crate::ids::{Epoch, ExtentId, Lba, NodeId, OpId, RequestId, Version, VolumeId};
use crate::map::ClusterMap;
use crate::wire::Message;
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};

/// Most client operations a node holds at once (queued or running); more get `Busy`.
pub const MAX_OPS_IN_FLIGHT: usize = 4096;

/// Identifies one device command issued by the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IoId(pub u64);

/// A device command, in volume blocks; the driver maps it to the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoCmd {
    /// Read `blocks` blocks at `lba`.
    Read {
        /// First block.
        lba: Lba,
        /// Number of blocks.
        blocks: u64,
    },
    /// Write `data` at `lba`.
    Write {
        /// First block.
        lba: Lba,
        /// Whole blocks.
        data: Bytes,
        /// Force unit access.
        fua: bool,
    },
    /// Flush the device's volatile cache.
    Flush,
}

/// Outcome of an [`IoCmd`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoResult {
    /// A read's data.
    Read(Bytes),
    /// A write or flush finished.
    Done,
    /// The command failed: a device error, or no buffer to read into (`Busy`).
    Failed(WeirError),
}

/// Something the driver must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send `msg` to `to`.
    Send {
        /// Destination.
        to: NodeId,
        /// The message.
        msg: Message,
    },
    /// Issue a device command and report it back with [`Replicator::handle_io`].
    Io {
        /// Id to report the completion under.
        io: IoId,
        /// The command.
        cmd: IoCmd,
    },
    /// Ask the control plane to commit `command` (a primary dropping a replica that
    /// did not acknowledge in time).
    Control {
        /// The command.
        command: crate::control::Command,
    },
    /// A fact for the invariant checkers (only with [`ReplicationConfig::audit`]).
    Audit(Audit),
    /// Something worth a line in the node's event log (a rebuild finished).
    Event(String),
    /// Write down these block versions, durable now (see `checkpoint`): a full
    /// checkpoint replaces what was written before, a delta is appended to it.
    Checkpoint {
        /// Runs of blocks at one version; version 0: forgotten.
        runs: Vec<crate::replication::versions::VersionRun>,
        /// Whether this is every version the node holds.
        full: bool,
    },
}

/// What the engine did, for invariant checkers that see every node at once. Times
/// are the cluster clock (ns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Audit {
    /// This node may serve `extent` at `epoch` as its primary from `from_ns` until
    /// `until_ns` (its lease at that moment).
    Claim {
        /// The extent.
        extent: ExtentId,
        /// The map epoch it serves.
        epoch: Epoch,
        /// Start of the right to serve.
        from_ns: u64,
        /// End of the right to serve.
        until_ns: u64,
    },
    /// This primary acknowledged `version` of `[lba, lba + blocks)` to the client at
    /// `at_ns`, when the map's in-sync set of the extent was `in_sync`.
    Acked {
        /// The extent.
        extent: ExtentId,
        /// First block.
        lba: Lba,
        /// Blocks written.
        blocks: u64,
        /// The write's version.
        version: Version,
        /// When.
        at_ns: u64,
        /// Every replica that must hold it.
        in_sync: Vec<NodeId>,
    },
    /// This replica took a write of `extent` sent at `epoch`, when its own map was
    /// at `map_epoch`.
    Accepted {
        /// The extent.
        extent: ExtentId,
        /// The epoch the write carried.
        epoch: Epoch,
        /// This replica's epoch of the extent then.
        map_epoch: Epoch,
        /// When.
        at_ns: u64,
    },
    /// This primary's copy of `extent` to `node` finished: `bytes` copied from
    /// `started_ns` until `at_ns`, when the node joined the in-sync set.
    Rebuilt {
        /// The extent.
        extent: ExtentId,
        /// The replica rebuilt.
        node: NodeId,
        /// Bytes copied.
        bytes: u64,
        /// Bytes the primary holds that the replica already had (not sent).
        skipped: u64,
        /// When the copy began.
        started_ns: u64,
        /// When the replica was in sync again.
        at_ns: u64,
    },
    /// This node's device completed `version` of `[lba, lba + blocks)` at `at_ns`.
    Persisted {
        /// First block.
        lba: Lba,
        /// Blocks written.
        blocks: u64,
        /// The write's version.
        version: Version,
        /// When.
        at_ns: u64,
    },
}

impl Audit {
    /// The same fact with every time passed through `f` (a node's clock to the
    /// true time, for checkers that compare nodes).
    pub fn map_times(self, f: impl Fn(u64) -> u64) -> Audit {
        match self {
            Audit::Claim {
                extent,
                epoch,
                from_ns,
                until_ns,
            } => Audit::Claim {
                extent,
                epoch,
                from_ns: f(from_ns),
                until_ns: f(until_ns),
            },
            Audit::Acked {
                extent,
                lba,
                blocks,
                version,
                at_ns,
                in_sync,
            } => Audit::Acked {
                extent,
                lba,
                blocks,
                version,
                at_ns: f(at_ns),
                in_sync,
            },
            Audit::Accepted {
                extent,
                epoch,
                map_epoch,
                at_ns,
            } => Audit::Accepted {
                extent,
                epoch,
                map_epoch,
                at_ns: f(at_ns),
            },
            Audit::Rebuilt {
                extent,
                node,
                bytes,
                skipped,
                started_ns,
                at_ns,
            } => Audit::Rebuilt {
                extent,
                node,
                bytes,
                skipped,
                started_ns: f(started_ns),
                at_ns: f(at_ns),
            },
            Audit::Persisted {
                lba,
                blocks,
                version,
                at_ns,
            } => Audit::Persisted {
                lba,
                blocks,
                version,
                at_ns: f(at_ns),
            },
        }
    }
}

/// The default of [`ReplicationConfig::replica_timeout_ns`]: a write a replica
/// has not acknowledged for this long makes the primary ask the control plane to
/// drop that replica from the in-sync set.
pub const DEFAULT_REPLICA_TIMEOUT_NS: u64 = 100_000_000;

/// Engine switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicationConfig {
    /// TEST ONLY, a deliberate bug: the primary does not forward writes to the last
    /// replica of each extent and counts it as acknowledged. The simulator's checkers
    /// must catch this; it exists to prove that they can fail.
    pub bug_skip_last_replica: bool,
    /// TEST ONLY, a deliberate bug: the primary acknowledges a write as soon as all
    /// but the slowest in-sync replica have persisted it.
    pub bug_ack_before_slowest: bool,
    /// TEST ONLY, a deliberate bug: a new primary serves at once after a failover,
    /// without waiting for the old primary's lease to run out.
    pub bug_serve_before_lease: bool,
    /// TEST ONLY, a deliberate bug: a rebuild leaves out the extent's newest
    /// block, so the replica joins the in-sync set one version short.
    pub bug_rebuild_one_short: bool,
    /// TEST ONLY, a deliberate bug: a replica takes a write that carries an older
    /// epoch than its map's, trusting the sender's view (no epoch, primary or
    /// membership check).
    pub bug_accept_stale_epoch: bool,
    /// TEST ONLY, a deliberate bug: a primary serves until its lease's end as its
    /// own clock reads it, ignoring `lease_margin_ns` (safe only when every clock
    /// agrees).
    pub bug_ignore_lease_margin: bool,
    /// How long before its lease's end a primary stops serving, ns: the clocks'
    /// disagreement ([`crate::time::ClockBound::lease_margin_ns`]).
    pub lease_margin_ns: u64,
    /// A replica silent this long on a write, a repair or a reconciliation is
    /// asked to be dropped from the in-sync set, ns.
    pub replica_timeout_ns: u64,
    /// Report [`Audit`] facts (the simulator's invariant checkers use them).
    pub audit: bool,
    /// Rebuild bandwidth of one primary over all its rebuilds, bytes per second;
    /// 0 means [`DEFAULT_REBUILD_BYTES_PER_SEC`].
    pub rebuild_bytes_per_sec: u64,
    /// Background scrub rate of one node, bytes per second; 0: no scrubbing.
    pub scrub_bytes_per_sec: u64,
    /// How often a node checkpoints its block versions (a device flush, then
    /// [`Action::Checkpoint`]), ns; 0: never (a restarted node is then sent every
    /// block it has not been written since).
    pub checkpoint_every_ns: u64,
}

impl Default for ReplicationConfig {
    /// No bugs, no audit, default rates, and the lease margin of
    /// [`crate::time::ClockBound::DEFAULT`] for the default lease.
    fn default() -> Self {
        ReplicationConfig {
            bug_skip_last_replica: false,
            bug_ack_before_slowest: false,
            bug_serve_before_lease: false,
            bug_rebuild_one_short: false,
            bug_accept_stale_epoch: false,
            bug_ignore_lease_margin: false,
            lease_margin_ns: crate::time::ClockBound::DEFAULT
                .lease_margin_ns(crate::control::DEFAULT_LEASE_NS),
            replica_timeout_ns: DEFAULT_REPLICA_TIMEOUT_NS,
            audit: false,
            rebuild_bytes_per_sec: 0,
            scrub_bytes_per_sec: 0,
            checkpoint_every_ns: 0,
        }
    }
}

/// A client operation this node coordinates.
#[derive(Debug)]
enum Op {
    Write {
        client: NodeId,
        req: RequestId,
        extent: ExtentId,
        lba: Lba,
        data: Bytes,
        fua: bool,
        /// Given when the write starts.
        version: Version,
        /// Acks expected from the replicas and the local device; `None` until the
        /// write holds its range lock and has been sent out.
        acks: Option<Acks>,
        /// When it was sent out (the engine's clock).
        started_ns: u64,
    },
    Read {
        client: NodeId,
        req: RequestId,
        extent: ExtentId,
        lba: Lba,
        blocks: u64,
    },
    Flush {
        client: NodeId,
        req: RequestId,
        acks: Acks,
    },
    /// A media error being repaired from a peer (see `repair`).
    Repair(repair::Repair),
    /// A primary reading blocks for an in-sync replica's repair, under a shared
    /// range lock until the answer is sent.
    Fetch {
        to: NodeId,
        remote: OpId,
        extent: ExtentId,
        lba: Lba,
        blocks: u64,
    },
    /// A rebuild chunk, under a shared range lock from its probe until the replica
    /// acknowledges it.
    Rebuild(rebuild::Chunk),
    /// A new primary writing back its copy of blocks an earlier primary's
    /// unanswered write may have touched (see `reconcile`): read under an exclusive
    /// range lock, then written like a client write from this node.
    Reconcile {
        extent: ExtentId,
        lba: Lba,
        blocks: u64,
    },
}

impl Op {
    /// A write of `data` at `lba` for (`client`, `req`), not started yet.
    fn write(
        (client, req): (NodeId, RequestId),
        extent: ExtentId,
        lba: Lba,
        data: Bytes,
        fua: bool,
    ) -> Op {
        Op::Write {
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

/// The acknowledgements a fan-out still waits for, by sender, and the first error
/// among them. Only a node asked, and only once, can acknowledge: a stray or forged
/// ack is refused, never counted.
#[derive(Debug)]
struct Acks {
    waiting: Vec<NodeId>,
    /// Also asked but not waited for (rebuilding replicas): their acks are taken
    /// quietly and change nothing.
    extra: Vec<NodeId>,
    error: Option<WeirError>,
}

impl Acks {
    fn new(waiting: Vec<NodeId>, extra: Vec<NodeId>) -> Self {
        assert!(!waiting.is_empty(), "a fan-out to nobody");
        Acks {
            waiting,
            extra,
            error: None,
        }
    }

    /// Stop waiting for nodes no longer in `keep` (a map change removed them from
    /// the in-sync set). `Some(outcome)` if nothing is left to wait for.
    fn retain(&mut self, keep: impl Fn(NodeId) -> bool) -> Option<Result<(), WeirError>> {
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
    fn promote(&mut self, node: NodeId) {
        if let Some(at) = self.extra.iter().position(|n| *n == node) {
            self.extra.swap_remove(at);
            self.waiting.push(node);
        }
    }

    /// Count `from`'s acknowledgement. `Err` if `from` was not asked (or already
    /// answered); `Ok(Some(outcome))` once the last is in.
    fn record(
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
    fn count(
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

/// What a device command was for.
#[derive(Debug)]
enum IoPurpose {
    /// The primary's local write or read, or the coordinator's local flush.
    Op(OpId),
    /// A replica applying a primary's write.
    ReplicaWrite {
        primary: NodeId,
        op: OpId,
        lba: Lba,
        blocks: u64,
        version: Version,
    },
    /// A replica flushing for a coordinator.
    ReplicaFlush { coordinator: NodeId, op: OpId },
    /// A scrub read answered straight to the client.
    Scrub {
        client: NodeId,
        req: RequestId,
        extent: ExtentId,
        lba: Lba,
        blocks: u64,
    },
    /// An in-sync replica reading blocks for its primary's repair.
    Fetch { to: NodeId, op: OpId },
    /// The background scrubber reading a run of blocks this node holds.
    BackgroundScrub {
        extent: ExtentId,
        lba: Lba,
        blocks: u64,
    },
    /// A rebuilding replica writing part of a primary's copy.
    RebuildWrite { primary: NodeId, op: OpId },
    /// The flush of a block-version checkpoint.
    Checkpoint,
}

/// Per-extent state of the primary.
#[derive(Debug)]
struct PrimaryExtent {
    last_version: Version,
    lock: RangeLock,
    /// Versions of writes not yet answered (see `reconcile`).
    unsettled: std::collections::BTreeSet<Version>,
}

/// The replication engine of one node.
#[derive(Debug)]
pub struct Replicator {
    me: NodeId,
    map: ClusterMap,
    config: ReplicationConfig,
    primary: BTreeMap<ExtentId, PrimaryExtent>,
    /// Version of the last write applied to each block this node holds a replica of.
    block_versions: BTreeMap<Lba, Version>,
    /// Recently applied writes by client request, so a retry is not applied twice.
    applied: applied::AppliedWrites,
    ops: BTreeMap<OpId, Op>,
    ios: BTreeMap<IoId, IoPurpose>,
    next_op: u64,
    next_io: u64,
    actions: VecDeque<Action>,
    /// The cluster clock as of the last event, ns.
    now_ns: u64,
    /// End of this node's lease from the control plane (cluster clock, ns).
    lease_until_ns: u64,
    /// Drops asked for, and when: asked again after another replica timeout if the
    /// map has not changed (the request may have been lost with a leader).
    drops_asked: BTreeMap<(ExtentId, Epoch, NodeId), u64>,
    /// Rebuild work: as a primary, its copies out; as a replica, its copies in.
    rebuild: rebuild::RebuildState,
    /// The background scrubber.
    scrub: scrub::Scrubber,
    /// Block-version checkpoints.
    checkpoint: checkpoint::Checkpoints,
    /// The device answered `Gone`: what this node holds is lost, whatever its
    /// versions say (a rebuild's probe is refused).
    device_gone: bool,
    /// Device writes of this node, ordered per block: a write waits for any earlier
    /// one to overlapping blocks (a deposed primary's write still on the device and
    /// the new primary's must land in version order). Keyed by `IoId` as `OpId`.
    device_lock: RangeLock,
    /// Device writes in flight (issued, or waiting in `device_lock`), each with
    /// its first block and the version claimed for each of its blocks before it
    /// was issued (0: none).
    device_writes: BTreeMap<IoId, (Lba, Vec<Version>)>,
    deferred: BTreeMap<IoId, IoCmd>,
    /// After a restart: each extent's epoch in the map the node restarted with. It
    /// serves as a primary only at later epochs (of its versions from before it
    /// knows only lower bounds, from its checkpoints; the control plane's
    /// `Restarted` moves its extents on).
    restored: BTreeMap<ExtentId, Epoch>,
    /// After a restart: (extent, replica) seen in sync at an epoch after the
    /// restored one. Such a replica lacks only writes this node has seen since.
    seen_in_sync: std::collections::BTreeSet<(ExtentId, NodeId)>,
    /// Uncertain tails, and reconciliation when a primary takes over.
    reconcile: reconcile::Reconciler,
}

impl Replicator {
    /// The engine of node `me` under `map`.
    pub fn new(me: NodeId, map: ClusterMap, config: ReplicationConfig) -> Self {
        let mut engine = Replicator {
            me,
            map,
            config,
            primary: BTreeMap::new(),
            block_versions: BTreeMap::new(),
            applied: applied::AppliedWrites::default(),
            ops: BTreeMap::new(),
            ios: BTreeMap::new(),
            next_op: 0,
            next_io: 0,
            actions: VecDeque::new(),
            now_ns: 0,
            lease_until_ns: 0,
            drops_asked: BTreeMap::new(),
            rebuild: rebuild::RebuildState::default(),
            scrub: scrub::Scrubber::default(),
            checkpoint: checkpoint::Checkpoints::default(),
            device_gone: false,
            device_lock: RangeLock::default(),
            device_writes: BTreeMap::new(),
            deferred: BTreeMap::new(),
            restored: BTreeMap::new(),
            seen_in_sync: std::collections::BTreeSet::new(),
            reconcile: reconcile::Reconciler::default(),
        };
        engine.reconcile_start_with();
        engine
    }

    /// This node restarted with a map whose extents had these epochs: of the
    /// versions it gave and saw before, it knows only what its checkpoints hold
    /// ([`Replicator::restore_versions`]). It serves as a primary only at later
    /// epochs, numbers its writes above the first of them, and copies whole extents
    /// to replicas it has not seen in sync since.
    pub fn set_restored(&mut self, epochs: BTreeMap<ExtentId, Epoch>) {
        self.restored = epochs;
        self.note_in_sync();
    }

    /// Record the replicas in sync at epochs after the restored ones.
    fn note_in_sync(&mut self) {
        if self.restored.is_empty() {
            return;
        }
        for (&id, ext) in &self.map.state().extents {
            if self.restored.get(&id).is_none_or(|&e| ext.epoch > e) {
                self.seen_in_sync
                    .extend(ext.in_sync.iter().map(|&n| (id, n)));
            }
        }
    }

    /// Issue device write `io` once no earlier write to overlapping blocks is still
    /// on the device.
    fn write_device(&mut self, io: IoId, cmd: IoCmd) {
        let IoCmd::Write { lba, data, .. } = &cmd else {
            panic!("{io:?} is not a write");
        };
        let (lba, blocks) = (*lba, self.blocks_of(data));
        let versions = (lba.0..lba.0 + blocks)
            .map(|b| {
                self.block_versions
                    .get(&Lba(b))
                    .copied()
                    .unwrap_or_default()
            })
            .collect();
        self.device_writes.insert(io, (lba, versions));
        if self
            .device_lock
            .acquire(OpId(io.0), lba, lba.offset(blocks), Mode::Exclusive)
        {
            self.actions.push_back(Action::Io { io, cmd });
        } else {
            self.deferred.insert(io, cmd);
        }
    }

    /// Whether a device write to any of `[lba, lba + blocks)` is in flight here:
    /// its versions are claimed already, and a failed one forgets them.
    fn writing_to(&self, lba: Lba, blocks: u64) -> bool {
        self.device_writes
            .values()
            .any(|(l, vs)| l.0 < lba.0 + blocks && lba.0 < l.0 + vs.len() as u64)
    }

    /// The cluster clock reads `now_ns` and this node's lease runs until
    /// `lease_until_ns`. The driver calls this before every event.
    pub fn set_clock(&mut self, now_ns: u64, lease_until_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
        if lease_until_ns > self.lease_until_ns {
            self.lease_until_ns = lease_until_ns;
            self.claim_all();
        }
    }

    /// The time until which this node may serve, as a primary, under its lease.
    fn lease_end(&self) -> u64 {
        if self.config.bug_ignore_lease_margin {
            return self.lease_until_ns;
        }
        self.lease_until_ns
            .saturating_sub(self.config.lease_margin_ns)
    }

    /// The earliest time this node may serve `extent` as its primary.
    fn serve_from(&self, extent: ExtentId) -> u64 {
        if self.config.bug_serve_before_lease {
            return 0;
        }
        self.map.extent(extent).serve_after_ns
    }

    /// May this node serve `extent` now? (It is the primary: checked before.)
    fn may_serve(&self, extent: ExtentId) -> Result<(), WeirError> {
        let restarted_here = self
            .restored
            .get(&extent)
            .is_some_and(|&e| self.map.extent(extent).epoch <= e);
        if self.now_ns < self.lease_end()
            && self.now_ns >= self.serve_from(extent)
            && !restarted_here
            && self.reconciled(extent)
        {
            Ok(())
        } else {
            Err(WeirError::NoLease(self.me))
        }
    }

    /// Report, for the checkers, every extent this node may now serve, and until when.
    fn claim_all(&mut self) {
        if !self.config.audit {
            return;
        }
        let led: Vec<(ExtentId, Epoch)> = self
            .map
            .state()
            .extents
            .iter()
            .filter(|(_, e)| e.primary == self.me && e.in_sync.contains(&self.me))
            .map(|(&id, e)| (id, e.epoch))
            // Not at an epoch it may have served in before a restart.
            .filter(|(id, epoch)| self.restored.get(id).is_none_or(|r| epoch > r))
            .filter(|(id, _)| self.reconciled(*id))
            .collect();
        let until_ns = self.lease_end();
        for (extent, epoch) in led {
            let from_ns = self.now_ns.max(self.serve_from(extent));
            if from_ns < until_ns {
                self.actions.push_back(Action::Audit(Audit::Claim {
                    extent,
                    epoch,
                    from_ns,
                    until_ns,
                }));
            }
        }
    }

    fn audit(&mut self, fact: Audit) {
        if self.config.audit {
            self.actions.push_back(Action::Audit(fact));
        }
    }

    /// The driver's clock moved to `now_ns`: writes some in-sync replica has left
    /// unanswered for [`ReplicationConfig::replica_timeout_ns`] make this primary ask the control plane
    /// to drop that replica, after which the write is acknowledged without it.
    pub fn handle_tick(&mut self, now_ns: u64) {
        self.now_ns = self.now_ns.max(now_ns);
        self.expire_rebuild_chunks();
        self.expire_repairs();
        self.pump_rebuilds();
        self.scrub_tick();
        self.checkpoint_tick();
        self.reconcile_tick();
        let mut asks = Vec::new();
        for op in self.ops.values() {
            let Op::Write {
                extent,
                acks: Some(acks),
                started_ns,
                ..
            } = op
            else {
                continue;
            };
            if now_ns.saturating_sub(*started_ns) < self.config.replica_timeout_ns {
                continue;
            }
            let epoch = self.map.extent(*extent).epoch;
            for &node in acks.waiting.iter().filter(|n| **n != self.me) {
                asks.push((*extent, epoch, node));
            }
        }
        for (extent, epoch, node) in asks {
            self.ask_drop(extent, epoch, node, "silent past its timeout");
        }
    }

    /// Ask the control plane to drop `node` from `extent`'s in-sync set at `epoch`
    /// (again only after a replica timeout: the request may have been lost).
    fn ask_drop(&mut self, extent: ExtentId, epoch: Epoch, node: NodeId, why: &str) {
        let now_ns = self.now_ns;
        let last = self.drops_asked.get(&(extent, epoch, node)).copied();
        if last.is_none_or(|t| now_ns.saturating_sub(t) >= self.config.replica_timeout_ns) {
            self.drops_asked.insert((extent, epoch, node), now_ns);
            tracing::warn!(%extent, %node, why, "asking to drop a replica");
            let command = crate::control::Command::DropReplica {
                extent,
                epoch,
                node,
            };
            self.actions.push_back(Action::Control { command });
        }
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.me
    }

    /// Whole blocks in `data` (already checked to be a whole number of blocks).
    fn blocks_of(&self, data: &Bytes) -> u64 {
        (data.len() / self.map.volume().block_size as usize) as u64
    }

    /// Report [`Audit`] facts from now on.
    pub fn enable_audit(&mut self) {
        self.config.audit = true;
    }

    /// The cluster map this engine runs under.
    pub fn map(&self) -> &ClusterMap {
        &self.map
    }

    /// The next thing the driver must do, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Client operations in flight (queued or running).
    pub fn ops_in_flight(&self) -> usize {
        self.ops.len()
    }

    /// Device commands in flight.
    pub fn ios_in_flight(&self) -> usize {
        self.ios.len()
    }

    /// A message arrived from `from`.
    pub fn handle_message(&mut self, from: NodeId, msg: Message) {
        match msg {
            Message::Write {
                req,
                volume,
                epoch,
                lba,
                data,
                fua,
            } => self.client_write(from, req, volume, epoch, lba, data, fua),
            Message::Read {
                req,
                volume,
                epoch,
                lba,
                blocks,
            } => self.client_read(from, req, volume, epoch, lba, u64::from(blocks)),
            Message::Flush { req, volume } => self.client_flush(from, req, volume),
            Message::ScrubRead {
                req,
                volume,
                lba,
                blocks,
            } => self.scrub_read(from, req, volume, lba, u64::from(blocks)),
            Message::ReplicaWrite {
                op,
                extent,
                epoch,
                version,
                settled,
                origin,
                lba,
                data,
                fua,
            } => self.replica_write(
                from,
                op,
                extent,
                epoch,
                (version, settled),
                origin,
                lba,
                data,
                fua,
            ),
            Message::ReconcileTail {
                extent,
                reign,
                blocks,
            } => self.reconcile_tail(from, extent, reign, blocks),
            Message::ReplicaWriteAck { op, result } => self.write_acked(from, op, result),
            Message::ReplicaFlush { op } => {
                if !self.map.nodes().contains(&from) {
                    tracing::warn!(%from, "flush request from a non-member; dropped");
                    return;
                }
                let io = self.io(IoPurpose::ReplicaFlush {
                    coordinator: from,
                    op,
                });
                self.actions.push_back(Action::Io {
                    io,
                    cmd: IoCmd::Flush,
                });
            }
            Message::ReplicaFlushAck { op, result } => self.flush_acked(from, op, result),
            Message::RebuildWrite { op, copy } => self.rebuild_write(from, op, copy),
            Message::RebuildAck { op, result } => self.rebuild_acked(from, op, result),
            Message::RebuildProbe { op, copy } => self.rebuild_probe(from, op, copy),
            Message::RebuildProbeOk { op, result } => self.rebuild_probed(from, op, result),
            Message::FetchBlocks {
                op,
                extent,
                epoch,
                lba,
                blocks,
            } => {
                if !self.map.nodes().contains(&from) {
                    return tracing::warn!(%from, "fetch from a non-member; dropped");
                }
                self.fetch_blocks(from, op, extent, epoch, lba, blocks)
            }
            Message::FetchBlocksOk { op, result } => self.fetched(from, op, result),
            Message::GetMap { req } => {
                let state = crate::control::plane::encode_state(self.map.state());
                self.send(from, Message::MapState { req, state });
            }
            Message::ReadOk { .. }
            | Message::WriteOk { .. }
            | Message::FlushOk { .. }
            | Message::Failed { .. }
            | Message::MapState { .. } => {
                tracing::warn!(%from, "client reply sent to a storage node; dropped");
            }
            Message::Raft { .. }
            | Message::Heartbeat { .. }
            | Message::HeartbeatAck { .. }
            | Message::Propose { .. } => {
                tracing::warn!(%from, "control-plane message reached the data path; dropped");
            }
        }
    }

    /// A device command finished.
    pub fn handle_io(&mut self, io: IoId, result: IoResult) {
        let purpose = self
            .ios
            .remove(&io)
            .unwrap_or_else(|| panic!("completion for unknown io {io:?}"));
        if matches!(result, IoResult::Failed(WeirError::Device(DevError::Gone))) {
            self.device_gone = true;
        }
        let write = self.device_writes.remove(&io);
        let was_write = write.is_some();
        if let Some((lba, versions)) = write {
            self.device_write_done(lba, versions, !matches!(result, IoResult::Failed(_)));
            for next in self.device_lock.release(OpId(io.0)) {
                let cmd = self
                    .deferred
                    .remove(&IoId(next.0))
                    .expect("a deferred write");
                self.actions.push_back(Action::Io {
                    io: IoId(next.0),
                    cmd,
                });
            }
        }
        match purpose {
            IoPurpose::Op(op) => self.local_io_done(op, result),
            IoPurpose::ReplicaWrite {
                primary,
                op,
                lba,
                blocks,
                version,
            } => {
                // A failed write's versions are forgotten by now (see
                // `device_write_done`), so a rebuild's probe asks for its blocks.
                let result = io_unit(result);
                if result.is_ok() {
                    let at_ns = self.now_ns;
                    self.audit(Audit::Persisted {
                        lba,
                        blocks,
                        version,
                        at_ns,
                    });
                }
                self.send(primary, Message::ReplicaWriteAck { op, result });
            }
            IoPurpose::RebuildWrite { primary, op } => self.rebuild_io_done(primary, op, result),
            IoPurpose::ReplicaFlush { coordinator, op } => {
                let result = io_unit(result);
                self.send(coordinator, Message::ReplicaFlushAck { op, result });
            }
            IoPurpose::Scrub {
                client,
                req,
                extent,
                lba,
                blocks,
            } => {
                if let IoResult::Failed(e @ WeirError::Device(DevError::Media(_))) = &result {
                    self.start_repair(extent, lba, blocks, e.clone());
                }
                self.reply_read(client, req, result)
            }
            IoPurpose::Fetch { to, op } => {
                let result = io_data(result);
                self.send(to, Message::FetchBlocksOk { op, result });
            }
            IoPurpose::BackgroundScrub {
                extent,
                lba,
                blocks,
            } => self.scrub_done(extent, lba, blocks, result),
            IoPurpose::Checkpoint => self.checkpoint_flushed(io, result),
        }
        if was_write {
            // A rebuild's answer, or a write-back's read, may have waited for it.
            self.answer_rebuilds();
            self.retry_reconcile_reads();
        }
    }

    // ---- client requests at the primary -------------------------------------------

    /// Validate a data-path request aimed at the primary of its extent.
    fn check_primary(
        &self,
        volume: VolumeId,
        epoch: Epoch,
        lba: Lba,
        blocks: u64,
    ) -> Result<ExtentId, WeirError> {
        let extent = self.map.locate(volume, lba, blocks)?;
        let placement = self.map.extent(extent);
        if placement.primary != self.me || !placement.in_sync.contains(&self.me) {
            return Err(WeirError::NotPrimary(self.me));
        }
        // A client's older map is no harm if it is from this primary's reign
        // (this map, and the lease, are what make it the primary; a replica
        // dropped or rebuilt moves the epoch without moving the primary, and
        // should not cost every client a retry). One from before the reign may
        // be a request delayed past writes acknowledged since, and is refused; a
        // newer one means this node's map lags: it may have been deposed since.
        if epoch > placement.epoch || epoch < placement.primary_since {
            return Err(WeirError::StaleEpoch {
                got: epoch,
                current: placement.epoch,
            });
        }
        self.may_serve(extent)?;
        if self.ops.len() >= MAX_OPS_IN_FLIGHT {
            return Err(WeirError::Busy);
        }
        Ok(extent)
    }

    #[allow(clippy::too_many_arguments)]
    fn client_write(
        &mut self,
        client: NodeId,
        req: RequestId,
        volume: VolumeId,
        epoch: Epoch,
        lba: Lba,
        data: Bytes,
        fua: bool,
    ) {
        let checked = self
            .map
            .blocks_in(data.len())
            .and_then(|blocks| Ok((blocks, self.check_primary(volume, epoch, lba, blocks)?)));
        let (blocks, extent) = match checked {
            Ok(ok) => ok,
            Err(e) => return self.fail(client, req, e),
        };
        let op = self.op_id();
        self.ops
            .insert(op, Op::write((client, req), extent, lba, data, fua));
        let lock = &mut self.primary_state(extent).lock;
        if lock.acquire(op, lba, lba.offset(blocks), Mode::Exclusive) {
            self.run_ready(vec![op]);
        }
    }

    fn client_read(
        &mut self,
        client: NodeId,
        req: RequestId,
        volume: VolumeId,
        epoch: Epoch,
        lba: Lba,
        blocks: u64,
    ) {
        let extent = match self.check_primary(volume, epoch, lba, blocks) {
            Ok(extent) => extent,
            Err(e) => return self.fail(client, req, e),
        };
        let op = self.op_id();
        self.ops.insert(
            op,
            Op::Read {
                client,
                req,
                extent,
                lba,
                blocks,
            },
        );
        let lock = &mut self.primary_state(extent).lock;
        if lock.acquire(op, lba, lba.offset(blocks), Mode::Shared) {
            self.run_ready(vec![op]);
        }
    }

    fn client_flush(&mut self, client: NodeId, req: RequestId, volume: VolumeId) {
        if volume != self.map.volume().id {
            return self.fail(client, req, WeirError::UnknownVolume(volume));
        }
        if self.ops.len() >= MAX_OPS_IN_FLIGHT {
            return self.fail(client, req, WeirError::Busy);
        }
        let op = self.op_id();
        // Every node holds replicas of the one volume, so a flush reaches every node
        // that is up.
        let nodes = self.map.state().up_nodes();
        self.ops.insert(
            op,
            Op::Flush {
                client,
                req,
                acks: Acks::new(nodes.clone(), Vec::new()),
            },
        );
        for node in nodes {
            if node == self.me {
                let io = self.io(IoPurpose::Op(op));
                self.actions.push_back(Action::Io {
                    io,
                    cmd: IoCmd::Flush,
                });
            } else {
                self.send(node, Message::ReplicaFlush { op });
            }
        }
    }

    fn scrub_read(
        &mut self,
        client: NodeId,
        req: RequestId,
        volume: VolumeId,
        lba: Lba,
        blocks: u64,
    ) {
        let extent = match self.map.locate(volume, lba, blocks) {
            Ok(extent) => extent,
            Err(e) => return self.fail(client, req, e),
        };
        if !self.map.extent(extent).replicas.contains(&self.me) {
            return self.fail(client, req, WeirError::NotPrimary(self.me));
        }
        if self.ios.len() >= MAX_OPS_IN_FLIGHT {
            return self.fail(client, req, WeirError::Busy);
        }
        let io = self.io(IoPurpose::Scrub {
            client,
            req,
            extent,
            lba,
            blocks,
        });
        self.actions.push_back(Action::Io {
            io,
            cmd: IoCmd::Read { lba, blocks },
        });
    }

    /// Start `ready` ops (they hold their range locks), and any that become ready
    /// because one of them failed its lease check and let go of its lock.
    fn run_ready(&mut self, ready: Vec<OpId>) {
        let mut ready = VecDeque::from(ready);
        while let Some(op) = ready.pop_front() {
            ready.extend(self.start(op));
        }
    }

    /// `op` holds its range lock: issue its I/O, unless the lease ran out while it
    /// queued; then fail it and return the ops its lock release makes ready.
    fn start(&mut self, op: OpId) -> Vec<OpId> {
        let extent = match self.ops.get(&op) {
            Some(Op::Write { extent, .. } | Op::Read { extent, .. }) => *extent,
            Some(Op::Rebuild(_)) => {
                // A copy reads the primary's own data for a replica that checks the
                // epoch itself: no lease needed. First the replica is asked which
                // blocks it lacks.
                return self.probe_chunk(op);
            }
            Some(Op::Repair(_)) => {
                self.ask_next_peer(op);
                return Vec::new();
            }
            Some(&Op::Fetch { lba, blocks, .. }) => {
                let io = self.io(IoPurpose::Op(op));
                let cmd = IoCmd::Read { lba, blocks };
                self.actions.push_back(Action::Io { io, cmd });
                return Vec::new();
            }
            Some(&Op::Reconcile { lba, blocks, .. }) => {
                self.start_reconcile_read(op, lba, blocks);
                return Vec::new();
            }
            Some(Op::Flush { .. }) => panic!("{op} cannot be started"),
            None => return Vec::new(),
        };
        let refused = self.may_serve(extent).and_then(|()| {
            // A write may not widen the replicas' uncertain tails past what they
            // keep (see `reconcile`): it waits for the oldest to be answered.
            match self.ops.get(&op) {
                Some(Op::Write { .. }) if !self.tail_has_room(extent) => Err(WeirError::Busy),
                _ => Ok(()),
            }
        });
        if let Err(e) = refused {
            let Some(Op::Write { client, req, .. } | Op::Read { client, req, .. }) =
                self.ops.remove(&op)
            else {
                unreachable!("matched above");
            };
            self.fail(client, req, e);
            return self.release(extent, op);
        }
        match self.ops.get(&op) {
            Some(&Op::Write {
                client, req, lba, ..
            }) if self.superseded(client, req, lba) => {
                // Answered as done: it took effect before the writes that
                // overwrote it (see `applied`). It holds the range lock, so none of
                // those is still in flight here.
                self.ops.remove(&op);
                self.reply(client, req, Ok(Message::WriteOk { req }));
                return self.release(extent, op);
            }
            Some(Op::Write { .. }) => self.start_write(op),
            Some(Op::Read { lba, blocks, .. }) => {
                let cmd = IoCmd::Read {
                    lba: *lba,
                    blocks: *blocks,
                };
                let io = self.io(IoPurpose::Op(op));
                self.actions.push_back(Action::Io { io, cmd });
            }
            _ => unreachable!("matched above"),
        }
        Vec::new()
    }

    fn start_write(&mut self, op: OpId) {
        let now_ns = self.now_ns;
        let Some(Op::Write {
            client,
            req,
            extent,
            lba,
            data,
            fua,
            acks,
            started_ns,
            ..
        }) = self.ops.get_mut(&op)
        else {
            panic!("{op} is not a write");
        };
        assert!(acks.is_none(), "{op} started twice");
        *started_ns = now_ns;
        let (client, req, extent, lba, data, fua) =
            (*client, *req, *extent, *lba, data.clone(), *fua);
        let state = self
            .primary
            .get_mut(&extent)
            .expect("locked extent has state");
        let version = state.last_version.next();
        state.last_version = version;
        state.unsettled.insert(version);
        let settled = self.settled(extent);
        if let Some(Op::Write { version: v, .. }) = self.ops.get_mut(&op) {
            *v = version;
        }
        let placement = self.map.extent(extent).clone();
        // Every in-sync and rebuilding replica gets the write; the client's ack
        // waits for the in-sync ones only (rebuilding replicas are not counted on).
        let mut forward: Vec<NodeId> = placement
            .replicas
            .iter()
            .copied()
            .filter(|n| {
                *n != self.me && (placement.in_sync.contains(n) || placement.rebuilding.contains(n))
            })
            .collect();
        if self.config.bug_skip_last_replica {
            forward.pop();
        }
        if let Some(Op::Write { acks, .. }) = self.ops.get_mut(&op) {
            let mut expect: Vec<NodeId> = forward
                .iter()
                .copied()
                .filter(|n| placement.in_sync.contains(n))
                .collect();
            expect.push(self.me);
            let extra = forward
                .iter()
                .copied()
                .filter(|n| !expect.contains(n))
                .collect();
            *acks = Some(Acks::new(expect, extra));
        }
        // A rebuilt replica about to join is waited for like an in-sync one.
        let joining = self.joining(extent);
        if let Some(Op::Write {
            acks: Some(acks), ..
        }) = self.ops.get_mut(&op)
        {
            for node in joining {
                acks.promote(node);
            }
            for &node in &acks.extra {
                self.rebuild
                    .unacked
                    .entry(node)
                    .or_default()
                    .insert(op, extent);
            }
        }
        let blocks = self.blocks_of(&data);
        if let Err(e) = self.claim_version(lba, blocks, version) {
            // The primary gives out versions in order under the lock; a regression
            // here means its own state is corrupt.
            panic!("primary {} version regression at {lba}: {e}", self.me);
        }
        // A write-back carries the version of its data as its request id.
        let internal = client == self.me;
        self.note_renumbered(lba, blocks, internal.then_some(Version(req.0)));
        if !internal {
            // Should this node be deposed, the new primary learns of it.
            self.note_tail(extent, version, lba, blocks, settled);
        }
        if client != self.me {
            let write = applied::Applied {
                lba,
                blocks,
                version,
            };
            self.applied.note((client, req), write, now_ns);
        }
        let io = self.io(IoPurpose::Op(op));
        self.write_device(
            io,
            IoCmd::Write {
                lba,
                data: data.clone(),
                fua,
            },
        );
        for to in forward {
            let msg = Message::ReplicaWrite {
                op,
                extent,
                epoch: placement.epoch,
                version,
                settled,
                origin: (client, req),
                lba,
                data: data.clone(),
                fua,
            };
            self.send(to, msg);
        }
    }

    fn local_io_done(&mut self, op: OpId, result: IoResult) {
        match self.ops.get(&op) {
            Some(Op::Write {
                lba, data, version, ..
            }) => {
                let result = io_unit(result);
                if result.is_ok() {
                    let fact = Audit::Persisted {
                        lba: *lba,
                        blocks: self.blocks_of(data),
                        version: *version,
                        at_ns: self.now_ns,
                    };
                    self.audit(fact);
                }
                self.write_acked(self.me, op, result)
            }
            Some(Op::Flush { .. }) => self.flush_acked(self.me, op, io_unit(result)),
            Some(Op::Read { .. }) => {
                if let IoResult::Failed(e @ WeirError::Device(DevError::Media(_))) = &result {
                    return self.repair_read(op, e.clone());
                }
                let Some(Op::Read {
                    client,
                    req,
                    extent,
                    ..
                }) = self.ops.remove(&op)
                else {
                    unreachable!("matched a read above");
                };
                self.reply_read(client, req, result);
                self.unlock(extent, op);
            }
            Some(Op::Rebuild(_)) => self.rebuild_read_done(op, result),
            Some(Op::Repair(_)) => self.repair_written(op, result),
            Some(Op::Fetch { .. }) => self.fetch_read_done(op, result),
            Some(Op::Reconcile { .. }) => self.reconcile_read_done(op, result),
            // The op was failed by a map change while its I/O ran.
            None => tracing::debug!(%op, "completion for an op already failed"),
        }
    }

    /// One replica (or the local device) reported on write `op`.
    fn write_acked(&mut self, from: NodeId, op: OpId, result: Result<(), WeirError>) {
        if self.rebuild_replica_acked(from, op, result.is_err()) && !self.ops.contains_key(&op) {
            return; // A rebuilding replica's late ack of a finished write.
        }
        let Some(Op::Write {
            acks: Some(acks),
            extent,
            ..
        }) = self.ops.get_mut(&op)
        else {
            tracing::warn!(%from, %op, "ack for no running write; dropped");
            return;
        };
        if from != self.me
            && matches!(result, Err(WeirError::Device(_)))
            && acks.waiting.contains(&from)
        {
            // A replica whose device failed the write (or is gone) does not fail
            // it for the client: like a silent one, it is dropped from the in-sync
            // set, and the write is acknowledged without it (it rebuilds later).
            let (extent, epoch) = (*extent, self.map.extent(*extent).epoch);
            return self.ask_drop(extent, epoch, from, "its device failed a write");
        }
        if let Some(outcome) = acks.count(from, op, result) {
            return self.finish_write(op, outcome);
        }
        if self.config.bug_ack_before_slowest && acks.waiting.len() == 1 && acks.error.is_none() {
            if let Some(outcome) = acks.retain(|_| false) {
                self.finish_write(op, outcome);
            }
        }
    }

    /// Every in-sync replica has answered write `op`: reply and release its range.
    fn finish_write(&mut self, op: OpId, outcome: Result<(), WeirError>) {
        let Some(Op::Write {
            client,
            req,
            extent,
            lba,
            data,
            version,
            ..
        }) = self.ops.remove(&op)
        else {
            unreachable!("matched a write above");
        };
        if outcome.is_ok() {
            let placement = self.map.extent(extent);
            let fact = Audit::Acked {
                extent,
                lba,
                blocks: self.blocks_of(&data),
                version,
                at_ns: self.now_ns,
                in_sync: placement.in_sync.iter().copied().collect(),
            };
            self.audit(fact);
        }
        if let Some(state) = self.primary.get_mut(&extent) {
            state.unsettled.remove(&version);
        }
        if client == self.me {
            // A reconciliation's write-back.
            self.reconcile_pushed(extent);
        } else {
            self.reply(client, req, outcome.map(|()| Message::WriteOk { req }));
        }
        self.unlock(extent, op);
    }

    fn flush_acked(&mut self, from: NodeId, op: OpId, result: Result<(), WeirError>) {
        let Some(Op::Flush { acks, .. }) = self.ops.get_mut(&op) else {
            tracing::warn!(%from, %op, "ack for no running flush; dropped");
            return;
        };
        let Some(outcome) = acks.count(from, op, result) else {
            return;
        };
        let Some(Op::Flush { client, req, .. }) = self.ops.remove(&op) else {
            unreachable!("matched a flush above");
        };
        self.reply(client, req, outcome.map(|()| Message::FlushOk { req }));
    }

    /// The primary state of `extent`, created on first use. A node that becomes
    /// primary (at start, or by failover) numbers its writes above the extent's
    /// epoch floor and above the highest version it holds, so versions never go
    /// back.
    fn primary_state(&mut self, extent: ExtentId) -> &mut PrimaryExtent {
        if !self.primary.contains_key(&extent) {
            let start = Lba(extent.0 * self.map.volume().extent_blocks);
            let end = self.map.extent_end(extent);
            let mut epoch = self.map.extent(extent).epoch;
            if let Some(&restored) = self.restored.get(&extent) {
                epoch = epoch.max(restored.next());
            }
            let floor = Version::epoch_floor(epoch);
            let last_version = self
                .block_versions
                .range(start..end)
                .map(|(_, &v)| v)
                .max()
                .unwrap_or_default()
                .max(floor);
            let state = PrimaryExtent {
                last_version,
                lock: RangeLock::default(),
                unsettled: Default::default(),
            };
            self.primary.insert(extent, state);
        }
        self.primary.get_mut(&extent).expect("inserted above")
    }

    // ---- map changes ---------------------------------------------------------------

    /// The control plane published a newer map. Extents this node no longer leads
    /// fail their operations (clients retry with the new map); extents it still
    /// leads stop waiting for replicas that left the in-sync set, which is when a
    /// write held up by a silent replica may be acknowledged.
    pub fn handle_map(&mut self, map: ClusterMap) {
        self.map = map;
        self.note_in_sync();
        self.claim_all();
        // A flush waits only for nodes still up.
        let up = self.map.state().up_nodes();
        let flushes: Vec<OpId> = self
            .ops
            .iter()
            .filter(|(_, o)| matches!(o, Op::Flush { .. }))
            .map(|(&id, _)| id)
            .collect();
        for op in flushes {
            let Some(Op::Flush { acks, .. }) = self.ops.get_mut(&op) else {
                continue;
            };
            if let Some(outcome) = acks.retain(|n| up.contains(&n)) {
                let Some(Op::Flush { client, req, .. }) = self.ops.remove(&op) else {
                    unreachable!("matched a flush above");
                };
                self.reply(client, req, outcome.map(|()| Message::FlushOk { req }));
            }
        }
        let led: Vec<ExtentId> = self.primary.keys().copied().collect();
        for extent in led {
            let now = self.map.extent(extent);
            if now.primary != self.me || !now.in_sync.contains(&self.me) {
                self.abandon(extent, WeirError::NotPrimary(self.me));
                continue;
            }
            let mut in_sync = now.in_sync.clone();
            let joined = in_sync.clone();
            in_sync.extend(self.joining(extent));
            let writes: Vec<OpId> = self
                .ops
                .iter()
                .filter(|(_, o)| matches!(o, Op::Write { extent: e, acks: Some(_), .. } if *e == extent))
                .map(|(&id, _)| id)
                .collect();
            for op in writes {
                let Some(Op::Write {
                    acks: Some(acks), ..
                }) = self.ops.get_mut(&op)
                else {
                    continue;
                };
                // A replica that joined the in-sync set while this write ran is
                // waited for too, unless it already answered.
                for &node in &joined {
                    acks.promote(node);
                }
                if let Some(outcome) = acks.retain(|n| in_sync.contains(&n)) {
                    self.finish_write(op, outcome);
                }
            }
        }
        self.rebuilds_after_map();
        self.reconcile_after_map();
    }

    /// Fail every operation of `extent` and forget its primary state.
    fn abandon(&mut self, extent: ExtentId, error: WeirError) {
        let ops: Vec<OpId> = self
            .ops
            .iter()
            .filter(|(_, o)| match o {
                Op::Write { extent: e, .. }
                | Op::Read { extent: e, .. }
                | Op::Fetch { extent: e, .. }
                | Op::Rebuild(rebuild::Chunk { extent: e, .. })
                | Op::Reconcile { extent: e, .. } => *e == extent,
                Op::Repair(r) => r.locked && r.extent == extent,
                Op::Flush { .. } => false,
            })
            .map(|(&id, _)| id)
            .collect();
        for op in ops {
            match self.ops.remove(&op) {
                Some(Op::Write { client, req, .. } | Op::Read { client, req, .. }) => {
                    self.fail(client, req, error.clone())
                }
                Some(Op::Repair(r)) => {
                    if let Some((client, req)) = r.waiter {
                        self.fail(client, req, error.clone());
                    }
                }
                // The new primary rebuilds afresh; an asking replica asks it.
                Some(Op::Rebuild(_) | Op::Fetch { .. } | Op::Reconcile { .. }) => {}
                _ => unreachable!("selected above"),
            }
        }
        self.primary.remove(&extent);
    }

    fn unlock(&mut self, extent: ExtentId, op: OpId) {
        let ready = self.release(extent, op);
        self.run_ready(ready);
    }

    /// Release `op`'s range lock; returns the ops that now hold theirs.
    fn release(&mut self, extent: ExtentId, op: OpId) -> Vec<OpId> {
        let state = self
            .primary
            .get_mut(&extent)
            .expect("locked extent has state");
        let ready = state.lock.release(op);
        debug_assert!({
            state.lock.self_check();
            true
        });
        ready
    }

    // ---- replica side --------------------------------------------------------------

    #[allow(clippy::too_many_arguments)]
    fn replica_write(
        &mut self,
        primary: NodeId,
        op: OpId,
        extent: ExtentId,
        epoch: Epoch,
        (version, settled): (Version, Version),
        origin: (NodeId, RequestId),
        lba: Lba,
        data: Bytes,
        fua: bool,
    ) {
        let checked = self.check_replica_write(primary, extent, epoch, lba, &data);
        let result = checked.and_then(|blocks| self.claim_version(lba, blocks, version));
        if let Err(e) = result {
            return self.send(primary, Message::ReplicaWriteAck { op, result: Err(e) });
        }
        let blocks = self.blocks_of(&data);
        self.note_tail(extent, version, lba, blocks, settled);
        // A primary's write-back names itself as the client, and the version of
        // its data as the request.
        let internal = origin.0 == primary;
        self.note_renumbered(lba, blocks, internal.then_some(Version(origin.1 .0)));
        if !internal {
            let write = applied::Applied {
                lba,
                blocks,
                version,
            };
            self.applied.note(origin, write, self.now_ns);
        }
        let fact = Audit::Accepted {
            extent,
            epoch,
            map_epoch: self.map.extent(extent).epoch,
            at_ns: self.now_ns,
        };
        self.audit(fact);
        let blocks = self.blocks_of(&data);
        let io = self.io(IoPurpose::ReplicaWrite {
            primary,
            op,
            lba,
            blocks,
            version,
        });
        self.write_device(io, IoCmd::Write { lba, data, fua });
    }

    fn check_replica_write(
        &self,
        primary: NodeId,
        extent: ExtentId,
        epoch: Epoch,
        lba: Lba,
        data: &Bytes,
    ) -> Result<u64, WeirError> {
        let blocks = self.blocks_in_extent(extent, lba, data.len())?;
        if self.config.bug_accept_stale_epoch && epoch < self.map.extent(extent).epoch {
            return Ok(blocks);
        }
        self.check_sender(primary, extent, epoch, true, |p, me| {
            p.in_sync.contains(&me) || p.rebuilding.contains(&me)
        })?;
        Ok(blocks)
    }

    /// The blocks of a `len`-byte request at `lba`, which must lie in `extent`.
    fn blocks_in_extent(&self, extent: ExtentId, lba: Lba, len: usize) -> Result<u64, WeirError> {
        let blocks = self.map.blocks_in(len)?;
        if self.map.locate(self.map.volume().id, lba, blocks)? != extent {
            return Err(WeirError::CrossesExtent);
        }
        Ok(blocks)
    }

    /// Is `primary`, sending at `epoch`, the primary of `extent` to this node, and
    /// does `role` say this node takes its writes? The epoch must be this node's, or
    /// newer too if `newer_ok` (this node's map may lag).
    fn check_sender(
        &self,
        primary: NodeId,
        extent: ExtentId,
        epoch: Epoch,
        newer_ok: bool,
        role: impl Fn(&crate::control::state::ExtentState, NodeId) -> bool,
    ) -> Result<(), WeirError> {
        let placement = self.map.extent(extent);
        if epoch < placement.epoch || (epoch > placement.epoch && !newer_ok) {
            return Err(WeirError::StaleEpoch {
                got: epoch,
                current: placement.epoch,
            });
        }
        if placement.primary != primary || !role(placement, self.me) {
            return Err(WeirError::NotPrimary(primary));
        }
        Ok(())
    }

    /// Whether the write of (`client`, `req`) at `lba` is a retry of one this node
    /// applied whose every block a newer write has overwritten since.
    fn superseded(&self, client: NodeId, req: RequestId, lba: Lba) -> bool {
        let Some(first) = self.applied.get((client, req)) else {
            return false;
        };
        // A block written back by a reconciliation holds older data than its
        // version says: what counts is the version of its data.
        let newer = |b: u64| self.data_version(Lba(b)).is_some_and(|v| v > first.version);
        first.lba == lba && (lba.0..lba.0 + first.blocks).all(newer)
    }

    /// Record that `version` is written to `[lba, lba + blocks)`, refusing to go
    /// backwards on any block: the primary orders overlapping writes, so a replica
    /// that sees an older version over a newer one has been sent messages out of order.
    fn claim_version(&mut self, lba: Lba, blocks: u64, version: Version) -> Result<(), WeirError> {
        let end = lba.offset(blocks);
        if self
            .block_versions
            .range(lba..end)
            .any(|(_, &v)| v >= version)
        {
            return Err(WeirError::VersionRegression);
        }
        for b in lba.0..end.0 {
            self.block_versions.insert(Lba(b), version);
        }
        Ok(())
    }

    /// Version of the last write this node applied to `lba`, if any.
    pub fn block_version(&self, lba: Lba) -> Option<Version> {
        self.block_versions.get(&lba).copied()
    }

    // ---- helpers -------------------------------------------------------------------

    fn send(&mut self, to: NodeId, msg: Message) {
        self.actions.push_back(Action::Send { to, msg });
    }

    fn fail(&mut self, client: NodeId, req: RequestId, error: WeirError) {
        if client == self.me {
            // An internal write (a reconciliation's), failed with its extent.
            return;
        }
        self.send(client, Message::Failed { req, error });
    }

    fn reply_read(&mut self, client: NodeId, req: RequestId, result: IoResult) {
        match result {
            IoResult::Read(data) => self.send(client, Message::ReadOk { req, data }),
            IoResult::Failed(e) => self.fail(client, req, e),
            IoResult::Done => panic!("a read for {client} {req} completed without data"),
        }
    }

    fn reply(&mut self, client: NodeId, req: RequestId, outcome: Result<Message, WeirError>) {
        match outcome {
            Ok(msg) => self.send(client, msg),
            Err(error) => self.fail(client, req, error),
        }
    }

    fn op_id(&mut self) -> OpId {
        self.next_op += 1;
        OpId(self.next_op)
    }

    fn io(&mut self, purpose: IoPurpose) -> IoId {
        self.next_io += 1;
        let io = IoId(self.next_io);
        self.ios.insert(io, purpose);
        io
    }
}

fn io_unit(result: IoResult) -> Result<(), WeirError> {
    match result {
        IoResult::Done | IoResult::Read(_) => Ok(()),
        IoResult::Failed(e) => Err(e),
    }
}

/// A read's data, or its error.
fn io_data(result: IoResult) -> Result<Bytes, WeirError> {
    match result {
        IoResult::Read(data) => Ok(data),
        IoResult::Failed(e) => Err(e),
        IoResult::Done => panic!("a read completed without data"),
    }
}

#[cfg(test)]
mod tests;
