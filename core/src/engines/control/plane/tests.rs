use super::*;
use crate::events::Event;
use crate::ids::VolumeId;

fn planes() -> BTreeMap<NodeId, ControlPlane> {
    planes_with(3, 0)
}

/// `n` members (all voters) of a 3-extent, 3-replica volume.
fn planes_with(n: u32, replace_ns: u64) -> BTreeMap<NodeId, ControlPlane> {
    let ids: Vec<NodeId> = (1..=n).map(NodeId).collect();
    let mut boot: Vec<Command> = ids.iter().map(|&node| Command::AddNode { node }).collect();
    boot.push(Command::CreateVolume {
        volume: VolumeId(1),
        extents: 3,
        replicas: 3,
    });
    ids.iter()
        .map(|&id| {
            (
                id,
                ControlPlane::new(
                    id,
                    &ids,
                    boot.clone(),
                    Timeouts {
                        lease_ns: 150,
                        detect_ns: 100,
                        replace_ns,
                    },
                    5 + u64::from(id.0),
                )
                .unwrap(),
            )
        })
        .collect()
}

/// Run `ticks` ticks of 10 time units; `dead` nodes neither send nor receive.
fn run(
    p: &mut BTreeMap<NodeId, ControlPlane>,
    from: u64,
    ticks: u64,
    dead: &[NodeId],
    events: &mut Vec<Event>,
) {
    run_cut(p, from, ticks, dead, &[], events)
}

/// [`run`], where `cut` nodes still tick (cut off from the network, not stopped).
fn run_cut(
    p: &mut BTreeMap<NodeId, ControlPlane>,
    from: u64,
    ticks: u64,
    dead: &[NodeId],
    cut: &[NodeId],
    events: &mut Vec<Event>,
) {
    run_logged(p, from, ticks, dead, cut, events, &mut BTreeMap::new())
}

/// [`run_cut`], appending each node's durable Raft records to `logs`.
fn run_logged(
    p: &mut BTreeMap<NodeId, ControlPlane>,
    from: u64,
    ticks: u64,
    dead: &[NodeId],
    cut: &[NodeId],
    events: &mut Vec<Event>,
    logs: &mut BTreeMap<NodeId, Vec<u8>>,
) {
    let dead: Vec<NodeId> = dead.iter().chain(cut).copied().collect();
    for t in from..from + ticks {
        let now = t * 10;
        for (id, plane) in p.iter_mut() {
            if !dead.contains(id) || cut.contains(id) {
                plane.tick(now);
            }
        }
        loop {
            let mut sent = Vec::new();
            for (&id, plane) in p.iter_mut() {
                while let Some(a) = plane.poll_action() {
                    match a {
                        PlaneAction::Send { to, msg } => sent.push((id, to, msg)),
                        PlaneAction::Event(e) => events.push(e),
                        PlaneAction::Map { .. } => {}
                        PlaneAction::Persist(r) => {
                            logs.entry(id).or_default().extend_from_slice(&r)
                        }
                        PlaneAction::Rewrite(image) => {
                            *logs.entry(id).or_default() = image.to_vec()
                        }
                    }
                }
            }
            if sent.is_empty() {
                break;
            }
            for (from, to, msg) in sent {
                if dead.contains(&from) || dead.contains(&to) {
                    continue;
                }
                let plane = p.get_mut(&to).unwrap();
                match msg {
                    Message::Raft { bytes } => plane.handle_raft(from, &bytes),
                    Message::Heartbeat {
                        sent_ns,
                        applied,
                        healthy,
                    } => plane.handle_heartbeat(from, sent_ns, applied, healthy, now),
                    Message::HeartbeatAck {
                        sent_ns,
                        lease_until_ns,
                    } => plane.handle_heartbeat_ack(from, sent_ns, lease_until_ns),
                    Message::Propose { command } => plane.handle_propose(from, &command),
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
    }
}

#[test]
fn a_node_down_past_the_replacement_timeout_is_replaced_by_spares() {
    let mut p = planes_with(4, 400);
    let mut events = Vec::new();
    run(&mut p, 0, 20, &[], &mut events);
    let holds = |p: &BTreeMap<NodeId, ControlPlane>, n: NodeId| {
        p[&NodeId(1)]
            .state()
            .extents
            .values()
            .filter(|e| e.replicas.contains(&n))
            .count()
    };
    assert_eq!(
        holds(&p, NodeId(3)),
        3,
        "3 extents x 3 replicas over 4 nodes"
    );
    // n3 dies: declared down after 100, replaced only after 400 of silence.
    run(&mut p, 20, 25, &[NodeId(3)], &mut events);
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::NodeDown {
                node: NodeId(3),
                ..
            }
        )),
        "{events:?}"
    );
    assert_eq!(holds(&p, NodeId(3)), 3, "not replaced before its timeout");
    run(&mut p, 45, 30, &[NodeId(3)], &mut events);
    assert!(
        events.contains(&Event::Replaced {
            node: NodeId(3),
            rebuilding: 3
        }),
        "{events:?}"
    );
    let state = p[&NodeId(1)].state().clone();
    assert_eq!(holds(&p, NodeId(3)), 0);
    for e in state.extents.values() {
        // Its place went to a spare, which rebuilds; the other two stay in sync.
        assert_eq!(
            (e.replicas.len(), e.in_sync.len(), e.rebuilding.len()),
            (3, 2, 1)
        );
        assert!(e.rebuilding.iter().all(|n| e.replicas.contains(n)));
    }
    // Proposed once: nothing is left to replace, so nothing more is proposed.
    run(&mut p, 75, 30, &[NodeId(3)], &mut events);
    let replaced = events
        .iter()
        .filter(|e| matches!(e, Event::Replaced { .. }));
    assert_eq!(replaced.count(), 1);
    assert_eq!(p[&NodeId(1)].state().extents, state.extents);
}

