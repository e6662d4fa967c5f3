//! Errors a client or a peer can see. They cross the wire, so they are plain data.

use crate::device::DevError;
use crate::ids::{Epoch, Lba, NodeId, VolumeId};
use serde::{Deserialize, Serialize};

/// An error returned for a client or replication request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum WeirError {
    /// The named volume does not exist in the cluster map.
    #[error("unknown volume {0}")]
    UnknownVolume(VolumeId),
    /// The request reaches past the end of the volume.
    #[error("{lba} + {blocks} blocks is past the end of the volume ({capacity} blocks)")]
    OutOfRange {
        /// First block of the request.
        lba: Lba,
        /// Length of the request in blocks.
        blocks: u64,
        /// Volume size in blocks.
        capacity: u64,
    },
    /// The payload length is not a whole, non-zero number of blocks within limits.
    #[error("bad length {len} bytes (block size {block_size}, max {max_bytes})")]
    BadLength {
        /// The length received.
        len: u64,
        /// The volume's block size.
        block_size: u32,
        /// The largest request accepted.
        max_bytes: u32,
    },
    /// The request spans two extents; clients split requests at extent boundaries.
    #[error("request crosses an extent boundary")]
    CrossesExtent,
    /// The receiving node is not the primary of the extent.
    #[error("{0} is not the primary of this extent")]
    NotPrimary(NodeId),
    /// The sender's map epoch is older than the receiver's.
    #[error("stale epoch {got}, current is {current}")]
    StaleEpoch {
        /// Epoch carried by the message.
        got: Epoch,
        /// Receiver's epoch of the extent.
        current: Epoch,
    },
    /// A replica was asked to write an older version over a newer one.
    #[error("version regression on a replica")]
    VersionRegression,
    /// A device failed the command.
    #[error("device error: {0}")]
    Device(DevError),
    /// A peer could not be reached.
    #[error("{0} is unreachable")]
    Unreachable(NodeId),
    /// The node has too many requests in flight.
    #[error("node busy")]
    Busy,
    /// The node is the extent's primary but may not serve it now: it holds no lease
    /// from the control plane, or the previous primary's lease has not run out.
    #[error("{0} holds no lease on this extent right now")]
    NoLease(NodeId),
    /// A replica write sent without its payload, to the node whose own front end
    /// sent the write (see [`crate::front_end`]), found no payload held there: the
    /// primary sends it again with its data.
    #[error("the replica write's payload is not held by its front end")]
    PayloadNotHeld,
}
