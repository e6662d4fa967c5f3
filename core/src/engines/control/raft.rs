//! The Raft group that replicates the cluster map, as a sans-IO engine.
//!
//! raft-rs's `RawNode` is itself sans-IO (tick, step, ready, advance); this wraps it
//! the weir way: [`MapRaft::tick`], [`MapRaft::handle_message`] and
//! [`MapRaft::propose`] in, [`MapRaft::poll_action`] out. Committed entries are
//! [`Command`]s (postcard-encoded) applied in log order to a [`ClusterState`]; every
//! member reaches the same state. The one source of randomness in raft-rs, the
//! election timeout jitter, is drawn here from a seeded generator after every term or
//! role change, so a simulated run replays exactly.
//!
//! Storage: [`storage::MapStorage`] in memory, and, for a member opened with
//! [`MapRaft::open`], a durable copy: every round of new entries and hard state
//! comes out as a [`RaftAction::Persist`] record ([`persist`]) that the driver makes
//! durable before it carries out the actions after it (the messages that depend on
//! it). A restarted member replays its records and applies the committed entries
//! again, reaching the map it had.
//!
//! Compaction: every [`MapRaft::set_snapshot_entries`] applied entries (default
//! [`SNAPSHOT_ENTRIES`]) a member snapshots its map (the postcard-encoded
//! [`ClusterState`] at its applied index) and drops all but the last half of those
//! entries from its log; a durable member replaces its log file with the snapshot
//! and what follows it ([`RaftAction::Rewrite`]). So the log, the file and a
//! restart's replay stay bounded however long the cluster runs. A leader sends its
//! snapshot to a member that needs entries it no longer holds (one that was down
//! or cut off); the member checks it ([`MapRaft::handle_message`] refuses one that
//! does not decode to a valid map), installs it in place of its log and map, and
//! rewrites its file. A snapshot that is not acknowledged within
//! [`SNAPSHOT_RETRY_TICKS`] (lost with a connection, or its receiver crashed
//! during the install) is sent again.

use super::state::{Change, ClusterState, Command, ConfRole, MapDecodeError, Refusal};
use crate::ids::NodeId;
use bytes::Bytes;
use protobuf::Message as _;
use raft::prelude::Snapshot;
use raft::prelude::{
    ConfChange, ConfChangeType, ConfState, Entry, EntryType, Message as RaftMessage,
};
use raft::{Config, ProgressState, RawNode, SnapshotStatus, StateRole, Storage as _};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::collections::VecDeque;

/// Ticks without hearing from a leader before a follower campaigns (at least; the
/// real timeout is drawn between this and twice this).
pub const ELECTION_TICKS: usize = 10;
/// Ticks between the leader's heartbeats.
pub const HEARTBEAT_TICKS: usize = 2;
/// Applied entries between two snapshots of the map (the daemon's default): the
/// log holds at most about one and a half times this many committed entries.
pub const SNAPSHOT_ENTRIES: u64 = 1024;
/// Ticks a leader waits for a member to acknowledge a snapshot before sending it
/// again.
pub const SNAPSHOT_RETRY_TICKS: u32 = 4 * ELECTION_TICKS as u32;

