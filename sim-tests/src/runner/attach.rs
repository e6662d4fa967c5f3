//! How the simulator's client hosts reach a volume: through a storage node's
//! own front end, as NBD's clients reach the daemon's. Every storage node runs
//! its front end as the daemon does (weir-core's `boot_with_front_end`: its
//! pool client spliced to its node, the node taking the payloads it holds),
//! on an endpoint of its own on the fabric ([`front_end_of`] the node, on the
//! node's CPU). A client host sends each request to one node's front end and
//! gets the answer back, both over the fabric: the hop that NBD (over TCP) or
//! NVMe-oF (over RDMA) makes in a deployment, in a small protocol of the
//! simulator's own: frames with weir's frame header (which every transport
//! delimits frames by) marked [`MARK`] where a weir message has 0, and a
//! body of their own; the front end's endpoint hands them to [`serve`] and the
//! rest to its pool client.
//!
//! A host has a path to every node and uses one at a time. An attempt that is
//! not answered by its deadline ([`ATTEMPT`]) goes to the next node, as a
//! multipath host moves I/O off a path that stopped answering. The front end
//! drops an attempt at its deadline (the simulator's one clock), so it sends
//! nothing for it after; the host waits [`FENCE`] more before it sends the
//! request elsewhere, so that no copy of the first attempt can land after the
//! second was answered.

use super::cluster::SharedFrontEnd;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;
use weir_core::named::Target;
use weir_core::transport::{CongestionSignals, SendError, Transport, TransportError};
use weir_core::wire::{Frame, HEADER_BYTES, MAGIC, WIRE_VERSION};
use weir_core::NodeId;
use weir_transport_sim::SimTransport;

use weir_core::front_end::front_end_of;

/// The byte of weir's frame header (its fourth, 0 in every weir message)
/// that marks a frame of this protocol.
pub(super) const MARK: u8 = 0xA7;
/// How long a front end works on one attempt of a request.
pub(super) const ATTEMPT: Duration = Duration::from_secs(1);
/// How long past an attempt's deadline a host waits before it sends the
/// request to another node: longer than a message takes to cross the fabric
/// and a node's queues, so that the front end that dropped the attempt has
/// nothing of it still on its way.
pub(super) const FENCE: Duration = Duration::from_millis(50);
/// How long a host keeps trying a request, over every path, before the
/// workload sees an error.
pub(super) const REQUEST_BOUND: Duration = Duration::from_secs(60);
/// How long a host waits after a front end refused a request before it
/// tries the next.
pub(super) const REFUSED_PAUSE: Duration = Duration::from_millis(10);
/// Requests a node's front end serves at once; past it, it reads no more
/// from its endpoint until one is answered.
pub(super) const SERVED_MAX: usize = 1024;
/// Requests waiting for the server between the endpoint and it; past it, a
/// request is dropped (its host tries again elsewhere after its deadline).
pub(super) const QUEUED_MAX: usize = 1024;

const KIND_READ: u8 = 0;
const KIND_WRITE: u8 = 1;
const KIND_REPLY: u8 = 2;

/// One request of a host.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Request {
    tag: u64,
    /// Nanoseconds after the run's start by which the front end drops it.
    deadline_ns: u64,
    volume: Target,
    offset: u64,
    /// Bytes to read, or the data to write.
    op: Op,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Read(u64),
    Write(Bytes),
}

/// A front end's answer.
type Reply = Result<Bytes, Refusal>;

/// A front end's error, and whether every other front end would give it too
/// (the request is wrong in itself, or the pool is full), so that no other
/// path is tried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Refusal {
    pub(super) why: String,
    pub(super) final_everywhere: bool,
}

/// A reply's status byte: answered.
const STATUS_OK: u8 = 1;
/// Refused; another front end may answer.
const STATUS_REFUSED: u8 = 0;
/// Refused; every front end would refuse it.
const STATUS_FINAL: u8 = 2;

