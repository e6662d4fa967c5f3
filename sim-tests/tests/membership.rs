//! Membership changes in the simulated cluster, under a workload: a node added,
//! another removed (its replicas moved first), a voter gone for good replaced,
//! with every checker passing.
#![cfg(madsim)]

use weir_core::events::MemberChange;
use weir_core::{Event, NodeId};
use weir_sim::report::Report;
use weir_sim::runner::{run, Fault};
use weir_sim::scenario::Scenario;

/// One client at queue depth 8 for `duration_ms`.
fn small(duration_ms: u64) -> Scenario {
    let mut s = Scenario::default_scenario();
    s.workload.duration_ms = duration_ms;
    s.workload.clients = 1;
    s.workload.queue_depth = 8;
    s
}

/// The membership changes the run reported for `node`, in order.
fn changes(r: &Report, node: NodeId) -> Vec<MemberChange> {
    r.node_events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Member { node: n, change } if *n == node => Some(*change),
            _ => None,
        })
        .collect()
}

#[test]
fn a_node_is_added_and_another_removed_during_the_workload() {
    let mut s = small(400);
    // 16 extents of 16 MiB: the removal, which waits for the new node to be
    // up (two up nodes cannot stay for three copies), has time to move them
    // all within the liveness bound.
    s.cluster.volume_mib = 256;
    s.cluster.extent_mib = 16;
    s.faults.node_adds = 1;
    s.faults.node_removals = 1;
    for seed in [1, 2] {
        let outcome = run(seed, &s, "membership");
        let r = &outcome.report;
        assert!(r.passed(), "{r}");
        let removed = outcome
            .plan
            .faults
            .iter()
            .find_map(|p| match p.fault {
                Fault::Remove { node } => Some(node),
                _ => None,
            })
            .expect("a removal");
        let added = NodeId(4);
        assert!(r.faults.iter().any(|f| f.contains("n4 is added")), "{r}");
        let gone = changes(r, removed);
        // It held a replica of every extent (3 nodes, 3 replicas): each moved
        // before it left, and it left holding nothing.
        let Some(MemberChange::Leaving { extents }) = gone.first().copied() else {
            panic!("{removed} never started leaving: {gone:?}\n{r}");
        };
        let moved = gone
            .iter()
            .filter(|c| matches!(c, MemberChange::Moved { .. }))
            .count();
        assert_eq!(moved, extents, "{gone:?}");
        assert!(
            gone.contains(&MemberChange::Learner),
            "its vote went: {gone:?}"
        );
        assert_eq!(gone.last(), Some(&MemberChange::Gone), "{gone:?}");
        // The new node took the vote and replicas.
        let joined = changes(r, added);
        assert_eq!(joined.first(), Some(&MemberChange::Joined), "{joined:?}");
        assert!(joined.contains(&MemberChange::Voter), "{joined:?}");
        let to_added = gone
            .iter()
            .filter(|c| matches!(c, MemberChange::Moved { to, .. } if *to == added))
            .count();
        assert_eq!(to_added, extents, "the only node that holds none of them");
        let live = r.verdicts.iter().find(|v| v.name == "liveness").unwrap();
        assert!(live.passed() && live.scope.contains("back to 3"), "{r}");
    }
}

#[test]
fn a_voter_gone_for_good_hands_its_vote_to_a_learner() {
    let mut s = small(600);
    s.cluster.nodes = 4;
    s.faults.node_crashes = 1;
    s.faults.crash_leader = true;
    let outcome = run(3, &s, "voter replaced");
    let r = &outcome.report;
    assert!(r.passed(), "{r}");
    // Node 1 (a voter, the first leader) crashes for good; past the
    // replacement timeout node 4 (the learner of 4 members) takes its vote.
    assert!(r.faults.iter().any(|f| f.contains("n1 crashes")), "{r}");
    assert!(changes(r, NodeId(4)).contains(&MemberChange::Voter), "{r}");
    assert!(
        changes(r, NodeId(1)).contains(&MemberChange::Learner),
        "{r}"
    );
}
