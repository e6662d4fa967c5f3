use super::*;
use proptest::prelude::*;

fn cluster(nodes: u32, extents: u64) -> ClusterState {
    let mut s = ClusterState::default();
    for n in 1..=nodes {
        s.apply(&Command::AddNode { node: NodeId(n) }).unwrap();
    }
    s.apply(&Command::CreateVolume {
        volume: VolumeId(1),
        extents,
        replicas: 3,
    })
    .unwrap();
    s
}

#[test]
fn a_primary_failure_moves_the_primary_to_an_in_sync_replica_after_its_lease() {
    let mut s = cluster(3, 3);
    let e0 = s.extents[&ExtentId(0)].clone();
    assert_eq!(e0.primary, NodeId(1));
    let changes = s
        .apply(&Command::NodeDown {
            node: NodeId(1),
            lease_expires_ns: 5_000,
        })
        .unwrap();
    let e0 = &s.extents[&ExtentId(0)];
    assert_eq!(e0.primary, NodeId(2));
    assert_eq!(e0.epoch, Epoch(2));
    assert_eq!(e0.serve_after_ns, 5_000);
    assert!(!e0.in_sync.contains(&NodeId(1)));
    assert!(matches!(&changes[0], Change::Failover(f) if f.len() == 1));
    // Extent 1 (primary n2) only lost a secondary.
    assert_eq!(s.extents[&ExtentId(1)].primary, NodeId(2));
    assert_eq!(s.extents[&ExtentId(1)].epoch, Epoch(2));
}

#[test]
fn a_returning_node_rebuilds_before_it_counts() {
    let mut s = cluster(3, 1);
    let down = Command::NodeDown {
        node: NodeId(3),
        lease_expires_ns: 0,
    };
    s.apply(&down).unwrap();
    s.apply(&Command::NodeUp { node: NodeId(3) }).unwrap();
    let e = &s.extents[&ExtentId(0)];
    assert!(e.rebuilding.contains(&NodeId(3)) && !e.in_sync.contains(&NodeId(3)));
    let stale = Command::RebuildDone {
        extent: ExtentId(0),
        epoch: Epoch(2),
        node: NodeId(3),
    };
    assert!(matches!(s.apply(&stale), Err(Refusal::StaleEpoch { .. })));
    let done = Command::RebuildDone {
        extent: ExtentId(0),
        epoch: Epoch(3),
        node: NodeId(3),
    };
    s.apply(&done).unwrap();
    assert!(s.extents[&ExtentId(0)].in_sync.contains(&NodeId(3)));
}

#[test]
fn a_replica_can_be_dropped_but_never_the_last_one() {
    let mut s = cluster(3, 1);
    let drop = |epoch, node| Command::DropReplica {
        extent: ExtentId(0),
        epoch: Epoch(epoch),
        node: NodeId(node),
    };
    assert!(
        matches!(s.apply(&drop(1, 1)), Err(Refusal::WrongRole { .. })),
        "the primary"
    );
    s.apply(&drop(1, 2)).unwrap();
    assert!(matches!(
        s.apply(&drop(1, 3)),
        Err(Refusal::StaleEpoch { .. })
    ));
    s.apply(&drop(2, 3)).unwrap();
    assert_eq!(s.extents[&ExtentId(0)].in_sync.len(), 1);
}

#[test]
fn losing_every_in_sync_replica_makes_the_extent_unavailable_until_the_last_returns() {
    let mut s = cluster(3, 1);
    for n in [2, 3, 1] {
        s.apply(&Command::NodeDown {
            node: NodeId(n),
            lease_expires_ns: 0,
        })
        .unwrap();
    }
    assert!(s.extents[&ExtentId(0)].in_sync.is_empty());
    // n2 comes back first: it missed writes, so it may only rebuild.
    s.apply(&Command::NodeUp { node: NodeId(2) }).unwrap();
    assert!(s.extents[&ExtentId(0)].in_sync.is_empty());
    // n1, the last in sync, comes back and serves again.
    s.apply(&Command::NodeUp { node: NodeId(1) }).unwrap();
    let e = &s.extents[&ExtentId(0)];
    assert_eq!(e.primary, NodeId(1));
    assert_eq!(
        e.in_sync.iter().copied().collect::<Vec<_>>(),
        vec![NodeId(1)]
    );
}