/// Why a Raft input was refused.
#[derive(Debug, thiserror::Error)]
pub enum RaftError {
    /// A Raft message that does not decode.
    #[error("malformed raft message: {0}")]
    Decode(#[from] protobuf::ProtobufError),
    /// raft-rs refused the input.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// Only the leader takes proposals.
    #[error("not the leader (leader: {0:?})")]
    NotLeader(Option<NodeId>),
    /// A message from a node outside the group.
    #[error("{0} is not a member of the raft group")]
    Stranger(NodeId),
    /// A message kind weir does not use.
    #[error("unexpected raft message: {0}")]
    Unexpected(&'static str),
    /// A message no correct member sends (raft-rs would panic on some of these).
    #[error("impossible raft message: {0}")]
    Impossible(&'static str),
}

pub mod persist;
pub mod storage;

use storage::MapStorage;

/// Something the driver must do.
#[derive(Debug)]
pub enum RaftAction {
    /// Append this record to the member's log file and make it durable before
    /// carrying out any later action (only for members opened with
    /// [`MapRaft::open`]).
    Persist(Bytes),
    /// Replace the member's whole log file with this image (a snapshot and what
    /// follows it), durably and atomically, before carrying out any later action
    /// (only for members opened with [`MapRaft::open`]).
    Rewrite(Bytes),
    /// The leader's snapshot replaced this member's log and map: the map is now
    /// the state at log index `index`.
    Installed {
        /// Index of the last entry the snapshot holds.
        index: u64,
        /// Bytes of the encoded map.
        bytes: usize,
    },
    /// Send an encoded Raft message to `to` (as `wire::Message::Raft`).
    Send {
        /// Destination.
        to: NodeId,
        /// The encoded message.
        bytes: Bytes,
    },
    /// A command was committed and applied; the map changed (or the command was
    /// refused, which changes nothing but is reported).
    Applied {
        /// The command.
        command: Command,
        /// What it changed, or why it was refused.
        outcome: Result<Vec<Change>, Refusal>,
    },
}

/// The members that vote: 3 of 3 or 4, 5 of 5 or more (the first ones listed),
/// all of fewer than 3. More voters only slow commits and elections; the others
/// are learners, which get every command but neither vote nor lead.
pub fn voters_of(members: &[NodeId]) -> Vec<NodeId> {
    members[..super::state::voter_target(members.len())].to_vec()
}

/// The Raft configuration a map records.
fn conf_of(state: &ClusterState) -> ConfState {
    let ids = |set: &std::collections::BTreeSet<NodeId>| -> Vec<u64> {
        set.iter().map(|n| u64::from(n.0)).collect()
    };
    ConfState::from((ids(&state.voters), ids(&state.learners)))
}

/// One member's Raft engine and its applied cluster state.
pub struct MapRaft {
    me: NodeId,
    node: RawNode<MapStorage>,
    state: ClusterState,
    rng: SmallRng,
    last_role: (u64, StateRole),
    actions: VecDeque<RaftAction>,
    /// Index of the last log entry applied (empty entries included).
    applied_index: u64,
    /// Whether the driver keeps a durable log ([`RaftAction::Persist`]).
    durable: bool,
    /// Applied entries between snapshots (0: never compact).
    snapshot_entries: u64,
    /// Leader only: ticks each member has waited in the snapshot state.
    snapshot_waits: BTreeMap<u64, u32>,
    /// Snapshots taken here, and installed from a leader.
    snapshots: SnapshotCounts,
    /// Take a snapshot at once (a learner joined: the one the leader sends it
    /// must hold its place in the group).
    snapshot_now: bool,
}

/// How many snapshots a member took and installed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotCounts {
    /// Taken of its own map (each followed by a compaction).
    pub taken: u64,
    /// Installed from a leader.
    pub installed: u64,
    /// Sent again after no acknowledgement (leader only).
    pub retried: u64,
}

impl std::fmt::Debug for MapRaft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MapRaft")
            .field("me", &self.me)
            .field("term", &self.node.raft.term)
            .field("role", &self.node.raft.state)
            .finish()
    }
}

impl MapRaft {
    /// Member `me` of a group whose first members are `members` ([`voters_of`]
    /// them vote, the others learn), starting from an empty log, with election
    /// jitter drawn from `seed`. A first member starts from the group's genesis
    /// (a snapshot at index 1 of [`ClusterState::genesis`]); a node that is not
    /// one joins later: it starts with no configuration and waits for the
    /// leader's snapshot once the group takes it as a learner.
    pub fn new(me: NodeId, members: &[NodeId], seed: u64) -> Result<Self, RaftError> {
        Self::build(me, members, seed, None)
    }

    /// Member `me` with a durable log: `log` is what its log file holds (empty for
    /// a new member). The intact records are replayed and the committed commands
    /// applied again; from then on every change comes out as a
    /// [`RaftAction::Persist`]. Also returns what the replay found (the driver cuts
    /// the file at [`persist::Replayed::valid_len`]).
    pub fn open(
        me: NodeId,
        members: &[NodeId],
        seed: u64,
        log: &[u8],
    ) -> Result<(Self, persist::Replayed), RaftError> {
        let replayed = persist::replay(log);
        let raft = Self::build(me, members, seed, Some(&replayed))?;
        Ok((raft, replayed))
    }

