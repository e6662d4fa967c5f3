//! weir's polled user-space NVMe device: SPDK's NVMe driver behind weir's
//! `BlockDevice`, through weir's own FFI.
//!
//! Built with the feature `spdk` where SPDK (24.09 or later, with its
//! pkg-config files) is installed. Without it the crate has no C and no SPDK
//! dependency, and [`SpdkDevice::open`] fails with [`OpenError::NotBuilt`].
//!
//! # Design
//!
//! - **The FFI.** I/O goes straight to SPDK's functions that take only handles
//!   and scalars (`spdk_nvme_ns_cmd_read`, `_write`, `_writev`, `_flush`,
//!   `_write_zeroes`, `spdk_nvme_qpair_process_completions`). The calls
//!   whose arguments are version-dependent structs (the environment's
//!   options, the transport id, the identify data) go through a small C glue
//!   (`csrc/weir_spdk_glue.c`) compiled against the installed SPDK's headers,
//!   so weir never hard-codes their layout. The completion entry is the NVMe
//!   specification's, declared in Rust with a size assertion. The glue puts
//!   back the caller's CPU affinity after DPDK's start-up pins it.
//! - **Formats.** A namespace formatted with metadata or protection
//!   information is refused at open (the SSD would move metadata past the end
//!   of weir's buffers). Its identity, which block-version checkpoints are
//!   tied to, is the model, serial, namespace id, NGUID and EUI-64: a
//!   namespace made again is another device.
//! - **One queue pair per queue, one polling thread per queue pair.** SPDK's
//!   queue pairs have no locks: one thread submits and polls each. Queue `i`'s
//!   thread is pinned to `poll_cores[i]` when cores are named. Submitters hand
//!   commands to it through a channel bounded by `queue_depth` permits; results
//!   come back through a oneshot per command. While commands are in flight the
//!   thread polls without pause (no interrupt, no system call); with none, it
//!   keeps polling for `idle_spin`, then sleeps on the channel until the next
//!   command, so an idle device costs no CPU.
//! - **Completions** are callbacks SPDK makes from inside
//!   `process_completions`, on the polling thread. The callback only records
//!   `(tag, status)` in that thread's list; the thread then finishes each
//!   command with full access to its state. A command's memory stays in the
//!   thread's table until its last completion, so nothing SPDK may still DMA
//!   is ever freed.
//! - **DMA memory.** SPDK can only move data in memory from its own allocator
//!   (pinned hugepages with known physical addresses). [`SpdkDevice::pool`] is
//!   a [`BufPool`] whose regions come from `spdk_zmalloc`: the node allocates
//!   its read buffers there, so a read lands in the pool and is sent from it.
//!   Data from anywhere else (a write payload received into heap memory) is
//!   copied into a DMA bounce buffer once the command has its queue slot,
//!   counted in [`SpdkStats::bounce_copies`]. The pool and the bounce
//!   buffers (every queue full of the largest transfers) are reserved at
//!   open, so too little hugepage memory stops the open, not a command. Gathered writes whose segments all lie in
//!   DMA memory and keep NVMe's PRP rules go as one scattered write with no
//!   copy (`writev`); others are copied together.
//! - **Zeroes.** WriteZeroes is NVMe Write Zeroes (in pieces of at most
//!   65,536 blocks, NVMe's limit) where the namespace has it, else writes of a
//!   zeroed DMA buffer. Deallocate is Write Zeroes too, with its Deallocate
//!   bit where the namespace allows it (DLFEAT): weir's contract is that
//!   deallocated blocks read back as zeroes, and Dataset Management's
//!   deallocate is only advisory (a block the SSD keeps reads its old data).
//! - **Errors.** Range, length and queue checks fail before submission. A
//!   failed completion's NVMe status becomes a [`DevError`] by
//!   [`NvmeStatus::to_dev_error`] and is logged with its codes. A queue pair
//!   that fails at the transport (`-ENXIO`) fails its commands with `Gone`,
//!   as does a command SPDK refuses (it would be refused again). No command
//!   timeout is registered with SPDK: the node's stall detection
//!   (`device_ms`) fails a device whose commands hang. Queue 0's thread polls
//!   the controller's admin queue every 10 ms, idle or not.
//! - **Shutdown.** Dropping the device closes its queues (new and waiting
//!   commands get `Gone`), lets each thread finish what is in flight (for 10
//!   s at most), free its queue pair and exit, joins the threads, then
//!   detaches the controller. Freeing a queue pair makes SPDK abort what it
//!   still holds; a wedged SSD could still write into those buffers after,
//!   which only an IOMMU (vfio-pci) prevents.
//!
//! What never ran: this crate against a real SPDK and a real SSD. The glue
//! tests run it against the stand-in in `csrc/mock` (`--features spdk-mock`).
#![cfg(not(madsim))]

