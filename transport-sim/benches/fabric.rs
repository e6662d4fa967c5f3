//! `cargo xtask bench fabric`: the fabric engine's speed on the 2:1 and 60:1
//! scenarios of the published-behaviour checks, on one core: events processed per
//! wall-clock second, and simulated time per wall-clock time.
//!
//! A benchmark, not a test: it asserts nothing and reads the wall clock. Each
//! scenario runs `RUNS` times; the median run is reported. (A plain harness rather
//! than criterion: the figures wanted are ratios of two measured quantities per
//! run, which criterion's per-iteration statistics do not give.)

use std::time::Instant;
use weir_core::wire::Frame;
use weir_transport_sim::fabric::config::{FabricConfig, Topology};
use weir_transport_sim::fabric::Engine;

const RUNS: usize = 5;

struct Run {
    events: u64,
    sim_ns: u64,
    wall_s: f64,
}

fn run(hosts: usize, flows: &[(usize, usize, usize, usize)]) -> Run {
    let config = FabricConfig {
        topology: Topology::Star { hosts },
        ..FabricConfig::default()
    };
    let mut e = Engine::new(config).expect("valid config");
    for _ in 0..hosts {
        e.add_host().expect("slot");
    }
    let start = Instant::now();
    for &(src, dst, count, len) in flows {
        for _ in 0..count {
            e.send(0, src, dst, Frame::from(vec![0; len]));
        }
    }
    let d = e.run_until_idle(u64::MAX);
    let wall_s = start.elapsed().as_secs_f64();
    let sim_ns = d.iter().map(|d| d.at_ns).max().unwrap_or(0);
    Run {
        events: e.counters().events,
        sim_ns,
        wall_s,
    }
}

fn report(name: &str, hosts: usize, flows: &[(usize, usize, usize, usize)]) {
    let mut runs: Vec<Run> = (0..RUNS).map(|_| run(hosts, flows)).collect();
    runs.sort_by(|a, b| a.wall_s.total_cmp(&b.wall_s));
    let m = &runs[RUNS / 2];
    println!(
        "{name:<34} {:>10} events {:>9.3} ms simulated {:>8.3} s wall  {:>6.2} M events/s  sim/wall {:.4}",
        m.events,
        m.sim_ns as f64 / 1e6,
        m.wall_s,
        m.events as f64 / m.wall_s / 1e6,
        m.sim_ns as f64 / 1e9 / m.wall_s
    );
}

fn main() {
    // `cargo bench` passes flags such as `--bench`; this harness takes none.
    println!("fabric engine, 100 Gb/s star, DCQCN (hpcc), median of {RUNS} runs, one core");
    let two_to_one: Vec<_> = (0..2).map(|s| (s, 2, 400, 64 << 10)).collect();
    report("2:1, 2 x 26 MB", 3, &two_to_one);
    let incast: Vec<_> = (0..60).map(|s| (s, 60, 1, 500_000)).collect();
    report("60:1 incast, 60 x 500 KB", 61, &incast);
    let big: Vec<_> = (0..32).map(|s| (s, (s + 1) % 32, 200, 64 << 10)).collect();
    report("32 hosts in a ring, 32 x 13 MB", 32, &big);
}
