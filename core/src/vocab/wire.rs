//! The wire protocol: every message between nodes, and between clients and nodes.
//!
//! A frame is a 12-byte header, a control part and a payload:
//!
//! ```text
//! 0      2         3          4               8               12
//! | "WR" | version | reserved | control_len LE | payload_len LE | control | payload |
//! ```
//!
//! The control part is the postcard-encoded [`Message`] without its data; the
//! payload is the data of the messages that carry blocks (a write, a read's answer,
//! a forwarded write, a rebuild copy, fetched blocks), raw. A [`Frame`] keeps the
//! two apart: a sender writes the header and control part and then the payload's
//! own memory (a vectored send), and a receiver's [`Message::decode`] slices the
//! payload out of what it received. Encoding and decoding never copy a payload.
//!
//! Decoding checks the magic, the version, that `control_len + payload_len` is at
//! most [`MAX_BODY_BYTES`] and the lengths equal the bytes present, that the
//! control part decodes to exactly one message with nothing left over, and that a
//! payload comes only with a message that carries one. Every length inside the
//! control part is checked against the bytes remaining before anything is
//! allocated, so hostile input costs at most its own size in memory and yields a
//! [`DecodeError`], never a panic.
//!
//! Versioning rule: bump [`WIRE_VERSION`] whenever a change alters the bytes of any
//! existing message (a new field, a reordered or removed variant). Appending a new
//! variant at the end of [`Message`] does not need a bump: old peers reject it with
//! [`DecodeError::Body`]. A new control-plane command or refusal does: Raft
//! carries commands inside its own messages, and a member that cannot decode
//! one would skip it and hold another map than the rest (11: `Resize`,
//! `MapFull`, `NoShrink`).

use crate::error::WeirError;
use crate::ids::{Epoch, ExtentId, Lba, NodeId, OpId, RequestId, Version, VolumeId};
use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// The two magic bytes that open every frame.
pub const MAGIC: [u8; 2] = *b"WR";
/// Current version of the frame and message encoding.
pub const WIRE_VERSION: u8 = 11;
/// Frame header length in bytes.
pub const HEADER_BYTES: usize = 12;
/// Largest body accepted: a 1 MiB data payload plus room for the message fields.
pub const MAX_BODY_BYTES: usize = (1 << 20) + 256;
/// The longest bound a client may be given on a request's retries, a
/// contract between clients and primaries: nodes keep a write's record for
/// its retries (so a retry of one already overwritten is not applied again;
/// see the replication engine's applied log) no longer than a little past
/// this, which is why there is no "wait for ever". The log's count bound
/// (65,536 records) may drop a record sooner at a high write rate: a gap
/// docs/replication.md states.
pub const REQUEST_TIMEOUT_MAX: std::time::Duration = std::time::Duration::from_secs(600);

