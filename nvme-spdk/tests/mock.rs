//! weir's SPDK glue against the stand-in in csrc/mock (`--features spdk-mock`):
//! the FFI declarations, the C glue, the polling threads, DMA memory, status
//! decoding and shutdown. This tests weir's side of the boundary, not SPDK.
//!
//! The stand-in's state is process-wide, so the tests take turns (`SERIAL`)
//! and each uses its own controller address.
#![cfg(feature = "spdk-mock")]

use bytes::Bytes;
use std::ffi::{c_char, c_int, CString};
use tokio::sync::{Mutex, MutexGuard};
use weir_core::buf::{BufPool, BUF_ALIGN};
use weir_core::device::{BlockDevice, DevCommand, DevCompletion, DevError};
use weir_core::ids::Lba;
use weir_nvme_spdk::{OpenError, SpdkDevice, SpdkOptions};

unsafe extern "C" {
    fn weir_spdk_mock_add_ctrlr(
        traddr: *const c_char,
        sector_size: u32,
        sectors: u64,
        max_xfer: u32,
        flags: u32,
        wz_deallocate: c_int,
        qpair_requests: u32,
    ) -> c_int;
    fn weir_spdk_mock_fail_next(traddr: *const c_char, sct: u8, sc: u8);
    fn weir_spdk_mock_fail_ctrlr(traddr: *const c_char);
    fn weir_spdk_mock_set_md(traddr: *const c_char, md_size: u32);
    fn weir_spdk_mock_remake_ns(traddr: *const c_char);
    fn weir_spdk_mock_hold(traddr: *const c_char, hold: c_int);
    fn weir_spdk_mock_count(traddr: *const c_char, what: c_int) -> u64;
    fn weir_spdk_mock_peek(traddr: *const c_char, offset: u64, out: *mut u8, len: usize) -> c_int;
    fn weir_spdk_mock_violations(last: *mut c_char, cap: usize) -> u64;
    fn weir_spdk_mock_dma_live() -> c_int;
}

const FLUSH: u32 = 2;
const WRITE_ZEROES: u32 = 8;
const ALL: u32 = FLUSH | WRITE_ZEROES;

/// The stand-in's counters (`weir_spdk_mock_count`).
#[derive(Clone, Copy)]
enum Count {
    Reads = 0,
    Writes = 1,
    FuaWrites = 2,
    Flushes = 3,
    WriteZeroes = 4,
    WriteZeroesDeallocate = 5,
    Scattered = 6,
    MostHeld = 7,
    AdminPolls = 8,
}

/// Held for a whole test: an async lock, as most tests await while they hold it.
static SERIAL: Mutex<()> = Mutex::const_new(());

async fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().await
}

struct Ctrl {
    traddr: CString,
}

impl Ctrl {
    /// A controller with one namespace of `sectors` sectors of `sector_size`.
    fn add(
        name: &str,
        sector_size: u32,
        sectors: u64,
        flags: u32,
        wz_deallocate: bool,
        requests: u32,
    ) -> Ctrl {
        Self::add_with_transfer(
            name,
            sector_size,
            sectors,
            128 << 10,
            flags,
            wz_deallocate,
            requests,
        )
    }

    fn add_with_transfer(
        name: &str,
        sector_size: u32,
        sectors: u64,
        max_xfer: u32,
        flags: u32,
        wz_deallocate: bool,
        requests: u32,
    ) -> Ctrl {
        let traddr = CString::new(name).unwrap();
        // SAFETY: a NUL-terminated string; the stand-in copies it.
        let rc = unsafe {
            weir_spdk_mock_add_ctrlr(
                traddr.as_ptr(),
                sector_size,
                sectors,
                max_xfer,
                flags,
                c_int::from(wz_deallocate),
                requests,
            )
        };
        assert_eq!(rc, 0);
        Ctrl { traddr }
    }

