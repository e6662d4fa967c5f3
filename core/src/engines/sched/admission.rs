//! Admission of client requests into the engine by dmClock (Gulati, Merchant and
//! Varman, "mClock" (OSDI 2010) and its distributed form dmClock): the per-volume
//! QoS of the cluster map (reservation, weight, limit; [`Qos`]) enforced at each
//! primary, holding across primaries.
//!
//! At most `depth` client requests are in the engine at once; the rest wait here,
//! a FIFO per volume. Each request is tagged when it arrives:
//!
//! - R (reservation): `max(R' + delta / reservation, now)`;
//! - L (limit): `max(L' + delta / limit, now)`, and for a bandwidth limit
//!   `max(B' + bytes * delta / bw, now)`;
//! - P (proportional share): `max(P' + delta / weight, V)`, where V is the P
//!   tag of the request admitted last (a virtual time): a volume that was idle
//!   starts level with the others, neither with a burst for its idle time nor
//!   behind their past.
//!
//! `delta` is what the client carries: 1 plus the volume's requests sent to
//! other primaries since its last request to this one (dmClock counts those
//! completed; see [`Deltas`] for why weir counts those sent). So each primary
//! spaces a volume's tags by the volume's requests across the whole cluster,
//! and a limit holds for the volume, not per primary.
//!
//! When a slot frees: first the reservation phase (the smallest R at or before
//! now), then the weight phase (the smallest P among volumes whose L is at or
//! before now). weir's reservation counts all the requests of a volume (the
//! client carries one count, not dmClock's separate rho for those served in
//! the reservation phase): a volume served above its reservation through its
//! weight gets nothing more through its reservation.
//!
//! A request that has waited [`ADMIT_WAIT_MAX_NS`] is answered `Busy` (its
//! client's call has nearly timed out; it retries), so what waits is bounded in
//! time as well as in number ([`AdmitConfig::waiting_max`]). Tags are spaced
//! from the last *admitted* request of the volume, worked out when a request
//! comes to the head of its volume's queue: one answered `Busy` takes no room
//! from those after it (tagged at arrival, a volume with more requests
//! outstanding than its limit allows in 200 ms would run its tags ever further
//! ahead, and every request would time out).
//!
//! Sans-IO: inputs take `now_ns`; the node carries admitted requests to the engine.

use crate::control::state::Qos;
use crate::ids::{NodeId, RequestId};
use std::collections::{BTreeMap, VecDeque};

/// Client requests in each node's engine at once, by default, while any volume
/// asks for QoS. Shallow on purpose: what is admitted queues at the device in
/// arrival order, beyond dmClock's reach. In the `qos` experiment (3 nodes, one
/// SSD each) a reserving volume beside a saturating neighbour got 78,000 IOPS at
/// depth 32, 41,100 at 64 and 20,750 at 256 (no better than without QoS), while
/// the neighbour kept 927,000, 973,000 and 984,000.
pub const ADMIT_DEPTH_DEFAULT: usize = 32;
/// Client requests waiting for admission at most, by default; past it a request
/// is answered `Busy`.
pub const ADMIT_WAITING_MAX_DEFAULT: usize = 8192;
/// Longest wait for admission: below the client's call timeout (250 ms), so the
/// client hears `Busy` rather than nothing.
pub const ADMIT_WAIT_MAX_NS: u64 = 200_000_000;
/// An admitted request the engine never answered is forgotten after this long
/// (the engine answers every request it keeps; one it drops, the client retries).
pub const ADMIT_FORGET_NS: u64 = 2_000_000_000;
/// Largest delta a client may carry (a hostile or broken one only slows its own
/// volume, but tags stay in range).
pub const DELTA_MAX: u32 = 1 << 16;

const NS: u128 = 1_000_000_000;

/// Which volume a request is of: a named volume by its number, or `None`
/// for requests outside every named volume (the pool used directly).
pub type VolKey = Option<u64>;

/// A client request, by its client and id.
pub type Who = (NodeId, RequestId);

/// The admission settings of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdmitConfig {
    /// Client requests in the engine at once.
    pub depth: usize,
    /// Client requests waiting at most.
    pub waiting_max: usize,
}

impl Default for AdmitConfig {
    fn default() -> Self {
        AdmitConfig {
            depth: ADMIT_DEPTH_DEFAULT,
            waiting_max: ADMIT_WAITING_MAX_DEFAULT,
        }
    }
}

