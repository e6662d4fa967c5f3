//! Named volumes as a node's front end sees them: thin tables of the pool's
//! extents, snapshots served read-only, and redirect-on-write (see
//! [`crate::control::state::volumes`] and [`crate::control::state::snapshots`]).
//!
//! [`NamedVolumes`] reads and writes a volume's bytes through the pool's
//! client ([`Volume`]), resolving each piece to a pool block afresh on every
//! attempt. A write into an extent the volume never wrote first has the
//! control plane allocate one; into a frozen one, redirect it; into a chunk
//! of a redirected extent not yet filled, copy the chunk over from its base
//! and mark it filled; each step is a command the control plane commits, and
//! the piece goes once this node's map shows it. A read of an extent never
//! written is zeroes (after asking the voters for a newer map: one written
//! through another node may not have reached this node's yet).

use crate::client::{Attempts, ClientError, Volume};
use crate::control::state::{ClusterState, Command, CHUNKS};
use crate::ids::{ExtentId, Lba};
use crate::map::ClusterMap;
use crate::transport::Transport;

mod control;
use bytes::{Bytes, BytesMut};
pub use control::Control;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Largest piece of a volume sent in one request (the map's request limit).
pub const PIECE: u64 = crate::map::MAX_REQUEST_BYTES;
/// Zeroing writes of a freed extent in flight at once.
const ZEROING_WRITES: usize = 4;
/// Zeroes for one request; never written, so its pages cost no memory.
static ZEROES: [u8; PIECE as usize] = [0; PIECE as usize];
/// Rounds a piece may go through (allocate, redirect, fill, write) before it
/// gives up: each is a committed step, so a few suffice unless TRIMs and
/// writes of the same extent race without end.
const ROUNDS: usize = 16;

/// Which table a read goes by: a volume's own, or one of its snapshots'.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The volume.
    pub name: String,
    /// The snapshot, if any (read-only).
    pub snap: Option<String>,
    /// The volume's number, where the caller opened a particular one (a
    /// volume deleted and made again under its name is another).
    pub id: Option<u64>,
}

impl Target {
    /// `VOL` or `VOL@SNAP`.
    pub fn parse(export: &str) -> Target {
        match export.split_once('@') {
            Some((name, snap)) => Target {
                name: name.to_string(),
                snap: Some(snap.to_string()),
                id: None,
            },
            None => Target {
                name: export.to_string(),
                snap: None,
                id: None,
            },
        }
    }
}

/// A node's front end over named volumes.
pub struct NamedVolumes<T> {
    volume: Arc<Volume<T>>,
    control: Arc<dyn Control>,
    extent_bytes: u64,
    /// Per volume (by number): the generation whose snapshots this front
    /// end has seen every primary apply (see
    /// [`crate::control::state::snapshots`]); bounded by the map's volumes.
    barriers: Mutex<BTreeMap<u64, u64>>,
    /// Commands asked of the control plane lately, and when: the pieces of
    /// a request (and requests) waiting for the same command ask it once
    /// per `ASK_AGAIN` between them. Entries older than that are pruned
    /// at each ask, so it holds at most the commands waited for at once.
    asked: Mutex<BTreeMap<String, tokio::time::Instant>>,
    /// Test-only bug (the simulator's `leak_into_snapshot`): one write, the
    /// third that started after a snapshot was seen applied and went to an
    /// extent a snapshot froze or reads through, also goes in place into the
    /// frozen extent (the third, so it starts well after the snapshot's
    /// command returned); 0 when off or spent.
    bug_leak: std::sync::atomic::AtomicU32,
}

/// Where byte `at` of a volume is: its extent index, the chunk, the offset
/// in the extent.
fn place(at: u64, extent_bytes: u64) -> (u64, u32, u64) {
    let off = at % extent_bytes;
    (
        at / extent_bytes,
        (off / (extent_bytes / u64::from(CHUNKS))) as u32,
        off,
    )
}

