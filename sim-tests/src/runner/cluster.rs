//! Stage 1 of a run: the simulated cluster. The fabric, the map, every storage
//! node (a simulated SSD, a durable Raft log and block-version checkpoints that
//! survive its crashes, a clock of its own), the client and checker hosts; it is
//! given [`WARMUP`] to elect a leader and hand out leases.

use super::attach::Demux;
use super::plan::Host;
use super::{CHECKER_HOST, FIRST_CLIENT, WARMUP};
use crate::scenario::{Cnp, Dcqcn, Driver, NetworkStack, Scenario, Transport};
use madsim::rand::{thread_rng, Rng};
use madsim::runtime::Handle;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use weir_core::client::ClientOptions;
use weir_core::control::state::{ClusterState, Command};
use weir_core::control::Timeouts;
use weir_core::front_end::front_end_of;
use weir_core::map::{ClusterMap, VolumeSpec};
use weir_core::named::Control;
use weir_core::named::NamedVolumes;
use weir_core::node::boot::{boot_with_front_end, Durable, NodeSettings, Stored};
use weir_core::node::{AuditLog, EventLog, Events, NodeHandle};
use weir_core::replication::ReplicationConfig;
use weir_core::splice::Spliced;
use weir_core::time::Skew;
use weir_core::{BufPool, NodeId, VolumeId};
use weir_nvme_sim::{SimSsd, SsdConfig};
use weir_transport_sim::congestion::dcqcn::CnpMode;
use weir_transport_sim::congestion::tcp::Algorithm;
use weir_transport_sim::fabric::config::Topology;
use weir_transport_sim::{Fabric, FabricConfig, SimTransport};

/// Events a run keeps (every node's, and the faults'): the report lists them all,
/// and a run far past this would be too long to read anyway.
const SIM_EVENTS_MAX: usize = 1 << 20;
/// Each node's buffer budget for device reads.
const NODE_POOL_BYTES: usize = 256 << 20;

/// A running cluster and what its stages share.
pub(super) struct Cluster {
    /// The fabric.
    pub(super) fabric: Arc<Fabric>,
    /// The map every node started with.
    pub(super) map: ClusterMap,
    /// The nodes' replication settings.
    pub(super) config: ReplicationConfig,
    /// Every storage host.
    pub(super) hosts: Vec<Host>,
    /// Every node's events (times from [`Cluster::start`]).
    pub(super) events: EventLog,
    /// Every node's audit facts, for the invariant checkers.
    pub(super) audit: AuditLog,
    /// Each node's clock.
    pub(super) skews: Vec<(NodeId, Skew)>,
    /// The read-back's host.
    pub(super) checker: Arc<SimTransport>,
    /// The clients' hosts.
    pub(super) clients: Vec<Arc<SimTransport>>,
    /// The CPU of every storage node and client host, when hosts are modelled.
    pub(super) cpus: HostCpus,
    /// When the cluster started.
    pub(super) start: Instant,
    /// Each storage node's handle (its latest incarnation's): the clients'
    /// front ends and the operator ask the nodes for map changes through them.
    pub(super) handles: Handles,
    /// The counts of every node's incarnations that a restart replaced.
    pub(super) retired: Arc<Mutex<NodeCounts>>,
    /// Each storage node's front end (its latest incarnation's).
    pub(super) fronts: Fronts,
}

/// A storage node's own front end, which the client hosts reach over the
/// fabric (see [`super::attach`]).
pub(super) type SharedFrontEnd = Arc<NamedVolumes<Spliced<Demux>>>;
/// The storage nodes' front ends, by node.
pub(super) type Fronts = Arc<Mutex<std::collections::BTreeMap<NodeId, SharedFrontEnd>>>;