/// What one volume's requests met at this node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeAdmitStats {
    /// Requests admitted.
    pub admitted: u64,
    /// Of them, in the reservation phase.
    pub by_reservation: u64,
    /// Requests waiting now.
    pub waiting: usize,
    /// Total time admitted requests waited, ns.
    pub waited_ns: u64,
    /// Of it, time their limit held them (their L tag past their arrival), ns.
    pub throttled_ns: u64,
    /// Requests answered `Busy` (the queue full, or waited too long).
    pub refused: u64,
}

impl VolumeAdmitStats {
    /// Add `other`'s counts (and its waiting).
    pub fn add(&mut self, other: &VolumeAdmitStats) {
        self.admitted += other.admitted;
        self.by_reservation += other.by_reservation;
        self.waiting += other.waiting;
        self.waited_ns += other.waited_ns;
        self.throttled_ns += other.throttled_ns;
        self.refused += other.refused;
    }
}

/// What [`Admission::submit`] did with a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Submit<R> {
    /// It waits for admission.
    Queued,
    /// The same request (a client's retry) is in the engine already: give it to
    /// the engine now, which knows what to do with a repeat.
    Again(R),
    /// Too many wait: answer it `Busy`.
    Refused(R),
}

/// A request waiting: what its tags are made of.
#[derive(Debug)]
struct Waiting<R> {
    item: R,
    who: Who,
    delta: u128,
    bytes: u128,
    /// Its P tag's floor: the virtual time when it arrived to an empty queue.
    floor: u128,
    arrived_ns: u64,
}

/// The tags of a volume's head request (ns): R, the IOPS limit's L, the
/// bandwidth limit's B, P.
#[derive(Clone, Copy, Debug)]
struct Tags {
    r: u128,
    l: u128,
    b: u128,
    p: u128,
}

/// One volume at this node: its setting, its last tags, its waiting requests.
#[derive(Debug)]
struct VolumeQueue<R> {
    qos: Qos,
    /// The last admitted request's tags (none before the first).
    last_r: Option<u128>,
    last_l: Option<u128>,
    last_b: Option<u128>,
    last_p: u128,
    queue: VecDeque<Waiting<R>>,
    stats: VolumeAdmitStats,
}

impl<R> VolumeQueue<R> {
    /// The tags of the head request, spaced from the last admitted one: a
    /// request answered `Busy` after waiting takes nothing from the others.
    fn head_tags(&self) -> Option<Tags> {
        let w = self.queue.front()?;
        let q = &self.qos;
        let since = u128::from(w.arrived_ns);
        let after = |last: Option<u128>, rate: u64, units: u128| match (rate, last) {
            (0, _) => 0,
            (_, None) => since,
            (rate, Some(last)) => (last + units * NS / u128::from(rate)).max(since),
        };
        Some(Tags {
            r: match q.iops_reservation {
                0 => u128::MAX,
                res => after(self.last_r, res, w.delta),
            },
            l: after(self.last_l, q.iops_limit, w.delta),
            b: after(self.last_b, q.bw_limit, w.delta * w.bytes),
            p: (self.last_p + w.delta * NS / u128::from(q.weight.max(1))).max(w.floor),
        })
    }

    fn new(qos: Qos) -> Self {
        VolumeQueue {
            qos,
            last_r: None,
            last_l: None,
            last_b: None,
            last_p: 0,
            queue: VecDeque::new(),
            stats: VolumeAdmitStats::default(),
        }
    }
}

/// dmClock admission of one node's client requests.
#[derive(Debug)]
pub struct Admission<R> {
    cfg: AdmitConfig,
    volumes: BTreeMap<VolKey, VolumeQueue<R>>,
    /// Requests in the engine, and when they entered it.
    in_engine: BTreeMap<Who, u64>,
    waiting: usize,
    /// The P tag of the request admitted last.
    vtime: u128,
}

/// Either phase of a choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Reservation,
    Weight,
}

impl<R> Admission<R> {
    /// Admission with `cfg`.
    pub fn new(cfg: AdmitConfig) -> Self {
        assert!(cfg.depth > 0 && cfg.waiting_max > 0, "admission bounds");
        Admission {
            cfg,
            volumes: BTreeMap::new(),
            in_engine: BTreeMap::new(),
            waiting: 0,
            vtime: 0,
        }
    }

    /// Requests waiting.
    pub fn waiting(&self) -> usize {
        self.waiting
    }

    /// Requests in the engine.
    pub fn in_engine(&self) -> usize {
        self.in_engine.len()
    }

