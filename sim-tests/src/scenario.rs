//! Scenario specs: the cluster, the fabric and a fio-like workload, read from TOML.
//! Every field has a default; unknown keys are errors, so a typo cannot pass silently.

use serde::Deserialize;

/// Time from the cluster's start to the workload's: the nodes elect a leader
/// and hand out leases. Node events count from the cluster's start, operations
/// from the workload's.
pub const WARMUP: std::time::Duration = std::time::Duration::from_millis(30);

/// The scenario `cargo xtask sim` runs when given none.
pub const DEFAULT_SCENARIO: &str = include_str!("../scenarios/default.toml");

/// A whole scenario.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Scenario {
    /// The cluster under test.
    pub cluster: ClusterSpec,
    /// What the clients do.
    pub workload: WorkloadSpec,
    /// The simulated network.
    pub fabric: FabricSpec,
    /// The hosts' CPUs and network stacks (storage nodes and clients alike).
    pub host: HostSpec,
    /// The storage nodes' devices.
    pub device: DeviceSpec,
    /// The storage nodes' I/O schedulers.
    pub sched: SchedSpec,
    /// More client hosts with workloads of their own (`[[extra_clients]]`).
    pub extra_clients: Vec<ExtraClients>,
    /// Named volumes carved from the pool, with their QoS (`[[volumes]]`); the
    /// workload and each client group use one by name, or the whole pool.
    pub volumes: Vec<VolumeSpecToml>,
    /// Admission of client requests at the primaries (dmClock QoS).
    pub qos: QosSpec,
    /// The congestion response (`[flow]`): clients' read windows, and rebuild
    /// copies bounded by each peer's window; off by default.
    pub flow: weir_core::flow::FlowConfig,
    /// Faults injected into the fabric, drawn from the seed.
    pub faults: FaultSpec,
    /// Deliberate bugs, to prove the checkers can fail.
    pub bugs: BugSpec,
    /// Snapshots of a thin named volume taken while the faults happen
    /// (`[snapshots]`); off by default.
    pub snapshots: SnapshotSpec,
}

/// The snapshot stage: a writer on a thin named volume of its own (at the
/// pool's end), snapshots taken while it writes (at the plan's crashes too),
/// a clone written, a snapshot deleted and an extent trimmed; every read of
/// the volume, its snapshots and the clone is checked against the writes.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SnapshotSpec {
    /// Snapshots taken (0: no snapshot stage).
    pub rounds: u32,
    /// The volume's extents.
    pub extents: u64,
}

