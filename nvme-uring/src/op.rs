//! One command on its way through a ring: what it owns, the SQE for what is left of
//! it, and what its completion means.
//!
//! An `Op` owns every byte the kernel may touch (the read `Buf`, the write `Bytes`)
//! from the moment it is sent to the queue thread until its last CQE is reaped, so a
//! caller that drops its future never frees memory under the kernel.

use crate::error::dev_error;
use bytes::Bytes;
use io_uring::{opcode, squeue, types};
use tokio::sync::oneshot;
use tokio::sync::OwnedSemaphorePermit;
use weir_core::buf::Buf;
use weir_core::device::{DevCompletion, DevError};
use weir_core::ids::Lba;

/// How often an op is retried after EINTR or EAGAIN before it fails.
const RETRIES_MAX: u8 = 8;

/// The result a caller awaits.
pub(crate) type OpResult = Result<DevCompletion, DevError>;

/// What the kernel is asked to do.
#[derive(Debug)]
pub(crate) enum OpKind {
    /// Read into `buf` (block-aligned memory, a whole number of blocks).
    Read { buf: Buf },
    /// Write `data` (block-aligned memory: unaligned data was copied before this).
    Write { data: Bytes, fua: bool },
    /// Write the segments of `data` in order: copied into one aligned buffer at
    /// admission (`QueueShared::align`), so it never reaches the ring as such.
    Gather { data: Vec<Bytes>, fua: bool },
    /// fdatasync.
    Flush,
    /// fallocate(`mode`) over `len` bytes: zero range or punch hole.
    Fallocate { len: u64, mode: i32 },
}

/// A command in flight (or waiting for ring space) on one queue.
#[derive(Debug)]
pub(crate) struct Op {
    pub(crate) kind: OpKind,
    /// Byte offset of the command's first byte.
    pub(crate) offset: u64,
    /// Bytes already transferred by earlier (short) completions.
    pub(crate) done: usize,
    retries: u8,
    reply: oneshot::Sender<OpResult>,
    /// The queue slot this op holds; freed when the op is dropped after its last CQE.
    _slot: OwnedSemaphorePermit,
}

/// What to do with an op after one of its completions.
#[derive(Debug)]
pub(crate) enum Next {
    /// Submit it again: the rest of a short transfer, or a retry.
    Resubmit,
    /// fallocate is not supported here: write zeroes instead.
    ZeroFill,
    /// Reply with this.
    Finish(Result<(), DevError>),
}

impl Op {
    pub(crate) fn new(
        kind: OpKind,
        offset: u64,
        reply: oneshot::Sender<OpResult>,
        slot: OwnedSemaphorePermit,
    ) -> Op {
        Op {
            kind,
            offset,
            done: 0,
            retries: 0,
            reply,
            _slot: slot,
        }
    }

    /// The memory a read or write moves, whole: none for the others (so
    /// `Some` for exactly the commands a polled ring takes).
    pub(crate) fn memory(&self) -> Option<(*const u8, usize)> {
        match &self.kind {
            OpKind::Read { buf } => Some((buf.as_ref().as_ptr(), buf.len())),
            OpKind::Write { data, .. } => Some((data.as_ptr(), data.len())),
            _ => None,
        }
    }

    /// Total bytes a read or write moves (0 for the others).
    fn transfer_len(&self) -> usize {
        match &self.kind {
            OpKind::Read { buf } => buf.len(),
            OpKind::Write { data, .. } => data.len(),
            OpKind::Gather { data, .. } => data.iter().map(Bytes::len).sum(),
            OpKind::Flush | OpKind::Fallocate { .. } => 0,
        }
    }

    /// The block the op had reached, for a media error report.
    pub(crate) fn progress_lba(&self, block_size: u32) -> Lba {
        Lba((self.offset + self.done as u64) / u64::from(block_size))
    }

