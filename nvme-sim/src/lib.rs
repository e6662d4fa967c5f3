//! weir-nvme-sim: a simulated NVMe SSD that implements weir-core's `BlockDevice`.
//!
//! Model: a namespace of 512 B or 4 KiB blocks behind several I/O queues of bounded
//! depth; a controller with a fixed, serialized cost per command; channels x dies of
//! flash, each die doing one 4 KiB array read (tR) or program (tPROG) at a time, so
//! IOPS rise with queue depth until the controller or the dies saturate; read and
//! program times drawn from a seeded distribution with a read-retry tail; a volatile
//! DRAM write cache with Flush and FUA semantics; data really stored, sparsely. See
//! [`timing`] for the resource model and [`config::SsdConfig`] for the defaults and
//! the datasheet they come from.
//!
//! Contents change when a command completes, not when it is submitted, so
//! overlapping commands in flight together race as on a real SSD.
//!
//! Fault model: `power_loss` drops the volatile cache (unflushed, non-FUA writes
//! vanish), tears every write in flight at a block boundary (a seeded prefix of
//! its blocks reaches media) and fails commands until `power_on`; `hang` stalls every command until
//! `resume`; `media_error` makes blocks unreadable (latent sector errors): a read
//! touching one fails with `DevError::Media` until a write covers it (the drive
//! remaps a block on write).
//!
//! Host CPU: with [`SimSsd::with_host`], each command first costs its driver's
//! submission work on the host's cores (the kernel's system call and block layer,
//! or a polled driver's few hundred ns on its polling core), and its completion
//! reaches the caller only after the driver's completion work (an interrupt and a
//! wake-up, or the poller's pass). Without a host the driver costs nothing.
//!
//! Time is madsim time under `--cfg madsim` (exact to the nanosecond through
//! `weir_core::time::sleep_until_exact`); on real tokio the same code runs, with the
//! timer's resolution.

pub mod config;
pub mod store;
pub mod timing;

pub use config::SsdConfig;

/// The host CPU a device's driver runs on (see `weir_host_sim`): submitting and
/// completing each command cost CPU time there, by the driver's profile.
#[derive(Clone, Debug)]
pub struct DeviceHost {
    /// The host's cores, shared with its network stack.
    pub cpu: Arc<Mutex<Cpu>>,
    /// The driver.
    pub driver: NvmeDriver,
    /// The instant the host's CPU time counts from.
    pub epoch: Instant,
    /// NUMA node the device is attached to.
    pub numa_node: u8,
    /// The polling core that serves this device (a polled driver).
    pub poller: usize,
}

impl DeviceHost {
    fn run(
        &self,
        (now_ns, at_ns): (u64, u64),
        cost_ns: u64,
        affinity: Affinity,
    ) -> weir_host_sim::Ran {
        let work = Work {
            cost_ns,
            affinity,
            numa_node: self.numa_node,
        };
        self.cpu.lock().expect("cpu").run_at(now_ns, at_ns, work)
    }

    /// The driver submits a command at `at_ns`: where and when that ends.
    fn submit(&self, at_ns: u64) -> weir_host_sim::Ran {
        match self.driver {
            NvmeDriver::Kernel(k) => self.run((at_ns, at_ns), k.submit_ns, Affinity::Any),
            NvmeDriver::Polled(p) => {
                self.run((at_ns, at_ns), p.submit_ns, Affinity::Poller(self.poller))
            }
        }
    }

    /// The device will complete at `at_ns` (charged now, at `now_ns`) a command
    /// submitted on `core`: when the waiting thread has it. The kernel's
    /// interrupt goes to the submitting core's queue; a poller finds it on its
    /// next pass.
    fn complete(&self, now_ns: u64, at_ns: u64, core: usize) -> u64 {
        let when = (now_ns, at_ns.max(now_ns));
        match self.driver {
            NvmeDriver::Kernel(k) => self.run(when, k.complete_ns, Affinity::Core(core)).end_ns,
            NvmeDriver::Polled(p) => {
                self.run(when, p.complete_ns, Affinity::Poller(self.poller))
                    .end_ns
            }
        }
    }
}

