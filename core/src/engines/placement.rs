//! Placement: which devices hold each placement group's (PG's) replicas, in
//! what order (the first is the PG's preferred primary), and which PG holds
//! each object of a volume.
//!
//! The algorithm is **ranked straw2**. For a PG, every device of nonzero
//! weight draws straw2's weighted straw: its cost is `-log2(u) / weight`,
//! where `u` is a 64-bit hash of (pool, PG, device) taken as a fraction of
//! 2^64, and the devices are ranked by cost, least first. The replicas are
//! the first devices in that ranking whose failure domain no earlier replica
//! has. What follows from it:
//!
//! - A device ranks first with a chance proportional to its weight (its cost
//!   is an exponential variable of rate `weight`), so capacity fills in
//!   proportion to size, and so do primaries.
//! - Every device's draw depends on that device alone. A device added (or
//!   whose weight grows) can only rise in some PGs' rankings: where it ranks
//!   among a PG's replicas it takes exactly one place (its own domain's, or
//!   else the last), so **everything that moves moves onto it** (a grown
//!   device may also come to lead PGs it already held). A device
//!   removed (weight 0, or gone) moves exactly the replicas it held. Ceph's
//!   straw2 buckets have the same property per bucket; ranking every device
//!   at once keeps it across failure domains too (choosing a rack first, then a
//!   device in it, would move about twice a new device's share: PGs that newly
//!   choose its rack land on the rack's other devices as well).
//! - No two replicas share a failure domain: a host always, and a rack or a
//!   zone where nodes carry such labels ([`Level`]). The level is the widest
//!   the devices allow, so a change that alters it (a labelled rack count
//!   reaching the replica count, or falling below it) re-places most PGs, and
//!   the movement bounds above hold only for changes within one level. Once
//!   the map holds pools, a pool's level will be fixed when it is made.
//!
//! Costs are fixed-point (log2 to 32 fraction bits in integer arithmetic, and
//! costs compared by cross-multiplication), so every node computes the same
//! placement on every platform, as Ceph's straw2 does with its integer ln.
//!
//! Cost: `place` draws once per device (a hash and a table lookup), keeping
//! each failure domain's best device, then takes the best domains, in time
//! `O(devices + replicas x domains)`. A whole pool is `O(PGs x devices)`
//! (1,024 devices and 32,768 PGs: see docs/architecture.md), done when a
//! device joins, leaves or changes weight, never on the data path.

use crate::ids::{DeviceId, NodeId, PgId, VolumeId};
use std::collections::BTreeMap;

/// PG replicas per device a pool gets by default (the count Ceph aims for).
pub const PG_REPLICAS_PER_DEVICE: u64 = 100;

/// The failure domain no two replicas of a PG share.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// A node: always distinct.
    Host,
    /// A rack (`[node] labels = { rack = "..." }`): distinct where at least one
    /// node is labelled and there are as many racks as replicas; a node with no
    /// rack label is a rack of its own.
    Rack,
    /// A zone (`labels = { zone = "..." }`), in the same way.
    Zone,
}

/// One device as placement sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The device.
    pub id: DeviceId,
    /// The node it is on.
    pub host: NodeId,
    /// Its share of the data relative to the others' (its usable bytes); 0
    /// for a device being drained or out.
    pub weight: u64,
    /// Its node's rack label, if any.
    pub rack: Option<String>,
    /// Its node's zone label, if any.
    pub zone: Option<String>,
}

/// A set of devices placement cannot work with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// Zero replicas asked for.
    #[error("a pool needs at least one replica")]
    NoReplicas,
    /// Fewer hosts with weighted devices than replicas.
    #[error("{replicas} replicas need devices on {replicas} hosts, have {hosts}")]
    TooFewHosts {
        /// Replicas asked for.
        replicas: usize,
        /// Hosts with a device of nonzero weight.
        hosts: usize,
    },
    /// A device id given twice.
    #[error("device {0} given twice")]
    DuplicateDevice(DeviceId),
    /// Two devices of one node with different labels (labels are a node's).
    #[error("devices of {0} carry different rack or zone labels")]
    SplitHost(NodeId),
}

/// One device, with its failure domains as indices.
#[derive(Clone, Debug)]
struct Entry {
    id: DeviceId,
    host: NodeId,
    weight: u64,
    /// Index of its domain at the placement's level.
    domain: u32,
}

/// The devices of a pool, ready to place its PGs.
#[derive(Clone, Debug)]
pub struct Placement {
    /// Devices of nonzero weight, by id.
    devices: Vec<Entry>,
    /// Failure domains at `level` (domain indices are `0..domains`).
    domains: u32,
    replicas: usize,
    level: Level,
    /// The pool's seed: pools over the same devices place differently.
    seed: u32,
}

