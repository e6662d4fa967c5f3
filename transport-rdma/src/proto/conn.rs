//! [`Conn`]: one queue pair's messenger state, the one owner of its credits,
//! grants, send queue and receive slots.

use super::header::{self, Header};
use super::{Config, Params, ProtoError};
use bytes::Bytes;
use std::collections::VecDeque;
use weir_core::wire::Frame;
use weir_core::{SendError, TransportError};

/// A work request for the caller to post, in the order handed out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Post {
    /// Post one receive slot of the connection's `slot_bytes`.
    Recv,
    /// Post a send work request.
    Send(SendWr),
}

/// A send work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Its id; [`Completion::Sent`] names it.
    pub wr: u64,
    /// Whether it asks for a completion (one frees every send before it).
    pub signaled: bool,
    /// What it does.
    pub op: Op,
}

/// The operation of a send work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// SEND of `header`, then the frame's head and payload (gathered, not
    /// copied), into the peer's next receive slot; `inline` asks the NIC to copy
    /// it into the work request.
    Send {
        /// The messenger's header.
        header: Bytes,
        /// The frame, or none for a credit update.
        frame: Option<Frame>,
        /// Whether the whole message goes inline.
        inline: bool,
    },
    /// RDMA WRITE_WITH_IMM of the frame's head and payload to the start of the
    /// peer's granted region `slot`, with `slot` as the immediate.
    WriteImm {
        /// The region, from a grant of the peer's.
        slot: u16,
        /// The frame.
        frame: Frame,
    },
}

/// A completion, as polled from the completion queues.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completion {
    /// Signalled send `wr` completed: it and every send before it are done.
    Sent {
        /// The work request.
        wr: u64,
    },
    /// A receive slot took a SEND: the bytes it holds.
    Recv {
        /// The message (the messenger's header and what follows).
        data: Bytes,
    },
    /// A receive slot was consumed by a WRITE_WITH_IMM.
    RecvImm {
        /// The immediate.
        imm: u32,
        /// Bytes written.
        len: u32,
    },
    /// A work request (send or receive) completed in error or was flushed.
    Error {
        /// The work request, 0 for a receive.
        wr: u64,
    },
}

/// What a receive completion brought.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming {
    /// A frame (its payload slices the receive slot's memory).
    Frame(Frame),
    /// A frame of `len` bytes is in granted region `slot`: hand its bytes to
    /// [`Conn::take_large`], and [`Conn::release`] the region once the frame is
    /// dropped.
    Large {
        /// The region.
        slot: u16,
        /// Bytes in it.
        len: u32,
    },
}

/// Where one of this side's granted regions stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Region {
    /// Free, waiting to go out in a header.
    Free,
    /// Granted to the peer.
    Granted,
    /// Written by the peer; the frame in it is not yet released.
    Held,
}

/// One queue pair's messenger (see the module docs of [`super`]).
#[derive(Debug)]
pub struct Conn {
    cfg: Config,
    peer: Params,
    dead: bool,
    // --- sending ---
    /// Receives posted at the peer that this side may still consume:
    /// `peer.recv_slots - sent + returned`.
    credits: u16,
    /// Messages sent (credits spent) in all.
    sent: u64,
    /// Credits the peer returned in all.
    returned: u64,
    /// The peer's regions granted to this side, unused, oldest first.
    grants: VecDeque<u16>,
    /// Per region of the peer's: whether it is in `grants`.
    holding: Vec<bool>,
    /// Frames waiting for a credit, a grant or room in the send queue.
    queue: VecDeque<Frame>,
    queued_bytes: usize,
    /// A frame was refused since the queue last emptied.
    refused: bool,
    next_wr: u64,
    since_signal: u16,
    /// Send work requests posted and not yet known complete, with the frame
    /// each carries (none for a credit update).
    inflight: VecDeque<(u64, Option<Frame>)>,
    // --- receiving ---
    /// Receive slots to post at start.
    initial: u16,
    /// Receive slots consumed and not yet posted again.
    to_repost: u16,
    /// Receive slots posted.
    posted: u16,
    /// Receive slots posted again and not yet reported to the peer.
    unreported: u16,
    /// Messages received in all.
    received: u64,
    /// Credits returned to the peer in all.
    reported: u64,
    regions: Vec<Region>,
    /// Free regions for the next header, oldest first.
    to_grant: VecDeque<u16>,
    /// Frames lost when the connection failed.
    lost: u64,
    /// Those frames, in the order they were sent, until taken.
    unfinished: Vec<Frame>,
}

