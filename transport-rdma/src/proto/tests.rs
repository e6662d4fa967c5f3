//! The messenger against a model of two RC queue pairs: in-order delivery, a
//! receive consumed per message (none posted is a receiver-not-ready), signalled
//! completions, granted regions as memory; and against hostile peers.

use super::header::Header;
use super::*;
use crate::testing::{frame, op_of};
use bytes::Bytes;
use proptest::prelude::*;
use std::collections::VecDeque;
use weir_core::wire::Frame;
use weir_core::SendError;

/// Small shapes, so credits, grants and the send queue all run out.
fn cfg(recv_slots: u16, large_slots: u16, send_queue: u16, signal_every: u16) -> Config {
    Config {
        params: Params {
            recv_slots,
            slot_bytes: 1024,
            large_slots,
            large_bytes: 64 * 1024,
        },
        send_queue,
        signal_every,
        max_inline: 64,
        queue_bytes: 256 * 1024,
    }
}

/// One side: its messenger and what its NIC holds.
struct Side {
    conn: Conn,
    send_queue: usize,
    /// Receives posted at the NIC.
    recvs: u32,
    /// Send work requests posted, not yet on the wire.
    sq: VecDeque<SendWr>,
    /// Signalled sends done at the peer, their completions not yet polled.
    cq: VecDeque<u64>,
    /// This side's granted regions, as memory.
    regions: Vec<Option<Bytes>>,
    /// Frames of regions the application still holds.
    held: VecDeque<(u16, Frame)>,
    delivered: Vec<u64>,
    sent: Vec<u64>,
}

impl Side {
    fn new(c: Config, peer: Params) -> Side {
        Side {
            conn: Conn::new(c, peer).expect("valid"),
            send_queue: usize::from(c.send_queue),
            recvs: 0,
            sq: VecDeque::new(),
            cq: VecDeque::new(),
            regions: vec![None; usize::from(c.params.large_slots)],
            held: VecDeque::new(),
            delivered: Vec::new(),
            sent: Vec::new(),
        }
    }

    /// Post everything the messenger hands out; how many.
    fn post(&mut self) -> usize {
        let mut n = 0;
        while let Some(p) = self.conn.poll_post() {
            n += 1;
            match p {
                Post::Recv => self.recvs += 1,
                Post::Send(wr) => self.sq.push_back(wr),
            }
            assert!(
                self.conn.in_flight() <= self.send_queue,
                "send queue overrun"
            );
        }
        assert_eq!(
            u32::from(self.conn.posted()),
            self.recvs,
            "receives miscounted"
        );
        n
    }
}

/// `wr` arrives at `to`: a receive consumed (there must be one), the data placed.
fn arrive(wr: SendWr, from: &mut Side, to: &mut Side) {
    assert!(
        to.recvs > 0,
        "receiver not ready: a message with no receive posted"
    );
    to.recvs -= 1;
    let incoming = match wr.op {
        Op::Send { header, frame, .. } => {
            let mut data = header.to_vec();
            if let Some(f) = &frame {
                data.extend_from_slice(&f.head);
                data.extend_from_slice(&f.payload);
            }
            to.conn.complete(Completion::Recv { data: data.into() })
        }
        Op::WriteImm { slot, frame } => {
            let region = &mut to.regions[usize::from(slot)];
            assert!(region.is_none(), "a write over a frame not yet taken");
            *region = Some(frame.to_contiguous());
            to.conn.complete(Completion::RecvImm {
                imm: u32::from(slot),
                len: frame.len() as u32,
            })
        }
    };
    match incoming.expect("a well-behaved peer is never refused") {
        None => {}
        Some(Incoming::Frame(f)) => to.delivered.push(op_of(&f)),
        Some(Incoming::Large { slot, len }) => {
            let data = to.regions[usize::from(slot)].take().expect("written");
            assert_eq!(data.len(), len as usize);
            let f = to.conn.take_large(slot, data).expect("parses");
            to.delivered.push(op_of(&f));
            to.held.push_back((slot, f));
        }
    }
    if wr.signaled {
        from.cq.push_back(wr.wr);
    }
}

/// One step of the model, chosen by the test.
#[derive(Clone, Debug)]
enum Step {
    /// The application on a side sends a frame of this many payload bytes.
    Send(usize, usize),
    /// A side posts what its messenger hands out.
    Post(usize),
    /// A side's NIC moves its oldest posted send to the peer.
    Wire(usize),
    /// A side polls one send completion.
    Poll(usize),
    /// A side's application drops its oldest held large frame.
    Release(usize),
}

