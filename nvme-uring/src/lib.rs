//! weir's real-IO block device: io_uring and O_DIRECT on a regular file or a block
//! device (Linux 5.6 or newer). The `weir` daemon uses it on any Linux box; the
//! simulator never builds it.
//!
//! # Design
//!
//! - **One ring per queue, one thread per ring.** `UringOptions::queues` rings, each
//!   with room for `queue_depth` commands (plus one wake-up read), each driven by its
//!   own OS thread. This is an adapter: threads are allowed here, not in `weir-core`.
//!   Every queue shares the one O_DIRECT file descriptor.
//! - **Hand-off and wake-up.** [`UringDevice::submit`](weir_core::BlockDevice::submit)
//!   checks the command (`Geometry::check_range`, block multiple, queue index), waits
//!   for one of the queue's `queue_depth` slots, sends the command down a channel and
//!   writes the queue's eventfd. The thread always keeps a read of that eventfd in its
//!   ring, so it sleeps in exactly one place, `io_uring_enter` waiting for one
//!   completion, and a new command ends that wait like a completion does. A flag
//!   skips the eventfd write while a wake-up is already pending, so a burst of
//!   submissions costs one write syscall, and the thread then takes every command
//!   waiting in the channel and submits them with one `io_uring_enter`. The cost is
//!   one extra wake-up syscall (and a thread wake-up) per burst, in exchange for never
//!   spinning and never stalling a new command behind slow ones in flight (the
//!   simpler design, blocking on the channel only when nothing is in flight, would make
//!   a command that arrives while others are in flight wait for their completion).
//! - **Memory stays put while the kernel uses it.** A command owns its `Buf` (read) or
//!   `Bytes` (write) from submission until its last completion is reaped; the thread
//!   keeps it in a fixed in-flight table keyed by `user_data`. A caller that drops its
//!   future only drops the reply channel. If a ring thread ever stops with commands
//!   still in the kernel (a broken ring, a panic), their memory is leaked rather than
//!   freed under the kernel.
//! - **Alignment.** O_DIRECT needs the memory of a transfer aligned. `Buf`s from a
//!   `BufPool` are 4 KiB-aligned, so reads and weir's own writes go straight to the
//!   kernel. A `Write` whose `Bytes` does not start 4 KiB-aligned (a slice of a larger
//!   frame, say) is copied into an aligned buffer first; this should be rare and is
//!   counted in [`UringStats::unaligned_write_copies`]. 4 KiB rather than the block
//!   size: it satisfies every device's logical block size whatever `block_size` is.
//! - **Durability.** A FUA write carries `RWF_DSYNC`, so it completes only once on
//!   stable media. Flush is `IORING_OP_FSYNC` with `DATASYNC`. As on NVMe, commands in
//!   flight together complete in any order, and a Flush covers the writes that have
//!   completed before it was submitted.
//! - **Zeroes.** WriteZeroes is `fallocate(ZERO_RANGE | KEEP_SIZE)`, Deallocate is
//!   `fallocate(PUNCH_HOLE | KEEP_SIZE)` (both valid on regular files and block
//!   devices); both read back as zeroes. Where a mode answers EOPNOTSUPP the queue
//!   writes zeroes instead, from then on, counted in
//!   [`UringStats::zero_write_fallbacks`].
//! - **Short transfers** are resubmitted for the remainder; one that makes no progress
//!   fails. A buffer is never returned as filled unless every byte was read.
//! - **Errors.** Range, length and queue checks fail before anything is submitted
//!   (`OutOfRange`, `TooLarge`, `Misaligned`, `BadQueue`). A failed completion is a
//!   media error at the first block not transferred (EIO, ENOSPC, ...), `Timeout` for
//!   ETIMEDOUT, or `Gone` for a vanished device. EINTR/EAGAIN are retried a bounded
//!   number of times. There are no timeouts in this adapter: a hung device leaves
//!   commands pending, and the node's stall detection handles that.
//! - **Shutdown.** Dropping the device closes every queue (new and waiting commands
//!   get `Gone`), waits for the commands in the rings to complete, then joins the
//!   threads. Drop therefore blocks for as long as the outstanding I/O takes.
//!
//! - **Polling** ([`PollMode`]): `interrupt` (the above), `sqpoll` (a kernel
//!   thread per ring polls the submission queue: no system call to submit) or
//!   `iopoll` (reads and writes on a second ring that polls the device for
//!   completions: no interrupt; only a block device with polled queues can,
//!   and any other is refused at open, as its sysfs `queue/io_poll` says).
//! - **Fixed files and buffers.** The file is registered with every ring and
//!   named by index; with [`UringDevice::open_with_pool`] the node's buffer
//!   pool's regions are registered as the ring's buffers as they appear, so a
//!   read into or a write from a pool buffer skips the kernel's per-command
//!   page pinning (Linux 5.19 or later; plain reads and writes otherwise).
//!
//! The simulator build (`--cfg madsim`) compiles this crate empty: it does real I/O
//! from OS threads, which has no place in a deterministic simulation.
#![cfg(not(madsim))]