/// What nodes counted: their flow owners', device schedulers' and
/// admission gates' figures, from their reports.
#[derive(Clone, Debug, Default)]
pub(super) struct NodeCounts {
    /// Flow counts (nodes' only: the clients' read windows are the
    /// workload's).
    pub(super) flow: weir_core::flow::FlowTotals,
    /// The device schedulers'.
    pub(super) sched: weir_core::sched::SchedStats,
    /// The admission gates', every volume together (`waiting` not kept).
    pub(super) admission: weir_core::sched::VolumeAdmitStats,
    /// Replica writes that took their payload from their node's front end,
    /// and ones that found none there.
    pub(super) payloads: (u64, u64),
}

impl NodeCounts {
    /// Add what `report` says its node counted.
    pub(super) fn add(&mut self, report: &weir_core::node::NodeReport) {
        self.flow.add_node(&report.flow, report.writes_waited);
        self.sched.add(&report.sched);
        for (_, a) in &report.admission {
            self.admission.add(a);
        }
        self.admission.waiting = 0;
        self.payloads.0 += report.front_end_payloads.0;
        self.payloads.1 += report.front_end_payloads.1;
    }
}

impl Cluster {
    /// What every node counted so far: its incarnations replaced by a
    /// restart (as of their last report: a crash loses at most a tick's
    /// counts) and its latest one.
    pub(super) fn node_counts(&self) -> NodeCounts {
        let mut counts = self.retired.lock().expect("retired counts").clone();
        for handle in self.handles.lock().expect("handles").values() {
            counts.add(&handle.report());
        }
        counts
    }
}

/// The storage nodes' handles, by node.
pub(super) type Handles = Arc<Mutex<std::collections::BTreeMap<NodeId, NodeHandle>>>;

impl Cluster {
    /// Build and start the cluster of `scenario`, then wait out the warm-up.
    pub(super) async fn start(scenario: &Scenario) -> Cluster {
        let start = Instant::now();
        let fabric = Fabric::current();
        fabric
            .configure(fabric_config(scenario))
            .expect("validated scenario");
        if scenario.fabric.transport == Transport::Rdma {
            let rdma = weir_transport_rdma::proto::Config {
                queue_bytes: (scenario.fabric.send_queue_kib << 10) as usize,
                ..Default::default()
            };
            fabric
                .enable_messenger(rdma)
                .expect("valid messenger settings");
        }
        let map = build_map(scenario);
        let config = replication_config(scenario);
        let events: EventLog = Arc::new(Mutex::new(Events::with_capacity(SIM_EVENTS_MAX)));
        let audit: AuditLog = Arc::default();
        let mut skews = Vec::new();
        let mut cpus = Vec::new();
        let handles = Handles::default();
        let retired: Arc<Mutex<NodeCounts>> = Arc::default();
        let fronts = Fronts::default();
        let hosts = start_nodes(
            &fabric,
            (&map, config),
            scenario,
            (&events, start),
            (&audit, &handles, &retired, &fronts),
            (&mut skews, &mut cpus),
        );
        // Every host attaches before traffic starts.
        let checker = Arc::new(fabric.endpoint(NodeId(CHECKER_HOST)).expect("new host"));
        let clients = (0..scenario.client_hosts())
            .map(|c| {
                let id = NodeId(FIRST_CLIENT + c);
                let transport = Arc::new(fabric.endpoint(id).expect("new host"));
                if let Some(cpu) = host_cpu(&fabric, id, scenario, 0) {
                    cpus.push((Role::Client, cpu));
                }
                transport
            })
            .collect();
        // The cluster comes up before clients connect: a Raft leader, the map, and
        // a lease on every node (a few heartbeat ticks).
        tokio::time::sleep(WARMUP).await;
        Cluster {
            fabric,
            map,
            config,
            hosts,
            events,
            audit,
            skews,
            checker,
            clients,
            cpus,
            start,
            handles,
            retired,
            fronts,
        }
    }
}

/// The simulator's control port, which the clients' front ends ask for map
/// changes and read the map from: the latest map any node applied, and the
/// leader that map's node knows of (else the first member, not leaving,
/// that knows a leader and takes the request: a removed node may still take
/// one, and drop it).
pub(super) struct Nodes(pub(super) Handles);

