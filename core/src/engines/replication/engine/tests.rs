//! Engine tests: three engines wired by hand, with a toy network and toy disks whose
//! every step the test controls.

use super::*;
use crate::device::DevError;
use crate::map::VolumeSpec;

const CLIENT: NodeId = NodeId(100);
const BS: usize = 4096;

struct Cluster {
    engines: BTreeMap<NodeId, Replicator>,
    disks: BTreeMap<NodeId, BTreeMap<u64, Vec<u8>>>,
    /// Blocks a node's device cannot read (a media error) until they are written.
    bad: std::collections::BTreeSet<(NodeId, u64)>,
    /// Device commands issued and not yet completed.
    ios: Vec<(NodeId, IoId, IoCmd)>,
    /// Messages in flight: (from, to, message).
    net: VecDeque<(NodeId, NodeId, Message)>,
    /// Replies that reached the client.
    replies: Vec<Message>,
    /// Every ReplicaWrite delivered, as (replica, lba, version).
    applied: Vec<(NodeId, Lba, Version)>,
    /// Control-plane requests made, as (node, command).
    controls: Vec<(NodeId, crate::control::Command)>,
    /// Audit facts reported (only with `config.audit`).
    audits: Vec<(NodeId, Audit)>,
    /// Event lines reported.
    events: Vec<crate::events::Event>,
    /// Rebuild copies sent, as (first block, blocks).
    copies: Vec<(Lba, usize)>,
    /// Each node's block-version checkpoint file, as the driver would keep it.
    checkpoints: BTreeMap<NodeId, Vec<u8>>,
}

/// The engine's defaults with one block per version grain: versions as exact as
/// they go, what most tests here assert on (tests of grains set their own).
fn test_config() -> ReplicationConfig {
    ReplicationConfig {
        version_grain_bytes: BS as u64,
        ..ReplicationConfig::default()
    }
}

fn cluster(config: ReplicationConfig) -> Cluster {
    let nodes: Vec<NodeId> = (1..=3).map(NodeId).collect();
    let volume = VolumeSpec {
        id: VolumeId(1),
        block_size: BS as u32,
        capacity_blocks: 64,
        extent_blocks: 16,
        max_request_blocks: 8,
    };
    let map = ClusterMap::new_static(nodes.clone(), volume, 3).unwrap();
    Cluster {
        engines: nodes
            .iter()
            .map(|&n| {
                let mut engine = Replicator::new(n, map.clone(), config);
                // Every node holds a lease for the whole test unless a test says
                // otherwise.
                engine.set_clock(0, u64::MAX);
                (n, engine)
            })
            .collect(),
        disks: nodes.iter().map(|&n| (n, BTreeMap::new())).collect(),
        bad: Default::default(),
        ios: Vec::new(),
        net: VecDeque::new(),
        replies: Vec::new(),
        applied: Vec::new(),
        controls: Vec::new(),
        audits: Vec::new(),
        events: Vec::new(),
        copies: Vec::new(),
        checkpoints: BTreeMap::new(),
    }
}

/// The `n`th version a primary gives out in epoch 1.
fn v(n: u64) -> Version {
    Version(Version::epoch_floor(Epoch(1)).0 + n)
}

fn block(tag: u8, blocks: usize) -> Bytes {
    Bytes::from(vec![tag; BS * blocks])
}

impl Cluster {
    fn collect(&mut self) {
        for (&n, engine) in self.engines.iter_mut() {
            engine.self_check();
            while let Some(action) = engine.poll_action() {
                match action {
                    Action::Send { to, msg } => {
                        if let Message::RebuildWrite { copy, .. } = &msg {
                            self.copies.push((copy.lba, copy.data.len() / BS));
                        }
                        self.net.push_back((n, to, msg))
                    }
                    Action::Io { io, cmd } => self.ios.push((n, io, cmd)),
                    Action::Control { command } => self.controls.push((n, command)),
                    Action::Audit(fact) => self.audits.push((n, fact)),
                    Action::Event(event) => self.events.push(event),
                    Action::Checkpoint { runs, full } => {
                        use crate::replication::versions::encode;
                        let file = self.checkpoints.entry(n).or_default();
                        if full {
                            *file = encode(Some("disk"), &runs);
                        } else {
                            file.extend(encode(None, &runs));
                        }
                    }
                }
            }
        }
    }

    fn client_sends(&mut self, to: NodeId, msg: Message) {
        self.net.push_back((CLIENT, to, msg));
    }

    /// Deliver every message in flight (and those they cause), but no device I/O.
    fn deliver(&mut self) {
        self.collect();
        while let Some((from, to, msg)) = self.net.pop_front() {
            if to.0 >= CLIENT.0 {
                // To a client: CLIENT, or another of a higher id.
                self.replies.push(msg);
                continue;
            }
            if let Message::ReplicaWrite { lba, version, .. } = &msg {
                self.applied.push((to, *lba, *version));
            }
            self.engines.get_mut(&to).unwrap().handle_message(from, msg);
            self.collect();
        }
    }

    /// Complete the oldest pending device command on `node`.
    fn complete_one(&mut self, node: NodeId) -> bool {
        let Some(at) = self.ios.iter().position(|(n, ..)| *n == node) else {
            return false;
        };
        let (n, io, cmd) = self.ios.remove(at);
        let disk = self.disks.get_mut(&n).unwrap();
        let result = match cmd {
            IoCmd::Write { lba, data, .. } => {
                for (i, chunk) in data.chunks(BS).enumerate() {
                    disk.insert(lba.0 + i as u64, chunk.to_vec());
                    self.bad.remove(&(n, lba.0 + i as u64));
                }
                IoResult::Done
            }
            IoCmd::Read { lba, blocks }
                if (lba.0..lba.0 + blocks).any(|b| self.bad.contains(&(n, b))) =>
            {
                IoResult::Failed(WeirError::Device(DevError::Media(lba)))
            }
            IoCmd::Read { lba, blocks } => {
                let mut out = Vec::new();
                for b in lba.0..lba.0 + blocks {
                    out.extend(disk.get(&b).cloned().unwrap_or_else(|| vec![0; BS]));
                }
                IoResult::Read(Bytes::from(out))
            }
            IoCmd::Flush => IoResult::Done,
        };
        self.engines.get_mut(&n).unwrap().handle_io(io, result);
        self.collect();
        true
    }

    /// Fail the oldest pending device command on `node` with `error`.
    fn fail_next_io(&mut self, node: NodeId, error: DevError) {
        let at = self.ios.iter().position(|(n, ..)| *n == node).unwrap();
        let (_, io, _) = self.ios.remove(at);
        let result = IoResult::Failed(WeirError::Device(error));
        self.engines.get_mut(&node).unwrap().handle_io(io, result);
        self.collect();
    }

    /// Run until nothing is left to do.
    fn settle(&mut self) {
        loop {
            self.deliver();
            let nodes: Vec<NodeId> = self.engines.keys().copied().collect();
            if !nodes.into_iter().any(|n| self.complete_one(n)) {
                break;
            }
        }
    }

    fn disk_block(&self, node: NodeId, lba: u64) -> Option<u8> {
        self.disks[&node].get(&lba).map(|b| b[0])
    }
}

fn write(req: u64, lba: u64, data: Bytes) -> Message {
    Message::Write {
        req: RequestId(req),
        volume: VolumeId(1),
        epoch: Epoch(1),
        lba: Lba(lba),
        data,
        fua: false,
        delta: 1,
    }
}

fn read(req: u64, lba: u64, blocks: u32) -> Message {
    Message::Read {
        req: RequestId(req),
        volume: VolumeId(1),
        epoch: Epoch(1),
        lba: Lba(lba),
        blocks,
        delta: 1,
    }
}

#[test]
fn write_is_acked_only_after_every_replica_persisted() {
    let mut c = cluster(test_config());
    // Extent 0 (blocks 0..16): primary n1, replicas n2, n3.
    c.client_sends(NodeId(1), write(1, 3, block(7, 2)));
    c.deliver();
    assert!(c.complete_one(NodeId(1)));
    assert!(c.complete_one(NodeId(2)));
    c.deliver();
    assert!(c.replies.is_empty(), "acked before n3 persisted");
    assert!(c.complete_one(NodeId(3)));
    c.deliver();
    assert_eq!(c.replies, vec![Message::WriteOk { req: RequestId(1) }]);
    for n in 1..=3 {
        assert_eq!(c.disk_block(NodeId(n), 3), Some(7));
        assert_eq!(c.disk_block(NodeId(n), 4), Some(7));
        assert_eq!(c.engines[&NodeId(n)].block_version(Lba(4)), Some(v(1)));
    }
    assert!(c.engines.values().all(|e| e.ops_in_flight() == 0));
}

#[test]
fn a_front_ends_own_node_gets_its_replica_write_without_data_and_a_miss_drops_it() {
    let mut c = cluster(ReplicationConfig {
        front_end_payloads: true,
        ..test_config()
    });
    // n2's front end writes to ext0, whose primary is n1.
    let front_end_writes = |c: &mut Cluster, msg: Message| {
        let front_end = crate::front_end::front_end_of(NodeId(2));
        c.engines
            .get_mut(&NodeId(1))
            .unwrap()
            .handle_message(front_end, msg);
        c.collect();
    };
    front_end_writes(&mut c, write(1, 3, block(7, 1)));
    let sent = |c: &Cluster, to: u32| -> Vec<usize> {
        c.net
            .iter()
            .filter_map(|(_, t, m)| match m {
                Message::ReplicaWrite { data, .. } if *t == NodeId(to) => Some(data.len()),
                _ => None,
            })
            .collect()
    };
    assert_eq!(sent(&c, 2), vec![0], "n2's front end holds the data");
    assert_eq!(sent(&c, 3), vec![BS]);
    // n2's node found nothing held (its front end gave up): n2 says so, and n1
    // has it dropped rather than send the data again (it could land after a
    // later write of the same grain).
    c.deliver();
    c.settle();
    assert!(c.replies.is_empty(), "waits for the map to drop n2");
    let drop_n2 = crate::control::Command::DropReplica {
        extent: ExtentId(0),
        epoch: Epoch(1),
        node: NodeId(2),
    };
    assert_eq!(c.controls, vec![(NodeId(1), drop_n2.clone())]);
    assert_eq!(c.disk_block(NodeId(2), 3), None, "n2 applied nothing");
    publish(&mut c, drop_n2);
    c.settle();
    assert_eq!(c.replies, vec![Message::WriteOk { req: RequestId(1) }]);
    assert_eq!(c.disk_block(NodeId(1), 3), Some(7));
    assert_eq!(c.disk_block(NodeId(3), 3), Some(7));

    // A rebuilding replica's writes carry their data (its ack holds nothing up).
    front_end_writes(&mut c, write(2, 4, block(8, 1)));
    assert!(
        sent(&c, 2).iter().all(|&len| len == BS),
        "n2 is out of sync now"
    );
}

#[test]
fn a_second_attempt_of_a_front_ends_write_carries_its_data() {
    let mut c = cluster(ReplicationConfig {
        front_end_payloads: true,
        ..test_config()
    });
    let front_end = crate::front_end::front_end_of(NodeId(2));
    let attempt = |c: &mut Cluster| {
        let msg = write(3, 5, block(9, 1));
        c.engines
            .get_mut(&NodeId(1))
            .unwrap()
            .handle_message(front_end, msg);
        c.collect();
        // What n1 sent n2, with the data n2's node would take from its front end.
        let mut lens = Vec::new();
        for (_, to, m) in c.net.iter_mut() {
            if let (NodeId(2), Message::ReplicaWrite { data, .. }) = (*to, m) {
                lens.push(data.len());
                if data.is_empty() {
                    *data = block(9, 1);
                }
            }
        }
        c.settle();
        lens
    };
    assert_eq!(
        attempt(&mut c),
        vec![0],
        "the first attempt leaves its data out"
    );
    assert_eq!(c.replies, vec![Message::WriteOk { req: RequestId(3) }]);
    // The client had timed out and sent it again: n1 runs the second attempt
    // after the first was answered, when the front end may hold nothing.
    assert_eq!(
        attempt(&mut c),
        vec![BS],
        "a second attempt carries its data"
    );
    assert_eq!(c.replies.len(), 2);
    assert!(c.controls.is_empty(), "nobody dropped");
    assert_eq!(c.disk_block(NodeId(2), 5), Some(9));
}

