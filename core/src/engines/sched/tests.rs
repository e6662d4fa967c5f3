//! The device owner's tests: health, and the I/O queue against an unscheduled
//! oracle.

use super::*;
use crate::buf::{BufPool, BUF_ALIGN};
use crate::device::DevCommand;
use crate::error::WeirError;
use crate::ids::Lba;
use bytes::Bytes;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

const MS: u64 = 1_000_000;
const BS: usize = BUF_ALIGN;

fn geometry(queues: u16, depth: u16, max_transfer_blocks: u32, optimal_io_blocks: u32) -> Geometry {
    Geometry {
        block_size: BS as u32,
        capacity_blocks: 64,
        max_transfer_blocks,
        optimal_io_blocks,
        queues,
        queue_depth: depth,
    }
}

fn read(lba: u64, blocks: u64) -> IoCmd {
    IoCmd::Read {
        lba: Lba(lba),
        blocks,
    }
}

fn write(lba: u64, blocks: u64, byte: u8, fua: bool) -> IoCmd {
    IoCmd::Write {
        lba: Lba(lba),
        data: Bytes::from(vec![byte; blocks as usize * BS]),
        fua,
    }
}

fn merging(depth: u32) -> SchedConfig {
    SchedConfig {
        merge: true,
        split: true,
        depth_per_queue: depth,
        waiting_max: 64,
        classes: false,
        shares: ClassShares::default(),
    }
}

/// The owner of a device of `queues` queues, FIFO at its depth, stalled at
/// 100 ms.
fn device(queues: u16) -> DeviceSched {
    DeviceSched::new(
        geometry(queues, 8, 8, 0),
        SchedConfig::default(),
        Duration::from_millis(100),
    )
}

/// Issue one flush-free command and return its id (the health tests' helper).
fn issue(s: &mut DeviceSched, pool: &BufPool, io: u64, lba: u64, now_ns: u64) -> CmdId {
    s.submit(IoId(io), read(lba, 1), IoClass::Foreground, now_ns)
        .unwrap();
    s.poll(now_ns, pool).expect("room").cmd
}

#[test]
fn commands_spread_over_the_queues_and_are_counted_per_queue() {
    let pool = BufPool::new(1 << 20);
    let mut s = device(4);
    let mut queues = Vec::new();
    for i in 0..8 {
        s.submit(IoId(i), read(i * 2, 1), IoClass::Foreground, 0)
            .unwrap();
        queues.push(s.poll(0, &pool).expect("room").queue);
    }
    assert_eq!(queues, [0, 1, 2, 3, 0, 1, 2, 3], "the least busy queue");
    s.self_check();
    assert_eq!(s.inflight(), 8);
}

#[test]
#[should_panic(expected = "which was not issued")]
fn a_completion_of_a_command_never_issued_is_a_bug() {
    let mut s = device(1);
    s.complete(CmdId(3), Ok(DevCompletion::Done), 0);
}

#[test]
fn a_command_outstanding_past_the_timeout_at_two_ticks_is_a_stall() {
    let pool = BufPool::new(1 << 20);
    let mut s = device(2);
    let cmd = issue(&mut s, &pool, 1, 0, 0);
    assert_eq!(s.tick(50 * MS), None);
    // Old at one tick (the node may itself have been paused): not yet.
    assert_eq!(s.tick(120 * MS), None);
    assert!(s.healthy());
    assert_eq!(s.tick(130 * MS), Some(Health::Stalled));
    assert_eq!(s.tick(140 * MS), None, "reported once");
    let buf = pool.alloc(BS).unwrap();
    s.complete(cmd, Ok(DevCompletion::Read(buf)), 145 * MS);
    assert!(matches!(
        s.poll_finished(),
        Some((IoId(1), IoResult::Read(_)))
    ));
    assert_eq!(s.tick(150 * MS), Some(Health::Answers));
    s.self_check();
}