mod error;
mod fixed;
mod op;
mod open;
mod queue;
mod ring;

pub use error::OpenError;
pub use open::BackingKind;

use bytes::Bytes;
use op::OpKind;
use queue::{Counters, QueueShared};
use ring::Worker;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use weir_core::buf::{BufPool, BUF_ALIGN};
use weir_core::device::{BlockDevice, DevCommand, DevCompletion, DevError, Geometry};
use weir_core::ids::Lba;

/// How a queue learns that its commands completed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PollMode {
    /// The device interrupts; the queue's thread sleeps in `io_uring_enter`
    /// until a completion (or a new command) wakes it. Runs everywhere.
    #[default]
    Interrupt,
    /// A kernel thread per queue polls the submission queue
    /// (`IORING_SETUP_SQPOLL`), so submitting costs no system call; it sleeps
    /// after [`SQPOLL_IDLE_MS`] without work. Completions still interrupt.
    Sqpoll,
    /// Reads and writes complete by polling the device's completion queue
    /// (`IORING_SETUP_IOPOLL`): no interrupt. Needs a block device whose
    /// driver has polled queues (NVMe with the `nvme` module's `poll_queues`
    /// above 0); refused at open elsewhere. Flushes, zeroing and the wake-up
    /// go through a second, ordinary ring of the same queue.
    Iopoll,
}

impl PollMode {
    /// Its name in config files.
    pub fn name(self) -> &'static str {
        match self {
            PollMode::Interrupt => "interrupt",
            PollMode::Sqpoll => "sqpoll",
            PollMode::Iopoll => "iopoll",
        }
    }
}

/// How long an idle SQPOLL thread polls before it sleeps (then the next
/// submission wakes it with one system call).
pub const SQPOLL_IDLE_MS: u32 = 100;

/// How to open a [`UringDevice`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UringOptions {
    /// How completions are found. Default [`PollMode::Interrupt`].
    pub mode: PollMode,
    /// Namespace size. A regular file shorter than this is extended to it (sparse);
    /// nothing is ever truncated, and only the first `capacity_bytes` are used. A
    /// block device must be at least this large. `None`: the whole file or device.
    pub capacity_bytes: Option<u64>,
    /// Number of I/O queues (rings and threads). Default 2.
    pub queues: u16,
    /// Commands per queue at once, in 1..=4096. Default 128.
    pub queue_depth: u16,
    /// Logical block size in bytes, a power of two >= 512. Default 4096.
    pub block_size: u32,
    /// Largest transfer of one command, a multiple of `block_size`, at most 64 MiB.
    /// Default 1 MiB.
    pub max_transfer_bytes: u32,
    /// Create the file if it does not exist (needs `capacity_bytes`). Default false.
    pub create: bool,
    /// WriteZeroes and Deallocate use fallocate (zero range, punch hole). `false`
    /// writes zeroes instead, as is done anyway where fallocate is unsupported.
    /// Default true.
    pub use_fallocate: bool,
}

impl Default for UringOptions {
    fn default() -> Self {
        UringOptions {
            capacity_bytes: None,
            queues: 2,
            queue_depth: 128,
            block_size: 4096,
            max_transfer_bytes: 1 << 20,
            create: false,
            use_fallocate: true,
            mode: PollMode::Interrupt,
        }
    }
}