/// Every message weir sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// Client -> primary: read `blocks` blocks at `lba`.
    Read {
        /// Client request id, echoed in the reply.
        req: RequestId,
        /// Volume to read.
        volume: VolumeId,
        /// Client's map epoch of the extent.
        epoch: Epoch,
        /// First block.
        lba: Lba,
        /// Number of blocks.
        blocks: u32,
        /// dmClock's delta: 1 plus the volume's requests this client completed at
        /// other primaries since its last one to this primary.
        delta: u32,
    },
    /// Client -> primary: write `data` at `lba`.
    Write {
        /// Client request id, echoed in the reply.
        req: RequestId,
        /// Volume to write.
        volume: VolumeId,
        /// Client's map epoch of the extent.
        epoch: Epoch,
        /// First block.
        lba: Lba,
        /// Whole blocks of data (the frame's payload).
        #[serde(skip)]
        data: Bytes,
        /// Force unit access on every replica.
        fua: bool,
        /// dmClock's delta (as for a read).
        delta: u32,
    },
    /// Client -> any node: flush every replica of the volume.
    Flush {
        /// Client request id, echoed in the reply.
        req: RequestId,
        /// Volume to flush.
        volume: VolumeId,
    },
    /// Checker -> any replica: read this replica's own copy, bypassing the primary.
    /// Used to verify that every replica holds every acknowledged write.
    ScrubRead {
        /// Client request id, echoed in the reply.
        req: RequestId,
        /// Volume to read.
        volume: VolumeId,
        /// First block.
        lba: Lba,
        /// Number of blocks.
        blocks: u32,
    },
    /// Node -> client: the data read.
    ReadOk {
        /// The request answered.
        req: RequestId,
        /// The blocks read (the frame's payload).
        #[serde(skip)]
        data: Bytes,
    },
    /// Node -> client: the write is on every in-sync replica.
    WriteOk {
        /// The request answered.
        req: RequestId,
    },
    /// Node -> client: every replica has flushed.
    FlushOk {
        /// The request answered.
        req: RequestId,
    },
    /// Node -> client: the request failed.
    Failed {
        /// The request answered.
        req: RequestId,
        /// Why.
        error: WeirError,
    },
    /// Primary -> replica: apply this write.
    ReplicaWrite {
        /// Primary's operation id, echoed in the ack.
        op: OpId,
        /// Extent written.
        extent: ExtentId,
        /// Primary's epoch of the extent.
        epoch: Epoch,
        /// Version the primary gave this write.
        version: Version,
        /// The primary's versions of the first and last version grains the write
        /// touches, before it: a replica holding other versions there missed a
        /// write (see [`crate::replication::grains`]).
        prev: (Version, Version),
        /// Every write of this extent up to this version has been acknowledged to
        /// its client (or failed): a replica forgets those in its uncertain tail.
        settled: Version,
        /// The client's request this write serves (a retry of a write reuses its
        /// request id; a replica that becomes primary recognises it).
        origin: (NodeId, RequestId),
        /// First block.
        lba: Lba,
        /// Whole blocks of data (the frame's payload). Empty when sent to the
        /// node whose own front end is `origin`'s client: that node takes the
        /// data from its front end (see [`crate::front_end`]).
        #[serde(skip)]
        data: Bytes,
        /// Force unit access.
        fua: bool,
    },
    /// Replica -> primary: outcome of a `ReplicaWrite`.
    ReplicaWriteAck {
        /// The operation acknowledged.
        op: OpId,
        /// Ok once the data is on the replica's device.
        result: Result<(), WeirError>,
    },
    /// Coordinator -> replica: flush the device.
    ReplicaFlush {
        /// Coordinator's operation id, echoed in the ack.
        op: OpId,
    },
    /// Replica -> coordinator: outcome of a `ReplicaFlush`.
    ReplicaFlushAck {
        /// The operation acknowledged.
        op: OpId,
        /// Ok once the device flushed.
        result: Result<(), WeirError>,
    },
    /// Node <-> node: a control-plane Raft message (raft-rs protobuf encoding).
    Raft {
        /// The encoded Raft message.
        bytes: Bytes,
    },
    /// Node -> Raft leader: still alive. Stamped with the sender's cluster clock.
    Heartbeat {
        /// When it was sent (ns, cluster clock).
        sent_ns: u64,
        /// Index of the last control-plane log entry the sender applied.
        applied: u64,
        /// False while the sender's device is stalled or gone: it takes part in
        /// the control plane but must not serve (no lease), and is declared down.
        healthy: bool,
    },
    /// Client -> any node: send me the current cluster map.
    GetMap {
        /// Client request id, echoed in the reply.
        req: RequestId,
    },
    /// Node -> client: the cluster map (a postcard-encoded control-plane state).
    MapState {
        /// The request answered.
        req: RequestId,
        /// The encoded state.
        state: Bytes,
    },
    /// Node -> Raft leader: please propose this control-plane command
    /// (postcard-encoded `control::Command`).
    Propose {
        /// The encoded command.
        command: Bytes,
    },
    /// Raft leader -> node: your heartbeat of `sent_ns` arrived; you hold a lease
    /// until `lease_until_ns` (cluster clock).
    HeartbeatAck {
        /// The heartbeat answered.
        sent_ns: u64,
        /// End of the lease granted.
        lease_until_ns: u64,
    },
    /// Primary -> rebuilding replica: the primary's copy of `[lba, lba + n)`, with
    /// each block's version; the replica keeps each block it holds an older
    /// version of.
    RebuildWrite {
        /// Operation id at the primary, echoed in the ack.
        op: OpId,
        /// The blocks and their versions.
        copy: RebuildCopy,
    },
    /// Rebuilding replica -> primary: the copy is on the device (and no older
    /// write to those blocks is still in flight there).
    RebuildAck {
        /// Operation acknowledged.
        op: OpId,
        /// Ok once persisted.
        result: Result<(), WeirError>,
    },
    /// A node whose device could not read `[lba, lba + blocks)` (a media error)
    /// asks a peer for those blocks: a primary asks an in-sync replica, an in-sync
    /// replica asks its primary (see the engine's `repair`).
    FetchBlocks {
        /// The asker's operation id, echoed in the answer.
        op: OpId,
        /// Extent read.
        extent: ExtentId,
        /// The asker's epoch of the extent.
        epoch: Epoch,
        /// First block.
        lba: Lba,
        /// Number of blocks.
        blocks: u32,
    },
    /// The blocks a `FetchBlocks` asked for, or why not.
    FetchBlocksOk {
        /// The operation answered.
        op: OpId,
        /// Ok with the blocks in `data`, or why not.
        result: Result<(), WeirError>,
        /// The blocks (the frame's payload).
        #[serde(skip)]
        data: Bytes,
    },
    /// Primary -> rebuilding replica, before a rebuild chunk is read: the versions
    /// the primary holds of a run of blocks (`copy.data` is empty). The replica
    /// answers which part of the run it lacks, so one that was away briefly is sent
    /// only what changed meanwhile.
    RebuildProbe {
        /// Operation id at the primary, echoed in the answer.
        op: OpId,
        /// The run and its versions, no data.
        copy: RebuildCopy,
    },
    /// The part of a probed run the replica lacks: blocks `[lba + from, lba + to)`
    /// of it, empty (`from == to`) if it holds every block at the primary's version
    /// or newer. Sent once no older write to the run is still in flight there.
    RebuildProbeOk {
        /// The operation answered.
        op: OpId,
        /// `(from, to)`, offsets in the run, or why not.
        result: Result<(u32, u32), WeirError>,
    },
    /// Replica -> an extent's new primary, when the replica sees it take over:
    /// the blocks of writes it took from earlier primaries that may not have been
    /// acknowledged (its uncertain tail). The new primary makes every copy of those
    /// blocks agree with its own before it serves.
    ReconcileTail {
        /// The extent.
        extent: ExtentId,
        /// The epoch at which the new primary's reign began (`primary_since`).
        reign: Epoch,
        /// Runs of blocks: (first block, blocks).
        blocks: Vec<(Lba, u32)>,
    },
}