#[test]
fn flushes_are_not_timed_and_gone_stays_gone() {
    let pool = BufPool::new(1 << 20);
    let mut s = device(1);
    s.submit(IoId(1), IoCmd::Flush, IoClass::Foreground, 0)
        .unwrap();
    let flush = s.poll(0, &pool).expect("room").cmd;
    for t in 1..10 {
        assert_eq!(s.tick(t * 100 * MS), None, "a long flush is no stall");
    }
    let cmd = issue(&mut s, &pool, 2, 0, 1000 * MS);
    s.complete(cmd, Err(DevError::Gone), 1000 * MS);
    s.self_check(); // gone, not yet judged: a valid state between ticks
    assert_eq!(s.tick(1010 * MS), Some(Health::Gone));
    s.complete(flush, Ok(DevCompletion::Done), 1015 * MS);
    assert_eq!(
        s.tick(1020 * MS),
        None,
        "no command stalls, but the device is gone"
    );
    assert!(!s.healthy());
    s.self_check();
}

#[test]
fn a_device_hung_on_flushes_stalls_the_requests_behind_them() {
    let pool = BufPool::new(1 << 20);
    let cfg = SchedConfig {
        depth_per_queue: 1,
        ..SchedConfig::default()
    };
    let mut s = DeviceSched::new(geometry(1, 8, 8, 0), cfg, Duration::from_millis(100));
    s.submit(IoId(1), IoCmd::Flush, IoClass::Foreground, 0)
        .unwrap();
    assert!(matches!(
        s.poll(0, &pool).unwrap().command,
        DevCommand::Flush
    ));
    s.submit(IoId(2), read(0, 1), IoClass::Foreground, 10 * MS)
        .unwrap();
    assert!(s.poll(10 * MS, &pool).is_none(), "behind the flush");
    assert_eq!(s.tick(100 * MS), None, "90 ms: not yet");
    assert_eq!(s.tick(115 * MS), None, "one late tick is not enough");
    assert_eq!(s.tick(120 * MS), Some(Health::Stalled));
}

#[test]
fn an_idle_device_is_probed_and_a_probe_finds_it_gone() {
    let pool = BufPool::new(1 << 20);
    let mut s = device(1);
    assert_eq!(s.tick(50 * MS), None);
    assert!(s.poll(50 * MS, &pool).is_none(), "busy enough: no probe");
    assert_eq!(s.tick(100 * MS), None);
    let probe = s.poll(100 * MS, &pool).expect("idle for a timeout: probed");
    assert!(matches!(
        probe.command,
        DevCommand::Read { lba: Lba(0), .. }
    ));
    assert_eq!(s.tick(110 * MS), None);
    assert!(s.poll(110 * MS, &pool).is_none(), "one probe at a time");
    s.complete(probe.cmd, Err(DevError::Gone), 120 * MS);
    assert_eq!(s.poll_finished(), None, "the probe's result is the owner's");
    assert_eq!(s.tick(130 * MS), Some(Health::Gone));
    assert_eq!(s.tick(400 * MS), None);
    assert!(
        s.poll(400 * MS, &pool).is_none(),
        "a gone device is not probed"
    );
    s.self_check();
}

#[test]
fn a_transfer_of_no_block_or_part_of_one_is_refused_typed() {
    let pool = BufPool::new(1 << 20);
    let mut q = IoQueue::new(geometry(1, 8, 8, 0), merging(1));
    let partial = IoCmd::Write {
        lba: Lba(0),
        data: Bytes::from(vec![1; BS + 1]),
        fua: false,
    };
    q.submit(IoId(1), partial, 0).unwrap();
    q.submit(IoId(2), read(0, 0), 0).unwrap();
    assert!(q.poll(0, &pool).is_none(), "nothing reaches the device");
    let done: Vec<(IoId, IoResult)> = std::iter::from_fn(|| q.poll_finished()).collect();
    assert_eq!(
        done,
        [
            (
                IoId(1),
                IoResult::Failed(WeirError::Device(DevError::Misaligned))
            ),
            (
                IoId(2),
                IoResult::Failed(WeirError::Device(DevError::OutOfRange))
            ),
        ]
    );
    q.self_check();
}