impl Placement {
    /// Placement of `replicas` copies over `devices` for the pool seeded
    /// `seed`, at the widest failure domain the labels allow.
    pub fn new(devices: &[DeviceSpec], replicas: usize, seed: u32) -> Result<Self, PlacementError> {
        if replicas == 0 {
            return Err(PlacementError::NoReplicas);
        }
        let mut by_id = BTreeMap::new();
        let mut labels: BTreeMap<NodeId, (&Option<String>, &Option<String>)> = BTreeMap::new();
        for d in devices {
            if by_id.insert(d.id, d).is_some() {
                return Err(PlacementError::DuplicateDevice(d.id));
            }
            let mine = (&d.rack, &d.zone);
            if *labels.entry(d.host).or_insert(mine) != mine {
                return Err(PlacementError::SplitHost(d.host));
            }
        }
        let weighted: Vec<&DeviceSpec> = by_id.into_values().filter(|d| d.weight > 0).collect();
        // Each level's domain of a device: its label, or its host's own.
        let domain_key = |d: &DeviceSpec, level: Level| -> (bool, String) {
            let label = match level {
                Level::Host => None,
                Level::Rack => d.rack.as_ref(),
                Level::Zone => d.zone.as_ref(),
            };
            match label {
                Some(l) => (true, l.clone()),
                None => (false, d.host.0.to_string()),
            }
        };
        let hosts = weighted
            .iter()
            .map(|d| d.host)
            .collect::<std::collections::BTreeSet<_>>();
        if hosts.len() < replicas {
            return Err(PlacementError::TooFewHosts {
                replicas,
                hosts: hosts.len(),
            });
        }
        let level = [Level::Zone, Level::Rack]
            .into_iter()
            .find(|&level| {
                let keys: std::collections::BTreeSet<_> =
                    weighted.iter().map(|d| domain_key(d, level)).collect();
                keys.iter().any(|(labelled, _)| *labelled) && keys.len() >= replicas
            })
            .unwrap_or(Level::Host);
        let mut index: BTreeMap<(bool, String), u32> = BTreeMap::new();
        let devices = weighted
            .iter()
            .map(|d| {
                let next = index.len() as u32;
                let domain = *index.entry(domain_key(d, level)).or_insert(next);
                Entry {
                    id: d.id,
                    host: d.host,
                    weight: d.weight,
                    domain,
                }
            })
            .collect();
        Ok(Placement {
            devices,
            domains: index.len() as u32,
            replicas,
            level,
            seed,
        })
    }

    /// The failure domain no two replicas share.
    pub fn level(&self) -> Level {
        self.level
    }

    /// Replicas of each PG.
    pub fn replicas(&self) -> usize {
        self.replicas
    }

    /// The devices of `pg`, the preferred primary first.
    pub fn place(&self, pg: PgId) -> Vec<DeviceId> {
        self.place_with(pg, &mut Vec::new())
    }

    /// The devices of PGs `0..pgs`, in order.
    pub fn place_all(&self, pgs: u32) -> Vec<Vec<DeviceId>> {
        let mut best = Vec::with_capacity(self.domains as usize);
        (0..pgs)
            .map(|pg| self.place_with(PgId(pg), &mut best))
            .collect()
    }

    fn place_with(&self, pg: PgId, best: &mut Vec<Option<(u64, usize)>>) -> Vec<DeviceId> {
        let base = mix((u64::from(self.seed) << 32) | u64::from(pg.0));
        // The greedy walk down the ranking takes the first `replicas` domains
        // to appear in it, each with its best device: so find each domain's
        // best device in one pass, then the `replicas` best domains.
        best.clear();
        best.resize(self.domains as usize, None);
        for (i, d) in self.devices.iter().enumerate() {
            let cost = straw_cost(draw(base, d.id));
            let slot = &mut best[d.domain as usize];
            if slot.is_none_or(|(c, b)| ranks_before((cost, d.weight), (c, self.devices[b].weight)))
            {
                *slot = Some((cost, i));
            }
        }
        let mut chosen: Vec<usize> = Vec::with_capacity(self.replicas);
        for _ in 0..self.replicas {
            let mut pick: Option<usize> = None;
            for (dom, slot) in best.iter().enumerate() {
                let Some((c, i)) = *slot else { continue };
                let better = pick.is_none_or(|p| {
                    let (pc, pi) = best[p].expect("picked");
                    ranks_before((c, self.devices[i].weight), (pc, self.devices[pi].weight))
                        || (!ranks_before(
                            (pc, self.devices[pi].weight),
                            (c, self.devices[i].weight),
                        ) && i < pi)
                });
                if better {
                    pick = Some(dom);
                }
            }
            let dom = pick.expect("Placement::new counted a domain per replica");
            chosen.push(best[dom].expect("picked").1);
            best[dom] = None;
        }
        debug_assert!(
            {
                let mut hosts: Vec<NodeId> = chosen.iter().map(|&i| self.devices[i].host).collect();
                hosts.sort();
                hosts.windows(2).all(|w| w[0] != w[1])
            },
            "two replicas of {pg} on one host"
        );
        chosen.into_iter().map(|i| self.devices[i].id).collect()
    }
}

