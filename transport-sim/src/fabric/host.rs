//! Host NIC behaviour of the engine: QP scheduling with DCQCN pacing and windows,
//! receive processing (ACK, NACK, CNP), timers.

use super::config::FabricConfig;
use super::nic::{control, data_packet, RecvQp, RxVerdict, SendQp, TcpSender};
use super::packet::{Kind, Packet};
use super::telemetry::DropReason;
use super::topology::{HostIdx, Path, PortId};
use super::{mix, Delivery, Engine, Event, Failure, Host, QpKey};
use crate::congestion::dcqcn::{NotificationPoint, ReactionPoint};
use crate::congestion::tcp::TcpCc;
use weir_core::wire::Frame;

impl Engine {
    fn flow_hash(src: HostIdx, dst: HostIdx) -> u64 {
        mix(((src as u64) << 32) | dst as u64)
    }

    /// Hops between two hosts (links crossed one way).
    fn hops(&self, src: HostIdx, dst: HostIdx) -> u64 {
        match self.config.topology {
            super::config::Topology::Star { .. } => 2,
            super::config::Topology::LeafSpine { hosts_per_leaf, .. } => {
                if src / hosts_per_leaf == dst / hosts_per_leaf {
                    2
                } else {
                    4
                }
            }
        }
    }

    /// Bandwidth-delay product of the path, bytes: line rate x base round trip
    /// (propagation both ways plus one full frame's serialization per hop).
    fn bdp_bytes(&self, src: HostIdx, dst: HostIdx) -> u64 {
        let link = self.config.host_link;
        let hops = self.hops(src, dst);
        let frame = u64::from(self.config.nic.mtu_bytes + self.config.header_bytes);
        let rtt_ns =
            2 * hops * link.delay_ns + hops * FabricConfig::serialization_ns(frame, link.rate_bps);
        (link.rate_bps as u128 * u128::from(rtt_ns) / 8_000_000_000) as u64
    }

    pub(super) fn host_send(&mut self, src: HostIdx, dst: HostIdx, path: Path, frame: Frame) {
        let port = self.wiring.host_ports[src][usize::from(path)];
        let rp = self.config.nic.dcqcn.clone().map(ReactionPoint::new);
        let tcp = self.config.tcp.map(|t| TcpSender {
            cc: TcpCc::new(t.params),
            dupacks: 0,
            recover: None,
            rexmit: None,
        });
        let mtu = u64::from(self.config.nic.mtu_bytes);
        let packets = (frame.len() as u64).div_ceil(mtu).max(1);
        let len = frame.len() as u64;
        let now = self.now_ns;
        let Host {
            send,
            queued_bytes,
            last_qpn,
            ..
        } = &mut self.hosts[src];
        let qp = send.entry((dst, path)).or_insert_with(|| {
            *last_qpn += 1;
            SendQp::new((dst, path, *last_qpn), port, rp, tcp)
        });
        qp.push(frame, packets, now);
        *queued_bytes += len;
        let port = qp.port;
        self.try_tx(port);
    }

