use super::*;
use crate::ids::VolumeId;
use std::collections::{BTreeMap, BTreeSet};

struct Group {
    members: BTreeMap<NodeId, MapRaft>,
    /// Members cut off from everyone.
    isolated: BTreeSet<NodeId>,
    applied: BTreeMap<NodeId, Vec<Command>>,
}

fn group(seed: u64) -> Group {
    group_of(3, seed)
}

fn group_of(n: u32, seed: u64) -> Group {
    let ids: Vec<NodeId> = (1..=n).map(NodeId).collect();
    let members = ids
        .iter()
        .map(|&id| (id, MapRaft::new(id, &ids, seed ^ u64::from(id.0)).unwrap()))
        .collect();
    Group {
        members,
        isolated: BTreeSet::new(),
        applied: BTreeMap::new(),
    }
}

impl Group {
    /// Deliver messages until quiet.
    fn settle(&mut self) {
        loop {
            let mut sent = Vec::new();
            for (&id, m) in self.members.iter_mut() {
                while let Some(a) = m.poll_action() {
                    match a {
                        RaftAction::Send { to, bytes } => sent.push((id, to, bytes)),
                        RaftAction::Applied { command, .. } => {
                            self.applied.entry(id).or_default().push(command)
                        }
                        RaftAction::Persist(_) => panic!("in-memory members persist nothing"),
                    }
                }
            }
            if sent.is_empty() {
                return;
            }
            for (from, to, bytes) in sent {
                if self.isolated.contains(&from) || self.isolated.contains(&to) {
                    continue;
                }
                let _ = self
                    .members
                    .get_mut(&to)
                    .unwrap()
                    .handle_message(from, &bytes);
            }
        }
    }

    fn tick_all(&mut self, n: usize) {
        for _ in 0..n {
            for m in self.members.values_mut() {
                m.tick();
            }
            self.settle();
        }
    }

    fn leader(&self) -> Option<NodeId> {
        self.members
            .iter()
            .find(|(id, m)| m.is_leader() && !self.isolated.contains(id))
            .map(|(&id, _)| id)
    }
}

#[test]
fn a_group_elects_a_leader_and_replicates_commands_to_every_member() {
    let mut g = group(7);
    g.tick_all(50);
    let leader = g.leader().expect("a leader within 50 ticks");
    let l = g.members.get_mut(&leader).unwrap();
    for n in 1..=3 {
        l.propose(&Command::AddNode { node: NodeId(n) }).unwrap();
    }
    l.propose(&Command::CreateVolume {
        volume: VolumeId(1),
        extents: 4,
        replicas: 3,
    })
    .unwrap();
    g.tick_all(5);
    let states: Vec<&ClusterState> = g.members.values().map(|m| m.state()).collect();
    assert_eq!(states[0].extents.len(), 4);
    assert!(states
        .iter()
        .all(|s| s.extents == states[0].extents && s.nodes == states[0].nodes));
    // A follower refuses proposals and names the leader.
    let follower = g.members.keys().copied().find(|&id| id != leader).unwrap();
    let err = g
        .members
        .get_mut(&follower)
        .unwrap()
        .propose(&Command::AddNode { node: NodeId(9) });
    assert!(matches!(err, Err(RaftError::NotLeader(Some(l))) if l == leader));
}

#[test]
fn losing_the_leader_elects_another_that_keeps_the_log() {
    let mut g = group(3);
    g.tick_all(50);
    let first = g.leader().unwrap();
    g.members
        .get_mut(&first)
        .unwrap()
        .propose(&Command::AddNode { node: NodeId(1) })
        .unwrap();
    g.tick_all(3);
    g.isolated.insert(first);
    g.tick_all(60);
    let second = g.leader().expect("a new leader");
    assert_ne!(first, second);
    let term_before = g.members[&first].term();
    assert!(g.members[&second].term() > term_before);
    g.members
        .get_mut(&second)
        .unwrap()
        .propose(&Command::AddNode { node: NodeId(2) })
        .unwrap();
    g.tick_all(3);
    let nodes = &g.members[&second].state().nodes;
    assert!(
        nodes.contains_key(&NodeId(1)) && nodes.contains_key(&NodeId(2)),
        "the new leader lost a committed command"
    );
}

#[test]
fn the_same_seed_elects_the_same_leader_in_the_same_term() {
    let run = |seed| {
        let mut g = group(seed);
        g.tick_all(50);
        let l = g.leader().unwrap();
        (l, g.members[&l].term())
    };
    assert_eq!(run(11), run(11));
    let leaders: BTreeSet<NodeId> = (0..20).map(|s| run(s).0).collect();
    assert!(leaders.len() > 1, "the seed does not move the election");
}

#[test]
fn strangers_and_garbage_are_refused() {
    let mut g = group(1);
    let m = g.members.get_mut(&NodeId(1)).unwrap();
    assert!(matches!(
        m.handle_message(NodeId(9), b""),
        Err(RaftError::Stranger(_))
    ));
    assert!(matches!(
        m.handle_message(NodeId(2), &[0xff; 16]),
        Err(RaftError::Decode(_))
    ));
}

#[test]
fn the_first_three_or_five_members_vote_and_the_others_learn_the_map() {
    let ids = |n: u32| (1..=n).map(NodeId).collect::<Vec<_>>();
    assert_eq!(voters_of(&ids(2)), ids(2));
    assert_eq!(voters_of(&ids(4)), ids(3));
    assert_eq!(voters_of(&ids(9)), ids(5));
    // Four members: n4 learns. It applies every command, never leads, and the
    // three voters go on without it.
    let mut g = group_of(4, 11);
    g.tick_all(50);
    let leader = g.leader().expect("a leader");
    assert_ne!(leader, NodeId(4));
    let cmd = Command::AddNode { node: NodeId(4) };
    g.members.get_mut(&leader).unwrap().propose(&cmd).unwrap();
    g.settle();
    g.tick_all(5);
    assert_eq!(g.applied[&NodeId(4)], vec![cmd]);
    g.isolated.insert(leader);
    g.tick_all(100);
    let next = g.leader().expect("a new leader among the voters");
    assert!(next != NodeId(4) && next != leader);
    // A learner standing for election gets nowhere.
    let _ = g.members.get_mut(&NodeId(4)).unwrap().campaign();
    g.settle();
    assert!(!g.members[&NodeId(4)].is_leader());
    assert_eq!(g.leader(), Some(next));
}