/// Counters of the slow paths, for tests and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UringStats {
    /// Writes whose data was not 4 KiB-aligned in memory and was copied first.
    pub unaligned_write_copies: u64,
    /// Merged (gathered) writes copied into one aligned buffer.
    pub gather_copies: u64,
    /// Reads or writes the kernel completed only in part, resubmitted for the rest.
    pub short_transfer_resubmits: u64,
    /// WriteZeroes or Deallocate commands done by writing zeroes.
    pub zero_write_fallbacks: u64,
    /// Reads and writes that went through a registered buffer of the pool.
    pub fixed_buffer_ops: u64,
}

/// A [`BlockDevice`] over io_uring with O_DIRECT. See the crate docs for the design.
#[derive(Debug)]
pub struct UringDevice {
    geometry: Geometry,
    kind: BackingKind,
    queues: Vec<Arc<QueueShared>>,
    threads: Vec<JoinHandle<()>>,
    counters: Arc<Counters>,
}

const ZERO_RANGE_MODE: i32 = libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE;
const PUNCH_HOLE_MODE: i32 = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;

impl UringDevice {
    /// Open `path` (a regular file or a block device) with O_DIRECT, set up one ring
    /// and one thread per queue.
    pub fn open(path: &Path, opts: UringOptions) -> Result<Self, OpenError> {
        Self::open_with_pool(path, opts, None)
    }

    /// [`UringDevice::open`], with `pool`'s regions registered with every
    /// ring as its buffers (where the kernel allows): reads into and writes
    /// from the pool's buffers then skip the per-command pinning of pages.
    pub fn open_with_pool(
        path: &Path,
        opts: UringOptions,
        pool: Option<BufPool>,
    ) -> Result<Self, OpenError> {
        open::validate(&opts)?;
        let backing = open::open_backing(path, &opts)?;
        if opts.mode == PollMode::Iopoll {
            open::check_iopoll(&backing.file, path, backing.kind)?;
        }
        let rings = (0..opts.queues)
            .map(|_| open::new_rings(path, &backing.file, opts.queue_depth, opts.mode))
            .collect::<Result<Vec<_>, _>>()?;
        let geometry = Geometry {
            block_size: opts.block_size,
            capacity_blocks: backing.size_bytes / u64::from(opts.block_size),
            max_transfer_blocks: opts.max_transfer_bytes / opts.block_size,
            // A file or block device does not say (a RAID's stripe could come
            // from sysfs's optimal_io_size; not read yet).
            optimal_io_blocks: 0,
            queues: opts.queues,
            queue_depth: opts.queue_depth,
        };
        let file = Arc::new(backing.file);
        let counters = Arc::new(Counters::default());
        // Built up queue by queue so that, if a later queue fails, dropping `device`
        // stops the threads already started.
        let mut device = UringDevice {
            geometry,
            kind: backing.kind,
            queues: Vec::with_capacity(rings.len()),
            threads: Vec::with_capacity(rings.len()),
            counters: counters.clone(),
        };
        for (queue, ring) in (0..opts.queues).zip(rings) {
            let (shared, rx) =
                QueueShared::new(opts.queue_depth, opts.max_transfer_bytes, counters.clone())
                    .map_err(|source| OpenError::Io {
                        path: path.to_path_buf(),
                        op: "create the queue's eventfd",
                        source,
                    })?;
            let mut worker = Worker::new(
                ring,
                pool.clone(),
                file.clone(),
                rx,
                shared.clone(),
                counters.clone(),
                &opts,
            )
            .map_err(|source| OpenError::Io {
                path: path.to_path_buf(),
                op: "register the buffer pool with io_uring (Linux 5.19 or later; without \
                     CAP_IPC_LOCK, RLIMIT_MEMLOCK must allow the pool once per queue)",
                source,
            })?;
            if !opts.use_fallocate {
                worker.write_zeroes_for(&[ZERO_RANGE_MODE, PUNCH_HOLE_MODE]);
            }
            let thread = std::thread::Builder::new()
                .name(format!("weir-uring-q{queue}"))
                .spawn(move || worker.run())
                .map_err(|source| OpenError::Thread { queue, source })?;
            device.queues.push(shared);
            device.threads.push(thread);
        }
        tracing::info!(path = %path.display(), kind = ?device.kind, geometry = ?device.geometry, "io_uring device open");
        Ok(device)
    }