/// A run of blocks a primary copies to a rebuilding replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebuildCopy {
    /// Extent being rebuilt.
    pub extent: ExtentId,
    /// Primary's map epoch of the extent.
    pub epoch: Epoch,
    /// First block.
    pub lba: Lba,
    /// Version of each version grain of the run, from `lba` (0: never written).
    pub versions: Vec<Version>,
    /// The blocks (the frame's payload; empty in a probe).
    #[serde(skip)]
    pub data: Bytes,
}

/// Why a frame could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Fewer bytes than a frame header.
    #[error("frame shorter than its {HEADER_BYTES}-byte header")]
    Truncated,
    /// The frame does not start with [`MAGIC`].
    #[error("bad magic {0:02x?}")]
    BadMagic([u8; 2]),
    /// The frame was encoded with another protocol version.
    #[error("unsupported wire version {0} (this build speaks {WIRE_VERSION})")]
    Version(u8),
    /// The header announces a body larger than [`MAX_BODY_BYTES`].
    #[error("body of {0} bytes exceeds the maximum")]
    TooLarge(u32),
    /// The header's body length disagrees with the bytes present.
    #[error("header says {declared} body bytes, frame has {actual}")]
    LengthMismatch {
        /// Body length in the header.
        declared: u32,
        /// Body bytes actually present.
        actual: usize,
    },
    /// The body is not a valid message.
    #[error("malformed body: {0}")]
    Body(postcard::Error),
    /// The body decoded but left bytes over.
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    /// The header's reserved byte (its fourth) is not 0: not a weir message,
    /// though framed as one (the simulator's client hosts mark theirs so).
    #[error("reserved header byte {0:#04x} is not 0")]
    Reserved(u8),
}

/// Why a message could not be encoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The encoded body would exceed [`MAX_BODY_BYTES`].
    #[error("message body of {0} bytes exceeds the maximum")]
    TooLarge(usize),
    /// Serialization failed.
    #[error("encoding failed: {0}")]
    Body(postcard::Error),
}

