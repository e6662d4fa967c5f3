//! Snapshots, clones and redirect-on-write.
//!
//! A snapshot is a copy of its volume's table (which pool extent holds each
//! of its extents), taken by one command: one point in the volume's write
//! history. From then on the extents in it are frozen: a pool extent may be
//! written only while exactly one table refers to it, a volume's, and no
//! redirected extent reads from it ([`ClusterState::frozen`]). The first write
//! into a frozen extent redirects the volume's extent to a new pool extent
//! ([`Command::Redirect`]) that reads each of its [`CHUNKS`] chunks from the
//! frozen one (its base) until the chunk is copied over and marked filled
//! ([`Command::Filled`]); the write goes to the new extent once its chunk is.
//! A chunk is an extent's 64th part (1 MiB of a 64 MiB extent: one request's
//! worth, so a copy is one read and one write; the map holds 8 bytes of
//! bitmap per redirected extent, so it stays within its frame).
//!
//! A clone is a volume whose table starts as a snapshot's: it shares the
//! snapshot's extents, frozen, and redirects as it writes. Deleting a
//! snapshot with live clones is allowed: extents are kept as long as any
//! table refers to them or a redirected extent reads from them (reference
//! counts, recounted by [`ClusterState::collect`]), and freed (dirty, then
//! zeroed) once none does.
//!
//! The snapshot command starts a new reign of every extent it freezes, so a
//! primary that has applied it refuses a write sent under an older map. A
//! primary that has not yet applied it may still take one: so a front end
//! that sees a new snapshot of a volume (its `generation`) first reads one
//! block of every extent it froze at the snapshot's epoch, which each primary
//! serves only once it has applied the snapshot, before it lets any write of
//! the volume go (`weir snapshot create` does the same before it returns).
//! No write that starts after that lands in the snapshot, and none that
//! lands in it started after one that did not.

use super::{Change, ClusterState, NamedVolume, Refusal};
use crate::ids::{Epoch, ExtentId};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Chunks per extent: the unit of redirect-on-write.
pub const CHUNKS: u32 = 64;
/// Most snapshots a volume may have.
pub const MAX_SNAPSHOTS: usize = 64;
/// Most named volumes (clones included) the map holds.
pub const MAX_VOLUMES: usize = 1024;
/// Most entries all volumes' and snapshots' tables hold together: the map
/// travels in one frame (about 6 bytes an entry, beside up to 16 Ki extents'
/// placements).
pub const MAX_TABLE_ENTRIES: u64 = 1 << 15;
/// Every chunk filled.
const ALL: u64 = u64::MAX;

/// A snapshot: its volume's table at one point of its write history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The pool extent of each of the volume's extents then.
    pub table: BTreeMap<u64, ExtentId>,
    /// The volume's generation it started.
    pub generation: u64,
}

/// A redirected extent: chunks not yet filled read from `base`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Row {
    /// The frozen extent it took the place of.
    pub base: ExtentId,
    /// Bit `c`: chunk `c` holds its own data.
    pub filled: u64,
    /// The reign the extent was in when it was redirected: a copy written
    /// before cannot be this row's.
    pub since: Epoch,
}

impl Row {
    /// Whether chunk `chunk` reads from this extent itself.
    pub fn has(&self, chunk: u32) -> bool {
        self.filled & (1 << chunk) != 0
    }
}

impl ClusterState {
    /// How many references each pool extent has: tables (volumes' and
    /// snapshots') and redirected extents reading from it.
    pub fn references(&self) -> BTreeMap<ExtentId, u32> {
        let mut refs: BTreeMap<ExtentId, u32> = BTreeMap::new();
        for v in self.named.values() {
            let tables = std::iter::once(&v.alloc).chain(v.snapshots.values().map(|s| &s.table));
            for &e in tables.flat_map(|t| t.values()) {
                *refs.entry(e).or_default() += 1;
            }
        }
        for row in self.rows.values() {
            *refs.entry(row.base).or_default() += 1;
        }
        refs
    }

    /// Entries of every volume's and snapshot's table.
    pub fn table_entries(&self) -> u64 {
        let tables = |v: &NamedVolume| {
            v.alloc.len() as u64
                + v.snapshots
                    .values()
                    .map(|s| s.table.len() as u64)
                    .sum::<u64>()
        };
        self.named.values().map(tables).sum()
    }

