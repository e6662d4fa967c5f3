//! The SSD's timing: a resource-reservation model, sans-IO.
//!
//! Every command reserves, in order, the resources it passes through, each of which
//! serves one thing at a time: the controller (a fixed cost per command, serialized:
//! the IOPS cap), a die per 4 KiB unit (tR or tPROG: internal parallelism), the die's
//! channel (bus transfer), and the host link. A reservation starts when both the
//! request and the resource are ready, so queues form exactly where they would on
//! the device, and the completion time of each command falls out. Writes land in a
//! DRAM cache and are destaged to their die in the background; the cache has a byte
//! budget, and a write that finds it full waits until destaging frees room.
//!
//! Reads have priority over destaging, as on real controllers (program suspend): a
//! plane keeps two timelines. A read waits only for earlier reads of its plane; the
//! array time it takes is added to the plane's program timeline, pushing later
//! destages back. So a destage backlog slows writes (through the cache budget) but
//! does not put reads behind milliseconds of programs.
//!
//! Inputs take `now_ns`; randomness comes from the caller's seeded RNG.

use crate::config::{SsdConfig, UNIT_BYTES};
use rand::Rng;
use std::collections::BTreeMap;

/// Busy-until times of every resource.
#[derive(Debug)]
pub struct Timing {
    config: SsdConfig,
    controller_free_ns: u64,
    /// Per plane: busy with reads until.
    die_free_ns: Vec<u64>,
    /// Per plane: busy with programs (and the reads that suspended them) until.
    die_program_free_ns: Vec<u64>,
    channel_free_ns: Vec<u64>,
    host_free_ns: u64,
    /// Cache bytes freed at each destage completion time: (time, seq) -> bytes.
    cache_frees: BTreeMap<(u64, u64), u64>,
    cache_used_bytes: u64,
    /// Latest destage completion of anything in the cache: what a flush waits for.
    destage_done_ns_max: u64,
    /// Writes enter the cache in arrival order: none before this time.
    cache_admit_ns: u64,
    seq: u64,
}

/// When a write's data is accepted and when it is durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteTimes {
    /// The command completes (data in cache; or on media for FUA).
    pub complete_ns: u64,
    /// The data is on media.
    pub durable_ns: u64,
}

impl Timing {
    /// Idle device.
    pub fn new(config: SsdConfig) -> Self {
        let dies = config.dies() as usize;
        Timing {
            die_free_ns: vec![0; dies],
            die_program_free_ns: vec![0; dies],
            channel_free_ns: vec![0; config.channels as usize],
            config,
            controller_free_ns: 0,
            host_free_ns: 0,
            cache_frees: BTreeMap::new(),
            cache_used_bytes: 0,
            destage_done_ns_max: 0,
            cache_admit_ns: 0,
            seq: 0,
        }
    }

    /// Die of a 4 KiB unit: a fixed scramble of its address, so sequential units
    /// stripe over every die and random ones spread evenly.
    fn die_of(&self, unit: u64) -> usize {
        let h = unit.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        ((h >> 32) % self.die_free_ns.len() as u64) as usize
    }

    fn jittered(&self, mean_ns: u64, rng: &mut impl Rng) -> u64 {
        let j = self.config.jitter;
        if j == 0.0 {
            return mean_ns;
        }
        (mean_ns as f64 * rng.gen_range(1.0 - j..1.0 + j)) as u64
    }

    /// The controller takes the command: returns when it is done with it.
    fn controller(&mut self, now_ns: u64) -> u64 {
        let start = now_ns.max(self.controller_free_ns);
        self.controller_free_ns = start + self.config.controller_ns_per_cmd;
        self.controller_free_ns
    }

    fn host_transfer(&mut self, ready_ns: u64, bytes: u64) -> u64 {
        let start = ready_ns.max(self.host_free_ns);
        self.host_free_ns = start + SsdConfig::transfer_ns(bytes, self.config.host_bytes_per_sec);
        self.host_free_ns
    }