/// Steps of the property test: control commands, and acknowledged writes.
#[derive(Clone, Debug)]
enum Step {
    Down(u32),
    Up(u32),
    Drop(u64, u32),
    RebuildDone(u64, u32),
    /// A node restarts having lost its volatile cache.
    Restart(u32),
    /// The last incarnation's `Restarted` asked for again.
    RepeatRestart(u32),
    Replace(u32),
    /// A write to an extent acknowledged by its current in-sync set.
    Write(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1u32..=5).prop_map(Step::Down),
        (1u32..=5).prop_map(Step::Up),
        (0u64..4, 1u32..=5).prop_map(|(e, n)| Step::Drop(e, n)),
        (0u64..4, 1u32..=5).prop_map(|(e, n)| Step::RebuildDone(e, n)),
        (1u32..=5).prop_map(Step::Restart),
        (1u32..=5).prop_map(Step::RepeatRestart),
        (1u32..=5).prop_map(Step::Replace),
        (0u64..4).prop_map(Step::Write),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Against a reference model of who holds every acknowledged write: whatever
    /// the sequence of failures, returns, restarts that lose a volatile cache,
    /// replacements, drops and rebuilds, the in-sync set (and so
    /// any primary failover picks) only ever contains nodes that hold every
    /// acknowledged write; epochs only grow; one primary per extent per epoch.
    #[test]
    fn failover_never_loses_an_acknowledged_write(steps in prop::collection::vec(step(), 1..80)) {
        let mut s = cluster(5, 4);
        // Model: per extent, the nodes that hold every acknowledged write.
        let mut complete: BTreeMap<ExtentId, BTreeSet<NodeId>> = s
            .extents
            .iter()
            .map(|(&id, e)| (id, e.in_sync.clone()))
            .collect();
        let mut primaries: BTreeMap<(ExtentId, Epoch), NodeId> = BTreeMap::new();
        let mut epochs: BTreeMap<ExtentId, Epoch> = BTreeMap::new();
        for step in steps {
            let cmd = match step {
                Step::Down(n) => Some(Command::NodeDown { node: NodeId(n), lease_expires_ns: 0 }),
                Step::Up(n) => Some(Command::NodeUp { node: NodeId(n) }),
                Step::Drop(e, n) => s.extents.get(&ExtentId(e)).map(|x| Command::DropReplica {
                    extent: ExtentId(e), epoch: x.epoch, node: NodeId(n) }),
                Step::RebuildDone(e, n) => s.extents.get(&ExtentId(e)).map(|x| Command::RebuildDone {
                    extent: ExtentId(e), epoch: x.epoch, node: NodeId(n) }),
                Step::Restart(n) => {
                    // Its device lost what it had not flushed: it holds every
                    // acknowledged write no longer, unless nothing else did.
                    for (id, ext) in &s.extents {
                        if ext.in_sync.iter().any(|&r| r != NodeId(n)) {
                            complete.get_mut(id).unwrap().remove(&NodeId(n));
                        }
                    }
                    // A new incarnation of it.
                    Some(Command::Restarted {
                        node: NodeId(n),
                        incarnation: s.incarnations.get(&NodeId(n)).copied().unwrap_or(0) + 1,
                        boot: 0,
                    })
                }
                // The last incarnation's request again: it changes nothing.
                Step::RepeatRestart(n) => Some(Command::Restarted {
                    node: NodeId(n),
                    incarnation: s.incarnations.get(&NodeId(n)).copied().unwrap_or(0),
                    boot: 0,
                }),
                Step::Replace(n) => Some(Command::ReplaceNode { node: NodeId(n) }),
                Step::Write(e) => {
                    let ext = &s.extents[&ExtentId(e)];
                    if !ext.in_sync.is_empty() {
                        // Acknowledged once every in-sync replica has it; rebuilding
                        // replicas receive it too but are not waited for.
                        complete.insert(ExtentId(e), ext.in_sync.clone());
                    }
                    None
                }
            };
            if let Some(cmd) = cmd {
                let rebuilt = match &cmd {
                    Command::RebuildDone { extent, node, .. } => Some((*extent, *node)),
                    _ => None,
                };
                if s.apply(&cmd).is_ok() {
                    if let Some((extent, node)) = rebuilt {
                        // A finished rebuild copied everything from the primary.
                        complete.get_mut(&extent).unwrap().insert(node);
                    }
                }
            }
            for (&id, ext) in &s.extents {
                prop_assert!(ext.in_sync.is_subset(&complete[&id]),
                    "{id}: in sync {:?} but only {:?} hold every acked write", ext.in_sync, complete[&id]);
                let before = epochs.insert(id, ext.epoch).unwrap_or(Epoch(0));
                prop_assert!(ext.epoch >= before, "{id}: epoch went back");
                if !ext.in_sync.is_empty() {
                    let p = *primaries.entry((id, ext.epoch)).or_insert(ext.primary);
                    prop_assert_eq!(p, ext.primary, "two primaries in one epoch");
                }
            }
        }
    }
}

