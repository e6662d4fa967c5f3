//! Membership through the control plane: a node joins, another leaves with its
//! replicas moved and its vote handed over, a voter gone for good is replaced.

use super::*;
use crate::events::MemberChange;

fn timeouts(replace_ns: u64) -> Timeouts {
    Timeouts {
        lease_ns: 150,
        detect_ns: 100,
        replace_ns,
    }
}

/// Stand in for the data path: every rebuilding replica of an extent whose
/// primary is alive finishes its rebuild (the primary asks for `RebuildDone`).
fn finish_rebuilds(p: &mut BTreeMap<NodeId, ControlPlane>, dead: &[NodeId]) {
    let Some(leader) = p.values().find_map(|x| x.leader()) else {
        return;
    };
    let state = p[&leader].state().clone();
    for (&extent, e) in &state.extents {
        if dead.contains(&e.primary) || e.in_sync.is_empty() {
            continue;
        }
        for &node in e.rebuilding.iter().filter(|n| !dead.contains(n)) {
            if let Some(primary) = p.get_mut(&e.primary) {
                primary.request(&Command::RebuildDone {
                    extent,
                    epoch: e.epoch,
                    node,
                });
            }
        }
    }
}

/// A node that joins later: it knows the first members, not the map.
fn joiner(id: NodeId, replace_ns: u64) -> ControlPlane {
    let first: Vec<NodeId> = (1..=3).map(NodeId).collect();
    let boot = planes()[&NodeId(1)].bootstrap.clone();
    ControlPlane::new(id, &first, boot, timeouts(replace_ns), 40 + u64::from(id.0)).unwrap()
}

fn member_events(events: &[Event], node: NodeId) -> Vec<MemberChange> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Member { node: n, change } if *n == node => Some(*change),
            _ => None,
        })
        .collect()
}

#[test]
fn a_node_joins_and_another_leaves_with_its_replicas_moved_and_its_vote_handed_over() {
    let mut p = planes();
    let mut events = Vec::new();
    run(&mut p, 0, 30, &[], &mut events);
    let leader = p[&NodeId(1)].leader().unwrap();
    p.insert(NodeId(4), joiner(NodeId(4), 0));
    assert!(
        p[&NodeId(4)].state().nodes.is_empty(),
        "no map before the group takes it"
    );
    p.get_mut(&NodeId(2)).unwrap().request(&Command::JoinNode {
        node: NodeId(4),
        addr: "10.0.0.4:7400".into(),
    });
    run(&mut p, 30, 30, &[], &mut events);
    let s = p[&leader].state().clone();
    assert!(s.learners.contains(&NodeId(4)), "{events:?}");
    assert_eq!(s.nodes[&NodeId(4)], NodeStatus::Up, "heard from");
    assert!(!s.holds_replicas(NodeId(4)));
    assert_eq!(p[&NodeId(4)].state().nodes, s.nodes, "it has the map");
    assert_eq!(
        member_events(&events, NodeId(4)),
        [MemberChange::Joined, MemberChange::Learner]
    );

    // The leader itself leaves: its replicas move to node 4, its vote too.
    p.get_mut(&NodeId(3))
        .unwrap()
        .request(&Command::RemoveNode { node: leader });
    let mut t = 60;
    while p[&NodeId(4)].state().nodes.contains_key(&leader) && t < 600 {
        run(&mut p, t, 5, &[], &mut events);
        finish_rebuilds(&mut p, &[]);
        t += 5;
    }
    let now = p.values().find_map(|x| x.leader()).unwrap();
    assert_ne!(now, leader, "leadership was handed over");
    let s = p[&now].state().clone();
    s.self_check();
    assert!(!s.nodes.contains_key(&leader), "{events:?}");
    let mut expect: BTreeSet<NodeId> = (1..=4).map(NodeId).collect();
    expect.remove(&leader);
    assert_eq!(s.voters, expect);
    assert!(s.learners.is_empty() && s.leaving.is_empty());
    for e in s.extents.values() {
        assert_eq!(e.replicas.len(), 3);
        assert!(!e.replicas.contains(&leader) && e.moving.is_none());
    }
    let changes = member_events(&events, leader);
    assert_eq!(changes.first(), Some(&MemberChange::Leaving { extents: 3 }));
    let moved = changes
        .iter()
        .filter(|c| matches!(c, MemberChange::Moved { to: NodeId(4), .. }))
        .count();
    assert_eq!(moved, 3, "{changes:?}");
    // Its vote goes as soon as another node can take it; it leaves the group
    // last, holding nothing.
    assert!(changes.contains(&MemberChange::Learner), "{changes:?}");
    assert_eq!(changes.last(), Some(&MemberChange::Gone));
    assert!(member_events(&events, NodeId(4)).contains(&MemberChange::Voter));
    // Every member that stays holds the same map, and nothing more is proposed.
    run(&mut p, t, 30, &[], &mut events);
    let settled = p[&now].state().clone();
    for id in &expect {
        assert_eq!(p[id].state(), &settled, "{id}");
    }
    assert_eq!(
        settled.applied, s.applied,
        "the removed node is no one to judge"
    );
}

#[test]
fn a_voter_gone_for_good_gives_its_vote_to_a_learner() {
    let mut p = planes_with(4, 300);
    let mut events = Vec::new();
    run(&mut p, 0, 30, &[], &mut events);
    let s = p[&NodeId(1)].state().clone();
    assert_eq!(s.voters, [1, 2, 3].map(NodeId).into());
    let leader = p[&NodeId(1)].leader().unwrap();
    let dead = *s.voters.iter().find(|&&v| v != leader).unwrap();
    run(&mut p, 30, 60, &[dead], &mut events);
    let s = p[&leader].state().clone();
    assert!(s.voters.contains(&NodeId(4)), "{events:?}");
    assert!(s.learners.contains(&dead));
    assert_eq!(s.voters.len(), 3);
    // It comes back: a learner that is heard from again gets no vote while
    // three voters may vote.
    run(&mut p, 90, 30, &[], &mut events);
    let s = p[&leader].state().clone();
    assert!(s.learners.contains(&dead) && s.voters.len() == 3, "{s:?}");
}

#[test]
fn a_removal_the_others_cannot_hold_is_refused() {
    let mut p = planes();
    let mut events = Vec::new();
    run(&mut p, 0, 30, &[], &mut events);
    let before = p[&NodeId(1)].state().clone();
    p.get_mut(&NodeId(1))
        .unwrap()
        .request(&Command::RemoveNode { node: NodeId(2) });
    run(&mut p, 30, 10, &[], &mut events);
    let after = p[&NodeId(1)].state();
    assert!(after.leaving.is_empty());
    assert_eq!(after.applied, before.applied + 1, "applied as a refusal");
}

#[test]
fn a_voter_gone_for_good_keeps_its_vote_where_no_learner_can_take_it() {
    // Three voters and no learner: taking the dead one's vote would not lower
    // the quorum (2 of 3, 2 of 2), and it could no longer help one if it came
    // back.
    let mut p = planes_with(3, 300);
    let mut events = Vec::new();
    run(&mut p, 0, 30, &[], &mut events);
    let leader = p[&NodeId(1)].leader().unwrap();
    let dead = *p[&leader]
        .state()
        .voters
        .iter()
        .find(|&&v| v != leader)
        .unwrap();
    run(&mut p, 30, 80, &[dead], &mut events);
    let s = p[&leader].state();
    assert_eq!(s.nodes[&dead], NodeStatus::Down);
    assert_eq!(s.voters.len(), 3, "{events:?}");
    assert!(member_events(&events, dead).is_empty());
}
