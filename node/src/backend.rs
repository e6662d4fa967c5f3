//! The NBD server's backend on weir: a named volume is a table of the
//! replicated pool's extents, filled at the first write into each (thin
//! provisioning, see weir-core's `control::state::volumes`); its I/O goes
//! through weir-core's client (`Volume`), which finds each extent's primary,
//! retries through failovers, and resolves the volume's block to a pool block
//! afresh on every attempt.
//!
//! - Requests are cut into pieces of at most [`PIECE`] bytes on piece boundaries
//!   (never across an extent) that run concurrently.
//! - A read of an extent the volume never wrote is zeroes, sent by no one. A
//!   write into one first asks the control plane to allocate it (and waits
//!   until this node's map shows it); with the pool full it fails with ENOSPC,
//!   and nothing written before is touched.
//! - A request not aligned to the 4 KiB block reads the edge blocks, merges and
//!   writes them back; such writes are serialized with each other on this node,
//!   but not with aligned writes nor across nodes: a client that writes parts of
//!   one block concurrently may lose one part. The export advertises a minimum
//!   block size of 1 (nbdfuse passes on unaligned I/O, and libnbd refuses requests
//!   below an advertised minimum) and a preferred size of 4 KiB.
//! - TRIM and WRITE_ZEROES give every whole extent they cover back to the pool
//!   (it reads as zeroes, and is zeroed before another volume gets it), skip
//!   extents never written, and write zeroes (replicated like any write) over
//!   the rest.
//! - An encrypted volume's blocks are encrypted here before they leave the node
//!   and decrypted here after they arrive ([`crate::crypt`]), with the key this
//!   node was given ([`Keys`]); a volume whose key this node lacks is not
//!   exported (its `GO` is refused with the reason).

use crate::crypt::VolumeKey;
use crate::metrics::Metrics;
use crate::nbd::{errno, Backend, Export};
use bytes::{Bytes, BytesMut};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use weir_core::client::{ClientError, Volume};
use weir_core::control::{ClusterState, Command};
use weir_core::map::ClusterMap;
use weir_core::node::NodeHandle;
use weir_core::{Lba, Transport, WeirError};

/// Largest piece sent to one primary in one request (the map's request limit).
pub const PIECE: u64 = 1 << 20;
/// weir's block size.
const BS: u64 = 4096;
/// Zeroes for TRIM and WRITE_ZEROES: one request's worth.
static ZEROES: [u8; crate::nbd::MAX_IO as usize] = [0; crate::nbd::MAX_IO as usize];

/// The keys of the encrypted volumes this node was given, by volume name (at
/// most one per volume of the map: a key is checked against the map's check
/// value when it is given, and a deleted volume's goes with it).
pub type Keys = Arc<Mutex<BTreeMap<String, Arc<VolumeKey>>>>;

/// Drop the keys of volumes `state` no longer holds, and of earlier volumes
/// of the same name (another check value): every key left is a volume's of
/// the map, so the table is bounded by the map's volumes.
pub fn prune_keys(keys: &mut BTreeMap<String, Arc<VolumeKey>>, state: &ClusterState) {
    keys.retain(|name, key| {
        state
            .named
            .get(name)
            .is_some_and(|v| v.key_check == Some(key.check()))
    });
}

/// NBD on weir volumes.
pub struct WeirBackend<T> {
    volume: Arc<Volume<T>>,
    handle: NodeHandle,
    extent_bytes: u64,
    metrics: Arc<Metrics>,
    keys: Keys,
    /// Serializes read-modify-write of partial blocks.
    rmw: tokio_real::sync::Mutex<()>,
}

impl<T: Transport> WeirBackend<T> {
    /// A backend over `volume` (the pool), with the named volumes of `handle`'s map.
    pub fn new(
        volume: Arc<Volume<T>>,
        handle: NodeHandle,
        extent_bytes: u64,
        (metrics, keys): (Arc<Metrics>, Keys),
    ) -> Self {
        WeirBackend {
            volume,
            handle,
            extent_bytes,
            metrics,
            keys,
            rmw: tokio_real::sync::Mutex::new(()),
        }
    }

    fn error(&self, op: &str, e: &ClientError) -> u32 {
        self.metrics.error(op);
        tracing::warn!(op, error = %e, "volume request failed");
        match e {
            ClientError::Weir(WeirError::OutOfRange { .. } | WeirError::BadLength { .. }) => {
                errno::EINVAL
            }
            ClientError::NoSpace(_) => errno::ENOSPC,
            _ => errno::EIO,
        }
    }