/// A frame of this protocol with `control` (after the header) and `payload`.
fn frame(control: BytesMut, payload: Bytes) -> Frame {
    let mut head = BytesMut::with_capacity(HEADER_BYTES + control.len());
    head.put_slice(&MAGIC);
    head.put_u8(WIRE_VERSION);
    head.put_u8(MARK);
    head.put_u32_le(control.len() as u32);
    head.put_u32_le(payload.len() as u32);
    head.put_slice(&control);
    Frame {
        head: head.freeze(),
        payload,
        local: None,
    }
}

/// The body of a frame of this protocol (after the header).
fn control(frame: &Frame) -> Option<&[u8]> {
    is_ours(frame).then(|| &frame.head[HEADER_BYTES..])
}

fn put_str(b: &mut BytesMut, s: &str) {
    let s = &s.as_bytes()[..s.len().min(usize::from(u16::MAX))];
    b.put_u16(s.len() as u16);
    b.put_slice(s);
}

fn get_str(b: &mut &[u8]) -> Option<String> {
    if b.remaining() < 2 {
        return None;
    }
    let len = usize::from(b.get_u16());
    if b.remaining() < len {
        return None;
    }
    let s = String::from_utf8(b[..len].to_vec()).ok()?;
    b.advance(len);
    Some(s)
}

impl Request {
    fn encode(&self) -> Frame {
        let mut head = BytesMut::with_capacity(64);
        let (kind, len, payload) = match &self.op {
            Op::Read(len) => (KIND_READ, *len, Bytes::new()),
            Op::Write(data) => (KIND_WRITE, data.len() as u64, data.clone()),
        };
        head.put_u8(kind);
        head.put_u64(self.tag);
        head.put_u64(self.deadline_ns);
        head.put_u64(self.volume.id.unwrap_or(u64::MAX));
        head.put_u64(self.offset);
        head.put_u64(len);
        put_str(&mut head, &self.volume.name);
        frame(head, payload)
    }

    fn decode(frame: &Frame) -> Option<Request> {
        let mut b = control(frame)?;
        if b.remaining() < 1 + 5 * 8 {
            return None;
        }
        let kind = b.get_u8();
        let (tag, deadline_ns, id, offset, len) = (
            b.get_u64(),
            b.get_u64(),
            b.get_u64(),
            b.get_u64(),
            b.get_u64(),
        );
        let name = get_str(&mut b)?;
        let op = match kind {
            KIND_READ => Op::Read(len),
            KIND_WRITE if frame.payload.len() as u64 == len => Op::Write(frame.payload.clone()),
            _ => return None,
        };
        let volume = Target {
            name,
            snap: None,
            id: (id != u64::MAX).then_some(id),
        };
        Some(Request {
            tag,
            deadline_ns,
            volume,
            offset,
            op,
        })
    }
}

fn encode_reply(tag: u64, reply: &Reply) -> Frame {
    let mut head = BytesMut::with_capacity(32);
    head.put_u8(KIND_REPLY);
    head.put_u64(tag);
    head.put_u8(match reply {
        Ok(_) => STATUS_OK,
        Err(r) if r.final_everywhere => STATUS_FINAL,
        Err(_) => STATUS_REFUSED,
    });
    put_str(
        &mut head,
        reply.as_ref().err().map_or("", |r| r.why.as_str()),
    );
    frame(head, reply.as_ref().ok().cloned().unwrap_or_default())
}

fn decode_reply(frame: &Frame) -> Option<(u64, Reply)> {
    let mut b = control(frame)?;
    if b.remaining() < 1 + 8 + 1 || b.get_u8() != KIND_REPLY {
        return None;
    }
    let (tag, status) = (b.get_u64(), b.get_u8());
    let why = get_str(&mut b)?;
    let reply = match status {
        STATUS_OK => Ok(frame.payload.clone()),
        STATUS_REFUSED | STATUS_FINAL => Err(Refusal {
            why,
            final_everywhere: status == STATUS_FINAL,
        }),
        _ => return None,
    };
    Some((tag, reply))
}

