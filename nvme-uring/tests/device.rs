//! The io_uring device against a real file on the build disk: data round trips under
//! concurrency, durability across reopen, zeroing, typed errors, O_DIRECT refusal,
//! and shutdown with commands in flight. Real I/O: never built for the simulator.
#![cfg(not(madsim))]

use bytes::Bytes;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use weir_core::buf::{BufPool, BUF_ALIGN};
use weir_core::device::{BlockDevice, DevCommand, DevCompletion, DevError};
use weir_core::ids::Lba;
use weir_nvme_uring::{BackingKind, OpenError, PollMode, UringDevice, UringOptions};

const BS: usize = 4096;

/// A fresh path for `name` on the build disk (not /tmp, which may be tmpfs).
fn test_path(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("weir-nvme-uring");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

fn create_opts(capacity_bytes: u64) -> UringOptions {
    UringOptions {
        capacity_bytes: Some(capacity_bytes),
        create: true,
        ..UringOptions::default()
    }
}

/// Deterministic pseudo-random bytes for `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = vec![0; len];
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    out
}

/// `data` in an aligned pool buffer, frozen: the shape of weir's own writes.
fn aligned(pool: &BufPool, data: &[u8]) -> Bytes {
    let mut buf = pool.alloc(data.len()).unwrap();
    buf.as_mut().copy_from_slice(data);
    buf.freeze()
}

/// `data` at a deliberately unaligned address.
fn unaligned(data: &[u8]) -> Bytes {
    let mut v = vec![0u8; data.len() + BUF_ALIGN];
    let skip = if (v.as_ptr() as usize + 1).is_multiple_of(BUF_ALIGN) {
        2
    } else {
        1
    };
    v[skip..skip + data.len()].copy_from_slice(data);
    let bytes = Bytes::from(v).slice(skip..skip + data.len());
    assert_ne!(bytes.as_ptr() as usize % BUF_ALIGN, 0);
    bytes
}

async fn read(dev: &UringDevice, pool: &BufPool, queue: u16, lba: u64, len: usize) -> Vec<u8> {
    let buf = pool.alloc(len).unwrap();
    match dev
        .submit(queue, DevCommand::Read { lba: Lba(lba), buf })
        .await
    {
        Ok(DevCompletion::Read(buf)) => buf.as_ref().to_vec(),
        other => panic!("read at {lba}: {other:?}"),
    }
}

async fn write(dev: &UringDevice, queue: u16, lba: u64, data: Bytes, fua: bool) {
    let cmd = DevCommand::Write {
        lba: Lba(lba),
        data,
        fua,
    };
    let done = dev.submit(queue, cmd).await;
    assert!(
        matches!(done, Ok(DevCompletion::Done)),
        "write at {lba}: {done:?}"
    );
}

