//! The async node driver: runs the replication engine over any `Transport` and
//! `BlockDevice`.
//!
//! One task owns the engine (one thing happens at a time, no locks): it feeds it
//! frames from the transport and device completions, and carries out its actions.
//! Each device command runs in a task of its own so the device sees real queue depth.

use crate::buf::BufPool;
use crate::control::{ClusterState, Command, ControlPlane, PlaneAction};
use crate::device::{BlockDevice, DevCompletion, DevError};
use crate::error::WeirError;
use crate::events::Event;
pub use crate::events::{Events, EVENTS_MAX};
use crate::flow::{Flow, Sent};
use crate::ids::{Lba, NodeId};
use crate::map::ClusterMap;
use crate::replication::engine::RebuildProgress;
use crate::replication::{Action, Audit, IoCmd, IoId, IoResult, ReplicationConfig, Replicator};
use crate::sched::{AdmitConfig, CmdId, DeviceSched, Health, SchedConfig};
use crate::transport::{Transport, TransportError};
use crate::wire::Message;
use gate::{Arrival, ClientGate};
use std::sync::Arc;
use tokio::sync::{mpsc, watch};

pub mod boot;
mod gate;
pub mod store_io;

/// Why a node could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The volume's block size is not a multiple of the device's.
    #[error("volume block size {volume} is not a multiple of device block size {device}")]
    BlockSize {
        /// Volume block size.
        volume: u32,
        /// Device block size.
        device: u32,
    },
    /// The device is smaller than the volume.
    #[error("device holds {device} bytes, the volume needs {volume}")]
    TooSmall {
        /// Device capacity in bytes.
        device: u64,
        /// Volume capacity in bytes.
        volume: u64,
    },
    /// A request of the volume's largest size does not fit one device command.
    #[error("volume requests of {request} blocks exceed the device's {device}-block transfers")]
    TransferTooLarge {
        /// Largest request, in device blocks.
        request: u64,
        /// Device's largest transfer, in blocks.
        device: u64,
    },
    /// The transport failed.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The durable Raft log could not be written: the node stops rather than act
    /// on a vote or an entry it may forget.
    #[error("raft log: {0}")]
    Log(std::io::Error),
    /// A block-version checkpoint could not be written: the node stops rather
    /// than leave a forgotten version on record.
    #[error("block-version checkpoint: {0}")]
    Checkpoint(std::io::Error),
}

/// Where a node keeps a durable file of records (a file in production): its Raft
/// log (rounds appended, replaced by an image after a snapshot) and its
/// block-version checkpoints (see [`crate::replication::versions`]: deltas
/// appended, replaced by a full checkpoint).
pub trait LogStore: Send + Sync + 'static {
    /// Append `record` and make it durable before returning.
    fn append(&mut self, record: &[u8]) -> std::io::Result<()>;
    /// Replace everything with `record`, durably and atomically (the old contents
    /// stay whole until the new ones are).
    fn replace(&mut self, record: &[u8]) -> std::io::Result<()>;
    /// Keep only the first `len` bytes (a torn record after them is dropped at
    /// start); nothing to do when it holds no more.
    fn truncate(&mut self, len: u64) -> std::io::Result<()>;
}

