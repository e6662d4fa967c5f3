//! The NBD server's backend on weir: named volumes are runs of the replicated
//! pool's extents; their I/O goes through weir-core's client (`Volume`), which
//! finds each extent's primary and retries through failovers.
//!
//! - Requests are cut into pieces of at most [`PIECE`] bytes on piece boundaries
//!   (never across an extent) that run concurrently.
//! - A request not aligned to the 4 KiB block reads the edge blocks, merges and
//!   writes them back; such writes are serialized with each other on this node,
//!   but not with aligned writes nor across nodes: a client that writes parts of
//!   one block concurrently may lose one part. The export advertises a minimum
//!   block size of 1 (nbdfuse passes on unaligned I/O, and libnbd refuses requests
//!   below an advertised minimum) and a preferred size of 4 KiB.
//! - TRIM and WRITE_ZEROES write zeroes (replicated like any write), so a trimmed
//!   range reads back as zeroes everywhere.
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
use weir_core::control::ClusterState;
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
            _ => errno::EIO,
        }
    }

    /// Read whole blocks `[start, start + len)` of the pool (aligned) of
    /// `export`, concurrently in pieces, decrypted if it is encrypted.
    async fn read_aligned(
        &self,
        export: &Export,
        start: u64,
        len: u64,
    ) -> Result<Bytes, ClientError> {
        let data = self.read_pool(start, len).await?;
        let Some(key) = &export.key else {
            return Ok(data);
        };
        if data.len() as u64 != len {
            return Ok(data); // The caller refuses a short read.
        }
        let mut plain = BytesMut::from(&data[..]);
        key.decrypt(&mut plain, (start - export.base) / BS);
        Ok(plain.freeze())
    }

    /// Read whole blocks `[start, start + len)` of the pool as they are.
    async fn read_pool(&self, start: u64, len: u64) -> Result<Bytes, ClientError> {
        let pieces = pieces(start, len);
        if pieces.len() == 1 {
            return self.volume.read(Lba(start / BS), len / BS).await;
        }
        let tasks: Vec<_> = pieces
            .into_iter()
            .map(|(at, n)| {
                let volume = self.volume.clone();
                tokio_real::spawn(async move { volume.read(Lba(at / BS), n / BS).await })
            })
            .collect();
        let mut out = BytesMut::with_capacity(len as usize);
        for t in tasks {
            let data = t.await.map_err(|_| ClientError::Closed)??;
            out.extend_from_slice(&data);
        }
        Ok(out.freeze())
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
                key.encrypt(&mut sealed, (start - export.base) / BS);
                sealed.freeze()
            }
            None => data,
        };
        let pieces = pieces(start, data.len() as u64);
        if pieces.len() == 1 {
            return self.volume.write(Lba(start / BS), data, fua).await;
        }
        let tasks: Vec<_> = pieces
            .into_iter()
            .map(|(at, n)| {
                let volume = self.volume.clone();
                let from = (at - start) as usize;
                let chunk = data.slice(from..from + n as usize);
                tokio_real::spawn(async move { volume.write(Lba(at / BS), chunk, fua).await })
            })
            .collect();
        let mut result = Ok(());
        for t in tasks {
            let r = t.await.map_err(|_| ClientError::Closed).and_then(|r| r);
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    /// Write `data` at byte `start` of the pool (in `export`), merging partial
    /// edge blocks.
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
                    base: v.first.0 * self.extent_bytes,
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
        let start = export.base + offset;
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
        self.write_any(export, export.base + offset, data, fua)
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
        // request limit: zero it in turns of at most the static zeroes' length
        // (whose pages are never touched, so they cost no memory).
        let (mut at, end) = (export.base + offset, export.base + offset + u64::from(len));
        while at < end {
            let n = (end - at).min(ZEROES.len() as u64) as usize;
            self.write_any(export, at, Bytes::from_static(&ZEROES[..n]), fua)
                .await
                .map_err(|e| self.error("write_zeroes", &e))?;
            at += n as u64;
        }
        Ok(())
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
