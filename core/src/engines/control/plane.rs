//! The control plane of one node, sans-IO: its Raft member, the leader's failure
//! detector and the bootstrap of the cluster map.
//!
//! - Every node heartbeats the Raft leader once per tick, stamped with its cluster
//!   clock; the leader's answer grants it a lease (below).
//! - The leader marks a node down when it has not heard from it for the detection
//!   timeout (proposing `NodeDown`, which fails its extents over), and up again when
//!   it hears from it (`NodeUp`: its replicas start rebuilding). A new leader first
//!   waits a whole detection timeout, so it never declares down a node it simply has
//!   not had time to hear from.
//!
//! Leases (DESIGN.md section 4.1: a primary serves only while it holds one, a new
//! primary only after the old one's has run out):
//! - The leader's own lease runs `lease_ns` past the send time of the latest
//!   heartbeat by which a majority of voters (itself included) still followed it.
//!   A rival leader needs a majority's votes, and one of those voters heartbeated
//!   this leader before voting for the rival, so this lease ends before the rival's
//!   reign is `lease_ns` old.
//! - A node's lease runs `lease_ns` past the send time of a heartbeat the leader
//!   answered, but never past the answering leader's own lease. Send times, not
//!   arrival times: a node stalled with heartbeats queued gains nothing from them.
//! - Only a node whose map is current gets a lease: its heartbeat says which log
//!   entry it applied last, and the leader answers only if that is the last entry
//!   of its own log (the leader renews its own lease under the same rule). So a node
//!   that was cut off and comes back never serves from its old map: by the time it
//!   holds a lease again it has applied whatever moved its extents away. Any later
//!   move is proposed after this heartbeat arrived, and waits out this lease.
//! - `NodeDown` records when the silent node's lease surely ended: `lease_ns` after
//!   the later of its last heartbeat's arrival and the start of this leader's reign.
//!   Its extents' new primaries serve only after that (`serve_after_ns`).
//! - The first leader of an empty log proposes the bootstrap commands (members and
//!   the volume), which reproduce exactly the static map every node starts with.
//!
//! Time comes in with every call (`now_ns`); the driver ticks at a fixed interval.

use super::raft::{MapRaft, RaftAction, RaftError};
use super::state::{ClusterState, Command, NodeStatus};
use crate::ids::{Epoch, ExtentId, NodeId};
use crate::wire::Message;
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Ticks between a restarted node's requests for `Restarted`.
const RESTART_ASK_TICKS: u32 = 5;
/// Most replicas moving off leaving nodes at once (each move rebuilds a whole
/// extent on its new node).
pub const MOVES_MAX: usize = 4;
/// Ticks the leader waits after a configuration change was refused before it
/// proposes another (a refusal means the map changed under it).
const CONF_BACKOFF_TICKS: u32 = 10;
/// Ticks the leader waits after a move was refused because the map is full
/// before it proposes moves again.
const MOVE_BACKOFF_TICKS: u32 = 100;

/// Something the driver must do.
#[derive(Debug)]
pub enum PlaneAction {
    /// Send `msg` to `to`.
    Send {
        /// Destination.
        to: NodeId,
        /// The message.
        msg: Message,
    },
    /// The cluster map changed: hand it to the data path.
    Map {
        /// The applied state.
        state: ClusterState,
        /// This node restarted and its `Restarted` is not applied in it yet:
        /// its data path must not serve.
        restart_pending: bool,
    },
    /// A control-plane event worth a line in a report (failover, node down/up).
    Event(crate::events::Event),
    /// Append this record to the node's Raft log file and make it durable before
    /// carrying out any later action (nodes opened with [`ControlPlane::open`]).
    Persist(Bytes),
    /// Replace the node's whole Raft log file with this image, durably and
    /// atomically, before carrying out any later action (after a snapshot).
    Rewrite(Bytes),
}

