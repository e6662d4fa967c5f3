//! The host NIC: RC queue pairs with MTU segmentation, PSNs, cumulative ACKs, NACK
//! on out-of-order arrival, go-back-N retransmission from the last acknowledged PSN,
//! a retransmission timeout, DCQCN rate limiting per QP (reaction point) and CNP
//! generation at the receiver (notification point). One QP per ordered host pair
//! and path (a pair of NIC ports, see [`Path`]). With a retry limit, a QP that
//! times out that many times in a row without progress fails: its messages are
//! given up (reported as failures, as an RC QP's error completions are) and the
//! next message goes on a fresh QP with a new number, as after a reconnect.

use super::packet::{Kind, Packet, PRIO_CONTROL, PRIO_DATA};
use super::topology::{HostIdx, Path, PortId};
use crate::congestion::dcqcn::{NotificationPoint, ReactionPoint};
use crate::congestion::tcp::TcpCc;
use std::collections::BTreeMap;
use std::collections::VecDeque;
use weir_core::transport::CongestionSignals;
use weir_core::wire::Frame;

/// TCP sender state beyond the packet sequence: congestion control, duplicate ACKs,
/// fast retransmit and recovery.
#[derive(Debug)]
pub(super) struct TcpSender {
    pub(super) cc: TcpCc,
    pub(super) dupacks: u32,
    /// In fast recovery until this PSN is acknowledged.
    pub(super) recover: Option<u64>,
    /// A single packet to retransmit ahead of new data (fast retransmit).
    pub(super) rexmit: Option<u64>,
}

/// A message waiting to be (fully) acknowledged.
#[derive(Clone, Debug)]
pub(super) struct OutMsg {
    pub(super) frame: Frame,
    pub(super) first_psn: u64,
    pub(super) packets: u64,
    pub(super) sent_ns: u64,
}

/// The sending side of a QP.
#[derive(Debug)]
pub(super) struct SendQp {
    pub(super) dst: HostIdx,
    pub(super) path: Path,
    /// This QP's number (unique per sending host).
    pub(super) qpn: u32,
    pub(super) port: PortId,
    pub(super) msgs: VecDeque<OutMsg>,
    /// First PSN not yet handed to `msgs`.
    pub(super) end_psn: u64,
    /// Oldest unacknowledged PSN.
    pub(super) una: u64,
    /// Next PSN to transmit (rewinds on NACK or timeout).
    pub(super) nxt: u64,
    /// Highest PSN ever transmitted + 1 (to count retransmissions).
    pub(super) max_sent: u64,
    pub(super) rp: Option<ReactionPoint>,
    /// Pacing: the QP may send its next packet at this time.
    pub(super) next_send_ns: u64,
    /// Retransmission deadline while data is outstanding.
    pub(super) rto_at: Option<u64>,
    /// A timer event is queued for this time (RTO or DCQCN).
    pub(super) timer_event_ns: Option<u64>,
    pub(super) queued_bytes: u64,
    /// Send time of every PSN in `[una, max_sent)` and whether it was sent twice
    /// (no RTT sample from those: Karn's rule).
    pub(super) sent: VecDeque<(u64, bool)>,
    /// TCP mode.
    pub(super) tcp: Option<TcpSender>,
    /// Congestion signals seen on this QP.
    pub(super) signals: CongestionSignals,
    /// Timeouts in a row without progress.
    pub(super) retries: u32,
}

impl SendQp {
    pub(super) fn new(
        (dst, path, qpn): (HostIdx, Path, u32),
        port: PortId,
        rp: Option<ReactionPoint>,
        tcp: Option<TcpSender>,
    ) -> Self {
        SendQp {
            dst,
            path,
            qpn,
            port,
            msgs: VecDeque::new(),
            end_psn: 0,
            una: 0,
            nxt: 0,
            max_sent: 0,
            rp,
            next_send_ns: 0,
            rto_at: None,
            timer_event_ns: None,
            queued_bytes: 0,
            sent: VecDeque::new(),
            tcp,
            signals: CongestionSignals::default(),
            retries: 0,
        }
    }

