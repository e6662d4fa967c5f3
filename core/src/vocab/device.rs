//! The `BlockDevice` seam: an NVMe-shaped device.
//!
//! Implementations: the simulated SSD (`weir-nvme-sim`), io_uring on a file or block
//! device, SPDK. Buffers are passed by ownership and handed back with the completion
//! (the shape DMA needs: the device owns the memory while the command is in flight).

use crate::buf::Buf;
use crate::ids::Lba;
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::future::Future;

/// Shape and limits of a device namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Logical block size in bytes (512 or 4096).
    pub block_size: u32,
    /// Namespace size in blocks.
    pub capacity_blocks: u64,
    /// Largest transfer of one command, in blocks.
    pub max_transfer_blocks: u32,
    /// The device's optimal I/O boundary in blocks (NVMe's NOIOB; a RAID's
    /// stripe unit): a command that crosses it is served by two parts of the
    /// device at once, so the scheduler splits there. 0 when it has none.
    pub optimal_io_blocks: u32,
    /// Number of I/O queues.
    pub queues: u16,
    /// Depth of each I/O queue.
    pub queue_depth: u16,
}

impl Geometry {
    /// Check that `[lba, lba + blocks)` is a valid, non-empty transfer.
    pub fn check_range(&self, lba: Lba, blocks: u64) -> Result<(), DevError> {
        let end = lba.0.checked_add(blocks).ok_or(DevError::OutOfRange)?;
        if blocks == 0 || end > self.capacity_blocks {
            return Err(DevError::OutOfRange);
        }
        if blocks > u64::from(self.max_transfer_blocks) {
            return Err(DevError::TooLarge);
        }
        Ok(())
    }
}

/// A command submitted to a device queue.
#[derive(Debug)]
pub enum DevCommand {
    /// Read `buf.len() / block_size` blocks at `lba` into `buf`.
    Read {
        /// First block.
        lba: Lba,
        /// Destination, a whole number of blocks long; returned filled.
        buf: Buf,
    },
    /// Write `data` (a whole number of blocks) at `lba`.
    Write {
        /// First block.
        lba: Lba,
        /// The blocks to write.
        data: Bytes,
        /// Force Unit Access: complete only once the data is on media.
        fua: bool,
    },
    /// Write the segments of `data`, one after the other, at `lba` (a
    /// scatter-gather list, as NVMe's SGLs carry one: several writes merged into
    /// one command without copying them together).
    WriteGather {
        /// First block.
        lba: Lba,
        /// The blocks to write, in order; together a whole number of blocks.
        data: Vec<Bytes>,
        /// Force Unit Access: complete only once the data is on media.
        fua: bool,
    },
    /// Persist everything the volatile cache holds.
    Flush,
    /// Write zeroes to `blocks` blocks at `lba`.
    WriteZeroes {
        /// First block.
        lba: Lba,
        /// Number of blocks.
        blocks: u64,
    },
    /// Discard `blocks` blocks at `lba`; they read back as zeroes.
    Deallocate {
        /// First block.
        lba: Lba,
        /// Number of blocks.
        blocks: u64,
    },
}

impl DevCommand {
    /// This command with a gathered write's segments copied into one buffer: for
    /// a device that cannot take a scatter-gather list. Other commands are
    /// returned as they are.
    pub fn into_contiguous(self) -> DevCommand {
        match self {
            DevCommand::WriteGather { lba, data, fua } => {
                let data = match <[Bytes; 1]>::try_from(data) {
                    Ok([one]) => one,
                    Err(data) => Bytes::from(data.concat()),
                };
                DevCommand::Write { lba, data, fua }
            }
            cmd => cmd,
        }
    }
}

/// A successful completion.
#[derive(Debug)]
pub enum DevCompletion {
    /// A read finished; here is the buffer, filled.
    Read(Buf),
    /// Any other command finished.
    Done,
}

/// Why a device command failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum DevError {
    /// Unrecoverable read or write error on the media at this block.
    #[error("media error at {0}")]
    Media(Lba),
    /// The device did not complete the command in time.
    #[error("command timed out")]
    Timeout,
    /// The device is gone (removed, failed, or powered off).
    #[error("device gone")]
    Gone,
    /// The command addresses blocks outside the namespace (or no blocks).
    #[error("LBA range out of bounds")]
    OutOfRange,
    /// The transfer is longer than the device's maximum.
    #[error("transfer larger than the device maximum")]
    TooLarge,
    /// The buffer is not a whole number of blocks.
    #[error("buffer length is not a multiple of the block size")]
    Misaligned,
    /// No such I/O queue.
    #[error("no such queue")]
    BadQueue,
}

/// An NVMe-shaped block device.
///
/// A read completes with [`DevCompletion::Read`] of the very buffer it was
/// given, filled; every other command with [`DevCompletion::Done`]. The
/// scheduler relies on it: the pieces of a split read are pieces of one
/// buffer, joined again when the last completes.
pub trait BlockDevice: Send + Sync + 'static {
    /// The namespace's shape and limits.
    fn geometry(&self) -> Geometry;

    /// Submit `cmd` on I/O queue `queue` and wait for its completion.
    fn submit(
        &self,
        queue: u16,
        cmd: DevCommand,
    ) -> impl Future<Output = Result<DevCompletion, DevError>> + Send;
}