/// The control plane of one node.
#[derive(Debug)]
pub struct ControlPlane {
    me: NodeId,
    raft: MapRaft,
    bootstrap: Vec<Command>,
    bootstrap_term: Option<u64>,
    timeouts: Timeouts,
    /// Leader only: when each node was last heard from healthy.
    last_seen: BTreeMap<NodeId, u64>,
    /// Leader only: when each node was last heard from at all (for the quorum the
    /// failure detector needs).
    heard: BTreeMap<NodeId, u64>,
    /// Leader only: send time of each voter's latest heartbeat.
    voter_sent: BTreeMap<NodeId, u64>,
    /// This node's lease (cluster clock, ns): it may serve as a primary until then.
    lease_until_ns: u64,
    /// False while the node's own device is stalled: it neither heartbeats nor
    /// renews its own lease, so its extents fail over, and a leader hands over.
    healthy: bool,
    leader_since_ns: Option<u64>,
    /// Proposals in flight, so the detector does not repeat them every tick.
    proposed: BTreeSet<(NodeId, bool)>,
    /// Replacements in flight.
    replacing: BTreeSet<NodeId>,
    /// Leader only: extents with a move (its start or finish) proposed.
    moves_proposed: BTreeSet<ExtentId>,
    /// Leader only: ticks before the next configuration change.
    conf_backoff: u32,
    /// Leader only: ticks before the next moves, after a full map refused one.
    move_backoff: u32,
    actions: VecDeque<PlaneAction>,
    /// The epochs of the map this node had when it restarted (None: a new node).
    restored: Option<BTreeMap<ExtentId, Epoch>>,
    /// A restarted node asks for `Restarted` until it sees it applied.
    restart_pending: bool,
    /// Ticks until it asks again.
    restart_wait: u32,
    /// The incarnation its `Restarted` names (0: none asked for yet).
    incarnation: u64,
    /// This process's nonce in its `Restarted` (drawn at open).
    boot: u64,
    /// When this incarnation sent its first heartbeat: leases answer only later ones.
    first_heartbeat_ns: Option<u64>,
}

/// The daemon's default lease, ns (`[timeouts] lease_ms`).
pub const DEFAULT_LEASE_NS: u64 = 1_500_000_000;

/// The control plane's timeouts, ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// How long a lease lasts past the heartbeat that earned it.
    pub lease_ns: u64,
    /// How long a node may be silent before the leader declares it down. Shorter
    /// than the lease: the down node leaves every in-sync set at once (writes stop
    /// waiting for it), while its extents' new primaries wait for its lease.
    pub detect_ns: u64,
    /// How long a node may stay down before the leader gives up on it and its
    /// replicas move to spares ([`Command::ReplaceNode`]); 0: never.
    pub replace_ns: u64,
}

impl ControlPlane {
    /// The control plane of `me` in a group of `members` (the first 3 or 5 vote,
    /// see [`super::raft::voters_of`]; the others learn the map); `bootstrap` are
    /// the commands that build the initial map.
    pub fn new(
        me: NodeId,
        members: &[NodeId],
        bootstrap: Vec<Command>,
        timeouts: Timeouts,
        seed: u64,
    ) -> Result<Self, RaftError> {
        let mut raft = MapRaft::new(me, members, seed)?;
        if members.first() == Some(&me) {
            // The first voter stands for election at once: a fresh cluster has a
            // leader after one round trip instead of after an election timeout.
            raft.campaign()?;
        }
        Ok(Self::with_raft(me, raft, bootstrap, timeouts))
    }

    fn with_raft(me: NodeId, raft: MapRaft, bootstrap: Vec<Command>, timeouts: Timeouts) -> Self {
        ControlPlane {
            me,
            raft,
            bootstrap,
            bootstrap_term: None,
            timeouts,
            last_seen: BTreeMap::new(),
            heard: BTreeMap::new(),
            voter_sent: BTreeMap::new(),
            lease_until_ns: 0,
            healthy: true,
            leader_since_ns: None,
            proposed: BTreeSet::new(),
            replacing: BTreeSet::new(),
            moves_proposed: BTreeSet::new(),
            conf_backoff: 0,
            move_backoff: 0,
            actions: VecDeque::new(),
            restored: None,
            restart_pending: false,
            restart_wait: 0,
            incarnation: 0,
            boot: 0,
            first_heartbeat_ns: None,
        }
    }

