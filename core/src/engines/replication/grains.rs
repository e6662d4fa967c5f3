//! The versions a node holds, per grain: a fixed run of blocks inside one extent
//! (DESIGN.md section 4.1). Memory is eight bytes per grain of each extent the
//! node has written, allocated on the extent's first write: with the default
//! grain of [`DEFAULT_GRAIN_BYTES`], 32 MiB per TiB written, whatever the write
//! pattern (a map per block cost about 60 bytes per 4 KiB block, 15 GiB per TiB).
//!
//! A grain's state is the highest version claimed for any of its blocks, and
//! whether it is *whole*: whether the node holds (or has claimed) every write to
//! the grain up to that version. A write that covers a grain makes it whole. A
//! write that covers only part of it keeps it whole only if the node's version
//! of the grain is the one the primary had before the write (`prev`, carried
//! with every forwarded write): otherwise the node missed a write to the grain,
//! and the grain stays *broken* until a write or a rebuild copy covers it. A
//! device write that fails breaks the grains it touched. A rebuild's probe asks
//! for every grain that is broken or older than the primary's.
//!
//! Versions are given in order per extent, so a grain's version never goes
//! back; a claim at or below it is a [`WeirError::VersionRegression`].

use crate::error::WeirError;
use crate::ids::{Lba, Version};
use std::collections::BTreeMap;

/// Default grain: a quarter MiB (64 blocks of 4 KiB). Smaller grains copy less
/// after a short absence; larger ones take less memory (8 bytes per grain).
pub const DEFAULT_GRAIN_BYTES: u64 = 256 << 10;

/// The broken flag, in a grain's word (versions stay below 2^63).
const BROKEN: u64 = 1 << 63;

/// Blocks per grain for a volume of `block_size`-byte blocks, `extent_blocks`
/// per extent, `capacity_blocks` in all and requests of at most
/// `max_request_blocks`, asked for `grain_bytes` (0: [`DEFAULT_GRAIN_BYTES`]): the
/// largest power of two of blocks no larger than that and than a request (a
/// rebuild copies a grain in one message) that divides the extent and the volume
/// (a grain never straddles two extents, nor runs past the end).
pub fn grain_blocks(
    grain_bytes: u64,
    block_size: u32,
    (extent_blocks, capacity_blocks): (u64, u64),
    max_request_blocks: u32,
) -> u64 {
    let asked = match grain_bytes {
        0 => DEFAULT_GRAIN_BYTES,
        b => b,
    } / u64::from(block_size.max(1));
    let most = asked
        .min(u64::from(max_request_blocks))
        .min(extent_blocks)
        .max(1);
    let mut g = 1u64 << (63 - most.leading_zeros());
    while !extent_blocks.is_multiple_of(g) || !capacity_blocks.is_multiple_of(g) {
        g /= 2;
    }
    g
}

/// One grain's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grain {
    /// The highest version claimed for any of its blocks (0: never written).
    pub version: Version,
    /// Every write to it up to `version` is held (or claimed) here.
    pub whole: bool,
}

impl Grain {
    /// The version a probe compares: 0 if broken (what the node holds is not
    /// known), as for a grain never written.
    pub fn held(self) -> Version {
        if self.whole {
            self.version
        } else {
            Version(0)
        }
    }
}

/// The grains of every extent a node has written.
#[derive(Debug)]
pub struct Grains {
    grain_blocks: u64,
    extent_blocks: u64,
    /// Per extent (by index), one word per grain: version | [`BROKEN`].
    extents: BTreeMap<u64, Box<[u64]>>,
}

impl Grains {
    /// Grains of `grain_blocks` blocks in extents of `extent_blocks`.
    pub fn new(grain_blocks: u64, extent_blocks: u64) -> Self {
        assert!(
            grain_blocks > 0 && extent_blocks.is_multiple_of(grain_blocks),
            "a grain of {grain_blocks} blocks must divide an extent of {extent_blocks}"
        );
        Grains {
            grain_blocks,
            extent_blocks,
            extents: BTreeMap::new(),
        }
    }

    /// Blocks per grain.
    pub fn grain_blocks(&self) -> u64 {
        self.grain_blocks
    }

    /// The grain (global index) holding `lba`.
    pub fn grain_of(&self, lba: Lba) -> u64 {
        lba.0 / self.grain_blocks
    }

    /// The first block of grain `g`.
    pub fn start_of(&self, g: u64) -> Lba {
        Lba(g * self.grain_blocks)
    }

