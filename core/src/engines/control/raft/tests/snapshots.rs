//! Log compaction: snapshots taken, sent to a member that needs entries the
//! leader dropped, installed, persisted, lost in flight and interrupted by crashes.

use super::*;

/// A group whose members snapshot every `every` applied entries; durable ones
/// keep a log file.
fn compacting(n: u32, seed: u64, every: u64, durable: bool) -> Group {
    let mut g = group_of(n, seed);
    if durable {
        let ids: Vec<NodeId> = g.members.keys().copied().collect();
        for &id in &ids {
            let (m, _) = MapRaft::open(id, &ids, seed ^ u64::from(id.0), &[]).unwrap();
            g.members.insert(id, m);
            g.files.insert(id, Vec::new());
        }
    }
    for m in g.members.values_mut() {
        m.set_snapshot_entries(every);
    }
    g
}

/// Elect a leader, cut a follower off, commit `commands` new members' `AddNode`s
/// without it, and let it back (its messages flow at the next tick); returns the
/// leader and the follower.
fn commit_without_a_follower(g: &mut Group, commands: u32) -> (NodeId, NodeId) {
    g.tick_all(50);
    let leader = g.leader().expect("a leader");
    let away = *g.members.keys().find(|&&id| id != leader).unwrap();
    g.isolated.insert(away);
    for i in 0..commands {
        let cmd = Command::AddNode {
            node: NodeId(100 + i),
        };
        g.members.get_mut(&leader).unwrap().propose(&cmd).unwrap();
        g.settle();
    }
    g.isolated.remove(&away);
    (leader, away)
}

/// Every member holds the same map at the same applied index.
fn assert_agree(g: &Group) {
    let members: Vec<&MapRaft> = g.members.values().collect();
    let first = members[0];
    for m in &members[1..] {
        assert_eq!(m.applied_index(), first.applied_index());
        assert_eq!(m.state(), first.state());
    }
    for m in g.members.values() {
        m.self_check();
    }
}

#[test]
fn the_log_stays_bounded_and_a_member_that_was_away_installs_the_leaders_snapshot() {
    let mut g = compacting(3, 5, 4, false);
    let (leader, away) = commit_without_a_follower(&mut g, 30);
    let l = &g.members[&leader];
    assert!(l.snapshot_counts().taken >= 6, "{:?}", l.snapshot_counts());
    assert!(
        l.last_index() - l.first_index() < 8,
        "the log holds at most 1.5 x 4 entries past its snapshot"
    );
    assert!(
        l.first_index() > 20,
        "compacted past what the member missed"
    );
    g.tick_all(20);
    assert_eq!(g.installed[&away].len(), 1, "one snapshot, not the entries");
    assert_eq!(g.members[&away].snapshot_counts().installed, 1);
    assert_eq!(g.members[&away].state().nodes.len(), 3 + 30);
    assert_agree(&g);
    // It follows the log again from there.
    let cmd = Command::AddNode { node: NodeId(7) };
    g.members.get_mut(&leader).unwrap().propose(&cmd).unwrap();
    g.tick_all(3);
    assert_eq!(g.applied[&away].last(), Some(&cmd));
    assert_agree(&g);
}

#[test]
fn a_snapshot_lost_in_flight_is_sent_again() {
    let mut g = compacting(3, 8, 4, false);
    let (leader, away) = commit_without_a_follower(&mut g, 20);
    g.lose_snapshots = 1;
    g.tick_all(usize::try_from(SNAPSHOT_RETRY_TICKS).unwrap() / 2);
    assert!(!g.installed.contains_key(&away), "the first one was lost");
    g.tick_all(usize::try_from(SNAPSHOT_RETRY_TICKS).unwrap() + 10);
    assert_eq!(g.members[&leader].snapshot_counts().retried, 1);
    assert_eq!(g.installed[&away].len(), 1);
    assert_agree(&g);
}

#[test]
fn a_member_restarted_after_compaction_replays_its_snapshot_and_the_entries_after_it() {
    let mut g = compacting(3, 2, 4, true);
    commit_without_a_follower(&mut g, 10);
    g.tick_all(10);
    assert_agree(&g);
    let ids: Vec<NodeId> = g.members.keys().copied().collect();
    for id in ids {
        let before = (
            g.members[&id].state().clone(),
            g.members[&id].applied_index(),
        );
        let file = g.files[&id].len();
        g.restart(id);
        assert_eq!(g.files[&id].len(), file, "no torn tail");
        let m = &g.members[&id];
        assert_eq!(
            (m.state().clone(), m.applied_index()),
            before,
            "{id} replays to its map"
        );
        assert!(m.snapshot_index() > 0, "{id}'s file starts at a snapshot");
        m.self_check();
    }
    // Bounded: a file holds the latest snapshot and the few entries after it, not
    // every round the member ever made durable.
    let file_of = |every: u64| {
        let mut g = compacting(3, 2, every, true);
        commit_without_a_follower(&mut g, 40);
        g.tick_all(10);
        g.files.values().map(Vec::len).max().unwrap()
    };
    let (compacted, whole) = (file_of(4), file_of(0));
    assert!(
        compacted * 4 < whole,
        "a compacted file of 40 commands ({compacted} B) against the whole log ({whole} B)"
    );
}

