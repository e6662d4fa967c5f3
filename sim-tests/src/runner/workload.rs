//! Stage 3 of a run: the workload. Each client host (the workload's, then the
//! `[[extra_clients]]`) reaches the named volumes through the storage nodes'
//! own front ends (weir-core's `NamedVolumes` in each node, which NBD's
//! requests go through in the daemon), over the fabric (see
//! [`super::attach`]: one path per node, the host's first the node after the
//! previous host's), or with `workload.path = "library"` through weir-core's
//! front end on the host itself, and runs
//! `queue_depth` workers from its start until its stop (by default the
//! workload's deadline), each recording every operation it invokes (and when
//! it completed, if it did) for the history. Every request goes to a named
//! volume: a client of a `[[volumes]]` volume uses that volume, a client of
//! none uses the pool's (each block through the volume that holds it,
//! `pool-rest` where no `[[volumes]]` does). The history keeps pool block
//! numbers, so the checkers and the read-back see one address space.

use super::attach::Paths;
use super::cluster::Cluster;
use crate::history::{decode_block, encode_block, OpKind, OpRecord, Tag, Value};
use crate::scenario::{ClientPath, Pattern, Scenario};
use bytes::Bytes;
use madsim::rand::{thread_rng, Rng};
use madsim::runtime::Handle;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use weir_core::client::Volume;
use weir_core::flow::ReadFlowStats;
use weir_core::map::ClusterMap;
use weir_core::named::{NamedVolumes, Target};
use weir_transport_sim::SimTransport;

/// What one client host does: its workload, its first worker's index among all
/// the run's workers, and when it starts and stops.
#[derive(Clone, Debug)]
struct ClientPlan {
    pattern: Pattern,
    read_percent: u32,
    block_size: u32,
    queue_depth: u32,
    first_worker: u64,
    start: Instant,
    stop: Instant,
    /// The blocks it uses: its volume's (first block, blocks), or the pool's.
    range: (u64, u64),
}

/// The blocks of named volume `name` (first, count) of `scenario`, whose pool
/// holds `capacity` blocks; for no name, the pool's (but for what the
/// snapshot stage keeps).
fn range_of(scenario: &Scenario, capacity: u64, name: &str) -> (u64, u64) {
    let pool = capacity.min(scenario.unreserved_blocks());
    scenario
        .volume_ranges()
        .into_iter()
        .find(|(n, ..)| n == name)
        .map_or((0, pool), |(_, first, blocks)| (first, blocks))
}

/// Every client's plan: the workload's clients for the whole run, then each
/// `[[extra_clients]]` group's, starting and stopping as it says.
fn plans(scenario: &Scenario, capacity: u64, epoch: Instant, deadline: Instant) -> Vec<ClientPlan> {
    let w = &scenario.workload;
    let mut plans = Vec::new();
    let mut first_worker = 0u64;
    for _ in 0..w.clients {
        plans.push(ClientPlan {
            pattern: w.pattern,
            read_percent: w.read_percent,
            block_size: w.block_size,
            queue_depth: w.queue_depth,
            first_worker,
            start: epoch,
            stop: deadline,
            range: range_of(scenario, capacity, &w.volume),
        });
        first_worker += u64::from(w.queue_depth);
    }
    for e in &scenario.extra_clients {
        for _ in 0..e.clients {
            let delay_ms = match e.start_spread_ms {
                0 => 0,
                spread => thread_rng().gen_range(0..spread),
            };
            let start = (epoch + Duration::from_millis(delay_ms)).min(deadline);
            let stop = match e.run_ms {
                0 => deadline,
                run => (start + Duration::from_millis(run)).min(deadline),
            };
            plans.push(ClientPlan {
                pattern: e.pattern,
                read_percent: e.read_percent,
                block_size: e.block_size,
                queue_depth: e.queue_depth,
                first_worker,
                start,
                stop,
                range: range_of(scenario, capacity, &e.volume),
            });
            first_worker += u64::from(e.queue_depth);
        }
    }
    plans
}

