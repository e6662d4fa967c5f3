//! The device with SPDK linked: open, the submitting side, shutdown.

use crate::env::{self, DmaSource};
use crate::error::{errno_name, OpenError};
use crate::ffi;
use crate::place::{reserve, Placement};
use crate::poller::{Cmd, Counters, Op, Poller, Setup};
use crate::{SpdkOptions, SpdkStats};
use bytes::Bytes;
use std::ffi::CString;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use tokio::sync::{oneshot, Semaphore};
use weir_core::buf::{BufPool, BUF_ALIGN, REGION_BYTES_MAX};
use weir_core::device::{DevCommand, DevCompletion, DevError, Geometry};
use weir_core::ids::Lba;

/// The controller handle, detached when the device is dropped.
#[derive(Debug)]
struct Ctrlr(*mut ffi::Ctrlr);

// SAFETY: SPDK's controller handle may be used from any thread for the calls
// weir makes on it (queries, queue pair allocation, detach); weir detaches it
// only after every polling thread has freed its queue pair and ended.
unsafe impl Send for Ctrlr {}
// SAFETY: as for Send: shared only for those thread-safe calls.
unsafe impl Sync for Ctrlr {}

/// What one queue's submitters share with its polling thread.
#[derive(Debug)]
pub(crate) struct QueueShared {
    /// The way to the thread; taken away when the queue closes, which ends
    /// the thread's channel (submitters never keep a clone of it).
    tx: Mutex<Option<mpsc::SyncSender<Cmd>>>,
    /// One permit per command in the queue (in the channel or on the thread):
    /// `queue_depth` bounds the channel, the thread's table and the bounce
    /// buffers.
    slots: Arc<Semaphore>,
    /// No new commands: the device is dropped or the queue pair failed.
    closed: AtomicBool,
    /// Where a command's memory goes once it has its slot.
    placement: Arc<Placement>,
}

impl QueueShared {
    /// Stop taking commands: later and waiting submitters get `Gone`.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.slots.close();
        drop(self.sender().take());
    }

    fn sender(&self) -> std::sync::MutexGuard<'_, Option<mpsc::SyncSender<Cmd>>> {
        self.tx
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn run(&self, op: Op) -> Result<DevCompletion, DevError> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(DevError::Gone);
        }
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| DevError::Gone)?;
        // With the slot held, the queue's share of bounce buffers is free.
        let op = self.placement.place(op)?;
        let (reply, done) = oneshot::channel();
        // The channel holds `queue_depth` commands and a permit is held for
        // each, so it is never full; it is closed only when the thread ended.
        let cmd = Cmd {
            op,
            reply,
            _slot: slot,
        };
        self.sender()
            .as_ref()
            .ok_or(DevError::Gone)?
            .try_send(cmd)
            .map_err(|_| DevError::Gone)?;
        // The thread drops a command's reply unanswered only when it is gone.
        done.await.map_err(|_| DevError::Gone)?
    }
}

#[derive(Debug)]
pub(crate) struct Device {
    geometry: Geometry,
    queues: Vec<Arc<QueueShared>>,
    threads: Vec<JoinHandle<()>>,
    ctrlr: Ctrlr,
    /// The node's buffer pool and the bounce buffers, all DMA memory.
    placement: Arc<Placement>,
    counters: Arc<Counters>,
    /// The SSD's and the namespace's ids: changes when either does.
    identity: String,
}

