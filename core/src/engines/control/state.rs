//! The control plane's state machine: the cluster map as a deterministic function of
//! a log of commands (DESIGN.md section 4.1). Raft replicates the commands; every
//! node applies them in log order and reaches the same map.
//!
//! Per extent: a replica set (primary first when it is in sync), the in-sync subset,
//! the replicas rebuilding, and an epoch that every change bumps. Invariants, checked
//! by [`ClusterState::self_check`] after every command:
//! - the primary is in sync, and every in-sync or rebuilding node is a replica;
//! - a node is never both in sync and rebuilding;
//! - epochs only grow; a command that names an older epoch is refused;
//! - a down node is in no in-sync set;
//! - a pool extent is in at most one named volume, and free only once zeroed
//!   (see [`volumes`]).
//!
//! Named volumes: the daemon's users see block devices by name (`weir volume create
//! NAME`). Each is a table of extents of the one replicated pool volume that the
//! cluster bootstraps with, filled on first write ([`volumes`]).
//!
//! Failover picks the new primary from the in-sync set only, so it holds every
//! acknowledged write (a write is acknowledged only once every in-sync replica has
//! it). A new primary may serve only after `serve_after_ns`, the moment the old
//! primary's lease has surely run out.

pub use super::qos::{Qos, QosError};
use command::Growth;
pub use command::{Command, ConfRole, Refusal};
pub use members::{take_spare, voter_target, MAX_ADDR_BYTES};

pub use size::{MAP_FRAME_BYTES, MEMBER_RESERVE_BYTES};
pub use snapshots::{Row, Snapshot, CHUNKS, MAX_SNAPSHOTS, MAX_TABLE_ENTRIES, MAX_VOLUMES};
pub use volumes::MAX_VOLUME_EXTENTS;

mod command;
mod members;
mod size;
pub mod snapshots;
pub mod volumes;
use crate::ids::{Epoch, ExtentId, NodeId, VolumeId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// A node as the control plane sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeStatus {
    /// Heartbeating.
    Up,
    /// Silent past the lease timeout, or removed.
    Down,
}

/// One extent's placement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtentState {
    /// Every node holding (or rebuilding) a replica, in placement order.
    pub replicas: Vec<NodeId>,
    /// The primary: serves reads and orders writes.
    pub primary: NodeId,
    /// Replicas holding every acknowledged write.
    pub in_sync: BTreeSet<NodeId>,
    /// Replicas catching up; they receive new writes but are not counted on.
    pub rebuilding: BTreeSet<NodeId>,
    /// Bumped by every change of this extent.
    pub epoch: Epoch,
    /// The epoch at which the primary took over (or restarted): a client request
    /// from an earlier epoch was sent in another primary's reign, or to another
    /// incarnation of this one, and is refused (it may have been delayed past
    /// writes acknowledged since). Requests from later epochs of this reign are
    /// served: a replica dropped or rebuilt changes nothing for them.
    pub primary_since: Epoch,
    /// The primary may not serve before this time (ns, control-plane clock): the
    /// previous primary's lease has run out by then.
    pub serve_after_ns: u64,
    /// A replica being moved off a leaving node ([`Command::MoveReplica`]).
    pub moving: Option<Move>,
}

/// A replica moving from a leaving node to another: both are replicas until
/// [`Command::FinishMove`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    /// The leaving replica.
    pub from: NodeId,
    /// The replica taking its place (rebuilding until in sync).
    pub to: NodeId,
}

/// Most members the map holds.
pub const MAX_MEMBERS: usize = 1024;
/// Most extents the pool holds (at 64 MiB each, 64 PiB), so one command from a
/// member cannot make every member allocate without bound.
pub const MAX_POOL_EXTENTS: u64 = 1 << 20;

/// Longest volume name, in bytes (NBD export names are strings on the wire).
pub const MAX_NAME_BYTES: usize = 128;