    /// Record that `psn` goes on the wire at `now_ns`.
    pub(super) fn record_send(&mut self, psn: u64, now_ns: u64) {
        let at = (psn - self.una) as usize;
        if at < self.sent.len() {
            self.sent[at] = (now_ns, true);
            self.signals.retransmits += 1;
        } else {
            debug_assert_eq!(at, self.sent.len(), "PSNs are sent in order the first time");
            self.sent.push_back((now_ns, false));
        }
    }

    /// Queue a message of `packets` packets.
    pub(super) fn push(&mut self, frame: Frame, packets: u64, now_ns: u64) {
        self.queued_bytes += frame.len() as u64;
        self.msgs.push_back(OutMsg {
            frame,
            first_psn: self.end_psn,
            packets,
            sent_ns: now_ns,
        });
        self.end_psn += packets;
    }

    /// True if a packet is waiting to be transmitted.
    pub(super) fn has_data(&self) -> bool {
        self.nxt < self.end_psn
    }

    /// Bytes sent and not yet acknowledged, by packet count x MTU (an upper bound).
    pub(super) fn inflight_packets(&self) -> u64 {
        self.nxt - self.una
    }

    /// The message holding `psn` and the packet's index in it.
    pub(super) fn locate(&self, psn: u64) -> (&OutMsg, u64) {
        let i = self
            .msgs
            .partition_point(|m| m.first_psn + m.packets <= psn);
        let m = &self.msgs[i];
        debug_assert!(psn >= m.first_psn && psn < m.first_psn + m.packets);
        (m, psn - m.first_psn)
    }

    /// Cumulative ACK of every PSN <= `psn` at `now_ns`: returns (bytes of messages
    /// completed, packets newly acknowledged, an RTT sample if the newest acked
    /// packet was sent once).
    pub(super) fn ack(&mut self, psn: u64, now_ns: u64) -> (u64, u64, Option<u64>) {
        if psn < self.una || psn >= self.end_psn || psn >= self.una + self.sent.len() as u64 {
            return (0, 0, None); // Stale, bogus, or for a packet never sent.
        }
        let newly = psn + 1 - self.una;
        let mut rtt = None;
        for _ in 0..newly {
            if let Some((sent_ns, twice)) = self.sent.pop_front() {
                rtt = (!twice).then(|| now_ns.saturating_sub(sent_ns));
            }
        }
        if let Some(r) = rtt {
            self.signals.rtt_ns_last = r;
        }
        self.una = psn + 1;
        self.nxt = self.nxt.max(self.una);
        let mut freed = 0;
        while let Some(m) = self.msgs.front() {
            if m.first_psn + m.packets > self.una {
                break;
            }
            freed += m.frame.len() as u64;
            self.msgs.pop_front();
        }
        self.queued_bytes -= freed;
        (freed, newly, rtt)
    }

    /// Rate the QP may send at, bits per second.
    pub(super) fn rate_bps(&self, line_rate_bps: u64) -> u64 {
        match &self.rp {
            Some(rp) => (rp.rate_bps() as u64).clamp(1, line_rate_bps),
            None => line_rate_bps,
        }
    }
}

/// Most out-of-order packets a TCP receiver holds (its receive window).
pub(super) const TCP_OOO_PACKETS_MAX: usize = 4096;

/// An out-of-order packet a TCP receiver keeps: the message it ends, if any.
pub(super) type Held = Option<(Frame, u64)>;

/// The receiving side of a QP.
#[derive(Debug)]
pub(super) struct RecvQp {
    /// The number of the sending QP this side is paired with.
    pub(super) qpn: u32,
    pub(super) expected: u64,
    pub(super) nacked: bool,
    pub(super) np: NotificationPoint,
    /// TCP only: packets received beyond a gap, by PSN.
    pub(super) ooo: BTreeMap<u64, Held>,
    /// Data packets that arrived ECN-marked (CE): RoCE mode only (a RoCE NIC's
    /// notification point counts them; kernel TCP does not report them).
    pub(super) marked_in: u64,
}

/// What a receiver does with an arriving data packet.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum RxVerdict {
    /// In order: accept, then acknowledge it.
    Accept,
    /// Ahead of a gap: drop; NACK the expected PSN if not done for this gap.
    Gap { nack: bool },
    /// Already received: drop, re-acknowledge.
    Duplicate,
}

