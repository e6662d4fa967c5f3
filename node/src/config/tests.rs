//! The config parser: defaults, every key, and refusals naming the key.

use super::*;

const GOOD: &str = r#"
    [node]
    id = 2
    [cluster]
    members = [
      { id = 1, addr = "127.0.0.1:7401" },
      { id = 2, addr = "127.0.0.1:7402" },
      { id = 3, addr = "127.0.0.1:7403" },
    ]
"#;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("weir.toml"))
}

#[test]
fn defaults_fill_everything_but_the_members() {
    let c = parse(GOOD).unwrap();
    assert_eq!(c.cluster.replicas, 3);
    assert_eq!(c.cluster.pool_size, Size(64 << 30));
    assert_eq!(c.nbd.listen, "127.0.0.1:10809".parse().unwrap());
    assert_eq!(c.admin_addr(), "127.0.0.1:9402".parse().unwrap());
    assert_eq!(c.my_addr(), "127.0.0.1:7402".parse().unwrap());
    assert_eq!(c.timeouts.lease_ms, 1500);
    assert_eq!(c.timeouts.replace_after_s, 600);
    // 1 ms offsets and 15 ppm over a 1.5 s lease.
    assert_eq!(c.timeouts.lease_margin_ns(), 2_000_000 + 45_000);
}

