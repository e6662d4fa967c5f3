//! Fabric parameters: topology, links, switch buffers (ECN, PFC) and NICs (RC QPs,
//! DCQCN, CNPs). Every value has a documented default; `validate` names a bad key.

use crate::congestion::dcqcn::{CnpMode, DcqcnParams};
use crate::congestion::tcp::{Algorithm, TcpParams};

/// TCP mode: the lossy baseline on the same topology.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TcpSpec {
    /// Congestion control.
    pub params: TcpParams,
    /// Drop-tail: an egress queue may hold at most this share of the free buffer
    /// (the dynamic threshold of shared-buffer switches; 1.0 is common).
    pub queue_share: f64,
}

/// How hosts are wired.
#[derive(Clone, Debug, PartialEq)]
pub enum Topology {
    /// Every host port on one switch.
    Star {
        /// Host slots.
        hosts: usize,
    },
    /// Two tiers: hosts on leaves, every leaf linked to every spine, ECMP across
    /// spines by flow hash.
    LeafSpine {
        /// Leaf switches.
        leaves: usize,
        /// Spine switches.
        spines: usize,
        /// Host slots per leaf (filled leaf by leaf).
        hosts_per_leaf: usize,
    },
}

/// One kind of link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkSpec {
    /// Rate, bits per second.
    pub rate_bps: u64,
    /// One-way propagation delay, ns.
    pub delay_ns: u64,
}

/// ECN marking of a switch egress queue at one port speed, RED-style on its bytes:
/// probability 0 up to `kmin_bytes`, linear to `pmax` at `kmax_bytes`, 1 above.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EcnLevel {
    /// Port speed this row is for, bits per second.
    pub rate_bps: u64,
    /// Marking starts above this many queued bytes.
    pub kmin_bytes: u64,
    /// Marking reaches `pmax` here (bytes); every packet is marked above it.
    pub kmax_bytes: u64,
    /// Marking probability at `kmax_bytes`.
    pub pmax: f64,
}

/// ECN marking by port speed, one row per speed. A port at a listed speed uses its
/// row; a port at another speed uses the row of the highest listed speed below it
/// (or the lowest listed speed, if none is below), thresholds scaled linearly with
/// speed.
#[derive(Clone, Debug, PartialEq)]
pub struct EcnSpec {
    /// Rows, in increasing order of speed.
    pub by_rate: Vec<EcnLevel>,
}

const G: u64 = 1_000_000_000;

impl EcnSpec {
    /// The reference simulator's DCQCN marking (the ns-3 code of HPCC, Li et al.
    /// SIGCOMM 2019): `KMIN_MAP`/`KMAX_MAP`/`PMAX_MAP` of its `mix/config.txt` give
    /// Kmin 100/200/400 KB, Kmax 400/800/1600 KB, pmax 0.2 at 25/50/100 Gb/s (its
    /// switch MMU multiplies the map's values by 1000), and its `run.py` adds the
    /// row for 4x the host speed, 1600/6400 KB at 400 Gb/s.
    pub fn hpcc() -> Self {
        let row = |gbps: u64, kmin_kb: u64, kmax_kb: u64| EcnLevel {
            rate_bps: gbps * G,
            kmin_bytes: kmin_kb * 1000,
            kmax_bytes: kmax_kb * 1000,
            pmax: 0.2,
        };
        EcnSpec {
            by_rate: vec![
                row(25, 100, 400),
                row(50, 200, 800),
                row(100, 400, 1600),
                row(400, 1600, 6400),
            ],
        }
    }

    /// The DCQCN paper's marking (Zhu et al., SIGCOMM 2015, "Congestion Control for
    /// Large-Scale RDMA Deployments"): Kmin 5 KB, Kmax 200 KB, pmax 1%, given for its
    /// 40 Gb/s testbed and tuned with its fluid model. Secondary sources, the paper's
    /// text not being at hand: Kmin 5 KB and Kmax 200 KB in the fluid-model
    /// reproductions lzhtan/Fluid-Model-for-DCQCN-ECN-PFC and
    /// lirong-lirong/dcqcn-fluid-model (which also give g 1/256, timers 55 us, byte
    /// counter 10 MB, F = 5, R_AI 40 Mb/s, CNPs 50 us apart as the paper's), pmax 0.01
    /// in sc20anonymous/DCQCN-validation (run on the paper's own ns-3 code); one
    /// reader quotes Kmin as 4 KB (alibaba-edu/High-Precision-Congestion-Control
    /// issue 21). One row at 40
    /// Gb/s, so other speeds scale linearly (12.5 / 500 KB at 100 Gb/s): the
    /// thresholds are queueing-delay budgets (1 us and 40 us at 40 Gb/s), as HPCC's
    /// authors scale theirs ("K should be proportional to the link bandwidth. DCQCN
    /// paper uses 40Gbps", alibaba-edu/High-Precision-Congestion-Control issue 21).
    pub fn dcqcn_paper() -> Self {
        EcnSpec {
            by_rate: vec![EcnLevel {
                rate_bps: 40 * G,
                kmin_bytes: 5_000,
                kmax_bytes: 200_000,
                pmax: 0.01,
            }],
        }
    }

