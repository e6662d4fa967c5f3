//! TCP mode of the NICs: the same per-pair packet sequence as the RC QPs, but with
//! a receiver that keeps out-of-order packets and answers every packet with a
//! cumulative ACK (duplicates included) echoing its ECN mark, and a sender driven
//! by a congestion window (`crate::congestion::tcp`): fast retransmit of the
//! missing packet after three duplicate ACKs, go-back-N from the oldest
//! unacknowledged packet on a retransmission timeout.

use super::nic::{control, TCP_OOO_PACKETS_MAX};
use super::packet::Kind;
use super::telemetry::DropReason;
use super::topology::{HostIdx, PortId};
use super::{Engine, QpKey};
use weir_core::wire::Frame;

/// Duplicate ACKs that signal a loss.
const DUPACK_THRESHOLD: u32 = 3;

impl Engine {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn receive_tcp_data(
        &mut self,
        h: HostIdx,
        port: PortId,
        (key, qpn): (QpKey, u32),
        psn: u64,
        ce: bool,
        msg: Option<Frame>,
        msg_sent_ns: u64,
    ) {
        let src = key.0;
        // Kernel TCP echoes CE to the sender but reports no count of marked
        // packets received per socket, so `marked_in` stays 0 here, as it does
        // in weir's TCP transport.
        let rq = self.recv_qp(h, key, qpn);
        let mut ready = Vec::new();
        if psn == rq.expected {
            rq.expected += 1;
            ready.push(msg.map(|m| (m, msg_sent_ns)));
            // The gap is filled: everything held behind it is now in order.
            while let Some(held) = rq.ooo.remove(&rq.expected) {
                rq.expected += 1;
                ready.push(held);
            }
        } else if psn > rq.expected {
            if rq.ooo.len() < TCP_OOO_PACKETS_MAX {
                rq.ooo.entry(psn).or_insert(msg.map(|m| (m, msg_sent_ns)));
            } else {
                self.drop_packet(DropReason::OutOfOrder);
            }
        } else {
            self.drop_packet(DropReason::Duplicate);
        }
        // Every arrival is answered with the cumulative ACK (the highest in-order PSN,
        // u64::MAX for none yet): duplicates are how the sender learns of a loss.
        let psn = self.hosts[h].recv[&key].expected.wrapping_sub(1);
        for (frame, sent_ns) in ready.into_iter().flatten() {
            self.stack_receive(key, h, frame, sent_ns);
        }
        let hash = Self::flow_hash_of(h, src);
        let to = (src, key.1, qpn);
        self.enqueue(port, control(h, to, hash, Kind::Ack { psn, ece: ce }));
    }

    /// A cumulative ACK of `psn` (with ECN echo `ece`) for TCP connection `h -> key`.
    pub(super) fn receive_tcp_ack(&mut self, h: HostIdx, key: QpKey, psn: u64, ece: bool) {
        let now = self.now_ns;
        let mss = u64::from(self.config.nic.mtu_bytes);
        let Some(qp) = self.hosts[h].send.get_mut(&key) else {
            return;
        };
        if ece {
            qp.signals.ecn_echoes += 1;
        }
        let tcp = qp.tcp.as_mut().expect("TCP mode QPs have TCP state");
        let mut freed = 0;
        let next = psn.wrapping_add(1);
        if next > qp.una {
            let una_before = qp.una;
            let (bytes, packets, rtt) = qp.ack(psn, now);
            if packets == 0 {
                return; // An ACK for what was never sent.
            }
            freed = bytes;
            let tcp = qp.tcp.as_mut().expect("checked above");
            tcp.dupacks = 0;
            let acked = packets * mss;
            tcp.cc.on_ack(now, acked, if ece { acked } else { 0 }, rtt);
            if let Some(recover) = tcp.recover {
                if qp.una >= recover {
                    tcp.recover = None;
                } else {
                    // A partial ACK in recovery: the next hole is lost too (NewReno).
                    tcp.rexmit = Some(qp.una);
                }
            }
            if tcp.rexmit.is_some_and(|r| r < qp.una) {
                tcp.rexmit = None;
            }
            debug_assert!(qp.una > una_before);
            let rto = tcp.cc.rto_ns();
            qp.rto_at = (qp.una < qp.max_sent || qp.has_data()).then_some(now + rto);
        } else if next == qp.una && qp.una < qp.max_sent {
            tcp.dupacks += 1;
            if tcp.dupacks == DUPACK_THRESHOLD && tcp.recover.is_none() {
                tcp.cc.on_loss(now);
                tcp.rexmit = Some(qp.una);
                tcp.recover = Some(qp.max_sent);
            }
        }
        if qp.una == qp.end_psn {
            qp.rto_at = None;
        }
        let port = qp.port;
        self.hosts[h].queued_bytes -= freed;
        self.arm_qp_timer(h, key);
        self.try_tx(port);
    }
}
