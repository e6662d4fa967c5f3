//! One queue's polling thread: the one owner of its SPDK queue pair.
//!
//! A command becomes one or more NVMe commands ("parts": Write Zeroes is at
//! most 65,536 blocks). Each command has a tag, its slot in `table`; SPDK's
//! callback records `(tag, status)` in this thread's `DONE` list, and the
//! thread finishes commands after `process_completions` returns. A command
//! leaves the table only when no part of it is with SPDK, so its memory
//! outlives every DMA into or out of it.

use crate::device::QueueShared;
use crate::ffi::{self, caps};
use crate::status::NvmeStatus;
use crate::SpdkStats;
use bytes::Bytes;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, OwnedSemaphorePermit};
use weir_core::buf::Buf;
use weir_core::device::{DevCompletion, DevError, Geometry};
use weir_core::ids::Lba;

/// NVMe's Write Zeroes count is 16 bits, zero-based.
const WRITE_ZEROES_MAX_BLOCKS: u64 = 1 << 16;
/// How often queue 0's thread polls the controller's admin queue (SPDK's
/// asynchronous events, keep-alives, a removed device), busy or idle.
const ADMIN_POLL: Duration = Duration::from_millis(10);
/// At shutdown, how long a queue waits for the commands it still has with
/// SPDK before it frees its queue pair, which aborts them.
const DRAIN_DEADLINE: Duration = Duration::from_secs(10);

/// Counters shared by all queues of a device.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    bounce_copies: AtomicU64,
    gather_copies: AtomicU64,
    scattered_writes: AtomicU64,
    zero_write_fallbacks: AtomicU64,
    requeued: AtomicU64,
    nvme_errors: AtomicU64,
}

impl Counters {
    pub(crate) fn bounce(&self) {
        self.bounce_copies.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn gather_copy(&self) {
        self.gather_copies.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> SpdkStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SpdkStats {
            bounce_copies: get(&self.bounce_copies),
            gather_copies: get(&self.gather_copies),
            scattered_writes: get(&self.scattered_writes),
            zero_write_fallbacks: get(&self.zero_write_fallbacks),
            requeued: get(&self.requeued),
            nvme_errors: get(&self.nvme_errors),
        }
    }
}

/// A command for the thread, its memory already where SPDK can reach it.
#[derive(Debug)]
pub(crate) enum Op {
    Read {
        lba: u64,
        blocks: u32,
        /// The caller's buffer, returned filled.
        buf: Buf,
        /// DMA memory the device reads into when `buf` is not DMA memory.
        bounce: Option<Buf>,
    },
    Write {
        lba: u64,
        blocks: u32,
        data: Bytes,
        fua: bool,
    },
    Writev {
        lba: u64,
        blocks: u32,
        segments: Vec<Bytes>,
        fua: bool,
    },
    Flush,
    /// WriteZeroes, or Deallocate (which must read back as zeroes too).
    Zeroes {
        lba: u64,
        blocks: u64,
        deallocate: bool,
    },
}

/// A command on its way to the thread.
#[derive(Debug)]
pub(crate) struct Cmd {
    pub(crate) op: Op,
    pub(crate) reply: oneshot::Sender<Result<DevCompletion, DevError>>,
    /// Held until the command is finished: one of the queue's slots.
    pub(crate) _slot: OwnedSemaphorePermit,
}

/// What SPDK's callbacks reach through their argument: the command's tag and,
/// for a scattered write, its segments and where the walk over them is.
struct Ctx {
    tag: usize,
    segments: Vec<(usize, u32)>,
    at: usize,
    offset: u32,
}

/// How a zeroing command is carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Zeroing {
    /// NVMe Write Zeroes; with `deallocate`, its DEAC bit (the SSD may
    /// deallocate the blocks as it zeroes them, where DLFEAT says it can).
    /// Dataset Management's deallocate is not used: it is advisory, and a
    /// block it leaves allocated reads back its old data.
    WriteZeroes { deallocate: bool },
    /// Writes of the zeroed buffer (the namespace has no Write Zeroes).
    Writes,
}

/// A command on the thread.
struct Pending {
    cmd: Cmd,
    /// Owned: freed when the command leaves the table, after its last part.
    ctx: NonNull<Ctx>,
    /// The next block to submit and the end, for a command in parts; a
    /// single-part command has `next == end` once submitted.
    next: u64,
    end: u64,
    zeroing: Zeroing,
    /// Parts with SPDK now.
    outstanding: u32,
    error: Option<DevError>,
    /// SPDK refused a part of it once (counted once per command).
    refused: bool,
}

