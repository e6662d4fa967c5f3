//! The client library: a volume as seen by an application.
//!
//! `Volume::read/write/flush` find the primary of each extent from the cluster map,
//! split requests at extent boundaries, send them with fresh request ids and match
//! replies by id. One task receives all replies and hands each to its waiter.
//!
//! Failover is hidden behind bounded retries: a request that times out, or is
//! refused for anything a newer map or a later attempt may cure (`NotPrimary`,
//! `StaleEpoch`, `NoLease`, `Busy`, a peer unreachable, a connection down: see
//! [`ClientError::retryable`]), makes the client fetch the current map (from
//! the voting members at once, one round for every request that failed
//! meanwhile) and try again, until the client's request bound
//! ([`ClientOptions::request_timeout`], [`REQUEST_TIMEOUT`] by default) is
//! spent; each attempt that got no reply gives the next one twice as long
//! ([`CALL_TIMEOUT`] up to [`CALL_TIMEOUT_MAX`]), so a slow cluster is waited
//! for rather than flooded. Retrying a write
//! is idempotent: it writes the same data to the same blocks again, under the same
//! request id, so a node that applied the first attempt and has seen it
//! overwritten since does not bring the old data back (see the engine's `applied`).

pub mod front_end;
pub mod named;
mod read_flow;
mod retry;
pub mod splice;

pub use retry::{
    Attempts, ClientError, CALL_TIMEOUT, CALL_TIMEOUT_MAX, REQUEST_TIMEOUT, REQUEST_TIMEOUT_MAX,
};

use crate::error::WeirError;
use crate::flow::{FlowConfig, ReadFlowStats};
use crate::ids::{Lba, NodeId, RequestId};
use crate::map::ClusterMap;
use crate::sched::{Deltas, VolKey};
use crate::transport::{SendError, Transport};
use crate::wire::{Frame, Message};
use bytes::{Bytes, BytesMut};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

/// How a client is opened: see [`Volume::open_with`].
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Where a node's own front end holds its writes' payloads while they run
    /// (see [`crate::front_end`]); `None` for any other client.
    pub held: Option<Arc<crate::front_end::HeldPayloads>>,
    /// The congestion response's settings: with `flow.enabled`, reads wait
    /// for a window over the response bytes in flight towards this client,
    /// which the transport's marks on packets arriving here cut.
    pub flow: FlowConfig,
    /// How long a request retries (through failovers, restarts, refusals a
    /// newer map resolves, replies that do not come) before it fails; at most
    /// [`REQUEST_TIMEOUT_MAX`]. Zero: one attempt, whatever it meets (the
    /// simulator's `give_up_at_once` bug).
    pub request_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            held: None,
            flow: FlowConfig::default(),
            request_timeout: REQUEST_TIMEOUT,
        }
    }
}

/// Requests waiting for a reply: the node asked, and where the reply goes. `None`
/// once the reply task has stopped, so later calls fail at once instead of waiting.
type Waiters = Arc<Mutex<Option<BTreeMap<RequestId, (NodeId, oneshot::Sender<Message>)>>>>;

/// A handle on one volume.
pub struct Volume<T> {
    transport: Arc<T>,
    /// The current map; an `Arc` so every request takes it without copying.
    map: Mutex<Arc<ClusterMap>>,
    next_req: AtomicU64,
    waiters: Waiters,
    /// Retries done (each a failed attempt followed by another).
    retries: AtomicU64,
    /// Held while the map is being refreshed; when the last refresh ended.
    refreshing: tokio::sync::Mutex<Option<tokio::time::Instant>>,
    /// Where a node's own front end holds its writes' payloads while they run
    /// (see [`crate::front_end`]); `None` for any other client.
    held: Option<Arc<crate::front_end::HeldPayloads>>,
    /// What each request carries for the primaries' dmClock (see
    /// [`crate::sched::Admission`]).
    deltas: Mutex<Deltas>,
    /// The window over read responses in flight towards this client, with the
    /// congestion response on (see [`crate::flow::ReadWindow`]).
    reads: Option<read_flow::ReadFlow>,
    /// How long a request retries before it fails.
    request_timeout: Duration,
}

