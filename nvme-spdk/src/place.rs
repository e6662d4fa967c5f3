//! Where a command's memory must be: SPDK's DMA memory. Memory from anywhere
//! else is copied into a bounce buffer, once the command has its queue slot.

use crate::poller::{Counters, Op};
use crate::OpenError;
use bytes::Bytes;
use std::sync::Arc;
use weir_core::buf::{BufPool, BUF_ALIGN, REGION_BYTES_MAX};
use weir_core::device::DevError;
use weir_core::Buf;

/// The device's two DMA pools.
#[derive(Debug)]
pub(crate) struct Placement {
    /// The node's buffers: DMA memory, no copy.
    pub(crate) pool: BufPool,
    /// Bounce buffers: a budget of every queue full of the largest transfers,
    /// reserved at open.
    pub(crate) bounce: BufPool,
    pub(crate) counters: Arc<Counters>,
}

impl Placement {
    /// Put `op`'s memory where SPDK can reach it.
    pub(crate) fn place(&self, op: Op) -> Result<Op, DevError> {
        Ok(match op {
            Op::Read {
                lba,
                blocks,
                buf,
                bounce: None,
            } if !self.in_dma(buf.as_ref()) => {
                self.counters.bounce();
                let bounce = Some(self.bounce_buf(buf.len())?);
                Op::Read {
                    lba,
                    blocks,
                    buf,
                    bounce,
                }
            }
            Op::Write {
                lba,
                blocks,
                data,
                fua,
            } => Op::Write {
                lba,
                blocks,
                data: self.reachable(data)?,
                fua,
            },
            Op::Writev {
                lba,
                blocks,
                segments,
                fua,
            } if !self.scatters(&segments) => {
                // Copied together into one DMA buffer: a plain write.
                self.counters.gather_copy();
                let len = segments.iter().map(Bytes::len).sum();
                let mut buf = self.bounce_buf(len)?;
                let mut at = 0;
                for s in &segments {
                    buf.as_mut()[at..at + s.len()].copy_from_slice(s);
                    at += s.len();
                }
                weir_core::copies::note(len, weir_core::copies::Copy::Other);
                Op::Write {
                    lba,
                    blocks,
                    data: buf.freeze(),
                    fua,
                }
            }
            op => op,
        })
    }

    /// `bytes` lie in DMA memory, dword-aligned (NVMe's PRP rule for a
    /// buffer's start).
    fn in_dma(&self, bytes: &[u8]) -> bool {
        (bytes.as_ptr() as usize).is_multiple_of(4)
            && (self.pool.locate(bytes).is_some() || self.bounce.locate(bytes).is_some())
    }

    /// `data` itself if SPDK can reach it, else a DMA copy of it.
    fn reachable(&self, data: Bytes) -> Result<Bytes, DevError> {
        if self.in_dma(&data) {
            return Ok(data);
        }
        self.counters.bounce();
        let mut buf = self.bounce_buf(data.len())?;
        buf.as_mut().copy_from_slice(&data);
        weir_core::copies::note(data.len(), weir_core::copies::Copy::Other);
        Ok(buf.freeze())
    }

    /// A bounce buffer. The pool's budget covers every queue full of the
    /// largest transfers, but its buddy blocks can be split so that no block
    /// of the size asked is free; then a buffer of its own is taken from
    /// SPDK's memory. Only SPDK's memory running out fails (Gone: the node
    /// cannot use the device safely without it).
    fn bounce_buf(&self, len: usize) -> Result<Buf, DevError> {
        self.bounce
            .alloc(len)
            .or_else(|_| BufPool::with_source(len, Arc::new(crate::env::DmaSource)).alloc(len))
            .map_err(|e| {
                tracing::error!(error = %e, "no DMA memory for a bounce buffer; raise spdk_mem_mb");
                DevError::Gone
            })
    }

    /// The segments can go as one scattered command: each in DMA memory, and
    /// NVMe's PRP rules kept (every segment but the first starts on a page,
    /// every one but the last ends on one; 4 KiB controller pages).
    fn scatters(&self, segments: &[Bytes]) -> bool {
        let last = segments.len().saturating_sub(1);
        segments.iter().enumerate().all(|(i, s)| {
            let (start, end) = (s.as_ptr() as usize, s.as_ptr() as usize + s.len());
            self.in_dma(s)
                && !s.is_empty()
                && (i == 0 || start.is_multiple_of(BUF_ALIGN))
                && (i == last || end.is_multiple_of(BUF_ALIGN))
        })
    }
}

/// Reserve `bytes` of `pool` from its source now, so that a shortfall of
/// SPDK's memory stops the open rather than a command later.
pub(crate) fn reserve(pool: &BufPool, bytes: usize) -> Result<(), OpenError> {
    let chunk = bytes.next_power_of_two().clamp(BUF_ALIGN, REGION_BYTES_MAX);
    let held: Vec<Buf> = std::iter::from_fn(|| pool.alloc(chunk).ok()).collect();
    let got = held.len() * chunk;
    drop(held);
    if got < bytes {
        return Err(OpenError::Dma(bytes));
    }
    Ok(())
}