fn create(name: &str, extents: u64, thin: bool) -> Command {
    Command::CreateNamed {
        name: name.into(),
        size_bytes: extents * 4096,
        extents,
        qos: Qos::default(),
        key_check: None,
        thin,
    }
}

#[test]
fn thick_volumes_take_their_extents_at_once_and_are_refused_clearly() {
    let mut s = cluster(3, 10);
    s.apply(&create("a", 4, false)).unwrap();
    s.apply(&create("b", 5, false)).unwrap();
    assert_eq!(s.named["a"].alloc.values().next(), Some(&ExtentId(0)));
    assert_eq!(s.named["b"].alloc[&0], ExtentId(4));
    assert_eq!(s.named["b"].alloc.len(), 5);
    assert_eq!((s.free_extents(), s.allocated_extents()), (1, 9));
    assert_eq!(
        s.apply(&create("a", 1, true)),
        Err(Refusal::KnownName("a".into()))
    );
    assert_eq!(
        s.apply(&create("c", 2, false)),
        Err(Refusal::NoSpace { needed: 2, free: 1 })
    );
    assert!(matches!(
        s.apply(&create("../x", 1, true)),
        Err(Refusal::BadName(_))
    ));
    assert!(matches!(
        s.apply(&create("", 1, true)),
        Err(Refusal::BadName(_))
    ));
    assert!(matches!(
        s.apply(&create("z", 0, true)),
        Err(Refusal::BadName(_))
    ));
    s.apply(&Command::DeleteNamed { name: "a".into() }).unwrap();
    assert_eq!(
        s.apply(&Command::DeleteNamed { name: "a".into() }),
        Err(Refusal::UnknownName("a".into()))
    );
    // A deleted volume's extents are dirty: not free until zeroed.
    assert_eq!(s.dirty.len(), 4);
    assert_eq!(
        s.apply(&create("c", 2, false)),
        Err(Refusal::NoSpace { needed: 2, free: 1 })
    );
    s.apply(&create("c", 1, false)).unwrap();
    assert_eq!(s.named["c"].alloc[&0], ExtentId(9));
    assert_ne!(s.named["c"].id, s.named["b"].id);
    s.self_check();
}

#[test]
fn a_thin_volume_takes_an_extent_at_its_first_write_and_gives_it_back() {
    let mut s = cluster(3, 3);
    // Larger than the pool: thin volumes may over-commit it.
    s.apply(&create("a", 5, true)).unwrap();
    s.apply(&create("b", 2, true)).unwrap();
    assert_eq!((s.free_extents(), s.allocated_extents()), (3, 0));
    let alloc = |name: &str, index| Command::Allocate {
        name: name.into(),
        index,
    };
    let reign = |s: &ClusterState, e: u64| s.extents[&ExtentId(e)].primary_since;
    s.apply(&alloc("a", 4)).unwrap();
    assert_eq!(s.named["a"].alloc[&4], ExtentId(0));
    assert_eq!(
        s.apply(&alloc("a", 4)),
        Err(Refusal::Allocated { index: 4 })
    );
    assert_eq!(s.apply(&alloc("a", 5)), Err(Refusal::BadIndex { index: 5 }));
    s.apply(&alloc("b", 0)).unwrap();
    s.apply(&alloc("a", 0)).unwrap();
    // The pool is full: a write that needs space is refused, nothing moves.
    let full = s.clone();
    assert_eq!(
        s.apply(&alloc("b", 1)),
        Err(Refusal::NoSpace { needed: 1, free: 0 })
    );
    assert_eq!(s.named, full.named);
    // A TRIM of a whole extent frees it: dirty, in a new reign.
    let before = reign(&s, 1);
    s.apply(&Command::Trim {
        name: "b".into(),
        index: 0,
    })
    .unwrap();
    assert!(s.named["b"].alloc.is_empty() && s.dirty.contains(&ExtentId(1)));
    assert!(reign(&s, 1) > before);
    assert_eq!(
        s.apply(&Command::Trim {
            name: "b".into(),
            index: 0
        }),
        Err(Refusal::Unallocated { index: 0 })
    );
    // Still not free: its old data is on it.
    assert_eq!(
        s.apply(&alloc("b", 1)),
        Err(Refusal::NoSpace { needed: 1, free: 0 })
    );
    // Zeroes written in an earlier reign do not count.
    let zeroed = |since| Command::Zeroed {
        extent: ExtentId(1),
        since,
    };
    assert!(matches!(
        s.apply(&zeroed(before)),
        Err(Refusal::StaleEpoch { .. })
    ));
    s.apply(&zeroed(reign(&s, 1))).unwrap();
    assert_eq!(
        s.apply(&zeroed(reign(&s, 1))),
        Err(Refusal::NotDirty(ExtentId(1)))
    );
    assert_eq!(s.free_extents(), 1);
    let zeroed_in = reign(&s, 1);
    s.apply(&alloc("b", 1)).unwrap();
    assert_eq!(s.named["b"].alloc[&1], ExtentId(1));
    // Handed out again in a new reign: no zeroing write sent before reaches
    // the new owner.
    assert!(reign(&s, 1) > zeroed_in);
    // A delete frees every extent the volume holds.
    s.apply(&Command::DeleteNamed { name: "a".into() }).unwrap();
    assert_eq!(s.dirty, [ExtentId(0), ExtentId(2)].into());
    assert_eq!((s.free_extents(), s.allocated_extents()), (0, 1));
    s.self_check();
}

