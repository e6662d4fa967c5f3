//! The durable form of a node's block versions: checkpoints a restarted node
//! restores, so a rebuild copies only what it lacks (see the engine's
//! `checkpoint` module for when a version may be written down).
//!
//! A file of framed records ([`crate::record`]), each a postcard `Record`:
//!
//! - a full checkpoint names the device it describes and holds every version; it
//!   replaces the file (the driver writes it aside and renames it over);
//! - a delta holds versions that changed since, appended. Version 0 means the
//!   block's version is forgotten (a write to it failed: its contents are unknown).
//!
//! Versions are runs `(first block, blocks, version)`: a write gives all its blocks
//! one version, so runs are short to write down.
//!
//! Replay trusts a file only if it starts with a full checkpoint of the same
//! device: a replaced disk must not inherit the old one's versions. It stops at a
//! torn or corrupt record, and at a run past the volume's end.

use crate::ids::{Lba, Version};
use crate::record::{frame, Frames};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A run of blocks at one version: (first block, blocks, version; 0: forgotten).
pub type VersionRun = (Lba, u64, Version);

#[derive(Serialize, Deserialize)]
struct Record {
    /// Set on a full checkpoint: the device it describes.
    device: Option<String>,
    /// (first block, blocks, version).
    runs: Vec<(u64, u64, u64)>,
}

/// One record: a full checkpoint of `device` if given, else a delta.
pub fn encode(device: Option<&str>, runs: &[VersionRun]) -> Vec<u8> {
    let record = Record {
        device: device.map(str::to_owned),
        runs: runs.iter().map(|&(l, n, v)| (l.0, n, v.0)).collect(),
    };
    frame(&postcard::to_allocvec(&record).expect("a record always encodes"))
}

/// Runs of equal versions over consecutive blocks, in block order.
pub fn runs<'a>(versions: impl IntoIterator<Item = (&'a Lba, &'a Version)>) -> Vec<VersionRun> {
    runs_by(versions.into_iter().map(|(l, v)| (l.0, *v)), u64::MAX)
        .into_iter()
        .map(|(first, n, v)| (Lba(first), n, v))
        .collect()
}

/// Runs of consecutive blocks with equal keys, at most `max` blocks each, from
/// `blocks` in block order: (first block, blocks, key).
pub fn runs_by<K: PartialEq>(
    blocks: impl IntoIterator<Item = (u64, K)>,
    max: u64,
) -> Vec<(u64, u64, K)> {
    let mut out: Vec<(u64, u64, K)> = Vec::new();
    for (b, key) in blocks {
        match out.last_mut() {
            Some((first, n, k)) if *k == key && *first + *n == b && *n < max => *n += 1,
            _ => out.push((b, 1, key)),
        }
    }
    out
}

/// What a versions file holds for this device.
#[derive(Debug, Default)]
pub struct Restored {
    /// The version of each version grain, by its first block, as last
    /// checkpointed (a run covering part of a grain leaves it out: what the
    /// grain holds is not known).
    pub versions: BTreeMap<Lba, Version>,
    /// Bytes of trusted records from the start; anything after is cut.
    pub valid_len: usize,
    /// Trusted records read.
    pub records: usize,
    /// The file described another device (or began with no full checkpoint):
    /// nothing in it is trusted. The device it names, if any.
    pub foreign: Option<String>,
}