/// What a running node reports about itself, for status pages and metrics.
#[derive(Clone, Debug, Default)]
pub struct NodeReport {
    /// The cluster map as this node has applied it.
    pub state: Arc<ClusterState>,
    /// The Raft leader it knows of.
    pub leader: Option<NodeId>,
    /// End of its lease (cluster clock, ns).
    pub lease_until_ns: u64,
    /// Whether its device answers in time.
    pub device_healthy: bool,
    /// Rebuild copies it runs as a primary.
    pub rebuilds: Vec<RebuildProgress>,
    /// Device commands in flight.
    pub device_inflight: usize,
    /// Requests (pieces) waiting in the device's scheduler.
    pub device_waiting: usize,
    /// The device's scheduler's counts.
    pub sched: crate::sched::SchedStats,
    /// Version checkpoints written since the start.
    pub checkpoints: u64,
    /// Bytes of version grains held (8 per grain of each extent written).
    pub version_bytes: u64,
    /// Records in the applied log (bounded).
    pub applied_records: u64,
    /// The flow towards each peer it sent to: frames sent, held, dropped, and
    /// the transport's congestion signals.
    pub flow: Vec<(NodeId, crate::flow::PeerFlow)>,
    /// Client writes its engine held back for room in a replica's window,
    /// so far.
    pub writes_waited: u64,
    /// Replica writes that took their data from this node's own front end, and
    /// ones that found none held (the replica is then dropped and rebuilds): see
    /// [`crate::front_end`].
    pub front_end_payloads: (u64, u64),
    /// Client requests admitted by dmClock, per named volume (by number;
    /// `None`: outside every named volume), while any volume asks for QoS.
    pub admission: Vec<(crate::sched::VolKey, crate::sched::VolumeAdmitStats)>,
    /// The device scheduler's merges and splits per named volume (by
    /// number).
    pub volume_sched: Vec<(u64, crate::sched::VolumeSchedStats)>,
}

/// The daemon's handle on a running node: ask for map changes, watch its reports.
#[derive(Clone, Debug)]
pub struct NodeHandle {
    requests: mpsc::Sender<Request>,
    reports: watch::Receiver<NodeReport>,
}

/// What a [`NodeHandle`] asks of its node.
#[derive(Debug)]
enum Request {
    /// Commit a map change.
    Control(Command),
    /// Checkpoint block versions now; answer once written (false: checkpoints are
    /// off, or the device is gone).
    Checkpoint(tokio::sync::oneshot::Sender<bool>),
}

impl NodeHandle {
    /// Ask the control plane to commit `command` (forwarded to the leader). The
    /// outcome shows in a later report's map; false if the node has stopped or
    /// already holds [`NODE_REQUESTS_MAX`] requests it has not taken.
    pub fn request(&self, command: Command) -> bool {
        self.requests.try_send(Request::Control(command)).is_ok()
    }

    /// Checkpoint the node's block versions now (a clean shutdown does, so the
    /// restarted node is sent nothing it holds) and wait until it has finished:
    /// written down, or its flush failed (logged). False if checkpoints are off,
    /// the device is gone or the node has stopped.
    pub async fn checkpoint(&self) -> bool {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if self.requests.send(Request::Checkpoint(tx)).await.is_err() {
            return false;
        }
        rx.await.unwrap_or(false)
    }

    /// The node's reports as they come: one each tick and each applied map.
    pub fn watch(&self) -> watch::Receiver<NodeReport> {
        self.reports.clone()
    }

    /// The node's latest report.
    pub fn report(&self) -> NodeReport {
        self.reports.borrow().clone()
    }

    /// The map of the node's latest report (shared, not copied).
    pub fn state(&self) -> Arc<ClusterState> {
        self.reports.borrow().state.clone()
    }
}

/// Events a node reports (failovers, nodes down and up, rebuilds), shared with
/// whoever shows them.
pub type EventLog = Arc<std::sync::Mutex<Events>>;

/// Audit facts of every node that shares it, by node (for the simulator's
/// invariant checkers; see [`crate::replication::Audit`]).
pub type AuditLog = Arc<std::sync::Mutex<Vec<(NodeId, Audit)>>>;

