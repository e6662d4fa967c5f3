//! A host's cores, each a single server of CPU work.
//!
//! Work arrives at a time with a cost (nanoseconds on the reference CPU of
//! [`crate::profile`], scaled by the host's clock) and an affinity: any general
//! core, one given core (the core an interrupt or a queue is bound to), or one of
//! the host's polling cores. A core runs one piece of work at a time, without
//! preemption; work starts at the first idle stretch of its core at or after its
//! arrival that is long enough to hold it. "Any" work goes to the core that would
//! finish it first, as a scheduler with a run queue per core and work stealing
//! roughly does. So a busy core delays what arrives for it, and a saturated host
//! caps what it can do: saturation shows as latency and as a throughput ceiling
//! in the run, never as a formula.
//!
//! Why idle stretches rather than one busy-until time per core: the fabric and the
//! SSD model charge work from their own event loops, and a device completion is
//! charged when it is scheduled, ahead of its time. A single busy-until time would
//! make everything that arrives meanwhile wait behind that future work; keeping the
//! busy intervals lets earlier work run in the gap before it, as it would.
//!
//! NUMA: with two nodes, cores are split evenly between them; work whose memory
//! lives on the other node costs [`HostSpec::remote_cost_pct`] percent of its local
//! cost there, so "any" work prefers local cores and spills to remote ones only
//! when they finish it sooner.
//!
//! Polling cores spin all the time: they count as fully busy whatever they do,
//! and only the work given to them runs there.

use std::collections::BTreeMap;

/// Index of a core in its host.
pub type CoreIdx = usize;

/// Work that arrives this long before the latest "now" a caller gave is treated
/// as arriving then: the callers' event loops are never further apart than this
/// (madsim wakes each within a few hundred ns of its deadline). Work may arrive
/// in the future (a device completion charged when it is scheduled): that does
/// not move the watermark, which follows the callers' present only.
pub const LATE_ARRIVAL_SLACK_NS: u64 = 10_000_000;
/// Busy intervals a core keeps; past this the oldest that ended before the
/// callers' present is forgotten (work arriving in that past is moved up to the
/// present, see [`LATE_ARRIVAL_SLACK_NS`]).
pub const INTERVALS_PER_CORE_MAX: usize = 1 << 16;
/// Largest host.
pub const CORES_MAX: u32 = 256;

/// The shape of a host's CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSpec {
    /// Cores (hardware threads are not modelled: one core, one server).
    pub cores: u32,
    /// Core clock, MHz; costs are scaled from the reference CPU's clock.
    pub clock_mhz: u32,
    /// Two NUMA nodes (cores split evenly) instead of one.
    pub numa: bool,
    /// Cost of work on a core of the other NUMA node, percent of its local cost.
    pub remote_cost_pct: u32,
    /// Cores given over to polling (a polled driver's reactor): the host's last
    /// cores (so on its second NUMA node when it has two).
    pub poll_cores: u32,
}

impl HostSpec {
    /// Whether the spec describes a host that can run work.
    pub fn validate(&self) -> Result<(), String> {
        if self.cores == 0 || self.cores > CORES_MAX {
            return Err(format!("cores must be between 1 and {CORES_MAX}"));
        }
        if self.poll_cores >= self.cores {
            return Err("polling cores must leave at least one general core".into());
        }
        if self.clock_mhz < 100 || self.clock_mhz > 10_000 {
            return Err("clock_mhz must be between 100 and 10000".into());
        }
        if self.numa && self.cores < 2 {
            return Err("two NUMA nodes need at least two cores".into());
        }
        if self.remote_cost_pct < 100 || self.remote_cost_pct > 1000 {
            return Err("remote_cost_pct must be between 100 and 1000".into());
        }
        Ok(())
    }
}

/// Where a piece of work may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Affinity {
    /// Whichever general core finishes it first.
    Any,
    /// General core `n` (modulo the general cores): an interrupt's or a queue's.
    Core(usize),
    /// Polling core `n` (modulo the polling cores).
    Poller(usize),
}

/// A piece of CPU work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Work {
    /// Cost on the reference CPU, ns.
    pub cost_ns: u64,
    /// Where it may run.
    pub affinity: Affinity,
    /// NUMA node of the memory it touches (the NIC's or the device's).
    pub numa_node: u8,
}

