//! Switch behaviour of the engine: admission and PFC at ingress, ECMP forwarding,
//! ECN marking at egress dequeue, buffer release on departure, reboot.

use super::config::{FabricConfig, CONTROL_FRAME_BYTES};
use super::mmu::{Mmu, PfcAction};
use super::packet::{Kind, Packet, PRIO_DATA};
use super::telemetry::DropReason;
use super::topology::{Device, PortId, SwitchIdx, Wiring};
use super::{mix, Engine, Event, Switch};
use rand::Rng;

/// Build switch `s`: per ingress port, a headroom of `headroom_rtt_factor` x rate x
/// propagation delay plus one maximal frame and one PAUSE frame, and an XOFF shift
/// one smaller per doubling of the port's speed over the host speed.
pub(super) fn new_switch(
    config: &FabricConfig,
    wiring: &Wiring,
    s: SwitchIdx,
) -> Result<Switch, String> {
    let pfc = config.switch.pfc;
    let mut local = std::collections::BTreeMap::new();
    let mut queues = Vec::new();
    for (i, &port) in wiring.switch_ports[s].iter().enumerate() {
        let info = wiring.ports[port];
        let bdp = (info.rate_bps as u128 * u128::from(info.delay_ns) / 8_000_000_000) as u64;
        let frame = u64::from(config.nic.mtu_bytes + config.header_bytes + CONTROL_FRAME_BYTES);
        // Without PFC (TCP mode) nothing is held back for in-flight data.
        let headroom = if pfc.enabled {
            pfc.headroom_rtt_factor * bdp + frame
        } else {
            0
        };
        let doublings = (info.rate_bps / wiring.host_rate_bps.max(1)).max(1).ilog2();
        let shift = pfc.xoff_shift_at_host_speed.saturating_sub(doublings);
        local.insert(port, i);
        queues.push((headroom, shift));
    }
    let reserve = if pfc.enabled { pfc.reserve_bytes } else { 0 };
    let reserved: u64 = queues.iter().map(|(h, _)| h + reserve).sum();
    if reserved >= config.switch.buffer_bytes {
        return Err(format!(
            "fabric config `switch.buffer_bytes`: {} B cannot hold the {} B of headroom and reserve of switch {s}",
            config.switch.buffer_bytes, reserved
        ));
    }
    Ok(Switch {
        local,
        mmu: Mmu::new(
            config.switch.buffer_bytes,
            pfc.reserve_bytes,
            pfc.resume_offset_bytes,
            &queues,
        ),
        down_until_ns: 0,
    })
}

impl Engine {
    pub(super) fn switch_arrive(&mut self, s: SwitchIdx, port: PortId, mut packet: Packet) {
        if self.now_ns < self.switches[s].down_until_ns {
            return self.drop_packet(DropReason::SwitchReboot);
        }
        if let Kind::Pause { on } = packet.kind {
            return self.set_paused(port, on);
        }
        let q = self.switches[s].local[&port];
        let size = u64::from(packet.wire_bytes);
        let Some(egress) = self.ecmp(s, &packet) else {
            return self.drop_packet(DropReason::NoRoute);
        };
        let lossless = packet.prio == PRIO_DATA && self.config.switch.pfc.enabled;
        if !lossless && packet.is_data() {
            // Drop-tail with a dynamic threshold: an egress queue may hold a share
            // of what is still free.
            let share = self.config.tcp.map_or(1.0, |t| t.queue_share);
            let free = self.config.switch.buffer_bytes - self.switches[s].mmu.used_bytes();
            if self.ports[egress].queue_bytes[PRIO_DATA] + size > (free as f64 * share) as u64 {
                return self.drop_packet(DropReason::BufferFull);
            }
        }
        let mmu = &mut self.switches[s].mmu;
        let admitted = if lossless {
            mmu.admit_lossless(q, size)
                .map_err(|_| DropReason::HeadroomOverflow)
        } else {
            mmu.admit_lossy(size).map_err(|_| DropReason::BufferFull)
        };
        if let Err(reason) = admitted {
            return self.drop_packet(reason);
        }
        if lossless {
            self.pfc_check(s, port);
        }
        packet.ingress = Some(port);
        let at = self.now_ns + self.config.switch.forwarding_ns;
        self.schedule(
            at,
            Event::Enqueue {
                port: egress,
                packet,
            },
        );
    }