#[test]
fn snapshots_freeze_extents_and_writes_redirect_chunk_by_chunk() {
    let mut s = cluster(3, 8);
    s.apply(&create("v", 2, true)).unwrap();
    let alloc = |index| Command::Allocate {
        name: "v".into(),
        index,
    };
    s.apply(&alloc(0)).unwrap();
    let p = s.named["v"].alloc[&0];
    let refs = s.references();
    assert!(!s.frozen(&refs, p), "one table: written in place");
    let reign = s.extents[&p].primary_since;
    let snap = |name: &str| Command::Snapshot {
        name: "v".into(),
        snap: name.into(),
    };
    s.apply(&snap("s1")).unwrap();
    assert!(s.extents[&p].primary_since > reign, "frozen in a new reign");
    assert!(s.frozen(&s.references(), p));
    assert_eq!(s.named["v"].generation, 1);
    assert!(matches!(
        s.apply(&snap("s1")),
        Err(Refusal::KnownSnapshot { .. })
    ));
    // The first write into the frozen extent redirects it.
    let redirect = Command::Redirect {
        name: "v".into(),
        index: 0,
        from: p,
    };
    s.apply(&redirect).unwrap();
    let q = s.named["v"].alloc[&0];
    assert_ne!(q, p);
    assert_eq!(s.rows[&q].base, p);
    assert_eq!(s.apply(&redirect), Err(Refusal::NotFrozen(p)));
    assert_eq!(s.holder(q, 5), p, "an unfilled chunk reads from the base");
    let since = s.extents[&q].primary_since;
    let filled = |chunk, since| Command::Filled {
        extent: q,
        chunk,
        since,
    };
    s.apply(&filled(5, since)).unwrap();
    assert_eq!(s.holder(q, 5), q);
    assert_eq!(s.holder(q, 6), p);
    // A copy from before the redirect is refused, one from a reign since
    // (before another chunk's fill started a new one) is taken, and a chunk
    // is filled once.
    assert!(matches!(
        s.apply(&filled(6, Epoch(0))),
        Err(Refusal::StaleEpoch { .. })
    ));
    s.apply(&filled(6, since)).unwrap();
    let since = s.extents[&q].primary_since;
    assert_eq!(s.apply(&filled(5, since)), Err(Refusal::NotFrozen(q)));
    // A clone shares the snapshot's extents; deleting the snapshot keeps them.
    s.apply(&Command::Clone {
        name: "v".into(),
        snap: "s1".into(),
        new: "c".into(),
    })
    .unwrap();
    assert_eq!(s.named["c"].alloc[&0], p);
    assert_eq!(s.named["c"].origin.as_deref(), Some("v@s1"));
    s.apply(&Command::DeleteSnapshot {
        name: "v".into(),
        snap: "s1".into(),
    })
    .unwrap();
    assert!(
        s.frozen(&s.references(), p),
        "the clone and q still read it"
    );
    assert!(s.dirty.is_empty());
    // Every chunk filled: q no longer needs its base; the clone alone has p,
    // and writes it in place.
    for chunk in 0..64u8 {
        if chunk != 5 && chunk != 6 {
            let since = s.extents[&q].primary_since;
            s.apply(&filled(chunk, since)).unwrap();
        }
    }
    assert!(!s.rows.contains_key(&q));
    assert!(!s.frozen(&s.references(), p));
    // Rollback: the volume takes the snapshot's table; what it wrote since
    // is freed.
    s.apply(&snap("s2")).unwrap();
    s.apply(&Command::Redirect {
        name: "v".into(),
        index: 0,
        from: q,
    })
    .unwrap();
    let r = s.named["v"].alloc[&0];
    s.apply(&Command::Rollback {
        name: "v".into(),
        snap: "s2".into(),
    })
    .unwrap();
    assert_eq!(s.named["v"].alloc[&0], q);
    assert!(s.dirty.contains(&r) && !s.rows.contains_key(&r));
    // Deleting the volume frees what only it and its snapshots held.
    s.apply(&Command::DeleteNamed { name: "v".into() }).unwrap();
    assert!(s.dirty.contains(&q));
    assert!(!s.dirty.contains(&p), "the clone still holds it");
    s.apply(&Command::DeleteNamed { name: "c".into() }).unwrap();
    assert!(s.dirty.contains(&p));
    assert_eq!(s.allocated_extents(), 0);
    s.self_check();
}

