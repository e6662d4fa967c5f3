//! Thin provisioning with the daemon: a volume larger than the pool takes
//! pool extents only where it is written; a write that needs space in a full
//! pool fails with ENOSPC and leaves what was written; a delete gives the
//! space back (the pool's use falls) once the freed extents are zeroed, and a
//! new volume that gets them reads zeroes where the old one's data was; a
//! TRIM of a whole extent frees it too; a volume grows and shrinks online.

mod common;

use common::*;
use std::time::{Duration, Instant};

/// Ports: offset 15000 puts the members at 22401-3 (replication), 25809-11
/// (NBD) and 24401-3 (admin), clear of the other tests' offsets.
const OFFSET: u16 = 15000;
/// The pool: 4 extents of 64 MiB.
const POOL: u64 = 256 << 20;
const EXTENT: u64 = 64 << 20;

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The pool's figures from `weir status`: (allocated, free, being zeroed).
fn pool(cluster: &Cluster) -> (u64, u64, u64) {
    let status = text(&cluster.weir(&["status"]));
    let line = status
        .lines()
        .find(|l| l.starts_with("pool: "))
        .unwrap_or_else(|| panic!("no pool line in {status}"));
    let n: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect();
    assert_eq!(n.len(), 4, "{line}");
    assert_eq!(n[1], POOL, "{line}");
    (n[0], n[2], n[3])
}

/// Run qemu-io commands on `uri`; the output, and whether it succeeded.
fn qemu_io(uri: &str, commands: &[String]) -> (bool, String) {
    let mut args = vec!["-f".to_string(), "raw".into(), uri.into()];
    for c in commands {
        args.extend(["-c".to_string(), c.clone()]);
    }
    let out = std::process::Command::new("qemu-io")
        .args(&args)
        .output()
        .expect("qemu-io runs");
    let t = text(&out);
    println!("qemu-io {commands:?}: {t}");
    (
        out.status.success() && !t.contains("failed") && !t.contains("error"),
        t,
    )
}