#[test]
fn a_write_towards_a_congested_replica_is_refused_busy_until_it_drains() {
    let mut c = cluster(test_config());
    // Extent 0: primary n1, replicas n2 and n3; n3's send queue is full.
    let n1 = c.engines.get_mut(&NodeId(1)).unwrap();
    n1.set_congested([NodeId(3)].into());
    c.client_sends(NodeId(1), write(1, 3, block(7, 1)));
    c.client_sends(NodeId(1), read(2, 3, 1));
    c.settle();
    assert_eq!(c.replies.len(), 2);
    assert!(
        c.replies.iter().any(|r| matches!(
            r,
            Message::Failed {
                req: RequestId(1),
                error: WeirError::Busy
            }
        )),
        "{:?}",
        c.replies
    );
    assert!(
        c.replies.iter().any(|r| matches!(
            r,
            Message::ReadOk {
                req: RequestId(2),
                ..
            }
        )),
        "reads go on: {:?}",
        c.replies
    );
    assert_eq!(c.disk_block(NodeId(2), 3), None, "nothing was forwarded");
    // Once the queue drains, the retry goes through.
    c.replies.clear();
    c.engines
        .get_mut(&NodeId(1))
        .unwrap()
        .set_congested(Default::default());
    c.client_sends(NodeId(1), write(1, 3, block(7, 1)));
    c.settle();
    assert_eq!(c.replies, vec![Message::WriteOk { req: RequestId(1) }]);
    assert_eq!(c.disk_block(NodeId(3), 3), Some(7));
}

#[test]
fn a_write_past_a_replicas_window_waits_for_room_and_then_goes() {
    let mut c = cluster(test_config());
    // Extent 0: primary n1, replicas n2 and n3; n3's window holds one block.
    let n1 = c.engines.get_mut(&NodeId(1)).unwrap();
    n1.set_peer_windows([(NodeId(3), BS as u64)].into());
    c.client_sends(NodeId(1), write(1, 3, block(7, 1)));
    c.client_sends(NodeId(1), write(2, 5, block(8, 1)));
    c.deliver();
    let forwarded = |c: &Cluster, lba: u64| c.applied.iter().filter(|a| a.1 == Lba(lba)).count();
    assert_eq!(forwarded(&c, 3), 2, "the first write went to both replicas");
    assert_eq!(forwarded(&c, 5), 0, "the second waits for n3's answer");
    // n3 answers the first: the second goes, and both are acknowledged.
    c.settle();
    assert_eq!(forwarded(&c, 5), 2);
    assert_eq!(c.replies.len(), 2, "{:?}", c.replies);
    assert!(c
        .replies
        .iter()
        .all(|r| matches!(r, Message::WriteOk { .. })));
    assert_eq!(c.disk_block(NodeId(3), 5), Some(8));
    // Without a window for a replica nothing waits.
    c.engines
        .get_mut(&NodeId(1))
        .unwrap()
        .set_peer_windows([(NodeId(2), u64::MAX)].into());
    c.client_sends(NodeId(1), write(3, 6, block(9, 1)));
    c.client_sends(NodeId(1), write(4, 7, block(9, 1)));
    c.deliver();
    assert_eq!(forwarded(&c, 6) + forwarded(&c, 7), 4);
}

#[test]
fn overlapping_writes_reach_replicas_in_version_order() {
    let mut c = cluster(test_config());
    c.client_sends(NodeId(2), write(1, 16, block(1, 4)));
    c.client_sends(NodeId(2), write(2, 18, block(2, 4)));
    c.client_sends(NodeId(2), write(3, 30, block(3, 1)));
    c.deliver();
    // The overlapping second write waits; the disjoint third runs at once.
    let forwarded: Vec<_> = c.applied.iter().map(|(_, l, v)| (*l, *v)).collect();
    assert_eq!(
        forwarded,
        vec![
            (Lba(16), v(1)),
            (Lba(16), v(1)),
            (Lba(30), v(2)),
            (Lba(30), v(2))
        ]
    );
    c.settle();
    assert_eq!(c.replies.len(), 3);
    for n in 1..=3 {
        let node = NodeId(n);
        assert_eq!(c.disk_block(node, 17), Some(1));
        assert_eq!(
            c.disk_block(node, 18),
            Some(2),
            "{node} applied writes out of order"
        );
        assert_eq!(c.engines[&node].block_version(Lba(18)), Some(v(3)));
    }
}

#[test]
fn read_waits_for_an_earlier_overlapping_write() {
    let mut c = cluster(test_config());
    c.client_sends(NodeId(1), write(1, 0, block(9, 1)));
    c.client_sends(NodeId(1), read(2, 0, 2));
    c.deliver();
    let reads = c
        .ios
        .iter()
        .filter(|(_, _, cmd)| matches!(cmd, IoCmd::Read { .. }));
    assert_eq!(
        reads.count(),
        0,
        "read issued while an overlapping write runs"
    );
    c.settle();
    let mut expect = vec![9u8; BS];
    expect.extend(vec![0u8; BS]);
    assert_eq!(
        c.replies,
        vec![
            Message::WriteOk { req: RequestId(1) },
            Message::ReadOk {
                req: RequestId(2),
                data: Bytes::from(expect)
            }
        ]
    );
}

#[test]
fn a_primary_serves_a_client_whose_map_is_older_only_within_its_reign() {
    // n3 leaves extent 0's in-sync set: epoch 2, n1 still the primary. A client
    // whose map says epoch 1 is served.
    let mut c = cluster(test_config());
    drop_n3(&mut c);
    c.client_sends(NodeId(1), write(1, 2, block(4, 1)));
    c.settle();
    c.client_sends(NodeId(1), read(2, 2, 1));
    c.settle();
    assert_eq!(
        c.replies,
        vec![
            Message::WriteOk { req: RequestId(1) },
            Message::ReadOk {
                req: RequestId(2),
                data: block(4, 1)
            }
        ]
    );
    // n1 goes down: n2 leads extent 0 from epoch 3. A request from epoch 2 (n1's
    // reign; it may have been delayed past writes n2 has acknowledged) is refused.
    n1_goes_down(&mut c);
    c.client_sends(NodeId(2), write_at_epoch(3, 2, block(5, 1), 2));
    c.settle();
    assert!(matches!(
        failed_with(&c, 3),
        Some(WeirError::StaleEpoch { .. })
    ));
    c.client_sends(NodeId(2), write_at_epoch(4, 2, block(5, 1), 3));
    c.settle();
    assert_eq!(
        c.replies.last(),
        Some(&Message::WriteOk { req: RequestId(4) })
    );
}

#[test]
fn bad_requests_get_typed_errors() {
    let mut c = cluster(test_config());
    // A map newer than the primary's: the primary may have been deposed in it.
    let ahead = Message::Write {
        req: RequestId(5),
        volume: VolumeId(1),
        epoch: Epoch(2),
        lba: Lba(0),
        data: block(1, 1),
        fua: false,
        delta: 1,
    };
    let unknown = Message::Read {
        req: RequestId(6),
        volume: VolumeId(9),
        epoch: Epoch(1),
        lba: Lba(0),
        blocks: 1,
        delta: 1,
    };
    c.client_sends(NodeId(1), write(1, 16, block(1, 1)));
    c.client_sends(NodeId(1), read(2, 63, 2));
    c.client_sends(NodeId(1), write(3, 0, Bytes::from(vec![0u8; 100])));
    c.client_sends(NodeId(1), read(4, 14, 4));
    c.client_sends(NodeId(1), ahead);
    c.client_sends(NodeId(1), unknown);
    c.settle();
    let errors: Vec<WeirError> = c
        .replies
        .iter()
        .map(|m| match m {
            Message::Failed { error, .. } => error.clone(),
            other => panic!("expected an error, got {other:?}"),
        })
        .collect();
    assert_eq!(errors[0], WeirError::NotPrimary(NodeId(1)));
    assert!(matches!(errors[1], WeirError::OutOfRange { .. }));
    assert!(matches!(errors[2], WeirError::BadLength { len: 100, .. }));
    assert_eq!(errors[3], WeirError::CrossesExtent);
    assert!(matches!(errors[4], WeirError::StaleEpoch { .. }));
    assert_eq!(errors[5], WeirError::UnknownVolume(VolumeId(9)));
    assert!(c.ios.is_empty());
}

#[test]
fn flush_reaches_every_node() {
    let mut c = cluster(test_config());
    c.client_sends(
        NodeId(2),
        Message::Flush {
            req: RequestId(1),
            volume: VolumeId(1),
        },
    );
    c.deliver();
    let mut flushing: Vec<NodeId> = c
        .ios
        .iter()
        .filter(|(_, _, cmd)| *cmd == IoCmd::Flush)
        .map(|(n, ..)| *n)
        .collect();
    flushing.sort();
    assert_eq!(flushing, vec![NodeId(1), NodeId(2), NodeId(3)]);
    c.complete_one(NodeId(1));
    c.complete_one(NodeId(2));
    c.deliver();
    assert!(c.replies.is_empty());
    c.settle();
    assert_eq!(c.replies, vec![Message::FlushOk { req: RequestId(1) }]);
}

#[test]
fn a_replica_whose_device_fails_a_write_is_dropped_and_the_write_acked_without_it() {
    let mut c = cluster(test_config());
    c.client_sends(NodeId(1), write(1, 0, block(1, 1)));
    c.deliver();
    c.fail_next_io(NodeId(3), DevError::Gone);
    c.settle();
    // No answer to the client yet: n1 asked the control plane to drop n3.
    assert!(c.replies.is_empty(), "{:?}", c.replies);
    assert!(c.controls.iter().any(|(n, cmd)| *n == NodeId(1)
        && *cmd
            == crate::control::Command::DropReplica {
                extent: ExtentId(0),
                epoch: Epoch(1),
                node: NodeId(3)
            }));
    drop_n3(&mut c);
    c.settle();
    assert_eq!(c.replies, vec![Message::WriteOk { req: RequestId(1) }]);
    // The primary's own device failing the write fails it for the client.
    c.client_sends(NodeId(1), write_at_epoch(2, 1, block(2, 1), 2));
    c.deliver();
    c.fail_next_io(NodeId(1), DevError::Media(Lba(1)));
    c.settle();
    assert_eq!(
        failed_with(&c, 2),
        Some(WeirError::Device(DevError::Media(Lba(1))))
    );
}

#[test]
fn a_replica_rejects_an_older_version_over_a_newer_one() {
    let mut c = cluster(test_config());
    let rw = |version, tag| Message::ReplicaWrite {
        op: OpId(version),
        extent: ExtentId(0),
        epoch: Epoch(1),
        version: Version(version),
        prev: (Version::default(), Version::default()),
        settled: Version::default(),
        origin: (NodeId(100), RequestId(version)),
        lba: Lba(2),
        data: block(tag, 1),
        fua: false,
    };
    let n2 = c.engines.get_mut(&NodeId(2)).unwrap();
    n2.handle_message(NodeId(1), rw(5, 1));
    n2.handle_message(NodeId(1), rw(4, 2));
    let acks: Vec<_> = std::iter::from_fn(|| n2.poll_action())
        .filter_map(|a| match a {
            Action::Send { msg, .. } => Some(msg),
            _ => None,
        })
        .collect();
    assert_eq!(
        acks,
        vec![Message::ReplicaWriteAck {
            op: OpId(4),
            result: Err(WeirError::VersionRegression)
        }]
    );
}