/// Check a volume name: 1 to [`MAX_NAME_BYTES`] bytes of ASCII letters, digits,
/// `-`, `_` and `.`, not starting with `.` or `-`.
pub fn check_name(name: &str) -> Result<(), Refusal> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || name.len() > MAX_NAME_BYTES {
        return Err(Refusal::BadName("a name has 1 to 128 characters"));
    }
    if !name.chars().all(ok_char) || name.starts_with(['.', '-']) {
        return Err(Refusal::BadName(
            "a name is letters, digits, '-', '_' and '.', not starting with '.' or '-'",
        ));
    }
    Ok(())
}

/// A named volume: a table of the pool's extents (see [`volumes`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedVolume {
    /// Its number, never reused in the map's life: the key its QoS and its
    /// figures go by.
    pub id: u64,
    /// Extents it spans (its size rounded up to whole extents).
    pub extents: u64,
    /// The pool extent that holds each of its extents, by index; an index
    /// with none was never written (or was trimmed) and reads as zeroes.
    pub alloc: BTreeMap<u64, ExtentId>,
    /// Its snapshots, by name ([`snapshots`]).
    pub snapshots: BTreeMap<String, Snapshot>,
    /// Bumped by every snapshot taken: a front end that has not yet seen every
    /// primary of the frozen extents apply it holds the volume's writes
    /// (see [`snapshots`]).
    pub generation: u64,
    /// A clone's origin (`VOL@SNAP`), as it was when cloned.
    pub origin: Option<String>,
    /// Size the users see, in bytes (at most `extents` extents).
    pub size_bytes: u64,
    /// Its quality of service.
    pub qos: Qos,
    /// Encrypted: its key's check value (see [`Command::CreateNamed`]).
    pub key_check: Option<[u8; 16]>,
}

/// What a command changed, for the log and the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A membership or volume change.
    Membership,
    /// Extents whose primary moved: (extent, old primary, new primary, new epoch).
    Failover(Vec<(ExtentId, NodeId, NodeId, Epoch)>),
    /// Extents whose replica sets changed without a new primary.
    Replicas(Vec<(ExtentId, Epoch)>),
    /// A replica moved off a leaving node: `to` took `from`'s place.
    Moved {
        /// The extent.
        extent: ExtentId,
        /// The leaving node.
        from: NodeId,
        /// The new replica.
        to: NodeId,
    },
    /// A node went down and every one of an extent's in-sync replicas is gone: the
    /// extent is unavailable until one comes back (never silently served stale).
    Unavailable(Vec<ExtentId>),
}

/// Why an encoded map was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MapDecodeError {
    /// The bytes are not an encoded map.
    #[error("not an encoded map: {0}")]
    Malformed(String),
    /// It decodes, but breaks the map's invariants.
    #[error("the map breaks its invariants: {0}")]
    Invalid(String),
}

/// The cluster map as the control plane's state machine.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    /// Members and their status.
    pub nodes: BTreeMap<NodeId, NodeStatus>,
    /// Each restarted node's last applied incarnation (see
    /// [`Command::Restarted`]); a node never restarted has none.
    pub incarnations: BTreeMap<NodeId, u64>,
    /// The Raft group's voters, as its configuration entries left it (empty in
    /// a static map, which no Raft group replicates).
    pub voters: BTreeSet<NodeId>,
    /// The Raft group's learners.
    pub learners: BTreeSet<NodeId>,
    /// Members being removed ([`Command::RemoveNode`]).
    pub leaving: BTreeSet<NodeId>,
    /// The replication addresses of members that joined ([`Command::JoinNode`]);
    /// the first members' come from every node's configuration.
    pub addrs: BTreeMap<NodeId, String>,
    /// The pool volume(s): first extent id and extent count.
    pub volumes: BTreeMap<VolumeId, (ExtentId, u64)>,
    /// Every extent, by id.
    pub extents: BTreeMap<ExtentId, ExtentState>,
    /// Named volumes, by name.
    pub named: BTreeMap<String, NamedVolume>,
    /// First pool extent never handed to a named volume (it and every later
    /// one are free and were never written).
    pub next_free_extent: u64,
    /// Pool extents freed and zeroed since: free.
    pub clean: BTreeSet<ExtentId>,
    /// Pool extents freed (a volume deleted, an extent trimmed) and not yet
    /// zeroed: neither free nor any volume's ([`Command::Zeroed`]).
    pub dirty: BTreeSet<ExtentId>,
    /// The next named volume's number.
    pub next_volume: u64,
    /// Redirected extents: a volume's extent written since a snapshot froze
    /// the one it had, which still reads its unfilled chunks from there.
    pub rows: BTreeMap<ExtentId, Row>,
    /// Log index of the last command applied (refused ones included).
    pub applied: u64,
}