/// 1. 256 writes of 4 KiB..1 MiB in flight at once on two queues, some from unaligned
///    memory, then read back concurrently and compared byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_read_back() {
    let path = test_path("concurrent.img");
    let dev = UringDevice::open(&path, create_opts(512 << 20)).unwrap();
    assert_eq!(dev.backing_kind(), BackingKind::File);
    let geo = dev.geometry();
    assert_eq!(
        (geo.block_size, geo.queues, geo.queue_depth),
        (4096, 2, 128)
    );
    assert_eq!(
        (geo.capacity_blocks, geo.max_transfer_blocks),
        (131072, 256)
    );
    let pool = BufPool::new(1 << 30);

    // Extents of 1..=256 blocks, one free block between neighbours.
    let mut extents = Vec::new();
    let mut next_lba = 0u64;
    for i in 0..256u64 {
        let blocks = 1 + (pattern(i, 8)[0] as u64 % 256);
        extents.push((i, next_lba, blocks as usize * BS));
        next_lba += blocks + 1;
    }
    assert!(next_lba <= geo.capacity_blocks);
    let mut unaligned_writes = 0;
    let mut tasks = Vec::new();
    for &(i, lba, len) in &extents {
        let data = pattern(i + 1000, len);
        let bytes = if i % 32 == 7 {
            unaligned_writes += 1;
            unaligned(&data)
        } else {
            aligned(&pool, &data)
        };
        let cmd = DevCommand::Write {
            lba: Lba(lba),
            data: bytes,
            fua: false,
        };
        tasks.push(tokio::spawn(dev.submit_detached((i % 2) as u16, cmd)));
    }
    for task in tasks {
        assert!(matches!(task.await.unwrap(), Ok(DevCompletion::Done)));
    }
    assert_eq!(dev.stats().unaligned_write_copies, unaligned_writes);

    let mut tasks = Vec::new();
    for &(i, lba, len) in &extents {
        let cmd = DevCommand::Read {
            lba: Lba(lba),
            buf: pool.alloc(len).unwrap(),
        };
        let fut = dev.submit_detached(((i + 1) % 2) as u16, cmd);
        tasks.push((i, tokio::spawn(fut)));
    }
    for (i, task) in tasks {
        let Ok(DevCompletion::Read(buf)) = task.await.unwrap() else {
            panic!("read {i} failed");
        };
        let want = pattern(i + 1000, buf.len());
        assert!(buf.as_ref() == want.as_slice(), "extent {i} differs");
    }
    // The gaps were never written: still zero.
    for &(_, lba, len) in extents.iter().take(8) {
        let gap = lba + (len / BS) as u64;
        assert!(read(&dev, &pool, 0, gap, BS).await.iter().all(|&b| b == 0));
    }
    drop(dev);
    assert_eq!(pool.used_bytes(), 0, "every buffer went back to the pool");
}

/// 2. A FUA write and a Flush complete, and the data is there after reopening.
#[tokio::test]
async fn fua_and_flush_survive_reopen() {
    let path = test_path("durable.img");
    let pool = BufPool::new(16 << 20);
    let a = pattern(1, 8 * BS);
    let b = pattern(2, 3 * BS);
    {
        let dev = UringDevice::open(&path, create_opts(1 << 20)).unwrap();
        write(&dev, 0, 10, aligned(&pool, &a), true).await;
        write(&dev, 1, 100, aligned(&pool, &b), false).await;
        let flushed = dev.submit(1, DevCommand::Flush).await;
        assert!(matches!(flushed, Ok(DevCompletion::Done)), "{flushed:?}");
    }
    let reopened = UringOptions {
        queues: 1,
        ..UringOptions::default()
    };
    let dev = UringDevice::open(&path, reopened).unwrap();
    assert_eq!(dev.geometry().capacity_blocks, 256);
    assert!(read(&dev, &pool, 0, 10, a.len()).await == a);
    assert!(read(&dev, &pool, 0, 100, b.len()).await == b);
}

/// 3. WriteZeroes and Deallocate read back as zeroes and leave their neighbours
///    alone, through fallocate and through the zero-write fallback.
#[tokio::test]
async fn zeroes_and_deallocate_read_back_zero() {
    for use_fallocate in [true, false] {
        let path = test_path(&format!("zeroes-{use_fallocate}.img"));
        let opts = UringOptions {
            use_fallocate,
            ..create_opts(1 << 20)
        };
        let dev = UringDevice::open(&path, opts).unwrap();
        let pool = BufPool::new(16 << 20);
        let data = pattern(3, 64 * BS);
        write(&dev, 0, 0, aligned(&pool, &data), false).await;
        let zero = DevCommand::WriteZeroes {
            lba: Lba(8),
            blocks: 8,
        };
        assert!(matches!(dev.submit(0, zero).await, Ok(DevCompletion::Done)));
        let discard = DevCommand::Deallocate {
            lba: Lba(32),
            blocks: 9,
        };
        assert!(matches!(
            dev.submit(1, discard).await,
            Ok(DevCompletion::Done)
        ));
        let back = read(&dev, &pool, 1, 0, 64 * BS).await;
        for block in 0..64 {
            let range = block * BS..(block + 1) * BS;
            if (8..16).contains(&block) || (32..41).contains(&block) {
                assert!(
                    back[range].iter().all(|&b| b == 0),
                    "block {block} not zero"
                );
            } else {
                assert!(back[range.clone()] == data[range], "block {block} changed");
            }
        }
        let fallbacks = dev.stats().zero_write_fallbacks;
        if use_fallocate {
            println!("fallocate path: {fallbacks} zero-write fallbacks on this filesystem");
        } else {
            assert_eq!(fallbacks, 2);
        }
    }
}