    fn build(
        me: NodeId,
        members: &[NodeId],
        seed: u64,
        durable: Option<&persist::Replayed>,
    ) -> Result<Self, RaftError> {
        let config = Config {
            id: u64::from(me.0),
            election_tick: ELECTION_TICKS,
            heartbeat_tick: HEARTBEAT_TICKS,
            check_quorum: true,
            pre_vote: true,
            ..Config::default()
        };
        config.validate()?;
        let mut storage = MapStorage::new(ConfState::default());
        let mut state = ClusterState::default();
        let mut applied_index = 0;
        let snapshot = durable.and_then(|r| r.snapshot.as_ref());
        if let Some((index, term, data)) = snapshot {
            // Only this member wrote the file; a snapshot in it that does not
            // decode is corruption, which stops the member rather than let it
            // rejoin with a map it never had.
            state = decode_map(data)?;
            storage.install(snapshot_of(*index, *term, conf_of(&state), data.clone()));
            applied_index = *index;
        } else if members.contains(&me) {
            // The genesis: entry 1, which every first member holds alike.
            state = ClusterState::genesis(members);
            storage.install(snapshot_of(1, 1, conf_of(&state), state.encode()));
            applied_index = 1;
        }
        let genesis = snapshot.is_none() && applied_index == 1;
        if let Some(replayed) = durable {
            storage.append(&replayed.entries)?;
            let mut hs = replayed.hard_state.clone();
            hs.commit = hs.commit.max(applied_index);
            storage.set_hard_state(hs);
        }
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let node = RawNode::new(&config, storage, &logger)?;
        let mut raft = MapRaft {
            me,
            last_role: (node.raft.term, node.raft.state),
            node,
            state,
            rng: SmallRng::seed_from_u64(seed),
            actions: VecDeque::new(),
            applied_index,
            durable: durable.is_some(),
            snapshot_entries: SNAPSHOT_ENTRIES,
            snapshot_waits: BTreeMap::new(),
            snapshots: SnapshotCounts::default(),
            snapshot_now: false,
        };
        raft.jitter();
        if genesis {
            // The file starts with the genesis, so its entries (from 2) follow
            // a snapshot when replayed.
            raft.rewrite();
        }
        // A replayed log's committed commands are applied at once.
        raft.drain_ready();
        Ok(raft)
    }

    /// The applied cluster state.
    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    /// Take a snapshot (and compact the log) every `entries` applied entries; 0
    /// never compacts.
    pub fn set_snapshot_entries(&mut self, entries: u64) {
        self.snapshot_entries = entries;
    }

    /// Snapshots taken, installed and sent again.
    pub fn snapshot_counts(&self) -> SnapshotCounts {
        self.snapshots
    }

    /// Index of the latest snapshot (0: none yet).
    pub fn snapshot_index(&self) -> u64 {
        self.node.store().latest_snapshot().get_metadata().index
    }

    /// Index of the first entry this member's log still holds.
    pub fn first_index(&self) -> u64 {
        self.node.store().first()
    }

    /// Assert the storage's invariants and that the map is the applied one: the
    /// applied index is within the log or at its snapshot, and the log never
    /// starts past what was applied.
    pub fn self_check(&self) {
        let store = self.node.store();
        store.self_check();
        assert!(
            store.first() <= self.applied_index + 1,
            "the log holds every entry after the applied one"
        );
        assert!(
            self.snapshot_index() <= self.applied_index,
            "a snapshot holds only applied entries"
        );
        assert!(self.applied_index <= store.hard_state().commit.max(self.snapshot_index()));
        let conf = self.node.raft.prs().conf().to_conf_state();
        let (mut voters, mut learners) = (conf.voters.clone(), conf.learners.clone());
        voters.sort_unstable();
        learners.sort_unstable();
        let map = conf_of(&self.state);
        assert_eq!(
            (voters, learners),
            (map.voters, map.learners),
            "the map records the group's configuration"
        );
    }

    /// Leader: whether `node`'s log holds every committed entry (a learner
    /// promoted before it does could hold up commits).
    pub fn caught_up(&self, node: NodeId) -> bool {
        let committed = self.node.raft.raft_log.committed;
        self.node
            .raft
            .prs()
            .get(u64::from(node.0))
            .is_some_and(|p| p.matched >= committed)
    }

    /// Whether a configuration change is proposed and not yet applied (the
    /// group takes one at a time).
    pub fn conf_pending(&self) -> bool {
        self.node.raft.has_pending_conf()
    }

