//! The I/O queue of one device: requests wait here for room on the device's
//! queues, and leave as device commands, merged and split.
//!
//! - **Depth.** At most `depth_per_queue` commands are in flight on each device
//!   queue; a command goes to the queue with the fewest. Past that, requests
//!   wait, in the order they came, up to `waiting_max` pieces; a request that
//!   would pass it is refused (the engine's back-pressure: it fails the request
//!   as `Busy`, as it does when the buffer pool is out).
//! - **Merge.** When a command leaves, the waiting requests of the same kind
//!   (reads; writes with the same FUA) that continue it block for block join it,
//!   up to the device's largest transfer. Only what already waits is taken: a
//!   lone request never waits for company. A read merged with others is read
//!   into one buffer and each gets its slice of it; writes merged go as one
//!   scatter-gather list, not copied together.
//! - **Split.** A request that crosses the device's optimal I/O boundary (a
//!   stripe of striped drives, NVMe's NOIOB) is cut there, so its parts are
//!   served at once by the parts of the device; a read's pieces are pieces of
//!   one buffer, joined again without a copy. Merging never crosses a boundary
//!   either (with splitting on), so the two do not undo each other.
//! - **Order.** Requests leave in the order they came, but for the ones a merge
//!   takes ahead and the foreground ones that pass background work (classes);
//!   neither takes a request past an earlier waiting one that
//!   it overlaps when either writes, nor past a flush (a flush waits for the
//!   requests before it to leave, and none after it leaves first). So the
//!   device sees conflicting requests in the order the engine made them, and a
//!   read returns what it would have unscheduled (the property test in
//!   `tests.rs` runs both against an oracle). What is in flight together races
//!   on the device as before: ordering device writes is [`super::WriteOrder`]'s.
//! - **Classes.** With `classes` on, background work waits behind clients'
//!   requests, and holds few commands on the device (see `queue/classes.rs`).
//! - **Errors.** A merged command that fails with a media error is taken apart:
//!   its requests go again one by one at the head, so the error is charged to
//!   the request whose blocks it is in and the others complete. Other errors
//!   fail every request of the command. So that going again passes nothing, a
//!   request that conflicts with a merged command in flight waits for it (and
//!   while the head waits, everything waits).
//!
//! Sans-IO: requests in ([`IoQueue::submit`]), commands out ([`IoQueue::poll`]),
//! completions in ([`IoQueue::complete`]), results out ([`IoQueue::poll_finished`]).

use crate::buf::{Buf, BufPool, BUF_ALIGN};
use crate::device::{DevCommand, DevCompletion, DevError, Geometry};
use crate::error::WeirError;
use crate::ids::Lba;
use crate::io::{IoClass, IoCmd, IoId, IoResult};
use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};

pub use classes::{ClassShares, Share, BACKGROUND_INFLIGHT_MAX, FOREGROUND_WEIGHT};

mod classes;

/// Waiting pieces a merge looks through past the head, at most.
pub const MERGE_SCAN_MAX: usize = 32;

/// The default bound on waiting pieces: far above what the engine keeps in
/// flight in normal running (a refused replica write costs the replica its
/// place in the in-sync set, and a rebuild). A waiting piece holds no memory of
/// its own beyond its entry: a write's data is the frame it came in.
pub const WAITING_MAX_DEFAULT: usize = 65_536;

/// The scheduler's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedConfig {
    /// Merge waiting requests that continue one another.
    pub merge: bool,
    /// Split requests at the device's optimal I/O boundary.
    pub split: bool,
    /// Commands in flight per device queue, at most; 0 takes the device's
    /// queue depth.
    pub depth_per_queue: u32,
    /// Pieces waiting, at most; a request that would pass it is refused.
    pub waiting_max: usize,
    /// Background work waits behind clients' requests (see the module).
    pub classes: bool,
    /// The classes' weights and reservations (with `classes`).
    pub shares: ClassShares,
}

