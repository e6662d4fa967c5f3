use super::*;
use crate::ids::VolumeId;
use std::collections::{BTreeMap, BTreeSet};

mod snapshots;

struct Group {
    members: BTreeMap<NodeId, MapRaft>,
    /// Members cut off from everyone.
    isolated: BTreeSet<NodeId>,
    applied: BTreeMap<NodeId, Vec<Command>>,
    /// Durable members' log files (none: the members keep no file).
    files: BTreeMap<NodeId, Vec<u8>>,
    /// Snapshots each member installed, by index.
    installed: BTreeMap<NodeId, Vec<u64>>,
    /// Snapshot messages still to lose in flight.
    lose_snapshots: usize,
    /// A member that crashes when a snapshot reaches it: before its file is
    /// rewritten (false) or just after (true).
    crash_on_install: Option<(NodeId, bool)>,
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
        files: BTreeMap::new(),
        installed: BTreeMap::new(),
        lose_snapshots: 0,
        crash_on_install: None,
    }
}

impl Group {
    /// Deliver messages until quiet.
    fn settle(&mut self) {
        loop {
            let mut sent = Vec::new();
            let ids: Vec<NodeId> = self.members.keys().copied().collect();
            for id in ids {
                while let Some(a) = self.members.get_mut(&id).unwrap().poll_action() {
                    if let RaftAction::Send { to, bytes } = a {
                        sent.push((id, to, bytes));
                    } else {
                        self.carry_out(id, a);
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
                let snapshot = RaftMessage::parse_from_bytes(&bytes)
                    .unwrap()
                    .get_msg_type()
                    == raft::prelude::MessageType::MsgSnapshot;
                if snapshot && self.lose_snapshots > 0 {
                    self.lose_snapshots -= 1;
                    continue;
                }
                let member = self.members.get_mut(&to).unwrap();
                let _ = member.handle_message(from, &bytes);
                if let Some((crashing, after_rewrite)) = self.crash_on_install {
                    if snapshot && crashing == to {
                        self.crash_on_install = None;
                        self.crash_during_install(to, after_rewrite);
                    }
                }
            }
        }
    }

    /// Carry out a member's action other than a send.
    fn carry_out(&mut self, id: NodeId, action: RaftAction) {
        match action {
            RaftAction::Send { .. } => unreachable!("sends are delivered by settle"),
            RaftAction::Applied { command, .. } => {
                self.applied.entry(id).or_default().push(command)
            }
            RaftAction::Persist(record) => self
                .files
                .get_mut(&id)
                .expect("only durable members persist")
                .extend_from_slice(&record),
            RaftAction::Rewrite(image) => {
                *self
                    .files
                    .get_mut(&id)
                    .expect("only durable members rewrite") = image.to_vec()
            }
            RaftAction::Installed { index, .. } => {
                self.installed.entry(id).or_default().push(index)
            }
        }
    }

    /// `id` took a snapshot message and crashes before it sends anything: its file
    /// is rewritten first if `after_rewrite`, and it restarts from its file.
    fn crash_during_install(&mut self, id: NodeId, after_rewrite: bool) {
        let member = self.members.get_mut(&id).unwrap();
        let mut done = Vec::new();
        while let Some(a) = member.poll_action() {
            done.push(a);
        }
        let mut rewritten = false;
        for a in done {
            match a {
                RaftAction::Persist(_) | RaftAction::Rewrite(_) if after_rewrite && !rewritten => {
                    rewritten = matches!(a, RaftAction::Rewrite(_));
                    self.carry_out(id, a);
                }
                _ => {}
            }
        }
        assert_eq!(rewritten, after_rewrite, "the install rewrites the file");
        self.restart(id);
    }

    /// Restart durable member `id` from its file.
    fn restart(&mut self, id: NodeId) {
        let ids: Vec<NodeId> = self.members.keys().copied().collect();
        let entries = self.members[&id].snapshot_entries;
        let file = self.files.get_mut(&id).unwrap();
        let (mut m, replayed) = MapRaft::open(id, &ids, 99 ^ u64::from(id.0), file).unwrap();
        file.truncate(replayed.valid_len);
        m.set_snapshot_entries(entries);
        self.members.insert(id, m);
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

/// A forged Raft message from member `from` to `to`, built from random fields near
/// the group's real log (terms and indexes a few past the end, so the out-of-range
/// cases come up often).
#[derive(Clone, Debug)]
struct Forged {
    from: u32,
    to: u32,
    kind: u8,
    term: u64,
    index: u64,
    log_term: u64,
    commit: u64,
    reject: bool,
    reject_hint: u64,
    entries: Vec<(u64, u64, u8)>,
}

fn forged() -> impl proptest::strategy::Strategy<Value = Forged> {
    use proptest::prelude::*;
    (
        (1u32..=3, 1u32..=3, 0u8..12),
        (0u64..8, 0u64..16, 0u64..8, 0u64..24),
        (any::<bool>(), 0u64..24),
        proptest::collection::vec((0u64..16, 0u64..8, 0u8..3), 0..4),
    )
        .prop_map(
            |(
                (from, to, kind),
                (term, index, log_term, commit),
                (reject, reject_hint),
                entries,
            )| {
                Forged {
                    from,
                    to,
                    kind,
                    term,
                    index,
                    log_term,
                    commit,
                    reject,
                    reject_hint,
                    entries,
                }
            },
        )
}

impl Forged {
    fn encode(&self) -> Vec<u8> {
        use raft::prelude::MessageType as T;
        let kinds = [
            T::MsgAppend,
            T::MsgAppendResponse,
            T::MsgHeartbeat,
            T::MsgHeartbeatResponse,
            T::MsgRequestVote,
            T::MsgRequestVoteResponse,
            T::MsgRequestPreVote,
            T::MsgRequestPreVoteResponse,
            T::MsgTimeoutNow,
            T::MsgSnapshot,
            T::MsgTransferLeader,
            T::MsgReadIndex,
            T::MsgPropose,
        ];
        let mut m = RaftMessage::default();
        m.set_msg_type(kinds[self.kind as usize % kinds.len()]);
        m.from = u64::from(self.from);
        m.to = u64::from(self.to);
        m.term = self.term;
        m.index = self.index;
        m.log_term = self.log_term;
        m.commit = self.commit;
        m.reject = self.reject;
        m.reject_hint = self.reject_hint;
        m.entries = self
            .entries
            .iter()
            .map(|&(index, term, data)| {
                let data: Vec<u8> = match data {
                    0 => vec![],
                    1 => vec![0xff, 0x13],
                    _ => postcard::to_allocvec(&Command::AddNode { node: NodeId(9) }).unwrap(),
                };
                Entry {
                    index,
                    term,
                    data: data.into(),
                    ..Entry::default()
                }
            })
            .collect::<Vec<_>>()
            .into();
        m.write_to_bytes().unwrap()
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]

    /// A member that claims a member's id but sends forged Raft messages (stale or
    /// future terms, indexes past the log, commit indexes beyond it, entries that
    /// conflict with committed ones) is refused or absorbed: no member panics, and
    /// each still answers afterwards. (Raft cannot stay correct under a lying
    /// member; it must at least not be crashed by one.)
    #[test]
    fn forged_raft_messages_never_crash_a_member(seed in 0u64..64, msgs in proptest::collection::vec(forged(), 1..24)) {
        let mut g = group(seed);
        g.tick_all(50);
        let leader = g.leader().expect("a leader");
        for i in 0..3 {
            let cmd = Command::AddNode { node: NodeId(10 + i) };
            g.members.get_mut(&leader).unwrap().propose(&cmd).unwrap();
            g.settle();
        }
        for (i, m) in msgs.iter().enumerate() {
            let to = NodeId(m.to);
            let _ = g
                .members
                .get_mut(&to)
                .unwrap()
                .handle_message(NodeId(m.from), &m.encode());
            g.settle();
            if i % 4 == 3 {
                g.tick_all(1);
            }
        }
        g.tick_all(60);
        for m in g.members.values() {
            proptest::prop_assert!(m.last_index() >= m.applied_index());
        }
    }
}
