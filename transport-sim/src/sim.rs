//! The fabric as a madsim `Simulator` plugin.
//!
//! One driver task, on a node of its own, owns the clock of the [`Engine`]: it
//! processes every event due at or before madsim's `now` (a task poll advances the
//! clock by 50-100 ns, so it never assumes it woke exactly on time), hands delivered
//! messages to the receivers' inboxes, and sleeps until the next event time, or until
//! a sender queues something new. One madsim timer per wake-up, not per packet.
//!
//! Fault model: the engine's (see `crate::fabric::Fault`); scenarios inject them
//! through [`Fabric::inject`].

use crate::fabric::config::FabricConfig;
use crate::fabric::telemetry::Counters;
use crate::fabric::topology::HostIdx;
use crate::fabric::Engine;
use madsim::plugin::Simulator;
use madsim::rand::GlobalRng;
use madsim::runtime::Handle;
use madsim::time::TimeHandle;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use weir_core::time::sleep_until_exact;
use weir_core::transport::{CongestionSignals, Transport, TransportError};
use weir_core::wire::{Frame, HEADER_BYTES, MAX_BODY_BYTES};
use weir_core::NodeId;

type Inbox = mpsc::UnboundedSender<(NodeId, Frame)>;

struct State {
    engine: Engine,
    hosts: BTreeMap<NodeId, HostIdx>,
    ids: Vec<NodeId>,
    inboxes: Vec<Inbox>,
    space: Vec<Arc<Notify>>,
    driver_started: bool,
}

/// The simulated fabric. Register it with `Runtime::add_simulator::<Fabric>()`,
/// [`Fabric::configure`] it, then make an endpoint per host with
/// [`Fabric::endpoint`].
pub struct Fabric {
    state: Mutex<State>,
    wake: Notify,
    epoch: Instant,
}

impl Simulator for Fabric {
    fn new(_rand: &GlobalRng, time: &TimeHandle, _config: &madsim::Config) -> Self {
        Fabric {
            state: Mutex::new(State {
                engine: Engine::new(FabricConfig::default()).expect("the default fabric is valid"),
                hosts: BTreeMap::new(),
                ids: Vec::new(),
                inboxes: Vec::new(),
                space: Vec::new(),
                driver_started: false,
            }),
            wake: Notify::new(),
            epoch: time.now_instant(),
        }
    }
}

impl Fabric {
    /// The fabric of the current simulation.
    pub fn current() -> Arc<Fabric> {
        madsim::plugin::simulator::<Fabric>()
    }

    /// Set the fabric parameters. Must come before the first endpoint.
    pub fn configure(&self, config: FabricConfig) -> Result<(), String> {
        let engine = Engine::new(config)?;
        let mut s = self.state.lock().expect("fabric state");
        if !s.ids.is_empty() {
            return Err("fabric configured after hosts were added".into());
        }
        s.engine = engine;
        Ok(())
    }

    fn now_ns(&self) -> u64 {
        (Instant::now() - self.epoch).as_nanos() as u64
    }

    /// Attach host `id` to the fabric and return its transport endpoint.
    pub fn endpoint(self: &Arc<Self>, id: NodeId) -> Result<SimTransport, String> {
        let (tx, rx) = mpsc::unbounded_channel();
        let space = Arc::new(Notify::new());
        let mut s = self.state.lock().expect("fabric state");
        if s.hosts.contains_key(&id) {
            return Err(format!("host {id} attached twice"));
        }
        let idx = s.engine.add_host()?;
        s.hosts.insert(id, idx);
        s.ids.push(id);
        s.inboxes.push(tx);
        s.space.push(space.clone());
        if !s.driver_started {
            s.driver_started = true;
            let fabric = self.clone();
            let node = Handle::current().create_node().name("fabric").build();
            node.spawn(async move { fabric.drive().await });
        }
        Ok(SimTransport {
            fabric: self.clone(),
            me: id,
            idx,
            inbox: tokio::sync::Mutex::new(rx),
            space,
        })
    }

    /// Sample queues, pauses and QP rates every `interval` from now on.
    pub fn enable_sampling(&self, interval: std::time::Duration) {
        let mut s = self.state.lock().expect("fabric state");
        s.engine.enable_sampling(interval.as_nanos() as u64);
        self.wake.notify_one();
    }

    /// Samples taken so far (times relative to the fabric's start).
    pub fn samples(&self) -> Vec<crate::fabric::telemetry::Sample> {
        self.state
            .lock()
            .expect("fabric state")
            .engine
            .samples()
            .to_vec()
    }

    /// A name for every switch port: "sw0->n3" is switch 0's port towards node 3.
    pub fn port_names(&self) -> BTreeMap<usize, String> {
        use crate::fabric::topology::Device;
        let s = self.state.lock().expect("fabric state");
        let w = s.engine.wiring();
        let name = |d: Device| match d {
            Device::Switch(i) => format!("sw{i}"),
            Device::Host(h) => s.ids.get(h).map_or(format!("host{h}"), |id| id.to_string()),
        };
        w.ports
            .iter()
            .enumerate()
            .filter(|(_, p)| matches!(p.device, Device::Switch(_)))
            .map(|(i, p)| {
                (
                    i,
                    format!("{}->{}", name(p.device), name(w.ports[p.peer].device)),
                )
            })
            .collect()
    }