/// Fabric faults of a run. Times and links are drawn from the run's seed.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FaultSpec {
    /// Per-packet loss probability on every link.
    pub link_loss: f64,
    /// Per-packet corruption probability on every link (the receiver's ICRC check
    /// drops what is damaged).
    pub link_corrupt: f64,
    /// Links taken down at random times during the workload, each for a random
    /// 10%..100% of `flap_down_us`.
    pub link_flaps: u32,
    /// Longest link outage, microseconds.
    pub flap_down_us: u64,
    /// Storage nodes that crash (and stay down) at random times in the first half
    /// of the run; at most replicas - 1.
    pub node_crashes: u32,
    /// The first crash takes the initial Raft leader (the first node).
    pub crash_leader: bool,
    /// Storage devices that hang at a random time in the first half of the run, each
    /// for 25%..100% of `hang_ms`. Primaries drop the stalled replica after their
    /// replica timeout; past the device timeout the node stops heartbeating, so its
    /// own extents fail over too.
    pub device_hangs: u32,
    /// Longest device hang, milliseconds.
    pub hang_ms: u64,
    /// Storage nodes that stall (a GC-like pause: no task runs, messages queue) at a
    /// random time in the first half of the run, each for 25%..100% of `pause_ms`.
    pub node_pauses: u32,
    /// Longest pause, milliseconds.
    pub pause_ms: u64,
    /// Storage nodes cut off from the network (every link of the node down) at a
    /// random time in the first half of the run, each for 25%..100% of
    /// `partition_ms`. Reliable transports deliver what was sent when it heals.
    pub partitions: u32,
    /// Longest partition, milliseconds.
    pub partition_ms: u64,
    /// Storage nodes that crash at a random time in the first half of the run and
    /// restart 25%..100% of `restart_ms` later, from what survived: their device
    /// and their durable Raft log.
    pub node_restarts: u32,
    /// Longest time a restarting node stays down, milliseconds.
    pub restart_ms: u64,
    /// Storage nodes that lose power at a random time in the first half of the
    /// run: the node crashes, its SSD's volatile cache (writes neither flushed nor
    /// FUA) is lost, and it restarts 25%..100% of `restart_ms` later.
    pub power_losses: u32,
    /// Storage nodes whose SSD stops being able to read 1 MiB of blocks (latent
    /// sector errors) at a random place and time in the first half of the run;
    /// reads there fail until the node repairs the blocks from a peer.
    pub media_errors: u32,
    /// Storage devices that disappear at a random time in the first half of the
    /// run (every command fails): the node stays up but stops heartbeating, is
    /// declared down, and its replicas move to spares.
    pub device_losses: u32,
    /// Nodes that join during the run (`weir node add`): they run from the
    /// start as joining nodes (ids after the first members') and are added at
    /// a random time in the first half; they take the replicas of leaving
    /// nodes and the places of nodes given up on.
    pub node_adds: u32,
    /// Members removed during the run (`weir node remove`), at a random time in
    /// the first half, each a node no other fault strikes: their replicas move
    /// to other nodes, their vote to another node, and they leave the cluster.
    pub node_removals: u32,
}

impl FaultSpec {
    /// Storage nodes some node fault hits (each takes a node of its own).
    pub fn faulty_nodes(&self) -> u64 {
        [
            self.node_crashes,
            self.node_pauses,
            self.partitions,
            self.device_hangs,
            self.node_restarts,
            self.power_losses,
            self.media_errors,
            self.device_losses,
        ]
        .iter()
        .map(|&n| u64::from(n))
        .sum()
    }
}

impl Default for FaultSpec {
    fn default() -> Self {
        FaultSpec {
            link_loss: 0.0,
            link_corrupt: 0.0,
            link_flaps: 0,
            flap_down_us: 500,
            node_crashes: 0,
            crash_leader: false,
            device_hangs: 0,
            hang_ms: 200,
            node_pauses: 0,
            pause_ms: 300,
            partitions: 0,
            partition_ms: 300,
            node_restarts: 0,
            power_losses: 0,
            media_errors: 0,
            device_losses: 0,
            restart_ms: 200,
            node_adds: 0,
            node_removals: 0,
        }
    }
}

/// Cluster shape.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSpec {
    /// Storage nodes.
    pub nodes: u32,
    /// Replicas per extent.
    pub replicas: u32,
    /// Volume block size in bytes (512 or 4096).
    pub block_size: u32,
    /// Volume size in MiB.
    pub volume_mib: u64,
    /// Extent size in MiB.
    pub extent_mib: u64,
    /// A node down this long (simulated ms) is replaced: its replicas move to
    /// spares, if the cluster has nodes beyond the replica count. 0: never.
    pub replace_after_ms: u64,
    /// Background scrub rate of each node, MiB/s (reads the blocks it holds, to
    /// find media errors nobody reads). 0: off.
    pub scrub_mib_per_sec: u64,
    /// How often each node checkpoints its block versions (simulated ms), so a
    /// restarted node is sent only the blocks written since. 0: never.
    pub checkpoint_ms: u64,
    /// Each node's clock is off the true time by up to this much (drawn per node
    /// from the seed), microseconds. Leases keep a margin of twice this (plus the
    /// drift's share) before they end.
    pub clock_offset_max_us: u64,
    /// ... and runs fast or slow by up to this much, parts per million.
    pub clock_drift_max_ppm: u64,
    /// A replica silent this long on a write is dropped from the in-sync set
    /// (simulated ms).
    pub replica_timeout_ms: u64,
    /// A device command outstanding this long means the device stalled: the node
    /// stops heartbeating and its extents fail over (simulated ms).
    pub device_timeout_ms: u64,
    /// Version grain in KiB: the run of blocks a node keeps one version for (see
    /// `weir_core::replication::grains`). 0: the default (256 KiB).
    pub version_grain_kib: u64,
    /// Each node snapshots its map and compacts its Raft log every this many
    /// applied entries (0: never). Far below the daemon's 1,024 by default, so a
    /// run's few dozen commands compact the log and a node that was away installs
    /// the leader's snapshot.
    pub raft_snapshot_entries: u64,
}

