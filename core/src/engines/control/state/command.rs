//! The commands of the control-plane log, and why one is refused.

use super::{Qos, QosError};
use crate::ids::{Epoch, ExtentId, NodeId, VolumeId};
use serde::{Deserialize, Serialize};

/// A command of the control-plane log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A node joins the cluster.
    AddNode {
        /// The node.
        node: NodeId,
    },
    /// A volume is created with `extents` extents of `replicas` replicas each,
    /// placed round robin over the up nodes (primaries spread).
    CreateVolume {
        /// Volume id.
        volume: VolumeId,
        /// Number of extents.
        extents: u64,
        /// Replicas per extent.
        replicas: u8,
    },
    /// A node stopped heartbeating at `silent_since_ns`; its lease expires at
    /// `lease_expires_ns`. It leaves every in-sync set; extents it was primary of
    /// fail over to an in-sync replica, which may serve after the lease expiry.
    NodeDown {
        /// The node.
        node: NodeId,
        /// Control-plane time its lease runs out.
        lease_expires_ns: u64,
    },
    /// A node that was down is back: its replicas start rebuilding.
    NodeUp {
        /// The node.
        node: NodeId,
    },
    /// The primary of `extent` at `epoch` asks to drop a replica that did not
    /// acknowledge a write in time, so it can acknowledge without it.
    DropReplica {
        /// The extent.
        extent: ExtentId,
        /// The epoch the primary is at.
        epoch: Epoch,
        /// The silent replica.
        node: NodeId,
    },
    /// A rebuilding replica has caught up at `epoch`: it joins the in-sync set.
    RebuildDone {
        /// The extent.
        extent: ExtentId,
        /// The epoch the rebuild finished in.
        epoch: Epoch,
        /// The replica.
        node: NodeId,
    },
    /// A node restarted and lost what it held in memory (the versions it gave or
    /// saw): every extent it holds a replica of moves to a new epoch, so versions it
    /// hands out from now on are above any it gave before, and it serves as a
    /// primary only at an epoch it has not served in. Where another replica is in
    /// sync it leaves the in-sync set and rebuilds (its device may have lost
    /// unflushed writes, or missed one it forwarded); extents it led fail over.
    ///
    /// It applies once per incarnation: a `Restarted` whose incarnation is not
    /// above the node's last applied one is a repeat (the request asked again
    /// before the node saw it applied, or a late copy of an earlier
    /// incarnation's) and is refused.
    Restarted {
        /// The node.
        node: NodeId,
        /// Its incarnation: above every one of its `Restarted` applied so far.
        incarnation: u64,
        /// The asking process's nonce: a restarted process takes as its own
        /// only the `Restarted` that carries it (an earlier process's, applied
        /// after this one opened its log, is not this one's).
        boot: u64,
    },
    /// A node down past the replacement timeout is given up on: in every extent
    /// it holds a replica of, a spare takes its place and rebuilds from the
    /// primary (see [`ClusterState::replacements`]). If it comes back it holds
    /// nothing and serves as a spare itself.
    ReplaceNode {
        /// The node.
        node: NodeId,
    },
    /// A named volume of `size_bytes`, spanning `extents` extents: a thin one
    /// takes a pool extent at the first write into each ([`Command::Allocate`]),
    /// a thick one takes them all now.
    CreateNamed {
        /// The volume's name.
        name: String,
        /// Size the users see, in bytes.
        size_bytes: u64,
        /// Pool extents it needs (the proposer rounds the size up to extents).
        extents: u64,
        /// Its quality of service.
        qos: Qos,
        /// An encrypted volume's key check value (the key is never in the
        /// map: its owner's front ends encrypt, and refuse another key).
        key_check: Option<[u8; 16]>,
        /// Allocated on first write (else all at once).
        thin: bool,
    },
    /// A named volume's quality of service changes.
    SetQos {
        /// The volume's name.
        name: String,
        /// The new setting.
        qos: Qos,
    },
    /// A named volume is deleted: its extents are dirty until zeroed.
    DeleteNamed {
        /// The volume's name.
        name: String,
    },
    /// The first write into a volume's extent `index` (a front end asks): it
    /// gets the next free pool extent, in a new reign of its primary.
    Allocate {
        /// The volume's name.
        name: String,
        /// The volume's extent.
        index: u64,
    },
    /// A TRIM covered a volume's whole extent `index`: its pool extent is
    /// freed (dirty until zeroed) and the index reads as zeroes again.
    Trim {
        /// The volume's name.
        name: String,
        /// The volume's extent.
        index: u64,
    },
    /// A snapshot of volume `name`: its table as it is, frozen (every extent
    /// in it starts a new reign; a write to one from now on goes to a new
    /// extent, [`Command::Redirect`]).
    Snapshot {
        /// The volume.
        name: String,
        /// The snapshot's name.
        snap: String,
    },
    /// A snapshot is deleted; extents nothing else refers to are freed.
    DeleteSnapshot {
        /// The volume.
        name: String,
        /// The snapshot.
        snap: String,
    },
    /// A new volume `new` whose table is snapshot `name@snap`'s: it shares
    /// the snapshot's extents until it writes (redirected like a volume's).
    Clone {
        /// The volume.
        name: String,
        /// The snapshot.
        snap: String,
        /// The clone's name.
        new: String,
    },
    /// Volume `name` goes back to snapshot `snap`: its table becomes the
    /// snapshot's; extents nothing else refers to are freed.
    Rollback {
        /// The volume.
        name: String,
        /// The snapshot.
        snap: String,
    },
    /// The first write into volume `name`'s extent `index` since a snapshot
    /// froze `from`, its extent: a new extent takes its place, reading its
    /// chunks from `from` until each is filled ([`Command::Filled`]).
    Redirect {
        /// The volume.
        name: String,
        /// The volume's extent.
        index: u64,
        /// The frozen extent it has.
        from: ExtentId,
    },
    /// Chunk `chunk` of redirected extent `extent` was copied from its base
    /// by writes of the reign that started at `since`: it now reads from
    /// `extent` itself (in a new reign: a copy still on its way is refused).
    Filled {
        /// The redirected extent.
        extent: ExtentId,
        /// The chunk.
        chunk: u8,
        /// The reign the copy was written in.
        since: Epoch,
    },
    /// A dirty pool extent was zeroed by writes of the reign that started at
    /// `since` (the reclaimer, on the leader's node): it is free again.
    Zeroed {
        /// The pool extent.
        extent: ExtentId,
        /// The reign (`primary_since`) the zeroes were written in.
        since: Epoch,
    },
    /// A new node joins (`weir node add`): a member, down until the leader
    /// hears from it, holding no replica; the leader then adds it to the Raft
    /// group as a learner ([`Command::Conf`]).
    JoinNode {
        /// The node.
        node: NodeId,
        /// Its replication address (host:port; empty where the transport
        /// needs none, as in the simulator).
        addr: String,
    },
    /// A member is to leave (`weir node remove`): the leader moves its
    /// replicas to other nodes ([`Command::MoveReplica`]), hands its vote to
    /// another node, and once it holds nothing, removes it ([`ConfRole::Gone`]).
    RemoveNode {
        /// The node.
        node: NodeId,
    },
    /// Start moving `extent`'s replica on `from` (a leaving node) to `to`: `to`
    /// becomes a replica and rebuilds from the primary while `from` keeps its
    /// copy, so the extent never has fewer copies than it had.
    MoveReplica {
        /// The extent.
        extent: ExtentId,
        /// The epoch the leader saw.
        epoch: Epoch,
        /// The leaving replica.
        from: NodeId,
        /// The node taking its place.
        to: NodeId,
    },
    /// Finish `extent`'s move: its new replica is in sync, so the leaving one
    /// gives up its place (and its primacy: the new primary serves from
    /// `serve_after_ns`, when every lease the old one may still hold has run
    /// out).
    FinishMove {
        /// The extent.
        extent: ExtentId,
        /// The epoch the leader saw.
        epoch: Epoch,
        /// Control-plane time from which a new primary may serve.
        serve_after_ns: u64,
    },
    /// A Raft configuration change (only ever applied from a configuration
    /// entry, together with raft-rs's own change: the map's `voters` and
    /// `learners` are always the Raft group's).
    Conf {
        /// The node.
        node: NodeId,
        /// Its new place in the group.
        role: ConfRole,
    },
    /// A named volume's size changes, to `size_bytes` in `extents` extents of
    /// `extent_bytes` (the asker's view of the pool's extent size). Growing
    /// takes effect at once (the new extents are thin). Shrinking releases
    /// the extents past the new end (dirty until zeroed, in a new reign, as
    /// a TRIM does); it must end on an extent boundary and the volume must
    /// have no snapshots. (Last, so that the log's earlier commands keep
    /// their encoding.)
    Resize {
        /// The volume's name.
        name: String,
        /// The new size users see.
        size_bytes: u64,
        /// Extents it spans: `size_bytes` rounded up to whole extents.
        extents: u64,
        /// Bytes of one extent.
        extent_bytes: u64,
    },
}

