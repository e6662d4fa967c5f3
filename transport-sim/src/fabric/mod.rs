//! The packet-level RoCE v2 fabric, sans-IO: an event queue ordered by
//! (time ns, sequence) over hosts, links and switches.
//!
//! Model:
//! - Links: full duplex, a rate and a propagation delay each; a transmitter
//!   serializes one packet at a time. Faults: down/up, random loss, corruption.
//! - Switches: store-and-forward with a forwarding latency; a shared buffer with
//!   per-port, per-class egress queues (control frames strictly first); ECN marking at
//!   dequeue, RED-style on the egress queue's bytes; PFC on ingress occupancy (see
//!   [`mmu`]), pausing the upstream transmitter's data class until resumed, so pauses
//!   propagate hop by hop; ECMP by flow hash over shortest paths. Fault: reboot (queues
//!   and buffer state lost, arrivals dropped while it is down).
//! - NICs: RC QPs (see [`nic`]) with PSNs, ACK/NACK, go-back-N, a timeout; DCQCN rate
//!   limiting per QP and CNP generation; control frames strictly first; the data class
//!   honours PFC pauses from the switch. Fault: a PFC storm (a NIC stuck sending
//!   XOFF to its switch).
//!
//! - TCP mode (`tcp.rs`): lossy queues and windowed congestion control.
//! - Host stacks (`stack.rs`): a host with a CPU attached pays for its sends and
//!   receives on its cores (kernel TCP or RDMA costs), before the NIC and before
//!   the application.
//!
//! Not modelled yet: PAUSE quanta (XOFF holds until XON). Everything random comes
//! from the seed in the configuration; the engine never reads a clock: [`Engine::advance`] is told the time.

pub mod config;
pub mod mmu;
pub mod nic;
pub mod packet;
pub mod telemetry;
pub mod topology;

mod host;
mod stack;
mod switch;
mod tcp;

use config::FabricConfig;
use nic::{RecvQp, SendQp};
use packet::{Packet, PRIOS, PRIO_CONTROL, PRIO_DATA};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::collections::{BTreeMap, VecDeque};
use telemetry::{Counters, PortStats, Sample};
use topology::{Device, HostIdx, Path, PortId, PortInfo, SwitchIdx, Wiring};
use weir_core::wire::Frame;

/// A message that reached its destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// Sender.
    pub src: HostIdx,
    /// Receiver.
    pub dst: HostIdx,
    /// The message.
    pub frame: Frame,
    /// When it was handed to the sender, ns.
    pub sent_ns: u64,
    /// When its last packet arrived, ns.
    pub at_ns: u64,
    /// The ports it went between.
    pub path: Path,
}

/// Messages given up with a QP that failed (exceeded its retry limit), as an
/// RC QP's error completions report them: none of them is delivered later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Sender.
    pub src: HostIdx,
    /// Receiver.
    pub dst: HostIdx,
    /// The ports the QP went between.
    pub path: Path,
    /// Messages given up, in the order sent (each one not delivered).
    pub messages: usize,
}

/// A QP of a host, by its peer and path.
type QpKey = (HostIdx, Path);

/// A fault to inject.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    /// Take a link down (both directions); what is sent onto it is lost.
    LinkDown {
        /// Link index.
        link: usize,
    },
    /// Bring a link back.
    LinkUp {
        /// Link index.
        link: usize,
    },
    /// Set a link's random loss and corruption probabilities per packet.
    LinkErrors {
        /// Link index.
        link: usize,
        /// Probability a packet vanishes.
        loss: f64,
        /// Probability a packet arrives damaged (dropped by the receiver's ICRC check).
        corrupt: f64,
    },
    /// A host NIC stuck sending PFC XOFF to its switch (or recovered).
    PfcStorm {
        /// Host.
        host: HostIdx,
        /// Storm on or off.
        on: bool,
    },
    /// A switch reboots: its queues and buffer state are lost and it drops what
    /// arrives for `down_ns`.
    SwitchReboot {
        /// Switch.
        switch: SwitchIdx,
        /// Time it stays down.
        down_ns: u64,
    },
}