use config::UNIT_BYTES;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use store::Store;
use timing::Array;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use weir_core::device::{BlockDevice, DevCommand, DevCompletion, DevError, Geometry};
use weir_core::ids::Lba;
use weir_core::time::sleep_until_exact;
use weir_host_sim::{Affinity, Cpu, NvmeDriver, Work};

struct State {
    timing: Array,
    store: Store,
    rng: SmallRng,
    powered: bool,
    /// Bumped by every power loss: a command that was in flight across one fails.
    power_epoch: u64,
    /// Blocks that cannot be read until written.
    bad: std::collections::BTreeSet<u64>,
    /// Writes the device has taken and not yet completed, by id: what a power
    /// loss tears.
    in_flight: std::collections::BTreeMap<u64, InFlight>,
    next_id: u64,
}

/// A write in flight: where its blocks go, and the blocks.
struct InFlight {
    lba: u64,
    data: bytes::Bytes,
}

/// What a command does to the contents when it completes.
enum Effect {
    /// Fill the read buffer from the contents as they are then.
    Read { lba: u64, buf: weir_core::Buf },
    /// Store the blocks (durable at `durable_ns`); `id` is its in-flight entry.
    Write { id: u64, durable_ns: u64 },
    /// Forget the blocks.
    Discard { lba: u64, blocks: u64 },
    /// Nothing (a flush).
    None,
}

/// A simulated SSD.
pub struct SimSsd {
    config: SsdConfig,
    geometry: Geometry,
    state: Mutex<State>,
    slots: Vec<Semaphore>,
    epoch: Instant,
    /// The CPU its driver costs, if modelled.
    host: Option<DeviceHost>,
    /// A hung device completes nothing until it resumes (a firmware stall).
    hung: std::sync::atomic::AtomicBool,
    resumed: tokio::sync::Notify,
}

impl SimSsd {
    /// A powered-on, empty SSD; `seed` drives its latency draws.
    pub fn new(config: SsdConfig, seed: u64) -> Result<Self, String> {
        config.validate()?;
        let geometry = Geometry {
            block_size: config.block_size,
            capacity_blocks: config.capacity_blocks * u64::from(config.drives),
            max_transfer_blocks: config.max_transfer_bytes / config.block_size,
            // Striped drives: a command crossing a stripe is served by two.
            optimal_io_blocks: if config.drives > 1 {
                (timing::STRIPE_UNITS * UNIT_BYTES / u64::from(config.block_size)) as u32
            } else {
                0
            },
            queues: config.queues,
            queue_depth: config.queue_depth,
        };
        let slots = (0..config.queues)
            .map(|_| Semaphore::new(usize::from(config.queue_depth)))
            .collect();
        Ok(SimSsd {
            state: Mutex::new(State {
                timing: Array::new(config.clone()),
                store: Store::new(config.block_size as usize),
                rng: SmallRng::seed_from_u64(seed),
                powered: true,
                power_epoch: 0,
                bad: std::collections::BTreeSet::new(),
                in_flight: std::collections::BTreeMap::new(),
                next_id: 0,
            }),
            config,
            geometry,
            slots,
            epoch: Instant::now(),
            host: None,
            hung: std::sync::atomic::AtomicBool::new(false),
            resumed: tokio::sync::Notify::new(),
        })
    }

    /// Charge its driver's work to `host`'s CPU; device time then counts from
    /// the host's epoch. Before the first command.
    pub fn with_host(mut self, host: DeviceHost) -> Self {
        self.epoch = host.epoch;
        self.host = Some(host);
        self
    }

    /// The model parameters.
    pub fn config(&self) -> &SsdConfig {
        &self.config
    }

    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Power loss: the volatile cache is lost and commands fail with `Gone` until
    /// [`SimSsd::power_on`]. A write in flight is torn at a block boundary: a
    /// prefix of its blocks (drawn from the seed, from none to all) reached
    /// media, the rest did not. Returns the blocks lost (written, not yet on
    /// media, and the torn-off blocks of writes in flight).
    pub fn power_loss(&self) -> usize {
        use rand::Rng;
        let now = self.now_ns();
        let mut guard = self.state.lock().expect("ssd state");
        let s = &mut *guard;
        s.store.settle(now);
        let mut lost = s.store.blocks_dirty();
        s.store.power_loss();
        let bs = self.config.block_size as usize;
        for (_, w) in std::mem::take(&mut s.in_flight) {
            let blocks = w.data.len() / bs;
            let kept = s.rng.gen_range(0..=blocks);
            if kept > 0 {
                s.store.write(w.lba, &w.data[..kept * bs], now);
                s.store.settle(now);
                let end = w.lba + kept as u64;
                s.bad.retain(|b| !(w.lba..end).contains(b));
            }
            lost += blocks - kept;
        }
        s.timing.power_cycle(now);
        s.powered = false;
        s.power_epoch += 1;
        lost
    }