/// 4. Bad commands fail with the right typed error before reaching the kernel, and
///    the device keeps working after them.
#[tokio::test]
async fn bad_commands_get_typed_errors() {
    let path = test_path("errors.img");
    let opts = UringOptions {
        max_transfer_bytes: 8 * BS as u32,
        ..create_opts(64 * BS as u64)
    };
    let dev = UringDevice::open(&path, opts).unwrap();
    let pool = BufPool::new(1 << 20);
    let block = || Bytes::from(pattern(4, BS));
    let wr = |lba: u64, data: Bytes| DevCommand::Write {
        lba: Lba(lba),
        data,
        fua: false,
    };
    let cases: Vec<(&str, u16, DevCommand, DevError)> = vec![
        ("past the end", 0, wr(64, block()), DevError::OutOfRange),
        (
            "straddles the end",
            0,
            wr(63, Bytes::from(vec![0; 2 * BS])),
            DevError::OutOfRange,
        ),
        (
            "lba overflow",
            0,
            wr(u64::MAX, block()),
            DevError::OutOfRange,
        ),
        (
            "zero-length write",
            0,
            wr(0, Bytes::new()),
            DevError::OutOfRange,
        ),
        (
            "zero-length zeroes",
            0,
            DevCommand::WriteZeroes {
                lba: Lba(0),
                blocks: 0,
            },
            DevError::OutOfRange,
        ),
        (
            "too large",
            0,
            wr(0, Bytes::from(vec![0; 9 * BS])),
            DevError::TooLarge,
        ),
        (
            "too large discard",
            1,
            DevCommand::Deallocate {
                lba: Lba(0),
                blocks: 9,
            },
            DevError::TooLarge,
        ),
        (
            "misaligned write",
            1,
            wr(0, Bytes::from(vec![0; BS + 1])),
            DevError::Misaligned,
        ),
        (
            "misaligned read",
            1,
            DevCommand::Read {
                lba: Lba(0),
                buf: pool.alloc(100).unwrap(),
            },
            DevError::Misaligned,
        ),
        ("no such queue", 2, wr(0, block()), DevError::BadQueue),
        (
            "no such queue, flush",
            7,
            DevCommand::Flush,
            DevError::BadQueue,
        ),
    ];
    for (what, queue, cmd, want) in cases {
        let got = dev.submit(queue, cmd).await;
        assert!(
            matches!(got, Err(e) if e == want),
            "{what}: {got:?}, want {want:?}"
        );
    }
    write(&dev, 0, 63, aligned(&pool, &pattern(5, BS)), false).await;
    assert!(read(&dev, &pool, 1, 63, BS).await == pattern(5, BS));
}

/// 4b. Opening fails with a typed error for each bad start.
#[test]
fn bad_opens_get_typed_errors() {
    let missing = test_path("missing.img");
    let err = UringDevice::open(&missing, UringOptions::default()).unwrap_err();
    assert!(matches!(err, OpenError::NotFound { .. }), "{err}");

    let odd = test_path("odd.img");
    std::fs::write(&odd, vec![1u8; 5000]).unwrap();
    let err = UringDevice::open(&odd, UringOptions::default()).unwrap_err();
    assert!(
        matches!(
            err,
            OpenError::NotBlockMultiple {
                size_bytes: 5000,
                block_size: 4096,
                ..
            }
        ),
        "{err}"
    );
    let err = UringDevice::open(&odd, create_opts(5 * 1024)).unwrap_err();
    assert!(matches!(err, OpenError::NotBlockMultiple { .. }), "{err}");

    let empty = test_path("empty.img");
    std::fs::write(&empty, b"").unwrap();
    let err = UringDevice::open(&empty, UringOptions::default()).unwrap_err();
    assert!(matches!(err, OpenError::Empty { .. }), "{err}");

    let dir = missing.parent().unwrap();
    let err = UringDevice::open(dir, UringOptions::default()).unwrap_err();
    assert!(
        matches!(err, OpenError::NotFileOrBlockDevice { .. }),
        "{err}"
    );

    let no_capacity = UringOptions {
        create: true,
        ..UringOptions::default()
    };
    let err = UringDevice::open(&missing, no_capacity).unwrap_err();
    assert!(matches!(err, OpenError::BadOptions(_)), "{err}");
    assert!(!missing.exists(), "a refused open creates nothing");
}

