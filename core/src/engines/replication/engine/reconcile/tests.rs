use super::*;

const E: ExtentId = ExtentId(0);
const ME: NodeId = NodeId(1);
const N2: NodeId = NodeId(2);
const N3: NodeId = NodeId(3);

fn blocks(b: &[u64]) -> BTreeSet<u64> {
    b.iter().copied().collect()
}

#[test]
fn a_tail_keeps_the_writes_above_settled_within_its_bound() {
    let mut r = Reconciler::default();
    r.note_tail(E, Version(1), Lba(0), 2, Version(0));
    r.note_tail(E, Version(2), Lba(10), 1, Version(0));
    assert_eq!(r.tail_blocks(E), blocks(&[0, 1, 10]));
    // Write 3 carries settled 1: write 1 is answered everywhere.
    r.note_tail(E, Version(3), Lba(20), 1, Version(1));
    assert_eq!(r.tail_blocks(E), blocks(&[10, 20]));
    r.self_check();
    for v in 4..(TAIL_MAX as u64 + 10) {
        r.note_tail(E, Version(v), Lba(v), 1, Version(1));
    }
    assert_eq!(
        r.tails[&E].len(),
        TAIL_MAX,
        "the oldest fall out past the bound"
    );
    r.self_check();
    // Everything settled but the write itself: it alone is kept.
    let last = TAIL_MAX as u64 + 100;
    r.note_tail(E, Version(last), Lba(7), 1, Version(last - 1));
    assert!(
        r.tail_blocks(E) == blocks(&[7]),
        "only the write above settled"
    );
}

#[test]
fn a_follower_sends_its_tail_once_per_reign_in_runs_of_a_request() {
    let mut r = Reconciler::default();
    for (v, lba) in [(1, 0), (2, 1), (3, 2), (4, 9)] {
        r.note_tail(E, Version(v), Lba(lba), 1, Version(0));
    }
    let reign = (N2, Epoch(5));
    assert_eq!(
        r.follow(E, reign, true, 2),
        Some(vec![(Lba(0), 2), (Lba(2), 1), (Lba(9), 1)])
    );
    assert_eq!(r.follow(E, reign, true, 2), None, "sent already");
    assert_eq!(r.follow(E, (N3, Epoch(7)), false, 2), None, "holds no copy");
    assert!(
        r.follow(E, (N3, Epoch(7)), true, 2).is_some(),
        "a new reign"
    );
}

#[test]
fn a_leader_waits_for_every_tail_then_writes_back_once_and_reports_the_batch() {
    let mut r = Reconciler::default();
    r.note_tail(E, Version(9), Lba(4), 1, Version(0));
    // N3's tail comes before this node's map shows the reign.
    let early = r.tail(N3, E, Epoch(5), vec![(Lba(6), 2)], Epoch(4));
    assert_eq!(early, TailNext::Nothing);
    assert!(r.lead(E, Epoch(5), &[N2, N3], 100));
    assert_eq!(r.to_push(E), None, "N2's tail is not in");
    assert!(r.overdue(199, 100).is_empty());
    assert_eq!(r.overdue(200, 100), [(E, N2)]);
    assert_eq!(
        r.tail(N2, E, Epoch(4), vec![(Lba(30), 1)], Epoch(5)),
        TailNext::Nothing,
        "stale"
    );
    assert_eq!(
        r.tail(N2, E, Epoch(5), vec![(Lba(8), 1)], Epoch(5)),
        TailNext::Push
    );
    r.self_check();
    let (named, since) = r.to_push(E).expect("every tail is in");
    assert_eq!((named, since), (blocks(&[4, 6, 7, 8]), 100));
    r.pushing(E, 2, 4, since);
    assert_eq!(r.to_push(E), None, "written back once");
    // A rebuilding replica's tail, not waited for, after the write-backs began.
    let more = r.tail(NodeId(4), E, Epoch(5), vec![(Lba(40), 1)], Epoch(5));
    assert_eq!(more, TailNext::WriteBack(blocks(&[40])));
    r.wrote_back(E, 1, 1, true);
    r.pushed(E);
    r.pushed(E);
    assert_eq!(r.finish(E), None, "one write-back left");
    r.pushed(E);
    assert_eq!(
        r.finish(E),
        Some(Finished {
            batch: Some((1, 4, 100))
        })
    );
    assert!(r.reconciled(E, Epoch(5)));
    assert!(
        r.tails.is_empty(),
        "the tail is settled by the reconciliation"
    );
    assert!(!r.lead(E, Epoch(5), &[N2, N3], 300), "reconciled already");
    let late = r.tail(N3, E, Epoch(5), vec![(Lba(50), 1)], Epoch(5));
    assert_eq!(late, TailNext::Late(blocks(&[50])));
    r.self_check();
}

#[test]
fn a_replica_dropped_from_the_in_sync_set_is_not_waited_for() {
    let mut r = Reconciler::default();
    assert!(r.lead(E, Epoch(5), &[N2, N3], 0));
    assert!(r.lead(E, Epoch(5), &[N2], 10), "N3 dropped");
    assert_eq!(r.overdue(1_000, 1), [(E, N2)]);
    assert_eq!(r.tail(N2, E, Epoch(5), vec![], Epoch(5)), TailNext::Push);
    assert_eq!(r.to_push(E), Some((BTreeSet::new(), 0)));
    r.pushing(E, 0, 0, 0);
    assert_eq!(
        r.finish(E),
        Some(Finished { batch: None }),
        "nothing written back"
    );
    // Deposed: the next primary's reign is followed, the lead forgotten.
    assert_eq!(r.follow(E, (N2, Epoch(6)), true, 16), Some(vec![]));
    assert!(!r.reconciled(E, Epoch(5)));
}

#[test]
fn the_first_map_is_taken_as_reconciled_and_seen() {
    let (_, map) = super::super::small_cluster();
    let mut r = Reconciler::default();
    r.start_with(&map, ME);
    let (led, other) = (map.extent(ExtentId(0)), map.extent(ExtentId(1)));
    assert_eq!((led.primary, other.primary), (ME, N2));
    assert!(r.reconciled(ExtentId(0), led.primary_since));
    assert!(!r.lead(ExtentId(0), led.primary_since, &[N2, N3], 0));
    assert_eq!(
        r.follow(ExtentId(1), (N2, other.primary_since), true, 16),
        None,
        "nothing was in flight before the first map"
    );
}

#[test]
#[should_panic(expected = "deferred twice")]
fn the_check_catches_a_write_back_deferred_twice() {
    let mut r = Reconciler::default();
    r.defer(OpId(3));
    r.defer(OpId(3));
    r.self_check();
}