/// An encoded message: the header and control part, and the payload as a
/// segment of its own, so a transport sends the payload's memory as it is (a
/// vectored write, an RDMA scatter-gather entry) and never copies it.
///
/// Or a message handed over in this process, not encoded at all
/// ([`Frame::in_process`]): only a transport whose peer lives in the same
/// process makes one ([`crate::Transport::frame`]), and only for that peer, so
/// none reaches a wire.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// The header and the control part.
    pub head: Bytes,
    /// The payload (empty for messages without data).
    pub payload: Bytes,
    /// The message itself, where it is handed over in process (`head` and
    /// `payload` are then empty).
    pub local: Option<Box<Message>>,
}

impl From<Vec<u8>> for Frame {
    /// Opaque bytes as a frame's head (for transports' tests).
    fn from(bytes: Vec<u8>) -> Frame {
        Frame {
            head: Bytes::from(bytes),
            ..Frame::default()
        }
    }
}

impl Frame {
    /// `msg` handed over as it is, to a peer in this process: no encoding, and
    /// [`Message::decode`] gives it back without parsing.
    pub fn in_process(msg: Message) -> Frame {
        Frame {
            local: Some(Box::new(msg)),
            ..Frame::default()
        }
    }

    /// Bytes on the wire (of a frame handed over in process: its header's and
    /// payload's, as if encoded, for the bounds that count bytes).
    pub fn len(&self) -> usize {
        let local = self
            .local
            .as_ref()
            .map_or(0, |m| HEADER_BYTES + m.payload().map_or(0, Bytes::len));
        self.head.len() + self.payload.len() + local
    }

    /// Whether the frame holds no bytes at all (never true of an encoded one).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A frame received in one piece: its payload is sliced out of it (no copy).
    /// Fails if the header is bad or the lengths disagree with the bytes present.
    pub fn parse(bytes: Bytes) -> Result<Frame, DecodeError> {
        let Some(header) = bytes.first_chunk::<HEADER_BYTES>() else {
            return Err(DecodeError::Truncated);
        };
        let (control, payload) = Message::frame_lens(header)?;
        let declared = control + payload;
        if declared != bytes.len() - HEADER_BYTES {
            return Err(DecodeError::LengthMismatch {
                declared: declared as u32,
                actual: bytes.len() - HEADER_BYTES,
            });
        }
        let split = HEADER_BYTES + control;
        let frame = Frame {
            head: bytes.slice(..split),
            payload: bytes.slice(split..),
            local: None,
        };
        debug_assert_eq!(
            frame.payload.len(),
            payload,
            "the payload is what the header says"
        );
        Ok(frame)
    }

    /// The frame in one piece. This copies the payload (counted in
    /// [`crate::copies`]); transports send the two segments instead.
    pub fn to_contiguous(&self) -> Bytes {
        debug_assert!(
            self.local.is_none(),
            "a frame handed over in process made contiguous"
        );
        if self.payload.is_empty() {
            return self.head.clone();
        }
        crate::copies::note(self.payload.len(), crate::copies::Copy::Other);
        let mut out = BytesMut::with_capacity(self.len());
        out.put_slice(&self.head);
        out.put_slice(&self.payload);
        debug_assert_eq!(out.len(), self.len());
        out.freeze()
    }
}

/// The `data` of a message that carries a payload, borrowed as `$msg` is.
macro_rules! payload_slot {
    ($msg:expr) => {
        match $msg {
            Message::Write { data, .. }
            | Message::ReadOk { data, .. }
            | Message::ReplicaWrite { data, .. }
            | Message::FetchBlocksOk { data, .. }
            | Message::RebuildWrite {
                copy: RebuildCopy { data, .. },
                ..
            }
            | Message::RebuildProbe {
                copy: RebuildCopy { data, .. },
                ..
            } => Some(data),
            _ => None,
        }
    };
}

impl Message {
    /// The data this message carries as its frame's payload, if it is of a kind
    /// that carries some.
    pub fn payload(&self) -> Option<&Bytes> {
        payload_slot!(self)
    }

    fn payload_mut(&mut self) -> Option<&mut Bytes> {
        payload_slot!(self)
    }

