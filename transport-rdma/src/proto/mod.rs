//! The messenger over one reliable-connected queue pair, sans-IO.
//!
//! A [`Conn`] is the one owner of a connection's state: the credits it may spend
//! on the peer's receive slots, the regions the peer granted it, its send queue,
//! and its own receive slots and granted regions. The caller (the verbs backend,
//! or the simulator's) posts what [`Conn::poll_post`] hands out and feeds every
//! completion to [`Conn::complete`]; the connection never waits and never touches
//! a device.
//!
//! How a frame travels:
//!
//! - A frame that fits a receive slot goes by SEND, behind a small [`header`]
//!   that returns credits and grants; a tiny one inline.
//! - A larger frame goes by RDMA WRITE_WITH_IMM into a region the receiver
//!   granted, the immediate naming the region. Writes into granted regions rather
//!   than RDMA READs of the sender's memory: the data path costs one operation
//!   and no round trip (grants are handed out ahead, in headers), the receiver
//!   decides how much of its memory a peer may fill, and no sender ever exposes
//!   its pool to remote reads. Only the granted regions are remotely writable.
//! - Every message, SEND or WRITE_WITH_IMM, consumes one posted receive at the
//!   peer, so every message spends one credit. A sender keeps its last credit for
//!   an explicit credit update, so two peers that both ran out can always return
//!   each other's credits: with credits there is no receiver-not-ready in normal
//!   operation, and a peer that sends without one is disconnected.
//! - Completions are signalled selectively: RC completes in order, so one
//!   signalled completion frees every send posted before it.
//!
//! Anything a peer sends that breaks these rules (a header that does not parse,
//! more credits back than were spent, a grant of a region that does not exist or
//! is already held, a write into a region not granted, a message without a
//! credit) fails that connection with a [`ProtoError`] and touches nothing else.
//! The caller then destroys the queue pair and, after [`Backoff`], connects
//! again with a fresh one; frames in flight are lost, as weir-core's `Transport`
//! contract allows.

mod backoff;
mod conn;
pub mod header;

pub use backoff::Backoff;
pub use conn::{Completion, Conn, Incoming, Op, Post, SendWr};

use weir_core::wire::{HEADER_BYTES, MAX_BODY_BYTES};

/// The largest frame weir's wire format produces.
pub const MAX_FRAME_BYTES: usize = HEADER_BYTES + MAX_BODY_BYTES;

/// Most receive slots a connection may ask its peer to respect.
pub const MAX_RECV_SLOTS: u16 = 4096;

/// Most granted regions a connection may have (the header names at most this many
/// at once).
pub const MAX_LARGE_SLOTS: u16 = 64;

/// One side's shape of a connection, exchanged at connection set-up: the peer
/// sends by the receiver's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Receive work requests kept posted: the credits the peer starts with.
    pub recv_slots: u16,
    /// Bytes of one receive slot: the largest SEND (header and frame).
    pub slot_bytes: u32,
    /// Regions granted for frames that do not fit a slot.
    pub large_slots: u16,
    /// Bytes of one granted region: the largest frame.
    pub large_bytes: u32,
}

impl Default for Params {
    /// 64 slots of 8 KiB (a 4 KiB block's frame and its header fit one) and 8
    /// regions of the largest frame: 8.5 MiB of receive memory per connection.
    fn default() -> Self {
        Params {
            recv_slots: 64,
            slot_bytes: 8192,
            large_slots: 8,
            large_bytes: MAX_FRAME_BYTES as u32,
        }
    }
}

impl Params {
    /// The credit updates' threshold: returned credits wait for a message that
    /// carries them until this many have gathered (half the slots, so an update
    /// never answers an update).
    pub fn credit_threshold(&self) -> u16 {
        self.recv_slots / 2
    }

    /// Check a shape, ours or a peer's: a bad one is refused at set-up.
    pub fn validate(&self) -> Result<(), ProtoError> {
        let bad = |why: &'static str| Err(ProtoError::BadParams(why));
        if !(4..=MAX_RECV_SLOTS).contains(&self.recv_slots) {
            return bad("recv_slots must be between 4 and 4096");
        }
        if self.large_slots == 0 || self.large_slots > MAX_LARGE_SLOTS {
            return bad("large_slots must be between 1 and 64");
        }
        if (self.slot_bytes as usize) < header::max_len(self.large_slots) + HEADER_BYTES {
            return bad("slot_bytes must hold a header and a frame header");
        }
        if self.large_bytes < self.slot_bytes || self.large_bytes as usize > MAX_FRAME_BYTES {
            return bad("large_bytes must be between slot_bytes and the largest frame");
        }
        Ok(())
    }
}

/// The local side's settings beyond its [`Params`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// What this side receives with.
    pub params: Params,
    /// Send work requests outstanding at most (the send queue's depth).
    pub send_queue: u16,
    /// Every this many send work requests one is signalled (and the last before
    /// the queue goes idle, so nothing stays held).
    pub signal_every: u16,
    /// Sends of at most this many bytes go inline (copied into the work request
    /// by the NIC, so nothing is held): what the device granted at queue-pair
    /// creation, 0 for none.
    pub max_inline: u32,
    /// Bytes of frames waiting for a credit or a grant, at most; a queue that is
    /// empty takes any frame.
    pub queue_bytes: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            params: Params::default(),
            send_queue: 256,
            signal_every: 16,
            max_inline: 0,
            queue_bytes: 8 << 20,
        }
    }
}

impl Config {
    /// Check the settings.
    pub fn validate(&self) -> Result<(), ProtoError> {
        self.params.validate()?;
        if self.send_queue < 2 {
            return Err(ProtoError::BadParams("send_queue must be at least 2"));
        }
        if self.signal_every == 0 || self.signal_every > self.send_queue {
            return Err(ProtoError::BadParams(
                "signal_every must be between 1 and send_queue",
            ));
        }
        Ok(())
    }
}

/// Why a connection failed. Each fails that connection only.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// A shape refused at set-up.
    #[error("bad connection parameters: {0}")]
    BadParams(&'static str),
    /// A message's header does not parse.
    #[error("malformed message header: {0}")]
    BadHeader(&'static str),
    /// The frame behind a header, or in a region, does not parse.
    #[error("malformed frame: {0}")]
    BadFrame(weir_core::wire::DecodeError),
    /// The peer returned more credits than this side spent.
    #[error("peer returned {returned} credits in all for {spent} messages sent")]
    ExcessCredits {
        /// Credits returned so far, with this message's.
        returned: u64,
        /// Messages this side sent.
        spent: u64,
    },
    /// The peer sent a message without a credit for it (or spent the credit it
    /// must keep for updates on a frame).
    #[error("peer sent without a credit")]
    NoCredit,
    /// The peer granted a region that does not exist or that this side holds.
    #[error("peer granted region {0}, which does not exist or is held already")]
    BadGrant(u16),
    /// The peer wrote with an immediate naming a region it was not granted.
    #[error("peer wrote into region {0}, which it was not granted")]
    NotGranted(u32),
    /// The peer wrote more than a region holds, or nothing.
    #[error("peer wrote {0} bytes into a region")]
    BadLength(u32),
    /// A work request completed in error (or was flushed): the queue pair is in
    /// the error state.
    #[error("work request {0} completed in error")]
    Completion(u64),
    /// The connection failed before.
    #[error("the connection failed")]
    Dead,
}

#[cfg(test)]
mod tests;