impl Default for SchedConfig {
    /// At the device's own depth: nothing merges, and requests wait in weir
    /// only past what the device's queues hold, or when they are background
    /// work past its two commands (classes: in the `rebuild-under-load`
    /// experiment they halved clients' P99 while a node rebuilt, at 2% of the
    /// rebuild's speed; with no background work they change nothing).
    fn default() -> Self {
        SchedConfig {
            merge: false,
            split: false,
            depth_per_queue: 0,
            waiting_max: WAITING_MAX_DEFAULT,
            classes: true,
            shares: ClassShares::default(),
        }
    }
}

/// A device command's number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CmdId(pub u64);

/// A command to give the device.
#[derive(Debug)]
pub struct Dispatch {
    /// Its number, for [`IoQueue::complete`].
    pub cmd: CmdId,
    /// The device queue it goes to.
    pub queue: u16,
    /// The command.
    pub command: DevCommand,
    /// The requests whose pieces it carries, in block order: more than one is a
    /// merge.
    pub requests: Vec<IoId>,
}

/// The queue refused a request: too many wait already.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the device's queue is full: {waiting} pieces wait, at most {max}")]
pub struct QueueFull {
    /// Pieces waiting.
    pub waiting: usize,
    /// The bound.
    pub max: usize,
}

/// Counters of a queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedStats {
    /// Requests taken.
    pub requests: u64,
    /// Device commands issued.
    pub commands: u64,
    /// Requests (pieces) that joined another's command.
    pub merged: u64,
    /// Requests cut in pieces.
    pub split: u64,
    /// Requests refused because the queue was full.
    pub refused: u64,
    /// Merged commands taken apart after a media error.
    pub unmerged: u64,
    /// Nanoseconds requests waited in the queue, in all.
    pub waited_ns: u64,
    /// Commands that went ahead of waiting background work (classes on).
    pub passed: u64,
}

impl SchedStats {
    /// Add `other`'s counts.
    pub fn add(&mut self, other: &SchedStats) {
        self.requests += other.requests;
        self.commands += other.commands;
        self.merged += other.merged;
        self.split += other.split;
        self.refused += other.refused;
        self.unmerged += other.unmerged;
        self.waited_ns += other.waited_ns;
        self.passed += other.passed;
    }
}

#[derive(Debug)]
enum What {
    Read,
    Write { data: Bytes, fua: bool },
    Flush,
}

/// One piece of a request (the whole request unless split).
#[derive(Debug)]
struct Piece {
    io: IoId,
    index: u32,
    lba: u64,
    blocks: u64,
    what: What,
    /// It joins no other command: a piece of a split read (it owns a piece of
    /// the request's buffer), or a request of a merged command taken apart.
    solo: bool,
    /// Put back after its merged command failed.
    again: bool,
    since_ns: u64,
    /// Its request's class.
    class: IoClass,
}

impl Piece {
    fn writes(&self) -> bool {
        matches!(self.what, What::Write { .. })
    }

    fn overlaps(&self, other: &Piece) -> bool {
        self.lba < other.lba + other.blocks && other.lba < self.lba + self.blocks
    }

    /// Whether `self` may be moved ahead of `other`.
    fn conflicts(&self, other: &Piece) -> bool {
        matches!(other.what, What::Flush)
            || (self.overlaps(other) && (self.writes() || other.writes()))
    }

    /// Whether `next` may join a command that starts with `self`.
    fn same_kind(&self, next: &Piece) -> bool {
        match (&self.what, &next.what) {
            (What::Read, What::Read) => true,
            (What::Write { fua: a, .. }, What::Write { fua: b, .. }) => a == b,
            _ => false,
        }
    }
}

/// A request not yet finished.
#[derive(Debug)]
struct Request {
    /// Pieces not yet completed.
    left: u32,
    failed: Option<WeirError>,
    read: ReadState,
}

#[derive(Debug)]
enum ReadState {
    /// Not a read.
    None,
    /// A read in one piece: its data once read.
    Whole(Option<Bytes>),
    /// A split read: the buffer pieces not yet given to the device (made at
    /// its first piece's dispatch), and the ones read.
    Split {
        sizes: Vec<usize>,
        todo: Vec<Option<Buf>>,
        done: Vec<Option<Buf>>,
    },
}

#[derive(Debug)]
struct Cmd {
    queue: u16,
    pieces: Vec<Piece>,
    /// When it was dispatched, if it is timed (flushes are not: under a heavy
    /// write load a healthy device takes long to drain its cache).
    timed_ns: Option<u64>,
    /// Counted as background work in flight.
    background: bool,
}