/// True when a device of straw cost `a.0` and weight `a.1` ranks before one of
/// `b`: the lesser cost/weight, compared as `cost_a * w_b < cost_b * w_a`
/// (exact in u128: a cost is below 2^38).
fn ranks_before(a: (u64, u64), b: (u64, u64)) -> bool {
    u128::from(a.0) * u128::from(b.1) < u128::from(b.0) * u128::from(a.1)
}

/// The PG count a pool over `devices` devices gets by default: about
/// [`PG_REPLICAS_PER_DEVICE`] replicas a device, as the power of two nearest
/// (by ratio) to `devices x 100 / replicas`, so that [`pg_of`] spreads objects
/// evenly over PGs.
pub fn default_pg_count(devices: usize, replicas: usize) -> u32 {
    let want = (devices as u64 * PG_REPLICAS_PER_DEVICE / replicas.max(1) as u64).max(1);
    let up = want.next_power_of_two();
    let down = up / 2;
    // Nearest by ratio: down if want/down < up/want, i.e. want^2 < up*down.
    let pick =
        if down > 0 && u128::from(want) * u128::from(want) < u128::from(up) * u128::from(down) {
            down
        } else {
            up
        };
    pick.min(1 << 31) as u32
}

/// The PG of a pool of `pgs` PGs that holds `object` of `volume`. Ceph's
/// stable mod: when the count doubles, each PG's objects go to it or to one
/// new PG (splitting a PG is then a local copy: see docs/architecture.md).
pub fn pg_of(volume: VolumeId, object: u64, pgs: u32) -> PgId {
    assert!(pgs > 0, "a pool has PGs");
    let h = mix(mix(u64::from(volume.0)) ^ object.wrapping_mul(GOLDEN));
    let mask = u64::from(pgs).next_power_of_two() - 1;
    let pg = if h & mask < u64::from(pgs) {
        h & mask
    } else {
        h & (mask >> 1)
    };
    PgId(pg as u32)
}

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// splitmix64's finaliser: every input bit moves every output bit.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A device's hash for the PG whose hash is `base`.
fn draw(base: u64, device: DeviceId) -> u64 {
    mix(base ^ (u64::from(device.0) + 1).wrapping_mul(GOLDEN))
}

/// `-log2(u)` in 32.32 fixed point, `u` the draw as a fraction in (0, 1]:
/// at most 63 << 32 (2^38), so that a cost times a 64-bit weight fits u128.
fn straw_cost(h: u64) -> u64 {
    let x = (h >> 1) + 1; // 1..=2^63
    (63u64 << 32) - log2_fixed(x)
}

/// `log2(x)` in 32.32 fixed point, by integer arithmetic only: the integer
/// part from the leading zeros; the fraction from a table of `log2(1 + i /
/// 4096)` ([`log2_exact`], made once) and a straight line between entries
/// (off by under 2^-26: the curve bends that little over 1/4096).
fn log2_fixed(x: u64) -> u64 {
    debug_assert!(x > 0);
    static TABLE: std::sync::OnceLock<Vec<u64>> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        (0..=LOG_TABLE)
            .map(|i| match i {
                LOG_TABLE => 1 << 32, // log2(2)
                _ => log2_exact(((LOG_TABLE + i) as u64) << (63 - 12)) - (63u64 << 32),
            })
            .collect()
    });
    let int = 63 - u64::from(x.leading_zeros());
    let m = x << x.leading_zeros(); // the mantissa: the top bit, then 63 of fraction
    let i = ((m >> (63 - 12)) & (LOG_TABLE as u64 - 1)) as usize;
    let rest = (m >> (63 - 12 - 32)) & 0xffff_ffff; // the next 32 bits
    let (lo, hi) = (table[i], table[i + 1]);
    (int << 32) + lo + (((hi - lo) * rest) >> 32)
}

/// Entries of [`log2_fixed`]'s table, less one.
const LOG_TABLE: usize = 4096;

/// `log2(x)` in 32.32 fixed point, each fraction bit by squaring the
/// mantissa: exact to the last bit but 32 multiplications long.
fn log2_exact(x: u64) -> u64 {
    debug_assert!(x > 0);
    let int = 63 - u64::from(x.leading_zeros());
    // The mantissa in [1, 2), as a 1.63 fixed-point value in [2^63, 2^64).
    let mut m = u128::from(x << x.leading_zeros());
    let mut frac = 0u64;
    for bit in (0..32).rev() {
        m = (m * m) >> 63; // [1, 4) in 1.63
        if m >= 1 << 64 {
            m >>= 1;
            frac |= 1 << bit;
        }
    }
    (int << 32) | frac
}

#[cfg(test)]
mod tests;