impl ClusterSpec {
    /// The bound on the nodes' clocks that lease margins are derived from.
    pub fn clock_bound(&self) -> weir_core::time::ClockBound {
        weir_core::time::ClockBound {
            offset_max_ns: self.clock_offset_max_us * 1000,
            drift_max_ppm: self.clock_drift_max_ppm,
        }
    }
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            nodes: 3,
            replicas: 3,
            block_size: 4096,
            volume_mib: 4096,
            extent_mib: 64,
            replace_after_ms: 200,
            scrub_mib_per_sec: 0,
            checkpoint_ms: 20,
            clock_offset_max_us: weir_core::time::ClockBound::DEFAULT.offset_max_ns / 1000,
            clock_drift_max_ppm: weir_core::time::ClockBound::DEFAULT.drift_max_ppm,
            replica_timeout_ms: 100,
            device_timeout_ms: 100,
            version_grain_kib: 0,
            raft_snapshot_entries: 8,
        }
    }
}

/// Access pattern.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Uniformly random, request-aligned offsets.
    Random,
    /// Each worker streams through its own region.
    Sequential,
    /// Each client streams through its own region, its workers sharing one
    /// cursor: one sequential stream at the client's queue depth (fio's
    /// sequential job with an iodepth), so neighbouring requests are in flight
    /// together.
    Stream,
}

/// A fio-like workload.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WorkloadSpec {
    /// Random or sequential.
    pub pattern: Pattern,
    /// Percent of requests that are reads.
    pub read_percent: u32,
    /// Bytes per request.
    pub block_size: u32,
    /// Outstanding requests per client.
    pub queue_depth: u32,
    /// Client hosts.
    pub clients: u32,
    /// Simulated run time in milliseconds.
    pub duration_ms: u64,
    /// The named volume (`[[volumes]]`) its clients use; empty: the whole pool.
    pub volume: String,
    /// How every client host of the run (the `[[extra_clients]]` too)
    /// reaches its volume.
    pub path: ClientPath,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            pattern: Pattern::Random,
            read_percent: 70,
            block_size: 4096,
            queue_depth: 32,
            clients: 2,
            duration_ms: 200,
            volume: String::new(),
            path: ClientPath::FrontEnd,
        }
    }
}

/// More client hosts beside the workload's, with a workload of their own: an
/// ingest stream beside analytics reads, or bursts of clients that switch on at
/// random times.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ExtraClients {
    /// Client hosts.
    pub clients: u32,
    /// Random or sequential.
    pub pattern: Pattern,
    /// Percent of requests that are reads.
    pub read_percent: u32,
    /// Bytes per request.
    pub block_size: u32,
    /// Outstanding requests per client.
    pub queue_depth: u32,
    /// Each client starts at a random time up to this long after the workload
    /// (drawn from the seed), milliseconds; 0: with the rest.
    pub start_spread_ms: u64,
    /// Each client runs this long, milliseconds; 0: to the workload's end.
    pub run_ms: u64,
    /// The named volume (`[[volumes]]`) its clients use; empty: the whole pool.
    pub volume: String,
}

impl Default for ExtraClients {
    fn default() -> Self {
        ExtraClients {
            clients: 1,
            pattern: Pattern::Sequential,
            read_percent: 0,
            block_size: 131072,
            queue_depth: 8,
            start_spread_ms: 0,
            run_ms: 0,
            volume: String::new(),
        }
    }
}

