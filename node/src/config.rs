//! The node's configuration file (TOML). Every key but `node.id` and the member
//! list has a default; an unknown key, a bad value or an impossible combination is
//! an error that names the key and the file.
//!
//! ```toml
//! [node]
//! id = 1                      # this node's id, one of cluster.members, or a
//!                             # node that joins later (weir node add)
//! data_dir = "data/node1"     # Raft log and (by default) the device file; default:
//!                             # the directory holding this file
//! # addr = "10.0.0.4:7404"    # a joining node's replication address (the
//!                             # first members' is in cluster.members)
//!
//! [cluster]
//! id = 1                      # connections from other clusters are refused
//! replicas = 3                # replicas per extent (at most the member count)
//! pool_size = "64G"           # the replicated pool that volumes are carved from
//! extent_size = "64M"         # unit of placement, replication and rebuild
//! members = [                 # the first members: id and replication address,
//!   { id = 1, addr = "127.0.0.1:7401" },   # the same list on every node; the
//!                             # first 3 or 5 vote in Raft. Nodes added later
//!                             # (weir node add) are learned from the map
//!   { id = 2, addr = "127.0.0.1:7402" },
//!   { id = 3, addr = "127.0.0.1:7403" },
//! ]
//!
//! [device]
//! path = "device.img"         # file or block device, relative to data_dir; a file
//!                             # is created sparse at pool_size (default device.img)
//! queues = 2                  # queues (io_uring rings, or SPDK queue pairs)
//! queue_depth = 128           # commands in flight per queue
//! driver = "uring"            # or "spdk": SPDK's polled NVMe driver (a build
//!                             # with --features spdk) on the SSD at
//! # pci_addr = "0000:01:00.0" # (bound to vfio-pci by SPDK's scripts/setup.sh),
//! # poll_cores = [2, 3]       # each queue's polling thread pinned to a core,
//! # spdk_mem_mb = 2048        # hugepage memory for SPDK (0: SPDK's default)
//! mode = "interrupt"          # io_uring: "sqpoll" or "iopoll" poll instead
//! scrub_rate = "16M"          # bytes/s the background scrubber reads (0: off)
//! checkpoint_ms = 1000        # block-version checkpoints (0: off; a restarted
//!                             # node is then sent every block again)
//! merge = false               # merge queued requests that continue one another
//! sched_depth = 0             # commands in flight per queue (0: queue_depth);
//!                             # past it requests wait in weir, where they merge
//! classes = true              # rebuild and scrub I/O waits behind
//!                             # clients' requests, two commands on the device
//!
//! [qos]                       # while any volume has QoS (weir volume create|set)
//! admit_depth = 32            # client requests in this node's engine at once;
//!                             # the rest wait, admitted by dmClock
//!
//! [nbd]
//! listen = "127.0.0.1:10809"  # NBD front end; export name = volume name
//! request_timeout_s = 120     # a request retries through failovers, restarts
//!                             # and a slow cluster this long before it fails
//!                             # (EIO); 1 to 600
//!
//! [admin]
//! listen = "127.0.0.1:9401"   # /metrics, /status, /volumes (default 9400 + id)
//!
//! [timeouts]
//! tick_ms = 10                # control-plane tick
//! lease_ms = 1500             # primary lease; a new primary waits this long
//! detect_ms = 1000            # a node silent this long is declared down
//! replace_after_s = 600       # a node down this long is replaced by spares (0: never)
//! replica_ms = 100            # a replica silent this long on a write is dropped
//! device_ms = 100             # a device command outstanding this long: stalled,
//!                             # the node's extents fail over
//! clock_offset_max_us = 1000  # how far any node's clock may be from true time
//! clock_drift_max_ppm = 15    # and how fast or slow it may run; a primary stops
//!                             # serving 2 x offset + 2 x drift x lease before its
//!                             # lease ends
//! ```

pub use device::{DeviceDriver, DeviceMode, DeviceSection};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Largest member count. The 3 or 5 members of the lowest ids vote in Raft; the
/// others learn the map.
pub const MAX_MEMBERS: usize = 64;
/// Most extents a pool may have (the map travels in one wire frame).
pub const MAX_EXTENTS: u64 = 16_384;

/// A size in bytes, written as a number or as a string with a binary suffix
/// (`"64M"`, `"10G"`, `"1T"`; `K`, `M`, `G`, `T`, optionally followed by `iB` or `B`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(try_from = "SizeRepr")]
pub struct Size(pub u64);

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Bytes(u64),
    Text(String),
}