/// A storage node: replication engine + control plane + transport + device.
pub struct Node<T, D> {
    transport: Arc<T>,
    device: Arc<D>,
    engine: Replicator,
    /// Frames held for peers whose transport queue is full, and each path's
    /// signals.
    flow: Flow,
    pool: BufPool,
    /// Device blocks per volume block.
    scale: u64,
    control: Option<(ControlPlane, std::time::Duration, EventLog)>,
    audit: Option<AuditLog>,
    /// The device's owner: its queues, what is in flight, its health.
    sched: DeviceSched,
    /// The origin of the node's monotonic clock (`now_ns`), set when `run` starts.
    origin: Option<tokio::time::Instant>,
    log_store: Option<Box<dyn LogStore>>,
    /// Where checkpoints go, and the name of the device they describe.
    version_store: Option<(Box<dyn LogStore>, String)>,
    /// Block versions restored from checkpoints at start.
    restored_blocks: usize,
    /// Event times count from this instant (default: when `run` starts).
    events_since: Option<tokio::time::Instant>,
    requests: Option<mpsc::Receiver<Request>>,
    /// Checkpoints asked for through the handle: (number, who waits).
    checkpoint_waiters: Vec<(u64, tokio::sync::oneshot::Sender<bool>)>,
    reports: Option<watch::Sender<NodeReport>>,
    /// This node's clock against the true cluster clock (the simulator's clock
    /// skew; none on real nodes, whose clock is what NTP made it).
    skew: crate::time::Skew,
    /// The payloads this node's own front end holds (see [`crate::front_end`]).
    held: Option<Arc<crate::front_end::HeldPayloads>>,
    /// Client requests pass here before the engine (dmClock QoS).
    gate: ClientGate,
}

/// Device completions waiting for the node's loop; a device task past this
/// waits (with its buffer) until the loop takes one.
pub const DEVICE_COMPLETIONS_MAX: usize = 1024;

/// Requests through a [`NodeHandle`] that the node has not taken yet.
pub const NODE_REQUESTS_MAX: usize = 64;

/// The default device timeout ([`Node::with_device_timeout`]): a device command
/// outstanding this long means the device has stalled, and the node stops
/// heartbeating so its extents fail over (its replicas rebuild once the device
/// answers again).
pub const DEFAULT_DEVICE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(100);

impl<T: Transport, D: BlockDevice> Node<T, D> {
    /// A node with the given adapters. `pool` supplies the buffers device reads
    /// land in.
    pub fn new(
        transport: Arc<T>,
        device: Arc<D>,
        map: ClusterMap,
        config: ReplicationConfig,
        pool: BufPool,
    ) -> Result<Self, NodeError> {
        let geometry = device.geometry();
        let volume = *map.volume();
        if !volume.block_size.is_multiple_of(geometry.block_size) {
            return Err(NodeError::BlockSize {
                volume: volume.block_size,
                device: geometry.block_size,
            });
        }
        let volume_bytes = volume.capacity_blocks * u64::from(volume.block_size);
        let device_bytes = geometry.capacity_blocks * u64::from(geometry.block_size);
        if device_bytes < volume_bytes {
            return Err(NodeError::TooSmall {
                device: device_bytes,
                volume: volume_bytes,
            });
        }
        let scale = u64::from(volume.block_size / geometry.block_size);
        let request = u64::from(volume.max_request_blocks) * scale;
        if request > u64::from(geometry.max_transfer_blocks) {
            return Err(NodeError::TransferTooLarge {
                request,
                device: u64::from(geometry.max_transfer_blocks),
            });
        }
        let me = transport.local_id();
        Ok(Node {
            transport,
            device,
            engine: Replicator::new(me, map, config),
            flow: Flow::new(),
            pool,
            scale,
            control: None,
            audit: None,
            sched: DeviceSched::new(geometry, SchedConfig::default(), DEFAULT_DEVICE_TIMEOUT),
            origin: None,
            log_store: None,
            version_store: None,
            restored_blocks: 0,
            events_since: None,
            requests: None,
            checkpoint_waiters: Vec::new(),
            reports: None,
            skew: crate::time::Skew::default(),
            held: None,
            gate: ClientGate::new(AdmitConfig::default(), false),
        })
    }

    /// Run `plane` in this node, ticking it every `tick`; its events go to `events`.
    pub fn with_control(
        mut self,
        plane: ControlPlane,
        tick: std::time::Duration,
        events: EventLog,
    ) -> Self {
        if let Some(epochs) = plane.restored_epochs() {
            self.engine.set_restored(epochs.clone());
        }
        self.control = Some((plane, tick, events));
        self
    }