#[test]
fn the_skip_replica_bug_switch_really_skips() {
    let mut c = cluster(ReplicationConfig {
        bugs_asked: Bugs {
            skip_last_replica: true,
            ..Bugs::default()
        },
        ..test_config()
    });
    c.client_sends(NodeId(1), write(1, 0, block(4, 1)));
    c.settle();
    assert_eq!(c.replies, vec![Message::WriteOk { req: RequestId(1) }]);
    assert_eq!(c.disk_block(NodeId(2), 0), Some(4));
    assert_eq!(c.disk_block(NodeId(3), 0), None);
}

#[test]
fn forged_and_duplicate_acks_are_refused() {
    let mut c = cluster(test_config());
    c.client_sends(NodeId(1), write(1, 0, block(1, 1)));
    c.client_sends(NodeId(1), write(2, 0, block(2, 1)));
    c.deliver();
    let n1 = c.engines.get_mut(&NodeId(1)).unwrap();
    let ok = |op| Message::ReplicaWriteAck {
        op: OpId(op),
        result: Ok(()),
    };
    // A client forging acks for the running write, the queued one, and an unknown one.
    for _ in 0..5 {
        n1.handle_message(CLIENT, ok(1));
    }
    n1.handle_message(CLIENT, ok(2));
    n1.handle_message(CLIENT, ok(99));
    // A replica acking twice counts once.
    n1.handle_message(NodeId(2), ok(1));
    n1.handle_message(NodeId(2), ok(1));
    n1.handle_message(
        CLIENT,
        Message::ReplicaFlushAck {
            op: OpId(1),
            result: Ok(()),
        },
    );
    c.deliver();
    assert!(
        c.replies.is_empty(),
        "a forged ack completed a write: {:?}",
        c.replies
    );
    c.settle();
    assert_eq!(
        c.replies,
        vec![
            Message::WriteOk { req: RequestId(1) },
            Message::WriteOk { req: RequestId(2) }
        ]
    );
}

/// The control plane drops n3 from extent 0's in-sync set (at epoch 1).
fn drop_n3(c: &mut Cluster) {
    let cmd = crate::control::Command::DropReplica {
        extent: ExtentId(0),
        epoch: Epoch(1),
        node: NodeId(3),
    };
    publish(c, cmd);
}

/// n1 is declared down (its lease long over) and every message to it is lost.
fn n1_goes_down(c: &mut Cluster) {
    goes_down(c, NodeId(1));
}

/// `node` is declared down (its lease long over) and every message to it is lost.
fn goes_down(c: &mut Cluster, node: NodeId) {
    let cmd = crate::control::Command::NodeDown {
        node,
        lease_expires_ns: 0,
    };
    publish(c, cmd);
    c.net.retain(|(_, to, _)| *to != node);
}

/// Apply control-plane `cmd` to every engine's map (as the control plane would).
fn publish(c: &mut Cluster, cmd: crate::control::Command) {
    let map = c.engines[&NodeId(1)].map().clone();
    let mut state = map.state().clone();
    state.apply(&cmd).unwrap();
    let map = map.with_state(state).unwrap();
    for e in c.engines.values_mut() {
        e.handle_map(map.clone());
    }
    c.collect();
}

#[test]
fn a_write_held_up_by_a_silent_replica_is_acked_once_the_map_drops_it() {
    let mut c = cluster(test_config());
    c.client_sends(NodeId(1), write(1, 0, block(5, 1)));
    c.deliver();
    c.complete_one(NodeId(1));
    c.complete_one(NodeId(2));
    c.deliver();
    assert!(c.replies.is_empty(), "n3 is silent: no ack yet");
    drop_n3(&mut c);
    c.deliver();
    assert_eq!(c.replies, vec![Message::WriteOk { req: RequestId(1) }]);
    // The next write goes to n3 as a rebuilding replica, but is not held up by it
    // (n1 also reads block 0 to copy it to n3).
    c.client_sends(NodeId(1), write_at_epoch(2, 1, block(6, 1), 2));
    c.deliver();
    while c.complete_one(NodeId(1)) {}
    c.complete_one(NodeId(2));
    c.deliver();
    assert_eq!(c.replies.len(), 2, "a rebuilding replica held up the ack");
    assert!(
        c.applied
            .iter()
            .any(|(n, l, _)| *n == NodeId(3) && *l == Lba(1)),
        "n3 got no copy"
    );
}

fn write_at_epoch(req: u64, lba: u64, data: Bytes, epoch: u64) -> Message {
    Message::Write {
        req: RequestId(req),
        volume: VolumeId(1),
        epoch: Epoch(epoch),
        lba: Lba(lba),
        data,
        fua: false,
        delta: 1,
    }
}

#[test]
fn a_deposed_primary_fails_its_writes_and_the_new_one_continues_the_versions() {
    use crate::control::Command;
    let mut c = cluster(test_config());
    c.client_sends(NodeId(1), write(1, 0, block(1, 1)));
    c.settle();
    c.client_sends(NodeId(1), write(2, 0, block(2, 1)));
    c.client_sends(NodeId(1), write(3, 0, block(3, 1)));
    c.deliver();
    publish(
        &mut c,
        Command::NodeDown {
            node: NodeId(1),
            lease_expires_ns: 0,
        },
    );
    c.settle();
    let failed: Vec<_> = c
        .replies
        .iter()
        .filter(|m| {
            matches!(
                m,
                Message::Failed {
                    error: WeirError::NotPrimary(_),
                    ..
                }
            )
        })
        .collect();
    assert_eq!(
        failed.len(),
        2,
        "running and queued writes must fail: {:?}",
        c.replies
    );
    // n2 is the new primary at epoch 2; its next write continues after version 1.
    c.client_sends(NodeId(2), write_at_epoch(4, 0, block(4, 1), 2));
    c.settle();
    assert_eq!(
        c.replies.last(),
        Some(&Message::WriteOk { req: RequestId(4) })
    );
    let v = c.engines[&NodeId(2)].block_version(Lba(0)).unwrap();
    assert!(v > Version(1), "versions went back: {v}");
    assert_eq!(c.disk_block(NodeId(3), 0), Some(4));
}

#[test]
fn a_replica_silent_past_its_timeout_is_reported_once() {
    use crate::control::Command;
    let mut c = cluster(test_config());
    for n in 1..=3 {
        c.engines.get_mut(&NodeId(n)).unwrap().handle_tick(1_000);
    }
    c.client_sends(NodeId(1), write(1, 0, block(5, 1)));
    c.deliver();
    c.complete_one(NodeId(1));
    c.complete_one(NodeId(2));
    c.deliver();
    let n1 = c.engines.get_mut(&NodeId(1)).unwrap();
    n1.handle_tick(1_000 + DEFAULT_REPLICA_TIMEOUT_NS - 1);
    c.collect();
    assert!(c.controls.is_empty(), "asked before the timeout");
    for t in [
        DEFAULT_REPLICA_TIMEOUT_NS + 1_000,
        DEFAULT_REPLICA_TIMEOUT_NS + 50_000_000,
    ] {
        c.engines.get_mut(&NodeId(1)).unwrap().handle_tick(t);
        c.collect();
    }
    assert_eq!(
        c.controls,
        vec![(
            NodeId(1),
            Command::DropReplica {
                extent: ExtentId(0),
                epoch: Epoch(1),
                node: NodeId(3)
            }
        )]
    );
}

#[test]
fn a_flush_stops_waiting_for_a_node_that_went_down() {
    use crate::control::Command;
    let mut c = cluster(test_config());
    c.client_sends(
        NodeId(1),
        Message::Flush {
            req: RequestId(1),
            volume: VolumeId(1),
        },
    );
    c.deliver();
    c.complete_one(NodeId(1));
    c.complete_one(NodeId(2));
    c.deliver();
    assert!(c.replies.is_empty(), "n3 has not flushed");
    publish(
        &mut c,
        Command::NodeDown {
            node: NodeId(3),
            lease_expires_ns: 0,
        },
    );
    c.deliver();
    assert_eq!(c.replies, vec![Message::FlushOk { req: RequestId(1) }]);
}

fn failed_with(c: &Cluster, req: u64) -> Option<WeirError> {
    c.replies.iter().find_map(|m| match m {
        Message::Failed { req: r, error } if *r == RequestId(req) => Some(error.clone()),
        _ => None,
    })
}

#[test]
fn a_primary_serves_only_under_its_lease() {
    let mut c = cluster(test_config());
    let n1 = c.engines.get_mut(&NodeId(1)).unwrap();
    *n1 = Replicator::new(NodeId(1), n1.map().clone(), test_config());
    // No lease yet: refused with a retryable error.
    c.client_sends(NodeId(1), read(1, 0, 1));
    c.settle();
    assert_eq!(failed_with(&c, 1), Some(WeirError::NoLease(NodeId(1))));
    // A lease until t = 100 ms: served at 10 ms.
    let n1 = c.engines.get_mut(&NodeId(1)).unwrap();
    n1.set_clock(10_000_000, 100_000_000);
    c.client_sends(NodeId(1), write(2, 0, block(7, 1)));
    c.deliver();
    // A read queues behind the write; the lease runs out before the write is done,
    // so the read fails when it would have started.
    c.client_sends(NodeId(1), read(3, 0, 1));
    c.deliver();
    let n1 = c.engines.get_mut(&NodeId(1)).unwrap();
    n1.set_clock(100_000_000, 100_000_000);
    c.settle();
    assert_eq!(c.replies[1], Message::WriteOk { req: RequestId(2) });
    assert_eq!(failed_with(&c, 3), Some(WeirError::NoLease(NodeId(1))));
    // Within the skew margin of the lease's end it no longer serves either.
    let n1 = c.engines.get_mut(&NodeId(1)).unwrap();
    n1.set_clock(0, 100_000_000 + test_config().lease_margin_ns);
    c.client_sends(NodeId(1), read(4, 0, 1));
    c.settle();
    assert_eq!(failed_with(&c, 4), Some(WeirError::NoLease(NodeId(1))));
}

/// n1 fails; n2 takes over at epoch 2 but may serve only after `serve_after`.
fn fail_over_to_n2(config: ReplicationConfig, serve_after: u64) -> Cluster {
    use crate::control::Command;
    let mut c = cluster(config);
    for e in c.engines.values_mut() {
        e.set_clock(1_000, u64::MAX);
    }
    publish(
        &mut c,
        Command::NodeDown {
            node: NodeId(1),
            lease_expires_ns: serve_after,
        },
    );
    c.client_sends(NodeId(2), write_at_epoch(1, 0, block(1, 1), 2));
    c.settle();
    c
}

#[test]
fn a_new_primary_waits_for_the_old_lease_and_the_bug_switch_does_not() {
    let mut c = fail_over_to_n2(test_config(), 50_000);
    assert_eq!(failed_with(&c, 1), Some(WeirError::NoLease(NodeId(2))));
    c.engines
        .get_mut(&NodeId(2))
        .unwrap()
        .set_clock(50_000, u64::MAX);
    c.client_sends(NodeId(2), write_at_epoch(2, 0, block(2, 1), 2));
    c.settle();
    assert_eq!(
        c.replies.last(),
        Some(&Message::WriteOk { req: RequestId(2) })
    );
    let buggy = ReplicationConfig {
        bugs_asked: Bugs {
            serve_before_lease: true,
            ..Bugs::default()
        },
        ..test_config()
    };
    let c = fail_over_to_n2(buggy, 50_000);
    assert_eq!(c.replies, vec![Message::WriteOk { req: RequestId(1) }]);
}

