//! A run's fault plan: a typed value drawn from the seed before anything is
//! injected, printed in the report, then carried out as it says.
//!
//! [`FaultPlan::draw`] makes every random choice (which link, which node, when,
//! for how long) from the run's seeded generator, in a fixed order, and nothing
//! else; [`FaultPlan::inject`] schedules the plan on the fabric, the hosts and the
//! SSDs. So one seed replays the same plan, a test can match on its faults, and the
//! plan is known (to the checkers and the report) before the first fault lands.

use super::{MEDIA_ERROR_BYTES, WARMUP_US};
use crate::scenario::Scenario;
use madsim::rand::{thread_rng, Rng};
use madsim::runtime::Handle;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use weir_core::control::{ClusterState, Command};
use weir_core::map::ClusterMap;
use weir_core::named::Control;
use weir_core::node::EventLog;
use weir_core::{Event, Lba, NodeId};
use weir_nvme_sim::SimSsd;
use weir_transport_sim::Fabric;

/// One fault.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Every link loses and corrupts packets at these rates, from the start.
    LinkErrors {
        /// Loss per packet.
        loss: f64,
        /// Corruption per packet.
        corrupt: f64,
    },
    /// A link goes down, and up again `down_us` later.
    LinkFlap {
        /// The fabric's link index.
        link: usize,
        /// Its name.
        name: String,
        /// How long it stays down.
        down_us: u64,
    },
    /// A node crashes for good.
    Crash {
        /// The node.
        node: NodeId,
    },
    /// A node's process stops, and goes on `for_us` later.
    Pause {
        /// The node.
        node: NodeId,
        /// How long.
        for_us: u64,
    },
    /// Every link towards a node goes down, and up again `for_us` later.
    Partition {
        /// The node.
        node: NodeId,
        /// How long.
        for_us: u64,
    },
    /// A node's SSD stops answering, and answers again `for_us` later.
    DeviceHang {
        /// The node.
        node: NodeId,
        /// How long.
        for_us: u64,
    },
    /// A node crashes (or loses power: its SSD's volatile cache is lost) and
    /// restarts `after_us` later from its device and durable files.
    Restart {
        /// The node.
        node: NodeId,
        /// A power loss rather than a crash.
        power_loss: bool,
        /// Time until the restart.
        after_us: u64,
    },
    /// A node's SSD disappears for good.
    DeviceLoss {
        /// The node.
        node: NodeId,
    },
    /// A run of a node's SSD blocks becomes unreadable.
    MediaErrors {
        /// The node.
        node: NodeId,
        /// The first block.
        first: u64,
        /// Blocks in the run.
        blocks: u64,
    },
    /// An operator adds a node that was started to join (`weir node add`).
    Join {
        /// The node.
        node: NodeId,
    },
    /// An operator removes a member (`weir node remove`): its replicas move
    /// away, then it leaves.
    Remove {
        /// The node.
        node: NodeId,
    },
}

impl Fault {
    /// The host a crash, pause or device fault strikes (`None` for the
    /// others: link faults, restarts, joins and removals).
    fn struck_host(&self) -> Option<NodeId> {
        match *self {
            Fault::Crash { node }
            | Fault::Pause { node, .. }
            | Fault::DeviceHang { node, .. }
            | Fault::DeviceLoss { node }
            | Fault::MediaErrors { node, .. } => Some(node),
            _ => None,
        }
    }

    /// The node the fault strikes, if it is a node fault.
    pub fn node(&self) -> Option<NodeId> {
        match self {
            Fault::LinkErrors { .. } | Fault::LinkFlap { .. } => None,
            Fault::Crash { node }
            | Fault::Pause { node, .. }
            | Fault::Partition { node, .. }
            | Fault::DeviceHang { node, .. }
            | Fault::Restart { node, .. }
            | Fault::DeviceLoss { node }
            | Fault::MediaErrors { node, .. }
            | Fault::Join { node }
            | Fault::Remove { node } => Some(*node),
        }
    }

    /// How long the fault lasts, if it ends (the run's liveness counts from the
    /// end of the last one).
    pub fn lasts_us(&self) -> Option<u64> {
        match self {
            Fault::Pause { for_us, .. }
            | Fault::Partition { for_us, .. }
            | Fault::DeviceHang { for_us, .. } => Some(*for_us),
            Fault::Restart { after_us, .. } => Some(*after_us),
            _ => None,
        }
    }

