//! `cargo xtask bench rdma`: RDMA's messenger (weir-transport-rdma) on the
//! simulated fabric, next to the fabric's raw path (frames handed to the RC queue
//! pairs as they are), for 64 B, 4 KiB and 128 KiB frames between two hosts on a
//! 100 Gb/s star:
//!
//! - message rate: 20,000 frames (2,000 of 128 KiB) sent as fast as each path
//!   takes them, in frames per simulated second;
//! - latency: one frame at a time, from the send to its delivery to the
//!   application, simulated;
//! - the wall clock each run took (the simulator's own cost).
//!
//! Simulated figures of the models, not of hardware. A benchmark, not a test: it
//! asserts nothing. (No real-verbs half yet: weir has no verbs layer.)

use std::collections::VecDeque;
use std::time::Instant;
use weir_core::wire::{Frame, Message};
use weir_core::{NodeId, OpId, SendError};
use weir_transport_rdma::messenger::{Messenger, Out};
use weir_transport_rdma::proto::Config;
use weir_transport_sim::fabric::config::{FabricConfig, Topology};
use weir_transport_sim::fabric::Engine;

const IDS: [NodeId; 2] = [NodeId(1), NodeId(2)];

/// A frame of `len` bytes in all (at least its head), tagged with `op`.
fn frame(op: u64, len: usize) -> Frame {
    let head = Message::fetched(OpId(op), Ok(bytes::Bytes::new()))
        .encode()
        .expect("encodes")
        .len();
    let payload = len.saturating_sub(head);
    Message::fetched(OpId(op), Ok(bytes::Bytes::from(vec![0u8; payload])))
        .encode()
        .expect("encodes")
}

fn engine() -> Engine {
    let config = FabricConfig {
        topology: Topology::Star { hosts: 2 },
        ..FabricConfig::default()
    };
    let mut e = Engine::new(config).expect("valid config");
    for _ in 0..2 {
        e.add_host().expect("slot");
    }
    e
}

/// One path from host 0 to host 1: frames in, deliveries (with their times) out.
trait Path {
    /// Offer a frame at `now`; whether it was taken.
    fn offer(&mut self, e: &mut Engine, now: u64, f: Frame) -> bool;
    /// Run the fabric to its next event; frames delivered to host 1 then, and
    /// that time. `None` when nothing is left to happen.
    fn step(&mut self, e: &mut Engine) -> Option<(u64, usize)>;
}

struct Raw;

impl Path for Raw {
    fn offer(&mut self, e: &mut Engine, now: u64, f: Frame) -> bool {
        e.send(now, 0, 1, f);
        true
    }
    fn step(&mut self, e: &mut Engine) -> Option<(u64, usize)> {
        let t = e.next_event_ns()?;
        Some((t, e.advance(t).len()))
    }
}

struct Rdma {
    m: [Messenger; 2],
}

impl Rdma {
    fn new() -> Rdma {
        let m = |id| Messenger::new(id, Config::default(), 0).expect("valid");
        Rdma {
            m: [m(IDS[0]), m(IDS[1])],
        }
    }

    fn put(e: &mut Engine, now: u64, at: usize, out: Out) -> usize {
        for (to, path, image) in out.images {
            e.send_on(now, at, usize::from(to == IDS[1]), path, image);
        }
        out.frames.len()
    }
}

impl Path for Rdma {
    fn offer(&mut self, e: &mut Engine, now: u64, f: Frame) -> bool {
        let mut out = Out::default();
        let taken = match self.m[0].send(IDS[1], f, now, &mut out) {
            Ok(()) => true,
            Err(SendError::Full(_)) => false,
            Err(err) => panic!("refused: {err}"),
        };
        Rdma::put(e, now, 0, out);
        taken
    }

    fn step(&mut self, e: &mut Engine) -> Option<(u64, usize)> {
        let t = e.next_event_ns()?;
        let mut delivered = 0;
        for d in e.advance(t) {
            let (src, dst) = (d.src, d.dst);
            let mut out = Out::default();
            let taken = self.m[dst].arrived(IDS[src], d.path, d.frame, t, &mut out);
            let frames = Rdma::put(e, t, dst, out);
            if dst == 1 {
                delivered += frames;
            }
            let mut out = Out::default();
            self.m[src].wire_done(IDS[dst], d.path, taken, t, &mut out);
            Rdma::put(e, t, src, out);
        }
        Some((t, delivered))
    }
}

/// Frames per simulated second for `count` frames of `len` bytes, and the wall
/// clock it took.
fn rate(path: &mut dyn Path, len: usize, count: u64) -> (f64, f64) {
    let mut e = engine();
    let wall = Instant::now();
    let mut waiting: VecDeque<Frame> = (0..count).map(|op| frame(op, len)).collect();
    let (mut now, mut got) = (0u64, 0u64);
    loop {
        let mut took = false;
        while let Some(f) = waiting.pop_front() {
            if !path.offer(&mut e, now, f.clone()) {
                waiting.push_front(f);
                break;
            }
            took = true;
        }
        match path.step(&mut e) {
            Some((t, n)) => {
                now = t;
                got += n as u64;
            }
            None if waiting.is_empty() => break,
            None => assert!(took, "frames wait and nothing moves"),
        }
    }
    assert_eq!(got, count, "every frame arrives");
    (
        count as f64 / (now as f64 / 1e9),
        wall.elapsed().as_secs_f64(),
    )
}

/// Mean simulated latency of `count` frames of `len` bytes sent one at a time
/// (after one to set the connection up), us.
fn latency(path: &mut dyn Path, len: usize, count: u64) -> f64 {
    let mut e = engine();
    let mut total = 0u64;
    let mut now = 0u64;
    for op in 0..=count {
        assert!(path.offer(&mut e, now, frame(op, len)));
        let sent = now;
        let arrived = loop {
            let (t, n) = path.step(&mut e).expect("the frame is on its way");
            if n > 0 {
                break t;
            }
        };
        // Let acknowledgements and credit updates settle before the next frame.
        now = arrived;
        while let Some((t, _)) = path.step(&mut e) {
            now = t;
        }
        if op > 0 {
            total += arrived - sent;
        }
    }
    total as f64 / count as f64 / 1e3
}

fn main() {
    println!(
        "RDMA's messenger on the simulated fabric (100 Gb/s star, 2 hosts), against the raw path"
    );
    println!(
        "{:>8} {:>6} {:>14} {:>10} {:>14}",
        "frame", "path", "frames/s", "wall s", "latency us"
    );
    for (name, len, count) in [
        ("64 B", 64, 20_000),
        ("4 KiB", 4096, 20_000),
        ("128 KiB", 128 << 10, 2_000),
    ] {
        for (path_name, mut path) in [
            ("raw", Box::new(Raw) as Box<dyn Path>),
            ("rdma", Box::new(Rdma::new()) as Box<dyn Path>),
        ] {
            let (per_s, wall) = rate(path.as_mut(), len, count);
            let mut fresh: Box<dyn Path> = if path_name == "raw" {
                Box::new(Raw)
            } else {
                Box::new(Rdma::new())
            };
            let lat = latency(fresh.as_mut(), len, 200);
            println!("{name:>8} {path_name:>6} {per_s:>14.0} {wall:>10.3} {lat:>14.2}");
        }
    }
}