fn step() -> impl Strategy<Value = Step> {
    let side = 0..2usize;
    prop_oneof![
        (
            side.clone(),
            prop_oneof![0..30usize, 30..900usize, 900..60_000usize]
        )
            .prop_map(|(s, n)| Step::Send(s, n)),
        side.clone().prop_map(Step::Post),
        side.clone().prop_map(Step::Wire),
        side.clone().prop_map(Step::Wire),
        side.clone().prop_map(Step::Poll),
        side.prop_map(Step::Release),
    ]
}

struct Pair {
    s: [Side; 2],
    next_op: u64,
}

impl Pair {
    fn new(a: Config, b: Config) -> Pair {
        let mut s = [Side::new(a, b.params), Side::new(b, a.params)];
        // Both sides post their receives before the queue pair connects.
        for side in &mut s {
            side.post();
        }
        Pair { s, next_op: 1 }
    }

    fn sides(&mut self, i: usize) -> (&mut Side, &mut Side) {
        let [a, b] = &mut self.s;
        if i == 0 {
            (a, b)
        } else {
            (b, a)
        }
    }

    /// Whether the step did anything.
    fn apply(&mut self, step: &Step) -> bool {
        let op = self.next_op;
        match *step {
            Step::Send(i, n) => {
                let me = self.sides(i).0;
                match me.conn.send(frame(op, n)) {
                    Ok(()) => me.sent.push(op),
                    Err(SendError::Full(_)) => {}
                    Err(e) => panic!("refused: {e}"),
                }
                self.next_op += 1;
                true
            }
            Step::Post(i) => self.sides(i).0.post() > 0,
            Step::Wire(i) => {
                let (me, peer) = self.sides(i);
                let Some(wr) = me.sq.pop_front() else {
                    return false;
                };
                arrive(wr, me, peer);
                true
            }
            Step::Poll(i) => {
                let me = self.sides(i).0;
                let Some(wr) = me.cq.pop_front() else {
                    return false;
                };
                assert_eq!(me.conn.complete(Completion::Sent { wr }), Ok(None));
                true
            }
            Step::Release(i) => {
                let me = self.sides(i).0;
                let Some((slot, _frame)) = me.held.pop_front() else {
                    return false;
                };
                me.conn.release(slot);
                true
            }
        }
    }

    /// Run every side's NIC and application until nothing moves.
    fn settle(&mut self) {
        let all = [Step::Release, Step::Post, Step::Wire, Step::Poll];
        for _ in 0..100_000 {
            let mut moved = false;
            for i in 0..2 {
                for s in all {
                    moved |= self.apply(&s(i));
                }
            }
            if !moved {
                return;
            }
        }
        panic!("the messenger never settles");
    }
}

fn shape() -> impl Strategy<Value = Config> {
    (4u16..12, 1u16..4, 2u16..8, 1u16..8).prop_map(|(r, l, q, e)| cfg(r, l, q, e.min(q)))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Under any interleaving of sends, posts, deliveries, completions and
    /// releases: no message ever finds no receive posted, credits never go
    /// negative (checked on every spend), the send queue never overruns, and
    /// once the NICs and applications settle every frame taken has arrived, in
    /// order, and nothing is left queued or held.
    #[test]
    fn no_receiver_not_ready_and_every_frame_arrives_in_order(
        a in shape(),
        b in shape(),
        steps in proptest::collection::vec(step(), 1..300),
    ) {
        let mut p = Pair::new(a, b);
        for s in &steps {
            p.apply(s);
        }
        p.settle();
        for i in 0..2 {
            let (me, peer) = p.sides(i);
            prop_assert_eq!(&peer.delivered, &me.sent);
            prop_assert_eq!(me.conn.queued(), 0);
            prop_assert_eq!(me.conn.in_flight(), 0, "a send left unsignalled");
            prop_assert!(!me.conn.is_dead());
        }
    }
}

