//! Rolling restarts under load: a client never sees an error while one node
//! at a time is killed (SIGKILL, no clean shutdown) and started again.
//!
//! Six rounds on a 3-node cluster from `weir cluster up`. In each, fio's nbd
//! engine writes 4 KiB blocks at random offsets at QD16 with crc32c verify
//! through a node that is not the round's victim; 2 s in, the victim is
//! killed, and 3 s later started again from its directory (`weir node
//! --config`), so it rejoins and rebuilds while the next round writes. The
//! first round's victim is the Raft leader; the rounds kill every node twice.
//! fio must finish every round with no error and every block verified, and
//! at the end the last round's blocks are verified again through each node.

mod common;

use common::*;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A node started by the test (after its kill), stopped when dropped.
struct Restarted(Option<Child>);

impl Restarted {
    /// Reap it once it was killed.
    fn reap(mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.wait();
        }
    }
}

impl Drop for Restarted {
    fn drop(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        // SAFETY: kill(2) on our own child's pid, not yet reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        if wait(&mut child, Duration::from_secs(30)).is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The Raft leader as node `asked` sees it.
fn leader(cluster: &Cluster, asked: u16) -> u32 {
    let url = format!("http://127.0.0.1:{}/status", 9400 + asked + cluster.offset);
    let deadline = Instant::now() + MINUTE;
    loop {
        if let Ok(r) = ureq::get(&url).call() {
            let text = r.into_string().unwrap();
            let id = text
                .lines()
                .find_map(|l| l.strip_prefix("raft leader: n"))
                .and_then(|id| id.trim().parse().ok());
            if let Some(id) = id {
                return id;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no Raft leader known to n{asked}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The requests node `n`'s front end failed, by its metrics (none is an
/// empty list).
fn failed_requests(cluster: &Cluster, n: u16) -> Vec<String> {
    let url = format!("http://127.0.0.1:{}/metrics", 9400 + n + cluster.offset);
    let text = ureq::get(&url).call().unwrap().into_string().unwrap();
    text.lines()
        .filter(|l| l.starts_with("weir_nbd_errors_total{"))
        .map(str::to_string)
        .collect()
}

/// Start node `n` of `cluster` again from its directory, logging to its log.
fn restart(cluster: &Cluster, n: u32) -> Restarted {
    let dir = cluster.dir.join(format!("node{n}"));
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("weir.log"))
        .unwrap();
    let child = Command::new(WEIR)
        .arg("node")
        .arg("--config")
        .arg(dir.join("weir.toml"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("weir runs");
    Restarted(Some(child))
}

/// fio's verify job of the rounds, through `uri`: `verify_only` reads back
/// what the job wrote.
fn fio_round(uri: &str, verify_only: bool) -> Child {
    let mut cmd = Command::new("fio");
    cmd.args([
        "--name=rolling",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=4k",
        "--size=128M",
        "--iodepth=16",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        "--verify_state_save=0",
    ]);
    if verify_only {
        cmd.arg("--verify_only");
    }
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio is needed; .ci/run installs it")
}

#[test]
fn rolling_restarts_under_fio_verify_see_no_error() {
    let dir = scratch("rolling");
    let cluster = Cluster::start(&dir.join("data"), 7000);
    assert!(cluster
        .weir(&["volume", "create", "vol", "--size", "1G"])
        .status
        .success());
    // The first victim is the leader; then each node in turn, twice over.
    let first = leader(&cluster, 1);
    let mut victims = vec![first];
    for i in 1..6u32 {
        victims.push((first + i - 1) % 3 + 1);
    }
    let mut restarted: Vec<Option<Restarted>> = (0..=3).map(|_| None).collect();
    let mut killed_leader = false;
    for (round, &victim) in victims.iter().enumerate() {
        let through = (victim % 3 + 1) as u16;
        killed_leader |= leader(&cluster, through) == victim;
        println!("round {round}: kill n{victim}, write through n{through}");
        let mut fio = fio_round(&cluster.nbd(through, "vol"), false);
        std::thread::sleep(Duration::from_secs(2));
        assert!(
            fio.try_wait().unwrap().is_none(),
            "round {round}: fio finished before the kill; make the job longer"
        );
        let pid = cluster.node_pid(victim);
        // SAFETY: kill(2) on a node process of this test's cluster.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        // Reap it if it is ours (a node this test restarted).
        if let Some(old) = restarted[victim as usize].take() {
            old.reap();
        }
        std::thread::sleep(Duration::from_secs(3));
        restarted[victim as usize] = Some(restart(&cluster, victim));
        let (status, text) = fio_finish(&mut fio);
        assert!(
            status.success(),
            "round {round} (n{victim} killed, writing through n{through}): fio failed:\n{text}"
        );
        assert_fio_clean(&text);
        // Read now: the node written through is the next round's victim.
        let failed = failed_requests(&cluster, through);
        assert!(
            failed.is_empty(),
            "round {round}: n{through} failed {failed:?}"
        );
    }
    assert!(killed_leader, "no round killed the Raft leader");
    // Every node serves the last round's blocks.
    for node in 1..=3u16 {
        let mut fio = fio_round(&cluster.nbd(node, "vol"), true);
        let (status, text) = fio_finish(&mut fio);
        assert!(status.success(), "verify through n{node}:\n{text}");
        assert_fio_clean(&text);
    }
    // No request failed at any node's front end in the verify runs.
    for node in 1..=3u16 {
        let failed = failed_requests(&cluster, node);
        assert!(failed.is_empty(), "n{node} failed requests: {failed:?}");
    }
    drop(restarted);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
