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
use crate::fabric::{Delivery, Engine, Failure};
use madsim::plugin::Simulator;
use madsim::rand::GlobalRng;
use madsim::runtime::Handle;
use madsim::time::TimeHandle;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use weir_core::time::sleep_until_exact;
use weir_core::transport::{CongestionSignals, SendError, Transport, TransportError};
use weir_core::wire::{Frame, HEADER_BYTES, MAX_BODY_BYTES};
use weir_core::NodeId;
use weir_transport_rdma::messenger::{Messenger, Out};

type Inbox = mpsc::Sender<(NodeId, Frame)>;

/// Frames delivered to a host and not yet taken by it. Past this the fabric keeps
/// further deliveries waiting (as a receiver's NIC with no receive buffers posted
/// makes its senders wait), and they count against their sender's queue, so a
/// receiver that does not keep up pushes back on its senders' `send`.
pub const INBOX_FRAMES_MAX: usize = 256;

struct State {
    engine: Engine,
    hosts: BTreeMap<NodeId, HostIdx>,
    ids: Vec<NodeId>,
    inboxes: Vec<Inbox>,
    /// By receiver: frames delivered while its inbox was full, oldest first.
    waiting: Vec<VecDeque<(HostIdx, Frame)>>,
    /// Bytes of `waiting` by (sender, receiver).
    waiting_bytes: BTreeMap<(HostIdx, HostIdx), u64>,
    driver_started: bool,
    /// With RDMA's messenger: its settings, and each host's messenger (see
    /// [`Fabric::enable_messenger`]) with its incarnation.
    rdma: Option<weir_transport_rdma::proto::Config>,
    messengers: Vec<(Messenger, u32)>,
    /// The messengers' time-driven work is looked at no earlier than this (the
    /// earliest any of it can be due).
    timers_due_ns: u64,
}

impl State {
    /// Bytes `src` has towards `dst`: on the wire unacknowledged, or delivered and
    /// waiting for room in `dst`'s inbox.
    fn queued(&self, src: HostIdx, dst: HostIdx) -> u64 {
        self.engine.qp_queue_bytes(src, dst)
            + self.waiting_bytes.get(&(src, dst)).copied().unwrap_or(0)
    }

    /// Whether `src`'s queue towards `dst` takes a frame of `len` bytes. An empty
    /// queue takes any frame, so no frame is refused for ever.
    fn takes(&self, src: HostIdx, dst: HostIdx, len: u64) -> bool {
        let queued = self.queued(src, dst);
        queued == 0 || queued + len <= self.engine.config().nic.send_queue_bytes_max
    }

    /// A message reached `dst`: with the messenger, an image for `dst`'s
    /// messenger (its frames then go to the inbox, its answers on the wire, and
    /// the sender's messenger hears that it arrived); without, a frame for the
    /// inbox.
    fn arrive(&mut self, now_ns: u64, d: Delivery) {
        let Delivery {
            src,
            dst,
            frame,
            path,
            ..
        } = d;
        if self.messengers.is_empty() {
            return self.deliver(src, dst, frame);
        }
        let mut out = Out::default();
        let (from, to) = (self.ids[src], self.ids[dst]);
        // A work request for a connection the receiver no longer has finds no
        // queue pair there: its sender's completion is an error.
        let taken = self.messengers[dst]
            .0
            .arrived(from, path, frame, now_ns, &mut out);
        self.put(now_ns, dst, out);
        let mut out = Out::default();
        self.messengers[src]
            .0
            .wire_done(to, path, taken, now_ns, &mut out);
        self.put(now_ns, src, out);
    }

    /// A QP failed (its NIC gave up after its retries): each message given up
    /// is an error completion for the sender's messenger. Without the
    /// messenger they are lost, as the network lost them for good.
    fn failed(&mut self, now_ns: u64, f: Failure) {
        tracing::debug!(?f, "QP failed");
        if self.messengers.is_empty() {
            return;
        }
        let to = self.ids[f.dst];
        for _ in 0..f.messages {
            let mut out = Out::default();
            self.messengers[f.src]
                .0
                .wire_done(to, f.path, false, now_ns, &mut out);
            self.put(now_ns, f.src, out);
        }
    }

    /// Host `id`'s messenger in its incarnation `boot`, with a path per NIC port.
    fn messenger(&self, id: NodeId, boot: u32) -> Result<Messenger, String> {
        let cfg = self.rdma.ok_or("no messenger")?;
        let paths = self.engine.config().ports_per_host as u8;
        Messenger::new(id, cfg, boot)
            .and_then(|m| m.with_paths(paths))
            .map_err(|e| e.to_string())
    }

    /// What host `at`'s messenger handed out: images onto the wire, frames into
    /// its inbox.
    fn put(&mut self, now_ns: u64, at: HostIdx, out: Out) {
        // Whatever a messenger did may have armed a timer, none sooner than this.
        let soonest = now_ns + weir_transport_rdma::messenger::PROBE_AFTER_NS;
        self.timers_due_ns = self.timers_due_ns.min(soonest);
        for (to, path, image) in out.images {
            if let Some(&dst) = self.hosts.get(&to) {
                self.engine.send_on(now_ns, at, dst, path, image);
            }
        }
        for (from, frame) in out.frames {
            let src = self.hosts[&from];
            self.deliver(src, at, frame);
        }
    }

