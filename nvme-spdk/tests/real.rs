//! Against a real SPDK and a real NVMe SSD. Never run in CI (no SSD there, and
//! SPDK is not installed): run by hand on a machine where SPDK 24.09 or later
//! is installed, hugepages are reserved and the SSD is bound to vfio-pci
//! (SPDK's scripts/setup.sh), as root:
//!
//! ```text
//! WEIR_SPDK_PCI=0000:01:00.0 cargo test -p weir-nvme-spdk --features spdk \
//!     --test real -- --ignored
//! ```
//!
//! It overwrites the first 64 blocks of namespace 1.
#![cfg(all(feature = "spdk", not(feature = "spdk-mock")))]

use weir_core::device::{BlockDevice, DevCommand, DevCompletion};
use weir_core::ids::Lba;
use weir_nvme_spdk::{trid_for_pci, SpdkDevice, SpdkOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "requires SPDK and an NVMe device"]
async fn writes_read_back_flush_and_zeroes_on_a_real_ssd() {
    let pci = std::env::var("WEIR_SPDK_PCI").expect("WEIR_SPDK_PCI names the SSD's PCI address");
    let dev = SpdkDevice::open(SpdkOptions {
        trid: trid_for_pci(&pci),
        ..SpdkOptions::default()
    })
    .expect("open");
    let g = dev.geometry();
    let bs = g.block_size as usize;
    let pool = dev.pool();
    for lba in 0..64u64 {
        let mut buf = pool.alloc(bs).unwrap();
        buf.as_mut().fill(lba as u8 ^ 0x5a);
        let cmd = DevCommand::Write {
            lba: Lba(lba),
            data: buf.freeze(),
            fua: lba % 8 == 0,
        };
        dev.submit((lba % 2) as u16, cmd).await.expect("write");
    }
    dev.submit(0, DevCommand::Flush).await.expect("flush");
    for lba in 0..64u64 {
        let buf = pool.alloc(bs).unwrap();
        let DevCompletion::Read(buf) = dev
            .submit(1, DevCommand::Read { lba: Lba(lba), buf })
            .await
            .expect("read")
        else {
            panic!("a read returns its buffer");
        };
        assert!(
            buf.as_ref().iter().all(|&x| x == lba as u8 ^ 0x5a),
            "block {lba}"
        );
    }
    dev.submit(
        0,
        DevCommand::WriteZeroes {
            lba: Lba(0),
            blocks: 64,
        },
    )
    .await
    .expect("zeroes");
    let buf = pool.alloc(bs).unwrap();
    let DevCompletion::Read(buf) = dev
        .submit(0, DevCommand::Read { lba: Lba(5), buf })
        .await
        .unwrap()
    else {
        panic!("a read returns its buffer");
    };
    assert!(buf.as_ref().iter().all(|&x| x == 0));
    assert_eq!(dev.stats().bounce_copies, 0, "pool memory needs no bounce");
}
