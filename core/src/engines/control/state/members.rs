//! Membership: nodes joining and leaving, replicas moving off a leaving node, and
//! the Raft group's configuration as the map records it.
//!
//! A node joins with [`super::Command::JoinNode`] and holds nothing until a replica
//! moves to it (or a spare is needed). A node leaves in three steps, each a
//! command the leader proposes once the one before has applied:
//! 1. [`super::Command::RemoveNode`] marks it leaving;
//! 2. each extent it holds gets a new replica ([`super::Command::MoveReplica`]), which
//!    rebuilds from the primary, and once that is in sync the leaving one gives
//!    up its place ([`super::Command::FinishMove`]): an extent never has fewer copies
//!    during a move than before it;
//! 3. it leaves the Raft group, as a voter handing its vote to another node
//!    first ([`ConfRole::Learner`] for it after [`ConfRole::Voter`] for the other),
//!    then as a learner ([`ConfRole::Gone`]), which takes it out of the map.

use super::{Change, MAX_MEMBERS};
use super::{ClusterState, ConfRole, ExtentState, Move, NodeStatus, Refusal};
use crate::ids::{Epoch, ExtentId, NodeId};
use std::collections::{BTreeMap, BTreeSet};

/// Longest replication address a joining node may give, in bytes.
pub const MAX_ADDR_BYTES: usize = 256;

/// How many voters a group of `eligible` members that may vote has: all of
/// fewer than 3, 3 of 3 or 4, 5 of 5 or more (more voters only slow commits and
/// elections).
pub fn voter_target(eligible: usize) -> usize {
    match eligible {
        0..=2 => eligible,
        3..=4 => 3,
        _ => 5,
    }
}

/// The node of `load` (replicas held, by node) that holds no replica of
/// `ext` and the fewest replicas (the lowest id on ties), counted as holding
/// one more.
pub fn take_spare(load: &mut BTreeMap<NodeId, u64>, ext: &ExtentState) -> Option<NodeId> {
    let (&spare, count) = load
        .iter_mut()
        .filter(|(n, _)| !ext.replicas.contains(n))
        .min_by_key(|(&n, &mut c)| (c, n))?;
    *count += 1;
    Some(spare)
}

impl ClusterState {
    /// The nodes that may take a replica (up, and not leaving), with the
    /// replicas each holds: spares for replacements and moves.
    pub fn spare_load(&self) -> BTreeMap<NodeId, u64> {
        let mut load: BTreeMap<NodeId, u64> = self
            .up_nodes()
            .into_iter()
            .filter(|n| !self.leaving.contains(n))
            .map(|n| (n, 0))
            .collect();
        for ext in self.extents.values() {
            for r in &ext.replicas {
                if let Some(c) = load.get_mut(r) {
                    *c += 1;
                }
            }
        }
        load
    }

    /// The map a Raft group starts from: `members`, up, the first
    /// [`voter_target`] of them voting (in the order given), the rest learning.
    pub fn genesis(members: &[NodeId]) -> ClusterState {
        let mut state = ClusterState::default();
        for &node in members {
            // As the static map applies them (the same count of commands); a
            // member listed twice is one member.
            let _ = state.apply(&super::Command::AddNode { node });
        }
        let n = voter_target(members.len());
        for (i, &node) in members.iter().enumerate() {
            if i < n {
                state.voters.insert(node);
            } else {
                state.learners.insert(node);
            }
        }
        state.learners.retain(|n| !state.voters.contains(n));
        state
    }

    /// Whether `node` holds (or is taking) a replica of any extent.
    pub fn holds_replicas(&self, node: NodeId) -> bool {
        self.extents.values().any(|e| e.replicas.contains(&node))
    }

    /// Extents with a replica on `node`, and how many of them are moving.
    pub fn replicas_on(&self, node: NodeId) -> (usize, usize) {
        let on: Vec<&ExtentState> = self
            .extents
            .values()
            .filter(|e| e.replicas.contains(&node))
            .collect();
        let moving = on
            .iter()
            .filter(|e| e.moving.is_some_and(|m| m.from == node))
            .count();
        (on.len(), moving)
    }

