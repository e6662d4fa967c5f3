//! Stage 4 of a run: the read-back. Once the cluster has healed (or the
//! liveness bound ran out, which is the liveness verdict), every written block is
//! read from every replica the final map counts as in sync.

use crate::checker::Verdict;
use crate::history::{decode_block, OpKind, OpRecord, ReplicaRead, Value};
use madsim::rand::{thread_rng, Rng};
use madsim::runtime::Handle;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use weir_core::client::{ClientError, Volume};
use weir_core::device::DevError;
use weir_core::error::WeirError;
use weir_core::map::ClusterMap;
use weir_core::{Lba, NodeId};
use weir_transport_sim::SimTransport;

/// Concurrent reads of the read-back.
const READBACK_PARALLEL: usize = 64;
/// Attempts of one read-back before the replica counts as unreadable (each waits
/// up to the client's call timeout).
const READBACK_ATTEMPTS_MAX: usize = 8;
/// How long the read-back waits for a replica to repair a block its device
/// cannot read. The replica repairs from its primary, and a primary new to an
/// extent answers only once the previous primary's lease (150 ms) has run out:
/// in campaign seed 384850325, ext12's primary moved at 271 ms and could answer
/// from 421 ms, 66 ms after the read-back began, which had given up at 40 ms.
const READBACK_REPAIR_PATIENCE: Duration = Duration::from_millis(500);
/// The pause between reads of a block that is being repaired.
const READBACK_REPAIR_PAUSE: Duration = Duration::from_millis(10);

/// How long after the workload and the last fault every replica on an up node must be back in sync.
const LIVENESS_BOUND: Duration = Duration::from_secs(2);

