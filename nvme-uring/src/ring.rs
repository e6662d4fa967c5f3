//! The thread that drives one queue's ring.
//!
//! It sleeps in `io_uring_enter` only. A read of the queue's eventfd is always in
//! the ring, so a submitter that writes the eventfd wakes the thread through the same
//! wait that completions end; there is no second blocking point and no polling.
//! Each pass: take new commands from the channel, push as many SQEs as fit, submit
//! and wait for at least one completion, reap all completions.

use crate::fixed::FixedBufs;
use crate::op::{Next, Op, OpKind};
use crate::open::Rings;
use crate::queue::{Counters, QueueShared};
use crate::UringOptions;
use bytes::Bytes;
use io_uring::{opcode, types, IoUring};
use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use weir_core::buf::BufPool;
use weir_core::device::DevError;

/// `user_data` of the eventfd read; ops use their in-flight table index.
const WAKE: u64 = u64::MAX;

/// Everything one queue thread owns.
pub(crate) struct Worker {
    ring: IoUring,
    /// [`PollMode::Iopoll`](crate::PollMode::Iopoll): the polled ring that
    /// reads and writes go to, and how many of its entries are in the kernel.
    poll: Option<IoUring>,
    poll_inflight: usize,
    /// Registered buffers of the ring that reads and writes go to.
    fixed: FixedBufs,
    /// The device's file, registered at index 0 of every ring.
    fd: types::Fixed,
    /// Keeps `fd` open as long as the ring may use it.
    _file: Arc<File>,
    rx: mpsc::Receiver<Op>,
    shared: Arc<QueueShared>,
    counters: Arc<Counters>,
    table: InFlight,
    /// Commands taken from the channel, or resubmitted, that are not in the ring yet.
    waiting: VecDeque<Op>,
    /// (user_data, result) of the completions of one pass; reused between passes.
    reaped: Vec<(u64, i32)>,
    wake: WakeRead,
    zero: ZeroFill,
    block_size: u32,
}

impl Worker {
    pub(crate) fn new(
        rings: Rings,
        pool: Option<BufPool>,
        file: Arc<File>,
        rx: mpsc::Receiver<Op>,
        shared: Arc<QueueShared>,
        counters: Arc<Counters>,
        opts: &UringOptions,
    ) -> std::io::Result<Worker> {
        let depth = usize::from(opts.queue_depth);
        let fixed = FixedBufs::new(rings.poll.as_ref().unwrap_or(&rings.main), pool)?;
        Ok(Worker {
            ring: rings.main,
            poll: rings.poll,
            poll_inflight: 0,
            fixed,
            fd: types::Fixed(0),
            _file: file,
            rx,
            shared,
            counters,
            table: InFlight::new(depth),
            waiting: VecDeque::with_capacity(depth),
            reaped: Vec::with_capacity(depth + 1),
            wake: WakeRead {
                buf: Some(Box::new([0; 8])),
                armed: false,
            },
            zero: ZeroFill {
                unsupported_modes: Vec::new(),
                zeroes: None,
                max_transfer_bytes: opts.max_transfer_bytes as usize,
            },
            block_size: opts.block_size,
        })
    }

    /// Write zeroes, without trying fallocate, for these fallocate modes.
    pub(crate) fn write_zeroes_for(&mut self, modes: &[i32]) {
        self.zero.unsupported_modes.extend_from_slice(modes);
    }