    /// Bring the front end's map up to this node's (a volume created or an
    /// extent allocated here since shows at once).
    fn sync(&self) {
        self.volume.offer(&self.handle.state());
    }

    /// The pool block of byte `at` of volume `name` in `map`: `None` where its
    /// extent was never written.
    fn resolve(&self, map: &ClusterMap, name: &str, at: u64) -> Result<Option<Lba>, ClientError> {
        let volume = map
            .state()
            .named
            .get(name)
            .ok_or_else(|| ClientError::Unmapped(format!("volume {name:?} is gone")))?;
        let index = at / self.extent_bytes;
        Ok(volume
            .alloc
            .get(&index)
            .map(|e| Lba((e.0 * self.extent_bytes + at % self.extent_bytes) / BS)))
    }

    /// Read whole blocks `[start, start + len)` (aligned) of `export`,
    /// concurrently in pieces, decrypted if it is encrypted.
    async fn read_aligned(
        &self,
        export: &Export,
        start: u64,
        len: u64,
    ) -> Result<Bytes, ClientError> {
        let data = self.read_volume(&export.name, start, len).await?;
        let Some(key) = &export.key else {
            return Ok(data);
        };
        if data.len() as u64 != len {
            return Ok(data); // The caller refuses a short read.
        }
        let mut plain = BytesMut::from(&data[..]);
        key.decrypt(&mut plain, start / BS);
        Ok(plain.freeze())
    }

    /// Read one piece of volume `name` as it is (zeroes where never written).
    async fn read_piece(&self, name: &str, at: u64, len: u64) -> Result<Bytes, ClientError> {
        let data = self
            .volume
            .read_at(|map| self.resolve(map, name, at), len / BS)
            .await?;
        if data.iter().all(|&b| b == 0) || self.resolve(&self.volume.map(), name, at)?.is_some() {
            return Ok(data);
        }
        // Zeroes from a map in which the extent was not written yet: this
        // node's map may lag one in which another node's front end wrote it.
        self.volume.refresh().await;
        self.volume
            .read_at(|map| self.resolve(map, name, at), len / BS)
            .await
    }

    /// Read whole blocks `[start, start + len)` of volume `name` as they are.
    async fn read_volume(&self, name: &str, start: u64, len: u64) -> Result<Bytes, ClientError> {
        let pieces = pieces(start, len);
        if pieces.len() == 1 {
            return self.read_piece(name, start, len).await;
        }
        let reads = pieces
            .into_iter()
            .map(|(at, n)| self.read_piece(name, at, n));
        let mut out = BytesMut::with_capacity(len as usize);
        for data in futures_util::future::join_all(reads).await {
            out.extend_from_slice(&data?);
        }
        Ok(out.freeze())
    }

    /// Write one piece (whole blocks) at byte `at` of volume `name`: into its
    /// pool extent, allocated first if the volume never wrote there.
    async fn write_piece(
        &self,
        name: &str,
        at: u64,
        data: Bytes,
        fua: bool,
    ) -> Result<(), ClientError> {
        // A piece may find its extent unallocated (or moved) a few times
        // when allocations and TRIMs race; each round makes progress.
        for _ in 0..8 {
            let written = self
                .volume
                .write_at(
                    |map| {
                        self.resolve(map, name, at)?.ok_or_else(|| {
                            ClientError::Unmapped(format!(
                                "extent {} unallocated",
                                at / self.extent_bytes
                            ))
                        })
                    },
                    data.clone(),
                    fua,
                )
                .await;
            match written {
                Err(ClientError::Moved) => continue,
                Err(ClientError::Unmapped(_))
                    if self.volume.map().state().named.contains_key(name) =>
                {
                    self.allocate(name, at / self.extent_bytes).await?;
                }
                other => return other,
            }
        }
        Err(ClientError::Unmapped(format!(
            "extent {} of volume {name:?} kept moving",
            at / self.extent_bytes
        )))
    }