impl Nodes {
    fn handles(&self) -> std::collections::BTreeMap<NodeId, NodeHandle> {
        self.0.lock().expect("handles").clone()
    }
}

impl Control for Nodes {
    fn state(&self) -> Arc<ClusterState> {
        self.handles()
            .values()
            .map(|h| h.state())
            .max_by_key(|s| s.applied)
            .unwrap_or_default()
    }

    fn request(&self, command: Command) -> bool {
        let handles = self.handles();
        let Some(latest) = handles.values().max_by_key(|h| h.state().applied) else {
            return false;
        };
        let state = latest.state();
        if let Some(leader) = latest.report().leader.and_then(|l| handles.get(&l)) {
            if leader.request(command.clone()) {
                return true;
            }
        }
        handles
            .iter()
            .filter(|(n, _)| state.nodes.contains_key(n) && !state.leaving.contains(n))
            .filter(|(_, h)| h.report().leader.is_some())
            .any(|(_, h)| h.request(command.clone()))
    }
}

/// What a host is, for CPU figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Role {
    /// A storage node.
    Storage,
    /// A client (compute) host.
    Client,
}

/// A host's CPU, shared by its NIC's stack and its devices.
pub(super) type SharedCpu = Arc<Mutex<weir_host_sim::Cpu>>;
/// Every modelled host's CPU, with its role.
pub(super) type HostCpus = Vec<(Role, SharedCpu)>;

/// The network stack of a scenario's hosts, if they pay for one.
fn net_stack(s: &Scenario) -> Option<weir_host_sim::NetStack> {
    use weir_host_sim::profile::{KernelTcp, Rdma};
    match s.host.network_stack {
        NetworkStack::KernelTcp => Some(weir_host_sim::NetStack::KernelTcp(KernelTcp::LINUX)),
        NetworkStack::Rdma => Some(weir_host_sim::NetStack::Rdma(Rdma::VERBS)),
        NetworkStack::None => None,
    }
}

/// The storage nodes' NVMe driver, if it costs CPU.
fn nvme_driver(s: &Scenario) -> Option<weir_host_sim::NvmeDriver> {
    use weir_host_sim::profile::{KernelNvme, PolledNvme};
    match s.device.driver {
        Driver::Kernel => Some(weir_host_sim::NvmeDriver::Kernel(KernelNvme::LINUX)),
        Driver::Polled => Some(weir_host_sim::NvmeDriver::Polled(PolledNvme::SPDK)),
        Driver::None => None,
    }
}

/// Host `id`'s CPU (with `poll_cores` polling cores), attached to its network
/// stack; none when the scenario models no host cost.
fn host_cpu(fabric: &Fabric, id: NodeId, s: &Scenario, poll_cores: u32) -> Option<SharedCpu> {
    if !s.host.modelled(&s.device) {
        return None;
    }
    let spec = weir_host_sim::HostSpec {
        cores: s.host.cores,
        clock_mhz: (s.host.clock_ghz * 1000.0).round() as u32,
        numa: s.host.numa,
        remote_cost_pct: weir_host_sim::profile::NUMA_REMOTE_COST_PCT,
        poll_cores,
    };
    let cpu = weir_host_sim::Cpu::new(spec, weir_host_sim::profile::REFERENCE_MHZ)
        .expect("validated scenario");
    let cpu = Arc::new(Mutex::new(cpu));
    if let Some(net) = net_stack(s) {
        fabric
            .attach_stack(id, cpu.clone(), net)
            .expect("attached host");
    }
    Some(cpu)
}