/// `[start, start + len)` cut at multiples of `piece`.
fn pieces(start: u64, len: u64, piece: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let (mut at, end) = (start, start + len);
    while at < end {
        let stop = ((at / piece + 1) * piece).min(end);
        out.push((at, stop - at));
        at = stop;
    }
    out
}

fn gone(name: &str) -> ClientError {
    ClientError::Unmapped(format!("volume {name:?} is gone"))
}

/// Volume `name` of `state`, if it is the one numbered `id` (when given).
fn volume_of<'s>(
    state: &'s ClusterState,
    name: &str,
    id: Option<u64>,
) -> Result<&'s crate::control::state::NamedVolume, ClientError> {
    state
        .named
        .get(name)
        .filter(|v| id.is_none_or(|id| id == v.id))
        .ok_or_else(|| gone(name))
}

impl<T: Transport> NamedVolumes<T> {
    /// A front end over `volume` (the pool's client) and `control`, with
    /// extents of `extent_bytes`.
    pub fn new(volume: Arc<Volume<T>>, control: Arc<dyn Control>, extent_bytes: u64) -> Self {
        assert!(
            extent_bytes
                .is_multiple_of(u64::from(CHUNKS) * u64::from(volume.map().volume().block_size)),
            "an extent is whole chunks of whole blocks"
        );
        NamedVolumes {
            volume,
            control,
            extent_bytes,
            barriers: Mutex::new(BTreeMap::new()),
            asked: Mutex::new(BTreeMap::new()),
            bug_leak: std::sync::atomic::AtomicU32::new(0),
        }
    }

    /// Turn on the test-only bug that lets one write leak into a snapshot
    /// (the simulator proves its snapshot checker catches it).
    pub fn with_bug_leak_into_snapshot(self) -> Self {
        self.bug_leak.store(3, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// The pool's client.
    pub fn pool(&self) -> &Arc<Volume<T>> {
        &self.volume
    }

    /// Bytes of one chunk (the unit of redirect-on-write).
    pub fn chunk_bytes(&self) -> u64 {
        self.extent_bytes / u64::from(CHUNKS)
    }

    /// Bytes of one piece: no piece crosses a chunk or is larger than a
    /// request.
    fn piece_bytes(&self) -> u64 {
        PIECE.min(self.chunk_bytes())
    }

    /// `[start, start + len)` cut at multiples of the piece size.
    fn pieces(&self, start: u64, len: u64) -> Vec<(u64, u64)> {
        pieces(start, len, self.piece_bytes())
    }

    /// Bring the pool client's map up to the node's.
    fn sync(&self) -> Arc<ClusterState> {
        let state = self.control.state();
        self.volume.offer(&state);
        state
    }

    fn block(&self) -> u64 {
        u64::from(self.volume.map().volume().block_size)
    }

    fn lba(&self, extent: ExtentId, off: u64) -> Lba {
        Lba((extent.0 * self.extent_bytes + off) / self.block())
    }

    /// The table `target` reads by in `map`, if the volume (and snapshot)
    /// exists and is the one `target` opened.
    fn table<'m>(
        &self,
        state: &'m ClusterState,
        target: &Target,
    ) -> Result<&'m BTreeMap<u64, ExtentId>, ClientError> {
        let v = volume_of(state, &target.name, target.id)?;
        match &target.snap {
            None => Ok(&v.alloc),
            Some(snap) => Ok(&v
                .snapshots
                .get(snap)
                .ok_or_else(|| {
                    ClientError::Unmapped(format!("snapshot {}@{snap} is gone", target.name))
                })?
                .table),
        }
    }

    /// The pool block byte `at` of `target` reads from in `map`: `None`
    /// where the table has no extent.
    fn locate(
        &self,
        map: &ClusterMap,
        target: &Target,
        at: u64,
    ) -> Result<Option<Lba>, ClientError> {
        let (index, chunk, off) = place(at, self.extent_bytes);
        let state = map.state();
        Ok(self
            .table(state, target)?
            .get(&index)
            .map(|&e| self.lba(state.holder(e, chunk), off)))
    }