    /// The grains `[lba, lba + blocks)` touches.
    pub fn touched(&self, lba: Lba, blocks: u64) -> std::ops::Range<u64> {
        debug_assert!(blocks > 0, "an empty range touches no grain");
        self.grain_of(lba)..self.grain_of(Lba(lba.0 + blocks - 1)) + 1
    }

    /// Whether `[lba, lba + blocks)` covers all of grain `g`.
    pub fn covers(&self, lba: Lba, blocks: u64, g: u64) -> bool {
        let start = self.start_of(g).0;
        lba.0 <= start && start + self.grain_blocks <= lba.0 + blocks
    }

    fn per_extent(&self) -> u64 {
        self.extent_blocks / self.grain_blocks
    }

    fn word(&self, g: u64) -> u64 {
        let per = self.per_extent();
        self.extents
            .get(&(g / per))
            .map_or(0, |grains| grains[(g % per) as usize])
    }

    fn word_mut(&mut self, g: u64) -> &mut u64 {
        let per = self.per_extent();
        let grains = self
            .extents
            .entry(g / per)
            .or_insert_with(|| vec![0; per as usize].into_boxed_slice());
        &mut grains[(g % per) as usize]
    }

    /// Grain `g`'s state.
    pub fn get(&self, g: u64) -> Grain {
        let w = self.word(g);
        Grain {
            version: Version(w & !BROKEN),
            whole: w & BROKEN == 0,
        }
    }

    /// Set grain `g` to `version`, whole (a write or a copy covered it), or
    /// broken.
    pub fn set(&mut self, g: u64, version: Version, whole: bool) {
        assert!(version.0 & BROKEN == 0, "version {version} out of range");
        *self.word_mut(g) = version.0 | if whole { 0 } else { BROKEN };
    }

    /// Mark grain `g` broken (a write to it failed: its contents are unknown).
    pub fn break_grain(&mut self, g: u64) {
        *self.word_mut(g) |= BROKEN;
    }

    /// Whether `version` fits a grain's word (a peer could send any number).
    pub fn in_range(version: Version) -> bool {
        version.0 & BROKEN == 0
    }

    /// Claim `version` for `[lba, lba + blocks)`, `prev` being the primary's
    /// versions of the first and last grains touched before this write. Refused,
    /// changing nothing, if any grain touched is at `version` or above.
    pub fn claim(
        &mut self,
        lba: Lba,
        blocks: u64,
        version: Version,
        prev: (Version, Version),
    ) -> Result<(), WeirError> {
        let touched = self.touched(lba, blocks);
        if !Self::in_range(version) || touched.clone().any(|g| self.get(g).version >= version) {
            return Err(WeirError::VersionRegression);
        }
        let (first, last) = (touched.start, touched.end - 1);
        for g in touched {
            let whole = self.covers(lba, blocks, g) || {
                let held = self.get(g);
                let before = if g == first { prev.0 } else { prev.1 };
                debug_assert!(g == first || g == last, "a middle grain is covered");
                held.whole && held.version == before
            };
            self.set(g, version, whole);
        }
        debug_assert!(
            self.touched(lba, blocks)
                .all(|g| self.get(g).version == version),
            "a claim of {version} left a grain behind"
        );
        Ok(())
    }

    /// The versions of the first and last grains `[lba, lba + blocks)` touches,
    /// as a replica compares them with its own when the write arrives.
    pub fn prev(&self, lba: Lba, blocks: u64) -> (Version, Version) {
        let touched = self.touched(lba, blocks);
        (
            self.get(touched.start).version,
            self.get(touched.end - 1).version,
        )
    }

