//! weir used by real clients that no weir code controls: qemu-io, nbdcopy, fio's
//! nbd engine, nbdfuse with mkfs.ext4 and e2fsck, against a 3-node cluster started
//! with `weir cluster up`, as a user would. `.ci/run` installs the clients
//! (Debian's qemu-utils, libnbd-bin, fio, fuse3, e2fsprogs); a missing one fails
//! the test with its name.
//!
//! Each test runs its own cluster on its own ports (`--port-offset`).

mod common;

use common::*;
use std::io::{Read, Write};
use std::process::Command;
use std::time::Duration;

#[test]
fn real_clients_on_a_three_node_cluster_and_a_restart() {
    let dir = scratch("real-clients");
    let mut cluster = Cluster::start(&dir.join("data"), 1000);

    // Volumes.
    assert!(cluster
        .weir(&["volume", "create", "vol", "--size", "256M"])
        .status
        .success());
    assert!(cluster
        .weir(&["volume", "create", "copy", "--size", "256M"])
        .status
        .success());
    assert!(cluster
        .weir(&["volume", "create", "fs", "--size", "256M"])
        .status
        .success());
    let again = cluster.weir(&["volume", "create", "vol", "--size", "1G"]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    let bad = cluster.weir(&["volume", "create", "../x", "--size", "1G"]);
    assert!(!bad.status.success());
    // The admin API: a request that changes something needs the token; one
    // without it, or with a wrong one, gets 401 and no detail. Reads from
    // loopback need none.
    let admin = cluster.admin();
    let url = format!("http://{admin}/volumes/sneaky?size=1048576");
    match ureq::post(&url).call() {
        Err(ureq::Error::Status(401, r)) => assert_eq!(r.into_string().unwrap(), ""),
        other => panic!("a tokenless create: {other:?}"),
    }
    let wrong = "0".repeat(64);
    let refused = weir_node::admin_client::delete(&admin, Some(&wrong), "/volumes/vol");
    assert!(
        matches!(
            refused,
            Err(weir_node::admin_client::AdminError::Unauthorized { .. })
        ),
        "{refused:?}"
    );
    assert!(weir_node::admin_client::get(&admin, None, "/volumes").is_ok());
    let counted = weir_node::admin_client::metric(&admin, "weir_admin_refused_total");
    assert_eq!(counted.unwrap(), Some(2));
    let no_token = Command::new(WEIR)
        .args(["volume", "create", "x", "--size", "1M", "--admin", &admin])
        .env("WEIR_ADMIN_TOKEN_FILE", dir.join("nowhere"))
        .output()
        .unwrap();
    assert!(!no_token.status.success());
    assert!(String::from_utf8_lossy(&no_token.stderr).contains("admin token"));
    // Thin: nothing is allocated until written.
    let list = cluster.weir(&["volume", "list"]);
    assert_eq!(
        String::from_utf8_lossy(&list.stdout),
        "copy 268435456 allocated=0\nfs 268435456 allocated=0\nvol 268435456 allocated=0\n"
    );

    // qemu-io: patterns written through node 1, read back through nodes 1 and 2.
    let vol1 = cluster.nbd(1, "vol");
    let out = run(
        "qemu-io",
        &[
            "-f",
            "raw",
            &vol1,
            "-c",
            "write -P 0xab 0 1M",
            "-c",
            "write -P 0xcd 1M 64k",
            "-c",
            "write -P 0x11 3000 1000",
            "-c",
            "read -P 0xab 0 3000",
            "-c",
            "read -P 0x11 3000 1000",
            "-c",
            "read -P 0xcd 1M 64k",
            "-c",
            "flush",
        ],
        MINUTE,
    );
    assert!(!out.contains("verification failed"), "{out}");
    check_patterns(&cluster.nbd(2, "vol"));

    // nbdcopy: 256 MiB of seeded random data in and out.
    let input = dir.join("in.bin");
    let data = pattern(256 * MIB, 7);
    std::fs::write(&input, &data).unwrap();
    let copy = cluster.nbd(1, "copy");
    run("nbdcopy", &[input.to_str().unwrap(), &copy], 5 * MINUTE);
    copy_out(&cluster.nbd(3, "copy"), &dir.join("out.bin"), &data);

    // fio's nbd engine: a crc32c verify job over 3 replicas.
    let out = run(
        "fio",
        &[
            "--name=weirjob",
            "--ioengine=nbd",
            &format!("--uri={vol1}"),
            "--rw=randwrite",
            "--bs=4k",
            "--size=32M",
            "--iodepth=32",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            // No state file left in the working directory.
            "--verify_state_save=0",
            "--offset=64M",
        ],
        5 * MINUTE,
    );
    assert_fio_clean(&out);
    // Node 1's front end held its writes' data, so the primaries of the extents
    // node 1 does not lead sent it their replica writes without it.
    let taken = weir_node::admin_client::metric(
        &cluster.admin(),
        "weir_front_end_payloads{outcome=\"taken\"}",
    )
    .expect("node 1 answers")
    .expect("node 1 exports the count");
    assert!(
        taken > 1000,
        "{taken} replica writes took their data from the front end"
    );

    // nbdfuse: the volume as a file; mkfs.ext4 on it and e2fsck finds it clean.
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let pidfile = dir.join("nbdfuse.pid");
    // WRITE_ZEROES over more than one request's worth (64 MiB) zeroes it all.
    let fs = cluster.nbd(1, "fs");
    let out = run(
        "qemu-io",
        &[
            "-f",
            "raw",
            &fs,
            "-c",
            "write -P 0x5a 40M 1M",
            "-c",
            "write -P 0x5b 63M 1M",
            "-c",
            "write -z 0 64M",
            "-c",
            "read -P 0 40M 1M",
            "-c",
            "read -P 0 63M 1M",
            "-c",
            "write -P 0x5c 64M 4k",
            "-c",
            "read -P 0x5c 64M 4k",
        ],
        MINUTE,
    );
    assert!(!out.contains("verification failed"), "{out}");
    let mut fuse = Fuse::mount(&mnt, &pidfile, &fs);
    let disk = mnt.join("disk");
    let disk = disk.to_str().unwrap();
    run("mkfs.ext4", &["-q", "-F", disk], 5 * MINUTE);
    // e2fsck -n exits 0 only when the file system is clean (run() checks that).
    let fsck = run("e2fsck", &["-fn", disk], 5 * MINUTE);
    assert!(fsck.contains("non-contiguous"), "{fsck}");
    fuse.unmount();

    // Hostile clients: garbage, a truncated request, a 4 GiB write. The node
    // disconnects them, its memory stays put, and the others are still served.
    let nbd_addr = format!("127.0.0.1:{}", 10809 + cluster.offset);
    let pid = cluster.node_pid(1);
    let before = rss_kib(pid);
    for i in 0..200u32 {
        let mut s = std::net::TcpStream::connect(&nbd_addr).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        match i % 3 {
            0 => s.write_all(&[0xee; 4096]).unwrap(),
            1 => {
                // Fixed newstyle, GO on "vol", then a 4 GiB write header.
                s.write_all(&3u32.to_be_bytes()).unwrap();
                let mut opt = Vec::new();
                opt.extend_from_slice(&0x4948_4156_454F_5054u64.to_be_bytes());
                opt.extend_from_slice(&7u32.to_be_bytes());
                opt.extend_from_slice(&9u32.to_be_bytes());
                opt.extend_from_slice(&3u32.to_be_bytes());
                opt.extend_from_slice(b"vol");
                opt.extend_from_slice(&0u16.to_be_bytes());
                s.write_all(&opt).unwrap();
                let mut req = Vec::new();
                req.extend_from_slice(&0x2560_9513u32.to_be_bytes());
                req.extend_from_slice(&0u16.to_be_bytes());
                req.extend_from_slice(&1u16.to_be_bytes());
                req.extend_from_slice(&1u64.to_be_bytes());
                req.extend_from_slice(&0u64.to_be_bytes());
                req.extend_from_slice(&u32::MAX.to_be_bytes());
                s.write_all(&req).unwrap();
            }
            _ => s.write_all(&3u32.to_be_bytes()[..2]).unwrap(),
        }
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut rest = Vec::new();
        if i % 3 != 2 {
            // Closed by the server (EOF or reset), never left hanging.
            let _ = s.read_to_end(&mut rest);
        }
    }
    let after = rss_kib(pid);
    assert!(
        after < before + 64 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    let out = run(
        "qemu-io",
        &["-f", "raw", &vol1, "-c", "read -P 0xcd 1M 64k"],
        MINUTE,
    );
    assert!(!out.contains("verification failed"), "{out}");

    // Stop the whole cluster and start it again: volumes and data are still there,
    // and each node knows from its checkpoints which block versions it holds.
    cluster.stop();
    let cluster = Cluster::start(&dir.join("data"), 1000);
    for n in 1..=3 {
        let log = std::fs::read_to_string(dir.join(format!("data/node{n}/weir.log"))).unwrap();
        assert!(
            log.contains("block versions restored from checkpoints"),
            "node {n} restored no block versions:\n{log}"
        );
    }
    let list = cluster.weir(&["volume", "list"]);
    let sizes: Vec<String> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(|l| l.split(' ').take(2).collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(sizes, ["copy 268435456", "fs 268435456", "vol 268435456"]);
    copy_out(&cluster.nbd(2, "copy"), &dir.join("again.bin"), &data);
    check_patterns(&cluster.nbd(1, "vol"));
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn killing_a_node_during_a_fio_verify_run_loses_nothing() {
    let dir = scratch("kill-node");
    let cluster = Cluster::start(&dir.join("data"), 2000);
    assert!(cluster
        .weir(&["volume", "create", "vol", "--size", "512M"])
        .status
        .success());
    let uri = cluster.nbd(1, "vol");
    let mut fio = fio_verify("weirjob", &uri, "192M", 16);
    // Let the write phase run, then kill node 3 outright (no clean shutdown).
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        fio.try_wait().unwrap().is_none(),
        "fio finished before the kill; make the job longer"
    );
    let victim = cluster.node_pid(3);
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let (status, text) = fio_finish(&mut fio);
    assert!(
        status.success(),
        "fio failed after a node was killed:\n{text}"
    );
    assert_fio_clean(&text);
    let status = cluster.weir(&["status"]);
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(status.contains("n3 DOWN"), "{status}");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The I/O scheduler in the daemon: with `[device] merge = true` and one
/// command in flight per queue, requests wait in weir and merge (gathered
/// writes go to io_uring as one), and fio's sequential verify job over 3
/// replicas reads back every block it wrote; the nodes' metrics count merges.
#[test]
fn merged_device_commands_keep_every_block() {
    let dir = scratch("merge");
    let data = dir.join("data");
    // Stopped as soon as it is up: a SIGTERM then stops every node cleanly
    // (it once killed `weir cluster up` alone, leaving its nodes running).
    let mut cluster = Cluster::start(&data, 5000);
    let pids: Vec<i32> = (1..=3).map(|n| cluster.node_pid(n)).collect();
    cluster.stop();
    drop(cluster);
    for pid in pids {
        // SAFETY: kill(2) with signal 0 only asks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        assert!(!alive, "node process {pid} outlived its cluster");
    }
    for node in 1..=3 {
        let path = data.join(format!("node{node}/weir.toml"));
        let mut text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("[device]"), "{text}");
        text.push_str("\n[device]\nmerge = true\nsched_depth = 1\n");
        std::fs::write(&path, text).unwrap();
    }
    let cluster = Cluster::start(&data, 5000);
    assert!(cluster
        .weir(&["volume", "create", "vol", "--size", "256M"])
        .status
        .success());
    let uri = cluster.nbd(1, "vol");
    let out = run(
        "fio",
        &[
            "--name=weirjob",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=write",
            "--bs=4k",
            "--size=64M",
            "--iodepth=32",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
        ],
        5 * MINUTE,
    );
    assert_fio_clean(&out);
    let merged: u64 = (1..=3u16)
        .map(|node| {
            let url = format!("http://127.0.0.1:{}/metrics", 9400 + node + 5000);
            let text = ureq::get(&url).call().unwrap().into_string().unwrap();
            text.lines()
                .find_map(|l| l.strip_prefix("weir_device_merged "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("no weir_device_merged in {url}:\n{text}"))
        })
        .sum();
    println!("merged device commands over the nodes: {merged}");
    assert!(merged > 0, "a sequential stream at QD32 merged nothing");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Read and write IOPS of each job of fio's JSON output, by job name.
fn fio_iops(json: &str) -> std::collections::BTreeMap<String, f64> {
    // fio may print notes before the JSON.
    let start = json
        .find('{')
        .unwrap_or_else(|| panic!("no JSON from fio:\n{json}"));
    let v: serde_json::Value =
        serde_json::from_str(&json[start..]).unwrap_or_else(|e| panic!("fio's JSON: {e}\n{json}"));
    v["jobs"]
        .as_array()
        .expect("fio's jobs")
        .iter()
        .map(|job| {
            let iops = |dir: &str| job[dir]["iops"].as_f64().unwrap_or(0.0);
            let name = job["jobname"].as_str().expect("a job name").to_string();
            (name, iops("read") + iops("write"))
        })
        .collect()
}

/// fio's arguments for a job named `name` of 4 KiB random 50% reads at QD16
/// over the whole of `uri` (256 MiB: four extents, their primaries on every
/// node) for `secs` seconds.
fn fio_job(name: &str, uri: &str, secs: u32) -> Vec<String> {
    [
        format!("--name={name}"),
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        "--rw=randrw".into(),
        "--rwmixread=50".into(),
        "--bs=4k".into(),
        "--size=256M".into(),
        "--iodepth=16".into(),
        "--time_based=1".into(),
        format!("--runtime={secs}"),
    ]
    .into()
}

/// Run fio with `jobs` (each a job's arguments) at once; IOPS by job name.
fn fio_together(jobs: &[Vec<String>]) -> std::collections::BTreeMap<String, f64> {
    let mut args: Vec<String> = vec!["--output-format=json".into()];
    for job in jobs {
        args.extend(job.iter().cloned());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let iops = fio_iops(&run("fio", &args, 2 * MINUTE));
    println!("fio IOPS by job: {iops:?}");
    iops
}

/// A volume's IOPS limit holds over the cluster (its requests go to primaries
/// on all three nodes, each admitting by dmClock with the deltas the client
/// carries) while a volume beside it without a limit is not held back; a
/// limit changed with `weir volume set` takes effect.
#[test]
fn a_volumes_iops_limit_holds_and_its_neighbour_runs_free() {
    const LIMIT: f64 = 500.0;
    let dir = scratch("qos");
    let cluster = Cluster::start(&dir.join("data"), 6000);
    let create = |args: &[&str]| assert!(cluster.weir(args).status.success());
    create(&["volume", "create", "quiet", "--size", "256M"]);
    create(&[
        "volume",
        "create",
        "noisy",
        "--size",
        "256M",
        "--iops-limit",
        "500",
    ]);
    let bad = cluster.weir(&[
        "volume",
        "set",
        "noisy",
        "--iops-limit",
        "10",
        "--iops-reservation",
        "20",
    ]);
    assert!(
        !bad.status.success(),
        "a reservation above the limit is refused"
    );
    assert!(
        String::from_utf8_lossy(&bad.stdout).contains("above the limit")
            || String::from_utf8_lossy(&bad.stderr).contains("above the limit")
    );
    let list = String::from_utf8_lossy(&cluster.weir(&["volume", "list"]).stdout).to_string();
    assert!(
        list.contains("noisy 268435456 allocated=0 iops_limit=500"),
        "{list}"
    );
    // noisy's four extents taken one after another, before the clients
    // run: thin extents are placed as first written, four consecutive pool
    // extents have their primaries on every node (the chain), so the limit
    // is held by three primaries at once. (Written by both clients at once,
    // the two volumes' allocations interleave, and noisy's extents could all
    // be led by two nodes, or one.)
    let prefill: Vec<String> = (0..4)
        .flat_map(|i| ["-c".to_string(), format!("write -P 0x11 {}M 4k", i * 64)])
        .collect();
    let mut args = vec!["-f", "raw"];
    let noisy_uri = cluster.nbd(1, "noisy");
    args.push(&noisy_uri);
    args.extend(prefill.iter().map(String::as_str));
    run("qemu-io", &args, MINUTE);
    let (quiet, noisy) = (cluster.nbd(1, "quiet"), cluster.nbd(2, "noisy"));

    // Both at once.
    let both = fio_together(&[fio_job("quiet", &quiet, 8), fio_job("noisy", &noisy, 8)]);
    let (q, n) = (both["quiet"], both["noisy"]);
    assert!(
        (n - LIMIT).abs() <= LIMIT * 0.1,
        "the limited volume ran at {n:.0} IOPS, its limit is {LIMIT}"
    );
    // Its neighbour is not held: no primary's limit ever held one of its
    // requests, and it outran the limited one at the same queue depth. (Its
    // rate alone is no yardstick here: on a shared two-core machine the other
    // tests' clusters move it by more than the 500 IOPS beside it take.)
    // A node shows a volume's figures once it has led one of its extents (a
    // thin volume's extents are placed as they are first written, so a
    // node may lead none of one volume's): absent is none held.
    let gauge = |node: u16, name: &str| {
        let url = format!("http://127.0.0.1:{}/metrics", 9400 + node + 6000);
        let text = ureq::get(&url).call().unwrap().into_string().unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .map_or(0, |v| v.trim().parse::<u64>().expect("a gauge's value"))
    };
    let held = |volume: &str| -> u64 {
        (1..=3)
            .map(|node| {
                gauge(
                    node,
                    &format!("weir_volume_throttled_us{{volume=\"{volume}\"}}"),
                )
            })
            .sum()
    };
    assert_eq!(held("quiet"), 0, "a limit held the volume without one");
    assert!(held("noisy") > 0, "the limited volume was never held");
    assert!(
        q > 2.0 * n,
        "the free volume ran at {q:.0} IOPS beside the limited one's {n:.0}"
    );

    // Twice the limit, set on the running cluster.
    assert!(cluster
        .weir(&["volume", "set", "noisy", "--iops-limit", "1000"])
        .status
        .success());
    // The raise took effect: the volume runs well past its old limit, and
    // within the new one. How near 1000 it gets is the machine's: with the
    // other tests' clusters on two cores it once reached 887 (a throughput,
    // which a test does not assert; the limit holding is asserted above).
    let raised = fio_together(&[fio_job("noisy", &noisy, 5)])["noisy"];
    assert!(
        (1.5 * LIMIT..=2.0 * LIMIT * 1.1).contains(&raised),
        "the raised limit is 1000, the volume ran at {raised:.0} IOPS"
    );
    // Every node was a primary of the limited volume (its extents prefilled
    // in order) and admitted some of it: the limit held over three
    // primaries, not at one.
    for node in 1..=3u16 {
        let admitted = gauge(node, "weir_volume_admitted{volume=\"noisy\"}");
        assert!(admitted > 0, "node {node} admitted none of noisy");
    }
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

/// NBD over TLS with real clients: qemu-io (GnuTLS, tls-creds-x509) and
/// libnbd's nbdcopy (nbds://) write and read through a front end that
/// requires TLS, with the client certificates `weir cluster up` made; a plain
/// client is refused.
#[test]
fn nbd_over_tls_with_qemu_and_libnbd_while_a_plain_client_is_refused() {
    let dir = scratch("nbd-tls");
    // Offset 9000: ports 16401-3, 18401-3 and 19809-11, clear of the other tests.
    let cluster = Cluster::start_with(&dir.join("data"), 9000, &["--nbd-tls", "require"]);
    assert!(cluster
        .weir(&["volume", "create", "tvol", "--size", "64M"])
        .status
        .success());
    let certs = dir.join("data/certs/nbd-client");
    let port = 10808 + 1 + 9000;
    let limit = Duration::from_secs(120);
    let creds = format!(
        "tls-creds-x509,id=tls0,endpoint=client,dir={}",
        certs.display()
    );
    let image = format!("driver=nbd,host=127.0.0.1,port={port},export=tvol,tls-creds=tls0");
    let out = run(
        "qemu-io",
        &[
            "--object",
            &creds,
            "--image-opts",
            &image,
            "-c",
            "write -P 0xab 0 1M",
            "-c",
            "read -P 0xab 0 1M",
        ],
        limit,
    );
    assert!(!out.contains("verification failed"), "{out}");
    // libnbd, over TLS, reads what qemu wrote.
    let uri = format!(
        "nbds://127.0.0.1:{port}/tvol?tls-certificates={}",
        certs.display()
    );
    let copy = dir.join("copy.img");
    run("nbdcopy", &[&uri, copy.to_str().unwrap()], limit);
    let data = std::fs::read(&copy).unwrap();
    assert_eq!(data.len(), 64 << 20);
    assert!(
        data[..MIB].iter().all(|&b| b == 0xab),
        "qemu's write, read over libnbd's TLS"
    );
    // A plain client gets nothing: the front end requires TLS.
    let plain = Command::new("qemu-io")
        .args([
            "-f",
            "raw",
            &format!("nbd://127.0.0.1:{port}/tvol"),
            "-c",
            "read 0 4k",
        ])
        .output()
        .expect("qemu-io runs");
    println!("plain qemu-io: {}", String::from_utf8_lossy(&plain.stderr));
    assert!(!plain.status.success(), "a plain client is refused");
    let plain = Command::new("nbdinfo")
        .arg(format!("nbd://127.0.0.1:{port}/tvol"))
        .output()
        .expect("nbdinfo runs");
    assert!(!plain.status.success(), "a plain libnbd client is refused");
    // TLS without a client certificate of the cluster CA: refused too.
    let anonymous = dir.join("anonymous");
    std::fs::create_dir_all(&anonymous).unwrap();
    std::fs::copy(certs.join("ca-cert.pem"), anonymous.join("ca-cert.pem")).unwrap();
    let out = Command::new("nbdinfo")
        .arg(format!(
            "nbds://127.0.0.1:{port}/tvol?tls-certificates={}",
            anonymous.display()
        ))
        .output()
        .expect("nbdinfo runs");
    println!(
        "anonymous nbdinfo: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "no client certificate: refused");
}