    /// Apply a command's effect on the contents at its completion; `None` if
    /// power was lost since it was taken (it never completed).
    fn complete(&self, power_epoch: u64, effect: Effect) -> Option<DevCompletion> {
        let now = self.now_ns();
        let mut guard = self.state.lock().expect("ssd state");
        let s = &mut *guard;
        if s.power_epoch != power_epoch {
            return None;
        }
        s.store.settle(now);
        Some(match effect {
            Effect::Read { lba, mut buf } => {
                s.store.read(lba, buf.as_mut());
                DevCompletion::Read(buf)
            }
            Effect::Write { id, durable_ns } => {
                let w = s.in_flight.remove(&id).expect("a write in flight");
                s.store.write(w.lba, &w.data, durable_ns.max(now));
                // The drive remaps a bad block when a write covers it.
                let end = w.lba + (w.data.len() / self.config.block_size as usize) as u64;
                s.bad.retain(|b| !(w.lba..end).contains(b));
                DevCompletion::Done
            }
            Effect::Discard { lba, blocks } => {
                s.store.discard(lba, blocks);
                s.bad.retain(|b| !(lba..lba + blocks).contains(b));
                DevCompletion::Done
            }
            Effect::None => DevCompletion::Done,
        })
    }

    /// Blocks `[lba, lba + blocks)` become unreadable (latent sector errors)
    /// until written again.
    pub fn media_error(&self, lba: Lba, blocks: u64) {
        let mut s = self.state.lock().expect("ssd state");
        s.bad.extend(lba.0..lba.0.saturating_add(blocks));
    }

    /// Blocks that cannot be read now.
    pub fn unreadable_blocks(&self) -> usize {
        self.state.lock().expect("ssd state").bad.len()
    }

    /// Of those, blocks that hold data (written before the media error): what a
    /// scrubber must find.
    pub fn unreadable_written_blocks(&self) -> usize {
        let s = self.state.lock().expect("ssd state");
        s.bad.iter().filter(|&&b| s.store.holds(b)).count()
    }

