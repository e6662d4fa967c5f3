use super::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;

const TIB: u64 = 1 << 40;

fn device(id: u32, host: u32, weight: u64, rack: Option<&str>) -> DeviceSpec {
    DeviceSpec {
        id: DeviceId(id),
        host: NodeId(host),
        weight,
        rack: rack.map(str::to_string),
        zone: None,
    }
}

/// `hosts` nodes of `per_host` devices each, of `weight` bytes, in `racks`
/// labelled racks (none when 0).
fn uniform(hosts: u32, per_host: u32, weight: u64, racks: u32) -> Vec<DeviceSpec> {
    let mut out = Vec::new();
    for h in 0..hosts {
        let rack = (racks > 0).then(|| format!("r{}", h % racks));
        for d in 0..per_host {
            out.push(device(h * per_host + d, h, weight, rack.as_deref()));
        }
    }
    out
}

/// What every placement must be: `replicas` devices of the set, on distinct
/// hosts, and in distinct racks where placement chose racks.
fn check_domains(devices: &[DeviceSpec], p: &Placement, placed: &[Vec<DeviceId>]) {
    let by_id: BTreeMap<DeviceId, &DeviceSpec> = devices.iter().map(|d| (d.id, d)).collect();
    for (pg, replicas) in placed.iter().enumerate() {
        assert_eq!(replicas.len(), p.replicas(), "pg{pg}");
        let specs: Vec<&DeviceSpec> = replicas.iter().map(|id| by_id[id]).collect();
        assert!(
            specs.iter().all(|d| d.weight > 0),
            "pg{pg} on a device of weight 0"
        );
        let hosts: BTreeSet<NodeId> = specs.iter().map(|d| d.host).collect();
        assert_eq!(
            hosts.len(),
            replicas.len(),
            "pg{pg}: two replicas on one host"
        );
        if p.level() >= Level::Rack {
            let racks: BTreeSet<String> = specs
                .iter()
                .map(|d| d.rack.clone().unwrap_or_else(|| format!("host {}", d.host)))
                .collect();
            assert_eq!(
                racks.len(),
                replicas.len(),
                "pg{pg}: two replicas in one rack"
            );
        }
    }
}

/// Checks that going from `before` to `after` moved only `dev`'s replicas:
/// in each PG either nothing changed, or `dev` took (`gained`) or gave up
/// (otherwise) exactly one place, the others keeping their order. Returns
/// the replicas moved.
fn moved_only(
    dev: DeviceId,
    gained: bool,
    before: &[Vec<DeviceId>],
    after: &[Vec<DeviceId>],
) -> usize {
    let mut moved = 0;
    for (pg, (b, a)) in before.iter().zip(after).enumerate() {
        if a == b {
            continue;
        }
        let (old, new) = if gained { (b, a) } else { (a, b) };
        assert!(
            new.contains(&dev),
            "pg{pg}: {b:?} -> {a:?} moved a replica that is not {dev}'s"
        );
        assert!(!old.contains(&dev), "pg{pg}: {b:?} -> {a:?}");
        let rest: Vec<DeviceId> = new.iter().copied().filter(|d| *d != dev).collect();
        let kept: Vec<DeviceId> = old.iter().copied().filter(|d| rest.contains(d)).collect();
        assert_eq!(
            rest, kept,
            "pg{pg}: {b:?} -> {a:?} changed more than {dev}'s place"
        );
        assert_eq!(kept.len(), old.len() - 1, "pg{pg}: {b:?} -> {a:?}");
        moved += 1;
    }
    moved
}

/// Checks that a device that rose in the rankings (its weight grew) only
/// gained: a PG that held it holds the same devices (it may now lead), one
/// that did not either is unchanged or took it in one replica's place.
fn gained_only(dev: DeviceId, before: &[Vec<DeviceId>], after: &[Vec<DeviceId>]) {
    for (pg, (b, a)) in before.iter().zip(after).enumerate() {
        let others =
            |r: &Vec<DeviceId>| r.iter().copied().filter(|d| *d != dev).collect::<Vec<_>>();
        let (ob, oa) = (others(b), others(a));
        if b.contains(&dev) {
            assert!(a.contains(&dev) && oa == ob, "pg{pg}: {b:?} -> {a:?}");
        } else if a.contains(&dev) {
            let kept: Vec<DeviceId> = ob.iter().copied().filter(|d| oa.contains(d)).collect();
            assert!(
                kept == oa && kept.len() + 1 == ob.len(),
                "pg{pg}: {b:?} -> {a:?}"
            );
        } else {
            assert_eq!(a, b, "pg{pg}");
        }
    }
}