    /// Keep the control plane's Raft log durable in `store` (see
    /// [`ControlPlane::open`]).
    pub fn with_log_store(mut self, store: Box<dyn LogStore>) -> Self {
        self.log_store = Some(store);
        self
    }

    /// Keep block-version checkpoints of `device` in `store`, starting from
    /// `restored`, what the store held (see [`crate::replication::versions::replay`]).
    /// Checkpoints are taken every [`ReplicationConfig::checkpoint_every_ns`].
    pub fn with_version_store(
        mut self,
        store: Box<dyn LogStore>,
        device: String,
        restored: std::collections::BTreeMap<Lba, crate::ids::Version>,
    ) -> Self {
        // One entry per version grain.
        self.restored_blocks = restored.len() * self.engine.grain_blocks() as usize;
        self.engine.restore_versions(restored);
        self.version_store = Some((store, device));
        self
    }

    /// This node's own front end holds its writes' payloads in `held`: a replica
    /// write sent without its data takes it from there (see [`crate::front_end`]).
    pub fn with_held_payloads(mut self, held: Arc<crate::front_end::HeldPayloads>) -> Self {
        self.held = Some(held);
        self
    }

    /// Count event times from `since` (a simulated cluster's start, so a restarted
    /// node's events line up with the others').
    pub fn with_events_since(mut self, since: tokio::time::Instant) -> Self {
        self.events_since = Some(since);
        self
    }

    /// A handle for the daemon around the node.
    pub fn handle(&mut self) -> NodeHandle {
        let (tx, rx) = mpsc::channel(NODE_REQUESTS_MAX);
        let (report_tx, report_rx) = watch::channel(NodeReport::default());
        self.requests = Some(rx);
        self.reports = Some(report_tx);
        NodeHandle {
            requests: tx,
            reports: report_rx,
        }
    }

    /// Publish a report if anyone holds a handle.
    fn report(&self) {
        let Some(tx) = &self.reports else {
            return;
        };
        let state = self.engine.map().state();
        tx.send_modify(|r| {
            // Every map comes from the one log: its applied index names it.
            if r.state.applied != state.applied {
                r.state = Arc::new(state.clone());
            }
            r.leader = self.control.as_ref().and_then(|(p, ..)| p.leader());
            r.lease_until_ns = self
                .control
                .as_ref()
                .map_or(0, |(p, ..)| p.lease_until_ns());
            r.device_healthy = self.sched.healthy();
            r.rebuilds = self.engine.rebuild_progress();
            r.device_inflight = self.sched.inflight();
            r.device_waiting = self.sched.waiting();
            r.sched = self.sched.stats();
            r.checkpoints = self.engine.checkpoints_written().0;
            (r.version_bytes, r.applied_records) = self.engine.version_memory();
            r.flow = self.flow.report();
            r.writes_waited = self.engine.writes_waited();
            r.front_end_payloads = self.held.as_ref().map_or((0, 0), |h| h.counts());
            r.admission = self.gate.stats();
            r.volume_sched = self.sched.volume_stats();
        });
    }

    /// Read the cluster clock through `skew` (the simulator gives every node a
    /// clock of its own). Audit facts are logged in true time, so the checkers
    /// compare what nodes did on one clock.
    pub fn with_skew(mut self, skew: crate::time::Skew) -> Self {
        self.skew = skew;
        self
    }

    /// Respond to congestion by `cfg` (see [`crate::flow`]): with it on, each
    /// peer's window follows the transport's signals and bounds the rebuild
    /// copies sent there.
    pub fn with_flow(mut self, cfg: crate::flow::FlowConfig) -> Self {
        self.flow = Flow::with_config(cfg);
        self
    }