#[derive(Debug)]
enum Event {
    /// A port finished serializing the packet it holds.
    TxDone { port: PortId },
    /// A packet reached the device of `port` (it arrived on that port).
    Arrive { port: PortId, packet: Packet },
    /// A switch finished forwarding a packet to egress port `port`.
    Enqueue { port: PortId, packet: Packet },
    /// A paced NIC port may have a packet ready.
    Wake { port: PortId },
    /// A QP's DCQCN or retransmission timer.
    QpTimer { host: HostIdx, qp: QpKey },
    /// A switch finishes rebooting.
    SwitchUp { switch: SwitchIdx },
    /// Inject a fault.
    Fault(Fault),
    /// Take a telemetry sample.
    Sample,
    /// A host stack's send work for a message ended: it goes to the NIC.
    StackTx {
        src: HostIdx,
        dst: HostIdx,
        path: Path,
        frame: Frame,
    },
    /// A receive queue's coalesced interrupt, armed at `at`.
    StackIrq {
        host: HostIdx,
        queue: usize,
        at: u64,
    },
    /// A host stack's receive work for a batch ended: it reaches the application.
    StackDeliver { dst: HostIdx, batch: stack::Batch },
}

/// A transmitter: one end of a link.
#[derive(Debug)]
struct Port {
    info: PortInfo,
    /// ECN marking of this port's data queue (used on switch ports).
    ecn: config::EcnLevel,
    /// Egress queues by class (a host NIC uses only the control queue; its data
    /// comes from its QPs).
    queues: [VecDeque<Packet>; PRIOS],
    queue_bytes: [u64; PRIOS],
    /// The packet being serialized.
    on_wire: Option<Packet>,
    /// The peer paused this port's data class.
    paused: bool,
    paused_since_ns: u64,
    /// A pacing wake-up is queued for this time.
    wake_at: Option<u64>,
    /// Round-robin cursor over the host's QPs.
    rr: usize,
    stats: PortStats,
}

#[derive(Debug, Default)]
struct Host {
    send: BTreeMap<QpKey, SendQp>,
    recv: BTreeMap<QpKey, RecvQp>,
    queued_bytes: u64,
    storm: bool,
    /// The number of the last QP this host made.
    last_qpn: u32,
}

#[derive(Debug)]
struct Switch {
    /// Local ingress-queue index of each of its ports.
    local: BTreeMap<PortId, usize>,
    mmu: mmu::Mmu,
    down_until_ns: u64,
}

/// The fabric.
#[derive(Debug)]
pub struct Engine {
    config: FabricConfig,
    wiring: Wiring,
    ports: Vec<Port>,
    hosts: Vec<Host>,
    /// Each host's network stack, if its CPU is modelled.
    stacks: Vec<Option<stack::Stack>>,
    switches: Vec<Switch>,
    attached: usize,
    link_up: Vec<bool>,
    link_errors: Vec<(f64, f64)>,
    events: BTreeMap<(u64, u64), Event>,
    seq: u64,
    now_ns: u64,
    rng: SmallRng,
    delivered: Vec<Delivery>,
    failed: Vec<Failure>,
    counters: Counters,
    sample_interval_ns: Option<u64>,
    sample_pending: bool,
    samples: Vec<Sample>,
}

/// Most events processed in one `advance` call before it stops to let time move:
/// a bound on the work of one call, not on the simulation.
pub const EVENTS_PER_ADVANCE_MAX: usize = 1 << 24;