    /// Whether the node it strikes ends the run down or without a device.
    fn loses_node(&self) -> bool {
        matches!(self, Fault::Crash { .. } | Fault::DeviceLoss { .. })
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |us: u64| us as f64 / 1e3;
        match self {
            Fault::LinkErrors { loss, corrupt } => write!(
                f,
                "every link: loss {loss}, corruption {corrupt} per packet"
            ),
            Fault::LinkFlap { name, down_us, .. } => {
                write!(f, "link {name} down for {down_us} us")
            }
            Fault::Crash { node } => write!(f, "node {node} crashes"),
            Fault::Pause { node, for_us } => {
                write!(f, "node {node} pauses for {} ms", ms(*for_us))
            }
            Fault::Partition { node, for_us } => {
                write!(f, "node {node} cut off for {} ms", ms(*for_us))
            }
            Fault::DeviceHang { node, for_us } => {
                write!(f, "the device of {node} hangs for {} ms", ms(*for_us))
            }
            Fault::Restart {
                node,
                power_loss,
                after_us,
            } => {
                let what = if *power_loss {
                    "loses power (its SSD's volatile cache is lost)"
                } else {
                    "crashes"
                };
                write!(
                    f,
                    "node {node} {what} and restarts {} ms later",
                    ms(*after_us)
                )
            }
            Fault::DeviceLoss { node } => write!(f, "the SSD of {node} disappears"),
            Fault::Join { node } => write!(f, "node {node} is added"),
            Fault::Remove { node } => write!(f, "node {node} is removed"),
            Fault::MediaErrors {
                node,
                first,
                blocks,
            } => write!(
                f,
                "the SSD of {node} cannot read blocks {first}..{} (media errors)",
                first + blocks
            ),
        }
    }
}

/// A fault and when it strikes (us from the workload's start).
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    /// When.
    pub at_us: u64,
    /// What.
    pub fault: Fault,
}

/// Every fault of a run, in the order drawn.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultPlan {
    /// The faults.
    pub faults: Vec<Planned>,
}

/// When nodes were killed (cluster clock, ns), for the lease checker.
pub type KillLog = Arc<Mutex<Vec<(NodeId, u64)>>>;

/// A storage host of the run: its id, its madsim node and its SSD.
pub type Host = (NodeId, madsim::task::NodeId, Arc<SimSsd>);

/// Ticks of an operator's membership request: it asks again every
/// [`ASK_EVERY`] until the map shows the change (a request can be lost with
/// a leader), at most this many times.
const ASKS_MAX: u32 = 100;
/// Time between an operator's requests.
const ASK_EVERY: Duration = Duration::from_millis(50);

impl FaultPlan {
    /// Draw the scenario's faults from the seed. Fabric faults strike the links
    /// that carry `links` (no host links); node faults each strike a distinct
    /// storage node of `nodes` (the scenario keeps them fewer than the replicas,
    /// so every extent keeps an in-sync copy), at times in the first half of the
    /// run; a crash of "the leader" strikes the first node (the first voter,
    /// which stands for election at once). Each node after the map's members
    /// is added, and removals strike nodes of their own.
    pub fn draw(
        links: &[(usize, String)],
        nodes: &[NodeId],
        s: &Scenario,
        map: &ClusterMap,
    ) -> FaultPlan {
        let mut plan = Self::draw_faults(links, map.nodes(), s, map);
        for &node in nodes.iter().filter(|n| !map.nodes().contains(n)) {
            let at_us = thread_rng().gen_range(0..(s.workload.duration_ms * 500).max(1));
            plan.push(at_us, Fault::Join { node });
        }
        plan.self_check();
        plan
    }