fn assert_direct_io_unsupported(err: OpenError) {
    assert!(
        matches!(err, OpenError::DirectIoUnsupported { .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("O_DIRECT") && msg.contains("ext4"), "{msg}");
}

/// 5. A filesystem without O_DIRECT gives the clear error. tmpfs refused O_DIRECT
///    before Linux 6.6 and accepts it since; procfs always refuses it.
#[test]
fn filesystems_without_o_direct_are_refused() {
    // procfs: /proc/self/comm is a regular file this process may open for writing;
    // opening it writes nothing.
    let comm = Path::new("/proc/self/comm");
    if comm.exists() {
        let opts = UringOptions {
            block_size: 512,
            max_transfer_bytes: 4096,
            ..UringOptions::default()
        };
        assert_direct_io_unsupported(UringDevice::open(comm, opts).unwrap_err());
    } else {
        println!("note: no procfs mounted; procfs case skipped");
    }

    let shm = Path::new("/dev/shm");
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let shm_is_tmpfs = mounts.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.get(1) == Some(&"/dev/shm") && fields.get(2) == Some(&"tmpfs")
    });
    if !shm_is_tmpfs {
        println!("note: /dev/shm is not tmpfs here; tmpfs case skipped");
        return;
    }
    let path = shm.join(format!("weir-nvme-uring-{}.img", std::process::id()));
    let kernel_says = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_DIRECT)
        .open(&path);
    let result = UringDevice::open(&path, create_opts(1 << 20));
    match kernel_says {
        Err(e) => {
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
            assert_direct_io_unsupported(result.unwrap_err());
        }
        Ok(_) => {
            println!("note: this kernel's tmpfs supports O_DIRECT; the device must open");
            let dev = result.unwrap();
            assert_eq!(dev.geometry().capacity_blocks, 256);
        }
    }
    let _ = std::fs::remove_file(&path);
}

/// 6. Dropping the device with hundreds of commands queued or in the rings, some of
///    them abandoned by their callers: no crash, every command either completes or
///    fails with `Gone`, and every buffer goes back to the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_with_commands_in_flight() {
    // At once, and after the first write is back (the rings busy mid-stream).
    drop_round(false).await;
    drop_round(true).await;
}