    /// The leader this member knows of.
    pub fn leader(&self) -> Option<NodeId> {
        let id = self.node.raft.leader_id;
        (id != 0).then_some(NodeId(id as u32))
    }

    /// True if this member leads.
    pub fn is_leader(&self) -> bool {
        self.node.raft.state == StateRole::Leader
    }

    /// Index of the last log entry this member applied.
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    /// Index of the last entry in this member's log (committed or not).
    pub fn last_index(&self) -> u64 {
        self.node.raft.raft_log.last_index()
    }

    /// The current term.
    pub fn term(&self) -> u64 {
        self.node.raft.term
    }

    /// The next thing the driver must do.
    pub fn poll_action(&mut self) -> Option<RaftAction> {
        self.actions.pop_front()
    }

    /// One clock tick (the driver ticks at a fixed interval).
    pub fn tick(&mut self) {
        self.node.tick();
        self.retry_snapshots();
        self.after_input();
    }

    /// Leader: a member that has waited [`SNAPSHOT_RETRY_TICKS`] for a snapshot
    /// (the message lost with a connection, or the member crashed during the
    /// install) goes back to probing, which sends the snapshot again.
    fn retry_snapshots(&mut self) {
        if !self.is_leader() {
            self.snapshot_waits.clear();
            return;
        }
        let waiting: Vec<u64> = self
            .node
            .raft
            .prs()
            .iter()
            .filter(|(_, pr)| pr.state == ProgressState::Snapshot)
            .map(|(&id, _)| id)
            .collect();
        self.snapshot_waits.retain(|id, _| waiting.contains(id));
        for id in waiting {
            let ticks = self.snapshot_waits.entry(id).or_insert(0);
            *ticks += 1;
            if *ticks >= SNAPSHOT_RETRY_TICKS {
                self.snapshot_waits.remove(&id);
                self.snapshots.retried += 1;
                self.node.report_snapshot(id, SnapshotStatus::Failure);
            }
        }
    }

    /// A Raft message from `from`.
    pub fn handle_message(&mut self, from: NodeId, bytes: &[u8]) -> Result<(), RaftError> {
        // A member of the map, or anyone while this node has no map yet (it
        // joins: the leader's first messages come before it knows the group).
        let known = self.state.nodes.contains_key(&from)
            || self.state.voters.contains(&from)
            || self.state.learners.contains(&from);
        if !known && !self.state.nodes.is_empty() {
            return Err(RaftError::Stranger(from));
        }
        let msg = RaftMessage::parse_from_bytes(bytes)?;
        if msg.from != u64::from(from.0) {
            return Err(RaftError::Stranger(from));
        }
        self.check(&msg)?;
        let result = self.node.step(msg);
        self.after_input();
        result.map_err(RaftError::from)
    }

