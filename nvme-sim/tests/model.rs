//! The simulated SSD measured on madsim time against its own model.
#![cfg(madsim)]

use bytes::Bytes;
use madsim::rand::{thread_rng, Rng};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use weir_core::device::{BlockDevice, DevCommand, DevCompletion, DevError};
use weir_core::ids::Lba;
use weir_core::BufPool;
use weir_nvme_sim::{SimSsd, SsdConfig};

/// Run `qd` workers of 4 KiB random reads over the first 64 GiB for `span`;
/// returns (IOPS, mean latency in ns).
async fn random_reads(ssd: Arc<SimSsd>, qd: usize, span: Duration) -> (f64, f64) {
    let pool = BufPool::new(64 << 20);
    let start = Instant::now();
    let mut workers = Vec::new();
    for w in 0..qd {
        let (ssd, pool) = (ssd.clone(), pool.clone());
        workers.push(tokio::spawn(async move {
            let (mut ops, mut latency_ns) = (0u64, 0u128);
            while start.elapsed() < span {
                let lba = Lba(thread_rng().gen_range(0..(64u64 << 30) / 4096));
                let buf = pool.alloc(4096).unwrap();
                let t0 = Instant::now();
                let queue = (w % 8) as u16;
                match ssd.submit(queue, DevCommand::Read { lba, buf }).await {
                    Ok(DevCompletion::Read(_)) => {}
                    other => panic!("read failed: {other:?}"),
                }
                latency_ns += t0.elapsed().as_nanos();
                ops += 1;
            }
            (ops, latency_ns)
        }));
    }
    let (mut ops, mut latency_ns) = (0u64, 0u128);
    for w in workers {
        let (o, l) = w.await.unwrap();
        ops += o;
        latency_ns += l;
    }
    let secs = start.elapsed().as_secs_f64();
    (ops as f64 / secs, latency_ns as f64 / ops as f64)
}

/// Read `bytes` at `lba` through `queue`: what the device returns.
async fn read_back(ssd: &SimSsd, queue: u16, lba: u64, bytes: usize) -> Vec<u8> {
    let buf = BufPool::new(1 << 20).alloc(bytes).unwrap();
    let cmd = DevCommand::Read { lba: Lba(lba), buf };
    match ssd.submit(queue, cmd).await {
        Ok(DevCompletion::Read(buf)) => buf.as_ref().to_vec(),
        other => panic!("read returned no data: {other:?}"),
    }
}

fn within(measured: f64, model: f64, tolerance: f64) -> bool {
    (measured - model).abs() <= tolerance * model
}

#[madsim::test]
async fn qd1_latency_and_qd128_iops_match_the_model() {
    let config = SsdConfig::default();
    let latency_model = config.model_read_latency_qd1_ns() as f64;
    let iops_model = config.model_read_iops_max();
    let ssd = Arc::new(SimSsd::new(config, 7).unwrap());

    let (_, latency_qd1) = random_reads(ssd.clone(), 1, Duration::from_millis(100)).await;
    println!("QD1 mean latency {latency_qd1:.0} ns (model {latency_model:.0} ns)");
    assert!(
        within(latency_qd1, latency_model, 0.15),
        "QD1 latency {latency_qd1:.0} ns vs model {latency_model:.0} ns"
    );

    let (iops_qd128, _) = random_reads(ssd, 128, Duration::from_millis(50)).await;
    println!("QD128 {iops_qd128:.0} IOPS (model {iops_model:.0})");
    assert!(
        within(iops_qd128, iops_model, 0.15),
        "QD128 {iops_qd128:.0} IOPS vs model {iops_model:.0}"
    );
}

#[madsim::test]
async fn iops_rise_with_queue_depth_until_they_saturate() {
    let ssd = Arc::new(SimSsd::new(SsdConfig::default(), 3).unwrap());
    let mut last = 0.0;
    let mut curve = Vec::new();
    for qd in [1, 4, 16, 64] {
        let (iops, _) = random_reads(ssd.clone(), qd, Duration::from_millis(20)).await;
        curve.push((qd, iops as u64));
        assert!(
            iops > last * 1.5,
            "IOPS did not rise with queue depth: {curve:?}"
        );
        last = iops;
    }
    let (saturated, _) = random_reads(ssd.clone(), 512, Duration::from_millis(20)).await;
    curve.push((512, saturated as u64));
    let cap = ssd.config().model_read_iops_max();
    assert!(
        saturated <= cap * 1.01,
        "beyond the controller cap: {curve:?}"
    );
    assert!(saturated >= cap * 0.9, "never saturates: {curve:?}");
}

