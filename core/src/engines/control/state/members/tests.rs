use super::super::{ClusterState, Command, ConfRole, NodeStatus, Refusal};
use super::voter_target;
use crate::control::state::Change;
use crate::ids::{Epoch, ExtentId, NodeId, VolumeId};

/// Members 1..=n (the first 3 vote), one volume of `extents` extents of 3
/// replicas.
fn cluster(n: u32, extents: u64) -> ClusterState {
    let ids: Vec<NodeId> = (1..=n).map(NodeId).collect();
    let mut s = ClusterState::genesis(&ids);
    s.apply(&Command::CreateVolume {
        volume: VolumeId(1),
        extents,
        replicas: 3,
    })
    .unwrap();
    s
}

/// Start moving extent 0's replica `from` -> `to` at `epoch`.
fn start_move(s: &mut ClusterState, epoch: Epoch, from: NodeId, to: NodeId) {
    s.apply(&Command::MoveReplica {
        extent: ExtentId(0),
        epoch,
        from,
        to,
    })
    .unwrap();
}

fn epoch(s: &ClusterState, e: u64) -> Epoch {
    s.extents[&ExtentId(e)].epoch
}

#[test]
fn genesis_votes_the_first_three_or_five() {
    assert_eq!(voter_target(2), 2);
    assert_eq!(voter_target(4), 3);
    assert_eq!(voter_target(7), 5);
    let s = cluster(4, 1);
    assert_eq!(s.voters.len(), 3);
    assert!(s.learners.contains(&NodeId(4)));
    s.self_check();
}

#[test]
fn a_joining_node_is_down_and_holds_nothing_until_the_group_takes_it() {
    let mut s = cluster(3, 3);
    s.apply(&Command::JoinNode {
        node: NodeId(4),
        addr: "10.0.0.4:7400".into(),
    })
    .unwrap();
    assert_eq!(s.nodes[&NodeId(4)], NodeStatus::Down);
    assert!(!s.holds_replicas(NodeId(4)));
    assert_eq!(s.addrs[&NodeId(4)], "10.0.0.4:7400");
    let again = s.apply(&Command::JoinNode {
        node: NodeId(4),
        addr: String::new(),
    });
    assert_eq!(again, Err(Refusal::KnownNode(NodeId(4))));
    for bad in [0, crate::ids::FRONT_END_ID_BASE] {
        let r = s.apply(&Command::JoinNode {
            node: NodeId(bad),
            addr: String::new(),
        });
        assert!(matches!(r, Err(Refusal::BadNode(..))), "{bad}: {r:?}");
    }
    let long = s.apply(&Command::JoinNode {
        node: NodeId(5),
        addr: "x".repeat(300),
    });
    assert!(matches!(long, Err(Refusal::BadNode(..))));
    s.apply(&Command::Conf {
        node: NodeId(4),
        role: ConfRole::Learner,
    })
    .unwrap();
    assert!(s.learners.contains(&NodeId(4)));
    s.self_check();
}

#[test]
fn a_leaving_node_keeps_its_copy_until_the_new_one_is_in_sync() {
    let mut s = cluster(4, 4);
    // Extent 0: replicas 1, 2, 3 with 1 primary.
    assert_eq!(
        s.extents[&ExtentId(0)].replicas,
        [NodeId(1), NodeId(2), NodeId(3)]
    );
    s.apply(&Command::RemoveNode { node: NodeId(1) }).unwrap();
    assert_eq!(
        s.apply(&Command::RemoveNode { node: NodeId(1) }),
        Err(Refusal::Leaving(NodeId(1)))
    );
    // Only to an up node that stays and is no replica yet.
    let e = epoch(&s, 0);
    for to in [NodeId(2), NodeId(1)] {
        let r = s.apply(&Command::MoveReplica {
            extent: ExtentId(0),
            epoch: e,
            from: NodeId(1),
            to,
        });
        assert!(matches!(r, Err(Refusal::BadMove { .. })), "{to}: {r:?}");
    }
    start_move(&mut s, e, NodeId(1), NodeId(4));
    let ext = &s.extents[&ExtentId(0)];
    assert!(ext.rebuilding.contains(&NodeId(4)));
    assert_eq!(ext.in_sync.len(), 3, "every old copy still counts");
    // Not before the new copy is in sync.
    let e = epoch(&s, 0);
    let early = s.apply(&Command::FinishMove {
        extent: ExtentId(0),
        epoch: e,
        serve_after_ns: 9_000,
    });
    assert!(matches!(early, Err(Refusal::BadMove { .. })));
    s.apply(&Command::RebuildDone {
        extent: ExtentId(0),
        epoch: e,
        node: NodeId(4),
    })
    .unwrap();
    let e = epoch(&s, 0);
    let changes = s
        .apply(&Command::FinishMove {
            extent: ExtentId(0),
            epoch: e,
            serve_after_ns: 9_000,
        })
        .unwrap();
    let ext = &s.extents[&ExtentId(0)];
    // The new replica takes the old one's place; the primary moves on, and
    // serves only once the old one's lease is surely over.
    assert_eq!(ext.replicas, [NodeId(4), NodeId(2), NodeId(3)]);
    assert_eq!(ext.primary, NodeId(4));
    assert_eq!(ext.primary_since, ext.epoch);
    assert_eq!(ext.serve_after_ns, 9_000);
    assert!(ext.moving.is_none());
    assert!(changes
        .iter()
        .any(|c| matches!(c, Change::Failover(f) if f[0].2 == NodeId(4))));
    assert!(changes.contains(&Change::Moved {
        extent: ExtentId(0),
        from: NodeId(1),
        to: NodeId(4)
    }));
    s.self_check();
}

