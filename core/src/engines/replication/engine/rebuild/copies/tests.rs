use super::*;

const BS: u64 = 4096;
const E0: ExtentId = ExtentId(0);
const ME: NodeId = NodeId(1);
const N2: NodeId = NodeId(2);
const RATE: u64 = 1 << 30;

/// Three nodes, extents of 64 blocks (extent 0 led by node 1), grains of 4
/// blocks, requests of at most 16 blocks (so chunks of 4 grains); every
/// grain of extent 0 written at version 5.
fn setup() -> (Grains, ClusterMap) {
    let (mut grains, map) = crate::replication::engine::small_cluster();
    for g in 0..16 {
        grains.set(g, Version(5), true);
    }
    (grains, map)
}

/// `map` with `node` moved in extent 0 to rebuilding (or back in sync),
/// at the next epoch.
fn with_node(map: &ClusterMap, node: NodeId, rebuilding: bool) -> ClusterMap {
    let mut state = map.state().clone();
    let e = state.extents.get_mut(&E0).unwrap();
    if rebuilding {
        e.in_sync.remove(&node);
        e.rebuilding.insert(node);
    } else {
        e.rebuilding.remove(&node);
        e.in_sync.insert(node);
    }
    e.epoch = e.epoch.next();
    map.with_state(state).unwrap()
}

/// The engine's side of a test: its table of chunks, and op ids.
#[derive(Default)]
struct Table {
    chunks: BTreeMap<OpId, Chunk>,
    next_op: u64,
    asked: usize,
    /// Replicas with a chunk waiting for room in their window.
    blocked: BTreeSet<NodeId>,
}

impl Table {
    /// Pump, file the chunks started, count the `RebuildDone`s asked;
    /// the first blocks of the chunks started.
    fn pump(&mut self, r: &mut Rebuilds, now: u64, grains: &Grains, map: &ClusterMap) -> Vec<u64> {
        let next = &mut self.next_op;
        let mut new_op = || {
            *next += 1;
            OpId(*next)
        };
        let mut started = Vec::new();
        for step in r.pump(now, (RATE, &self.blocked), grains, map, &mut new_op) {
            match step {
                Step::AskDone(crate::control::Command::RebuildDone { extent, node, .. }) => {
                    assert_eq!((extent, node), (E0, N2));
                    self.asked += 1;
                }
                Step::AskDone(other) => panic!("asked for {other:?}"),
                Step::Chunk { op, chunk } => {
                    started.push(chunk.lba.0);
                    self.chunks.insert(op, chunk);
                }
            }
        }
        r.self_check(&self.chunks);
        started
    }

    /// Every chunk out answered at `now` (all sent: the replica lacked all).
    fn answer_all(&mut self, r: &mut Rebuilds, now: u64) {
        for (op, chunk) in std::mem::take(&mut self.chunks) {
            let bytes = chunk.versions.len() as u64 * 4 * BS;
            r.probed((E0, N2), 0, bytes);
            r.chunk_ended((E0, N2), op, chunk.lba, Ok(bytes), now);
        }
        r.self_check(&self.chunks);
    }
}

fn started(grains: &Grains, map: &ClusterMap) -> (Rebuilds, Table) {
    let mut r = Rebuilds::default();
    let wanted = r.wanted(map, ME);
    assert_eq!(wanted.len(), 1, "one replica rebuilds: {wanted:?}");
    assert_eq!((wanted[0].0, wanted[0].1), (E0, N2));
    r.begin(wanted[0], None, false, grains, map, 0);
    assert!(r.wanted(map, ME).is_empty(), "the copy has begun");
    (r, Table::default())
}

#[test]
fn no_chunk_starts_towards_a_replica_whose_data_waits_for_its_window() {
    let (grains, map) = setup();
    let map = with_node(&map, N2, true);
    let (mut r, mut t) = started(&grains, &map);
    // A chunk of N2's waits for room in its window: nothing new goes.
    t.blocked.insert(N2);
    assert!(t.pump(&mut r, 0, &grains, &map).is_empty());
    // Another peer's wait does not bind this copy: its probes go, four at
    // once (each may find the replica lacks nothing).
    t.blocked = [NodeId(3)].into();
    assert_eq!(t.pump(&mut r, 0, &grains, &map), [0, 16, 32, 48]);
}