impl Device {
    pub(crate) fn open(opts: SpdkOptions) -> Result<Device, OpenError> {
        validate(&opts)?;
        env::init(&opts.env)?;
        let trid = CString::new(opts.trid.as_str())
            .map_err(|_| OpenError::Options("the transport id holds a NUL byte".into()))?;
        let mut code = 0;
        // SAFETY: a NUL-terminated string and an out-parameter that lives
        // across the call.
        let raw = unsafe { ffi::weir_spdk_connect(trid.as_ptr(), &mut code) };
        if raw.is_null() {
            return Err(OpenError::Connect {
                trid: opts.trid.clone(),
                code,
            });
        }
        // From here on, dropping `ctrlr` (on an error below) detaches it.
        let ctrlr = Ctrlr(raw);
        let mut device = Device {
            geometry: Geometry {
                block_size: 0,
                capacity_blocks: 0,
                max_transfer_blocks: 0,
                optimal_io_blocks: 0,
                queues: opts.queues,
                queue_depth: opts.queue_depth,
            },
            queues: Vec::new(),
            threads: Vec::new(),
            ctrlr,
            placement: Arc::new(Placement {
                pool: BufPool::new(0),
                bounce: BufPool::new(0),
                counters: Arc::new(Counters::default()),
            }),
            counters: Arc::new(Counters::default()),
            identity: String::new(),
        };
        // SAFETY: a live controller handle.
        let ns = unsafe { ffi::spdk_nvme_ctrlr_get_ns(device.ctrlr.0, opts.nsid) };
        // SAFETY: `ns` is checked non-null before it is used.
        if ns.is_null() || !unsafe { ffi::spdk_nvme_ns_is_active(ns) } {
            return Err(OpenError::Namespace {
                trid: opts.trid.clone(),
                nsid: opts.nsid,
            });
        }
        let mut identity = [0 as std::ffi::c_char; 256];
        // SAFETY: live handles; the glue writes at most `identity.len()` bytes,
        // NUL-terminated.
        let identity = unsafe {
            ffi::weir_spdk_identity(
                device.ctrlr.0,
                ns,
                opts.nsid,
                identity.as_mut_ptr(),
                identity.len(),
            );
            std::ffi::CStr::from_ptr(identity.as_ptr())
        };
        device.identity = identity.to_string_lossy().into_owned();
        device.geometry = geometry(ns, &opts)?;
        let max_bytes =
            device.geometry.max_transfer_blocks as usize * device.geometry.block_size as usize;
        let bounce_bytes = usize::from(opts.queues)
            * usize::from(opts.queue_depth)
            * max_bytes.next_power_of_two();
        let placement = Placement {
            pool: BufPool::with_source(opts.pool_bytes, Arc::new(DmaSource)),
            bounce: BufPool::with_source(bounce_bytes, Arc::new(DmaSource)),
            counters: device.counters.clone(),
        };
        reserve(&placement.pool, opts.pool_bytes)?;
        reserve(&placement.bounce, bounce_bytes)?;
        device.placement = Arc::new(placement);
        // A zeroed buffer of the largest transfer, for zeroing by writes where
        // the namespace has no Write Zeroes.
        let zero = BufPool::with_source(max_bytes, Arc::new(DmaSource))
            .alloc(max_bytes)
            .map_err(|_| OpenError::Dma(max_bytes))?
            .freeze();
        // SAFETY: a live namespace handle.
        let caps = unsafe { ffi::weir_spdk_ns_caps(ns) };
        for queue in 0..opts.queues {
            // SAFETY: a live controller; null options ask for SPDK's defaults.
            let qpair =
                unsafe { ffi::spdk_nvme_ctrlr_alloc_io_qpair(device.ctrlr.0, std::ptr::null(), 0) };
            if qpair.is_null() {
                return Err(OpenError::Qpair { queue });
            }
            let (tx, rx) = mpsc::sync_channel(usize::from(opts.queue_depth));
            let shared = Arc::new(QueueShared {
                tx: Mutex::new(Some(tx)),
                slots: Arc::new(Semaphore::new(usize::from(opts.queue_depth))),
                closed: AtomicBool::new(false),
                placement: device.placement.clone(),
            });
            let poller = Poller::new(Setup {
                qpair,
                ns,
                admin: (queue == 0).then_some(device.ctrlr.0),
                caps,
                geometry: device.geometry,
                rx,
                shared: shared.clone(),
                counters: device.counters.clone(),
                zero: zero.clone(),
                idle_spin: opts.idle_spin,
            });
            let core = opts.poll_cores.get(usize::from(queue)).copied();
            let (started_tx, started) = mpsc::channel();
            let thread = std::thread::Builder::new()
                .name(format!("weir-spdk-q{queue}"))
                .spawn(move || {
                    let pinned = core.map_or(Ok(()), pin_to);
                    let ok = pinned.is_ok();
                    let _ = started_tx.send(pinned);
                    // Not pinned: the thread frees its queue pair and ends.
                    poller.run(ok);
                })
                .map_err(|source| OpenError::Thread { queue, source })?;
            device.queues.push(shared);
            device.threads.push(thread);
            let pinned = started.recv().unwrap_or_else(|_| {
                Err(std::io::Error::other("the thread ended before it started"))
            });
            pinned.map_err(|source| OpenError::Thread { queue, source })?;
        }
        tracing::info!(trid = %opts.trid, nsid = opts.nsid, geometry = ?device.geometry,
            caps, poll_cores = ?opts.poll_cores, "SPDK device open");
        Ok(device)
    }

    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }

    pub(crate) fn pool(&self) -> BufPool {
        self.placement.pool.clone()
    }

    pub(crate) fn stats(&self) -> SpdkStats {
        self.counters.snapshot()
    }

    pub(crate) fn geometry(&self) -> Geometry {
        self.geometry
    }

    pub(crate) fn submit(
        &self,
        queue: u16,
        cmd: DevCommand,
    ) -> impl Future<Output = Result<DevCompletion, DevError>> + Send {
        let prepared = self.prepare(queue, cmd);
        async move {
            let (shared, op) = prepared?;
            shared.run(op).await
        }
    }

    /// Check `cmd` and pick its queue. Its memory is placed (copied into DMA
    /// memory where it is not) once it has a slot on the queue.
    fn prepare(&self, queue: u16, cmd: DevCommand) -> Result<(Arc<QueueShared>, Op), DevError> {
        let shared = self
            .queues
            .get(usize::from(queue))
            .ok_or(DevError::BadQueue)?
            .clone();
        let op = match cmd {
            DevCommand::Read { lba, buf } => Op::Read {
                lba: lba.0,
                blocks: self.check_transfer(lba, buf.len())?,
                buf,
                bounce: None,
            },
            DevCommand::Write { lba, data, fua } => Op::Write {
                lba: lba.0,
                blocks: self.check_transfer(lba, data.len())?,
                data,
                fua,
            },
            DevCommand::WriteGather { lba, mut data, fua } => {
                let blocks = self.check_transfer(lba, data.iter().map(Bytes::len).sum())?;
                if data.len() == 1 {
                    Op::Write {
                        lba: lba.0,
                        blocks,
                        data: data.remove(0),
                        fua,
                    }
                } else {
                    Op::Writev {
                        lba: lba.0,
                        blocks,
                        segments: data,
                        fua,
                    }
                }
            }
            DevCommand::Flush => Op::Flush,
            DevCommand::WriteZeroes { lba, blocks } => {
                self.geometry.check_range(lba, blocks)?;
                Op::Zeroes {
                    lba: lba.0,
                    blocks,
                    deallocate: false,
                }
            }
            DevCommand::Deallocate { lba, blocks } => {
                self.geometry.check_range(lba, blocks)?;
                Op::Zeroes {
                    lba: lba.0,
                    blocks,
                    deallocate: true,
                }
            }
        };
        Ok((shared, op))
    }

    /// The transfer's length in blocks, checked.
    fn check_transfer(&self, lba: Lba, len: usize) -> Result<u32, DevError> {
        let block_size = self.geometry.block_size as usize;
        if !len.is_multiple_of(block_size) {
            return Err(DevError::Misaligned);
        }
        let blocks = (len / block_size) as u64;
        self.geometry.check_range(lba, blocks)?;
        Ok(blocks as u32)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        for queue in &self.queues {
            queue.close();
        }
        // Closing took each thread's sender away: it finishes what is in
        // flight, frees its queue pair and returns.
        for thread in self.threads.drain(..) {
            if thread.join().is_err() {
                tracing::error!("an SPDK polling thread panicked");
            }
        }
    }
}

