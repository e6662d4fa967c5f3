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

/// A formatted store on a model disk with object `k` in slot 0, written back.
fn store_with_one_object(g: &Geometry, options: StoreOptions, k: ObjectKey) -> Disk {
    let mut disk = Disk::new(g, 1);
    let (mut store, cmds) = Store::format(11, g, options, true, 11).expect("format");
    for c in cmds {
        disk.apply(&c, None);
    }
    disk.flush(disk.clock);
    store.allocate(k, 1, 5).expect("room");
    store.checkpoint();
    while let Some(op) = store.poll_op() {
        disk.apply(&op.cmd, None);
        if matches!(op.cmd, DevCommand::Flush) {
            disk.flush(disk.clock);
        }
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
        disk.apply(&op.cmd, None);
        if matches!(op.cmd, DevCommand::Flush) {
            disk.flush(disk.clock);
        }
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
    let (mut high, _) = Store::recover(&g, &sb, &table, &ring_of(&[(MAX_SEQ - 1, MAX_SEQ - 1)]), 7)
        .expect("recovers");
    assert_eq!(high.next_seq, MAX_SEQ);
    high.update(&k, 9, 0).expect("takes a change");
    assert!(
        high.poll_op().is_some(),
        "a journal page can still be written"
    );
    // A run as long as the ring would leave no room: the store takes the
    // longest run it could have written.
    let (mut full, _) = Store::recover(
        &g,
        &sb,
        &table,
        &ring_of(&[(1, 1), (2, 1), (3, 1), (4, 1)]),
        8,
    )
    .expect("recovers");
    assert_eq!(full.done_seq, 3);
    full.update(&k, 9, 0).expect("takes a change");
    let mut pages = 0;
    while let Some(op) = full.poll_op() {
        pages += u64::from(matches!(op.cmd, DevCommand::Write { fua: true, .. }));
        full.complete(op.id, Ok(()));
    }
    assert!(pages >= 1 && full.idle(), "the store moves on");
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
        let _ = Store::recover(&g, &parts[0], &parts[1], &parts[2], 9);
    }
}