/// Run every client from `epoch` for the workload's duration; returns every
/// operation, in completion order (operations that never completed last),
/// the requests the clients' front ends sent to each named volume, and each
/// client's read window's counts.
pub(super) async fn drive(
    cluster: &Cluster,
    scenario: &Scenario,
    epoch: Instant,
) -> (Vec<OpRecord>, FrontEndCounts, Vec<ReadFlowStats>) {
    let deadline = epoch + Duration::from_millis(scenario.workload.duration_ms);
    let capacity = cluster.map.volume().capacity_blocks;
    let plans = plans(scenario, capacity, epoch, deadline);
    let workers: u64 = plans.iter().map(|p| u64::from(p.queue_depth)).sum();
    let nodes = cluster.map.nodes().to_vec();
    let mut clients = Vec::new();
    for ((c, transport), plan) in cluster.clients.iter().cloned().enumerate().zip(plans) {
        let c = c as u32;
        let (map, spec, nodes) = (cluster.map.clone(), scenario.clone(), nodes.clone());
        let (start, handles) = (cluster.start, cluster.handles.clone());
        let host = Handle::current()
            .create_node()
            .name(format!("client-{c}"))
            .build();
        clients.push(host.spawn(async move {
            // Only later starters wait: a madsim sleep waits at least 1 ms.
            if plan.start > Instant::now() {
                weir_core::time::sleep_until_exact(plan.start).await;
            }
            let way = match spec.workload.path {
                ClientPath::FrontEnd => {
                    let paths = (nodes, c as usize);
                    let give_up = spec.bugs.give_up_at_once;
                    Way::Paths(Paths::open(transport, paths, give_up, start))
                }
                ClientPath::Library => Way::Library(library(transport, &map, handles, &spec)),
            };
            let front = FrontEnd::open(way, map);
            let ops = run_client(front.clone(), spec, (c as u16, plan, workers), epoch).await;
            let (moved, reads) = match &front.way {
                Way::Paths(p) => (p.moved.load(Ordering::Relaxed), None),
                Way::Library(named) => (0, named.pool().read_flow()),
            };
            (ops, front.requests(), (moved, reads))
        }));
    }
    let mut ops = Vec::new();
    let mut requests = BTreeMap::new();
    let mut moved = 0;
    let mut reads = Vec::new();
    for client in clients {
        let (done, sent, (m, read)) = client.await.expect("client task");
        ops.extend(done);
        moved += m;
        reads.extend(read);
        for (volume, n) in sent {
            *requests.entry(volume).or_insert(0) += n;
        }
    }
    // The nodes' front ends' windows, counted once the workload is done.
    reads.splice(0..0, read_windows(cluster));
    ops.sort_by_key(|o| (o.complete_ns.unwrap_or(u64::MAX), o.invoke_ns, o.client));
    let front_end = FrontEndCounts {
        requests: requests.into_iter().collect(),
        moved,
    };
    (ops, front_end, reads)
}

/// What the client hosts counted: requests by named volume, and attempts
/// sent again on another path.
pub(super) struct FrontEndCounts {
    pub(super) requests: Vec<(String, u64)>,
    pub(super) moved: u64,
}

/// The read windows' counts of the nodes' front ends (their latest
/// incarnations': a crash loses what its front end counted).
fn read_windows(cluster: &Cluster) -> Vec<ReadFlowStats> {
    let fronts = cluster.fronts.lock().expect("fronts");
    fronts
        .values()
        .map(|f| f.pool().read_flow().unwrap_or_default())
        .collect()
}

/// How a client host reaches the volumes.
enum Way {
    /// Through the nodes' front ends.
    Paths(Arc<Paths>),
    /// Through weir-core's front end on the host.
    Library(NamedVolumes<SimTransport>),
}

/// weir-core's front end on a client host: its pool client on `transport`
/// over `map`, asking the nodes of `handles` for map changes.
fn library(
    transport: Arc<SimTransport>,
    map: &ClusterMap,
    handles: super::cluster::Handles,
    spec: &Scenario,
) -> NamedVolumes<SimTransport> {
    let options = super::cluster::front_end_options(spec);
    let pool = *map.volume();
    let volume = Volume::open_with(transport, map.clone(), thread_rng().gen(), options);
    let control = Arc::new(super::cluster::Nodes(handles));
    let extent_bytes = pool.extent_blocks * u64::from(pool.block_size);
    NamedVolumes::new(volume, control, extent_bytes)
}

impl Way {
    async fn read(&self, volume: &Target, at: u64, len: u64) -> Result<Bytes, String> {
        match self {
            Way::Paths(p) => p.read(volume, at, len).await,
            Way::Library(n) => n.read(volume, at, len).await.map_err(|e| e.to_string()),
        }
    }

