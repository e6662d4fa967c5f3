//! `cargo xtask bench snapshots`: what snapshots cost. A 3-node cluster on
//! loopback, a 256 MiB volume filled by a sequential write; fio's nbd engine
//! runs 4 KiB random writes and reads (QD32) with no snapshot, then ten
//! snapshots are taken, each after a run of random writes (so every snapshot
//! freezes extents the one before had redirected), and the same jobs run
//! again: the first random-write run after the tenth snapshot pays the
//! copies of redirect-on-write, the read run reads through the redirected
//! extents. Prints IOPS and P99 of each run, the ratios, the time each
//! `weir snapshot create` took, and the pool's use. A benchmark, not a test:
//! it asserts nothing.
//!
//! Runs are `BENCH_RUNTIME_S` (default 20) seconds; the writes between
//! snapshots run a fifth of that. Needs the release `weir` binary
//! (`WEIR_BIN`, set by xtask) and fio.

mod common;

use common::{fio, weir_cluster, Result, VOLUME};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The volume: 4 extents of 64 MiB, each redirected in full by the writes
/// between snapshots (copy-forward), so the pool holds 11 versions of it.
const SIZE: &str = "256M";
const POOL: &str = "4G";
/// Port offset (admin 14901-3, NBD 16309-11), clear of the other benchmarks'.
const OFFSET: u16 = 5500;
const SNAPSHOTS: usize = 10;

fn main() {
    let weir = PathBuf::from(
        std::env::var("WEIR_BIN").expect("WEIR_BIN: run through cargo xtask bench snapshots"),
    );
    let runtime: u64 = std::env::var("BENCH_RUNTIME_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-snapshots");
    let target = weir_cluster(
        &weir,
        &dir,
        "weir, 3 replicas",
        (3, OFFSET),
        (POOL, SIZE, false),
    );
    let admin = format!("127.0.0.1:{}", 9401 + OFFSET);
    let weir_cmd = |args: &[&str]| {
        let out = Command::new(&weir)
            .args(args)
            .args(["--admin", &admin, "--token-file"])
            .arg(dir.join("admin.token"))
            .output()
            .expect("weir runs");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "weir {args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    eprintln!("bench: filling {}", target.uri);
    fio(&target.uri, ("write", "1m"), 8, SIZE, None);
    let jobs = [("4k randwrite", "randwrite"), ("4k randread", "randread")];
    let run = |label: &str| -> Vec<Result> {
        jobs.iter()
            .map(|(name, rw)| {
                eprintln!("bench: {name}, {label}, {runtime} s");
                fio(&target.uri, (rw, "4k"), 32, SIZE, Some(runtime))
            })
            .collect()
    };
    let before = run("no snapshot");
    let mut took_ms = Vec::new();
    for i in 0..SNAPSHOTS {
        let out = weir_cmd(&["snapshot", "create", VOLUME, &format!("s{i}")]);
        let ms: f64 = out
            .split("taken in ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|t| t.parse().ok())
            .expect("the time a snapshot took");
        took_ms.push(ms);
        eprintln!("bench: snapshot s{i} in {ms} ms; writes between snapshots");
        fio(
            &target.uri,
            ("randwrite", "4k"),
            32,
            SIZE,
            Some((runtime / 5).max(1)),
        );
    }
    let after = run("10 snapshots");
    let status = weir_cmd(&["status"]);
    let pool = status
        .lines()
        .find(|l| l.starts_with("pool: "))
        .unwrap_or("pool: ?")
        .to_string();
    println!("fio nbd engine, QD32, {runtime} s per run, 256 MiB volume, 3 nodes on loopback");
    println!(
        "{:<14} {:<14} {:>10} {:>10}",
        "job", "snapshots", "IOPS", "P99 us"
    );
    for (j, (name, _)) in jobs.iter().enumerate() {
        for (label, r) in [("0", before[j]), ("10", after[j])] {
            println!(
                "{:<14} {:<14} {:>10.0} {:>10.0}",
                name, label, r.iops, r.p99_us
            );
        }
        println!(
            "{:<14} {:<14} IOPS {:.2}, P99 {:.2}",
            "",
            "10 / 0",
            after[j].iops / before[j].iops,
            after[j].p99_us / before[j].p99_us
        );
    }
    let mut sorted = took_ms.clone();
    sorted.sort_by(f64::total_cmp);
    println!(
        "snapshot create: median {:.1} ms, min {:.1} ms, max {:.1} ms over {SNAPSHOTS}",
        sorted[SNAPSHOTS / 2],
        sorted[0],
        sorted[SNAPSHOTS - 1]
    );
    println!("{pool}");
}