    /// The device stalls: commands in flight and new ones complete only after
    /// [`SimSsd::resume`], as in a firmware hang or a long GC pause.
    pub fn hang(&self) {
        self.hung.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// The stall ends.
    pub fn resume(&self) {
        self.hung.store(false, std::sync::atomic::Ordering::SeqCst);
        self.resumed.notify_waiters();
    }

    /// Power restored.
    pub fn power_on(&self) {
        self.state.lock().expect("ssd state").powered = true;
    }

    /// Blocks held in memory: the model's footprint.
    pub fn blocks_stored(&self) -> usize {
        self.state.lock().expect("ssd state").store.blocks_stored()
    }

    /// The 4 KiB flash units a transfer touches.
    fn units(&self, lba: Lba, blocks: u64) -> Vec<u64> {
        let bs = u64::from(self.config.block_size);
        let first = lba.0 * bs / UNIT_BYTES;
        let last = ((lba.0 + blocks) * bs).div_ceil(UNIT_BYTES);
        (first..last).collect()
    }

    fn blocks_of(&self, len: usize) -> Result<u64, DevError> {
        let bs = self.config.block_size as usize;
        if len == 0 || !len.is_multiple_of(bs) {
            return Err(DevError::Misaligned);
        }
        Ok((len / bs) as u64)
    }

    /// Validate `cmd`, reserve the device's resources and return its completion
    /// time (ns since the device's epoch) and what it does to the contents then.
    /// Contents change at completion, not here: commands in flight together race
    /// as they do on a real SSD (a read sees a write only if the write completed
    /// first; of two overlapping writes, the one completing last wins).
    fn schedule(&self, cmd: DevCommand) -> Result<(u64, u64, Effect), DevError> {
        let now = self.now_ns();
        let mut guard = self.state.lock().expect("ssd state");
        let s = &mut *guard;
        if !s.powered {
            return Err(DevError::Gone);
        }
        let epoch = s.power_epoch;
        s.store.settle(now);
        // The model's DMA gathers a scatter-gather list into its store at once.
        match cmd.into_contiguous() {
            DevCommand::Read { lba, buf } => {
                let blocks = self.blocks_of(buf.len())?;
                self.geometry.check_range(lba, blocks)?;
                if let Some(&bad) = s.bad.range(lba.0..lba.0 + blocks).next() {
                    return Err(DevError::Media(Lba(bad)));
                }
                let done = s.timing.read(now, &self.units(lba, blocks), &mut s.rng);
                Ok((epoch, done, Effect::Read { lba: lba.0, buf }))
            }
            DevCommand::Write { lba, data, fua } => {
                let blocks = self.blocks_of(data.len())?;
                self.geometry.check_range(lba, blocks)?;
                let t = s
                    .timing
                    .write(now, &self.units(lba, blocks), fua, &mut s.rng);
                s.next_id += 1;
                let id = s.next_id;
                s.in_flight.insert(id, InFlight { lba: lba.0, data });
                let effect = Effect::Write {
                    id,
                    durable_ns: t.durable_ns,
                };
                Ok((epoch, t.complete_ns, effect))
            }
            DevCommand::WriteGather { .. } => unreachable!("gathered above"),
            DevCommand::Flush => Ok((epoch, s.timing.flush(now), Effect::None)),
            DevCommand::WriteZeroes { lba, blocks } | DevCommand::Deallocate { lba, blocks } => {
                self.geometry.check_range(lba, blocks)?;
                let effect = Effect::Discard { lba: lba.0, blocks };
                Ok((epoch, s.timing.metadata(now), effect))
            }
        }
    }
}

impl BlockDevice for SimSsd {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    async fn submit(&self, queue: u16, cmd: DevCommand) -> Result<DevCompletion, DevError> {
        let slots = self
            .slots
            .get(usize::from(queue))
            .ok_or(DevError::BadQueue)?;
        let _slot = slots.acquire().await.map_err(|_| DevError::Gone)?;
        // The driver's submission work first: the device sees the command when
        // it ends.
        let core = self.host.as_ref().map(|h| {
            let ran = h.submit(self.now_ns());
            (ran.core, ran.end_ns)
        });
        if let Some((_, submitted_ns)) = core {
            sleep_until_exact(self.epoch + Duration::from_nanos(submitted_ns)).await;
        }
        let (power_epoch, done_ns, effect) = self.schedule(cmd)?;
        // From here the device has the command: if the caller goes away (its
        // host crashed without a power loss), the device still completes it.
        let mut pending = Pending {
            ssd: self,
            power_epoch,
            effect: Some(effect),
        };
        let host_done_ns = match (&self.host, core) {
            (Some(host), Some((core, _))) => Some(host.complete(self.now_ns(), done_ns, core)),
            _ => None,
        };
        sleep_until_exact(self.epoch + Duration::from_nanos(done_ns)).await;
        loop {
            let resumed = self.resumed.notified();
            tokio::pin!(resumed);
            resumed.as_mut().enable();
            if !self.hung.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            resumed.await;
        }
        // The device completes it now (power lost meanwhile: it never did);
        // the caller has it once the driver's completion work is done.
        let completion = pending.finish().ok_or(DevError::Gone);
        if let Some(at) = host_done_ns {
            sleep_until_exact(self.epoch + Duration::from_nanos(at)).await;
        }
        completion
    }
}

/// A command the device has taken: its effect happens exactly once, when the
/// device completes it, or when its caller's future is dropped (the device
/// does not know its host crashed).
struct Pending<'a> {
    ssd: &'a SimSsd,
    power_epoch: u64,
    effect: Option<Effect>,
}

impl Pending<'_> {
    fn finish(&mut self) -> Option<DevCompletion> {
        let effect = self.effect.take().expect("finished once");
        self.ssd.complete(self.power_epoch, effect)
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(effect) = self.effect.take() {
            let _ = self.ssd.complete(self.power_epoch, effect);
        }
    }
}