mod campaign;
mod choices;
mod volumes;

pub use choices::{ClientPath, Cnp, Dcqcn, Driver, NetworkStack, Transport};
pub use volumes::{QosSpec, VolumeSpecToml, REST_VOLUME};

impl Scenario {
    /// Storage hosts: the first members and the nodes that join.
    pub fn storage_hosts(&self) -> u32 {
        self.cluster.nodes + self.faults.node_adds
    }

    /// Client hosts in all.
    pub fn client_hosts(&self) -> u32 {
        self.workload.clients
            + self.extra_clients.iter().map(|e| e.clients).sum::<u32>()
            + u32::from(self.snapshots.rounds > 0)
    }
}

/// Fabric parameters: a star of RoCE v2 hosts on one switch.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FabricSpec {
    /// Link rate, Gb/s.
    pub link_gbps: u64,
    /// One-way link propagation delay, ns.
    pub link_delay_ns: u64,
    /// Packet payload size.
    pub mtu_bytes: u32,
    /// "roce" (lossless, PFC + DCQCN), "rdma" (the same fabric, frames carried
    /// by RDMA's messenger: connections, credits, granted regions), or the lossy
    /// TCP baseline: "tcp-reno", "tcp-dctcp", "tcp-cubic" (no PFC, no DCQCN,
    /// ECN at K).
    pub transport: Transport,
    /// DCQCN reaction-point preset: "hpcc", "paper", "connectx", or "off".
    pub dcqcn: Dcqcn,
    /// CNP generation: "per-qp" (at most one per QP per 50 us) or "per-packet".
    pub cnp: Cnp,
    /// Limit each QP's unacknowledged bytes to the path's bandwidth-delay product.
    pub bdp_window: bool,
    /// Switch shared buffer, MiB.
    pub buffer_mib: u64,
    /// PFC on the data class.
    pub pfc: bool,
    /// Bytes a host's NIC queues towards one peer before `send` refuses frames to
    /// it (back-pressure to the node's flow owner), KiB.
    pub send_queue_kib: u64,
    /// Also mark ECN on every data packet a switch sends while its shared buffer
    /// is at least this full, percent (deployments mark at 70%); 0: off, RED on
    /// the egress queue's length only.
    pub ecn_buffer_pct: u32,
    /// NIC ports per host, 1 or 2. With 2 each host has two paths to every
    /// other (port k to port k); with "rdma" the messenger spreads its peers
    /// over them and moves a connection whose path fails to the other (a link
    /// flap then takes one port of a host). Other transports pin each pair to
    /// a path by hash and wait for a failed one to come back.
    pub ports_per_host: u32,
}

impl FabricSpec {
    /// Whether the fabric is RoCE's (lossless, PFC and DCQCN), with or without
    /// RDMA's messenger.
    pub fn lossless(&self) -> bool {
        self.transport.lossless()
    }
}

impl Default for FabricSpec {
    fn default() -> Self {
        FabricSpec {
            link_gbps: 100,
            link_delay_ns: 1000,
            mtu_bytes: 4096,
            transport: Transport::Roce,
            dcqcn: Dcqcn::Hpcc,
            cnp: Cnp::PerQp,
            bdp_window: false,
            buffer_mib: 32,
            pfc: true,
            send_queue_kib: 64 << 10,
            ecn_buffer_pct: 0,
            ports_per_host: 1,
        }
    }
}

/// The hosts' CPU and network stack: every storage node and every client host has
/// this CPU, and every message and device command costs time on it (see
/// `weir_host_sim`). With `network_stack = "none"` and `device.driver = "none"`
/// hosts cost nothing.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HostSpec {
    /// Cores per host.
    pub cores: u32,
    /// Core clock, GHz.
    pub clock_ghz: f64,
    /// Two NUMA nodes per host (the NIC on the first).
    pub numa: bool,
    /// "none" (free), "kernel-tcp" or "rdma".
    pub network_stack: NetworkStack,
}

