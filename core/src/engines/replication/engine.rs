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

use crate::engines::range_lock::{Mode, RangeLock};
pub use rebuild::{RebuildProgress, DEFAULT_REBUILD_BYTES_PER_SEC, REBUILD_CHUNK_BYTES};
pub use scrub::SCRUB_RUN_BYTES;

mod actions;
mod applied;
mod audit;
mod checkpoint;
mod client;
mod config;
mod forwards;
mod lease;
mod map_change;
mod ops;
mod rebuild;
mod reconcile;
mod repair;
mod replica;
mod scrub;
mod write;
use crate::device::DevError;
use crate::error::WeirError;
use crate::ids::{Epoch, ExtentId, Lba, NodeId, OpId, RequestId, Version, VolumeId};
pub use crate::io::{IoClass, IoCmd, IoId, IoResult};
use crate::map::ClusterMap;
use crate::wire::Message;
pub use actions::Action;
use actions::{io_data, io_unit};
pub use audit::Audit;
use bytes::Bytes;
pub(crate) use config::BUGS_BUILT;
pub use config::{Bugs, ReplicationConfig, DEFAULT_REPLICA_TIMEOUT_NS};
use ops::{Acks, FetchOp, FlushOp, Kind, ReadOp, WriteBack, WriteOp};
use std::collections::{BTreeMap, VecDeque};

/// Most client operations a node holds at once (queued or running); more get `Busy`.
pub const MAX_OPS_IN_FLIGHT: usize = 4096;

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
    /// The versions this node holds, per grain of the extents it has written.
    grains: crate::replication::grains::Grains,
    /// Recently applied writes by client request, so a retry is not applied twice.
    applied: applied::AppliedWrites,
    /// The ops this node coordinates, by kind.
    ops: ops::Ops,
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
    rebuild: rebuild::Rebuilds,
    /// The background scrubber.
    scrub: scrub::Scrubber,
    /// Block-version checkpoints.
    checkpoint: checkpoint::Checkpoints,
    /// The device answered `Gone`: what this node holds is lost, whatever its
    /// versions say (a rebuild's probe is refused).
    device_gone: bool,
    /// Device writes of this node, in order per block, and what is in flight per
    /// block and grain.
    writes: crate::sched::WriteOrder,
    /// After a restart: each extent's epoch in the map the node restarted with. It
    /// serves as a primary only at later epochs (of its versions from before it
    /// knows only lower bounds, from its checkpoints; the control plane's
    /// `Restarted` moves its extents on).
    restored: BTreeMap<ExtentId, Epoch>,
    /// Restarted, and its `Restarted` not applied yet: it serves (and claims)
    /// nothing. Catching up brings it epochs made while it was down that still
    /// name it primary; the leader, which marked it down, fails those extents
    /// over without waiting for the lease the restarted node holds again.
    restart_fence: bool,
    /// After a restart: (extent, replica) seen in sync at an epoch after the
    /// restored one. Such a replica lacks only writes this node has seen since.
    seen_in_sync: std::collections::BTreeSet<(ExtentId, NodeId)>,
    /// Uncertain tails, and reconciliation when a primary takes over.
    reconcile: reconcile::Reconciler,
    /// Peers whose transport queue is full (the node's flow owner holds frames
    /// for them): a new client write whose replicas include one is refused
    /// `Busy`, so clients back off instead of piling frames up behind it.
    congested: std::collections::BTreeSet<NodeId>,
    /// Each peer's sender-side window from the congestion response (bytes): the
    /// replica forwards and rebuild copies in flight to a peer stay within it. Empty (no bound) with
    /// the response off.
    peer_windows: BTreeMap<NodeId, u64>,
    /// Bytes forwarded to each replica and not yet answered, and the client
    /// writes waiting for room in a replica's window.
    forwards: forwards::Forwards,
}