#[test]
fn a_copy_walks_in_bounded_chunks_then_joins_and_asks_once_owed_writes_are_answered() {
    let (grains, map) = setup();
    let map = with_node(&map, N2, true);
    let (mut r, mut t) = started(&grains, &map);
    assert_eq!(r.progress()[0].bytes_total, 64 * BS);
    assert_eq!(t.pump(&mut r, 0, &grains, &map), [0, 16, 32, 48]);
    assert!(
        t.pump(&mut r, 0, &grains, &map).is_empty(),
        "4 chunks per copy"
    );
    // A write forwarded to the replica, not yet answered, holds the join back.
    r.forwarded(N2, OpId(1000), E0, 0);
    const MS: u64 = 1_000_000;
    t.answer_all(&mut r, MS);
    assert!(
        t.pump(&mut r, 2 * MS, &grains, &map).is_empty(),
        "walked to the end"
    );
    assert_eq!(r.joining(E0), [N2], "walked, every chunk answered");
    assert_eq!(t.asked, 0, "the replica owes a write");
    assert!(
        !r.replica_answered(N2, OpId(999), false, &map),
        "not forwarded"
    );
    assert!(r.replica_answered(N2, OpId(1000), false, &map));
    t.pump(&mut r, 3 * MS, &grains, &map);
    assert_eq!(t.asked, 1);
    t.pump(&mut r, 3 * MS + REBUILD_RETRY_NS - 1, &grains, &map);
    assert_eq!(t.asked, 1, "asked just now");
    t.pump(&mut r, 3 * MS + REBUILD_RETRY_NS, &grains, &map);
    assert_eq!(t.asked, 2, "asked again: the request may have been lost");
    // Then twice as long between asks, up to a bound.
    let second = 3 * MS + REBUILD_RETRY_NS;
    t.pump(&mut r, second + 2 * REBUILD_RETRY_NS - 1, &grains, &map);
    assert_eq!(t.asked, 2, "asked again too soon");
    t.pump(&mut r, second + 2 * REBUILD_RETRY_NS, &grains, &map);
    assert_eq!(t.asked, 3);
    let mut at = second + 2 * REBUILD_RETRY_NS;
    for _ in 0..10 {
        at += REBUILD_DONE_ASK_AGAIN_NS;
        t.pump(&mut r, at, &grains, &map);
    }
    assert_eq!(t.asked, 13, "once per bound at most, and no less");
    let p = &r.progress()[0];
    assert_eq!((p.bytes_done, p.bytes_sent), (64 * BS, 64 * BS));
    // A forwarded write the replica failed: it may lack those blocks.
    r.forwarded(N2, OpId(1001), E0, 0);
    assert!(r.replica_answered(N2, OpId(1001), true, &map));
    assert!(r.joining(E0).is_empty());
    assert_eq!(
        t.pump(&mut r, 4 * MS + REBUILD_RETRY_NS, &grains, &map),
        [0, 16, 32, 48]
    );
}

#[test]
fn a_forwarded_write_never_answered_is_given_up_and_the_copy_walks_again() {
    // The write or its answer was lost (a connection reset loses frames): the
    // copy must not wait for ever to join.
    let (grains, map) = setup();
    let map = with_node(&map, N2, true);
    let (mut r, mut t) = started(&grains, &map);
    t.pump(&mut r, 0, &grains, &map);
    const MS: u64 = 1_000_000;
    r.forwarded(N2, OpId(1000), E0, MS);
    t.answer_all(&mut r, MS);
    t.pump(&mut r, 2 * MS, &grains, &map);
    assert_eq!(r.joining(E0), [N2]);
    assert_eq!(t.asked, 0, "the replica owes a write");
    r.expire_forwards(MS + REBUILD_CHUNK_TIMEOUT_NS - 1, &map);
    assert_eq!(r.joining(E0), [N2], "not yet given up");
    r.expire_forwards(MS + REBUILD_CHUNK_TIMEOUT_NS, &map);
    assert!(r.joining(E0).is_empty(), "given up: the copy walks again");
    assert!(
        !r.replica_answered(N2, OpId(1000), false, &map),
        "no longer owed"
    );
    let now = MS + REBUILD_CHUNK_TIMEOUT_NS;
    assert_eq!(t.pump(&mut r, now, &grains, &map), [0, 16, 32, 48]);
    t.answer_all(&mut r, now);
    t.pump(&mut r, now, &grains, &map);
    assert_eq!((r.joining(E0), t.asked), (vec![N2], 1), "joins and asks");
}