impl HostSpec {
    /// Whether hosts cost anything at all.
    pub fn modelled(&self, device: &DeviceSpec) -> bool {
        self.network_stack != NetworkStack::None || device.driver != Driver::None
    }
}

impl Default for HostSpec {
    fn default() -> Self {
        HostSpec {
            cores: 16,
            clock_ghz: 3.4,
            numa: false,
            network_stack: NetworkStack::None,
        }
    }
}

/// The storage nodes' devices.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DeviceSpec {
    /// NVMe driver: "none" (free), "kernel" (interrupts) or "polled" (a
    /// user-space driver on a dedicated polling core).
    pub driver: Driver,
    /// SSDs per storage node, striped into one namespace (RAID 0, 512 KiB
    /// stripes), each with its own controller, flash and host link.
    pub ssds: u32,
}

impl Default for DeviceSpec {
    fn default() -> Self {
        DeviceSpec {
            driver: Driver::None,
            ssds: 1,
        }
    }
}

/// The I/O scheduler of every storage node's device (weir-core's
/// `sched::IoQueue`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SchedSpec {
    /// Merge waiting requests that continue one another into one command.
    pub merge: bool,
    /// Split requests at the device's optimal I/O boundary (the stripe of
    /// striped SSDs; a single simulated SSD has none).
    pub split: bool,
    /// Commands in flight per device queue, at most (0: the device's queue
    /// depth, 1024); past it requests wait in weir, where they can merge.
    pub depth: u32,
    /// Requests (pieces) waiting, at most; past it a request fails as busy.
    pub waiting_max: usize,
    /// Background work (rebuild copies, the scrubber) waits behind clients'
    /// requests, at most two commands of it on the device, keeping one command
    /// in eight while both wait.
    pub classes: bool,
    /// With classes: clients' weight against each background class's (7).
    pub foreground_weight: u32,
    /// With classes: the rebuild's weight (1) and reservation (commands per
    /// second it is owed before any weight; 0: none).
    pub rebuild_weight: u32,
    /// See `rebuild_weight`.
    pub rebuild_reservation: u32,
}

impl Default for SchedSpec {
    fn default() -> Self {
        let cfg = weir_core::sched::SchedConfig::default();
        SchedSpec {
            merge: cfg.merge,
            split: cfg.split,
            depth: cfg.depth_per_queue,
            waiting_max: cfg.waiting_max,
            classes: cfg.classes,
            foreground_weight: cfg.shares.foreground_weight,
            rebuild_weight: cfg.shares.rebuild.weight,
            rebuild_reservation: cfg.shares.rebuild.reservation,
        }
    }
}

impl SchedSpec {
    /// The scheduler's settings.
    pub fn config(&self) -> weir_core::sched::SchedConfig {
        weir_core::sched::SchedConfig {
            merge: self.merge,
            split: self.split,
            depth_per_queue: self.depth,
            waiting_max: self.waiting_max,
            classes: self.classes,
            shares: weir_core::sched::ClassShares {
                foreground_weight: self.foreground_weight,
                rebuild: weir_core::sched::Share {
                    weight: self.rebuild_weight,
                    reservation: self.rebuild_reservation,
                },
                ..Default::default()
            },
        }
    }
}

/// Test-only deliberate bugs.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BugSpec {
    /// Primaries skip forwarding writes to the last replica of each extent.
    pub skip_last_replica: bool,
    /// Primaries acknowledge once all but the slowest in-sync replica persisted.
    pub ack_before_slowest: bool,
    /// A new primary serves without waiting for the old primary's lease.
    pub serve_before_lease: bool,
    /// A rebuild leaves out the extent's newest block.
    pub rebuild_one_short: bool,
    /// Replicas take writes from an older epoch.
    pub accept_stale_epoch: bool,
    /// Primaries serve to their lease's end by their own clock, with no margin for
    /// the clocks' disagreement.
    pub ignore_lease_margin: bool,
    /// A front end writes once into a frozen extent in place, into the
    /// snapshot.
    pub leak_into_snapshot: bool,
    /// Clients give a request up at its first refusal or missed reply,
    /// instead of retrying within their request bound.
    pub give_up_at_once: bool,
}

