//! Building a node, the same way in every world: the daemon maps its TOML to
//! [`NodeSettings`] over TCP or RDMA and io_uring or SPDK, the simulator maps
//! its scenario to them over the simulated fabric and SSDs, and both call
//! [`boot`]. What differs between the worlds (where the bytes live, the clock,
//! the audit log) stays with the caller; everything a node derives from them
//! (its control plane replayed from its Raft log, its block versions from its
//! checkpoints, each torn tail cut off, and the node with its scheduler, flow
//! windows, admission gate and device timeout) is here, once.

use super::{EventLog, LogStore, Node, NodeError};
use crate::buf::BufPool;
use crate::control::{ControlPlane, RaftError, Timeouts};
use crate::device::BlockDevice;
use crate::flow::FlowConfig;
use crate::front_end::{front_end_of, FrontEndParts, HeldPayloads};
use crate::ids::NodeId;
use crate::map::ClusterMap;
use crate::replication::ReplicationConfig;
use crate::sched::{AdmitConfig, SchedConfig};
use crate::splice::{splice, Spliced};
use crate::transport::Transport;
use std::sync::Arc;
use std::time::Duration;

/// How a node runs: what its operator (the daemon's config, the simulator's
/// scenario) decided. Every node of a cluster must agree on the map, the
/// replica count and the version grain; the rest is the node's own.
#[derive(Clone, Debug)]
pub struct NodeSettings {
    /// The first members' map (the Raft group's voters are its nodes).
    pub map: ClusterMap,
    /// Replicas of every extent.
    pub replicas: u8,
    /// The replication engine's settings.
    pub replication: ReplicationConfig,
    /// Leases, failure detection and replacement.
    pub timeouts: Timeouts,
    /// The control plane's tick.
    pub tick: Duration,
    /// A device command outstanding this long means the device stalled.
    pub device_timeout: Duration,
    /// The device scheduler's settings.
    pub sched: SchedConfig,
    /// The flow windows' settings.
    pub flow: FlowConfig,
    /// The admission gate's settings.
    pub admit: AdmitConfig,
    /// Raft entries between snapshots (`None`: the control plane's default).
    pub snapshot_entries: Option<u64>,
}

/// One of a node's durable stores, and what it held when the node started.
pub struct Stored {
    /// Where new records go.
    pub store: Box<dyn LogStore>,
    /// What it held.
    pub bytes: Vec<u8>,
}

/// What survives a node's crash besides its device.
pub struct Durable {
    /// The control plane's Raft log.
    pub raft: Stored,
    /// The block-version checkpoints.
    pub versions: Stored,
    /// The device's identity, which checkpoints name (checkpoints of another
    /// device are ignored).
    pub device: String,
}

/// What [`boot`] found in the node's durable stores, for its operator's log.
#[derive(Clone, Debug, Default)]
pub struct BootReport {
    /// The node restarted: its Raft log held a term and vote or records.
    pub restarted: bool,
    /// Bytes of Raft log replayed.
    pub raft_bytes: usize,
    /// Block-version grains restored.
    pub version_grains: usize,
    /// Checkpoint records replayed.
    pub version_records: usize,
    /// The device that the checkpoints describe, when it is not this one.
    pub foreign_versions: Option<String>,
}

/// Why a node could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The Raft log could not be replayed.
    #[error("replaying the raft log: {0}")]
    Raft(#[from] RaftError),
    /// A store's torn tail could not be cut off.
    #[error("cutting the {what} store's torn tail: {error}")]
    Store {
        /// Which store.
        what: &'static str,
        /// What failed.
        error: std::io::Error,
    },
    /// The node refused its adapters.
    #[error(transparent)]
    Node(#[from] NodeError),
}

/// Build node `me`'s node from `settings`, its adapters and what `durable`
/// held; `seed` seeds its Raft timers.
pub fn boot<T: Transport, D: BlockDevice>(
    settings: &NodeSettings,
    (transport, device, pool): (Arc<T>, Arc<D>, BufPool),
    durable: Durable,
    events: EventLog,
    seed: u64,
) -> Result<(Node<T, D>, BootReport), BootError> {
    let me: NodeId = transport.local_id();
    let map = &settings.map;
    let Durable {
        raft,
        versions,
        device: identity,
    } = durable;
    let bootstrap = crate::control::plane::bootstrap(map, settings.replicas);
    let (plane, valid) = ControlPlane::open(
        me,
        map.nodes(),
        bootstrap,
        settings.timeouts,
        seed,
        &raft.bytes,
    )?;
    let mut raft_store = raft.store;
    truncate(&mut *raft_store, "raft log", valid)?;
    let plane = match settings.snapshot_entries {
        Some(entries) => plane.with_snapshot_entries(entries),
        None => plane,
    };
    let volume = map.volume();
    let grain_blocks = settings.replication.grain_blocks(volume);
    let restored = crate::replication::versions::replay(
        &versions.bytes,
        &identity,
        volume.capacity_blocks,
        grain_blocks,
    );
    let mut versions_store = versions.store;
    truncate(&mut *versions_store, "block-version", restored.valid_len)?;
    let report = BootReport {
        restarted: plane.restored_epochs().is_some(),
        raft_bytes: valid,
        version_grains: restored.versions.len(),
        version_records: restored.records,
        foreign_versions: restored.foreign.clone(),
    };
    let node = Node::new(transport, device, map.clone(), settings.replication, pool)?
        .with_control(plane, settings.tick, events)
        .with_device_timeout(settings.device_timeout)
        .with_sched(settings.sched)
        .with_flow(settings.flow)
        .with_admission(settings.admit, false)
        .with_log_store(raft_store)
        .with_version_store(versions_store, identity, restored.versions);
    Ok((node, report))
}

/// A node spliced to its own front end, the front end's parts, and what
/// [`boot`] found.
pub type WithFrontEnd<T, D> = (Node<Spliced<T>, D>, FrontEndParts<T>, BootReport);

/// [`boot`] node `me` with its own front end, as the daemon runs every node:
/// `transports` are the node's endpoint and its front end's
/// ([`front_end_of`]`(me)`), spliced so that the two hand messages over in
/// process; the node takes the payloads the front end holds for it. The
/// front end opens once the caller has its node's handle
/// ([`FrontEndParts::open`]).
pub fn boot_with_front_end<T: Transport, D: BlockDevice>(
    settings: &NodeSettings,
    ((net, front_net), device, pool): ((Arc<T>, Arc<T>), Arc<D>, BufPool),
    durable: Durable,
    events: EventLog,
    seed: u64,
) -> Result<WithFrontEnd<T, D>, BootError> {
    let me = net.local_id();
    let front = front_end_of(me);
    assert_eq!(front_net.local_id(), front, "{me}'s front end's endpoint");
    let (node_side, client) = splice(me, Some(net), front, Some(front_net));
    let held = Arc::new(HeldPayloads::default());
    let (node, report) = boot(settings, (node_side, device, pool), durable, events, seed)?;
    let node = node.with_held_payloads(held.clone());
    Ok((node, FrontEndParts { client, held }, report))
}

/// Cut `store` back to its first `valid` bytes (a crash may have left a torn
/// record after them); nothing to do when it holds no more.
fn truncate(store: &mut dyn LogStore, what: &'static str, valid: usize) -> Result<(), BootError> {
    store
        .truncate(valid as u64)
        .map_err(|error| BootError::Store { what, error })
}
