//! `[device]`: the node's device and how its I/O is scheduled.

use super::{two, yes, Size};
use serde::Deserialize;
use std::path::PathBuf;

/// `[device]`
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSection {
    /// File or block device; relative paths are under `data_dir`.
    #[serde(default = "default_device")]
    pub path: PathBuf,
    /// io_uring submission queues.
    #[serde(default = "two")]
    pub queues: u16,
    /// Entries per queue.
    #[serde(default = "default_depth")]
    pub queue_depth: u16,
    /// Bytes per second the background scrubber reads to find media errors in
    /// blocks nobody reads (0: off).
    #[serde(default = "default_scrub_rate")]
    pub scrub_rate: Size,
    /// How often the node checkpoints which block versions its device holds
    /// (after a device flush), so that, restarted, it is sent only the blocks
    /// written since. 0: never.
    #[serde(default = "default_checkpoint_ms")]
    pub checkpoint_ms: u64,
    /// Merge queued requests that continue one another into one command (the
    /// I/O scheduler, `weir_core::sched`).
    #[serde(default)]
    pub merge: bool,
    /// Commands in flight per queue at most (0: `queue_depth`); past it
    /// requests wait in the scheduler, where they can merge.
    #[serde(default)]
    pub sched_depth: u32,
    /// Background work (rebuild copies, the scrubber) waits behind
    /// clients' requests in the scheduler, at most two commands of it on the
    /// device, keeping one command in eight while both wait.
    #[serde(default = "yes")]
    pub classes: bool,
    /// With classes: the rebuild's commands per second owed before any weight
    /// (0: none), a floor under its progress however busy clients keep the
    /// device.
    #[serde(default)]
    pub rebuild_reservation: u32,
    /// How the device's queues find completions: `"interrupt"` (the default),
    /// `"sqpoll"` (a kernel thread per queue polls submissions) or
    /// `"iopoll"` (completions polled: a block device with polled queues
    /// only; refused at start elsewhere, with the reason).
    #[serde(default)]
    pub mode: DeviceMode,
    /// Register the node's buffer pool with the device's rings (io_uring
    /// fixed buffers): reads and writes skip the kernel's per-command page
    /// pinning, but the whole pool (512 MiB) is reserved and pinned in memory
    /// at start (without CAP_IPC_LOCK, RLIMIT_MEMLOCK must allow it once per
    /// queue, or the node stops at start saying so). Off by default.
    #[serde(default)]
    pub register_buffers: bool,
    /// The driver: `"uring"` (io_uring on `path`, the default) or `"spdk"`
    /// (SPDK's polled user-space NVMe driver on the SSD at `pci_addr`; weir
    /// must be built with `--features spdk`).
    #[serde(default)]
    pub driver: DeviceDriver,
    /// With `driver = "spdk"`: the SSD's PCI address (`"0000:01:00.0"`, as
    /// lspci writes it), bound to vfio-pci or uio (SPDK's scripts/setup.sh).
    #[serde(default)]
    pub pci_addr: Option<String>,
    /// With `driver = "spdk"`: the core each queue's polling thread is pinned
    /// to, one per queue (empty: not pinned). A polled queue keeps its core
    /// busy while commands are in flight.
    #[serde(default)]
    pub poll_cores: Vec<usize>,
    /// With `driver = "spdk"`: megabytes of hugepage memory SPDK reserves (0:
    /// SPDK's default). It must hold the node's buffer pool (512 MiB) and the
    /// bounce buffers.
    #[serde(default)]
    pub spdk_mem_mb: u32,
}

/// `[device] driver`.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DeviceDriver {
    /// io_uring on a file or block device (weir-nvme-uring).
    #[default]
    Uring,
    /// SPDK's polled NVMe driver (weir-nvme-spdk).
    Spdk,
}

/// `[device] mode`: weir-nvme-uring's `PollMode`.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DeviceMode {
    /// Interrupts.
    #[default]
    Interrupt,
    /// A polled submission queue.
    Sqpoll,
    /// Polled completions.
    Iopoll,
}

fn default_checkpoint_ms() -> u64 {
    1000
}

fn default_scrub_rate() -> Size {
    Size(16 << 20)
}

impl Default for DeviceSection {
    fn default() -> Self {
        DeviceSection {
            path: default_device(),
            queues: two(),
            queue_depth: default_depth(),
            scrub_rate: default_scrub_rate(),
            checkpoint_ms: default_checkpoint_ms(),
            merge: false,
            sched_depth: 0,
            classes: true,
            rebuild_reservation: 0,
            mode: DeviceMode::Interrupt,
            register_buffers: false,
            driver: DeviceDriver::Uring,
            pci_addr: None,
            poll_cores: Vec::new(),
            spdk_mem_mb: 0,
        }
    }
}

fn default_device() -> PathBuf {
    PathBuf::from("device.img")
}

fn default_depth() -> u16 {
    128
}

impl DeviceSection {
    /// The section's own rules: the key at fault and why.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        if self.queues == 0 || self.queue_depth == 0 {
            return Err((
                "device.queues",
                "queues and queue_depth must be above 0".into(),
            ));
        }
        if self.rebuild_reservation > 1_000_000 {
            return Err((
                "device.rebuild_reservation",
                format!(
                    "{}: must be at most 1000000 commands per second",
                    self.rebuild_reservation
                ),
            ));
        }
        if self.sched_depth > u32::from(self.queue_depth) {
            return Err((
                "device.sched_depth",
                "at most device.queue_depth (0: all of it)".into(),
            ));
        }
        if self.checkpoint_ms > 3_600_000 {
            return Err((
                "device.checkpoint_ms",
                "at most an hour (3600000), or 0 for never".into(),
            ));
        }
        match self.driver {
            DeviceDriver::Uring => {
                if self.pci_addr.is_some() || !self.poll_cores.is_empty() || self.spdk_mem_mb != 0 {
                    return Err((
                        "device.driver",
                        "pci_addr, poll_cores and spdk_mem_mb are for driver = \"spdk\"".into(),
                    ));
                }
            }
            DeviceDriver::Spdk => self.check_spdk()?,
        }
        Ok(())
    }

    /// What `driver = "spdk"` needs, and what it does not take.
    fn check_spdk(&self) -> Result<(), (&'static str, String)> {
        match &self.pci_addr {
            None => {
                return Err((
                    "device.pci_addr",
                    "driver = \"spdk\" needs the SSD's PCI address".into(),
                ))
            }
            Some(addr) if !weir_nvme_spdk::is_pci_addr(addr) => {
                return Err((
                    "device.pci_addr",
                    format!("{addr:?}: a PCI address is DDDD:BB:DD.F (0000:01:00.0)"),
                ))
            }
            Some(_) => {}
        }
        if !self.poll_cores.is_empty() && self.poll_cores.len() != usize::from(self.queues) {
            return Err((
                "device.poll_cores",
                format!(
                    "{} cores for {} queues: name one per queue, or none",
                    self.poll_cores.len(),
                    self.queues
                ),
            ));
        }
        if self.mode != DeviceMode::Interrupt || self.register_buffers {
            return Err((
                "device.mode",
                "mode and register_buffers are io_uring's; SPDK always polls, from \
                 its own DMA memory"
                    .into(),
            ));
        }
        Ok(())
    }
}
