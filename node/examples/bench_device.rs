//! `cargo xtask bench device`: weir's io_uring device against fio's own
//! io_uring engine on the same file, 4 KiB random reads and writes at queue
//! depth 1, 16 and 128, in each poll mode: `interrupt`, `sqpoll` (fio
//! `--sqthread_poll`) and `iopoll` (fio `--hipri`), registered buffers and
//! files on both sides (fio `--fixedbufs --registerfiles`). Prints IOPS, P50
//! and P99 latency and CPU time per I/O of each, and weir's IOPS as a ratio
//! of fio's. A mode the device cannot run is reported with the reason, as
//! `weir node` would refuse it. A benchmark, not a test: it asserts nothing.
//!
//! One queue, one thread submitting (a tokio runtime of one worker), for
//! `BENCH_RUNTIME_S` seconds a cell (default 5), on a 1 GiB file written in
//! full first so reads hit data (`BENCH_DIR`, default `target/bench-device`,
//! must be on a file system with O_DIRECT). CPU time is the process's user
//! and system time over the run (getrusage), so a SQPOLL thread's polling
//! counts where the kernel charges it to the process.

use hdrhistogram::Histogram;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_core::buf::BufPool;
use weir_core::device::{BlockDevice, DevCommand};
use weir_core::ids::Lba;
use weir_nvme_uring::{PollMode, UringDevice, UringOptions};

const FILE_BYTES: u64 = 1 << 30;
const BS: usize = 4096;
const DEPTHS: [u16; 3] = [1, 16, 128];

