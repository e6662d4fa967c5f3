//! Fabric telemetry: counters, and optional time series of queues, pauses and
//! per-QP rates.

use std::collections::BTreeMap;

/// Why a packet was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DropReason {
    /// Lossless headroom overflowed: PFC failed to hold traffic back. Loud.
    HeadroomOverflow,
    /// Lossy buffer full (drop-tail).
    BufferFull,
    /// Sent onto a link that is down.
    LinkDown,
    /// Random loss on a link.
    LinkLoss,
    /// Damaged on a link; dropped by the receiver's ICRC check.
    Corrupt,
    /// Lost in a switch reboot.
    SwitchReboot,
    /// Arrived out of order at the receiver (go-back-N discards it).
    OutOfOrder,
    /// A duplicate of a packet already received.
    Duplicate,
    /// No route (every path down).
    NoRoute,
    /// Of a QP that failed (its sender gave it up), or a duplicate of one.
    StaleQp,
}

/// Counters of the whole fabric.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets put on any link.
    pub packets: u64,
    /// Wire bytes put on any link.
    pub bytes: u64,
    /// Data packets marked Congestion Experienced.
    pub ecn_marks: u64,
    /// CNPs sent by receivers.
    pub cnps_sent: u64,
    /// CNPs received by senders.
    pub cnps_received: u64,
    /// PFC XOFF frames sent.
    pub pauses_sent: u64,
    /// PFC XOFF frames received.
    pub pauses_received: u64,
    /// PFC XON frames sent.
    pub resumes_sent: u64,
    /// NACKs sent.
    pub nacks: u64,
    /// Data packets sent again (go-back-N or timeout).
    pub retransmits: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// QPs that failed: they exceeded their retry limit.
    pub qp_errors: u64,
    /// Messages delivered.
    pub messages: u64,
    /// Events the engine processed (the simulator's unit of work).
    pub events: u64,
    /// Drops by reason.
    pub drops: BTreeMap<DropReason, u64>,
}

impl Counters {
    /// Drops for `reason`.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.drops.get(&reason).copied().unwrap_or(0)
    }

    /// Drops of every reason but the receiver's own discards (go-back-N's, and
    /// those of a QP that failed).
    pub fn drops_in_network(&self) -> u64 {
        self.drops
            .iter()
            .filter(|(r, _)| {
                !matches!(
                    r,
                    DropReason::OutOfOrder | DropReason::Duplicate | DropReason::StaleQp
                )
            })
            .map(|(_, n)| n)
            .sum()
    }
}

/// Counters of one port's transmitter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Packets sent.
    pub packets: u64,
    /// Wire bytes sent.
    pub bytes: u64,
    /// Most bytes ever waiting in the data queue.
    pub queue_bytes_max: u64,
    /// Time this port spent paused, ns.
    pub paused_ns: u64,
}

/// One sample of the time series.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Time, ns.
    pub at_ns: u64,
    /// Data-queue bytes of every switch port, by port id.
    pub queue_bytes: Vec<(usize, u64)>,
    /// Ports whose data class is paused.
    pub paused: Vec<usize>,
    /// Rate (bit/s) and alpha of every QP with DCQCN: (src, dst, rate, alpha).
    pub qp_rates: Vec<(usize, usize, f64, f64)>,
}
