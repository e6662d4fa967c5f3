//! The leader's membership reconcilers: replicas moved off leaving nodes, and
//! the Raft group's votes brought to what the map calls for (see
//! [`crate::control::state`]'s membership commands).

use super::{ControlPlane, MOVES_MAX};
use crate::control::state::{Command, ConfRole, NodeStatus};
use crate::ids::NodeId;

impl ControlPlane {
    /// Leader: move replicas off leaving nodes, at most [`MOVES_MAX`] at once:
    /// start a move to the up, staying node that holds the fewest replicas (the
    /// lowest id on ties), and finish it once the new replica is in sync.
    pub(super) fn move_replicas(&mut self, now_ns: u64) {
        self.move_backoff = self.move_backoff.saturating_sub(1);
        let state = self.state();
        if state.leaving.is_empty() && state.extents.values().all(|e| e.moving.is_none()) {
            return;
        }
        let mut load = state.spare_load();
        let mut under_way = state
            .extents
            .values()
            .filter(|e| e.moving.is_some())
            .count();
        under_way += self
            .moves_proposed
            .iter()
            .filter(|e| state.extents.get(e).is_some_and(|x| x.moving.is_none()))
            .count();
        let mut proposals = Vec::new();
        for (&id, ext) in &state.extents {
            if self.moves_proposed.contains(&id) {
                continue;
            }
            if let Some(m) = ext.moving {
                if ext.in_sync.contains(&m.to) {
                    // Every lease the old primary may hold ends within a lease
                    // of now: any it gets later needs this map.
                    let serve_after_ns = now_ns.saturating_add(self.timeouts.lease_ns);
                    proposals.push(Command::FinishMove {
                        extent: id,
                        epoch: ext.epoch,
                        serve_after_ns,
                    });
                }
                continue;
            }
            let Some(&from) = ext.replicas.iter().find(|r| state.leaving.contains(r)) else {
                continue;
            };
            // After a full map refused a move, none for a while (moves under
            // way still finish).
            if self.move_backoff > 0 {
                continue;
            }
            if under_way >= MOVES_MAX || ext.in_sync.is_empty() {
                continue;
            }
            if let Some(to) = crate::control::state::take_spare(&mut load, ext) {
                under_way += 1;
                proposals.push(Command::MoveReplica {
                    extent: id,
                    epoch: ext.epoch,
                    from,
                    to,
                });
            }
        }
        for cmd in proposals {
            if let Command::MoveReplica { extent, .. } | Command::FinishMove { extent, .. } = cmd {
                // Marked first (a one-voter group applies it within the call);
                // unmarked if raft-rs dropped it (during a leader transfer).
                self.moves_proposed.insert(extent);
                if !self.try_propose(&cmd) {
                    self.moves_proposed.remove(&extent);
                }
            }
        }
    }

    /// Leader: hand leadership to the voter that stays (not leaving) heard from
    /// most recently, preferring one whose log is complete.
    pub(super) fn hand_over(&mut self, why: &str) {
        let state = self.raft.state();
        let heir = state
            .voters
            .iter()
            .filter(|&&v| v != self.me && !state.leaving.contains(&v))
            .max_by_key(|v| {
                (
                    self.raft.caught_up(**v),
                    self.voter_sent.get(v).copied().unwrap_or(0),
                )
            })
            .copied();
        if let Some(heir) = heir {
            tracing::info!(%heir, why, "handing leadership over");
            self.raft.transfer_leader(heir);
            self.drain_raft();
        }
    }

    /// Leader: one step towards the Raft group the map calls for, when no
    /// configuration change is under way. A joined node becomes a learner; a
    /// learner that may vote (up, heard from, caught up, not leaving) becomes a
    /// voter while fewer than [`crate::control::state::voter_target`] of those that may
    /// vote do; a voter that may not becomes a learner once the group is over
    /// that target: a leaving one always (it must go; a vote is added first
    /// where a learner can take it), one down past the replacement timeout (gone
    /// for good) only from an even group, where it lowers the quorum (from an
    /// odd one it would not, and it could no longer help a quorum if it came
    /// back); a leaving learner that holds nothing leaves. The leader never
    /// demotes itself: it hands leadership over first.
    pub(super) fn reconfigure(&mut self, now_ns: u64, leader_since_ns: u64) {
        if self.conf_backoff > 0 {
            self.conf_backoff -= 1;
            return;
        }
        if self.raft.conf_pending() {
            return;
        }
        let step = self.conf_step(now_ns, leader_since_ns);
        let Some((node, role)) = step else {
            return;
        };
        if node == self.me && role != ConfRole::Voter {
            self.hand_over("leaving the vote");
            return;
        }
        self.propose(&Command::Conf { node, role });
    }

    /// The next step of the Raft group's membership, if one is due: a new
    /// member learns; a caught-up learner votes while voters are short; a
    /// leaving voter (or, in an even group, one that may not vote) is
    /// demoted; a leaving learner holding no replicas goes.
    fn conf_step(&self, now_ns: u64, leader_since_ns: u64) -> Option<(NodeId, ConfRole)> {
        let state = self.state();
        let heard = |n: &NodeId| {
            *n == self.me
                || self
                    .last_seen
                    .get(n)
                    .is_some_and(|&t| now_ns.saturating_sub(t) <= self.timeouts.detect_ns)
        };
        let gone_for_good = |n: &NodeId| {
            let last = self.last_heard_healthy(*n, leader_since_ns);
            *n != self.me
                && state.nodes.get(n) == Some(&NodeStatus::Down)
                && self.gives_up_after(now_ns.saturating_sub(last))
        };
        let may_vote = |n: &NodeId| !state.leaving.contains(n) && !gone_for_good(n);
        if let Some(&node) = state
            .nodes
            .keys()
            .find(|n| !state.voters.contains(n) && !state.learners.contains(n))
        {
            Some((node, ConfRole::Learner))
        } else {
            let target = crate::control::state::voter_target(
                state.nodes.keys().filter(|n| may_vote(n)).count(),
            );
            let voting = state.voters.iter().filter(|n| may_vote(n)).count();
            let candidate = state.learners.iter().copied().find(|n| {
                may_vote(n)
                    && state.nodes.get(n) == Some(&NodeStatus::Up)
                    && heard(n)
                    && self.raft.caught_up(*n)
            });
            let leaving_voter = state
                .voters
                .iter()
                .copied()
                .find(|n| state.leaving.contains(n));
            let demote = leaving_voter.or_else(|| {
                let even = state.voters.len().is_multiple_of(2);
                even.then(|| state.voters.iter().copied().find(|n| !may_vote(n)))
                    .flatten()
            });
            let leave = state
                .leaving
                .iter()
                .copied()
                .find(|n| !state.voters.contains(n) && !state.holds_replicas(*n));
            match (candidate, demote, leave) {
                (Some(c), ..) if voting < target => Some((c, ConfRole::Voter)),
                (_, Some(d), _) if state.voters.len() > target.max(1) => {
                    Some((d, ConfRole::Learner))
                }
                (.., Some(l)) => Some((l, ConfRole::Gone)),
                _ => None,
            }
        }
    }
}
