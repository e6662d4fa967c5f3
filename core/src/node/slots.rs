//! The node's device as a store ([`crate::store`]): each pool extent the node
//! holds a replica of lives in a slot of its own, taken at the extent's first
//! write, so a device holds the extents placed on its node, not the whole pool.
//!
//! The engine still speaks pool blocks; this layer, owned by the node's task,
//! turns them into device blocks on the way to the scheduler:
//!
//! - a read of an extent that has no slot here was never written here: it is
//!   answered with zeroes, with no device command;
//! - a write of an extent that has no slot takes one, and waits until the
//!   allocation is durable (the store's rule: a slot never holds data its table
//!   does not give to its object), then goes to the scheduler like any other;
//! - a flush goes as it is (a write is issued only once its allocation is
//!   durable, so a flush after it covers both).
//!
//! Slots are not given back yet: a node keeps the slots of extents it once
//! held. Releasing them comes with placement groups, when an object leaving a
//! device is a step of its own (see docs/architecture.md).

use crate::device::{BlockDevice, DevError};
use crate::error::WeirError;
use crate::ids::Lba;
use crate::io::{IoClass, IoCmd, IoId};
use crate::sched::VolKey;
use crate::store::{ObjectKey, Recovery, Store, StoreError, StoreOp, StoreOptions, Ticket};

/// Writes waiting for their slot's allocation to be durable; past this a
/// write is refused with `Busy` (the engine retries it).
pub const SLOT_WAITERS_MAX: usize = 1024;

/// The journal of a node's store: 1 MiB, 256 pages of 56 changes each. A
/// change is an extent's first write on the node, so this is ample.
pub const NODE_JOURNAL_BYTES: u64 = 1 << 20;

/// Largest read answered with zeroes without the device: one request.
const ZEROES_MAX: usize = crate::map::MAX_REQUEST_BYTES as usize;
static ZEROES: [u8; ZEROES_MAX] = [0; ZEROES_MAX];

/// How the node's store starts: made anew, or recovered from its device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreStart {
    /// A new store (the node's first start). `fresh`: the device already
    /// reads as zeroes (a new sparse file, a new simulated SSD), so its slots
    /// need no zeroing.
    Format {
        /// The device reads as zeroes.
        fresh: bool,
    },
    /// The store the device holds (a restart).
    Open,
}

/// The store's options for a pool of `extent_bytes` extents.
pub fn store_options(extent_bytes: u64) -> StoreOptions {
    StoreOptions {
        slot_bytes: extent_bytes,
        journal_bytes: NODE_JOURNAL_BYTES,
    }
}

/// Bytes a device needs to hold `extents` extents of `extent_bytes` in a
/// node's store (the superblock, journal and table in front of the slots).
/// (Page-aligned throughout: the same for either block size.)
pub fn device_bytes_for(extents: u64, extent_bytes: u64) -> u64 {
    crate::store::layout::device_bytes_for(extents, store_options(extent_bytes))
}

/// Where an engine request goes after the store.
#[derive(Debug)]
pub enum Resolved {
    /// To the scheduler, in device blocks of the slot.
    Go(IoCmd),
    /// Answered at once: a read of zeroes, of these many bytes.
    Zeroes(bytes::Bytes),
    /// Held until its slot's allocation is durable (see [`Slots::ready`]).
    Held,
    /// Refused.
    Failed(WeirError),
}

/// A held write let go: its command in device blocks of its slot (or why it
/// cannot go), with its io and tag.
pub type Ready = (IoId, Result<IoCmd, WeirError>, (IoClass, VolKey));

/// A write held for its slot (its command in pool blocks).
#[derive(Debug)]
struct Waiting {
    io: IoId,
    cmd: IoCmd,
    tag: (IoClass, VolKey),
}

impl Waiting {
    fn extent(&self, extent_blocks: u64) -> u64 {
        match &self.cmd {
            IoCmd::Write { lba, .. } | IoCmd::Read { lba, .. } => lba.0 / extent_blocks,
            IoCmd::Flush => u64::MAX,
        }
    }
}

/// Where a write stands with its slot.
enum Placing {
    /// It may go, in the slot's blocks.
    Go(IoCmd),
    /// It waits: for its slot's allocation to be durable, or for a slot.
    Wait,
    /// It never will.
    Failed(WeirError),
}

/// The node's store and the writes waiting on it. See the module docs.
#[derive(Debug)]
pub struct Slots {
    store: Option<Store>,
    /// Device blocks per pool extent (and per slot).
    extent_blocks: u64,
    waiting: std::collections::VecDeque<Waiting>,
    /// The store changed since [`Slots::self_check`] last checked it whole
    /// (a check is a pass over every slot: done only after a change).
    changed: bool,
}