impl Conn {
    /// A connection that receives by `cfg` and sends by the `peer`'s shape (from
    /// set-up). Refuses a bad shape of either side.
    pub fn new(cfg: Config, peer: Params) -> Result<Conn, ProtoError> {
        cfg.validate()?;
        peer.validate()?;
        let p = cfg.params;
        Ok(Conn {
            cfg,
            peer,
            dead: false,
            credits: peer.recv_slots,
            sent: 0,
            returned: 0,
            grants: VecDeque::new(),
            holding: vec![false; usize::from(peer.large_slots)],
            queue: VecDeque::new(),
            queued_bytes: 0,
            refused: false,
            next_wr: 1,
            since_signal: 0,
            inflight: VecDeque::new(),
            initial: p.recv_slots,
            to_repost: 0,
            posted: 0,
            unreported: 0,
            received: 0,
            reported: 0,
            regions: vec![Region::Free; usize::from(p.large_slots)],
            to_grant: (0..p.large_slots).collect(),
            lost: 0,
            unfinished: Vec::new(),
        })
    }

    /// Queue `frame` for the peer. Never waits: a full queue hands it back
    /// ([`SendError::Full`]); an empty one takes any frame that is not too large.
    pub fn send(&mut self, frame: Frame) -> Result<(), SendError> {
        self.check_takes(&frame)?;
        if !self.queue.is_empty() && self.queued_bytes + frame.len() > self.cfg.queue_bytes {
            self.refused = true;
            return Err(SendError::Full(frame));
        }
        self.queued_bytes += frame.len();
        self.queue.push_back(frame);
        Ok(())
    }

    /// Whether the connection can carry `frame` at all: alive, and the frame
    /// no larger than the peer's regions.
    fn check_takes(&self, frame: &Frame) -> Result<(), SendError> {
        if self.dead {
            return Err(SendError::Refused(TransportError::Closed));
        }
        let max = self.peer.large_bytes as usize;
        if frame.len() > max {
            return Err(SendError::Refused(TransportError::FrameTooLarge {
                len: frame.len(),
                max,
            }));
        }
        Ok(())
    }

    /// Whether a queue that refused a frame has since emptied (once per refusal).
    pub fn take_writable(&mut self) -> bool {
        let now = self.refused && self.queue.is_empty();
        if now {
            self.refused = false;
        }
        now
    }

    /// The next work request to post, if any is due: receive slots first (all of
    /// them before the connection is used), then frames in order, then a credit
    /// update when enough credits or any region wait to go back.
    pub fn poll_post(&mut self) -> Option<Post> {
        if self.dead {
            return None;
        }
        if self.initial > 0 {
            self.initial -= 1;
            self.posted += 1;
            return Some(Post::Recv);
        }
        if self.to_repost > 0 {
            self.to_repost -= 1;
            self.posted += 1;
            self.unreported += 1;
            return Some(Post::Recv);
        }
        if self.inflight.len() >= usize::from(self.cfg.send_queue) {
            return None;
        }
        if let Some(post) = self.next_frame() {
            return Some(post);
        }
        let due =
            self.unreported >= self.cfg.params.credit_threshold() || !self.to_grant.is_empty();
        if due && self.credits >= 1 {
            self.spend();
            let header = self.header(false, usize::from(u16::MAX));
            let inline = header.len() <= self.cfg.max_inline as usize;
            return Some(self.post(
                Op::Send {
                    header,
                    frame: None,
                    inline,
                },
                None,
            ));
        }
        None
    }