    /// The control plane of `me` with a durable Raft log: `log` is what the node's
    /// log file holds (empty for a new node). A node with a log restarted: it
    /// replays it, reaching the map it had, and asks for [`Command::Restarted`]
    /// (a new epoch for each of its extents) before its data path serves again.
    /// Also returns where the intact records end (cut the file there).
    pub fn open(
        me: NodeId,
        members: &[NodeId],
        bootstrap: Vec<Command>,
        timeouts: Timeouts,
        seed: u64,
        log: &[u8],
    ) -> Result<(Self, usize), RaftError> {
        let (mut raft, replayed) = MapRaft::open(me, members, seed, log)?;
        if members.first() == Some(&me) && replayed.records == 0 {
            raft.campaign()?;
        }
        let mut plane = Self::with_raft(me, raft, bootstrap, timeouts);
        // The replayed commands first: a `Restarted` of an earlier incarnation
        // among them must not count as this one's.
        plane.drain_raft();
        // Never 0 (a node that never asked): this process's own nonce.
        plane.boot = seed | 1;
        // A node that joined and restarted before the group took it holds
        // nothing yet: it starts again as a joining node.
        if replayed.records > 0 && plane.state().nodes.contains_key(&me) {
            let epochs = plane
                .state()
                .extents
                .iter()
                .map(|(&id, e)| (id, e.epoch))
                .collect();
            plane.restored = Some(epochs);
            plane.restart_pending = true;
            // The replay's maps are of this restart too.
            for action in &mut plane.actions {
                if let PlaneAction::Map {
                    restart_pending, ..
                } = action
                {
                    *restart_pending = true;
                }
            }
        }
        Ok((plane, replayed.valid_len))
    }

    /// Snapshot the map and compact the Raft log every `entries` applied entries
    /// (default [`super::raft::SNAPSHOT_ENTRIES`]; 0: never).
    pub fn with_snapshot_entries(mut self, entries: u64) -> Self {
        self.raft.set_snapshot_entries(entries);
        self
    }

    /// The Raft member's snapshots: taken, installed, sent again.
    pub fn snapshot_counts(&self) -> super::raft::SnapshotCounts {
        self.raft.snapshot_counts()
    }

    /// Check the Raft member's invariants (see [`MapRaft::self_check`]).
    pub fn self_check(&self) {
        self.raft.self_check();
    }

    /// For a restarted node, the epoch of each extent in the map it restarted
    /// with: its data path serves as a primary only at later epochs.
    pub fn restored_epochs(&self) -> Option<&BTreeMap<ExtentId, Epoch>> {
        self.restored.as_ref()
    }

    /// The applied cluster state.
    pub fn state(&self) -> &ClusterState {
        self.raft.state()
    }

    /// The Raft group's voters, as the map records them.
    fn voters(&self) -> &BTreeSet<NodeId> {
        &self.raft.state().voters
    }