/// The nodes' replication settings: the scenario's, with its bug switches.
fn replication_config(scenario: &Scenario) -> ReplicationConfig {
    ReplicationConfig {
        bugs_asked: weir_core::replication::Bugs {
            skip_last_replica: scenario.bugs.skip_last_replica,
            ack_before_slowest: scenario.bugs.ack_before_slowest,
            serve_before_lease: scenario.bugs.serve_before_lease,
            rebuild_one_short: scenario.bugs.rebuild_one_short,
            accept_stale_epoch: scenario.bugs.accept_stale_epoch,
            ignore_lease_margin: scenario.bugs.ignore_lease_margin,
        },
        lease_margin_ns: scenario
            .cluster
            .clock_bound()
            .lease_margin_ns(timeouts(scenario).lease_ns),
        replica_timeout_ns: scenario.cluster.replica_timeout_ms * 1_000_000,
        audit: true,
        rebuild_bytes_per_sec: 0,
        scrub_bytes_per_sec: scenario.cluster.scrub_mib_per_sec << 20,
        checkpoint_every_ns: scenario.cluster.checkpoint_ms * 1_000_000,
        version_grain_bytes: scenario.cluster.version_grain_kib << 10,
        // As the daemon's: a node takes the payloads its own front end holds.
        front_end_payloads: true,
    }
}

/// The fabric of a scenario: a star with a slot for every node, client and the
/// checker, RoCE v2 with the scenario's DCQCN, CNP and PFC choices.
fn fabric_config(scenario: &Scenario) -> FabricConfig {
    let f = &scenario.fabric;
    let rate_bps = f.link_gbps * 1_000_000_000;
    let mut config = match f.transport {
        Transport::TcpReno => FabricConfig::tcp(rate_bps, Algorithm::Reno),
        Transport::TcpDctcp => FabricConfig::tcp(rate_bps, Algorithm::Dctcp),
        Transport::TcpCubic => FabricConfig::tcp(rate_bps, Algorithm::Cubic),
        Transport::Roce | Transport::Rdma => FabricConfig::at_rate(rate_bps),
    };
    // Every storage node and its front end, every client host, the checker.
    let hosts = 2 * scenario.storage_hosts() + scenario.client_hosts() + 1;
    config.topology = Topology::Star {
        hosts: hosts as usize,
    };
    config.ports_per_host = f.ports_per_host as usize;
    config.host_link.delay_ns = f.link_delay_ns;
    config.nic.mtu_bytes = f.mtu_bytes;
    if f.transport == Transport::Rdma {
        // RC's retry count as deployments set it (the largest): a QP gives up
        // after 7 retransmission timeouts without progress, and its error
        // completions reach the messenger.
        config.nic.retry_limit = Some(7);
    }
    config.nic.send_queue_bytes_max = f.send_queue_kib << 10;
    if let Some(tcp) = &mut config.tcp {
        tcp.params.mss = u64::from(f.mtu_bytes);
        config.switch.buffer_bytes = f.buffer_mib << 20;
        config.switch.ecn_buffer_pct = f.ecn_buffer_pct;
        config.seed = thread_rng().gen();
        return config;
    }
    // The reaction point with the switches' ECN marking it was tuned with.
    if f.dcqcn == Dcqcn::Off {
        config.nic.dcqcn = None;
    } else {
        let known = config.set_dcqcn_preset(f.dcqcn.as_str());
        assert!(known, "the fabric knows every preset of the scenario's");
    }
    config.nic.cnp = match f.cnp {
        Cnp::PerPacket => CnpMode::PerPacket { min_gap_ns: 0 },
        Cnp::PerQp => CnpMode::PerQpInterval {
            interval_ns: 50_000,
        },
    };
    config.nic.bdp_window = f.bdp_window;
    config.switch.buffer_bytes = f.buffer_mib << 20;
    config.switch.ecn_buffer_pct = f.ecn_buffer_pct;
    config.switch.pfc.enabled = f.pfc;
    config.seed = thread_rng().gen();
    config
}