#[test]
fn thin_volumes_take_space_on_write_and_give_it_back_zeroed() {
    let dir = scratch("thin");
    let cluster = Cluster::start_with(&dir.join("data"), OFFSET, &["--pool-size", "256M"]);
    // Four times the pool: thin volumes may over-commit it.
    assert!(cluster
        .weir(&["volume", "create", "big", "--size", "1G"])
        .status
        .success());
    let list = text(&cluster.weir(&["volume", "list"]));
    assert!(list.contains("big 1073741824 allocated=0"), "{list}");
    assert_eq!(pool(&cluster), (0, POOL, 0));

    // A read of an extent never written is zeroes and takes no space.
    let big = cluster.nbd(1, "big");
    let (ok, out) = qemu_io(&big, &["read -P 0 512M 1M".into()]);
    assert!(ok, "{out}");
    assert_eq!(pool(&cluster).0, 0);

    // One megabyte at the start of four extents: the whole pool.
    let writes: Vec<String> = (0..4)
        .map(|i| format!("write -P 0x5a {} 1M", i * EXTENT))
        .collect();
    let (ok, out) = qemu_io(&big, &writes);
    assert!(ok, "{out}");
    let list = text(&cluster.weir(&["volume", "list"]));
    assert!(
        list.contains(&format!("big 1073741824 allocated={POOL}")),
        "{list}"
    );
    assert_eq!(pool(&cluster), (POOL, 0, 0));

    // A fifth extent does not fit: ENOSPC, through node 2 as well, and what
    // was written stays.
    for node in [1, 2] {
        let (ok, out) = qemu_io(
            &cluster.nbd(node, "big"),
            &[format!("write -P 0x77 {} 4k", 4 * EXTENT)],
        );
        assert!(!ok && out.contains("No space left on device"), "{out}");
    }
    // A write into an extent it holds still goes.
    let (ok, out) = qemu_io(&big, &["write -P 0x5b 2M 4k".into()]);
    assert!(ok, "{out}");
    let reads: Vec<String> = (0..4)
        .map(|i| format!("read -P 0x5a {} 1M", i * EXTENT))
        .chain(["read -P 0x5b 2M 4k".to_string(), "read -P 0 768M 4k".into()])
        .collect();
    let (ok, out) = qemu_io(&cluster.nbd(3, "big"), &reads);
    assert!(ok, "{out}");

    // A delete frees the space once the freed extents are zeroed.
    assert!(cluster.weir(&["volume", "delete", "big"]).status.success());
    let (allocated, _, _) = pool(&cluster);
    assert_eq!(allocated, 0);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, free, zeroing) = pool(&cluster);
        if free == POOL && zeroing == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the freed extents were not zeroed"
        );
        std::thread::sleep(Duration::from_millis(500));
    }

    // A new volume gets the same extents and reads none of the old data: a
    // block written at each extent's start allocates it, the rest is zeroes.
    assert!(cluster
        .weir(&["volume", "create", "next", "--size", "256M"])
        .status
        .success());
    let next = cluster.nbd(2, "next");
    let mut cmds: Vec<String> = Vec::new();
    for i in 0..4 {
        cmds.push(format!("write -P 0x11 {} 4k", i * EXTENT));
        cmds.push(format!("read -P 0 {} {}", i * EXTENT + 4096, EXTENT - 4096));
    }
    let (ok, out) = qemu_io(&next, &cmds);
    assert!(ok, "{out}");
    assert_eq!(pool(&cluster).0, POOL);

    // A TRIM of a whole extent frees it; one of part of an extent zeroes it.
    let (ok, out) = qemu_io(
        &next,
        &[
            format!("discard {EXTENT} {EXTENT}"),
            "discard 0 4k".into(),
            format!("read -P 0 0 {}", 2 * EXTENT),
            format!("read -P 0x11 {} 4k", 2 * EXTENT),
        ],
    );
    assert!(ok, "{out}");
    let list = text(&cluster.weir(&["volume", "list"]));
    assert!(
        list.contains(&format!("next 268435456 allocated={}", 3 * EXTENT)),
        "{list}"
    );
    assert_eq!(pool(&cluster).0, 3 * EXTENT);

    // Online resize. Grown, at once: the new space reads zeroes, the old
    // data stays, and a new connection sees the size.
    let resize = |size: &str, shrink: bool| {
        let mut args = vec!["volume", "resize", "next", "--size", size];
        if shrink {
            args.push("--shrink");
        }
        let out = cluster.weir(&args);
        (out.status.success(), text(&out))
    };
    let (ok, out) = resize("512M", false);
    assert!(ok, "{out}");
    let list = text(&cluster.weir(&["volume", "list"]));
    assert!(list.contains("next 536870912 "), "{list}");
    let (ok, out) = qemu_io(
        &cluster.nbd(1, "next"),
        &[
            "length".into(),
            "read -P 0 400M 4k".into(),
            format!("read -P 0x11 {} 4k", 3 * EXTENT),
        ],
    );
    assert!(ok && out.contains("512 MiB"), "{out}");
    // Shrinking needs --shrink, whole extents, and drops the tail.
    let (ok, out) = resize("128M", false);
    assert!(!ok && out.contains("--shrink"), "{out}");
    let (ok, out) = resize("100M", true);
    assert!(!ok && out.contains("whole extents"), "{out}");
    let (ok, out) = resize("128M", true);
    assert!(ok, "{out}");
    let list = text(&cluster.weir(&["volume", "list"]));
    assert!(
        list.contains(&format!("next 134217728 allocated={EXTENT}")),
        "{list}"
    );
    assert_eq!(pool(&cluster).0, EXTENT);
    let (ok, out) = qemu_io(&cluster.nbd(2, "next"), &["length".into()]);
    assert!(ok && out.contains("128 MiB"), "{out}");
    // Grown again, the dropped tail reads zeroes, not its old data.
    let (ok, out) = resize("256M", false);
    assert!(ok, "{out}");
    let (ok, out) = qemu_io(
        &cluster.nbd(3, "next"),
        &[format!("read -P 0 {} {}", 2 * EXTENT, 2 * EXTENT)],
    );
    assert!(ok, "{out}");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
