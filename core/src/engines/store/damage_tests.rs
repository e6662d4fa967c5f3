//! The store given damage: a table with an object in two slots and an entry
//! that does not check, crafted journal pages, and random bytes flipped in the
//! superblock, table and journal. Recovery frees what damage left, for good,
//! and never panics, overflows or stalls.

use super::journal::{decode_page, encode_page, MAX_SEQ};
use super::tests::{small, Disk, Run};
use super::*;
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::collections::VecDeque;

/// A formatted store on a model disk with object `k` in slot 0, written back.
fn store_with_one_object(g: &Geometry, options: StoreOptions, k: ObjectKey) -> Disk {
    let mut disk = Disk::new(g, 1);
    let (mut store, cmds) = Store::format(11, g, options, true, 11).expect("format");
    for c in cmds {
        disk.run(&c);
    }
    store.allocate(k, 1, 5).expect("room");
    store.checkpoint();
    while let Some(op) = store.poll_op() {
        disk.run(&op.cmd);
        store.complete(op.id, Ok(()));
    }
    assert!(store.idle());
    disk
}

#[test]
fn recovery_frees_a_second_slot_and_a_damaged_entry_for_good() {
    let (g, options) = small(4096);
    let k = ObjectKey {
        volume: 3,
        object: 4,
        generation: 0,
    };
    let mut disk = store_with_one_object(&g, options, k);
    let layout = disk.open(&g, 102).expect("open").0.layout;
    assert_eq!(
        disk.open(&g, 103)
            .expect("open")
            .0
            .lookup(&k)
            .map(|f| f.placed.slot),
        Some(0)
    );
    // Damage: slot 1 claims the same object (older), slot 2 is garbage.
    let twin = Entry {
        state: SlotState::Used,
        key: k,
        seq: 0,
        version: 1,
        fill: 1,
    };
    let at = (layout.table_off + ENTRY_BYTES) as usize;
    twin.encode(1, &mut disk.media[at..at + ENTRY_BYTES as usize]);
    disk.media[at + 64..at + 128].fill(0x5a);
    let (mut store, found) = disk.open(&g, 104).expect("open");
    assert_eq!((found.duplicates, found.corrupt), (1, 1), "{found:?}");
    assert_eq!(store.lookup(&k).map(|f| f.placed.slot), Some(0));
    // The fixes are journaled and the slots zeroed; a power loss then (no
    // checkpoint) must not bring the twin back.
    let mut rng = SmallRng::seed_from_u64(3);
    while let Some(op) = store.poll_op() {
        disk.run(&op.cmd);
        store.complete(op.id, Ok(()));
    }
    assert_eq!(store.usage().dirty, 0);
    disk.power_loss(&mut rng);
    let (store, found) = disk.open(&g, 105).expect("open");
    assert_eq!((found.duplicates, found.corrupt), (0, 0), "{found:?}");
    assert_eq!(store.lookup(&k).map(|f| f.placed.slot), Some(0));
    assert_eq!(store.usage().used, 1);
}

#[test]
fn crafted_journal_pages_cannot_overflow_or_stall_the_store() {
    let (g, options) = small(4096);
    let k = ObjectKey {
        volume: 1,
        object: 1,
        generation: 0,
    };
    let disk = store_with_one_object(&g, options, k);
    let (store, _) = disk.open(&g, 106).expect("open");
    let l = store.layout;
    let sb = disk.read(0, PAGE_BYTES);
    let table = disk.read(l.table_off, l.table_bytes());
    let e = |seq| Entry {
        state: SlotState::Used,
        key: k,
        seq,
        version: 0,
        fill: 0,
    };
    let ring_of = |pages: &[(u64, u64)]| {
        let mut ring = vec![0u8; (l.journal_pages * PAGE_BYTES) as usize];
        for &(seq, start) in pages {
            let at = (seq % l.journal_pages * PAGE_BYTES) as usize;
            ring[at..at + PAGE_BYTES as usize].copy_from_slice(&encode_page(
                l.uuid,
                5,
                seq,
                start,
                &[(0, e(seq))],
            ));
        }
        ring
    };
    // Page numbers at the top of the range are refused, so none can overflow.
    let top = ring_of(&[(MAX_SEQ, MAX_SEQ)]);
    assert!(decode_page(l.uuid, l.slots, &top[(MAX_SEQ % 4 * PAGE_BYTES) as usize..]).is_none());
    let near_end = Store::recover(&g, &sb, &table, &ring_of(&[(MAX_SEQ - 1, MAX_SEQ - 1)]), 7);
    assert!(
        matches!(near_end, Err(StoreError::Corrupt(_))),
        "a journal near its end is damage"
    );
    let high = MAX_SEQ - (1 << 32) - 1;
    let (mut store, _) =
        Store::recover(&g, &sb, &table, &ring_of(&[(high, high)]), 7).expect("recovers");
    store.update(&k, 9, 0).expect("takes a change");
    assert!(
        store.poll_op().is_some(),
        "a journal page can still be written"
    );
    // A run as long as the ring the store never writes (it keeps a place for
    // a page that carries a newer start): its last page lies past the run the
    // store could have written, so the journal is damaged.
    let full = Store::recover(
        &g,
        &sb,
        &table,
        &ring_of(&[(1, 1), (2, 1), (3, 1), (4, 1)]),
        8,
    );
    assert!(matches!(full, Err(StoreError::Corrupt(_))));
    // The longest run it writes leaves one place, which only a page that
    // carries a newer start may take: the store sweeps, then moves on.
    let (mut longest, _) =
        Store::recover(&g, &sb, &table, &ring_of(&[(1, 1), (2, 1), (3, 1)]), 8).expect("recovers");
    assert_eq!(longest.done_seq, 3);
    longest.update(&k, 9, 0).expect("takes a change");
    let mut pages = 0;
    while let Some(op) = longest.poll_op() {
        pages += u64::from(matches!(op.cmd, DevCommand::Write { fua: true, .. }));
        longest.complete(op.id, Ok(()));
    }
    assert!(pages >= 1 && longest.idle(), "the store moves on");
}