fn build_map(scenario: &Scenario) -> ClusterMap {
    let c = &scenario.cluster;
    let bs = u64::from(c.block_size);
    let volume = VolumeSpec {
        id: VolumeId(1),
        block_size: c.block_size,
        capacity_blocks: (c.volume_mib << 20) / bs,
        extent_blocks: (c.extent_mib << 20) / bs,
        max_request_blocks: (1 << 20) / c.block_size,
    };
    let nodes = (1..=c.nodes).map(NodeId).collect();
    let mut map =
        ClusterMap::new_static(nodes, volume, c.replicas as usize).expect("validated scenario");
    // The named volumes, in order, each its share of the pool's extents (the
    // map hands them out in that order, from the first).
    for (v, (first, share)) in scenario.volumes.iter().zip(scenario.volume_extents()) {
        debug_assert_eq!(first, map.state().next_free_extent);
        let qos = if scenario.qos.enabled {
            v.qos()
        } else {
            weir_core::control::qos::Qos::default()
        };
        let create = weir_core::control::Command::CreateNamed {
            name: v.name.clone(),
            size_bytes: share * (c.extent_mib << 20),
            extents: share,
            qos,
            key_check: None,
            thin: false,
        };
        map = map.with_named(&create).expect("validated scenario");
    }
    // The rest of the workload's part of the pool is a thick volume of its
    // own, so every block a client writes is in a named volume (and with a
    // snapshot stage, the stage's thin volume takes its extents from the part
    // kept for it, at the pool's end).
    let first = map.state().next_free_extent;
    let rest = scenario.pool_extents().saturating_sub(first);
    if rest > 0 {
        let extent_bytes = c.extent_mib << 20;
        let create = weir_core::control::Command::CreateNamed {
            name: crate::scenario::REST_VOLUME.into(),
            size_bytes: (rest * extent_bytes).min((c.volume_mib << 20) - first * extent_bytes),
            extents: rest,
            qos: weir_core::control::qos::Qos::default(),
            key_check: None,
            thin: false,
        };
        map = map.with_named(&create).expect("validated scenario");
    }
    map
}

/// Control-plane tick.
const TICK: Duration = Duration::from_millis(10);
/// Leases and failure detection: a node silent for 100 ms is declared down; its
/// extents' new primaries serve once its 150 ms lease has run out; it is replaced
/// after the scenario's `replace_after_ms`.
fn timeouts(s: &Scenario) -> Timeouts {
    Timeouts {
        lease_ns: 150_000_000,
        detect_ns: 100_000_000,
        replace_ns: s.cluster.replace_after_ms * 1_000_000,
    }
}

/// The nodes of `s`, for [`boot`]: the map every node starts with and the
/// scenario's settings.
fn node_settings(s: &Scenario, map: &ClusterMap, config: ReplicationConfig) -> NodeSettings {
    NodeSettings {
        map: map.clone(),
        replicas: s.cluster.replicas as u8,
        replication: config,
        timeouts: timeouts(s),
        tick: TICK,
        device_timeout: Duration::from_millis(s.cluster.device_timeout_ms),
        sched: s.sched.config(),
        flow: s.flow,
        admit: weir_core::sched::AdmitConfig {
            depth: s.qos.depth,
            ..weir_core::sched::AdmitConfig::default()
        },
        snapshot_entries: Some(s.cluster.raft_snapshot_entries),
    }
}

