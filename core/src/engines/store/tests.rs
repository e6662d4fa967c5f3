//! The store under power loss: a model disk whose volatile cache loses any
//! subset of its blocks and whose writes in flight land any subset of theirs,
//! driven by random owners' steps and crashes; after every recovery the store
//! must hold each object as it was after its last durable change or a later
//! one, and no slot may show one object another's data.

use super::journal::{decode_page, encode_page, find_chain, RECORDS_PER_PAGE};
use super::*;
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;

pub(super) fn geometry(block_size: u32, capacity_bytes: u64, max_transfer_bytes: u32) -> Geometry {
    Geometry {
        block_size,
        capacity_blocks: capacity_bytes / u64::from(block_size),
        max_transfer_blocks: max_transfer_bytes / block_size,
        optimal_io_blocks: 0,
        queues: 1,
        queue_depth: 32,
    }
}

/// A disk with a volatile cache: writes go to the cache unless FUA, a flush
/// destages what had completed when it was issued (and no more), a power loss
/// keeps a random subset of what the cache held.
pub(super) struct Disk {
    bs: usize,
    pub(super) media: Vec<u8>,
    /// Cached blocks, with the count of writes applied when the oldest write
    /// of the block not yet on media landed.
    cache: BTreeMap<u64, (Vec<u8>, u64)>,
    /// Writes applied so far: a flush issued now covers up to here.
    pub(super) clock: u64,
    /// Which cached blocks reach media, and when.
    rng: SmallRng,
}

impl Disk {
    pub(super) fn new(g: &Geometry, seed: u64) -> Disk {
        Disk {
            bs: g.block_size as usize,
            media: vec![0; (g.capacity_blocks * u64::from(g.block_size)) as usize],
            cache: BTreeMap::new(),
            clock: 0,
            rng: SmallRng::seed_from_u64(seed ^ 0xd15c),
        }
    }

    fn write_block(&mut self, lba: u64, block: &[u8], fua: bool) {
        if fua {
            self.cache.remove(&lba);
            let at = lba as usize * self.bs;
            self.media[at..at + self.bs].copy_from_slice(block);
        } else {
            self.clock += 1;
            // The version it replaces may have been destaged meanwhile: then a
            // power loss can leave the older version on media, the newer lost,
            // and the block waits for a flush only since this write. If not, it
            // still waits since its older write: a flush issued after that
            // makes the block (its newest version) durable.
            let since = match self.cache.get(&lba) {
                Some((_, first)) if !self.rng.gen_bool(0.5) => *first,
                Some((old, _)) => {
                    let at = lba as usize * self.bs;
                    self.media[at..at + self.bs].copy_from_slice(old);
                    self.clock
                }
                None => self.clock,
            };
            self.cache.insert(lba, (block.to_vec(), since));
        }
    }

    /// `cmd` issued now and done whole: a flush covers everything so far.
    pub(super) fn run(&mut self, cmd: &DevCommand) {
        self.apply(cmd, None);
        if matches!(cmd, DevCommand::Flush) {
            self.flush(self.clock);
        }
    }

    /// A flush issued when the clock read `issued` completes: what had landed
    /// in the cache by then is on media.
    pub(super) fn flush(&mut self, issued: u64) {
        let bs = self.bs;
        let media = &mut self.media;
        self.cache.retain(|&lba, (b, at)| {
            if *at > issued {
                return true;
            }
            let off = lba as usize * bs;
            media[off..off + bs].copy_from_slice(b);
            false
        });
    }

    /// Apply `cmd` whole, or (`torn`) only a random subset of its blocks.
    pub(super) fn apply(&mut self, cmd: &DevCommand, torn: Option<&mut SmallRng>) {
        let mut torn = torn;
        let keep = |rng: &mut Option<&mut SmallRng>| rng.as_mut().is_none_or(|r| r.gen_bool(0.5));
        match cmd {
            DevCommand::Write { lba, data, fua } => {
                for (i, b) in data.chunks(self.bs).enumerate() {
                    if keep(&mut torn) {
                        self.write_block(lba.0 + i as u64, b, *fua);
                    }
                }
            }
            DevCommand::WriteZeroes { lba, blocks } => {
                let zero = vec![0u8; self.bs];
                for i in 0..*blocks {
                    if keep(&mut torn) {
                        self.write_block(lba.0 + i, &zero, false);
                    }
                }
            }
            // A flush is applied by `flush`, with the clock it was issued at.
            DevCommand::Flush => {}
            other => panic!("the store issued {other:?}"),
        }
    }

