//! The scenario's named volumes (`[[volumes]]`) and the primaries' admission
//! of their requests (`[qos]`): where each volume lies in the pool, its QoS.

use super::Scenario;
use serde::Deserialize;
use weir_core::control::qos::Qos;

/// The named volume of the workload's extents that no `[[volumes]]` takes:
/// every block a client writes is in a named volume.
pub const REST_VOLUME: &str = "pool-rest";

/// A named volume of the scenario: a share of the pool's extents, with QoS.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct VolumeSpecToml {
    /// Its name.
    pub name: String,
    /// Its share of the pool's extents, percent (volumes take consecutive runs).
    pub share_percent: u32,
    /// Most requests per second over the cluster (0: none).
    pub iops_limit: u64,
    /// Most MiB per second over the cluster (0: none).
    pub bw_limit_mib: u64,
    /// Requests per second reserved (0: none).
    pub iops_reservation: u64,
    /// Share of what is left beyond reservations.
    pub weight: u32,
}

impl Default for VolumeSpecToml {
    fn default() -> Self {
        VolumeSpecToml {
            name: String::new(),
            share_percent: 50,
            iops_limit: 0,
            bw_limit_mib: 0,
            iops_reservation: 0,
            weight: weir_core::control::qos::QOS_WEIGHT_DEFAULT,
        }
    }
}

impl VolumeSpecToml {
    /// Its QoS in the map.
    pub fn qos(&self) -> Qos {
        Qos {
            iops_limit: self.iops_limit,
            bw_limit: self.bw_limit_mib << 20,
            iops_reservation: self.iops_reservation,
            weight: self.weight,
        }
    }
}

/// Admission of client requests at the primaries: dmClock by the volumes' QoS.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QosSpec {
    /// Whether the volumes' QoS goes into the map (false: the volumes are
    /// created without it, and nothing is admitted).
    pub enabled: bool,
    /// Client requests in each node's engine at once; the rest wait for
    /// admission.
    pub depth: usize,
}

impl Default for QosSpec {
    fn default() -> Self {
        QosSpec {
            enabled: true,
            depth: weir_core::sched::ADMIT_DEPTH_DEFAULT,
        }
    }
}

impl Scenario {
    /// The pool's extents the workload and `[[volumes]]` use: all but those
    /// kept for the snapshot stage, at its end.
    pub fn pool_extents(&self) -> u64 {
        self.cluster
            .volume_mib
            .div_ceil(self.cluster.extent_mib)
            .saturating_sub(self.reserved_extents())
    }

    /// Pool extents kept for the snapshot stage: its volume, a redirected
    /// extent per snapshot, the clone's, and as many again to spare.
    pub fn reserved_extents(&self) -> u64 {
        let s = &self.snapshots;
        if s.rounds == 0 {
            return 0;
        }
        s.extents * (2 * u64::from(s.rounds) + 4)
    }

    /// The blocks the workload and `[[volumes]]` use, from the pool's first.
    pub fn unreserved_blocks(&self) -> u64 {
        let c = &self.cluster;
        let bs = u64::from(c.block_size);
        (self.pool_extents() * ((c.extent_mib << 20) / bs)).min((c.volume_mib << 20) / bs)
    }

    /// Each named volume's run of the pool's extents (first, count), as the map
    /// places them: in order, each its share (at least one extent).
    pub fn volume_extents(&self) -> Vec<(u64, u64)> {
        let extents = self.pool_extents();
        let mut first = 0;
        self.volumes
            .iter()
            .map(|v| {
                let share = (extents * u64::from(v.share_percent) / 100).max(1);
                first += share;
                (first - share, share)
            })
            .collect()
    }

    /// The named volumes' blocks: (name, first block, blocks).
    pub fn volume_ranges(&self) -> Vec<(String, u64, u64)> {
        let c = &self.cluster;
        let bs = u64::from(c.block_size);
        let capacity = (c.volume_mib << 20) / bs;
        let extent_blocks = (c.extent_mib << 20) / bs;
        self.volumes
            .iter()
            .zip(self.volume_extents())
            .map(|(v, (first, count))| {
                let start = first * extent_blocks;
                let end = ((first + count) * extent_blocks).min(capacity);
                (v.name.clone(), start, end - start)
            })
            .collect()
    }

    /// Check `[[volumes]]`, the volumes the clients name, and `[qos]`.
    pub(super) fn validate_volumes(&self) -> Result<(), (&'static str, String)> {
        let bad = |key, why: &str| Err((key, why.to_string()));
        let mut share = 0;
        for (i, v) in self.volumes.iter().enumerate() {
            if weir_core::control::state::check_name(&v.name).is_err()
                || self.volumes[..i].iter().any(|u| u.name == v.name)
            {
                return bad(
                    "volumes.name",
                    "a volume needs a distinct name (letters, digits, - _ .)",
                );
            }
            if v.share_percent == 0 {
                return bad("volumes.share_percent", "must be above 0");
            }
            share += v.share_percent;
            if let Err(e) = v.qos().check() {
                return Err(("volumes", format!("{}: {e}", v.name)));
            }
        }
        let s = &self.snapshots;
        if s.rounds > 0 && (s.extents == 0 || s.rounds > 8) {
            return bad(
                "snapshots",
                "a snapshot stage takes 1 to 8 rounds on 1 or more extents",
            );
        }
        let total = self.cluster.volume_mib.div_ceil(self.cluster.extent_mib);
        if self.reserved_extents() >= total {
            return bad(
                "snapshots.extents",
                "the stage needs fewer extents than the pool has",
            );
        }
        if self.volumes.iter().any(|v| v.name == REST_VOLUME) {
            return bad(
                "volumes.name",
                "\"pool-rest\" is the name of the pool's extents no volume takes",
            );
        }
        let taken: u64 = self.volume_extents().iter().map(|&(_, n)| n).sum();
        if self.pool_extents() > weir_core::control::state::MAX_TABLE_ENTRIES
            && (!self.volumes.is_empty() || s.rounds > 0)
        {
            return bad(
                "volumes",
                "named volumes hold at most 32768 extents in all (use larger extents)",
            );
        }
        if share > 100 || taken > self.pool_extents() {
            return bad(
                "volumes.share_percent",
                "the volumes' shares add up to at most 100",
            );
        }
        let named = |name: &str| name.is_empty() || self.volumes.iter().any(|v| v.name == name);
        if !named(&self.workload.volume) || !self.extra_clients.iter().all(|e| named(&e.volume)) {
            return bad("workload.volume", "names no volume of [[volumes]]");
        }
        if self.qos.depth == 0 || self.qos.depth > 1 << 16 {
            return bad("qos.depth", "must be between 1 and 65536");
        }
        Ok(())
    }
}