    /// Whether `extent`, of a volume's table, may not be written in place:
    /// another table or a redirected extent refers to it too.
    pub fn frozen(&self, refs: &BTreeMap<ExtentId, u32>, extent: ExtentId) -> bool {
        refs.get(&extent).is_some_and(|&n| n > 1)
    }

    /// The pool extent that holds chunk `chunk` of `extent`: itself, or the
    /// base it reads that chunk from (followed down the chain).
    pub fn holder(&self, mut extent: ExtentId, chunk: u32) -> ExtentId {
        // Each step goes to an older extent; the chain is at most as long as
        // the snapshots taken, and `validate` refuses a cycle.
        for _ in 0..=self.rows.len() {
            match self.rows.get(&extent) {
                Some(row) if !row.has(chunk) => extent = row.base,
                _ => break,
            }
        }
        extent
    }

    fn volume_mut(&mut self, name: &str) -> Result<&mut NamedVolume, Refusal> {
        self.named
            .get_mut(name)
            .ok_or_else(|| Refusal::UnknownName(name.to_string()))
    }

    fn snapshot_of(&self, name: &str, snap: &str) -> Result<&super::Snapshot, Refusal> {
        let v = self
            .named
            .get(name)
            .ok_or_else(|| Refusal::UnknownName(name.to_string()))?;
        v.snapshots
            .get(snap)
            .ok_or_else(|| Refusal::UnknownSnapshot {
                name: name.to_string(),
                snap: snap.to_string(),
            })
    }

    pub(super) fn snapshot(&mut self, name: &str, snap: &str) -> Result<Vec<Change>, Refusal> {
        super::check_name(snap)?;
        let v = self.volume_mut(name)?;
        if v.snapshots.contains_key(snap) {
            return Err(Refusal::KnownSnapshot {
                name: name.to_string(),
                snap: snap.to_string(),
            });
        }
        if v.snapshots.len() >= MAX_SNAPSHOTS {
            return Err(Refusal::TooLarge("snapshots of one volume"));
        }
        let adds = v.alloc.len() as u64;
        if self.table_entries() + adds > MAX_TABLE_ENTRIES {
            return Err(Refusal::TooLarge("volumes' and snapshots' table entries"));
        }
        let v = self.volume_mut(name)?;
        v.generation += 1;
        let snapshot = super::Snapshot {
            table: v.alloc.clone(),
            generation: v.generation,
        };
        let frozen: Vec<ExtentId> = snapshot.table.values().copied().collect();
        v.snapshots.insert(snap.to_string(), snapshot);
        for id in frozen {
            if let Some(ext) = self.extents.get_mut(&id) {
                super::volumes::new_reign(ext);
            }
        }
        Ok(vec![Change::Membership])
    }

    pub(super) fn delete_snapshot(
        &mut self,
        name: &str,
        snap: &str,
    ) -> Result<Vec<Change>, Refusal> {
        self.snapshot_of(name, snap)?;
        self.volume_mut(name)?.snapshots.remove(snap);
        self.collect();
        Ok(vec![Change::Membership])
    }

    pub(super) fn clone_volume(
        &mut self,
        name: &str,
        snap: &str,
        new: &str,
    ) -> Result<Vec<Change>, Refusal> {
        super::check_name(new)?;
        let table = self.snapshot_of(name, snap)?.table.clone();
        if self.named.contains_key(new) {
            return Err(Refusal::KnownName(new.to_string()));
        }
        if self.named.len() >= MAX_VOLUMES {
            return Err(Refusal::TooLarge("volumes"));
        }
        if self.table_entries() + table.len() as u64 > MAX_TABLE_ENTRIES {
            return Err(Refusal::TooLarge("volumes' and snapshots' table entries"));
        }
        let source = &self.named[name];
        let clone = NamedVolume {
            id: self.next_volume,
            extents: source.extents,
            alloc: table,
            snapshots: BTreeMap::new(),
            generation: 0,
            origin: Some(format!("{name}@{snap}")),
            size_bytes: source.size_bytes,
            qos: Default::default(),
            key_check: source.key_check,
        };
        self.next_volume += 1;
        self.named.insert(new.to_string(), clone);
        Ok(vec![Change::Membership])
    }

    pub(super) fn rollback(&mut self, name: &str, snap: &str) -> Result<Vec<Change>, Refusal> {
        let table = self.snapshot_of(name, snap)?.table.clone();
        let v = self.volume_mut(name)?;
        v.alloc = table;
        // Writes sent under the old table go to extents freed now (a new
        // reign) or frozen: none lands in the rolled-back volume.
        v.generation += 1;
        self.collect();
        Ok(vec![Change::Membership])
    }