    fn opts(&self) -> SpdkOptions {
        SpdkOptions {
            trid: format!("trtype:PCIe traddr:{}", self.traddr.to_str().unwrap()),
            queues: 2,
            queue_depth: 16,
            pool_bytes: 4 << 20,
            ..SpdkOptions::default()
        }
    }

    fn count(&self, what: Count) -> u64 {
        // SAFETY: a NUL-terminated string.
        unsafe { weir_spdk_mock_count(self.traddr.as_ptr(), what as c_int) }
    }

    fn media(&self, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        // SAFETY: `out` holds `len` bytes.
        let rc =
            unsafe { weir_spdk_mock_peek(self.traddr.as_ptr(), offset, out.as_mut_ptr(), len) };
        assert_eq!(rc, 0);
        out
    }

    fn hold(&self, hold: bool) {
        // SAFETY: a NUL-terminated string.
        unsafe { weir_spdk_mock_hold(self.traddr.as_ptr(), c_int::from(hold)) }
    }

    /// Wait (a bounded while) until the counter reaches `n`.
    async fn wait_for(&self, what: Count, n: u64) {
        for _ in 0..5_000 {
            if self.count(what) >= n {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        panic!("counter {} never reached {n}", what as c_int);
    }

    fn fail_next(&self, sct: u8, sc: u8) {
        // SAFETY: a NUL-terminated string.
        unsafe { weir_spdk_mock_fail_next(self.traddr.as_ptr(), sct, sc) }
    }
}

/// The calling thread's CPU affinity.
fn affinity() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data, filled by the call.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set),
            0
        );
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Open a device, checking that the open left the caller's CPU affinity as
/// it was (the stand-in, like DPDK, pins the thread that sets the
/// environment up; the glue must undo that).
fn open(opts: SpdkOptions) -> SpdkDevice {
    let before = affinity();
    let dev = SpdkDevice::open(opts).unwrap();
    assert_eq!(
        affinity(),
        before,
        "opening moved the caller to other cores"
    );
    dev
}

/// No rule of SPDK's was broken so far.
fn assert_no_violations() {
    let mut last = [0 as c_char; 256];
    // SAFETY: `last` holds 256 bytes.
    let n = unsafe { weir_spdk_mock_violations(last.as_mut_ptr(), last.len()) };
    // SAFETY: the stand-in NUL-terminates within the buffer.
    let text = unsafe { std::ffi::CStr::from_ptr(last.as_ptr()) };
    assert_eq!(n, 0, "SPDK's rules broken; the last: {text:?}");
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_add((i / 512) as u8))
        .collect()
}

async fn read(
    dev: &SpdkDevice,
    pool: &BufPool,
    queue: u16,
    lba: u64,
    len: usize,
) -> Result<Vec<u8>, DevError> {
    let buf = pool.alloc(len).unwrap();
    match dev
        .submit(queue, DevCommand::Read { lba: Lba(lba), buf })
        .await?
    {
        DevCompletion::Read(buf) => Ok(buf.as_ref().to_vec()),
        DevCompletion::Done => panic!("a read completes with its buffer"),
    }
}

async fn write(
    dev: &SpdkDevice,
    queue: u16,
    lba: u64,
    data: Bytes,
    fua: bool,
) -> Result<(), DevError> {
    match dev
        .submit(
            queue,
            DevCommand::Write {
                lba: Lba(lba),
                data,
                fua,
            },
        )
        .await?
    {
        DevCompletion::Done => Ok(()),
        DevCompletion::Read(_) => panic!("a write completes with Done"),
    }
}

