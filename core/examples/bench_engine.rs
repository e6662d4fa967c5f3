//! `cargo xtask bench engine`: the CPU time weir's own sans-IO replication
//! engine spends per operation, frames' encoding and decoding included, on one
//! core: a 4 KiB read at its primary, a replicated 4 KiB write at the primary
//! and at one replica, and one acknowledgement at the primary.
//!
//! Three engines of a static map (3 replicas) on this thread; the "network"
//! is `Message::encode` and `Message::decode`, the "device" answers every
//! command at once (a read with a shared 4 KiB buffer). Operations go in
//! batches of `BATCH` in flight, and each role's steps of a batch are timed
//! together by the thread's CPU clock (`CLOCK_THREAD_CPUTIME_ID`), so the
//! figures are the engine's and the wire codec's, without sockets, devices or
//! a runtime. A benchmark, not a test: it asserts nothing about the figures.
//!
//! `BENCH_ENGINE_OPS` sets the operations per kind (default 200,000).

use bytes::Bytes;
use std::collections::VecDeque;
use weir_core::map::VolumeSpec;
use weir_core::replication::{Action, IoCmd, IoId, IoResult, ReplicationConfig, Replicator};
use weir_core::wire::{Frame, Message};
use weir_core::{ClusterMap, Epoch, Lba, NodeId, RequestId, VolumeId};

/// Operations in flight at once (a queue depth).
const BATCH: usize = 32;
const BS: usize = 4096;
/// Blocks of extent 0, whose primary is n1 and replicas n2 and n3.
const EXTENT_BLOCKS: u64 = 16_384;
const CLIENT: NodeId = NodeId(100);

/// The thread's CPU time, in nanoseconds.
fn cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One engine and what it asked for.
struct Node {
    id: NodeId,
    engine: Replicator,
    /// Frames it sent, with their destination.
    out: Vec<(NodeId, Frame)>,
    /// Device commands it issued.
    ios: Vec<(IoId, IoCmd)>,
}

impl Node {
    fn new(id: NodeId, map: &ClusterMap) -> Node {
        let mut engine = Replicator::new(id, map.clone(), ReplicationConfig::default());
        engine.set_clock(0, u64::MAX);
        Node {
            id,
            engine,
            out: Vec::new(),
            ios: Vec::new(),
        }
    }

    /// Take the engine's actions: frames encoded, device commands kept.
    fn drain(&mut self) {
        while let Some(action) = self.engine.poll_action() {
            match action {
                Action::Send { to, msg } => {
                    let frame = msg.encode().expect("the engine's messages encode");
                    self.out.push((to, frame));
                }
                Action::Io { io, cmd } => self.ios.push((io, cmd)),
                _ => {}
            }
        }
    }

    /// Decode and handle `frame` from `from`.
    fn receive(&mut self, from: NodeId, frame: Frame) {
        let msg = Message::decode(frame).expect("frames decode");
        self.engine.handle_message(from, msg);
        self.drain();
    }

    /// Complete every device command at once.
    fn complete(&mut self, block: &Bytes) {
        for (io, cmd) in std::mem::take(&mut self.ios) {
            let result = match cmd {
                IoCmd::Read { blocks, .. } => {
                    assert_eq!(blocks, 1, "4 KiB reads");
                    IoResult::Read(block.clone())
                }
                IoCmd::Write { .. } | IoCmd::Flush => IoResult::Done,
            };
            self.engine.handle_io(io, result);
        }
        self.drain();
    }

    /// Frames sent to `to`, taken.
    fn sent_to(&mut self, to: NodeId) -> Vec<Frame> {
        let (mine, rest) = std::mem::take(&mut self.out)
            .into_iter()
            .partition(|(dest, _)| *dest == to);
        self.out = rest;
        mine.into_iter().map(|(_, f)| f).collect()
    }
}

/// CPU time spent, by role, over a run of operations.
#[derive(Default)]
struct Spent {
    primary: u64,
    replica: u64,
    acks: u64,
    ops: u64,
    ack_count: u64,
}

fn request(req: u64, lba: u64, write: Option<&Bytes>) -> Frame {
    let (req, volume, epoch, lba) = (RequestId(req), VolumeId(1), Epoch(1), Lba(lba));
    let msg = match write {
        Some(data) => Message::Write {
            req,
            volume,
            epoch,
            lba,
            data: data.clone(),
            fua: false,
            delta: 1,
        },
        None => Message::Read {
            req,
            volume,
            epoch,
            lba,
            blocks: 1,
            delta: 1,
        },
    };
    msg.encode().expect("requests encode")
}