    async fn write(&self, volume: &Target, at: u64, data: Bytes) -> Result<(), String> {
        match self {
            Way::Paths(p) => p.write(volume, at, data).await,
            Way::Library(n) => n
                .write(volume, at, data, false)
                .await
                .map_err(|e| e.to_string()),
        }
    }
}

/// A client host's way to the volumes, and where each pool extent lies in
/// the named volumes.
struct FrontEnd {
    way: Way,
    /// Each pool extent's volume and index in it, from the first map (the
    /// workload's volumes are thick: an extent of theirs never moves).
    owner: BTreeMap<u64, (Target, u64)>,
    /// Blocks per extent, and bytes per block.
    extent_blocks: u64,
    block_bytes: u64,
    /// Requests sent to each volume.
    sent: Mutex<BTreeMap<String, u64>>,
}

impl FrontEnd {
    /// The host's front end over `way`, with the extents of `map`'s named
    /// volumes.
    fn open(way: Way, map: ClusterMap) -> Arc<FrontEnd> {
        let owner = map
            .state()
            .named
            .iter()
            .flat_map(|(name, v)| {
                v.alloc.iter().map(|(&index, &extent)| {
                    let target = Target {
                        name: name.clone(),
                        snap: None,
                        id: Some(v.id),
                    };
                    (extent.0, (target, index))
                })
            })
            .collect();
        let pool = *map.volume();
        Arc::new(FrontEnd {
            way,
            owner,
            extent_blocks: pool.extent_blocks,
            block_bytes: u64::from(pool.block_size),
            sent: Mutex::default(),
        })
    }

    /// Requests sent to each volume so far.
    fn requests(&self) -> BTreeMap<String, u64> {
        self.sent.lock().expect("counts").clone()
    }

    /// Pool blocks `[lba, lba + blocks)` as runs within one extent each: the
    /// volume, the run's byte offset in it, and its blocks.
    fn parts(&self, lba: u64, blocks: u64) -> Vec<(&Target, u64, u64)> {
        let mut parts = Vec::new();
        let (mut at, end) = (lba, lba + blocks);
        while at < end {
            let (extent, off) = (at / self.extent_blocks, at % self.extent_blocks);
            let n = (self.extent_blocks - off).min(end - at);
            let (target, index) = self
                .owner
                .get(&extent)
                .expect("every block a client uses is in a named volume");
            let byte = (index * self.extent_blocks + off) * self.block_bytes;
            parts.push((target, byte, n));
            at += n;
        }
        let mut sent = self.sent.lock().expect("counts");
        for (target, ..) in &parts {
            *sent.entry(target.name.clone()).or_insert(0) += 1;
        }
        parts
    }

    async fn read(&self, lba: u64, blocks: u64) -> Result<Bytes, String> {
        let reads = self
            .parts(lba, blocks)
            .into_iter()
            .map(|(target, at, n)| self.way.read(target, at, n * self.block_bytes));
        let mut out = Vec::with_capacity((blocks * self.block_bytes) as usize);
        for data in futures_util::future::join_all(reads).await {
            let data: Bytes = data?;
            out.extend_from_slice(&data);
        }
        Ok(Bytes::from(out))
    }

    async fn write(&self, lba: u64, data: Bytes) -> Result<(), String> {
        let mut from = 0usize;
        let writes = self
            .parts(lba, data.len() as u64 / self.block_bytes)
            .into_iter()
            .map(|(target, at, n)| {
                let len = (n * self.block_bytes) as usize;
                let piece = data.slice(from..from + len);
                from += len;
                self.way.write(target, at, piece)
            })
            .collect::<Vec<_>>();
        futures_util::future::join_all(writes)
            .await
            .into_iter()
            .collect()
    }
}