/// A DMA buffer holding `bytes`, frozen.
fn dma_bytes(dev: &SpdkDevice, bytes: &[u8]) -> Bytes {
    let mut buf = dev.pool().alloc(bytes.len()).unwrap();
    buf.as_mut().copy_from_slice(bytes);
    buf.freeze()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_reaches_the_media_from_dma_memory_without_a_copy_and_from_elsewhere_with_one() {
    let _turn = serial().await;
    let ctrl = Ctrl::add("mock:rw", 4096, 4096, ALL, true, 64);
    let dev = open(ctrl.opts());
    let g = dev.geometry();
    assert_eq!(
        (g.block_size, g.capacity_blocks, g.max_transfer_blocks),
        (4096, 4096, 32)
    );
    assert!(
        dev.identity()
            .starts_with("nvme weir stand-in MOCK-mock:rw ns 1 nguid "),
        "model, serial (padding dropped), namespace: {}",
        dev.identity()
    );

    // From the DMA pool: straight to the device.
    let a = pattern(1, 8192);
    write(&dev, 0, 10, dma_bytes(&dev, &a), true).await.unwrap();
    assert_eq!(dev.stats().bounce_copies, 0);
    assert_eq!(ctrl.media(10 * 4096, 8192), a, "on the media");
    assert_eq!(ctrl.count(Count::FuaWrites), 1, "FUA carried");
    // From the heap: through a bounce buffer.
    let b = pattern(9, 4096);
    write(&dev, 1, 20, Bytes::from(b.clone()), false)
        .await
        .unwrap();
    assert_eq!(dev.stats().bounce_copies, 1);
    assert_eq!(ctrl.media(20 * 4096, 4096), b);
    // Read into DMA memory, then into heap memory (bounced back).
    assert_eq!(read(&dev, &dev.pool(), 1, 10, 8192).await.unwrap(), a);
    assert_eq!(dev.stats().bounce_copies, 1);
    let heap = BufPool::new(1 << 20);
    assert_eq!(read(&dev, &heap, 0, 20, 4096).await.unwrap(), b);
    assert_eq!(dev.stats().bounce_copies, 2);
    dev.submit(0, DevCommand::Flush).await.unwrap();
    assert_eq!(ctrl.count(Count::Flushes), 1);
    assert_eq!(
        (ctrl.count(Count::Reads), ctrl.count(Count::Writes)),
        (2, 2)
    );
    drop(dev);
    assert_no_violations();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_commands_at_once_on_both_queues_match_a_model_and_complete_out_of_order() {
    let _turn = serial().await;
    let ctrl = Ctrl::add("mock:many", 4096, 1024, ALL, true, 64);
    let dev = std::sync::Arc::new(open(ctrl.opts()));
    // Each task owns its own blocks, so the model needs no ordering between tasks.
    let mut tasks = Vec::new();
    for t in 0..32u64 {
        let dev = dev.clone();
        tasks.push(tokio::spawn(async move {
            let pool = dev.pool();
            for round in 0..20u64 {
                let lba = t * 32 + (round * 7) % 30;
                let data = pattern((t * 31 + round) as u8, 2 * 4096);
                let bytes = if round % 3 == 0 {
                    Bytes::from(data.clone())
                } else {
                    dma_bytes(&dev, &data)
                };
                write(&dev, (t % 2) as u16, lba, bytes, false)
                    .await
                    .unwrap();
                let back = read(&dev, &pool, ((t + 1) % 2) as u16, lba, 2 * 4096)
                    .await
                    .unwrap();
                assert_eq!(back, data, "task {t} round {round}");
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(
        ctrl.count(Count::MostHeld) >= 4,
        "commands were in flight together: {}",
        ctrl.count(Count::MostHeld)
    );
    assert_eq!(dev.stats().nvme_errors, 0);
    drop(dev);
    assert_no_violations();
}

#[tokio::test]
async fn a_gather_in_dma_pages_goes_scattered_and_any_other_is_copied_together() {
    let _turn = serial().await;
    let ctrl = Ctrl::add("mock:gather", 4096, 256, ALL, true, 64);
    let dev = open(ctrl.opts());
    let (a, b) = (pattern(3, 4096), pattern(5, 8192));
    let cmd = DevCommand::WriteGather {
        lba: Lba(4),
        data: vec![dma_bytes(&dev, &a), dma_bytes(&dev, &b)],
        fua: true,
    };
    dev.submit(1, cmd).await.unwrap();
    assert_eq!(
        (ctrl.count(Count::Scattered), dev.stats().scattered_writes),
        (1, 1)
    );
    assert_eq!(ctrl.media(4 * 4096, 4096), a);
    assert_eq!(ctrl.media(5 * 4096, 8192), b);
    assert_eq!(ctrl.count(Count::FuaWrites), 1);
    // A segment that ends inside a page cannot be a PRP list entry: copied.
    let whole = dma_bytes(&dev, &pattern(7, 8192));
    let cmd = DevCommand::WriteGather {
        lba: Lba(40),
        data: vec![whole.slice(..512), whole.slice(512..)],
        fua: false,
    };
    dev.submit(0, cmd).await.unwrap();
    assert_eq!(dev.stats().gather_copies, 1);
    assert_eq!(ctrl.count(Count::Scattered), 1);
    assert_eq!(ctrl.media(40 * 4096, 8192), whole.to_vec());
    drop(dev);
    assert_no_violations();
}

#[tokio::test]
async fn zeroes_and_deallocate_read_back_as_zeroes_whatever_the_namespace_can_do() {
    let _turn = serial().await;
    // 512-byte sectors and 128 KiB transfers: 256-block commands.
    // Deallocate is Write Zeroes, with its Deallocate bit where DLFEAT
    // allows; without Write Zeroes, writes of zeroes. Never Dataset
    // Management: it is advisory, and a block left allocated reads old data.
    for (name, flags, wz_deallocate, zeroes_cmds, deac_cmds, fallbacks) in [
        ("mock:z-all", ALL, true, 2, 1, 0),
        ("mock:z-plain", ALL, false, 2, 0, 0),
        ("mock:z-none", FLUSH, false, 0, 0, 2),
        // No volatile write cache: a flush has nothing to do.
        ("mock:z-nocache", WRITE_ZEROES, false, 2, 0, 0),
    ] {
        let ctrl = Ctrl::add(name, 512, 4096, flags, wz_deallocate, 64);
        let dev = open(ctrl.opts());
        let ones = vec![0xffu8; 128 << 10];
        write(&dev, 0, 0, dma_bytes(&dev, &ones), false)
            .await
            .unwrap();
        write(&dev, 0, 256, dma_bytes(&dev, &ones), false)
            .await
            .unwrap();
        let cmd = DevCommand::WriteZeroes {
            lba: Lba(0),
            blocks: 256,
        };
        dev.submit(0, cmd).await.unwrap();
        let cmd = DevCommand::Deallocate {
            lba: Lba(256),
            blocks: 256,
        };
        dev.submit(1, cmd).await.unwrap();
        assert!(ctrl.media(0, 256 << 10).iter().all(|&x| x == 0), "{name}");
        let back = read(&dev, &dev.pool(), 0, 256, 128 << 10).await.unwrap();
        assert!(
            back.iter().all(|&x| x == 0),
            "{name}: deallocated reads zeroes"
        );
        assert_eq!(ctrl.count(Count::WriteZeroes), zeroes_cmds, "{name}");
        let deac = ctrl.count(Count::WriteZeroesDeallocate);
        assert_eq!(deac, deac_cmds, "{name}");
        assert_eq!(dev.stats().zero_write_fallbacks, fallbacks, "{name}");
        dev.submit(0, DevCommand::Flush).await.unwrap();
        let flushes = u64::from(flags & FLUSH != 0);
        assert_eq!(ctrl.count(Count::Flushes), flushes, "{name}");
        drop(dev);
    }
    // Write Zeroes longer than NVMe's 65,536 blocks goes in pieces.
    let ctrl = Ctrl::add_with_transfer("mock:z-long", 512, 100_000, 64 << 20, ALL, true, 64);
    let mut opts = ctrl.opts();
    opts.max_transfer_bytes = 64 << 20;
    let dev = open(opts);
    assert_eq!(dev.geometry().max_transfer_blocks, 131_072);
    write(&dev, 0, 98_000, dma_bytes(&dev, &[0xff; 512 << 10]), false)
        .await
        .unwrap();
    let cmd = DevCommand::WriteZeroes {
        lba: Lba(0),
        blocks: 100_000,
    };
    dev.submit(1, cmd).await.unwrap();
    assert_eq!(
        ctrl.count(Count::WriteZeroes),
        2,
        "65,536 blocks, then the rest"
    );
    assert!(ctrl.media(98_000 * 512, 512 << 10).iter().all(|&x| x == 0));
    drop(dev);
    assert_no_violations();
}

#[tokio::test]
async fn nvme_errors_come_back_typed_and_bad_commands_never_reach_the_device() {
    let _turn = serial().await;
    let ctrl = Ctrl::add("mock:errors", 4096, 64, ALL, true, 64);
    let dev = open(ctrl.opts());
    let pool = dev.pool();
    ctrl.fail_next(2, 0x81); // unrecovered read error
    assert_eq!(
        read(&dev, &pool, 0, 7, 4096).await,
        Err(DevError::Media(Lba(7)))
    );
    ctrl.fail_next(0, 0x08); // aborted: queue deleted
    let err = write(&dev, 1, 3, dma_bytes(&dev, &[1; 4096]), false).await;
    assert_eq!(err, Err(DevError::Gone));
    ctrl.fail_next(0, 0x07); // aborted by request (a command timeout)
    assert_eq!(read(&dev, &pool, 0, 1, 4096).await, Err(DevError::Timeout));
    assert_eq!(dev.stats().nvme_errors, 3);
    // The device carries on.
    write(&dev, 0, 3, dma_bytes(&dev, &[2; 4096]), false)
        .await
        .unwrap();
    assert_eq!(read(&dev, &pool, 1, 3, 4096).await.unwrap(), vec![2; 4096]);

    let before = ctrl.count(Count::Reads) + ctrl.count(Count::Writes);
    assert_eq!(
        read(&dev, &pool, 0, 64, 4096).await,
        Err(DevError::OutOfRange)
    );
    assert_eq!(
        read(&dev, &pool, 0, 0, 256 << 10).await,
        Err(DevError::TooLarge)
    );
    assert_eq!(read(&dev, &pool, 2, 0, 4096).await, Err(DevError::BadQueue));
    let odd = write(&dev, 0, 0, Bytes::from(vec![0u8; 1000]), false).await;
    assert_eq!(odd, Err(DevError::Misaligned));
    assert_eq!(ctrl.count(Count::Reads) + ctrl.count(Count::Writes), before);
    drop(dev);
    assert_no_violations();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_beyond_spdks_request_slots_wait_for_room_and_all_complete() {
    let _turn = serial().await;
    // Two requests per queue pair, sixteen commands on the queue.
    let ctrl = Ctrl::add("mock:slots", 4096, 256, ALL, true, 2);
    let dev = std::sync::Arc::new(open(ctrl.opts()));
    // Nothing completes until every command is on the thread: SPDK must
    // refuse all but two of them.
    ctrl.hold(true);
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let dev = dev.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(i as u8, 4096);
            write(&dev, 0, i, dma_bytes(&dev, &data), false)
                .await
                .unwrap();
            data
        }));
    }
    // The thread takes each command as it arrives; wait (a bounded while)
    // until it has tried all sixteen: two with SPDK, fourteen refused.
    for _ in 0..10_000 {
        if dev.stats().requeued == 14 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    assert_eq!(dev.stats().requeued, 14, "{:?}", dev.stats());
    assert_eq!(ctrl.count(Count::Writes), 2);
    ctrl.hold(false);
    for (i, task) in tasks.into_iter().enumerate() {
        let data = task.await.unwrap();
        assert_eq!(ctrl.media(i as u64 * 4096, 4096), data);
    }
    assert_eq!(ctrl.count(Count::MostHeld), 2);
    assert_eq!(ctrl.count(Count::Writes), 16);
    drop(dev);
    assert_no_violations();
}

#[tokio::test]
async fn a_failed_controller_fails_commands_with_gone_and_the_device_still_shuts_down() {
    let _turn = serial().await;
    let ctrl = Ctrl::add("mock:fail", 4096, 64, ALL, true, 64);
    let dev = open(ctrl.opts());
    let pool = dev.pool();
    write(&dev, 0, 1, dma_bytes(&dev, &[3; 4096]), false)
        .await
        .unwrap();
    // Four reads with the SSD when its controller fails: the queue pair's
    // poll fails, the queue closes, freeing the queue pair aborts them.
    ctrl.hold(true);
    let held: Vec<_> = (0..4u64)
        .map(|i| {
            let buf = pool.alloc(4096).unwrap();
            tokio::spawn(dev.submit_detached(0, DevCommand::Read { lba: Lba(i), buf }))
        })
        .collect();
    ctrl.wait_for(Count::Reads, 4).await;
    // SAFETY: a NUL-terminated string.
    unsafe { weir_spdk_mock_fail_ctrlr(ctrl.traddr.as_ptr()) };
    for read in held {
        assert_eq!(read.await.unwrap().err(), Some(DevError::Gone));
    }
    assert_eq!(read(&dev, &pool, 0, 1, 4096).await, Err(DevError::Gone));
    assert_eq!(read(&dev, &pool, 1, 1, 4096).await, Err(DevError::Gone));
    drop(dev);
    assert_no_violations();
}

#[tokio::test]
async fn shutdown_answers_every_command_and_returns_all_dma_memory() {
    let _turn = serial().await;
    // SAFETY: no arguments.
    let live_before = unsafe { weir_spdk_mock_dma_live() };
    let ctrl = Ctrl::add("mock:drop", 4096, 256, ALL, true, 64);
    let dev = open(ctrl.opts());
    let pool = dev.pool();
    for i in 0..8u64 {
        let heap = Bytes::from(vec![i as u8; 4096]);
        write(&dev, (i % 2) as u16, i, heap, false).await.unwrap();
    }
    // Eight reads with the SSD when the device is dropped: they complete,
    // with their data, before its queues go.
    ctrl.hold(true);
    let held: Vec<_> = (0..8u64)
        .map(|i| {
            let buf = pool.alloc(4096).unwrap();
            let read = dev.submit_detached((i % 2) as u16, DevCommand::Read { lba: Lba(i), buf });
            tokio::spawn(read)
        })
        .collect();
    ctrl.wait_for(Count::Reads, 8).await;
    let dropping = std::thread::spawn(move || drop(dev));
    // Give the drop time to close the queues (it then waits on the reads).
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    assert!(!dropping.is_finished(), "the drop waits for the reads");
    ctrl.hold(false);
    dropping.join().unwrap();
    for (i, read) in held.into_iter().enumerate() {
        match read.await.unwrap() {
            Ok(DevCompletion::Read(buf)) => assert!(buf.as_ref().iter().all(|&x| x == i as u8)),
            other => panic!("read {i}: {other:?}"),
        }
    }
    drop(pool);
    // SAFETY: no arguments.
    assert_eq!(
        unsafe { weir_spdk_mock_dma_live() },
        live_before,
        "pool, bounce and zero buffers freed"
    );
    assert_no_violations();
}

#[tokio::test]
async fn bad_options_and_missing_devices_are_refused_with_the_reason() {
    let _turn = serial().await;
    let ctrl = Ctrl::add("mock:open", 4096, 64, ALL, true, 64);
    let missing = SpdkOptions {
        trid: "trtype:PCIe traddr:0000:99:00.0".into(),
        ..ctrl.opts()
    };
    let e = SpdkDevice::open(missing).unwrap_err();
    assert!(matches!(e, OpenError::Connect { .. }), "{e}");
    assert!(e.to_string().contains("0000:99:00.0"), "{e}");
    let e = SpdkDevice::open(SpdkOptions {
        trid: "nonsense".into(),
        ..ctrl.opts()
    })
    .unwrap_err();
    assert!(
        matches!(e, OpenError::Connect { code, .. } if code == -libc::EINVAL),
        "{e}"
    );
    let e = SpdkDevice::open(SpdkOptions {
        nsid: 2,
        ..ctrl.opts()
    })
    .unwrap_err();
    assert!(matches!(e, OpenError::Namespace { nsid: 2, .. }), "{e}");
    let e = SpdkDevice::open(SpdkOptions {
        poll_cores: vec![0],
        ..ctrl.opts()
    })
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("poll_cores names 1 cores for 2 queues"),
        "{e}"
    );
    let mut env = ctrl.opts();
    env.env.mem_mb = 512;
    let e = SpdkDevice::open(env).unwrap_err();
    assert!(matches!(e, OpenError::EnvMismatch(_)), "{e}");
    // A core past the machine's: the thread cannot be pinned.
    let e = SpdkDevice::open(SpdkOptions {
        poll_cores: vec![0, 1000],
        ..ctrl.opts()
    })
    .unwrap_err();
    assert!(e.to_string().contains("pinning to core 1000"), "{e}");
    // Each refusal let go of the controller: it attaches again, pinned.
    let dev = SpdkDevice::open(SpdkOptions {
        poll_cores: vec![0, 0],
        ..ctrl.opts()
    })
    .unwrap();
    write(&dev, 1, 0, dma_bytes(&dev, &[5; 4096]), false)
        .await
        .unwrap();
    drop(dev);
    assert_no_violations();
}

#[test]
fn buffers_from_the_pool_are_page_aligned_dma_memory() {
    let _turn = SERIAL.blocking_lock();
    let ctrl = Ctrl::add("mock:pool", 4096, 64, ALL, true, 64);
    let dev = open(ctrl.opts());
    let buf = dev.pool().alloc(3 * BUF_ALIGN).unwrap();
    assert_eq!(buf.as_ref().as_ptr() as usize % BUF_ALIGN, 0);
    drop(buf);
    drop(dev);
    assert_no_violations();
}

#[tokio::test]
async fn a_format_with_metadata_is_refused_and_the_identity_follows_the_namespace() {
    let _turn = serial().await;
    let ctrl = Ctrl::add("mock:md", 512, 64, ALL, false, 64);
    // SAFETY: a NUL-terminated string.
    unsafe { weir_spdk_mock_set_md(ctrl.traddr.as_ptr(), 8) };
    let e = SpdkDevice::open(ctrl.opts()).unwrap_err();
    assert!(matches!(e, OpenError::Shape { .. }), "{e}");
    assert!(e.to_string().contains("metadata (8 bytes a sector"), "{e}");
    // SAFETY: as above.
    unsafe { weir_spdk_mock_set_md(ctrl.traddr.as_ptr(), 0) };
    let dev = open(ctrl.opts());
    let first = dev.identity().to_owned();
    assert!(
        first.starts_with("nvme weir stand-in MOCK-mock:md ns 1 nguid "),
        "{first}"
    );
    // The admin queue is polled, idle or not.
    ctrl.wait_for(Count::AdminPolls, 2).await;
    drop(dev);
    // The namespace deleted and made again: another identity, so checkpoints
    // of the old one are not trusted.
    // SAFETY: as above.
    unsafe { weir_spdk_mock_remake_ns(ctrl.traddr.as_ptr()) };
    let dev = open(ctrl.opts());
    assert_ne!(dev.identity(), first);
    drop(dev);
    assert_no_violations();
}