    /// The marking a DCQCN reaction-point preset was tuned with (see
    /// [`DcqcnParams::preset`]): the paper's for `paper`, the reference simulator's
    /// for `hpcc` and for `connectx` (whose firmware defaults come with no switch
    /// setting of their own). `None` for an unknown name.
    pub fn for_dcqcn_preset(name: &str) -> Option<Self> {
        match name {
            "paper" => Some(Self::dcqcn_paper()),
            "hpcc" | "connectx" => Some(Self::hpcc()),
            _ => None,
        }
    }

    /// One row at 100 Gb/s, scaled linearly to every other speed.
    pub fn at_100g(kmin_bytes: u64, kmax_bytes: u64, pmax: f64) -> Self {
        EcnSpec {
            by_rate: vec![EcnLevel {
                rate_bps: 100 * G,
                kmin_bytes,
                kmax_bytes,
                pmax,
            }],
        }
    }

    /// The marking of a port of `rate_bps`.
    pub fn level(&self, rate_bps: u64) -> EcnLevel {
        let row = self
            .by_rate
            .iter()
            .rev()
            .find(|r| r.rate_bps <= rate_bps)
            .or(self.by_rate.first())
            .copied()
            .expect("validated: at least one ECN row");
        let scale = |b: u64| (b as u128 * rate_bps as u128 / row.rate_bps as u128) as u64;
        EcnLevel {
            rate_bps,
            kmin_bytes: scale(row.kmin_bytes),
            kmax_bytes: scale(row.kmax_bytes),
            pmax: row.pmax,
        }
    }

    /// (Kmin, Kmax) in bytes at a port of `rate_bps`.
    pub fn thresholds(&self, rate_bps: u64) -> (u64, u64) {
        let l = self.level(rate_bps);
        (l.kmin_bytes, l.kmax_bytes)
    }

    /// Check the rows; what is wrong is named.
    pub fn validate(&self) -> Result<(), String> {
        if self.by_rate.is_empty() {
            return Err("no row".into());
        }
        if self
            .by_rate
            .windows(2)
            .any(|w| w[0].rate_bps >= w[1].rate_bps)
        {
            return Err("rows must be in increasing order of speed".into());
        }
        for r in &self.by_rate {
            if r.rate_bps == 0 || r.kmin_bytes > r.kmax_bytes || !(0.0..=1.0).contains(&r.pmax) {
                return Err(format!(
                    "row at {} b/s: need speed > 0, kmin <= kmax and pmax in [0, 1]",
                    r.rate_bps
                ));
            }
        }
        Ok(())
    }
}

/// Priority flow control on the lossless class.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PfcSpec {
    /// PFC on (RoCE) or off.
    pub enabled: bool,
    /// Per ingress queue bytes that never count against the shared buffer.
    pub reserve_bytes: u64,
    /// Headroom = this x port rate x propagation delay (+ one MTU frame).
    pub headroom_rtt_factor: u64,
    /// XOFF threshold = free shared buffer >> shift at the host-port speed; one less
    /// per doubling of the port's speed.
    pub xoff_shift_at_host_speed: u32,
    /// XON when headroom is empty and shared use + this <= threshold.
    pub resume_offset_bytes: u64,
}

/// Switch parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct SwitchSpec {
    /// Shared packet buffer, bytes.
    pub buffer_bytes: u64,
    /// Forwarding latency, ns.
    pub forwarding_ns: u64,
    /// ECN marking.
    pub ecn: EcnSpec,
    /// Also mark every data packet sent while the shared buffer is at least this
    /// full, percent of `buffer_bytes` (0: off). Deployments that mark on buffer
    /// occupancy rather than queue length set 70.
    pub ecn_buffer_pct: u32,
    /// PFC.
    pub pfc: PfcSpec,
}