/// A cluster of random shape: 3-20 hosts of 1-4 devices of 1-16 TiB, in 3-6
/// labelled racks or none, 2 or 3 replicas, 32-256 PGs.
fn random_cluster(rng: &mut StdRng) -> (Vec<DeviceSpec>, usize, u32) {
    let hosts = rng.gen_range(3..=20u32);
    let racks = if rng.gen_bool(0.5) {
        rng.gen_range(3..=6u32)
    } else {
        0
    };
    let mut devices = Vec::new();
    for h in 0..hosts {
        let rack = (racks > 0).then(|| format!("r{}", h % racks));
        for _ in 0..rng.gen_range(1..=4) {
            let weight = TIB << rng.gen_range(0..=4);
            devices.push(device(devices.len() as u32, h, weight, rack.as_deref()));
        }
    }
    (devices, rng.gen_range(2..=3), rng.gen_range(32..=256))
}

#[test]
fn over_a_thousand_random_clusters_replicas_keep_their_domains_and_only_the_changed_device_moves() {
    let mut rng = StdRng::seed_from_u64(42);
    let (mut moved_in, mut share_in) = (0usize, 0f64);
    let mut removals = 0;
    for cluster in 0..1000 {
        let (mut devices, replicas, pgs) = random_cluster(&mut rng);
        let seed = rng.gen();
        let p = Placement::new(&devices, replicas, seed).unwrap();
        let labelled = devices[0].rack.is_some();
        assert_eq!(
            p.level(),
            if labelled { Level::Rack } else { Level::Host },
            "cluster {cluster}"
        );
        let before = p.place_all(pgs);
        check_domains(&devices, &p, &before);

        // A device added, to a random node or on a new node (in a random
        // node's rack): everything that moves moves onto it.
        let host = devices[rng.gen_range(0..devices.len())].clone();
        let node = if rng.gen_bool(0.5) {
            host.host.0
        } else {
            devices.iter().map(|d| d.host.0).max().unwrap_or(0) + 1
        };
        let new = device(
            devices.len() as u32,
            node,
            TIB << rng.gen_range(0..=4),
            host.rack.as_deref(),
        );
        let (id, weight) = (new.id, new.weight);
        devices.push(new);
        let grown = Placement::new(&devices, replicas, seed).unwrap();
        assert_eq!(grown.level(), p.level());
        let after = grown.place_all(pgs);
        check_domains(&devices, &grown, &after);
        let moved = moved_only(id, true, &before, &after);
        let total: u64 = devices.iter().map(|d| d.weight).sum();
        moved_in += moved;
        share_in += (replicas as u64 * u64::from(pgs)) as f64 * weight as f64 / total as f64;

        // A device grown (its weight doubled): it only gains.
        let grow = rng.gen_range(0..devices.len());
        let mut larger = devices.clone();
        larger[grow].weight *= 2;
        let g = Placement::new(&larger, replicas, seed).unwrap();
        assert_eq!(g.level(), grown.level());
        let gained = g.place_all(pgs);
        check_domains(&larger, &g, &gained);
        gained_only(larger[grow].id, &after, &gained);

        // A device taken out (weight 0): exactly its replicas move.
        let out = rng.gen_range(0..devices.len());
        let mut shrunk = devices.clone();
        shrunk[out].weight = 0;
        let Ok(q) = Placement::new(&shrunk, replicas, seed) else {
            continue; // too few hosts left
        };
        if q.level() != grown.level() {
            continue;
        }
        let out = shrunk[out].id;
        let drained = q.place_all(pgs);
        check_domains(&shrunk, &q, &drained);
        let held = after.iter().filter(|r| r.contains(&out)).count();
        assert_eq!(
            moved_only(out, false, &after, &drained),
            held,
            "cluster {cluster}"
        );
        removals += 1;
    }
    // The new devices got, over all clusters, about their share by weight
    // (a device can hold one replica of a PG, so a node much larger than the
    // rest gets a little less).
    let ratio = moved_in as f64 / share_in;
    assert!(
        (0.8..=1.2).contains(&ratio),
        "moved {moved_in} for a share of {share_in:.0}: {ratio:.3}"
    );
    assert!(
        removals > 500,
        "only {removals} clusters could lose a device"
    );
}