#[test]
fn a_node_leaves_the_map_only_once_it_holds_nothing_and_does_not_vote() {
    let mut s = cluster(4, 2);
    s.apply(&Command::RemoveNode { node: NodeId(4) }).unwrap();
    // 4 holds extent 1's replicas (placement 2, 3, 4)? Find what it holds.
    let holds = s.holds_replicas(NodeId(4));
    let gone = s.apply(&Command::Conf {
        node: NodeId(4),
        role: ConfRole::Gone,
    });
    assert_eq!(gone.is_ok(), !holds);
    // A voter must hand its vote over first.
    s.apply(&Command::RemoveNode { node: NodeId(3) })
        .unwrap_err();
    let mut t = cluster(6, 0);
    t.apply(&Command::RemoveNode { node: NodeId(1) }).unwrap();
    let r = t.apply(&Command::Conf {
        node: NodeId(1),
        role: ConfRole::Gone,
    });
    assert!(matches!(r, Err(Refusal::BadConf { .. })), "{r:?}");
    for (node, role) in [(NodeId(6), ConfRole::Voter), (NodeId(1), ConfRole::Learner)] {
        t.apply(&Command::Conf { node, role }).unwrap();
    }
    t.apply(&Command::Conf {
        node: NodeId(1),
        role: ConfRole::Gone,
    })
    .unwrap();
    assert!(!t.nodes.contains_key(&NodeId(1)));
    assert!(!t.learners.contains(&NodeId(1)) && !t.leaving.contains(&NodeId(1)));
    assert_eq!(t.voters.len(), 5);
    t.self_check();
    // A leaving node never votes again; the last voter never learns.
    let mut one = ClusterState::genesis(&[NodeId(1)]);
    let r = one.apply(&Command::Conf {
        node: NodeId(1),
        role: ConfRole::Learner,
    });
    assert!(matches!(r, Err(Refusal::BadConf { .. })));
}

#[test]
fn the_staying_nodes_must_hold_every_copy() {
    let mut s = cluster(3, 2);
    let r = s.apply(&Command::RemoveNode { node: NodeId(1) });
    assert!(matches!(r, Err(Refusal::TooFewNodes { .. })), "{r:?}");
    let mut s = cluster(4, 2);
    s.apply(&Command::RemoveNode { node: NodeId(1) }).unwrap();
    let r = s.apply(&Command::RemoveNode { node: NodeId(2) });
    assert!(matches!(r, Err(Refusal::TooFewNodes { .. })), "{r:?}");
    // A node that is down counts for nothing: it may never come back.
    let mut s = cluster(4, 2);
    s.apply(&Command::NodeDown {
        node: NodeId(4),
        lease_expires_ns: 0,
    })
    .unwrap();
    let r = s.apply(&Command::RemoveNode { node: NodeId(1) });
    assert!(
        matches!(r, Err(Refusal::TooFewNodes { up: 2, .. })),
        "{r:?}"
    );
}

#[test]
fn a_replaced_move_target_is_replaced_in_the_move_too() {
    let mut s = cluster(5, 1);
    s.apply(&Command::RemoveNode { node: NodeId(1) }).unwrap();
    let e = epoch(&s, 0);
    start_move(&mut s, e, NodeId(1), NodeId(4));
    s.apply(&Command::NodeDown {
        node: NodeId(4),
        lease_expires_ns: 0,
    })
    .unwrap();
    s.apply(&Command::ReplaceNode { node: NodeId(4) }).unwrap();
    let ext = &s.extents[&ExtentId(0)];
    let m = ext.moving.unwrap();
    assert_eq!((m.from, m.to), (NodeId(1), NodeId(5)));
    assert!(ext.rebuilding.contains(&NodeId(5)));
    s.self_check();
    // The leaving node's own replica is not given a second spare.
    s.apply(&Command::NodeDown {
        node: NodeId(1),
        lease_expires_ns: 0,
    })
    .unwrap();
    assert!(s.replacements(NodeId(1)).is_empty());
}
