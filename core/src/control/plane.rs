//! The control plane of one node, sans-IO: its Raft member, the leader's failure
//! detector and the bootstrap of the cluster map.
//!
//! - Every node heartbeats the Raft leader once per tick.
//! - The leader marks a node down when it has not heard from it for the lease
//!   timeout (proposing `NodeDown`, which fails its extents over), and up again when
//!   it hears from it (`NodeUp`: its replicas start rebuilding). A new leader first
//!   waits a whole lease timeout, so it never declares down a node it simply has not
//!   had time to hear from.
//! - The first leader of an empty log proposes the bootstrap commands (members and
//!   the volume), which reproduce exactly the static map every node starts with.
//!
//! Time comes in with every call (`now_ns`); the driver ticks at a fixed interval.

use super::raft::{MapRaft, RaftAction, RaftError};
use super::state::{ClusterState, Command, NodeStatus};
use crate::ids::NodeId;
use crate::wire::Message;
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

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
    Map(ClusterState),
    /// A control-plane event worth a line in a report (failover, node down/up).
    Event(String),
}

/// The control plane of one node.
#[derive(Debug)]
pub struct ControlPlane {
    me: NodeId,
    raft: MapRaft,
    bootstrap: Vec<Command>,
    bootstrap_term: Option<u64>,
    lease_ns: u64,
    /// Leader only: when each node was last heard from.
    last_seen: BTreeMap<NodeId, u64>,
    leader_since_ns: Option<u64>,
    /// Proposals in flight, so the detector does not repeat them every tick.
    proposed: BTreeSet<(NodeId, bool)>,
    actions: VecDeque<PlaneAction>,
}

impl ControlPlane {
    /// The control plane of `me` in a group of `voters`; `bootstrap` are the commands
    /// that build the initial map; `lease_ns` is the failure-detection timeout.
    pub fn new(
        me: NodeId,
        voters: &[NodeId],
        bootstrap: Vec<Command>,
        lease_ns: u64,
        seed: u64,
    ) -> Result<Self, RaftError> {
        let mut raft = MapRaft::new(me, voters, seed)?;
        if voters.first() == Some(&me) {
            // The first voter stands for election at once: a fresh cluster has a
            // leader after one round trip instead of after an election timeout.
            raft.campaign()?;
        }
        Ok(ControlPlane {
            me,
            raft,
            bootstrap,
            bootstrap_term: None,
            lease_ns,
            last_seen: BTreeMap::new(),
            leader_since_ns: None,
            proposed: BTreeSet::new(),
            actions: VecDeque::new(),
        })
    }

    /// The applied cluster state.
    pub fn state(&self) -> &ClusterState {
        self.raft.state()
    }

    /// The Raft leader this node knows of.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.leader()
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

    /// A member asks the leader to propose a command. Only data-path requests are
    /// taken from others (dropping a replica); membership stays the leader's.
    pub fn handle_propose(&mut self, from: NodeId, bytes: &[u8]) {
        if !self.state().nodes.contains_key(&from) || !self.raft.is_leader() {
            return;
        }
        match postcard::from_bytes::<Command>(bytes) {
            // Only an extent's primary may ask to drop one of its replicas.
            Ok(cmd @ Command::DropReplica { extent, .. })
                if self
                    .state()
                    .extents
                    .get(&extent)
                    .is_some_and(|e| e.primary == from) =>
            {
                self.propose(&cmd)
            }
            Ok(other) => tracing::warn!(%from, ?other, "command not taken from a member"),
            Err(e) => tracing::warn!(%from, error = %e, "undecodable proposal"),
        }
    }

    /// A heartbeat from `from` arrived at `now_ns`.
    pub fn handle_heartbeat(&mut self, from: NodeId, now_ns: u64) {
        if self.raft.is_leader() {
            self.last_seen.insert(from, now_ns);
        }
    }