impl RecvQp {
    pub(super) fn new(qpn: u32, np: NotificationPoint) -> Self {
        RecvQp {
            qpn,
            expected: 0,
            nacked: false,
            np,
            ooo: BTreeMap::new(),
            marked_in: 0,
        }
    }

    pub(super) fn receive(&mut self, psn: u64) -> RxVerdict {
        use std::cmp::Ordering::*;
        match psn.cmp(&self.expected) {
            Equal => {
                self.expected += 1;
                self.nacked = false;
                RxVerdict::Accept
            }
            Greater => {
                let nack = !self.nacked;
                self.nacked = true;
                RxVerdict::Gap { nack }
            }
            Less => RxVerdict::Duplicate,
        }
    }
}

/// A control frame from `src` to `dst` about QP `qpn` on `path`.
pub(super) fn control(
    src: HostIdx,
    (dst, path, qpn): (HostIdx, Path, u32),
    hash: u64,
    kind: Kind,
) -> Packet {
    Packet {
        src,
        dst,
        path,
        qpn,
        prio: PRIO_CONTROL,
        wire_bytes: super::config::CONTROL_FRAME_BYTES,
        ce: false,
        corrupt: false,
        hash,
        ingress: None,
        kind,
    }
}

/// Data packet `psn` of `qp`, sent by `src`.
pub(super) fn data_packet(
    src: HostIdx,
    qp: &SendQp,
    psn: u64,
    mtu: u32,
    header: u32,
    hash: u64,
) -> Packet {
    let (msg, index) = qp.locate(psn);
    let len = msg.frame.len() as u64;
    let payload = (len - (index * u64::from(mtu)).min(len)).min(u64::from(mtu)) as u32;
    let last = index + 1 == msg.packets;
    Packet {
        src,
        dst: qp.dst,
        path: qp.path,
        qpn: qp.qpn,
        prio: PRIO_DATA,
        wire_bytes: payload + header,
        ce: false,
        corrupt: false,
        hash,
        ingress: None,
        kind: Kind::Data {
            psn,
            payload,
            msg: last.then(|| msg.frame.clone()),
            msg_sent_ns: msg.sent_ns,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::congestion::dcqcn::CnpMode;

    #[test]
    fn acks_free_whole_messages_and_go_back_n_rewinds() {
        let mut qp = SendQp::new((1, 0, 1), 0, None, None);
        qp.push(Frame::from(vec![0; 10_000]), 3, 0);
        qp.push(Frame::from(vec![0; 100]), 1, 0);
        assert_eq!(qp.end_psn, 4);
        for psn in 0..4 {
            qp.record_send(psn, 10 * psn);
        }
        qp.nxt = 4;
        assert_eq!(
            qp.ack(1, 100),
            (0, 2, Some(90)),
            "message 1 is not complete"
        );
        qp.record_send(2, 150);
        assert_eq!(
            qp.ack(2, 200),
            (10_000, 1, None),
            "no RTT from a packet sent twice"
        );
        assert_eq!(qp.ack(1, 200).0, 0, "stale ack");
        assert_eq!(qp.ack(9, 200).0, 0, "ack beyond what was sent");
        assert_eq!(qp.locate(3).1, 0);
        let p = data_packet(0, &qp, 3, 4096, 82, 7);
        assert!(matches!(
            p.kind,
            Kind::Data {
                payload: 100,
                msg: Some(_),
                ..
            }
        ));
        assert_eq!(qp.ack(3, 300).0, 100);
        assert_eq!(qp.queued_bytes, 0);
        assert_eq!(qp.signals.retransmits, 1);
    }

    #[test]
    fn the_receiver_nacks_a_gap_once_and_accepts_in_order() {
        let mut rx = RecvQp::new(
            1,
            NotificationPoint::new(CnpMode::PerPacket { min_gap_ns: 0 }),
        );
        assert_eq!(rx.receive(0), RxVerdict::Accept);
        assert_eq!(rx.receive(2), RxVerdict::Gap { nack: true });
        assert_eq!(rx.receive(3), RxVerdict::Gap { nack: false });
        assert_eq!(rx.receive(0), RxVerdict::Duplicate);
        assert_eq!(rx.receive(1), RxVerdict::Accept);
        assert_eq!(rx.receive(3), RxVerdict::Gap { nack: true });
    }
}
