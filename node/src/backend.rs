//! The NBD server's backend on weir: a named volume is a table of the
//! replicated pool's extents, filled at the first write into each (thin
//! provisioning, see weir-core's `control::state::volumes`); its I/O goes
//! through weir-core's client (`Volume`), which finds each extent's primary,
//! retries through failovers, and resolves the volume's block to a pool block
//! afresh on every attempt.
//!
//! - Requests are cut into pieces of at most `weir_core::named::PIECE` bytes on piece boundaries
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
use weir_core::client::ClientError;
use weir_core::control::ClusterState;
use weir_core::named::{NamedVolumes, Target};
use weir_core::node::NodeHandle;
use weir_core::{Transport, WeirError};

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

/// The volume (or snapshot) `export` serves, as the client opened it.
fn target(export: &Export) -> Target {
    Target {
        id: export.id,
        ..Target::parse(&export.name)
    }
}

/// NBD on weir volumes.
pub struct WeirBackend<T> {
    named: Arc<NamedVolumes<T>>,
    handle: NodeHandle,
    metrics: Arc<Metrics>,
    keys: Keys,
    /// Serializes read-modify-write of partial blocks.
    rmw: tokio_real::sync::Mutex<()>,
}

impl<T: Transport> WeirBackend<T> {
    /// A backend over `named` (the node's front end on its volumes), with
    /// the volumes of `handle`'s map.
    pub fn new(
        named: Arc<NamedVolumes<T>>,
        handle: NodeHandle,
        (metrics, keys): (Arc<Metrics>, Keys),
    ) -> Self {
        WeirBackend {
            named,
            handle,
            metrics,
            keys,
            rmw: tokio_real::sync::Mutex::new(()),
        }
    }

    fn error(&self, op: &str, e: &ClientError) -> u32 {
        self.metrics.error(op, e.kind());
        tracing::warn!(op, why = e.kind(), error = %e, "volume request failed");
        match e {
            ClientError::Weir(WeirError::OutOfRange { .. } | WeirError::BadLength { .. }) => {
                errno::EINVAL
            }
            ClientError::NoSpace(_) => errno::ENOSPC,
            _ => errno::EIO,
        }
    }

    /// Read whole blocks `[start, start + len)` (aligned) of `export`,
    /// decrypted if it is encrypted.
    async fn read_aligned(
        &self,
        export: &Export,
        start: u64,
        len: u64,
    ) -> Result<Bytes, ClientError> {
        let data = self.named.read(&target(export), start, len).await?;
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

    /// Write whole blocks at `start` (aligned) of `export`, encrypted if it is.
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
        self.named.write(&target(export), start, data, fua).await
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

    /// Write zeroes over `[at, stop)` of `export` in turns of at most the
    /// static zeroes' length.
    async fn write_zeroes(
        &self,
        export: &Export,
        (mut at, stop): (u64, u64),
        fua: bool,
    ) -> Result<(), ClientError> {
        while at < stop {
            let n = (stop - at).min(ZEROES.len() as u64) as usize;
            self.write_any(export, at, Bytes::from_static(&ZEROES[..n]), fua)
                .await?;
            at += n as u64;
        }
        Ok(())
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

impl<T: Transport> Backend for WeirBackend<T> {
    fn exports(&self) -> Vec<Export> {
        let state = self.handle.state();
        let mut keys = self.keys.lock().expect("keys");
        prune_keys(&mut keys, &state);
        let mut out = Vec::new();
        for (name, v) in &state.named {
            let key = keys.get(name).cloned();
            let locked = (v.key_check.is_some() && key.is_none()).then(|| {
                format!(
                    "volume {name:?} is encrypted and this node has not been given its key \
                     (weir volume unlock {name} --key-file F)"
                )
            });
            let export = |name: String, read_only| Export {
                name,
                size: v.size_bytes,
                key: key.clone(),
                locked: locked.clone(),
                read_only,
                id: Some(v.id),
            };
            out.push(export(name.clone(), false));
            // Each snapshot, read-only, as VOL@SNAP.
            for snap in v.snapshots.keys() {
                out.push(export(format!("{name}@{snap}"), true));
            }
        }
        out
    }

    async fn read(&self, export: &Export, offset: u64, len: u32) -> Result<Bytes, u32> {
        if export.locked.is_some() {
            return Err(errno::EPERM); // Never opened so; refused all the same.
        }
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
        if export.locked.is_some() || export.read_only {
            return Err(errno::EPERM);
        }
        self.write_any(export, offset, data, fua)
            .await
            .map_err(|e| self.error("write", &e))
    }

    async fn flush(&self, _export: &Export) -> Result<(), u32> {
        self.named
            .pool()
            .flush()
            .await
            .map_err(|e| self.error("flush", &e))
    }

    async fn zero(&self, export: &Export, offset: u64, len: u32, fua: bool) -> Result<(), u32> {
        if export.locked.is_some() || export.read_only {
            return Err(errno::EPERM);
        }
        // TRIM and WRITE_ZEROES carry no payload, so their length may exceed the
        // request limit: zeroes are written in turns of at most the static
        // zeroes' length (whose pages are never touched, so they cost no memory).
        let range = (offset, offset + u64::from(len));
        self.named
            .zero(&target(export), range, |at, stop| {
                self.write_zeroes(export, (at, stop), fua)
            })
            .await
            .map_err(|e| self.error("write_zeroes", &e))
    }

    fn record(&self, command: &'static str, bytes: u64, latency: std::time::Duration) {
        self.metrics.record(command, bytes, latency);
    }
}
