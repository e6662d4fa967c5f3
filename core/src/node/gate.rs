//! The node's gate for client requests: reads and writes from clients pass
//! through dmClock admission ([`Admission`]) before the engine sees them, while
//! any named volume of the map asks for QoS (or the node is told to always
//! admit). Without QoS the gate is open: requests go straight to the engine, as
//! they always did.

use super::Node;
use crate::control::state::Qos;
use crate::device::BlockDevice;
use crate::error::WeirError;
use crate::ids::{NodeId, RequestId};
use crate::map::ClusterMap;
use crate::sched::{Admission, AdmitConfig, Submit, VolKey, VolumeAdmitStats};
use crate::transport::Transport;
use crate::wire::Message;

/// What became of a client request at the gate.
#[derive(Debug)]
pub(super) enum Arrival {
    /// To the engine now.
    Engine(NodeId, Message),
    /// It waits for admission.
    Waiting,
    /// Too many wait: answer the client `Busy`.
    Busy(NodeId, RequestId),
}

/// The gate.
#[derive(Debug)]
pub(super) struct ClientGate {
    adm: Admission<(NodeId, Message)>,
    /// Whether requests pass through admission.
    on: bool,
    /// Admission even without QoS in the map (`[qos] always`).
    always: bool,
}

impl ClientGate {
    /// A gate admitting by `cfg`; `always`: even when no volume asks for QoS.
    pub(super) fn new(cfg: AdmitConfig, always: bool) -> Self {
        ClientGate {
            adm: Admission::new(cfg),
            on: always,
            always,
        }
    }

    /// A new map: volumes and their QoS may have changed. Returns the requests
    /// to give the engine now (all that waited, if the gate opened).
    pub(super) fn set_map(&mut self, map: &ClusterMap) -> Vec<(NodeId, Message)> {
        self.on = self.always || map.any_qos();
        self.adm
            .set_volumes(|key| key.map_or(Some(Qos::default()), |e| qos_of(map, e)));
        if self.on {
            Vec::new()
        } else {
            self.adm.take_all()
        }
    }

    /// A message from `from` for the engine arrives at `now_ns`.
    pub(super) fn arrive(
        &mut self,
        map: &ClusterMap,
        from: NodeId,
        msg: Message,
        now_ns: u64,
    ) -> Arrival {
        if !self.on {
            return Arrival::Engine(from, msg);
        }
        let bs = u64::from(map.volume().block_size);
        let (req, lba, bytes, delta) = match &msg {
            Message::Read {
                req,
                lba,
                blocks,
                delta,
                ..
            } => (*req, *lba, u64::from(*blocks) * bs, *delta),
            Message::Write {
                req,
                lba,
                data,
                delta,
                ..
            } => (*req, *lba, data.len() as u64, *delta),
            _ => return Arrival::Engine(from, msg),
        };
        // Tags are charged before the engine checks the request: a length
        // past what any request may carry is charged as the largest.
        let bytes = bytes.min(crate::map::MAX_REQUEST_BYTES);
        let (key, qos): (VolKey, Qos) = match map.named_at(map.extent_of(lba)) {
            Some((volume, qos)) => (Some(volume), qos),
            None => (None, Qos::default()),
        };
        match self
            .adm
            .submit(key, qos, ((from, req), delta, bytes), (from, msg), now_ns)
        {
            Submit::Queued => Arrival::Waiting,
            Submit::Again((from, msg)) => Arrival::Engine(from, msg),
            Submit::Refused((from, _)) => Arrival::Busy(from, req),
        }
    }

    /// The node sends `msg` to `to`: if it answers an admitted request, its
    /// slot is free.
    pub(super) fn replied(&mut self, to: NodeId, msg: &Message) {
        if let Message::ReadOk { req, .. }
        | Message::WriteOk { req }
        | Message::Failed { req, .. } = msg
        {
            self.adm.finish((to, *req));
        }
    }

    /// The next request admitted at `now_ns`, if any.
    pub(super) fn poll(&mut self, now_ns: u64) -> Option<(NodeId, Message)> {
        self.adm.poll(now_ns)
    }

    /// Requests that waited too long at `now_ns`: answer them `Busy`.
    pub(super) fn expired(&mut self, now_ns: u64) -> Vec<(NodeId, RequestId)> {
        self.adm
            .expired(now_ns)
            .into_iter()
            .filter_map(|(from, msg)| match msg {
                Message::Read { req, .. } | Message::Write { req, .. } => Some((from, req)),
                _ => None,
            })
            .collect()
    }

    /// When (node clock, ns) a waiting request may go or must be refused.
    pub(super) fn next_wake(&self, now_ns: u64) -> Option<u64> {
        self.adm.next_wake(now_ns)
    }

    /// The control plane's tick: forget admitted requests never answered.
    pub(super) fn tick(&mut self, now_ns: u64) {
        let forgotten = self.adm.forget_old(now_ns);
        if forgotten > 0 {
            tracing::debug!(forgotten, "admitted client requests never answered");
        }
    }

    /// Per-volume figures.
    pub(super) fn stats(&self) -> Vec<(VolKey, VolumeAdmitStats)> {
        self.adm.stats()
    }

    pub(super) fn self_check(&self) {
        self.adm.self_check();
    }
}

/// The QoS of the named volume numbered `volume`, if it exists.
fn qos_of(map: &ClusterMap, volume: u64) -> Option<Qos> {
    map.qos_of(volume)
}

/// The node's side of the gate: what it admits goes to the engine, what waited
/// too long is answered, and when it must look again.
impl<T: Transport, D: BlockDevice> Node<T, D> {
    /// Admit client requests by `cfg`; `always`: through dmClock even when no
    /// volume of the map asks for QoS.
    pub fn with_admission(mut self, cfg: AdmitConfig, always: bool) -> Self {
        self.gate = ClientGate::new(cfg, always);
        let opened = self.gate.set_map(self.engine.map());
        debug_assert!(opened.is_empty(), "nothing waits before the node runs");
        self
    }

    /// Answer client request `req` of `to` `Busy` (it retries).
    pub(super) fn busy(&mut self, to: NodeId, req: RequestId) {
        let msg = Message::Failed {
            req,
            error: WeirError::Busy,
        };
        if let Err(e) = self.send(to, msg) {
            tracing::warn!(%to, error = %e, "busy answer not sent");
        }
    }

    /// Client requests through the gate: those admitted now to the engine,
    /// those waited too long answered `Busy`. Whether any moved.
    pub(super) fn admit(&mut self) -> bool {
        let now = self.now_ns();
        let mut moved = false;
        for (to, req) in self.gate.expired(now) {
            moved = true;
            self.busy(to, req);
        }
        while let Some((from, msg)) = self.gate.poll(now) {
            moved = true;
            self.give_engine(from, msg);
        }
        moved
    }

    /// When a client request waiting for admission may go (or must give up).
    pub(super) fn admit_at(&self) -> Option<tokio::time::Instant> {
        self.gate
            .next_wake(self.now_ns())
            .zip(self.origin)
            .map(|(ns, origin)| origin + std::time::Duration::from_nanos(ns))
    }
}

/// Sleep until `at`, or forever.
pub(super) async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => crate::time::sleep_until_exact(at).await,
        None => std::future::pending().await,
    }
}