#[test]
fn the_congestion_response_is_off_unless_asked_and_its_bounds_are_checked() {
    assert!(!parse(GOOD).unwrap().flow.enabled);
    let on = parse(&format!(
        "{GOOD}\n[flow]\nenabled = true\nwindow_min_bytes = 65536"
    ));
    let flow = on.unwrap().flow;
    assert!(flow.enabled);
    assert_eq!(flow.window_min_bytes, 65536);
    let e = parse(&format!("{GOOD}\n[flow]\nwindow_min_bytes = 0"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("flow.window_min_bytes"), "{e}");
}

#[test]
fn clocks_too_far_apart_for_the_lease_are_refused() {
    let e = parse(&format!("{GOOD}\n[timeouts]\nclock_offset_max_us = 200000"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("clock_offset_max_us"), "{e}");
    let ok = parse(&format!("{GOOD}\n[timeouts]\nclock_offset_max_us = 100"));
    assert_eq!(ok.unwrap().timeouts.lease_margin_ns(), 200_000 + 45_000);
}

#[test]
fn the_device_mode_is_one_of_three() {
    assert_eq!(parse(GOOD).unwrap().device.mode, DeviceMode::Interrupt);
    for (text, mode) in [
        ("sqpoll", DeviceMode::Sqpoll),
        ("iopoll", DeviceMode::Iopoll),
    ] {
        let c = parse(&format!("{GOOD}\n[device]\nmode = \"{text}\"")).unwrap();
        assert_eq!(c.device.mode, mode);
    }
    let e = parse(&format!("{GOOD}\n[device]\nmode = \"polled\"")).unwrap_err();
    assert!(e.to_string().contains("mode"), "{e}");
}

#[test]
fn the_rdma_section_has_defaults_and_refuses_bad_ports_and_pools() {
    let c = parse(&format!("{GOOD}\n[transport]\nkind = \"rdma\"")).unwrap();
    assert_eq!(c.transport.kind, TransportKind::Rdma);
    assert_eq!(c.rdma, RdmaSection::default());
    let two = parse(&format!(
        "{GOOD}\n[rdma]\ndevice = \"mlx5_0\"\nports = [1, 2]\ngid_index = 3"
    ))
    .unwrap();
    assert_eq!(two.rdma.ports, [1, 2]);
    assert_eq!(two.rdma.device.as_deref(), Some("mlx5_0"));
    for bad in [
        "ports = []",
        "ports = [1, 1]",
        "ports = [0]",
        "ports = [1, 2, 3]",
    ] {
        let e = parse(&format!("{GOOD}\n[rdma]\n{bad}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("rdma.ports"), "{bad}: {e}");
    }
    let e = parse(&format!("{GOOD}\n[rdma]\npool_bytes = \"4k\""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("rdma.pool_bytes"), "{e}");
    assert!(parse(&format!("{GOOD}\n[transport]\nkind = \"udp\"")).is_err());
}

#[test]
fn errors_name_the_key_and_the_file() {
    let typo = GOOD.replace("[cluster]", "[cluster]\nreplica = 2");
    let e = parse(&typo).unwrap_err().to_string();
    assert!(e.contains("weir.toml") && e.contains("replica"), "{e}");
    let e = parse(&GOOD.replace("id = 2\n", "id = 9\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("node.id") && e.contains("weir.toml"), "{e}");
    let e = parse(&GOOD.replace("[cluster]", "[cluster]\nreplicas = 4"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cluster.replicas"), "{e}");
    let e = parse(&GOOD.replace("[cluster]", "[cluster]\npool_size = \"10Q\""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("pool_size") || e.contains("10Q"), "{e}");
    let e = parse(&GOOD.replace("[cluster]", "[cluster]\npool_size = \"100M\""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("cluster.pool_size"), "{e}");
    let e = parse(&GOOD.replace("7403", "99999"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("weir.toml"), "{e}");
    let e = parse(&format!("{GOOD}\n[timeouts]\nlease_ms = 5"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("timeouts"), "{e}");
    let e = parse(&format!("{GOOD}\n[timeouts]\nreplace_after_s = 1"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("timeouts.replace_after_s"), "{e}");
}

#[test]
fn sizes_parse_with_binary_units() {
    assert_eq!(parse_size("10G"), Ok(10 << 30));
    assert_eq!(parse_size("64MiB"), Ok(64 << 20));
    assert_eq!(parse_size("1.5K"), Ok(1536));
    assert_eq!(parse_size("4096"), Ok(4096));
    assert!(parse_size("ten").is_err());
    assert!(parse_size("5X").is_err());
    assert!(parse_size("").is_err());
}

#[test]
fn the_spdk_driver_needs_a_pci_address_and_takes_no_uring_options() {
    let spdk = |rest: &str| parse(&format!("{GOOD}\n[device]\ndriver = \"spdk\"\n{rest}"));
    let c = spdk("pci_addr = \"0000:01:00.0\"\npoll_cores = [2, 3]\nspdk_mem_mb = 2048").unwrap();
    assert_eq!(c.device.driver, DeviceDriver::Spdk);
    assert_eq!(c.device.pci_addr.as_deref(), Some("0000:01:00.0"));
    assert_eq!(c.device.poll_cores, [2, 3]);
    assert_eq!(parse(GOOD).unwrap().device.driver, DeviceDriver::Uring);
    for (rest, key, why) in [
        ("", "device.pci_addr", "needs the SSD's PCI address"),
        ("pci_addr = \"01:00.0\"", "device.pci_addr", "DDDD:BB:DD.F"),
        (
            "pci_addr = \"0000:01:00.0\"\npoll_cores = [1]",
            "device.poll_cores",
            "1 cores for 2 queues",
        ),
        (
            "pci_addr = \"0000:01:00.0\"\nmode = \"sqpoll\"",
            "device.mode",
            "io_uring's",
        ),
    ] {
        let e = spdk(rest).unwrap_err().to_string();
        assert!(e.contains(key) && e.contains(why), "{rest}: {e}");
    }
    let e = parse(&format!("{GOOD}\n[device]\npci_addr = \"0000:01:00.0\""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("device.driver"), "{e}");
    let e = parse(&format!("{GOOD}\n[device]\ndriver = \"nvme\""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown variant"), "{e}");
}

#[test]
fn nbd_tls_needs_a_certificate_and_a_key() {
    let e = parse(&format!("{GOOD}\n[nbd]\ntls = \"require\""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("nbd.tls") && e.contains("tls_cert"), "{e}");
    let c = parse(&format!(
        "{GOOD}\n[nbd]\ntls = \"on\"\ntls_cert = \"a.pem\"\ntls_key = \"a.key\""
    ))
    .unwrap();
    assert_eq!(c.nbd.tls, NbdTlsMode::On);
    assert_eq!(parse(GOOD).unwrap().nbd.tls, NbdTlsMode::Off);
    let e = parse(&format!(
        "{GOOD}\n[nbd]\ntls = \"on\"\ntls_cert = \"a\"\ntls_key = \"b\"\ntls_client_ca = \"c\""
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("require"), "{e}");
}