#[test]
fn chunks_are_bounded_over_all_copies() {
    let (grains, map) = setup();
    let mut state = with_node(&map, N2, true).state().clone();
    // Node 1 leads extents 0 and 3; node 2 and node 3 rebuild both.
    for id in [ExtentId(0), ExtentId(3)] {
        let e = state.extents.get_mut(&id).unwrap();
        assert_eq!(e.primary, ME);
        for n in [N2, NodeId(3)] {
            e.in_sync.remove(&n);
            e.rebuilding.insert(n);
        }
    }
    let map = map.with_state(state).unwrap();
    let mut grains = grains;
    for g in 48..64 {
        grains.set(g, Version(5), true);
    }
    let mut r = Rebuilds::default();
    let wanted = r.wanted(&map, ME);
    assert_eq!(wanted.len(), 4);
    for w in wanted {
        r.begin(w, None, false, &grains, &map, 0);
    }
    let mut t = Table::default();
    let next = &mut t.next_op;
    let mut new_op = || {
        *next += 1;
        OpId(*next)
    };
    let steps = r.pump(0, (RATE, &BTreeSet::new()), &grains, &map, &mut new_op);
    assert_eq!(steps.len(), REBUILD_CHUNKS_IN_FLIGHT);
    for step in steps {
        let Step::Chunk { op, chunk } = step else {
            panic!("a chunk");
        };
        t.chunks.insert(op, chunk);
    }
    r.self_check(&t.chunks);
    let per_copy: Vec<usize> = r.copies.values().map(|c| c.chunks.len()).collect();
    assert_eq!(
        per_copy,
        [4, 4, 0, 0],
        "the first copies in order, each to its bound"
    );
}

#[test]
fn the_rate_bounds_what_is_read() {
    let (grains, map) = setup();
    let map = with_node(&map, N2, true);
    let (mut r, mut t) = started(&grains, &map);
    let next = &mut t.next_op;
    let mut new_op = || {
        *next += 1;
        OpId(*next)
    };
    // 64 KiB per second: a chunk's burst at first, then 1 s per 64 KiB sent.
    let rate = 64 << 10;
    let steps = r.pump(0, (rate, &BTreeSet::new()), &grains, &map, &mut new_op);
    assert_eq!(
        steps.len(),
        REBUILD_CHUNKS_PER_COPY,
        "the window opens with a chunk's burst"
    );
    r.probed((E0, N2), 0, 2 * REBUILD_CHUNK_BYTES);
    let Step::Chunk { op, chunk } = &steps[3] else {
        panic!("a chunk")
    };
    let err = WeirError::NotPrimary(N2);
    r.chunk_ended((E0, N2), *op, chunk.lba, Err(&err), 0);
    assert!(
        r.pump(
            REBUILD_RETRY_NS,
            (rate, &BTreeSet::new()),
            &grains,
            &map,
            &mut new_op
        )
        .is_empty(),
        "past the rate"
    );
    assert!(r
        .pump(
            1_900_000_000,
            (rate, &BTreeSet::new()),
            &grains,
            &map,
            &mut new_op
        )
        .is_empty());
    assert_eq!(
        r.pump(
            2_100_000_000,
            (rate, &BTreeSet::new()),
            &grains,
            &map,
            &mut new_op
        )
        .len(),
        1
    );
}

#[test]
fn a_failed_or_unanswered_chunk_is_sent_again_after_a_pause() {
    let (grains, map) = setup();
    let map = with_node(&map, N2, true);
    let (mut r, mut t) = started(&grains, &map);
    assert_eq!(t.pump(&mut r, 0, &grains, &map), [0, 16, 32, 48]);
    let (op, chunk) = t.chunks.pop_first().unwrap();
    assert_eq!(chunk.lba, Lba(0));
    let err = WeirError::NotPrimary(N2);
    r.chunk_ended((E0, N2), op, chunk.lba, Err(&err), 1_000);
    assert!(
        t.pump(&mut r, 2_000, &grains, &map).is_empty(),
        "a pause after a failure"
    );
    assert_eq!(t.pump(&mut r, 1_000 + REBUILD_RETRY_NS, &grains, &map), [0]);
    assert!(r.expired(REBUILD_CHUNK_TIMEOUT_NS - 1).is_empty());
    let expired = r.expired(REBUILD_CHUNK_TIMEOUT_NS);
    assert_eq!(expired.len(), 3, "the chunks out since 0: {expired:?}");
    for (key, op) in expired {
        let lba = t.chunks.remove(&op).map(|c| c.lba);
        r.give_up(key, op, lba, REBUILD_CHUNK_TIMEOUT_NS);
    }
    r.self_check(&t.chunks);
    let at = REBUILD_CHUNK_TIMEOUT_NS + REBUILD_RETRY_NS;
    assert_eq!(t.pump(&mut r, at, &grains, &map), [16, 32, 48]);
}