#[test]
fn waiting_requests_that_continue_the_head_leave_as_one_command() {
    let pool = BufPool::new(1 << 20);
    let mut q = IoQueue::new(geometry(1, 8, 8, 0), merging(1));
    // A lone request goes at once: nothing waits for company.
    q.submit(IoId(1), read(0, 1), 0).unwrap();
    let first = q.poll(0, &pool).expect("room");
    assert!(matches!(first.command, DevCommand::Read { lba: Lba(0), ref buf } if buf.len() == BS));
    // Behind it (depth 1): three reads that continue one another, a write
    // between them to other blocks, and one read elsewhere.
    q.submit(IoId(2), read(10, 1), 0).unwrap();
    q.submit(IoId(3), write(30, 1, 9, false), 0).unwrap();
    q.submit(IoId(4), read(11, 2), 0).unwrap();
    q.submit(IoId(5), read(20, 1), 0).unwrap();
    q.submit(IoId(6), read(13, 1), 0).unwrap();
    assert!(q.poll(0, &pool).is_none(), "the queue is full");
    q.complete(first.cmd, Ok(DevCompletion::Read(pool.alloc(BS).unwrap())));
    let merged = q.poll(0, &pool).expect("room");
    let DevCommand::Read { lba, mut buf } = merged.command else {
        panic!("a read");
    };
    assert_eq!((lba, buf.len()), (Lba(10), 4 * BS), "2, 4 and 6 as one");
    q.self_check();
    for (i, b) in buf.as_mut().chunks_mut(BS).enumerate() {
        b.fill(i as u8 + 1);
    }
    q.complete(merged.cmd, Ok(DevCompletion::Read(buf)));
    let mut done: Vec<(IoId, IoResult)> = std::iter::from_fn(|| q.poll_finished()).collect();
    done.sort_by_key(|(io, _)| *io);
    let firsts: Vec<(u64, usize, u8)> = done
        .iter()
        .filter_map(|(io, r)| match r {
            IoResult::Read(d) => Some((io.0, d.len() / BS, d[0])),
            _ => None,
        })
        .collect();
    assert_eq!(firsts, [(1, 1, 0), (2, 1, 1), (4, 2, 2), (6, 1, 4)]);
    assert_eq!(q.stats().merged, 2);
}

#[test]
fn merged_writes_go_as_one_gather_list_and_fua_does_not_mix() {
    let pool = BufPool::new(1 << 20);
    let mut q = IoQueue::new(geometry(1, 8, 8, 0), merging(1));
    q.submit(IoId(1), write(0, 1, 1, false), 0).unwrap();
    let first = q.poll(0, &pool).unwrap();
    q.submit(IoId(2), write(4, 1, 2, false), 0).unwrap();
    q.submit(IoId(3), write(5, 1, 3, true), 0).unwrap();
    q.submit(IoId(4), write(5, 1, 4, false), 0).unwrap();
    q.submit(IoId(5), write(6, 1, 5, false), 0).unwrap();
    q.complete(first.cmd, Ok(DevCompletion::Done));
    let d = q.poll(0, &pool).unwrap();
    // 3 is FUA and does not join; 4 overlaps 3, a write waiting before it, so
    // it may not pass it; 5 continues nothing taken.
    assert!(matches!(d.command, DevCommand::Write { lba: Lba(4), .. }));
    q.complete(d.cmd, Ok(DevCompletion::Done));
    let d = q.poll(0, &pool).unwrap();
    assert!(matches!(
        d.command,
        DevCommand::Write {
            lba: Lba(5),
            fua: true,
            ..
        }
    ));
    q.complete(d.cmd, Ok(DevCompletion::Done));
    let d = q.poll(0, &pool).unwrap();
    let DevCommand::WriteGather { lba, data, fua } = d.command else {
        panic!("4 and 5 gathered");
    };
    assert_eq!((lba, data.len(), fua), (Lba(5), 2, false));
    assert_eq!((data[0][0], data[1][0]), (4, 5));
    q.complete(d.cmd, Ok(DevCompletion::Done));
    assert_eq!(std::iter::from_fn(|| q.poll_finished()).count(), 5);
    q.self_check();
}

