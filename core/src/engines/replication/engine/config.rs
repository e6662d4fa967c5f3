//! The engine's switches and rates ([`ReplicationConfig`]), with their defaults.

/// The default of [`ReplicationConfig::replica_timeout_ns`]: a write a replica
/// has not acknowledged for this long makes the primary ask the control plane to
/// drop that replica from the in-sync set.
pub const DEFAULT_REPLICA_TIMEOUT_NS: u64 = 100_000_000;

/// TEST ONLY: deliberate bugs, each to prove that one of the simulator's
/// checkers can fail. They take effect only where weir-core is built with its
/// `bugs` feature (the simulator, and weir-core's own tests); in the daemon's
/// build [`ReplicationConfig::bugs`] is always all off, and the branches that
/// read it are compiled out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bugs {
    /// The primary does not forward writes to the last replica of each extent
    /// and counts it as acknowledged.
    pub skip_last_replica: bool,
    /// The primary acknowledges a write as soon as all but the slowest in-sync
    /// replica have persisted it.
    pub ack_before_slowest: bool,
    /// A new primary serves at once after a failover, without waiting for the
    /// old primary's lease to run out.
    pub serve_before_lease: bool,
    /// A rebuild leaves out the extent's newest block, so the replica joins the
    /// in-sync set one version short.
    pub rebuild_one_short: bool,
    /// A replica takes a write that carries an older epoch than its map's,
    /// trusting the sender's view (no epoch, primary or membership check).
    pub accept_stale_epoch: bool,
    /// A primary serves until its lease's end as its own clock reads it,
    /// ignoring `lease_margin_ns` (safe only when every clock agrees).
    pub ignore_lease_margin: bool,
}

/// Whether this build lets deliberate bugs take effect.
pub(crate) const BUGS_BUILT: bool = cfg!(any(test, feature = "bugs"));

/// Engine switches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicationConfig {
    /// TEST ONLY: the deliberate bugs asked for (see [`Bugs`]; read through
    /// [`ReplicationConfig::bugs`]).
    pub bugs_asked: Bugs,
    /// How long before its lease's end a primary stops serving, ns: the clocks'
    /// disagreement ([`crate::time::ClockBound::lease_margin_ns`]).
    pub lease_margin_ns: u64,
    /// A replica silent this long on a write, a repair or a reconciliation is
    /// asked to be dropped from the in-sync set, ns.
    pub replica_timeout_ns: u64,
    /// Report [`super::Audit`] facts (the simulator's invariant checkers use them).
    pub audit: bool,
    /// Rebuild bandwidth of one primary over all its rebuilds, bytes per second;
    /// 0 means [`super::DEFAULT_REBUILD_BYTES_PER_SEC`].
    pub rebuild_bytes_per_sec: u64,
    /// Background scrub rate of one node, bytes per second; 0: no scrubbing.
    pub scrub_bytes_per_sec: u64,
    /// How often a node checkpoints its block versions (a device flush, then
    /// [`super::Action::Checkpoint`]), ns; 0: never (a restarted node is then sent every
    /// block it has not been written since).
    pub checkpoint_every_ns: u64,
    /// Bytes per version grain (see [`crate::replication::grains`]); 0:
    /// [`crate::replication::grains::DEFAULT_GRAIN_BYTES`]. Every node of a
    /// cluster must use the same.
    pub version_grain_bytes: u64,
    /// Every node runs a front end of its own ([`crate::front_end`]) that holds
    /// its writes' payloads: a primary sends a replica write to the node whose
    /// front end is the write's client without its data.
    pub front_end_payloads: bool,
}

impl ReplicationConfig {
    /// The deliberate bugs in effect: those asked for, in a build with the
    /// `bugs` feature; none otherwise.
    pub fn bugs(&self) -> Bugs {
        if BUGS_BUILT {
            self.bugs_asked
        } else {
            Bugs::default()
        }
    }

    /// Blocks per version grain in `volume` (see [`crate::replication::grains::grain_blocks`]).
    pub fn grain_blocks(&self, volume: &crate::map::VolumeSpec) -> u64 {
        crate::replication::grains::grain_blocks(
            self.version_grain_bytes,
            volume.block_size,
            (volume.extent_blocks, volume.capacity_blocks),
            volume.max_request_blocks,
        )
    }
}

impl Default for ReplicationConfig {
    /// No bugs, no audit, default rates, and the lease margin of
    /// [`crate::time::ClockBound::DEFAULT`] for the default lease.
    fn default() -> Self {
        ReplicationConfig {
            bugs_asked: Bugs::default(),
            lease_margin_ns: crate::time::ClockBound::DEFAULT
                .lease_margin_ns(crate::control::DEFAULT_LEASE_NS),
            replica_timeout_ns: DEFAULT_REPLICA_TIMEOUT_NS,
            audit: false,
            rebuild_bytes_per_sec: 0,
            scrub_bytes_per_sec: 0,
            checkpoint_every_ns: 0,
            version_grain_bytes: 0,
            front_end_payloads: false,
        }
    }
}
