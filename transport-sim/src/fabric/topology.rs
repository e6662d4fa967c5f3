//! Wiring: devices, ports, links and ECMP routes, built once from the topology.

use super::config::{FabricConfig, LinkSpec, Topology};
use std::collections::VecDeque;

/// Index of a port (one end of a link).
pub type PortId = usize;
/// Index of a host.
pub type HostIdx = usize;
/// Index of a switch.
pub type SwitchIdx = usize;
/// One of a host's NIC ports, by its index among the host's ports: a packet on
/// path `k` leaves its sender's port `k` and is addressed to its receiver's port
/// `k` (each port has its own address, as RoCE ports do).
pub type Path = u8;

/// What a port belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// A host NIC.
    Host(HostIdx),
    /// A switch.
    Switch(SwitchIdx),
}

/// One end of a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Owner.
    pub device: Device,
    /// The port at the other end.
    pub peer: PortId,
    /// Link rate, bits per second.
    pub rate_bps: u64,
    /// One-way propagation delay, ns.
    pub delay_ns: u64,
    /// The link (both directions share it).
    pub link: usize,
}

/// The built fabric.
#[derive(Clone, Debug)]
pub struct Wiring {
    /// Every port.
    pub ports: Vec<PortInfo>,
    /// Ports of each host.
    pub host_ports: Vec<Vec<PortId>>,
    /// Ports of each switch.
    pub switch_ports: Vec<Vec<PortId>>,
    /// Links as port pairs.
    pub links: Vec<(PortId, PortId)>,
    /// `routes[switch][host][path]`: egress ports on shortest paths to the host's
    /// port `path` (ECMP set).
    pub routes: Vec<Vec<Vec<Vec<PortId>>>>,
    /// Host link rate (the "host speed" of PFC thresholds).
    pub host_rate_bps: u64,
}

impl Wiring {
    /// Wire `config`'s topology.
    pub fn build(config: &FabricConfig) -> Wiring {
        let mut w = Wiring {
            ports: Vec::new(),
            host_ports: Vec::new(),
            switch_ports: Vec::new(),
            links: Vec::new(),
            routes: Vec::new(),
            host_rate_bps: config.host_link.rate_bps,
        };
        match config.topology {
            Topology::Star { hosts } => {
                w.switch_ports.push(Vec::new());
                for h in 0..hosts {
                    w.host_ports.push(Vec::new());
                    for _ in 0..config.ports_per_host {
                        w.link(Device::Host(h), Device::Switch(0), config.host_link);
                    }
                }
            }
            Topology::LeafSpine {
                leaves,
                spines,
                hosts_per_leaf,
            } => {
                w.switch_ports = vec![Vec::new(); leaves + spines];
                for h in 0..leaves * hosts_per_leaf {
                    w.host_ports.push(Vec::new());
                    for k in 0..config.ports_per_host {
                        let leaf = (h / hosts_per_leaf + k) % leaves;
                        w.link(Device::Host(h), Device::Switch(leaf), config.host_link);
                    }
                }
                for leaf in 0..leaves {
                    for spine in 0..spines {
                        let s = Device::Switch(leaves + spine);
                        w.link(Device::Switch(leaf), s, config.fabric_link);
                    }
                }
            }
        }
        w.routes = (0..w.switch_ports.len())
            .map(|_| vec![vec![Vec::new(); config.ports_per_host]; w.host_ports.len()])
            .collect();
        for h in 0..w.host_ports.len() {
            for path in 0..config.ports_per_host {
                w.route_to(h, path);
            }
        }
        w
    }

    fn link(&mut self, a: Device, b: Device, spec: LinkSpec) {
        let (pa, pb) = (self.ports.len(), self.ports.len() + 1);
        let link = self.links.len();
        for (device, peer) in [(a, pb), (b, pa)] {
            self.ports.push(PortInfo {
                device,
                peer,
                rate_bps: spec.rate_bps,
                delay_ns: spec.delay_ns,
                link,
            });
        }
        self.links.push((pa, pb));
        for (device, port) in [(a, pa), (b, pb)] {
            match device {
                Device::Host(h) => self.host_ports[h].push(port),
                Device::Switch(s) => self.switch_ports[s].push(port),
            }
        }
    }

    /// Breadth-first from port `path` of host `dst` over switches: every
    /// switch's egress ports that lie on a shortest path to it.
    fn route_to(&mut self, dst: HostIdx, path: usize) {
        let mut dist = vec![usize::MAX; self.switch_ports.len()];
        let mut queue = VecDeque::new();
        let p = self.host_ports[dst][path];
        let peer = self.ports[p].peer;
        if let Device::Switch(s) = self.ports[peer].device {
            dist[s] = 1;
            queue.push_back(s);
            self.routes[s][dst][path].push(peer);
        }
        while let Some(s) = queue.pop_front() {
            for &p in &self.switch_ports[s].clone() {
                let peer = self.ports[p].peer;
                let Device::Switch(n) = self.ports[peer].device else {
                    continue;
                };
                if dist[n] == usize::MAX {
                    dist[n] = dist[s] + 1;
                    queue.push_back(n);
                }
                if dist[n] == dist[s] + 1 {
                    // n reaches dst through s: its port `peer` leads there.
                    self.routes[n][dst][path].push(peer);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_spine_routes_up_to_every_spine_and_down_to_the_host() {
        let config = FabricConfig {
            topology: Topology::LeafSpine {
                leaves: 2,
                spines: 3,
                hosts_per_leaf: 2,
            },
            ..FabricConfig::default()
        };
        let w = Wiring::build(&config);
        assert_eq!(w.host_ports.len(), 4);
        // Host 3 is on leaf 1. Leaf 0 has three equal paths (one per spine).
        assert_eq!(w.routes[0][3][0].len(), 3);
        for &p in &w.routes[0][3][0] {
            assert!(matches!(
                w.ports[w.ports[p].peer].device,
                Device::Switch(2..=4)
            ));
        }
        // Leaf 1 and every spine have one way down.
        assert_eq!(w.routes[1][3][0].len(), 1);
        assert_eq!(
            w.ports[w.ports[w.routes[1][3][0][0]].peer].device,
            Device::Host(3)
        );
        for spine in 2..5 {
            assert_eq!(w.routes[spine][3][0].len(), 1);
        }
    }

    #[test]
    fn a_star_with_two_port_hosts_has_one_route_to_each_port() {
        let config = FabricConfig {
            topology: Topology::Star { hosts: 3 },
            ports_per_host: 2,
            ..FabricConfig::default()
        };
        let w = Wiring::build(&config);
        assert_eq!(w.host_ports[2].len(), 2);
        for path in 0..2 {
            assert_eq!(w.routes[0][2][path], [w.ports[w.host_ports[2][path]].peer]);
        }
        assert_eq!(w.links.len(), 6);
    }
}