    /// One tick at `now_ns`.
    pub fn tick(&mut self, now_ns: u64) {
        self.raft.tick();
        self.drain_raft();
        match self.raft.leader() {
            Some(leader) if leader != self.me => self.actions.push_back(PlaneAction::Send {
                to: leader,
                msg: Message::Heartbeat,
            }),
            _ => {}
        }
        if !self.raft.is_leader() {
            self.leader_since_ns = None;
            self.proposed.clear();
            return;
        }
        if self.leader_since_ns.is_none() {
            // A new reign: what an earlier reign heard says nothing about now.
            self.last_seen.clear();
        }
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
    }

    /// The leader's failure detector.
    fn detect(&mut self, now_ns: u64, leader_since_ns: u64) {
        let nodes: Vec<(NodeId, NodeStatus)> = self
            .state()
            .nodes
            .iter()
            .map(|(&n, &s)| (n, s))
            .filter(|(n, _)| *n != self.me)
            .collect();
        for (node, status) in nodes {
            let last = self
                .last_seen
                .get(&node)
                .copied()
                .unwrap_or(0)
                .max(leader_since_ns);
            let silent = now_ns.saturating_sub(last) > self.lease_ns;
            let cmd = match status {
                NodeStatus::Up if silent => Command::NodeDown {
                    node,
                    // Its last heartbeat came at `last`; whatever lease it held has
                    // run out a lease later.
                    lease_expires_ns: last + self.lease_ns,
                },
                NodeStatus::Down if !silent && self.last_seen.contains_key(&node) => {
                    Command::NodeUp { node }
                }
                _ => continue,
            };
            if self.proposed.insert((node, status == NodeStatus::Up)) {
                self.propose(&cmd);
            }
        }
    }

    fn propose(&mut self, cmd: &Command) {
        if let Err(e) = self.raft.propose(cmd) {
            tracing::debug!(error = %e, ?cmd, "proposal not taken");
        }
        self.drain_raft();
    }

    fn drain_raft(&mut self) {
        while let Some(action) = self.raft.poll_action() {
            match action {
                RaftAction::Send { to, bytes } => self.actions.push_back(PlaneAction::Send {
                    to,
                    msg: Message::Raft { bytes },
                }),
                RaftAction::Applied { command, outcome } => {
                    if let Command::NodeDown { node, .. } | Command::NodeUp { node } = &command {
                        self.proposed.retain(|(n, _)| n != node);
                    }
                    match outcome {
                        Ok(changes) => {
                            // Every member applies the command; the leader reports it.
                            if self.raft.is_leader() {
                                if let Some(line) = describe(&command, &changes) {
                                    self.actions.push_back(PlaneAction::Event(line));
                                }
                            }
                            let state = self.state().clone();
                            self.actions.push_back(PlaneAction::Map(state));
                        }
                        Err(refusal) => tracing::debug!(?command, %refusal, "command refused"),
                    }
                }
            }
        }
    }
}

/// One line for a node going down or up, if `command` is one.
fn describe(command: &Command, changes: &[super::state::Change]) -> Option<String> {
    use super::state::Change;
    let (mut failovers, mut replicas, mut unavailable) = (0, 0, 0);
    for c in changes {
        match c {
            Change::Failover(f) => failovers += f.len(),
            Change::Replicas(r) => replicas += r.len(),
            Change::Unavailable(u) => unavailable += u.len(),
            Change::Membership => {}
        }
    }
    match command {
        Command::NodeDown { node, .. } => Some(format!(
            "{node} down: {failovers} extents fail over, {replicas} lose a replica, {unavailable} unavailable"
        )),
        Command::NodeUp { node } => Some(format!("{node} up: rebuilding {replicas} extents")),
        Command::DropReplica { extent, node, .. } => Some(format!(
            "{node} dropped from {extent}'s in-sync set (silent past the replica timeout)"
        )),
        _ => None,
    }
}

/// Encode a cluster state for `Message::MapState`.
pub fn encode_state(state: &ClusterState) -> Bytes {
    Bytes::from(postcard::to_allocvec(state).expect("a cluster state always encodes"))
}