fn is_ours(frame: &Frame) -> bool {
    frame.local.is_none()
        && frame.head.len() >= HEADER_BYTES
        && frame.head.starts_with(&MAGIC)
        && frame.head[3] == MARK
}

/// A storage node's endpoint on the fabric, as its node and front end see it:
/// frames of this protocol (at the front end's) go to its server, every other
/// frame to its reader.
pub(super) struct Demux {
    net: Arc<SimTransport>,
    requests: Option<mpsc::Sender<(NodeId, Frame)>>,
}

impl Demux {
    /// The node's endpoint (no requests reach it).
    pub(super) fn node(net: Arc<SimTransport>) -> Arc<Demux> {
        Arc::new(Demux {
            net,
            requests: None,
        })
    }

    /// The front end's endpoint, and the requests that reach it.
    pub(super) fn front_end(
        net: Arc<SimTransport>,
    ) -> (Arc<Demux>, mpsc::Receiver<(NodeId, Frame)>) {
        let (tx, rx) = mpsc::channel(QUEUED_MAX);
        let demux = Demux {
            net,
            requests: Some(tx),
        };
        (Arc::new(demux), rx)
    }
}

impl Transport for Demux {
    fn local_id(&self) -> NodeId {
        self.net.local_id()
    }

    fn send(&self, to: NodeId, frame: Frame) -> Result<(), SendError> {
        self.net.send(to, frame)
    }

    async fn writable(&self) {
        self.net.writable().await;
    }

    async fn recv(&self) -> Result<(NodeId, Frame), TransportError> {
        loop {
            let (from, frame) = self.net.recv().await?;
            match &self.requests {
                // A full queue drops the request, as a target out of command
                // slots would; the host tries again after its deadline.
                Some(requests) if is_ours(&frame) => {
                    let _ = requests.try_send((from, frame));
                }
                _ => return Ok((from, frame)),
            }
        }
    }

    fn signals(&self, peer: NodeId) -> CongestionSignals {
        self.net.signals(peer)
    }
}

/// Serve the requests that reach a node's front end (`front`, on `net`) until
/// the node stops; `start` is the run's start, which deadlines count from.
pub(super) async fn serve(
    front: SharedFrontEnd,
    (net, mut requests): (Arc<Demux>, mpsc::Receiver<(NodeId, Frame)>),
    start: Instant,
) {
    let room = Arc::new(Semaphore::new(SERVED_MAX));
    while let Some((from, frame)) = requests.recv().await {
        let Some(req) = Request::decode(&frame) else {
            tracing::warn!(%from, "malformed front-end request dropped");
            continue;
        };
        let deadline = start + Duration::from_nanos(req.deadline_ns);
        if deadline <= Instant::now() {
            continue;
        }
        let permit = room.clone().acquire_owned().await.expect("never closed");
        let (front, net) = (front.clone(), net.clone());
        tokio::spawn(async move {
            let _permit = permit;
            // A request that waited for its slot past its deadline is dropped
            // before it sends anything: its host is trying elsewhere.
            if deadline <= Instant::now() {
                return;
            }
            let work = async {
                let done = match &req.op {
                    Op::Read(len) => front.read(&req.volume, req.offset, *len).await,
                    Op::Write(data) => front
                        .write(&req.volume, req.offset, data.clone(), false)
                        .await
                        .map(|()| Bytes::new()),
                };
                done.map_err(|e| Refusal {
                    final_everywhere: e.final_everywhere(),
                    why: e.to_string(),
                })
            };
            // At its deadline the attempt is dropped, with all it would still
            // send: its host is about to try elsewhere.
            let Ok(reply) = timeout_at(deadline, work).await else {
                return;
            };
            send_until(&*net, from, encode_reply(req.tag, &reply), deadline).await;
        });
    }
}