    /// Release cache space whose destage finished by `now_ns`.
    fn reclaim(&mut self, now_ns: u64) {
        while let Some((&(t, seq), &bytes)) = self.cache_frees.first_key_value() {
            if t > now_ns {
                break;
            }
            self.cache_frees.remove(&(t, seq));
            self.cache_used_bytes -= bytes;
        }
    }

    /// A read of the 4 KiB units `units`; returns its completion time.
    pub fn read(&mut self, now_ns: u64, units: &[u64], rng: &mut impl Rng) -> u64 {
        let issued = self.controller(now_ns);
        let mut data_ready = issued;
        for &unit in units {
            let die = self.die_of(unit);
            let mut t_r = self.jittered(self.config.read_ns_mean, rng);
            if rng.gen_bool(self.config.read_retry_prob) {
                t_r *= 2;
            }
            let array_done = issued.max(self.die_free_ns[die]) + t_r;
            self.die_free_ns[die] = array_done;
            // The read suspends whatever program runs there: destaging slips by tR.
            let program = &mut self.die_program_free_ns[die];
            *program = (*program).max(issued) + t_r;
            let ch = die % self.channel_free_ns.len();
            let bus = SsdConfig::transfer_ns(UNIT_BYTES, self.config.channel_bytes_per_sec);
            let bus_done = array_done.max(self.channel_free_ns[ch]) + bus;
            self.channel_free_ns[ch] = bus_done;
            data_ready = data_ready.max(bus_done);
        }
        let bytes = units.len() as u64 * UNIT_BYTES;
        self.host_transfer(data_ready, bytes) + self.config.fixed_ns
    }

    /// A write of the 4 KiB units `units`; FUA writes complete when durable.
    pub fn write(
        &mut self,
        now_ns: u64,
        units: &[u64],
        fua: bool,
        rng: &mut impl Rng,
    ) -> WriteTimes {
        let issued = self.controller(now_ns);
        let bytes = units.len() as u64 * UNIT_BYTES;
        let received = self.host_transfer(issued, bytes);
        // Wait for cache room: destages free space in completion order.
        // A write may not take room that an earlier, stalled write is waiting for.
        let mut accepted = received.max(self.cache_admit_ns);
        self.reclaim(accepted);
        while self.cache_used_bytes + bytes > self.config.cache_bytes {
            let (&(t, seq), &freed) = self
                .cache_frees
                .first_key_value()
                .expect("cache full of nothing: cache_bytes < one write");
            self.cache_frees.remove(&(t, seq));
            self.cache_used_bytes -= freed;
            accepted = accepted.max(t);
        }
        self.cache_admit_ns = accepted;
        let in_cache = accepted + self.config.cache_write_ns_per_unit * units.len() as u64;
        let mut durable = in_cache;
        for &unit in units {
            let die = self.die_of(unit);
            let t_prog = self.jittered(self.config.program_ns_per_unit, rng);
            let done = in_cache.max(self.die_program_free_ns[die]) + t_prog;
            self.die_program_free_ns[die] = done;
            durable = durable.max(done);
        }
        self.seq += 1;
        self.cache_frees.insert((durable, self.seq), bytes);
        self.cache_used_bytes += bytes;
        self.destage_done_ns_max = self.destage_done_ns_max.max(durable);
        let complete = if fua { durable } else { in_cache };
        WriteTimes {
            complete_ns: complete + self.config.fixed_ns,
            durable_ns: durable,
        }
    }

    /// A flush: completes once everything written so far is on media.
    pub fn flush(&mut self, now_ns: u64) -> u64 {
        let issued = self.controller(now_ns);
        issued.max(self.destage_done_ns_max) + self.config.fixed_ns
    }

    /// A command with no data transfer (deallocate, write zeroes): controller only.
    pub fn metadata(&mut self, now_ns: u64) -> u64 {
        self.controller(now_ns) + self.config.fixed_ns
    }