/// Start every storage node (data path, control plane and its own front
/// end): the map's members, then the nodes that join later (which know the
/// first members, not the map); returns the madsim node of each, for crash
/// faults.
fn start_nodes(
    fabric: &Arc<Fabric>,
    (map, config): (&ClusterMap, ReplicationConfig),
    s: &Scenario,
    (events, cluster_start): (&EventLog, Instant),
    (audit, handles, retired, fronts): (&AuditLog, &Handles, &Arc<Mutex<NodeCounts>>, &Fronts),
    (skews, cpus): (&mut Vec<(NodeId, Skew)>, &mut HostCpus),
) -> Vec<Host> {
    let settings = node_settings(s, map, config);
    let options = front_end_options(s);
    let mut hosts = Vec::new();
    let bound = s.cluster.clock_bound();
    let since_ns = weir_core::time::cluster_ns();
    for id in (1..=s.storage_hosts()).map(NodeId) {
        let transport = Arc::new(fabric.endpoint(id).expect("new host"));
        let front_transport = Arc::new(fabric.endpoint(front_end_of(id)).expect("new host"));
        // The node's clock, the same in every incarnation (it is the host's).
        let skew = node_clock(&bound, since_ns);
        skews.push((id, skew));
        let ssd = node_ssd(fabric, id, s, cpus);
        // The front end runs on its node's CPU.
        if let (Some((_, cpu)), Some(net)) = (cpus.last(), net_stack(s)) {
            fabric
                .attach_stack(front_end_of(id), cpu.clone(), net)
                .expect("attached host");
        }
        let kit = Arc::new(NodeKit {
            id,
            endpoints: (transport, front_transport),
            ssd: ssd.clone(),
            // What survives a crash: the device, the durable Raft log and the
            // block-version checkpoints.
            stores: (MemLog::default(), MemLog::default()),
            skew,
            settings: (settings.clone(), options.clone()),
            logs: (events.clone(), audit.clone(), cluster_start),
            shared: (handles.clone(), retired.clone(), fronts.clone()),
        });
        // Run at start and again at every restart.
        let host = Handle::current()
            .create_node()
            .name(format!("node-{}", id.0))
            .init(move || kit.incarnation())
            .build();
        hosts.push((id, host.id(), ssd));
    }
    hosts
}

/// What a storage node's incarnations share: the host's (its endpoints, SSD,
/// durable stores and clock), the node's settings, and the run's logs and
/// tables of nodes.
struct NodeKit {
    id: NodeId,
    /// The node's endpoint and its front end's.
    endpoints: (Arc<SimTransport>, Arc<SimTransport>),
    ssd: Arc<SimSsd>,
    /// The Raft log and the block-version checkpoints.
    stores: (MemLog, MemLog),
    skew: Skew,
    settings: (NodeSettings, ClientOptions),
    logs: (EventLog, AuditLog, Instant),
    shared: (Handles, Arc<Mutex<NodeCounts>>, Fronts),
}

impl NodeKit {
    /// A new incarnation of the node from what survived, with a new front end.
    fn incarnation(&self) -> impl std::future::Future<Output = ()> {
        let id = self.id;
        // A restarted host's queue pairs are new (a no-op without RDMA's
        // messenger, and at the first start).
        Fabric::current().reboot(id);
        Fabric::current().reboot(front_end_of(id));
        let durable = Durable {
            raft: self.stores.0.stored(),
            versions: self.stores.1.stored(),
            device: format!("sim-ssd-{id}"),
        };
        let (front_net, requests) = Demux::front_end(self.endpoints.1.clone());
        let adapters = (
            (Demux::node(self.endpoints.0.clone()), front_net.clone()),
            self.ssd.clone(),
            BufPool::new(NODE_POOL_BYTES),
        );
        let (settings, options) = &self.settings;
        let (events, audit, cluster_start) = &self.logs;
        let seed: u64 = thread_rng().gen();
        let (node, parts, _) =
            boot_with_front_end(settings, adapters, durable, events.clone(), seed)
                .expect("a validated scenario's node boots");
        let mut node = node
            .with_events_since(*cluster_start)
            .with_skew(self.skew)
            .with_audit(audit.clone());
        let handle = node.handle();
        let (handles, retired, fronts) = &self.shared;
        let old = handles.lock().expect("handles").insert(id, handle.clone());
        if let Some(old) = old {
            retired.lock().expect("retired counts").add(&old.report());
        }
        let (map, options, fronts) = (settings.map.clone(), options.clone(), fronts.clone());
        let start = *cluster_start;
        // The front end's incarnation from the node's seed: no draw of its own,
        // so the fault plans drawn after the cluster starts stay as they were.
        let incarnation = (seed >> 32) as u32;
        async move {
            let front = parts.open(map, Arc::new(handle), (incarnation, options));
            fronts
                .lock()
                .expect("fronts")
                .insert(id, front.named.clone());
            tokio::spawn(super::attach::serve(
                front.named,
                (front_net, requests),
                start,
            ));
            if let Err(e) = node.run().await {
                tracing::error!(error = %e, "node stopped");
            }
        }
    }
}