#[test]
fn audit_facts_show_claims_acks_and_persistence() {
    let audited = ReplicationConfig {
        audit: true,
        ..test_config()
    };
    let mut c = fail_over_to_n2(audited, 50_000);
    // n2 claims extent 0 (and the others it now leads) from the old lease's end.
    let claim = c.audits.iter().find_map(|(n, a)| match a {
        Audit::Claim {
            extent: ExtentId(0),
            epoch,
            from_ns,
            ..
        } if *n == NodeId(2) => Some((*epoch, *from_ns)),
        _ => None,
    });
    assert_eq!(claim, Some((Epoch(2), 50_000)));
    c.engines
        .get_mut(&NodeId(2))
        .unwrap()
        .set_clock(60_000, u64::MAX);
    c.client_sends(NodeId(2), write_at_epoch(2, 3, block(2, 1), 2));
    c.settle();
    let acked: Vec<_> = c
        .audits
        .iter()
        .filter_map(|(n, a)| match a {
            Audit::Acked {
                lba,
                in_sync,
                version,
                ..
            } => Some((*n, *lba, in_sync.clone(), *version)),
            _ => None,
        })
        .collect();
    assert_eq!(acked.len(), 1);
    let (primary, lba, in_sync, version) = acked[0].clone();
    assert_eq!((primary, lba), (NodeId(2), Lba(3)));
    assert_eq!(in_sync, vec![NodeId(2), NodeId(3)]);
    for node in in_sync {
        assert!(
            c.audits.iter().any(|(n, a)| *n == node
                && matches!(a, Audit::Persisted { lba: l, version: v, .. } if *l == lba && *v == version)),
            "{node} reported no persistence"
        );
    }
}

#[test]
fn the_ack_before_slowest_bug_switch_acks_early() {
    let mut c = cluster(ReplicationConfig {
        bugs_asked: Bugs {
            ack_before_slowest: true,
            ..Bugs::default()
        },
        ..test_config()
    });
    c.client_sends(NodeId(1), write(1, 0, block(3, 1)));
    c.deliver();
    c.complete_one(NodeId(1));
    c.complete_one(NodeId(2));
    c.deliver();
    assert_eq!(c.replies, vec![Message::WriteOk { req: RequestId(1) }]);
    assert_eq!(c.disk_block(NodeId(3), 0), None, "n3 has not persisted it");
    // Its late ack is taken without harm.
    c.settle();
    assert_eq!(c.disk_block(NodeId(3), 0), Some(3));
    assert_eq!(c.replies.len(), 1);
}

/// Write `count` blocks with tag `tag` at lba 0.., one write each, to completion.
fn fill(c: &mut Cluster, first_req: u64, count: u64, tag: u8, epoch: u64) {
    for i in 0..count {
        c.client_sends(
            NodeId(1),
            write_at_epoch(first_req + i, i, block(tag, 1), epoch),
        );
    }
    c.settle();
}

impl Cluster {
    /// [`Cluster::settle`], with every message to `away` lost and its disk idle.
    fn settle_without(&mut self, away: NodeId) {
        loop {
            self.collect();
            while let Some((from, to, msg)) = self.net.pop_front() {
                if to == away {
                    continue;
                }
                if to == CLIENT {
                    self.replies.push(msg);
                    continue;
                }
                self.engines.get_mut(&to).unwrap().handle_message(from, msg);
                self.collect();
            }
            let nodes: Vec<NodeId> = self
                .engines
                .keys()
                .copied()
                .filter(|n| *n != away)
                .collect();
            if !nodes.into_iter().any(|n| self.complete_one(n)) {
                return;
            }
        }
    }
}

/// n3 misses two writes to extent 0, is dropped from its in-sync set, and rebuilds.
fn rebuild_cluster(config: ReplicationConfig) -> Cluster {
    let mut c = cluster(config);
    fill(&mut c, 1, 6, 1, 1);
    c.client_sends(NodeId(1), write(20, 2, block(2, 1)));
    c.client_sends(NodeId(1), write(21, 9, block(2, 1)));
    c.settle_without(NodeId(3));
    assert!(c.replies.len() == 6, "acked without n3");
    drop_n3(&mut c);
    // Dropped, the writes are acked; n3 is rebuilding: the primary copies to it.
    c.settle();
    assert_eq!(c.replies.len(), 8);
    c
}

#[test]
fn a_rebuild_copies_what_a_replica_missed_then_joins() {
    use crate::control::Command;
    let mut c = rebuild_cluster(test_config());
    // n1 copied extent 0 to n3 and asks for it to join.
    let asked: Vec<_> = c
        .controls
        .iter()
        .filter(|(_, cmd)| matches!(cmd, Command::RebuildDone { .. }))
        .cloned()
        .collect();
    assert_eq!(
        asked,
        vec![(
            NodeId(1),
            Command::RebuildDone {
                extent: ExtentId(0),
                epoch: Epoch(2),
                node: NodeId(3)
            }
        )]
    );
    for lba in 0..16 {
        assert_eq!(
            c.disk_block(NodeId(3), lba),
            c.disk_block(NodeId(1), lba),
            "block {lba} differs after the rebuild"
        );
    }
    assert_eq!(c.disk_block(NodeId(3), 9), Some(2));
    assert_eq!(c.disk_block(NodeId(3), 2), Some(2));
    let progress = c.engines[&NodeId(1)].rebuild_progress();
    assert_eq!(progress.len(), 1);
    assert_eq!(progress[0].bytes_done, progress[0].bytes_total);
    // n1 holds blocks 0-5 and 9; n3 lacked only 2 and 9: its probes said so, and
    // only those two blocks were read and sent.
    assert_eq!(progress[0].bytes_total, 7 * BS as u64);
    assert_eq!(progress[0].bytes_sent, 2 * BS as u64);
    assert_eq!(c.copies, vec![(Lba(2), 1), (Lba(9), 1)]);
    publish(&mut c, asked[0].1.clone());
    assert!(c.engines[&NodeId(1)].rebuild_progress().is_empty());
    assert!(
        c.events.iter().any(|e| matches!(
            e,
            crate::events::Event::Rebuilt {
                node: NodeId(3),
                extent: ExtentId(0),
                ..
            }
        )),
        "{:?}",
        c.events
    );
    // In sync again: the next write waits for n3.
    c.client_sends(NodeId(1), write_at_epoch(30, 4, block(3, 1), 3));
    c.deliver();
    c.complete_one(NodeId(1));
    c.complete_one(NodeId(2));
    c.deliver();
    assert!(
        !c.replies.contains(&Message::WriteOk { req: RequestId(30) }),
        "acked without the rejoined replica"
    );
    c.settle();
    assert_eq!(c.disk_block(NodeId(3), 4), Some(3));
}

#[test]
fn a_rebuild_probes_ahead_while_its_data_waits_for_the_replicas_window() {
    // As in `rebuild_cluster`, n3 lacks blocks 2 and 9, one in each of extent
    // 0's two chunks (8 blocks each); n1 gives n3 a window of one block.
    let mut c = cluster(test_config());
    fill(&mut c, 1, 6, 1, 1);
    c.client_sends(NodeId(1), write(20, 2, block(2, 1)));
    c.client_sends(NodeId(1), write(21, 9, block(2, 1)));
    c.settle_without(NodeId(3));
    c.engines
        .get_mut(&NodeId(1))
        .unwrap()
        .set_peer_windows([(NodeId(3), BS as u64)].into());
    drop_n3(&mut c);
    c.collect();
    // Probes carry no data: both chunks ask at once (one at a time, each
    // lost packet on TCP would cost a retransmission timeout).
    let probes = c
        .net
        .iter()
        .filter(|(_, to, m)| *to == NodeId(3) && matches!(m, Message::RebuildProbe { .. }))
        .count();
    assert_eq!(probes, 2, "{:?}", c.net);
    // The data goes one block at a time, the window's worth, until done.
    let mut waited = false;
    for _ in 0..1000 {
        c.collect();
        let n1 = &c.engines[&NodeId(1)];
        assert!(
            n1.rebuild_data_in_flight(NodeId(3)) <= BS as u64,
            "past the window"
        );
        waited |= n1
            .ops
            .chunks
            .values()
            .any(|ch| ch.phase == super::rebuild::ChunkPhase::Waiting);
        if let Some((from, to, msg)) = c.net.pop_front() {
            if to.0 >= CLIENT.0 {
                c.replies.push(msg);
            } else {
                c.engines.get_mut(&to).unwrap().handle_message(from, msg);
            }
        } else if ![NodeId(1), NodeId(2), NodeId(3)]
            .into_iter()
            .any(|n| c.complete_one(n))
        {
            break;
        }
    }
    assert!(
        waited,
        "the second chunk's data never waited for the window"
    );
    assert_eq!(c.copies, vec![(Lba(2), 1), (Lba(9), 1)]);
    assert!(c
        .controls
        .iter()
        .any(|(_, cmd)| matches!(cmd, crate::control::Command::RebuildDone { .. })));
}

/// Grains of four blocks (extent 0 has four).
fn grain_config() -> ReplicationConfig {
    ReplicationConfig {
        version_grain_bytes: 4 * BS as u64,
        ..ReplicationConfig::default()
    }
}

impl Cluster {
    /// [`Cluster::deliver`], losing the messages `lost` picks.
    fn deliver_losing(&mut self, lost: impl Fn(NodeId, &Message) -> bool) {
        self.collect();
        while let Some((from, to, msg)) = self.net.pop_front() {
            if lost(to, &msg) {
                continue;
            }
            if to.0 >= CLIENT.0 {
                self.replies.push(msg);
                continue;
            }
            self.engines.get_mut(&to).unwrap().handle_message(from, msg);
            self.collect();
        }
    }
}

#[test]
fn a_replica_that_missed_a_write_to_part_of_a_grain_is_sent_the_whole_grain() {
    let mut c = cluster(grain_config());
    fill(&mut c, 1, 8, 1, 1);
    // n3 misses a write to block 1, then gets one to block 2 of the same grain:
    // that grain is now at the primary's version on n3 too, but not whole.
    c.client_sends(NodeId(1), write(20, 1, block(2, 1)));
    c.deliver_losing(|to, m| to == NodeId(3) && matches!(m, Message::ReplicaWrite { .. }));
    c.client_sends(NodeId(1), write(21, 2, block(3, 1)));
    c.settle();
    let grain = |c: &Cluster, n: u32| c.engines[&NodeId(n)].grains.get(0);
    assert_eq!(grain(&c, 3).version, grain(&c, 1).version);
    assert!(!grain(&c, 3).whole, "a write to the grain was missed");
    assert_eq!(c.disk_block(NodeId(3), 1), Some(1), "n3 lacks write 20");
    assert_eq!(
        c.replies,
        (1..=8)
            .map(|r| Message::WriteOk { req: RequestId(r) })
            .chain([Message::WriteOk { req: RequestId(21) }])
            .collect::<Vec<_>>()
    );
    // Dropped for its silence on write 20, n3 is rebuilt: its probe of grain 0
    // says it lacks it (grain 1 it holds whole), and the whole grain is copied.
    drop_n3(&mut c);
    c.settle();
    assert!(c.replies.contains(&Message::WriteOk { req: RequestId(20) }));
    for lba in 0..8 {
        assert_eq!(
            c.disk_block(NodeId(3), lba),
            c.disk_block(NodeId(1), lba),
            "block {lba} differs after the rebuild"
        );
    }
    assert_eq!(c.copies, vec![(Lba(0), 4)]);
    let progress = c.engines[&NodeId(1)].rebuild_progress();
    assert_eq!(
        (progress[0].bytes_total, progress[0].bytes_sent),
        (8 * BS as u64, 4 * BS as u64)
    );
    assert!(grain(&c, 3).whole);
}