    /// One table, argued long: a draw per fault kind, in the order the seed's
    /// randomness is taken (reordering would change every seed's plan).
    fn draw_faults(
        links: &[(usize, String)],
        nodes: &[NodeId],
        s: &Scenario,
        map: &ClusterMap,
    ) -> FaultPlan {
        let mut plan = FaultPlan::default();
        let f = &s.faults;
        if f.link_loss > 0.0 || f.link_corrupt > 0.0 {
            plan.push(
                0,
                Fault::LinkErrors {
                    loss: f.link_loss,
                    corrupt: f.link_corrupt,
                },
            );
        }
        let duration_us = s.workload.duration_ms * 1000;
        for _ in 0..f.link_flaps {
            let (link, name) = links[thread_rng().gen_range(0..links.len())].clone();
            let at_us = thread_rng().gen_range(0..duration_us.max(1));
            let down_us = thread_rng()
                .gen_range(f.flap_down_us / 10..=f.flap_down_us)
                .max(1);
            plan.push(
                at_us,
                Fault::LinkFlap {
                    link,
                    name,
                    down_us,
                },
            );
        }
        let mut victims = nodes.to_vec();
        let first_half_us = || thread_rng().gen_range(0..(s.workload.duration_ms * 500).max(1));
        let lasting = |longest_ms: u64| {
            let longest_us = longest_ms * 1000;
            thread_rng().gen_range(longest_us / 4..=longest_us).max(1)
        };
        let mut victim = |leader: bool| {
            let pick = if leader {
                0
            } else {
                thread_rng().gen_range(0..victims.len())
            };
            victims.remove(pick)
        };
        for i in 0..f.node_crashes {
            let node = victim(i == 0 && f.crash_leader);
            plan.push(first_half_us(), Fault::Crash { node });
        }
        for _ in 0..f.node_pauses {
            let node = victim(false);
            let (at_us, for_us) = (first_half_us(), lasting(f.pause_ms));
            plan.push(at_us, Fault::Pause { node, for_us });
        }
        for _ in 0..f.partitions {
            let node = victim(false);
            let (at_us, for_us) = (first_half_us(), lasting(f.partition_ms));
            plan.push(at_us, Fault::Partition { node, for_us });
        }
        for _ in 0..f.device_hangs {
            let node = victim(false);
            let (at_us, for_us) = (first_half_us(), lasting(f.hang_ms));
            plan.push(at_us, Fault::DeviceHang { node, for_us });
        }
        let restarts = (0..f.node_restarts).map(|_| false);
        for power_loss in restarts.chain((0..f.power_losses).map(|_| true)) {
            let node = victim(false);
            let (at_us, after_us) = (first_half_us(), lasting(f.restart_ms));
            plan.push(
                at_us,
                Fault::Restart {
                    node,
                    power_loss,
                    after_us,
                },
            );
        }
        for _ in 0..f.device_losses {
            let node = victim(false);
            plan.push(first_half_us(), Fault::DeviceLoss { node });
        }
        let extent_blocks = map.volume().extent_blocks;
        let blocks = (MEDIA_ERROR_BYTES / u64::from(s.cluster.block_size)).min(extent_blocks);
        for _ in 0..f.media_errors {
            let node = victim(false);
            let at_us = first_half_us();
            // In an extent the node holds a replica of, so the blocks are read.
            let held: Vec<u64> = map
                .state()
                .extents
                .iter()
                .filter(|(_, e)| e.replicas.contains(&node))
                .map(|(id, _)| id.0)
                .collect();
            let extent = held[thread_rng().gen_range(0..held.len())];
            let within = thread_rng().gen_range(0..extent_blocks / blocks) * blocks;
            let first = extent * extent_blocks + within;
            plan.push(
                at_us,
                Fault::MediaErrors {
                    node,
                    first,
                    blocks,
                },
            );
        }
        for _ in 0..f.node_removals {
            let node = victim(false);
            plan.push(first_half_us(), Fault::Remove { node });
        }
        plan
    }

    fn push(&mut self, at_us: u64, fault: Fault) {
        self.faults.push(Planned { at_us, fault });
    }

    /// Assert what [`Self::draw`] promises: node faults strike distinct nodes.
    fn self_check(&self) {
        let struck: Vec<NodeId> = self.faults.iter().filter_map(|p| p.fault.node()).collect();
        let distinct: std::collections::BTreeSet<_> = struck.iter().collect();
        assert_eq!(distinct.len(), struck.len(), "one node fault per node");
    }