    pub(super) fn redirect(
        &mut self,
        name: &str,
        index: u64,
        from: ExtentId,
    ) -> Result<Vec<Change>, Refusal> {
        let refs = self.references();
        let v = self
            .named
            .get(name)
            .ok_or_else(|| Refusal::UnknownName(name.to_string()))?;
        if v.alloc.get(&index) != Some(&from) || !self.frozen(&refs, from) {
            return Err(Refusal::NotFrozen(from));
        }
        if self.table_entries() >= MAX_TABLE_ENTRIES {
            return Err(Refusal::TooLarge("volumes' and snapshots' table entries"));
        }
        let id = self
            .take_free()
            .ok_or(Refusal::NoSpace { needed: 1, free: 0 })?;
        let since = self.extents.get(&id).map_or(Epoch(0), |e| e.primary_since);
        self.rows.insert(
            id,
            Row {
                base: from,
                filled: 0,
                since,
            },
        );
        self.volume_mut(name)?.alloc.insert(index, id);
        Ok(vec![Change::Membership])
    }

    pub(super) fn filled(
        &mut self,
        extent: ExtentId,
        chunk: u8,
        since: Epoch,
    ) -> Result<Vec<Change>, Refusal> {
        let ext = self
            .extents
            .get_mut(&extent)
            .ok_or(Refusal::UnknownExtent(extent))?;
        let Some(row) = self.rows.get_mut(&extent) else {
            return Err(Refusal::NotFrozen(extent));
        };
        if u32::from(chunk) >= CHUNKS || row.has(u32::from(chunk)) {
            return Err(Refusal::NotFrozen(extent));
        }
        // A copy written in any reign since the redirect holds the chunk
        // (the base does not change; a later reign's primary holds every
        // write acknowledged before): other chunks' fills, which each start
        // a reign, do not make it copy again.
        if since < row.since || since > ext.primary_since {
            return Err(Refusal::StaleEpoch {
                got: since,
                current: ext.primary_since,
            });
        }
        row.filled |= 1 << chunk;
        // A copy of this chunk still on its way (another front end's) is
        // refused from now on: it would land over the writes that follow.
        super::volumes::new_reign(ext);
        if row.filled == ALL {
            // Every chunk is its own: the base may go.
            self.rows.remove(&extent);
            self.collect();
        }
        Ok(vec![Change::Membership])
    }

    /// Free every handed-out extent nothing refers to any more (dirty, in a
    /// new reign, its row dropped).
    pub(super) fn collect(&mut self) {
        // Rows of unreferenced extents go first: they hold their bases.
        loop {
            let refs = self.references();
            let orphans: Vec<ExtentId> = self
                .rows
                .keys()
                .copied()
                .filter(|e| !refs.contains_key(e))
                .collect();
            if orphans.is_empty() {
                break;
            }
            for e in orphans {
                self.rows.remove(&e);
            }
        }
        let refs = self.references();
        let garbage: Vec<ExtentId> = (0..self.next_free_extent)
            .map(ExtentId)
            .filter(|e| !refs.contains_key(e) && !self.dirty.contains(e) && !self.clean.contains(e))
            .collect();
        for e in garbage {
            self.release(e);
        }
    }

    /// The snapshots' and rows' invariants.
    pub(super) fn validate_snapshots(&self, referenced: &BTreeSet<ExtentId>) -> Result<(), String> {
        for (name, v) in &self.named {
            if v.snapshots.len() > MAX_SNAPSHOTS {
                return Err(format!("volume {name:?} has too many snapshots"));
            }
            for (snap, s) in &v.snapshots {
                if s.generation == 0 || s.generation > v.generation {
                    return Err(format!("snapshot {name}@{snap} from a later generation"));
                }
                if s.table.keys().any(|&i| i >= v.extents) {
                    return Err(format!("snapshot {name}@{snap} past its volume's end"));
                }
            }
        }
        for (e, row) in &self.rows {
            if !referenced.contains(e) || row.base == *e || row.filled == ALL {
                return Err(format!("{e}: a row of no use"));
            }
        }
        // Chains end: following bases never comes back.
        for &start in self.rows.keys() {
            let mut at = start;
            for step in 0..=self.rows.len() {
                match self.rows.get(&at) {
                    Some(row) => at = row.base,
                    None => break,
                }
                if step == self.rows.len() {
                    return Err(format!("{start}: its bases form a cycle"));
                }
            }
        }
        Ok(())
    }
}