/// Where and when a piece of work ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ran {
    /// The core.
    pub core: CoreIdx,
    /// When it started, ns.
    pub start_ns: u64,
    /// When it finished, ns.
    pub end_ns: u64,
}

/// CPU time of a host over a window, ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Time general cores spent on work.
    pub work_ns: u64,
    /// Time polling cores spent (all of it: they spin).
    pub poll_ns: u64,
    /// Cores x the window.
    pub capacity_ns: u64,
}

impl Usage {
    /// Busy share of the capacity, 0..=1.
    pub fn utilization(&self) -> f64 {
        if self.capacity_ns == 0 {
            return 0.0;
        }
        ((self.work_ns + self.poll_ns) as f64 / self.capacity_ns as f64).min(1.0)
    }

    /// The sum of two hosts' usage (a role's).
    pub fn plus(self, other: Usage) -> Usage {
        Usage {
            work_ns: self.work_ns + other.work_ns,
            poll_ns: self.poll_ns + other.poll_ns,
            capacity_ns: self.capacity_ns + other.capacity_ns,
        }
    }
}

#[derive(Debug)]
struct Core {
    node: u8,
    poller: bool,
    /// Busy intervals, start -> end, disjoint and not touching.
    busy: BTreeMap<u64, u64>,
    /// Work time charged since the window began.
    work_ns: u64,
}

impl Core {
    /// The first start at or after `at` of an idle stretch `cost` long.
    fn earliest(&self, at: u64, cost: u64) -> u64 {
        let mut t = at;
        if let Some((_, &end)) = self.busy.range(..=at).next_back() {
            t = t.max(end);
        }
        for (&start, &end) in self.busy.range(at.saturating_add(1)..) {
            if start >= t.saturating_add(cost) {
                break;
            }
            t = t.max(end);
        }
        t
    }

    /// Mark `[start, end)` busy, merging with the intervals it touches; past
    /// the bound, forget the oldest intervals that ended before `watermark`.
    fn occupy(&mut self, start: u64, end: u64, watermark: u64) {
        debug_assert!(start < end);
        let mut from = start;
        if let Some((&s, &e)) = self.busy.range(..=start).next_back() {
            debug_assert!(e <= start, "work placed on a busy stretch");
            if e == start {
                from = s;
            }
        }
        let mut to = end;
        if let Some(next_end) = self.busy.remove(&end) {
            to = next_end;
        }
        debug_assert!(
            self.busy
                .range(start..end)
                .next()
                .is_none_or(|(&s, _)| s >= end),
            "work overlaps a later busy stretch"
        );
        self.busy.insert(from, to);
        while self.busy.len() > INTERVALS_PER_CORE_MAX {
            match self.busy.first_key_value() {
                Some((_, &e)) if e <= watermark => {
                    self.busy.pop_first();
                }
                _ => break,
            }
        }
    }

    /// Forget busy time that ended before `watermark`.
    fn prune(&mut self, watermark: u64) {
        while let Some((_, &end)) = self.busy.first_key_value() {
            if end > watermark {
                break;
            }
            self.busy.pop_first();
        }
    }
}

/// How often (in pieces of work) the cores forget old busy time.
const PRUNE_EVERY: u64 = 1024;

/// A host's cores.
#[derive(Debug)]
pub struct Cpu {
    spec: HostSpec,
    /// Reference clock the costs are given at, MHz.
    reference_mhz: u32,
    cores: Vec<Core>,
    general: Vec<CoreIdx>,
    pollers: Vec<CoreIdx>,
    /// Latest present a caller gave, ns.
    latest_ns: u64,
    /// Work arriving before this is moved to it.
    watermark_ns: u64,
    runs: u64,
    window_start_ns: u64,
}

impl Cpu {
    /// An idle host; costs will be given at `reference_mhz`.
    pub fn new(spec: HostSpec, reference_mhz: u32) -> Result<Cpu, String> {
        spec.validate()?;
        assert!(reference_mhz > 0);
        let n = spec.cores as usize;
        let node_of = |i: usize| if spec.numa && i >= n / 2 { 1 } else { 0 };
        let first_poller = n - spec.poll_cores as usize;
        let cores: Vec<Core> = (0..n)
            .map(|i| Core {
                node: node_of(i),
                poller: i >= first_poller,
                busy: BTreeMap::new(),
                work_ns: 0,
            })
            .collect();
        let cpu = Cpu {
            general: (0..first_poller).collect(),
            pollers: (first_poller..n).collect(),
            spec,
            reference_mhz,
            cores,
            latest_ns: 0,
            watermark_ns: 0,
            runs: 0,
            window_start_ns: 0,
        };
        cpu.self_check();
        Ok(cpu)
    }