impl Command {
    /// The command's name, for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::AddNode { .. } => "add_node",
            Command::CreateVolume { .. } => "create_volume",
            Command::NodeDown { .. } => "node_down",
            Command::NodeUp { .. } => "node_up",
            Command::DropReplica { .. } => "drop_replica",
            Command::RebuildDone { .. } => "rebuild_done",
            Command::Restarted { .. } => "restarted",
            Command::ReplaceNode { .. } => "replace_node",
            Command::CreateNamed { .. } => "create_named",
            Command::SetQos { .. } => "set_qos",
            Command::DeleteNamed { .. } => "delete_named",
            Command::Allocate { .. } => "allocate",
            Command::Trim { .. } => "trim",
            Command::Snapshot { .. } => "snapshot",
            Command::DeleteSnapshot { .. } => "delete_snapshot",
            Command::Clone { .. } => "clone",
            Command::Rollback { .. } => "rollback",
            Command::Redirect { .. } => "redirect",
            Command::Filled { .. } => "filled",
            Command::Zeroed { .. } => "zeroed",
            Command::JoinNode { .. } => "join_node",
            Command::RemoveNode { .. } => "remove_node",
            Command::MoveReplica { .. } => "move_replica",
            Command::FinishMove { .. } => "finish_move",
            Command::Conf { .. } => "conf",
            Command::Resize { .. } => "resize",
        }
    }

    /// How much the command may add to the encoded map and its reserve, for
    /// the map's size budget ([`super::MAP_FRAME_BYTES`]).
    pub(super) fn growth(&self) -> Growth {
        match self {
            // One member, its address at most MAX_ADDR_BYTES.
            Command::AddNode { .. } => Growth::Small(64),
            Command::JoinNode { .. } => Growth::Small(64 + super::MAX_ADDR_BYTES),
            // A pool extent (at most 255 replicas, in three sets of ids of
            // at most 5 bytes: 3.9 KB), its table entry and a redirect's
            // record of chunks: under 8 KiB.
            Command::Allocate { .. } | Command::Redirect { .. } => Growth::Small(8 << 10),
            Command::SetQos { .. } | Command::Resize { .. } => Growth::Small(128),
            // A move's record (11 bytes) and its new replica in two sets (5
            // each): a leaving node's moves wait while the map is full.
            Command::MoveReplica { .. } => Growth::Small(64),
            // Volumes, snapshots and clones: as large as their tables.
            Command::CreateVolume { .. }
            | Command::CreateNamed { .. }
            | Command::Snapshot { .. }
            | Command::Clone { .. }
            | Command::Rollback { .. } => Growth::Large,
            // What failure handling, rebuild and deletions need is
            // never refused for size: what it may add to an extent, a row or
            // a member is kept free for it (`ClusterState::size_reserve`).
            Command::NodeDown { .. }
            | Command::NodeUp { .. }
            | Command::DropReplica { .. }
            | Command::RebuildDone { .. }
            | Command::Restarted { .. }
            | Command::ReplaceNode { .. }
            | Command::DeleteNamed { .. }
            | Command::Trim { .. }
            | Command::DeleteSnapshot { .. }
            | Command::Filled { .. }
            | Command::Zeroed { .. }
            | Command::RemoveNode { .. }
            | Command::FinishMove { .. }
            // Raft applies a configuration change to its group whatever the
            // map says, so the map must follow it: an id in a list, kept
            // free for every member.
            | Command::Conf { .. } => Growth::Kept,
        }
    }
}

