//! Named volumes and the pool's space: which pool extent holds which extent of
//! which volume, and which pool extents are free.
//!
//! A volume is a table from its extent indexes to pool extents. A thin volume
//! starts with an empty table and gets an extent at the first write into it
//! ([`Command::Allocate`]); an index with none reads as zeroes. A thick volume
//! (the simulator's static maps) takes all its extents when it is created.
//!
//! Every pool extent below `next_free_extent` is in exactly one of: in use
//! (a volume's or a snapshot's table refers to it, or a redirected extent
//! reads from it: [`super::snapshots`]), `dirty` (freed by a delete, a TRIM or
//! a snapshot's end, still holding the old data) or `clean` (zeroed since it
//! was freed). Extents from
//! `next_free_extent` on were never handed out. Only clean and never-used
//! extents are allocated, so a volume never reads another's data.
//!
//! An extent changes hands only with a new reign of its primary (its epoch
//! moves and `primary_since` with it): a request sent under the old owner is
//! refused by the primary, and the client, which resolves a volume's block to
//! a pool block afresh on every attempt, finds the extent is no longer its
//! volume's. So every write the old owner's clients get in lands before the
//! first of the new owner's.

use super::{Change, ClusterState, ExtentState, NamedVolume, Qos, Refusal};
use crate::ids::{Epoch, ExtentId};

/// Most extents one volume may span (its table's bound; a thin volume may be
/// larger than the pool, up to this).
pub const MAX_VOLUME_EXTENTS: u64 = super::MAX_POOL_EXTENTS;

/// A new reign of `ext`'s primary: requests from before are refused.
pub(super) fn new_reign(ext: &mut ExtentState) -> Epoch {
    ext.epoch = ext.epoch.next();
    ext.primary_since = ext.epoch;
    ext.epoch
}

impl ClusterState {
    /// Pool extents that may be allocated: clean ones and those never handed
    /// out.
    pub fn free_extents(&self) -> u64 {
        (self.extents.len() as u64).saturating_sub(self.next_free_extent) + self.clean.len() as u64
    }

    /// Pool extents in use: by volumes, snapshots, or redirected extents.
    pub fn allocated_extents(&self) -> u64 {
        self.references().len() as u64
    }

    /// Take the next free extent: the lowest clean one, in a new reign (the
    /// reclaimer wrote to it), else the first never handed out (which no one
    /// ever wrote to).
    pub(super) fn take_free(&mut self) -> Option<ExtentId> {
        if let Some(id) = self.clean.pop_first() {
            if let Some(ext) = self.extents.get_mut(&id) {
                new_reign(ext);
            }
            return Some(id);
        }
        if self.next_free_extent < self.extents.len() as u64 {
            self.next_free_extent += 1;
            return Some(ExtentId(self.next_free_extent - 1));
        }
        None
    }

    /// Hand `id` back: dirty until the reclaimer has zeroed it.
    pub(super) fn release(&mut self, id: ExtentId) {
        if let Some(ext) = self.extents.get_mut(&id) {
            new_reign(ext);
        }
        self.dirty.insert(id);
    }

    pub(super) fn create_named(
        &mut self,
        name: &str,
        (size_bytes, extents): (u64, u64),
        (qos, key_check): (Qos, Option<[u8; 16]>),
        thin: bool,
    ) -> Result<Vec<Change>, Refusal> {
        super::check_name(name)?;
        qos.check().map_err(Refusal::BadQos)?;
        if size_bytes == 0 || extents == 0 {
            return Err(Refusal::BadName("a volume has a size above zero"));
        }
        if extents > MAX_VOLUME_EXTENTS {
            return Err(Refusal::TooLarge("volume extents"));
        }
        if self.named.contains_key(name) {
            return Err(Refusal::KnownName(name.to_string()));
        }
        if self.named.len() >= super::MAX_VOLUMES {
            return Err(Refusal::TooLarge("volumes"));
        }
        if !thin && self.table_entries() + extents > super::MAX_TABLE_ENTRIES {
            return Err(Refusal::TooLarge("volumes' and snapshots' table entries"));
        }
        let free = self.free_extents();
        if !thin && extents > free {
            return Err(Refusal::NoSpace {
                needed: extents,
                free,
            });
        }
        let mut volume = NamedVolume {
            id: self.next_volume,
            extents,
            alloc: Default::default(),
            snapshots: Default::default(),
            generation: 0,
            origin: None,
            size_bytes,
            qos,
            key_check,
        };
        if !thin {
            for index in 0..extents {
                let id = self.take_free().expect("counted free");
                volume.alloc.insert(index, id);
            }
        }
        self.next_volume += 1;
        self.named.insert(name.to_string(), volume);
        Ok(vec![Change::Membership])
    }

    pub(super) fn delete_named(&mut self, name: &str) -> Result<Vec<Change>, Refusal> {
        self.named
            .remove(name)
            .ok_or_else(|| Refusal::UnknownName(name.to_string()))?;
        // Its snapshots go with it; what a clone shares stays.
        self.collect();
        Ok(vec![Change::Membership])
    }