#[test]
fn probes_from_a_non_primary_or_with_data_and_stray_answers_are_refused() {
    let mut c = cluster(test_config());
    let probe = |op: u64, data: Bytes| Message::RebuildProbe {
        op: OpId(op),
        copy: crate::wire::RebuildCopy {
            extent: ExtentId(0),
            epoch: Epoch(1),
            lba: Lba(0),
            versions: vec![Version(1)],
            data,
        },
    };
    let n2 = c.engines.get_mut(&NodeId(2)).unwrap();
    // n2 is in sync, not rebuilding; and a probe carries no data.
    n2.handle_message(NodeId(1), probe(1, Bytes::new()));
    n2.handle_message(NodeId(1), probe(2, block(1, 1)));
    // n1 gets answers to probes it never sent.
    let n1 = c.engines.get_mut(&NodeId(1)).unwrap();
    n1.handle_message(
        NodeId(2),
        Message::RebuildProbeOk {
            op: OpId(77),
            result: Ok((0, 1)),
        },
    );
    c.collect();
    let answers: Vec<(OpId, bool)> = c
        .net
        .iter()
        .filter_map(|(_, _, m)| match m {
            Message::RebuildProbeOk { op, result } => Some((*op, result.is_err())),
            _ => None,
        })
        .collect();
    assert_eq!(answers, vec![(OpId(1), true), (OpId(2), true)]);
    assert!(
        c.ios.is_empty(),
        "a refused probe or stray answer touched a disk"
    );
}

#[test]
fn the_rebuild_one_short_bug_switch_leaves_out_the_newest_block() {
    let c = rebuild_cluster(ReplicationConfig {
        bugs_asked: Bugs {
            rebuild_one_short: true,
            ..Bugs::default()
        },
        ..test_config()
    });
    let differ: Vec<u64> = (0..16)
        .filter(|&lba| c.disk_block(NodeId(3), lba) != c.disk_block(NodeId(1), lba))
        .collect();
    assert_eq!(differ, vec![9], "exactly the newest block is left out");
}