mod error;
mod status;

#[cfg(weir_spdk_linked)]
mod device;
#[cfg(weir_spdk_linked)]
mod env;
#[cfg(weir_spdk_linked)]
mod ffi;
#[cfg(weir_spdk_linked)]
mod place;
#[cfg(weir_spdk_linked)]
mod poller;
#[cfg(not(weir_spdk_linked))]
mod unbuilt;

pub use error::OpenError;
pub use status::NvmeStatus;

/// This build links the test stand-in of SPDK (csrc/mock) instead of SPDK
/// (the `spdk-mock` feature, which `--all-features` turns on too): a daemon
/// must refuse to drive a device with it.
pub const STAND_IN: bool = cfg!(feature = "spdk-mock");

use std::future::Future;
use std::time::Duration;
use weir_core::buf::BufPool;
use weir_core::device::{BlockDevice, DevCommand, DevCompletion, DevError, Geometry};

#[cfg(weir_spdk_linked)]
use device::Device;
#[cfg(not(weir_spdk_linked))]
use unbuilt::Device;

/// SPDK's environment: set up once per process, by the first device opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvOptions {
    /// The process's name in SPDK's shared memory.
    pub name: String,
    /// Cores SPDK's environment may use, as a hex mask (`"0x3"`); `None`:
    /// SPDK's default. weir's polling threads are pinned by
    /// [`SpdkOptions::poll_cores`], not by this.
    pub core_mask: Option<String>,
    /// Megabytes of hugepage memory to reserve; 0: SPDK's default. Must hold
    /// the DMA pool ([`SpdkOptions::pool_bytes`]) and the bounce buffers.
    pub mem_mb: u32,
    /// Use ordinary memory instead of hugepages (SPDK's own tests do; only
    /// with an IOMMU, and `mem_mb` must be set).
    pub no_huge: bool,
}

impl Default for EnvOptions {
    fn default() -> Self {
        EnvOptions {
            name: "weir".into(),
            core_mask: None,
            mem_mb: 0,
            no_huge: false,
        }
    }
}

/// How to open an SPDK device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpdkOptions {
    /// The controller, as an SPDK transport id (`"trtype:PCIe
    /// traddr:0000:01:00.0"`); [`trid_for_pci`] makes one from a PCI address.
    pub trid: String,
    /// The namespace to use (NVMe numbers them from 1).
    pub nsid: u32,
    /// I/O queues (one queue pair and one polling thread each).
    pub queues: u16,
    /// Commands in flight per queue at most.
    pub queue_depth: u16,
    /// The core each queue's thread is pinned to, by queue; empty: not pinned.
    /// When not empty it names one core per queue.
    pub poll_cores: Vec<usize>,
    /// Budget of the DMA buffer pool ([`SpdkDevice::pool`]).
    pub pool_bytes: usize,
    /// Largest transfer weir sends in one command (the device's own limit
    /// lowers it).
    pub max_transfer_bytes: u32,
    /// How long an idle queue keeps polling for a new command before it
    /// sleeps.
    pub idle_spin: Duration,
    /// SPDK's environment (used by the first device the process opens).
    pub env: EnvOptions,
}

impl Default for SpdkOptions {
    fn default() -> Self {
        SpdkOptions {
            trid: String::new(),
            nsid: 1,
            queues: 2,
            queue_depth: 128,
            poll_cores: Vec::new(),
            pool_bytes: 256 << 20,
            max_transfer_bytes: 1 << 20,
            idle_spin: Duration::from_micros(50),
            env: EnvOptions::default(),
        }
    }
}