impl TryFrom<SizeRepr> for Size {
    type Error = String;
    fn try_from(r: SizeRepr) -> Result<Self, String> {
        match r {
            SizeRepr::Bytes(b) => Ok(Size(b)),
            SizeRepr::Text(t) => parse_size(&t).map(Size),
        }
    }
}

/// Parse `"10G"`, `"512M"`, `"4096"`, `"1.5G"` (binary units) into bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let unit = unit.trim();
    let shift = match unit.trim_end_matches("iB").trim_end_matches('B') {
        "" => 0,
        "K" | "k" => 10,
        "M" | "m" => 20,
        "G" | "g" => 30,
        "T" | "t" => 40,
        _ => return Err(format!("{text:?}: unknown unit (use K, M, G or T)")),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size"))?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("{text:?} is out of range"));
    }
    Ok(bytes as u64)
}

/// A node's whole configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// This node.
    pub node: NodeSection,
    /// The cluster it belongs to.
    pub cluster: ClusterSection,
    /// Its device.
    #[serde(default)]
    pub device: DeviceSection,
    /// The NBD front end.
    #[serde(default)]
    pub nbd: NbdSection,
    /// The admin and metrics endpoint.
    #[serde(default)]
    pub admin: AdminSection,
    /// Control-plane timing.
    #[serde(default)]
    pub timeouts: TimeoutSection,
    /// The transport between nodes.
    #[serde(default)]
    pub transport: TransportSection,
    /// The RDMA transport's device and pool (with `kind = "rdma"`).
    #[serde(default)]
    pub rdma: RdmaSection,
    /// Admission of client requests by the volumes' QoS.
    #[serde(default)]
    pub qos: QosSection,
    /// The congestion response: the front end's read window, rebuild copies
    /// within each peer's window (`weir_core::flow::FlowConfig`; off by default).
    #[serde(default)]
    pub flow: weir_core::flow::FlowConfig,
    /// Member authentication (mutual TLS under the cluster CA); none: member
    /// links are plain TCP, checked by the cluster id only.
    #[serde(default)]
    pub tls: Option<TlsSection>,
}

/// `[tls]`: this member's certificate and key, and the cluster CA every
/// member's certificate must chain to (`weir cluster init-certs` makes them).
/// Paths are relative to `data_dir`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    /// The cluster CA's certificate (PEM).
    pub ca: PathBuf,
    /// This member's certificate (PEM), naming `node-<id>.weir`.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
}

/// `[qos]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosSection {
    /// Client requests in this node's engine at once while any volume has QoS.
    #[serde(default = "default_admit_depth")]
    pub admit_depth: usize,
}

fn yes() -> bool {
    true
}

fn default_admit_depth() -> usize {
    weir_core::sched::ADMIT_DEPTH_DEFAULT
}

impl Default for QosSection {
    fn default() -> Self {
        QosSection {
            admit_depth: default_admit_depth(),
        }
    }
}

/// `[rdma]`
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RdmaSection {
    /// The verbs device (`ibv_devices` lists them); none: the first.
    pub device: Option<String>,
    /// Its ports to use, numbered from 1: one, or two for multipath (the
    /// messenger spreads peers over them and moves a connection whose port
    /// fails to the other).
    pub ports: Vec<u8>,
    /// The GID table entry of each port to send from: RoCE v2 over the port's
    /// IPv4 or IPv6 address (`show_gids` lists them).
    pub gid_index: u8,
    /// The IP traffic class byte (DSCP << 2, ECN bits) RDMA packets carry:
    /// 0, the default, leaves the port's own (the NIC's per-port
    /// `traffic_class` setting, where the lossless class is usually chosen).
    pub traffic_class: u8,
    /// Bytes of the registered pool that receive slots and granted regions
    /// come from (pinned memory).
    pub pool_bytes: Size,
}

impl Default for RdmaSection {
    fn default() -> Self {
        RdmaSection {
            device: None,
            ports: vec![1],
            gid_index: 1,
            traffic_class: 0,
            pool_bytes: Size(256 << 20),
        }
    }
}

/// `[transport]`
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransportSection {
    /// `"tcp"` (the default) or `"rdma"`.
    #[serde(default)]
    pub kind: TransportKind,
}