#[madsim::test]
async fn flush_and_fua_survive_power_loss_and_the_rest_does_not() {
    let config = SsdConfig {
        block_size: 512,
        ..SsdConfig::default()
    };
    let ssd = SimSsd::new(config, 1).unwrap();
    let write = |lba, byte, fua| DevCommand::Write {
        lba: Lba(lba),
        data: Bytes::from(vec![byte; 512]),
        fua,
    };
    ssd.submit(0, write(10, 1, false)).await.unwrap();
    ssd.submit(0, DevCommand::Flush).await.unwrap();
    ssd.submit(1, write(11, 2, true)).await.unwrap();
    let t0 = Instant::now();
    ssd.submit(1, write(12, 3, false)).await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_micros(50),
        "cached write must be fast"
    );
    ssd.power_loss();
    assert_eq!(
        ssd.submit(0, DevCommand::Flush).await.unwrap_err(),
        DevError::Gone
    );
    ssd.power_on();
    let data = read_back(&ssd, 0, 10, 3 * 512).await;
    assert!(data[..512].iter().all(|&b| b == 1), "flushed write lost");
    assert!(data[512..1024].iter().all(|&b| b == 2), "FUA write lost");
    assert!(
        data[1024..].iter().all(|&b| b == 0),
        "unflushed write survived power loss"
    );
}

/// A FUA write of `blocks` blocks of 5s at LBA 3, cut by a power loss half-way
/// through its program time; returns what the blocks hold after power returns.
async fn write_cut_by_power_loss(seed: u64, blocks: usize) -> Vec<u8> {
    let ssd = Arc::new(SimSsd::new(SsdConfig::default(), seed).unwrap());
    let writer = {
        let ssd = ssd.clone();
        tokio::spawn(async move {
            let data = Bytes::from(vec![5u8; 4096 * blocks]);
            let cmd = DevCommand::Write {
                lba: Lba(3),
                data,
                fua: true,
            };
            ssd.submit(0, cmd).await
        })
    };
    // A FUA write takes a program time (milliseconds); cut power half-way.
    tokio::time::sleep(Duration::from_millis(1)).await;
    ssd.power_loss();
    assert_eq!(writer.await.unwrap().unwrap_err(), DevError::Gone);
    ssd.power_on();
    read_back(&ssd, 0, 3, 4096 * blocks).await
}

#[madsim::test]
async fn a_write_in_flight_at_power_loss_fails_and_is_torn_at_a_block_boundary() {
    // One block is atomic: old or new, never a mix.
    let mut outcomes = std::collections::BTreeSet::new();
    for seed in 0..16 {
        let data = write_cut_by_power_loss(seed, 1).await;
        let first = data[0];
        assert!(data.iter().all(|&b| b == first), "a block was torn inside");
        outcomes.insert(first);
    }
    assert_eq!(outcomes.len(), 2, "both outcomes occur: {outcomes:?}");
    // Many blocks: a prefix of new blocks, then old ones; different tears occur.
    let mut prefixes = std::collections::BTreeSet::new();
    for seed in 0..16 {
        let data = write_cut_by_power_loss(seed, 16).await;
        let blocks: Vec<u8> = data
            .chunks(4096)
            .map(|b| {
                assert!(b.iter().all(|&x| x == b[0]), "a block was torn inside");
                b[0]
            })
            .collect();
        let kept = blocks.iter().take_while(|&&b| b == 5).count();
        assert!(
            blocks[kept..].iter().all(|&b| b == 0),
            "not a prefix: {blocks:?}"
        );
        prefixes.insert(kept);
    }
    assert!(prefixes.len() > 2, "tears vary with the seed: {prefixes:?}");
}

#[madsim::test]
async fn a_read_in_flight_with_a_write_sees_the_contents_when_it_completes() {
    let ssd = Arc::new(SimSsd::new(SsdConfig::default(), 1).unwrap());
    // A FUA write takes milliseconds; a read issued meanwhile completes first
    // and sees the old contents (zeroes), not the write's.
    let writer = {
        let ssd = ssd.clone();
        tokio::spawn(async move {
            let cmd = DevCommand::Write {
                lba: Lba(9),
                data: Bytes::from(vec![7u8; 4096]),
                fua: true,
            };
            ssd.submit(0, cmd).await
        })
    };
    tokio::time::sleep(Duration::from_micros(100)).await;
    let data = read_back(&ssd, 1, 9, 4096).await;
    assert!(data.iter().all(|&b| b == 0), "saw a write still in flight");
    writer.await.unwrap().unwrap();
    let data = read_back(&ssd, 1, 9, 4096).await;
    assert!(
        data.iter().all(|&b| b == 7),
        "a completed write is not seen"
    );
}