/// A scenario that cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The TOML does not parse or has unknown keys.
    #[error("scenario {source_name}: {error}")]
    Parse {
        /// File name or "default".
        source_name: String,
        /// What is wrong, with its key and position.
        error: toml::de::Error,
    },
    /// A value is out of range.
    #[error("scenario {source_name}: `{key}` {why}")]
    Invalid {
        /// File name or "default".
        source_name: String,
        /// The offending key.
        key: &'static str,
        /// What is wrong with it.
        why: String,
    },
}

impl Scenario {
    /// Parse and validate `text`; `source_name` names it in errors.
    pub fn parse(text: &str, source_name: &str) -> Result<Scenario, ScenarioError> {
        let scenario: Scenario = toml::from_str(text).map_err(|error| ScenarioError::Parse {
            source_name: source_name.to_string(),
            error,
        })?;
        scenario.checked(source_name)
    }

    /// `self`, if it is valid; `source_name` names it in errors.
    pub fn checked(self, source_name: &str) -> Result<Scenario, ScenarioError> {
        self.validate()
            .map_err(|(key, why)| ScenarioError::Invalid {
                source_name: source_name.to_string(),
                key,
                why,
            })?;
        Ok(self)
    }

    /// The embedded default scenario.
    pub fn default_scenario() -> Scenario {
        Scenario::parse(DEFAULT_SCENARIO, "default").expect("the embedded scenario is valid")
    }

    fn validate(&self) -> Result<(), (&'static str, String)> {
        let c = &self.cluster;
        let w = &self.workload;
        let bad = |key, why: &str| Err((key, why.to_string()));
        if c.replicas == 0 || c.replicas > c.nodes {
            return bad("cluster.replicas", "must be between 1 and cluster.nodes");
        }
        if c.nodes > 64 {
            return bad("cluster.nodes", "must be at most 64");
        }
        if !matches!(c.block_size, 512 | 4096) {
            return bad("cluster.block_size", "must be 512 or 4096");
        }
        if c.volume_mib == 0 || c.volume_mib > 1 << 20 {
            return bad(
                "cluster.volume_mib",
                "must be between 1 and 1048576 (1 TiB)",
            );
        }
        if c.extent_mib == 0 || c.extent_mib > c.volume_mib {
            return bad(
                "cluster.extent_mib",
                "must be between 1 and the volume size",
            );
        }
        self.validate_clients()?;
        self.validate_volumes()?;
        if let Err((key, why)) = self.flow.check() {
            return bad(key, why);
        }
        if self.sched.depth > 1024 {
            return bad("sched.depth", "must be at most 1024 (0: the device's)");
        }
        if let Err(why) = self.sched.config().shares.check() {
            return bad(
                "sched.foreground_weight, rebuild_weight, rebuild_reservation",
                why,
            );
        }
        if !(1..=1 << 20).contains(&self.sched.waiting_max) {
            return bad("sched.waiting_max", "must be between 1 and 1048576");
        }
        if w.duration_ms == 0 || w.duration_ms > 60_000 {
            return bad("workload.duration_ms", "must be between 1 and 60000");
        }
        self.validate_fabric()?;
        self.validate_host()?;
        self.validate_faults()
    }