impl Slots {
    /// A node's slots for extents of `extent_blocks` device blocks; no store
    /// until [`Slots::start`].
    pub fn new(extent_blocks: u64) -> Slots {
        Slots {
            store: None,
            extent_blocks,
            waiting: std::collections::VecDeque::new(),
            changed: true,
        }
    }

    /// Format or open the store on `dev` (`seed`: this incarnation's random
    /// number, for the store's id and its journal's nonce). What recovery
    /// found, after an open.
    pub async fn start<D: BlockDevice>(
        &mut self,
        dev: &D,
        how: StoreStart,
        seed: u64,
    ) -> Result<Option<Recovery>, StoreError> {
        let block = u64::from(dev.geometry().block_size);
        let options = store_options(self.extent_blocks * block);
        let nonce = mix(seed ^ 0x006e_6f6e_6365);
        let (store, recovery) = match how {
            StoreStart::Format { fresh } => {
                let uuid = (u128::from(mix(seed)) << 64) | u128::from(mix(seed ^ 0x7575_6964));
                let store = super::store_io::format(dev, uuid, options, fresh, nonce).await?;
                (store, None)
            }
            StoreStart::Open => {
                let (store, recovery) = super::store_io::open(dev, nonce).await?;
                if store.layout().slot_bytes != options.slot_bytes {
                    return Err(StoreError::BadOptions(
                        "the store's slots are not the pool's extent size",
                    ));
                }
                (store, Some(recovery))
            }
        };
        self.store = Some(store);
        self.changed = true;
        Ok(recovery)
    }

    fn key(&self, lba: Lba) -> ObjectKey {
        ObjectKey {
            volume: 0,
            object: lba.0 / self.extent_blocks,
            generation: 0,
        }
    }

    /// Where engine request `cmd` (pool blocks, in device blocks) goes.
    /// `io` and `tag` are kept with a write that must wait.
    pub fn resolve(&mut self, io: IoId, cmd: IoCmd, tag: (IoClass, VolKey)) -> Resolved {
        let (lba, read_blocks) = match &cmd {
            IoCmd::Flush => return Resolved::Go(cmd),
            IoCmd::Read { lba, blocks } => (*lba, Some(*blocks)),
            IoCmd::Write { lba, .. } => (*lba, None),
        };
        let key = self.key(lba);
        let within = lba.0 % self.extent_blocks;
        let Some(store) = &mut self.store else {
            // Not started: the node serves nothing before its store is open.
            return Resolved::Failed(WeirError::Busy);
        };
        if let Some(blocks) = read_blocks {
            // A read of a slot not yet durable goes too: the slot is clean
            // (zeroes) until a write lands, and no write is on it yet.
            return match store.lookup(&key) {
                Some(f) => Resolved::Go(cmd.at(Lba(f.placed.lba.0 + within))),
                None => {
                    let bytes = blocks * u64::from(store.layout().block_size);
                    match usize::try_from(bytes).ok().filter(|&b| b <= ZEROES_MAX) {
                        Some(b) => Resolved::Zeroes(bytes::Bytes::from_static(&ZEROES[..b])),
                        None => Resolved::Failed(WeirError::Device(DevError::TooLarge)),
                    }
                }
            };
        }
        // Behind an earlier held write of its extent (in order), or waiting
        // itself.
        let extent = lba.0 / self.extent_blocks;
        if !self
            .waiting
            .iter()
            .any(|w| w.extent(self.extent_blocks) == extent)
        {
            match self.place(&cmd) {
                Placing::Go(cmd) => return Resolved::Go(cmd),
                Placing::Failed(e) => return Resolved::Failed(e),
                Placing::Wait => {}
            }
        }
        if self.waiting.len() >= SLOT_WAITERS_MAX {
            return Resolved::Failed(WeirError::Busy);
        }
        self.waiting.push_back(Waiting { io, cmd, tag });
        Resolved::Held
    }