    /// The nodes removed from the cluster.
    pub fn removed(&self) -> Vec<NodeId> {
        self.faults
            .iter()
            .filter_map(|p| match p.fault {
                Fault::Remove { node } => Some(node),
                _ => None,
            })
            .collect()
    }

    /// The nodes of `nodes` that end the run alive, with a device, and members.
    pub fn live(&self, nodes: &[NodeId]) -> Vec<NodeId> {
        let mut lost: Vec<NodeId> = self
            .faults
            .iter()
            .filter(|p| p.fault.loses_node())
            .filter_map(|p| p.fault.node())
            .collect();
        lost.extend(self.removed());
        nodes
            .iter()
            .copied()
            .filter(|n| !lost.contains(n))
            .collect()
    }

    /// When the last fault with an end ends (us from the workload's start).
    pub fn end_us(&self) -> u64 {
        self.faults
            .iter()
            .filter_map(|p| p.fault.lasts_us().map(|d| p.at_us + d))
            .max()
            .unwrap_or(0)
    }

    /// When the first fault strikes (ns from the workload's start), if any.
    pub fn first_ns(&self) -> Option<u64> {
        self.faults.iter().map(|p| p.at_us * 1000).min()
    }

    /// The report's lines: each fault in time order, its time from the cluster's
    /// start (like the control-plane events').
    pub fn lines(&self) -> Vec<String> {
        let mut faults: Vec<(u64, String)> = self
            .faults
            .iter()
            .map(|p| (p.at_us, p.fault.to_string()))
            .collect();
        faults.sort();
        faults
            .into_iter()
            .map(|(at_us, what)| format!("{:.3} ms: {what}", (at_us + WARMUP_US) as f64 / 1e3))
            .collect()
    }

    /// Carry the plan out: fabric faults on the fabric, node faults as tasks that
    /// strike at their time. Kills go to `kills`, power losses to `events` (its
    /// times count from `cluster_start`).
    pub fn inject(
        &self,
        fabric: &Fabric,
        (hosts, handles): (&[Host], &super::cluster::Handles),
        (events, kills, cluster_start): (&EventLog, &KillLog, Instant),
    ) {
        let host_of = |node: NodeId| {
            hosts
                .iter()
                .find(|(n, ..)| *n == node)
                .cloned()
                .expect("a victim is a host")
        };
        for p in &self.faults {
            let at_us = p.at_us;
            if let Some(node) = p.fault.struck_host() {
                tokio::spawn(strike(host_of(node), at_us, p.fault.clone(), kills.clone()));
                continue;
            }
            match p.fault.clone() {
                f @ (Fault::LinkErrors { .. }
                | Fault::LinkFlap { .. }
                | Fault::Partition { .. }) => link_fault(fabric, at_us, f),
                Fault::Restart {
                    node,
                    power_loss,
                    after_us,
                } => {
                    let victim = host_of(node);
                    let logs = (events.clone(), kills.clone(), cluster_start);
                    tokio::spawn(restart(victim, (at_us, after_us, power_loss), logs));
                }
                Fault::Crash { .. }
                | Fault::Pause { .. }
                | Fault::DeviceHang { .. }
                | Fault::DeviceLoss { .. }
                | Fault::MediaErrors { .. } => unreachable!("struck above"),
                Fault::Join { node } => {
                    let command = Command::JoinNode {
                        node,
                        addr: String::new(),
                    };
                    let done = move |s: &ClusterState| s.nodes.contains_key(&node);
                    tokio::spawn(operator(
                        handles.clone(),
                        Duration::from_micros(at_us),
                        command,
                        done,
                    ));
                }
                Fault::Remove { node } => {
                    let command = Command::RemoveNode { node };
                    let done = move |s: &ClusterState| {
                        s.leaving.contains(&node) || !s.nodes.contains_key(&node)
                    };
                    tokio::spawn(operator(
                        handles.clone(),
                        Duration::from_micros(at_us),
                        command,
                        done,
                    ));
                }
            }
        }
    }
}

