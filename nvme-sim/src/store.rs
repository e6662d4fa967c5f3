//! The SSD's contents: sparse media plus a volatile write cache.
//!
//! Only written blocks cost memory, so a 3.84 TB namespace is cheap. A write goes to
//! the cache with the time its destage completes; from then on it is on media. A
//! power loss drops whatever the cache still holds, exactly the data a real device
//! without power-loss protection loses: unflushed, non-FUA writes.

use std::collections::BTreeMap;

#[derive(Debug)]
struct Cached {
    data: Box<[u8]>,
    durable_ns: u64,
    seq: u64,
}

/// Sparse block contents.
#[derive(Debug)]
pub struct Store {
    block_size: usize,
    media: BTreeMap<u64, Box<[u8]>>,
    cache: BTreeMap<u64, Cached>,
    /// Destage schedule: (durable time, seq) -> block.
    destage: BTreeMap<(u64, u64), u64>,
    seq: u64,
}

impl Store {
    /// Empty store of `block_size`-byte blocks.
    pub fn new(block_size: usize) -> Self {
        Store {
            block_size,
            media: BTreeMap::new(),
            cache: BTreeMap::new(),
            destage: BTreeMap::new(),
            seq: 0,
        }
    }

    /// Move everything whose destage finished by `now_ns` to media.
    pub fn settle(&mut self, now_ns: u64) {
        while let Some((&(t, seq), &lba)) = self.destage.first_key_value() {
            if t > now_ns {
                break;
            }
            self.destage.remove(&(t, seq));
            // A later write of the same block may have replaced this cache entry.
            if self.cache.get(&lba).is_some_and(|c| c.seq == seq) {
                let cached = self.cache.remove(&lba).expect("checked above");
                self.media.insert(lba, cached.data);
            }
        }
    }

    /// Write whole blocks at `lba`; durable at `durable_ns`.
    pub fn write(&mut self, lba: u64, data: &[u8], durable_ns: u64) {
        debug_assert_eq!(data.len() % self.block_size, 0);
        for (i, block) in data.chunks_exact(self.block_size).enumerate() {
            self.seq += 1;
            let at = lba + i as u64;
            self.destage.insert((durable_ns, self.seq), at);
            let cached = Cached {
                data: block.into(),
                durable_ns,
                seq: self.seq,
            };
            if let Some(old) = self.cache.insert(at, cached) {
                debug_assert!(old.seq < self.seq);
            }
        }
    }

    /// Read whole blocks at `lba` into `out`; unwritten blocks read as zeroes.
    pub fn read(&self, lba: u64, out: &mut [u8]) {
        for (i, block) in out.chunks_exact_mut(self.block_size).enumerate() {
            let at = lba + i as u64;
            match self.cache.get(&at).map(|c| &c.data).or(self.media.get(&at)) {
                Some(data) => block.copy_from_slice(data),
                None => block.fill(0),
            }
        }
    }

    /// Forget `blocks` blocks at `lba` (deallocate / write zeroes): they read as
    /// zeroes. Modelled as immediately durable.
    pub fn discard(&mut self, lba: u64, blocks: u64) {
        for at in lba..lba + blocks {
            self.cache.remove(&at);
            self.media.remove(&at);
        }
    }

    /// Power loss: the volatile cache is gone.
    pub fn power_loss(&mut self) {
        self.cache.clear();
        self.destage.clear();
    }

    /// Whether block `lba` was ever written (and not discarded since).
    pub fn holds(&self, lba: u64) -> bool {
        self.cache.contains_key(&lba) || self.media.contains_key(&lba)
    }

    /// Blocks held in memory (media + cache): the simulator's footprint.
    pub fn blocks_stored(&self) -> usize {
        self.media.len() + self.cache.len()
    }

    /// Blocks in the volatile cache not yet on media.
    pub fn blocks_dirty(&self) -> usize {
        self.cache.len()
    }

    /// Latest durable time among cached blocks, if any (for self-checks).
    pub fn last_destage_ns(&self) -> Option<u64> {
        self.cache.values().map(|c| c.durable_ns).max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_loss_keeps_only_what_was_destaged() {
        let mut s = Store::new(512);
        s.write(0, &[1; 512], 100);
        s.write(1, &[2; 1024], 300);
        s.settle(200);
        s.write(0, &[3; 512], 400);
        s.power_loss();
        let mut out = vec![9; 512 * 3];
        s.read(0, &mut out);
        assert!(
            out[..512].iter().all(|&b| b == 1),
            "destaged block survives"
        );
        assert!(out[512..].iter().all(|&b| b == 0), "cached blocks are lost");
    }

    #[test]
    fn an_overwrite_in_cache_is_not_undone_by_an_older_destage() {
        let mut s = Store::new(512);
        s.write(5, &[1; 512], 100);
        s.write(5, &[2; 512], 900);
        s.settle(500);
        assert_eq!(s.blocks_dirty(), 1);
        let mut out = vec![0; 512];
        s.read(5, &mut out);
        assert_eq!(out[0], 2);
        s.settle(1000);
        assert_eq!(s.blocks_dirty(), 0);
        assert_eq!(s.blocks_stored(), 1);
    }
}