/// What carries frames between nodes.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum TransportKind {
    /// TCP (weir-transport-tcp).
    #[default]
    Tcp,
    /// RDMA (weir-transport-rdma over verbs, `[rdma]`): the device is checked
    /// at start, and a machine without one is refused with the reason.
    Rdma,
}

/// `[node]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSection {
    /// This node's id (one of the members, or a node that joins later).
    pub id: u32,
    /// Where the Raft log and the default device file live.
    pub data_dir: Option<PathBuf>,
    /// A joining node's replication address (a first member's is in
    /// `cluster.members`).
    pub addr: Option<SocketAddr>,
}

/// `[cluster]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// Cluster id: connections from another cluster are refused.
    #[serde(default = "one")]
    pub id: u64,
    /// Replicas per extent.
    #[serde(default = "three")]
    pub replicas: u8,
    /// Size of the replicated pool.
    #[serde(default = "default_pool")]
    pub pool_size: Size,
    /// Extent size.
    #[serde(default = "default_extent")]
    pub extent_size: Size,
    /// Every member.
    pub members: Vec<Member>,
}

/// One member of `cluster.members`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// Node id (1 and up).
    pub id: u32,
    /// Its replication (and Raft) address.
    pub addr: SocketAddr,
}

/// `[nbd]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NbdSection {
    /// Listen address.
    #[serde(default = "default_nbd")]
    pub listen: SocketAddr,
    /// NBD over TLS (NBD_OPT_STARTTLS): `"off"` (the default), `"on"`
    /// (offered), or `"require"` (nothing but STARTTLS and ABORT before it).
    #[serde(default)]
    pub tls: NbdTlsMode,
    /// With TLS: the server's certificate (PEM), relative to `data_dir`.
    pub tls_cert: Option<PathBuf>,
    /// With TLS: its private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// With TLS: clients must present a certificate this CA (PEM) signed.
    pub tls_client_ca: Option<PathBuf>,
    /// How long a request keeps retrying (failovers, a restarting node,
    /// refusals a newer map resolves, replies that do not come) before it
    /// fails with EIO: 120 s by default, past the Linux block layer's 30 s
    /// command timeout, so the kernel's client and qemu decide first.
    #[serde(default = "default_request_timeout")]
    pub request_timeout_s: u64,
}

/// `[nbd] tls`.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum NbdTlsMode {
    /// Plain NBD only.
    #[default]
    Off,
    /// TLS offered; plain clients served too.
    On,
    /// TLS required.
    Require,
}

/// `[admin]`
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSection {
    /// Listen address (default `127.0.0.1:` 9400 + node id).
    pub listen: Option<SocketAddr>,
    /// The bearer token every mutating request, and every request from off
    /// loopback, must carry (default `data_dir/admin.token`; made at first
    /// start, mode 0600).
    pub token_file: Option<PathBuf>,
}

/// `[timeouts]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimeoutSection {
    /// Control-plane tick.
    #[serde(default = "ten")]
    pub tick_ms: u64,
    /// Primary lease.
    #[serde(default = "default_lease")]
    pub lease_ms: u64,
    /// Failure detection.
    #[serde(default = "default_detect")]
    pub detect_ms: u64,
    /// A node down this long has its replicas moved to spares (re-replication);
    /// 0 never gives up on a node. Longer than a reboot, so a restart only
    /// catches up instead of copying whole extents elsewhere.
    #[serde(default = "default_replace")]
    pub replace_after_s: u64,
    /// A replica silent this long on a write is asked to be dropped.
    #[serde(default = "default_replica_ms")]
    pub replica_ms: u64,
    /// A device command outstanding this long (at two ticks) means the device
    /// stalled: the node stops heartbeating and its extents fail over.
    #[serde(default = "default_device_ms")]
    pub device_ms: u64,
    /// Largest offset of any member's clock from true time (NTP on one LAN).
    #[serde(default = "default_offset_us")]
    pub clock_offset_max_us: u64,
    /// Largest rate error of any member's clock.
    #[serde(default = "default_drift_ppm")]
    pub clock_drift_max_ppm: u64,
}

impl TimeoutSection {
    /// The clocks' bound, from which the lease margin is derived.
    pub fn clock_bound(&self) -> weir_core::time::ClockBound {
        weir_core::time::ClockBound {
            offset_max_ns: self.clock_offset_max_us.saturating_mul(1000),
            drift_max_ppm: self.clock_drift_max_ppm,
        }
    }

