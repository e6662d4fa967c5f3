//! The I/O types the engines, the device scheduler and the driver share: a
//! device command in volume blocks ([`IoCmd`]), its id ([`IoId`]), its outcome
//! ([`IoResult`]) and what it is for, as the scheduler ranks it ([`IoClass`]).

use crate::error::WeirError;
use crate::ids::Lba;
use bytes::Bytes;

/// Identifies one device command issued by the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IoId(pub u64);

/// What a device command is for, as the device's scheduler ranks it: a
/// client's request (and everything a client waits on: a replica's write, a
/// repair, a flush, reconciliation's write-backs, which a new primary serves
/// only after) or background work, which waits behind it (see
/// [`crate::sched::IoQueue`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IoClass {
    /// A client waits on it.
    Foreground,
    /// A rebuild's copy: read at the primary, written at the replica.
    Rebuild,
    /// The background scrubber's reads.
    Scrub,
}

impl IoClass {
    /// Whether it is background work.
    pub fn background(self) -> bool {
        self != IoClass::Foreground
    }
}

/// A device command, in volume blocks; the driver maps it to the device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoCmd {
    /// Read `blocks` blocks at `lba`.
    Read {
        /// First block.
        lba: Lba,
        /// Number of blocks.
        blocks: u64,
    },
    /// Write `data` at `lba`.
    Write {
        /// First block.
        lba: Lba,
        /// Whole blocks.
        data: Bytes,
        /// Force unit access.
        fua: bool,
    },
    /// Flush the device's volatile cache.
    Flush,
}

impl IoCmd {
    /// The same command in device blocks, `scale` of them to a volume block of
    /// `block_bytes`.
    pub fn in_device_blocks(self, scale: u64, block_bytes: u64) -> IoCmd {
        match self {
            IoCmd::Read { lba, blocks } => IoCmd::Read {
                lba: Lba(lba.0 * scale),
                blocks: blocks * scale,
            },
            IoCmd::Write { lba, data, fua } => {
                debug_assert!(
                    !data.is_empty() && (data.len() as u64).is_multiple_of(block_bytes),
                    "a device write of {} bytes, not whole blocks",
                    data.len()
                );
                IoCmd::Write {
                    lba: Lba(lba.0 * scale),
                    data,
                    fua,
                }
            }
            IoCmd::Flush => IoCmd::Flush,
        }
    }
}

/// Outcome of an [`IoCmd`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IoResult {
    /// A read's data.
    Read(Bytes),
    /// A write or flush finished.
    Done,
    /// The command failed: a device error, or no buffer to read into (`Busy`).
    Failed(WeirError),
}