    pub(super) fn power_loss(&mut self, rng: &mut SmallRng) {
        for (lba, (b, _)) in std::mem::take(&mut self.cache) {
            if rng.gen_bool(0.5) {
                let at = lba as usize * self.bs;
                self.media[at..at + self.bs].copy_from_slice(&b);
            }
        }
    }

    pub(super) fn read(&self, off: u64, len: u64) -> Vec<u8> {
        let mut out = self.media[off as usize..(off + len) as usize].to_vec();
        for (i, chunk) in out.chunks_mut(self.bs).enumerate() {
            let lba = off / self.bs as u64 + i as u64;
            if let Some((b, _)) = self.cache.get(&lba) {
                chunk.copy_from_slice(b);
            }
        }
        out
    }

    pub(super) fn open(&self, g: &Geometry, nonce: u64) -> Result<(Store, Recovery), StoreError> {
        let sb = self.read(0, PAGE_BYTES);
        let layout = Layout::decode(&sb, g)?;
        let table = self.read(layout.table_off, layout.table_bytes());
        let ring = self.read(layout.journal_off, layout.journal_pages * PAGE_BYTES);
        Store::recover(g, &sb, &table, &ring, nonce)
    }
}

/// The bytes an object writes into block `i` of its slot: its key and `i`,
/// never zero.
fn pattern(key: &ObjectKey, i: u64, bs: usize) -> Vec<u8> {
    let seed = key.volume * 1_000_003 + key.object * 7919 + u64::from(key.generation) * 31 + i;
    (0..bs)
        .map(|j| ((seed as usize + j) % 251) as u8 + 1)
        .collect()
}

/// What an object's entry has been: (ticket, present in slot with version and
/// fill), oldest first.
type History = Vec<(u64, Option<(u32, u64, u64)>)>;

pub(super) struct Run {
    g: Geometry,
    pub(super) disk: Disk,
    pub(super) store: Store,
    rng: SmallRng,
    /// Store ops issued, not completed.
    in_flight: Vec<(StoreOp, u64)>,
    /// Data writes issued by owners, not completed: (object, command).
    data: Vec<(ObjectKey, DevCommand)>,
    /// Data writes completed, and those a flush made durable: (slot, block).
    written: Vec<(ObjectKey, u32, u64, u64)>,
    durable: BTreeMap<ObjectKey, BTreeSet<(u32, u64)>>,
    history: BTreeMap<ObjectKey, History>,
    /// Keys an owner may use.
    keys: Vec<ObjectKey>,
    crashes: u64,
    checked_objects: u64,
    checked_blocks: u64,
}