#[test]
fn a_frame_too_large_is_refused_and_a_full_queue_hands_frames_back() {
    let c = cfg(4, 1, 4, 2);
    let mut p = Pair::new(c, c);
    let me = &mut p.s[0].conn;
    let big = frame(1, 70_000);
    assert!(matches!(
        me.send(big),
        Err(SendError::Refused(
            weir_core::TransportError::FrameTooLarge { max: 65536, .. }
        ))
    ));
    // An empty queue takes any frame that is not too large, then the bound holds.
    let mut taken = 0;
    let mut refused = 0;
    for op in 0..40 {
        match me.send(frame(op, 60_000)) {
            Ok(()) => taken += 1,
            Err(SendError::Full(f)) => {
                assert_eq!(op_of(&f), op, "the refused frame comes back");
                refused += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(taken, 4, "256 KiB of queue takes four 60 KB frames");
    assert_eq!(refused, 36);
    assert!(!me.take_writable(), "not writable while frames wait");
    p.settle();
    assert_eq!(p.s[1].delivered, vec![0, 1, 2, 3]);
    assert!(
        p.s[0].conn.take_writable(),
        "writable once the queue emptied"
    );
    assert!(!p.s[0].conn.take_writable(), "once per refusal");
}

#[test]
fn one_signalled_completion_frees_every_send_before_it() {
    // A send queue of 8, every fourth send signalled: 7 frames go out as 7 work
    // requests (the 4th signalled, the 7th as the last before the queue idles).
    let c = cfg(16, 1, 8, 4);
    let mut p = Pair::new(c, c);
    p.settle();
    let a = &mut p.s[0];
    for op in 1..=7 {
        a.conn.send(frame(op, 100)).unwrap();
    }
    a.post();
    let signaled: Vec<bool> = a.sq.iter().map(|w| w.signaled).collect();
    assert_eq!(
        signaled,
        [false, false, false, true, false, false, true],
        "every fourth and the last"
    );
    assert_eq!(a.conn.in_flight(), 7);
    let last = a.sq.back().unwrap().wr;
    a.conn.complete(Completion::Sent { wr: last }).unwrap();
    assert_eq!(a.conn.in_flight(), 0, "one completion frees all before it");
}

/// A side past set-up (receives posted, the peer's grants taken), and what it
/// is known to have done: for the hostile tests, which play the peer by hand.
fn victim() -> Conn {
    let c = cfg(4, 2, 8, 2);
    let mut v = Conn::new(c, c.params).unwrap();
    while let Some(p) = v.poll_post() {
        // Its receives, then its own grant update (which the peer never answers).
        if let Post::Send(wr) = p {
            assert!(matches!(wr.op, Op::Send { frame: None, .. }));
        }
    }
    v
}

fn header(frame: bool, credits: u16, grants: Vec<u16>) -> Vec<u8> {
    Header {
        frame,
        credits,
        grants,
    }
    .encode()
    .to_vec()
}

fn send_of(mut h: Vec<u8>, f: Option<Frame>) -> Completion {
    if let Some(f) = f {
        h.extend_from_slice(&f.to_contiguous());
    }
    Completion::Recv { data: h.into() }
}

/// `c` fails the victim with `want`, and the victim takes nothing after.
fn refused(mut v: Conn, c: Completion, want: ProtoError) {
    assert_eq!(v.complete(c), Err(want));
    assert!(v.is_dead());
    assert_eq!(v.poll_post(), None);
    assert!(matches!(
        v.send(frame(9, 10)),
        Err(SendError::Refused(weir_core::TransportError::Closed))
    ));
}

#[test]
fn a_hostile_peer_loses_its_connection() {
    // A frame the header says follows, but it does not parse.
    let mut bad = header(true, 0, vec![]);
    bad.extend_from_slice(b"not a frame");
    refused(
        victim(),
        Completion::Recv { data: bad.into() },
        ProtoError::BadFrame(weir_core::wire::DecodeError::Truncated),
    );
    refused(
        victim(),
        Completion::Recv {
            data: Bytes::from_static(&[7, 0, 0, 0]),
        },
        ProtoError::BadHeader("unknown kind"),
    );
    refused(
        victim(),
        Completion::Recv {
            data: Bytes::from_static(&[1, 3, 0, 0, 1, 0]),
        },
        ProtoError::BadHeader("grant list cut short"),
    );
    let mut trailing = header(false, 0, vec![]);
    trailing.push(0);
    refused(
        victim(),
        Completion::Recv {
            data: trailing.into(),
        },
        ProtoError::BadHeader("a credit update carries nothing"),
    );
    // The victim sent one message (its grant update): two credits back is one too many.
    refused(
        victim(),
        send_of(header(false, 2, vec![]), None),
        ProtoError::ExcessCredits {
            returned: 2,
            spent: 1,
        },
    );
    // A grant of a region the peer does not have, and one granted twice.
    refused(
        victim(),
        send_of(header(false, 0, vec![2]), None),
        ProtoError::BadGrant(2),
    );
    refused(
        victim(),
        send_of(header(false, 0, vec![1, 1]), None),
        ProtoError::BadGrant(1),
    );
    // A write with an immediate out of range, and into a region not granted.
    refused(
        victim(),
        Completion::RecvImm { imm: 7, len: 100 },
        ProtoError::NotGranted(7),
    );
    refused(
        victim(),
        Completion::RecvImm {
            imm: 1 << 20,
            len: 100,
        },
        ProtoError::NotGranted(1 << 20),
    );
    let mut v = victim();
    assert!(matches!(
        v.complete(Completion::RecvImm { imm: 0, len: 100 }),
        Ok(Some(Incoming::Large { slot: 0, len: 100 }))
    ));
    // Region 0 now holds a frame: writing it again is not granted.
    refused(
        v,
        Completion::RecvImm { imm: 0, len: 100 },
        ProtoError::NotGranted(0),
    );
    refused(
        victim(),
        Completion::RecvImm { imm: 1, len: 65537 },
        ProtoError::BadLength(65537),
    );
    refused(
        victim(),
        Completion::RecvImm { imm: 1, len: 0 },
        ProtoError::BadLength(0),
    );
}

#[test]
fn a_peer_that_spends_the_credit_kept_for_updates_is_disconnected() {
    // Four receives posted for the peer and none returned: it may send three
    // frames and one credit update; a fourth frame is one too many.
    let mut v = victim();
    for op in 0..3 {
        let got = v.complete(send_of(header(true, 0, vec![]), Some(frame(op, 10))));
        assert!(matches!(got, Ok(Some(Incoming::Frame(_)))), "{got:?}");
    }
    let mut spare = victim();
    for op in 0..3 {
        spare
            .complete(send_of(header(true, 0, vec![]), Some(frame(op, 10))))
            .unwrap();
    }
    assert_eq!(
        spare.complete(send_of(header(false, 0, vec![]), None)),
        Ok(None),
        "the kept credit may carry an update"
    );
    refused(
        v,
        send_of(header(true, 0, vec![]), Some(frame(3, 10))),
        ProtoError::NoCredit,
    );
    // Once the update went out, nothing at all may follow until credits return.
    refused(
        spare,
        send_of(header(false, 0, vec![]), None),
        ProtoError::NoCredit,
    );
}

#[test]
fn an_error_completion_fails_the_connection_and_counts_what_was_lost() {
    let c = cfg(8, 2, 8, 4);
    let mut p = Pair::new(c, c);
    p.settle();
    let a = &mut p.s[0];
    for op in 1..=5 {
        a.conn.send(frame(op, 100)).unwrap();
    }
    // Three posted (one of them inline-sized frames would not be held; these are not).
    for _ in 0..3 {
        let Some(Post::Send(_)) = a.conn.poll_post() else {
            panic!("a send")
        };
    }
    assert_eq!(
        a.conn.complete(Completion::Error { wr: 2 }),
        Err(ProtoError::Completion(2))
    );
    assert!(a.conn.is_dead());
    assert_eq!(a.conn.lost(), 5, "three in flight and two queued");
    assert_eq!(
        a.conn.complete(Completion::Sent { wr: 1 }),
        Err(ProtoError::Dead)
    );
}

#[test]
fn a_hostile_peer_costs_only_its_own_connection_and_a_fresh_one_carries_frames() {
    let c = cfg(8, 2, 8, 4);
    let mut good = Pair::new(c, c);
    let mut hostile = Pair::new(c, c);
    good.settle();
    hostile.settle();
    // The hostile peer writes outside its grants: its connection fails...
    let r = hostile.s[0]
        .conn
        .complete(Completion::RecvImm { imm: 5, len: 10 });
    assert_eq!(r, Err(ProtoError::NotGranted(5)));
    // ... the other connection of the same node carries on ...
    for op in 1..=20 {
        good.s[0].conn.send(frame(op, op as usize * 1000)).unwrap();
    }
    good.settle();
    assert_eq!(good.s[1].delivered, (1..=20).collect::<Vec<_>>());
    // ... and after the backoff a new queue pair with fresh state carries frames.
    let mut backoff = Backoff::default();
    assert_eq!(backoff.failed(), 1_000_000);
    assert_eq!(backoff.failed(), 2_000_000);
    let mut again = Pair::new(c, c);
    backoff.connected();
    assert_eq!(
        backoff.failed(),
        1_000_000,
        "a connection that came up resets it"
    );
    again.s[0].conn.send(frame(1, 30_000)).unwrap();
    again.settle();
    assert_eq!(again.s[1].delivered, vec![1]);
}

#[test]
fn shapes_out_of_range_are_refused_at_set_up() {
    let ok = cfg(8, 2, 8, 4);
    assert!(Conn::new(ok, ok.params).is_ok());
    let peer = |f: fn(&mut Params)| {
        let mut p = ok.params;
        f(&mut p);
        Conn::new(ok, p).map(|_| ())
    };
    assert!(peer(|p| p.recv_slots = 3).is_err());
    assert!(peer(|p| p.recv_slots = 5000).is_err());
    assert!(peer(|p| p.large_slots = 0).is_err());
    assert!(peer(|p| p.large_slots = 65).is_err());
    assert!(peer(|p| p.slot_bytes = 8).is_err());
    assert!(peer(|p| p.large_bytes = 100).is_err());
    assert!(peer(|p| p.large_bytes = u32::MAX).is_err());
    let mut c = ok;
    c.signal_every = 9;
    assert!(Conn::new(c, ok.params).is_err());
    assert!(Params::default().validate().is_ok());
    assert!(Config::default().validate().is_ok());
}