    /// Have the control plane give volume `name`'s extent `index` a pool
    /// extent, and wait until this node's map shows it (or a full pool).
    async fn allocate(&self, name: &str, index: u64) -> Result<(), ClientError> {
        let deadline = tokio_real::time::Instant::now() + weir_core::client::RETRY_BUDGET;
        let mut asked = false;
        loop {
            let state = self.handle.state();
            let Some(volume) = state.named.get(name) else {
                return Err(ClientError::Unmapped(format!("volume {name:?} is gone")));
            };
            if volume.alloc.contains_key(&index) {
                self.sync();
                return Ok(());
            }
            let free = state.free_extents();
            if free == 0 && state.dirty.is_empty() {
                return Err(ClientError::NoSpace(format!(
                    "the pool is full: {} extents allocated",
                    state.allocated_extents()
                )));
            }
            if tokio_real::time::Instant::now() >= deadline {
                return Err(ClientError::NoSpace(format!(
                    "no free extent within {:?} ({} freed, being zeroed)",
                    weir_core::client::RETRY_BUDGET,
                    state.dirty.len()
                )));
            }
            // Asked again while freed extents are being zeroed: the first
            // ask may have been refused for want of a free one.
            if free > 0 && !asked || free == 0 {
                asked = self.handle.request(Command::Allocate {
                    name: name.to_string(),
                    index,
                }) && free > 0;
            }
            tokio_real::time::sleep(std::time::Duration::from_millis(2)).await;
        }
    }

