//! The node's Prometheus metrics (text exposition at `/metrics`): NBD requests,
//! bytes and latency by command, and the node's view of its replicas, rebuilds,
//! device queue and the cluster, refreshed at each scrape.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::Mutex;
use std::time::Duration;
use weir_core::control::NodeStatus;
use weir_core::node::NodeReport;
use weir_core::NodeId;

/// A label naming an NBD command.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Op {
    /// read, write, flush, trim, write_zeroes.
    pub op: String,
}

/// Labels naming an NBD command and why it failed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Failure {
    /// read, write, flush, trim, write_zeroes.
    pub op: String,
    /// The error's kind (`weir_core::client::ClientError::kind`): gave_up
    /// for a request whose bound ran out, no_space, out_of_range, ...
    pub why: String,
}

/// A label naming what became of something: taken, missed.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    /// taken, missed.
    pub outcome: String,
}

/// A label naming a replica state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct State {
    /// primary, in_sync, rebuilding, out (a replica neither in sync nor rebuilding).
    pub state: String,
}

/// Label of a per-peer metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Peer {
    /// The peer's node id.
    pub peer: u32,
}

/// Label of a per-volume metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Vol {
    /// The volume's name (`(pool)`: requests outside every named volume).
    pub volume: String,
}

fn latency_histogram() -> Histogram {
    // 10 us to ~5 s.
    Histogram::new(exponential_buckets(10e-6, 2.0, 20))
}

