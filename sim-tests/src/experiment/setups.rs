//! The experiments' setups: the published deployments' comparisons.
//!
//! Shared by all: storage nodes and compute nodes (clients) on one 100 GbE
//! switch, every host with 16 cores at the cost profiles' reference clock, every
//! volume 3-way replicated. "Kernel TCP" is Linux's default: CUBIC on a lossy
//! fabric, the kernel's socket stack and, where the device side is part of the
//! comparison, the kernel's NVMe driver. "RoCE" is RoCE v2 with PFC, ECN and
//! DCQCN, verbs, and a polled user-space NVMe driver. Where an experiment keeps
//! one side fixed to isolate the other, it says so.

use super::{Experiment, Variant};
use crate::scenario::{
    ClientPath, Dcqcn, Driver, ExtraClients, NetworkStack, Pattern, Scenario, Transport,
};

/// Every experiment, in the order `list` prints them.
pub const ALL: &[Experiment] = &[
    Experiment {
        name: "roce-vs-tcp-small",
        about: "4 KiB random reads, then writes, at QD128 from 3 compute nodes to 3 storage \
                nodes: RoCE v2 + verbs vs kernel TCP (both with the polled NVMe driver)",
        variants: roce_vs_tcp_small,
    },
    Experiment {
        name: "roce-vs-tcp-large",
        about: "1 MiB sequential reads, then writes, at QD32 from 3 compute nodes: bandwidth \
                as % of the clients' line rate and CPU, RoCE v2 vs kernel TCP",
        variants: roce_vs_tcp_large,
    },
    Experiment {
        name: "mixed",
        about: "analytics (4 KiB random reads) and ingest (128 KiB sequential writes) at once \
                and each alone, on both fabrics: how much each slows the other",
        variants: mixed,
    },
    Experiment {
        name: "incast",
        about: "32 compute nodes read 4 KiB at random at once, ECN marked at 70% buffer \
                occupancy: DCQCN on vs off vs kernel TCP; and a fan-in the fabric binds \
                (6 nodes x 4 SSDs answer 4 clients' 128 KiB reads)",
        variants: incast,
    },
    Experiment {
        name: "spdk-vs-kernel",
        about: "one node, 4 KiB random reads at QD16 against its NVMe: a polled user-space \
                driver vs the kernel's interrupt-driven one (RDMA to the client in both)",
        variants: spdk_vs_kernel,
    },
    Experiment {
        name: "full-stack",
        about: "3 nodes with 2 SSDs each, 3 clients of 4 KiB random 70% reads at QD64 (one \
                per node): kernel NVMe + kernel TCP vs polled + RoCE, steady and with bursts",
        variants: full_stack,
    },
    Experiment {
        name: "rdma-messenger",
        about: "3 compute nodes, 4 KiB random 70% reads and 128 KiB random reads at QD32: \
                RoCE's frames as they are vs carried by RDMA's messenger (connection set-up, \
                SENDs under credits, large frames into granted regions)",
        variants: rdma_messenger,
    },
    Experiment {
        name: "merge-split",
        about: "3 nodes; 3 clients each stream 4 KiB requests (70% reads) at QD128, and one \
                reads 1 MiB at random: the I/O scheduler merging and splitting (on) or not \
                (off) at 16 commands per device queue, and neither at the device's own depth \
                (fifo-deep, the default); one SSD a node, then two striped (-2ssd: 512 KiB \
                stripes to split at)",
        variants: merge_split,
    },
    Experiment {
        name: "qos",
        about: "3 nodes; a latency-sensitive volume (one client, 4 KiB random 70% reads at \
                QD8) beside a noisy neighbour (three clients, 4 KiB random writes at QD128): \
                no QoS (off), the neighbour limited (limit), the quiet volume holding a \
                reservation (reserve), both (on), and the quiet volume alone",
        variants: qos,
    },
    Experiment {
        name: "rebuild-under-load",
        about: "3 nodes; 2 clients of 4 KiB random 70% reads at QD32; a node restarts with no \
                checkpoint and its replicas rebuild (about 1 GiB) under the load: the device \
                scheduler at 16 commands a queue, FIFO (fifo) or with background work behind \
                clients' requests and at most two commands on the device (classes), and at \
                the device's depth, FIFO (fifo-deep, the default) or with classes \
                (classes-deep)",
        variants: rebuild_under_load,
    },
];