/// The transport id of a local PCIe controller (`"0000:01:00.0"`).
pub fn trid_for_pci(pci_addr: &str) -> String {
    format!("trtype:PCIe traddr:{pci_addr}")
}

/// Whether `addr` is a PCI address as SPDK and lspci write it
/// (`DDDD:BB:DD.F`, hex).
pub fn is_pci_addr(addr: &str) -> bool {
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    let mut parts = addr.split(':');
    let (Some(domain), Some(bus), Some(devfn), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    let Some((dev, func)) = devfn.split_once('.') else {
        return false;
    };
    hex(domain, 4) && hex(bus, 2) && hex(dev, 2) && matches!(func.as_bytes(), [b'0'..=b'7'])
}

/// What a device has done that costs extra, since it was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpdkStats {
    /// Reads and writes whose memory was not DMA memory, copied through a
    /// bounce buffer.
    pub bounce_copies: u64,
    /// Gathered writes copied into one buffer (segments outside DMA memory
    /// or not on page boundaries).
    pub gather_copies: u64,
    /// Gathered writes sent as one scattered command, with no copy.
    pub scattered_writes: u64,
    /// WriteZeroes or Deallocate carried out by writing zeroes.
    pub zero_write_fallbacks: u64,
    /// Commands SPDK refused (a part of) for want of request slots, and
    /// that waited for room.
    pub requeued: u64,
    /// Commands that completed with an error status.
    pub nvme_errors: u64,
}

/// An NVMe namespace through SPDK's polled driver.
#[derive(Debug)]
pub struct SpdkDevice {
    inner: Device,
}

impl SpdkDevice {
    /// Set up SPDK's environment if this is the process's first device, attach
    /// the controller, and start one polling thread per queue.
    pub fn open(opts: SpdkOptions) -> Result<SpdkDevice, OpenError> {
        Ok(SpdkDevice {
            inner: Device::open(opts)?,
        })
    }

    /// The DMA buffer pool: buffers from it go to and from the SSD without a
    /// copy. The node's buffer pool should be this one.
    pub fn pool(&self) -> BufPool {
        self.inner.pool()
    }

    /// A name for the SSD that changes when it is replaced: its serial
    /// number and the namespace (`"nvme S4EWNX0R123456 ns 1"`).
    pub fn identity(&self) -> &str {
        self.inner.identity()
    }

    /// What this device has done that costs extra.
    pub fn stats(&self) -> SpdkStats {
        self.inner.stats()
    }

    /// As [`BlockDevice::submit`], but the future does not borrow the device:
    /// dropping the device while it is pending answers it (`Gone` if it never
    /// reached the device).
    pub fn submit_detached(
        &self,
        queue: u16,
        cmd: DevCommand,
    ) -> impl Future<Output = Result<DevCompletion, DevError>> + Send + 'static {
        self.inner.submit(queue, cmd)
    }
}

impl BlockDevice for SpdkDevice {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }

    fn submit(
        &self,
        queue: u16,
        cmd: DevCommand,
    ) -> impl Future<Output = Result<DevCompletion, DevError>> + Send {
        self.inner.submit(queue, cmd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_addresses_are_checked_as_lspci_writes_them() {
        assert!(is_pci_addr("0000:01:00.0"));
        assert!(is_pci_addr("0000:af:1f.7"));
        for bad in [
            "",
            "01:00.0",
            "0000:01:00",
            "0000:01:00.8",
            "0000:1:00.0",
            "0000:01:00.0:1",
            "000g:01:00.0",
        ] {
            assert!(!is_pci_addr(bad), "{bad}");
        }
        assert_eq!(
            trid_for_pci("0000:01:00.0"),
            "trtype:PCIe traddr:0000:01:00.0"
        );
    }

    #[cfg(not(weir_spdk_linked))]
    #[test]
    fn without_spdk_open_says_how_to_get_it() {
        let e = SpdkDevice::open(SpdkOptions::default()).unwrap_err();
        let text = e.to_string();
        if cfg!(feature = "spdk") {
            assert!(text.contains("pkg-config"), "{text}");
        } else {
            assert_eq!(
                text,
                "weir was built without SPDK; rebuild with --features spdk where SPDK is installed"
            );
        }
    }
}