async fn drop_round(settle: bool) {
    let path = test_path(&format!("shutdown-{settle}.img"));
    let opts = UringOptions {
        queue_depth: 16,
        ..create_opts(64 << 20)
    };
    let dev = UringDevice::open(&path, opts).unwrap();
    let pool = BufPool::new(256 << 20);
    // Commands made first, so that they all reach the device at once.
    let mut commands = Vec::new();
    for i in 0..256u64 {
        let lba = i * 64;
        let len = 64 * BS;
        let write = DevCommand::Write {
            lba: Lba(lba),
            data: aligned(&pool, &pattern(i, len)),
            fua: i % 8 == 0,
        };
        let read = DevCommand::Read {
            lba: Lba(lba),
            buf: pool.alloc(len).unwrap(),
        };
        commands.push((i, write, read));
    }
    let mut tasks = Vec::new();
    let mut abandoned = Vec::new();
    for (i, write, read) in commands {
        tasks.push(tokio::spawn(dev.submit_detached((i % 2) as u16, write)));
        let handle = tokio::spawn(dev.submit_detached((i % 2) as u16, read));
        if i % 2 == 0 {
            abandoned.push(handle);
        } else {
            tasks.push(handle);
        }
    }
    // Not yet polled when the device goes: must fail with Gone, not hang.
    let late = dev.submit_detached(0, DevCommand::Flush);
    let mut tasks = tasks.into_iter();
    let mut first = None;
    if settle {
        first = Some(tasks.next().unwrap().await.unwrap());
        assert!(matches!(first, Some(Ok(DevCompletion::Done))), "{first:?}");
    }
    for handle in &abandoned {
        handle.abort();
    }
    tokio::task::spawn_blocking(move || drop(dev))
        .await
        .unwrap();

    let (mut completed, mut gone) = (usize::from(first.is_some()), 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => completed += 1,
            Err(DevError::Gone) => gone += 1,
            Err(e) => panic!("unexpected error at shutdown: {e}"),
        }
    }
    for handle in abandoned {
        let _ = handle.await;
    }
    assert_eq!(late.await.unwrap_err(), DevError::Gone);
    println!("drop (settle {settle}): {completed} completed, {gone} gone");
    assert_eq!(completed + gone, 384);
    assert_eq!(pool.used_bytes(), 0, "every buffer went back to the pool");
}

/// The same round trips on a real block device. Its contents are destroyed.
/// Run with `WEIR_URING_TEST_BLKDEV=/dev/loopN cargo test -- --ignored`.
#[tokio::test]
#[ignore = "requires a scratch block device named in WEIR_URING_TEST_BLKDEV (data destroyed)"]
async fn block_device_round_trip() {
    let path = PathBuf::from(
        std::env::var_os("WEIR_URING_TEST_BLKDEV").expect("set WEIR_URING_TEST_BLKDEV"),
    );
    let dev = UringDevice::open(&path, UringOptions::default()).unwrap();
    assert_eq!(dev.backing_kind(), BackingKind::BlockDevice);
    let geo = dev.geometry();
    assert!(geo.capacity_blocks >= 64, "{geo:?}");
    let pool = BufPool::new(16 << 20);
    let last = geo.capacity_blocks - 16;
    let data = pattern(6, 16 * BS);
    write(&dev, 0, 0, aligned(&pool, &data), true).await;
    write(&dev, 1, last, unaligned(&data), false).await;
    assert!(matches!(
        dev.submit(0, DevCommand::Flush).await,
        Ok(DevCompletion::Done)
    ));
    assert!(read(&dev, &pool, 1, 0, data.len()).await == data);
    assert!(read(&dev, &pool, 0, last, data.len()).await == data);
    let zero = DevCommand::WriteZeroes {
        lba: Lba(0),
        blocks: 4,
    };
    assert!(matches!(dev.submit(0, zero).await, Ok(DevCompletion::Done)));
    let discard = DevCommand::Deallocate {
        lba: Lba(last + 4),
        blocks: 4,
    };
    assert!(matches!(
        dev.submit(1, discard).await,
        Ok(DevCompletion::Done)
    ));
    let head = read(&dev, &pool, 0, 0, 8 * BS).await;
    assert!(head[..4 * BS].iter().all(|&b| b == 0));
    assert!(head[4 * BS..] == data[4 * BS..8 * BS]);
    let tail = read(&dev, &pool, 1, last, 8 * BS).await;
    assert!(tail[..4 * BS] == data[..4 * BS]);
    assert!(tail[4 * BS..].iter().all(|&b| b == 0));
    let past_end = DevCommand::Read {
        lba: Lba(geo.capacity_blocks),
        buf: pool.alloc(BS).unwrap(),
    };
    assert_eq!(
        dev.submit(0, past_end).await.unwrap_err(),
        DevError::OutOfRange
    );
    println!("block device: {geo:?}, {:?}", dev.stats());
}