/// The I/O queue of one device.
#[derive(Debug)]
pub struct IoQueue {
    cfg: SchedConfig,
    block_bytes: usize,
    max_transfer_blocks: u64,
    /// Where commands are cut (0: nowhere).
    boundary_blocks: u64,
    depth: u32,
    waiting: VecDeque<Piece>,
    inflight: Vec<u32>,
    cmds: BTreeMap<CmdId, Cmd>,
    /// Merged commands in flight: first block, end, whether they write. A
    /// piece that conflicts with one waits for it: if it fails, its requests
    /// go again, and none that came after them may have passed them.
    merged: BTreeMap<CmdId, (u64, u64, bool)>,
    requests: BTreeMap<IoId, Request>,
    finished: VecDeque<(IoId, IoResult)>,
    next_cmd: u64,
    stats: SchedStats,
    /// The classes' dmClock tags (classes on).
    clock: classes::ClassClock,
    /// Background commands in flight (classes on).
    background: u32,
}

impl IoQueue {
    /// The queue of a device of `geometry`.
    pub fn new(geometry: Geometry, cfg: SchedConfig) -> Self {
        let queues = geometry.queues.max(1);
        let depth = if cfg.depth_per_queue == 0 {
            u32::from(geometry.queue_depth.max(1))
        } else {
            cfg.depth_per_queue
        };
        let boundary_blocks = if cfg.split {
            u64::from(geometry.optimal_io_blocks)
        } else {
            0
        };
        IoQueue {
            cfg,
            block_bytes: geometry.block_size as usize,
            max_transfer_blocks: u64::from(geometry.max_transfer_blocks.max(1)),
            boundary_blocks,
            depth,
            waiting: VecDeque::new(),
            inflight: vec![0; usize::from(queues)],
            cmds: BTreeMap::new(),
            merged: BTreeMap::new(),
            requests: BTreeMap::new(),
            finished: VecDeque::new(),
            next_cmd: 0,
            stats: SchedStats::default(),
            clock: classes::ClassClock::new(cfg.shares),
            background: 0,
        }
    }

    /// Count on this queue.
    fn count(&mut self, f: impl Fn(&mut SchedStats)) {
        f(&mut self.stats);
    }

    /// The settings.
    pub fn config(&self) -> SchedConfig {
        self.cfg
    }

    /// The counters.
    pub fn stats(&self) -> SchedStats {
        self.stats
    }

    /// Pieces waiting.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// When the oldest timed command in flight was dispatched.
    pub fn oldest_timed_ns(&self) -> Option<u64> {
        self.cmds.values().filter_map(|c| c.timed_ns).min()
    }

    /// When the oldest piece waiting that is not a flush came (flushes are not
    /// timed: a healthy device takes long to drain its cache).
    pub fn oldest_waiting_ns(&self) -> Option<u64> {
        self.waiting
            .iter()
            .filter(|p| !matches!(p.what, What::Flush))
            .map(|p| p.since_ns)
            .min()
    }

    /// Commands in flight.
    pub fn inflight(&self) -> usize {
        self.cmds.len()
    }

    /// Take request `io` (its blocks in device blocks) at `now_ns`; it leaves
    /// through [`IoQueue::poll`] and its result comes out of
    /// [`IoQueue::poll_finished`].
    pub fn submit(&mut self, io: IoId, cmd: IoCmd, now_ns: u64) -> Result<(), QueueFull> {
        self.submit_as(io, cmd, IoClass::Foreground, now_ns)
    }