/// Every metric of one node.
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<Op, Counter>,
    bytes: Family<Op, Counter>,
    errors: Family<Failure, Counter>,
    latency: Family<Op, Histogram, fn() -> Histogram>,
    replicas: Family<State, Gauge>,
    rebuild_done: Gauge,
    rebuild_total: Gauge,
    device_inflight: Gauge,
    device_healthy: Gauge,
    checkpoints: Gauge,
    version_bytes: Gauge,
    applied_records: Gauge,
    payload_copies: Gauge,
    payload_copies_beyond_receive: Gauge,
    /// Replica writes whose data came from this node's front end: (taken, missed).
    front_end_payloads: Family<Outcome, Gauge>,
    nodes_up: Gauge,
    leader: Gauge,
    volumes: Gauge,
    admin_refused: Counter,
    /// Per peer: the flow owner's counts and the transport's signals
    /// (`weir_core::flow`), as gauges set from the node's report.
    flow: [(&'static str, &'static str, Family<Peer, Gauge>); 11],
    /// The device's I/O scheduler (`weir_core::sched`), set from the report.
    sched: [(&'static str, &'static str, Gauge); 6],
    /// Per volume: dmClock admission at this node (`weir_core::sched::Admission`),
    /// while any volume asks for QoS.
    admission: [(&'static str, &'static str, Family<Vol, Gauge>); 6],
    /// Per named volume: the device scheduler's merges and splits of its
    /// requests at this node.
    volume_sched: [(&'static str, &'static str, Family<Vol, Gauge>); 2],
    /// The front end's read window (`weir_core::flow::ReadWindow`), with the
    /// congestion response on.
    read_window: [(&'static str, &'static str, Gauge); 4],
    /// The RDMA transport's connections (node and front end together), with
    /// `[transport] kind = "rdma"`.
    rdma: [(&'static str, &'static str, Gauge); 4],
    tcp: [(&'static str, &'static str, Gauge); 1],
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Metrics, all zero.
    ///
    /// One table, argued long: each metric registered once, with its name
    /// and help text, in the order `/metrics` lists them.
    pub fn new() -> Self {
        let m = Metrics {
            registry: Mutex::new(Registry::with_prefix("weir")),
            requests: Family::default(),
            bytes: Family::default(),
            errors: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            replicas: Family::default(),
            rebuild_done: Gauge::default(),
            rebuild_total: Gauge::default(),
            device_inflight: Gauge::default(),
            checkpoints: Gauge::default(),
            version_bytes: Gauge::default(),
            applied_records: Gauge::default(),
            payload_copies: Gauge::default(),
            payload_copies_beyond_receive: Gauge::default(),
            front_end_payloads: Family::default(),
            device_healthy: Gauge::default(),
            nodes_up: Gauge::default(),
            leader: Gauge::default(),
            volumes: Gauge::default(),
            admin_refused: Counter::default(),
            flow: [
                (
                    "peer_frames_sent",
                    "Frames sent to the peer (taken by the transport)",
                ),
                (
                    "peer_send_refusals",
                    "Times the transport's queue towards the peer was full",
                ),
                (
                    "peer_frames_held",
                    "Frames held now until the peer's queue has room",
                ),
                (
                    "peer_frames_dropped",
                    "Frames dropped with held frames past the bound (64 MiB)",
                ),
                (
                    "peer_cnps",
                    "Congestion notification packets from the peer (RoCE)",
                ),
                ("peer_ecn_echoes", "ECN echoes from the peer (TCP)"),
                ("peer_retransmits", "Packets retransmitted towards the peer"),
                (
                    "peer_rtt_ns",
                    "Last round-trip time sample towards the peer, ns",
                ),
                (
                    "peer_marked_in",
                    "Packets from the peer that arrived ECN-marked (RoCE)",
                ),
                (
                    "peer_window_bytes",
                    "The congestion response's window towards the peer, bytes (0: off)",
                ),
                (
                    "peer_window_cuts",
                    "Times the congestion response cut the peer's window",
                ),
            ]
            .map(|(name, help)| (name, help, Family::default())),
            sched: [
                (
                    "device_waiting",
                    "Requests (pieces) waiting for room on the device",
                ),
                (
                    "device_commands",
                    "Device commands issued since the node started",
                ),
                (
                    "device_merged",
                    "Requests that joined another's device command",
                ),
                (
                    "device_split",
                    "Requests cut at the device's optimal I/O boundary",
                ),
                (
                    "device_refused",
                    "Requests refused because the device's queue was full",
                ),
                (
                    "device_waited_us",
                    "Microseconds requests waited in the queue, in all",
                ),
            ]
            .map(|(name, help)| (name, help, Gauge::default())),
            admission: [
                (
                    "volume_admitted",
                    "Client requests of the volume this node admitted (dmClock)",
                ),
                (
                    "volume_admitted_by_reservation",
                    "Of them, admitted in the reservation phase",
                ),
                (
                    "volume_queued",
                    "Client requests of the volume waiting for admission now",
                ),
                (
                    "volume_waited_us",
                    "Microseconds the volume's requests waited for admission, in all",
                ),
                (
                    "volume_throttled_us",
                    "Of it, microseconds its limits held them",
                ),
                (
                    "volume_refused",
                    "Client requests of the volume answered busy (queue full or waited too long)",
                ),
            ]
            .map(|(name, help)| (name, help, Family::default())),
            volume_sched: [
                (
                    "volume_merged",
                    "Requests of the volume that joined another's device command here",
                ),
                (
                    "volume_split",
                    "Requests of the volume cut at the device's optimal I/O boundary here",
                ),
            ]
            .map(|(name, help)| (name, help, Family::default())),
            read_window: [
                (
                    "read_window_bytes",
                    "The front end's window over read responses in flight, bytes",
                ),
                (
                    "read_window_waited",
                    "Front-end reads that waited for the read window",
                ),
                ("read_window_cuts", "Times the read window was cut"),
                (
                    "read_window_marks",
                    "ECN-marked packets the read window has seen arrive",
                ),
            ]
            .map(|(name, help)| (name, help, Gauge::default())),
            rdma: [
                ("rdma_connects", "RDMA connections set up"),
                (
                    "rdma_refused",
                    "RDMA connections refused (a bad hello, a broken protocol, a full pool)",
                ),
                ("rdma_resets", "RDMA connections that were up and closed"),
                (
                    "rdma_frames_lost",
                    "Frames lost with an RDMA connection or sent where none could go",
                ),
            ]
            .map(|(name, help)| (name, help, Gauge::default())),
            tcp: [(
                "tcp_refused",
                "TCP connections refused at set-up (a bad hello; with [tls], no certificate of \
                 the cluster CA, or one naming another node)",
                Gauge::default(),
            )],
        };
        {
            let mut r = m.registry.lock().expect("registry");
            r.register("nbd_requests", "NBD requests served", m.requests.clone());
            r.register(
                "nbd_bytes",
                "Bytes read or written through NBD",
                m.bytes.clone(),
            );
            r.register(
                "nbd_errors",
                "NBD requests that failed, by command and why",
                m.errors.clone(),
            );
            r.register(
                "nbd_latency_seconds",
                "NBD request latency",
                m.latency.clone(),
            );
            r.register(
                "replicas",
                "Extent replicas this node holds, by state",
                m.replicas.clone(),
            );
            r.register(
                "rebuild_done_bytes",
                "Bytes copied by the rebuilds this node runs as a primary",
                m.rebuild_done.clone(),
            );
            r.register(
                "rebuild_total_bytes",
                "Bytes to copy in the rebuilds this node runs as a primary",
                m.rebuild_total.clone(),
            );
            r.register(
                "device_inflight",
                "Device commands in flight (queue depth)",
                m.device_inflight.clone(),
            );
            r.register(
                "device_healthy",
                "1 while the device answers in time",
                m.device_healthy.clone(),
            );
            r.register(
                "version_checkpoints",
                "Version checkpoints written since the node started",
                m.checkpoints.clone(),
            );
            r.register(
                "version_grain_bytes",
                "Bytes of version grains held: 8 per 256 KiB of each extent written",
                m.version_bytes.clone(),
            );
            r.register(
                "payload_copies",
                "Copies of block data this process made since it started (each \
                 write's data is copied once per node, as it is received)",
                m.payload_copies.clone(),
            );
            r.register(
                "payload_copies_beyond_receive",
                "Copies of block data other than its receipt off a socket (a frame \
                 made contiguous, an unaligned write): 0 on weir's data path",
                m.payload_copies_beyond_receive.clone(),
            );
            r.register(
                "front_end_payloads",
                "Replica writes of this node's own front end's writes, sent without \
                 their data: taken from the front end, or missed (the replica is dropped)",
                m.front_end_payloads.clone(),
            );
            r.register(
                "applied_log_records",
                "Writes in the applied log behind idempotent retries (at most 65536)",
                m.applied_records.clone(),
            );
            r.register("nodes_up", "Members the map marks up", m.nodes_up.clone());
            r.register(
                "raft_leader",
                "Id of the Raft leader known here, 0 if none",
                m.leader.clone(),
            );
            r.register("volumes", "Named volumes", m.volumes.clone());
            r.register(
                "admin_refused",
                "Admin requests refused for want of the token",
                m.admin_refused.clone(),
            );
            for (name, help, family) in &m.flow {
                r.register(*name, *help, family.clone());
            }
            for (name, help, gauge) in &m.sched {
                r.register(*name, *help, gauge.clone());
            }
            for (name, help, family) in m.admission.iter().chain(&m.volume_sched) {
                r.register(*name, *help, family.clone());
            }
            for (name, help, gauge) in m.read_window.iter().chain(&m.rdma).chain(&m.tcp) {
                r.register(*name, *help, gauge.clone());
            }
        }
        m
    }

    /// Set the front end's read window gauges (left at 0 with the congestion
    /// response off).
    pub fn set_read_window(&self, stats: Option<weir_core::flow::ReadFlowStats>) {
        let Some(s) = stats else {
            return;
        };
        let values = [s.window_bytes, s.waited, s.window.cuts, s.window.marks];
        for ((.., gauge), v) in self.read_window.iter().zip(values) {
            gauge.set(v.min(i64::MAX as u64) as i64);
        }
    }

    /// Set the RDMA transport's gauges (left at 0 over TCP).
    pub fn set_rdma(&self, counters: Option<weir_transport_rdma::net::Counters>) {
        let Some(c) = counters else {
            return;
        };
        let values = [c.connects, c.refused, c.resets, c.frames_lost];
        for ((.., gauge), v) in self.rdma.iter().zip(values) {
            gauge.set(v.min(i64::MAX as u64) as i64);
        }
    }

    /// Set the TCP transport's count of connections refused at set-up.
    pub fn set_tcp_refused(&self, refused: u64) {
        self.tcp[0].2.set(refused.min(i64::MAX as u64) as i64);
    }

    /// A request finished.
    pub fn record(&self, op: &str, bytes: u64, latency: Duration) {
        let label = Op { op: op.to_string() };
        self.requests.get_or_create(&label).inc();
        self.bytes.get_or_create(&label).inc_by(bytes);
        self.latency
            .get_or_create(&label)
            .observe(latency.as_secs_f64());
    }

    /// An admin request was refused (no or wrong token).
    pub fn admin_refused(&self) {
        self.admin_refused.inc();
    }

    /// A request failed, for `why` (an error kind).
    pub fn error(&self, op: &str, why: &str) {
        self.errors
            .get_or_create(&Failure {
                op: op.to_string(),
                why: why.to_string(),
            })
            .inc();
    }

    /// The text exposition, with the gauges refreshed from `report` of node `me`.
    pub fn render(&self, me: NodeId, report: &NodeReport) -> String {
        self.set_replicas(me, report);
        self.set_node(report);
        self.set_links(report);
        self.set_volumes(report);
        let mut out = String::new();
        let registry = self.registry.lock().expect("registry");
        encode(&mut out, &registry).expect("writing to a String cannot fail");
        out
    }

    /// The replicas node `me` holds, by state.
    fn set_replicas(&self, me: NodeId, report: &NodeReport) {
        let (mut primary, mut in_sync, mut rebuilding, mut out) = (0, 0, 0, 0);
        for ext in report.state.extents.values() {
            if !ext.replicas.contains(&me) {
                continue;
            }
            if ext.primary == me && ext.in_sync.contains(&me) {
                primary += 1;
            }
            if ext.in_sync.contains(&me) {
                in_sync += 1;
            } else if ext.rebuilding.contains(&me) {
                rebuilding += 1;
            } else {
                out += 1;
            }
        }
        for (state, n) in [
            ("primary", primary),
            ("in_sync", in_sync),
            ("rebuilding", rebuilding),
            ("out", out),
        ] {
            self.replicas
                .get_or_create(&State {
                    state: state.into(),
                })
                .set(n);
        }
    }

    /// Rebuilds, the device and its scheduler, checkpoints, copies.
    fn set_node(&self, report: &NodeReport) {
        let done: u64 = report.rebuilds.iter().map(|r| r.bytes_done).sum();
        let total: u64 = report.rebuilds.iter().map(|r| r.bytes_total).sum();
        self.rebuild_done.set(done as i64);
        self.rebuild_total.set(total as i64);
        self.device_inflight.set(report.device_inflight as i64);
        let q = &report.sched;
        let values = [
            report.device_waiting as u64,
            q.commands,
            q.merged,
            q.split,
            q.refused,
            q.waited_ns / 1000,
        ];
        for ((_, _, gauge), v) in self.sched.iter().zip(values) {
            gauge.set(v.min(i64::MAX as u64) as i64);
        }
        self.device_healthy.set(i64::from(report.device_healthy));
        self.checkpoints.set(report.checkpoints as i64);
        self.version_bytes.set(report.version_bytes as i64);
        self.applied_records.set(report.applied_records as i64);
        self.payload_copies
            .set(weir_core::copies::total().0.min(i64::MAX as u64) as i64);
        self.payload_copies_beyond_receive
            .set(weir_core::copies::beyond_receive().min(i64::MAX as u64) as i64);
    }

    /// The front end's payloads, the members, and each peer's flow.
    fn set_links(&self, report: &NodeReport) {
        let (taken, missed) = report.front_end_payloads;
        for (outcome, n) in [("taken", taken), ("missed", missed)] {
            self.front_end_payloads
                .get_or_create(&Outcome {
                    outcome: outcome.into(),
                })
                .set(n.min(i64::MAX as u64) as i64);
        }
        let up = report
            .state
            .nodes
            .values()
            .filter(|s| **s == NodeStatus::Up)
            .count();
        self.nodes_up.set(up as i64);
        self.leader.set(report.leader.map_or(0, |l| i64::from(l.0)));
        self.volumes.set(report.state.named.len() as i64);
        for (peer, f) in &report.flow {
            let values = [
                f.sent,
                f.refused,
                f.held as u64,
                f.dropped,
                f.signals.cnps,
                f.signals.ecn_echoes,
                f.signals.retransmits,
                f.signals.rtt_ns_last,
                f.signals.marked_in,
                f.window_bytes,
                f.window_cuts,
            ];
            let label = Peer { peer: peer.0 };
            for ((.., family), value) in self.flow.iter().zip(values) {
                family
                    .get_or_create(&label)
                    .set(value.min(i64::MAX as u64) as i64);
            }
        }
    }

    /// Each volume's admission and scheduling.
    fn set_volumes(&self, report: &NodeReport) {
        // Volumes come and go: the families hold the current ones only.
        for (.., family) in self.admission.iter().chain(&self.volume_sched) {
            family.clear();
        }
        let names: std::collections::BTreeMap<_, _> = report
            .state
            .named
            .iter()
            .map(|(name, v)| (v.id, name))
            .collect();
        let label = |key: &weir_core::sched::VolKey| match key {
            None => Some(Vol {
                volume: "(pool)".to_string(),
            }),
            Some(id) => names.get(id).map(|name| Vol {
                volume: name.to_string(),
            }),
        };
        let set = |families: &[(&str, &str, Family<Vol, Gauge>)], label: &Vol, values: &[u64]| {
            for ((.., family), value) in families.iter().zip(values) {
                family
                    .get_or_create(label)
                    .set((*value).min(i64::MAX as u64) as i64);
            }
        };
        for (key, a) in &report.admission {
            let Some(label) = label(key) else { continue };
            let values = [
                a.admitted,
                a.by_reservation,
                a.waiting as u64,
                a.waited_ns / 1000,
                a.throttled_ns / 1000,
                a.refused,
            ];
            set(&self.admission, &label, &values);
        }
        for (first, v) in &report.volume_sched {
            let Some(label) = label(&Some(*first)) else {
                continue;
            };
            set(&self.volume_sched, &label, &[v.merged, v.split]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_histograms_show_in_the_exposition() {
        let m = Metrics::new();
        m.record("read", 4096, Duration::from_micros(80));
        m.record("read", 4096, Duration::from_micros(120));
        m.error("write", "gave_up");
        let report = NodeReport {
            checkpoints: 7,
            version_bytes: 2048,
            flow: vec![(
                NodeId(2),
                weir_core::flow::PeerFlow {
                    sent: 5,
                    refused: 1,
                    held: 2,
                    ..Default::default()
                },
            )],
            ..NodeReport::default()
        };
        let text = m.render(NodeId(1), &report);
        assert!(
            text.contains("weir_nbd_requests_total{op=\"read\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("weir_nbd_bytes_total{op=\"read\"} 8192"),
            "{text}"
        );
        assert!(
            text.contains("weir_nbd_errors_total{op=\"write\",why=\"gave_up\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("weir_nbd_latency_seconds_count{op=\"read\"} 2"),
            "{text}"
        );
        assert!(text.contains("weir_device_healthy 0"), "{text}");
        assert!(text.contains("weir_version_checkpoints 7"), "{text}");
        assert!(text.contains("weir_version_grain_bytes 2048"), "{text}");
        assert!(
            text.contains("weir_peer_frames_sent{peer=\"2\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("weir_peer_send_refusals{peer=\"2\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("weir_peer_frames_held{peer=\"2\"} 2"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}

#[cfg(test)]
mod volume_tests {
    use super::*;
    use weir_core::control::state::NamedVolume;
    use weir_core::ExtentId;

    #[test]
    fn merges_and_splits_show_per_volume_and_the_read_window_once_on() {
        let m = Metrics::new();
        let mut report = NodeReport::default();
        std::sync::Arc::make_mut(&mut report.state).named.insert(
            "db".into(),
            NamedVolume {
                id: 4,
                extents: 2,
                alloc: [(0, ExtentId(4)), (1, ExtentId(5))].into(),
                snapshots: Default::default(),
                generation: 0,
                origin: None,
                size_bytes: 1 << 20,
                qos: Default::default(),
                key_check: None,
            },
        );
        report.volume_sched = vec![(
            4,
            weir_core::sched::VolumeSchedStats {
                merged: 3,
                split: 2,
            },
        )];
        let text = m.render(NodeId(1), &report);
        assert!(
            text.contains("weir_volume_merged{volume=\"db\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("weir_volume_split{volume=\"db\"} 2"),
            "{text}"
        );
        assert!(text.contains("weir_read_window_bytes 0"), "{text}");
        m.set_read_window(None);
        assert!(m
            .render(NodeId(1), &report)
            .contains("weir_read_window_bytes 0"));
        let mut window = weir_core::flow::ReadWindow::new(weir_core::flow::FlowConfig {
            enabled: true,
            ..Default::default()
        });
        assert_eq!(window.take(1, 4096), weir_core::flow::Turn::Go);
        m.set_read_window(Some(window.stats()));
        let text = m.render(NodeId(1), &report);
        assert!(
            text.contains(&format!(
                "weir_read_window_bytes {}",
                weir_core::flow::WINDOW_MAX_BYTES_DEFAULT
            )),
            "{text}"
        );
    }
}