    /// Check `[workload]`'s clients and `[[extra_clients]]`.
    fn validate_clients(&self) -> Result<(), (&'static str, String)> {
        let (c, w) = (&self.cluster, &self.workload);
        let bad = |key, why: &str| Err((key, why.to_string()));
        if w.read_percent > 100 {
            return bad("workload.read_percent", "must be at most 100");
        }
        // Tags number the blocks of one request in a byte.
        if w.block_size == 0
            || !w.block_size.is_multiple_of(c.block_size)
            || w.block_size / c.block_size > 256
            || u64::from(w.block_size) > c.volume_mib << 20
        {
            return bad(
                "workload.block_size",
                "must be 1 to 256 times cluster.block_size, and fit in the volume",
            );
        }
        if w.queue_depth == 0 || w.queue_depth > 1024 {
            return bad("workload.queue_depth", "must be between 1 and 1024");
        }
        if w.clients == 0 || w.clients > 256 {
            return bad("workload.clients", "must be between 1 and 256");
        }
        for e in &self.extra_clients {
            if e.read_percent > 100
                || e.queue_depth == 0
                || e.queue_depth > 1024
                || e.block_size == 0
                || !e.block_size.is_multiple_of(c.block_size)
                || e.block_size / c.block_size > 256
                || u64::from(e.block_size) > c.volume_mib << 20
            {
                return bad(
                    "extra_clients",
                    "read_percent at most 100, queue_depth 1 to 1024, block_size 1 to 256 \
                     times cluster.block_size",
                );
            }
            if e.start_spread_ms > 60_000 || e.run_ms > 60_000 {
                return bad("extra_clients", "start_spread_ms and run_ms at most 60000");
            }
        }
        if self.client_hosts() > 256 {
            return bad("extra_clients.clients", "at most 256 client hosts in all");
        }
        Ok(())
    }

    /// Check `[fabric]` and the cluster's timing settings.
    fn validate_fabric(&self) -> Result<(), (&'static str, String)> {
        let c = &self.cluster;
        let bad = |key, why: &str| Err((key, why.to_string()));
        let f = &self.fabric;
        if f.link_gbps == 0 || f.link_gbps > 1600 {
            return bad("fabric.link_gbps", "must be between 1 and 1600");
        }
        if !matches!(f.mtu_bytes, 1024 | 2048 | 4096) {
            return bad("fabric.mtu_bytes", "must be 1024, 2048 or 4096");
        }
        if !matches!(f.ports_per_host, 1 | 2) {
            return bad("fabric.ports_per_host", "must be 1 or 2");
        }
        if c.replace_after_ms != 0 && !(151..=3_600_000).contains(&c.replace_after_ms) {
            return bad(
                "cluster.replace_after_ms",
                "must be 0 or above the 150 ms lease (at most an hour)",
            );
        }
        if c.clock_offset_max_us > 20_000 || c.clock_drift_max_ppm > 1000 {
            // The lease is 150 ms: clocks 40 ms apart would leave it little.
            return bad(
                "cluster.clock_offset_max_us",
                "clocks at most 20000 us off and 1000 ppm fast or slow",
            );
        }
        if c.replica_timeout_ms == 0 || c.device_timeout_ms == 0 {
            return bad(
                "cluster.replica_timeout_ms",
                "replica and device timeouts must be above 0",
            );
        }
        if c.version_grain_kib > 1 << 20 {
            return bad(
                "cluster.version_grain_kib",
                "must be at most 1048576 (1 GiB)",
            );
        }
        if c.raft_snapshot_entries > 1 << 20 {
            return bad("cluster.raft_snapshot_entries", "must be at most 1048576");
        }
        if c.checkpoint_ms > 60_000 {
            return bad("cluster.checkpoint_ms", "must be at most 60000");
        }
        if c.scrub_mib_per_sec > 100_000 {
            return bad("cluster.scrub_mib_per_sec", "must be at most 100000");
        }
        if f.ecn_buffer_pct > 100 {
            return bad("fabric.ecn_buffer_pct", "must be between 0 (off) and 100");
        }
        Ok(())
    }