    /// Keep only the volumes `keep` says still exist, with their current QoS
    /// (a map changed). Requests waiting for a volume that is gone stay: the
    /// engine answers them.
    pub fn set_volumes(&mut self, qos_of: impl Fn(VolKey) -> Option<Qos>) {
        for (&key, v) in self.volumes.iter_mut() {
            if let Some(qos) = qos_of(key) {
                v.qos = qos;
            }
        }
        self.volumes
            .retain(|&key, v| !v.queue.is_empty() || qos_of(key).is_some());
    }

    /// A request of volume `key` (set `qos`), from `who`, carrying `delta`, for
    /// `bytes` bytes, arrives at `now_ns`.
    pub fn submit(
        &mut self,
        key: VolKey,
        qos: Qos,
        (who, delta, bytes): (Who, u32, u64),
        item: R,
        now_ns: u64,
    ) -> Submit<R> {
        if let Some(at) = self.in_engine.get_mut(&who) {
            *at = now_ns;
            return Submit::Again(item);
        }
        let v = self
            .volumes
            .entry(key)
            .or_insert_with(|| VolumeQueue::new(qos));
        if self.waiting >= self.cfg.waiting_max {
            v.stats.refused += 1;
            return Submit::Refused(item);
        }
        v.qos = qos;
        let floor = if v.queue.is_empty() { self.vtime } else { 0 };
        v.queue.push_back(Waiting {
            item,
            who,
            delta: u128::from(delta.clamp(1, DELTA_MAX)),
            bytes: u128::from(bytes),
            floor,
            arrived_ns: now_ns,
        });
        v.stats.waiting += 1;
        self.waiting += 1;
        Submit::Queued
    }

    /// The next request to give the engine at `now_ns`, if a slot is free and a
    /// request may go.
    pub fn poll(&mut self, now_ns: u64) -> Option<R> {
        if self.in_engine.len() >= self.cfg.depth {
            return None;
        }
        let (key, phase, t) = self.choose(u128::from(now_ns))?;
        let v = self.volumes.get_mut(&key).expect("chosen volume");
        let w = v.queue.pop_front().expect("chosen volume waits");
        if t.r != u128::MAX {
            v.last_r = Some(t.r);
        }
        (v.last_l, v.last_b, v.last_p) = (Some(t.l), Some(t.b), t.p);
        v.stats.waiting -= 1;
        self.waiting -= 1;
        v.stats.admitted += 1;
        if phase == Phase::Reservation {
            v.stats.by_reservation += 1;
        }
        let waited = now_ns - w.arrived_ns;
        v.stats.waited_ns += waited;
        let held = t.l.max(t.b).saturating_sub(u128::from(w.arrived_ns));
        let held = u64::try_from(held).unwrap_or(u64::MAX);
        v.stats.throttled_ns += held.min(waited);
        self.in_engine.insert(w.who, now_ns);
        self.vtime = self.vtime.max(t.p);
        Some(w.item)
    }

    /// The volume whose head goes next, and in which phase: the reservation
    /// phase takes the smallest R due (within its bandwidth limit; the IOPS
    /// limit is no lower than the reservation), the weight phase the smallest
    /// P among heads within both limits.
    fn choose(&self, now: u128) -> Option<(VolKey, Phase, Tags)> {
        // One pass over the heads, in volume order (a tie goes to the first).
        let mut reserved: Option<(VolKey, Tags)> = None;
        let mut weighted: Option<(VolKey, Tags)> = None;
        for (&k, v) in &self.volumes {
            let Some(t) = v.head_tags() else {
                continue;
            };
            if t.r <= now && t.b <= now && reserved.is_none_or(|(_, best)| t.r < best.r) {
                reserved = Some((k, t));
            }
            if t.l.max(t.b) <= now && weighted.is_none_or(|(_, best)| t.p < best.p) {
                weighted = Some((k, t));
            }
        }
        reserved
            .map(|(k, t)| (k, Phase::Reservation, t))
            .or(weighted.map(|(k, t)| (k, Phase::Weight, t)))
    }

    /// Requests that have waited past [`ADMIT_WAIT_MAX_NS`] at `now_ns`, taken
    /// out: answer them `Busy`.
    pub fn expired(&mut self, now_ns: u64) -> Vec<R> {
        let mut out = Vec::new();
        for v in self.volumes.values_mut() {
            while v
                .queue
                .front()
                .is_some_and(|w| now_ns.saturating_sub(w.arrived_ns) >= ADMIT_WAIT_MAX_NS)
            {
                let w = v.queue.pop_front().expect("front");
                v.stats.waiting -= 1;
                v.stats.refused += 1;
                self.waiting -= 1;
                out.push(w.item);
            }
        }
        out
    }