    /// Serve the queue until the device closes it and every op in the ring is back.
    pub(crate) fn run(mut self) {
        loop {
            let closing = self.shared.closed.load(Ordering::SeqCst);
            self.take_new(closing);
            self.push(closing);
            if closing && self.table.is_empty() && !self.wake.armed {
                return;
            }
            let entered = match self.poll.as_mut() {
                // Reads and writes in the polled ring: poll the device once and
                // go round again, never blocking on either ring, so new
                // commands and the other ring's completions (a flush) are seen
                // between polls whatever a polled command waits for.
                Some(poll) if self.poll_inflight > 0 => {
                    self.ring.submit().and_then(|_| poll.submit_and_wait(0))
                }
                _ => self.ring.submit_and_wait(1),
            };
            match entered {
                Ok(_) => {}
                // Interrupted, or short of memory or completion-queue room for a
                // moment: reap what is there and go round again.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)
                    ) => {}
                Err(e) => {
                    // The ring itself is broken. Dropping `self` replies `Gone` to every
                    // op and leaks the memory of those the kernel may still hold.
                    tracing::error!(error = %e, "io_uring_enter failed; queue stops");
                    self.shared.close();
                    return;
                }
            }
            self.reap();
        }
    }

    /// Move commands from the channel to `waiting`; when closing, fail them instead.
    /// Bounded: a command holds a queue slot, so at most `queue_depth` are queued.
    fn take_new(&mut self, closing: bool) {
        while let Ok(op) = self.rx.try_recv() {
            self.waiting.push_back(op);
        }
        if closing {
            for op in self.waiting.drain(..) {
                op.finish(Err(DevError::Gone));
            }
        }
    }

    /// Put the eventfd read (unless closing) and as many waiting ops as fit into the
    /// submission queues.
    fn push(&mut self, closing: bool) {
        self.push_wake(closing);
        while let Some(mut op) = self.waiting.pop_front() {
            if let OpKind::Fallocate { mode, .. } = op.kind {
                if self.zero.unsupported_modes.contains(&mode) {
                    self.counters
                        .zero_write_fallbacks
                        .fetch_add(1, Ordering::Relaxed);
                    op.become_zero_write(self.zero.zeroes());
                }
            }
            // Reads and writes go to the polled ring if there is one, which is
            // also the ring whose buffers are registered.
            let polled = self.poll.is_some() && op.memory().is_some();
            if self.ring_for(polled).submission().is_full() {
                self.waiting.push_front(op);
                break;
            }
            let fixed_ring = polled || self.poll.is_none();
            let buf_index = op.memory().filter(|_| fixed_ring).and_then(|(ptr, len)| {
                let ring = self.poll.as_ref().unwrap_or(&self.ring);
                self.fixed.index(ring, ptr, len)
            });
            let key = match self.table.insert(op) {
                Ok(key) => key,
                Err(op) => {
                    self.waiting.push_front(op);
                    break;
                }
            };
            if buf_index.is_some() {
                self.counters
                    .fixed_buffer_ops
                    .fetch_add(1, Ordering::Relaxed);
            }
            let entry = self
                .table
                .get_mut(key)
                .entry(self.fd, buf_index)
                .user_data(key as u64);
            if polled {
                self.poll_inflight += 1;
            }
            let mut sq = self.ring_for(polled).submission();
            // SAFETY: the entry points into memory owned by the op at `key` in the
            // in-flight table. The op stays there, untouched, until this entry's CQE
            // is reaped; the table never frees an op it still holds (on drop it leaks
            // them), and `self._file` keeps the file (registered at index 0) open
            // for the ring's lifetime; a registered buffer is pool memory that
            // `self.fixed` keeps alive.
            unsafe { sq.push(&entry) }.expect("checked the submission queue has room");
        }
    }

    /// The ring an op goes to: the polled one if `polled` (and there is one).
    fn ring_for(&mut self, polled: bool) -> &mut IoUring {
        match &mut self.poll {
            Some(p) if polled => p,
            _ => &mut self.ring,
        }
    }

    /// Put the eventfd read into the main ring, unless closing or already there.
    fn push_wake(&mut self, closing: bool) {
        let mut sq = self.ring.submission();
        if !closing && !self.wake.armed {
            let buf = self
                .wake
                .buf
                .as_mut()
                .expect("the wake buffer lives until drop");
            let entry = opcode::Read::new(
                types::Fd(self.shared.wake_fd.as_raw_fd()),
                buf.as_mut_ptr(),
                8,
            )
            .build()
            .user_data(WAKE);
            // SAFETY: the 8-byte buffer is heap memory owned by `self.wake`, which
            // frees it only if no read of it is armed (it leaks it otherwise), and the
            // eventfd is owned by `self.shared`, which this thread holds.
            if unsafe { sq.push(&entry) }.is_ok() {
                self.wake.armed = true;
            }
        }
    }

    fn reap(&mut self) {
        self.reaped.clear();
        self.reaped.extend(
            self.ring
                .completion()
                .map(|cqe| (cqe.user_data(), cqe.result())),
        );
        if let Some(poll) = self.poll.as_mut() {
            let before = self.reaped.len();
            self.reaped
                .extend(poll.completion().map(|cqe| (cqe.user_data(), cqe.result())));
            self.poll_inflight -= self.reaped.len() - before;
        }
        for i in 0..self.reaped.len() {
            let (user_data, res) = self.reaped[i];
            if user_data == WAKE {
                self.wake.armed = false;
                // Before the next drain of the channel: see `QueueShared::wake_pending`.
                // A swap, not a store: it reads the submitter's `true`, so that
                // submitter's send happens-before the drain that follows.
                self.shared.wake_pending.swap(false, Ordering::SeqCst);
            } else {
                self.complete(user_data as usize, res);
            }
        }
    }

    fn complete(&mut self, key: usize, res: i32) {
        let Some(op) = self.table.get_mut_checked(key) else {
            tracing::error!(key, "completion for an unknown op");
            debug_assert!(false, "completion for an unknown op {key}");
            return;
        };
        match op.on_completion(res, self.block_size) {
            Next::Resubmit => {
                if res >= 0 {
                    self.counters
                        .short_transfer_resubmits
                        .fetch_add(1, Ordering::Relaxed);
                }
                let op = self.table.remove(key);
                self.waiting.push_front(op);
            }
            Next::ZeroFill => {
                let mut op = self.table.remove(key);
                if let OpKind::Fallocate { mode, .. } = op.kind {
                    if !self.zero.unsupported_modes.contains(&mode) {
                        tracing::info!(mode, "fallocate unsupported here; writing zeroes");
                        self.zero.unsupported_modes.push(mode);
                    }
                }
                self.counters
                    .zero_write_fallbacks
                    .fetch_add(1, Ordering::Relaxed);
                op.become_zero_write(self.zero.zeroes());
                self.waiting.push_front(op);
            }
            Next::Finish(result) => self.table.remove(key).finish(result),
        }
    }
}