/// Simulated time of the quick form (`cargo xtask test` runs every experiment so).
const QUICK_MS: u64 = 4;

fn base(quick: bool, duration_ms: u64) -> Scenario {
    let mut s = Scenario::default();
    s.cluster.nodes = 3;
    s.cluster.replicas = 3;
    s.cluster.volume_mib = 4096;
    s.workload.duration_ms = if quick { QUICK_MS } else { duration_ms };
    s.host.cores = 16;
    s.host.clock_ghz = f64::from(weir_host_sim::profile::REFERENCE_MHZ) / 1000.0;
    s
}

/// Kernel TCP: CUBIC on a lossy fabric, the kernel's socket stack.
fn kernel_tcp(s: &mut Scenario) {
    s.fabric.transport = Transport::TcpCubic;
    s.host.network_stack = NetworkStack::KernelTcp;
}

/// RoCE v2 with PFC, ECN and DCQCN, through verbs.
fn roce(s: &mut Scenario) {
    s.fabric.transport = Transport::Roce;
    s.fabric.dcqcn = Dcqcn::Hpcc;
    s.fabric.pfc = true;
    s.host.network_stack = NetworkStack::Rdma;
}

fn workload(s: &mut Scenario, pattern: Pattern, block_size: u32, read_percent: u32, qd: u32) {
    s.workload.pattern = pattern;
    s.workload.block_size = block_size;
    s.workload.read_percent = read_percent;
    s.workload.queue_depth = qd;
}

fn variant(name: &str, scenario: Scenario) -> Variant {
    Variant {
        name: name.to_string(),
        scenario,
    }
}

/// `tcp-read`, `tcp-write`, `roce-read`, `roce-write` of one block size and
/// pattern.
fn fabric_matrix(
    quick: bool,
    duration_ms: u64,
    pattern: Pattern,
    bs: u32,
    qd: u32,
) -> Vec<Variant> {
    let mut out = Vec::new();
    for (fabric, set) in [("tcp", kernel_tcp as fn(&mut Scenario)), ("roce", roce)] {
        for (kind, reads) in [("read", 100), ("write", 0)] {
            let mut s = base(quick, duration_ms);
            s.workload.clients = 3;
            s.device.driver = Driver::Polled;
            set(&mut s);
            workload(&mut s, pattern, bs, reads, qd);
            out.push(variant(&format!("{fabric}-{kind}"), s));
        }
    }
    out
}

/// `roce-4k`, `rdma-4k`, `roce-128k`, `rdma-128k`: the same RoCE fabric, hosts
/// and polled driver; `rdma-` carries every frame through the messenger.
fn rdma_messenger(quick: bool) -> Vec<Variant> {
    let mut out = Vec::new();
    for (size, bs, reads) in [("4k", 4096, 70), ("128k", 128 << 10, 100)] {
        for via in [Transport::Roce, Transport::Rdma] {
            let mut s = base(quick, 40);
            s.workload.clients = 3;
            s.device.driver = Driver::Polled;
            roce(&mut s);
            s.fabric.transport = via;
            workload(&mut s, Pattern::Random, bs, reads, 32);
            out.push(variant(&format!("{via}-{size}"), s));
        }
    }
    out
}

fn roce_vs_tcp_small(quick: bool) -> Vec<Variant> {
    fabric_matrix(quick, 60, Pattern::Random, 4096, 128)
}

fn roce_vs_tcp_large(quick: bool) -> Vec<Variant> {
    fabric_matrix(quick, 40, Pattern::Sequential, 1 << 20, 32)
}

fn mixed(quick: bool) -> Vec<Variant> {
    let ingest = ExtraClients {
        clients: 1,
        pattern: Pattern::Sequential,
        read_percent: 0,
        block_size: 128 << 10,
        queue_depth: 8,
        start_spread_ms: 0,
        run_ms: 0,
        volume: String::new(),
    };
    let mut out = Vec::new();
    for (fabric, set) in [("tcp", kernel_tcp as fn(&mut Scenario)), ("roce", roce)] {
        let driver = if fabric == "tcp" {
            Driver::Kernel
        } else {
            Driver::Polled
        };
        let mut common = base(quick, 60);
        set(&mut common);
        common.device.driver = driver;
        // Analytics: 2 clients of 4 KiB random reads; beside them, the ingest.
        let mut reads = common.clone();
        reads.workload.clients = 2;
        workload(&mut reads, Pattern::Random, 4096, 100, 64);
        let mut both = reads.clone();
        both.extra_clients = vec![ingest.clone()];
        let mut writes = common;
        writes.workload.clients = ingest.clients;
        workload(
            &mut writes,
            ingest.pattern,
            ingest.block_size,
            0,
            ingest.queue_depth,
        );
        out.push(variant(&format!("{fabric}-mixed"), both));
        out.push(variant(&format!("{fabric}-read-alone"), reads));
        out.push(variant(&format!("{fabric}-write-alone"), writes));
    }
    out
}