/// What a command may add to the encoded map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Growth {
    /// Never refused for size (see [`Command::growth`]).
    Kept,
    /// At most this many bytes.
    Small(usize),
    /// Without a bound short of the map's own.
    Large,
}

/// A node's place in the Raft group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConfRole {
    /// Votes (and may lead).
    Voter,
    /// Receives every command, votes for nothing.
    Learner,
    /// Out of the group and of the map: a leaving node that holds nothing.
    Gone,
}

/// Why a command was refused (it changes nothing).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum Refusal {
    /// A `Restarted` of an incarnation already applied, or an earlier one.
    #[error("{node}'s restart {incarnation} is a repeat (restart {last} is applied)")]
    RepeatedRestart {
        /// The node.
        node: NodeId,
        /// The incarnation named.
        incarnation: u64,
        /// The node's last applied incarnation.
        last: u64,
    },
    /// The node is already a member.
    #[error("{0} is already a member")]
    KnownNode(NodeId),
    /// No such node.
    #[error("{0} is not a member")]
    UnknownNode(NodeId),
    /// The volume exists.
    #[error("{0} already exists")]
    KnownVolume(VolumeId),
    /// Not enough up nodes for the replica count.
    #[error("{replicas} replicas need {replicas} up nodes, {up} are up")]
    TooFewNodes {
        /// Replicas asked for.
        replicas: u8,
        /// Nodes up.
        up: usize,
    },
    /// No such extent.
    #[error("{0} does not exist")]
    UnknownExtent(ExtentId),
    /// The command names an older epoch than the extent's.
    #[error("stale epoch {got}, extent is at {current}")]
    StaleEpoch {
        /// Epoch named.
        got: Epoch,
        /// Current epoch.
        current: Epoch,
    },
    /// The command does not apply to the node's current role.
    #[error("{node} is not {role} of {extent}")]
    WrongRole {
        /// The node.
        node: NodeId,
        /// The role it should have had.
        role: &'static str,
        /// The extent.
        extent: ExtentId,
    },
    /// Dropping this replica would leave the extent with no in-sync replica.
    #[error("{0} would lose its last in-sync replica")]
    LastReplica(ExtentId),
    /// The node's status already is what the command asks.
    #[error("{0} is already in that state")]
    NoChange(NodeId),
    /// A named volume of that name exists.
    #[error("volume {0:?} already exists")]
    KnownName(String),
    /// No named volume of that name.
    #[error("no volume named {0:?}")]
    UnknownName(String),
    /// The pool has too few free extents for the volume.
    #[error("the pool has {free} free extents, the volume needs {needed}")]
    NoSpace {
        /// Extents asked for.
        needed: u64,
        /// Extents free.
        free: u64,
    },
    /// An extent index past the volume's end.
    #[error("extent {index} is past the volume's end")]
    BadIndex {
        /// The index named.
        index: u64,
    },
    /// The volume's extent already has a pool extent (another front end's
    /// allocation came first).
    #[error("extent {index} is already allocated")]
    Allocated {
        /// The index named.
        index: u64,
    },
    /// The volume's extent has no pool extent to free.
    #[error("extent {index} is not allocated")]
    Unallocated {
        /// The index named.
        index: u64,
    },
    /// No snapshot of that name.
    #[error("volume {name:?} has no snapshot {snap:?}")]
    UnknownSnapshot {
        /// The volume.
        name: String,
        /// The snapshot.
        snap: String,
    },
    /// A snapshot of that name exists.
    #[error("volume {name:?} already has a snapshot {snap:?}")]
    KnownSnapshot {
        /// The volume.
        name: String,
        /// The snapshot.
        snap: String,
    },
    /// A redirect or fill that no longer applies (another front end's came
    /// first, or the extent changed hands).
    #[error("{0} needs no redirect or fill")]
    NotFrozen(ExtentId),
    /// The pool extent is not waiting to be zeroed.
    #[error("{0} is not a freed extent waiting to be zeroed")]
    NotDirty(ExtentId),
    /// The command applies to down nodes only.
    #[error("{0} is not down")]
    NotDown(NodeId),
    /// The name or size is not acceptable.
    #[error("bad volume: {0}")]
    BadName(&'static str),
    /// A QoS setting that cannot be kept.
    #[error("bad QoS: {0}")]
    BadQos(QosError),
    /// The command would take the map past one of its bounds.
    #[error("past a bound of the map: {0}")]
    TooLarge(&'static str),
    /// Not an acceptable node for the map.
    #[error("{0}: {1}")]
    BadNode(NodeId, &'static str),
    /// The node is already leaving.
    #[error("{0} is already leaving")]
    Leaving(NodeId),
    /// A move that cannot start or finish in this map.
    #[error("{extent} cannot move: {why}")]
    BadMove {
        /// The extent.
        extent: ExtentId,
        /// Why.
        why: &'static str,
    },
    /// A Raft configuration change that does not apply to the map (or a
    /// [`Command::Conf`] outside a configuration entry).
    #[error("{node} cannot become {role:?}: {why}")]
    BadConf {
        /// The node.
        node: NodeId,
        /// The role asked.
        role: ConfRole,
        /// Why.
        why: &'static str,
    },
    /// Applying the command broke an invariant of the map: a bug in weir, not in
    /// the command. Every member applies it alike, so they stay in step; the
    /// error is logged and the debug build stops on it.
    #[error("cluster state invariant broken: {0}")]
    Invariant(String),
    /// The command would take the encoded map, with what is kept free for
    /// failure handling, past what one frame carries (the map travels whole,
    /// to clients and as a Raft snapshot).
    #[error("the map would encode to {bytes} bytes, and {reserve} are kept free for failure handling: past its limit of {limit}")]
    MapFull {
        /// The map's encoded size with the command applied.
        bytes: usize,
        /// `ClusterState::size_reserve` with the command applied.
        reserve: usize,
        /// [`super::MAP_FRAME_BYTES`].
        limit: usize,
    },
    /// A shrink of a volume with snapshots (a rollback would bring back
    /// extents past its end), or to a size off an extent boundary (what a
    /// kept extent held past the end would show again when it grows).
    #[error("volume {name:?} cannot shrink: {why}")]
    NoShrink {
        /// The volume.
        name: String,
        /// Why.
        why: &'static str,
    },
}