impl Pending {
    fn lba(&self) -> u64 {
        match &self.cmd.op {
            Op::Read { lba, .. } | Op::Write { lba, .. } | Op::Writev { lba, .. } => *lba,
            Op::Zeroes { lba, .. } => *lba,
            Op::Flush => 0,
        }
    }

    /// No part is left to submit (or the command failed and submits no more).
    fn submitted(&self) -> bool {
        self.next == self.end || self.error.is_some()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // SAFETY: from `Box::into_raw` in `Poller::start`; SPDK holds no part
        // of this command any more (it leaves the table only then).
        drop(unsafe { Box::from_raw(self.ctx.as_ptr()) });
    }
}

thread_local! {
    /// Completions SPDK reported during this thread's current
    /// `process_completions` (or queue pair free): `(tag, status)`.
    static DONE: RefCell<Vec<(usize, u16)>> = const { RefCell::new(Vec::new()) };
}

unsafe extern "C" fn on_complete(ctx: *mut c_void, cpl: *const ffi::Cpl) {
    // SAFETY: `ctx` is a live `Ctx` (its command is in the table until this
    // completion is handled), `cpl` valid for the call; SPDK calls this on the
    // polling thread, which is not touching the `Ctx` meanwhile.
    let (tag, raw) = unsafe { ((*ctx.cast::<Ctx>()).tag, (*cpl).status_raw) };
    DONE.with(|done| done.borrow_mut().push((tag, raw)));
}

unsafe extern "C" fn reset_sgl(ctx: *mut c_void, offset: u32) {
    // SAFETY: as for `on_complete`; SPDK walks the list on the polling thread.
    let ctx = unsafe { &mut *ctx.cast::<Ctx>() };
    let mut left = offset;
    ctx.at = 0;
    while ctx.at < ctx.segments.len() && left >= ctx.segments[ctx.at].1 {
        left -= ctx.segments[ctx.at].1;
        ctx.at += 1;
    }
    ctx.offset = left;
}

unsafe extern "C" fn next_sge(
    ctx: *mut c_void,
    address: *mut *mut c_void,
    length: *mut u32,
) -> c_int {
    // SAFETY: as for `reset_sgl`; `address` and `length` are SPDK's
    // out-parameters, valid for the call.
    let ctx = unsafe { &mut *ctx.cast::<Ctx>() };
    let Some(&(addr, len)) = ctx.segments.get(ctx.at) else {
        return -libc::EINVAL;
    };
    // SAFETY: SPDK's out-parameters.
    unsafe {
        *address = (addr + ctx.offset as usize) as *mut c_void;
        *length = len - ctx.offset;
    }
    ctx.at += 1;
    ctx.offset = 0;
    0
}

/// What a queue's thread is given.
pub(crate) struct Setup {
    pub(crate) qpair: *mut ffi::Qpair,
    pub(crate) ns: *mut ffi::Ns,
    /// The controller, for the thread that polls its admin queue (queue 0).
    pub(crate) admin: Option<*mut ffi::Ctrlr>,
    /// `weir_spdk_ns_caps` bits.
    pub(crate) caps: u32,
    pub(crate) geometry: Geometry,
    pub(crate) rx: mpsc::Receiver<Cmd>,
    pub(crate) shared: Arc<QueueShared>,
    pub(crate) counters: Arc<Counters>,
    /// A zeroed DMA buffer of the largest transfer (read by the device only).
    pub(crate) zero: Bytes,
    pub(crate) idle_spin: Duration,
}

/// One queue's thread.
pub(crate) struct Poller {
    s: Setup,
    /// Commands by tag; `free` holds the unused tags.
    table: Vec<Option<Pending>>,
    free: Vec<usize>,
    /// Tags of commands with parts SPDK refused for want of requests.
    waiting: VecDeque<usize>,
    /// Parts with SPDK, over all commands.
    outstanding: usize,
    last_admin_poll: Instant,
}

// SAFETY: the queue pair and namespace handles are used only by the thread the
// poller is moved to (the queue pair has no other user); the controller only
// for its admin queue, by queue 0's thread alone; everything else is Send.
unsafe impl Send for Poller {}