/// Send `frame` to `to` on `net`, waiting for room until `deadline`; lost if
/// there is none by then (its receiver treats it as unanswered).
async fn send_until<T: Transport>(net: &T, to: NodeId, mut frame: Frame, deadline: Instant) {
    loop {
        match net.send(to, frame) {
            Ok(()) | Err(SendError::Refused(_)) => return,
            Err(SendError::Full(back)) => frame = back,
        }
        if timeout_at(deadline, net.writable()).await.is_err() {
            return;
        }
    }
}

/// A client host's paths to the volumes: its endpoint, the front ends it may
/// use (in the order it tries them), and the requests waiting for answers.
pub(super) struct Paths {
    net: Arc<SimTransport>,
    nodes: Vec<NodeId>,
    /// Index in `nodes` of the path in use.
    using: AtomicU64,
    waiting: Arc<Mutex<BTreeMap<u64, oneshot::Sender<Reply>>>>,
    next_tag: AtomicU64,
    /// A front end's refusal ends the request (the simulator's
    /// `give_up_at_once` bug: no other path is tried).
    give_up: bool,
    start: Instant,
    /// Attempts sent again on another path.
    pub(super) moved: AtomicU64,
}

impl Paths {
    /// Paths from `net` to the front ends of `nodes`, the one at `first` in
    /// use first; spawns the task that takes the answers.
    pub(super) fn open(
        net: Arc<SimTransport>,
        (nodes, first): (Vec<NodeId>, usize),
        give_up: bool,
        start: Instant,
    ) -> Arc<Paths> {
        assert!(!nodes.is_empty(), "a host has a path");
        let waiting: Arc<Mutex<BTreeMap<u64, oneshot::Sender<Reply>>>> = Arc::default();
        let (rx_net, rx_waiting) = (net.clone(), waiting.clone());
        tokio::spawn(async move {
            while let Ok((_, frame)) = rx_net.recv().await {
                let Some((tag, reply)) = decode_reply(&frame) else {
                    continue;
                };
                if let Some(waiter) = rx_waiting.lock().expect("waiting").remove(&tag) {
                    let _ = waiter.send(reply);
                }
            }
        });
        Arc::new(Paths {
            net,
            nodes,
            using: AtomicU64::new(first as u64),
            waiting,
            next_tag: AtomicU64::new(1),
            give_up,
            start,
            moved: AtomicU64::new(0),
        })
    }

    /// Read `len` bytes of `volume` at `offset`.
    pub(super) async fn read(
        &self,
        volume: &Target,
        offset: u64,
        len: u64,
    ) -> Result<Bytes, String> {
        self.call(volume, offset, Op::Read(len)).await
    }

    /// Write `data` to `volume` at `offset`.
    pub(super) async fn write(
        &self,
        volume: &Target,
        offset: u64,
        data: Bytes,
    ) -> Result<(), String> {
        self.call(volume, offset, Op::Write(data)).await.map(|_| ())
    }

