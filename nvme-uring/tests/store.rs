//! A device's store on a real file through io_uring: formatted, filled,
//! released, closed and opened again, its objects and their data where they
//! were and its released slots zeroed. (Power loss is the store's own property
//! test, against a model disk.) Real I/O: never built for the simulator.
#![cfg(not(madsim))]

use bytes::Bytes;
use std::path::Path;
use weir_core::device::{BlockDevice, DevCommand, DevCompletion};
use weir_core::ids::Lba;
use weir_core::node::store_io;
use weir_core::store::{ObjectKey, StoreError, StoreOptions};
use weir_core::BufPool;
use weir_nvme_uring::{UringDevice, UringOptions};

const MIB: u64 = 1 << 20;

async fn read(dev: &UringDevice, lba: Lba, len: usize) -> Vec<u8> {
    let buf = BufPool::new(len).alloc(len).unwrap();
    match dev.submit(0, DevCommand::Read { lba, buf }).await.unwrap() {
        DevCompletion::Read(buf) => buf.as_ref().to_vec(),
        DevCompletion::Done => panic!("a read completes with its buffer"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_on_a_file_reopens_with_its_objects_and_zeroed_free_slots() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("weir-store");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("store.img");
    let _ = std::fs::remove_file(&path);
    let opts = UringOptions {
        capacity_bytes: Some(64 * MIB),
        create: true,
        ..UringOptions::default()
    };
    let dev = UringDevice::open(&path, opts).unwrap();
    let options = StoreOptions {
        slot_bytes: MIB,
        journal_bytes: 0,
    };
    let mut store = store_io::format(&dev, 42, options, true, 1).await.unwrap();
    assert!(store.layout().slots >= 60, "{:?}", store.layout());
    let key = |i| ObjectKey {
        volume: 7,
        object: i,
        generation: 0,
    };
    let mut placed = Vec::new();
    for i in 0..10u64 {
        let (p, t) = store.allocate(key(i), 1, i).unwrap();
        placed.push((p, t));
    }
    store_io::settle(&dev, &mut store).await.unwrap();
    for (i, (p, t)) in placed.iter().enumerate() {
        assert!(store.durable(*t));
        let data = Bytes::from(vec![i as u8 + 1; 4096]);
        dev.submit(
            0,
            DevCommand::Write {
                lba: Lba(p.lba.0 + 3),
                data,
                fua: false,
            },
        )
        .await
        .unwrap();
    }
    dev.submit(0, DevCommand::Flush).await.unwrap();
    for i in 0..3 {
        store.release(&key(i)).unwrap();
    }
    store.update(&key(5), 99, 0b10).unwrap();
    // The released slots are zeroed before the store is idle.
    store_io::settle(&dev, &mut store).await.unwrap();
    assert_eq!(store.usage().used, 7);
    drop(store);
    drop(dev);

    // Closed without a checkpoint, as after a crash: the journal has it all; the
    // released slots' zeroing was not written down, so they are zeroed again.
    let dev = UringDevice::open(&path, UringOptions::default()).unwrap();
    let (mut store, found) = store_io::open(&dev, 2).await.unwrap();
    assert!(found.pages > 0 && found.applied > 0, "{found:?}");
    assert_eq!(found.corrupt, 0);
    assert_eq!((store.usage().used, store.usage().dirty), (7, 3));
    store_io::settle(&dev, &mut store).await.unwrap();
    assert_eq!(store.usage().dirty, 0);
    // A clean shutdown: the table written back; the next open replays nothing new.
    store_io::close(&dev, store).await.unwrap();
    let (store, found) = store_io::open(&dev, 3).await.unwrap();
    assert_eq!((found.applied, found.pages), (0, 1), "{found:?}");
    assert_eq!(
        (store.usage().used, store.usage().clean, store.usage().dirty),
        (7, store.layout().slots - 7, 0)
    );
    for i in 0..10u64 {
        let (p, _) = placed[i as usize];
        let got = read(&dev, Lba(p.lba.0 + 3), 4096).await;
        match store.lookup(&key(i)) {
            None => {
                assert!(i < 3);
                assert!(
                    got.iter().all(|&b| b == 0),
                    "released slot {} was not zeroed",
                    p.slot
                );
            }
            Some(f) => {
                assert_eq!(f.placed, p);
                assert_eq!(f.entry.version, if i == 5 { 99 } else { i });
                assert_eq!(f.entry.fill, if i == 5 { 0b11 } else { 1 });
                assert!(got.iter().all(|&b| b == i as u8 + 1), "object {i}'s data");
            }
        }
    }
    // A device that holds no store is refused as such.
    let other = dir.join("empty.img");
    let _ = std::fs::remove_file(&other);
    let empty = UringDevice::open(
        &other,
        UringOptions {
            capacity_bytes: Some(8 * MIB),
            create: true,
            ..UringOptions::default()
        },
    )
    .unwrap();
    assert_eq!(
        store_io::open(&empty, 4).await.err(),
        Some(StoreError::NotAStore)
    );
}