#[test]
fn a_member_that_crashes_during_an_install_comes_back_whole_and_installs_again() {
    for after_rewrite in [false, true] {
        let mut g = compacting(3, 3, 4, true);
        let (leader, away) = commit_without_a_follower(&mut g, 20);
        g.crash_on_install = Some((away, after_rewrite));
        g.tick_all(usize::try_from(SNAPSHOT_RETRY_TICKS).unwrap() * 2 + 20);
        assert!(
            g.crash_on_install.is_none(),
            "the member crashed during an install"
        );
        let m = &g.members[&away];
        m.self_check();
        if after_rewrite {
            // It restarted from the snapshot; the leader only had to catch it up.
            assert!(m.snapshot_index() > 0);
        } else {
            // It restarted from its old file and was sent the snapshot again.
            assert_eq!(g.members[&leader].snapshot_counts().retried, 1);
            assert_eq!(m.snapshot_counts().installed, 1);
        }
        assert_agree(&g);
    }
}

#[test]
fn a_snapshot_that_is_not_a_valid_map_is_refused() {
    let mut g = compacting(3, 4, 4, false);
    g.tick_all(50);
    let leader = g.leader().unwrap();
    let to = *g.members.keys().find(|&&id| id != leader).unwrap();
    let term = g.members[&to].term();
    let conf = g.members[&to].node.store().conf_state().clone();
    let forge = |data: Vec<u8>, index: u64, conf: ConfState| {
        let mut m = RaftMessage::default();
        m.set_msg_type(raft::prelude::MessageType::MsgSnapshot);
        m.from = u64::from(leader.0);
        m.to = u64::from(to.0);
        m.term = term;
        m.set_snapshot(snapshot_of(index, term, conf, data));
        m.write_to_bytes().unwrap()
    };
    let valid = postcard::to_allocvec(&ClusterState::default()).unwrap();
    let member = g.members.get_mut(&to).unwrap();
    for (bytes, why) in [
        (forge(vec![0xff; 7], 50, conf.clone()), "garbage"),
        (forge(valid.clone(), 0, conf.clone()), "no index"),
        (
            forge(valid.clone(), 50, ConfState::from((vec![1, 9], vec![]))),
            "another group",
        ),
    ] {
        assert!(
            matches!(
                member.handle_message(leader, &bytes),
                Err(RaftError::Impossible(_))
            ),
            "{why}"
        );
    }
    // A map that decodes but breaks its invariants (extent ids with a gap).
    let mut broken = ClusterState::default();
    let extent = crate::control::state::ExtentState {
        replicas: vec![NodeId(1)],
        primary: NodeId(1),
        in_sync: [NodeId(1)].into(),
        rebuilding: BTreeSet::new(),
        epoch: crate::ids::Epoch(1),
        primary_since: crate::ids::Epoch(1),
        serve_after_ns: 0,
        moving: None,
    };
    broken.extents.insert(crate::ids::ExtentId(3), extent);
    let bytes = forge(postcard::to_allocvec(&broken).unwrap(), 50, conf);
    assert!(matches!(
        member.handle_message(leader, &bytes),
        Err(RaftError::Impossible(_))
    ));
    assert_eq!(member.snapshot_counts().installed, 0);
    assert_eq!(member.applied_index(), g.members[&leader].applied_index());
}

#[test]
fn the_snapshot_of_a_large_pool_fits_in_one_frame() {
    // 16,384 extents of 3 replicas on 5 nodes: the most the daemon's config takes
    // (`MAX_EXTENTS`; a 1 TiB pool in 64 MiB extents).
    let mut state = ClusterState::default();
    for n in 1..=5 {
        state.apply(&Command::AddNode { node: NodeId(n) }).unwrap();
    }
    let volume = Command::CreateVolume {
        volume: VolumeId(1),
        extents: 16_384,
        replicas: 3,
    };
    state.apply(&volume).unwrap();
    let data = postcard::to_allocvec(&state).unwrap();
    let conf = ConfState::from((vec![1, 2, 3, 4, 5], vec![]));
    let mut m = RaftMessage::default();
    m.set_msg_type(raft::prelude::MessageType::MsgSnapshot);
    m.set_snapshot(snapshot_of(9, 2, conf, data.clone()));
    let bytes = Bytes::from(m.write_to_bytes().unwrap());
    let per_extent = data.len() as f64 / 16_384.0;
    let frame = crate::wire::Message::Raft { bytes }.encode();
    assert!(
        frame.is_ok(),
        "{} B of map ({per_extent:.1} B per extent) do not fit in one frame",
        data.len()
    );
    // What the README states: some 70,000 extents fit (15 B each).
    let extents_max = crate::wire::MAX_BODY_BYTES as f64 / per_extent;
    assert!(
        extents_max > 65_000.0,
        "{extents_max:.0} extents fit in a frame"
    );
}