#[test]
fn devices_fill_and_lead_in_proportion_to_their_weight() {
    // 16 hosts, each with two 1 TiB and two 2 TiB devices.
    let mut devices = uniform(16, 4, TIB, 0);
    for d in devices.iter_mut().filter(|d| d.id.0 % 2 == 1) {
        d.weight = 2 * TIB;
    }
    let pgs = 16_384;
    let p = Placement::new(&devices, 3, 7).unwrap();
    let placed = p.place_all(pgs);
    check_domains(&devices, &p, &placed);
    let total: u64 = devices.iter().map(|d| d.weight).sum();
    let mut held: BTreeMap<DeviceId, usize> = BTreeMap::new();
    let mut led: BTreeMap<DeviceId, usize> = BTreeMap::new();
    for r in &placed {
        *led.entry(r[0]).or_default() += 1;
        for d in r {
            *held.entry(*d).or_default() += 1;
        }
    }
    let mut by_size: BTreeMap<u64, (usize, f64)> = BTreeMap::new();
    for d in &devices {
        let share = 3.0 * f64::from(pgs) * d.weight as f64 / total as f64;
        // Each device within 5 sd of its share (a count of n is +- sqrt(n)).
        let got = held[&d.id] as f64;
        assert!(
            (got - share).abs() < 5.0 * share.sqrt(),
            "{}: {got} replicas for a share of {share:.0}",
            d.id
        );
        let lead_share = f64::from(pgs) * d.weight as f64 / total as f64;
        let lead = led[&d.id] as f64;
        assert!(
            (lead - lead_share).abs() < 5.0 * lead_share.sqrt(),
            "{}: leads {lead} of {lead_share:.0}",
            d.id
        );
        let e = by_size.entry(d.weight).or_default();
        e.0 += held[&d.id];
        e.1 += share;
    }
    for (weight, (got, share)) in by_size {
        let r = got as f64 / share;
        assert!(
            (r - 1.0).abs() < 0.03,
            "{weight}-byte devices hold {got} for {share:.0}"
        );
    }
}

#[test]
fn labels_choose_the_widest_domain_that_has_a_place_for_every_replica() {
    // Racks labelled: no PG twice in a rack.
    let devices = uniform(12, 2, TIB, 4);
    let p = Placement::new(&devices, 3, 1).unwrap();
    assert_eq!(p.level(), Level::Rack);
    check_domains(&devices, &p, &p.place_all(1024));
    // Two racks cannot hold three replicas apart: hosts are the domain.
    let two = uniform(6, 1, TIB, 2);
    assert_eq!(Placement::new(&two, 3, 1).unwrap().level(), Level::Host);
    // Some nodes unlabelled: each is a rack of its own.
    let mut some = uniform(6, 1, TIB, 0);
    for d in &mut some[..4] {
        d.rack = Some("big".into());
    }
    let p = Placement::new(&some, 3, 1).unwrap();
    assert_eq!(p.level(), Level::Rack);
    let placed = p.place_all(512);
    check_domains(&some, &p, &placed);
    assert!(placed
        .iter()
        .all(|r| r.iter().filter(|d| d.0 < 4).count() <= 1));
    // Zones, where there are enough of them, come before racks.
    let mut zoned = uniform(9, 1, TIB, 9);
    for d in &mut zoned {
        d.zone = Some(format!("z{}", d.host.0 % 3));
    }
    let p = Placement::new(&zoned, 3, 1).unwrap();
    assert_eq!(p.level(), Level::Zone);
    for r in p.place_all(512) {
        let zones: BTreeSet<u32> = r.iter().map(|d| d.0 % 3).collect();
        assert_eq!(zones.len(), 3);
    }
}

#[test]
fn sets_placement_cannot_use_are_refused() {
    assert_eq!(
        Placement::new(&uniform(2, 3, TIB, 0), 3, 0).unwrap_err(),
        PlacementError::TooFewHosts {
            replicas: 3,
            hosts: 2
        }
    );
    let mut drained = uniform(3, 1, TIB, 0);
    drained[2].weight = 0;
    assert!(matches!(
        Placement::new(&drained, 3, 0),
        Err(PlacementError::TooFewHosts { hosts: 2, .. })
    ));
    let mut twice = uniform(3, 1, TIB, 0);
    twice[2].id = DeviceId(0);
    assert_eq!(
        Placement::new(&twice, 3, 0).unwrap_err(),
        PlacementError::DuplicateDevice(DeviceId(0))
    );
    let mut split = uniform(3, 2, TIB, 3);
    split[1].rack = Some("elsewhere".into());
    assert_eq!(
        Placement::new(&split, 3, 0).unwrap_err(),
        PlacementError::SplitHost(NodeId(0))
    );
    assert_eq!(
        Placement::new(&split, 0, 0).unwrap_err(),
        PlacementError::NoReplicas
    );
}