    /// Hand a delivered frame to `dst`'s inbox, or keep it waiting behind the
    /// frames already waiting for `dst`.
    fn deliver(&mut self, src: HostIdx, dst: HostIdx, frame: Frame) {
        let frame = if self.waiting[dst].is_empty() {
            match self.inboxes[dst].try_send((self.ids[src], frame)) {
                Err(mpsc::error::TrySendError::Full((_, frame))) => frame,
                // Delivered; or the receiver is gone (node killed) and loses the
                // message, as a powered-off host would.
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => return,
            }
        } else {
            frame
        };
        *self.waiting_bytes.entry((src, dst)).or_default() += frame.len() as u64;
        self.waiting[dst].push_back((src, frame));
    }

    /// Move frames waiting for `dst` into its inbox while it has room.
    fn move_waiting(&mut self, dst: HostIdx) {
        while let Some((src, frame)) = self.waiting[dst].pop_front() {
            let len = frame.len() as u64;
            match self.inboxes[dst].try_send((self.ids[src], frame)) {
                Err(mpsc::error::TrySendError::Full((_, frame))) => {
                    self.waiting[dst].push_front((src, frame));
                    return;
                }
                Ok(()) | Err(mpsc::error::TrySendError::Closed(_)) => {
                    let bytes = self.waiting_bytes.get_mut(&(src, dst)).expect("counted");
                    *bytes -= len;
                    if *bytes == 0 {
                        self.waiting_bytes.remove(&(src, dst));
                    }
                }
            }
        }
    }
}

/// The simulated fabric. Register it with `Runtime::add_simulator::<Fabric>()`,
/// [`Fabric::configure`] it, then make an endpoint per host with
/// [`Fabric::endpoint`].
pub struct Fabric {
    state: Mutex<State>,
    wake: Notify,
    /// Notified whenever queues may have drained (senders waiting in
    /// [`Transport::writable`] look again).
    space: Notify,
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
                waiting: Vec::new(),
                waiting_bytes: BTreeMap::new(),
                driver_started: false,
                rdma: None,
                messengers: Vec::new(),
                timers_due_ns: u64::MAX,
            }),
            wake: Notify::new(),
            space: Notify::new(),
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

    /// Carry every host's frames through RDMA's messenger
    /// (`weir_transport_rdma::messenger`): connections set up by its connection
    /// manager, SENDs into receive slots under credits, large frames written
    /// into granted regions, on the fabric's RC queue pairs. Must come before
    /// the first endpoint.
    pub fn enable_messenger(&self, cfg: weir_transport_rdma::proto::Config) -> Result<(), String> {
        cfg.validate().map_err(|e| e.to_string())?;
        let mut s = self.state.lock().expect("fabric state");
        if !s.ids.is_empty() {
            return Err("messenger enabled after hosts were added".into());
        }
        s.rdma = Some(cfg);
        Ok(())
    }

    /// Host `id` restarted: its messenger starts afresh (its connections are
    /// gone; peers find out from their next message, or its first).
    pub fn reboot(&self, id: NodeId) {
        let mut s = self.state.lock().expect("fabric state");
        let (Some(_), Some(&h)) = (s.rdma, s.hosts.get(&id)) else {
            return;
        };
        let boot = s.messengers[h].1 + 1;
        s.messengers[h] = (s.messenger(id, boot).expect("validated"), boot);
    }

    /// The counters of every host's messenger in this incarnation, summed; none
    /// without the messenger.
    pub fn messenger_totals(&self) -> Option<weir_transport_rdma::messenger::Counters> {
        let s = self.state.lock().expect("fabric state");
        s.rdma?;
        Some(s.messengers.iter().map(|m| m.0.counters()).sum())
    }

    /// Attach host `id` to the fabric and return its transport endpoint.
    pub fn endpoint(self: &Arc<Self>, id: NodeId) -> Result<SimTransport, String> {
        let (tx, rx) = mpsc::channel(INBOX_FRAMES_MAX);
        let mut s = self.state.lock().expect("fabric state");
        if s.hosts.contains_key(&id) {
            return Err(format!("host {id} attached twice"));
        }
        let idx = s.engine.add_host()?;
        s.hosts.insert(id, idx);
        s.ids.push(id);
        s.inboxes.push(tx);
        s.waiting.push(VecDeque::new());
        if s.rdma.is_some() {
            let m = s.messenger(id, 0)?;
            s.messengers.push((m, 0));
        }
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
            refused: Mutex::new(BTreeSet::new()),
        })
    }

    /// Charge host `id`'s sends and receives to `cpu` by `net`'s costs (see
    /// `weir_host_sim`). The same `cpu` may be given to the host's devices.
    pub fn attach_stack(
        &self,
        id: NodeId,
        cpu: Arc<Mutex<weir_host_sim::Cpu>>,
        net: weir_host_sim::NetStack,
    ) -> Result<(), String> {
        let mut s = self.state.lock().expect("fabric state");
        let idx = *s
            .hosts
            .get(&id)
            .ok_or(format!("host {id} is not attached"))?;
        s.engine.attach_stack(idx, cpu, net);
        Ok(())
    }

    /// The instant fabric time counts from: host CPUs shared with devices count
    /// from it too.
    pub fn epoch(&self) -> Instant {
        self.epoch
    }

    /// Nanoseconds since [`Fabric::epoch`].
    pub fn now_since_epoch_ns(&self) -> u64 {
        self.now_ns()
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
                let now = self.now_ns();
                let delivered = s.engine.advance(now);
                // Frames that waited for room first, so each receiver's order holds.
                for dst in 0..s.waiting.len() {
                    s.move_waiting(dst);
                }
                for d in delivered {
                    s.arrive(now, d);
                }
                for f in s.engine.take_failures() {
                    s.failed(now, f);
                }
                // Connection attempts that timed out, probes; the next one due.
                if s.timers_due_ns <= now {
                    s.timers_due_ns = u64::MAX;
                    let mut due = u64::MAX;
                    for h in 0..s.messengers.len() {
                        let mut out = Out::default();
                        if let Some(t) = s.messengers[h].0.poll(now, &mut out) {
                            due = due.min(t);
                        }
                        s.put(now, h, out);
                    }
                    s.timers_due_ns = s.timers_due_ns.min(due);
                }
                let timer = (s.timers_due_ns != u64::MAX).then_some(s.timers_due_ns);
                self.space.notify_waiters();
                match (s.engine.next_event_ns(), timer) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
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
    inbox: tokio::sync::Mutex<mpsc::Receiver<(NodeId, Frame)>>,
    /// Hosts whose queue refused a frame of ours since they last had room.
    refused: Mutex<BTreeSet<HostIdx>>,
}