    /// [`IoQueue::submit`] of a request of `class`.
    pub fn submit_as(
        &mut self,
        io: IoId,
        cmd: IoCmd,
        class: IoClass,
        now_ns: u64,
    ) -> Result<(), QueueFull> {
        assert!(!self.requests.contains_key(&io), "{io:?} submitted twice");
        // A transfer of no blocks or of part of one is refused here, typed, as
        // the device would: merged with others it would shift their data.
        let bad = match &cmd {
            IoCmd::Read { blocks, .. } => (*blocks == 0).then_some(DevError::OutOfRange),
            IoCmd::Write { data, .. } => (data.is_empty()
                || !data.len().is_multiple_of(self.block_bytes))
            .then_some(DevError::Misaligned),
            IoCmd::Flush => None,
        };
        if let Some(e) = bad {
            self.finished
                .push_back((io, IoResult::Failed(WeirError::Device(e))));
            return Ok(());
        }
        let pieces = self.cut(io, cmd, class, now_ns);
        if self.waiting.len() + pieces.len() > self.cfg.waiting_max {
            self.count(|s| s.refused += 1);
            return Err(QueueFull {
                waiting: self.waiting.len(),
                max: self.cfg.waiting_max,
            });
        }
        let read = match (&pieces[0].what, pieces.len()) {
            (What::Read, 1) => ReadState::Whole(None),
            (What::Read, n) => ReadState::Split {
                sizes: pieces
                    .iter()
                    .map(|p| p.blocks as usize * self.block_bytes)
                    .collect(),
                todo: (0..n).map(|_| None).collect(),
                done: (0..n).map(|_| None).collect(),
            },
            _ => ReadState::None,
        };
        let split = u64::from(pieces.len() > 1);
        self.count(|s| {
            s.requests += 1;
            s.split += split;
        });
        let left = pieces.len() as u32;
        self.requests.insert(
            io,
            Request {
                left,
                failed: None,
                read,
            },
        );
        self.waiting.extend(pieces);
        Ok(())
    }

    /// Cut a request into its pieces at the boundaries it crosses.
    fn cut(&self, io: IoId, cmd: IoCmd, class: IoClass, since_ns: u64) -> Vec<Piece> {
        let piece = |index, lba, blocks, what| Piece {
            io,
            index,
            lba,
            blocks,
            what,
            solo: false,
            again: false,
            since_ns,
            class,
        };
        let (lba, blocks, data, fua) = match cmd {
            IoCmd::Flush => return vec![piece(0, 0, 0, What::Flush)],
            IoCmd::Read { lba, blocks } => (lba.0, blocks, None, false),
            IoCmd::Write { lba, data, fua } => {
                let blocks = (data.len() / self.block_bytes) as u64;
                (lba.0, blocks, Some(data), fua)
            }
        };
        assert!(blocks > 0, "{io:?} moves no blocks");
        let b = self.boundary_blocks;
        let mut cuts = Vec::new();
        if let Some(first) = lba.checked_div(b) {
            let mut at = (first + 1) * b;
            while at < lba + blocks {
                cuts.push(at);
                at += b;
            }
        }
        // A read's pieces are pieces of one buffer: each must start on the
        // buffer's page grid.
        let aligned = cuts
            .iter()
            .all(|&c| ((c - lba) as usize * self.block_bytes).is_multiple_of(BUF_ALIGN));
        if cuts.is_empty() || (data.is_none() && !aligned) {
            let what = match data {
                Some(data) => What::Write { data, fua },
                None => What::Read,
            };
            return vec![piece(0, lba, blocks, what)];
        }
        let mut starts = vec![lba];
        starts.extend(&cuts);
        let mut ends = cuts;
        ends.push(lba + blocks);
        starts
            .into_iter()
            .zip(ends)
            .enumerate()
            .map(|(i, (start, end))| {
                let what = match &data {
                    Some(data) => What::Write {
                        data: data.slice(
                            (start - lba) as usize * self.block_bytes
                                ..(end - lba) as usize * self.block_bytes,
                        ),
                        fua,
                    },
                    None => What::Read,
                };
                let mut p = piece(i as u32, start, end - start, what);
                p.solo = data.is_none();
                p
            })
            .collect()
    }