/// Wait until the cluster has healed (at most [`LIVENESS_BOUND`]): every `live`
/// node (alive with a device at the end) is up in the map, every other node is
/// down in it (campaign seeds 9073 and 9409 read back from a node that crashed
/// for good and that a leader without a quorum had not yet declared down), no up
/// node is still
/// rebuilding an extent, and every extent has `replicas` in-sync copies, or one on
/// every up node that stays (not leaving) where fewer are up (a spare replaced
/// every node down past the replacement timeout), and every `removed` node has
/// left the map (its replicas moved away) and no replica is still moving,
/// unless fewer up nodes stay than an extent has copies (weir then refuses or
/// holds the removal, and a move whose target went down waits for a spare).
async fn await_in_sync(
    volume: &Volume<SimTransport>,
    replicas: usize,
    (live, removed): (&[NodeId], &[NodeId]),
) -> Verdict {
    let start = Instant::now();
    loop {
        volume.refresh().await;
        let map = volume.map();
        let state = map.state();
        let behind = behind(state, replicas, (live, removed));
        let waited = Instant::now() - start;
        if behind.is_empty() || waited >= LIVENESS_BOUND {
            let violations = behind
                .into_iter()
                .map(|b| {
                    format!(
                        "{b} {} ms after the workload and the faults",
                        waited.as_millis()
                    )
                })
                .collect();
            return Verdict {
                name: "liveness",
                scope: format!(
                    "every extent back to {replicas} in-sync copies (or all up nodes that stay) {:.1} ms \
                     after the workload and the faults (bound {} ms)",
                    waited.as_secs_f64() * 1e3,
                    LIVENESS_BOUND.as_millis()
                ),
                violations,
            };
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What keeps `state` from being healed: extents short of `replicas` copies
/// in sync (or of all up nodes that stay), rebuilds and moves still running,
/// nodes `live` not up, lost nodes still up, nodes `removed` still members.
fn behind(
    state: &weir_core::control::ClusterState,
    replicas: usize,
    (live, removed): (&[NodeId], &[NodeId]),
) -> Vec<String> {
    use weir_core::control::NodeStatus;
    // Up nodes that may hold copies (a leaving node's go elsewhere).
    let staying = |n: &NodeId| !state.leaving.contains(n) && !removed.contains(n);
    let staying_up = state.up_nodes().into_iter().filter(staying).count();
    let want = replicas.min(staying_up);
    let mut behind: Vec<String> = state
        .extents
        .iter()
        .flat_map(|(id, e)| e.rebuilding.iter().map(move |n| (id, n)))
        .filter(|(_, n)| state.nodes.get(n) == Some(&NodeStatus::Up))
        .map(|(id, n)| format!("{n} still rebuilding {id}"))
        .collect();
    behind.extend(
        live.iter()
            .filter(|n| state.nodes.get(n) != Some(&NodeStatus::Up))
            .map(|n| format!("{n}, alive, is not up")),
    );
    // A node lost for good must be declared down: until it is, it stays in
    // the in-sync sets it was in, and the map does not say where the data is.
    behind.extend(
        state
            .nodes
            .iter()
            .filter(|(n, s)| **s == NodeStatus::Up && !live.contains(n) && !removed.contains(n))
            .map(|(n, _)| format!("{n}, lost for good, is still up")),
    );
    // A removal finishes where up nodes enough stay to take its copies;
    // with fewer (a node lost for good meanwhile), it waits for more.
    behind.extend(
        removed
            .iter()
            .filter(|n| state.nodes.contains_key(n) && staying_up >= replicas)
            .map(|n| {
                let (held, moving) = state.replicas_on(*n);
                format!("{n}, removed, is still a member ({held} replicas, {moving} moving)")
            }),
    );
    // A move finishes where up nodes enough stay; with fewer, one whose
    // target went down waits for a spare (campaign seed 689: n4 removed, its
    // replicas of ext3 and ext7 moving to n3, whose SSD then vanished, and n1
    // crashed for good, left n2 and n5 to stay, both replicas already).
    behind.extend(
        state
            .extents
            .iter()
            .filter(|(_, e)| e.moving.is_some() && staying_up >= replicas)
            .map(|(id, _)| format!("{id} is still moving")),
    );
    behind.extend(
        state
            .extents
            .iter()
            .filter(|(_, e)| e.in_sync.len() < want)
            .map(|(id, e)| format!("{id} has {} of {want} copies in sync", e.in_sync.len())),
    );
    behind
}

/// Block `lba` as `node`'s copy holds it; `None` if it never answers. A
/// slow answer (a TCP timeout, a flapping link) is retried up to
/// [`READBACK_ATTEMPTS_MAX`] times, and a media error for up to
/// [`READBACK_REPAIR_PATIENCE`] (the replica repairs the block from a peer
/// meanwhile).
async fn read_copy(volume: &Volume<SimTransport>, node: NodeId, lba: u64) -> Option<Value> {
    let repair_deadline = Instant::now() + READBACK_REPAIR_PATIENCE;
    let mut timeouts = 0;
    while timeouts < READBACK_ATTEMPTS_MAX {
        match volume.scrub_read(node, Lba(lba), 1).await {
            Ok(data) => return Some(decode_block(&data, lba)),
            Err(ClientError::Timeout(_)) => timeouts += 1,
            Err(ClientError::Weir(WeirError::Device(DevError::Media(_))))
                if Instant::now() < repair_deadline =>
            {
                tokio::time::sleep(READBACK_REPAIR_PAUSE).await;
            }
            Err(e) => {
                tracing::warn!(lba, %node, error = %e, "read-back failed");
                return None;
            }
        }
    }
    None
}

/// Wait for the cluster to heal ([`await_in_sync`]), then read every written block
/// from every replica that should hold it.
pub(super) async fn read_back(
    transport: Arc<SimTransport>,
    map: ClusterMap,
    ops: &[OpRecord],
    replicas: usize,
    (live, removed): (Vec<NodeId>, Vec<NodeId>),
) -> (Vec<ReplicaRead>, BTreeMap<u64, usize>, Verdict) {
    let written: BTreeSet<u64> = ops
        .iter()
        .filter(|o| o.kind == OpKind::Write)
        .flat_map(|o| o.lba..o.lba + o.values.len() as u64)
        .collect();
    let host = Handle::current().create_node().name("checker").build();
    host.spawn(async move {
        let volume = Volume::open(transport, map, thread_rng().gen());
        let liveness = await_in_sync(&volume, replicas, (&live, &removed)).await;
        // Read back from the replicas the final map counts as in sync: the ones that
        // must hold every acknowledged write.
        volume.refresh().await;
        let map = volume.map();
        let mut work: Vec<(u64, NodeId)> = Vec::new();
        let mut expected = BTreeMap::new();
        for &lba in &written {
            let ext = map.extent(map.extent_of(Lba(lba)));
            expected.insert(lba, ext.in_sync.len());
            for &node in &ext.in_sync {
                work.push((lba, node));
            }
        }
        let work = Arc::new(Mutex::new(work.into_iter()));
        let results = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        for _ in 0..READBACK_PARALLEL {
            let (volume, work, results) = (volume.clone(), work.clone(), results.clone());
            readers.push(tokio::spawn(async move {
                loop {
                    let next = work.lock().expect("work lock").next();
                    let Some((lba, node)) = next else { break };
                    let value = read_copy(&volume, node, lba).await;
                    results.lock().expect("results lock").push(ReplicaRead {
                        lba,
                        node: node.0,
                        value,
                    });
                }
            }));
        }
        for r in readers {
            r.await.expect("reader task");
        }
        let mut results = std::mem::take(&mut *results.lock().expect("results lock"));
        results.sort_by_key(|r| (r.lba, r.node));
        (results, expected, liveness)
    })
    .await
    .expect("checker task")
}