/// NIC parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct NicSpec {
    /// Payload bytes per packet (RoCE path MTU: 1024 or 4096).
    pub mtu_bytes: u32,
    /// DCQCN reaction point on every QP (`None`: send at line rate, PFC only).
    pub dcqcn: Option<DcqcnParams>,
    /// How receivers turn ECN marks into CNPs.
    pub cnp: CnpMode,
    /// Limit each QP's unacknowledged bytes to the bandwidth-delay product.
    pub bdp_window: bool,
    /// Retransmission timeout, ns.
    pub rto_ns: u64,
    /// RC's retry count: a QP that times out this many times in a row without
    /// progress fails, and its messages are given up (`None`: it retries for
    /// ever, a wire that never gives up). Verbs' `retry_cnt` is a 3-bit field,
    /// at most 7 (InfiniBand Architecture Specification, vol. 1, 9.7.6.1.3).
    pub retry_limit: Option<u32>,
    /// Bytes a host may queue towards one peer (sent and not yet acknowledged,
    /// or delivered and not yet taken by the receiver); past it `send` refuses
    /// frames to that peer ([`weir_core::SendError::Full`]).
    pub send_queue_bytes_max: u64,
}

/// The whole fabric.
#[derive(Clone, Debug, PartialEq)]
pub struct FabricConfig {
    /// Wiring.
    pub topology: Topology,
    /// Host-to-leaf links.
    pub host_link: LinkSpec,
    /// Leaf-to-spine links.
    pub fabric_link: LinkSpec,
    /// NIC ports per host (1, or 2 for multipath): in a star both reach the switch;
    /// in a leaf-spine port k reaches leaf (home + k) mod leaves.
    pub ports_per_host: usize,
    /// Wire bytes added to every packet: Ethernet (14 + 4 FCS) + IPv4 (20) + UDP (8)
    /// + BTH (12) + ICRC (4) + preamble and inter-frame gap (20).
    pub header_bytes: u32,
    /// Switches.
    pub switch: SwitchSpec,
    /// NICs.
    pub nic: NicSpec,
    /// `Some`: TCP over lossy queues instead of RoCE (no PFC, no DCQCN).
    pub tcp: Option<TcpSpec>,
    /// Seed of the fabric's own random draws (ECN marking, loss, ECMP salt).
    pub seed: u64,
}

/// Wire size of an ACK, NACK, CNP or PAUSE frame.
pub const CONTROL_FRAME_BYTES: u32 = 84;

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            topology: Topology::Star { hosts: 64 },
            host_link: LinkSpec {
                rate_bps: 100_000_000_000,
                delay_ns: 1_000,
            },
            fabric_link: LinkSpec {
                rate_bps: 400_000_000_000,
                delay_ns: 1_000,
            },
            ports_per_host: 1,
            header_bytes: 82,
            switch: SwitchSpec {
                buffer_bytes: 32 << 20,
                forwarding_ns: 300,
                ecn: EcnSpec::hpcc(),
                ecn_buffer_pct: 0,
                pfc: PfcSpec {
                    enabled: true,
                    reserve_bytes: 4096,
                    headroom_rtt_factor: 3,
                    xoff_shift_at_host_speed: 3,
                    resume_offset_bytes: 3072,
                },
            },
            nic: NicSpec {
                mtu_bytes: 4096,
                dcqcn: Some(DcqcnParams::hpcc(100e9)),
                // The paper's notification point: at most one CNP per QP per 50 us.
                cnp: CnpMode::PerQpInterval {
                    interval_ns: 50_000,
                },
                bdp_window: false,
                rto_ns: 1_000_000,
                retry_limit: None,
                send_queue_bytes_max: 64 << 20,
            },
            tcp: None,
            seed: 0,
        }
    }
}

impl FabricConfig {
    /// The default fabric with every host link at `rate_bps` and DCQCN scaled to it.
    pub fn at_rate(rate_bps: u64) -> Self {
        let mut c = FabricConfig::default();
        c.host_link.rate_bps = rate_bps;
        c.fabric_link.rate_bps = rate_bps * 4;
        if let Some(d) = &mut c.nic.dcqcn {
            d.line_rate_bps = rate_bps as f64;
            d.min_rate_bps = d.min_rate_bps.min(rate_bps as f64);
        }
        c
    }

    /// DCQCN preset `name` (see [`DcqcnParams::preset`]) on every QP at the host-link
    /// speed, with the switch ECN marking it was tuned with
    /// ([`EcnSpec::for_dcqcn_preset`]): the paper's reaction point under the
    /// reference simulator's 400 KB Kmin and pmax 0.2 overshoots, keeps alpha high
    /// and recovers at 40 Mb/s per 55 us (63 Gb/s for the 2:1 at 100 Gb/s, against
    /// 97 with the paper's marking). `false` (and nothing changed) for an unknown name.
    pub fn set_dcqcn_preset(&mut self, name: &str) -> bool {
        let rate = self.host_link.rate_bps as f64;
        match (
            DcqcnParams::preset(name, rate),
            EcnSpec::for_dcqcn_preset(name),
        ) {
            (Some(mut d), Some(ecn)) => {
                d.min_rate_bps = d.min_rate_bps.min(rate);
                self.nic.dcqcn = Some(d);
                self.switch.ecn = ecn;
                true
            }
            _ => false,
        }
    }