    /// The next command for the device at `now_ns`, if a queue has room and a
    /// request waits; read buffers come from `pool`.
    pub fn poll(&mut self, now_ns: u64, pool: &BufPool) -> Option<Dispatch> {
        loop {
            let queue = (0..self.inflight.len()).min_by_key(|&q| (self.inflight[q], q))?;
            if self.inflight[queue] >= self.depth {
                return None;
            }
            let first = self.first_to_go(now_ns)?;
            if self
                .waiting
                .get(first)
                .is_some_and(|head| self.waits_for_merged(head))
            {
                return None;
            }
            let run = self.take_run(first)?;
            let waited: u64 = run.iter().map(|p| now_ns.saturating_sub(p.since_ns)).sum();
            self.count(|s| s.waited_ns += waited);
            // Pieces of a request that failed already are dropped here.
            let run = self.drop_failed(run);
            if run.is_empty() {
                continue;
            }
            let Some(command) = self.command(&run, pool) else {
                continue;
            };
            let cmd = CmdId(self.next_cmd);
            self.next_cmd += 1;
            let merged = run.len() as u64 - 1;
            self.count(|s| {
                s.commands += 1;
                s.merged += merged;
            });
            self.inflight[queue] += 1;
            if run.len() > 1 {
                let (start, last) = (run[0].lba, &run[run.len() - 1]);
                let span = (start, last.lba + last.blocks, run[0].writes());
                self.merged.insert(cmd, span);
            }
            let queue = queue as u16;
            let timed_ns = (!matches!(command, DevCommand::Flush)).then_some(now_ns);
            let background = self.cfg.classes && run[0].class.background();
            self.background += u32::from(background);
            // The tags count commands that went, not choices made.
            if self.cfg.classes {
                self.clock.dispatched(run[0].class, now_ns);
                if !background && first > 0 {
                    self.count(|s| s.passed += 1);
                }
            }
            let requests = run.iter().map(|p| p.io).collect();
            let cmd_state = Cmd {
                queue,
                pieces: run,
                timed_ns,
                background,
            };
            self.cmds.insert(cmd, cmd_state);
            return Some(Dispatch {
                cmd,
                queue,
                command,
                requests,
            });
        }
    }

    /// The piece at `first` and the waiting ones that continue it.
    fn take_run(&mut self, first: usize) -> Option<Vec<Piece>> {
        let head = self.waiting.remove(first)?;
        let mut run = vec![head];
        if !self.cfg.merge || run[0].solo || matches!(run[0].what, What::Flush) {
            return Some(run);
        }
        let start = run[0].lba;
        let mut end = start + run[0].blocks;
        let mut skipped: Vec<usize> = Vec::new();
        let mut i = 0;
        let mut scanned = 0;
        while i < self.waiting.len() && scanned < MERGE_SCAN_MAX {
            scanned += 1;
            let p = &self.waiting[i];
            if matches!(p.what, What::Flush) {
                break;
            }
            let joins = !p.solo
                && run[0].same_kind(p)
                && p.lba == end
                && end + p.blocks - start <= self.max_transfer_blocks
                && !self.crosses(start, end + p.blocks)
                && !skipped.iter().any(|&s| p.conflicts(&self.waiting[s]))
                && (!self.cfg.classes || p.class.background() == run[0].class.background())
                && !self.waits_for_merged(p);
            if joins {
                end += p.blocks;
                let p = self.waiting.remove(i).expect("scanned");
                // Indices of skipped pieces stand before `i`: unchanged.
                run.push(p);
            } else {
                skipped.push(i);
                i += 1;
            }
        }
        Some(run)
    }

    /// Whether `p` must wait for a merged command in flight (see `merged`).
    fn waits_for_merged(&self, p: &Piece) -> bool {
        self.merged.values().any(|&(start, end, writes)| {
            matches!(p.what, What::Flush)
                || (p.lba < end && start < p.lba + p.blocks && (writes || p.writes()))
        })
    }

    fn crosses(&self, start: u64, end: u64) -> bool {
        let b = self.boundary_blocks;
        b > 0 && start / b != (end - 1) / b
    }

    fn drop_failed(&mut self, run: Vec<Piece>) -> Vec<Piece> {
        let (keep, failed): (Vec<Piece>, Vec<Piece>) = run
            .into_iter()
            .partition(|p| self.requests[&p.io].failed.is_none());
        for p in failed {
            self.piece_done(p.io);
        }
        keep
    }