    pub(super) fn join_node(&mut self, node: NodeId, addr: &str) -> Result<Vec<Change>, Refusal> {
        if node.0 == 0 || node.0 >= crate::ids::FRONT_END_ID_BASE {
            return Err(Refusal::BadNode(
                node,
                "node ids are 1 up to the front ends' ids",
            ));
        }
        if addr.len() > MAX_ADDR_BYTES {
            return Err(Refusal::BadNode(node, "its address is past 256 bytes"));
        }
        if self.nodes.contains_key(&node) {
            return Err(Refusal::KnownNode(node));
        }
        if self.nodes.len() >= MAX_MEMBERS {
            return Err(Refusal::TooLarge("members"));
        }
        // Down until the leader hears from it.
        self.nodes.insert(node, NodeStatus::Down);
        if !addr.is_empty() {
            self.addrs.insert(node, addr.to_string());
        }
        Ok(vec![Change::Membership])
    }

    pub(super) fn remove_node(&mut self, node: NodeId) -> Result<Vec<Change>, Refusal> {
        self.check_remove(node)?;
        self.leaving.insert(node);
        Ok(vec![Change::Membership])
    }

    /// Whether [`super::Command::RemoveNode`] of `node` would apply: a member,
    /// not leaving yet, whose removal leaves up nodes enough for every
    /// extent's copies (a node that is down may never come back to take one).
    pub fn check_remove(&self, node: NodeId) -> Result<(), Refusal> {
        if !self.nodes.contains_key(&node) {
            return Err(Refusal::UnknownNode(node));
        }
        if self.leaving.contains(&node) {
            return Err(Refusal::Leaving(node));
        }
        // Those that stay, up, must be able to hold every extent's copies.
        let stay = self
            .nodes
            .iter()
            .filter(|(n, s)| **n != node && !self.leaving.contains(n) && **s == NodeStatus::Up)
            .count();
        let replicas = self
            .extents
            .values()
            .map(|e| e.replicas.len() - usize::from(e.moving.is_some()))
            .max()
            .unwrap_or(0)
            .max(1);
        if stay < replicas {
            return Err(Refusal::TooFewNodes {
                replicas: u8::try_from(replicas).unwrap_or(u8::MAX),
                up: stay,
            });
        }
        Ok(())
    }

    pub(super) fn move_replica(
        &mut self,
        extent: ExtentId,
        epoch: Epoch,
        from: NodeId,
        to: NodeId,
    ) -> Result<Vec<Change>, Refusal> {
        let target_ok = self.nodes.get(&to) == Some(&NodeStatus::Up) && !self.leaving.contains(&to);
        let leaving = self.leaving.contains(&from);
        let ext = self.extent_at(extent, epoch)?;
        let bad = |why| Err(Refusal::BadMove { extent, why });
        if ext.moving.is_some() {
            return bad("a move is under way");
        }
        if !ext.replicas.contains(&from) || !leaving {
            return bad("the node moved from is no leaving replica");
        }
        if ext.replicas.contains(&to) || !target_ok {
            return bad("the node moved to is no up, staying non-replica");
        }
        if ext.in_sync.is_empty() {
            return bad("no in-sync replica to copy from");
        }
        ext.replicas.push(to);
        ext.rebuilding.insert(to);
        ext.moving = Some(Move { from, to });
        ext.epoch = ext.epoch.next();
        Ok(vec![Change::Replicas(vec![(extent, ext.epoch)])])
    }