    /// Write whole blocks at `start` (aligned) of `export`, encrypted if it is,
    /// concurrently in pieces.
    async fn write_aligned(
        &self,
        export: &Export,
        start: u64,
        data: Bytes,
        fua: bool,
    ) -> Result<(), ClientError> {
        let data = match &export.key {
            Some(key) => {
                let mut sealed = BytesMut::from(&data[..]);
                key.encrypt(&mut sealed, start / BS);
                sealed.freeze()
            }
            None => data,
        };
        let writes = pieces(start, data.len() as u64).into_iter().map(|(at, n)| {
            let from = (at - start) as usize;
            self.write_piece(&export.name, at, data.slice(from..from + n as usize), fua)
        });
        let mut result = Ok(());
        for r in futures_util::future::join_all(writes).await {
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    /// Write `data` at byte `start` of `export`, merging partial edge blocks.
    async fn write_any(
        &self,
        export: &Export,
        start: u64,
        data: Bytes,
        fua: bool,
    ) -> Result<(), ClientError> {
        let end = start + data.len() as u64;
        if start.is_multiple_of(BS) && end.is_multiple_of(BS) {
            return self.write_aligned(export, start, data, fua).await;
        }
        let _serial = self.rmw.lock().await;
        let (lo, hi) = (start / BS * BS, end.div_ceil(BS) * BS);
        let edges = self.read_edges(export, (lo, hi), start, end).await?;
        let mut merged = BytesMut::from(&edges[..]);
        let at = (start - lo) as usize;
        merged[at..at + data.len()].copy_from_slice(&data);
        self.write_aligned(export, lo, merged.freeze(), fua).await
    }

    /// Zero `[start, end)` of `export`: whole extents go back to the pool,
    /// extents never written are left so, the rest gets zeroes written.
    async fn zero_range(
        &self,
        export: &Export,
        (start, end): (u64, u64),
        fua: bool,
    ) -> Result<(), ClientError> {
        let eb = self.extent_bytes;
        let mut at = start;
        while at < end {
            let index = at / eb;
            let stop = ((index + 1) * eb).min(end);
            let allocated = self
                .resolve(&self.volume.map(), &export.name, at)?
                .is_some();
            if at % eb == 0 && stop - at == eb {
                if allocated {
                    self.trim(&export.name, index).await?;
                }
            } else if allocated {
                while at < stop {
                    let n = (stop - at).min(ZEROES.len() as u64) as usize;
                    self.write_any(export, at, Bytes::from_static(&ZEROES[..n]), fua)
                        .await?;
                    at += n as u64;
                }
            }
            at = stop;
        }
        Ok(())
    }

    /// Give volume `name`'s extent `index` back to the pool, and wait until
    /// this node's map shows it.
    async fn trim(&self, name: &str, index: u64) -> Result<(), ClientError> {
        let deadline = tokio_real::time::Instant::now() + weir_core::client::RETRY_BUDGET;
        let command = Command::Trim {
            name: name.to_string(),
            index,
        };
        if !self.handle.request(command) {
            return Err(ClientError::Closed);
        }
        while tokio_real::time::Instant::now() < deadline {
            let state = self.handle.state();
            if state
                .named
                .get(name)
                .is_none_or(|v| !v.alloc.contains_key(&index))
            {
                self.sync();
                return Ok(());
            }
            tokio_real::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        Err(ClientError::Timeout(weir_core::client::RETRY_BUDGET))
    }

    /// The blocks `[lo, hi)` of `export`, of which only the partial first and
    /// last matter.
    async fn read_edges(
        &self,
        export: &Export,
        (lo, hi): (u64, u64),
        start: u64,
        end: u64,
    ) -> Result<BytesMut, ClientError> {
        let mut out = BytesMut::zeroed((hi - lo) as usize);
        let block = |data: Bytes| {
            (data.len() == BS as usize)
                .then_some(data)
                .ok_or(ClientError::UnexpectedReply(
                    "a block read of the wrong length",
                ))
        };
        if !start.is_multiple_of(BS) {
            let head = block(self.read_aligned(export, lo, BS).await?)?;
            out[..BS as usize].copy_from_slice(&head);
        }
        if !end.is_multiple_of(BS) && (hi - BS >= lo + BS || start.is_multiple_of(BS)) {
            let tail = block(self.read_aligned(export, hi - BS, BS).await?)?;
            let at = (hi - lo - BS) as usize;
            out[at..].copy_from_slice(&tail);
        }
        Ok(out)
    }
}

/// `[start, start + len)` cut at multiples of [`PIECE`].
fn pieces(start: u64, len: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let (mut at, end) = (start, start + len);
    while at < end {
        let stop = ((at / PIECE + 1) * PIECE).min(end);
        out.push((at, stop - at));
        at = stop;
    }
    out
}

impl<T: Transport> Backend for WeirBackend<T> {
    fn exports(&self) -> Vec<Export> {
        let report = self.handle.report();
        let mut keys = self.keys.lock().expect("keys");
        prune_keys(&mut keys, &report.state);
        report
            .state
            .named
            .iter()
            .map(|(name, v)| {
                let key = keys.get(name).cloned();
                let locked = (v.key_check.is_some() && key.is_none()).then(|| {
                    format!(
                        "volume {name:?} is encrypted and this node has not been given its key \
                         (weir volume unlock {name} --key-file F)"
                    )
                });
                Export {
                    name: name.clone(),
                    size: v.size_bytes,
                    key,
                    locked,
                }
            })
            .collect()
    }

    async fn read(&self, export: &Export, offset: u64, len: u32) -> Result<Bytes, u32> {
        if export.locked.is_some() {
            return Err(errno::EPERM); // Never opened so; refused all the same.
        }
        self.sync();
        let start = offset;
        let end = start + u64::from(len);
        let (lo, hi) = (start / BS * BS, end.div_ceil(BS) * BS);
        match self.read_aligned(export, lo, hi - lo).await {
            Ok(data) if data.len() as u64 == hi - lo => {
                Ok(data.slice((start - lo) as usize..(end - lo) as usize))
            }
            Ok(data) => {
                tracing::error!(
                    got = data.len(),
                    wanted = hi - lo,
                    "short read from the volume"
                );
                Err(errno::EIO)
            }
            Err(e) => Err(self.error("read", &e)),
        }
    }

    async fn write(&self, export: &Export, offset: u64, data: Bytes, fua: bool) -> Result<(), u32> {
        if export.locked.is_some() {
            return Err(errno::EPERM);
        }
        self.sync();
        self.write_any(export, offset, data, fua)
            .await
            .map_err(|e| self.error("write", &e))
    }

    async fn flush(&self, _export: &Export) -> Result<(), u32> {
        self.volume
            .flush()
            .await
            .map_err(|e| self.error("flush", &e))
    }

    async fn zero(&self, export: &Export, offset: u64, len: u32, fua: bool) -> Result<(), u32> {
        if export.locked.is_some() {
            return Err(errno::EPERM);
        }
        // TRIM and WRITE_ZEROES carry no payload, so their length may exceed the
        // request limit: zeroes are written in turns of at most the static
        // zeroes' length (whose pages are never touched, so they cost no memory).
        self.sync();
        self.zero_range(export, (offset, offset + u64::from(len)), fua)
            .await
            .map_err(|e| self.error("write_zeroes", &e))
    }

    fn record(&self, command: &'static str, bytes: u64, latency: std::time::Duration) {
        self.metrics.record(command, bytes, latency);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_never_cross_a_piece_boundary_and_cover_the_range() {
        assert_eq!(pieces(0, 4096), vec![(0, 4096)]);
        let p = pieces(PIECE - 4096, 3 * PIECE);
        assert_eq!(p.first(), Some(&(PIECE - 4096, 4096)));
        assert_eq!(p.iter().map(|x| x.1).sum::<u64>(), 3 * PIECE);
        assert!(p.iter().all(|(at, n)| at / PIECE == (at + n - 1) / PIECE));
    }
}