impl Poller {
    pub(crate) fn new(s: Setup) -> Poller {
        let depth = usize::from(s.geometry.queue_depth);
        Poller {
            s,
            table: (0..depth).map(|_| None).collect(),
            free: (0..depth).rev().collect(),
            waiting: VecDeque::with_capacity(depth),
            outstanding: 0,
            last_admin_poll: Instant::now(),
        }
    }

    /// Poll until the device is dropped (or the queue pair fails), then free
    /// the queue pair. With `serve` false, only free it.
    pub(crate) fn run(mut self, serve: bool) {
        DONE.with(|done| {
            done.borrow_mut()
                .reserve(usize::from(self.s.geometry.queue_depth))
        });
        let mut open = serve;
        let mut last_work = Instant::now();
        let mut closed_at = None;
        loop {
            self.poll_admin();
            while open {
                match self.s.rx.try_recv() {
                    Ok(cmd) => {
                        self.start(cmd);
                        last_work = Instant::now();
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => open = false,
                }
            }
            if self.outstanding > 0 || !self.waiting.is_empty() {
                // SAFETY: this thread's queue pair; 0: no limit.
                let n = unsafe { ffi::spdk_nvme_qpair_process_completions(self.s.qpair, 0) };
                self.finish_done();
                if n < 0 {
                    tracing::error!(error = %crate::error::errno_name(n),
                        "the NVMe queue pair failed; its commands fail with Gone");
                    self.s.shared.close();
                    break;
                }
                if n > 0 {
                    last_work = Instant::now();
                }
                self.retry_waiting();
                if !open && closed_at.get_or_insert_with(Instant::now).elapsed() > DRAIN_DEADLINE {
                    tracing::error!(
                        parts = self.outstanding,
                        "commands still with the SSD {DRAIN_DEADLINE:?} after shutdown; \
                         freeing the queue pair aborts them"
                    );
                    break;
                }
                continue;
            }
            if !open {
                break;
            }
            if last_work.elapsed() < self.s.idle_spin {
                std::hint::spin_loop();
                continue;
            }
            // Idle: sleep until a command comes (queue 0 wakes to poll the
            // admin queue too).
            let next = if self.s.admin.is_some() {
                self.s.rx.recv_timeout(ADMIN_POLL)
            } else {
                self.s
                    .rx
                    .recv()
                    .map_err(|_| mpsc::RecvTimeoutError::Disconnected)
            };
            match next {
                Ok(cmd) => {
                    self.start(cmd);
                    last_work = Instant::now();
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
            }
        }
        // Dropping the poller frees the queue pair (see Drop).
    }

    /// Queue 0: poll the controller's admin queue every [`ADMIN_POLL`].
    fn poll_admin(&mut self) {
        let Some(ctrlr) = self.s.admin else {
            return;
        };
        if self.last_admin_poll.elapsed() < ADMIN_POLL {
            return;
        }
        self.last_admin_poll = Instant::now();
        // SAFETY: the live controller; only this thread touches its admin
        // queue after open.
        let rc = unsafe { ffi::spdk_nvme_ctrlr_process_admin_completions(ctrlr) };
        if rc < 0 {
            tracing::warn!(error = %crate::error::errno_name(rc), "the NVMe admin queue failed");
        }
    }

    /// Put `cmd` in the table and submit what SPDK takes of it.
    fn start(&mut self, cmd: Cmd) {
        let tag = self
            .free
            .pop()
            .expect("a slot permit per command: the table has room");
        let segments = match &cmd.op {
            Op::Writev { segments, .. } => segments
                .iter()
                .map(|s| (s.as_ptr() as usize, s.len() as u32))
                .collect(),
            _ => Vec::new(),
        };
        let ctx = Box::new(Ctx {
            tag,
            segments,
            at: 0,
            offset: 0,
        });
        let (next, end, zeroing) = match &cmd.op {
            Op::Zeroes {
                lba,
                blocks,
                deallocate,
            } => (*lba, lba + blocks, self.zeroing(*deallocate)),
            // Without a volatile cache there is nothing to flush: no part.
            Op::Flush if self.s.caps & caps::FLUSH == 0 => (0, 0, Zeroing::Writes),
            _ => (0, 1, Zeroing::Writes),
        };
        if zeroing == Zeroing::Writes && matches!(cmd.op, Op::Zeroes { .. }) {
            self.s
                .counters
                .zero_write_fallbacks
                .fetch_add(1, Ordering::Relaxed);
        }
        if matches!(cmd.op, Op::Writev { .. }) {
            self.s
                .counters
                .scattered_writes
                .fetch_add(1, Ordering::Relaxed);
        }
        self.table[tag] = Some(Pending {
            cmd,
            ctx: NonNull::from(Box::leak(ctx)),
            next,
            end,
            zeroing,
            outstanding: 0,
            error: None,
            refused: false,
        });
        self.advance(tag);
    }

    fn zeroing(&self, deallocate: bool) -> Zeroing {
        if self.s.caps & caps::WRITE_ZEROES == 0 {
            return Zeroing::Writes;
        }
        Zeroing::WriteZeroes {
            deallocate: deallocate && self.s.caps & caps::WRITE_ZEROES_DEALLOCATE != 0,
        }
    }

    /// Submit the command's remaining parts until SPDK refuses one; finish it
    /// if nothing of it is left with SPDK and nothing is left to submit.
    fn advance(&mut self, tag: usize) {
        let pending = self.table[tag].as_mut().expect("a live tag");
        while !pending.submitted() {
            let (rc, parts_end) = submit_part(
                pending,
                self.s.ns,
                self.s.qpair,
                &self.s.zero,
                self.s.geometry.max_transfer_blocks,
            );
            match rc {
                0 => {
                    pending.next = parts_end;
                    pending.outstanding += 1;
                    self.outstanding += 1;
                }
                rc if rc == -libc::ENOMEM => {
                    if !std::mem::replace(&mut pending.refused, true) {
                        self.s.counters.requeued.fetch_add(1, Ordering::Relaxed);
                    }
                    if !self.waiting.contains(&tag) {
                        self.waiting.push_back(tag);
                    }
                    return;
                }
                rc => {
                    // -ENXIO: the queue pair failed. Anything else (-EINVAL,
                    // -EFAULT: memory SPDK cannot map) would be refused again:
                    // not the media's fault, so not a media error the node
                    // would "repair".
                    tracing::error!(error = %crate::error::errno_name(rc), lba = pending.lba(),
                        "SPDK refused a command");
                    pending.error = Some(DevError::Gone);
                }
            }
        }
        if pending.outstanding == 0 {
            self.finish(tag);
        }
    }

    /// Handle the completions SPDK reported.
    fn finish_done(&mut self) {
        let done = DONE.with(|done| std::mem::take(&mut *done.borrow_mut()));
        for &(tag, raw) in &done {
            let pending = self.table[tag]
                .as_mut()
                .expect("a completion for a command in the table");
            pending.outstanding -= 1;
            self.outstanding -= 1;
            let status = NvmeStatus::from_raw(raw);
            if !status.is_success() {
                self.s.counters.nvme_errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%status, lba = pending.lba(), "NVMe command failed");
                pending
                    .error
                    .get_or_insert(status.to_dev_error(Lba(pending.lba())));
            }
            if pending.outstanding == 0 && pending.submitted() {
                self.finish(tag);
            }
        }
        // Keep the list's allocation for the next round.
        DONE.with(|d| {
            let mut d = d.borrow_mut();
            if d.is_empty() {
                let mut done = done;
                done.clear();
                *d = done;
            }
        });
    }

    fn retry_waiting(&mut self) {
        for _ in 0..self.waiting.len() {
            let Some(tag) = self.waiting.pop_front() else {
                break;
            };
            self.advance(tag);
            if self.waiting.contains(&tag) {
                // Refused again: SPDK has no requests free; try after the next
                // completions.
                break;
            }
        }
    }

    /// Answer the command at `tag` and free its slot.
    fn finish(&mut self, tag: usize) {
        let mut pending = self.table[tag].take().expect("a live tag");
        self.waiting.retain(|&t| t != tag);
        self.free.push(tag);
        let result = match pending.error {
            Some(e) => Err(e),
            None => match std::mem::replace(&mut pending.cmd.op, Op::Flush) {
                Op::Read {
                    mut buf, bounce, ..
                } => {
                    if let Some(bounce) = bounce {
                        buf.as_mut().copy_from_slice(bounce.as_ref());
                        weir_core::copies::note(buf.len(), weir_core::copies::Copy::Other);
                    }
                    Ok(DevCompletion::Read(buf))
                }
                _ => Ok(DevCompletion::Done),
            },
        };
        let Pending { cmd, .. } = &mut pending;
        let (reply, _) = oneshot::channel();
        let reply = std::mem::replace(&mut cmd.reply, reply);
        // A caller that dropped its future no longer wants the answer.
        let _ = reply.send(result);
    }
}

/// Submit the next part of `p`: SPDK's return code and the block the part
/// ends at.
fn submit_part(
    p: &mut Pending,
    ns: *mut ffi::Ns,
    qpair: *mut ffi::Qpair,
    zero: &Bytes,
    max_blocks: u32,
) -> (c_int, u64) {
    let ctx = p.ctx.as_ptr().cast::<c_void>();
    let cb = on_complete as ffi::CmdCb;
    let fua_flags = |fua: bool| if fua { ffi::IO_FLAGS_FUA } else { 0 };
    // SAFETY (every call below): `ns` and `qpair` are this thread's live
    // handles; the memory handed over belongs to the command, which stays in
    // the table (unmoved: its buffers are heap memory) until its last part
    // completes; `ctx` lives as long. SPDK only reads a write's memory.
    let rc = unsafe {
        match &mut p.cmd.op {
            Op::Read {
                lba,
                blocks,
                buf,
                bounce,
            } => {
                let into = bounce.as_mut().unwrap_or(buf).as_mut().as_mut_ptr();
                ffi::spdk_nvme_ns_cmd_read(ns, qpair, into.cast(), *lba, *blocks, cb, ctx, 0)
            }
            Op::Write {
                lba,
                blocks,
                data,
                fua,
            } => ffi::spdk_nvme_ns_cmd_write(
                ns,
                qpair,
                data.as_ptr().cast_mut().cast(),
                *lba,
                *blocks,
                cb,
                ctx,
                fua_flags(*fua),
            ),
            Op::Writev {
                lba, blocks, fua, ..
            } => ffi::spdk_nvme_ns_cmd_writev(
                ns,
                qpair,
                *lba,
                *blocks,
                cb,
                ctx,
                fua_flags(*fua),
                reset_sgl,
                next_sge,
            ),
            Op::Flush => ffi::spdk_nvme_ns_cmd_flush(ns, qpair, cb, ctx),
            Op::Zeroes { .. } => {
                let start = p.next;
                let left = p.end - start;
                let (rc, n) = match p.zeroing {
                    Zeroing::WriteZeroes { deallocate } => {
                        let n = left.min(WRITE_ZEROES_MAX_BLOCKS);
                        let flags = if deallocate {
                            ffi::IO_FLAGS_WRITE_ZEROES_DEAC
                        } else {
                            0
                        };
                        let rc = ffi::spdk_nvme_ns_cmd_write_zeroes(
                            ns, qpair, start, n as u32, cb, ctx, flags,
                        );
                        (rc, n)
                    }
                    Zeroing::Writes => {
                        let n = left.min(u64::from(max_blocks));
                        let rc = ffi::spdk_nvme_ns_cmd_write(
                            ns,
                            qpair,
                            zero.as_ptr().cast_mut().cast(),
                            start,
                            n as u32,
                            cb,
                            ctx,
                            0,
                        );
                        (rc, n)
                    }
                };
                return (rc, start + n);
            }
        }
    };
    (rc, p.end)
}

impl Drop for Poller {
    fn drop(&mut self) {
        // Freeing the queue pair completes whatever SPDK still holds (aborted:
        // queue deleted), through the callbacks, on this thread.
        // SAFETY: this poller's queue pair, used by no one else, freed once.
        let rc = unsafe { ffi::spdk_nvme_ctrlr_free_io_qpair(self.s.qpair) };
        if rc != 0 {
            tracing::error!(error = %crate::error::errno_name(rc), "freeing an NVMe queue pair");
        }
        self.finish_done();
        // Parts never submitted: the command fails whole.
        for tag in 0..self.table.len() {
            if let Some(p) = self.table[tag].as_mut() {
                if p.outstanding == 0 {
                    p.error.get_or_insert(DevError::Gone);
                    self.finish(tag);
                } else {
                    // SPDK kept a part it should have completed when the queue
                    // pair was freed: leak the command rather than free memory
                    // a device may still write.
                    tracing::error!(
                        tag,
                        "a command outlived its queue pair; its memory is leaked"
                    );
                    std::mem::forget(self.table[tag].take());
                }
            }
        }
    }
}