/// Decode a cluster state from `Message::MapState`.
pub fn decode_state(bytes: &[u8]) -> Result<ClusterState, postcard::Error> {
    let state: ClusterState = postcard::from_bytes(bytes)?;
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::VolumeId;

    fn planes() -> BTreeMap<NodeId, ControlPlane> {
        let ids: Vec<NodeId> = (1..=3).map(NodeId).collect();
        let mut boot: Vec<Command> = ids.iter().map(|&node| Command::AddNode { node }).collect();
        boot.push(Command::CreateVolume {
            volume: VolumeId(1),
            extents: 3,
            replicas: 3,
        });
        ids.iter()
            .map(|&id| {
                (
                    id,
                    ControlPlane::new(id, &ids, boot.clone(), 150, 5 + u64::from(id.0)).unwrap(),
                )
            })
            .collect()
    }

    /// Run `ticks` ticks of 10 time units; `dead` nodes neither send nor receive.
    fn run(
        p: &mut BTreeMap<NodeId, ControlPlane>,
        from: u64,
        ticks: u64,
        dead: &[NodeId],
        events: &mut Vec<String>,
    ) {
        for t in from..from + ticks {
            let now = t * 10;
            for (id, plane) in p.iter_mut() {
                if !dead.contains(id) {
                    plane.tick(now);
                }
            }
            loop {
                let mut sent = Vec::new();
                for (&id, plane) in p.iter_mut() {
                    while let Some(a) = plane.poll_action() {
                        match a {
                            PlaneAction::Send { to, msg } => sent.push((id, to, msg)),
                            PlaneAction::Event(e) => events.push(e),
                            PlaneAction::Map(_) => {}
                        }
                    }
                }
                if sent.is_empty() {
                    break;
                }
                for (from, to, msg) in sent {
                    if dead.contains(&from) || dead.contains(&to) {
                        continue;
                    }
                    let plane = p.get_mut(&to).unwrap();
                    match msg {
                        Message::Raft { bytes } => plane.handle_raft(from, &bytes),
                        Message::Heartbeat => plane.handle_heartbeat(from, now),
                        other => panic!("unexpected {other:?}"),
                    }
                }
            }
        }
    }

    #[test]
    fn the_first_leader_bootstraps_the_map_and_a_silent_node_fails_over() {
        let mut p = planes();
        let mut events = Vec::new();
        run(&mut p, 0, 60, &[], &mut events);
        let state = p[&NodeId(1)].state().clone();
        assert_eq!(state.extents.len(), 3, "bootstrap did not apply");
        assert!(p.values().all(|x| x.state().extents == state.extents));
        // Kill a node that is not the leader; it is declared down and its extent fails over.
        let leader = p[&NodeId(1)].leader().unwrap();
        let victim = (1..=3).map(NodeId).find(|&n| n != leader).unwrap();
        run(&mut p, 60, 60, &[victim], &mut events);
        let s = p[&leader].state();
        assert_eq!(s.nodes[&victim], NodeStatus::Down, "events: {events:?}");
        for ext in s.extents.values() {
            assert_ne!(ext.primary, victim);
            assert!(!ext.in_sync.contains(&victim));
        }
        assert!(
            events.iter().any(|e| e.contains(&format!("{victim} down"))),
            "{events:?}"
        );
        // It comes back: marked up, rebuilding.
        run(&mut p, 120, 30, &[], &mut events);
        let s = p[&leader].state();
        assert_eq!(s.nodes[&victim], NodeStatus::Up);
        assert!(s.extents.values().all(|e| e.rebuilding.contains(&victim)));
    }

    #[test]
    fn states_round_trip_and_garbage_is_an_error() {
        let mut p = planes();
        run(&mut p, 0, 60, &[], &mut Vec::new());
        let state = p[&NodeId(2)].state().clone();
        assert_eq!(decode_state(&encode_state(&state)).unwrap(), state);
        assert!(decode_state(&[0xff; 7]).is_err());
    }
}
