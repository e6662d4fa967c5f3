//! `cargo xtask bench nbd`: the same fio jobs through fio's nbd engine against
//! (a) weir with 1 replica, (b) qemu-nbd serving the same kind of file, (c) weir
//! with 3 replicas on loopback and (d) the same with the volume encrypted
//! (XTS-AES-256 in the front end), in alternation; prints IOPS, MB/s and P99
//! latency of each and the ratios a/b, c/a and d/c, and for weir the payload
//! copies per random write and node (from each node's `/metrics`), and the
//! server's CPU time (user and system, every node of a weir target) per I/O with
//! the ratio of weir's to qemu-nbd's. A benchmark, not a test: it asserts nothing.
//!
//! Jobs (QD32, 20 s each; `BENCH_RUNTIME_S` overrides): 4 KiB random read, 4 KiB
//! random write, 128 KiB sequential read, on a 1 GiB volume first filled with a
//! sequential write so reads hit data. qemu-nbd runs with `--cache=none
//! --aio=io_uring` (O_DIRECT and io_uring, as weir's device does). Everything runs
//! on this host; the figures are this machine's.
//!
//! Needs the release `weir` binary (`WEIR_BIN`, set by xtask), fio and qemu-nbd.

mod common;

use common::{fio, metric, tree_cpu_ns, weir_cluster, Result, Target, VOLUME};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The volume's size, and the pool's.
const SIZE: &str = "1G";
const POOL: &str = "4G";

fn qemu_nbd(dir: &Path, port: u16) -> Target {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let file = dir.join("disk.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    let child = Command::new("qemu-nbd")
        .args([
            "-f",
            "raw",
            "-x",
            VOLUME,
            "-b",
            "127.0.0.1",
            "-p",
            &port.to_string(),
        ])
        .args(["-t", "-e", "64", "--cache=none", "--aio=io_uring"])
        .arg(&file)
        .stderr(Stdio::inherit())
        .spawn()
        .expect("qemu-nbd is needed (Debian: qemu-utils)");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "qemu-nbd did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Target {
        label: "b qemu-nbd",
        uri: format!("nbd://127.0.0.1:{port}/{VOLUME}"),
        process: child,
    }
}

struct Job {
    name: &'static str,
    rw: &'static str,
    bs: &'static str,
}

const JOBS: [Job; 3] = [
    Job {
        name: "4k randread",
        rw: "randread",
        bs: "4k",
    },
    Job {
        name: "4k randwrite",
        rw: "randwrite",
        bs: "4k",
    },
    Job {
        name: "128k seqread",
        rw: "read",
        bs: "128k",
    },
];

fn main() {
    let weir = PathBuf::from(
        std::env::var("WEIR_BIN").expect("WEIR_BIN: run through cargo xtask bench nbd"),
    );
    let runtime: u64 = std::env::var("BENCH_RUNTIME_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let work = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-nbd");
    let targets = [
        weir_cluster(
            &weir,
            &work.join("a"),
            "a weir, 1 replica",
            (1, 3000),
            (POOL, SIZE, false),
        ),
        qemu_nbd(&work.join("b"), 15809),
        weir_cluster(
            &weir,
            &work.join("c"),
            "c weir, 3 replicas",
            (3, 4000),
            (POOL, SIZE, false),
        ),
        weir_cluster(
            &weir,
            &work.join("d"),
            "d weir, 3, encrypted",
            (3, 4500),
            (POOL, SIZE, true),
        ),
    ];
    for t in &targets {
        eprintln!("bench: filling {} ({})", t.label, t.uri);
        fio(&t.uri, ("write", "1m"), 8, SIZE, None);
    }
    // Payload copies summed over a weir target's nodes (its port offset and
    // node count); none for qemu-nbd.
    let weirs: [Option<(u16, u16)>; 4] = [Some((3000, 1)), None, Some((4000, 3)), Some((4500, 3))];
    // (all copies, copies other than a receipt off a socket)
    let copies = |i: usize| {
        weirs[i].map(|(offset, nodes)| {
            (1..=nodes)
                .map(|n| {
                    let at = format!("127.0.0.1:{}", 9400 + n + offset);
                    (
                        metric(&at, "weir_payload_copies"),
                        metric(&at, "weir_payload_copies_beyond_receive"),
                    )
                })
                .fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
        })
    };
    let mut results = vec![[Result::default(); 4]; JOBS.len()];
    // The server's CPU time per I/O, in microseconds.
    let mut cpu_us = vec![[0.0f64; 4]; JOBS.len()];
    let mut write_copies = [None; 4];
    for (j, job) in JOBS.iter().enumerate() {
        for (i, t) in targets.iter().enumerate() {
            eprintln!("bench: {} on {} for {runtime} s", job.name, t.label);
            let before = copies(i);
            let cpu_before = tree_cpu_ns(t.process.id());
            results[j][i] = fio(&t.uri, (job.rw, job.bs), 32, SIZE, Some(runtime));
            let ios = results[j][i].iops * runtime as f64;
            let cpu_ns = tree_cpu_ns(t.process.id()) - cpu_before;
            cpu_us[j][i] = cpu_ns as f64 / 1e3 / ios.max(1.0);
            if job.rw == "randwrite" {
                let per = results[j][i].iops * runtime as f64;
                write_copies[i] = before.zip(copies(i)).zip(weirs[i]).map(
                    |(((all0, other0), (all1, other1)), (_, nodes))| {
                        let per = per * f64::from(nodes);
                        ((all1 - all0) as f64 / per, (other1 - other0) as f64 / per)
                    },
                );
            }
        }
    }
    let host = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!("fio nbd engine, QD32, {runtime} s per run, 1 GiB volume; {cpus} CPUs ({host})");
    println!(
        "{:<14} {:<20} {:>10} {:>9} {:>10} {:>13}",
        "job", "target", "IOPS", "MB/s", "P99 us", "CPU us per IO"
    );
    for (j, job) in JOBS.iter().enumerate() {
        for (i, t) in targets.iter().enumerate() {
            let r = results[j][i];
            println!(
                "{:<14} {:<20} {:>10.0} {:>9.1} {:>10.0} {:>13.1}",
                job.name, t.label, r.iops, r.mb_s, r.p99_us, cpu_us[j][i]
            );
        }
        let [a, b, c, d] = results[j];
        println!(
            "{:<14} {:<20} a/b IOPS {:.2}, c/a IOPS {:.2}, d/c IOPS {:.2}; a/b CPU per IO {:.2}",
            "",
            "ratios",
            a.iops / b.iops,
            c.iops / a.iops,
            d.iops / c.iops,
            cpu_us[j][0] / cpu_us[j][1]
        );
    }
    for (i, t) in targets.iter().enumerate() {
        if let Some((all, other)) = write_copies[i] {
            println!(
                "payload copies per 4k random write and node, {}: {all:.2} ({other:.2} other than a receipt off a socket)",
                t.label
            );
        }
    }
}
