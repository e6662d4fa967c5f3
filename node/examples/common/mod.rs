//! What the NBD benchmarks share: a local weir cluster as a child process, and
//! one fio run through fio's nbd engine, parsed from its JSON.

// Each benchmark uses its own part of this.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The volume every benchmark creates.
pub(crate) const VOLUME: &str = "bench";

/// A server under test, stopped (SIGTERM, then SIGKILL) when dropped.
pub(crate) struct Target {
    /// How the tables name it.
    pub(crate) label: &'static str,
    /// Its NBD URI.
    pub(crate) uri: String,
    /// The server process.
    pub(crate) process: Child,
}

impl Drop for Target {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our child's pid.
        unsafe { libc::kill(self.process.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.process.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// `weir cluster up` of `nodes` nodes (as many replicas) in `dir`, on ports
/// moved by `offset`, with a pool of `pool` and one volume of `size`
/// (encrypted, with a key made in `dir`, if `encrypt`).
pub(crate) fn weir_cluster(
    weir: &Path,
    dir: &Path,
    label: &'static str,
    (nodes, offset): (u32, u16),
    (pool, size, encrypt): (&str, &str, bool),
) -> Target {
    let _ = std::fs::remove_dir_all(dir);
    let mut child = Command::new(weir)
        .args(["cluster", "up", "--pool-size", pool])
        .args([
            "--nodes",
            &nodes.to_string(),
            "--replicas",
            &nodes.to_string(),
        ])
        .arg("--dir")
        .arg(dir)
        .args(["--port-offset", &offset.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("weir runs");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        let n = std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert!(n > 0, "weir cluster up ended: see {}", dir.display());
        if line.contains("nodes up") {
            break;
        }
    }
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    let admin = format!("127.0.0.1:{}", 9401 + offset);
    let mut create = Command::new(weir);
    create
        .args([
            "volume", "create", VOLUME, "--size", size, "--admin", &admin,
        ])
        // Mutating admin requests carry the cluster's token.
        .arg("--token-file")
        .arg(dir.join("admin.token"));
    if encrypt {
        create
            .arg("--encrypt")
            .arg("--key-file")
            .arg(dir.join("bench.key"));
    }
    let status = create.status().unwrap();
    assert!(status.success(), "volume create failed");
    Target {
        label,
        uri: format!("nbd://127.0.0.1:{}/{VOLUME}", 10809 + offset),
        process: child,
    }
}

/// A gauge or counter `name` from the `/metrics` of the node whose admin API
/// listens on `admin`.
pub(crate) fn metric(admin: &str, name: &str) -> u64 {
    weir_node::admin_client::metric(admin, name)
        .expect("the admin API answers")
        .unwrap_or_else(|| panic!("{name} in /metrics of {admin}"))
}

/// CPU time (user and system) spent so far by process `pid` and every process
/// below it (a `weir cluster up` runs each node as its child), from
/// `/proc/<pid>/stat`; in nanoseconds, at the kernel's clock-tick resolution.
pub(crate) fn tree_cpu_ns(pid: u32) -> u64 {
    // (pid, parent, utime + stime in ticks) of every process.
    let procs: Vec<(u32, u32, u64)> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            // The command name (field 2) may hold spaces: fields count from its ')'.
            let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
            let field = |n: usize| rest.get(n - 3)?.parse::<u64>().ok();
            Some((p, field(4)? as u32, field(14)? + field(15)?))
        })
        .collect();
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(procs.iter().filter(|p| p.1 == parent).map(|p| p.0));
        i += 1;
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let ticks: u64 = procs
        .iter()
        .filter(|p| tree.contains(&p.0))
        .map(|p| p.2)
        .sum();
    ticks * 1_000_000_000 / hz
}

/// What one fio run measured.
#[derive(Clone, Copy, Default)]
pub(crate) struct Result {
    /// Operations per second.
    pub(crate) iops: f64,
    /// Payload MB (10^6) per second.
    pub(crate) mb_s: f64,
    /// Completion latency, 99th percentile.
    pub(crate) p99_us: f64,
}

/// fio with `rw` in blocks of `bs` at queue depth `depth` over `size` of `uri`:
/// for `runtime` seconds, or once over `size`.
pub(crate) fn fio(
    uri: &str,
    (rw, bs): (&str, &str),
    depth: u32,
    size: &str,
    runtime: Option<u64>,
) -> Result {
    let mut cmd = Command::new("fio");
    cmd.args(["--name=bench", "--ioengine=nbd", &format!("--uri={uri}")])
        .args([
            &format!("--rw={rw}"),
            &format!("--bs={bs}"),
            &format!("--iodepth={depth}"),
        ])
        .args([&format!("--size={size}"), "--output-format=json"]);
    if let Some(s) = runtime {
        cmd.args(["--time_based", &format!("--runtime={s}")]);
    }
    let out = cmd.output().expect("fio is needed (Debian: fio)");
    assert!(
        out.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // fio may print notes before its JSON.
    let text = String::from_utf8_lossy(&out.stdout);
    let json = &text[text.find('{').expect("fio printed JSON")..];
    let v: serde_json::Value = serde_json::from_str(json).expect("fio JSON");
    let job = &v["jobs"][0];
    let side = if rw.contains("write") {
        &job["write"]
    } else {
        &job["read"]
    };
    Result {
        iops: side["iops"].as_f64().unwrap_or(0.0),
        mb_s: side["bw_bytes"].as_f64().unwrap_or(0.0) / 1e6,
        p99_us: side["clat_ns"]["percentile"]["99.000000"]
            .as_f64()
            .unwrap_or(0.0)
            / 1e3,
    }
}
