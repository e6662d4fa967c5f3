//! The fabric's packet engine, sans-IO: an event queue ordered by (time ns, sequence).
//!
//! Model: a star. Every host has one NIC port, linked to one switch port by a
//! full-duplex link (rate, propagation delay). A message is segmented into MTU-sized
//! packets, each carrying the per-packet header overhead on the wire. Every
//! transmitter (a NIC, or a switch egress port) is a FIFO that serializes one packet at
//! a time at its link rate; the switch is store-and-forward with a fixed forwarding
//! latency. Queues are unbounded in this version and nothing is dropped: delivery is
//! reliable and in order per host pair. PFC, ECN, DCQCN and TCP come next, on top of
//! this engine.
//!
//! Fault model: none yet.
//!
//! The engine never reads a clock: [`Engine::advance`] is told the time, processes
//! every event due by then, and returns the messages delivered.

use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};

/// Fabric parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct FabricConfig {
    /// Rate of every host link, bits per second.
    pub link_bps: u64,
    /// One-way propagation delay of every link, ns.
    pub link_delay_ns: u64,
    /// Payload bytes per packet (RoCE path MTU: 1024 or 4096).
    pub mtu_bytes: u32,
    /// Wire bytes added to every packet: Ethernet (14 + 4 FCS) + IPv4 (20) + UDP (8)
    /// + RoCE BTH (12) + ICRC (4), plus preamble and inter-frame gap (20).
    pub header_bytes: u32,
    /// Switch forwarding latency (cut from arrival to egress enqueue), ns.
    pub switch_latency_ns: u64,
    /// Bytes a host may have queued on its NIC before `send` waits.
    pub nic_queue_bytes_max: u64,
}

impl Default for FabricConfig {
    fn default() -> Self {
        FabricConfig {
            link_bps: 100_000_000_000,
            link_delay_ns: 1_000,
            mtu_bytes: 4096,
            header_bytes: 82,
            switch_latency_ns: 300,
            nic_queue_bytes_max: 64 << 20,
        }
    }
}

impl FabricConfig {
    /// Check the configuration; a bad one gets a message naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.link_bps == 0 {
            return Err("fabric config `link_bps`: must be > 0".into());
        }
        if !matches!(self.mtu_bytes, 256 | 512 | 1024 | 2048 | 4096) {
            return Err("fabric config `mtu_bytes`: must be a RoCE MTU (256..4096)".into());
        }
        if self.nic_queue_bytes_max < u64::from(self.mtu_bytes) {
            return Err("fabric config `nic_queue_bytes_max`: below one MTU".into());
        }
        Ok(())
    }

    /// Time to put `wire_bytes` on a link, ns (rounded up).
    pub fn serialization_ns(&self, wire_bytes: u64) -> u64 {
        (wire_bytes * 8 * 1_000_000_000).div_ceil(self.link_bps)
    }
}

/// Index of a host on the fabric.
pub type HostIdx = usize;

/// A message that reached its destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    /// Sender.
    pub src: HostIdx,
    /// Receiver.
    pub dst: HostIdx,
    /// The message.
    pub frame: Bytes,
    /// Time the last packet arrived, ns.
    pub at_ns: u64,
}

#[derive(Clone, Debug)]
struct Packet {
    src: HostIdx,
    dst: HostIdx,
    wire_bytes: u32,
    /// The whole message rides on its last packet.
    frame: Option<Bytes>,
}

/// Where a link delivers: the switch or a host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hop {
    Switch,
    Host(HostIdx),
}

/// A transmitter: a FIFO serialized onto one link.
#[derive(Debug, Default)]
struct Port {
    queue: VecDeque<Packet>,
    queue_bytes: u64,
    busy: bool,
    stats: PortStats,
}

/// Counters of one transmitter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Packets sent.
    pub packets: u64,
    /// Wire bytes sent.
    pub bytes: u64,
    /// Most bytes ever waiting in the queue.
    pub queue_bytes_max: u64,
}

#[derive(Debug)]
enum Event {
    /// A port finished serializing its head packet.
    TxDone { port: usize },
    /// A packet reached a hop.
    Arrive { hop: Hop, packet: Packet },
    /// The switch finished forwarding a packet to egress port `port`.
    Forwarded { port: usize, packet: Packet },
}