    /// The slot for write `cmd` (pool blocks): taken if the extent has none,
    /// and the write in the slot's blocks once its allocation is durable.
    fn place(&mut self, cmd: &IoCmd) -> Placing {
        let IoCmd::Write { lba, .. } = cmd else {
            unreachable!("only writes are placed")
        };
        let key = self.key(*lba);
        let within = lba.0 % self.extent_blocks;
        let store = self.store.as_mut().expect("placed once started");
        if let Some(e) = store.failed() {
            return Placing::Failed(WeirError::Device(e));
        }
        let (slot, ticket) = match store.lookup(&key) {
            Some(f) => (f.placed.lba, Ticket(f.entry.seq)),
            None => {
                match store.allocate(key, 0, 0) {
                    Ok((placed, ticket)) => {
                        self.changed = true;
                        (placed.lba, ticket)
                    }
                    // Free slots still being zeroed come back; the journal
                    // catches up: wait for either.
                    Err(StoreError::Full { zeroing }) if zeroing > 0 => return Placing::Wait,
                    Err(StoreError::Busy) => return Placing::Wait,
                    Err(e) => return Placing::Failed(refusal(e)),
                }
            }
        };
        if store.durable(ticket) {
            Placing::Go(cmd.clone().at(Lba(slot.0 + within)))
        } else {
            Placing::Wait
        }
    }

    /// The store's next device command.
    pub fn poll_op(&mut self) -> Option<StoreOp> {
        let op = self.store.as_mut()?.poll_op();
        self.changed |= op.is_some();
        op
    }

    /// A store command finished.
    pub fn complete(&mut self, id: u64, result: Result<(), DevError>) {
        if let Some(store) = &mut self.store {
            if let Err(e) = result {
                tracing::error!(
                    error = %e,
                    "a command of the device's store failed: the store takes no new \
                     extents until the node restarts, and the node reports itself unhealthy"
                );
            }
            store.complete(id, result);
            self.changed = true;
        }
    }

    /// Held writes that may go now (`Ok`, in device blocks of their slot) or
    /// never (the store failed, or has no room), in the order they came; one
    /// that must still wait holds back the later ones of its extent.
    pub fn ready(&mut self) -> Vec<Ready> {
        let mut out = Vec::new();
        if self.store.is_none() || self.waiting.is_empty() {
            return out;
        }
        let mut blocked = std::collections::BTreeSet::new();
        let mut kept = std::collections::VecDeque::new();
        for w in std::mem::take(&mut self.waiting) {
            let extent = w.extent(self.extent_blocks);
            let placing = if blocked.contains(&extent) {
                Placing::Wait
            } else {
                self.place(&w.cmd)
            };
            match placing {
                Placing::Wait => {
                    blocked.insert(extent);
                    kept.push_back(w);
                }
                Placing::Go(cmd) => out.push((w.io, Ok(cmd), w.tag)),
                Placing::Failed(e) => out.push((w.io, Err(e), w.tag)),
            }
        }
        self.waiting = kept;
        out
    }

    /// The slot of pool block `lba` (device blocks), if the extent has one
    /// here: the same block on the device.
    pub fn device_lba(&self, lba: Lba) -> Option<Lba> {
        let found = self.store.as_ref()?.lookup(&self.key(lba))?;
        Some(Lba(found.placed.lba.0 + lba.0 % self.extent_blocks))
    }

    /// Whether the store works: a store whose device failed one of its own
    /// commands takes no more slots until the node restarts, so the node
    /// must not go on as a healthy member.
    pub fn healthy(&self) -> bool {
        self.store.as_ref().is_none_or(|s| s.failed().is_none())
    }

    /// The store's counts, once started.
    pub fn usage(&self) -> Option<crate::store::Usage> {
        self.store.as_ref().map(Store::usage)
    }

    /// Assert the invariants: the store's own; held writes are bounded, and
    /// while any is held the store has work (a write never waits on a store
    /// with nothing to do). Checked where the node is between steps: after
    /// [`Slots::ready`] and [`Slots::poll_op`].
    pub fn self_check(&mut self) {
        if let Some(store) = &self.store {
            if std::mem::take(&mut self.changed) {
                store.self_check();
            }
            assert!(
                self.waiting.is_empty() || store.failed().is_some() || !store.idle(),
                "writes held by a store with nothing to do"
            );
        }
        assert!(self.waiting.len() <= SLOT_WAITERS_MAX);
    }
}

/// What the engine is told when the store refuses a new slot for good.
fn refusal(e: StoreError) -> WeirError {
    match e {
        StoreError::Failed(d) => WeirError::Device(d),
        StoreError::Full { .. } => WeirError::Device(DevError::Full),
        other => {
            tracing::error!(error = %other, "the store refused a slot");
            WeirError::Device(DevError::Full)
        }
    }
}