    /// The device command for `run`; `None` if no buffer could be had for a
    /// read (its requests fail as `Busy`).
    fn command(&mut self, run: &[Piece], pool: &BufPool) -> Option<DevCommand> {
        let lba = Lba(run[0].lba);
        match &run[0].what {
            What::Flush => Some(DevCommand::Flush),
            What::Write { fua, .. } => {
                let mut data: Vec<Bytes> = run
                    .iter()
                    .map(|p| match &p.what {
                        What::Write { data, .. } => data.clone(),
                        _ => unreachable!("a run is of one kind"),
                    })
                    .collect();
                Some(if data.len() == 1 {
                    DevCommand::Write {
                        lba,
                        data: data.pop().expect("one"),
                        fua: *fua,
                    }
                } else {
                    DevCommand::WriteGather {
                        lba,
                        data,
                        fua: *fua,
                    }
                })
            }
            What::Read => match self.read_buf(run, pool) {
                Ok(buf) => Some(DevCommand::Read { lba, buf }),
                Err(()) => {
                    tracing::warn!(
                        requests = run.len(),
                        "no buffer for a read; its requests fail as busy"
                    );
                    for p in run {
                        let r = self.requests.get_mut(&p.io).expect("a request");
                        r.failed.get_or_insert(WeirError::Busy);
                        self.piece_done(p.io);
                    }
                    None
                }
            },
        }
    }

    fn read_buf(&mut self, run: &[Piece], pool: &BufPool) -> Result<Buf, ()> {
        let bytes = run.iter().map(|p| p.blocks as usize).sum::<usize>() * self.block_bytes;
        let (index, io) = (run[0].index as usize, run[0].io);
        let r = self.requests.get_mut(&io).expect("a request");
        let ReadState::Split { sizes, todo, .. } = &mut r.read else {
            return pool.alloc(bytes).map_err(|_| ());
        };
        debug_assert_eq!(run.len(), 1, "a split read's pieces join no other");
        if index == 0 {
            // The first piece leaves first (FIFO, and no merge takes a piece of
            // a split read): the request's buffer, cut where its pieces are.
            let mut rest = pool.alloc(sizes.iter().sum()).map_err(|_| ())?;
            let last = todo.len() - 1;
            for (slot, &size) in todo[..last].iter_mut().zip(sizes.iter()) {
                let tail = rest.split_off(size);
                *slot = Some(std::mem::replace(&mut rest, tail));
            }
            todo[last] = Some(rest);
        }
        todo[index].take().ok_or(())
    }

    /// Command `cmd` completed with `result`.
    pub fn complete(&mut self, cmd: CmdId, result: Result<DevCompletion, DevError>) {
        let done = self
            .cmds
            .remove(&cmd)
            .unwrap_or_else(|| panic!("a completion of {cmd:?}, which was not issued"));
        self.merged.remove(&cmd);
        if done.background {
            self.background -= 1;
        }
        let depth = &mut self.inflight[usize::from(done.queue)];
        debug_assert!(*depth > 0);
        *depth -= 1;
        let pieces = done.pieces;
        match result {
            Err(DevError::Media(_)) if pieces.len() > 1 => {
                // Take the command apart: each request again on its own, first.
                self.count(|s| s.unmerged += 1);
                for mut p in pieces.into_iter().rev() {
                    p.solo = true;
                    p.again = true;
                    self.waiting.push_front(p);
                }
            }
            Err(e) => {
                for p in pieces {
                    let r = self.requests.get_mut(&p.io).expect("a request");
                    r.failed.get_or_insert(WeirError::Device(e));
                    self.piece_done(p.io);
                }
            }
            Ok(DevCompletion::Done) => {
                for p in pieces {
                    self.piece_done(p.io);
                }
            }
            Ok(DevCompletion::Read(buf)) => self.read_done(pieces, buf),
        }
    }

    fn read_done(&mut self, pieces: Vec<Piece>, buf: Buf) {
        let block_bytes = self.block_bytes;
        if let [p] = &pieces[..] {
            let r = self.requests.get_mut(&p.io).expect("a request");
            match &mut r.read {
                ReadState::Split { done, .. } => done[p.index as usize] = Some(buf),
                ReadState::Whole(data) => *data = Some(buf.freeze()),
                ReadState::None => unreachable!("a read's request"),
            }
            self.piece_done(p.io);
            return;
        }
        let all = buf.freeze();
        let mut at = 0;
        for p in pieces {
            let len = p.blocks as usize * block_bytes;
            let r = self.requests.get_mut(&p.io).expect("a request");
            let ReadState::Whole(data) = &mut r.read else {
                unreachable!("only whole reads merge");
            };
            *data = Some(all.slice(at..at + len));
            at += len;
            self.piece_done(p.io);
        }
    }