#[test]
fn pools_over_the_same_devices_place_differently_and_each_the_same_every_time() {
    let devices = uniform(8, 2, TIB, 0);
    let a = Placement::new(&devices, 3, 1).unwrap().place_all(256);
    let b = Placement::new(&devices, 3, 2).unwrap().place_all(256);
    assert_eq!(a, Placement::new(&devices, 3, 1).unwrap().place_all(256));
    let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    assert!(same < 16, "{same} of 256 PGs placed alike by two pools");
    // Fixed values: a change to the hash or the log changes every cluster's
    // placement, which needs a new map format version.
    assert_eq!(a[0], Placement::new(&devices, 3, 1).unwrap().place(PgId(0)));
    assert_eq!(
        format!("{:?} {:?}", a[0], a[255]),
        "[DeviceId(8), DeviceId(14), DeviceId(4)] [DeviceId(5), DeviceId(3), DeviceId(9)]"
    );
}

#[test]
fn the_fixed_point_log_is_log2_to_within_its_last_bits() {
    let mut rng = StdRng::seed_from_u64(3);
    for x in [1u64, 2, 3, 1 << 40, u64::MAX >> 1, (u64::MAX >> 1) + 1]
        .into_iter()
        .chain((0..10_000).map(|_| rng.gen_range(1..=u64::MAX)))
    {
        let want = (x as f64).log2();
        let exact = log2_exact(x) as f64 / (1u64 << 32) as f64;
        assert!(
            (exact - want).abs() < 1e-8,
            "log2({x}) = {want}, bit by bit {exact}"
        );
        let fast = log2_fixed(x);
        let off = fast.abs_diff(log2_exact(x));
        assert!(
            off < 1 << 6,
            "log2({x}): table {fast}, bit by bit {}",
            log2_exact(x)
        );
    }
    assert_eq!(log2_fixed(1 << 40), 40 << 32);
    assert_eq!(straw_cost(u64::MAX), 0);
    assert_eq!(straw_cost(0), 63 << 32);
}

#[test]
fn objects_spread_evenly_over_pgs_and_a_doubling_splits_each_pg_in_two() {
    let pgs = 64;
    let mut count = vec![0u32; pgs as usize];
    for vol in 0..4 {
        for object in 0..16_384 {
            let pg = pg_of(VolumeId(vol), object, pgs);
            count[pg.0 as usize] += 1;
            // Doubled, an object stays or goes to its PG's one new sibling.
            let split = pg_of(VolumeId(vol), object, pgs * 2);
            assert!(split == pg || split.0 == pg.0 + pgs);
            // A count that is no power of two stays in range.
            assert!(pg_of(VolumeId(vol), object, 100).0 < 100);
        }
    }
    let mean = 4.0 * 16_384.0 / f64::from(pgs);
    for (pg, n) in count.iter().enumerate() {
        assert!(
            (f64::from(*n) / mean - 1.0).abs() < 0.1,
            "pg{pg}: {n} objects, mean {mean}"
        );
    }
    assert_eq!(default_pg_count(1024, 3), 32_768);
    assert_eq!(default_pg_count(3, 3), 128);
    assert_eq!(default_pg_count(6, 3), 256);
    assert_eq!(default_pg_count(1, 3), 32);
    assert_eq!(default_pg_count(0, 3), 1);
}

#[test]
fn first_places_follow_weight_as_a_fair_draw_would() {
    // One replica a PG: each device's count is a multinomial draw; over 64
    // devices (63 degrees of freedom) chi-square is 63 +- 11, and past 110
    // (over 4 sd) would show the hash favouring some devices.
    let mut devices = uniform(16, 4, TIB, 0);
    for d in devices.iter_mut().filter(|d| d.id.0 % 2 == 1) {
        d.weight = 2 * TIB;
    }
    let total: u64 = devices.iter().map(|d| d.weight).sum();
    for seed in 0..10 {
        let p = Placement::new(&devices, 1, seed).unwrap();
        let mut held: BTreeMap<DeviceId, usize> = BTreeMap::new();
        for r in &p.place_all(16_384) {
            *held.entry(r[0]).or_default() += 1;
        }
        let chi2: f64 = devices
            .iter()
            .map(|d| {
                let e = 16_384.0 * d.weight as f64 / total as f64;
                let o = held.get(&d.id).copied().unwrap_or(0) as f64;
                (o - e) * (o - e) / e
            })
            .sum();
        assert!(
            chi2 < 110.0,
            "pool seed {seed}: chi-square {chi2:.1} over 63 degrees of freedom"
        );
    }
}