/// A 64-bit mixer (splitmix64's finaliser): the store's id and nonce from
/// the node's seed.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Geometry;
    use crate::io::IoClass;
    use bytes::Bytes;

    /// 1 MiB extents of 256 4 KiB blocks.
    const EXTENT: u64 = 1 << 20;
    const BLOCKS: u64 = EXTENT / 4096;

    fn geometry(bytes: u64) -> Geometry {
        Geometry {
            block_size: 4096,
            capacity_blocks: bytes / 4096,
            max_transfer_blocks: 256,
            optimal_io_blocks: 0,
            queues: 1,
            queue_depth: 32,
        }
    }

    /// Slots over a store made on a device of room for `extents` extents (its
    /// format's commands dropped: the tests play the device).
    fn slots(extents: u64) -> Slots {
        let g = geometry(device_bytes_for(extents, EXTENT));
        let (store, _) = Store::format(7, &g, store_options(EXTENT), true, 9).unwrap();
        assert_eq!(u64::from(store.layout().slots), extents);
        let mut s = Slots::new(BLOCKS);
        s.store = Some(store);
        s
    }

    fn tag() -> (IoClass, VolKey) {
        (IoClass::Foreground, Some(1))
    }

    fn write(lba: u64) -> IoCmd {
        IoCmd::Write {
            lba: Lba(lba),
            data: Bytes::from(vec![1u8; 4096]),
            fua: false,
        }
    }

    /// What the node does: let held writes go, issue the store's commands,
    /// complete them (`ok` or failed), until nothing moves; what went.
    fn drive(s: &mut Slots, ok: bool) -> Vec<Ready> {
        let mut went = Vec::new();
        loop {
            went.extend(s.ready());
            let ops: Vec<_> = std::iter::from_fn(|| s.poll_op()).collect();
            s.self_check();
            if ops.is_empty() {
                return went;
            }
            for op in ops {
                s.complete(op.id, if ok { Ok(()) } else { Err(DevError::Gone) });
            }
        }
    }

    /// Complete every command the store asks for, `ok` or failed.
    fn run_ops(s: &mut Slots, ok: bool) -> usize {
        let mut n = 0;
        while let Some(op) = s.poll_op() {
            s.complete(op.id, if ok { Ok(()) } else { Err(DevError::Gone) });
            n += 1;
        }
        n
    }

    #[test]
    fn a_read_of_an_extent_never_written_here_is_zeroes_without_the_device() {
        let mut s = slots(4);
        let r = s.resolve(
            IoId(1),
            IoCmd::Read {
                lba: Lba(BLOCKS + 3),
                blocks: 2,
            },
            tag(),
        );
        match r {
            Resolved::Zeroes(b) => assert_eq!(b, vec![0u8; 8192]),
            other => panic!("{other:?}"),
        }
        assert!(s.poll_op().is_none(), "no slot was taken");
        assert_eq!(s.device_lba(Lba(BLOCKS + 3)), None);
    }

    #[test]
    fn a_first_write_waits_for_its_slot_then_goes_to_the_slot() {
        let mut s = slots(4);
        assert!(matches!(
            s.resolve(IoId(1), write(2 * BLOCKS + 5), tag()),
            Resolved::Held
        ));
        // A second write and a read of the same extent while the slot is not
        // durable: the write waits too, the read goes (the slot is clean).
        assert!(matches!(
            s.resolve(IoId(2), write(2 * BLOCKS + 9), tag()),
            Resolved::Held
        ));
        let slot = s.device_lba(Lba(2 * BLOCKS)).expect("a slot was taken");
        match s.resolve(
            IoId(3),
            IoCmd::Read {
                lba: Lba(2 * BLOCKS + 1),
                blocks: 1,
            },
            tag(),
        ) {
            Resolved::Go(IoCmd::Read { lba, blocks: 1 }) => assert_eq!(lba.0, slot.0 + 1),
            other => panic!("{other:?}"),
        }
        assert!(s.ready().is_empty(), "nothing is durable yet");
        assert!(run_ops(&mut s, true) >= 1, "the allocation's journal page");
        let ready = s.ready();
        let lbas: Vec<_> = ready
            .iter()
            .map(|(io, cmd, _)| match cmd {
                Ok(IoCmd::Write { lba, .. }) => (io.0, lba.0),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            lbas,
            vec![(1, slot.0 + 5), (2, slot.0 + 9)],
            "in order, in the slot"
        );
        assert!(s.ready().is_empty());
        s.self_check();
        // Now durable: a write goes at once.
        match s.resolve(IoId(4), write(2 * BLOCKS + 7), tag()) {
            Resolved::Go(IoCmd::Write { lba, .. }) => assert_eq!(lba.0, slot.0 + 7),
            other => panic!("{other:?}"),
        }
        // Another extent gets another slot.
        assert!(matches!(
            s.resolve(IoId(5), write(0), tag()),
            Resolved::Held
        ));
        run_ops(&mut s, true);
        let other = s.device_lba(Lba(0)).unwrap();
        assert!(
            other.0 >= slot.0 + BLOCKS || other.0 + BLOCKS <= slot.0,
            "slots overlap"
        );
        assert_eq!(s.ready().len(), 1);
        assert_eq!(s.usage().unwrap().used, 2);
    }

    #[test]
    fn a_full_store_refuses_a_new_extent_and_a_failed_one_fails_its_waiters() {
        let mut s = slots(1);
        assert!(matches!(
            s.resolve(IoId(1), write(0), tag()),
            Resolved::Held
        ));
        match s.resolve(IoId(2), write(BLOCKS), tag()) {
            Resolved::Failed(WeirError::Device(DevError::Full)) => {}
            other => panic!("{other:?}"),
        }
        // The journal page fails: the held write can never go.
        run_ops(&mut s, false);
        match s.ready().as_slice() {
            [(IoId(1), Err(WeirError::Device(DevError::Gone)), _)] => {}
            other => panic!("{other:?}"),
        }
        // And the store takes no more slots.
        let mut s2 = slots(2);
        s2.resolve(IoId(1), write(0), tag());
        run_ops(&mut s2, false);
        s2.ready();
        match s2.resolve(IoId(2), write(BLOCKS), tag()) {
            Resolved::Failed(WeirError::Device(DevError::Gone)) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_write_waits_for_a_slot_still_being_zeroed_and_a_failed_store_is_unhealthy() {
        // Formatted over old data: every slot is dirty until zeroed.
        let g = geometry(device_bytes_for(2, EXTENT));
        let (store, _) = Store::format(7, &g, store_options(EXTENT), false, 9).unwrap();
        let mut s = Slots::new(BLOCKS);
        s.store = Some(store);
        assert!(matches!(
            s.resolve(IoId(1), write(0), tag()),
            Resolved::Held
        ));
        // Another extent's write waits too (no clean slot), but on its own.
        assert!(matches!(
            s.resolve(IoId(2), write(BLOCKS), tag()),
            Resolved::Held
        ));
        let went = drive(&mut s, true);
        let ios: Vec<_> = went.iter().map(|(io, r, _)| (io.0, r.is_ok())).collect();
        assert_eq!(ios, vec![(1, true), (2, true)], "both went, once zeroed");
        assert!(s.device_lba(Lba(0)).is_some() && s.device_lba(Lba(BLOCKS)).is_some());
        assert!(s.healthy());
        assert!(matches!(
            s.resolve(IoId(3), write(0), tag()),
            Resolved::Go(_)
        ));
        // A failed store command: the store is unhealthy.
        let mut s = slots(2);
        s.resolve(IoId(1), write(0), tag());
        run_ops(&mut s, false);
        assert!(!s.healthy(), "a store whose device failed a command");
    }

    #[test]
    fn held_writes_are_bounded() {
        let mut s = slots(2);
        for i in 0..SLOT_WAITERS_MAX as u64 {
            assert!(matches!(
                s.resolve(IoId(i), write(i % BLOCKS), tag()),
                Resolved::Held
            ));
        }
        match s.resolve(IoId(9999), write(1), tag()) {
            Resolved::Failed(WeirError::Busy) => {}
            other => panic!("{other:?}"),
        }
        run_ops(&mut s, true);
        assert_eq!(s.ready().len(), SLOT_WAITERS_MAX);
        s.self_check();
    }

    #[test]
    fn a_flush_passes_and_a_store_not_started_refuses() {
        let mut s = Slots::new(BLOCKS);
        assert!(matches!(
            s.resolve(IoId(1), IoCmd::Flush, tag()),
            Resolved::Go(IoCmd::Flush)
        ));
        assert!(matches!(
            s.resolve(IoId(2), write(0), tag()),
            Resolved::Failed(WeirError::Busy)
        ));
        assert!(s.usage().is_none());
    }

    #[test]
    fn device_bytes_for_is_the_least_that_holds_the_extents() {
        for extents in [1, 2, 64, 1000] {
            for extent in [1 << 20, 64 << 20] {
                let bytes = device_bytes_for(extents, extent);
                let layout = |b: u64| {
                    crate::store::Layout::new(0, &geometry(b), store_options(extent))
                        .map(|l| u64::from(l.slots))
                        .unwrap_or(0)
                };
                assert!(layout(bytes) >= extents, "{extents} x {extent}");
                assert!(layout(bytes - extent) < extents, "{extents} x {extent}");
                assert!(bytes < (extents + 1) * extent + NODE_JOURNAL_BYTES + (1 << 20));
            }
        }
    }
}