impl<T: Transport> Volume<T> {
    /// Open the map's volume over `transport`, with the default
    /// [`ClientOptions`]. Spawns the reply task.
    ///
    /// Request ids are `incarnation << 32` plus a counter: draw `incarnation` at
    /// random each time the client starts, so a restarted client's ids do not
    /// repeat its predecessor's (nodes remember the requests of recent writes).
    pub fn open(transport: Arc<T>, map: ClusterMap, incarnation: u32) -> Arc<Self> {
        Self::open_with(transport, map, incarnation, ClientOptions::default())
    }

    /// [`Volume::open`] with `options`.
    pub fn open_with(
        transport: Arc<T>,
        map: ClusterMap,
        incarnation: u32,
        options: ClientOptions,
    ) -> Arc<Self> {
        let ClientOptions {
            held,
            flow,
            request_timeout,
        } = options;
        assert!(
            request_timeout <= REQUEST_TIMEOUT_MAX,
            "a request bound of {request_timeout:?} is past {REQUEST_TIMEOUT_MAX:?}"
        );
        let waiters: Waiters = Arc::new(Mutex::new(Some(BTreeMap::new())));
        let volume = Arc::new(Volume {
            transport: transport.clone(),
            map: Mutex::new(Arc::new(map)),
            next_req: AtomicU64::new((u64::from(incarnation) << 32) + 1),
            waiters: waiters.clone(),
            retries: AtomicU64::new(0),
            refreshing: tokio::sync::Mutex::new(None),
            held,
            deltas: Mutex::new(Deltas::default()),
            reads: flow.enabled.then(|| read_flow::ReadFlow::new(flow)),
            request_timeout,
        });
        tokio::spawn(async move {
            while let Ok((from, frame)) = transport.recv().await {
                let msg = match Message::decode(frame) {
                    Ok(msg) => msg,
                    Err(e) => {
                        tracing::warn!(%from, error = %e, "undecodable reply dropped");
                        continue;
                    }
                };
                let req = match &msg {
                    Message::ReadOk { req, .. }
                    | Message::WriteOk { req }
                    | Message::FlushOk { req }
                    | Message::MapState { req, .. }
                    | Message::Failed { req, .. } => *req,
                    _ => {
                        tracing::warn!(%from, "non-reply message sent to a client; dropped");
                        continue;
                    }
                };
                let mut guard = waiters.lock().expect("waiters lock");
                let map = guard.as_mut().expect("open while the task runs");
                match map.get(&req) {
                    Some((asked, _)) if *asked == from => {
                        let (_, tx) = map.remove(&req).expect("present");
                        let _ = tx.send(msg);
                    }
                    Some((asked, _)) => {
                        tracing::warn!(%from, %asked, %req, "reply from a node not asked; dropped")
                    }
                    None => tracing::warn!(%from, %req, "reply to no request; dropped"),
                }
            }
            // Dropping the senders wakes every waiter with `Closed`; later calls fail.
            waiters.lock().expect("waiters lock").take();
        });
        volume
    }

    /// The cluster map in use.
    pub fn map(&self) -> Arc<ClusterMap> {
        self.map.lock().expect("map lock").clone()
    }

    /// Retries done so far.
    pub fn retries(&self) -> u64 {
        self.retries.load(Ordering::Relaxed)
    }

    /// What the read window has done, with the congestion response on.
    pub fn read_flow(&self) -> Option<ReadFlowStats> {
        self.reads.as_ref().map(read_flow::ReadFlow::stats)
    }

