//! Encryption at rest with the daemon: a volume created with `--encrypt`
//! reads and writes through qemu-io like any other, while no node's device
//! file holds the plaintext (an unencrypted volume's pattern, written the same
//! way, is found there: the scan can see it); a node not given the key refuses
//! the export with the reason, and refuses a wrong key.

mod common;

use common::*;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::Command;

/// Ports: offset 14000 puts the members at 21401-3 (replication), 24809-11
/// (NBD) and 23401-3 (admin), clear of the other tests' offsets.
const OFFSET: u16 = 14000;

/// Whether the file at `path` holds 64 KiB of `byte` at a 4 KiB boundary
/// (only its data regions are read: the device files are sparse).
fn holds_run(path: &Path, byte: u8) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    const RUN: usize = 64 << 10;
    let mut f = std::fs::File::open(path).unwrap();
    let len = f.metadata().unwrap().len() as i64;
    let mut at: i64 = 0;
    let mut buf = vec![0u8; 1 << 20];
    while at < len {
        // SAFETY: lseek(2) on a file this function owns.
        let data = unsafe { libc::lseek(f.as_raw_fd(), at, libc::SEEK_DATA) };
        if data < 0 {
            return false; // ENXIO: no data past `at`.
        }
        let hole = unsafe { libc::lseek(f.as_raw_fd(), data, libc::SEEK_HOLE) };
        let mut pos = data;
        f.seek(SeekFrom::Start(pos as u64)).unwrap();
        while pos < hole {
            let n = buf.len().min((hole - pos) as usize);
            f.read_exact(&mut buf[..n]).unwrap();
            if buf[..n]
                .chunks(RUN)
                .any(|c| c.len() == RUN && c.iter().all(|&b| b == byte))
            {
                return true;
            }
            pos += n as i64;
        }
        at = hole;
    }
    false
}

#[test]
fn an_encrypted_volume_reads_back_through_qemu_and_no_device_holds_its_plaintext() {
    let dir = scratch("encryption");
    let cluster = Cluster::start(&dir.join("data"), OFFSET);
    let key = dir.join("vol.key");
    let admin = |n: u16| format!("127.0.0.1:{}", 9400 + n + OFFSET);
    let weir = |n: u16, args: &[&str]| {
        let out = Command::new(WEIR)
            .args(args)
            .args(["--admin", &admin(n), "--token-file"])
            .arg(cluster.dir.join("admin.token"))
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("weir {args:?} on n{n}: {text}");
        (out.status.success(), text)
    };
    let key_arg = key.to_str().unwrap();
    let (ok, text) = weir(
        1,
        &[
            "volume",
            "create",
            "sealed",
            "--size",
            "64M",
            "--encrypt",
            "--key-file",
            key_arg,
        ],
    );
    assert!(
        ok && text.contains("a new volume key") && text.contains("unlocked on n1"),
        "{text}"
    );
    let (ok, _) = weir(1, &["volume", "create", "plain", "--size", "64M"]);
    assert!(ok);
    // A key serves one volume.
    let (ok, text) = weir(
        1,
        &[
            "volume",
            "create",
            "twin",
            "--size",
            "64M",
            "--encrypt",
            "--key-file",
            key_arg,
        ],
    );
    assert!(!ok && text.contains("a key of its own"), "{text}");
    let nbd = |n: u16, vol: &str| format!("nbd://127.0.0.1:{}/{vol}", 10808 + n + OFFSET);
    for (vol, byte) in [("sealed", "0xab"), ("plain", "0xcd")] {
        run(
            "qemu-io",
            &[
                "-f",
                "raw",
                &nbd(1, vol),
                "-c",
                &format!("write -P {byte} 1M 1M"),
            ],
            MINUTE,
        );
    }
    let out = run(
        "qemu-io",
        &[
            "-f",
            "raw",
            &nbd(1, "sealed"),
            "-c",
            "read -P 0xab 1M 1M",
            // Zeroes written as such read back as zeroes.
            "-c",
            "write -z 3M 64k",
            "-c",
            "read -P 0 3M 64k",
        ],
        MINUTE,
    );
    assert!(!out.contains("verification failed"), "{out}");
    // Every replica holds ciphertext only; the plain volume's pattern is there.
    for n in 1..=3 {
        let device = dir.join(format!("data/node{n}/device.img"));
        assert!(
            !holds_run(&device, 0xab),
            "n{n}'s device holds the plaintext"
        );
        assert!(
            holds_run(&device, 0xcd),
            "the scan finds a plain volume's data on n{n}"
        );
    }
    // Node 2 was not given the key: it says so and serves nothing of it.
    let refused = Command::new("qemu-io")
        .args(["-f", "raw", &nbd(2, "sealed"), "-c", "read 0 4k"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr).to_string()
        + &String::from_utf8_lossy(&refused.stdout);
    assert!(
        !refused.status.success() && err.contains("weir volume unlock"),
        "{err}"
    );
    let (_, list) = weir(2, &["volume", "list"]);
    assert!(list.contains("encrypted (locked here)"), "{list}");
    // A wrong key is refused; the right one opens it there too.
    let wrong = dir.join("wrong.key");
    std::fs::write(&wrong, format!("{}\n", "5a".repeat(64))).unwrap();
    let (ok, text) = weir(
        2,
        &[
            "volume",
            "unlock",
            "sealed",
            "--key-file",
            wrong.to_str().unwrap(),
        ],
    );
    assert!(!ok && text.contains("not the key"), "{text}");
    let (ok, text) = weir(2, &["volume", "unlock", "sealed", "--key-file", key_arg]);
    assert!(ok && text.contains("unlocked on n2"), "{text}");
    let out = run(
        "qemu-io",
        &["-f", "raw", &nbd(2, "sealed"), "-c", "read -P 0xab 1M 1M"],
        MINUTE,
    );
    assert!(!out.contains("verification failed"), "{out}");
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