    /// Power loss: every queue empties and the cache is gone.
    pub fn power_cycle(&mut self, now_ns: u64) {
        self.controller_free_ns = now_ns;
        self.host_free_ns = now_ns;
        self.die_free_ns.iter_mut().for_each(|t| *t = now_ns);
        self.die_program_free_ns
            .iter_mut()
            .for_each(|t| *t = now_ns);
        self.channel_free_ns.iter_mut().for_each(|t| *t = now_ns);
        self.cache_frees.clear();
        self.cache_used_bytes = 0;
        self.destage_done_ns_max = now_ns;
        self.cache_admit_ns = now_ns;
    }
}

/// Stripe of a drive array, in 4 KiB units: 512 KiB, mdadm's default chunk size
/// for RAID 0 (`mdadm(8)`, `--chunk`).
pub const STRIPE_UNITS: u64 = 512 * 1024 / UNIT_BYTES;

/// `drives` SSDs striped into one namespace (RAID 0 by [`STRIPE_UNITS`]): each
/// drive has its own controller, flash, host link and cache; a command touching
/// several drives completes when its part on each has.
#[derive(Debug)]
pub struct Array {
    drives: Vec<Timing>,
}

impl Array {
    /// Idle drives of `config` (its `drives` of them).
    pub fn new(config: SsdConfig) -> Self {
        let n = config.drives.max(1) as usize;
        Array {
            drives: (0..n).map(|_| Timing::new(config.clone())).collect(),
        }
    }

    /// The units of each drive a command touches, by drive, in drive order.
    fn parts(&self, units: &[u64]) -> std::collections::BTreeMap<usize, Vec<u64>> {
        let n = self.drives.len() as u64;
        let mut parts: std::collections::BTreeMap<usize, Vec<u64>> = Default::default();
        for &u in units {
            parts
                .entry(((u / STRIPE_UNITS) % n) as usize)
                .or_default()
                .push(u);
        }
        parts
    }

    /// A read of `units`: when its last part completes.
    pub fn read(&mut self, now_ns: u64, units: &[u64], rng: &mut impl Rng) -> u64 {
        let mut done = 0;
        for (d, part) in self.parts(units) {
            done = done.max(self.drives[d].read(now_ns, &part, rng));
        }
        done
    }

    /// A write of `units`: when its last part completes and is durable.
    pub fn write(
        &mut self,
        now_ns: u64,
        units: &[u64],
        fua: bool,
        rng: &mut impl Rng,
    ) -> WriteTimes {
        let mut t = WriteTimes {
            complete_ns: 0,
            durable_ns: 0,
        };
        for (d, part) in self.parts(units) {
            let w = self.drives[d].write(now_ns, &part, fua, rng);
            t.complete_ns = t.complete_ns.max(w.complete_ns);
            t.durable_ns = t.durable_ns.max(w.durable_ns);
        }
        t
    }

    /// A flush of every drive.
    pub fn flush(&mut self, now_ns: u64) -> u64 {
        self.drives
            .iter_mut()
            .map(|d| d.flush(now_ns))
            .max()
            .unwrap_or(now_ns)
    }

    /// A command with no data (deallocate, write zeroes), sent to every drive.
    pub fn metadata(&mut self, now_ns: u64) -> u64 {
        self.drives
            .iter_mut()
            .map(|d| d.metadata(now_ns))
            .max()
            .unwrap_or(now_ns)
    }