impl Drop for Ctrlr {
    fn drop(&mut self) {
        // SAFETY: a controller attached by `weir_spdk_connect`; `Device`'s
        // drop (which runs first: `ctrlr` is its field) joined every thread,
        // and each freed its queue pair.
        let rc = unsafe { ffi::spdk_nvme_detach(self.0) };
        if rc != 0 {
            tracing::error!(error = %errno_name(rc), "detaching the NVMe controller");
        }
    }
}

fn validate(opts: &SpdkOptions) -> Result<(), OpenError> {
    let bad = |why: String| Err(OpenError::Options(why));
    if opts.queues == 0 || opts.queue_depth == 0 {
        return bad("queues and queue_depth must be above 0".into());
    }
    if !opts.poll_cores.is_empty() && opts.poll_cores.len() != usize::from(opts.queues) {
        return bad(format!(
            "poll_cores names {} cores for {} queues (one each, or none)",
            opts.poll_cores.len(),
            opts.queues
        ));
    }
    if opts.nsid == 0 {
        return bad("namespace ids start at 1".into());
    }
    if opts.trid.is_empty() {
        return bad("no transport id (pci_addr)".into());
    }
    Ok(())
}

fn geometry(ns: *mut ffi::Ns, opts: &SpdkOptions) -> Result<Geometry, OpenError> {
    // SAFETY: a live, active namespace handle; these are thread-safe queries.
    let (block_size, capacity_blocks, max_xfer, boundary) = unsafe {
        (
            ffi::spdk_nvme_ns_get_sector_size(ns),
            ffi::spdk_nvme_ns_get_num_sectors(ns),
            ffi::spdk_nvme_ns_get_max_io_xfer_size(ns),
            ffi::spdk_nvme_ns_get_optimal_io_boundary(ns),
        )
    };
    let shape = |why: String| OpenError::Shape {
        nsid: opts.nsid,
        why,
    };
    // SAFETY: as above.
    let (md_size, extended, pi) = unsafe {
        (
            ffi::spdk_nvme_ns_get_md_size(ns),
            ffi::spdk_nvme_ns_get_extended_sector_size(ns),
            ffi::spdk_nvme_ns_get_pi_type(ns),
        )
    };
    if md_size != 0 || extended != block_size || pi != 0 {
        // The SSD would move each sector's metadata with the data (past the
        // end of weir's buffers) or to a metadata buffer weir does not give.
        return Err(shape(format!(
            "a format with metadata ({md_size} bytes a sector, protection type {pi}); \
             weir takes formats without (nvme format --lbaf)"
        )));
    }
    if !block_size.is_power_of_two() || !(512..=BUF_ALIGN as u32).contains(&block_size) {
        return Err(shape(format!(
            "sector size {block_size}: weir takes 512 to 4096-byte sectors"
        )));
    }
    let max_bytes = [max_xfer, opts.max_transfer_bytes, REGION_BYTES_MAX as u32]
        .into_iter()
        .filter(|&b| b > 0)
        .min()
        .unwrap_or(opts.max_transfer_bytes);
    let max_transfer_blocks = max_bytes / block_size;
    if max_transfer_blocks == 0 || capacity_blocks == 0 {
        return Err(shape(format!(
            "{capacity_blocks} sectors, {max_bytes}-byte transfers"
        )));
    }
    Ok(Geometry {
        block_size,
        capacity_blocks,
        max_transfer_blocks,
        optimal_io_blocks: boundary,
        queues: opts.queues,
        queue_depth: opts.queue_depth,
    })
}

/// Pin the calling thread to `core`.
fn pin_to(core: usize) -> std::io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET bounds-checks `core` against the
    // set's size (out of range: no bit set, and the call below then fails).
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if core >= libc::CPU_SETSIZE as usize {
            return Err(std::io::Error::other(format!(
                "core {core} is past CPU_SETSIZE"
            )));
        }
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        return Err(std::io::Error::new(
            e.kind(),
            format!("pinning to core {core}: {e}"),
        ));
    }
    Ok(())
}
