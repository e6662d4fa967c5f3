//! The submitting side of one queue: admission (at most `queue_depth` commands in
//! the queue at once), the unaligned-write copy, the hand-off to the queue's thread
//! and the wake-up through its eventfd.

use crate::op::{Op, OpKind, OpResult};
use bytes::Bytes;
use std::fs::File;
use std::io::Write;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use tokio::sync::{oneshot, Semaphore};
use weir_core::buf::{BufPool, BUF_ALIGN};
use weir_core::device::DevError;

/// Counters shared by all queues of a device.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) unaligned_write_copies: AtomicU64,
    pub(crate) gather_copies: AtomicU64,
    pub(crate) short_transfer_resubmits: AtomicU64,
    pub(crate) zero_write_fallbacks: AtomicU64,
    pub(crate) fixed_buffer_ops: AtomicU64,
}

/// State one queue's submitters and its thread share.
#[derive(Debug)]
pub(crate) struct QueueShared {
    tx: mpsc::Sender<Op>,
    /// Written by submitters to wake the thread, which always keeps a read of it in
    /// its ring.
    pub(crate) wake_fd: File,
    /// A wake-up is already on its way: later submitters need not write the eventfd.
    /// The thread clears it when the eventfd read completes, before it drains the
    /// channel, so no submission can slip between a drain and a missing wake-up.
    pub(crate) wake_pending: AtomicBool,
    /// Set when the device is dropped (or the ring failed): no new commands.
    pub(crate) closed: AtomicBool,
    /// One permit per command in the queue (waiting in the channel or in the ring):
    /// `queue_depth` bounds the channel, the in-flight table and the copies below.
    slots: Arc<Semaphore>,
    /// Aligned bounce buffers for writes whose data is not block-aligned in memory.
    /// Its budget covers a full queue of maximum-size copies, so it never runs out.
    copy_pool: BufPool,
    counters: Arc<Counters>,
}

impl QueueShared {
    /// A queue and the receiving end its thread drains.
    pub(crate) fn new(
        queue_depth: u16,
        max_transfer_bytes: u32,
        counters: Arc<Counters>,
    ) -> std::io::Result<(Arc<QueueShared>, mpsc::Receiver<Op>)> {
        let (tx, rx) = mpsc::channel();
        let shared = QueueShared {
            tx,
            wake_fd: new_eventfd()?,
            wake_pending: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            slots: Arc::new(Semaphore::new(usize::from(queue_depth))),
            // A buffer takes a power-of-two block: a full queue of the largest
            // copies fits the budget whatever the transfer size.
            copy_pool: BufPool::new(
                usize::from(queue_depth) * (max_transfer_bytes as usize).next_power_of_two(),
            ),
            counters,
        };
        Ok((Arc::new(shared), rx))
    }

    /// Run `kind` at byte `offset` on this queue and wait for its completion.
    pub(crate) async fn run(self: Arc<Self>, kind: OpKind, offset: u64) -> OpResult {
        if self.closed.load(Ordering::SeqCst) {
            return Err(DevError::Gone);
        }
        // Closed (with the queue) when the device is dropped.
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| DevError::Gone)?;
        let kind = self.align(kind);
        let (reply, done) = oneshot::channel();
        self.tx
            .send(Op::new(kind, offset, reply, slot))
            .map_err(|_| DevError::Gone)?;
        self.wake();
        // The thread drops an op's reply without sending only when it is gone.
        done.await.map_err(|_| DevError::Gone)?
    }

    /// O_DIRECT needs the memory of a transfer aligned, and `Bytes` from a caller can
    /// start anywhere (a slice of a larger frame, say). Copy such data into an aligned
    /// buffer. `Buf`-backed data is always aligned, so on weir's data path (pool ->
    /// wire -> device) this copy does not happen; the counter shows if it does.
    fn align(&self, kind: OpKind) -> OpKind {
        match kind {
            OpKind::Write { data, fua } if !(data.as_ptr() as usize).is_multiple_of(BUF_ALIGN) => {
                self.counters
                    .unaligned_write_copies
                    .fetch_add(1, Ordering::Relaxed);
                let mut buf = self
                    .copy_pool
                    .alloc(data.len())
                    .expect("copy pool budget covers queue_depth maximum transfers");
                buf.as_mut().copy_from_slice(&data);
                weir_core::copies::note(data.len(), weir_core::copies::Copy::Other);
                OpKind::Write {
                    data: buf.freeze(),
                    fua,
                }
            }
            OpKind::Gather { data, fua } => {
                // Merged writes: io_uring's vectored write would take the list
                // as it is, but O_DIRECT needs every segment aligned and a
                // short transfer's rest found inside the list; one copy into an
                // aligned buffer keeps the op a plain write. Counted.
                let len = data.iter().map(Bytes::len).sum();
                self.counters.gather_copies.fetch_add(1, Ordering::Relaxed);
                let mut buf = self
                    .copy_pool
                    .alloc(len)
                    .expect("copy pool budget covers queue_depth maximum transfers");
                let mut at = 0;
                for segment in &data {
                    buf.as_mut()[at..at + segment.len()].copy_from_slice(segment);
                    at += segment.len();
                }
                weir_core::copies::note(len, weir_core::copies::Copy::Other);
                OpKind::Write {
                    data: buf.freeze(),
                    fua,
                }
            }
            other => other,
        }
    }

    fn wake(&self) {
        if !self.wake_pending.swap(true, Ordering::SeqCst) {
            self.signal();
        }
    }

    /// Add one to the eventfd, completing the thread's read of it.
    pub(crate) fn signal(&self) {
        if let Err(e) = (&self.wake_fd).write_all(&1u64.to_ne_bytes()) {
            // Cannot happen short of 2^64 - 1 unread wake-ups; the thread would then
            // still find the command at its next completion.
            tracing::error!(error = %e, "eventfd write failed");
        }
    }

    /// Stop taking commands: later and waiting submitters get `Gone`.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.slots.close();
    }
}

fn new_eventfd() -> std::io::Result<File> {
    // SAFETY: eventfd takes no pointers; a negative return is an error, checked below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by eventfd, is open, and nothing else owns it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Ok(File::from(owned))
}