/// Replay a versions file's `bytes` for `device`, a volume of `volume_blocks`
/// in version grains of `grain_blocks`. Memory: one entry per grain.
pub fn replay(bytes: &[u8], device: &str, volume_blocks: u64, grain_blocks: u64) -> Restored {
    let gb = grain_blocks.max(1);
    let mut out = Restored::default();
    let mut frames = Frames::new(bytes);
    while let Some(payload) = frames.next() {
        let Ok(record) = postcard::from_bytes::<Record>(payload) else {
            break;
        };
        match (&record.device, out.records) {
            (Some(d), _) if d != device => {
                if out.records == 0 {
                    out.foreign = Some(d.clone());
                }
                break;
            }
            (Some(_), _) => out.versions.clear(),
            (None, 0) => {
                out.foreign = Some(String::new());
                break;
            }
            (None, _) => {}
        }
        let in_range = record
            .runs
            .iter()
            .all(|&(l, n, _)| l.checked_add(n).is_some_and(|end| end <= volume_blocks));
        if !in_range {
            break;
        }
        for (l, n, v) in record.runs {
            for g in l / gb..(l + n).div_ceil(gb) {
                let start = g * gb;
                let whole = l <= start && start + gb <= l + n;
                if v == 0 || !whole {
                    out.versions.remove(&Lba(start));
                } else {
                    out.versions.insert(Lba(start), Version(v));
                }
            }
        }
        out.valid_len = frames.valid_len();
        out.records += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: u64) -> Version {
        Version(n)
    }

    #[test]
    fn a_full_checkpoint_and_deltas_replay_and_forgets_remove() {
        let full: BTreeMap<Lba, Version> = [
            (Lba(0), v(5)),
            (Lba(1), v(5)),
            (Lba(2), v(6)),
            (Lba(9), v(6)),
        ]
        .into_iter()
        .collect();
        let full_runs = runs(&full);
        assert_eq!(
            full_runs,
            vec![(Lba(0), 2, v(5)), (Lba(2), 1, v(6)), (Lba(9), 1, v(6))]
        );
        let mut file = encode(Some("dev-a"), &full_runs);
        file.extend(encode(None, &[(Lba(1), 2, v(7)), (Lba(9), 1, v(0))]));
        let intact = file.len();
        let torn = encode(None, &[(Lba(3), 1, v(8))]);
        file.extend_from_slice(&torn[..torn.len() - 2]);

        let r = replay(&file, "dev-a", 16, 1);
        assert_eq!(r.foreign, None);
        assert_eq!((r.records, r.valid_len), (2, intact));
        let got: Vec<(u64, u64)> = r.versions.iter().map(|(l, v)| (l.0, v.0)).collect();
        assert_eq!(got, vec![(0, 5), (1, 7), (2, 7)]);

        // A later full checkpoint replaces everything before it.
        file.truncate(intact);
        file.extend(encode(Some("dev-a"), &[(Lba(4), 1, v(9))]));
        let r = replay(&file, "dev-a", 16, 1);
        assert_eq!(
            r.versions.into_iter().collect::<Vec<_>>(),
            vec![(Lba(4), v(9))]
        );
    }

    #[test]
    fn grains_are_restored_only_where_a_run_covers_them() {
        // Grains of 4: a run of 0-7 covers grains 0 and 1; a delta of block 9
        // alone leaves grain 2 unknown; a forget of 4 forgets grain 1.
        let mut file = encode(Some("dev-a"), &[(Lba(0), 8, v(5)), (Lba(8), 4, v(6))]);
        file.extend(encode(None, &[(Lba(9), 1, v(7)), (Lba(4), 1, v(0))]));
        let r = replay(&file, "dev-a", 16, 4);
        assert_eq!(
            r.versions.into_iter().collect::<Vec<_>>(),
            vec![(Lba(0), v(5))]
        );
    }

    #[test]
    fn another_device_a_headless_file_or_a_run_past_the_end_is_not_trusted() {
        let file = encode(Some("dev-a"), &[(Lba(0), 4, Version(3))]);
        let r = replay(&file, "dev-b", 16, 1);
        assert_eq!(r.foreign.as_deref(), Some("dev-a"));
        assert!(r.versions.is_empty());
        assert_eq!(r.valid_len, 0);

        let r = replay(&encode(None, &[(Lba(0), 1, Version(3))]), "dev-a", 16, 1);
        assert_eq!(r.foreign.as_deref(), Some(""));
        assert!(r.versions.is_empty());

        let mut file = encode(Some("dev-a"), &[(Lba(0), 4, Version(3))]);
        let good = file.len();
        file.extend(encode(None, &[(Lba(15), 2, Version(4))]));
        file.extend(encode(None, &[(Lba(u64::MAX), 2, Version(4))]));
        let r = replay(&file, "dev-a", 16, 1);
        assert_eq!((r.records, r.valid_len, r.versions.len()), (1, good, 4));
        assert_eq!(replay(&[], "dev-a", 16, 1).records, 0);
    }
}