    /// How long before its lease's end a primary stops serving, ns.
    pub fn lease_margin_ns(&self) -> u64 {
        self.clock_bound()
            .lease_margin_ns(self.lease_ms.saturating_mul(1_000_000))
    }
}

fn default_replica_ms() -> u64 {
    weir_core::replication::DEFAULT_REPLICA_TIMEOUT_NS / 1_000_000
}
fn default_device_ms() -> u64 {
    weir_core::node::DEFAULT_DEVICE_TIMEOUT.as_millis() as u64
}
fn default_offset_us() -> u64 {
    weir_core::time::ClockBound::DEFAULT.offset_max_ns / 1000
}
fn default_drift_ppm() -> u64 {
    weir_core::time::ClockBound::DEFAULT.drift_max_ppm
}

fn default_replace() -> u64 {
    600
}

fn one() -> u64 {
    1
}
fn two() -> u16 {
    2
}
fn three() -> u8 {
    3
}
fn ten() -> u64 {
    10
}
fn default_pool() -> Size {
    Size(64 << 30)
}
fn default_extent() -> Size {
    Size(64 << 20)
}
fn default_nbd() -> SocketAddr {
    "127.0.0.1:10809".parse().expect("a valid address")
}
fn default_request_timeout() -> u64 {
    weir_core::client::REQUEST_TIMEOUT.as_secs()
}
fn default_lease() -> u64 {
    weir_core::control::DEFAULT_LEASE_NS / 1_000_000
}
fn default_detect() -> u64 {
    1000
}

impl Default for NbdSection {
    fn default() -> Self {
        NbdSection {
            listen: default_nbd(),
            tls: NbdTlsMode::Off,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            request_timeout_s: default_request_timeout(),
        }
    }
}

impl Default for TimeoutSection {
    fn default() -> Self {
        TimeoutSection {
            tick_ms: ten(),
            lease_ms: default_lease(),
            detect_ms: default_detect(),
            replace_after_s: default_replace(),
            replica_ms: default_replica_ms(),
            device_ms: default_device_ms(),
            clock_offset_max_us: default_offset_us(),
            clock_drift_max_ppm: default_drift_ppm(),
        }
    }
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The file is not valid TOML for a weir config (the message names the key).
    #[error("{path}: {error}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with the key and the line.
        error: Box<toml::de::Error>,
    },
    /// A value is out of range or contradicts another.
    #[error("{path}: key `{key}`: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The key at fault.
        key: &'static str,
        /// What is wrong.
        message: String,
    },
}