#[test]
fn a_restarted_node_replays_its_log_and_moves_its_extents_to_a_new_epoch() {
    let ids: Vec<NodeId> = (1..=3).map(NodeId).collect();
    let boot = planes()[&NodeId(1)].bootstrap.clone();
    let timeouts = Timeouts {
        lease_ns: 150,
        detect_ns: 100,
        replace_ns: 0,
    };
    let open = |id: NodeId, log: &[u8]| {
        ControlPlane::open(id, &ids, boot.clone(), timeouts, 5 + u64::from(id.0), log).unwrap()
    };
    let mut p: BTreeMap<NodeId, ControlPlane> =
        ids.iter().map(|&id| (id, open(id, &[]).0)).collect();
    assert!(p.values().all(|x| x.restored_epochs().is_none()));
    let (mut events, mut logs) = (Vec::new(), BTreeMap::new());
    run_logged(&mut p, 0, 60, &[], &[], &mut events, &mut logs);
    let create = Command::CreateNamed {
        name: "vol".into(),
        size_bytes: 1 << 20,
        extents: 2,
        qos: crate::control::state::Qos::default(),
        key_check: None,
        thin: true,
    };
    p.get_mut(&NodeId(3)).unwrap().request(&create);
    run_logged(&mut p, 60, 20, &[], &[], &mut events, &mut logs);
    let before = p[&NodeId(1)].state().clone();
    assert_eq!(before.named["vol"].extents, 2, "{events:?}");

    // Node 2 restarts from its log (with a torn record at the end).
    let mut log = logs[&NodeId(2)].clone();
    let intact = log.len();
    log.extend_from_slice(&[9, 0, 0, 0, 1, 2]);
    let (restarted, valid) = open(NodeId(2), &log);
    assert_eq!(valid, intact);
    assert_eq!(restarted.state().named, before.named);
    assert_eq!(restarted.state().extents, before.extents);
    let epochs = restarted.restored_epochs().unwrap().clone();
    p.insert(NodeId(2), restarted);
    run_logged(&mut p, 80, 30, &[], &[], &mut events, &mut logs);
    let after = p[&NodeId(1)].state();
    for (id, ext) in &after.extents {
        assert!(ext.epoch > epochs[id], "{id} stayed at {}", ext.epoch);
    }
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::Restarted {
                node: NodeId(2),
                ..
            }
        )),
        "{events:?}"
    );
    // Asked until applied, then no more.
    let settled = p[&NodeId(1)].state().extents.clone();
    run_logged(&mut p, 110, 30, &[], &[], &mut events, &mut logs);
    assert_eq!(p[&NodeId(1)].state().extents, settled);

    // A second restart: the first incarnation's `Restarted` in the log does
    // not count for this one.
    let (again, _) = open(NodeId(2), &logs[&NodeId(2)]);
    let epochs = again.restored_epochs().unwrap().clone();
    p.insert(NodeId(2), again);
    run_logged(&mut p, 140, 30, &[], &[], &mut events, &mut logs);
    for (id, ext) in &p[&NodeId(1)].state().extents {
        assert!(
            ext.epoch > epochs[id],
            "second restart: {id} stayed at {}",
            ext.epoch
        );
    }
}

#[test]
fn the_first_leader_bootstraps_the_map_and_a_silent_node_fails_over() {
    let mut p = planes();
    let mut events = Vec::new();
    run(&mut p, 0, 60, &[], &mut events);
    let state = p[&NodeId(1)].state().clone();
    assert_eq!(state.extents.len(), 3, "bootstrap did not apply");
    assert!(p.values().all(|x| x.state().extents == state.extents));
    // Kill a node that is not the leader; it is declared down and its extent fails over.
    let leader = p[&NodeId(1)].leader().unwrap();
    let victim = (1..=3).map(NodeId).find(|&n| n != leader).unwrap();
    run(&mut p, 60, 60, &[victim], &mut events);
    let s = p[&leader].state();
    assert_eq!(s.nodes[&victim], NodeStatus::Down, "events: {events:?}");
    for ext in s.extents.values() {
        assert_ne!(ext.primary, victim);
        assert!(!ext.in_sync.contains(&victim));
    }
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::NodeDown { node, .. } if *node == victim)),
        "{events:?}"
    );
    // It comes back: marked up, rebuilding.
    run(&mut p, 120, 30, &[], &mut events);
    let s = p[&leader].state();
    assert_eq!(s.nodes[&victim], NodeStatus::Up);
    assert!(s.extents.values().all(|e| e.rebuilding.contains(&victim)));
}