    /// When, after `now_ns`, a waiting request may go or must be refused, if
    /// any waits and a slot is free (a freed slot is its own wake-up).
    pub fn next_wake(&self, now_ns: u64) -> Option<u64> {
        if self.waiting == 0 || self.in_engine.len() >= self.cfg.depth {
            return None;
        }
        let now = u128::from(now_ns);
        self.volumes
            .values()
            .filter_map(|v| Some((v.queue.front()?, v.head_tags()?)))
            .map(|(w, t)| {
                let go = t.r.max(t.b).min(t.l.max(t.b)).max(now + 1);
                let give_up = u128::from(w.arrived_ns + ADMIT_WAIT_MAX_NS);
                go.min(give_up.max(now + 1))
            })
            .min()
            .map(|t| u64::try_from(t).unwrap_or(u64::MAX))
    }

    /// Every waiting request, taken out (the gate opened: no volume asks for
    /// QoS any more), volume by volume in arrival order.
    pub fn take_all(&mut self) -> Vec<R> {
        let mut out = Vec::with_capacity(self.waiting);
        for v in self.volumes.values_mut() {
            v.stats.waiting = 0;
            out.extend(v.queue.drain(..).map(|w| w.item));
        }
        self.waiting = 0;
        out
    }

    /// The engine answered `who` (or it is forgotten): its slot is free.
    pub fn finish(&mut self, who: Who) -> bool {
        self.in_engine.remove(&who).is_some()
    }

    /// Forget admitted requests older than [`ADMIT_FORGET_NS`] at `now_ns` (the
    /// engine dropped them without an answer); how many.
    pub fn forget_old(&mut self, now_ns: u64) -> usize {
        let before = self.in_engine.len();
        self.in_engine
            .retain(|_, at| now_ns.saturating_sub(*at) < ADMIT_FORGET_NS);
        before - self.in_engine.len()
    }

    /// Per-volume figures, in volume order.
    pub fn stats(&self) -> Vec<(VolKey, VolumeAdmitStats)> {
        self.volumes.iter().map(|(&k, v)| (k, v.stats)).collect()
    }

    /// Assert the invariants: counts agree, bounds hold, tags are in order
    /// within a volume.
    pub fn self_check(&self) {
        let waiting: usize = self.volumes.values().map(|v| v.queue.len()).sum();
        assert_eq!(waiting, self.waiting, "waiting count");
        assert!(self.waiting <= self.cfg.waiting_max, "waiting bound");
        for v in self.volumes.values() {
            assert_eq!(v.queue.len(), v.stats.waiting, "volume waiting count");
            for pair in v.queue.iter().collect::<Vec<_>>().windows(2) {
                assert!(pair[0].arrived_ns <= pair[1].arrived_ns, "arrival order");
            }
        }
    }
}

/// Most (volume, node) pairs a client counts for; past it the counts restart
/// (deltas are 1 for a while: a volume is briefly held a little less tightly).
pub const DELTAS_MAX: usize = 65_536;

/// A client's side of dmClock: per volume, the requests it has sent, and at
/// each node how many it had sent when it last sent there, so each request
/// carries the `delta` its primary tags it by.
///
/// dmClock counts requests completed elsewhere; weir counts requests sent
/// elsewhere. A limit then holds from the first request: with completions,
/// a client that starts with many requests in flight has them all tagged as if
/// the other primaries had done nothing (the `qos` experiment's noisy volume
/// ran 6% over its limit over 100 ms so). A request that fails is counted all
/// the same: under failures a volume is held a little below its limit, never
/// above.
#[derive(Debug, Default)]
pub struct Deltas {
    /// Per volume: requests sent.
    sent: BTreeMap<VolKey, u64>,
    /// Per (volume, node): the volume's requests sent when one last went there.
    seen: BTreeMap<(VolKey, NodeId), u64>,
}

impl Deltas {
    /// The delta of a request of volume `key` to `node`, sent now: 1 plus the
    /// volume's requests sent to other nodes since the last one sent there (1
    /// for the first one there: a new primary is not handed the volume's past).
    pub fn delta(&mut self, key: VolKey, node: NodeId) -> u32 {
        if self.seen.len() >= DELTAS_MAX && !self.seen.contains_key(&(key, node)) {
            self.seen.clear();
            self.sent.clear();
        }
        let sent = self.sent.entry(key).or_default();
        let seen = self.seen.entry((key, node)).or_insert(*sent);
        let delta = 1 + (*sent - *seen);
        *sent += 1;
        *seen = *sent;
        u32::try_from(delta).unwrap_or(u32::MAX).min(DELTA_MAX)
    }
}