#[test]
fn a_map_change_restarts_a_moved_copy_and_ends_one_in_sync() {
    let (grains, map) = setup();
    let map = with_node(&map, N2, true);
    let (mut r, mut t) = started(&grains, &map);
    t.pump(&mut r, 0, &grains, &map);
    t.answer_all(&mut r, 1);
    // 1 ms later: the rate allows 1 MiB by then.
    t.pump(&mut r, 1_000_000, &grains, &map);
    assert_eq!(r.joining(E0), [N2]);
    // Same replicas, a later epoch: the walk starts over.
    let mut state = map.state().clone();
    state.extents.get_mut(&E0).unwrap().epoch = map.extent(E0).epoch.next();
    let moved = map.with_state(state).unwrap();
    assert!(r.after_map(&moved, ME).is_empty());
    assert!(r.joining(E0).is_empty());
    assert_eq!(t.pump(&mut r, 2_000_000, &grains, &moved), [0, 16, 32, 48]);
    // In sync now: the copy ends, with its chunks still out.
    let synced = with_node(&moved, N2, false);
    let ended = r.after_map(&synced, ME);
    assert_eq!(ended.len(), 1);
    let Ended {
        extent,
        node,
        chunks,
        rebuilt,
    } = &ended[0];
    assert_eq!((*extent, *node), (E0, N2));
    assert_eq!(chunks.len(), 4);
    assert_eq!(*rebuilt, Some((64 * BS, 0, 0)));
    assert!(r.progress().is_empty());
    // Down instead: the copy ends, not rebuilt, and the replica owes nothing.
    let (mut r, mut t) = started(&grains, &map);
    t.pump(&mut r, 0, &grains, &map);
    r.forwarded(N2, OpId(1000), E0, 0);
    let mut state = map.state().clone();
    state.extents.get_mut(&E0).unwrap().rebuilding.remove(&N2);
    let down = map.with_state(state).unwrap();
    let ended = r.after_map(&down, ME);
    assert_eq!(ended[0].rebuilt, None);
    assert!(
        !r.replica_answered(N2, OpId(1000), false, &down),
        "owes nothing"
    );
}

#[test]
#[should_panic(expected = "not in the table")]
fn the_check_catches_a_chunk_the_table_lost() {
    let (grains, map) = setup();
    let map = with_node(&map, N2, true);
    let (mut r, mut t) = started(&grains, &map);
    t.pump(&mut r, 0, &grains, &map);
    t.chunks.pop_first();
    r.self_check(&t.chunks);
}

#[test]
fn a_replica_answers_a_probe_at_once_and_a_copy_once_written() {
    let mut r = Rebuilds::default();
    let arrival = |op, ios_left, probe| Incoming {
        primary: ME,
        op: OpId(op),
        lba: Lba(16),
        blocks: 8,
        ios_left,
        error: None,
        probe,
    };
    r.arrived(arrival(1, 2, None));
    r.arrived(arrival(2, 0, Some(vec![Version(5), Version(5)])));
    assert!(
        r.answerable(|_, _| true).is_empty(),
        "a write to those blocks runs"
    );
    let ready = r.answerable(|_, _| false);
    assert_eq!(ready.iter().map(|i| i.op).collect::<Vec<_>>(), [OpId(2)]);
    assert_eq!(r.copy_written(ME, OpId(9), None), None, "no such copy");
    assert_eq!(r.copy_written(ME, OpId(1), None), None);
    let e = WeirError::Device(DevError::Gone);
    assert_eq!(
        r.copy_written(ME, OpId(1), Some(e.clone())),
        Some((Lba(16), 8))
    );
    let ready = r.answerable(|_, _| false);
    assert_eq!(ready.len(), 1);
    assert_eq!(ready[0].error, Some(e));
    assert!(!r.awaiting());
}