#[test]
fn a_copy_never_overwrites_a_newer_block_and_hostile_copies_are_refused() {
    let mut c = cluster(test_config());
    let n2 = c.engines.get_mut(&NodeId(2)).unwrap();
    // n2 is in sync, not rebuilding: a copy is refused.
    n2.handle_message(
        NodeId(1),
        Message::RebuildWrite {
            op: OpId(1),
            copy: crate::wire::RebuildCopy {
                extent: ExtentId(0),
                epoch: Epoch(1),
                lba: Lba(0),
                versions: vec![Version(1)],
                data: block(1, 1),
            },
        },
    );
    // Versions that do not match the data are refused.
    n2.handle_message(
        NodeId(1),
        Message::RebuildWrite {
            op: OpId(2),
            copy: crate::wire::RebuildCopy {
                extent: ExtentId(0),
                epoch: Epoch(1),
                lba: Lba(0),
                versions: vec![Version(1); 3],
                data: block(1, 1),
            },
        },
    );
    c.collect();
    let acks: Vec<_> = c
        .net
        .iter()
        .filter_map(|(_, _, m)| match m {
            Message::RebuildAck { op, result } => Some((*op, result.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(acks.len(), 2);
    assert_eq!(acks[0].1, Err(WeirError::NotPrimary(NodeId(1))));
    assert!(
        matches!(acks[1].1, Err(WeirError::BadLength { .. })),
        "{acks:?}"
    );
    assert!(c.ios.is_empty(), "a refused copy reached the disk");
}

#[test]
fn a_copy_to_a_replica_that_goes_down_lets_go_of_its_range() {
    use crate::control::Command;
    let mut c = cluster(test_config());
    fill(&mut c, 1, 2, 1, 1);
    c.client_sends(NodeId(1), write(10, 1, block(2, 1)));
    c.settle_without(NodeId(3));
    drop_n3(&mut c);
    // The copy of blocks 0..2 goes out to n3, which never answers.
    c.settle_without(NodeId(3));
    assert_eq!(c.engines[&NodeId(1)].rebuild_progress().len(), 1);
    // A write to a copied block queues behind the copy...
    c.client_sends(NodeId(1), write_at_epoch(11, 0, block(3, 1), 2));
    c.settle_without(NodeId(3));
    assert!(!c.replies.contains(&Message::WriteOk { req: RequestId(11) }));
    // ... until n3 is declared down: the copy is dropped and the write goes on.
    publish(
        &mut c,
        Command::NodeDown {
            node: NodeId(3),
            lease_expires_ns: 0,
        },
    );
    c.settle_without(NodeId(3));
    assert!(c.engines[&NodeId(1)].rebuild_progress().is_empty());
    assert!(
        c.replies.contains(&Message::WriteOk { req: RequestId(11) }),
        "{:?}",
        c.replies
    );
}

/// One step of a random run: the property test below drives the engines through
/// random interleavings of client writes, per-link message deliveries, device
/// completions in any order, and a node failing.
#[derive(Clone, Debug)]
enum Step {
    /// The client writes block `.0` (of the first extent) at its primary.
    Write(u64),
    /// Deliver the oldest message on the `.0`-th busy link (links stay FIFO).
    Deliver(usize),
    /// Complete the `.1`-th pending device command of node `.0`.
    Complete(u32, usize),
    /// Node `.0` fails: it stops, and the control plane declares it down.
    Down(u32),
    /// Node `.0` gets windows for its peers from the congestion response: one
    /// block, two blocks, or none (`.1` picks).
    Windows(u32, usize),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        3 => (0u64..6).prop_map(Step::Write),
        6 => (0usize..8).prop_map(Step::Deliver),
        5 => (1u32..=3, 0usize..4).prop_map(|(n, k)| Step::Complete(n, k)),
        1 => (1u32..=3).prop_map(Step::Down),
        1 => (1u32..=3, 0usize..3).prop_map(|(n, k)| Step::Windows(n, k)),
    ]
}

/// Runs [`Step`]s and checks, at every acknowledgement, that the block is on the disk
/// of every replica the primary's map counts in sync, and at the end that those
/// replicas agree on every block no failed write touched.
struct Model {
    c: Cluster,
    dead: Option<NodeId>,
    /// Tag of each write, by request.
    writes: BTreeMap<u64, (u64, u8)>,
    /// Per block: tag of the last acknowledged write; blocks a write failed on.
    acked: BTreeMap<u64, u8>,
    tainted: std::collections::BTreeSet<u64>,
    /// Replies already checked, by request.
    seen: std::collections::BTreeSet<u64>,
    next_req: u64,
}

impl Model {
    fn live_map(&self) -> &ClusterMap {
        let live = (1..=3).map(NodeId).find(|n| Some(*n) != self.dead).unwrap();
        self.c.engines[&live].map()
    }

    fn run(&mut self, step: Step) -> Result<(), String> {
        match step {
            Step::Write(lba) => {
                self.next_req += 1;
                let req = self.next_req;
                let tag = (req % 250) as u8 + 1;
                self.writes.insert(req, (lba, tag));
                let ext = self.live_map().extent(ExtentId(0)).clone();
                let msg = write_at_epoch(req, lba, block(tag, 1), ext.epoch.0);
                self.c.net.push_back((CLIENT, ext.primary, msg));
            }
            Step::Deliver(k) => {
                let mut links: Vec<(NodeId, NodeId)> =
                    self.c.net.iter().map(|(f, t, _)| (*f, *t)).collect();
                links.sort();
                links.dedup();
                if links.is_empty() {
                    return Ok(());
                }
                let link = links[k % links.len()];
                let at = self
                    .c
                    .net
                    .iter()
                    .position(|(f, t, _)| (*f, *t) == link)
                    .unwrap();
                let (from, to, msg) = self.c.net.remove(at).unwrap();
                if to == CLIENT {
                    self.c.replies.push(msg);
                } else if Some(to) != self.dead {
                    self.c
                        .engines
                        .get_mut(&to)
                        .unwrap()
                        .handle_message(from, msg);
                }
            }
            Step::Complete(n, k) => {
                let node = NodeId(n);
                let mine: Vec<usize> = (0..self.c.ios.len())
                    .filter(|&i| self.c.ios[i].0 == node)
                    .collect();
                if mine.is_empty() || Some(node) == self.dead {
                    return Ok(());
                }
                let pick = self.c.ios.remove(mine[k % mine.len()]);
                self.c.ios.insert(0, pick);
                self.c.complete_one(node);
            }
            Step::Windows(n, k) => {
                let peers = (1..=3).filter(|&p| p != n).map(NodeId);
                let windows = match k {
                    0 => peers.map(|p| (p, BS as u64)).collect(),
                    1 => peers.map(|p| (p, 2 * BS as u64)).collect(),
                    _ => BTreeMap::new(),
                };
                if Some(NodeId(n)) != self.dead {
                    let engine = self.c.engines.get_mut(&NodeId(n)).unwrap();
                    engine.set_peer_windows(windows);
                }
            }
            Step::Down(n) => {
                if self.dead.is_some() {
                    return Ok(());
                }
                self.dead = Some(NodeId(n));
                self.c.ios.retain(|(x, ..)| *x != NodeId(n));
                publish(
                    &mut self.c,
                    crate::control::Command::NodeDown {
                        node: NodeId(n),
                        lease_expires_ns: 0,
                    },
                );
            }
        }
        self.c.collect();
        self.check_acks()
    }

    /// Every acknowledgement just sent: the block is on every in-sync replica.
    fn check_acks(&mut self) -> Result<(), String> {
        let sent: Vec<(NodeId, Message)> = self
            .c
            .net
            .iter()
            .filter(|(_, to, _)| *to == CLIENT)
            .map(|(f, _, m)| (*f, m.clone()))
            .collect();
        for (primary, msg) in sent {
            match msg {
                Message::WriteOk { req } if self.seen.insert(req.0) => {
                    let (block, tag) = self.writes[&req.0];
                    self.acked.insert(block, tag);
                    let in_sync = self.c.engines[&primary]
                        .map()
                        .extent(ExtentId(0))
                        .in_sync
                        .clone();
                    for node in in_sync {
                        let has = self.c.disk_block(node, block);
                        if has != Some(tag) {
                            return Err(format!(
                                "req{} acked by {primary} but in-sync {node} holds {has:?}, not {tag}",
                                req.0
                            ));
                        }
                    }
                }
                Message::Failed { req, .. } if self.seen.insert(req.0) => {
                    self.tainted.insert(self.writes[&req.0].0);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Deliver and complete everything left, then compare the in-sync replicas.
    fn finish(&mut self) -> Result<(), String> {
        for _ in 0..10_000 {
            let busy =
                !self.c.net.is_empty() || self.c.ios.iter().any(|(n, ..)| Some(*n) != self.dead);
            if !busy {
                break;
            }
            self.run(Step::Deliver(0))?;
            for n in 1..=3 {
                self.run(Step::Complete(n, 0))?;
            }
        }
        let ext = self.live_map().extent(ExtentId(0)).clone();
        for block in 0..6 {
            if self.tainted.contains(&block) {
                continue;
            }
            let want = self.acked.get(&block).copied();
            for &node in &ext.in_sync {
                let has = self.c.disk_block(node, block);
                if has != want {
                    return Err(format!(
                        "block {block}: in-sync {node} holds {has:?}, last ack {want:?}"
                    ));
                }
            }
        }
        Ok(())
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

    #[test]
    fn random_interleavings_and_a_failure_never_lose_an_acknowledged_write(
        steps in proptest::collection::vec(step(), 1..120)
    ) {
        let mut m = Model {
            c: cluster(test_config()),
            dead: None,
            writes: BTreeMap::new(),
            acked: BTreeMap::new(),
            tainted: Default::default(),
            seen: Default::default(),
            next_req: 0,
        };
        for s in steps {
            if let Err(e) = m.run(s) {
                proptest::prop_assert!(false, "{}", e);
            }
        }
        if let Err(e) = m.finish() {
            proptest::prop_assert!(false, "{}", e);
        }
    }
}

#[test]
fn a_restarted_primary_waits_for_a_new_epoch_and_copies_whole_extents() {
    use crate::control::Command;
    let mut c = rebuild_cluster(test_config());
    // Before n3's rebuild is done, n2 goes down, and n1, the last in-sync copy,
    // restarts. It restores its versions from its checkpoint (lower bounds; here
    // every one), but a replica it has not seen in sync since may hold a later
    // write n1 lost with its cache: it must copy whole extents above them all.
    // (A restarted node with another in-sync copy beside it leaves the in-sync
    // set instead; the control plane's tests cover that.)
    goes_down(&mut c, NodeId(2));
    let map = c.engines[&NodeId(1)].map().clone();
    let epochs: BTreeMap<ExtentId, Epoch> = map
        .state()
        .extents
        .iter()
        .map(|(&id, e)| (id, e.epoch))
        .collect();
    // Its device commands in flight are gone with it.
    c.ios.retain(|(n, ..)| *n != NodeId(1));
    let held: BTreeMap<Lba, Version> = c.engines[&NodeId(1)].grain_versions().collect();
    let mut fresh = Replicator::new(NodeId(1), map.clone(), test_config());
    fresh.set_clock(0, u64::MAX);
    fresh.set_restored(epochs.clone());
    fresh.restore_versions(held);
    c.engines.insert(NodeId(1), fresh);
    // Wipe n3's copy of block 9 to see that the restarted primary copies it again.
    c.disks.get_mut(&NodeId(3)).unwrap().remove(&9);
    let replies = c.replies.len();
    c.client_sends(NodeId(1), write_at_epoch(40, 3, block(7, 1), 3));
    c.settle();
    assert_eq!(
        failed_with(&c, 40),
        Some(WeirError::NoLease(NodeId(1))),
        "served at an epoch it may have served at before: {:?}",
        &c.replies[replies..]
    );
    publish(
        &mut c,
        Command::Restarted {
            node: NodeId(1),
            incarnation: 1,
            boot: 0,
        },
    );
    // The node driver tells the engine once its control plane applied it.
    c.engines.get_mut(&NodeId(1)).unwrap().restart_applied();
    c.settle();
    let progress = c.engines[&NodeId(1)].rebuild_progress();
    assert_eq!(progress.len(), 1, "n1 copies ext0 to n3");
    assert_eq!(
        progress[0].bytes_total,
        16 * BS as u64,
        "a whole-extent copy"
    );
    for lba in 0..16 {
        // A block never written reads as zeroes, copied or not.
        assert_eq!(
            c.disk_block(NodeId(3), lba).unwrap_or(0),
            c.disk_block(NodeId(1), lba).unwrap_or(0),
            "block {lba} differs after a rebuild by a restarted primary"
        );
    }
    assert_eq!(c.disk_block(NodeId(3), 9), Some(2));
    // It serves at the new epoch, numbering above it.
    let epoch = c.engines[&NodeId(1)].map().extent(ExtentId(0)).epoch;
    c.client_sends(NodeId(1), write_at_epoch(41, 3, block(8, 1), epoch.0));
    c.settle();
    assert_eq!(
        c.replies.last(),
        Some(&Message::WriteOk { req: RequestId(41) })
    );
    let v = c.engines[&NodeId(1)].block_version(Lba(3)).unwrap();
    assert!(v > Version::epoch_floor(Epoch(4)), "{v}");
    // Neither replica was seen in sync since the restart: copies to either are
    // whole-extent copies.
    for n in [2, 3] {
        assert!(c.engines[&NodeId(1)]
            .copies_in_full(ExtentId(0), NodeId(n))
            .is_some());
    }
}

#[test]
fn a_rebuild_chunk_whose_ack_is_lost_lets_go_of_its_range_and_is_sent_again() {
    let mut c = cluster(test_config());
    fill(&mut c, 1, 4, 1, 1);
    c.client_sends(NodeId(1), write(10, 2, block(2, 1)));
    c.settle_without(NodeId(3));
    drop_n3(&mut c);
    // The copy to n3 goes out and is lost (n3 restarted before it was declared
    // down, say): its chunk holds a shared lock on blocks 0.. for good.
    c.settle_without(NodeId(3));
    assert_eq!(c.engines[&NodeId(1)].rebuild_progress()[0].bytes_done, 0);
    c.client_sends(NodeId(1), write_at_epoch(20, 1, block(7, 1), 2));
    c.settle_without(NodeId(3));
    assert!(
        !c.replies.contains(&Message::WriteOk { req: RequestId(20) }),
        "the write should wait behind the chunk's lock"
    );
    // Past the chunk timeout the range is let go: the write goes through.
    let later = super::rebuild::REBUILD_CHUNK_TIMEOUT_NS + 1;
    c.engines.get_mut(&NodeId(1)).unwrap().handle_tick(later);
    c.settle_without(NodeId(3));
    assert!(
        c.replies.contains(&Message::WriteOk { req: RequestId(20) }),
        "{:?}",
        c.replies
    );
    // ... and the chunk goes again after its pause; now n3 answers.
    let again = later + super::rebuild::REBUILD_CHUNK_TIMEOUT_NS;
    c.engines.get_mut(&NodeId(1)).unwrap().handle_tick(again);
    c.settle();
    for lba in 0..16 {
        assert_eq!(
            c.disk_block(NodeId(3), lba),
            c.disk_block(NodeId(1), lba),
            "block {lba} differs after the copy was sent again"
        );
    }
}

#[test]
fn a_retried_write_overwritten_since_is_answered_without_bringing_old_data_back() {
    let mut c = cluster(test_config());
    // Write A (request 1) reaches every replica, but n1 dies before it answers.
    c.client_sends(NodeId(1), write(1, 0, block(0xA, 2)));
    c.deliver();
    while c.complete_one(NodeId(2)) || c.complete_one(NodeId(3)) {}
    n1_goes_down(&mut c);
    // n2 leads at epoch 2, once it has written A's blocks back to n3 (they were
    // in both replicas' uncertain tails).
    c.settle_without(NodeId(1));
    c.replies.clear();
    // Write B (request 2) overwrites both blocks.
    c.client_sends(NodeId(2), write_at_epoch(2, 0, block(0xB, 2), 2));
    c.settle();
    assert_eq!(c.replies, vec![Message::WriteOk { req: RequestId(2) }]);
    // The client retries A under its request id: answered, B stays.
    let applied = c.applied.len();
    c.client_sends(NodeId(2), write_at_epoch(1, 0, block(0xA, 2), 2));
    c.settle();
    assert_eq!(c.replies[1], Message::WriteOk { req: RequestId(1) });
    assert_eq!(c.applied.len(), applied, "the retry was applied again");
    for n in [2, 3] {
        assert_eq!(c.disk_block(NodeId(n), 0), Some(0xB));
        assert_eq!(c.disk_block(NodeId(n), 1), Some(0xB));
    }
    // A retry overwritten in part, or not at all, is applied again.
    c.client_sends(NodeId(2), write_at_epoch(3, 1, block(0xC, 1), 2));
    c.settle();
    c.client_sends(NodeId(2), write_at_epoch(2, 0, block(0xB, 2), 2));
    c.settle();
    assert_eq!(
        c.replies.last(),
        Some(&Message::WriteOk { req: RequestId(2) })
    );
    assert_eq!(c.disk_block(NodeId(3), 1), Some(0xB));
    // Another client's request with the same number is its own write.
    c.net.push_back((
        NodeId(101),
        NodeId(2),
        write_at_epoch(1, 0, block(0xD, 2), 2),
    ));
    c.settle();
    assert_eq!(c.disk_block(NodeId(3), 0), Some(0xD));
}

#[test]
fn a_primary_read_that_hits_a_media_error_is_served_from_a_replica_and_repaired() {
    let mut c = cluster(test_config());
    c.client_sends(NodeId(1), write(1, 4, block(9, 2)));
    c.settle();
    c.bad.insert((NodeId(1), 5));
    c.client_sends(NodeId(1), read(2, 4, 2));
    c.settle();
    // The client got the data from n2's copy; n1 wrote it back over the bad block.
    assert_eq!(
        c.replies.last(),
        Some(&Message::ReadOk {
            req: RequestId(2),
            data: block(9, 2)
        })
    );
    assert!(!c.bad.contains(&(NodeId(1), 5)), "not repaired");
    assert_eq!(c.disk_block(NodeId(1), 5), Some(9));
    assert!(
        c.events.iter().any(|e| matches!(
            e,
            crate::events::Event::Repaired {
                node: NodeId(1),
                blocks: 2,
                ..
            }
        )),
        "{:?}",
        c.events
    );
    // With every copy unreadable the read fails with the media error.
    for n in 1..=3 {
        c.bad.insert((NodeId(n), 6));
    }
    c.client_sends(NodeId(1), read(3, 6, 1));
    c.settle();
    assert_eq!(
        failed_with(&c, 3),
        Some(WeirError::Device(DevError::Media(Lba(6))))
    );
}

#[test]
fn a_replica_that_hits_a_media_error_is_repaired_from_its_primary() {
    let mut c = cluster(test_config());
    c.client_sends(NodeId(1), write(1, 4, block(9, 2)));
    c.settle();
    c.bad.insert((NodeId(3), 4));
    let scrub = Message::ScrubRead {
        req: RequestId(2),
        volume: VolumeId(1),
        lba: Lba(4),
        blocks: 2,
    };
    c.client_sends(NodeId(3), scrub.clone());
    c.settle();
    // The scrub got the error, and n3 fetched the blocks from n1 and wrote them.
    assert!(matches!(failed_with(&c, 2), Some(WeirError::Device(_))));
    assert_eq!(c.disk_block(NodeId(3), 4), Some(9));
    assert!(c.bad.is_empty());
    c.client_sends(NodeId(3), scrub);
    c.settle();
    assert_eq!(
        c.replies.last(),
        Some(&Message::ReadOk {
            req: RequestId(2),
            data: block(9, 2)
        })
    );
    // Fetches from strangers, of the wrong epoch or past the extent are refused.
    let fetch = |epoch, lba, blocks| Message::FetchBlocks {
        op: OpId(77),
        extent: ExtentId(0),
        epoch: Epoch(epoch),
        lba: Lba(lba),
        blocks,
    };
    let n1 = NodeId(1);
    for msg in [
        fetch(2, 4, 1),
        fetch(1, 15, 2),
        fetch(1, 4, 0),
        fetch(1, 4, u32::MAX),
    ] {
        c.engines
            .get_mut(&n1)
            .unwrap()
            .handle_message(NodeId(2), msg);
        c.collect();
        let answer = c.net.pop_back().expect("an answer");
        assert!(
            matches!(
                answer,
                (_, NodeId(2), Message::FetchBlocksOk { result: Err(_), .. })
            ),
            "{answer:?}"
        );
        assert!(c.net.is_empty() && c.ios.is_empty());
    }
    // A non-member gets nothing at all.
    c.engines
        .get_mut(&n1)
        .unwrap()
        .handle_message(NodeId(9), fetch(1, 4, 1));
    c.collect();
    assert!(c.net.is_empty() && c.ios.is_empty());
}

#[test]
fn a_repair_refused_while_a_new_primary_waits_out_the_old_lease_is_asked_again() {
    use crate::control::Command;
    let mut c = cluster(test_config());
    for e in c.engines.values_mut() {
        e.set_clock(1_000, u64::MAX);
    }
    c.client_sends(NodeId(1), write(1, 4, block(9, 1)));
    c.settle();
    // n2 takes ext0 over and may serve it only from 50 ms.
    publish(
        &mut c,
        Command::NodeDown {
            node: NodeId(1),
            lease_expires_ns: 50_000_000,
        },
    );
    // n2 reconciles the extent's replicas meanwhile.
    c.settle();
    c.bad.insert((NodeId(3), 4));
    c.client_sends(
        NodeId(3),
        Message::ScrubRead {
            req: RequestId(2),
            volume: VolumeId(1),
            lba: Lba(4),
            blocks: 1,
        },
    );
    c.settle();
    assert!(matches!(failed_with(&c, 2), Some(WeirError::Device(_))));
    assert!(c.bad.contains(&(NodeId(3), 4)), "n2 may not answer yet");
    assert_eq!(c.engines[&NodeId(3)].ops_in_flight(), 1, "the repair waits");
    // n2 may serve; n3 asks again once its replica timeout has passed.
    c.engines
        .get_mut(&NodeId(2))
        .unwrap()
        .set_clock(50_000_000, u64::MAX);
    c.engines
        .get_mut(&NodeId(3))
        .unwrap()
        .handle_tick(1_000 + DEFAULT_REPLICA_TIMEOUT_NS);
    c.collect();
    c.settle();
    assert_eq!(c.disk_block(NodeId(3), 4), Some(9));
    assert!(c.bad.is_empty());
    assert_eq!(c.engines[&NodeId(3)].ops_in_flight(), 0);
}

#[test]
fn the_background_scrubber_finds_and_repairs_a_bad_block_nobody_reads() {
    let config = ReplicationConfig {
        scrub_bytes_per_sec: 64 * BS as u64 * 1000, // 64 blocks per ms
        ..test_config()
    };
    let mut c = cluster(config);
    // Blocks 0-5 and 20-23 (extent 1), then two bad blocks: one on the primary of
    // extent 0 (n1) and one on a replica of extent 1.
    fill(&mut c, 1, 6, 1, 1);
    let ext1 = c.engines[&NodeId(1)].map.extent(ExtentId(1)).clone();
    c.client_sends(ext1.primary, write(10, 20, block(2, 4)));
    c.settle();
    assert_eq!(
        c.replies.last(),
        Some(&Message::WriteOk { req: RequestId(10) })
    );
    let replica = *ext1.in_sync.iter().find(|n| **n != ext1.primary).unwrap();
    c.bad.insert((NodeId(1), 3));
    c.bad.insert((replica, 22));
    // Nobody reads; the scrubbers walk their blocks a tick at a time.
    for ms in 1..=20u64 {
        for n in 1..=3 {
            c.engines
                .get_mut(&NodeId(n))
                .unwrap()
                .handle_tick(ms * 1_000_000);
        }
        c.settle();
    }
    assert!(c.bad.is_empty(), "left unrepaired: {:?}", c.bad);
    assert_eq!(c.disk_block(NodeId(1), 3), Some(1));
    assert_eq!(c.disk_block(replica, 22), Some(2));
    let found: Vec<_> = c
        .events
        .iter()
        .filter(|e| matches!(e, crate::events::Event::ScrubFound { .. }))
        .collect();
    assert_eq!(found.len(), 2, "{:?}", c.events);
    let errors: u64 = c.engines.values().map(|e| e.scrub_progress().1).sum();
    assert_eq!(errors, 2);
    // n1 holds 10 blocks and walked them again and again over 20 ms.
    assert!(c.engines[&NodeId(1)].scrub_progress().0 > 10 * BS as u64);
}

/// What node `n`'s checkpoint file restores, block by block.
fn restored(c: &Cluster, n: u32) -> BTreeMap<Lba, Version> {
    let file = c.checkpoints.get(&NodeId(n)).cloned().unwrap_or_default();
    crate::replication::versions::replay(&file, "disk", 64, 1).versions
}

fn with_checkpoints() -> ReplicationConfig {
    ReplicationConfig {
        checkpoint_every_ns: 1_000,
        ..test_config()
    }
}

#[test]
fn a_checkpoint_holds_only_versions_completed_before_its_flush_and_forgets_failed_writes() {
    let mut c = cluster(with_checkpoints());
    fill(&mut c, 1, 4, 1, 1);
    let n3 = NodeId(3);
    // The first checkpoint is full. A write to block 8 reaches n3 after its flush
    // was issued: not in it, though its version is claimed.
    c.engines.get_mut(&n3).unwrap().handle_tick(10_000);
    c.collect();
    assert!(matches!(c.ios.last(), Some((n, _, IoCmd::Flush)) if *n == n3));
    c.client_sends(NodeId(1), write(10, 8, block(2, 1)));
    c.deliver();
    assert!(c.complete_one(n3), "the flush");
    let want: BTreeMap<Lba, Version> = (0..4).map(|b| (Lba(b), v(b + 1))).collect();
    assert_eq!(restored(&c, 3), want);
    assert_eq!(c.engines[&n3].block_version(Lba(8)), Some(v(5)));
    // Nothing is written down before the flush that makes it durable completes.
    c.settle();
    assert_eq!(restored(&c, 3), want);
    assert_eq!(c.engines[&n3].checkpoints_written(), (1, 4));

    // Block 8 (v5) is taken into the next checkpoint; before its flush completes,
    // a newer write to block 8 fails on n3's device. Its version is forgotten at
    // once, and the checkpoint must not write v5 back: what block 8 holds is
    // unknown.
    c.client_sends(NodeId(1), write(11, 8, block(3, 1)));
    c.deliver();
    c.engines.get_mut(&n3).unwrap().handle_tick(20_000);
    c.collect();
    c.fail_next_io(n3, DevError::Media(Lba(8)));
    assert_eq!(c.engines[&n3].block_version(Lba(8)), None);
    assert_eq!(restored(&c, 3), want);
    c.settle();
    assert_eq!(restored(&c, 3), want, "v5 of block 8 was written back");

    // A later write to block 8 completes and is checkpointed as a delta.
    c.client_sends(NodeId(1), write_at_epoch(12, 1, block(4, 1), 2));
    c.settle();
    let v1 = c.engines[&n3].block_version(Lba(1)).unwrap();
    c.engines.get_mut(&n3).unwrap().handle_tick(30_000);
    c.settle();
    let mut want = want;
    want.insert(Lba(1), v1);
    assert_eq!(restored(&c, 3), want);
    assert_eq!(c.engines[&n3].checkpoints_written(), (2, 5));
    // Not before the interval: nothing dirty is left anyway.
    c.engines.get_mut(&n3).unwrap().handle_tick(30_500);
    c.collect();
    assert!(c.ios.is_empty());
}

#[test]
fn a_replica_restarted_from_its_checkpoint_is_sent_only_what_it_lacks() {
    use crate::control::Command;
    let mut c = cluster(with_checkpoints());
    fill(&mut c, 1, 6, 1, 1);
    let n3 = NodeId(3);
    c.engines.get_mut(&n3).unwrap().handle_tick(10_000);
    c.settle();
    // Two more writes reach n3's device but no checkpoint; then n3 loses power
    // and its device's cache with them.
    c.client_sends(NodeId(1), write(20, 2, block(2, 1)));
    c.client_sends(NodeId(1), write(21, 9, block(2, 1)));
    c.settle();
    let disk = c.disks.get_mut(&n3).unwrap();
    disk.insert(2, vec![1; BS]);
    disk.remove(&9);
    let map = c.engines[&n3].map().clone();
    let epochs = map
        .state()
        .extents
        .iter()
        .map(|(&id, e)| (id, e.epoch))
        .collect();
    let mut fresh = Replicator::new(n3, map, with_checkpoints());
    fresh.set_clock(0, u64::MAX);
    fresh.set_restored(epochs);
    fresh.restore_versions(restored(&c, 3));
    assert_eq!(fresh.block_version(Lba(2)), Some(v(3)), "a lower bound");
    assert_eq!(fresh.block_version(Lba(9)), None);
    c.engines.insert(n3, fresh);
    publish(
        &mut c,
        Command::Restarted {
            node: n3,
            incarnation: 1,
            boot: 0,
        },
    );
    c.settle();
    // Its probes asked only for blocks 2 and 9: the rest it still holds.
    assert_eq!(c.copies, vec![(Lba(2), 1), (Lba(9), 1)]);
    let progress = c.engines[&NodeId(1)].rebuild_progress();
    assert_eq!(progress[0].bytes_sent, 2 * BS as u64);
    for lba in 0..16 {
        assert_eq!(
            c.disk_block(n3, lba),
            c.disk_block(NodeId(1), lba),
            "block {lba} differs after the rebuild"
        );
    }
}

#[test]
fn a_checkpoint_asked_for_covers_every_write_completed_before_the_ask() {
    let mut c = cluster(with_checkpoints());
    let n3 = NodeId(3);
    assert_eq!(
        Replicator::new(n3, c.engines[&n3].map().clone(), test_config()).checkpoint_now(),
        None,
        "checkpoints off"
    );
    fill(&mut c, 1, 2, 1, 1);
    // A checkpoint is in flight when block 5's write completes and a checkpoint
    // is asked for: the one in flight does not cover it, the next one does.
    c.engines.get_mut(&n3).unwrap().handle_tick(10_000);
    c.collect();
    c.client_sends(NodeId(1), write(10, 5, block(2, 1)));
    c.deliver();
    let at = c
        .ios
        .iter()
        .position(|(n, _, cmd)| *n == n3 && matches!(cmd, IoCmd::Write { .. }));
    let (_, io, _) = c.ios.remove(at.unwrap());
    c.engines
        .get_mut(&n3)
        .unwrap()
        .handle_io(io, IoResult::Done);
    c.collect();
    let asked = c.engines.get_mut(&n3).unwrap().checkpoint_now().unwrap();
    assert_eq!(asked, 2);
    assert!(c.complete_one(n3), "the first flush");
    assert_eq!(c.engines[&n3].checkpoints_finished(), 1);
    assert_eq!(restored(&c, 3).get(&Lba(5)), None);
    c.settle();
    assert_eq!(c.engines[&n3].checkpoints_finished(), 2);
    assert_eq!(restored(&c, 3).get(&Lba(5)), Some(&v(3)));
    // With nothing in flight it is taken at once.
    let asked = c.engines.get_mut(&n3).unwrap().checkpoint_now().unwrap();
    assert_eq!(asked, 3);
    c.settle();
    assert_eq!(c.engines[&n3].checkpoints_finished(), 3);
}

#[test]
fn a_probe_waits_for_a_deposed_primarys_own_write_still_on_its_device() {
    use crate::control::Command;
    let mut c = cluster(test_config());
    // n1 writes block 3; the replicas' devices finish, n1's own does not yet.
    c.client_sends(NodeId(1), write(1, 3, block(5, 1)));
    c.deliver();
    while c.complete_one(NodeId(2)) || c.complete_one(NodeId(3)) {}
    c.deliver();
    // n1 is deposed (n2 leads at epoch 2), then comes back and rebuilds: n2's
    // probe for block 3 finds n1 claiming the version its own write gave.
    n1_goes_down(&mut c);
    publish(&mut c, Command::NodeUp { node: NodeId(1) });
    c.deliver();
    let probed = |c: &Cluster| {
        c.engines[&NodeId(2)]
            .rebuild_progress()
            .iter()
            .map(|p| p.bytes_done)
            .sum::<u64>()
    };
    assert_eq!(probed(&c), 0, "n1 answered before its own write finished");
    // That write fails: n1 forgets the version, and its answer asks for block 3.
    c.fail_next_io(NodeId(1), DevError::Media(Lba(3)));
    assert_eq!(c.engines[&NodeId(1)].block_version(Lba(3)), None);
    c.settle();
    assert_eq!(c.copies, vec![(Lba(3), 1)]);
    assert_eq!(c.disk_block(NodeId(1), 3), Some(5));
}

/// n1 writes block 5 (tag 7) but only `reaches` gets it before n1 goes down and
/// n2 takes over; returns the cluster with n2's reconciliation under way.
fn unacked_write_then_failover(reaches: NodeId) -> Cluster {
    let mut c = cluster(test_config());
    fill(&mut c, 1, 8, 1, 1);
    let misses = if reaches == NodeId(2) {
        NodeId(3)
    } else {
        NodeId(2)
    };
    c.client_sends(NodeId(1), write(50, 5, block(7, 1)));
    c.settle_without(misses);
    assert!(
        !c.replies.contains(&Message::WriteOk { req: RequestId(50) }),
        "acknowledged without every replica"
    );
    // The write to `misses` is lost with n1.
    c.net.retain(|(_, to, _)| *to != misses);
    n1_goes_down(&mut c);
    c.collect();
    c
}

#[test]
fn a_new_primary_writes_back_a_block_only_it_holds_before_it_serves() {
    let mut c = unacked_write_then_failover(NodeId(2));
    // n2 holds the unanswered write, n3 does not. Until n3's tail is in and the
    // block is written back, n2 serves nothing of the extent.
    let epoch = c.engines[&NodeId(2)].map().extent(ExtentId(0)).epoch;
    let read_at = |req| Message::Read {
        req: RequestId(req),
        volume: VolumeId(1),
        epoch,
        lba: Lba(5),
        blocks: 1,
        delta: 1,
    };
    c.client_sends(NodeId(2), read_at(60));
    let (from, to, tail) = c
        .net
        .iter()
        .find(|(_, to, _)| *to == NodeId(2))
        .cloned()
        .unwrap();
    assert!(matches!(tail, Message::ReconcileTail { .. }), "{tail:?}");
    c.net
        .retain(|(_, t, m)| !(*t == to && matches!(m, Message::ReconcileTail { .. })));
    c.deliver();
    assert_eq!(
        failed_with(&c, 60),
        Some(WeirError::NoLease(NodeId(2))),
        "served before reconciling"
    );
    c.net.push_back((from, to, tail));
    c.settle_without(NodeId(1));
    assert_eq!(c.disk_block(NodeId(3), 5), Some(7));
    // The fill's 8 writes are still in n3's tail (no later write reached it to
    // say they settled): written back too, harmlessly.
    assert_eq!(c.engines[&NodeId(2)].blocks_reconciled(), 8);
    let v2 = c.engines[&NodeId(2)].block_version(Lba(5));
    assert_eq!(v2, c.engines[&NodeId(3)].block_version(Lba(5)));
    assert!(v2.unwrap() > Version::epoch_floor(Epoch(2)));
    // Now it serves, and the copies agree.
    c.client_sends(NodeId(2), read_at(61));
    c.settle_without(NodeId(1));
    assert!(c.replies.contains(&Message::ReadOk {
        req: RequestId(61),
        data: block(7, 1)
    }));
}

#[test]
fn a_new_primary_overwrites_a_block_only_a_replica_holds() {
    let mut c = unacked_write_then_failover(NodeId(3));
    // n3 holds the unanswered write, n2 (the new primary) does not: n3's tail
    // names the block, and n2 writes its own copy back over it.
    assert_eq!(c.disk_block(NodeId(3), 5), Some(7));
    c.settle_without(NodeId(1));
    assert_eq!(c.disk_block(NodeId(3), 5), Some(1));
    assert_eq!(c.disk_block(NodeId(2), 5), Some(1));
    assert_eq!(
        c.engines[&NodeId(2)].block_version(Lba(5)),
        c.engines[&NodeId(3)].block_version(Lba(5))
    );
    // n2's own tail still names the fill's 8 writes (write 50 would have told
    // it they settled); n3's only block 5.
    assert_eq!(c.engines[&NodeId(2)].blocks_reconciled(), 8);
}

#[test]
fn a_deposed_primary_rejoining_gives_up_its_own_unanswered_write() {
    use crate::control::Command;
    let mut c = cluster(test_config());
    fill(&mut c, 1, 8, 1, 1);
    // A later write tells the replicas the fill's writes were all answered.
    c.client_sends(NodeId(1), write(40, 9, block(1, 1)));
    c.settle();
    // n1's write to block 5 reaches its own device only.
    c.engines
        .get_mut(&NodeId(1))
        .unwrap()
        .handle_message(CLIENT, write(50, 5, block(7, 1)));
    c.collect();
    c.net
        .retain(|(_, _, m)| !matches!(m, Message::ReplicaWrite { .. }));
    assert!(c.complete_one(NodeId(1)));
    assert_eq!(c.disk_block(NodeId(1), 5), Some(7));
    // n1 is deposed; n2 leads without the write; n1 comes back and rebuilds.
    n1_goes_down(&mut c);
    c.settle_without(NodeId(1));
    publish(&mut c, Command::NodeUp { node: NodeId(1) });
    c.settle();
    // Its block 5 is newer than n2's, but from before n2's reign and unknown to
    // n2: it ends up with n2's copy.
    assert_eq!(c.disk_block(NodeId(1), 5), Some(1));
    assert_eq!(
        c.engines[&NodeId(1)].block_version(Lba(5)),
        c.engines[&NodeId(2)].block_version(Lba(5))
    );
    // n2's reconciliation wrote back block 9 (the last write, in the tails);
    // n1, back, sent its own tail late, naming block 5: written back too.
    assert_eq!(c.engines[&NodeId(2)].blocks_reconciled(), 2);
}

#[test]
fn a_rebuilding_replica_takes_the_copy_over_an_older_reigns_newer_block() {
    let reign = Version::epoch_floor(Epoch(3));
    let old = |n| Version(Version::epoch_floor(Epoch(2)).0 + n);
    let now = |n| Version(reign.0 + n);
    // Older than the copy: taken. Equal: kept.
    assert!(rebuild::takes(old(1), old(2), reign));
    assert!(!rebuild::takes(old(2), old(2), reign));
    // Newer, but from before the reign (a write the primary never got): taken.
    assert!(rebuild::takes(old(5), old(2), reign));
    // Newer and from this reign (forwarded after the copy was read): kept.
    assert!(!rebuild::takes(now(5), old(2), reign));
    // A block the primary left out (version 0) is never taken over one held.
    assert!(!rebuild::takes(old(5), Version(0), reign));
}

/// The shape campaign seed 321 (with the host model) found: an in-sync replica
/// whose grain is broken (it missed an unacknowledged write to part of it, which
/// reconciliation then wrote back) becomes primary and rebuilds a replica that
/// lacks an acknowledged write to that grain. Its copy must send the grain.
#[test]
fn a_primary_with_a_broken_grain_still_copies_it_to_a_rebuilding_replica() {
    use crate::control::Command;
    let mut c = cluster(grain_config());
    fill(&mut c, 1, 8, 1, 1);
    // A later write (grain 2) tells the replicas the fill's writes were all
    // answered: the tails below name only what follows.
    c.client_sends(NodeId(1), write(40, 8, block(1, 1)));
    c.settle();
    // n1's write to block 1 reaches n3, not n2; n1 is declared down before it
    // is answered. n2 takes over and writes its own block 1 back to n3: n3's
    // grain 0 is at n2's version, but broken (a write to part of it it holds
    // older than that).
    c.client_sends(NodeId(1), write(50, 1, block(7, 1)));
    c.settle_without(NodeId(2));
    c.net.retain(|(_, to, _)| *to != NodeId(2));
    n1_goes_down(&mut c);
    c.settle_without(NodeId(1));
    assert_eq!(c.disk_block(NodeId(3), 1), Some(1), "written back");
    let grain = |c: &Cluster, n: u32| c.engines[&NodeId(n)].grains.get(0);
    assert!(!grain(&c, 3).whole, "n3's grain 0 is broken");
    // n2 leads; an acknowledged write to block 2 reaches n2 and n3 only, and one
    // after it (grain 3) settles it.
    let epoch = c.engines[&NodeId(2)].map().extent(ExtentId(0)).epoch.0;
    c.client_sends(NodeId(2), write_at_epoch(60, 2, block(9, 1), epoch));
    c.settle_without(NodeId(1));
    c.client_sends(NodeId(2), write_at_epoch(61, 12, block(9, 1), epoch));
    c.settle_without(NodeId(1));
    for req in [60, 61] {
        assert!(c.replies.contains(&Message::WriteOk {
            req: RequestId(req)
        }));
    }
    assert!(
        !grain(&c, 3).whole,
        "a write to part of it leaves it broken"
    );
    // n1 comes back, and n2 goes down before it copies anything: n3, the last
    // in-sync copy, leads and rebuilds n1.
    publish(&mut c, Command::NodeUp { node: NodeId(1) });
    c.net.clear();
    goes_down(&mut c, NodeId(2));
    c.settle_without(NodeId(2));
    let map = c.engines[&NodeId(3)].map().clone();
    assert_eq!(map.extent(ExtentId(0)).primary, NodeId(3));
    assert!(map.extent(ExtentId(0)).rebuilding.contains(&NodeId(1)));
    assert_eq!(
        c.disk_block(NodeId(1), 2),
        Some(9),
        "n1 lacks acknowledged write 60"
    );
    for lba in 0..16 {
        // A block never written reads as zeroes, copied or not.
        assert_eq!(
            c.disk_block(NodeId(1), lba).unwrap_or(0),
            c.disk_block(NodeId(3), lba).unwrap_or(0),
            "block {lba} differs after the rebuild"
        );
    }
}

#[test]
fn a_tail_longer_than_a_request_is_sent_in_runs_the_new_primary_takes() {
    let mut c = cluster(test_config());
    // 12 adjacent blocks written at once: all in the tails (none was answered
    // before the others started), longer than one request (8 blocks).
    fill(&mut c, 1, 12, 1, 1);
    n1_goes_down(&mut c);
    c.settle_without(NodeId(1));
    assert_eq!(c.engines[&NodeId(2)].blocks_reconciled(), 12);
    let epoch = c.engines[&NodeId(2)].map().extent(ExtentId(0)).epoch;
    c.client_sends(NodeId(2), write_at_epoch(70, 3, block(9, 1), epoch.0));
    c.settle_without(NodeId(1));
    assert!(c.replies.contains(&Message::WriteOk { req: RequestId(70) }));
}

#[test]
fn a_retry_of_a_write_a_write_back_undid_is_applied_again() {
    // Write 50 (block 5, tag 7) reaches only n3; n2 takes over and writes its own
    // copy of block 5 back over it, at a version newer than write 50's.
    let mut c = unacked_write_then_failover(NodeId(3));
    c.settle_without(NodeId(1));
    assert_eq!(c.disk_block(NodeId(3), 5), Some(1));
    // n2 goes down too; n3 leads. The client retries write 50 there: n3
    // remembers applying it, but the block's data is older than it now, so it
    // must be applied again, not answered as done.
    goes_down(&mut c, NodeId(2));
    c.settle_without(NodeId(1));
    let epoch = c.engines[&NodeId(3)].map().extent(ExtentId(0)).epoch;
    c.replies.clear();
    c.client_sends(NodeId(3), write_at_epoch(50, 5, block(7, 1), epoch.0));
    c.settle_without(NodeId(1));
    assert_eq!(c.replies, vec![Message::WriteOk { req: RequestId(50) }]);
    assert_eq!(
        c.disk_block(NodeId(3), 5),
        Some(7),
        "acknowledged, not applied"
    );
}