impl Run {
    pub(super) fn new(seed: u64, g: Geometry, options: StoreOptions) -> Run {
        let mut disk = Disk::new(&g, seed);
        // Old contents: a device reused, never zeroed by the store.
        disk.media
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i % 7) as u8 + 9);
        let (store, cmds) =
            Store::format(0xfeed ^ u128::from(seed), &g, options, false, seed).expect("format");
        for c in cmds {
            disk.run(&c);
        }
        let keys = (0..64)
            .map(|i| ObjectKey {
                volume: i % 3,
                object: i / 3,
                generation: (i % 2) as u32,
            })
            .collect();
        Run {
            g,
            disk,
            store,
            rng: SmallRng::seed_from_u64(seed),
            in_flight: Vec::new(),
            data: Vec::new(),
            written: Vec::new(),
            durable: BTreeMap::new(),
            history: BTreeMap::new(),
            keys,
            crashes: 0,
            checked_objects: 0,
            checked_blocks: 0,
        }
    }

    fn note(&mut self, key: ObjectKey, ticket: Ticket) {
        let now = self
            .store
            .lookup(&key)
            .map(|f| (f.placed.slot, f.entry.version, f.entry.fill));
        self.history.entry(key).or_default().push((ticket.0, now));
    }

    pub(super) fn step(&mut self) {
        let key = self.keys[self.rng.gen_range(0..self.keys.len())];
        match self.rng.gen_range(0..100) {
            0..=14 => match self
                .store
                .allocate(key, self.rng.gen(), self.rng.gen_range(0..1000))
            {
                Ok((placed, t)) => {
                    // A slot comes back only zeroed, after the release was durable.
                    if let Some(blocks) = self.durable.get_mut(&key) {
                        blocks.retain(|&(s, _)| s != placed.slot);
                    }
                    self.note(key, t)
                }
                Err(StoreError::Exists | StoreError::Full { .. } | StoreError::Busy) => {}
                Err(e) => panic!("allocate: {e}"),
            },
            15..=24 => match self.store.update(
                &key,
                self.rng.gen_range(0..2000),
                1 << self.rng.gen_range(0..64),
            ) {
                Ok(t) => self.note(key, t),
                Err(StoreError::NotFound | StoreError::Busy) => {}
                Err(e) => panic!("update: {e}"),
            },
            25..=31 => {
                if self.data.iter().any(|(k, _)| *k == key) {
                    return; // the owner's rule: nothing in flight to a released slot
                }
                match self.store.release(&key) {
                    Ok(t) => {
                        self.note(key, t);
                        self.written.retain(|w| w.0 != key);
                    }
                    Err(StoreError::NotFound | StoreError::Busy) => {}
                    Err(e) => panic!("release: {e}"),
                }
            }
            32..=49 => {
                // An owner writes data once the allocation is durable.
                if let Some(f) = self.store.lookup(&key).filter(|f| f.durable) {
                    let i = self.rng.gen_range(0..f.placed.blocks);
                    let data = Bytes::from(pattern(&key, i, self.disk.bs));
                    self.data.push((
                        key,
                        DevCommand::Write {
                            lba: Lba(f.placed.lba.0 + i),
                            data,
                            fua: false,
                        },
                    ));
                }
            }
            50..=54 => self.store.checkpoint(),
            55..=94 => {
                while let Some(op) = self.store.poll_op() {
                    self.in_flight.push((op, self.disk.clock));
                }
                let n = self.in_flight.len() + self.data.len();
                if n > 0 {
                    let i = self.rng.gen_range(0..n);
                    if i < self.in_flight.len() {
                        let (op, issued) = self.in_flight.swap_remove(i);
                        self.disk.apply(&op.cmd, None);
                        if matches!(op.cmd, DevCommand::Flush) {
                            self.flushed(issued);
                        }
                        self.store.complete(op.id, Ok(()));
                    } else {
                        let (key, cmd) = self.data.swap_remove(i - self.in_flight.len());
                        self.disk.apply(&cmd, None);
                        let f = self
                            .store
                            .lookup(&key)
                            .expect("an object with data in flight is never released");
                        let DevCommand::Write { lba, .. } = cmd else {
                            unreachable!()
                        };
                        let block = lba.0 - f.placed.lba.0;
                        self.written
                            .push((key, f.placed.slot, block, self.disk.clock));
                    }
                }
                self.store.self_check();
            }
            95..=96 => self.flushed(self.disk.clock),
            97 => {
                // A burst: more changes than a journal page holds.
                for _ in 0..2 * RECORDS_PER_PAGE {
                    let k = self.keys[self.rng.gen_range(0..self.keys.len())];
                    if let Ok(t) = self.store.update(&k, self.rng.gen_range(0..2000), 1) {
                        self.note(k, t);
                    }
                }
            }
            98 => self.crash(false),
            _ => self.crash(true),
        }
    }

    /// A flush issued at clock `issued` completed: the data writes that had
    /// landed by then are durable.
    fn flushed(&mut self, issued: u64) {
        self.disk.flush(issued);
        let durable = &mut self.durable;
        self.written.retain(|&(key, slot, block, at)| {
            if at > issued {
                return true;
            }
            durable.entry(key).or_default().insert((slot, block));
            false
        });
    }

    /// The store's process dies, and (`power`) the device loses power: then
    /// writes in flight land any subset of their blocks, and the cache any
    /// subset of its own. Without a power loss the device finishes what it
    /// took and keeps its cache, which the next open reads.
    fn crash(&mut self, power: bool) {
        self.crashes += 1;
        let done_tickets = self.store.done_seq;
        let mut torn = power.then_some(&mut self.rng);
        for (op, _) in std::mem::take(&mut self.in_flight) {
            self.disk.apply(&op.cmd, torn.as_deref_mut());
        }
        for (_, cmd) in std::mem::take(&mut self.data) {
            self.disk.apply(&cmd, torn.as_deref_mut());
        }
        if power {
            self.disk.power_loss(&mut self.rng);
        }
        let (store, found) = match self.disk.open(&self.g, self.rng.gen()) {
            Ok(x) => x,
            Err(e) => {
                let l = *self.store.layout();
                let ring = self.disk.read(l.journal_off, l.journal_pages * PAGE_BYTES);
                for i in 0..l.journal_pages as usize {
                    let p = decode_page(l.uuid, l.slots, &ring[i * 4096..(i + 1) * 4096]);
                    eprintln!(
                        "page {i}: {:?}",
                        p.map(|p| (p.seq, p.start, p.records.len()))
                    );
                }
                eprintln!(
                    "store: next {} done {} start {}",
                    self.store.next_seq,
                    self.store.done_seq,
                    self.store.start()
                );
                panic!("a store always reopens after power loss: {e}");
            }
        };
        self.store = store;
        // Every object as it was after its last durable change, or a later one.
        for (key, history) in &mut self.history {
            let durable = history.iter().rposition(|&(t, _)| t <= done_tickets);
            let got = self
                .store
                .lookup(key)
                .map(|f| (f.placed.slot, f.entry.version, f.entry.fill));
            let allowed: Vec<_> = match durable {
                Some(d) => history[d..].iter().map(|&(_, s)| s).collect(),
                None => std::iter::once(None)
                    .chain(history.iter().map(|&(_, s)| s))
                    .collect(),
            };
            assert!(
                allowed.contains(&got),
                "{key:?} recovered as {got:?}; durable through page {done_tickets}, history {history:?}; {found:?}"
            );
            // From now on the recovered state is the object's only state.
            history.clear();
            history.push((0, got));
        }
        // Durable data of every object still there is intact.
        self.written.clear();
        let durable = std::mem::take(&mut self.durable);
        for (key, blocks) in durable {
            let Some(f) = self.store.lookup(&key) else {
                continue;
            };
            let layout = *self.store.layout();
            let blocks: BTreeSet<_> = blocks
                .into_iter()
                .filter(|&(s, _)| s == f.placed.slot)
                .collect();
            for &(s, i) in &blocks {
                let got = self.disk.read(
                    layout.slot_off(s) + i * self.disk.bs as u64,
                    self.disk.bs as u64,
                );
                assert_eq!(
                    got,
                    pattern(&key, i, self.disk.bs),
                    "{key:?}: durable block {i} of slot {s} lost"
                );
                self.checked_blocks += 1;
            }
            self.durable.insert(key, blocks);
        }
        // No slot shows an object data of another, and free clean slots read zero.
        let layout = *self.store.layout();
        for s in 0..layout.slots {
            let bytes = self.disk.read(layout.slot_off(s), layout.slot_bytes);
            let e = self.store.entries[s as usize];
            for (i, block) in bytes.chunks(self.disk.bs).enumerate() {
                let zero = block.iter().all(|&b| b == 0);
                match e.state {
                    SlotState::Clean => assert!(zero, "clean slot {s} block {i} holds data"),
                    SlotState::Used => {
                        assert!(
                            zero || block == pattern(&e.key, i as u64, self.disk.bs),
                            "slot {s} of {:?} block {i} holds another's data",
                            e.key
                        );
                        self.checked_objects += 1;
                    }
                    SlotState::Dirty => {}
                }
            }
        }
    }

    /// Run every op to the end, then check the store is idle.
    fn settle(&mut self) {
        for _ in 0..10_000 {
            while let Some(op) = self.store.poll_op() {
                self.in_flight.push((op, self.disk.clock));
            }
            let Some((op, issued)) = self.in_flight.pop() else {
                break;
            };
            self.disk.apply(&op.cmd, None);
            if matches!(op.cmd, DevCommand::Flush) {
                self.disk.flush(issued);
            }
            self.store.complete(op.id, Ok(()));
        }
        assert!(self.store.idle(), "the store does not settle");
    }
}