impl Engine {
    /// A fabric wired from `config`, with no host attached yet.
    pub fn new(config: FabricConfig) -> Result<Self, String> {
        config.validate()?;
        let wiring = Wiring::build(&config);
        let ports = wiring
            .ports
            .iter()
            .map(|&info| Port {
                info,
                ecn: config.switch.ecn.level(info.rate_bps),
                queues: Default::default(),
                queue_bytes: [0; PRIOS],
                on_wire: None,
                paused: false,
                paused_since_ns: 0,
                wake_at: None,
                rr: 0,
                stats: PortStats::default(),
            })
            .collect();
        let switches = (0..wiring.switch_ports.len())
            .map(|s| switch::new_switch(&config, &wiring, s))
            .collect::<Result<_, _>>()?;
        Ok(Engine {
            hosts: (0..wiring.host_ports.len())
                .map(|_| Host::default())
                .collect(),
            stacks: (0..wiring.host_ports.len()).map(|_| None).collect(),
            link_up: vec![true; wiring.links.len()],
            link_errors: vec![(0.0, 0.0); wiring.links.len()],
            rng: SmallRng::seed_from_u64(config.seed),
            config,
            wiring,
            ports,
            switches,
            attached: 0,
            events: BTreeMap::new(),
            seq: 0,
            now_ns: 0,
            delivered: Vec::new(),
            failed: Vec::new(),
            counters: Counters::default(),
            sample_interval_ns: None,
            sample_pending: false,
            samples: Vec::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &FabricConfig {
        &self.config
    }

    /// The wiring (ports, links, routes).
    pub fn wiring(&self) -> &Wiring {
        &self.wiring
    }

    /// Attach the next host slot; returns its index.
    pub fn add_host(&mut self) -> Result<HostIdx, String> {
        if self.attached == self.hosts.len() {
            return Err(format!(
                "all {} host slots of the topology are taken",
                self.hosts.len()
            ));
        }
        self.attached += 1;
        Ok(self.attached - 1)
    }

    /// Hosts attached.
    pub fn hosts(&self) -> usize {
        self.attached
    }

    /// Current time of the engine, ns.
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// Time of the next event, if any.
    pub fn next_event_ns(&self) -> Option<u64> {
        self.events.keys().next().map(|&(t, _)| t)
    }

    /// Bytes host `src` has queued and not yet had acknowledged.
    pub fn nic_queue_bytes(&self, src: HostIdx) -> u64 {
        self.hosts[src].queued_bytes
    }

    /// Bytes host `src` has queued towards `dst` (on any path) and not yet had
    /// acknowledged.
    pub fn qp_queue_bytes(&self, src: HostIdx, dst: HostIdx) -> u64 {
        self.qps(src, dst).map(|qp| qp.queued_bytes).sum::<u64>()
            + self.stacks[src].as_ref().map_or(0, |s| s.tx_bytes(dst))
    }

    /// Host `src`'s QPs towards `dst`, by path.
    fn qps(&self, src: HostIdx, dst: HostIdx) -> impl Iterator<Item = &SendQp> {
        self.hosts[src]
            .send
            .range((dst, 0)..=(dst, Path::MAX))
            .map(|(_, qp)| qp)
    }

    /// Congestion signals host `src` has seen on its connection to `dst` (CNPs, ECN
    /// echoes, retransmits, the last RTT sample, and ECN-marked packets it received
    /// from `dst`); zero if the two never exchanged a packet.
    pub fn signals(&self, src: HostIdx, dst: HostIdx) -> weir_core::transport::CongestionSignals {
        use weir_core::transport::CongestionSignals;
        let sent = self
            .qps(src, dst)
            .fold(CongestionSignals::default(), |a, qp| {
                let b = qp.signals;
                CongestionSignals {
                    cnps: a.cnps + b.cnps,
                    ecn_echoes: a.ecn_echoes + b.ecn_echoes,
                    retransmits: a.retransmits + b.retransmits,
                    rtt_ns_last: if b.rtt_ns_last > 0 {
                        b.rtt_ns_last
                    } else {
                        a.rtt_ns_last
                    },
                    marked_in: 0,
                }
            });
        let marked_in = self.hosts[src]
            .recv
            .range((dst, 0)..=(dst, Path::MAX))
            .map(|(_, rq)| rq.marked_in)
            .sum();
        CongestionSignals { marked_in, ..sent }
    }

    /// Counters of the whole fabric.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Counters of host `h`'s first NIC port and of the switch port that sends to it.
    pub fn port_stats(&self, h: HostIdx) -> (PortStats, PortStats) {
        let nic = self.wiring.host_ports[h][0];
        (
            self.ports[nic].stats,
            self.ports[self.ports[nic].info.peer].stats,
        )
    }

    /// Counters of every port, by port id.
    pub fn all_port_stats(&self) -> Vec<(PortId, PortInfo, PortStats)> {
        self.ports
            .iter()
            .enumerate()
            .map(|(i, p)| (i, p.info, p.stats))
            .collect()
    }

    /// Record a telemetry sample every `interval_ns` while the fabric is busy (an
    /// idle fabric takes no samples, so sampling never keeps it from going idle).
    pub fn enable_sampling(&mut self, interval_ns: u64) {
        assert!(interval_ns > 0);
        self.sample_interval_ns = Some(interval_ns);
        self.arm_sampling();
    }

    fn arm_sampling(&mut self) {
        if let (Some(interval), false) = (self.sample_interval_ns, self.sample_pending) {
            self.sample_pending = true;
            self.schedule(self.now_ns + interval, Event::Sample);
        }
    }

    /// Samples taken so far.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// Inject `fault` at `at_ns` (not before now).
    pub fn inject(&mut self, at_ns: u64, fault: Fault) {
        self.schedule(at_ns.max(self.now_ns), Event::Fault(fault));
    }

    /// Queue `frame` from `src` to `dst` at `now_ns`, on the path the pair's flow
    /// hash picks. Events due by then run first; their deliveries come out of the
    /// next [`Engine::advance`].
    pub fn send(&mut self, now_ns: u64, src: HostIdx, dst: HostIdx, frame: Frame) {
        let paths = self.config.ports_per_host as u64;
        let path = (Self::flow_hash_of(src, dst) % paths) as Path;
        self.send_on(now_ns, src, dst, path, frame);
    }

    /// Queue `frame` from `src` to `dst` on `path` at `now_ns`.
    pub fn send_on(&mut self, now_ns: u64, src: HostIdx, dst: HostIdx, path: Path, frame: Frame) {
        assert!(src < self.attached && dst < self.attached, "unknown host");
        assert_ne!(src, dst, "a host sends to itself without the fabric");
        assert!(
            usize::from(path) < self.config.ports_per_host,
            "no such path"
        );
        self.process_until(now_ns);
        self.app_send(src, dst, path, frame);
        self.arm_sampling();
    }

    /// Messages given up with failed QPs since the last call, in the order
    /// the QPs failed.
    pub fn take_failures(&mut self) -> Vec<Failure> {
        std::mem::take(&mut self.failed)
    }

    /// Process every event due at or before `now_ns`; return the messages delivered.
    pub fn advance(&mut self, now_ns: u64) -> Vec<Delivery> {
        self.process_until(now_ns);
        std::mem::take(&mut self.delivered)
    }

    /// Run until no event is left or `limit_ns` is reached; return the deliveries.
    pub fn run_until_idle(&mut self, limit_ns: u64) -> Vec<Delivery> {
        let mut all = Vec::new();
        while let Some(t) = self.next_event_ns() {
            if t > limit_ns {
                break;
            }
            all.extend(self.advance(t));
        }
        all
    }

    fn process_until(&mut self, now_ns: u64) {
        let mut processed = 0;
        while let Some(entry) = self.events.first_entry() {
            let (at, _) = *entry.key();
            if at > now_ns || processed == EVENTS_PER_ADVANCE_MAX {
                break;
            }
            let event = entry.remove();
            debug_assert!(at >= self.now_ns, "time went backwards");
            self.now_ns = at;
            self.handle(event);
            self.counters.events += 1;
            processed += 1;
        }
        self.now_ns = self.now_ns.max(now_ns);
    }

    fn schedule(&mut self, at_ns: u64, event: Event) {
        debug_assert!(at_ns >= self.now_ns, "event scheduled in the past");
        self.seq += 1;
        self.events.insert((at_ns, self.seq), event);
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::TxDone { port } => self.tx_done(port),
            Event::Arrive { port, packet } => match self.ports[port].info.device {
                Device::Host(h) => self.host_arrive(h, port, packet),
                Device::Switch(s) => self.switch_arrive(s, port, packet),
            },
            Event::Enqueue { port, packet } => {
                if self.switch_is_down(port) {
                    self.drop_packet(telemetry::DropReason::SwitchReboot);
                } else {
                    self.enqueue(port, packet);
                }
            }
            Event::Wake { port } => {
                if self.ports[port].wake_at == Some(self.now_ns) {
                    self.ports[port].wake_at = None;
                }
                self.try_tx(port);
            }
            Event::QpTimer { host, qp } => self.qp_timer(host, qp),
            Event::SwitchUp { switch } => self.switch_up(switch),
            Event::Fault(fault) => self.apply_fault(fault),
            Event::Sample => self.sample(),
            Event::StackTx {
                src,
                dst,
                path,
                frame,
            } => self.stack_tx(src, dst, path, frame),
            Event::StackIrq { host, queue, at } => self.stack_interrupt_timer(host, queue, at),
            Event::StackDeliver { dst, batch } => self.stack_deliver(dst, batch),
        }
    }

    /// Put `packet` on `port`'s egress queue and start sending if idle.
    fn enqueue(&mut self, port: PortId, packet: Packet) {
        let p = &mut self.ports[port];
        let prio = packet.prio;
        p.queue_bytes[prio] += u64::from(packet.wire_bytes);
        if prio == PRIO_DATA {
            p.stats.queue_bytes_max = p.stats.queue_bytes_max.max(p.queue_bytes[prio]);
        }
        if let packet::Kind::Pause { on } = packet.kind {
            // PAUSE frames go out ahead of everything else queued. Only the newest
            // state matters: a queued, unsent XOFF (or XON) is overwritten, so an
            // XON can never overtake the XOFF it follows, or the reverse.
            let queued = p.queues[prio]
                .iter_mut()
                .find(|q| matches!(q.kind, packet::Kind::Pause { .. }));
            match queued {
                Some(q) => {
                    q.kind = packet::Kind::Pause { on };
                    p.queue_bytes[prio] -= u64::from(packet.wire_bytes);
                }
                None => p.queues[prio].push_front(packet),
            }
        } else {
            p.queues[prio].push_back(packet);
        }
        self.try_tx(port);
    }

    /// If `port` is idle, start serializing its next packet.
    fn try_tx(&mut self, port: PortId) {
        if self.ports[port].on_wire.is_some() {
            return;
        }
        let packet = match self.next_packet(port) {
            Some(p) => p,
            None => return,
        };
        let p = &mut self.ports[port];
        let ser = FabricConfig::serialization_ns(u64::from(packet.wire_bytes), p.info.rate_bps);
        p.on_wire = Some(packet);
        self.schedule(self.now_ns + ser, Event::TxDone { port });
    }

    fn next_packet(&mut self, port: PortId) -> Option<Packet> {
        if let Some(packet) = self.ports[port].queues[PRIO_CONTROL].pop_front() {
            self.ports[port].queue_bytes[PRIO_CONTROL] -= u64::from(packet.wire_bytes);
            return Some(packet);
        }
        if self.ports[port].paused {
            return None;
        }
        match self.ports[port].info.device {
            Device::Host(h) => self.host_next_data(h, port),
            Device::Switch(s) => self.switch_dequeue_data(s, port),
        }
    }

    fn tx_done(&mut self, port: PortId) {
        let mut packet = self.ports[port]
            .on_wire
            .take()
            .expect("a port in TxDone holds a packet");
        let info = self.ports[port].info;
        let p = &mut self.ports[port];
        p.stats.packets += 1;
        p.stats.bytes += u64::from(packet.wire_bytes);
        self.counters.packets += 1;
        self.counters.bytes += u64::from(packet.wire_bytes);
        if let Device::Switch(s) = info.device {
            self.switch_release(s, &packet);
        }
        let (loss, corrupt) = self.link_errors[info.link];
        use rand::Rng;
        if !self.link_up[info.link] {
            self.drop_packet(telemetry::DropReason::LinkDown);
        } else if loss > 0.0 && self.rng.gen_bool(loss) {
            self.drop_packet(telemetry::DropReason::LinkLoss);
        } else {
            if corrupt > 0.0 && self.rng.gen_bool(corrupt) {
                packet.corrupt = true;
            }
            packet.ingress = None;
            let at = self.now_ns + info.delay_ns;
            self.schedule(
                at,
                Event::Arrive {
                    port: info.peer,
                    packet,
                },
            );
        }
        self.try_tx(port);
    }

    fn drop_packet(&mut self, reason: telemetry::DropReason) {
        *self.counters.drops.entry(reason).or_default() += 1;
        if reason == telemetry::DropReason::HeadroomOverflow {
            tracing::error!("lossless packet dropped: PFC headroom overflow");
        }
    }

    /// The peer of `port` asks it to pause (or resume) its data class.
    fn set_paused(&mut self, port: PortId, on: bool) {
        let now = self.now_ns;
        let p = &mut self.ports[port];
        if on && !p.paused {
            p.paused = true;
            p.paused_since_ns = now;
            self.counters.pauses_received += 1;
        } else if !on && p.paused {
            p.paused = false;
            p.stats.paused_ns += now - p.paused_since_ns;
            self.try_tx(port);
        }
    }

    /// Send a PAUSE (XOFF) or resume (XON) frame out of `port` to its peer.
    fn send_pause(&mut self, port: PortId, on: bool) {
        if on {
            self.counters.pauses_sent += 1;
        } else {
            self.counters.resumes_sent += 1;
        }
        let frame = nic::control(0, (0, 0, 0), 0, packet::Kind::Pause { on });
        self.enqueue(port, frame);
    }

    fn apply_fault(&mut self, fault: Fault) {
        tracing::debug!(?fault, at_ns = self.now_ns, "fault");
        match fault {
            Fault::LinkDown { link } => self.link_up[link] = false,
            Fault::LinkUp { link } => self.link_up[link] = true,
            Fault::LinkErrors {
                link,
                loss,
                corrupt,
            } => self.link_errors[link] = (loss.clamp(0.0, 1.0), corrupt.clamp(0.0, 1.0)),
            Fault::PfcStorm { host, on } => {
                self.hosts[host].storm = on;
                for port in self.wiring.host_ports[host].clone() {
                    self.send_pause(port, on);
                }
            }
            Fault::SwitchReboot { switch, down_ns } => self.switch_reboot(switch, down_ns),
        }
    }

    fn sample(&mut self) {
        let mut s = Sample {
            at_ns: self.now_ns,
            queue_bytes: Vec::new(),
            paused: Vec::new(),
            qp_rates: Vec::new(),
        };
        for (i, p) in self.ports.iter().enumerate() {
            if matches!(p.info.device, Device::Switch(_)) {
                s.queue_bytes.push((i, p.queue_bytes[PRIO_DATA]));
            }
            if p.paused {
                s.paused.push(i);
            }
        }
        let now = self.now_ns;
        for (h, host) in self.hosts.iter_mut().enumerate() {
            for (&(dst, _), qp) in host.send.iter_mut() {
                // Only QPs DCQCN is holding below line rate: the rest are at line
                // rate, and listing them would swamp the series.
                if let Some(rp) = &mut qp.rp {
                    let rate = rp.rate_bps();
                    if rate < rp.params().line_rate_bps {
                        s.qp_rates.push((h, dst, rate, rp.alpha(now)));
                    }
                }
            }
        }
        self.samples.push(s);
        self.sample_pending = false;
        if !self.events.is_empty() {
            self.arm_sampling();
        }
    }
}

/// A 64-bit mix (splitmix64 finalizer) for flow hashes.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests;