    pub(super) fn allocate(&mut self, name: &str, index: u64) -> Result<Vec<Change>, Refusal> {
        let volume = self
            .named
            .get(name)
            .ok_or_else(|| Refusal::UnknownName(name.to_string()))?;
        if index >= volume.extents {
            return Err(Refusal::BadIndex { index });
        }
        if volume.alloc.contains_key(&index) {
            return Err(Refusal::Allocated { index });
        }
        if self.table_entries() >= super::MAX_TABLE_ENTRIES {
            return Err(Refusal::TooLarge("volumes' and snapshots' table entries"));
        }
        let id = self
            .take_free()
            .ok_or(Refusal::NoSpace { needed: 1, free: 0 })?;
        self.named
            .get_mut(name)
            .expect("looked up")
            .alloc
            .insert(index, id);
        Ok(vec![Change::Membership])
    }

    pub(super) fn resize(
        &mut self,
        name: &str,
        size_bytes: u64,
        (extents, extent_bytes): (u64, u64),
    ) -> Result<Vec<Change>, Refusal> {
        if size_bytes == 0 || extent_bytes == 0 || extents != size_bytes.div_ceil(extent_bytes) {
            return Err(Refusal::BadName(
                "a volume has a size above zero, in whole extents",
            ));
        }
        if extents > MAX_VOLUME_EXTENTS {
            return Err(Refusal::TooLarge("volume extents"));
        }
        let volume = self
            .named
            .get_mut(name)
            .ok_or_else(|| Refusal::UnknownName(name.to_string()))?;
        // The asker's extent size must be the one the volume was cut by, or
        // `extents` would not say which of its extents are past the end. The
        // map does not hold the pool's extent size (its extents are counted,
        // not sized), so this checks that the asker's fits the volume's shape,
        // which catches most mistakes but not all (a one-extent volume fits
        // any larger size); every member's asker has the cluster's.
        if volume.extents != volume.size_bytes.div_ceil(extent_bytes) {
            return Err(Refusal::BadName(
                "the extent size does not fit the volume's",
            ));
        }
        if size_bytes < volume.size_bytes {
            let no = |why| {
                Err(Refusal::NoShrink {
                    name: name.to_string(),
                    why,
                })
            };
            if !volume.snapshots.is_empty() {
                return no("it has snapshots");
            }
            if !size_bytes.is_multiple_of(extent_bytes) {
                return no("it shrinks to whole extents only");
            }
            // Past the end: released as a TRIM releases them.
            volume.alloc.retain(|&index, _| index < extents);
        }
        let shrinks = extents < volume.extents;
        volume.size_bytes = size_bytes;
        volume.extents = extents;
        if shrinks {
            self.collect();
        }
        Ok(vec![Change::Membership])
    }

    pub(super) fn trim_extent(&mut self, name: &str, index: u64) -> Result<Vec<Change>, Refusal> {
        let volume = self
            .named
            .get_mut(name)
            .ok_or_else(|| Refusal::UnknownName(name.to_string()))?;
        volume
            .alloc
            .remove(&index)
            .ok_or(Refusal::Unallocated { index })?;
        // Its snapshots' copy of the extent stays.
        self.collect();
        Ok(vec![Change::Membership])
    }

    pub(super) fn zeroed(
        &mut self,
        extent: ExtentId,
        since: Epoch,
    ) -> Result<Vec<Change>, Refusal> {
        let ext = self
            .extents
            .get(&extent)
            .ok_or(Refusal::UnknownExtent(extent))?;
        if !self.dirty.contains(&extent) {
            return Err(Refusal::NotDirty(extent));
        }
        // Zeroes written in an earlier reign may have been written before a
        // later owner's data (or not by the primary that holds the extent
        // now): only a zeroing of this reign counts.
        if ext.primary_since != since {
            return Err(Refusal::StaleEpoch {
                got: since,
                current: ext.primary_since,
            });
        }
        self.dirty.remove(&extent);
        self.clean.insert(extent);
        Ok(vec![Change::Membership])
    }

    /// The volumes' and the free lists' invariants (see the module
    /// documentation).
    pub(super) fn validate_volumes(&self) -> Result<(), String> {
        if self.next_free_extent > self.extents.len() as u64 {
            return Err("extents handed out past the pool's end".into());
        }
        let mut ids = std::collections::BTreeSet::new();
        for (name, v) in &self.named {
            if v.extents == 0 || v.extents > MAX_VOLUME_EXTENTS {
                return Err(format!("volume {name:?} spans {} extents", v.extents));
            }
            if v.id >= self.next_volume || !ids.insert(v.id) {
                return Err(format!("volume {name:?}: number {} reused", v.id));
            }
            if let Err(e) = v.qos.check() {
                return Err(format!("volume {name:?}: {e}"));
            }
            if v.alloc.keys().any(|&i| i >= v.extents) {
                return Err(format!("volume {name:?}: an extent past its end"));
            }
        }
        let referenced: std::collections::BTreeSet<ExtentId> =
            self.references().into_keys().collect();
        if referenced.iter().any(|e| e.0 >= self.next_free_extent) {
            return Err("a volume refers to an extent never handed out".into());
        }
        let mut seen = referenced.clone();
        for id in self.clean.iter().chain(&self.dirty) {
            if id.0 >= self.next_free_extent || !seen.insert(*id) {
                return Err(format!("free {id} is in use or listed twice"));
            }
        }
        if seen.len() as u64 != self.next_free_extent {
            return Err("a handed-out extent is in no table and no free list".into());
        }
        self.validate_snapshots(&referenced)
    }
}