pub(super) fn small(block_size: u32) -> (Geometry, StoreOptions) {
    // 80 slots of 8 KiB (a table of two pages) for 64 objects, a journal of 4
    // pages (it wraps often), 4 KiB transfers.
    let options = StoreOptions {
        slot_bytes: 8 << 10,
        journal_bytes: 4 * PAGE_BYTES,
    };
    (
        geometry(block_size, PAGE_BYTES * 8 + 80 * (8 << 10), 4096),
        options,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn power_loss_keeps_every_durable_change_and_leaks_nothing(seed in any::<u64>(), bs in prop_oneof![Just(512u32), Just(4096u32)]) {
        let (g, options) = small(bs);
        let mut run = Run::new(seed, g, options);
        assert_eq!(run.store.layout().slots, 80);
        for _ in 0..3000 {
            run.step();
        }
        run.crash(true);
        prop_assert!(run.crashes >= 2);
        prop_assert!(run.checked_objects > 0);
        prop_assert!(run.checked_blocks > 0);
        run.settle();
    }
}

#[test]
fn a_settled_store_reopens_exactly_with_an_empty_replay() {
    let (g, options) = small(512);
    let mut run = Run::new(7, g, options);
    for _ in 0..2000 {
        run.step();
    }
    run.settle();
    run.store.checkpoint();
    run.settle();
    let before: Vec<_> = run
        .store
        .index
        .iter()
        .map(|(k, &s)| (*k, s, run.store.entries[s as usize]))
        .collect();
    let usage = run.store.usage();
    let (store, found) = run.disk.open(&g, 101).expect("reopen");
    let after: Vec<_> = store
        .index
        .iter()
        .map(|(k, &s)| (*k, s, store.entries[s as usize]))
        .collect();
    assert_eq!(before, after);
    assert_eq!(found.applied, 0, "a checkpointed store replays nothing new");
    assert_eq!(found.pages, 1, "only the page that carries the start");
    assert_eq!(store.usage().used, usage.used);
    assert_eq!(store.usage().clean, usage.clean);
    assert_eq!(usage.dirty, 0, "every released slot was zeroed");
}

#[test]
fn a_full_store_refuses_and_gets_space_back_once_zeroed() {
    let (g, options) = small(4096);
    let (mut store, _) = Store::format(1, &g, options, true, 1).expect("format");
    let key = |i| ObjectKey {
        volume: 1,
        object: i,
        generation: 0,
    };
    for i in 0..80 {
        store.allocate(key(i), 0, 0).expect("room");
    }
    assert_eq!(
        store.allocate(key(80), 0, 0),
        Err(StoreError::Full { zeroing: 0 })
    );
    assert_eq!(store.allocate(key(0), 0, 0), Err(StoreError::Exists));
    store.release(&key(3)).expect("release");
    assert_eq!(
        store.allocate(key(80), 0, 0),
        Err(StoreError::Full { zeroing: 1 })
    );
    let mut ops = 0;
    while let Some(op) = store.poll_op() {
        ops += 1;
        store.complete(op.id, Ok(()));
    }
    // Journal pages, then two zeroing commands (8 KiB slot, 4 KiB transfers), a flush.
    assert!(ops >= 4, "{ops} ops");
    let (placed, _) = store.allocate(key(80), 0, 0).expect("the zeroed slot");
    assert_eq!(placed.slot, 3);
    store.self_check();
}

#[test]
fn changes_past_the_queue_bound_are_refused_until_the_journal_catches_up() {
    let g = geometry(4096, 256 << 20, 1 << 20);
    let options = StoreOptions {
        slot_bytes: 4096,
        journal_bytes: 0,
    };
    let (mut store, _) = Store::format(2, &g, options, true, 2).expect("format");
    for i in 0..MAX_QUEUED as u64 {
        store
            .allocate(
                ObjectKey {
                    volume: 0,
                    object: i,
                    generation: 0,
                },
                0,
                0,
            )
            .expect("room");
    }
    let next = ObjectKey {
        volume: 0,
        object: u64::MAX,
        generation: 0,
    };
    assert_eq!(store.allocate(next, 0, 0), Err(StoreError::Busy));
    let op = store.poll_op().expect("a journal page");
    store.complete(op.id, Ok(()));
    store.allocate(next, 0, 0).expect("room in the queue again");
}

#[test]
fn a_failed_journal_write_fails_the_store() {
    let (g, options) = small(4096);
    let (mut store, _) = Store::format(3, &g, options, true, 3).expect("format");
    let key = ObjectKey::default();
    let (_, t) = store.allocate(key, 0, 0).expect("room");
    let op = store.poll_op().expect("a page");
    store.complete(op.id, Err(DevError::Media(Lba(1))));
    assert!(!store.durable(t));
    assert_eq!(
        store.update(&key, 1, 1),
        Err(StoreError::Failed(DevError::Media(Lba(1))))
    );
    assert!(store.poll_op().is_none());
}

#[test]
fn superblock_checks_refuse_what_is_not_this_store() {
    let g = geometry(4096, 2 << 30, 1 << 20);
    let layout = Layout::new(9, &g, StoreOptions::default()).expect("layout");
    // 2 GiB: a 2 MiB journal, 4 MiB slots from a 1 MiB boundary.
    assert_eq!(
        layout.journal_pages * PAGE_BYTES,
        (2u64 << 30) / 1000 / PAGE_BYTES * PAGE_BYTES
    );
    assert!(layout.data_off.is_multiple_of(1 << 20));
    assert_eq!(layout.slots, 511);
    let page = layout.encode();
    assert_eq!(Layout::decode(&page, &g), Ok(layout));
    assert_eq!(
        Layout::decode(&vec![0; 4096], &g),
        Err(StoreError::NotAStore)
    );
    let mut other = page.clone();
    other[8..12].copy_from_slice(&2u32.to_le_bytes());
    let err = Layout::decode(&other, &g).expect_err("format 2");
    assert_eq!(
        err,
        StoreError::WrongFormat {
            found: 2,
            expected: STORE_FORMAT
        }
    );
    assert_eq!(
        err.to_string(),
        "the store is format 2; this weir reads format 1"
    );
    let mut flipped = page.clone();
    flipped[40] ^= 1;
    assert_eq!(
        Layout::decode(&flipped, &g),
        Err(StoreError::Corrupt("the superblock's checksum"))
    );
    let smaller = geometry(4096, 1 << 30, 1 << 20);
    assert!(matches!(
        Layout::decode(&page, &smaller),
        Err(StoreError::Corrupt(_))
    ));
    assert!(matches!(
        Layout::new(9, &geometry(4096, 1 << 20, 4096), StoreOptions::default()),
        Err(StoreError::BadOptions(_))
    ));
}

#[test]
fn journal_pages_round_trip_and_a_torn_one_ends_the_run() {
    let uuid = 5;
    let e = |seq| Entry {
        state: SlotState::Used,
        key: ObjectKey {
            volume: 1,
            object: seq,
            generation: 0,
        },
        seq,
        version: 3,
        fill: 1,
    };
    let records: Vec<(u32, Entry)> = (0..RECORDS_PER_PAGE as u32).map(|s| (s, e(7))).collect();
    let page = encode_page(uuid, 1, 7, 5, &records);
    let back = decode_page(uuid, 1000, &page).expect("decodes");
    assert_eq!((back.seq, back.start, back.records), (7, 5, records));
    assert!(
        decode_page(uuid + 1, 1000, &page).is_none(),
        "another store's page"
    );
    assert!(
        decode_page(uuid, 10, &page).is_none(),
        "a slot past the table"
    );
    // A ring of 4: pages 5..=8; page 8 torn (its second half old).
    let mut ring = vec![0u8; 4 * PAGE_BYTES as usize];
    for seq in 5..=8u64 {
        let p = encode_page(uuid, 1, seq, if seq == 8 { 6 } else { 5 }, &[(0, e(seq))]);
        let at = (seq % 4 * PAGE_BYTES) as usize;
        ring[at..at + PAGE_BYTES as usize].copy_from_slice(&p);
    }
    assert_eq!(find_chain(uuid, 1000, &ring).expect("whole").last, 8);
    // Page 8 sits at index 8 % 4 = 0.
    let at = 2048;
    ring[at..at + 2048].fill(0xAA);
    let chain = find_chain(uuid, 1000, &ring).expect("whole up to 7");
    assert_eq!((chain.start, chain.last, chain.pages.len()), (5, 7, 3));
    assert_eq!(
        find_chain(uuid, 1000, &vec![0; 4 * PAGE_BYTES as usize]),
        Some(Default::default())
    );
}

#[test]
fn memory_per_tib_stays_in_budget() {
    // A 1 TiB device of 4 MiB slots, every slot used.
    let g = geometry(4096, 1 << 40, 1 << 20);
    let (mut store, _) = Store::format(4, &g, StoreOptions::default(), true, 4).expect("format");
    let slots = store.layout().slots;
    for i in 0..u64::from(slots) {
        if store.allocate(
            ObjectKey {
                volume: 1,
                object: i,
                generation: 0,
            },
            !0,
            1,
        ) == Err(StoreError::Busy)
        {
            while let Some(op) = store.poll_op() {
                store.complete(op.id, Ok(()));
            }
            store
                .allocate(
                    ObjectKey {
                        volume: 1,
                        object: i,
                        generation: 0,
                    },
                    !0,
                    1,
                )
                .expect("room");
        }
    }
    let usage = store.usage();
    assert_eq!(usage.used, slots);
    let mib = usage.memory_bytes as f64 / f64::from(1 << 20);
    // The budget the issue sets for a node is 64 MiB per TiB, versions and all.
    assert!(mib < 32.0, "{mib:.1} MiB for a full TiB");
}