    /// The front frame as a work request, if it has a credit (beyond the one kept
    /// for updates) and, when it needs one, a grant.
    fn next_frame(&mut self) -> Option<Post> {
        let front = self.queue.front()?;
        let small = self.fits_slot(front);
        if self.credits < 2 || (!small && self.grants.is_empty()) {
            return None;
        }
        let frame = self.queue.pop_front().expect("the front frame");
        self.queued_bytes -= frame.len();
        self.spend();
        if small {
            let room = self.peer.slot_bytes as usize - frame.len();
            let header = self.header(true, (room - header::len(0)) / 2);
            let inline = header.len() + frame.len() <= self.cfg.max_inline as usize;
            // Kept until known complete: the memory the NIC reads (unless
            // inline), and the frame to send again if the connection fails.
            let held = Some(frame.clone());
            let frame = Some(frame);
            Some(self.post(
                Op::Send {
                    header,
                    frame,
                    inline,
                },
                held,
            ))
        } else {
            let slot = self.grants.pop_front().expect("a grant");
            self.holding[usize::from(slot)] = false;
            let held = Some(frame.clone());
            Some(self.post(Op::WriteImm { slot, frame }, held))
        }
    }

    /// Whether `frame` goes by SEND: it fits a slot behind the longest header.
    fn fits_slot(&self, frame: &Frame) -> bool {
        header::max_len(self.cfg.params.large_slots) + frame.len() <= self.peer.slot_bytes as usize
    }

    /// One credit spent on a message.
    fn spend(&mut self) {
        debug_assert!(self.credits >= 1, "a message without a credit");
        self.credits -= 1;
        self.sent += 1;
        self.check();
    }

    /// A header returning every unreported credit and up to `max_grants` regions.
    fn header(&mut self, frame: bool, max_grants: usize) -> Bytes {
        let n = self.to_grant.len().min(max_grants);
        let grants: Vec<u16> = self.to_grant.drain(..n).collect();
        for &g in &grants {
            debug_assert_eq!(self.regions[usize::from(g)], Region::Free);
            self.regions[usize::from(g)] = Region::Granted;
        }
        let credits = std::mem::take(&mut self.unreported);
        self.reported += u64::from(credits);
        Header {
            frame,
            credits,
            grants,
        }
        .encode()
    }

    /// `op` as the next send work request; signalled every `signal_every`, when
    /// the send queue is about to fill, and when nothing waits behind it.
    fn post(&mut self, op: Op, held: Option<Frame>) -> Post {
        let wr = self.next_wr;
        self.next_wr += 1;
        self.since_signal += 1;
        let signaled = self.since_signal >= self.cfg.signal_every
            || self.inflight.len() + 1 >= usize::from(self.cfg.send_queue)
            || self.queue.is_empty();
        if signaled {
            self.since_signal = 0;
        }
        self.inflight.push_back((wr, held));
        Post::Send(SendWr { wr, signaled, op })
    }

    /// Feed one completion. An error fails the connection (see [`ProtoError`]):
    /// the caller destroys the queue pair.
    pub fn complete(&mut self, c: Completion) -> Result<Option<Incoming>, ProtoError> {
        if self.dead {
            return Err(ProtoError::Dead);
        }
        let result = match c {
            Completion::Sent { wr } => {
                debug_assert!(
                    self.inflight.iter().any(|&(w, _)| w == wr),
                    "completion of send {wr}, not in flight"
                );
                while self.inflight.front().is_some_and(|&(w, _)| w <= wr) {
                    self.inflight.pop_front();
                }
                Ok(None)
            }
            Completion::Recv { data } => self.received_send(data),
            Completion::RecvImm { imm, len } => self.received_write(imm, len).map(Some),
            Completion::Error { wr } => Err(ProtoError::Completion(wr)),
        };
        if result.is_err() {
            self.fail();
        }
        result
    }

    /// A receive slot was consumed by a message: `frame` says whether it carries
    /// one (and so must have left the peer a credit for updates).
    fn consume(&mut self, frame: bool) -> Result<(), ProtoError> {
        if self.posted == 0 {
            return Err(ProtoError::NoCredit);
        }
        self.posted -= 1;
        self.to_repost += 1;
        self.received += 1;
        // The peer's credits are at most what this side posted for it, less what
        // it consumed, plus what this side returned.
        let left = i128::from(self.cfg.params.recv_slots) + i128::from(self.reported)
            - i128::from(self.received);
        if left < i128::from(frame) {
            return Err(ProtoError::NoCredit);
        }
        Ok(())
    }