fn incast(quick: bool) -> Vec<Variant> {
    let mut out = Vec::new();
    // The published setup: 32 clients, 4 KiB reads, one SSD a node. Then one
    // where the fabric binds rather than the SSDs: 6 nodes with 4 SSDs each
    // answer 4 clients' 128 KiB reads (4 MiB outstanding per client), so many
    // senders converge on each client's port. `-flow`: the congestion response
    // on (each client's read window follows the marks on packets reaching it;
    // not on kernel TCP, which reports no marks at the receiver).
    for (suffix, nodes, ssds, clients, bs, qd) in [
        ("", 3, 1, 32, 4096, 16),
        ("-fan-in", 6, 4, 4, 128 << 10, 32),
    ] {
        for name in [
            "dcqcn-on",
            "dcqcn-off",
            "tcp",
            "dcqcn-on-flow",
            "dcqcn-off-flow",
        ] {
            let mut s = base(quick, 40);
            s.cluster.nodes = nodes;
            s.cluster.extent_mib = 16;
            s.workload.clients = clients;
            s.device.driver = Driver::Polled;
            s.device.ssds = ssds;
            s.fabric.ecn_buffer_pct = 70;
            workload(&mut s, Pattern::Random, bs, 100, qd);
            match name {
                "tcp" => kernel_tcp(&mut s),
                "dcqcn-off" | "dcqcn-off-flow" => {
                    roce(&mut s);
                    s.fabric.dcqcn = Dcqcn::Off;
                }
                _ => roce(&mut s),
            }
            s.flow.enabled = name.ends_with("-flow");
            // Hosts that read from the primaries themselves: the incast is
            // many primaries answering one host at once, on its port, and the
            // read window is that host's.
            s.workload.path = ClientPath::Library;
            out.push(variant(&format!("{name}{suffix}"), s));
        }
    }
    out
}

fn spdk_vs_kernel(quick: bool) -> Vec<Variant> {
    [Driver::Polled, Driver::Kernel]
        .into_iter()
        .map(|driver| {
            let mut s = base(quick, 100);
            s.cluster.nodes = 1;
            s.cluster.replicas = 1;
            s.workload.clients = 1;
            roce(&mut s);
            s.device.driver = driver;
            workload(&mut s, Pattern::Random, 4096, 100, 16);
            variant(driver.as_str(), s)
        })
        .collect()
}

fn full_stack(quick: bool) -> Vec<Variant> {
    let mut out = Vec::new();
    for burst in [false, true] {
        for (name, set, driver) in [
            (
                "kernel-tcp",
                kernel_tcp as fn(&mut Scenario),
                Driver::Kernel,
            ),
            ("polled-roce", roce, Driver::Polled),
        ] {
            let mut s = base(quick, 100);
            set(&mut s);
            s.device.driver = driver;
            s.device.ssds = 2;
            s.workload.clients = 3;
            workload(&mut s, Pattern::Random, 4096, 70, 64);
            let mut name = name.to_string();
            if burst {
                // Six more clients of the same workload, each switched on at a
                // random time in the first 80% of the run for a fifth of it.
                let d = s.workload.duration_ms;
                s.extra_clients = vec![ExtraClients {
                    clients: 6,
                    pattern: Pattern::Random,
                    read_percent: 70,
                    block_size: 4096,
                    queue_depth: 64,
                    start_spread_ms: (d * 4 / 5).max(1),
                    run_ms: (d / 5).max(1),
                    volume: String::new(),
                }];
                name.push_str("-burst");
            }
            out.push(variant(&name, s));
        }
    }
    out
}