    /// Marked packets received from every node of `map` so far, and the
    /// latest RTT sample towards `from`.
    fn marks_in(&self, map: &ClusterMap, from: NodeId) -> (u64, u64) {
        let marks = map
            .nodes()
            .iter()
            .map(|&node| crate::flow::receiver_marks(&self.transport.signals(node)))
            .sum();
        (marks, self.transport.signals(from).rtt_ns_last)
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> usize {
        self.map.lock().expect("map lock").volume().block_size as usize
    }

    /// A request's retries, starting now, within this client's bound (a
    /// request of several steps passes the same one to each, so they share
    /// its bound).
    pub fn attempts(&self) -> Attempts {
        Attempts::new(self.request_timeout)
    }

    /// Run `attempt` with the current map and the time it may wait for a
    /// reply until it succeeds or `attempts` says to stop; refresh the map
    /// between attempts.
    async fn with_retry<R, F, Fut>(
        &self,
        mut attempts: Attempts,
        mut attempt: F,
    ) -> Result<R, ClientError>
    where
        F: FnMut(Arc<ClusterMap>, Duration) -> Fut,
        Fut: std::future::Future<Output = Result<R, ClientError>>,
    {
        loop {
            let map = self.map();
            let error = match attempt(map.clone(), attempts.call_timeout()).await {
                Ok(r) => return Ok(r),
                Err(e) => e,
            };
            let failed_at = crate::time::now();
            tracing::debug!(error = %error, attempt = attempts.made() + 1, "attempt failed");
            let pause = attempts.failed(error)?;
            self.retries.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(pause).await;
            self.refresh_since(&map, failed_at).await;
        }
    }

    /// Take `state` as the map if it is newer than the client's (a node's
    /// own front end keeps up with its node's map so).
    pub fn offer(&self, state: &crate::control::state::ClusterState) {
        let mut map = self.map.lock().expect("map lock");
        if state.applied > map.state().applied {
            if let Ok(newer) = map.with_state(state.clone()) {
                *map = Arc::new(newer);
            }
        }
    }

    /// Fetch the current map from the nodes.
    pub async fn refresh(&self) {
        let _turn = self.refreshing.lock().await;
        self.refresh_map().await;
    }

    /// Refresh the map for an attempt that failed at `failed_at` under `seen`,
    /// unless another request has refreshed it since: when a primary dies, every
    /// request to it fails at about the same time, and one round of questions
    /// serves them all.
    async fn refresh_since(&self, seen: &ClusterMap, failed_at: tokio::time::Instant) {
        let mut last = self.refreshing.lock().await;
        if self.map().state().applied > seen.state().applied || last.is_some_and(|t| t >= failed_at)
        {
            return;
        }
        self.refresh_map().await;
        *last = Some(crate::time::now());
    }

    /// Ask the voting members, all at once, for the current map (any member
    /// answers, but voters are the first to know a change). Done at the first
    /// newer map, or once a majority of them have answered with nothing newer; a
    /// dead member costs nothing unless most are dead, in which case the answers
    /// wait out [`CALL_TIMEOUT`].
    async fn refresh_map(&self) {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        let map = self.map();
        // The group's voters as the map records them (a static map records
        // none: the first members vote).
        let voters = &map.state().voters;
        let asked = if voters.is_empty() {
            crate::control::raft::voters_of(map.nodes())
        } else {
            voters.iter().copied().collect()
        };
        let majority = asked.len() / 2 + 1;
        let mut answers: FuturesUnordered<_> = asked
            .iter()
            .map(
                |&node| async move { (node, self.call(node, |req| Message::GetMap { req }).await) },
            )
            .collect();
        let mut current = 0;
        while let Some((node, reply)) = answers.next().await {
            let Ok(Message::MapState { state, .. }) = reply else {
                continue;
            };
            let state = match crate::control::state::ClusterState::decode(&state) {
                Ok(state) => state,
                Err(e) => {
                    tracing::warn!(%node, error = %e, "undecodable map");
                    continue;
                }
            };
            let mut map = self.map.lock().expect("map lock");
            if state.applied > map.state().applied {
                if let Ok(newer) = map.with_state(state) {
                    *map = Arc::new(newer);
                    return;
                }
            }
            current += 1;
            if current >= majority {
                return;
            }
        }
    }

    /// Write `data` (whole blocks) at `lba`.
    pub async fn write(&self, lba: Lba, data: Bytes, fua: bool) -> Result<(), ClientError> {
        let map = self.map();
        let bs = self.check_length(&map, data.len())?;
        let blocks = (data.len() / bs) as u64;
        let attempts = self.attempts();
        for (start, count) in split(&map, lba, blocks)? {
            let from = ((start.0 - lba.0) as usize) * bs;
            let chunk = data.slice(from..from + count as usize * bs);
            self.write_at_with(attempts, |_| Ok(start), chunk, fua)
                .await?;
        }
        Ok(())
    }

    /// Refuse a write of `len` bytes that is not whole blocks; the block size.
    fn check_length(&self, map: &ClusterMap, len: usize) -> Result<usize, ClientError> {
        let v = map.volume();
        if len == 0 || !len.is_multiple_of(v.block_size as usize) {
            return Err(WeirError::BadLength {
                len: len as u64,
                block_size: v.block_size,
                max_bytes: v.max_request_bytes(),
            }
            .into());
        }
        Ok(v.block_size as usize)
    }

    /// Write `data` (whole blocks, one request's worth, within one extent) at
    /// the block `resolve` finds in each attempt's map (a named volume's block
    /// may change hands between attempts: see
    /// [`crate::control::state::volumes`]). A resolution that differs from the
    /// first attempt's fails with [`ClientError::Moved`].
    pub async fn write_at(
        &self,
        resolve: impl Fn(&ClusterMap) -> Result<Lba, ClientError>,
        data: Bytes,
        fua: bool,
    ) -> Result<(), ClientError> {
        self.write_at_with(self.attempts(), resolve, data, fua)
            .await
    }

    /// [`Volume::write_at`] as a step of a request whose retries are
    /// `attempts`.
    pub async fn write_at_with(
        &self,
        attempts: Attempts,
        resolve: impl Fn(&ClusterMap) -> Result<Lba, ClientError>,
        data: Bytes,
        fua: bool,
    ) -> Result<(), ClientError> {
        let map = self.map();
        let v = *map.volume();
        let count = (self.check_length(&map, data.len())? / v.block_size as usize) as u64;
        let start = resolve(&map)?;
        if split(&map, start, count)?.len() != 1 {
            return Err(WeirError::BadLength {
                len: data.len() as u64,
                block_size: v.block_size,
                max_bytes: v.max_request_bytes(),
            }
            .into());
        }
        // Every attempt of this write carries the same request id.
        let req = self.new_request();
        // Held until the write is answered or given up (the guard drops).
        let _held = match &self.held {
            Some(held) => Some(held.hold(req, start, data.clone()).await),
            None => None,
        };
        self.with_retry(attempts, |map, wait| {
            let data = data.clone();
            let at = resolve(&map);
            async move {
                if at? != start {
                    return Err(ClientError::Moved);
                }
                let extent = map.extent(map.extent_of(start));
                let (to, epoch) = (extent.primary, extent.epoch);
                let delta = self.delta(&map, start, to);
                let reply = self
                    .call_as(req, to, wait, |req| Message::Write {
                        req,
                        volume: v.id,
                        epoch,
                        lba: start,
                        data,
                        fua,
                        delta,
                    })
                    .await?;
                match reply {
                    Message::WriteOk { .. } => Ok(()),
                    _ => Err(ClientError::UnexpectedReply("to a write")),
                }
            }
        })
        .await
    }

    /// Read `blocks` blocks at `lba` from the primaries.
    pub async fn read(&self, lba: Lba, blocks: u64) -> Result<Bytes, ClientError> {
        let map = self.map();
        let v = *map.volume();
        let mut out = BytesMut::new();
        let attempts = self.attempts();
        for (start, count) in split(&map, lba, blocks)? {
            let data = self
                .read_at_with(attempts, |_| Ok(Some(start)), count)
                .await?;
            out.extend_from_slice(&data);
        }
        debug_assert_eq!(out.len() as u64, blocks * u64::from(v.block_size));
        Ok(out.freeze())
    }

    /// Read `count` blocks (one request's worth, within one extent) at the
    /// block `resolve` finds in each attempt's map; where it finds none (a
    /// named volume's extent never written), zeroes.
    pub async fn read_at(
        &self,
        resolve: impl Fn(&ClusterMap) -> Result<Option<Lba>, ClientError>,
        count: u64,
    ) -> Result<Bytes, ClientError> {
        self.read_at_with(self.attempts(), resolve, count).await
    }

    /// [`Volume::read_at`] as a step of a request whose retries are
    /// `attempts`.
    pub async fn read_at_with(
        &self,
        attempts: Attempts,
        resolve: impl Fn(&ClusterMap) -> Result<Option<Lba>, ClientError>,
        count: u64,
    ) -> Result<Bytes, ClientError> {
        let v = *self.map().volume();
        let bytes = count * u64::from(v.block_size);
        self.with_retry(attempts, |map, wait| {
            let at = resolve(&map);
            async move {
                let Some(start) = at? else {
                    return Ok(Bytes::from(vec![0; bytes as usize]));
                };
                if split(&map, start, count)?.len() != 1 {
                    return Err(WeirError::OutOfRange {
                        lba: start,
                        blocks: count,
                        capacity: v.capacity_blocks,
                    }
                    .into());
                }
                // Each attempt waits for the read window (if any) and holds
                // its turn until answered; dropped with an error (or the
                // caller gone), the turn gives its bytes back, so a read
                // retrying through a failover holds no one else up.
                let turn = match &self.reads {
                    Some(reads) => Some(reads.turn(bytes).await),
                    None => None,
                };
                let extent = map.extent(map.extent_of(start));
                let (to, epoch) = (extent.primary, extent.epoch);
                let delta = self.delta(&map, start, to);
                let reply = self
                    .call_as(self.new_request(), to, wait, |req| Message::Read {
                        req,
                        volume: v.id,
                        epoch,
                        lba: start,
                        blocks: count as u32,
                        delta,
                    })
                    .await?;
                if let Some(turn) = turn {
                    let (marks, rtt) = self.marks_in(&map, to);
                    turn.answered(marks, rtt);
                }
                self.expect_data(reply, count)
            }
        })
        .await
    }

    /// Read `blocks` blocks at `lba` from `node`'s own replica, bypassing the primary.
    /// The range must lie in one extent that `node` holds. Not retried.
    pub async fn scrub_read(
        &self,
        node: NodeId,
        lba: Lba,
        blocks: u64,
    ) -> Result<Bytes, ClientError> {
        let map = self.map();
        let volume = map.volume().id;
        map.locate(volume, lba, blocks)?;
        let reply = self
            .call(node, |req| Message::ScrubRead {
                req,
                volume,
                lba,
                blocks: blocks as u32,
            })
            .await?;
        self.expect_data(reply, blocks)
    }

    /// Flush every replica of the volume.
    pub async fn flush(&self) -> Result<(), ClientError> {
        self.with_retry(self.attempts(), |map, wait| async move {
            // Any node coordinates; try them in turn as retries go.
            let nodes = map.nodes();
            let to = nodes[(self.retries() as usize) % nodes.len()];
            let reply = self
                .call_as(self.new_request(), to, wait, |req| Message::Flush {
                    req,
                    volume: map.volume().id,
                })
                .await?;
            match reply {
                Message::FlushOk { .. } => Ok(()),
                _ => Err(ClientError::UnexpectedReply("to a flush")),
            }
        })
        .await
    }

    /// The delta of a request at `lba` to `to` (see [`Deltas`]).
    fn delta(&self, map: &ClusterMap, lba: Lba, to: NodeId) -> u32 {
        let key: VolKey = map.named_at(map.extent_of(lba)).map(|(volume, _)| volume);
        self.deltas.lock().expect("deltas lock").delta(key, to)
    }

    fn expect_data(&self, reply: Message, blocks: u64) -> Result<Bytes, ClientError> {
        match reply {
            Message::ReadOk { data, .. } if data.len() == blocks as usize * self.block_size() => {
                Ok(data)
            }
            Message::ReadOk { .. } => Err(ClientError::UnexpectedReply("read of the wrong length")),
            _ => Err(ClientError::UnexpectedReply("to a read")),
        }
    }

    fn new_request(&self) -> RequestId {
        RequestId(self.next_req.fetch_add(1, Ordering::Relaxed))
    }

    /// Send one request with a new id and wait [`CALL_TIMEOUT`] for its
    /// reply; `Failed` becomes an error.
    async fn call(
        &self,
        to: NodeId,
        make: impl FnOnce(RequestId) -> Message,
    ) -> Result<Message, ClientError> {
        self.call_as(self.new_request(), to, CALL_TIMEOUT, make)
            .await
    }

    /// [`Volume::call`] with request id `req` (a retry reuses its write's id; its
    /// earlier attempt is no longer waited for, so a late reply to it is
    /// dropped), waiting `wait` for the reply.
    async fn call_as(
        &self,
        req: RequestId,
        to: NodeId,
        wait: Duration,
        make: impl FnOnce(RequestId) -> Message,
    ) -> Result<Message, ClientError> {
        let frame = self.transport.frame(to, make(req))?;
        let (tx, rx) = oneshot::channel();
        match self.waiters.lock().expect("waiters lock").as_mut() {
            Some(map) => map.insert(req, (to, tx)),
            None => return Err(ClientError::Closed),
        };
        let forget = || {
            if let Some(map) = self.waiters.lock().expect("waiters lock").as_mut() {
                map.remove(&req);
            }
        };
        let deadline = crate::time::now() + wait;
        if let Err(e) = self.send_by((deadline, wait), to, frame).await {
            forget();
            return Err(e);
        }
        let reply = match tokio::time::timeout(left(deadline), rx).await {
            Ok(reply) => reply.map_err(|_| ClientError::Closed)?,
            Err(_) => {
                forget();
                return Err(ClientError::Timeout(wait));
            }
        };
        match reply {
            Message::Failed { error, .. } => Err(error.into()),
            reply => Ok(reply),
        }
    }

    /// Send `frame` to `to`; while the transport's queue towards it is full, wait
    /// for room (this request's caller waits, nobody else), until `deadline`
    /// (`wait` after the attempt started).
    async fn send_by(
        &self,
        (deadline, wait): (tokio::time::Instant, Duration),
        to: NodeId,
        mut frame: Frame,
    ) -> Result<(), ClientError> {
        loop {
            match self.transport.send(to, frame) {
                Ok(()) => return Ok(()),
                Err(SendError::Refused(e)) => return Err(e.into()),
                Err(SendError::Full(held)) => {
                    frame = held;
                    if tokio::time::timeout(left(deadline), self.transport.writable())
                        .await
                        .is_err()
                    {
                        return Err(ClientError::Timeout(wait));
                    }
                }
            }
        }
    }
}

/// Time left until `deadline` (madsim's timers take durations only).
fn left(deadline: tokio::time::Instant) -> Duration {
    deadline.saturating_duration_since(crate::time::now())
}

/// Split `[lba, lba + blocks)` at extent boundaries and request-size limits, after
/// checking the whole range is inside the volume.
fn split(map: &ClusterMap, lba: Lba, blocks: u64) -> Result<Vec<(Lba, u64)>, WeirError> {
    let v = map.volume();
    match lba.0.checked_add(blocks) {
        Some(end) if blocks > 0 && end <= v.capacity_blocks => {}
        _ => {
            return Err(WeirError::OutOfRange {
                lba,
                blocks,
                capacity: v.capacity_blocks,
            })
        }
    }
    let mut parts = Vec::new();
    let (mut at, end) = (lba, lba.offset(blocks));
    while at < end {
        let stop = map
            .extent_end(map.extent_of(at))
            .min(end)
            .min(at.offset(u64::from(v.max_request_blocks)));
        // Each part is one request to one primary: never empty, never past its
        // extent or the largest request.
        assert!(
            at < stop && map.extent_of(at) == map.extent_of(Lba(stop.0 - 1)),
            "a part of {at}..{stop} crosses an extent"
        );
        parts.push((at, stop.0 - at.0));
        at = stop;
    }
    debug_assert_eq!(parts.iter().map(|p| p.1).sum::<u64>(), blocks);
    Ok(parts)
}