#[test]
fn a_restarted_node_leaves_in_sync_sets_it_shares_and_its_extents_fail_over() {
    let mut s = cluster(3, 3);
    let changes = s
        .apply(&Command::Restarted {
            node: NodeId(1),
            incarnation: 1,
            boot: 0,
        })
        .unwrap();
    for (id, e) in &s.extents {
        assert_eq!(e.epoch, Epoch(2), "{id}");
        assert!(!e.in_sync.contains(&NodeId(1)) && e.rebuilding.contains(&NodeId(1)));
        assert_ne!(e.primary, NodeId(1));
    }
    // Extent 0 was led by n1: its next in-sync replica leads, with no lease wait.
    assert_eq!(s.extents[&ExtentId(0)].primary, NodeId(2));
    assert_eq!(s.extents[&ExtentId(0)].serve_after_ns, 0);
    assert!(changes
        .iter()
        .any(|c| matches!(c, Change::Failover(f) if f == &[(ExtentId(0), NodeId(1), NodeId(2), Epoch(2))])));

    // Where the restarted node holds the last in-sync copy, it keeps it.
    let mut s = cluster(3, 1);
    for n in [2, 3] {
        s.apply(&Command::NodeDown {
            node: NodeId(n),
            lease_expires_ns: 0,
        })
        .unwrap();
    }
    s.apply(&Command::Restarted {
        node: NodeId(1),
        incarnation: 1,
        boot: 0,
    })
    .unwrap();
    let e = &s.extents[&ExtentId(0)];
    assert_eq!(e.primary, NodeId(1));
    assert!(e.in_sync.contains(&NodeId(1)) && e.epoch == Epoch(4));
}

#[test]
fn a_replaced_node_gives_its_replicas_to_the_least_loaded_spares() {
    let mut s = cluster(5, 10);
    assert!(matches!(
        s.apply(&Command::ReplaceNode { node: NodeId(1) }),
        Err(Refusal::NotDown(_))
    ));
    s.apply(&Command::NodeDown {
        node: NodeId(1),
        lease_expires_ns: 0,
    })
    .unwrap();
    let before = s.clone();
    s.apply(&Command::ReplaceNode { node: NodeId(1) }).unwrap();
    let mut load = BTreeMap::new();
    for (id, e) in &s.extents {
        let was = &before.extents[id];
        assert!(!e.replicas.contains(&NodeId(1)), "{id}");
        if was.replicas.contains(&NodeId(1)) {
            // The spare took n1's place in the list; the primary and in-sync set
            // stayed; the spare rebuilds at a new epoch.
            let pos = was.replicas.iter().position(|&r| r == NodeId(1)).unwrap();
            let spare = e.replicas[pos];
            assert!(!was.replicas.contains(&spare));
            assert!(e.rebuilding.contains(&spare) && e.epoch == was.epoch.next());
            assert_eq!((e.primary, &e.in_sync), (was.primary, &was.in_sync));
        } else {
            assert_eq!(e, was);
        }
        for r in &e.replicas {
            *load.entry(*r).or_insert(0) += 1;
        }
    }
    // 30 replicas over 4 nodes: the spares even the load out.
    let (min, max) = (load.values().min().unwrap(), load.values().max().unwrap());
    assert!(max - min <= 1, "{load:?}");
    // Nothing left to replace; a return finds nothing to rebuild.
    assert!(matches!(
        s.apply(&Command::ReplaceNode { node: NodeId(1) }),
        Err(Refusal::NoChange(_))
    ));
    s.apply(&Command::NodeUp { node: NodeId(1) }).unwrap();
    assert!(s
        .extents
        .values()
        .all(|e| !e.rebuilding.contains(&NodeId(1))));
}