/// `ops` operations (writes if `write`), `BATCH` at a time, at random
/// blocks of extent 0, none of a batch overlapping another.
fn run(nodes: &mut [Node; 3], ops: u64, write: bool, rng: &mut u64) -> Spent {
    let data = Bytes::from(vec![0x5a; BS]);
    let mut spent = Spent::default();
    let mut req = 0u64;
    while spent.ops < ops {
        let n = BATCH.min((ops - spent.ops) as usize);
        // A random start, then blocks 509 apart: no two of a batch overlap
        // (an overlapping write would wait for the one before it).
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        let base = *rng;
        let frames: VecDeque<Frame> = (0..n as u64)
            .map(|i| {
                req += 1;
                let lba = (base + i * 509) % EXTENT_BLOCKS;
                request(req, lba, write.then_some(&data))
            })
            .collect();
        let [p, r2, r3] = nodes;
        // The primary takes the requests and completes its device commands.
        let t = cpu_ns();
        for f in frames {
            p.receive(CLIENT, f);
        }
        p.complete(&data);
        spent.primary += cpu_ns() - t;
        if write {
            // Each replica takes its forwards, writes, and acknowledges.
            for r in [&mut *r2, &mut *r3] {
                let forwards = p.sent_to(r.id);
                assert_eq!(forwards.len(), n, "a forward per write to {}", r.id);
                let t = cpu_ns();
                for f in forwards {
                    r.receive(p.id, f);
                }
                r.complete(&data);
                spent.replica += cpu_ns() - t;
            }
            // The primary takes the acknowledgements and answers the client.
            let acks: Vec<(NodeId, Frame)> = [&mut *r2, &mut *r3]
                .into_iter()
                .flat_map(|r| {
                    let id = r.id;
                    r.sent_to(p.id).into_iter().map(move |f| (id, f))
                })
                .collect();
            spent.ack_count += acks.len() as u64;
            let t = cpu_ns();
            for (from, f) in acks {
                p.receive(from, f);
            }
            spent.acks += cpu_ns() - t;
        }
        let replies = p.sent_to(CLIENT);
        assert_eq!(replies.len(), n, "every request answered");
        for f in replies {
            match Message::decode(f).expect("replies decode") {
                Message::ReadOk { .. } | Message::WriteOk { .. } => {}
                other => panic!("an error answered: {other:?}"),
            }
        }
        spent.ops += n as u64;
    }
    spent
}

fn main() {
    let ops: u64 = std::env::var("BENCH_ENGINE_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let volume = VolumeSpec {
        id: VolumeId(1),
        block_size: BS as u32,
        capacity_blocks: 3 * EXTENT_BLOCKS,
        extent_blocks: EXTENT_BLOCKS,
        max_request_blocks: 256,
    };
    let ids = [NodeId(1), NodeId(2), NodeId(3)];
    let map = ClusterMap::new_static(ids.to_vec(), volume, 3).expect("a static map");
    let mut nodes = ids.map(|id| Node::new(id, &map));
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    // Warm up: the engines' tables and the allocator.
    run(&mut nodes, ops / 10, true, &mut rng);
    run(&mut nodes, ops / 10, false, &mut rng);

    let reads = run(&mut nodes, ops, false, &mut rng);
    let writes = run(&mut nodes, ops, true, &mut rng);
    let per = |ns: u64, n: u64| ns as f64 / n as f64;
    println!("weir engine benchmark: CPU time per operation, one thread, {ops} operations each, {BATCH} in flight");
    println!(
        "  4 KiB read at the primary          {:>8.0} ns",
        per(reads.primary, reads.ops)
    );
    println!(
        "  4 KiB write at the primary         {:>8.0} ns  (with its 2 acknowledgements: {:.0} ns)",
        per(writes.primary, writes.ops),
        per(writes.primary + writes.acks, writes.ops)
    );
    println!(
        "  4 KiB write at a replica           {:>8.0} ns",
        per(writes.replica, 2 * writes.ops)
    );
    println!(
        "  acknowledgement at the primary     {:>8.0} ns  (the last of a write's answers its client)",
        per(writes.acks, writes.ack_count)
    );
    println!("  (frames encoded and decoded included; no sockets, device or runtime)");
}
