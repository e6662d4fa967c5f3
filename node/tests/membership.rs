//! Membership with the daemon: a node started to join is added to a running
//! `weir cluster up`, and a first member (the first leader) is removed, its
//! replicas moved and its vote handed over, while fio writes and verifies a
//! volume through another node; the data written before reads back through
//! the new node.

mod common;

use common::*;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Ports: offset 13000 puts the members at 20401-3 (replication), 23809-11
/// (NBD) and 22401-3 (admin), clear of the other tests' offsets; node 4 takes
/// the next of each.
const OFFSET: u16 = 13000;

/// A node process, killed on drop.
struct NodeProcess(Child);

impl Drop for NodeProcess {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our child's pid.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        if wait(&mut self.0, Duration::from_secs(30)).is_none() {
            let _ = self.0.kill();
        }
    }
}

/// `weir ARGS` against node `n`'s admin endpoint, within `limit`.
fn weir_at(cluster: &Cluster, n: u16, args: &[&str], limit: Duration) -> String {
    let admin = format!("127.0.0.1:{}", 9400 + n + OFFSET);
    let token = cluster.dir.join("admin.token");
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--admin", &admin, "--token-file", token.to_str().unwrap()]);
    run(WEIR, &all, limit)
}

#[test]
fn a_node_is_added_and_the_first_leader_removed_while_fio_verifies() {
    let dir = scratch("membership");
    let data = dir.join("data");
    let cluster = Cluster::start(&data, OFFSET);
    weir_at(
        &cluster,
        1,
        &["volume", "create", "vol", "--size", "256M"],
        MINUTE,
    );
    let uri2 = format!("nbd://127.0.0.1:{}/vol", 10810 + OFFSET);
    run(
        "qemu-io",
        &["-f", "raw", &uri2, "-c", "write -P 0xab 64M 1M"],
        MINUTE,
    );

    // Node 4: a certificate of the cluster's CA, and a config naming the
    // first members and its own address.
    run(
        WEIR,
        &[
            "cluster",
            "init-certs",
            data.join("certs").to_str().unwrap(),
            "--nodes",
            "4",
        ],
        MINUTE,
    );
    let node1 = std::fs::read_to_string(data.join("node1/weir.toml")).unwrap();
    let members: String = node1
        .lines()
        .skip_while(|l| !l.starts_with("members"))
        .take_while(|l| !l.starts_with(']'))
        .chain(["]"])
        .collect::<Vec<_>>()
        .join("\n");
    let pool = node1
        .lines()
        .find(|l| l.starts_with("pool_size"))
        .unwrap()
        .to_string();
    let addr4 = format!("127.0.0.1:{}", 7404 + OFFSET);
    let config = format!(
        "[node]\nid = 4\naddr = \"{addr4}\"\n\n[cluster]\nreplicas = 3\n{pool}\n{members}\n\n\
         [nbd]\nlisten = \"127.0.0.1:{nbd}\"\n\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n\n\
         [tls]\nca = \"../certs/ca.pem\"\ncert = \"../certs/node-4.pem\"\n\
         key = \"../certs/node-4.key\"\n",
        nbd = 10812 + OFFSET,
        admin = 9404 + OFFSET,
    );
    std::fs::create_dir_all(data.join("node4")).unwrap();
    let config_path = data.join("node4/weir.toml");
    std::fs::write(&config_path, config).unwrap();
    let log = std::fs::File::create(data.join("node4/weir.log")).unwrap();
    let _node4 = NodeProcess(
        Command::new(WEIR)
            .args(["node", "--config", config_path.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("weir runs"),
    );

    let out = weir_at(&cluster, 2, &["node", "add", "4", &addr4], MINUTE);
    assert!(out.contains("n4 added"), "{out}");
    let deadline = Instant::now() + MINUTE;
    loop {
        let list = weir_at(&cluster, 2, &["node", "list"], MINUTE);
        if list.contains("n4 up learner") {
            break;
        }
        assert!(Instant::now() < deadline, "n4 never came up:\n{list}");
        std::thread::sleep(Duration::from_millis(500));
    }

    // fio writes and verifies through node 2 while node 1 leaves.
    let mut fio = fio_verify("membership", &uri2, "32M", 8);
    let out = weir_at(&cluster, 2, &["node", "remove", "1"], 5 * MINUTE);
    assert!(out.contains("n1 is leaving"), "{out}");
    assert!(out.contains("n1: replicas="), "progress shown: {out}");
    assert!(out.contains("n1 left the cluster"), "{out}");
    let (status, text) = fio_finish(&mut fio);
    assert!(status.success(), "fio failed during the removal:\n{text}");
    assert_fio_clean(&text);

    let list = weir_at(&cluster, 2, &["node", "list"], MINUTE);
    assert!(!list.contains("n1 "), "{list}");
    for n in 2..=4 {
        assert!(
            list.contains(&format!("n{n} up voter")),
            "n{n} votes:\n{list}"
        );
    }
    assert!(list.contains(&format!("addr={addr4}")), "{list}");
    // What was written before the changes reads back through the new node.
    let uri4 = format!("nbd://127.0.0.1:{}/vol", 10812 + OFFSET);
    let out = run(
        "qemu-io",
        &["-f", "raw", &uri4, "-c", "read -P 0xab 64M 1M"],
        MINUTE,
    );
    assert!(!out.contains("verification failed"), "{out}");
    // Removing again is refused with the reason, and so is a removal that
    // would leave too few nodes for three copies.
    for (id, why) in [("1", "is not a member"), ("2", "replicas need")] {
        let admin = format!("127.0.0.1:{}", 9402 + OFFSET);
        let out = Command::new(WEIR)
            .args(["node", "remove", id, "--admin", &admin, "--token-file"])
            .arg(cluster.dir.join("admin.token"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(why), "{id}: {err}");
    }
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