/// 7. A gathered write (the scheduler's merged writes) lands its segments in
///    order, unaligned ones too, and is counted as the one copy it costs; one
///    too long for the device is refused.
#[tokio::test]
async fn gathered_writes_land_in_order() {
    let path = test_path("gather.img");
    let dev = UringDevice::open(&path, create_opts(16 << 20)).unwrap();
    let pool = BufPool::new(16 << 20);
    let parts = [pattern(1, BS), pattern(2, 3 * BS), pattern(3, BS)];
    let data = vec![
        aligned(&pool, &parts[0]),
        unaligned(&parts[1]),
        aligned(&pool, &parts[2]),
    ];
    let cmd = DevCommand::WriteGather {
        lba: Lba(7),
        data,
        fua: true,
    };
    assert!(matches!(dev.submit(0, cmd).await, Ok(DevCompletion::Done)));
    assert_eq!(read(&dev, &pool, 1, 7, 5 * BS).await, parts.concat());
    assert_eq!(dev.stats().gather_copies, 1);
    let max = dev.geometry().max_transfer_blocks as usize;
    let too_long = DevCommand::WriteGather {
        lba: Lba(0),
        data: vec![
            aligned(&pool, &pattern(4, max * BS)),
            aligned(&pool, &pattern(5, BS)),
        ],
        fua: false,
    };
    assert_eq!(
        dev.submit(0, too_long).await.err(),
        Some(DevError::TooLarge)
    );
}

/// Writes and reads on 2 queues with 32 commands in flight, then read back:
/// the data path of one poll mode.
async fn round_trip(dev: &UringDevice, pool: &BufPool) {
    let writes = (0..32u64).map(|i| {
        let data = aligned(pool, &pattern(i, 16 * BS));
        write(dev, (i % 2) as u16, i * 16, data, false)
    });
    futures_join(writes).await;
    dev.submit(0, DevCommand::Flush).await.unwrap();
    for i in 0..32u64 {
        assert_eq!(
            read(dev, pool, (i % 2) as u16, i * 16, 16 * BS).await,
            pattern(i, 16 * BS),
            "extent {i}"
        );
    }
}

async fn futures_join<F: std::future::Future<Output = ()>>(fs: impl Iterator<Item = F>) {
    let handles: Vec<_> = fs.collect();
    for f in handles {
        f.await;
    }
}

/// 10. Each poll mode: SQPOLL runs on this kernel; IOPOLL runs where the
///     device has polled queues and is refused, naming why, where not (a
///     file on a file system, a virtio disk without poll queues).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_modes_run_where_they_can_and_are_refused_clearly_elsewhere() {
    let pool = BufPool::new(64 << 20);
    for mode in [PollMode::Interrupt, PollMode::Sqpoll, PollMode::Iopoll] {
        let path = test_path(&format!("mode-{}.img", mode.name()));
        let opts = UringOptions {
            mode,
            ..create_opts(64 << 20)
        };
        match UringDevice::open_with_pool(&path, opts, Some(pool.clone())) {
            Ok(dev) => {
                println!("{mode:?} opened");
                round_trip(&dev, &pool).await;
                assert!(
                    dev.stats().fixed_buffer_ops > 0,
                    "{mode:?}: {:?}",
                    dev.stats()
                );
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    matches!(e, OpenError::ModeUnsupported { .. }),
                    "{mode:?}: {msg}"
                );
                assert_eq!(
                    mode,
                    PollMode::Iopoll,
                    "only iopoll may be refused here: {msg}"
                );
                assert!(
                    msg.contains("mode = \"iopoll\"") && msg.contains("polled queues"),
                    "{msg}"
                );
                println!("refused as expected: {msg}");
            }
        }
        let _ = std::fs::remove_file(&path);
    }
}

/// 11. Without the pool registered, the same data path goes by plain reads
///     and writes.
#[tokio::test]
async fn without_a_pool_no_buffer_is_registered() {
    let pool = BufPool::new(64 << 20);
    let path = test_path("no-pool.img");
    let dev = UringDevice::open(&path, create_opts(64 << 20)).unwrap();
    round_trip(&dev, &pool).await;
    assert_eq!(dev.stats().fixed_buffer_ops, 0);
}