    /// Power loss on every drive.
    pub fn power_cycle(&mut self, now_ns: u64) {
        self.drives.iter_mut().for_each(|d| d.power_cycle(now_ns));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    fn exact() -> SsdConfig {
        SsdConfig {
            jitter: 0.0,
            read_retry_prob: 0.0,
            ..SsdConfig::default()
        }
    }

    #[test]
    fn an_idle_read_costs_the_model_latency() {
        let c = exact();
        let mut t = Timing::new(c.clone());
        let mut rng = SmallRng::seed_from_u64(1);
        assert_eq!(t.read(0, &[7], &mut rng), c.model_read_latency_qd1_ns());
    }

    #[test]
    fn reads_of_one_die_queue_and_of_different_dies_overlap() {
        let mut t = Timing::new(exact());
        let mut rng = SmallRng::seed_from_u64(1);
        let a = t.read(0, &[7], &mut rng);
        let b = t.read(0, &[7], &mut rng);
        assert!(b >= a + 60_000, "same die must serialize: {a} {b}");
        let other = (0..1000).find(|u| t.die_of(*u) != t.die_of(7)).unwrap();
        let mut t = Timing::new(exact());
        let a = t.read(0, &[7], &mut rng);
        let b = t.read(0, &[other], &mut rng);
        assert_eq!(
            b,
            a + 1_000,
            "different dies overlap but for the controller"
        );
    }

    #[test]
    fn fua_waits_for_the_program_and_flush_for_every_destage() {
        let mut t = Timing::new(exact());
        let mut rng = SmallRng::seed_from_u64(1);
        let w = t.write(0, &[1], false, &mut rng);
        assert!(w.complete_ns < 20_000, "cached write is fast: {w:?}");
        assert!(w.durable_ns >= 2_800_000);
        let f = t.write(0, &[2], true, &mut rng);
        assert!(f.complete_ns >= 2_800_000);
        assert!(t.flush(10) >= w.durable_ns.max(f.durable_ns));
    }

    #[test]
    fn reads_are_not_queued_behind_destaging_but_destaging_yields_to_reads() {
        let mut t = Timing::new(exact());
        let mut rng = SmallRng::seed_from_u64(1);
        let programs = t.write(0, &[7; 8], false, &mut rng);
        let read = t.read(0, &[7], &mut rng);
        assert!(read < 100_000, "read waited for programs: {read}");
        let later = t.write(0, &[7], false, &mut rng);
        assert!(later.durable_ns >= programs.durable_ns + 2_800_000 + 60_000);
    }

    #[test]
    fn a_full_cache_makes_writes_wait_for_destage_in_arrival_order() {
        let c = SsdConfig {
            cache_bytes: 1 << 20,
            ..exact()
        };
        let mut t = Timing::new(c);
        let mut rng = SmallRng::seed_from_u64(1);
        let units: Vec<u64> = (0..256).collect();
        // 1 MiB fills the cache at once.
        let a = t.write(0, &units, false, &mut rng);
        assert!(a.complete_ns < 1_000_000, "{a:?}");
        // The next 1 MiB waits until the first is destaged.
        let b = t.write(0, &units, false, &mut rng);
        assert!(b.complete_ns >= 2_800_000, "{b:?}");
        // A small write behind it may not jump the queue into room B waits for.
        let c = t.write(0, &[1000], false, &mut rng);
        assert!(c.complete_ns >= 2_800_000, "{c:?}");
    }

    #[test]
    fn an_array_of_two_serves_twice_the_reads_and_one_drive_is_one_timing() {
        // Saturated 4 KiB reads: one drive's controller caps them at one per
        // microsecond; two drives, striped, take twice as many in the same time.
        let reads = |drives: u32| {
            let mut a = Array::new(SsdConfig { drives, ..exact() });
            let mut rng = SmallRng::seed_from_u64(1);
            (0..10_000u64)
                .map(|i| a.read(0, &[(i * 7919) % 1_000_000], &mut rng))
                .max()
                .unwrap()
        };
        let (one, two) = (reads(1), reads(2));
        assert!(two * 10 < one * 6, "one drive {one} ns, two {two} ns");
        // One drive behaves as the bare timing model, draw for draw.
        let mut a = Array::new(SsdConfig::default());
        let mut t = Timing::new(SsdConfig::default());
        let (mut r1, mut r2) = (SmallRng::seed_from_u64(3), SmallRng::seed_from_u64(3));
        for i in 0..100u64 {
            assert_eq!(
                a.read(i, &[i * 31, i * 31 + 1], &mut r1),
                t.read(i, &[i * 31, i * 31 + 1], &mut r2)
            );
            assert_eq!(
                a.write(i, &[i], i % 2 == 0, &mut r1),
                t.write(i, &[i], i % 2 == 0, &mut r2)
            );
        }
        // A 1 MiB read spans two stripes: both drives of a pair take part.
        let a = Array::new(SsdConfig {
            drives: 2,
            ..exact()
        });
        let units: Vec<u64> = (0..256).collect();
        assert_eq!(a.parts(&units).len(), 2);
    }
}
