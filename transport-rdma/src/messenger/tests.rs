//! Messengers of three nodes on a model wire that keeps order per pair: first
//! contact from both sides at once, every frame in order, a restarted peer, a
//! hostile one.

use super::image::{Image, Work};
use super::*;
use crate::testing::{frame, op_of};
use proptest::prelude::*;

fn cfg() -> Config {
    Config {
        params: Params {
            recv_slots: 8,
            slot_bytes: 1024,
            large_slots: 2,
            large_bytes: 64 * 1024,
        },
        send_queue: 8,
        signal_every: 4,
        max_inline: 0,
        queue_bytes: 128 * 1024,
    }
}

const N: [NodeId; 3] = [NodeId(1), NodeId(2), NodeId(3)];

struct Net {
    m: BTreeMap<NodeId, Messenger>,
    /// By (from, to, path).
    wires: BTreeMap<(NodeId, NodeId, Path), VecDeque<Frame>>,
    sent: BTreeMap<(NodeId, NodeId), Vec<u64>>,
    got: BTreeMap<(NodeId, NodeId), Vec<u64>>,
    now: u64,
    next_op: u64,
}

impl Net {
    fn new() -> Net {
        Net::with_paths(1)
    }

    fn with_paths(paths: Path) -> Net {
        Net {
            m: N.iter()
                .map(|&id| {
                    let m = Messenger::new(id, cfg(), 0).unwrap();
                    (id, m.with_paths(paths).unwrap())
                })
                .collect(),
            wires: BTreeMap::new(),
            sent: BTreeMap::new(),
            got: BTreeMap::new(),
            now: 0,
            next_op: 1,
        }
    }

    fn take(&mut self, at: NodeId, out: Out) {
        for (to, path, image) in out.images {
            self.wires
                .entry((at, to, path))
                .or_default()
                .push_back(image);
        }
        for (from, f) in out.frames {
            self.got.entry((from, at)).or_default().push(op_of(&f));
        }
    }

    /// The application at `from` sends `to` a frame with `n` payload bytes;
    /// whether it was taken.
    fn send(&mut self, from: NodeId, to: NodeId, n: usize) -> bool {
        let op = self.next_op;
        self.next_op += 1;
        let mut out = Out::default();
        let r = self
            .m
            .get_mut(&from)
            .unwrap()
            .send(to, frame(op, n), self.now, &mut out);
        self.take(from, out);
        match r {
            Ok(()) => {
                self.sent.entry((from, to)).or_default().push(op);
                true
            }
            Err(SendError::Full(_)) => false,
            Err(e) => panic!("refused: {e}"),
        }
    }

    /// The oldest image from `from` to `to` (on the lowest path that has one)
    /// arrives; the wire tells `from`.
    fn deliver(&mut self, from: NodeId, to: NodeId) -> bool {
        (0..PATHS_MAX).any(|path| self.carry(from, to, path, true))
    }

    /// The oldest image from `from` to `to` on `path` arrives (or is lost, and
    /// the sender's NIC reports an error completion); whether there was one.
    fn carry(&mut self, from: NodeId, to: NodeId, path: Path, arrives: bool) -> bool {
        self.carry_reported(from, to, path, arrives, arrives)
    }

    /// As [`Net::carry`], with the sender told `reported` whatever happened
    /// (an image that arrived but whose acknowledgement was lost: an error
    /// completion for a delivered frame).
    fn carry_reported(
        &mut self,
        from: NodeId,
        to: NodeId,
        path: Path,
        arrives: bool,
        reported: bool,
    ) -> bool {
        let wire = self.wires.get_mut(&(from, to, path));
        let Some(image) = wire.and_then(|w| w.pop_front()) else {
            return false;
        };
        let mut taken = false;
        if arrives {
            let mut out = Out::default();
            taken = self
                .m
                .get_mut(&to)
                .unwrap()
                .arrived(from, path, image, self.now, &mut out);
            self.take(to, out);
        }
        let mut out = Out::default();
        self.m
            .get_mut(&from)
            .unwrap()
            .wire_done(to, path, reported && taken, self.now, &mut out);
        self.take(from, out);
        true
    }