impl Transport for SimTransport {
    fn local_id(&self) -> NodeId {
        self.me
    }

    fn send(&self, to: NodeId, frame: Frame) -> Result<(), SendError> {
        debug_assert!(
            frame.local.is_none(),
            "a frame handed over in process sent on the fabric"
        );
        let max = HEADER_BYTES + MAX_BODY_BYTES;
        if frame.len() > max {
            return Err(TransportError::FrameTooLarge {
                len: frame.len(),
                max,
            }
            .into());
        }
        let mut s = self.fabric.state.lock().expect("fabric state");
        let dst = *s.hosts.get(&to).ok_or(TransportError::UnknownPeer(to))?;
        if !s.messengers.is_empty() {
            let now = self.fabric.now_ns();
            let mut out = Out::default();
            let sent = s.messengers[self.idx].0.send(to, frame, now, &mut out);
            if let Err(SendError::Full(_)) = &sent {
                self.refused.lock().expect("refused").insert(dst);
            }
            s.put(now, self.idx, out);
            self.fabric.wake.notify_one();
            return sent;
        }
        if !s.takes(self.idx, dst, frame.len() as u64) {
            self.refused.lock().expect("refused").insert(dst);
            return Err(SendError::Full(frame));
        }
        let now = self.fabric.now_ns();
        s.engine.send(now, self.idx, dst, frame);
        self.fabric.wake.notify_one();
        Ok(())
    }

    async fn writable(&self) {
        loop {
            let notified = self.fabric.space.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                // The fabric's state first, then the refused set: the order `send`
                // takes them in.
                let s = self.fabric.state.lock().expect("fabric state");
                let mut refused = self.refused.lock().expect("refused");
                if refused.is_empty() {
                    return;
                }
                let max = (HEADER_BYTES + MAX_BODY_BYTES) as u64;
                let before = refused.len();
                if s.messengers.is_empty() {
                    refused.retain(|&dst| !s.takes(self.idx, dst, max));
                } else {
                    let m = &s.messengers[self.idx].0;
                    refused.retain(|&dst| !m.writable(s.ids[dst]));
                }
                if refused.len() < before {
                    return;
                }
            }
            notified.await;
        }
    }

    async fn recv(&self) -> Result<(NodeId, Frame), TransportError> {
        let mut inbox = self.inbox.lock().await;
        let got = inbox.recv().await.ok_or(TransportError::Closed)?;
        // Room in the inbox: frames waiting for it can move in.
        let s = self.fabric.state.lock().expect("fabric state");
        if !s.waiting[self.idx].is_empty() {
            self.fabric.wake.notify_one();
        }
        Ok(got)
    }

    fn signals(&self, peer: NodeId) -> CongestionSignals {
        let s = self.fabric.state.lock().expect("fabric state");
        match s.hosts.get(&peer) {
            Some(&dst) => s.engine.signals(self.idx, dst),
            None => CongestionSignals::default(),
        }
    }
}
