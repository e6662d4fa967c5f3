//! What the real-client tests share: a `weir cluster up` in the background,
//! client programs run with a time limit, scratch directories and patterns.
#![allow(dead_code)] // Each test crate uses its own part.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub(crate) const WEIR: &str = env!("CARGO_BIN_EXE_weir");
pub(crate) const MIB: usize = 1 << 20;

/// A `weir cluster up` in the background; stopped (SIGTERM) on drop.
pub(crate) struct Cluster {
    child: Option<Child>,
    pub(crate) dir: PathBuf,
    pub(crate) offset: u16,
}

impl Cluster {
    pub(crate) fn start(dir: &Path, offset: u16) -> Cluster {
        Cluster::start_with(dir, offset, &[])
    }

    pub(crate) fn start_with(dir: &Path, offset: u16, extra: &[&str]) -> Cluster {
        // The pool is 8 GiB unless the test sizes it.
        let pool = if extra.contains(&"--pool-size") {
            &[][..]
        } else {
            &["--pool-size", "8G"][..]
        };
        let mut child = Command::new(WEIR)
            .args(["cluster", "up", "--nodes", "3"])
            .args(pool)
            .arg("--dir")
            .arg(dir)
            .args(["--port-offset", &offset.to_string()])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("weir runs");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                println!("[cluster] {line}");
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(line) if line.contains("nodes up") => break,
                Ok(_) => {}
                Err(_) => {
                    if let Ok(Some(status)) = child.try_wait() {
                        panic!("weir cluster up exited: {status}");
                    }
                    assert!(Instant::now() < deadline, "the cluster did not come up");
                }
            }
        }
        // The local cluster's members authenticate one another by TLS under
        // the CA it made, with no step of the user's.
        assert!(dir.join("certs/ca.pem").exists(), "the cluster CA");
        for n in 1..=3 {
            let log = std::fs::read_to_string(dir.join(format!("node{n}/weir.log"))).unwrap();
            assert!(
                !log.contains("member links are not authenticated"),
                "node {n} runs without TLS"
            );
        }
        Cluster {
            child: Some(child),
            dir: dir.to_path_buf(),
            offset,
        }
    }

    pub(crate) fn nbd(&self, node: u16, volume: &str) -> String {
        format!("nbd://127.0.0.1:{}/{volume}", 10808 + node + self.offset)
    }

    pub(crate) fn admin(&self) -> String {
        format!("127.0.0.1:{}", 9401 + self.offset)
    }

    pub(crate) fn weir(&self, args: &[&str]) -> Output {
        let out = Command::new(WEIR)
            .args(args)
            .args(["--admin", &self.admin()])
            .env("WEIR_ADMIN_TOKEN_FILE", self.dir.join("admin.token"))
            .output()
            .expect("weir runs");
        println!(
            "weir {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    pub(crate) fn node_pid(&self, node: u32) -> i32 {
        let text = std::fs::read_to_string(self.dir.join(format!("node{node}/weir.pid")))
            .expect("a running node has a pid file");
        text.trim().parse().unwrap()
    }

    /// Stop the cluster with SIGTERM and wait for it.
    pub(crate) fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: kill(2) on our child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let status = wait(&mut child, Duration::from_secs(60)).expect("the cluster stops");
            assert!(status.success(), "weir cluster up ended with {status}");
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = wait(&mut child, Duration::from_secs(30));
            let _ = child.kill();
        }
    }
}

/// An nbdfuse mount; unmounted (and nbdfuse ended) on drop.
pub(crate) struct Fuse {
    child: Option<Child>,
    mnt: PathBuf,
}

impl Fuse {
    pub(crate) fn mount(mnt: &Path, pidfile: &Path, uri: &str) -> Fuse {
        let child = Command::new("nbdfuse")
            .args(["-P", pidfile.to_str().unwrap()])
            .arg(mnt.join("disk"))
            .arg(uri)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nbdfuse is needed; .ci/run installs it");
        let mut fuse = Fuse {
            child: Some(child),
            mnt: mnt.to_path_buf(),
        };
        let deadline = Instant::now() + MINUTE;
        while !pidfile.exists() {
            assert!(Instant::now() < deadline, "nbdfuse did not mount");
            let child = fuse.child.as_mut().unwrap();
            assert!(child.try_wait().unwrap().is_none(), "nbdfuse exited");
            std::thread::sleep(Duration::from_millis(50));
        }
        fuse
    }