async fn run_client(
    volume: Arc<FrontEnd>,
    spec: Scenario,
    (client, plan, workers): (u16, ClientPlan, u64),
    epoch: Instant,
) -> Vec<OpRecord> {
    let seq = Arc::new(AtomicU64::new(0));
    let stream = Arc::new(AtomicU64::new(0));
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for w in 0..plan.queue_depth {
        let (volume, spec, seq, log) = (volume.clone(), spec.clone(), seq.clone(), log.clone());
        let stream = stream.clone();
        let plan = plan.clone();
        tasks.push(tokio::spawn(async move {
            let stop = plan.stop;
            let worker = Worker {
                volume,
                block_size: spec.cluster.block_size,
                me: plan.first_worker + u64::from(w),
                workers,
                plan,
                client,
                seq,
                stream,
                epoch,
            };
            worker.run(stop, log).await
        }));
    }
    for t in tasks {
        t.await.expect("worker task");
    }
    let mut log = log.lock().expect("log lock");
    std::mem::take(&mut *log)
}

struct Worker {
    volume: Arc<FrontEnd>,
    /// The volume's block size.
    block_size: u32,
    plan: ClientPlan,
    /// This worker's index among all the run's workers, and how many there are.
    me: u64,
    workers: u64,
    client: u16,
    seq: Arc<AtomicU64>,
    /// The client's stream cursor (`Pattern::Stream`).
    stream: Arc<AtomicU64>,
    epoch: Instant,
}

impl Worker {
    fn now_ns(&self) -> u64 {
        (Instant::now() - self.epoch).as_nanos() as u64
    }

    async fn run(self, deadline: Instant, log: Arc<Mutex<Vec<OpRecord>>>) {
        let w = &self.plan;
        let bs = u64::from(self.block_size);
        let req_blocks = u64::from(w.block_size) / bs;
        let (base, capacity) = w.range;
        let slots = capacity / req_blocks;
        // Sequential workers each stream through a region of their own.
        let (me, workers) = (self.me, self.workers);
        let region = (slots / workers).max(1);
        let mut cursor = 0u64;
        while Instant::now() < deadline {
            let slot = match w.pattern {
                Pattern::Random => thread_rng().gen_range(0..slots),
                Pattern::Sequential => {
                    cursor += 1;
                    (me * region + cursor % region) % slots
                }
                Pattern::Stream => {
                    // The client's region: its workers' share of the volume.
                    let qd = u64::from(w.queue_depth);
                    let start = slots * w.first_worker / workers;
                    let len = (slots * qd / workers).max(1);
                    let n = self.stream.fetch_add(1, Ordering::Relaxed);
                    (start + n % len) % slots
                }
            };
            let lba = base + slot * req_blocks;
            let is_read = thread_rng().gen_range(0..100) < w.read_percent;
            let record = if is_read {
                self.read(lba, req_blocks).await
            } else {
                self.write(lba, req_blocks, bs as usize).await
            };
            log.lock().expect("log lock").push(record);
        }
    }

    async fn read(&self, lba: u64, blocks: u64) -> OpRecord {
        let invoke_ns = self.now_ns();
        let result = self.volume.read(lba, blocks).await;
        let complete_ns = self.now_ns();
        let bs = self.volume.block_bytes as usize;
        let (values, complete_ns, error) = match result {
            Ok(data) => {
                let values = data
                    .chunks_exact(bs)
                    .enumerate()
                    .map(|(i, b)| decode_block(b, lba + i as u64))
                    .collect();
                (values, Some(complete_ns), None)
            }
            Err(e) => {
                tracing::warn!(lba, error = %e, "read failed");
                (Vec::new(), None, Some(e.to_string()))
            }
        };
        OpRecord {
            client: self.client,
            kind: OpKind::Read,
            lba,
            values,
            invoke_ns,
            complete_ns,
            error,
        }
    }

    async fn write(&self, lba: u64, blocks: u64, bs: usize) -> OpRecord {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let mut data = vec![0u8; blocks as usize * bs];
        let mut values = Vec::with_capacity(blocks as usize);
        for (i, block) in data.chunks_exact_mut(bs).enumerate() {
            let tag = Tag::new(self.client, seq, i as u8);
            encode_block(block, tag, lba + i as u64);
            values.push(Value::Tag(tag));
        }
        let invoke_ns = self.now_ns();
        let result = self.volume.write(lba, Bytes::from(data)).await;
        let (complete_ns, error) = match result {
            Ok(()) => (Some(self.now_ns()), None),
            Err(e) => {
                tracing::warn!(lba, error = %e, "write failed");
                (None, Some(e.to_string()))
            }
        };
        OpRecord {
            client: self.client,
            kind: OpKind::Write,
            lba,
            values,
            invoke_ns,
            complete_ns,
            error,
        }
    }
}