/// The eventfd read's 8-byte target.
struct WakeRead {
    buf: Option<Box<[u8; 8]>>,
    /// A read of `buf` is in the ring.
    armed: bool,
}

impl Drop for WakeRead {
    fn drop(&mut self) {
        if self.armed {
            // Only after a broken ring or a panic: the kernel may still write here.
            if let Some(buf) = self.buf.take() {
                Box::leak(buf);
            }
        }
    }
}

/// What WriteZeroes and Deallocate fall back to where fallocate is unsupported.
struct ZeroFill {
    /// fallocate modes that returned EOPNOTSUPP once (at most two: zero range and
    /// punch hole); later ops with these modes are written as zeroes directly.
    unsupported_modes: Vec<i32>,
    /// One aligned, zeroed buffer of the maximum transfer, made on first use.
    zeroes: Option<Bytes>,
    max_transfer_bytes: usize,
}

impl ZeroFill {
    fn zeroes(&mut self) -> &Bytes {
        let len = self.max_transfer_bytes;
        self.zeroes.get_or_insert_with(|| {
            BufPool::new(len)
                .alloc(len)
                .expect("a fresh pool sized for one buffer has room for it")
                .freeze()
        })
    }
}

/// Ops whose SQEs are in the ring, by `user_data`. Fixed capacity (the queue depth),
/// so a key is a small index and no allocation happens per op.
struct InFlight {
    slots: Vec<Option<Op>>,
    free: Vec<usize>,
}

impl InFlight {
    fn new(capacity: usize) -> InFlight {
        InFlight {
            slots: (0..capacity).map(|_| None).collect(),
            free: (0..capacity).rev().collect(),
        }
    }

    fn is_empty(&self) -> bool {
        self.free.len() == self.slots.len()
    }

    fn insert(&mut self, op: Op) -> Result<usize, Op> {
        let Some(key) = self.free.pop() else {
            return Err(op);
        };
        debug_assert!(self.slots[key].is_none());
        self.slots[key] = Some(op);
        Ok(key)
    }

    fn get_mut(&mut self, key: usize) -> &mut Op {
        self.get_mut_checked(key).expect("op just inserted")
    }

    fn get_mut_checked(&mut self, key: usize) -> Option<&mut Op> {
        self.slots.get_mut(key).and_then(Option::as_mut)
    }

    fn remove(&mut self, key: usize) -> Op {
        let op = self.slots[key]
            .take()
            .expect("removing an op that is in flight");
        self.free.push(key);
        op
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Empty on a normal exit (the thread waits for every CQE). After a broken ring
        // or a panic, the kernel may still use these ops' memory: leak it.
        for op in self.slots.iter_mut().filter_map(Option::take) {
            op.abandon();
        }
    }
}