    /// Schedule the device's requests by `cfg` (merging, splitting, depth).
    pub fn with_sched(mut self, cfg: SchedConfig) -> Self {
        self.sched.set_config(cfg);
        self
    }

    /// Declare the device stalled when a command is outstanding for `timeout`
    /// (at two ticks in a row).
    pub fn with_device_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.sched.set_timeout(timeout);
        self
    }

    /// The node's monotonic clock, ns since `run` started (for the device's
    /// owner: a stall is judged on this clock, never on one that NTP may step).
    fn now_ns(&self) -> u64 {
        self.origin
            .map_or(0, |o| (crate::time::now() - o).as_nanos() as u64)
    }

    /// This node's cluster clock.
    fn cluster_ns(&self) -> u64 {
        self.skew.now_ns()
    }

    /// Record the engine's audit facts in `log` (turns them on).
    pub fn with_audit(mut self, log: AuditLog) -> Self {
        self.engine.enable_audit();
        self.audit = Some(log);
        self
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.engine.id()
    }

    /// Serve until the transport closes.
    pub async fn run(mut self) -> Result<(), NodeError> {
        let (done_tx, mut done_rx) = mpsc::channel(DEVICE_COMPLETIONS_MAX);
        let start = self.events_since.unwrap_or_else(crate::time::now);
        self.origin = Some(crate::time::now());
        self.announce_restored(start);
        let tick = self
            .control
            .as_ref()
            .map_or(std::time::Duration::from_secs(3600), |c| c.1);
        let mut ticker = tokio::time::interval(tick);
        // After a stall (a paused process), one tick, not a burst of missed ones.
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.drain_actions(&done_tx, start)?;
            if cfg!(debug_assertions) {
                // The simulator and the tests run debug builds: every step of
                // every node is checked.
                self.engine.self_check();
                self.flow.self_check();
                self.sched.self_check();
                self.gate.self_check();
                if let Some((plane, ..)) = &self.control {
                    plane.self_check();
                }
            }
            // Checkpoints asked for are written down once drained.
            let finished = self.engine.checkpoints_finished();
            for (_, done) in self
                .checkpoint_waiters
                .extract_if(.., |(n, _)| *n <= finished)
            {
                let _ = done.send(true);
            }
            let admit_at = self.admit_at();
            // `biased`: device completions first (they free resources), and no draw
            // from tokio's unseeded thread-local RNG, which would break determinism.
            tokio::select! {
                biased;
                Some((cmd, result)) = done_rx.recv() => self.completed(cmd, result, &done_tx),
                _ = ticker.tick(), if self.control.is_some() => {
                    self.on_tick(start);
                    // The device's probe, if the tick made one.
                    self.dispatch(&done_tx);
                }
                // Held frames go out as soon as their queue has room.
                _ = self.transport.writable(), if self.flow.holding() => {
                    self.flow.flush(&*self.transport)?;
                    self.tell_congestion();
                }
                Some(request) = recv_request(&mut self.requests) => self.on_request(request),
                // Admitted in the next `drain_actions`.
                _ = gate::sleep_until_opt(admit_at) => {}
                frame = self.transport.recv() => {
                    let (from, frame) = frame?;
                    match Message::decode(frame) {
                        Ok(msg) => {
                            let now = self.cluster_ns();
                            self.route(from, msg, now)
                        }
                        Err(e) => tracing::warn!(%from, error = %e, "undecodable frame dropped"),
                    }
                }
            }
        }
    }

    /// A line for the block versions restored from checkpoints, if any.
    fn announce_restored(&self, start: tokio::time::Instant) {
        if self.restored_blocks == 0 {
            return;
        }
        let bytes = self.restored_blocks as u64 * u64::from(self.engine.map().volume().block_size);
        let event = Event::VersionsRestored {
            node: self.engine.id(),
            blocks: self.restored_blocks,
            bytes,
        };
        self.event(start, event);
    }

    /// A device command completed.
    fn completed(
        &mut self,
        cmd: CmdId,
        result: Result<DevCompletion, DevError>,
        done: &DeviceDone,
    ) {
        // A gone device: the node stops heartbeating, so it is declared down and
        // its replicas leave every in-sync set (the scheduler notes it).
        let now = self.now_ns();
        self.sched.complete(cmd, result, now);
        self.dispatch(done);
    }

    /// The control plane's tick: judge the device's health, tick the control plane
    /// and the engine, publish a report.
    fn on_tick(&mut self, start: tokio::time::Instant) {
        let now = self.cluster_ns();
        if let Some(health) = self.sched.tick(self.now_ns()) {
            let node = self.engine.id();
            let event = match health {
                Health::Answers => Event::DeviceAnswers { node },
                Health::Gone => Event::DeviceGone { node },
                Health::Stalled => Event::DeviceStalled {
                    node,
                    timeout: self.sched.timeout(),
                },
            };
            self.event(start, event);
        }
        let healthy = self.sched.healthy();
        if let Some((plane, ..)) = &mut self.control {
            plane.set_healthy(healthy);
            plane.tick(now);
        }
        self.clock();
        // The windows first: the tick's rebuild pump uses them.
        self.record_signals();
        self.engine.handle_tick(now);
        self.gate.tick(self.now_ns());
        self.report();
    }

    /// Read the transport's signals towards every other node of the map.
    fn record_signals(&mut self) {
        let me = self.engine.id();
        let now = self.now_ns();
        for &peer in self.engine.map().nodes() {
            if peer != me {
                let signals = self.transport.signals(peer);
                self.flow.record_signals(peer, signals, now);
            }
        }
        self.engine.set_peer_windows(self.flow.windows());
    }

    /// A request through the [`NodeHandle`].
    fn on_request(&mut self, request: Request) {
        match request {
            Request::Control(command) => {
                if let Some((plane, ..)) = &mut self.control {
                    plane.request(&command);
                }
            }
            Request::Checkpoint(done) => {
                self.clock();
                match self.engine.checkpoint_now() {
                    Some(n) => self.checkpoint_waiters.push((n, done)),
                    None => {
                        let _ = done.send(false);
                    }
                }
            }
        }
    }

    /// Tell the engine the time and this node's lease.
    fn clock(&mut self) {
        let lease = self
            .control
            .as_ref()
            .map_or(0, |(plane, ..)| plane.lease_until_ns());
        self.engine.set_clock(self.cluster_ns(), lease);
    }

    /// Control-plane messages to the control plane, the rest to the data path.
    fn route(&mut self, from: NodeId, msg: Message, now_ns: u64) {
        match (msg, &mut self.control) {
            (Message::Raft { bytes }, Some((plane, ..))) => plane.handle_raft(from, &bytes),
            (
                Message::Heartbeat {
                    sent_ns,
                    applied,
                    healthy,
                },
                Some((plane, ..)),
            ) => plane.handle_heartbeat(from, sent_ns, applied, healthy, now_ns),
            (
                Message::HeartbeatAck {
                    sent_ns,
                    lease_until_ns,
                },
                Some((plane, ..)),
            ) => plane.handle_heartbeat_ack(from, sent_ns, lease_until_ns),
            (Message::Propose { command }, Some((plane, ..))) => {
                plane.handle_propose(from, &command)
            }
            (msg, _) => match self
                .gate
                .arrive(self.engine.map(), from, msg, self.now_ns())
            {
                Arrival::Engine(from, msg) => self.give_engine(from, msg),
                Arrival::Waiting => {}
                Arrival::Busy(to, req) => self.busy(to, req),
            },
        }
    }

    /// A message for the data path goes to the engine.
    fn give_engine(&mut self, from: NodeId, mut msg: Message) {
        self.take_held(&mut msg);
        self.clock();
        self.engine.handle_message(from, msg)
    }

    /// A replica write sent without its data, for a write of this node's own
    /// front end, takes the data from the front end's memory (if still held; if
    /// not, the engine answers so and the primary has this replica dropped).
    fn take_held(&self, msg: &mut Message) {
        let Message::ReplicaWrite {
            origin: (client, req),
            lba,
            data,
            ..
        } = msg
        else {
            return;
        };
        if !data.is_empty() {
            return;
        }
        let me = self.engine.id();
        match &self.held {
            Some(held) if *client == crate::front_end::front_end_of(me) => {
                if let Some(payload) = held.take(*req, *lba) {
                    *data = payload;
                }
            }
            _ => tracing::warn!(%client, "a replica write without data for another front end"),
        }
    }

    fn drain_actions(
        &mut self,
        done: &DeviceDone,
        start: tokio::time::Instant,
    ) -> Result<(), NodeError> {
        // Until both are quiet: a control request from the data path makes work for
        // the control plane, a new map makes work for the data path.
        loop {
            let mut idle = !self.admit();
            // The control plane first: a new map changes what the data path does.
            while let Some(action) = self.control.as_mut().and_then(|(p, ..)| p.poll_action()) {
                idle = false;
                match action {
                    PlaneAction::Send { to, msg } => self.send(to, msg)?,
                    PlaneAction::Map {
                        state,
                        restart_pending,
                    } => self.take_map(state, restart_pending),
                    PlaneAction::Event(event) => self.event(start, event),
                    PlaneAction::Persist(record) => {
                        if let Some(store) = &mut self.log_store {
                            store.append(&record).map_err(NodeError::Log)?;
                        }
                    }
                    PlaneAction::Rewrite(image) => {
                        if let Some(store) = &mut self.log_store {
                            store.replace(&image).map_err(NodeError::Log)?;
                        }
                    }
                }
            }
            while let Some(action) = self.engine.poll_action() {
                idle = false;
                match action {
                    Action::Send { to, msg } => self.send(to, msg)?,
                    Action::Control { command } => match &mut self.control {
                        Some((plane, ..)) => plane.request(&command),
                        None => tracing::warn!(?command, "no control plane to ask"),
                    },
                    Action::Io { io, cmd } => self.issue(io, cmd, done),
                    Action::Event(event) => self.event(start, event),
                    Action::Checkpoint { runs, full } => self.checkpoint(&runs, full)?,
                    Action::Audit(fact) => {
                        if let Some(log) = &self.audit {
                            let skew = self.skew;
                            log.lock()
                                .expect("audit log")
                                .push((self.engine.id(), fact.map_times(|t| skew.to_true(t))));
                        }
                    }
                }
            }
            if idle {
                return Ok(());
            }
        }
    }

    /// Take the control plane's new map `state` (the engine, the admission
    /// gate); `restart_pending`: this node's restart is not applied yet.
    fn take_map(&mut self, state: ClusterState, restart_pending: bool) {
        match self.engine.map().with_state(state) {
            Ok(map) => {
                self.clock();
                let opened = self.gate.set_map(&map);
                self.engine.handle_map(map);
                for (from, msg) in opened {
                    self.give_engine(from, msg);
                }
                if !restart_pending {
                    self.engine.restart_applied();
                }
                // A front end waiting for a command to apply is woken by
                // this, not by the next tick.
                self.report();
            }
            Err(e) => tracing::debug!(error = %e, "map not taken"),
        }
    }

    /// Write a checkpoint of `runs` of block versions: all of them (`full`,
    /// replacing the store's contents) or what changed since the last.
    fn checkpoint(
        &mut self,
        runs: &[crate::replication::versions::VersionRun],
        full: bool,
    ) -> Result<(), NodeError> {
        let Some((store, device)) = &mut self.version_store else {
            return Ok(());
        };
        use crate::replication::versions::encode;
        let done = if full {
            store.replace(&encode(Some(device), runs))
        } else {
            store.append(&encode(None, runs))
        };
        done.map_err(NodeError::Checkpoint)
    }

    /// Log an event, and keep it in the event log with the time since `start`.
    fn event(&self, start: tokio::time::Instant, event: Event) {
        let at = (crate::time::now() - start).as_nanos() as u64;
        tracing::info!(node = %self.engine.id(), "{event}");
        if let Some((_, _, events)) = &self.control {
            events.lock().expect("event log").push(at, event);
        }
    }

    /// Tell the engine which peers are congested, if that changed.
    fn tell_congestion(&mut self) {
        if let Some(peers) = self.flow.congestion_changed() {
            self.engine.set_congested(peers);
        }
    }

    /// Send `msg` to `to` (encoded, or handed over as it is to a peer in this
    /// process: [`Transport::frame`]), or hold it until `to`'s queue has room.
    /// Never waits.
    fn send(&mut self, to: NodeId, msg: Message) -> Result<(), NodeError> {
        self.gate.replied(to, &msg);
        // The map bounds every request below the frame limit, so an encoding failure
        // is a bug: say so loudly, keep serving.
        let frame = match self.transport.frame(to, msg) {
            Ok(frame) => frame,
            Err(e) => {
                tracing::error!(%to, error = %e, "message not encodable; dropped");
                return Ok(());
            }
        };
        // One unreachable peer (a client gone) must not stop the node; only a
        // closed transport does.
        let sent = self.flow.send(&*self.transport, to, frame);
        self.tell_congestion();
        match sent {
            Ok(Sent::Taken | Sent::Held) => Ok(()),
            Ok(Sent::Dropped) => {
                tracing::warn!(%to, "frames held past the bound dropped (as a reset would)");
                Ok(())
            }
            Err(TransportError::Closed) => Err(TransportError::Closed.into()),
            Err(e) => {
                tracing::warn!(%to, error = %e, "send failed; dropped");
                Ok(())
            }
        }
    }

    /// Give engine request `io` to the device's scheduler, and the device what
    /// may go now.
    fn issue(&mut self, io: IoId, cmd: IoCmd, done: &DeviceDone) {
        let volume_block = u64::from(self.device.geometry().block_size) * self.scale;
        let cmd = cmd.in_device_blocks(self.scale, volume_block);
        let class = self.engine.io_class(io);
        // The named volume of the blocks (the device holds each extent at its
        // pool blocks), for the per-volume merges and splits.
        let map = self.engine.map();
        let volume = match &cmd {
            IoCmd::Read { lba, .. } | IoCmd::Write { lba, .. } => map
                .named_at(map.extent_of(Lba(lba.0 / self.scale)))
                .map(|(volume, _)| volume),
            IoCmd::Flush => None,
        };
        if let Err(e) = self
            .sched
            .submit_for(io, cmd, (class, volume), self.now_ns())
        {
            // Back-pressure: answered at once, as a request the engine may retry.
            tracing::warn!(error = %e, "device queue full; request refused");
            self.clock();
            self.engine.handle_io(io, IoResult::Failed(WeirError::Busy));
            return;
        }
        self.dispatch(done);
    }

    /// Carry out what the scheduler has for the device, and give the engine the
    /// requests it finished.
    fn dispatch(&mut self, done: &DeviceDone) {
        let now = self.now_ns();
        while let Some(d) = self.sched.poll(now, &self.pool) {
            let device = self.device.clone();
            let done = done.clone();
            tokio::spawn(async move {
                let result = device.submit(d.queue, d.command).await;
                // The node may have stopped; then nobody needs the result. A full
                // channel holds this task (and its buffer) until the node drains it.
                let _ = done.send((d.cmd, result)).await;
            });
        }
        while let Some((io, result)) = self.sched.poll_finished() {
            self.clock();
            self.engine.handle_io(io, result);
        }
    }
}

/// Where device tasks send their completions.
type DeviceDone = mpsc::Sender<(CmdId, Result<DevCompletion, DevError>)>;

/// The next admin request, or never if the node has no handle.
async fn recv_request(requests: &mut Option<mpsc::Receiver<Request>>) -> Option<Request> {
    match requests {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
