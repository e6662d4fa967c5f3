//! Snapshots and clones with the daemon: `qemu-img convert` from the
//! read-only export VOL@SNAP gives the data as it was when the snapshot was
//! taken while a writer keeps changing the volume; a clone of a snapshot
//! takes a fresh ext4 file system (mkfs.ext4 with files, then e2fsck -fn
//! clean) while the volume and its snapshot stay as they were; a rollback
//! brings the volume back; deleting a snapshot gives the space its
//! redirected extents held back to the pool.

mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Ports: offset 16000 puts the members at 23401-3 (replication), 26809-11
/// (NBD) and 25401-3 (admin), clear of the other tests' offsets.
const OFFSET: u16 = 16000;

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn weir_ok(cluster: &Cluster, args: &[&str]) -> String {
    let out = cluster.weir(args);
    let t = text(&out);
    assert!(out.status.success(), "weir {args:?}: {t}");
    t
}

/// The pool's bytes in use, from `weir status`.
fn pool_used(cluster: &Cluster) -> u64 {
    let status = weir_ok(cluster, &["status"]);
    let line = status.lines().find(|l| l.starts_with("pool: ")).unwrap();
    line["pool: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn qemu_io(uri: &str, commands: &[&str]) -> String {
    // A snapshot's export is read-only: opened so.
    let mut args = vec!["-f", "raw", uri];
    if uri.contains('@') {
        args.push("-r");
    }
    for c in commands {
        args.extend(["-c", c]);
    }
    let out = run("qemu-io", &args, MINUTE);
    assert!(
        !out.contains("failed") && !out.contains("error"),
        "qemu-io {commands:?}: {out}"
    );
    out
}

#[test]
fn a_snapshot_holds_its_point_while_the_volume_changes_and_a_clone_takes_a_file_system() {
    let dir = scratch("snapshots");
    let cluster = Cluster::start(&dir.join("data"), OFFSET);
    weir_ok(&cluster, &["volume", "create", "vol", "--size", "256M"]);
    let vol = cluster.nbd(1, "vol");
    // The snapshot's data: 8 MiB at 0, 1 MiB in the second extent, and the
    // last 64 KiB of the volume.
    qemu_io(
        &vol,
        &[
            "write -P 0xa1 0 8M",
            "write -P 0xa2 100M 1M",
            "write -P 0xa3 262080k 64k",
        ],
    );
    let used_before = pool_used(&cluster);
    let taken = weir_ok(&cluster, &["snapshot", "create", "vol", "s1"]);
    assert!(taken.contains("snapshot vol@s1 taken in"), "{taken}");
    let list = weir_ok(&cluster, &["snapshot", "list", "vol"]);
    assert_eq!(list, "vol@s1 268435456\n");
    assert!(weir_ok(&cluster, &["volume", "list"]).contains("snapshots=1"));

    // A writer keeps overwriting the volume through node 2 while qemu-img
    // copies the snapshot out through node 3.
    let mut writer = Command::new("qemu-io")
        .args(["-f", "raw", &cluster.nbd(2, "vol")])
        .args((0..48).flat_map(|i| {
            let at = (i * 5 + 1) % 256;
            ["-c".to_string(), format!("write -P 0xb{} {at}M 1M", i % 10)]
        }))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu-io runs");
    let out = dir.join("s1.img");
    run(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &cluster.nbd(3, "vol@s1"),
            out.to_str().unwrap(),
        ],
        MINUTE,
    );
    let status = wait(&mut writer, MINUTE).expect("the writer finishes");
    assert!(status.success(), "the writer failed");
    let copy = std::fs::read(&out).unwrap();
    assert_eq!(copy.len(), 256 * MIB);
    let expect = |range: std::ops::Range<usize>, byte: u8| {
        let bad = copy[range.clone()].iter().position(|&b| b != byte);
        assert!(
            bad.is_none(),
            "snapshot byte {} of {range:?} is not {byte:#x}",
            range.start + bad.unwrap()
        );
    };
    expect(0..8 * MIB, 0xa1);
    expect(8 * MIB..100 * MIB, 0);
    expect(100 * MIB..101 * MIB, 0xa2);
    expect(101 * MIB..256 * MIB - 64 * 1024, 0);
    expect(256 * MIB - 64 * 1024..256 * MIB, 0xa3);
    // The volume has the writer's data; the snapshot is read-only.
    qemu_io(&vol, &["read -P 0xb0 1M 1M", "read -P 0xb1 6M 1M"]);
    let refused = Command::new("qemu-io")
        .args(["-f", "raw", &cluster.nbd(1, "vol@s1"), "-c", "write 0 4k"])
        .output()
        .unwrap();
    assert!(
        !refused.status.success() && text(&refused).contains("Permission denied"),
        "{}",
        text(&refused)
    );
    qemu_io(&cluster.nbd(1, "vol@s1"), &["read -P 0xa1 0 4k"]);
    // Redirect-on-write took new extents for what the writer changed.
    assert!(pool_used(&cluster) > used_before);

    // A clone of the snapshot: mkfs.ext4 with files, e2fsck clean; the
    // volume and the snapshot are untouched.
    let cloned = weir_ok(&cluster, &["volume", "clone", "vol@s1", "fs"]);
    assert!(cloned.contains("cloned from vol@s1"), "{cloned}");
    qemu_io(
        &cluster.nbd(2, "fs"),
        &["read -P 0xa1 0 8M", "read -P 0xa2 100M 1M"],
    );
    let files = dir.join("files");
    std::fs::create_dir_all(files.join("sub")).unwrap();
    std::fs::write(files.join("hello.txt"), "weir clone\n").unwrap();
    std::fs::write(files.join("sub/data.bin"), pattern(3 * MIB, 7)).unwrap();
    let mnt = dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mut fuse = Fuse::mount(&mnt, &dir.join("nbdfuse.pid"), &cluster.nbd(2, "fs"));
    let disk = mnt.join("disk");
    let disk = disk.to_str().unwrap();
    run(
        "mkfs.ext4",
        &["-q", "-F", "-d", files.to_str().unwrap(), disk],
        5 * MINUTE,
    );
    let fsck = run("e2fsck", &["-fn", disk], 5 * MINUTE);
    assert!(fsck.contains("non-contiguous"), "{fsck}");
    let ls = run("debugfs", &["-R", "cat /hello.txt", disk], MINUTE);
    assert!(ls.contains("weir clone"), "{ls}");
    fuse.unmount();
    qemu_io(
        &cluster.nbd(3, "vol@s1"),
        &["read -P 0xa1 0 8M", "read -P 0xa3 262080k 64k"],
    );
    qemu_io(&vol, &["read -P 0xb0 1M 1M", "read -P 0xa2 100M 1M"]);

    // Rollback: the volume is the snapshot again.
    weir_ok(&cluster, &["volume", "rollback", "vol@s1"]);
    qemu_io(&vol, &["read -P 0xa1 0 8M", "read -P 0 8M 1M"]);

    // Deleting the snapshot and the clone gives their extents back.
    let before = pool_used(&cluster);
    weir_ok(&cluster, &["snapshot", "delete", "vol@s1"]);
    weir_ok(&cluster, &["volume", "delete", "fs"]);
    let after = pool_used(&cluster);
    assert!(
        after < before,
        "the pool's use went from {before} to {after}"
    );
    assert_eq!(weir_ok(&cluster, &["snapshot", "list"]), "");
    qemu_io(&vol, &["read -P 0xa1 0 8M", "read -P 0xa2 100M 1M"]);
    std::thread::sleep(Duration::from_millis(10));
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