    /// The next data packet host `h` may put on `port`: round robin over its QPs on
    /// that port that have data, window room and pacing credit.
    pub(super) fn host_next_data(&mut self, h: HostIdx, port: PortId) -> Option<Packet> {
        let now = self.now_ns;
        let keys: Vec<QpKey> = self.hosts[h]
            .send
            .iter()
            .filter(|(_, qp)| {
                qp.port == port
                    && (qp.has_data() || qp.tcp.as_ref().is_some_and(|t| t.rexmit.is_some()))
            })
            .map(|(&key, _)| key)
            .collect();
        if keys.is_empty() {
            return None;
        }
        let wire_frame = u64::from(self.config.nic.mtu_bytes + self.config.header_bytes);
        let mut earliest: Option<u64> = None;
        let start = self.ports[port].rr % keys.len();
        for i in 0..keys.len() {
            let key = keys[(start + i) % keys.len()];
            let window = self.config.nic.bdp_window.then(|| self.bdp_bytes(h, key.0));
            let qp = &self.hosts[h].send[&key];
            if let Some(tcp) = &qp.tcp {
                // TCP: a fast retransmit goes first; new data within the window.
                let room =
                    (qp.inflight_packets() + 1) * wire_frame <= tcp.cc.cwnd_bytes().max(wire_frame);
                if tcp.rexmit.is_none() && !room {
                    continue;
                }
                self.ports[port].rr = (start + i + 1) % keys.len();
                return Some(self.emit(h, key, port));
            }
            if let Some(window) = window {
                if qp.inflight_packets() > 0 && (qp.inflight_packets() + 1) * wire_frame > window {
                    continue; // Window full: an ACK will reopen it.
                }
            }
            if qp.next_send_ns > now {
                earliest = Some(earliest.map_or(qp.next_send_ns, |e| e.min(qp.next_send_ns)));
                continue;
            }
            self.ports[port].rr = (start + i + 1) % keys.len();
            return Some(self.emit(h, key, port));
        }
        if let Some(at) = earliest {
            if self.ports[port].wake_at.is_none_or(|w| at < w || w < now) {
                self.ports[port].wake_at = Some(at);
                self.schedule(at, Event::Wake { port });
            }
        }
        None
    }

    /// Build and account the next packet of QP `h -> key`.
    fn emit(&mut self, h: HostIdx, key: QpKey, port: PortId) -> Packet {
        let now = self.now_ns;
        let (mtu, header) = (self.config.nic.mtu_bytes, self.config.header_bytes);
        let rate_line = self.ports[port].info.rate_bps;
        let rto = self.config.nic.rto_ns;
        let qp = self.hosts[h].send.get_mut(&key).expect("chosen QP exists");
        let rexmit = qp.tcp.as_mut().and_then(|t| t.rexmit.take());
        let psn = rexmit.unwrap_or(qp.nxt);
        let packet = data_packet(h, qp, psn, mtu, header, Self::flow_hash(h, key.0));
        if rexmit.is_none() {
            qp.nxt += 1;
        }
        if psn < qp.max_sent {
            self.counters.retransmits += 1;
        }
        qp.record_send(psn, now);
        qp.max_sent = qp.max_sent.max(qp.nxt);
        let rto = qp.tcp.as_ref().map_or(rto, |t| t.cc.rto_ns());
        let rate = qp.rate_bps(rate_line);
        qp.next_send_ns = now + FabricConfig::serialization_ns(u64::from(packet.wire_bytes), rate);
        if let Some(rp) = &mut qp.rp {
            rp.handle_sent(u64::from(packet.wire_bytes));
        }
        if qp.rto_at.is_none() {
            qp.rto_at = Some(now + rto);
        }
        self.arm_qp_timer(h, key);
        packet
    }

    pub(super) fn flow_hash_of(src: HostIdx, dst: HostIdx) -> u64 {
        Self::flow_hash(src, dst)
    }