/// A front end's options (a node's, or a host's with `workload.path =
/// "library"`): the scenario's flow settings, and the client library's
/// default request bound (a client host's attempt at a node's front end ends
/// sooner, see [`super::attach::ATTEMPT`]), or none with the
/// `give_up_at_once` bug (a front end that gives up at the first refusal or
/// timeout).
pub(super) fn front_end_options(s: &Scenario) -> ClientOptions {
    let request_timeout = if s.bugs.give_up_at_once {
        Duration::ZERO
    } else {
        ClientOptions::default().request_timeout
    };
    ClientOptions {
        flow: s.flow,
        request_timeout,
        ..ClientOptions::default()
    }
}

/// A node's clock within `bound` of the cluster's, from `since_ns`.
fn node_clock(bound: &weir_core::time::ClockBound, since_ns: u64) -> Skew {
    let skew = Skew {
        offset_ns: thread_rng()
            .gen_range(-(bound.offset_max_ns as i64)..=bound.offset_max_ns as i64),
        drift_ppm: thread_rng()
            .gen_range(-(bound.drift_max_ppm as i64)..=bound.drift_max_ppm as i64),
        since_ns,
        offset_max_ns: bound.offset_max_ns,
    };
    assert!(skew.within(bound));
    skew
}

/// Storage node `id`'s SSD, on its host's CPU (added to `cpus`) when hosts
/// are modelled.
fn node_ssd(fabric: &Fabric, id: NodeId, s: &Scenario, cpus: &mut HostCpus) -> Arc<SimSsd> {
    let ssd = SsdConfig {
        block_size: s.cluster.block_size,
        drives: s.device.ssds,
        ..SsdConfig::default()
    };
    let mut ssd = SimSsd::new(ssd, thread_rng().gen()).expect("valid SSD config");
    let driver = nvme_driver(s);
    let poll_cores = u32::from(matches!(driver, Some(weir_host_sim::NvmeDriver::Polled(_))));
    if let Some(cpu) = host_cpu(fabric, id, s, poll_cores) {
        if let Some(driver) = driver {
            ssd = ssd.with_host(weir_nvme_sim::DeviceHost {
                cpu: cpu.clone(),
                driver,
                epoch: fabric.epoch(),
                // With two NUMA nodes the SSD hangs off the second, the NIC
                // off the first: the polling core (the host's last) is local.
                numa_node: u8::from(s.host.numa),
                poller: 0,
            });
        }
        cpus.push((Role::Storage, cpu));
    }
    Arc::new(ssd)
}

/// A node's durable Raft log, or its block-version checkpoints, in the simulator:
/// they survive the node's crashes.
#[derive(Clone, Debug, Default)]
struct MemLog(Arc<Mutex<Vec<u8>>>);

impl MemLog {
    /// This store for a new incarnation, with what it holds.
    fn stored(&self) -> Stored {
        Stored {
            store: Box::new(self.clone()),
            bytes: self.0.lock().expect("durable file").clone(),
        }
    }
}

impl weir_core::node::LogStore for MemLog {
    fn append(&mut self, record: &[u8]) -> std::io::Result<()> {
        self.0
            .lock()
            .expect("durable file")
            .extend_from_slice(record);
        Ok(())
    }

    fn replace(&mut self, record: &[u8]) -> std::io::Result<()> {
        *self.0.lock().expect("durable file") = record.to_vec();
        Ok(())
    }

    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        self.0.lock().expect("durable file").truncate(len as usize);
        Ok(())
    }
}