impl Config {
    /// Read and check the config at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        let mut config = Config::parse(&text, path)?;
        if config.node.data_dir.is_none() {
            let dir = path.parent().unwrap_or(Path::new("."));
            config.node.data_dir = Some(dir.to_path_buf());
        }
        Ok(config)
    }

    /// Parse and check `text` (from `path`, for messages).
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|error| ConfigError::Parse {
            path: path.to_path_buf(),
            error: Box::new(error),
        })?;
        config.check(path)?;
        Ok(config)
    }

    fn check(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |(key, message)| ConfigError::Invalid {
            path: path.to_path_buf(),
            key,
            message,
        };
        self.check_links().map_err(invalid)?;
        self.check_cluster().map_err(invalid)?;
        self.check_front_end().map_err(invalid)?;
        self.check_timeouts().map_err(invalid)
    }

    /// `[flow]`, `[qos]` and `[rdma]`.
    fn check_links(&self) -> Result<(), (&'static str, String)> {
        let bad = |key: &'static str, message: String| Err((key, message));
        if let Err((key, why)) = self.flow.check() {
            return bad(key, why.to_string());
        }
        if !(1..=65_536).contains(&self.qos.admit_depth) {
            return bad(
                "qos.admit_depth",
                format!("{}: must be between 1 and 65536", self.qos.admit_depth),
            );
        }
        let r = &self.rdma;
        let mut ports = r.ports.clone();
        ports.sort_unstable();
        ports.dedup();
        if r.ports.is_empty()
            || r.ports.len() > 2
            || ports.len() != r.ports.len()
            || ports.contains(&0)
        {
            return bad(
                "rdma.ports",
                format!(
                    "{:?}: one or two distinct port numbers (from 1) are supported",
                    r.ports
                ),
            );
        }
        if !(1 << 20..=64 << 30).contains(&r.pool_bytes.0) {
            return bad(
                "rdma.pool_bytes",
                format!("{}: must be between 1 MiB and 64 GiB", r.pool_bytes.0),
            );
        }
        Ok(())
    }

    /// `[cluster]` and `[node]`.
    fn check_cluster(&self) -> Result<(), (&'static str, String)> {
        let bad = |key: &'static str, message: String| Err((key, message));
        let members = &self.cluster.members;
        if members.is_empty() || members.len() > MAX_MEMBERS {
            return bad(
                "cluster.members",
                format!(
                    "{} members; 1 to {MAX_MEMBERS} are supported",
                    members.len()
                ),
            );
        }
        self.check_ids()?;
        let r = usize::from(self.cluster.replicas);
        if r == 0 || r > members.len() {
            return bad(
                "cluster.replicas",
                format!("{r}: must be 1 to the member count ({})", members.len()),
            );
        }
        let extent = self.cluster.extent_size.0;
        if extent < (1 << 20) || !extent.is_power_of_two() {
            return bad(
                "cluster.extent_size",
                format!("{extent} bytes: must be a power of two of at least 1M"),
            );
        }
        let pool = self.cluster.pool_size.0;
        if pool == 0 || !pool.is_multiple_of(extent) {
            return bad(
                "cluster.pool_size",
                format!("{pool} bytes: must be a whole number of extents ({extent} bytes)"),
            );
        }
        if pool / extent > MAX_EXTENTS {
            return bad(
                "cluster.pool_size",
                format!(
                    "{} extents; at most {MAX_EXTENTS} (raise cluster.extent_size)",
                    pool / extent
                ),
            );
        }
        Ok(())
    }

    /// The members' ids and this node's.
    fn check_ids(&self) -> Result<(), (&'static str, String)> {
        let bad = |key: &'static str, message: String| Err((key, message));
        let members = &self.cluster.members;
        let mut ids: Vec<u32> = members.iter().map(|m| m.id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) || ids.contains(&0) {
            return bad("cluster.members", "ids must be distinct and above 0".into());
        }
        if ids.iter().any(|&id| id >= crate::CLIENT_ID_BASE) {
            return bad(
                "cluster.members",
                format!("ids must be below {}", crate::CLIENT_ID_BASE),
            );
        }
        match (ids.contains(&self.node.id), self.node.addr) {
            (false, None) => {
                return bad(
                    "node.id",
                    format!(
                        "{} is not one of cluster.members {ids:?}; a node that joins later \
                         names its own replication address (node.addr)",
                        self.node.id
                    ),
                )
            }
            (true, Some(_)) => {
                return bad(
                    "node.addr",
                    "a first member's address is its entry in cluster.members".into(),
                )
            }
            _ => {}
        }
        if self.node.id == 0 || self.node.id >= crate::CLIENT_ID_BASE {
            return bad(
                "node.id",
                format!("must be 1 to {}", crate::CLIENT_ID_BASE - 1),
            );
        }
        Ok(())
    }

    /// `[device]` and `[nbd]`.
    fn check_front_end(&self) -> Result<(), (&'static str, String)> {
        let bad = |key: &'static str, message: String| Err((key, message));
        if let Err((key, why)) = self.device.check() {
            return bad(key, why);
        }
        let n = &self.nbd;
        let most = weir_core::client::REQUEST_TIMEOUT_MAX.as_secs();
        if !(1..=most).contains(&n.request_timeout_s) {
            return bad(
                "nbd.request_timeout_s",
                format!(
                    "{} s: must be 1 to {most} (nodes remember a write for a retry of it \
                     only so long)",
                    n.request_timeout_s
                ),
            );
        }
        if n.tls != NbdTlsMode::Off && (n.tls_cert.is_none() || n.tls_key.is_none()) {
            return bad(
                "nbd.tls",
                "TLS needs tls_cert and tls_key (weir cluster init-certs makes them)".into(),
            );
        }
        if n.tls == NbdTlsMode::On && n.tls_client_ca.is_some() {
            return bad(
                "nbd.tls",
                "tls_client_ca with tls = \"on\" would still serve plain clients without a \
                 certificate; use tls = \"require\""
                    .into(),
            );
        }
        Ok(())
    }

    /// `[timeouts]`.
    fn check_timeouts(&self) -> Result<(), (&'static str, String)> {
        let bad = |key: &'static str, message: String| Err((key, message));
        let t = &self.timeouts;
        if t.tick_ms == 0 || t.detect_ms < 4 * t.tick_ms || t.lease_ms <= t.detect_ms {
            return bad(
                "timeouts",
                "need tick_ms > 0, detect_ms >= 4 x tick_ms and lease_ms > detect_ms".into(),
            );
        }
        if t.replace_after_s != 0 && t.replace_after_s.saturating_mul(1000) <= t.lease_ms {
            return bad(
                "timeouts.replace_after_s",
                "a node is replaced only after its lease has run out: above lease_ms, or 0".into(),
            );
        }
        if t.replica_ms == 0 || t.device_ms == 0 {
            return bad(
                "timeouts",
                "replica_ms and device_ms must be above 0".into(),
            );
        }
        if t.lease_margin_ns() >= t.lease_ms.saturating_mul(1_000_000) / 4 {
            return bad(
                "timeouts.clock_offset_max_us",
                format!(
                    "clocks this far apart leave a primary too little of its lease: the \
                     margin, 2 x offset + 2 x drift x lease = {} us, must stay below a \
                     quarter of lease_ms",
                    t.lease_margin_ns() / 1000
                ),
            );
        }
        Ok(())
    }

    /// The data directory (set by [`Config::load`]).
    pub fn data_dir(&self) -> PathBuf {
        self.node
            .data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("."))
    }

    /// The device path, resolved against the data directory.
    pub fn device_path(&self) -> PathBuf {
        self.data_dir().join(&self.device.path)
    }

    /// This member's TLS identity, from the files `[tls]` names; `None`
    /// without `[tls]`.
    pub fn tls_identity(&self) -> anyhow::Result<Option<weir_transport_tcp::TlsIdentity>> {
        let Some(tls) = &self.tls else {
            return Ok(None);
        };
        let read = |path: &Path| {
            let path = self.data_dir().join(path);
            std::fs::read(&path).map_err(|e| anyhow::anyhow!("[tls] {}: {e}", path.display()))
        };
        let identity = weir_transport_tcp::TlsIdentity::from_pem(
            &read(&tls.ca)?,
            &read(&tls.cert)?,
            &read(&tls.key)?,
        )
        .map_err(|e| anyhow::anyhow!("[tls]: {e}"))?;
        Ok(Some(identity))
    }

    /// The NBD front end's TLS, from `[nbd]`.
    pub fn nbd_tls(&self) -> anyhow::Result<crate::nbd::NbdTls> {
        let n = &self.nbd;
        let (Some(cert), Some(key)) = (&n.tls_cert, &n.tls_key) else {
            return Ok(crate::nbd::NbdTls::off());
        };
        if n.tls == NbdTlsMode::Off {
            return Ok(crate::nbd::NbdTls::off());
        }
        let read = |path: &Path| {
            let path = self.data_dir().join(path);
            std::fs::read(&path).map_err(|e| anyhow::anyhow!("[nbd] {}: {e}", path.display()))
        };
        let client_ca = n.tls_client_ca.as_deref().map(read).transpose()?;
        crate::nbd::NbdTls::new(
            &read(cert)?,
            &read(key)?,
            client_ca.as_deref(),
            n.tls == NbdTlsMode::Require,
        )
        .map_err(|e| anyhow::anyhow!("[nbd] TLS: {e}"))
    }

    /// The admin token's file, resolved against the data directory.
    pub fn admin_token_path(&self) -> PathBuf {
        let file = self
            .admin
            .token_file
            .clone()
            .unwrap_or_else(|| PathBuf::from("admin.token"));
        self.data_dir().join(file)
    }

    /// The admin listen address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.listen.unwrap_or_else(|| {
            SocketAddr::from(([127, 0, 0, 1], 9400 + self.node.id.min(600) as u16))
        })
    }

    /// This node's replication address.
    pub fn my_addr(&self) -> SocketAddr {
        let member = self.cluster.members.iter().find(|m| m.id == self.node.id);
        match (member, self.node.addr) {
            (Some(m), _) => m.addr,
            (None, Some(addr)) => addr,
            (None, None) => unreachable!("checked: a joining node names its address"),
        }
    }

    /// Whether this node joins a running cluster (it is not a first member).
    pub fn joins(&self) -> bool {
        !self.cluster.members.iter().any(|m| m.id == self.node.id)
    }
}

mod device;
#[cfg(test)]
mod tests;