    /// The SQE for what is left of this op. The pointers in it point into memory the
    /// op owns; the caller must keep the op alive, and not touch that memory, until
    /// the entry's CQE is reaped.
    /// `buf_index`: the registered buffer the op's memory lies in, if any
    /// (see [`Op::memory`]).
    pub(crate) fn entry(&mut self, fd: types::Fixed, buf_index: Option<u16>) -> squeue::Entry {
        let offset = self.offset + self.done as u64;
        let done = self.done;
        match &mut self.kind {
            OpKind::Read { buf } => {
                let rest = &mut buf.as_mut()[done..];
                let (ptr, len) = (rest.as_mut_ptr(), len_u32(rest.len()));
                match buf_index {
                    Some(i) => opcode::ReadFixed::new(fd, ptr, len, i)
                        .offset(offset)
                        .build(),
                    None => opcode::Read::new(fd, ptr, len).offset(offset).build(),
                }
            }
            OpKind::Write { data, fua } => {
                let rest = &data[done..];
                let rw_flags = if *fua { libc::RWF_DSYNC } else { 0 };
                let (ptr, len) = (rest.as_ptr(), len_u32(rest.len()));
                match buf_index {
                    Some(i) => opcode::WriteFixed::new(fd, ptr, len, i)
                        .offset(offset)
                        .rw_flags(rw_flags)
                        .build(),
                    None => opcode::Write::new(fd, ptr, len)
                        .offset(offset)
                        .rw_flags(rw_flags)
                        .build(),
                }
            }
            OpKind::Gather { .. } => {
                unreachable!("a gathered write is made one buffer at admission")
            }
            OpKind::Flush => opcode::Fsync::new(fd)
                .flags(types::FsyncFlags::DATASYNC)
                .build(),
            OpKind::Fallocate { len, mode } => opcode::Fallocate::new(fd, *len)
                .offset(offset)
                .mode(*mode)
                .build(),
        }
    }

    /// Account for one CQE with result `res` (bytes moved, or `-errno`).
    pub(crate) fn on_completion(&mut self, res: i32, block_size: u32) -> Next {
        if res < 0 {
            return self.on_error(-res, block_size);
        }
        let total = self.transfer_len();
        if total == 0 {
            return Next::Finish(Ok(()));
        }
        let moved = res as usize;
        if moved == 0 {
            // No progress on a non-empty transfer: the file ended under us (someone
            // truncated it) or the device refuses; never report the buffer as filled.
            tracing::warn!(
                offset = self.offset + self.done as u64,
                "io_uring transfer made no progress; failing the command"
            );
            return Next::Finish(Err(DevError::Media(self.progress_lba(block_size))));
        }
        self.done += moved;
        debug_assert!(self.done <= total, "kernel moved more bytes than asked");
        if self.done < total {
            Next::Resubmit
        } else {
            Next::Finish(Ok(()))
        }
    }

    fn on_error(&mut self, errno: i32, block_size: u32) -> Next {
        match errno {
            libc::EINTR | libc::EAGAIN if self.retries < RETRIES_MAX => {
                self.retries += 1;
                Next::Resubmit
            }
            libc::EOPNOTSUPP if matches!(self.kind, OpKind::Fallocate { .. }) => Next::ZeroFill,
            _ => {
                let lba = self.progress_lba(block_size);
                tracing::warn!(errno, %lba, kind = self.kind_name(), "device command failed");
                Next::Finish(Err(dev_error(errno, lba)))
            }
        }
    }

    /// Turn a fallocate into a plain write of `zeroes` (at least as long as the range).
    pub(crate) fn become_zero_write(&mut self, zeroes: &Bytes) {
        let OpKind::Fallocate { len, .. } = self.kind else {
            unreachable!("only fallocate ops fall back to zero writes");
        };
        let len = usize::try_from(len).expect("fallocate length is bounded by max transfer");
        self.kind = OpKind::Write {
            data: zeroes.slice(..len),
            fua: false,
        };
        self.done = 0;
        self.retries = 0;
    }

    /// Reply to the caller (who may have stopped waiting; then the reply is dropped).
    pub(crate) fn finish(self, result: Result<(), DevError>) {
        let reply = match (result, self.kind) {
            (Ok(()), OpKind::Read { buf }) => Ok(DevCompletion::Read(buf)),
            (Ok(()), _) => Ok(DevCompletion::Done),
            (Err(e), _) => Err(e),
        };
        // A send fails only if the caller dropped its future; the op owned the memory
        // until now, so there is nothing left to protect.
        let _ = self.reply.send(reply);
    }

