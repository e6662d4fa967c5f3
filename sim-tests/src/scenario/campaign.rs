//! The fault campaign's scenarios: a swarm, each seed drawing its own mix.

use super::{Driver, NetworkStack, Scenario, Transport};

/// The campaign's draw number `salt` for `seed`, in `0..n` (a splitmix64 mix of
/// the two, so each choice of a seed is independent of the others).
fn campaign_pick(seed: u64, salt: u64, n: u64) -> u64 {
    let mut z = seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) % n
}

impl Scenario {
    /// The fault campaign's scenario for `seed`: a small cluster under a light
    /// workload, long enough for a failover, with a fault mix drawn from the seed
    /// (a swarm: each seed tests a different mix): a node crash (sometimes the Raft
    /// leader), link loss and corruption, link flaps, on RoCE (a third of it
    /// through RDMA's messenger, half of that on two-port hosts) or the TCP
    /// baseline, with the hosts' CPUs modelled on a quarter of the seeds and
    /// the devices' I/O schedulers merging and splitting on a third, and QoS
    /// admission on a third.
    /// `cargo xtask sim --campaign --seed N` replays one.
    ///
    /// One table, argued long: a draw per knob, each with its reason beside
    /// it, in the order the seed's bits are taken (reordering them would change
    /// every seed's scenario).
    pub fn campaign(seed: u64) -> Scenario {
        let pick = |salt: u64, n: u64| campaign_pick(seed, salt, n);
        let mut s = Scenario::default();
        s.cluster.nodes = 3 + pick(1, 3) as u32;
        s.cluster.volume_mib = 256;
        // Scrubbing finds media errors in blocks nobody reads.
        s.cluster.scrub_mib_per_sec = 256;
        s.cluster.extent_mib = [4, 16, 64][pick(2, 3) as usize];
        s.workload.clients = 1 + pick(3, 2) as u32;
        s.workload.queue_depth = [2, 4, 8][pick(4, 3) as usize];
        s.workload.read_percent = [30, 50, 70][pick(5, 3) as usize];
        s.workload.block_size = [4096, 16384][pick(6, 2) as usize];
        s.workload.duration_ms = 300;
        // Up to two node faults (crash, pause, device hang, partition) on distinct
        // nodes: with 3 replicas an extent always keeps one in-sync copy.
        for slot in 0..pick(7, 3) {
            match pick(13 + slot, 4) {
                // Half the crashed nodes come back: a restart from the device
                // and the Raft log.
                0 if s.faults.node_crashes + s.faults.node_restarts + s.faults.power_losses
                    == 0 =>
                {
                    if pick(19, 2) == 0 {
                        // Half the restarts follow a power loss.
                        if pick(21, 2) == 0 {
                            s.faults.power_losses = 1
                        } else {
                            s.faults.node_restarts = 1
                        }
                    } else {
                        s.faults.node_crashes = 1
                    }
                }
                1 => s.faults.node_pauses += 1,
                // A third of the failing devices disappear rather than stall.
                2 if pick(23, 3) == 0 && s.faults.device_losses == 0 => s.faults.device_losses = 1,
                2 => s.faults.device_hangs += 1,
                _ => s.faults.partitions += 1,
            }
        }
        // A third of the seeds with room for one more faulty node give its SSD
        // media errors.
        if s.faults.faulty_nodes() < 2 && pick(22, 3) == 0 {
            s.faults.media_errors = 1;
        }
        s.faults.crash_leader = pick(8, 3) == 0;
        s.faults.pause_ms = [120, 300][pick(16, 2) as usize];
        s.faults.partition_ms = [120, 300][pick(17, 2) as usize];
        s.faults.hang_ms = [120, 300][pick(18, 2) as usize];
        s.faults.restart_ms = [60, 300][pick(20, 2) as usize];
        if pick(9, 2) == 0 {
            s.faults.link_loss = [0.0005, 0.002][pick(10, 2) as usize];
            s.faults.link_corrupt = 0.0005;
        }
        s.faults.link_flaps = pick(11, 4) as u32;
        if pick(12, 4) == 0 {
            s.fabric.transport = Transport::TcpDctcp;
        } else if pick(31, 3) == 0 {
            // A third of the RoCE seeds carry their frames through RDMA's
            // messenger (connections, credits, granted regions).
            s.fabric.transport = Transport::Rdma;
        }
        // Half the RDMA seeds give every host two NIC ports: a link flap then
        // takes one port of a host, for up to 30 ms (longer than the 8 ms a QP
        // retries for), so connections move to the other path.
        if s.fabric.transport == Transport::Rdma && pick(32, 2) == 0 {
            s.fabric.ports_per_host = 2;
            s.faults.link_flaps = 1 + pick(11, 4) as u32;
            s.faults.flap_down_us = 30_000;
        }
        // Clocks from perfect to 5 ms apart (an NTP server lost for a while),
        // drifting up to RFC 5905's 15 ppm or a free-running oscillator's 100 ppm.
        s.cluster.clock_offset_max_us = [0, 100, 1000, 5000][pick(24, 4) as usize];
        s.cluster.clock_drift_max_ppm = [0, 15, 100][pick(25, 3) as usize];
        // One block per grain (as exact as versions go), a few blocks, or the default.
        s.cluster.version_grain_kib = [4, 16, 0][pick(26, 3) as usize];
        // A snapshot after every command or every other one (a node that missed
        // one installs a snapshot, often while it is also catching up), a few, or
        // the daemon's.
        s.cluster.raft_snapshot_entries = [1, 2, 8, 1024][pick(27, 4) as usize];
        // A quarter of the seeds model the hosts: the fabric's own stack (verbs on
        // RoCE, the kernel's sockets on TCP), a kernel or polled NVMe driver, and
        // few cores (2 or 4: saturated hosts stretch every timing the protocols
        // depend on) or many.
        if pick(28, 4) == 0 {
            s.host.network_stack = if s.fabric.lossless() {
                NetworkStack::Rdma
            } else {
                NetworkStack::KernelTcp
            };
            s.device.driver = [Driver::Kernel, Driver::Polled][pick(29, 2) as usize];
            s.host.cores = [2, 4, 16][pick(30, 3) as usize];
        }
        // A third of the seeds schedule their devices: merging and splitting at
        // a shallow depth (half of them without classes) (requests wait in weir, where they merge; a media
        // error takes a merged command apart), half of them on two striped
        // SSDs (a boundary to split at), half of those with every client one
        // sequential stream (neighbouring requests in flight together).
        if pick(33, 3) == 0 {
            s.sched.merge = true;
            s.sched.split = true;
            s.sched.depth = [1, 4][pick(34, 2) as usize];
            // Half of them do not rank background work (rebuild copies,
            // the scrubber) behind clients' requests, as every other
            // seed does (the default).
            s.sched.classes = pick(41, 2) == 0;
            // Half of those with classes reserve the rebuild a floor of
            // commands before clients' weight.
            if s.sched.classes && pick(44, 2) == 0 {
                s.sched.rebuild_reservation = 2_000;
            }
            if pick(35, 2) == 0 {
                s.device.ssds = 2;
                if pick(36, 2) == 0 {
                    s.workload.pattern = super::Pattern::Stream;
                }
            }
        }
        // A third of the seeds carve two named volumes with QoS from the pool
        // (the clients still use all of it: both volumes and the rest), so
        // every primary admits client requests by dmClock through the faults:
        // one volume limited (tightly or loosely), the other holding a
        // reservation and a weight, a shallow admission depth.
        if pick(37, 3) == 0 {
            s.volumes = vec![
                super::VolumeSpecToml {
                    name: "a".into(),
                    share_percent: 50,
                    iops_limit: [2_000, 20_000][pick(38, 2) as usize],
                    ..Default::default()
                },
                super::VolumeSpecToml {
                    name: "b".into(),
                    share_percent: 25,
                    iops_reservation: 1_000,
                    weight: [50, 400][pick(39, 2) as usize],
                    ..Default::default()
                },
            ];
            s.qos.depth = [1, 8][pick(40, 2) as usize];
        }
        // A quarter of the seeds with extents of at most 16 MiB run the
        // snapshot stage: snapshots of a thin volume taken while its writer
        // writes and the faults happen (at a crash where the plan has one),
        // a clone written, a snapshot deleted and an extent trimmed.
        if pick(47, 4) == 0 && s.cluster.extent_mib <= 16 {
            s.snapshots = super::SnapshotSpec {
                rounds: 2,
                extents: 1,
            };
        }
        // A third of the seeds turn the congestion response on, half of them
        // with windows so small they bind all the time (a client's reads wait
        // for each other; one rebuild chunk per peer), so reads that wait, are
        // retried and are given up while they wait run through every fault.
        if pick(42, 3) == 0 {
            s.flow.enabled = true;
            if pick(43, 2) == 0 {
                s.flow.window_min_bytes = 4096;
                s.flow.window_max_bytes = 16 << 10;
                s.flow.increase_bytes = 4096;
            }
        }
        // A quarter of the seeds add a node, and half of those remove another
        // (its replicas move to the others, its vote to another node) while the
        // faults and the workload go on.
        if pick(45, 4) == 0 {
            s.faults.node_adds = 1;
            if pick(46, 2) == 0 && s.faults.faulty_nodes() < u64::from(s.cluster.nodes) {
                s.faults.node_removals = 1;
            }
        }
        s
    }
}
