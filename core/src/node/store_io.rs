//! A device's store ([`crate::store`]) run over a [`BlockDevice`]: format it,
//! open it (recovery), and issue what it asks for until it is idle. The store
//! decides; this only moves bytes.

use crate::buf::BufPool;
use crate::device::{BlockDevice, DevCommand, DevCompletion, DevError};
use crate::ids::Lba;
use crate::store::{Layout, Recovery, Store, StoreError, StoreOptions, PAGE_BYTES};
use futures_util::stream::{FuturesUnordered, StreamExt};

/// The queue the store's commands go on.
const QUEUE: u16 = 0;

/// Read buffers in flight at once while opening (each at most one transfer).
const OPEN_READS_BYTES: usize = 4 << 20;

async fn submit<D: BlockDevice>(dev: &D, cmd: DevCommand) -> Result<DevCompletion, StoreError> {
    dev.submit(QUEUE, cmd).await.map_err(StoreError::Failed)
}

/// Make a new store named `uuid` on `dev` (`fresh`: the device already reads
/// as zeroes, so its slots need no zeroing). Whatever the device held is lost.
/// `nonce`, here and in [`open`]: a random number new at each opening.
pub async fn format<D: BlockDevice>(
    dev: &D,
    uuid: u128,
    options: StoreOptions,
    fresh: bool,
    nonce: u64,
) -> Result<Store, StoreError> {
    let (store, cmds) = Store::format(uuid, &dev.geometry(), options, fresh, nonce)?;
    for cmd in cmds {
        submit(dev, cmd).await?;
    }
    Ok(store)
}

/// `len` bytes of `dev` from byte `off`, read a transfer at a time.
async fn read<D: BlockDevice>(dev: &D, off: u64, len: u64) -> Result<Vec<u8>, StoreError> {
    let g = dev.geometry();
    let bs = u64::from(g.block_size);
    let most = (u64::from(g.max_transfer_blocks.max(1)) * bs).min(OPEN_READS_BYTES as u64);
    let pool = BufPool::new(OPEN_READS_BYTES);
    let mut out = Vec::with_capacity(len as usize);
    let mut at = off;
    while at < off + len {
        let n = (off + len - at).min(most);
        let buf = pool
            .alloc(n as usize)
            .map_err(|_| StoreError::BadOptions("no read buffer"))?;
        match submit(
            dev,
            DevCommand::Read {
                lba: Lba(at / bs),
                buf,
            },
        )
        .await?
        {
            DevCompletion::Read(buf) => out.extend_from_slice(buf.as_ref()),
            DevCompletion::Done => return Err(StoreError::Failed(DevError::Gone)),
        }
        at += n;
    }
    Ok(out)
}

/// The store on `dev`, recovered: superblock, table and journal read, the
/// journal replayed.
pub async fn open<D: BlockDevice>(dev: &D, nonce: u64) -> Result<(Store, Recovery), StoreError> {
    let g = dev.geometry();
    let superblock = read(dev, 0, PAGE_BYTES).await?;
    let layout = Layout::decode(&superblock, &g)?;
    let table = read(dev, layout.table_off, layout.table_bytes()).await?;
    let ring = read(dev, layout.journal_off, layout.journal_pages * PAGE_BYTES).await?;
    Store::recover(&g, &superblock, &table, &ring, nonce)
}

/// Issue everything `store` asks for, at once, until it is idle (a shutdown, or
/// a step of a test). A failed command fails the store and is returned.
pub async fn settle<D: BlockDevice>(dev: &D, store: &mut Store) -> Result<(), StoreError> {
    let mut in_flight = FuturesUnordered::new();
    loop {
        while let Some(op) = store.poll_op() {
            in_flight.push(async move { (op.id, dev.submit(QUEUE, op.cmd).await.map(|_| ())) });
        }
        let Some((id, result)) = in_flight.next().await else {
            break;
        };
        store.complete(id, result);
        if let Err(e) = result {
            return Err(StoreError::Failed(e));
        }
    }
    debug_assert!(store.idle(), "a settled store asks for nothing");
    Ok(())
}

/// A clean shutdown of `store` on `dev` ([`Store::shutdown`]): the table
/// written back and the start carried, without zeroing what is still dirty.
pub async fn close<D: BlockDevice>(dev: &D, mut store: Store) -> Result<(), StoreError> {
    store.shutdown();
    settle(dev, &mut store).await
}