    /// Refuse what no correct member sends. raft-rs trusts its peers and panics on
    /// some impossible inputs (a commit index past the log, an append rewriting a
    /// committed entry); a member link is input like any other, so those are
    /// stopped here and the sender is logged.
    fn check(&self, msg: &RaftMessage) -> Result<(), RaftError> {
        use raft::prelude::MessageType as T;
        let log = &self.node.raft.raft_log;
        match msg.get_msg_type() {
            T::MsgSnapshot => self.check_snapshot(msg)?,
            T::MsgAppend
            | T::MsgAppendResponse
            | T::MsgHeartbeat
            | T::MsgHeartbeatResponse
            | T::MsgRequestVote
            | T::MsgRequestVoteResponse
            | T::MsgRequestPreVote
            | T::MsgRequestPreVoteResponse
            | T::MsgTimeoutNow => {}
            // Local inputs (MsgHup, MsgBeat, ...) and kinds weir does not send
            // between members (proposals go through `wire::Message::Propose`).
            _ => return Err(RaftError::Unexpected("local or unused message kind")),
        }
        if msg.to != u64::from(self.me.0) || msg.from == u64::from(self.me.0) {
            return Err(RaftError::Impossible(
                "not addressed from a peer to this member",
            ));
        }
        if msg.term == 0 {
            // Every message between members carries its sender's term.
            return Err(RaftError::Impossible("no term"));
        }
        match msg.get_msg_type() {
            T::MsgHeartbeat if msg.commit > log.last_index() => {
                // The leader sends min(what we matched, its commit).
                return Err(RaftError::Impossible("heartbeat commit past this log"));
            }
            T::MsgAppend => {
                // Every entry has a term, so the entry before the new ones does
                // too (raft-rs takes term 0 past the log's end as a match).
                if (msg.index > 0 && msg.log_term == 0) || msg.log_term > msg.term {
                    return Err(RaftError::Impossible("append after an entry with no term"));
                }
                for (i, e) in msg.entries.iter().enumerate() {
                    if e.index != msg.index + 1 + i as u64 || e.term == 0 || e.term > msg.term {
                        return Err(RaftError::Impossible("append entries out of sequence"));
                    }
                    // An entry this member has committed can only be sent again
                    // as it is.
                    if e.index <= log.committed && log.term(e.index).ok() != Some(e.term) {
                        return Err(RaftError::Impossible("append rewrites a committed entry"));
                    }
                }
            }
            T::MsgAppendResponse if !msg.reject && msg.index > log.last_index() => {
                return Err(RaftError::Impossible(
                    "append response past the leader's log",
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// A snapshot replaces this member's map: it must decode to a valid map, of
    /// this group, at a real (index, term).
    fn check_snapshot(&self, msg: &RaftMessage) -> Result<(), RaftError> {
        let snap = msg.get_snapshot();
        let meta = snap.get_metadata();
        if meta.index == 0 || meta.term == 0 || meta.term > msg.term {
            return Err(RaftError::Impossible("snapshot at no entry"));
        }
        let Ok(map) = decode_map(&snap.data) else {
            return Err(RaftError::Impossible("snapshot is not a valid map"));
        };
        let mut conf = meta.get_conf_state().clone();
        conf.voters.sort_unstable();
        conf.learners.sort_unstable();
        if conf != conf_of(&map) || map.voters.is_empty() {
            return Err(RaftError::Impossible(
                "snapshot's configuration is not its map's",
            ));
        }
        Ok(())
    }

    /// Start an election now instead of waiting for the timeout (used once at
    /// cluster start, so the first map change need not wait for an election).
    pub fn campaign(&mut self) -> Result<(), RaftError> {
        self.node.campaign()?;
        self.after_input();
        Ok(())
    }

    /// Hand leadership to `to` (leader only; raft-rs catches `to` up first).
    pub fn transfer_leader(&mut self, to: NodeId) {
        self.node.transfer_leader(u64::from(to.0));
        self.after_input();
    }

    /// Propose `command` (leader only). A [`Command::Conf`] goes as a Raft
    /// configuration change (one at a time: raft-rs turns one proposed while
    /// another is pending into an empty entry, and the proposer asks again).
    pub fn propose(&mut self, command: &Command) -> Result<(), RaftError> {
        if !self.is_leader() {
            return Err(RaftError::NotLeader(self.leader()));
        }
        let data = postcard::to_allocvec(command).expect("commands always encode");
        if let Command::Conf { node, role } = command {
            let mut cc = ConfChange::default();
            cc.set_change_type(change_type(*role));
            cc.node_id = u64::from(node.0);
            cc.context = data.into();
            self.node.propose_conf_change(vec![], cc)?;
        } else {
            self.node.propose(vec![], data)?;
        }
        self.after_input();
        Ok(())
    }

    /// Draw a fresh election timeout from the seeded generator.
    fn jitter(&mut self) {
        let t = self.rng.gen_range(ELECTION_TICKS..2 * ELECTION_TICKS);
        self.node.raft.set_randomized_election_timeout(t);
    }

    fn after_input(&mut self) {
        let role = (self.node.raft.term, self.node.raft.state);
        if role != self.last_role {
            // raft-rs re-randomizes on every reset from the OS random source; replace
            // that draw with the seeded one before the next tick reads it.
            self.last_role = role;
            self.jitter();
        }
        self.drain_ready();
    }

    /// Process everything raft-rs has ready: send, install, persist (in memory),
    /// apply; then snapshot the map if it is time.
    fn drain_ready(&mut self) {
        while self.node.has_ready() {
            let mut ready = self.node.ready();
            self.send_all(ready.take_messages());
            if !ready.snapshot().is_empty() {
                let snapshot = ready.snapshot().clone();
                self.install(snapshot);
            }
            let committed = ready.take_committed_entries();
            self.apply(committed);
            let entries = ready.entries().clone();
            if !entries.is_empty() {
                if let Err(e) = self.node.mut_store().append(&entries) {
                    // raft-rs hands entries that follow the log; a gap is a bug.
                    debug_assert!(false, "entries from raft leave a gap: {e}");
                    tracing::error!(error = %e, "entries from raft not appended");
                }
            }
            let hs = ready.hs().cloned();
            if let Some(hs) = &hs {
                self.node.mut_store().set_hard_state(hs.clone());
            }
            if self.durable && (!entries.is_empty() || hs.is_some()) {
                let record = persist::encode_record(hs.as_ref(), &entries);
                self.actions
                    .push_back(RaftAction::Persist(Bytes::from(record)));
            }
            self.send_all(ready.take_persisted_messages());
            let mut light = self.node.advance(ready);
            if let Some(commit) = light.commit_index() {
                let store = self.node.mut_store();
                store.set_commit(commit);
                if self.durable {
                    let record = persist::encode_record(Some(store.hard_state()), &[]);
                    self.actions
                        .push_back(RaftAction::Persist(Bytes::from(record)));
                }
            }
            self.send_all(light.take_messages());
            let committed = light.take_committed_entries();
            self.apply(committed);
            self.node.advance_apply();
        }
        self.maybe_snapshot();
    }

    /// Install the leader's snapshot (checked on arrival by
    /// [`Self::check_snapshot`]): the map becomes the snapshot's, the log restarts
    /// after it, and a durable member's file is rewritten.
    fn install(&mut self, snapshot: Snapshot) {
        let index = snapshot.get_metadata().index;
        let state = match decode_map(&snapshot.data) {
            Ok(state) => state,
            Err(e) => {
                // Checked when the message arrived; raft-rs hands that snapshot.
                debug_assert!(false, "a checked snapshot does not decode: {e}");
                tracing::error!(error = %e, "snapshot not installed");
                return;
            }
        };
        debug_assert!(
            index > self.applied_index,
            "raft-rs installs only newer maps"
        );
        let bytes = snapshot.data.len();
        self.node.mut_store().install(snapshot);
        self.state = state;
        self.applied_index = index;
        self.snapshots.installed += 1;
        self.rewrite();
        self.actions
            .push_back(RaftAction::Installed { index, bytes });
    }

    /// Take a snapshot of the map at the applied index and compact the log, once
    /// [`Self::set_snapshot_entries`] entries were applied since the last one.
    fn maybe_snapshot(&mut self) {
        let last = self.snapshot_index();
        let due = self.snapshot_entries > 0 && self.applied_index >= last + self.snapshot_entries;
        let now = std::mem::take(&mut self.snapshot_now) && self.applied_index > last;
        if !due && !now {
            return;
        }
        let index = self.applied_index;
        let Ok(term) = self.node.store().term(index) else {
            // Applied entries are in the log (it is compacted only up to here).
            debug_assert!(false, "applied entry {index} not in the log");
            return;
        };
        let conf = self.node.store().conf_state().clone();
        let data = self.state.encode();
        let store = self.node.mut_store();
        store.set_snapshot(snapshot_of(index, term, conf, data));
        let keep = if self.snapshot_entries == 0 {
            // Never compacted: the snapshot is only for a joining learner.
            index
        } else {
            self.snapshot_entries / 2
        };
        if let Err(e) = store.compact(index.saturating_sub(keep)) {
            debug_assert!(false, "compaction below the applied index: {e}");
        }
        self.snapshots.taken += 1;
        self.rewrite();
    }

    /// A durable member's whole file, replaced: its latest snapshot, hard state
    /// and the entries after the snapshot.
    fn rewrite(&mut self) {
        if !self.durable {
            return;
        }
        let store = self.node.store();
        let image =
            persist::encode_image(store.latest_snapshot(), store.hard_state(), store.held());
        self.actions
            .push_back(RaftAction::Rewrite(Bytes::from(image)));
    }

    fn send_all(&mut self, messages: Vec<RaftMessage>) {
        for m in messages {
            let to = NodeId(m.to as u32);
            match m.write_to_bytes() {
                Ok(bytes) => self.actions.push_back(RaftAction::Send {
                    to,
                    bytes: Bytes::from(bytes),
                }),
                Err(e) => tracing::error!(%to, error = %e, "raft message not encodable"),
            }
        }
    }

    fn apply(&mut self, entries: Vec<Entry>) {
        for entry in entries {
            if entry.index <= self.applied_index {
                continue; // In the snapshot the map came from.
            }
            self.applied_index = entry.index;
            if entry.get_entry_type() == EntryType::EntryConfChange {
                self.apply_conf(&entry);
                continue;
            }
            if entry.get_entry_type() != EntryType::EntryNormal || entry.data.is_empty() {
                continue; // The leader's empty entry of a new term.
            }
            let command: Command = match postcard::from_bytes(&entry.data) {
                Ok(c) => c,
                Err(e) => {
                    // Only members propose, and they encode with this code: a bad
                    // entry means corruption. Every member skips it alike.
                    tracing::error!(index = entry.index, error = %e, "undecodable log entry skipped");
                    continue;
                }
            };
            let outcome = match command {
                Command::Conf { node, role } => {
                    // Only a configuration entry changes the group.
                    self.state.applied += 1;
                    Err(Refusal::BadConf {
                        node,
                        role,
                        why: "not in a configuration entry",
                    })
                }
                _ => self.state.apply(&command),
            };
            self.actions
                .push_back(RaftAction::Applied { command, outcome });
        }
    }

    /// Apply a configuration entry: the map's change and raft-rs's together, or
    /// neither (every member decides alike, from the same map and group).
    fn apply_conf(&mut self, entry: &Entry) {
        let decoded = ConfChange::parse_from_bytes(&entry.data)
            .ok()
            .and_then(|cc| Some((postcard::from_bytes::<Command>(&cc.context).ok()?, cc)));
        let Some((command, cc)) = decoded else {
            tracing::error!(
                index = entry.index,
                "undecodable configuration entry skipped"
            );
            return;
        };
        let conf = match &command {
            Command::Conf { node, role }
                if cc.node_id == u64::from(node.0)
                    && cc.get_change_type() == change_type(*role) =>
            {
                Some((*node, *role))
            }
            _ => None,
        };
        let joins = !(self.state.voters.contains(&NodeId(cc.node_id as u32))
            || self.state.learners.contains(&NodeId(cc.node_id as u32)));
        let applied_before = self.state.applied;
        // Checked against the map first, then raft-rs takes it, then the map:
        // both change, or neither.
        let outcome = match conf.map(|(node, role)| self.state.check_conf(node, role)) {
            None => Err(Refusal::Invariant(
                "a configuration entry that says two things".into(),
            )),
            Some(Err(refusal)) => Err(refusal),
            Some(Ok(())) => match self.node.apply_conf_change(&cc) {
                Ok(conf) => {
                    self.node.mut_store().set_conf_state(conf);
                    self.snapshot_now |= joins;
                    let applied = self.state.apply(&command);
                    debug_assert!(applied.is_ok(), "a checked change applies");
                    applied
                }
                Err(e) => {
                    tracing::error!(error = %e, ?command, "raft refused a configuration change");
                    Err(Refusal::Invariant(format!("raft refused it: {e}")))
                }
            },
        };
        if outcome.is_err() && applied_before == self.state.applied {
            // A refused entry counts as applied, as a refused command does.
            self.state.applied += 1;
        }
        self.actions
            .push_back(RaftAction::Applied { command, outcome });
    }
}

/// raft-rs's change for a role.
fn change_type(role: ConfRole) -> ConfChangeType {
    match role {
        ConfRole::Voter => ConfChangeType::AddNode,
        ConfRole::Learner => ConfChangeType::AddLearnerNode,
        ConfRole::Gone => ConfChangeType::RemoveNode,
    }
}

/// A snapshot of the map `data` at (index, term) of a group with configuration
/// `conf`.
fn snapshot_of(index: u64, term: u64, conf: ConfState, data: Vec<u8>) -> Snapshot {
    let mut snapshot = Snapshot::default();
    let meta = snapshot.mut_metadata();
    meta.index = index;
    meta.term = term;
    meta.set_conf_state(conf);
    snapshot.data = data.into();
    snapshot
}

/// Decode a snapshot's map and check it: a map from the network (or a file) is
/// never trusted.
fn decode_map(data: &[u8]) -> Result<ClusterState, RaftError> {
    ClusterState::decode(data).map_err(|e| match e {
        MapDecodeError::Malformed(_) => RaftError::Impossible("snapshot does not decode"),
        MapDecodeError::Invalid(_) => RaftError::Impossible("snapshot breaks the map's invariants"),
    })
}

#[cfg(test)]
mod tests;