/// What one run measured.
#[derive(Clone, Copy)]
struct Cell {
    iops: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us_per_io: f64,
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// One cell of the table: what runs, how deep, how long.
#[derive(Clone, Copy)]
struct Job {
    mode: PollMode,
    write: bool,
    depth: u16,
    runtime: Duration,
}

/// weir's device on `path`: `depth` commands in flight for `runtime`.
fn weir(path: &Path, job: Job) -> Result<Cell, String> {
    let Job {
        mode,
        write,
        depth,
        runtime,
    } = job;
    let pool = BufPool::new(256 << 20);
    let opts = UringOptions {
        mode,
        queues: 1,
        queue_depth: depth.max(2),
        ..UringOptions::default()
    };
    let dev = Arc::new(
        UringDevice::open_with_pool(path, opts, Some(pool.clone())).map_err(|e| e.to_string())?,
    );
    let rt = tokio_real::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let blocks = FILE_BYTES / BS as u64;
    let stop = Arc::new(AtomicBool::new(false));
    let (cpu0, t0) = (cpu_seconds(), Instant::now());
    let hists = rt.block_on(async {
        let tasks: Vec<_> = (0..depth)
            .map(|i| {
                let (dev, pool, stop) = (dev.clone(), pool.clone(), stop.clone());
                tokio_real::spawn(async move {
                    let mut h = Histogram::<u64>::new(3).unwrap();
                    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (u64::from(i) + 1);
                    let data = {
                        let mut b = pool.alloc(BS).unwrap();
                        b.as_mut().fill(0x5a);
                        b.freeze()
                    };
                    while !stop.load(Ordering::Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let lba = Lba(x % blocks);
                        let cmd = if write {
                            DevCommand::Write {
                                lba,
                                data: data.clone(),
                                fua: false,
                            }
                        } else {
                            DevCommand::Read {
                                lba,
                                buf: pool.alloc(BS).unwrap(),
                            }
                        };
                        let start = Instant::now();
                        dev.submit(0, cmd).await.expect("the command completes");
                        h.record(start.elapsed().as_nanos() as u64).unwrap();
                    }
                    h
                })
            })
            .collect();
        tokio_real::time::sleep(runtime).await;
        stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for t in tasks {
            all.push(t.await.unwrap());
        }
        all
    });
    let (cpu, secs) = (cpu_seconds() - cpu0, t0.elapsed().as_secs_f64());
    let mut h = Histogram::<u64>::new(3).unwrap();
    for x in &hists {
        h.add(x).unwrap();
    }
    let ios = h.len() as f64;
    Ok(Cell {
        iops: ios / secs,
        p50_us: h.value_at_quantile(0.5) as f64 / 1e3,
        p99_us: h.value_at_quantile(0.99) as f64 / 1e3,
        cpu_us_per_io: cpu / ios * 1e6,
    })
}

/// fio's io_uring engine on `path`, the matching options.
fn fio(path: &Path, job: Job) -> Result<Cell, String> {
    let (mode, write) = (job.mode, job.write);
    let mut cmd = Command::new("fio");
    cmd.args([
        "--name=bench",
        &format!("--filename={}", path.display()),
        "--ioengine=io_uring",
        "--direct=1",
        if write {
            "--rw=randwrite"
        } else {
            "--rw=randread"
        },
        "--bs=4k",
        &format!("--iodepth={}", job.depth),
        "--fixedbufs=1",
        "--registerfiles=1",
        // Submission to completion, as weir's figures are (fio's clat starts
        // at submission too, but with --sqthread_poll it is not meaningful).
        "--lat_percentiles=1",
        "--clat_percentiles=0",
        "--time_based",
        &format!("--runtime={}", job.runtime.as_secs()),
        "--output-format=json",
    ]);
    match mode {
        PollMode::Interrupt => {}
        PollMode::Sqpoll => {
            cmd.arg("--sqthread_poll=1");
        }
        PollMode::Iopoll => {
            cmd.arg("--hipri=1");
        }
    }
    let out = cmd
        .output()
        .map_err(|e| format!("fio is needed (Debian: fio): {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("fio failed: {}", err.lines().last().unwrap_or("")));
    }
    let json = &text[text.find('{').ok_or("fio printed no JSON")?..];
    let v: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
    let job = &v["jobs"][0];
    let side = if write { &job["write"] } else { &job["read"] };
    if job["error"].as_i64().unwrap_or(0) != 0 {
        return Err(format!("fio error {}", job["error"]));
    }
    let ios = side["total_ios"].as_f64().unwrap_or(0.0);
    let secs = job["job_runtime"].as_f64().unwrap_or(0.0) / 1e3;
    let cpu = (job["usr_cpu"].as_f64().unwrap_or(0.0) + job["sys_cpu"].as_f64().unwrap_or(0.0))
        / 100.0
        * secs;
    let pct = |p: &str| side["lat_ns"]["percentile"][p].as_f64().unwrap_or(0.0) / 1e3;
    Ok(Cell {
        iops: side["iops"].as_f64().unwrap_or(0.0),
        p50_us: pct("50.000000"),
        p99_us: pct("99.000000"),
        cpu_us_per_io: if ios > 0.0 { cpu / ios * 1e6 } else { 0.0 },
    })
}

/// A 1 GiB file written in full, so reads hit data.
fn prepare(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("disk.img");
    let full = std::fs::metadata(&path).is_ok_and(|m| m.len() == FILE_BYTES);
    if !full {
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0xa5u8; 1 << 20];
        for _ in 0..(FILE_BYTES >> 20) {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
    }
    path
}

fn show(c: &Result<Cell, String>) -> String {
    match c {
        Ok(c) => format!(
            "{:>9.0} | {:>7.1} | {:>7.1} | {:>6.1}",
            c.iops, c.p50_us, c.p99_us, c.cpu_us_per_io
        ),
        Err(_) => format!("{:>9} | {:>7} | {:>7} | {:>6}", "-", "-", "-", "-"),
    }
}

fn main() {
    let runtime = Duration::from_secs(
        std::env::var("BENCH_RUNTIME_S")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(5),
    );
    let dir = std::env::var("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from("target/bench-device"));
    let path = prepare(&dir);
    println!(
        "weir's io_uring device vs fio's io_uring engine, 4 KiB, one queue, {} s a cell, {}",
        runtime.as_secs(),
        path.display()
    );
    println!(
        "| mode | rw | QD | weir IOPS | P50 us | P99 us | CPU us/IO | fio IOPS | P50 us | P99 us | CPU us/IO | weir/fio |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut refusals = Vec::new();
    for mode in [PollMode::Interrupt, PollMode::Sqpoll, PollMode::Iopoll] {
        for write in [false, true] {
            for depth in DEPTHS {
                let job = Job {
                    mode,
                    write,
                    depth,
                    runtime,
                };
                let (w, f) = (weir(&path, job), fio(&path, job));
                let ratio = match (&w, &f) {
                    (Ok(w), Ok(f)) if f.iops > 0.0 => format!("{:.2}x", w.iops / f.iops),
                    _ => "-".into(),
                };
                println!(
                    "| {} | {} | {depth} | {} | {} | {ratio} |",
                    mode.name(),
                    if write { "randwrite" } else { "randread" },
                    show(&w),
                    show(&f)
                );
                for (who, r) in [("weir", &w), ("fio", &f)] {
                    if let Err(e) = r {
                        let line = format!("{who} {}: {e}", mode.name());
                        if !refusals.contains(&line) {
                            refusals.push(line);
                        }
                    }
                }
            }
        }
    }
    for r in refusals {
        println!("- {r}");
    }
}