    /// One piece of `io` is done; the request finishes with its last.
    fn piece_done(&mut self, io: IoId) {
        let r = self.requests.get_mut(&io).expect("a request");
        r.left -= 1;
        if r.left > 0 {
            return;
        }
        let r = self.requests.remove(&io).expect("a request");
        let result = match (r.failed, r.read) {
            (Some(e), _) => IoResult::Failed(e),
            (None, ReadState::None) => IoResult::Done,
            (None, ReadState::Whole(data)) => IoResult::Read(data.expect("read")),
            (None, ReadState::Split { done, .. }) => {
                let mut pieces = done.into_iter().map(|b| b.expect("every piece read"));
                let mut whole = pieces.next().expect("a piece");
                for next in pieces {
                    whole
                        .unsplit(next)
                        .expect("the pieces of one buffer, in order");
                }
                IoResult::Read(whole.freeze())
            }
        };
        self.finished.push_back((io, result));
    }

    /// The requests command `cmd` (in flight) serves, in block order.
    #[cfg(test)]
    pub(super) fn requests_of(&self, cmd: CmdId) -> Vec<IoId> {
        self.cmds[&cmd].pieces.iter().map(|p| p.io).collect()
    }

    /// The next finished request and its result.
    pub fn poll_finished(&mut self) -> Option<(IoId, IoResult)> {
        self.finished.pop_front()
    }

    /// Check the bookkeeping; panics on a broken invariant:
    /// - the per-queue depths count the commands in flight, within the depth;
    /// - every piece waiting or in flight belongs to a request, and each
    ///   request's count of pieces left is exactly those;
    /// - a command is one kind, contiguous, within the largest transfer, and
    ///   crosses no boundary.
    pub fn self_check(&self) {
        let background = self.cmds.values().filter(|c| c.background).count() as u32;
        assert_eq!(background, self.background, "background commands in flight");
        assert!(
            background <= self.background_max(),
            "background past its slots"
        );
        let mut depth = vec![0u32; self.inflight.len()];
        let mut left: BTreeMap<IoId, u32> = BTreeMap::new();
        for c in self.cmds.values() {
            depth[usize::from(c.queue)] += 1;
            let first = &c.pieces[0];
            let mut end = first.lba;
            for p in &c.pieces {
                assert!(first.same_kind(p) || c.pieces.len() == 1, "a mixed command");
                assert!(
                    !self.cfg.classes || p.class.background() == first.class.background(),
                    "background work merged into a client's command"
                );
                assert_eq!(p.lba, end, "a command with a gap");
                end += p.blocks;
            }
            if !matches!(first.what, What::Flush) {
                assert!(end - first.lba <= self.max_transfer_blocks, "too long");
                assert!(
                    c.pieces.len() == 1 || !self.crosses(first.lba, end),
                    "a merged command across a boundary"
                );
            }
            for p in &c.pieces {
                *left.entry(p.io).or_default() += 1;
            }
        }
        for p in &self.waiting {
            *left.entry(p.io).or_default() += 1;
        }
        assert_eq!(depth, self.inflight, "per-queue depths");
        for cmd in self.merged.keys() {
            assert!(
                self.cmds[cmd].pieces.len() > 1,
                "a merged command in flight"
            );
        }
        let merged = self.cmds.values().filter(|c| c.pieces.len() > 1).count();
        assert_eq!(merged, self.merged.len(), "merged commands in flight");
        assert!(depth.iter().all(|&d| d <= self.depth), "within the depth");
        let counted: BTreeMap<IoId, u32> =
            self.requests.iter().map(|(&io, r)| (io, r.left)).collect();
        assert_eq!(left, counted, "pieces left per request");
        // Admission keeps the waiting pieces within the bound; only the pieces
        // of merged commands taken apart come back past it.
        let admitted = self.waiting.iter().filter(|p| !p.again).count();
        assert!(admitted <= self.cfg.waiting_max, "within the bound");
    }
}