    /// A `FetchBlocksOk` for `op` answering with `result`'s blocks or error.
    pub fn fetched(op: OpId, result: Result<Bytes, WeirError>) -> Message {
        let (result, data) = match result {
            Ok(data) => (Ok(()), data),
            Err(e) => (Err(e), Bytes::new()),
        };
        Message::FetchBlocksOk { op, result, data }
    }

    /// Encode into a frame: the payload is shared, not copied.
    pub fn encode(&self) -> Result<Frame, EncodeError> {
        let control = postcard::to_allocvec(self).map_err(EncodeError::Body)?;
        let payload = self.payload().cloned().unwrap_or_default();
        let body = control.len() + payload.len();
        if body > MAX_BODY_BYTES {
            return Err(EncodeError::TooLarge(body));
        }
        let mut head = BytesMut::with_capacity(HEADER_BYTES + control.len());
        head.put_slice(&MAGIC);
        head.put_u8(WIRE_VERSION);
        head.put_u8(0);
        head.put_u32_le(control.len() as u32);
        head.put_u32_le(payload.len() as u32);
        head.put_slice(&control);
        let frame = Frame {
            head: head.freeze(),
            payload,
            local: None,
        };
        // The header written reads back as these lengths.
        debug_assert_eq!(
            frame.head.first_chunk().map(Message::frame_lens),
            Some(Ok((control.len(), frame.payload.len())))
        );
        Ok(frame)
    }

    /// Decode a frame; a payload is the frame's own memory, sliced, not copied.
    /// A frame handed over in process gives its message back as it is.
    pub fn decode(frame: Frame) -> Result<Message, DecodeError> {
        if let Some(msg) = frame.local {
            return Ok(*msg);
        }
        let Some((header, control)) = frame.head.split_first_chunk::<HEADER_BYTES>() else {
            return Err(DecodeError::Truncated);
        };
        let (control_len, payload_len) = Self::frame_lens(header)?;
        if header[3] != 0 {
            return Err(DecodeError::Reserved(header[3]));
        }
        if control_len != control.len() || payload_len != frame.payload.len() {
            return Err(DecodeError::LengthMismatch {
                declared: (control_len + payload_len) as u32,
                actual: control.len() + frame.payload.len(),
            });
        }
        let (mut msg, rest): (Message, _) =
            postcard::take_from_bytes(control).map_err(DecodeError::Body)?;
        if !rest.is_empty() {
            return Err(DecodeError::Trailing(rest.len()));
        }
        match msg.payload_mut() {
            Some(slot) => *slot = frame.payload,
            None if frame.payload.is_empty() => {}
            None => return Err(DecodeError::Trailing(frame.payload.len())),
        }
        debug_assert_eq!(msg.payload().map_or(0, Bytes::len), payload_len);
        Ok(msg)
    }

    /// Decode a frame received in one piece ([`Frame::parse`], then
    /// [`Message::decode`]).
    pub fn decode_bytes(bytes: Bytes) -> Result<Message, DecodeError> {
        Self::decode(Frame::parse(bytes)?)
    }

    /// The control and payload lengths a frame header declares, if `prefix` is a
    /// valid header. Stream transports use it to learn how many bytes to read
    /// next, and where the payload starts.
    pub fn frame_lens(prefix: &[u8; HEADER_BYTES]) -> Result<(usize, usize), DecodeError> {
        if prefix[..2] != MAGIC {
            return Err(DecodeError::BadMagic([prefix[0], prefix[1]]));
        }
        if prefix[2] != WIRE_VERSION {
            return Err(DecodeError::Version(prefix[2]));
        }
        let word = |at: usize| {
            u32::from_le_bytes([prefix[at], prefix[at + 1], prefix[at + 2], prefix[at + 3]])
        };
        let (control, payload) = (word(4), word(8));
        let declared = u64::from(control) + u64::from(payload);
        if declared > MAX_BODY_BYTES as u64 {
            return Err(DecodeError::TooLarge(
                declared.min(u64::from(u32::MAX)) as u32
            ));
        }
        Ok((control as usize, payload as usize))
    }

    /// Length of the body (control part and payload) a frame header declares.
    pub fn body_len(prefix: &[u8; HEADER_BYTES]) -> Result<usize, DecodeError> {
        Self::frame_lens(prefix).map(|(c, p)| c + p)
    }
}

#[cfg(test)]
mod tests;