#[test]
fn a_node_with_no_spare_or_holding_the_last_copy_is_kept() {
    // Three nodes, three replicas: no spare anywhere.
    let mut s = cluster(3, 2);
    s.apply(&Command::NodeDown {
        node: NodeId(3),
        lease_expires_ns: 0,
    })
    .unwrap();
    assert!(s.replacements(NodeId(3)).is_empty());
    // Four nodes, an extent whose every in-sync copy is down: nothing to copy from.
    let mut s = cluster(4, 1);
    for n in [1, 2, 3] {
        s.apply(&Command::NodeDown {
            node: NodeId(n),
            lease_expires_ns: 0,
        })
        .unwrap();
    }
    assert!(s.extents[&ExtentId(0)].in_sync.is_empty());
    assert!(s.replacements(NodeId(2)).is_empty());
}

/// Any command, with ids that hit the map's nodes and extents and values from
/// the hostile end (huge counts, epochs and sizes).
fn any_command() -> impl Strategy<Value = Command> {
    let node = (0u32..=6).prop_map(NodeId);
    let extent = (0u64..=5).prop_map(ExtentId);
    let epoch = prop_oneof![(0u64..=8).prop_map(Epoch), Just(Epoch(u64::MAX))];
    let count = prop_oneof![0u64..=4, Just(MAX_POOL_EXTENTS), Just(u64::MAX)];
    prop_oneof![
        node.clone().prop_map(|node| Command::AddNode { node }),
        ((0u32..=3), count.clone(), any::<u8>()).prop_map(|(v, extents, replicas)| {
            Command::CreateVolume {
                volume: VolumeId(v),
                extents,
                replicas,
            }
        }),
        (node.clone(), any::<u64>()).prop_map(|(node, lease_expires_ns)| Command::NodeDown {
            node,
            lease_expires_ns
        }),
        node.clone().prop_map(|node| Command::NodeUp { node }),
        (extent.clone(), epoch.clone(), node.clone()).prop_map(|(extent, epoch, node)| {
            Command::DropReplica {
                extent,
                epoch,
                node,
            }
        }),
        (extent.clone(), epoch.clone(), node.clone()).prop_map(|(extent, epoch, node)| {
            Command::RebuildDone {
                extent,
                epoch,
                node,
            }
        }),
        (node.clone(), 0u64..4).prop_map(|(node, incarnation)| Command::Restarted {
            node,
            incarnation,
            boot: 0
        }),
        node.prop_map(|node| Command::ReplaceNode { node }),
        (
            "[a-c]{0,2}",
            any::<u64>(),
            count,
            0u64..3,
            0u32..3,
            any::<bool>()
        )
            .prop_map(|(name, size_bytes, extents, limit, weight, thin)| {
                Command::CreateNamed {
                    name,
                    size_bytes,
                    extents,
                    qos: Qos {
                        iops_limit: limit * 1000,
                        bw_limit: 0,
                        iops_reservation: 1000,
                        weight,
                    },
                    key_check: None,
                    thin,
                }
            }),
        ("[a-c]{0,2}", 0u64..4).prop_map(|(name, index)| Command::Allocate { name, index }),
        ("[a-c]{0,2}", 0u64..4).prop_map(|(name, index)| Command::Trim { name, index }),
        (extent.clone(), epoch.clone())
            .prop_map(|(extent, since)| Command::Zeroed { extent, since }),
        ("[a-c]{0,2}", "[xy]").prop_map(|(name, snap)| Command::Snapshot { name, snap }),
        ("[a-c]{0,2}", "[xy]").prop_map(|(name, snap)| Command::DeleteSnapshot { name, snap }),
        ("[a-c]{0,2}", "[xy]", "[a-d]").prop_map(|(name, snap, new)| Command::Clone {
            name,
            snap,
            new
        }),
        ("[a-c]{0,2}", "[xy]").prop_map(|(name, snap)| Command::Rollback { name, snap }),
        ("[a-c]{0,2}", 0u64..4, extent.clone())
            .prop_map(|(name, index, from)| { Command::Redirect { name, index, from } }),
        (extent, 0u8..66, epoch).prop_map(|(extent, chunk, since)| Command::Filled {
            extent,
            chunk,
            since
        }),
        ("[a-c]{0,2}", 0u64..3, 0u64..3).prop_map(|(name, limit, reservation)| {
            Command::SetQos {
                name,
                qos: Qos {
                    iops_limit: limit * 500,
                    bw_limit: limit << 20,
                    iops_reservation: reservation * 500,
                    weight: 100,
                },
            }
        }),
        "[a-c]{0,2}".prop_map(|name| Command::DeleteNamed { name }),
        (
            "[a-c]{0,2}",
            0u64..6,
            prop_oneof![Just(4096u64), Just(0), Just(1)],
            any::<bool>()
        )
            .prop_map(|(name, blocks, extent_bytes, odd)| {
                let size_bytes = blocks * 4096 + u64::from(odd) * 512;
                Command::Resize {
                    name,
                    size_bytes,
                    extents: size_bytes.div_ceil(extent_bytes.max(1)),
                    extent_bytes,
                }
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1_000))]

    /// Applying the log never panics and never breaks the map, whatever the
    /// entries say: a command that does not apply is a typed refusal, and one
    /// that asks for more than the map's bounds is refused before it allocates.
    #[test]
    fn no_command_sequence_panics_or_breaks_the_map(
        commands in prop::collection::vec(any_command(), 1..60)
    ) {
        let mut s = cluster(4, 3);
        for command in &commands {
            let outcome = s.apply(command);
            prop_assert!(
                !matches!(outcome, Err(Refusal::Invariant(_))),
                "{command:?} broke the map: {outcome:?}"
            );
            prop_assert!(s.validate().is_ok());
            prop_assert!(s.extents.len() as u64 <= MAX_POOL_EXTENTS);
            prop_assert!(s.nodes.len() <= MAX_MEMBERS);
        }
    }
}