    /// The queue pair from `from` to `to` on `path` fails, as RC's do: its
    /// oldest image arrives (`arrives`) or not, its sender gets an error
    /// completion for it, and everything behind it is flushed in error
    /// (RC delivers a prefix; nothing of a failed queue pair arrives later).
    fn fail_wire(&mut self, from: NodeId, to: NodeId, path: Path, arrives: bool) {
        if !self.carry_reported(from, to, path, arrives, false) {
            return;
        }
        let flushed = self.wires.remove(&(from, to, path)).unwrap_or_default();
        for _ in flushed {
            let mut out = Out::default();
            self.m
                .get_mut(&from)
                .unwrap()
                .wire_done(to, path, false, self.now, &mut out);
            self.take(from, out);
        }
    }

    /// Every messenger's time-driven work at `now`.
    fn poll_all(&mut self) {
        for id in N {
            let mut out = Out::default();
            self.m.get_mut(&id).unwrap().poll(self.now, &mut out);
            self.take(id, out);
        }
    }

    fn settle(&mut self) {
        for _ in 0..1_000_000 {
            let wires: Vec<_> = self.wires.keys().copied().collect();
            let mut moved = false;
            for (a, b, path) in wires {
                moved |= self.carry(a, b, path, true);
            }
            if !moved {
                return;
            }
        }
        panic!("never settles");
    }
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Send(usize, usize, usize),
    Deliver(usize, usize),
}

