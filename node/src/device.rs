//! The node's device, by `[device] driver`: io_uring on a file or block device,
//! or SPDK's polled driver on an NVMe SSD.

use crate::config::{Config, DeviceDriver, DeviceMode};
use anyhow::Context;
use weir_core::device::{BlockDevice, DevCommand, DevCompletion, DevError, Geometry};
use weir_core::BufPool;
use weir_nvme_spdk::{EnvOptions, SpdkDevice, SpdkOptions};
use weir_nvme_uring::{PollMode, UringDevice, UringOptions};

/// One of the two real devices.
#[derive(Debug)]
pub enum NodeDevice {
    /// io_uring (weir-nvme-uring).
    Uring(UringDevice),
    /// SPDK (weir-nvme-spdk).
    Spdk(SpdkDevice),
}

/// An open device, the buffer pool the node should read into, and a name
/// for the device that changes when it is replaced.
pub struct Opened {
    /// The device.
    pub device: NodeDevice,
    /// The node's buffer pool: DMA memory for SPDK.
    pub pool: BufPool,
    /// What the block-version checkpoints are tied to.
    pub identity: String,
    /// For logs: the file or the PCI address.
    pub name: String,
}

/// Open the device `config` names, with a buffer pool of `pool_bytes`.
pub fn open(config: &Config, pool_bytes: usize) -> anyhow::Result<Opened> {
    match config.device.driver {
        DeviceDriver::Uring => open_uring(config, pool_bytes),
        DeviceDriver::Spdk => open_spdk(config, pool_bytes),
    }
}

/// The device file through io_uring, with O_DIRECT.
fn open_uring(config: &Config, pool_bytes: usize) -> anyhow::Result<Opened> {
    let d = &config.device;
    let path = config.device_path();
    let pool = BufPool::new(pool_bytes);
    // With `register_buffers` the pool's regions are all reserved now
    // and registered with the device's rings as they are set up
    // (registering pins a region; done in the I/O path it would hold
    // up the first command to touch each region).
    let registered = d.register_buffers.then(|| {
        let all: Vec<_> =
            std::iter::from_fn(|| pool.alloc(weir_core::buf::REGION_BYTES_MAX).ok()).collect();
        drop(all);
        pool.clone()
    });
    let opts = UringOptions {
        capacity_bytes: Some(config.cluster.pool_size.0),
        queues: d.queues,
        queue_depth: d.queue_depth,
        create: true,
        mode: match d.mode {
            DeviceMode::Interrupt => PollMode::Interrupt,
            DeviceMode::Sqpoll => PollMode::Sqpoll,
            DeviceMode::Iopoll => PollMode::Iopoll,
        },
        ..UringOptions::default()
    };
    let device = UringDevice::open_with_pool(&path, opts, registered)
        .with_context(|| format!("opening device {}", path.display()))?;
    let identity = crate::logfile::device_identity(&path, config.cluster.pool_size.0)
        .with_context(|| format!("naming device {}", path.display()))?;
    Ok(Opened {
        device: NodeDevice::Uring(device),
        pool,
        identity,
        name: path.display().to_string(),
    })
}

/// An NVMe SSD through SPDK.
fn open_spdk(config: &Config, pool_bytes: usize) -> anyhow::Result<Opened> {
    let d = &config.device;
    anyhow::ensure!(
        !weir_nvme_spdk::STAND_IN,
        "this weir links the test stand-in of SPDK (built with --all-features or \
         weir-nvme-spdk/spdk-mock), not SPDK; rebuild with --features spdk"
    );
    let pci = d.pci_addr.clone().context("device.pci_addr")?;
    let opts = SpdkOptions {
        trid: weir_nvme_spdk::trid_for_pci(&pci),
        queues: d.queues,
        queue_depth: d.queue_depth,
        poll_cores: d.poll_cores.clone(),
        pool_bytes,
        env: EnvOptions {
            mem_mb: d.spdk_mem_mb,
            ..EnvOptions::default()
        },
        ..SpdkOptions::default()
    };
    let device = SpdkDevice::open(opts)
        .with_context(|| format!("opening the NVMe SSD at {pci} through SPDK"))?;
    let g = device.geometry();
    let bytes = g.capacity_blocks * u64::from(g.block_size);
    anyhow::ensure!(
        bytes >= config.cluster.pool_size.0,
        "the SSD at {pci} holds {bytes} bytes, less than cluster.pool_size ({})",
        config.cluster.pool_size.0
    );
    let identity = format!(
        "{}, {} bytes",
        device.identity(),
        config.cluster.pool_size.0
    );
    Ok(Opened {
        pool: device.pool(),
        device: NodeDevice::Spdk(device),
        identity,
        name: format!("nvme {pci}"),
    })
}

impl BlockDevice for NodeDevice {
    fn geometry(&self) -> Geometry {
        match self {
            NodeDevice::Uring(d) => d.geometry(),
            NodeDevice::Spdk(d) => d.geometry(),
        }
    }

    async fn submit(&self, queue: u16, cmd: DevCommand) -> Result<DevCompletion, DevError> {
        match self {
            NodeDevice::Uring(d) => d.submit(queue, cmd).await,
            NodeDevice::Spdk(d) => d.submit(queue, cmd).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spdk_driver_in_a_build_without_spdk_says_how_to_get_it() {
        let text = r#"
            [node]
            id = 1
            [cluster]
            members = [{ id = 1, addr = "127.0.0.1:7401" }]
            replicas = 1
            [device]
            driver = "spdk"
            pci_addr = "0000:01:00.0"
        "#;
        let config = Config::parse(text, std::path::Path::new("weir.toml")).unwrap();
        let e = format!("{:#}", open(&config, 1 << 20).err().expect("no SPDK here"));
        assert!(
            e.contains("opening the NVMe SSD at 0000:01:00.0 through SPDK"),
            "{e}"
        );
        if cfg!(feature = "spdk") {
            assert!(e.contains("SPDK"), "{e}");
        } else {
            assert!(e.contains("rebuild with --features spdk"), "{e}");
        }
    }
}