#[test]
fn a_restart_applies_once_per_incarnation() {
    let mut s = cluster(3, 3);
    let restarted = |incarnation| Command::Restarted {
        node: NodeId(1),
        incarnation,
        boot: 7,
    };
    s.apply(&restarted(1)).unwrap();
    let after_first = s.clone();
    // Asked again before the node saw it applied: refused, nothing moves.
    let repeat = s.apply(&restarted(1)).unwrap_err();
    assert_eq!(
        repeat,
        Refusal::RepeatedRestart {
            node: NodeId(1),
            incarnation: 1,
            last: 1
        }
    );
    assert_eq!(s.extents, after_first.extents);
    // The next incarnation applies; a late copy of the first is refused.
    s.apply(&restarted(2)).unwrap();
    assert!(s
        .extents
        .values()
        .all(|e| e.epoch > after_first.extents[&ExtentId(0)].epoch));
    assert!(s.apply(&restarted(1)).is_err());
    assert_eq!(s.incarnations[&NodeId(1)], 2);
    s.self_check();
}

#[test]
fn a_command_that_would_take_the_map_past_its_budget_is_refused_and_changes_nothing() {
    let mut s = cluster(3, 1);
    let pool = |extents| Command::CreateVolume {
        volume: VolumeId(2),
        extents,
        replicas: 3,
    };
    // 100,000 extents would encode to about 1.7 MB, past what a frame carries.
    let before = s.clone();
    let Err(Refusal::MapFull {
        bytes,
        reserve,
        limit,
    }) = s.apply(&pool(100_000))
    else {
        panic!("a 1.7 MB map was not refused for its size");
    };
    assert_eq!(limit, MAP_FRAME_BYTES);
    assert!(bytes > 3 * limit / 2, "{bytes}");
    // A fresh extent keeps 30 bytes: 8 for its serve-after time, 4 each
    // for its epoch and reign, 8 for its ids, 6 for its sets' ids.
    assert_eq!(reserve, 30 * 100_001 + MEMBER_RESERVE_BYTES * 3);
    // Nothing changed but the count of commands applied.
    assert_eq!(s.applied, before.applied + 1);
    assert_eq!(
        ClusterState {
            applied: before.applied,
            ..s.clone()
        },
        before
    );

    // The largest pool that fits leaves the map within an extent of its limit.
    let (mut fits, mut not) = (1u64, 100_000u64);
    while not - fits > 1 {
        let mid = (fits + not) / 2;
        match s.clone().apply(&pool(mid)) {
            Ok(_) => fits = mid,
            Err(Refusal::MapFull { .. }) => not = mid,
            Err(e) => panic!("{e}"),
        }
    }
    s.apply(&pool(fits)).unwrap();
    // Members added one by one: each fits or is refused, never past the limit.
    let mut full = None;
    for n in 4..200 {
        match s.apply(&Command::AddNode { node: NodeId(n) }) {
            Ok(_) => assert!(s.encoded_len() + s.size_reserve() <= MAP_FRAME_BYTES),
            Err(e) => {
                full = Some(e);
                break;
            }
        }
    }
    assert!(matches!(full, Some(Refusal::MapFull { .. })), "{full:?}");
    let fits_frame = |s: &ClusterState| {
        let encoded = s.encode();
        assert_eq!(encoded.len(), s.encoded_len());
        assert_eq!(&ClusterState::decode(&encoded).unwrap(), s);
        let reply = crate::wire::Message::MapState {
            req: crate::ids::RequestId(1),
            state: bytes::Bytes::from(encoded),
        };
        reply.encode().is_ok()
    };
    let used = s.encoded_len() + s.size_reserve();
    assert!(
        used <= MAP_FRAME_BYTES && used > MAP_FRAME_BYTES - 64,
        "{used}"
    );
    assert!(fits_frame(&s), "a full map fits a frame");
    // Failure handling is never refused for size, and what it adds comes out
    // of the reserve: node 1 fails (its extents fail over, each with a
    // serve-after time in nanoseconds) and comes back to rebuild.
    let total = |s: &ClusterState| s.encoded_len() + s.size_reserve();
    let (full, bytes) = (total(&s), s.encoded_len());
    s.apply(&Command::NodeDown {
        node: NodeId(1),
        lease_expires_ns: 1_700_000_000_000_000_000,
    })
    .unwrap();
    s.apply(&Command::NodeUp { node: NodeId(1) }).unwrap();
    assert!(s.encoded_len() > bytes, "the failover grew the map");
    assert!(total(&s) <= full, "{} > {full}", total(&s));
    assert!(
        fits_frame(&s),
        "a full map after a failover still fits a frame"
    );
}