    /// Whether a regular file or a block device backs this device.
    pub fn backing_kind(&self) -> BackingKind {
        self.kind
    }

    /// The slow-path counters so far.
    pub fn stats(&self) -> UringStats {
        let c = &self.counters;
        UringStats {
            unaligned_write_copies: c.unaligned_write_copies.load(Ordering::Relaxed),
            gather_copies: c.gather_copies.load(Ordering::Relaxed),
            short_transfer_resubmits: c.short_transfer_resubmits.load(Ordering::Relaxed),
            zero_write_fallbacks: c.zero_write_fallbacks.load(Ordering::Relaxed),
            fixed_buffer_ops: c.fixed_buffer_ops.load(Ordering::Relaxed),
        }
    }

    /// Like [`BlockDevice::submit`], but the future does not borrow the device, so it
    /// can be spawned. If the device is dropped first, the command either completes
    /// or fails with `Gone`.
    pub fn submit_detached(
        &self,
        queue: u16,
        cmd: DevCommand,
    ) -> impl Future<Output = Result<DevCompletion, DevError>> + Send + 'static {
        let prepared = self.prepare(queue, cmd);
        async move {
            let (shared, kind, offset) = prepared?;
            shared.run(kind, offset).await
        }
    }

    /// Check `cmd` and turn it into an op for `queue` at a byte offset.
    fn prepare(
        &self,
        queue: u16,
        cmd: DevCommand,
    ) -> Result<(Arc<QueueShared>, OpKind, u64), DevError> {
        let shared = self
            .queues
            .get(usize::from(queue))
            .ok_or(DevError::BadQueue)?
            .clone();
        let (kind, lba) = match cmd {
            DevCommand::Read { lba, buf } => {
                self.check_transfer(lba, buf.len())?;
                debug_assert_eq!(buf.as_ref().as_ptr() as usize % BUF_ALIGN, 0);
                (OpKind::Read { buf }, lba)
            }
            DevCommand::Write { lba, data, fua } => {
                self.check_transfer(lba, data.len())?;
                (OpKind::Write { data, fua }, lba)
            }
            DevCommand::WriteGather { lba, data, fua } => {
                self.check_transfer(lba, data.iter().map(Bytes::len).sum())?;
                (OpKind::Gather { data, fua }, lba)
            }
            DevCommand::Flush => (OpKind::Flush, Lba(0)),
            DevCommand::WriteZeroes { lba, blocks } => {
                self.geometry.check_range(lba, blocks)?;
                (self.fallocate(blocks, ZERO_RANGE_MODE), lba)
            }
            DevCommand::Deallocate { lba, blocks } => {
                self.geometry.check_range(lba, blocks)?;
                (self.fallocate(blocks, PUNCH_HOLE_MODE), lba)
            }
        };
        Ok((shared, kind, lba.0 * u64::from(self.geometry.block_size)))
    }

    fn check_transfer(&self, lba: Lba, len_bytes: usize) -> Result<(), DevError> {
        let block_size = self.geometry.block_size as usize;
        if !len_bytes.is_multiple_of(block_size) {
            return Err(DevError::Misaligned);
        }
        self.geometry
            .check_range(lba, (len_bytes / block_size) as u64)
    }

    fn fallocate(&self, blocks: u64, mode: i32) -> OpKind {
        OpKind::Fallocate {
            len: blocks * u64::from(self.geometry.block_size),
            mode,
        }
    }
}

impl BlockDevice for UringDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn submit(
        &self,
        queue: u16,
        cmd: DevCommand,
    ) -> impl Future<Output = Result<DevCompletion, DevError>> + Send {
        self.submit_detached(queue, cmd)
    }
}

impl Drop for UringDevice {
    fn drop(&mut self) {
        for queue in &self.queues {
            queue.close();
            // Wake the thread even if a wake-up is pending: it must see `closed`.
            queue.signal();
        }
        for (queue, thread) in self.threads.drain(..).enumerate() {
            if thread.join().is_err() {
                tracing::error!(queue, "io_uring queue thread panicked");
            }
        }
    }
}
