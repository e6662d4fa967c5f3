//! Packets on the simulated wire.

use super::topology::{HostIdx, Path, PortId};
use weir_core::wire::Frame;

/// Traffic class of control frames (ACK, NACK, CNP, PAUSE): strict priority, never
/// paused.
pub const PRIO_CONTROL: usize = 0;
/// Traffic class of RoCE data: lossless (PFC) and ECN-capable.
pub const PRIO_DATA: usize = 1;
/// Number of traffic classes.
pub const PRIOS: usize = 2;

/// What a packet is.
#[derive(Clone, Debug)]
pub enum Kind {
    /// A data packet of an RC QP.
    Data {
        /// Packet sequence number.
        psn: u64,
        /// Payload bytes.
        payload: u32,
        /// The whole message, on its last packet only.
        msg: Option<Frame>,
        /// When the message was handed to the sender (for flow completion times).
        msg_sent_ns: u64,
    },
    /// Cumulative acknowledgement of every PSN up to and including `psn`.
    Ack {
        /// Highest PSN received in order.
        psn: u64,
        /// TCP: the packet that caused this ACK was marked CE (ECN echo).
        ece: bool,
    },
    /// Out-of-order arrival: retransmit from `psn` (go-back-N).
    Nack {
        /// The PSN the receiver expects.
        psn: u64,
    },
    /// Congestion notification for the QP from `dst` to `src` of this packet.
    Cnp,
    /// PFC PAUSE (XOFF when `on`) or resume (XON) of the data class, link-local.
    Pause {
        /// XOFF (true) or XON (false).
        on: bool,
    },
}

/// A packet.
#[derive(Clone, Debug)]
pub struct Packet {
    /// Sending host.
    pub src: HostIdx,
    /// Receiving host.
    pub dst: HostIdx,
    /// The ports it leaves and is addressed to (see [`Path`]).
    pub path: Path,
    /// The sending QP's number (for data) or the number of the QP it answers
    /// (ACK, NACK, CNP): a QP that failed is replaced by one with a higher
    /// number, and packets of the old one are stale.
    pub qpn: u32,
    /// Traffic class.
    pub prio: usize,
    /// Bytes on the wire (payload + headers).
    pub wire_bytes: u32,
    /// ECN Congestion Experienced.
    pub ce: bool,
    /// Damaged on a link; the receiving NIC's ICRC check drops it.
    pub corrupt: bool,
    /// ECMP flow hash.
    pub hash: u64,
    /// At a switch: the ingress port it arrived on (for buffer accounting).
    pub ingress: Option<PortId>,
    /// The packet.
    pub kind: Kind,
}

impl Packet {
    /// True for frames that carry data of the lossless class.
    pub fn is_data(&self) -> bool {
        matches!(self.kind, Kind::Data { .. })
    }
}