    /// Grains in `[from, to)` ever written here (version above 0, or broken),
    /// in order.
    pub fn written(&self, from: u64, to: u64) -> impl Iterator<Item = (u64, Grain)> + '_ {
        let per = self.per_extent();
        self.extents
            .range(from / per..to.div_ceil(per))
            .flat_map(move |(&e, grains)| {
                grains
                    .iter()
                    .enumerate()
                    .map(move |(i, &w)| (e * per + i as u64, w))
            })
            .filter(move |&(g, w)| g >= from && g < to && w != 0)
            .map(|(g, w)| {
                (
                    g,
                    Grain {
                        version: Version(w & !BROKEN),
                        whole: w & BROKEN == 0,
                    },
                )
            })
    }

    /// The highest version of any grain in `[from, to)`.
    pub fn max_version(&self, from: u64, to: u64) -> Version {
        self.written(from, to)
            .map(|(_, g)| g.version)
            .max()
            .unwrap_or_default()
    }

    /// Extents with grains allocated, and the bytes their grains take.
    pub fn footprint(&self) -> (usize, usize) {
        (
            self.extents.len(),
            self.extents.len() * self.per_extent() as usize * 8,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: u64) -> Version {
        Version(n)
    }

    #[test]
    fn grain_size_is_a_power_of_two_dividing_the_extent_within_a_request() {
        let vol = |extent: u64| (extent, 64 * extent);
        assert_eq!(grain_blocks(0, 4096, vol(16384), 64), 64);
        assert_eq!(grain_blocks(0, 4096, vol(16384), 8192), 64);
        assert_eq!(grain_blocks(4096, 4096, vol(16384), 64), 1);
        assert_eq!(grain_blocks(0, 4096, vol(48), 64), 16);
        assert_eq!(grain_blocks(0, 512, vol(1 << 20), 2048), 512);
        assert_eq!(grain_blocks(1 << 30, 4096, vol(7), 64), 1);
        // A volume that ends inside an extent: grains fit its last part too.
        assert_eq!(grain_blocks(0, 4096, (16384, 16384 * 3 + 40), 64), 8);
    }

    #[test]
    fn covering_writes_make_grains_whole_and_partial_ones_chain_on_prev() {
        let mut g = Grains::new(4, 16);
        // Blocks 0-3 are grain 0; a write of blocks 2-5 touches grains 0 and 1.
        g.claim(Lba(2), 4, v(5), (v(0), v(0))).unwrap();
        assert_eq!(
            g.get(0),
            Grain {
                version: v(5),
                whole: true
            }
        );
        assert_eq!(
            g.get(1),
            Grain {
                version: v(5),
                whole: true
            }
        );
        // The next write to grain 0 chains on 5.
        g.claim(Lba(0), 1, v(6), (v(5), v(5))).unwrap();
        assert!(g.get(0).whole);
        // A write whose prev is not what this node holds: a write was missed.
        g.claim(Lba(4), 1, v(9), (v(7), v(7))).unwrap();
        assert_eq!(
            g.get(1),
            Grain {
                version: v(9),
                whole: false
            }
        );
        assert_eq!(g.get(1).held(), v(0));
        // Broken stays broken under partial writes, until a covering one.
        g.claim(Lba(5), 1, v(10), (v(9), v(9))).unwrap();
        assert!(!g.get(1).whole);
        g.claim(Lba(4), 4, v(11), (v(10), v(10))).unwrap();
        assert_eq!(
            g.get(1),
            Grain {
                version: v(11),
                whole: true
            }
        );
        // Never backwards, and a refused claim changes nothing.
        assert_eq!(
            g.claim(Lba(0), 8, v(11), (v(6), v(11))),
            Err(WeirError::VersionRegression)
        );
        assert_eq!(g.get(0).version, v(6));
        // A version no grain can hold (a hostile peer's) is refused.
        assert_eq!(
            g.claim(Lba(0), 8, Version(1 << 63), (v(6), v(11))),
            Err(WeirError::VersionRegression)
        );
        // A failed write breaks what it touched.
        g.break_grain(0);
        g.break_grain(3);
        assert_eq!(
            g.get(0),
            Grain {
                version: v(6),
                whole: false
            }
        );
        assert_eq!(
            g.get(3),
            Grain {
                version: v(0),
                whole: false
            }
        );
        let written: Vec<u64> = g.written(0, 4).map(|(i, _)| i).collect();
        assert_eq!(written, vec![0, 1, 3]);
        assert_eq!(g.max_version(0, 4), v(11));
        assert_eq!(g.footprint(), (1, 32));
    }

    #[test]
    fn memory_is_per_grain_of_extents_written() {
        let mut g = Grains::new(64, 16384);
        for i in 0..10_000u64 {
            let lba = Lba((i * 7919) % (16 * 16384));
            let prev = g.prev(lba, 1);
            g.claim(lba, 1, v(i + 1), prev).unwrap();
        }
        // 16 extents of 256 grains, 8 bytes each, whatever was written.
        assert_eq!(g.footprint(), (16, 16 * 256 * 8));
        assert!(g.written(0, u64::MAX / 64).all(|(_, s)| s.whole));
    }
}