/// Commands in flight per device queue in `merge-split` (8 queues: 128 per
/// device, what the SSD model needs for its full 4 KiB rate): past it
/// requests wait in the scheduler, where they can merge.
pub const MERGE_SPLIT_DEPTH: u32 = 16;

/// `on` and `off`: the same cluster and load, the scheduler at the same depth,
/// merging and splitting or not; `fifo-deep`: neither, at the device's own
/// depth (weir's default: nothing waits in weir). First with one SSD a node,
/// whose controller binds at this load; then (`-2ssd`) with two striped SSDs a
/// node, which it does not.
fn merge_split(quick: bool) -> Vec<Variant> {
    let mut out = Vec::new();
    for (suffix, ssds) in [("", 1), ("-2ssd", 2)] {
        for name in ["on", "off", "fifo-deep"] {
            let mut s = base(quick, 100);
            roce(&mut s);
            s.device.driver = Driver::Polled;
            s.device.ssds = ssds;
            s.workload.clients = 3;
            workload(&mut s, Pattern::Stream, 4096, 70, 128);
            s.extra_clients = vec![ExtraClients {
                clients: 1,
                pattern: Pattern::Random,
                read_percent: 100,
                block_size: 1 << 20,
                queue_depth: 4,
                start_spread_ms: 0,
                run_ms: 0,
                volume: String::new(),
            }];
            if name != "fifo-deep" {
                s.sched.depth = MERGE_SPLIT_DEPTH;
            }
            s.sched.merge = name == "on";
            s.sched.split = name == "on";
            out.push(variant(&format!("{name}{suffix}"), s));
        }
    }
    out
}

/// The noisy neighbour's IOPS limit in `qos` (over the cluster).
pub const QOS_NOISY_LIMIT: u64 = 100_000;
/// The quiet volume's reservation in `qos`.
pub const QOS_QUIET_RESERVATION: u64 = 30_000;

/// `off`, `limit`, `reserve`, `on` and `alone`: see the experiment's line.
/// Admission at the default depth wherever a volume has QoS.
fn qos(quick: bool) -> Vec<Variant> {
    let mut out = Vec::new();
    for name in ["off", "limit", "reserve", "on", "alone"] {
        let mut s = base(quick, 100);
        roce(&mut s);
        s.device.driver = Driver::Polled;
        s.workload.clients = 1;
        s.workload.volume = "quiet".into();
        workload(&mut s, Pattern::Random, 4096, 70, 8);
        let mut quiet = crate::scenario::VolumeSpecToml {
            name: "quiet".into(),
            ..Default::default()
        };
        let mut noisy = crate::scenario::VolumeSpecToml {
            name: "noisy".into(),
            ..Default::default()
        };
        if matches!(name, "limit" | "on") {
            noisy.iops_limit = QOS_NOISY_LIMIT;
        }
        if matches!(name, "reserve" | "on") {
            quiet.iops_reservation = QOS_QUIET_RESERVATION;
        }
        s.volumes = vec![quiet, noisy];
        if name != "alone" {
            s.extra_clients = vec![ExtraClients {
                clients: 3,
                pattern: Pattern::Random,
                read_percent: 0,
                block_size: 4096,
                queue_depth: 128,
                volume: "noisy".into(),
                ..ExtraClients::default()
            }];
        }
        out.push(variant(name, s));
    }
    out
}

/// `fifo`, `classes`, `fifo-deep` and `classes-deep`: see the experiment's line. The restart
/// comes at the same time in each (the seed's), so the rebuild is the same.
fn rebuild_under_load(quick: bool) -> Vec<Variant> {
    let mut out = Vec::new();
    for name in ["fifo", "classes", "fifo-deep", "classes-deep"] {
        let mut s = base(quick, 300);
        roce(&mut s);
        s.device.driver = Driver::Polled;
        s.cluster.volume_mib = 1024;
        // No checkpoints: the restarted node is sent every block it holds.
        s.cluster.checkpoint_ms = 0;
        s.workload.clients = 2;
        workload(&mut s, Pattern::Random, 4096, 70, 32);
        s.faults.node_restarts = 1;
        s.faults.restart_ms = 20;
        if !name.ends_with("-deep") {
            s.sched.depth = MERGE_SPLIT_DEPTH;
        }
        s.sched.classes = name.starts_with("classes");
        out.push(variant(name, s));
    }
    out
}