    pub(super) fn finish_move(
        &mut self,
        extent: ExtentId,
        epoch: Epoch,
        serve_after_ns: u64,
    ) -> Result<Vec<Change>, Refusal> {
        let ext = self.extent_at(extent, epoch)?;
        let Some(Move { from, to }) = ext.moving else {
            return Err(Refusal::BadMove {
                extent,
                why: "no move is under way",
            });
        };
        if !ext.in_sync.contains(&to) {
            return Err(Refusal::BadMove {
                extent,
                why: "the new replica is not in sync",
            });
        }
        // The new replica takes the leaving one's place in placement order.
        ext.replicas.retain(|&r| r != to);
        let pos = ext.replicas.iter().position(|&r| r == from);
        debug_assert!(pos.is_some(), "a move's source is a replica");
        match pos {
            Some(pos) => ext.replicas[pos] = to,
            None => ext.replicas.push(to),
        }
        ext.in_sync.remove(&from);
        ext.rebuilding.remove(&from);
        ext.moving = None;
        ext.epoch = ext.epoch.next();
        let moved = Change::Moved { extent, from, to };
        if ext.primary != from {
            return Ok(vec![moved, Change::Replicas(vec![(extent, ext.epoch)])]);
        }
        // The first in-sync replica in placement order (the new one is in sync).
        let next = ext
            .replicas
            .iter()
            .copied()
            .find(|r| ext.in_sync.contains(r))
            .unwrap_or(to);
        ext.primary = next;
        ext.primary_since = ext.epoch;
        ext.serve_after_ns = ext.serve_after_ns.max(serve_after_ns);
        Ok(vec![
            moved,
            Change::Failover(vec![(extent, from, next, ext.epoch)]),
        ])
    }

    /// Whether a Raft configuration change applies to this map (checked
    /// before raft-rs takes it: then both change, or neither).
    pub fn check_conf(&self, node: NodeId, role: ConfRole) -> Result<(), Refusal> {
        let bad = |why| Err(Refusal::BadConf { node, role, why });
        if !self.nodes.contains_key(&node) {
            return bad("not a member");
        }
        match role {
            ConfRole::Voter if self.leaving.contains(&node) => bad("it is leaving"),
            ConfRole::Voter if self.voters.contains(&node) => bad("it votes already"),
            ConfRole::Learner if self.learners.contains(&node) => bad("it learns already"),
            ConfRole::Learner if self.voters.contains(&node) && self.voters.len() == 1 => {
                bad("it is the last voter")
            }
            ConfRole::Gone if !self.leaving.contains(&node) => bad("it is not leaving"),
            ConfRole::Gone if self.voters.contains(&node) => bad("it votes"),
            ConfRole::Gone if self.holds_replicas(node) => bad("it holds replicas"),
            _ => Ok(()),
        }
    }

    /// A Raft configuration change, applied with raft-rs's own.
    pub(super) fn conf(&mut self, node: NodeId, role: ConfRole) -> Result<Vec<Change>, Refusal> {
        self.check_conf(node, role)?;
        match role {
            ConfRole::Voter => {
                self.learners.remove(&node);
                self.voters.insert(node);
            }
            ConfRole::Learner => {
                self.voters.remove(&node);
                self.learners.insert(node);
            }
            ConfRole::Gone => {
                self.nodes.remove(&node);
                self.leaving.remove(&node);
                self.learners.remove(&node);
                self.addrs.remove(&node);
                self.incarnations.remove(&node);
            }
        }
        Ok(vec![Change::Membership])
    }

    /// The membership invariants: the Raft group's voters and learners are
    /// distinct members, and leaving nodes and addresses are members'.
    pub(super) fn validate_members(&self) -> Result<(), String> {
        let members: BTreeSet<NodeId> = self.nodes.keys().copied().collect();
        if !self.voters.is_disjoint(&self.learners) {
            return Err("a node both votes and learns".into());
        }
        for (what, set) in [
            ("voter", &self.voters),
            ("learner", &self.learners),
            ("leaving node", &self.leaving),
        ] {
            if let Some(n) = set.difference(&members).next() {
                return Err(format!("{what} {n} is not a member"));
            }
        }
        if self.voters.is_empty() && !self.learners.is_empty() {
            return Err("a Raft group of learners only".into());
        }
        if let Some(n) = members
            .iter()
            .find(|n| n.0 == 0 || n.0 >= crate::ids::FRONT_END_ID_BASE)
        {
            return Err(format!("{n} is no node id"));
        }
        for (n, addr) in &self.addrs {
            if !members.contains(n) || addr.is_empty() || addr.len() > MAX_ADDR_BYTES {
                return Err(format!("address of {n}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