/// Inject link fault `fault` of the plan at `at_us`.
fn link_fault(fabric: &Fabric, at_us: u64, fault: Fault) {
    use weir_transport_sim::fabric::Fault as Link;
    let at = Duration::from_micros;
    match fault {
        Fault::LinkErrors { loss, corrupt } => {
            let links: Vec<usize> = fabric
                .links()
                .into_iter()
                .filter(|(_, name)| !name.contains("host"))
                .map(|(link, _)| link)
                .collect();
            for link in links {
                fabric.inject(
                    Duration::ZERO,
                    Link::LinkErrors {
                        link,
                        loss,
                        corrupt,
                    },
                );
            }
        }
        Fault::LinkFlap { link, down_us, .. } => {
            fabric.inject(at(at_us), Link::LinkDown { link });
            fabric.inject(at(at_us + down_us), Link::LinkUp { link });
        }
        Fault::Partition { node, for_us } => {
            let suffix = format!("->{node}");
            for (link, _) in fabric
                .links()
                .into_iter()
                .filter(|(_, n)| n.ends_with(&suffix))
            {
                fabric.inject(at(at_us), Link::LinkDown { link });
                fabric.inject(at(at_us + for_us), Link::LinkUp { link });
            }
        }
        _ => unreachable!("not a link fault: {fault:?}"),
    }
}

/// Strike `victim` with `fault` (a crash, pause or device fault of the
/// plan) at `at_us`; a crash is logged in `kills`.
async fn strike((node, host, ssd): Host, at_us: u64, fault: Fault, kills: KillLog) {
    let at = Duration::from_micros;
    tokio::time::sleep(at(at_us)).await;
    match fault {
        Fault::Crash { .. } => {
            Handle::current().kill(host);
            let now = weir_core::time::cluster_ns();
            kills.lock().expect("kill log").push((node, now));
        }
        Fault::Pause { for_us, .. } => {
            Handle::current().pause(host);
            tokio::time::sleep(at(for_us)).await;
            Handle::current().resume(host);
        }
        Fault::DeviceHang { for_us, .. } => {
            ssd.hang();
            tokio::time::sleep(at(for_us)).await;
            ssd.resume();
        }
        // Unpowered for good: every command fails with `Gone`.
        Fault::DeviceLoss { .. } => {
            ssd.power_loss();
        }
        Fault::MediaErrors { first, blocks, .. } => ssd.media_error(Lba(first), blocks),
        _ => unreachable!("not a strike: {fault:?}"),
    }
}

/// Crash `victim` at `at_us`, cutting its SSD's power too if `power_loss`
/// (logged with the nodes' events), and start it again `after_us` later.
async fn restart(
    (node, host, ssd): Host,
    (at_us, after_us, power_loss): (u64, u64, bool),
    (events, kills, cluster_start): (EventLog, KillLog, Instant),
) {
    let at = Duration::from_micros;
    tokio::time::sleep(at(at_us)).await;
    Handle::current().kill(host);
    let now = weir_core::time::cluster_ns();
    kills.lock().expect("kill log").push((node, now));
    if power_loss {
        let dropped_blocks = ssd.power_loss() as u64;
        let lost = Event::PowerLost {
            node,
            dropped_blocks,
        };
        // Event times count from the cluster's start, like the
        // nodes' own.
        let at = (Instant::now() - cluster_start).as_nanos() as u64;
        events.lock().expect("event log").push(at, lost);
    }
    tokio::time::sleep(at(after_us)).await;
    ssd.power_on();
    Handle::current().restart(host);
}

/// An operator's membership request: at `after`, ask a node (the first whose
/// handle takes it) to commit `command`, and ask again until a node's map
/// shows it `done` (at most [`ASKS_MAX`] times; the liveness checker sees a
/// change that never came).
async fn operator(
    handles: super::cluster::Handles,
    after: Duration,
    command: Command,
    done: impl Fn(&ClusterState) -> bool,
) {
    tokio::time::sleep(after).await;
    let nodes = super::cluster::Nodes(handles);
    for _ in 0..ASKS_MAX {
        // The latest map any node has applied.
        let latest = nodes.state();
        if latest.applied > 0 && done(&latest) {
            return;
        }
        // That map's node's leader, else a member not leaving that knows a
        // leader (a removed node's handle may still take a request, and drop
        // it; a crashed node's takes nothing).
        nodes.request(command.clone());
        tokio::time::sleep(ASK_EVERY).await;
    }
}