    /// The host's shape.
    pub fn spec(&self) -> &HostSpec {
        &self.spec
    }

    /// NUMA node of core `c`.
    pub fn node_of(&self, c: CoreIdx) -> u8 {
        self.cores[c].node
    }

    /// Cost of `work` on core `c`, ns: scaled to the host's clock, and by the
    /// remote penalty if its memory is on the other node.
    fn cost_on(&self, c: CoreIdx, work: &Work) -> u64 {
        let mut cost =
            work.cost_ns as u128 * u128::from(self.reference_mhz) / u128::from(self.spec.clock_mhz);
        if self.spec.numa && self.cores[c].node != work.numa_node {
            cost = cost * u128::from(self.spec.remote_cost_pct) / 100;
        }
        cost as u64
    }

    /// Run `work`, arriving now: returns where and when it ran.
    pub fn run(&mut self, now_ns: u64, work: Work) -> Ran {
        self.run_at(now_ns, now_ns, work)
    }

    /// Run `work`, arriving at `at_ns` (now or later; `now_ns` is the caller's
    /// present): returns where and when it ran.
    pub fn run_at(&mut self, now_ns: u64, at_ns: u64, work: Work) -> Ran {
        debug_assert!(at_ns >= now_ns, "work arrives in the past");
        self.latest_ns = self.latest_ns.max(now_ns);
        self.watermark_ns = self
            .watermark_ns
            .max(self.latest_ns.saturating_sub(LATE_ARRIVAL_SLACK_NS));
        let at = at_ns.max(now_ns).max(self.watermark_ns);
        let pick = |set: &[CoreIdx], n: usize| set[n % set.len()];
        let (core, start, cost) = match work.affinity {
            Affinity::Core(n) => self.place(pick(&self.general, n), at, &work),
            Affinity::Poller(n) if !self.pollers.is_empty() => {
                self.place(pick(&self.pollers, n), at, &work)
            }
            // A host with no polling core runs polled work on its general cores.
            Affinity::Any | Affinity::Poller(_) => {
                let mut best: Option<(CoreIdx, u64, u64)> = None;
                for &c in &self.general {
                    let (c, start, cost) = self.place(c, at, &work);
                    if best.is_none_or(|(_, s, k)| start + cost < s + k) {
                        best = Some((c, start, cost));
                    }
                    // An idle local core cannot be beaten by a later one.
                    let local = !self.spec.numa || self.cores[c].node == work.numa_node;
                    if start == at && local {
                        break;
                    }
                }
                best.expect("validated: at least one general core")
            }
        };
        let end = start + cost;
        if cost > 0 {
            let watermark = self.watermark_ns;
            let c = &mut self.cores[core];
            c.occupy(start, end, watermark);
            c.work_ns += cost;
        }
        self.runs += 1;
        if self.runs.is_multiple_of(PRUNE_EVERY) {
            let watermark = self.watermark_ns;
            for c in &mut self.cores {
                c.prune(watermark);
            }
        }
        debug_assert!(start >= at && end >= start);
        Ran {
            core,
            start_ns: start,
            end_ns: end,
        }
    }

    fn place(&self, c: CoreIdx, at: u64, work: &Work) -> (CoreIdx, u64, u64) {
        let cost = self.cost_on(c, work);
        (c, self.cores[c].earliest(at, cost), cost)
    }

    /// Start a new measuring window at `now_ns` (the workload's start).
    pub fn start_window(&mut self, now_ns: u64) {
        self.window_start_ns = now_ns;
        for c in &mut self.cores {
            c.work_ns = 0;
        }
    }