#[madsim::test]
async fn a_hung_device_completes_nothing_until_it_resumes() {
    let ssd = Arc::new(SimSsd::new(SsdConfig::default(), 1).unwrap());
    ssd.hang();
    let t0 = Instant::now();
    let flusher = {
        let ssd = ssd.clone();
        tokio::spawn(async move { ssd.submit(0, DevCommand::Flush).await })
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(!flusher.is_finished(), "a hung device completed a command");
    ssd.resume();
    flusher.await.unwrap().unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(30));
}

#[madsim::test]
async fn bad_commands_get_typed_errors() {
    let ssd = SimSsd::new(SsdConfig::default(), 1).unwrap();
    let cap = ssd.geometry().capacity_blocks;
    let pool = BufPool::new(4 << 20);
    let past_end = DevCommand::Read {
        lba: Lba(cap),
        buf: pool.alloc(4096).unwrap(),
    };
    assert_eq!(
        ssd.submit(0, past_end).await.unwrap_err(),
        DevError::OutOfRange
    );
    let odd = DevCommand::Read {
        lba: Lba(0),
        buf: pool.alloc(100).unwrap(),
    };
    assert_eq!(ssd.submit(0, odd).await.unwrap_err(), DevError::Misaligned);
    let huge = DevCommand::Read {
        lba: Lba(0),
        buf: pool.alloc(2 << 20).unwrap(),
    };
    assert_eq!(ssd.submit(0, huge).await.unwrap_err(), DevError::TooLarge);
    assert_eq!(
        ssd.submit(99, DevCommand::Flush).await.unwrap_err(),
        DevError::BadQueue
    );
    let wrap = DevCommand::Deallocate {
        lba: Lba(u64::MAX),
        blocks: 2,
    };
    assert_eq!(ssd.submit(0, wrap).await.unwrap_err(), DevError::OutOfRange);
}

#[madsim::test]
async fn a_media_error_fails_reads_of_its_blocks_until_they_are_written() {
    let config = SsdConfig {
        block_size: 4096,
        ..SsdConfig::default()
    };
    let ssd = SimSsd::new(config, 1).unwrap();
    let pool = BufPool::new(1 << 20);
    let read = |lba: u64, blocks: usize| DevCommand::Read {
        lba: Lba(lba),
        buf: pool.alloc(blocks * 4096).unwrap(),
    };
    ssd.media_error(Lba(5), 2);
    assert_eq!(ssd.unreadable_blocks(), 2);
    assert_eq!(
        ssd.submit(0, read(4, 4)).await.unwrap_err(),
        DevError::Media(Lba(5))
    );
    // Blocks beside them read fine.
    assert!(ssd.submit(0, read(7, 1)).await.is_ok());
    let data = Bytes::from(vec![7u8; 4096]);
    let write = DevCommand::Write {
        lba: Lba(6),
        data,
        fua: false,
    };
    ssd.submit(0, write).await.unwrap();
    // Block 6 was remapped by the write; block 5 still fails.
    assert!(ssd.submit(0, read(6, 1)).await.is_ok());
    assert_eq!(
        ssd.submit(0, read(5, 2)).await.unwrap_err(),
        DevError::Media(Lba(5))
    );
    assert_eq!(ssd.unreadable_blocks(), 1);
}

/// An SSD whose driver runs on a host of `cores` cores (one of them a polling
/// core if the driver polls).
fn ssd_on_host(
    driver: weir_host_sim::NvmeDriver,
    cores: u32,
) -> (Arc<SimSsd>, weir_nvme_sim::DeviceHost) {
    use weir_host_sim::profile::REFERENCE_MHZ;
    let polled = matches!(driver, weir_host_sim::NvmeDriver::Polled(_));
    let spec = weir_host_sim::HostSpec {
        cores,
        clock_mhz: REFERENCE_MHZ,
        numa: false,
        remote_cost_pct: 100,
        poll_cores: u32::from(polled),
    };
    let cpu = weir_host_sim::Cpu::new(spec, REFERENCE_MHZ).unwrap();
    let host = weir_nvme_sim::DeviceHost {
        cpu: Arc::new(std::sync::Mutex::new(cpu)),
        driver,
        epoch: Instant::now(),
        numa_node: 0,
        poller: 0,
    };
    let ssd = SimSsd::new(SsdConfig::default(), 7)
        .unwrap()
        .with_host(host.clone());
    (Arc::new(ssd), host)
}