impl Replicator {
    /// The engine of node `me` under `map`.
    pub fn new(me: NodeId, map: ClusterMap, config: ReplicationConfig) -> Self {
        let volume = map.volume();
        let grain_blocks = config.grain_blocks(volume);
        let grains = crate::replication::grains::Grains::new(grain_blocks, volume.extent_blocks);
        let mut engine = Replicator {
            me,
            map,
            config,
            primary: BTreeMap::new(),
            grains,
            applied: applied::AppliedWrites::default(),
            ops: ops::Ops::default(),
            ios: BTreeMap::new(),
            next_op: 0,
            next_io: 0,
            actions: VecDeque::new(),
            now_ns: 0,
            lease_until_ns: 0,
            drops_asked: BTreeMap::new(),
            rebuild: rebuild::Rebuilds::default(),
            scrub: scrub::Scrubber::default(),
            checkpoint: checkpoint::Checkpoints::default(),
            device_gone: false,
            writes: crate::sched::WriteOrder::new(grain_blocks),
            restored: BTreeMap::new(),
            restart_fence: false,
            seen_in_sync: std::collections::BTreeSet::new(),
            reconcile: reconcile::Reconciler::default(),
            congested: std::collections::BTreeSet::new(),
            peer_windows: BTreeMap::new(),
            forwards: forwards::Forwards::default(),
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
        self.restart_fence = true;
        self.note_in_sync();
    }

    /// This node's `Restarted` was applied: it may serve again (as the
    /// primary of extents at epochs after the restored ones).
    pub fn restart_applied(&mut self) {
        if std::mem::take(&mut self.restart_fence) {
            self.claim_all();
            // The extents it leads at later epochs are reconciled now (the
            // fence kept them from it).
            self.reconcile_after_map();
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
        for w in self.ops.writes.values() {
            let Some(acks) = &w.acks else {
                continue;
            };
            if now_ns.saturating_sub(w.started_ns) < self.config.replica_timeout_ns {
                continue;
            }
            let (extent, epoch) = (w.extent, self.map.extent(w.extent).epoch);
            for &node in acks.waiting.iter().filter(|n| **n != self.me) {
                asks.push((extent, epoch, node));
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

    /// Check the engine's own bookkeeping; panics on a broken invariant. The node
    /// runs it after every step in debug builds (the simulator's and the tests'):
    /// - the device writes in flight are in order (their owner's own check);
    /// - the op tables, checkpoints, rebuilds and reconciliations are
    ///   consistent (their own checks; rebuilds against the table of chunks),
    ///   and so is each led extent's range lock;
    /// - a led extent's unanswered versions are those of its writes running;
    /// - every io id was handed out.
    pub fn self_check(&self) {
        self.writes.self_check();
        self.ops.self_check(self.next_op);
        self.checkpoint.self_check();
        self.reconcile.self_check();
        self.rebuild.self_check(&self.ops.chunks);
        self.forwards.self_check(&self.ops.writes);
        // The versions a primary has not answered yet are exactly those of its
        // writes sent out and not finished.
        let mut started: BTreeMap<ExtentId, std::collections::BTreeSet<Version>> = BTreeMap::new();
        for w in self.ops.writes.values().filter(|w| w.acks.is_some()) {
            started.entry(w.extent).or_default().insert(w.version);
        }
        for (extent, state) in &self.primary {
            state.lock.self_check();
            let unanswered = started.remove(extent).unwrap_or_default();
            assert_eq!(
                unanswered, state.unsettled,
                "{extent}'s unanswered versions"
            );
            if let Some(newest) = state.unsettled.last() {
                assert!(
                    *newest <= state.last_version,
                    "{extent} answers a version not given"
                );
            }
        }
        assert!(started.is_empty(), "writes running for extents not led");
        if let Some((io, _)) = self.ios.last_key_value() {
            assert!(io.0 <= self.next_io, "{io:?} not handed out");
        }
        assert!(self.writes.len() <= self.ios.len(), "writes not in flight");
    }

    /// The peers whose transport queue is full now (back-pressure from the
    /// node's flow owner); the driver sets it whenever it changes.
    pub fn set_congested(&mut self, peers: std::collections::BTreeSet<NodeId>) {
        self.congested = peers;
    }

    /// Each peer's window from the congestion response (see [`crate::flow`]);
    /// the driver sets them every tick. A peer with none is not bounded.
    pub fn set_peer_windows(&mut self, windows: BTreeMap<NodeId, u64>) {
        self.peer_windows = windows;
        self.start_waiting_forwards();
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
                ..
            } => self.client_write(from, req, volume, epoch, lba, data, fua),
            Message::Read {
                req,
                volume,
                epoch,
                lba,
                blocks,
                ..
            } => self.client_read(from, req, volume, epoch, lba, u64::from(blocks)),
            Message::Flush { req, volume } => self.client_flush(from, req, volume),
            Message::ScrubRead {
                req,
                volume,
                lba,
                blocks,
            } => self.scrub_read(from, req, volume, lba, u64::from(blocks)),
            Message::GetMap { req } => {
                let state = Bytes::from(self.map.state().encode());
                self.send(from, Message::MapState { req, state });
            }
            peer => self.handle_peer_message(from, peer),
        }
    }

    /// A message from another storage node: replication, rebuild, repair and
    /// reconciliation traffic.
    fn handle_peer_message(&mut self, from: NodeId, msg: Message) {
        match msg {
            Message::ReplicaWrite {
                op,
                extent,
                epoch,
                version,
                prev,
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
                (version, prev, settled),
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
            Message::ReplicaFlush { op } => self.replica_flush(from, op),
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
            } => self.fetch_blocks(from, op, extent, epoch, lba, blocks),
            Message::FetchBlocksOk { op, result, data } => {
                self.fetched(from, op, result.map(|()| data))
            }
            other => misdirected(from, &other),
        }
    }

    /// A coordinator asks this node to flush its device.
    fn replica_flush(&mut self, from: NodeId, op: OpId) {
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

    /// If `io` was a device write: note its versions as held (or forget them,
    /// if it failed), and issue the writes that waited for it.
    fn device_write_finished(&mut self, io: IoId, result: &IoResult) -> bool {
        let Some(done) = self.writes.finish(io) else {
            return false;
        };
        self.device_write_done(&done, !matches!(result, IoResult::Failed(_)));
        for (io, cmd) in done.ready {
            self.actions.push_back(Action::Io { io, cmd });
        }
        true
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
        let was_write = self.device_write_finished(io, &result);
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
                self.send(to, Message::fetched(op, result));
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

    /// What device command `io` (issued, not yet answered) is for, as the
    /// device's scheduler ranks it.
    pub fn io_class(&self, io: IoId) -> IoClass {
        match self.ios.get(&io) {
            // Reconciliation's write-backs are a client's wait: the new
            // primary serves the extent once they are done.
            Some(IoPurpose::Op(op)) => match self.ops.kind(*op) {
                Some(ops::Kind::Rebuild) => IoClass::Rebuild,
                _ => IoClass::Foreground,
            },
            Some(IoPurpose::RebuildWrite { .. }) => IoClass::Rebuild,
            Some(IoPurpose::BackgroundScrub { .. }) => IoClass::Scrub,
            _ => IoClass::Foreground,
        }
    }

    fn io(&mut self, purpose: IoPurpose) -> IoId {
        self.next_io += 1;
        let io = IoId(self.next_io);
        self.ios.insert(io, purpose);
        io
    }
}

/// A message no storage node takes (a client's reply, a control-plane message on
/// the data path): logged and dropped.
fn misdirected(from: NodeId, msg: &Message) {
    match msg {
        Message::Raft { .. }
        | Message::Heartbeat { .. }
        | Message::HeartbeatAck { .. }
        | Message::Propose { .. } => {
            tracing::warn!(%from, "control-plane message reached the data path; dropped");
        }
        _ => tracing::warn!(%from, "client reply sent to a storage node; dropped"),
    }
}

#[cfg(test)]
mod tests;

/// For the tests of the engine's parts: three nodes, a volume of 4 KiB blocks
/// in 4 extents of 64 blocks (extent `i` led by node `i % 3 + 1`), requests of
/// at most 16 blocks, and empty version grains of 4 blocks.
#[cfg(test)]
fn small_cluster() -> (crate::replication::grains::Grains, ClusterMap) {
    let volume = crate::map::VolumeSpec {
        id: VolumeId(1),
        block_size: 4096,
        capacity_blocks: 256,
        extent_blocks: 64,
        max_request_blocks: 16,
    };
    let nodes = (1..=3).map(NodeId).collect();
    let map = ClusterMap::new_static(nodes, volume, 3).expect("a valid shape");
    (crate::replication::grains::Grains::new(4, 64), map)
}