    /// The TCP baseline at `rate_bps`: no PFC, no DCQCN, drop-tail queues that mark
    /// ECN above K = 100 KB at 100 Gb/s (scaled with speed), and `algorithm` with
    /// Linux defaults (initial window 10, minimum RTO 200 ms).
    pub fn tcp(rate_bps: u64, algorithm: Algorithm) -> Self {
        let mut c = FabricConfig::at_rate(rate_bps);
        c.nic.dcqcn = None;
        c.switch.pfc.enabled = false;
        c.switch.ecn = EcnSpec::at_100g(100_000, 100_000, 1.0);
        c.tcp = Some(TcpSpec {
            params: TcpParams::linux(algorithm, u64::from(c.nic.mtu_bytes)),
            queue_share: 1.0,
        });
        c
    }

    /// Check the configuration; a bad one gets a message naming the key.
    pub fn validate(&self) -> Result<(), String> {
        let bad = |k: &str, why: &str| Err(format!("fabric config `{k}`: {why}"));
        match self.topology {
            Topology::Star { hosts } if hosts == 0 || hosts > 4096 => {
                return bad("topology.hosts", "must be 1..=4096")
            }
            Topology::LeafSpine {
                leaves,
                spines,
                hosts_per_leaf,
            } if leaves == 0
                || spines == 0
                || hosts_per_leaf == 0
                || leaves * hosts_per_leaf > 4096 =>
            {
                return bad(
                    "topology",
                    "leaves, spines and hosts_per_leaf must be > 0, hosts <= 4096",
                )
            }
            _ => {}
        }
        if !matches!(self.ports_per_host, 1 | 2) {
            return bad("ports_per_host", "must be 1 or 2");
        }
        for (k, l) in [
            ("host_link", self.host_link),
            ("fabric_link", self.fabric_link),
        ] {
            if l.rate_bps == 0 {
                return bad(k, "rate must be > 0");
            }
        }
        if !matches!(self.nic.mtu_bytes, 256 | 512 | 1024 | 2048 | 4096) {
            return bad("nic.mtu_bytes", "must be a RoCE MTU (256..4096)");
        }
        if let Err(why) = self.switch.ecn.validate() {
            return bad("switch.ecn", &why);
        }
        if self.switch.ecn_buffer_pct > 100 {
            return bad("switch.ecn_buffer_pct", "must be at most 100");
        }
        if self.switch.buffer_bytes < 1 << 20 {
            return bad("switch.buffer_bytes", "must be at least 1 MiB");
        }
        if let Some(d) = &self.nic.dcqcn {
            d.validate()?;
            if d.line_rate_bps > self.host_link.rate_bps as f64 {
                return bad("nic.dcqcn.line_rate_bps", "exceeds the host link rate");
            }
        }
        if let Some(t) = &self.tcp {
            if self.nic.dcqcn.is_some() || self.switch.pfc.enabled {
                return bad("tcp", "TCP mode runs without DCQCN and without PFC");
            }
            if t.params.mss != u64::from(self.nic.mtu_bytes) {
                return bad("tcp.params.mss", "must equal nic.mtu_bytes");
            }
            if !(t.queue_share > 0.0 && t.queue_share <= 8.0) {
                return bad("tcp.queue_share", "must be in (0, 8]");
            }
        }
        if self.nic.retry_limit.is_some_and(|r| r > 7) {
            return bad("nic.retry_limit", "must be at most 7 (RC's retry_cnt)");
        }
        if self.nic.rto_ns == 0 {
            return bad("nic.rto_ns", "must be > 0");
        }
        if self.nic.send_queue_bytes_max < u64::from(self.nic.mtu_bytes) {
            return bad("nic.send_queue_bytes_max", "below one MTU");
        }
        Ok(())
    }

    /// Time to put `wire_bytes` on a link of `rate_bps`, ns (rounded up).
    pub fn serialization_ns(wire_bytes: u64, rate_bps: u64) -> u64 {
        (wire_bytes as u128 * 8 * 1_000_000_000).div_ceil(rate_bps as u128) as u64
    }
}