    /// Links of the fabric, as (link index, name) with the name of the switch end,
    /// e.g. "sw0->n3".
    pub fn links(&self) -> Vec<(usize, String)> {
        let names = self.port_names();
        let s = self.state.lock().expect("fabric state");
        let w = s.engine.wiring();
        w.links
            .iter()
            .enumerate()
            .map(|(i, &(a, b))| {
                let name = names
                    .get(&b)
                    .or(names.get(&a))
                    .cloned()
                    .unwrap_or(format!("link{i}"));
                (i, name)
            })
            .collect()
    }

    /// Node id of fabric host `h`, if attached.
    pub fn node_of(&self, h: HostIdx) -> Option<NodeId> {
        self.state.lock().expect("fabric state").ids.get(h).copied()
    }

    /// The fabric's counters.
    pub fn counters(&self) -> Counters {
        self.state
            .lock()
            .expect("fabric state")
            .engine
            .counters()
            .clone()
    }

    /// Per-host counters: (NIC, switch port towards the host), by node id.
    pub fn port_stats(&self) -> Vec<(NodeId, crate::PortStats, crate::PortStats)> {
        let s = self.state.lock().expect("fabric state");
        s.hosts
            .iter()
            .map(|(&id, &h)| {
                let (nic, sw) = s.engine.port_stats(h);
                (id, nic, sw)
            })
            .collect()
    }

    /// Inject `fault` after `delay` from now.
    pub fn inject(&self, delay: std::time::Duration, fault: crate::fabric::Fault) {
        let at = self.now_ns() + delay.as_nanos() as u64;
        self.state
            .lock()
            .expect("fabric state")
            .engine
            .inject(at, fault);
        self.wake.notify_one();
    }

    async fn drive(self: Arc<Self>) {
        loop {
            let next = {
                let mut s = self.state.lock().expect("fabric state");
                let delivered = s.engine.advance(self.now_ns());
                for d in delivered {
                    let from = s.ids[d.src];
                    // A receiver that is gone (node killed) loses the message, as a
                    // powered-off host would.
                    let _ = s.inboxes[d.dst].send((from, d.frame));
                }
                for space in &s.space {
                    space.notify_waiters();
                }
                s.engine.next_event_ns()
            };
            match next {
                Some(at) => {
                    let deadline = self.epoch + std::time::Duration::from_nanos(at);
                    // `biased`: tokio's default random branch order would draw from a
                    // thread-local RNG that madsim does not seed.
                    tokio::select! {
                        biased;
                        _ = sleep_until_exact(deadline) => {}
                        _ = self.wake.notified() => {}
                    }
                }
                None => self.wake.notified().await,
            }
        }
    }
}

/// One host's endpoint on the simulated fabric.
pub struct SimTransport {
    fabric: Arc<Fabric>,
    me: NodeId,
    idx: HostIdx,
    inbox: tokio::sync::Mutex<mpsc::UnboundedReceiver<(NodeId, Frame)>>,
    space: Arc<Notify>,
}

impl Transport for SimTransport {
    fn local_id(&self) -> NodeId {
        self.me
    }

    async fn send(&self, to: NodeId, frame: Frame) -> Result<(), TransportError> {
        let max = HEADER_BYTES + MAX_BODY_BYTES;
        if frame.len() > max {
            return Err(TransportError::FrameTooLarge {
                len: frame.len(),
                max,
            });
        }
        loop {
            let notified = self.space.notified();
            tokio::pin!(notified);
            {
                let mut s = self.fabric.state.lock().expect("fabric state");
                let dst = *s.hosts.get(&to).ok_or(TransportError::UnknownPeer(to))?;
                let limit = s.engine.config().nic.send_queue_bytes_max;
                // An empty queue takes any frame, so no frame waits for ever.
                let queued = s.engine.nic_queue_bytes(self.idx);
                if queued == 0 || queued + frame.len() as u64 <= limit {
                    let now = self.fabric.now_ns();
                    s.engine.send(now, self.idx, dst, frame);
                    self.fabric.wake.notify_one();
                    return Ok(());
                }
                // The NIC queue is full: wait until the driver drains some of it.
                notified.as_mut().enable();
            }
            notified.await;
        }
    }

    async fn recv(&self) -> Result<(NodeId, Frame), TransportError> {
        let mut inbox = self.inbox.lock().await;
        inbox.recv().await.ok_or(TransportError::Closed)
    }

    fn signals(&self, peer: NodeId) -> CongestionSignals {
        let s = self.fabric.state.lock().expect("fabric state");
        match s.hosts.get(&peer) {
            Some(&dst) => s.engine.signals(self.idx, dst),
            None => CongestionSignals::default(),
        }
    }
}