fn step() -> impl Strategy<Value = Step> {
    let pair = (0..3usize, 1..3usize).prop_map(|(a, d)| (a, (a + d) % 3));
    prop_oneof![
        (pair.clone(), prop_oneof![0..500usize, 900..60_000usize])
            .prop_map(|((a, b), n)| Step::Send(a, b, n)),
        pair.clone().prop_map(|(a, b)| Step::Deliver(a, b)),
        pair.prop_map(|(a, b)| Step::Deliver(a, b)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whoever speaks first, and in whatever order images arrive across pairs,
    /// every frame taken arrives once, in order, and no connection resets.
    #[test]
    fn every_frame_arrives_in_order_whoever_connects_first(
        steps in proptest::collection::vec(step(), 1..200),
    ) {
        let mut net = Net::new();
        for s in &steps {
            match *s {
                Step::Send(a, b, n) => {
                    net.send(N[a], N[b], n);
                }
                Step::Deliver(a, b) => {
                    net.deliver(N[a], N[b]);
                }
            }
        }
        net.settle();
        for (pair, sent) in &net.sent {
            prop_assert_eq!(net.got.get(pair), Some(sent), "{:?}", pair);
        }
        for m in net.m.values() {
            let c = m.counters();
            prop_assert_eq!((c.resets, c.refused, c.frames_lost), (0, 0, 0), "{:?}", c);
        }
    }
}

/// Run `steps` on a net of `paths` paths (fault 0: the image is lost and its
/// queue pair fails; 1: it arrives but its queue pair fails), then let every
/// pair settle.
fn run_faulty(paths: Path, steps: &[(Step, u8)]) -> Net {
    let mut net = Net::with_paths(paths);
    for (s, fault) in steps {
        match (*s, *fault) {
            (Step::Send(a, b, n), _) => {
                net.send(N[a], N[b], n);
            }
            (Step::Deliver(a, b), fault @ (0 | 1)) => {
                let (a, b) = (N[a], N[b]);
                let busy = |p: &Path| net.wires.get(&(a, b, *p)).is_some_and(|w| !w.is_empty());
                if let Some(p) = (0..paths).find(busy) {
                    net.fail_wire(a, b, p, fault == 1);
                }
            }
            (Step::Deliver(a, b), _) => {
                net.deliver(N[a], N[b]);
            }
        }
        // Backoffs end as time passes.
        net.now += 100_000;
    }
    // Attempts time out, backoffs end, peers speak again: frames still
    // waiting to be sent again go.
    for _ in 0..4 {
        net.now += 100_000_000;
        net.poll_all();
        for &a in &N {
            for &b in &N {
                if a != b {
                    net.send(a, b, 10);
                }
            }
        }
        net.settle();
    }
    net
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Paths that fail at any moment (an image lost, or one that arrived but
    /// was reported in error) never deliver a frame twice or out of order, and
    /// lose only frames sent while the peer was down: every frame a connection
    /// took arrives, on it or on a successor.
    #[test]
    fn failing_paths_never_duplicate_reorder_or_lose_a_taken_frame(
        paths in 1..=2u8,
        steps in proptest::collection::vec((step(), 0..8u8), 1..200),
    ) {
        let net = run_faulty(paths, &steps);
        for (pair, sent) in &net.sent {
            let got = net.got.get(pair).cloned().unwrap_or_default();
            // In order, once each: a subsequence of what was sent.
            let mut it = sent.iter();
            prop_assert!(got.iter().all(|g| it.any(|s| s == g)), "{:?}: {:?} of {:?}", pair, got, sent);
        }
        let lost: u64 = net.m.values().map(|m| m.counters().frames_lost).sum();
        let sent: usize = net.sent.values().map(Vec::len).sum();
        let got: usize = net.got.values().map(Vec::len).sum();
        prop_assert_eq!(sent - got, lost as usize, "every frame not delivered was counted lost");
    }
}

#[test]
fn a_restarted_peer_is_connected_again_after_the_backoff() {
    let mut net = Net::new();
    let (a, b) = (N[0], N[1]);
    for _ in 0..5 {
        net.send(a, b, 100);
    }
    net.settle();
    assert_eq!(net.got[&(a, b)], net.sent[&(a, b)]);
    // b restarts: a fresh messenger of its next incarnation.
    net.m.insert(b, Messenger::new(b, cfg(), 1).unwrap());
    assert!(net.send(a, b, 100), "taken: a does not know yet");
    net.settle();
    // The stale message was dropped (the frame is lost, as on a connection that
    // reset) and answered with a reset: a is down for its backoff.
    assert_eq!(net.m[&b].counters().dropped, 1, "the stale message");
    let c = net.m[&a].counters();
    assert_eq!((c.resets, c.frames_lost), (1, 0), "{c:?}");
    assert!(!net.m[&a].is_up(b));
    net.send(a, b, 100);
    assert_eq!(net.m[&a].counters().frames_lost, 1, "sent while down: lost");
    // After the backoff a connects again and frames flow.
    net.now += 1_000_000;
    let before = net.got[&(a, b)].len();
    let ops: Vec<u64> = (0..5)
        .map(|_| {
            assert!(net.send(a, b, 2_000));
            net.sent[&(a, b)].last().copied().unwrap()
        })
        .collect();
    net.settle();
    assert!(net.m[&a].is_up(b) && net.m[&b].is_up(a));
    assert_eq!(net.got[&(a, b)][before..], ops[..]);
}

#[test]
fn a_peer_restarting_and_connecting_first_replaces_the_old_connection() {
    let mut net = Net::new();
    let (a, b) = (N[0], N[1]);
    net.send(a, b, 100);
    net.settle();
    net.m.insert(b, Messenger::new(b, cfg(), 1).unwrap());
    assert!(net.send(b, a, 100));
    net.send(a, b, 100);
    net.settle();
    // a gave up its old connection when b's Connect came, then both carried on.
    assert_eq!(net.m[&a].counters().resets, 1);
    assert_eq!(net.got[&(b, a)], net.sent[&(b, a)]);
    assert!(net.m[&a].is_up(b) && net.m[&b].is_up(a));
}

#[test]
fn a_hostile_peer_loses_its_own_connection_only() {
    let mut net = Net::new();
    let (a, b, c) = (N[0], N[1], N[2]);
    net.send(b, a, 100);
    net.send(c, a, 100);
    net.settle();
    // b writes into a region it was never granted, on its current connection.
    let (from, to) = {
        let ma = &net.m[&a];
        let p = &ma.peers[&b];
        let State::Up { peer_gen, .. } = p.state else {
            panic!("up")
        };
        (peer_gen, p.gen)
    };
    let hostile = Image::Work {
        from,
        to,
        op: Work::Op(crate::proto::Op::WriteImm {
            slot: 7,
            frame: frame(99, 10),
        }),
    }
    .encode();
    let mut out = Out::default();
    net.m
        .get_mut(&a)
        .unwrap()
        .arrived(b, 0, hostile, 0, &mut out);
    net.take(a, out);
    assert_eq!(net.m[&a].counters().refused, 1);
    assert!(!net.m[&a].is_up(b));
    // Garbage that is no image at all is dropped.
    let mut out = Out::default();
    net.m
        .get_mut(&a)
        .unwrap()
        .arrived(b, 0, Frame::from(vec![9, 9, 9]), 0, &mut out);
    assert!(out.images.is_empty() && out.frames.is_empty());
    // c's connection carries on.
    for _ in 0..10 {
        net.send(c, a, 3_000);
    }
    net.settle();
    assert_eq!(net.got[&(c, a)], net.sent[&(c, a)]);
    assert!(net.m[&a].is_up(c));
}

#[test]
fn images_decode_as_they_were_encoded_and_garbage_does_not() {
    let p = cfg().params;
    for image in [
        Image::Connect {
            gen: 7,
            delivered: 3,
            params: p,
        },
        Image::Accept {
            gen: 8,
            to: 7,
            delivered: 0,
            params: p,
        },
        Image::Reset { to: 3 },
        Image::Probe { from: 4, to: 5 },
    ] {
        assert_eq!(Image::decode(image.encode()), Ok(image));
    }
    for bad in [&[][..], &[1, 2, 3], &[3, 0, 0, 0, 0, 0, 0, 0, 0, 1], &[6]] {
        assert!(Image::decode(Frame::from(bad.to_vec())).is_err(), "{bad:?}");
    }
}

#[test]
fn a_connect_attempt_nobody_answers_times_out_into_the_backoff() {
    let mut m = Messenger::new(N[0], cfg(), 0).unwrap();
    let mut out = Out::default();
    m.send(N[1], frame(1, 10), 0, &mut out).unwrap();
    assert_eq!(out.images.len(), 1, "a Connect");
    assert_eq!(m.poll(0, &mut out), Some(CONNECT_TIMEOUT_NS));
    assert_eq!(m.poll(CONNECT_TIMEOUT_NS, &mut out), None);
    let c = m.counters();
    assert_eq!((c.resets, c.frames_lost), (1, 1), "{c:?}");
}

#[test]
fn a_side_out_of_credits_probes_a_silent_peer_and_finds_it_restarted() {
    let mut net = Net::new();
    let (a, b) = (N[0], N[1]);
    net.send(a, b, 100);
    net.settle();
    // More frames than b has receive slots for a, none delivered: a runs out of
    // credits with frames still queued.
    for _ in 0..20 {
        assert!(net.send(a, b, 100));
    }
    // b restarts; what was on the wire to it is lost with the old host.
    net.m.insert(b, Messenger::new(b, cfg(), 1).unwrap());
    net.wires.remove(&(a, b, 0));
    net.settle();
    assert!(net.m[&a].is_up(b), "nothing told a yet");
    // Nothing heard from b for the probe interval: a probes, b (restarted)
    // answers with a reset.
    let mut out = Out::default();
    let next = net.m.get_mut(&a).unwrap().poll(net.now, &mut out);
    assert!(out.images.is_empty(), "not yet");
    assert_eq!(next, Some(PROBE_AFTER_NS));
    net.now = PROBE_AFTER_NS;
    let mut out = Out::default();
    net.m.get_mut(&a).unwrap().poll(net.now, &mut out);
    assert_eq!(out.images.len(), 1, "a probe");
    net.take(a, out);
    net.settle();
    assert!(!net.m[&a].is_up(b), "the reset came back");
    // After the backoff the next frame connects again; the frames of the
    // old connection were for b's old incarnation: lost.
    net.now += 1_000_000;
    net.send(a, b, 100);
    net.settle();
    assert!(net.m[&a].is_up(b) && net.m[&b].is_up(a));
    assert!(net.m[&a].counters().frames_lost > 0);
    assert_eq!(net.m[&a].counters().replayed, 0);
    assert_eq!(net.got[&(a, b)].last(), net.sent[&(a, b)].last());
}

#[test]
fn a_connection_whose_path_fails_moves_to_the_other_at_once_and_keeps_order() {
    let mut net = Net::with_paths(2);
    let (a, b, c) = (N[0], N[1], N[2]);
    // Pairs start on the path their ids pick, the same from both sides, so a
    // host's peers use both of its ports.
    net.send(a, b, 100);
    net.send(a, c, 100);
    net.settle();
    let home = net.m[&a].path(b).unwrap();
    assert_eq!(net.m[&b].path(a), Some(home));
    assert_ne!(net.m[&a].path(c), Some(home), "a's peers are spread");
    // Frames on the wire when a's port on that path dies: the NIC gives up on
    // the oldest (an error completion), the rest are flushed.
    for _ in 0..6 {
        assert!(net.send(a, b, 3_000));
    }
    assert!(net.carry(a, b, home, false));
    assert_eq!(net.m[&a].counters().failovers, 1);
    let other = 1 - home;
    assert_eq!(net.m[&a].path(b), Some(other));
    // The next frame connects on the other path at once, with no backoff.
    let before = net.got.get(&(a, b)).map_or(0, Vec::len);
    for _ in 0..10 {
        assert!(net.send(a, b, 3_000));
    }
    let stale: Vec<_> = net.wires.remove(&(a, b, home)).unwrap_or_default().into();
    net.settle();
    assert!(net.m[&a].is_up(b) && net.m[&b].is_up(a));
    assert_eq!(net.m[&b].path(a), Some(other));
    assert!(before < net.sent[&(a, b)].len() - 10, "some were in flight");
    assert_eq!(
        net.got[&(a, b)],
        net.sent[&(a, b)],
        "the frames in flight are sent again: every frame arrives once, in order"
    );
    let c = net.m[&a].counters();
    assert!(c.replayed > 0 && c.frames_lost == 0, "{c:?}");
    // Images of the old connection that turn up late are stale: dropped.
    let dropped = net.m[&b].counters().dropped;
    for image in stale {
        let mut out = Out::default();
        net.m
            .get_mut(&b)
            .unwrap()
            .arrived(a, home, image, net.now, &mut out);
        assert!(
            out.frames.is_empty(),
            "nothing of a failed connection is delivered"
        );
    }
    assert!(net.m[&b].counters().dropped > dropped);
    // c's connection on the other path never noticed.
    assert_eq!(net.m[&a].counters().resets, 1);
}

#[test]
fn an_attempt_that_fails_tries_the_other_path_after_the_backoff() {
    let mut m = Messenger::new(N[0], cfg(), 0)
        .unwrap()
        .with_paths(2)
        .unwrap();
    let mut out = Out::default();
    m.send(N[1], frame(1, 10), 0, &mut out).unwrap();
    let first = out.images[0].1;
    m.poll(CONNECT_TIMEOUT_NS, &mut out);
    assert_eq!(
        m.counters().failovers,
        0,
        "it never came up: not a failover"
    );
    let mut out = Out::default();
    m.send(N[1], frame(2, 10), 10 * CONNECT_TIMEOUT_NS, &mut out)
        .unwrap();
    assert_eq!(out.images.len(), 1, "a Connect");
    assert_eq!(out.images[0].1, 1 - first);
    assert!(Messenger::new(N[0], cfg(), 0)
        .unwrap()
        .with_paths(3)
        .is_err());
}

#[test]
fn frames_that_arrived_though_their_completion_failed_are_not_sent_twice() {
    let mut net = Net::with_paths(2);
    let (a, b) = (N[0], N[1]);
    net.send(a, b, 100);
    net.settle();
    let home = net.m[&a].path(b).unwrap();
    for _ in 0..6 {
        assert!(net.send(a, b, 3_000));
    }
    // The first two arrive, but their acknowledgements do not: the NIC
    // reports them (and flushes the rest) in error.
    let got = net.got[&(a, b)].len();
    assert!(net.carry_reported(a, b, home, true, true));
    assert!(net.carry_reported(a, b, home, true, false));
    assert_eq!(net.got[&(a, b)].len(), got + 2, "both were frames");
    net.wires.remove(&(a, b, home));
    for _ in 0..3 {
        assert!(net.send(a, b, 3_000));
    }
    net.settle();
    assert_eq!(
        net.got[&(a, b)],
        net.sent[&(a, b)],
        "b told a what it had: nothing twice, nothing missing"
    );
    assert_eq!(net.m[&a].counters().failovers, 1);
}