    /// Make sure a timer event is queued for the QP's next DCQCN or RTO deadline.
    pub(super) fn arm_qp_timer(&mut self, h: HostIdx, key: QpKey) {
        let qp = self.hosts[h].send.get_mut(&key).expect("QP exists");
        let rp_next = qp.rp.as_ref().and_then(|rp| rp.next_timeout_ns());
        let next = match (rp_next, qp.rto_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let Some(next) = next else { return };
        if qp.timer_event_ns.is_none_or(|t| next < t) {
            qp.timer_event_ns = Some(next);
            self.schedule(next, Event::QpTimer { host: h, qp: key });
        }
    }

    pub(super) fn qp_timer(&mut self, h: HostIdx, key: QpKey) {
        let now = self.now_ns;
        let rto = self.config.nic.rto_ns;
        let limit = self.config.nic.retry_limit;
        let Some(qp) = self.hosts[h].send.get_mut(&key) else {
            return; // The QP failed after the timer was armed.
        };
        if qp.timer_event_ns == Some(now) {
            qp.timer_event_ns = None;
        }
        if let Some(rp) = &mut qp.rp {
            rp.handle_timeout(now);
        }
        if qp.rto_at.is_some_and(|t| t <= now) {
            if qp.una < qp.nxt {
                // No progress for a whole timeout: go back to the oldest unacked PSN.
                self.counters.timeouts += 1;
                qp.retries += 1;
                if qp.tcp.is_none() && limit.is_some_and(|l| qp.retries > l) {
                    return self.fail_qp(h, key);
                }
                let inflight = (qp.nxt - qp.una) * u64::from(self.config.nic.mtu_bytes);
                let rto = match &mut qp.tcp {
                    Some(tcp) => {
                        tcp.cc.on_timeout(now, inflight);
                        tcp.rexmit = None;
                        tcp.dupacks = 0;
                        tcp.recover = None;
                        tcp.cc.rto_ns()
                    }
                    None => rto,
                };
                qp.nxt = qp.una;
                qp.rto_at = Some(now + rto);
            } else {
                qp.rto_at = None;
            }
        }
        let port = qp.port;
        self.arm_qp_timer(h, key);
        self.try_tx(port);
    }

    /// QP `h -> key` exceeded its retry limit: it is destroyed, its messages given
    /// up (reported as failures); the next message to `key` goes on a new QP.
    fn fail_qp(&mut self, h: HostIdx, (dst, path): QpKey) {
        let qp = self.hosts[h]
            .send
            .remove(&(dst, path))
            .expect("a failing QP exists");
        tracing::debug!(
            host = h,
            dst,
            path,
            qpn = qp.qpn,
            at_ns = self.now_ns,
            "QP failed: retry limit exceeded"
        );
        self.hosts[h].queued_bytes -= qp.queued_bytes;
        self.counters.qp_errors += 1;
        self.failed.push(Failure {
            src: h,
            dst,
            path,
            messages: qp.msgs.len(),
        });
    }

    /// Whether `src`'s QP `qpn` towards `dst` on `path` is its current one. A
    /// packet of a QP that failed is not delivered: its messages were reported
    /// failed, and the receiving side's QP went with the connection.
    pub(super) fn qp_current(&self, src: HostIdx, (dst, path): QpKey, qpn: u32) -> bool {
        self.hosts[src]
            .send
            .get(&(dst, path))
            .is_some_and(|qp| qp.qpn == qpn)
    }

    pub(super) fn host_arrive(&mut self, h: HostIdx, port: PortId, packet: Packet) {
        if packet.corrupt {
            return self.drop_packet(DropReason::Corrupt);
        }
        let src = packet.src;
        let key = (src, packet.path);
        let qpn = packet.qpn;
        if !matches!(packet.kind, Kind::Pause { .. }) {
            // Data must come from the sender's current QP; answers must be
            // about this side's current QP.
            let current = match packet.kind {
                Kind::Data { .. } => self.qp_current(src, (h, packet.path), qpn),
                _ => self.qp_current(h, key, qpn),
            };
            if !current {
                return self.drop_packet(DropReason::StaleQp);
            }
        }
        match packet.kind {
            Kind::Pause { on } => self.set_paused(port, on),
            Kind::Data {
                psn,
                msg,
                msg_sent_ns,
                ..
            } if self.config.tcp.is_some() => {
                self.receive_tcp_data(h, port, (key, qpn), psn, packet.ce, msg, msg_sent_ns)
            }
            Kind::Data {
                psn,
                msg,
                msg_sent_ns,
                ..
            } => self.receive_data(h, port, (key, qpn), psn, packet.ce, msg, msg_sent_ns),
            Kind::Ack { psn, ece } if self.config.tcp.is_some() => {
                self.receive_tcp_ack(h, key, psn, ece)
            }
            Kind::Ack { psn, .. } => self.receive_ack(h, key, Some(psn), None),
            Kind::Nack { psn } => self.receive_ack(h, key, psn.checked_sub(1), Some(psn)),
            Kind::Cnp => {
                self.counters.cnps_received += 1;
                let now = self.now_ns;
                if let Some(qp) = self.hosts[h].send.get_mut(&key) {
                    qp.signals.cnps += 1;
                    if let Some(rp) = &mut qp.rp {
                        rp.handle_cnp(now);
                    }
                    self.arm_qp_timer(h, key);
                }
            }
        }
    }

    pub(super) fn deliver(
        &mut self,
        (src, path): (HostIdx, Path),
        dst: HostIdx,
        frame: Frame,
        sent_ns: u64,
    ) {
        self.counters.messages += 1;
        self.delivered.push(Delivery {
            src,
            dst,
            frame,
            sent_ns,
            at_ns: self.now_ns,
            path,
        });
    }

    /// The receiving side of QP `qpn` from `key`, created on its first packet
    /// (afresh when the sender replaced a QP that failed).
    pub(super) fn recv_qp(&mut self, h: HostIdx, key: QpKey, qpn: u32) -> &mut RecvQp {
        let cnp_mode = self.config.nic.cnp;
        let rq = self.hosts[h]
            .recv
            .entry(key)
            .or_insert_with(|| RecvQp::new(qpn, NotificationPoint::new(cnp_mode)));
        if rq.qpn != qpn {
            *rq = RecvQp::new(qpn, NotificationPoint::new(cnp_mode));
        }
        rq
    }

    #[allow(clippy::too_many_arguments)]
    fn receive_data(
        &mut self,
        h: HostIdx,
        port: PortId,
        (key, qpn): (QpKey, u32),
        psn: u64,
        ce: bool,
        msg: Option<Frame>,
        msg_sent_ns: u64,
    ) {
        let now = self.now_ns;
        let src = key.0;
        let to = (src, key.1, qpn);
        let rq = self.recv_qp(h, key, qpn);
        rq.marked_in += u64::from(ce);
        let cnp = ce && rq.np.handle_marked(now);
        let verdict = rq.receive(psn);
        let expected = rq.expected;
        let hash = Self::flow_hash(h, src);
        if cnp {
            self.counters.cnps_sent += 1;
            self.enqueue(port, control(h, to, hash, Kind::Cnp));
        }
        match verdict {
            RxVerdict::Accept => {
                if let Some(frame) = msg {
                    self.stack_receive(key, h, frame, msg_sent_ns);
                }
                self.enqueue(port, control(h, to, hash, Kind::Ack { psn, ece: false }));
            }
            RxVerdict::Gap { nack } => {
                self.drop_packet(DropReason::OutOfOrder);
                if nack {
                    self.counters.nacks += 1;
                    self.enqueue(port, control(h, to, hash, Kind::Nack { psn: expected }));
                }
            }
            RxVerdict::Duplicate => {
                self.drop_packet(DropReason::Duplicate);
                if let Some(last) = expected.checked_sub(1) {
                    let ack = Kind::Ack {
                        psn: last,
                        ece: false,
                    };
                    self.enqueue(port, control(h, to, hash, ack));
                }
            }
        }
    }

    /// ACK (cumulative up to `acked`) or NACK (`rewind_to`) for QP `h -> key`.
    fn receive_ack(&mut self, h: HostIdx, key: QpKey, acked: Option<u64>, rewind_to: Option<u64>) {
        let now = self.now_ns;
        let rto = self.config.nic.rto_ns;
        let Some(qp) = self.hosts[h].send.get_mut(&key) else {
            return; // An ACK for a QP never used: stale or bogus.
        };
        let (freed, newly, _) = acked.map_or((0, 0, None), |psn| qp.ack(psn, now));
        if newly > 0 {
            qp.retries = 0;
        }
        if let Some(psn) = rewind_to {
            if psn >= qp.una && psn < qp.nxt {
                qp.nxt = psn; // Go back N.
            }
        }
        qp.rto_at = (qp.una < qp.nxt || qp.has_data()).then_some(now + rto);
        if qp.una == qp.end_psn {
            qp.rto_at = None;
        }
        let port = qp.port;
        self.hosts[h].queued_bytes -= freed;
        self.arm_qp_timer(h, key);
        self.try_tx(port);
    }
}