    /// Where a read of byte `at` of `target` in `map` went through a base:
    /// the volume's own extent, whose chunk another front end may since have
    /// filled (a snapshot's tables never change).
    fn through_base(&self, map: &ClusterMap, target: &Target, at: u64) -> Option<ExtentId> {
        let (index, chunk, _) = place(at, self.extent_bytes);
        let state = map.state();
        let &head = self.table(state, target).ok()?.get(&index)?;
        (target.snap.is_none() && state.holder(head, chunk) != head).then_some(head)
    }

    /// Read whole blocks `[start, start + len)` of `target` (aligned),
    /// concurrently in pieces.
    pub async fn read(&self, target: &Target, start: u64, len: u64) -> Result<Bytes, ClientError> {
        self.sync();
        let attempts = self.volume.attempts();
        let reads = self
            .pieces(start, len)
            .into_iter()
            .map(|(at, n)| self.read_piece(target, at, n, attempts));
        let mut out = BytesMut::with_capacity(len as usize);
        for data in futures_util::future::join_all(reads).await {
            out.extend_from_slice(&data?);
        }
        Ok(out.freeze())
    }

    async fn read_piece(
        &self,
        target: &Target,
        at: u64,
        len: u64,
        attempts: Attempts,
    ) -> Result<Bytes, ClientError> {
        let blocks = len / self.block();
        let (_, chunk, _) = place(at, self.extent_bytes);
        for _ in 0..ROUNDS {
            let map = self.volume.map();
            let data = self
                .volume
                .read_at_with(attempts, |map| self.locate(map, target, at), blocks)
                .await?;
            let now = self.volume.map();
            if self.locate(&now, target, at)?.is_none() {
                if data.iter().any(|&b| b != 0) {
                    continue; // Freed meanwhile: read again.
                }
                // Zeroes from a map in which the extent was not written yet
                // (another node's front end may have written it since).
                self.volume.refresh().await;
                if self.locate(&self.volume.map(), target, at)?.is_none() {
                    return Ok(data);
                }
                continue;
            }
            let Some(head) = self.through_base(&map, target, at) else {
                return Ok(data);
            };
            // Read through a base: valid only if the chunk was not filled
            // (and written) meanwhile. A fill starts a new reign of the
            // volume's extent, so a read of it at this map's epoch is refused
            // once one has been committed and applied there.
            let fenced = self
                .volume
                .read_at_with(
                    attempts,
                    |m| {
                        let open = m.state().rows.get(&head).is_some_and(|r| !r.has(chunk))
                            && self.through_base(m, target, at) == Some(head);
                        if !open {
                            return Err(ClientError::Moved);
                        }
                        Ok(Some(self.lba(head, 0)))
                    },
                    1,
                )
                .await;
            match fenced {
                Ok(_) => return Ok(data),
                Err(ClientError::Moved) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(ClientError::Unmapped(format!(
            "a block of {:?} kept moving while read",
            target.name
        )))
    }

    /// Write whole blocks at `start` (aligned) of volume `name`, concurrently
    /// in pieces.
    pub async fn write(
        &self,
        target: &Target,
        start: u64,
        data: Bytes,
        fua: bool,
    ) -> Result<(), ClientError> {
        if target.snap.is_some() {
            return Err(ClientError::Unmapped("a snapshot is read-only".into()));
        }
        let (name, id) = (target.name.as_str(), target.id);
        self.sync();
        // The snapshots this write started after (only such a write may
        // leak, under the bug).
        let settled = self.settled(name);
        let attempts = self.volume.attempts();
        self.barrier_with(name, attempts).await?;
        let writes = self
            .pieces(start, data.len() as u64)
            .into_iter()
            .map(|(at, n)| {
                let from = (at - start) as usize;
                self.write_piece(
                    (name, id),
                    at,
                    data.slice(from..from + n as usize),
                    (fua, settled, attempts),
                )
            });
        let mut result = Ok(());
        for r in futures_util::future::join_all(writes).await {
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    /// Write one piece (within one chunk): allocate, redirect or fill first
    /// where the map says so.
    async fn write_piece(
        &self,
        (name, id): (&str, Option<u64>),
        at: u64,
        data: Bytes,
        (fua, settled, attempts): (bool, u64, Attempts),
    ) -> Result<(), ClientError> {
        let (index, chunk, off) = place(at, self.extent_bytes);
        for _ in 0..ROUNDS {
            let map = self.volume.map();
            let state = map.state();
            let v = volume_of(state, name, id)?;
            let Some(&extent) = v.alloc.get(&index) else {
                let allocate = Command::Allocate {
                    name: name.to_string(),
                    index,
                };
                let done = |s: &ClusterState| {
                    s.named
                        .get(name)
                        .is_some_and(|v| v.alloc.contains_key(&index))
                };
                self.commit(allocate, done, attempts).await?;
                continue;
            };
            if crate::replication::BUGS_BUILT && settled > 0 && settled == v.generation {
                self.maybe_leak(&map, extent, off, (&data, fua)).await?;
            }
            if map.frozen(extent) {
                let redirect = Command::Redirect {
                    name: name.to_string(),
                    index,
                    from: extent,
                };
                let done = |s: &ClusterState| {
                    s.named
                        .get(name)
                        .is_some_and(|v| v.alloc.get(&index) != Some(&extent))
                };
                self.commit(redirect, done, attempts).await?;
                continue;
            }
            if state.rows.get(&extent).is_some_and(|r| !r.has(chunk)) {
                self.fill(extent, chunk, attempts).await?;
                continue;
            }
            let target = (name, id, index, extent);
            let written = self.write_in_place(target, (chunk, off), &data, (fua, attempts));
            match written.await {
                Err(ClientError::Moved) => continue,
                other => return other,
            }
        }
        Err(ClientError::Unmapped(format!(
            "extent {index} of volume {name:?} kept changing hands"
        )))
    }

    /// Write `data` at `off` of `extent`, index `index` of volume `name`
    /// (numbered `id`), only while the table still holds `extent` there,
    /// writable, with its chunk `chunk` its own (else `Moved`).
    async fn write_in_place(
        &self,
        (name, id, index, extent): (&str, Option<u64>, u64, ExtentId),
        (chunk, off): (u32, u64),
        data: &Bytes,
        (fua, attempts): (bool, Attempts),
    ) -> Result<(), ClientError> {
        let still = |map: &ClusterMap| {
            let s = map.state();
            let v = volume_of(s, name, id)?;
            let same = v.alloc.get(&index) == Some(&extent)
                && !map.frozen(extent)
                && s.rows.get(&extent).is_none_or(|r| r.has(chunk));
            if !same {
                return Err(ClientError::Moved);
            }
            Ok(self.lba(extent, off))
        };
        self.volume
            .write_at_with(attempts, still, data.clone(), fua)
            .await
    }

    /// The bug: once, a write that started after this front end saw the
    /// volume's latest snapshot applied (with no snapshot taken since) goes
    /// in place into the extent the snapshot froze as well.
    async fn maybe_leak(
        &self,
        map: &ClusterMap,
        extent: ExtentId,
        off: u64,
        (data, fua): (&Bytes, bool),
    ) -> Result<(), ClientError> {
        if self.bug_leak.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return Ok(());
        }
        let frozen = match map.state().rows.get(&extent) {
            _ if map.frozen(extent) => Some(extent),
            Some(row) => Some(row.base),
            None => None,
        };
        if let Some(into) = frozen {
            let left = self
                .bug_leak
                .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            if left == 1 {
                let at = self.lba(into, off);
                self.volume.write_at(|_| Ok(at), data.clone(), fua).await?;
            }
        }
        Ok(())
    }

    /// Copy chunk `chunk` of redirected `extent` from its base, then have it
    /// marked filled.
    async fn fill(
        &self,
        extent: ExtentId,
        chunk: u32,
        attempts: Attempts,
    ) -> Result<(), ClientError> {
        let map = self.volume.map();
        let state = map.state();
        let Some(row) = state.rows.get(&extent).copied() else {
            return Ok(());
        };
        let since = map.extent(extent).primary_since;
        let source = state.holder(row.base, chunk);
        let cb = self.chunk_bytes();
        let first = u64::from(chunk) * cb;
        let mut at = first;
        while at < first + cb {
            let n = self.piece_bytes().min(first + cb - at);
            // The base is frozen: what it holds does not change.
            let data = self
                .volume
                .read_at_with(
                    attempts,
                    |_| Ok(Some(self.lba(source, at))),
                    n / self.block(),
                )
                .await?;
            let copied = self
                .volume
                .write_at_with(
                    attempts,
                    |map| {
                        let s = map.state();
                        let open = s.rows.get(&extent).is_some_and(|r| !r.has(chunk));
                        if !open {
                            return Err(ClientError::Moved);
                        }
                        Ok(self.lba(extent, at))
                    },
                    data,
                    // Durable before the chunk is marked filled: the base
                    // stops serving it then, whatever a power loss drops.
                    true,
                )
                .await;
            match copied {
                // Filled meanwhile (another front end's copy), or moved on.
                Err(ClientError::Moved) => return Ok(()),
                other => other?,
            }
            at += n;
        }
        let command = Command::Filled {
            extent,
            chunk: chunk as u8,
            since,
        };
        // Done once the chunk is filled (this copy or another's), or the
        // row is gone or made again (the extent changed hands).
        self.commit(
            command,
            |s| {
                s.rows
                    .get(&extent)
                    .is_none_or(|r| r.has(chunk) || r.since > since)
            },
            attempts,
        )
        .await
    }

    /// The generation of volume `name` whose snapshots this front end has
    /// seen applied, if that is every snapshot its map holds (0 otherwise,
    /// or if it has none).
    fn settled(&self, name: &str) -> u64 {
        let map = self.volume.map();
        let Some(v) = map.state().named.get(name) else {
            return 0;
        };
        let barriers = self.barriers.lock().expect("barriers");
        let seen = barriers.get(&v.id).copied().unwrap_or(0) >= v.generation;
        if seen {
            v.generation
        } else {
            0
        }
    }

    /// Before a write of volume `name`: once per new snapshot of it, see
    /// every primary of the extents it froze apply it (a read of one block at
    /// this map's epoch, which a primary serves only once its map is as new).
    pub async fn barrier(&self, name: &str) -> Result<(), ClientError> {
        self.barrier_with(name, self.volume.attempts()).await
    }

    /// [`NamedVolumes::barrier`] as a step of a request whose retries are
    /// `attempts`.
    async fn barrier_with(&self, name: &str, attempts: Attempts) -> Result<(), ClientError> {
        self.sync();
        let map = self.volume.map();
        let Some(v) = map.state().named.get(name) else {
            return Err(gone(name));
        };
        let done = self
            .barriers
            .lock()
            .expect("barriers")
            .get(&v.id)
            .copied()
            .unwrap_or(0);
        if done >= v.generation {
            return Ok(());
        }
        let mut frozen: Vec<ExtentId> = v
            .snapshots
            .values()
            .filter(|s| s.generation > done)
            .flat_map(|s| s.table.values().copied())
            .collect();
        frozen.sort_unstable();
        frozen.dedup();
        let reads = frozen.iter().map(|&e| {
            self.volume
                .read_at_with(attempts, move |_| Ok(Some(self.lba(e, 0))), 1)
        });
        for r in futures_util::future::join_all(reads).await {
            r?;
        }
        let mut barriers = self.barriers.lock().expect("barriers");
        let state = map.state();
        barriers.retain(|id, _| state.named.values().any(|v| v.id == *id));
        let at = barriers.entry(v.id).or_default();
        *at = (*at).max(v.generation);
        Ok(())
    }

    /// Zero `[start, end)` of volume `name`: whole extents go back to the
    /// pool, extents never written are left so, the rest gets `zeroes`
    /// written (by `write`, which may encrypt them).
    pub async fn zero<F, Fut>(
        &self,
        target: &Target,
        (start, end): (u64, u64),
        write: F,
    ) -> Result<(), ClientError>
    where
        F: Fn(u64, u64) -> Fut,
        Fut: std::future::Future<Output = Result<(), ClientError>>,
    {
        if target.snap.is_some() {
            return Err(ClientError::Unmapped("a snapshot is read-only".into()));
        }
        let (name, id) = (target.name.as_str(), target.id);
        let eb = self.extent_bytes;
        let attempts = self.volume.attempts();
        let mut at = start;
        while at < end {
            let index = at / eb;
            let stop = ((index + 1) * eb).min(end);
            let state = self.sync();
            let mut allocated = volume_of(&state, name, id)?.alloc.contains_key(&index);
            if !allocated {
                // Never written in this node's map: perhaps written through
                // another node's front end since.
                self.volume.refresh().await;
                let map = self.volume.map();
                allocated = volume_of(map.state(), name, id)?.alloc.contains_key(&index);
            }
            if at % eb == 0 && stop - at == eb {
                if allocated {
                    self.commit(
                        Command::Trim {
                            name: name.to_string(),
                            index,
                        },
                        |s| {
                            s.named
                                .get(name)
                                .is_none_or(|v| !v.alloc.contains_key(&index))
                        },
                        attempts,
                    )
                    .await?;
                }
            } else if allocated {
                write(at, stop).await?;
            }
            at = stop;
        }
        Ok(())
    }

    /// Write zeroes over all of freed pool extent `extent` while it stays
    /// dirty in reign `since`, then flush (the reclaimer's work; the caller
    /// then reports it zeroed, [`Command::Zeroed`]).
    pub async fn zero_freed(
        &self,
        extent: ExtentId,
        since: crate::ids::Epoch,
    ) -> Result<(), ClientError> {
        let eb = self.extent_bytes;
        let resolve = |offset: u64| {
            move |map: &ClusterMap| {
                let state = map.state();
                let same = state.dirty.contains(&extent)
                    && state.extents.get(&extent).map(|e| e.primary_since) == Some(since);
                if !same {
                    return Err(ClientError::Unmapped(format!(
                        "{extent} is no longer dirty"
                    )));
                }
                Ok(self.lba(extent, offset))
            }
        };
        let offsets: Vec<u64> = (0..eb.div_ceil(PIECE)).map(|i| i * PIECE).collect();
        for group in offsets.chunks(ZEROING_WRITES) {
            let writes = group.iter().map(|&offset| {
                let n = PIECE.min(eb - offset) as usize;
                self.volume
                    .write_at(resolve(offset), Bytes::from_static(&ZEROES[..n]), false)
            });
            for r in futures_util::future::join_all(writes).await {
                r?;
            }
        }
        // Durable before the extent counts as clean.
        self.volume.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_never_cross_a_piece_boundary_and_cover_the_range() {
        assert_eq!(pieces(0, 4096, PIECE), vec![(0, 4096)]);
        let p = pieces(PIECE - 4096, 3 * PIECE, PIECE);
        assert_eq!(p.first(), Some(&(PIECE - 4096, 4096)));
        assert_eq!(p.iter().map(|x| x.1).sum::<u64>(), 3 * PIECE);
        assert!(p.iter().all(|(at, n)| at / PIECE == (at + n - 1) / PIECE));
    }
}