    fn received_send(&mut self, data: Bytes) -> Result<Option<Incoming>, ProtoError> {
        let (h, at) = Header::decode(&data)?;
        self.consume(h.frame)?;
        self.returned += u64::from(h.credits);
        if self.returned > self.sent {
            return Err(ProtoError::ExcessCredits {
                returned: self.returned,
                spent: self.sent,
            });
        }
        self.credits += h.credits;
        for g in h.grants {
            match self.holding.get_mut(usize::from(g)) {
                Some(held @ false) => *held = true,
                _ => return Err(ProtoError::BadGrant(g)),
            }
            self.grants.push_back(g);
        }
        self.check();
        if !h.frame {
            if data.len() != at {
                return Err(ProtoError::BadHeader("a credit update carries nothing"));
            }
            return Ok(None);
        }
        Frame::parse(data.slice(at..))
            .map(|f| Some(Incoming::Frame(f)))
            .map_err(ProtoError::BadFrame)
    }

    fn received_write(&mut self, imm: u32, len: u32) -> Result<Incoming, ProtoError> {
        self.consume(true)?;
        let slot = u16::try_from(imm)
            .ok()
            .filter(|&s| self.regions.get(usize::from(s)) == Some(&Region::Granted))
            .ok_or(ProtoError::NotGranted(imm))?;
        if len == 0 || len > self.cfg.params.large_bytes {
            return Err(ProtoError::BadLength(len));
        }
        self.regions[usize::from(slot)] = Region::Held;
        Ok(Incoming::Large { slot, len })
    }

    /// The frame in region `slot`, from the bytes [`Incoming::Large`] named.
    pub fn take_large(&mut self, slot: u16, data: Bytes) -> Result<Frame, ProtoError> {
        if self.dead {
            return Err(ProtoError::Dead);
        }
        debug_assert_eq!(self.regions.get(usize::from(slot)), Some(&Region::Held));
        let frame = Frame::parse(data).map_err(ProtoError::BadFrame);
        if frame.is_err() {
            self.fail();
        }
        frame
    }

    /// The frame in region `slot` was dropped: the region may be granted again.
    pub fn release(&mut self, slot: u16) {
        if self.dead {
            return;
        }
        let r = &mut self.regions[usize::from(slot)];
        assert_eq!(*r, Region::Held, "region {slot} released but not held");
        *r = Region::Free;
        self.to_grant.push_back(slot);
    }

    /// The connection failed: every frame queued or in flight (not known to
    /// have arrived) is given up, counted in [`Conn::lost`] and kept for
    /// [`Conn::take_unfinished`]; the connection takes nothing more.
    pub fn fail(&mut self) {
        if self.dead {
            return;
        }
        self.dead = true;
        let flying = self.inflight.drain(..).filter_map(|(_, f)| f);
        self.unfinished.extend(flying.chain(self.queue.drain(..)));
        self.lost += self.unfinished.len() as u64;
        self.queued_bytes = 0;
    }

    /// The frames given up when the connection failed, in the order they were
    /// sent (some may have arrived: their completions were not seen).
    pub fn take_unfinished(&mut self) -> Vec<Frame> {
        std::mem::take(&mut self.unfinished)
    }

    /// Queue `frame` whatever the queue holds: for frames a failed connection
    /// gave up, sent again on its successor (they were within a bound once).
    pub fn send_again(&mut self, frame: Frame) -> Result<(), SendError> {
        self.check_takes(&frame)?;
        self.queued_bytes += frame.len();
        self.queue.push_back(frame);
        Ok(())
    }

    /// Whether the connection failed.
    pub fn is_dead(&self) -> bool {
        self.dead
    }

    /// Frames given up when it failed.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Credits left towards the peer.
    pub fn credits(&self) -> u16 {
        self.credits
    }

    /// The peer's regions granted to this side and unused.
    pub fn grants(&self) -> usize {
        self.grants.len()
    }

    /// Frames waiting to be posted.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Send work requests posted and not known complete.
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// Receive slots posted.
    pub fn posted(&self) -> u16 {
        self.posted
    }

    /// The send side's invariant: credits are what was posted for this side,
    /// less what it spent, plus what came back.
    fn check(&self) {
        debug_assert_eq!(
            u64::from(self.credits) + self.sent,
            u64::from(self.peer.recv_slots) + self.returned,
            "credits out of balance"
        );
    }
}