#[madsim::test]
async fn the_drivers_cost_cpu_and_a_busy_core_caps_iops() {
    use weir_host_sim::profile::{KernelNvme, PolledNvme};
    use weir_host_sim::NvmeDriver;
    let kernel = KernelNvme::LINUX;
    // QD1: the kernel driver adds its submission and completion work to every
    // command's latency.
    let bare = Arc::new(SimSsd::new(SsdConfig::default(), 7).unwrap());
    let (_, bare_ns) = random_reads(bare, 1, Duration::from_millis(100)).await;
    let (ssd, _) = ssd_on_host(NvmeDriver::Kernel(kernel), 16);
    let (_, kernel_ns) = random_reads(ssd, 1, Duration::from_millis(100)).await;
    let added = kernel_ns - bare_ns;
    let cost = (kernel.submit_ns + kernel.complete_ns) as f64;
    println!("QD1: {bare_ns:.0} ns bare, {kernel_ns:.0} ns with the kernel driver");
    assert!(
        (added - cost).abs() < 0.5 * cost,
        "added {added:.0} ns, the driver costs {cost:.0}"
    );

    // One general core and the kernel driver: the core, not the SSD (about 1M
    // IOPS), caps random reads at one command per 1,645 ns of CPU.
    let (ssd, host) = ssd_on_host(NvmeDriver::Kernel(kernel), 1);
    host.cpu.lock().unwrap().start_window(0);
    let (iops, _) = random_reads(ssd, 128, Duration::from_millis(20)).await;
    let cap = 1e9 / cost;
    println!("one core, kernel driver: {iops:.0} IOPS (CPU cap {cap:.0})");
    assert!(
        iops <= cap * 1.02 && iops > cap * 0.8,
        "{iops:.0} IOPS vs cap {cap:.0}"
    );
    let now = (Instant::now() - host.epoch).as_nanos() as u64;
    let busy = host.cpu.lock().unwrap().usage(now).utilization();
    assert!(busy > 0.9, "the one core should be saturated: {busy:.2}");

    // A polling core does the same work in 72 ns a command: the SSD binds again,
    // and the polling core shows fully busy however little it does.
    let (ssd, host) = ssd_on_host(NvmeDriver::Polled(PolledNvme::SPDK), 2);
    host.cpu.lock().unwrap().start_window(0);
    let (iops, _) = random_reads(ssd, 128, Duration::from_millis(20)).await;
    println!("polled: {iops:.0} IOPS");
    assert!(iops > 1.4 * cap, "polled {iops:.0} IOPS");
    let now = (Instant::now() - host.epoch).as_nanos() as u64;
    let usage = host.cpu.lock().unwrap().usage(now);
    assert_eq!(usage.poll_ns, now, "the polling core spins the whole time");
    assert_eq!(
        usage.work_ns, 0,
        "the general core did none of the driver's work"
    );
}

#[madsim::test]
async fn a_write_whose_host_crashed_still_lands() {
    // The host dies (no power loss) while its FUA write is in flight: the
    // device has the command and completes it; nothing is left behind for a
    // later power loss to tear onto media.
    let ssd = Arc::new(SimSsd::new(SsdConfig::default(), 1).unwrap());
    let handle = madsim::runtime::Handle::current();
    let host = handle.create_node().name("host").build();
    let writer = ssd.clone();
    host.spawn(async move {
        let cmd = DevCommand::Write {
            lba: Lba(4),
            data: Bytes::from(vec![6u8; 4096]),
            fua: true,
        };
        let _ = writer.submit(0, cmd).await;
    });
    tokio::time::sleep(Duration::from_millis(1)).await;
    handle.kill(host.id());
    // Power cut later: the write was complete on media, not in flight.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(ssd.power_loss(), 0, "nothing was in flight or in the cache");
    ssd.power_on();
    let data = read_back(&ssd, 0, 4, 4096).await;
    assert!(
        data.iter().all(|&b| b == 6),
        "the crashed host's write was lost"
    );
}
