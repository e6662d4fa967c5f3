//! `cargo xtask bench memory`: how a node's memory grows with the data it holds.
//! One node, one replica, a 6 GiB volume: its resident set size (VmRSS) before
//! any write, after 6 GiB of 4 KiB random writes (every block once, in random
//! order: fio's random map), and after the same again (a rewrite of every block).
//! Prints each figure, the growth, and the growth projected to 1 TiB written,
//! and the node's own accounting from its `/metrics`: the bytes of version
//! grains it holds (what grows with data written) and the records of its
//! applied log (bounded whatever is written).
//! A benchmark, not a test: it asserts nothing about the figures.
//!
//! The budget (DESIGN.md section 4.1): version, retry and reconciliation
//! metadata of at most 64 MiB of RAM per TiB written, for any write pattern.
//!
//! Needs the release `weir` binary (`WEIR_BIN`, set by xtask) and fio.
//! `BENCH_MEMORY_GIB` sets the volume size (default 6).

mod common;

use common::{fio, weir_cluster};
use std::path::{Path, PathBuf};

/// The pool is the volume plus room (sparse: only what is written takes disk).
const POOL_EXTRA_GIB: u64 = 2;

/// The node's resident set size, bytes, from /proc.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/status: {e}"));
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kib * 1024
}

/// The node's admin address (`weir cluster up --port-offset 5000`).
const ADMIN: &str = "127.0.0.1:14401";

/// A gauge from the node's `/metrics`.
fn gauge(name: &str) -> u64 {
    common::metric(ADMIN, name)
}

/// The pid the node wrote into its data directory.
fn node_pid(dir: &Path) -> u32 {
    let file = dir.join("node1/weir.pid");
    let text = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
    text.trim().parse().expect("a pid")
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

fn main() {
    let weir = PathBuf::from(
        std::env::var("WEIR_BIN").expect("WEIR_BIN: run through cargo xtask bench memory"),
    );
    let gib: u64 = std::env::var("BENCH_MEMORY_GIB")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&g| g > 0)
        .unwrap_or(6);
    let (size, pool) = (format!("{gib}G"), format!("{}G", gib + POOL_EXTRA_GIB));
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-memory");
    let target = weir_cluster(
        &weir,
        &dir,
        "weir, 1 replica",
        (1, 5000),
        (&pool, &size, false),
    );
    let pid = node_pid(&dir);
    let before = rss_bytes(pid);
    let mut rows = vec![("before any write", before)];
    let mut own = Vec::new();
    for pass in [
        "after writing every block once",
        "after rewriting every block",
    ] {
        eprintln!(
            "bench: 4 KiB random writes over {size} of {} ({pass})",
            target.uri
        );
        let r = fio(&target.uri, ("randwrite", "4k"), 32, &size, None);
        eprintln!("bench: {:.0} IOPS, {:.1} MB/s", r.iops, r.mb_s);
        rows.push((pass, rss_bytes(pid)));
        own.push((
            pass,
            gauge("weir_version_grain_bytes"),
            gauge("weir_applied_log_records"),
        ));
    }
    println!("weir node RSS, 1 replica, {gib} GiB volume, 4 KiB random writes at QD32 (fio nbd)");
    for (what, rss) in &rows {
        println!("  {what:<32} {:>9.1} MiB", mib(*rss));
    }
    let written = gib << 30;
    for (what, from, to) in [
        ("first pass", rows[0].1, rows[1].1),
        ("rewrite", rows[1].1, rows[2].1),
    ] {
        let growth = to.saturating_sub(from);
        println!(
            "  growth, {what:<10} {:>9.1} MiB for {gib} GiB: {:>7.1} MiB per TiB written",
            mib(growth),
            mib(growth) * (1u64 << 40) as f64 / written as f64
        );
    }
    println!("  budget: 64 MiB per TiB written (16 MiB for 6 GiB with slack)");
    println!("the node's own accounting (/metrics)");
    for (what, grains, records) in own {
        println!(
            "  {what:<32} version grains {:>7.1} KiB ({:.1} MiB per TiB written), applied log {records} records (bounded)",
            grains as f64 / 1024.0,
            mib(grains) * (1u64 << 40) as f64 / written as f64
        );
    }
}