    /// The Raft leader this node knows of.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.leader()
    }

    /// Whether this node can serve (its device answers). An unhealthy node stops
    /// heartbeating, so the leader declares it down and its extents fail over once
    /// its lease runs out; a leader also hands leadership to another voter. When it
    /// is healthy again its heartbeats bring it back up, and its replicas rebuild.
    pub fn set_healthy(&mut self, healthy: bool) {
        self.healthy = healthy;
    }

    /// End of this node's lease (cluster clock, ns); 0 if it never held one.
    pub fn lease_until_ns(&self) -> u64 {
        self.lease_until_ns
    }

    /// The next thing the driver must do.
    pub fn poll_action(&mut self) -> Option<PlaneAction> {
        self.actions.pop_front()
    }

    /// A Raft message arrived.
    pub fn handle_raft(&mut self, from: NodeId, bytes: &[u8]) {
        if let Err(e) = self.raft.handle_message(from, bytes) {
            tracing::warn!(%from, error = %e, "raft message refused");
        }
        self.drain_raft();
    }

    /// This node wants `command` committed: propose it if leading, else forward it
    /// to the leader.
    pub fn request(&mut self, command: &Command) {
        if self.raft.is_leader() {
            self.propose(command);
            return;
        }
        match self.raft.leader() {
            Some(leader) => {
                let command = Bytes::from(postcard::to_allocvec(command).expect("commands encode"));
                self.actions.push_back(PlaneAction::Send {
                    to: leader,
                    msg: Message::Propose { command },
                });
            }
            None => tracing::debug!(
                ?command,
                "no leader to take the request; it will be asked again"
            ),
        }
    }

    /// A member asks the leader to propose a command. Only data-path requests
    /// (dropping a replica, a replica rebuilt, from the extent's primary) and named
    /// volume changes (their QoS too) are taken from others; membership stays the
    /// leader's.
    pub fn handle_propose(&mut self, from: NodeId, bytes: &[u8]) {
        if !self.state().nodes.contains_key(&from) || !self.raft.is_leader() {
            return;
        }
        match postcard::from_bytes::<Command>(bytes) {
            // Only an extent's primary may drop one of its replicas or declare one
            // rebuilt.
            Ok(
                cmd @ (Command::DropReplica { extent, .. } | Command::RebuildDone { extent, .. }),
            ) if self
                .state()
                .extents
                .get(&extent)
                .is_some_and(|e| e.primary == from) =>
            {
                self.propose(&cmd)
            }
            // Any member may create, change or delete a named volume for its
            // users, allocate or trim its extents for its front end, and
            // report a freed extent zeroed (its reclaimer).
            Ok(
                cmd @ (Command::CreateNamed { .. }
                | Command::SetQos { .. }
                | Command::DeleteNamed { .. }
                | Command::Allocate { .. }
                | Command::Trim { .. }
                | Command::Zeroed { .. }
                | Command::Snapshot { .. }
                | Command::DeleteSnapshot { .. }
                | Command::Clone { .. }
                | Command::Rollback { .. }
                | Command::Redirect { .. }
                | Command::Filled { .. }
                | Command::Resize { .. }),
            ) => self.propose(&cmd),
            // An operator adds or removes a node through any member.
            Ok(cmd @ (Command::JoinNode { .. } | Command::RemoveNode { .. })) => self.propose(&cmd),
            // A node says it restarted, for itself only.
            Ok(cmd @ Command::Restarted { node, .. }) if node == from => self.propose(&cmd),
            Ok(other) => tracing::warn!(%from, ?other, "command not taken from a member"),
            Err(e) => tracing::warn!(%from, error = %e, "undecodable proposal"),
        }
    }

    /// A heartbeat `from` a member, sent at `sent_ns` when it had applied log entry
    /// `applied`, arrived at `now_ns`. The leader notes it and, while it holds its
    /// own lease, grants one back if the member's map is current. A member whose
    /// device is stalled or gone says it is not `healthy`: it still counts towards
    /// the quorum the failure detector needs, but gets no lease and is declared
    /// down like a silent one.
    pub fn handle_heartbeat(
        &mut self,
        from: NodeId,
        sent_ns: u64,
        applied: u64,
        healthy: bool,
        now_ns: u64,
    ) {
        if !self.raft.is_leader() || !self.state().nodes.contains_key(&from) {
            return;
        }
        self.heard.insert(from, now_ns);
        if self.voters().contains(&from) {
            // A voter that follows this leader backs its lease, healthy or not. A
            // stamp from the future (a skewed or hostile clock) counts as now.
            let sent = sent_ns.min(now_ns);
            let e = self.voter_sent.entry(from).or_default();
            *e = (*e).max(sent);
        }
        if !healthy {
            return;
        }
        self.last_seen.insert(from, now_ns);
        let mine = self.leader_lease(now_ns);
        if self.healthy {
            self.lease_until_ns = self.lease_until_ns.max(mine);
        }
        if mine > now_ns && applied >= self.raft.last_index() {
            let lease_until_ns = mine.min(sent_ns.saturating_add(self.timeouts.lease_ns));
            debug_assert!(self.raft.is_leader() && lease_until_ns <= mine);
            self.actions.push_back(PlaneAction::Send {
                to: from,
                msg: Message::HeartbeatAck {
                    sent_ns,
                    lease_until_ns,
                },
            });
        }
    }

    /// The leader answered this node's heartbeat of `sent_ns` with a lease.
    pub fn handle_heartbeat_ack(&mut self, from: NodeId, sent_ns: u64, lease_until_ns: u64) {
        if !self.healthy {
            return;
        }
        if self.first_heartbeat_ns.is_none_or(|first| sent_ns < first) {
            // An answer to a heartbeat this incarnation never sent (an earlier
            // one's, before a restart): that lease was not granted to this one.
            return;
        }
        if !self.voters().contains(&from) {
            tracing::warn!(%from, "lease from a node that cannot lead; ignored");
            return;
        }
        // Never longer than a lease from the heartbeat's own send time.
        let until = lease_until_ns.min(sent_ns.saturating_add(self.timeouts.lease_ns));
        self.lease_until_ns = self.lease_until_ns.max(until);
    }

    /// The leader's own lease at `now_ns`: `lease_ns` past the send time of the
    /// latest heartbeat by which a majority of voters followed it; 0 if none, or if
    /// its own map lags its log.
    fn leader_lease(&self, now_ns: u64) -> u64 {
        if !self.raft.is_leader() || self.raft.applied_index() < self.raft.last_index() {
            return 0;
        }
        let mut sent: Vec<u64> = self
            .voters()
            .iter()
            .map(|v| {
                if *v == self.me {
                    now_ns
                } else {
                    self.voter_sent.get(v).copied().unwrap_or(0)
                }
            })
            .collect();
        sent.sort_unstable_by(|a, b| b.cmp(a));
        let quorum = self.voters().len() / 2 + 1;
        match sent.get(quorum - 1) {
            Some(&t) if t > 0 => t + self.timeouts.lease_ns,
            _ => 0,
        }
    }

    /// One tick at `now_ns`.
    pub fn tick(&mut self, now_ns: u64) {
        self.raft.tick();
        self.drain_raft();
        if self.restart_pending && self.raft.leader().is_some() {
            self.ask_restarted();
        }
        match self.raft.leader() {
            Some(leader) if leader != self.me => self.heartbeat(leader, now_ns),
            _ => {}
        }
        if !self.raft.is_leader() {
            self.leader_since_ns = None;
            self.proposed.clear();
            self.replacing.clear();
            self.moves_proposed.clear();
            return;
        }
        if self.leader_since_ns.is_none() {
            // A new reign: what an earlier reign heard says nothing about now.
            self.last_seen.clear();
            self.heard.clear();
            self.voter_sent.clear();
        }
        let mine = self.leader_lease(now_ns);
        if !self.healthy {
            self.hand_over("device stalled");
            return;
        }
        if !self.voters().is_empty() && !self.voters().contains(&self.me) {
            // Demoted by an earlier leader's change, committed in this reign:
            // a leader that cannot vote gets no lease answered, nor do the
            // nodes whose heartbeats it answers.
            self.hand_over("leading without a vote");
            return;
        }
        self.lease_until_ns = self.lease_until_ns.max(mine);
        let since = *self.leader_since_ns.get_or_insert(now_ns);
        // Until the volume exists, each new leader proposes the whole bootstrap again
        // (a previous leader may have died half-way; repeats are refused harmlessly).
        if self.state().volumes.is_empty() && self.bootstrap_term != Some(self.raft.term()) {
            self.bootstrap_term = Some(self.raft.term());
            for cmd in self.bootstrap.clone() {
                self.propose(&cmd);
            }
        }
        self.detect(now_ns, since);
        if !self.state().volumes.is_empty() {
            self.move_replicas(now_ns);
            self.reconfigure(now_ns, since);
        }
    }

    /// Ask for this restarted node's `Restarted` until it is applied, every
    /// few ticks: a lost request costs that long, a repeated one only a
    /// spare epoch.
    fn ask_restarted(&mut self) {
        if self.restart_wait == 0 {
            // Above every incarnation of this node applied so far (an earlier
            // one's may have been applied by the others after this node's log
            // last heard of it).
            let applied = self.state().incarnations.get(&self.me).copied();
            self.incarnation = self.incarnation.max(applied.unwrap_or(0).saturating_add(1));
            self.request(&Command::Restarted {
                node: self.me,
                incarnation: self.incarnation,
                boot: self.boot,
            });
            self.restart_wait = RESTART_ASK_TICKS;
        }
        self.restart_wait -= 1;
    }

    /// Heartbeat `leader` at `now_ns`.
    fn heartbeat(&mut self, leader: NodeId, now_ns: u64) {
        self.first_heartbeat_ns.get_or_insert(now_ns);
        self.actions.push_back(PlaneAction::Send {
            to: leader,
            msg: Message::Heartbeat {
                sent_ns: now_ns,
                applied: self.raft.applied_index(),
                healthy: self.healthy,
            },
        })
    }

    /// The leader's failure detector. It judges only while a majority of voters
    /// (itself included) heard from it within the detection timeout: a leader cut
    /// off from the rest would otherwise declare them all down, and those stale
    /// proposals would commit once the cut heals. A leader the map calls down (such
    /// a proposal from an earlier reign) declares itself up again.
    fn detect(&mut self, now_ns: u64, leader_since_ns: u64) {
        if self.state().nodes.get(&self.me) == Some(&NodeStatus::Down)
            && self.proposed.insert((self.me, false))
            && !self.try_propose(&Command::NodeUp { node: self.me })
        {
            self.proposed.remove(&(self.me, false));
        }
        let fresh = self
            .voters()
            .iter()
            .filter(|&&v| {
                v == self.me
                    || self
                        .heard
                        .get(&v)
                        .is_some_and(|&t| now_ns.saturating_sub(t) <= self.timeouts.detect_ns)
            })
            .count();
        if fresh < self.voters().len() / 2 + 1 {
            tracing::debug!(fresh, "too few voters heard from to judge anyone");
            return;
        }
        let nodes: Vec<(NodeId, NodeStatus)> = self
            .state()
            .nodes
            .iter()
            .map(|(&n, &s)| (n, s))
            .filter(|(n, _)| *n != self.me)
            .collect();
        for (node, status) in nodes {
            let last = self.last_heard_healthy(node, leader_since_ns);
            let silent_ns = now_ns.saturating_sub(last);
            let silent = silent_ns > self.timeouts.detect_ns;
            let give_up = self.gives_up_after(silent_ns);
            if status == NodeStatus::Down
                && give_up
                && !self.replacing.contains(&node)
                && !self.state().replacements(node).is_empty()
            {
                self.replacing.insert(node);
                if !self.try_propose(&Command::ReplaceNode { node }) {
                    self.replacing.remove(&node);
                }
            }
            let cmd = match status {
                NodeStatus::Up if silent => Command::NodeDown {
                    node,
                    // Its last heartbeat came at `last` (or it followed an earlier
                    // leader, whose own lease ran out a lease after this reign began):
                    // whatever lease it held has run out a lease later.
                    lease_expires_ns: last + self.timeouts.lease_ns,
                },
                NodeStatus::Down if !silent && self.last_seen.contains_key(&node) => {
                    Command::NodeUp { node }
                }
                _ => continue,
            };
            let key = (node, status == NodeStatus::Up);
            if self.proposed.insert(key) && !self.try_propose(&cmd) {
                self.proposed.remove(&key);
            }
        }
    }

    /// Leader: when `node` was last heard from healthy, or this reign's start
    /// if later (what it heard before its reign says nothing now).
    fn last_heard_healthy(&self, node: NodeId, leader_since_ns: u64) -> u64 {
        self.last_seen
            .get(&node)
            .copied()
            .unwrap_or(0)
            .max(leader_since_ns)
    }

    /// Whether a node silent for `silent_ns` is given up on (gone for good:
    /// replaced by spares, its vote handed over).
    fn gives_up_after(&self, silent_ns: u64) -> bool {
        self.timeouts.replace_ns > 0 && silent_ns > self.timeouts.replace_ns
    }

    fn propose(&mut self, cmd: &Command) {
        self.try_propose(cmd);
    }

    /// Propose `cmd`; false if raft-rs did not take it (not the leader, or a
    /// leadership transfer under way): the caller asks again later.
    fn try_propose(&mut self, cmd: &Command) -> bool {
        let taken = self.raft.propose(cmd);
        if let Err(e) = &taken {
            tracing::debug!(error = %e, ?cmd, "proposal not taken");
        }
        self.drain_raft();
        taken.is_ok()
    }

    /// Carry out what the Raft member asks. The map goes to the data path once,
    /// after every command applied in this round (not a copy per command).
    fn drain_raft(&mut self) {
        let mut changed = false;
        while let Some(action) = self.raft.poll_action() {
            match action {
                RaftAction::Persist(record) => self.actions.push_back(PlaneAction::Persist(record)),
                RaftAction::Rewrite(image) => self.actions.push_back(PlaneAction::Rewrite(image)),
                RaftAction::Installed { index, bytes } => {
                    // The log this node missed is gone: what the leader and the
                    // detector had in flight is decided in the map it installed.
                    self.proposed.clear();
                    self.replacing.clear();
                    self.actions.push_back(PlaneAction::Event(
                        crate::events::Event::MapInstalled {
                            node: self.me,
                            index,
                            bytes,
                        },
                    ));
                    changed = true;
                }
                RaftAction::Send { to, bytes } => self.actions.push_back(PlaneAction::Send {
                    to,
                    msg: Message::Raft { bytes },
                }),
                RaftAction::Applied { command, outcome } => {
                    if let Command::Restarted { node, boot, .. } = command {
                        if node == self.me && boot == self.boot && outcome.is_ok() {
                            self.restart_pending = false;
                        }
                    }
                    if let Command::NodeDown { node, .. } | Command::NodeUp { node } = &command {
                        self.proposed.retain(|(n, _)| n != node);
                    }
                    if let Command::ReplaceNode { node } = &command {
                        self.replacing.remove(node);
                    }
                    if let Command::MoveReplica { extent, .. }
                    | Command::FinishMove { extent, .. } = &command
                    {
                        self.moves_proposed.remove(extent);
                    }
                    if matches!(command, Command::MoveReplica { .. })
                        && matches!(outcome, Err(crate::control::Refusal::MapFull { .. }))
                    {
                        self.move_backoff = MOVE_BACKOFF_TICKS;
                    }
                    if matches!(command, Command::Conf { .. }) && outcome.is_err() {
                        self.conf_backoff = CONF_BACKOFF_TICKS;
                    }
                    match outcome {
                        Ok(changes) => {
                            // Every member applies the command; the leader reports it.
                            if self.raft.is_leader() {
                                if let Some(event) =
                                    describe::describe(&command, &changes, self.raft.state())
                                {
                                    self.actions.push_back(PlaneAction::Event(event));
                                }
                            }
                            changed = true;
                        }
                        // A full map is the operator's to know of: what it
                        // refuses (a volume, a snapshot, a first write, a
                        // leaving node's move) fails or waits.
                        Err(refusal @ crate::control::Refusal::MapFull { .. }) => tracing::warn!(
                            command = command.kind(),
                            %refusal,
                            "command refused: the map is full"
                        ),
                        Err(refusal) => tracing::debug!(?command, %refusal, "command refused"),
                    }
                }
            }
        }
        if changed {
            let state = self.state().clone();
            let restart_pending = self.restart_pending;
            self.actions.push_back(PlaneAction::Map {
                state,
                restart_pending,
            });
        }
    }
}

/// The commands that build `map` from the group's genesis (which holds its
/// members, [`ClusterState::genesis`]): its volume with `replicas` replicas per
/// extent and its named volumes (the map every node starts with).
pub fn bootstrap(map: &crate::map::ClusterMap, replicas: u8) -> Vec<Command> {
    let mut commands = vec![Command::CreateVolume {
        volume: map.volume().id,
        extents: map.extent_count(),
        replicas,
    }];
    // A static map's named volumes (thick), in the order they took their
    // extents.
    let mut named: Vec<_> = map.state().named.iter().collect();
    named.sort_by_key(|(_, v)| v.id);
    commands.extend(named.into_iter().map(|(name, v)| Command::CreateNamed {
        name: name.clone(),
        size_bytes: v.size_bytes,
        extents: v.extents,
        qos: v.qos,
        key_check: v.key_check,
        thin: false,
    }));
    commands
}

mod describe;
mod members;
#[cfg(test)]
mod tests;