impl ClusterState {
    /// The map encoded (postcard), as a `Message::MapState` carries it and a Raft
    /// snapshot holds it: the one encoding of the map.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_allocvec(self).expect("a cluster state always encodes")
    }

    /// Decode a map from elsewhere (a peer, a snapshot, a file) and check it: a
    /// map received is never trusted.
    pub fn decode(bytes: &[u8]) -> Result<ClusterState, MapDecodeError> {
        let state: ClusterState =
            postcard::from_bytes(bytes).map_err(|e| MapDecodeError::Malformed(e.to_string()))?;
        state.validate().map_err(MapDecodeError::Invalid)?;
        Ok(state)
    }

    /// Apply one command. A refused command changes nothing but `applied`.
    /// A command that adds to the map is refused (`MapFull`) if the map
    /// would then encode to more than [`MAP_FRAME_BYTES`] less what is kept
    /// for the commands never refused ([`Self::size_reserve`]), and to more
    /// than before: the same on every member, as both are the map's own.
    pub fn apply(&mut self, cmd: &Command) -> Result<Vec<Change>, Refusal> {
        self.applied += 1;
        // A command that adds to the map keeps the map it was applied to when
        // it might pass the size budget, to go back to if it does.
        let before = match cmd.growth() {
            Growth::Kept => None,
            Growth::Small(bytes)
                if self.encoded_len() + self.size_reserve() + bytes <= MAP_FRAME_BYTES =>
            {
                None
            }
            Growth::Small(_) | Growth::Large => Some(self.clone()),
        };
        let result = self.apply_step(cmd);
        if let (Some(before), Ok(_)) = (before, &result) {
            let (bytes, reserve) = (self.encoded_len(), self.size_reserve());
            // Past the limit, and larger than before: a command that adds
            // nothing (or shrinks the map) still goes on a full map.
            if bytes + reserve > MAP_FRAME_BYTES
                && bytes + reserve > before.encoded_len() + before.size_reserve()
            {
                let applied = self.applied;
                *self = before;
                self.applied = applied;
                return Err(Refusal::MapFull {
                    bytes,
                    reserve,
                    limit: MAP_FRAME_BYTES,
                });
            }
        }
        result
    }

    /// [`Self::apply`] without the size budget.
    ///
    /// One table, argued long: an arm per command, each a call to its own
    /// step.
    fn apply_step(&mut self, cmd: &Command) -> Result<Vec<Change>, Refusal> {
        let result = match cmd {
            Command::AddNode { node } => self.add_node(*node),
            Command::CreateVolume {
                volume,
                extents,
                replicas,
            } => self.create_volume(*volume, *extents, *replicas),
            Command::NodeDown {
                node,
                lease_expires_ns,
            } => self.node_down(*node, *lease_expires_ns),
            Command::NodeUp { node } => self.node_up(*node),
            Command::DropReplica {
                extent,
                epoch,
                node,
            } => self.drop_replica(*extent, *epoch, *node),
            Command::RebuildDone {
                extent,
                epoch,
                node,
            } => self.rebuild_done(*extent, *epoch, *node),
            Command::Restarted {
                node, incarnation, ..
            } => self.restarted(*node, *incarnation),
            Command::ReplaceNode { node } => self.replace_node(*node),
            Command::CreateNamed {
                name,
                size_bytes,
                extents,
                qos,
                key_check,
                thin,
            } => self.create_named(name, (*size_bytes, *extents), (*qos, *key_check), *thin),
            Command::SetQos { name, qos } => {
                qos.check().map_err(Refusal::BadQos)?;
                match self.named.get_mut(name) {
                    Some(v) => {
                        v.qos = *qos;
                        Ok(vec![Change::Membership])
                    }
                    None => Err(Refusal::UnknownName(name.clone())),
                }
            }
            Command::DeleteNamed { name } => self.delete_named(name),
            Command::Allocate { name, index } => self.allocate(name, *index),
            Command::Trim { name, index } => self.trim_extent(name, *index),
            Command::Zeroed { extent, since } => self.zeroed(*extent, *since),
            Command::Snapshot { name, snap } => self.snapshot(name, snap),
            Command::DeleteSnapshot { name, snap } => self.delete_snapshot(name, snap),
            Command::Clone { name, snap, new } => self.clone_volume(name, snap, new),
            Command::Rollback { name, snap } => self.rollback(name, snap),
            Command::Redirect { name, index, from } => self.redirect(name, *index, *from),
            Command::Filled {
                extent,
                chunk,
                since,
            } => self.filled(*extent, *chunk, *since),
            Command::JoinNode { node, addr } => self.join_node(*node, addr),
            Command::RemoveNode { node } => self.remove_node(*node),
            Command::MoveReplica {
                extent,
                epoch,
                from,
                to,
            } => self.move_replica(*extent, *epoch, *from, *to),
            Command::FinishMove {
                extent,
                epoch,
                serve_after_ns,
            } => self.finish_move(*extent, *epoch, *serve_after_ns),
            Command::Conf { node, role } => self.conf(*node, *role),
            Command::Resize {
                name,
                size_bytes,
                extents,
                extent_bytes,
            } => self.resize(name, *size_bytes, (*extents, *extent_bytes)),
        };
        // Commands check their preconditions, so none breaks an invariant; if one
        // did, the map from the log is still the same on every member: say so,
        // never take the whole cluster down by panicking on a log entry.
        if let Err(e) = self.validate() {
            debug_assert!(false, "cluster state invariant broken by {cmd:?}: {e}");
            tracing::error!(?cmd, error = %e, "cluster state invariant broken");
            return Err(Refusal::Invariant(e));
        }
        result
    }

    fn add_node(&mut self, node: NodeId) -> Result<Vec<Change>, Refusal> {
        if node.0 == 0 || node.0 >= crate::ids::FRONT_END_ID_BASE {
            return Err(Refusal::BadNode(
                node,
                "node ids are 1 up to the front ends' ids",
            ));
        }
        if self.nodes.contains_key(&node) {
            return Err(Refusal::KnownNode(node));
        }
        if self.nodes.len() >= MAX_MEMBERS {
            return Err(Refusal::TooLarge("members"));
        }
        self.nodes.insert(node, NodeStatus::Up);
        Ok(vec![Change::Membership])
    }

    fn create_volume(
        &mut self,
        volume: VolumeId,
        extents: u64,
        replicas: u8,
    ) -> Result<Vec<Change>, Refusal> {
        if self.volumes.contains_key(&volume) {
            return Err(Refusal::KnownVolume(volume));
        }
        if extents > MAX_POOL_EXTENTS - self.extents.len() as u64 {
            return Err(Refusal::TooLarge("pool extents"));
        }
        let up = self.up_nodes();
        if replicas == 0 || up.len() < usize::from(replicas) {
            return Err(Refusal::TooFewNodes {
                replicas,
                up: up.len(),
            });
        }
        let first = self.extents.keys().next_back().map_or(0, |e| e.0 + 1);
        for i in 0..extents {
            let replicas: Vec<NodeId> = (0..u64::from(replicas))
                .map(|r| up[((i + r) % up.len() as u64) as usize])
                .collect();
            let state = ExtentState {
                primary: replicas[0],
                in_sync: replicas.iter().copied().collect(),
                replicas,
                rebuilding: BTreeSet::new(),
                epoch: Epoch(1),
                primary_since: Epoch(1),
                serve_after_ns: 0,
                moving: None,
            };
            self.extents.insert(ExtentId(first + i), state);
        }
        self.volumes.insert(volume, (ExtentId(first), extents));
        Ok(vec![Change::Membership])
    }

    fn restarted(&mut self, node: NodeId, incarnation: u64) -> Result<Vec<Change>, Refusal> {
        if !self.nodes.contains_key(&node) {
            return Err(Refusal::UnknownNode(node));
        }
        let last = self.incarnations.get(&node).copied().unwrap_or(0);
        if incarnation <= last {
            return Err(Refusal::RepeatedRestart {
                node,
                incarnation,
                last,
            });
        }
        self.incarnations.insert(node, incarnation);
        let (mut changed, mut failovers) = (Vec::new(), Vec::new());
        for (&id, ext) in self.extents.iter_mut() {
            if !ext.replicas.contains(&node) {
                continue;
            }
            ext.epoch = ext.epoch.next();
            if ext.primary == node {
                // A new incarnation: a new reign, even if it stays primary.
                ext.primary_since = ext.epoch;
            }
            // What the node's device holds is suspect: a power loss drops its
            // volatile cache (acknowledged writes that were not flushed), and a
            // crash between forwarding a write and writing it locally leaves it
            // without a write its replicas have. Where another copy is in sync it
            // rebuilds from that copy; where it holds the last one, it stays.
            // Another in-sync replica, the first in placement order.
            let other = ext
                .replicas
                .iter()
                .copied()
                .find(|&r| r != node && ext.in_sync.contains(&r));
            if let (true, Some(next)) = (ext.in_sync.contains(&node), other) {
                ext.in_sync.remove(&node);
                ext.rebuilding.insert(node);
                if ext.primary == node {
                    // Its earlier incarnation is gone with its lease, and the new
                    // one serves nothing until a later epoch: no wait is needed.
                    ext.primary = next;
                    ext.primary_since = ext.epoch;
                    failovers.push((id, node, next, ext.epoch));
                    continue;
                }
            }
            changed.push((id, ext.epoch));
        }
        let mut out = vec![Change::Replicas(changed)];
        if !failovers.is_empty() {
            out.push(Change::Failover(failovers));
        }
        Ok(out)
    }

    fn node_down(&mut self, node: NodeId, lease_expires_ns: u64) -> Result<Vec<Change>, Refusal> {
        match self.nodes.get(&node) {
            None => return Err(Refusal::UnknownNode(node)),
            Some(NodeStatus::Down) => return Err(Refusal::NoChange(node)),
            Some(NodeStatus::Up) => {}
        }
        self.nodes.insert(node, NodeStatus::Down);
        let (mut failovers, mut changed, mut unavailable) = (Vec::new(), Vec::new(), Vec::new());
        for (&id, ext) in self.extents.iter_mut() {
            let was_in_sync = ext.in_sync.remove(&node);
            let was_rebuilding = ext.rebuilding.remove(&node);
            if !was_in_sync && !was_rebuilding {
                continue;
            }
            ext.epoch = ext.epoch.next();
            if ext.primary != node {
                changed.push((id, ext.epoch));
                continue;
            }
            // The new primary: the first in-sync replica in placement order, so the
            // choice is deterministic and spreads like the placement does.
            match ext.replicas.iter().find(|r| ext.in_sync.contains(r)) {
                Some(&next) => {
                    ext.primary = next;
                    ext.primary_since = ext.epoch;
                    ext.serve_after_ns = ext.serve_after_ns.max(lease_expires_ns);
                    failovers.push((id, node, next, ext.epoch));
                }
                None => unavailable.push(id),
            }
        }
        // The node holds no copy any extent counts on or rebuilds, and every
        // extent it led has moved to an in-sync replica or has none.
        debug_assert!(self.extents.values().all(|e| {
            !e.in_sync.contains(&node)
                && !e.rebuilding.contains(&node)
                && (e.primary != node || e.in_sync.is_empty())
        }));
        let mut out = vec![];
        if !failovers.is_empty() {
            out.push(Change::Failover(failovers));
        }
        if !changed.is_empty() {
            out.push(Change::Replicas(changed));
        }
        if !unavailable.is_empty() {
            out.push(Change::Unavailable(unavailable));
        }
        Ok(out)
    }

    fn node_up(&mut self, node: NodeId) -> Result<Vec<Change>, Refusal> {
        match self.nodes.get(&node) {
            None => return Err(Refusal::UnknownNode(node)),
            Some(NodeStatus::Up) => return Err(Refusal::NoChange(node)),
            Some(NodeStatus::Down) => {}
        }
        self.nodes.insert(node, NodeStatus::Up);
        let mut changed = Vec::new();
        let mut failovers = Vec::new();
        for (&id, ext) in self.extents.iter_mut() {
            if !ext.replicas.contains(&node) {
                continue;
            }
            ext.epoch = ext.epoch.next();
            if ext.in_sync.is_empty() {
                // Every in-sync copy was lost; the returning node held the last
                // acknowledged state when it went down only if it was the last one
                // in sync, which the log records as the primary it had.
                if ext.primary == node {
                    ext.in_sync.insert(node);
                    failovers.push((id, node, node, ext.epoch));
                    continue;
                }
            }
            ext.rebuilding.insert(node);
            changed.push((id, ext.epoch));
        }
        // Back, it is in sync or rebuilding wherever it holds a replica.
        debug_assert!(self
            .extents
            .values()
            .filter(|e| e.replicas.contains(&node))
            .all(|e| e.in_sync.contains(&node) || e.rebuilding.contains(&node)));
        let mut out = Vec::new();
        if !failovers.is_empty() {
            out.push(Change::Failover(failovers));
        }
        if !changed.is_empty() {
            out.push(Change::Replicas(changed));
        }
        Ok(out)
    }

    fn extent_at(&mut self, extent: ExtentId, epoch: Epoch) -> Result<&mut ExtentState, Refusal> {
        let ext = self
            .extents
            .get_mut(&extent)
            .ok_or(Refusal::UnknownExtent(extent))?;
        if epoch != ext.epoch {
            return Err(Refusal::StaleEpoch {
                got: epoch,
                current: ext.epoch,
            });
        }
        Ok(ext)
    }

    fn drop_replica(
        &mut self,
        extent: ExtentId,
        epoch: Epoch,
        node: NodeId,
    ) -> Result<Vec<Change>, Refusal> {
        let ext = self.extent_at(extent, epoch)?;
        if node == ext.primary || !ext.in_sync.contains(&node) {
            return Err(Refusal::WrongRole {
                node,
                role: "an in-sync secondary",
                extent,
            });
        }
        if ext.in_sync.len() == 1 {
            return Err(Refusal::LastReplica(extent));
        }
        ext.in_sync.remove(&node);
        ext.rebuilding.insert(node);
        ext.epoch = ext.epoch.next();
        debug_assert!(
            ext.in_sync.contains(&ext.primary),
            "{extent} dropped its primary's copy"
        );
        Ok(vec![Change::Replicas(vec![(extent, ext.epoch)])])
    }

    fn rebuild_done(
        &mut self,
        extent: ExtentId,
        epoch: Epoch,
        node: NodeId,
    ) -> Result<Vec<Change>, Refusal> {
        let up = self.nodes.get(&node) == Some(&NodeStatus::Up);
        let ext = self.extent_at(extent, epoch)?;
        // A rebuild copies from the primary: with no in-sync replica there was no
        // source, so it cannot have finished.
        if !ext.rebuilding.contains(&node) || !up || ext.in_sync.is_empty() {
            return Err(Refusal::WrongRole {
                node,
                role: "a rebuilding replica",
                extent,
            });
        }
        ext.rebuilding.remove(&node);
        ext.in_sync.insert(node);
        ext.epoch = ext.epoch.next();
        Ok(vec![Change::Replicas(vec![(extent, ext.epoch)])])
    }

    /// Where [`Command::ReplaceNode`] of `node` puts spares: (extent, the
    /// node's position in its replica list, the spare), in extent order. An extent
    /// gets a spare if it has an in-sync replica to copy from and some up node
    /// holds no replica of it; the spare is the up node holding the fewest
    /// replicas (counting those placed before it), the lowest id on ties, so
    /// replacements spread. Empty if `node` is not down.
    pub fn replacements(&self, node: NodeId) -> Vec<(ExtentId, usize, NodeId)> {
        if self.nodes.get(&node) != Some(&NodeStatus::Down) {
            return Vec::new();
        }
        let mut load = self.spare_load();
        let mut plan = Vec::new();
        for (&id, ext) in &self.extents {
            let Some(pos) = ext.replicas.iter().position(|&r| r == node) else {
                continue;
            };
            // A leaving node's replica already has a node taking its place.
            if ext.in_sync.is_empty() || ext.moving.is_some_and(|m| m.from == node) {
                continue;
            }
            if let Some(spare) = take_spare(&mut load, ext) {
                plan.push((id, pos, spare));
            }
        }
        plan
    }

    fn replace_node(&mut self, node: NodeId) -> Result<Vec<Change>, Refusal> {
        match self.nodes.get(&node) {
            None => return Err(Refusal::UnknownNode(node)),
            Some(NodeStatus::Up) => return Err(Refusal::NotDown(node)),
            Some(NodeStatus::Down) => {}
        }
        let plan = self.replacements(node);
        if plan.is_empty() {
            return Err(Refusal::NoChange(node));
        }
        let mut changed = Vec::new();
        for (id, pos, spare) in plan {
            let Some(ext) = self.extents.get_mut(&id) else {
                continue; // Planned from this state: always there.
            };
            // A down node is in no in-sync or rebuilding set, and a primary is in
            // sync: the node was neither.
            debug_assert!(ext.primary != node && !ext.in_sync.contains(&node));
            ext.replicas[pos] = spare;
            if let Some(m) = ext.moving.as_mut().filter(|m| m.to == node) {
                m.to = spare;
            }
            ext.rebuilding.remove(&node);
            ext.rebuilding.insert(spare);
            ext.epoch = ext.epoch.next();
            changed.push((id, ext.epoch));
        }
        Ok(vec![Change::Replicas(changed)])
    }

    /// Members that are up, in id order.
    pub fn up_nodes(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|(_, s)| **s == NodeStatus::Up)
            .map(|(&n, _)| n)
            .collect()
    }

    /// Check the invariants listed in the module documentation, plus the shape a
    /// map received from elsewhere must have (extent ids 0..n, members known).
    pub fn validate(&self) -> Result<(), String> {
        for (i, (id, ext)) in self.extents.iter().enumerate() {
            if id.0 != i as u64 {
                return Err(format!("extent ids are not contiguous at {id}"));
            }
            let distinct: BTreeSet<_> = ext.replicas.iter().collect();
            if distinct.len() != ext.replicas.len() {
                return Err(format!("{id}: a node holds two of its replicas"));
            }
            if ext.replicas.is_empty() || !ext.replicas.contains(&ext.primary) {
                return Err(format!("{id}: primary {} is no replica", ext.primary));
            }
            if !ext.in_sync.is_empty() && !ext.in_sync.contains(&ext.primary) {
                return Err(format!("{id}: primary {} not in sync", ext.primary));
            }
            for n in ext
                .in_sync
                .iter()
                .chain(&ext.rebuilding)
                .chain(&ext.replicas)
            {
                if !ext.replicas.contains(n) || !self.nodes.contains_key(n) {
                    return Err(format!("{id}: {n} is no member replica"));
                }
            }
            if !ext.in_sync.is_disjoint(&ext.rebuilding) {
                return Err(format!("{id}: in sync and rebuilding"));
            }
            if let Some(n) = ext
                .in_sync
                .iter()
                .find(|n| self.nodes.get(n) != Some(&NodeStatus::Up))
            {
                return Err(format!("{id}: down node {n} in sync"));
            }
            if let Some(m) = ext.moving {
                if m.from == m.to
                    || !ext.replicas.contains(&m.from)
                    || !ext.replicas.contains(&m.to)
                {
                    return Err(format!("{id}: a move between non-replicas"));
                }
            }
        }
        self.validate_members()?;
        self.validate_volumes()?;
        Ok(())
    }

    /// Assert the invariants (see [`ClusterState::validate`]).
    pub fn self_check(&self) {
        if let Err(e) = self.validate() {
            panic!("cluster state invariant broken: {e}");
        }
    }
}

#[cfg(test)]
mod tests;