#[test]
fn a_request_across_the_boundary_is_split_and_its_read_joined_without_a_copy() {
    let pool = BufPool::new(1 << 20);
    let mut q = IoQueue::new(geometry(2, 8, 16, 4), merging(4));
    q.submit(IoId(1), read(2, 8), 0).unwrap();
    let cmds: Vec<Dispatch> = std::iter::from_fn(|| q.poll(0, &pool)).collect();
    let shapes: Vec<(u64, usize)> = cmds
        .iter()
        .map(|d| match &d.command {
            DevCommand::Read { lba, buf } => (lba.0, buf.len() / BS),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(shapes, [(2, 2), (4, 4), (8, 2)], "cut at 4 and 8");
    let start = match &cmds[0].command {
        DevCommand::Read { buf, .. } => buf.as_ref().as_ptr() as usize,
        _ => unreachable!(),
    };
    q.self_check();
    // Completed out of order.
    for d in cmds.into_iter().rev() {
        let DevCommand::Read { lba, mut buf } = d.command else {
            unreachable!()
        };
        buf.as_mut().fill(lba.0 as u8);
        q.complete(d.cmd, Ok(DevCompletion::Read(buf)));
    }
    let (io, IoResult::Read(data)) = q.poll_finished().unwrap() else {
        panic!("a read");
    };
    assert_eq!(io, IoId(1));
    assert_eq!(data.as_ptr() as usize, start, "the pieces of one buffer");
    let firsts: Vec<u8> = data.chunks(BS).map(|b| b[0]).collect();
    assert_eq!(firsts, [2, 2, 4, 4, 4, 4, 8, 8]);
    assert_eq!(q.stats().split, 1);
}

#[test]
fn a_media_error_of_a_merged_command_is_charged_to_its_own_request() {
    let pool = BufPool::new(1 << 20);
    let mut q = IoQueue::new(geometry(1, 8, 8, 0), merging(1));
    q.submit(IoId(1), read(0, 1), 0).unwrap();
    let first = q.poll(0, &pool).unwrap();
    q.submit(IoId(2), read(1, 1), 0).unwrap();
    q.submit(IoId(3), read(2, 1), 0).unwrap();
    q.complete(first.cmd, Ok(DevCompletion::Read(pool.alloc(BS).unwrap())));
    let merged = q.poll(0, &pool).unwrap();
    q.complete(merged.cmd, Err(DevError::Media(Lba(2))));
    assert_eq!(q.stats().unmerged, 1);
    let again = q.poll(0, &pool).unwrap();
    assert!(matches!(
        again.command,
        DevCommand::Read { lba: Lba(1), .. }
    ));
    q.complete(again.cmd, Ok(DevCompletion::Read(pool.alloc(BS).unwrap())));
    let again = q.poll(0, &pool).unwrap();
    q.complete(again.cmd, Err(DevError::Media(Lba(2))));
    let done: Vec<(IoId, IoResult)> = std::iter::from_fn(|| q.poll_finished()).collect();
    assert!(matches!(done[1], (IoId(2), IoResult::Read(_))));
    assert_eq!(
        done[2],
        (
            IoId(3),
            IoResult::Failed(WeirError::Device(DevError::Media(Lba(2))))
        )
    );
    q.self_check();
}

#[test]
fn a_full_queue_refuses_and_a_flush_is_a_barrier() {
    let pool = BufPool::new(1 << 20);
    let cfg = SchedConfig {
        waiting_max: 3,
        ..merging(1)
    };
    let mut q = IoQueue::new(geometry(1, 8, 8, 0), cfg);
    q.submit(IoId(1), write(0, 1, 1, false), 0).unwrap();
    let first = q.poll(0, &pool).unwrap();
    q.submit(IoId(2), write(1, 1, 2, false), 0).unwrap();
    q.submit(IoId(3), IoCmd::Flush, 0).unwrap();
    q.submit(IoId(4), write(2, 1, 3, false), 0).unwrap();
    assert_eq!(
        q.submit(IoId(5), write(3, 1, 4, false), 0),
        Err(QueueFull { waiting: 3, max: 3 })
    );
    q.complete(first.cmd, Ok(DevCompletion::Done));
    let d = q.poll(0, &pool).unwrap();
    assert!(
        matches!(d.command, DevCommand::Write { lba: Lba(1), .. }),
        "4 continues 2 but may not pass the flush"
    );
    q.complete(d.cmd, Ok(DevCompletion::Done));
    assert!(matches!(
        q.poll(0, &pool).unwrap().command,
        DevCommand::Flush
    ));
    assert_eq!(q.stats().refused, 1);
}

/// One step of the property test.
#[derive(Clone, Debug)]
enum Step {
    /// Submit a read, a write (of a fresh byte) or a flush.
    Read {
        lba: u64,
        blocks: u64,
    },
    Write {
        lba: u64,
        blocks: u64,
        fua: bool,
    },
    Flush,
    /// Complete the in-flight command at this index (modulo), if any.
    Complete(usize),
}

fn step() -> impl Strategy<Value = Step> {
    // Requests of at most 12 blocks (the device takes 12 or more at once),
    // inside the device's 64.
    let range = (0u64..52, 1u64..=12);
    prop_oneof![
        3 => range.clone().prop_map(|(lba, blocks)| Step::Read { lba, blocks }),
        3 => (range, any::<bool>()).prop_map(|((lba, blocks), fua)| Step::Write { lba, blocks, fua }),
        1 => Just(Step::Flush),
        5 => any::<usize>().prop_map(Step::Complete),
    ]
}

/// The device the test gives commands to: it takes each when it is
/// dispatched (so the order the queue gives them is the order that counts),
/// and completes them in whatever order the test draws. Blocks in `bad` fail
/// reads with a media error.
struct Device {
    blocks: Vec<u8>,
    bad: BTreeSet<u64>,
}

impl Device {
    fn take(&mut self, cmd: DevCommand) -> Result<DevCompletion, DevError> {
        match cmd {
            DevCommand::Read { lba, mut buf } => {
                let n = (buf.len() / BS) as u64;
                if let Some(&b) = self.bad.range(lba.0..lba.0 + n).next() {
                    return Err(DevError::Media(Lba(b)));
                }
                for (i, chunk) in buf.as_mut().chunks_mut(BS).enumerate() {
                    chunk.fill(self.blocks[lba.0 as usize + i]);
                }
                Ok(DevCompletion::Read(buf))
            }
            DevCommand::Write { lba, data, .. } => {
                for (i, chunk) in data.chunks(BS).enumerate() {
                    assert!(chunk.iter().all(|&x| x == chunk[0]), "one byte a block");
                    self.blocks[lba.0 as usize + i] = chunk[0];
                }
                Ok(DevCompletion::Done)
            }
            cmd @ DevCommand::WriteGather { .. } => self.take(cmd.into_contiguous()),
            DevCommand::Flush => Ok(DevCompletion::Done),
            other => panic!("the queue made {other:?}"),
        }
    }
}

/// A result in few words: a read's first byte of every block.
fn digest(r: &IoResult) -> String {
    match r {
        IoResult::Read(data) => {
            let firsts: Vec<u8> = data.chunks(BS).map(|b| b[0]).collect();
            format!("read {firsts:?}")
        }
        other => format!("{other:?}"),
    }
}

fn check_against_oracle(
    cfg: SchedConfig,
    geometry: Geometry,
    bad: BTreeSet<u64>,
    steps: Vec<Step>,
    class: impl Fn(u64) -> IoClass,
) -> Result<(), TestCaseError> {
    let pool = BufPool::new(8 << 20);
    let mut q = IoQueue::new(geometry, cfg);
    let mut device = Device {
        blocks: vec![0; 64],
        bad: bad.clone(),
    };
    // The oracle: every request taken, applied at once in submission order.
    let mut oracle = vec![0u8; 64];
    let mut expected: BTreeMap<IoId, IoResult> = BTreeMap::new();
    let mut inflight: Vec<(CmdId, Result<DevCompletion, DevError>)> = Vec::new();
    let mut got: BTreeMap<IoId, IoResult> = BTreeMap::new();
    let mut flushes: Vec<IoId> = Vec::new();
    let mut next_byte = 1u8;
    // The requests of every command, in the order the device took them.
    let mut taken: Vec<IoId> = Vec::new();
    let drain = |q: &mut IoQueue,
                 device: &mut Device,
                 inflight: &mut Vec<(CmdId, Result<DevCompletion, DevError>)>,
                 got: &mut BTreeMap<IoId, IoResult>,
                 taken: &mut Vec<IoId>|
     -> Result<(), TestCaseError> {
        while let Some(d) = q.poll(0, &pool) {
            taken.extend(q.requests_of(d.cmd));
            inflight.push((d.cmd, device.take(d.command)));
        }
        while let Some((io, r)) = q.poll_finished() {
            prop_assert!(got.insert(io, r).is_none(), "{:?} finished twice", io);
        }
        q.self_check();
        Ok(())
    };
    let last = steps.len() as u64;
    for (i, step) in steps.into_iter().enumerate() {
        let io = IoId(i as u64);
        let is_flush = matches!(step, Step::Flush);
        let (cmd, outcome) = match step {
            Step::Complete(k) => {
                if !inflight.is_empty() {
                    let (cmd, result) = inflight.remove(k % inflight.len());
                    q.complete(cmd, result);
                }
                drain(&mut q, &mut device, &mut inflight, &mut got, &mut taken)?;
                continue;
            }
            Step::Flush => (IoCmd::Flush, IoResult::Done),
            Step::Read { lba, blocks } => {
                let range = lba..lba + blocks;
                let outcome = match bad.range(range.clone()).next() {
                    Some(&b) => IoResult::Failed(WeirError::Device(DevError::Media(Lba(b)))),
                    None => {
                        let data: Vec<u8> = range
                            .flat_map(|b| std::iter::repeat_n(oracle[b as usize], BS))
                            .collect();
                        IoResult::Read(Bytes::from(data))
                    }
                };
                (read(lba, blocks), outcome)
            }
            Step::Write { lba, blocks, fua } => {
                next_byte = next_byte.wrapping_add(1).max(1);
                (write(lba, blocks, next_byte, fua), IoResult::Done)
            }
        };
        let write_range = match &cmd {
            IoCmd::Write { lba, data, .. } => Some((lba.0, (data.len() / BS) as u64, data[0])),
            _ => None,
        };
        if q.submit_as(io, cmd, class(io.0), 0).is_ok() {
            if let Some((lba, blocks, byte)) = write_range {
                oracle[lba as usize..(lba + blocks) as usize].fill(byte);
            }
            if is_flush {
                flushes.push(io);
            }
            expected.insert(io, outcome);
        }
        drain(&mut q, &mut device, &mut inflight, &mut got, &mut taken)?;
    }
    // Then the device completes everything left, in order.
    let mut rounds = 0;
    while !inflight.is_empty() {
        let (cmd, result) = inflight.remove(0);
        q.complete(cmd, result);
        drain(&mut q, &mut device, &mut inflight, &mut got, &mut taken)?;
        rounds += 1;
        prop_assert!(rounds < 10 * last + 100, "the queue never empties");
    }
    prop_assert_eq!(q.waiting(), 0);
    // A flush is a barrier: every request taken before it went to the device
    // before it (retries of a merged command too), none taken after it did.
    for f in flushes {
        let at = taken.iter().position(|&io| io == f).expect("a flush goes");
        prop_assert!(
            taken[..at].iter().all(|&io| io < f) && taken[at + 1..].iter().all(|&io| io > f),
            "requests crossed flush {:?}: {:?}",
            f,
            taken
        );
    }
    prop_assert_eq!(&device.blocks, &oracle, "the device ends as the oracle");
    prop_assert_eq!(
        got.len(),
        expected.len(),
        "every request taken finished once"
    );
    for (io, want) in &expected {
        let have = &got[io];
        match (want, have) {
            // A split read's pieces may fail in either order: any bad block of
            // its own is the right one to name.
            (
                IoResult::Failed(WeirError::Device(DevError::Media(_))),
                IoResult::Failed(WeirError::Device(DevError::Media(b))),
            ) => prop_assert!(bad.contains(&b.0)),
            _ => prop_assert_eq!(digest(want), digest(have), "{:?}", io),
        }
    }
    Ok(())
}

proptest! {
    // The scheduler's correctness rests here (issue: 10,000 cases or more);
    // each case is a few dozen steps of pure logic.
    #![proptest_config(ProptestConfig::with_cases(10_000))]

    /// Merging, splitting and classes never change what a read returns, what
    /// the device ends up holding, or which requests finish: whatever the
    /// settings, background work among the requests, the
    /// interleaving of requests and completions, the overlaps, FUA, flushes,
    /// media errors and refusals, every request finishes once with the result
    /// the unscheduled oracle gives it.
    #[test]
    fn the_queue_agrees_with_an_unscheduled_oracle(
        merge in any::<bool>(),
        split in any::<bool>(),
        classes in any::<bool>(),
        background in any::<u64>(),
        depth in 1u32..4,
        queues in 1u16..3,
        waiting_max in 4usize..40,
        max_transfer in 12u32..24,
        boundary in prop_oneof![Just(0u32), Just(4), Just(8)],
        bad in proptest::collection::btree_set(0u64..64, 0..3),
        steps in proptest::collection::vec(step(), 1..60),
    ) {
        let cfg = SchedConfig {
            merge,
            split,
            depth_per_queue: depth,
            waiting_max,
            classes,
            shares: ClassShares::default(),
        };
        let geometry = geometry(queues, 8, max_transfer, boundary);
        // Request i is background where bit i of `background` is set.
        let class = |io: u64| match (background >> (io % 64)) & 1 {
            1 => IoClass::Rebuild,
            _ => IoClass::Foreground,
        };
        check_against_oracle(cfg, geometry, bad, steps, class)?;
    }
}

/// FIFO at `depth` commands a queue, with classes.
fn with_classes(depth: u32) -> SchedConfig {
    SchedConfig {
        depth_per_queue: depth,
        classes: true,
        ..SchedConfig::default()
    }
}

/// The LBA of each command `q` dispatches while one at a time completes.
fn order_of(q: &mut IoQueue, pool: &BufPool) -> Vec<u64> {
    let mut out = Vec::new();
    while let Some(d) = q.poll(0, pool) {
        let done = match d.command {
            DevCommand::Read { lba, buf } => {
                out.push(lba.0);
                DevCompletion::Read(buf)
            }
            DevCommand::Write { lba, .. } => {
                out.push(lba.0);
                DevCompletion::Done
            }
            other => panic!("{other:?}"),
        };
        q.complete(d.cmd, Ok(done));
        while q.poll_finished().is_some() {}
    }
    out
}

#[test]
fn with_classes_clients_pass_background_work_but_leave_it_a_share() {
    let pool = BufPool::new(1 << 20);
    let cfg = with_classes(1);
    let mut q = IoQueue::new(geometry(1, 8, 8, 0), cfg);
    // A rebuild's reads at 0..10 wait, then clients' reads at 20..40.
    for i in 0..10 {
        q.submit_as(IoId(i), read(i, 1), IoClass::Rebuild, 0)
            .unwrap();
    }
    for i in 0..20 {
        q.submit(IoId(100 + i), read(20 + i, 1), 0).unwrap();
    }
    let order = order_of(&mut q, &pool);
    let turns = FOREGROUND_WEIGHT as usize;
    // Seven clients' reads, then one of the rebuild's, and so on.
    assert_eq!(
        &order[..turns],
        &(20..20 + turns as u64).collect::<Vec<_>>()[..]
    );
    assert_eq!(order[turns], 0, "background's turn");
    assert_eq!(order[turns + 1], 20 + turns as u64);
    assert_eq!(order.len(), 30);
    assert_eq!(q.stats().passed, 20);

    // Without classes: in the order they came.
    let mut q = IoQueue::new(
        geometry(1, 8, 8, 0),
        SchedConfig {
            classes: false,
            ..cfg
        },
    );
    for i in 0..3 {
        q.submit_as(IoId(i), read(i, 1), IoClass::Rebuild, 0)
            .unwrap();
    }
    q.submit(IoId(9), read(20, 1), 0).unwrap();
    assert_eq!(order_of(&mut q, &pool), vec![0, 1, 2, 20]);
}

#[test]
fn a_client_write_never_passes_background_work_it_overlaps() {
    let pool = BufPool::new(1 << 20);
    let cfg = with_classes(1);
    let mut q = IoQueue::new(geometry(1, 8, 8, 0), cfg);
    // A scrub read at 0, a rebuild's write at 4, then a client's
    // write at 4 (it must not pass the rebuild's) and one at 30 (it may).
    q.submit_as(IoId(1), read(0, 1), IoClass::Scrub, 0).unwrap();
    q.submit_as(IoId(2), write(4, 1, 7, false), IoClass::Rebuild, 0)
        .unwrap();
    q.submit(IoId(3), write(4, 1, 9, false), 0).unwrap();
    q.submit(IoId(4), write(30, 1, 9, false), 0).unwrap();
    assert_eq!(order_of(&mut q, &pool), vec![30, 0, 4, 4]);
    // A flush passes nothing, and nothing passes it.
    let mut q = IoQueue::new(geometry(1, 8, 8, 0), cfg);
    q.submit_as(IoId(1), read(0, 1), IoClass::Scrub, 0).unwrap();
    q.submit(IoId(2), IoCmd::Flush, 0).unwrap();
    q.submit(IoId(3), read(9, 1), 0).unwrap();
    let mut kinds = Vec::new();
    while let Some(d) = q.poll(0, &pool) {
        kinds.push(matches!(d.command, DevCommand::Flush));
        let done = match d.command {
            DevCommand::Read { buf, .. } => DevCompletion::Read(buf),
            _ => DevCompletion::Done,
        };
        q.complete(d.cmd, Ok(done));
    }
    assert_eq!(kinds, vec![false, true, false]);
}

#[test]
fn background_work_holds_at_most_its_share_of_the_device() {
    let pool = BufPool::new(1 << 20);
    let cfg = with_classes(8);
    // Two queues of 8: 16 slots, 2 for background (BACKGROUND_INFLIGHT_MAX).
    let mut q = IoQueue::new(geometry(2, 8, 8, 0), cfg);
    for i in 0..5 {
        q.submit_as(IoId(i), read(i, 1), IoClass::Rebuild, 0)
            .unwrap();
    }
    let first: Vec<_> = std::iter::from_fn(|| q.poll(0, &pool)).collect();
    assert_eq!(first.len(), 2, "two background commands, then none");
    // Clients' requests still go, up to the device's depth.
    for i in 0..20 {
        q.submit(IoId(100 + i), read(20 + i, 1), 0).unwrap();
    }
    let more: Vec<_> = std::iter::from_fn(|| q.poll(0, &pool)).collect();
    assert_eq!(more.len(), 14);
    q.self_check();
    // A background command done: the next background one may go.
    let d = first.into_iter().next().unwrap();
    let DevCommand::Read { buf, .. } = d.command else {
        panic!("a read");
    };
    q.complete(d.cmd, Ok(DevCompletion::Read(buf)));
    let next = q.poll(0, &pool).expect("a slot freed");
    assert!(matches!(next.command, DevCommand::Read { lba, .. } if lba.0 == 2));
}

#[test]
fn merges_and_splits_are_counted_for_the_requests_volume() {
    let pool = BufPool::new(1 << 20);
    // Depth 1, merging, an optimal I/O boundary every 4 blocks.
    let mut s = DeviceSched::new(geometry(1, 8, 8, 4), merging(1), Duration::from_millis(100));
    let (a, b) = (Some(0), Some(4));
    let fg = IoClass::Foreground;
    // The first goes alone; the next two wait, then go as one command.
    s.submit_for(IoId(1), write(20, 1, 1, false), (fg, a), 0)
        .unwrap();
    let first = s.poll(0, &pool).unwrap();
    s.submit_for(IoId(2), read(1, 1), (fg, b), 0).unwrap();
    s.submit_for(IoId(3), read(2, 1), (fg, a), 0).unwrap();
    // Across the boundary at 4: split (its pieces join no other); of no named
    // volume: not counted.
    s.submit_for(IoId(4), read(3, 2), (fg, b), 0).unwrap();
    s.submit_for(IoId(5), read(11, 2), (fg, None), 0).unwrap();
    s.complete(first.cmd, Ok(DevCompletion::Done), 0);
    let merged = s.poll(0, &pool).unwrap();
    assert_eq!(merged.requests, [IoId(2), IoId(3)]);
    let stats: BTreeMap<_, _> = s.volume_stats().into_iter().collect();
    assert_eq!((stats[&0].merged, stats[&0].split), (1, 0));
    assert_eq!((stats[&4].merged, stats[&4].split), (0, 1));
    assert_eq!(stats.len(), 2);
    assert_eq!(
        s.stats().split,
        2,
        "the pool's request split too, uncounted by volume"
    );
}