    /// CPU time of the window from [`Cpu::start_window`] to `now_ns`: the work
    /// charged since the window began (work charged ahead, such as a device
    /// completion, counts when it is charged), capped per core at the window.
    pub fn usage(&self, now_ns: u64) -> Usage {
        let window = now_ns.saturating_sub(self.window_start_ns);
        let general: u64 = self
            .general
            .iter()
            .map(|&c| self.cores[c].work_ns.min(window))
            .sum();
        Usage {
            work_ns: general,
            poll_ns: window * self.pollers.len() as u64,
            capacity_ns: window * self.cores.len() as u64,
        }
    }

    /// The structure holds: general and polling cores partition the host, busy
    /// intervals are sorted, disjoint and within bounds.
    pub fn self_check(&self) {
        assert_eq!(
            self.general.len() + self.pollers.len(),
            self.cores.len(),
            "cores are general or polling"
        );
        assert!(!self.general.is_empty(), "a host keeps a general core");
        for (i, c) in self.cores.iter().enumerate() {
            assert_eq!(c.poller, self.pollers.contains(&i));
            // Past the bound only when more intervals than it lie ahead.
            let ahead = c.busy.values().filter(|&&e| e > self.watermark_ns).count();
            assert!(c.busy.len() <= INTERVALS_PER_CORE_MAX.max(ahead + 1));
            let mut last_end = 0;
            for (n, (&s, &e)) in c.busy.iter().enumerate() {
                assert!(s < e, "an empty busy interval");
                assert!(n == 0 || s > last_end, "busy intervals overlap or touch");
                last_end = e;
            }
        }
        assert!(self.watermark_ns <= self.latest_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    fn spec(cores: u32) -> HostSpec {
        HostSpec {
            cores,
            clock_mhz: 1000,
            numa: false,
            remote_cost_pct: 100,
            poll_cores: 0,
        }
    }

    fn work(cost_ns: u64) -> Work {
        Work {
            cost_ns,
            affinity: Affinity::Any,
            numa_node: 0,
        }
    }

    /// Mean wait in queue of a single core fed Poisson arrivals at load `rho`,
    /// service times drawn by `service`.
    fn mean_wait_ns(rho: f64, mean_service_ns: f64, service: impl Fn(&mut SmallRng) -> u64) -> f64 {
        let mut cpu = Cpu::new(spec(1), 1000).unwrap();
        let mut rng = SmallRng::seed_from_u64(7);
        let rate_per_ns = rho / mean_service_ns;
        let (mut t, mut waited, n) = (0.0f64, 0u64, 400_000u64);
        for _ in 0..n {
            t += -(1.0 - rng.gen::<f64>()).ln() / rate_per_ns;
            let at = t as u64;
            let ran = cpu.run(at, work(service(&mut rng)));
            waited += ran.start_ns - at;
        }
        cpu.self_check();
        waited as f64 / n as f64
    }

    #[test]
    fn a_loaded_core_queues_as_m_d_1() {
        // Pollaczek-Khinchine with deterministic service: W = rho D / (2 (1 - rho)).
        for rho in [0.5, 0.8, 0.9] {
            let d = 1000.0;
            let expected = rho * d / (2.0 * (1.0 - rho));
            let measured = mean_wait_ns(rho, d, |_| 1000);
            let err = (measured - expected).abs() / expected;
            assert!(
                err < 0.06,
                "rho {rho}: wait {measured:.0} ns, M/D/1 says {expected:.0}"
            );
        }
    }

    #[test]
    fn a_loaded_core_queues_as_m_m_1() {
        // Exponential service: W = rho E[S] / (1 - rho).
        let (rho, s) = (0.7, 2000.0);
        let expected = rho * s / (1.0 - rho);
        let measured = mean_wait_ns(rho, s, |rng| (-(1.0 - rng.gen::<f64>()).ln() * s) as u64);
        let err = (measured - expected).abs() / expected;
        assert!(
            err < 0.06,
            "wait {measured:.0} ns, M/M/1 says {expected:.0}"
        );
    }

    #[test]
    fn a_saturated_core_caps_throughput() {
        // Offered twice what one core can do: completions come one cost apart.
        let mut cpu = Cpu::new(spec(1), 1000).unwrap();
        let mut last = 0;
        for i in 0..1000u64 {
            last = cpu.run(i * 500, work(1000)).end_ns;
        }
        assert_eq!(last, 1000 * 1000);
        // Two cores take it all, none waits.
        let mut cpu = Cpu::new(spec(2), 1000).unwrap();
        for i in 0..1000u64 {
            let ran = cpu.run(i * 500, work(1000));
            assert_eq!(ran.start_ns, i * 500);
        }
    }

    #[test]
    fn earlier_work_fills_the_gap_before_future_work() {
        let mut cpu = Cpu::new(spec(1), 1000).unwrap();
        let later = cpu.run_at(0, 10_000, work(1000));
        assert_eq!((later.start_ns, later.end_ns), (10_000, 11_000));
        // Arrives later in call order, earlier in time, and fits before it.
        let early = cpu.run_at(0, 2_000, work(3000));
        assert_eq!((early.start_ns, early.end_ns), (2_000, 5_000));
        // Does not fit in the gap left (5,000..10,000 holds 5,000): goes after.
        let big = cpu.run_at(0, 4_000, work(6000));
        assert_eq!(big.start_ns, 11_000);
        // Work charged far in the future does not hold back work arriving now.
        let future = cpu.run_at(20_000, 1_000_000_000, work(10));
        assert_eq!(future.start_ns, 1_000_000_000);
        assert_eq!(cpu.run(20_000, work(10)).start_ns, 20_000);
        cpu.self_check();
    }

    #[test]
    fn costs_scale_with_the_clock_and_numa() {
        let mut s = spec(2);
        s.clock_mhz = 2000;
        s.numa = true;
        s.remote_cost_pct = 150;
        let mut cpu = Cpu::new(s, 1000).unwrap();
        // Twice the reference clock: half the time; local core 0 takes it.
        let ran = cpu.run(0, work(1000));
        assert_eq!((ran.core, ran.end_ns), (0, 500));
        // Core 0 busy till 500: node 1's core finishes at 750 (remote), core 0 at
        // 1000: the remote one wins.
        let ran = cpu.run(0, work(1000));
        assert_eq!((ran.core, ran.end_ns), (1, 750));
        // Pinned to core 0: waits for it.
        let pinned = Work {
            affinity: Affinity::Core(0),
            ..work(1000)
        };
        assert_eq!(cpu.run(0, pinned).start_ns, 500);
    }

    #[test]
    fn a_polling_core_is_always_busy_and_runs_only_polled_work() {
        let mut s = spec(4);
        s.poll_cores = 1;
        let mut cpu = Cpu::new(s, 1000).unwrap();
        cpu.start_window(0);
        let polled = Work {
            affinity: Affinity::Poller(0),
            ..work(100)
        };
        for i in 0..10 {
            assert_eq!(cpu.run(i * 1000, polled).core, 3);
            assert_ne!(cpu.run(i * 1000, work(100)).core, 3);
        }
        let u = cpu.usage(1_000_000);
        assert_eq!(
            u.poll_ns, 1_000_000,
            "the polling core spins the whole window"
        );
        assert_eq!(u.work_ns, 10 * 100);
        assert_eq!(u.capacity_ns, 4_000_000);
        let expected = (1_000_000.0 + 1000.0) / 4_000_000.0;
        assert!((u.utilization() - expected).abs() < 1e-12);
    }

    #[test]
    fn old_busy_time_is_forgotten_and_late_work_moves_up() {
        let mut cpu = Cpu::new(spec(1), 1000).unwrap();
        let gap = 40_000;
        for i in 0..(3 * PRUNE_EVERY) {
            // Half a microsecond of work every 40 us: nothing merges.
            cpu.run(i * gap, work(500));
        }
        cpu.self_check();
        // What ended more than the slack ago is forgotten at the last prune.
        let kept = (LATE_ARRIVAL_SLACK_NS / gap + PRUNE_EVERY + 1) as usize;
        assert!(
            cpu.cores[0].busy.len() <= kept,
            "{}",
            cpu.cores[0].busy.len()
        );
        let latest = (3 * PRUNE_EVERY - 1) * gap;
        let late = cpu.run(0, work(10));
        assert!(late.start_ns >= latest - LATE_ARRIVAL_SLACK_NS);
    }

    #[test]
    fn bad_specs_are_refused() {
        assert!(Cpu::new(spec(0), 1000).is_err());
        let mut s = spec(2);
        s.poll_cores = 2;
        assert!(Cpu::new(s, 1000).is_err());
        let mut s = spec(1);
        s.numa = true;
        assert!(Cpu::new(s, 1000).is_err());
    }
}