    /// Send XOFF or XON upstream of ingress `port` if its queue crossed a threshold.
    fn pfc_check(&mut self, s: SwitchIdx, port: PortId) {
        let q = self.switches[s].local[&port];
        match self.switches[s].mmu.pfc_action(q) {
            Some(PfcAction::Pause) => self.send_pause(port, true),
            Some(PfcAction::Resume) => self.send_pause(port, false),
            None => {}
        }
    }

    /// ECMP: one of the up egress ports on a shortest path, by flow hash.
    fn ecmp(&self, s: SwitchIdx, packet: &Packet) -> Option<PortId> {
        let routes = &self.wiring.routes[s][packet.dst][usize::from(packet.path)];
        let up = |p: &&PortId| self.link_up[self.ports[**p].info.link];
        let n = routes.iter().filter(up).count();
        if n == 0 {
            return None;
        }
        let pick =
            (mix(packet.hash ^ (s as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) % n as u64) as usize;
        routes.iter().filter(up).nth(pick).copied()
    }

    /// Dequeue the next data packet of egress `port`, marking ECN RED-style on the
    /// queue's bytes with the packet still counted (the reference simulator takes it
    /// off first: one frame less), or on the shared buffer's occupancy when that
    /// is configured and reached.
    pub(super) fn switch_dequeue_data(&mut self, s: SwitchIdx, port: PortId) -> Option<Packet> {
        let pct = u64::from(self.config.switch.ecn_buffer_pct);
        let buffer_full = pct > 0
            && self.switches[s].mmu.used_bytes() * 100 >= pct * self.config.switch.buffer_bytes;
        let p = &mut self.ports[port];
        let mut packet = p.queues[PRIO_DATA].pop_front()?;
        let queued = p.queue_bytes[PRIO_DATA];
        p.queue_bytes[PRIO_DATA] -= u64::from(packet.wire_bytes);
        let ecn = p.ecn;
        let (kmin, kmax) = (ecn.kmin_bytes, ecn.kmax_bytes);
        let prob = if buffer_full {
            1.0
        } else if queued <= kmin {
            0.0
        } else if queued <= kmax {
            ecn.pmax * (queued - kmin) as f64 / (kmax - kmin).max(1) as f64
        } else {
            1.0
        };
        if prob > 0.0 && packet.is_data() && self.rng.gen_bool(prob.min(1.0)) {
            if !packet.ce {
                self.counters.ecn_marks += 1;
            }
            packet.ce = true;
        }
        Some(packet)
    }

    /// `packet` left switch `s`: give its buffer back and maybe resume its upstream.
    pub(super) fn switch_release(&mut self, s: SwitchIdx, packet: &Packet) {
        let Some(ingress) = packet.ingress else {
            return; // Admitted before a reboot, or a PAUSE frame.
        };
        let q = self.switches[s].local[&ingress];
        let size = u64::from(packet.wire_bytes);
        if packet.prio == PRIO_DATA && self.config.switch.pfc.enabled {
            self.switches[s].mmu.release_lossless(q, size);
            self.pfc_check(s, ingress);
        } else {
            self.switches[s].mmu.release_lossy(size);
        }
        debug_assert!({
            self.switches[s].mmu.self_check();
            true
        });
    }

    /// True if `port` belongs to a switch that is rebooting.
    pub(super) fn switch_is_down(&self, port: PortId) -> bool {
        match self.ports[port].info.device {
            Device::Switch(s) => self.now_ns < self.switches[s].down_until_ns,
            Device::Host(_) => false,
        }
    }

    pub(super) fn switch_reboot(&mut self, s: SwitchIdx, down_ns: u64) {
        // Packets still inside the forwarding pipeline land while it is down.
        let down_ns = down_ns.max(self.config.switch.forwarding_ns + 1);
        self.switches[s].down_until_ns = self.now_ns + down_ns;
        self.switches[s].mmu.reset();
        for port in self.wiring.switch_ports[s].clone() {
            let p = &mut self.ports[port];
            let lost: usize = p.queues.iter().map(|q| q.len()).sum();
            for q in p.queues.iter_mut() {
                q.clear();
            }
            p.queue_bytes = [0; super::packet::PRIOS];
            if let Some(on_wire) = &mut p.on_wire {
                on_wire.ingress = None; // Its buffer is already forgotten.
            }
            for _ in 0..lost {
                self.drop_packet(DropReason::SwitchReboot);
            }
        }
        self.schedule(self.now_ns + down_ns, Event::SwitchUp { switch: s });
    }

    /// A rebooted switch is back: whatever pause it held upstream is lifted.
    pub(super) fn switch_up(&mut self, s: SwitchIdx) {
        for port in self.wiring.switch_ports[s].clone() {
            self.send_pause(port, false);
        }
    }
}