    async fn call(&self, volume: &Target, offset: u64, op: Op) -> Result<Bytes, String> {
        let bound = Instant::now() + REQUEST_BOUND;
        loop {
            let using = self.using.load(Ordering::Relaxed);
            let node = self.nodes[using as usize % self.nodes.len()];
            let deadline = Instant::now() + ATTEMPT;
            let req = Request {
                tag: self.next_tag.fetch_add(1, Ordering::Relaxed),
                deadline_ns: (deadline - self.start).as_nanos() as u64,
                volume: volume.clone(),
                offset,
                op: op.clone(),
            };
            let (why, answered) = match self.attempt(node, &req, deadline + FENCE).await {
                Some(Ok(data)) => return Ok(data),
                Some(Err(e)) if self.give_up || e.final_everywhere => return Err(e.why),
                Some(Err(e)) => (e.why, true),
                None => (
                    format!("{node}'s front end did not answer by the attempt's deadline"),
                    false,
                ),
            };
            if Instant::now() >= bound {
                return Err(format!("no path answered within {REQUEST_BOUND:?}: {why}"));
            }
            // Another request may have moved the path already.
            if self
                .using
                .compare_exchange(using, using + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
            {
                tracing::debug!(%node, why, "moving to the next path");
            }
            self.moved.fetch_add(1, Ordering::Relaxed);
            // An unanswered attempt was waited for past its fence already; a
            // front end that answered sends nothing more for it, and is not
            // asked again at once.
            if answered {
                tokio::time::sleep(REFUSED_PAUSE).await;
            }
        }
    }

    /// One attempt of `req` at `node`'s front end, waited for until `until`.
    async fn attempt(&self, node: NodeId, req: &Request, until: Instant) -> Option<Reply> {
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().expect("waiting").insert(req.tag, tx);
        let to = front_end_of(node);
        send_until(&*self.net, to, req.encode(), until).await;
        let got = timeout_at(until, rx).await;
        self.waiting.lock().expect("waiting").remove(&req.tag);
        got.ok().and_then(Result::ok)
    }
}

/// `work`, unless `deadline` comes first.
async fn timeout_at<F: std::future::Future>(
    deadline: Instant,
    work: F,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), work).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::wire::Message;

    #[test]
    fn requests_and_replies_come_back_as_they_were_sent_and_garbage_is_refused() {
        let write = Request {
            tag: 7,
            deadline_ns: 1_000_000_000,
            volume: Target {
                name: "vol-a".into(),
                snap: None,
                id: Some(3),
            },
            offset: 8192,
            op: Op::Write(Bytes::from_static(b"data")),
        };
        let frame = write.encode();
        assert!(is_ours(&frame));
        assert_eq!(Request::decode(&frame), Some(write.clone()));
        let read = Request {
            op: Op::Read(4096),
            volume: Target {
                id: None,
                ..write.volume.clone()
            },
            ..write
        };
        assert_eq!(Request::decode(&read.encode()), Some(read));
        for reply in [
            Ok(Bytes::from_static(b"block")),
            Err(Refusal {
                why: "no lease".to_string(),
                final_everywhere: false,
            }),
            Err(Refusal {
                why: "out of range".to_string(),
                final_everywhere: true,
            }),
        ] {
            assert_eq!(decode_reply(&encode_reply(9, &reply)), Some((9, reply)));
        }
        // A status this protocol does not have is refused.
        let mut odd = encode_reply(9, &Ok(Bytes::new()));
        let mut head = odd.head.to_vec();
        head[HEADER_BYTES + 1 + 8] = 7;
        odd.head = Bytes::from(head);
        assert_eq!(decode_reply(&odd), None);
        // Cut short anywhere, a request is refused, not misread.
        let whole = frame.head.clone();
        for len in 0..whole.len() {
            let cut = Frame {
                head: whole.slice(..len),
                ..frame.clone()
            };
            assert_eq!(Request::decode(&cut), None, "cut at {len}");
        }
        // A weir message is not ours, nor ours a weir message; each crosses
        // a wire transport whole (its header gives its lengths).
        let msg = Message::fetched(weir_core::OpId(1), Ok(Bytes::new()));
        assert!(!is_ours(&msg.encode().unwrap()));
        assert_eq!(
            Message::decode(frame.clone()),
            Err(weir_core::wire::DecodeError::Reserved(MARK))
        );
        let wire = [frame.head.clone(), frame.payload.clone()].concat();
        assert_eq!(Frame::parse(Bytes::from(wire)), Ok(frame.clone()));
        // A write whose payload is not the length it says.
        let short = Frame {
            payload: Bytes::from_static(b"dat"),
            ..frame
        };
        assert_eq!(Request::decode(&short), None);
    }
}