    /// Check `[host]` and `[device]`.
    fn validate_host(&self) -> Result<(), (&'static str, String)> {
        let bad = |key, why: &str| Err((key, why.to_string()));
        let h = &self.host;
        if h.cores == 0 || h.cores > 256 {
            return bad("host.cores", "must be between 1 and 256");
        }
        if !(0.1..=10.0).contains(&h.clock_ghz) {
            return bad("host.clock_ghz", "must be between 0.1 and 10");
        }
        if h.numa && h.cores < 2 {
            return bad("host.numa", "two NUMA nodes need at least two cores");
        }
        if self.device.ssds == 0 || self.device.ssds > 32 {
            return bad("device.ssds", "must be between 1 and 32");
        }
        if self.device.driver == Driver::Polled && h.cores < 2 {
            return bad(
                "host.cores",
                "a polled driver takes a core of its own: at least 2 cores",
            );
        }
        Ok(())
    }

    /// Check `[faults]` (and the fabric's buffers, which its faults fill).
    fn validate_faults(&self) -> Result<(), (&'static str, String)> {
        let f = &self.fabric;
        let c = &self.cluster;
        let bad = |key, why: &str| Err((key, why.to_string()));
        let x = &self.faults;
        if !(0.0..0.5).contains(&x.link_loss) || !(0.0..0.5).contains(&x.link_corrupt) {
            return bad("faults.link_loss/link_corrupt", "must be in [0, 0.5)");
        }
        if x.link_flaps > 10_000 {
            return bad("faults.link_flaps", "must be at most 10000");
        }
        if x.link_flaps > 0 && x.flap_down_us == 0 {
            return bad("faults.flap_down_us", "must be > 0 when links flap");
        }
        if f.buffer_mib == 0 || f.buffer_mib > 1024 {
            return bad("fabric.buffer_mib", "must be between 1 and 1024");
        }
        if f.send_queue_kib << 10 < u64::from(f.mtu_bytes) || f.send_queue_kib > 1 << 20 {
            return bad("fabric.send_queue_kib", "must be between one MTU and 1 GiB");
        }
        // The promise holds while fewer than `replicas` copies fail: each node fault
        // takes a different node.
        if x.faulty_nodes() >= u64::from(c.replicas) {
            return bad(
                "faults.node_crashes/node_pauses/partitions/device_hangs/node_restarts/power_losses/media_errors/device_losses",
                "together must be fewer than cluster.replicas",
            );
        }
        if x.node_adds > 4 {
            return bad("faults.node_adds", "must be at most 4");
        }
        // The nodes that stay hold every copy, and each removal takes a node no
        // other fault strikes.
        if u64::from(c.nodes + x.node_adds) < u64::from(x.node_removals) + u64::from(c.replicas)
            || x.faulty_nodes() + u64::from(x.node_removals) > u64::from(c.nodes)
        {
            return bad(
                "faults.node_removals",
                "must leave cluster.replicas nodes (with those added), each a node no other fault strikes",
            );
        }
        if (x.node_pauses > 0 && x.pause_ms == 0) || (x.partitions > 0 && x.partition_ms == 0) {
            return bad("faults.pause_ms/partition_ms", "must be > 0 when used");
        }
        if x.node_restarts + x.power_losses > 0 && x.restart_ms == 0 {
            return bad("faults.restart_ms", "must be > 0 when nodes restart");
        }
        if x.pause_ms > 10_000
            || x.partition_ms > 10_000
            || x.hang_ms > 10_000
            || x.restart_ms > 10_000
        {
            return bad(
                "faults.pause_ms/partition_ms/hang_ms/restart_ms",
                "must be at most 10000",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_scenario_parses() {
        let s = Scenario::default_scenario();
        assert_eq!(s, Scenario::default());
    }

    #[test]
    fn bad_scenarios_name_the_key() {
        let err = Scenario::parse("[workload]\nqueue_dept = 3\n", "x.toml").unwrap_err();
        assert!(err.to_string().contains("queue_dept"), "{err}");
        let err = Scenario::parse("[cluster]\nreplicas = 4\n", "x.toml").unwrap_err();
        assert!(err.to_string().contains("cluster.replicas"), "{err}");
        let err = Scenario::parse("[workload]\nblock_size = 1000\n", "x.toml").unwrap_err();
        assert!(err.to_string().contains("workload.block_size"), "{err}");
    }
}