    /// Give up on an op whose SQE may still be in the kernel: reply `Gone` and leak
    /// the memory, because freeing it could let the kernel write into reused memory.
    /// Only reached when a ring thread stops abnormally.
    pub(crate) fn abandon(self) {
        let Op { kind, reply, .. } = self;
        std::mem::forget(kind);
        let _ = reply.send(Err(DevError::Gone));
    }

    fn kind_name(&self) -> &'static str {
        match self.kind {
            OpKind::Read { .. } => "read",
            OpKind::Write { .. } | OpKind::Gather { .. } => "write",
            OpKind::Flush => "flush",
            OpKind::Fallocate { .. } => "fallocate",
        }
    }
}

/// Transfers are bounded by `max_transfer_bytes` (at most 64 MiB), checked on submit.
fn len_u32(len: usize) -> u32 {
    u32::try_from(len).expect("transfer length is bounded by max_transfer_bytes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::sync::Semaphore;
    use weir_core::buf::BufPool;

    const BS: u32 = 4096;

    fn op(kind: OpKind, offset: u64) -> (Op, oneshot::Receiver<OpResult>) {
        let slot = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        let (reply, done) = oneshot::channel();
        (Op::new(kind, offset, reply, slot), done)
    }

    fn read_op(blocks: usize, lba: u64) -> (Op, oneshot::Receiver<OpResult>) {
        let buf = BufPool::new(1 << 20).alloc(blocks * BS as usize).unwrap();
        op(OpKind::Read { buf }, lba * u64::from(BS))
    }

    #[test]
    fn short_transfers_continue_where_they_stopped() {
        let (mut op, mut done) = read_op(2, 10);
        assert!(matches!(op.on_completion(4096, BS), Next::Resubmit));
        assert_eq!(op.done, 4096);
        assert!(matches!(op.on_completion(1024, BS), Next::Resubmit));
        assert!(matches!(op.on_completion(3072, BS), Next::Finish(Ok(()))));
        op.finish(Ok(()));
        let Ok(Ok(DevCompletion::Read(buf))) = done.try_recv() else {
            panic!("a finished read hands back its buffer");
        };
        assert_eq!(buf.len(), 8192);
    }

    #[test]
    fn failures_name_the_first_block_not_moved() {
        let (mut op, _done) = read_op(4, 10);
        assert!(matches!(op.on_completion(8192, BS), Next::Resubmit));
        let next = op.on_completion(-libc::EIO, BS);
        assert!(
            matches!(next, Next::Finish(Err(DevError::Media(Lba(12))))),
            "{next:?}"
        );
        let (mut op, _done) = read_op(4, 10);
        let next = op.on_completion(0, BS);
        assert!(
            matches!(next, Next::Finish(Err(DevError::Media(Lba(10))))),
            "{next:?}"
        );
    }

    #[test]
    fn interrupted_ops_are_retried_a_bounded_number_of_times() {
        let (mut op, _done) = read_op(1, 0);
        for _ in 0..RETRIES_MAX {
            assert!(matches!(op.on_completion(-libc::EINTR, BS), Next::Resubmit));
        }
        let next = op.on_completion(-libc::EAGAIN, BS);
        assert!(
            matches!(next, Next::Finish(Err(DevError::Media(Lba(0))))),
            "{next:?}"
        );
    }

    #[test]
    fn unsupported_fallocate_becomes_a_zero_write() {
        let kind = OpKind::Fallocate {
            len: 3 * u64::from(BS),
            mode: libc::FALLOC_FL_ZERO_RANGE,
        };
        let (mut op, mut done) = op(kind, 5 * u64::from(BS));
        assert!(matches!(
            op.on_completion(-libc::EOPNOTSUPP, BS),
            Next::ZeroFill
        ));
        op.become_zero_write(&Bytes::from(vec![0; 1 << 20]));
        assert!(matches!(&op.kind, OpKind::Write { data, fua: false } if data.len() == 12288));
        assert!(matches!(op.on_completion(12288, BS), Next::Finish(Ok(()))));
        op.finish(Ok(()));
        assert!(matches!(done.try_recv(), Ok(Ok(DevCompletion::Done))));
    }

    #[test]
    fn a_failed_read_does_not_hand_back_its_buffer() {
        let (op, mut done) = read_op(1, 0);
        op.finish(Err(DevError::Media(Lba(0))));
        assert_eq!(
            done.try_recv().unwrap().unwrap_err(),
            DevError::Media(Lba(0))
        );
    }
}