#[test]
fn a_table_ahead_of_its_journal_is_refused_not_freed() {
    let (g, options) = small(4096);
    let k = ObjectKey {
        volume: 2,
        object: 2,
        generation: 0,
    };
    let mut disk = store_with_one_object(&g, options, k);
    let (store, _) = disk.open(&g, 120).expect("open");
    let l = store.layout;
    // The journal lost: every table entry past it would be freed and zeroed.
    let ring = l.journal_off as usize..(l.journal_off + l.journal_pages * PAGE_BYTES) as usize;
    disk.media[ring].fill(0);
    assert_eq!(
        disk.open(&g, 121).err(),
        Some(StoreError::Corrupt("the table is ahead of the journal"))
    );
}

#[test]
fn a_format_cut_short_leaves_no_store() {
    let (g, options) = small(512);
    let k = ObjectKey::default();
    for cut in 1..6 {
        let mut disk = store_with_one_object(&g, options, k);
        let (_, cmds) = Store::format(77, &g, options, false, 77).expect("format");
        let cmds: Vec<DevCommand> = cmds.collect();
        let mut rng = SmallRng::seed_from_u64(cut);
        for c in &cmds[..cut as usize] {
            disk.apply(c, None);
        }
        disk.power_loss(&mut rng);
        assert_eq!(
            disk.open(&g, 122).err(),
            Some(StoreError::NotAStore),
            "cut after {cut}"
        );
    }
}

#[test]
fn a_zeroed_slot_comes_back_while_other_slots_are_still_being_zeroed() {
    // 64 KiB slots zeroed by 4 KiB commands: 16 a slot.
    let options = StoreOptions {
        slot_bytes: 64 << 10,
        journal_bytes: 4 * PAGE_BYTES,
    };
    let g = super::tests::geometry(4096, PAGE_BYTES * 8 + 32 * (64 << 10), 4096);
    let (mut store, _) = Store::format(5, &g, options, true, 5).expect("format");
    let key = |i| ObjectKey {
        volume: 1,
        object: i,
        generation: 0,
    };
    let slots = u64::from(store.layout().slots);
    for i in 0..slots {
        store.allocate(key(i), 0, 0).expect("room");
    }
    for i in 0..slots {
        store.release(&key(i)).expect("release");
    }
    let mut in_flight = VecDeque::new();
    let mut back_early = false;
    for _ in 0..100_000 {
        while let Some(op) = store.poll_op() {
            in_flight.push_back(op);
        }
        let Some(op) = in_flight.pop_front() else {
            break;
        };
        store.complete(op.id, Ok(()));
        if store.usage().clean > 0 && store.usage().dirty > 4 {
            back_early = true;
            break;
        }
    }
    assert!(back_early, "no slot came back until all were zeroed");
}

#[test]
fn a_clean_shutdown_does_not_wait_for_background_zeroing() {
    // Formatted over old data: every slot dirty, zeroed in the background.
    let (g, options) = small(4096);
    let mut disk = Disk::new(&g, 9);
    let (mut store, cmds) = Store::format(12, &g, options, false, 12).expect("format");
    for c in cmds {
        disk.run(&c);
    }
    let slots = store.layout().slots;
    let key = ObjectKey::default();
    assert!(matches!(
        store.allocate(key, 0, 0),
        Err(StoreError::Full { .. })
    ));
    // Zero a few, then shut down: no slot starts being zeroed after that.
    let mut issued = 0;
    while issued < 6 {
        let op = store.poll_op().expect("zeroing");
        disk.run(&op.cmd);
        store.complete(op.id, Ok(()));
        issued += 1;
    }
    store.shutdown();
    let mut ops = 0;
    while let Some(op) = store.poll_op() {
        ops += 1;
        disk.run(&op.cmd);
        store.complete(op.id, Ok(()));
    }
    assert!(store.idle());
    let usage = store.usage();
    assert!(usage.dirty > slots / 2, "{usage:?} after {ops} ops");
    // The next open zeroes the rest, and what was clean stays clean.
    let (mut reopened, _) = disk.open(&g, 123).expect("open");
    assert_eq!(reopened.usage().clean, usage.clean);
    reopened
        .allocate(key, 0, 0)
        .expect("a slot zeroed before the shutdown");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn a_damaged_store_opens_or_is_refused_never_panics(seed in any::<u64>(), flips in proptest::collection::vec((0usize..3, any::<u32>(), any::<u8>()), 1..40)) {
        let (g, options) = small(512);
        let mut run = Run::new(seed, g, options);
        for _ in 0..400 {
            run.step();
        }
        let l = *run.store.layout();
        let mut parts = [
            run.disk.read(0, PAGE_BYTES),
            run.disk.read(l.table_off, l.table_bytes()),
            run.disk.read(l.journal_off, l.journal_pages * PAGE_BYTES),
        ];
        for (part, at, x) in flips {
            let p = &mut parts[part];
            let i = at as usize % p.len();
            p[i] ^= x.max(1);
        }
        // Ok (and then its invariants hold: recover checks them) or a typed error.
        if let Ok((mut store, _)) = Store::recover(&g, &parts[0], &parts[1], &parts[2], 9) {
            // And it runs: everything it asks for, to idle.
            for _ in 0..100_000 {
                let Some(op) = store.poll_op() else { break };
                store.complete(op.id, Ok(()));
            }
            prop_assert!(store.idle());
        }
    }
}