/// The fabric's state and event queue.
#[derive(Debug)]
pub struct Engine {
    config: FabricConfig,
    /// Ports `0..n` are host NICs, `n..2n` the switch's egress port to host `i - n`.
    ports: Vec<Port>,
    events: BTreeMap<(u64, u64), Event>,
    seq: u64,
    now_ns: u64,
    delivered: Vec<Delivery>,
}

impl Engine {
    /// An empty fabric.
    pub fn new(config: FabricConfig) -> Self {
        Engine {
            config,
            ports: Vec::new(),
            events: BTreeMap::new(),
            seq: 0,
            now_ns: 0,
            delivered: Vec::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &FabricConfig {
        &self.config
    }

    /// Add a host; returns its index. Hosts are added before traffic starts.
    pub fn add_host(&mut self) -> HostIdx {
        let n = self.hosts();
        // Keep NIC ports first and switch ports second: insert the NIC at `n`.
        self.ports.insert(n, Port::default());
        self.ports.push(Port::default());
        assert!(
            self.events.is_empty(),
            "hosts are added before traffic starts"
        );
        n
    }

    /// Number of hosts.
    pub fn hosts(&self) -> usize {
        self.ports.len() / 2
    }

    /// Time of the next event, if any.
    pub fn next_event_ns(&self) -> Option<u64> {
        self.events.keys().next().map(|&(t, _)| t)
    }

    /// Bytes queued on host `src`'s NIC.
    pub fn nic_queue_bytes(&self, src: HostIdx) -> u64 {
        self.ports[src].queue_bytes
    }

    /// Counters of host `h`'s NIC and of the switch port towards it.
    pub fn port_stats(&self, h: HostIdx) -> (PortStats, PortStats) {
        (self.ports[h].stats, self.ports[self.hosts() + h].stats)
    }

    /// Queue `frame` from `src` to `dst` at time `now_ns`. Events due by then are
    /// processed first; their deliveries come out of the next [`Engine::advance`].
    pub fn send(&mut self, now_ns: u64, src: HostIdx, dst: HostIdx, frame: Bytes) {
        assert!(src < self.hosts() && dst < self.hosts(), "unknown host");
        self.process_until(now_ns);
        let mtu = self.config.mtu_bytes as usize;
        let packets = frame.len().div_ceil(mtu).max(1);
        for i in 0..packets {
            let payload = (frame.len() - i * mtu).min(mtu);
            let last = i + 1 == packets;
            let packet = Packet {
                src,
                dst,
                wire_bytes: payload as u32 + self.config.header_bytes,
                frame: last.then(|| frame.clone()),
            };
            self.enqueue(src, packet);
        }
    }

    fn schedule(&mut self, at_ns: u64, event: Event) {
        debug_assert!(at_ns >= self.now_ns, "event scheduled in the past");
        self.seq += 1;
        self.events.insert((at_ns, self.seq), event);
    }

    fn enqueue(&mut self, port: usize, packet: Packet) {
        let p = &mut self.ports[port];
        p.queue_bytes += u64::from(packet.wire_bytes);
        p.stats.queue_bytes_max = p.stats.queue_bytes_max.max(p.queue_bytes);
        p.queue.push_back(packet);
        if !p.busy {
            self.start_tx(port);
        }
    }

    fn start_tx(&mut self, port: usize) {
        let Some(head) = self.ports[port].queue.front() else {
            return;
        };
        let done = self.now_ns + self.config.serialization_ns(u64::from(head.wire_bytes));
        self.ports[port].busy = true;
        self.schedule(done, Event::TxDone { port });
    }

    /// Process every event due at or before `now_ns`; return the messages delivered.
    pub fn advance(&mut self, now_ns: u64) -> Vec<Delivery> {
        self.process_until(now_ns);
        std::mem::take(&mut self.delivered)
    }

    fn process_until(&mut self, now_ns: u64) {
        while let Some(entry) = self.events.first_entry() {
            let (at, _) = *entry.key();
            if at > now_ns {
                break;
            }
            let event = entry.remove();
            debug_assert!(at >= self.now_ns, "time went backwards");
            self.now_ns = at;
            self.handle(event);
        }
        self.now_ns = self.now_ns.max(now_ns);
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::TxDone { port } => {
                let p = &mut self.ports[port];
                let packet = p.queue.pop_front().expect("a busy port has a head packet");
                p.queue_bytes -= u64::from(packet.wire_bytes);
                p.stats.packets += 1;
                p.stats.bytes += u64::from(packet.wire_bytes);
                p.busy = false;
                let hop = if port < self.hosts() {
                    Hop::Switch
                } else {
                    Hop::Host(port - self.hosts())
                };
                let at = self.now_ns + self.config.link_delay_ns;
                self.schedule(at, Event::Arrive { hop, packet });
                self.start_tx(port);
            }
            Event::Arrive {
                hop: Hop::Switch,
                packet,
            } => {
                // Forwarding latency is modelled as a delay before the egress queue.
                let egress = self.hosts() + packet.dst;
                let at = self.now_ns + self.config.switch_latency_ns;
                self.schedule(
                    at,
                    Event::Forwarded {
                        port: egress,
                        packet,
                    },
                );
            }
            Event::Forwarded { port, packet } => self.enqueue(port, packet),
            Event::Arrive {
                hop: Hop::Host(h),
                packet,
            } => {
                debug_assert_eq!(h, packet.dst, "packet delivered to the wrong host");
                if let Some(frame) = packet.frame {
                    self.delivered.push(Delivery {
                        src: packet.src,
                        dst: packet.dst,
                        frame,
                        at_ns: self.now_ns,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(engine: &mut Engine) -> Vec<Delivery> {
        let mut all = Vec::new();
        while let Some(t) = engine.next_event_ns() {
            all.extend(engine.advance(t));
        }
        all
    }

    #[test]
    fn one_packet_costs_two_serializations_two_propagations_and_the_switch() {
        let config = FabricConfig::default();
        let mut e = Engine::new(config.clone());
        let (a, b) = (e.add_host(), e.add_host());
        e.send(0, a, b, Bytes::from(vec![0; 1000]));
        let d = run(&mut e);
        assert_eq!(d.len(), 1);
        let ser = config.serialization_ns(1000 + u64::from(config.header_bytes));
        let expect = 2 * ser + 2 * config.link_delay_ns + config.switch_latency_ns;
        assert_eq!(d[0].at_ns, expect);
    }

    #[test]
    fn a_long_message_streams_at_line_rate() {
        let config = FabricConfig::default();
        let mut e = Engine::new(config.clone());
        let (a, b) = (e.add_host(), e.add_host());
        let len = 1 << 20;
        e.send(0, a, b, Bytes::from(vec![0; len]));
        let d = run(&mut e);
        let packets = (len as u64).div_ceil(4096);
        let ser = config.serialization_ns(4096 + u64::from(config.header_bytes));
        // Pipelined: all packets on the first link, then one more on the second.
        let expect = (packets + 1) * ser + 2 * config.link_delay_ns + config.switch_latency_ns;
        assert_eq!(d[0].at_ns, expect);
        assert_eq!(e.port_stats(a).0.packets, packets);
    }

    #[test]
    fn messages_between_a_pair_arrive_in_order() {
        let mut e = Engine::new(FabricConfig::default());
        let (a, b) = (e.add_host(), e.add_host());
        let mut d = Vec::new();
        for i in 0..50u8 {
            e.send(
                u64::from(i) * 10,
                a,
                b,
                Bytes::from(vec![i; 100 + 97 * i as usize]),
            );
            d.extend(e.advance(u64::from(i) * 10));
        }
        d.extend(run(&mut e));
        let order: Vec<u8> = d.iter().map(|d| d.frame[0]).collect();
        assert_eq!(order, (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn two_senders_into_one_receiver_take_twice_as_long() {
        let config = FabricConfig::default();
        let msg = || Bytes::from(vec![0; 1 << 20]);
        let mut alone = Engine::new(config.clone());
        let (a, _b, c) = (alone.add_host(), alone.add_host(), alone.add_host());
        for _ in 0..8 {
            alone.send(0, a, c, msg());
        }
        let t1 = run(&mut alone).last().unwrap().at_ns;
        let mut both = Engine::new(config);
        let (a, b, c) = (both.add_host(), both.add_host(), both.add_host());
        for _ in 0..8 {
            both.send(0, a, c, msg());
            both.send(0, b, c, msg());
        }
        let t2 = run(&mut both).last().unwrap().at_ns;
        let ratio = t2 as f64 / t1 as f64;
        assert!(
            (ratio - 2.0).abs() <= 0.1,
            "ratio {ratio}: {t1} ns alone, {t2} ns shared"
        );
        assert!(
            both.port_stats(c).1.queue_bytes_max > 1 << 20,
            "no queue at the bottleneck"
        );
    }
}
