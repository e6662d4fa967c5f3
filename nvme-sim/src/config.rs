//! SSD model parameters and the figures they imply.

/// Parameters of the simulated SSD.
///
/// The defaults approximate a current datacenter TLC NVMe SSD, the Micron 7450 PRO
/// 3.84 TB (U.3, PCIe 4.0): its product brief quotes about 1,000K IOPS of 4 KiB random
/// read, about 180K IOPS of 4 KiB random write and sequential reads near 6.8 GB/s;
/// read latency at QD1 is tens of microseconds. The internal numbers (channels, dies,
/// tR, tPROG, controller cost) are not published; they are chosen so that the model
/// reproduces those headline figures: the controller caps random reads at 1M IOPS,
/// 512 planes at 2.8 ms per 4 KiB program sustain about 183K random-write IOPS.
#[derive(Clone, Debug, PartialEq)]
pub struct SsdConfig {
    /// Logical block size of the namespace: 512 or 4096 bytes.
    pub block_size: u32,
    /// Namespace size in blocks.
    pub capacity_blocks: u64,
    /// Number of I/O queues.
    pub queues: u16,
    /// Depth of each I/O queue; more outstanding commands wait for a slot.
    pub queue_depth: u16,
    /// Largest transfer of one command, in bytes.
    pub max_transfer_bytes: u32,
    /// Flash channels.
    pub channels: u32,
    /// Dies per channel.
    pub dies_per_channel: u32,
    /// Planes per die; each plane does one array operation at a time (multi-plane
    /// and independent-wordline reads make planes the real unit of parallelism).
    pub planes_per_die: u32,
    /// Mean array read time (tR) of one 4 KiB unit, ns.
    pub read_ns_mean: u64,
    /// Mean program time of one 4 KiB unit, ns (die busy time per unit destaged).
    pub program_ns_per_unit: u64,
    /// Spread of tR and tPROG: each draw is uniform in mean * (1 +- jitter).
    pub jitter: f64,
    /// Probability that a read needs a retry (read-retry / soft decode), which
    /// doubles its array time: the source of the long tail.
    pub read_retry_prob: f64,
    /// Controller time per command, serialized: caps the device's IOPS.
    pub controller_ns_per_cmd: u64,
    /// Fixed firmware + doorbell + interrupt latency per command, not serialized, ns.
    pub fixed_ns: u64,
    /// Flash channel rate, bytes per second (ONFI bus).
    pub channel_bytes_per_sec: u64,
    /// Host link (PCIe) rate, bytes per second.
    pub host_bytes_per_sec: u64,
    /// Time to place one 4 KiB unit in the DRAM write cache, ns.
    pub cache_write_ns_per_unit: u64,
    /// Volatile write cache size in bytes; writes stall when it is full.
    pub cache_bytes: u64,
    /// Drives of this kind striped into the one namespace (RAID 0, see
    /// `timing::Array`); `capacity_blocks` is each drive's.
    pub drives: u32,
}

/// Size of the flash mapping unit: reads and programs are modelled per 4 KiB.
pub const UNIT_BYTES: u64 = 4096;

impl Default for SsdConfig {
    fn default() -> Self {
        SsdConfig {
            block_size: 4096,
            // 3.84 TB; sparse, so only written blocks cost memory.
            capacity_blocks: 3_840_000_000_000 / 4096,
            queues: 8,
            queue_depth: 1024,
            max_transfer_bytes: 1 << 20,
            channels: 16,
            dies_per_channel: 8,
            planes_per_die: 4,
            read_ns_mean: 60_000,
            program_ns_per_unit: 2_800_000,
            jitter: 0.1,
            read_retry_prob: 0.002,
            controller_ns_per_cmd: 1_000,
            fixed_ns: 5_000,
            channel_bytes_per_sec: 1_200_000_000,
            host_bytes_per_sec: 7_000_000_000,
            cache_write_ns_per_unit: 2_000,
            cache_bytes: 256 << 20,
            drives: 1,
        }
    }
}

impl SsdConfig {
    /// Independent flash units (planes) in all.
    pub fn dies(&self) -> u32 {
        self.channels * self.dies_per_channel * self.planes_per_die
    }

    /// Check the configuration; a bad one gets a message naming the field.
    pub fn validate(&self) -> Result<(), String> {
        let fail = |field: &str, why: &str| Err(format!("ssd config `{field}`: {why}"));
        if !matches!(self.block_size, 512 | 4096) {
            return fail("block_size", "must be 512 or 4096");
        }
        if self.capacity_blocks == 0 {
            return fail("capacity_blocks", "must be > 0");
        }
        if self.drives == 0 || self.drives > 32 {
            return fail("drives", "must be between 1 and 32");
        }
        if self.queues == 0 || self.queue_depth == 0 {
            return fail("queues/queue_depth", "must be > 0");
        }
        if self.max_transfer_bytes < self.block_size
            || !self.max_transfer_bytes.is_multiple_of(self.block_size)
        {
            return fail("max_transfer_bytes", "must be a multiple of the block size");
        }
        if self.channels == 0 || self.dies_per_channel == 0 || self.planes_per_die == 0 {
            return fail("channels/dies_per_channel/planes_per_die", "must be > 0");
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return fail("jitter", "must be in [0, 1)");
        }
        if !(0.0..=1.0).contains(&self.read_retry_prob) {
            return fail("read_retry_prob", "must be in [0, 1]");
        }
        if self.channel_bytes_per_sec == 0 || self.host_bytes_per_sec == 0 {
            return fail("*_bytes_per_sec", "must be > 0");
        }
        // An unaligned maximal write touches one 4 KiB unit more than its size.
        if self.cache_bytes < 2 * (u64::from(self.max_transfer_bytes) + UNIT_BYTES) {
            return fail("cache_bytes", "must hold at least two maximal writes");
        }
        Ok(())
    }

    /// Transfer time of `bytes` at `rate` bytes/s, ns (rounded up).
    pub fn transfer_ns(bytes: u64, rate: u64) -> u64 {
        (bytes * 1_000_000_000).div_ceil(rate)
    }

    /// The model's mean 4 KiB random-read latency at queue depth 1, ns: controller,
    /// fixed cost, mean tR (with retries), channel and host transfer.
    pub fn model_read_latency_qd1_ns(&self) -> u64 {
        let t_r = self.read_ns_mean as f64 * (1.0 + self.read_retry_prob);
        self.controller_ns_per_cmd
            + self.fixed_ns
            + t_r as u64
            + Self::transfer_ns(UNIT_BYTES, self.channel_bytes_per_sec)
            + Self::transfer_ns(UNIT_BYTES, self.host_bytes_per_sec)
    }

    /// The model's saturated 4 KiB random-read IOPS: the tighter of the controller
    /// limit, the dies' limit, the channels' limit and the host link's limit.
    pub fn model_read_iops_max(&self) -> f64 {
        let controller = 1e9 / self.controller_ns_per_cmd as f64;
        let t_r = self.read_ns_mean as f64 * (1.0 + self.read_retry_prob);
        let dies = f64::from(self.dies()) * 1e9 / t_r;
        let channel_ns = Self::transfer_ns(UNIT_BYTES, self.channel_bytes_per_sec) as f64;
        let channels = f64::from(self.channels) * 1e9 / channel_ns;
        let host = self.host_bytes_per_sec as f64 / UNIT_BYTES as f64;
        controller.min(dies).min(channels).min(host)
    }
}