#[test]
fn a_volume_grows_at_once_and_shrinks_to_whole_extents_without_snapshots() {
    // Extents of 4,096 bytes, as `create` makes them.
    let mut s = cluster(3, 6);
    s.apply(&create("a", 4, true)).unwrap();
    let resize = |size_bytes: u64| Command::Resize {
        name: "a".into(),
        size_bytes,
        extents: size_bytes.div_ceil(4096),
        extent_bytes: 4096,
    };
    let alloc = |index| Command::Allocate {
        name: "a".into(),
        index,
    };
    for i in 0..4 {
        s.apply(&alloc(i)).unwrap();
    }
    // Grown: the new extents are thin, the old ones stay.
    s.apply(&resize(6 * 4096 + 512)).unwrap();
    let v = &s.named["a"];
    assert_eq!(
        (v.size_bytes, v.extents, v.alloc.len()),
        (6 * 4096 + 512, 7, 4)
    );
    s.apply(&alloc(6)).unwrap();
    // Shrunk: the extents past the end are released, dirty, in a new reign.
    let reign = s.extents[&s.named["a"].alloc[&6]].primary_since;
    let cut = s.named["a"].alloc[&6];
    s.apply(&resize(2 * 4096)).unwrap();
    let v = &s.named["a"];
    assert_eq!((v.size_bytes, v.extents), (2 * 4096, 2));
    assert_eq!(v.alloc.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
    assert!(s.dirty.contains(&cut) && s.extents[&cut].primary_since > reign);
    assert_eq!(s.apply(&alloc(2)), Err(Refusal::BadIndex { index: 2 }));
    // Not to a size off an extent boundary: the kept extent's tail would
    // show its old data when the volume grew again.
    let no_shrink = |why| Refusal::NoShrink {
        name: "a".into(),
        why,
    };
    assert_eq!(
        s.apply(&resize(4096 + 1)),
        Err(no_shrink("it shrinks to whole extents only"))
    );
    // Not with snapshots: a rollback would bring back extents past the end.
    s.apply(&Command::Snapshot {
        name: "a".into(),
        snap: "s".into(),
    })
    .unwrap();
    assert_eq!(s.apply(&resize(4096)), Err(no_shrink("it has snapshots")));
    s.apply(&resize(3 * 4096)).unwrap();
    // Sizes that do not add up, and unknown volumes.
    let bad = Command::Resize {
        name: "a".into(),
        size_bytes: 4096,
        extents: 2,
        extent_bytes: 4096,
    };
    assert!(matches!(s.apply(&bad), Err(Refusal::BadName(_))));
    // An extent size that does not fit the volume's shape: refused.
    let other = Command::Resize {
        name: "a".into(),
        size_bytes: 8192,
        extents: 1,
        extent_bytes: 8192,
    };
    assert_eq!(
        s.apply(&other),
        Err(Refusal::BadName(
            "the extent size does not fit the volume's"
        ))
    );
    let unknown = Command::Resize {
        name: "zz".into(),
        size_bytes: 4096,
        extents: 1,
        extent_bytes: 4096,
    };
    assert_eq!(s.apply(&unknown), Err(Refusal::UnknownName("zz".into())));
}