    pub(crate) fn unmount(&mut self) {
        if let Some(mut child) = self.child.take() {
            run("fusermount3", &["-u", self.mnt.to_str().unwrap()], MINUTE);
            wait(&mut child, MINUTE).expect("nbdfuse ends after unmount");
        }
    }
}

impl Drop for Fuse {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("fusermount3")
                .arg("-u")
                .arg(&self.mnt)
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub(crate) fn wait(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Run a client program to completion within `limit`; panic with its output if it
/// is missing, fails or hangs.
pub(crate) fn run(program: &str, args: &[&str], limit: Duration) -> String {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{program} is needed ({e}); .ci/run installs it"));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = wait(&mut child, limit);
    let text = reader.join().unwrap();
    println!("$ {program} {}\n{text}", args.join(" "));
    match status {
        Some(s) if s.success() => text,
        Some(s) => panic!("{program} failed ({s}):\n{text}"),
        None => panic!("{program} did not finish within {limit:?}:\n{text}"),
    }
}

pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `len` bytes from a seeded generator (xorshift), so a failure replays.
pub(crate) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

pub(crate) fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// The patterns written through qemu-io at the start read back through `uri`.
pub(crate) fn check_patterns(uri: &str) {
    let out = run(
        "qemu-io",
        &[
            "-f",
            "raw",
            uri,
            "-c",
            "read -P 0xcd 1M 64k",
            "-c",
            "read -P 0x11 3000 1000",
        ],
        MINUTE,
    );
    assert!(!out.contains("verification failed"), "{out}");
    assert_eq!(out.matches("read ").count(), 2, "{out}");
}

/// Copy the volume at `uri` out to `path` with nbdcopy; it must hold `expected`.
pub(crate) fn copy_out(uri: &str, path: &Path, expected: &[u8]) {
    run("nbdcopy", &[uri, path.to_str().unwrap()], 5 * MINUTE);
    let got = std::fs::read(path).unwrap();
    let first = got.iter().zip(expected).position(|(a, b)| a != b);
    assert!(
        got.len() == expected.len() && first.is_none(),
        "{uri} differs from what was copied in: {} bytes, first difference at {first:?}",
        got.len()
    );
}

/// fio's job ended without error and with no verify failure.
pub(crate) fn assert_fio_clean(out: &str) {
    assert!(out.contains("err= 0"), "{out}");
    for bad in [
        "verify failed",
        "bad magic",
        "bad header",
        "fio: io_u error",
    ] {
        assert!(!out.contains(bad), "fio reported {bad:?}:\n{out}");
    }
}

pub(crate) const MINUTE: Duration = Duration::from_secs(60);

/// fio's nbd engine writing `size` at random 4 KiB offsets to `uri` at
/// `depth`, then verifying every block (a failure is fatal), in the
/// background.
pub(crate) fn fio_verify(name: &str, uri: &str, size: &str, depth: u32) -> Child {
    Command::new("fio")
        .args([
            &format!("--name={name}"),
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=4k",
            &format!("--size={size}"),
            &format!("--iodepth={depth}"),
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            // No state file left in the working directory.
            "--verify_state_save=0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio is needed; .ci/run installs it")
}

/// Wait (5 minutes at most) for a [`fio_verify`] job: its status and output.
pub(crate) fn fio_finish(fio: &mut Child) -> (std::process::ExitStatus, String) {
    let status = wait(fio, 5 * MINUTE).expect("fio finishes");
    let mut text = String::new();
    let _ = fio.stdout.take().unwrap().read_to_string(&mut text);
    let _ = fio.stderr.take().unwrap().read_to_string(&mut text);
    println!("{text}");
    (status, text)
}