#[test]
fn leases_of_a_cut_off_leader_and_node_end_before_their_extents_move() {
    let mut p = planes();
    let mut events = Vec::new();
    run(&mut p, 0, 60, &[], &mut events);
    let now = 590;
    for (id, plane) in &p {
        assert!(plane.lease_until_ns() > now, "{id} holds no lease");
        assert!(plane.lease_until_ns() <= now + 150, "{id}: lease too long");
    }
    // Cut the leader off: it keeps ticking, believing it leads, but its lease
    // stops growing; the rest elect a new leader that declares it down.
    let old = p[&NodeId(1)].leader().unwrap();
    let lease_held = p[&old].lease_until_ns();
    let led: Vec<crate::ids::ExtentId> = p[&old]
        .state()
        .extents
        .iter()
        .filter(|(_, e)| e.primary == old)
        .map(|(&id, _)| id)
        .collect();
    assert!(!led.is_empty());
    run_cut(&mut p, 60, 80, &[], &[old], &mut events);
    assert_eq!(
        p[&old].lease_until_ns(),
        lease_held,
        "a cut-off leader renewed its lease"
    );
    let new = (1..=3).map(NodeId).find(|&n| n != old).unwrap();
    let s = p[&new].state();
    assert_eq!(s.nodes[&old], NodeStatus::Down, "events: {events:?}");
    for ext in led.iter().map(|id| &s.extents[id]) {
        assert_ne!(ext.primary, old);
        assert!(
            ext.serve_after_ns >= lease_held,
            "new primary may serve at {} but the old lease runs to {lease_held}",
            ext.serve_after_ns
        );
    }
    // The cut heals: the old leader's view of the others (silent to it) never
    // made it into the map, and it comes back up.
    run(&mut p, 140, 40, &[], &mut events);
    for plane in p.values() {
        let s = plane.state();
        assert!(
            s.nodes.values().all(|st| *st == NodeStatus::Up),
            "{:?}, events: {events:?}",
            s.nodes
        );
    }
}

#[test]
fn hostile_heartbeats_and_acks_grant_nothing_extra() {
    let mut p = planes();
    run(&mut p, 0, 60, &[], &mut Vec::new());
    let leader = p[&NodeId(1)].leader().unwrap();
    let other = (1..=3).map(NodeId).find(|&n| n != leader).unwrap();
    let plane = p.get_mut(&other).unwrap();
    let before = plane.lease_until_ns();
    // An ack promising a lease longer than a lease past its heartbeat is cut.
    plane.handle_heartbeat_ack(leader, 600, u64::MAX);
    assert_eq!(plane.lease_until_ns(), before.max(750));
    // A stranger's ack grants nothing.
    plane.handle_heartbeat_ack(NodeId(77), 10_000, 10_100);
    assert_eq!(plane.lease_until_ns(), before.max(750));
    // A heartbeat stamped in the future counts as sent now at the leader.
    let leader_plane = p.get_mut(&leader).unwrap();
    leader_plane.handle_heartbeat(other, u64::MAX, u64::MAX, true, 600);
    assert!(leader_plane.lease_until_ns() <= 750);
    let acks = |plane: &mut ControlPlane| {
        std::iter::from_fn(|| plane.poll_action())
            .filter(|a| {
                matches!(
                    a,
                    PlaneAction::Send {
                        msg: Message::HeartbeatAck { .. },
                        ..
                    }
                )
            })
            .count()
    };
    assert_eq!(acks(leader_plane), 1);
    // A member whose map lags the leader's log gets no lease.
    leader_plane.handle_heartbeat(other, 600, 0, true, 600);
    assert_eq!(acks(leader_plane), 0, "a lease for a stale map");
}

#[test]
fn states_round_trip_and_garbage_is_an_error() {
    let mut p = planes();
    run(&mut p, 0, 60, &[], &mut Vec::new());
    let state = p[&NodeId(2)].state().clone();
    assert_eq!(ClusterState::decode(&state.encode()).unwrap(), state);
    assert!(matches!(
        ClusterState::decode(&[0xff; 7]),
        Err(crate::control::state::MapDecodeError::Malformed(_))
    ));
    let mut broken = state.clone();
    let extent = broken.extents.values_mut().next().expect("an extent");
    extent.primary = NodeId(99);
    assert!(matches!(
        ClusterState::decode(&broken.encode()),
        Err(crate::control::state::MapDecodeError::Invalid(_))
    ));
}

mod members;
