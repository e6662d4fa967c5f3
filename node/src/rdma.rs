//! `[transport] kind = "rdma"` at start: the device and ports the config names
//! are checked through weir-transport-rdma's verbs layer, and the node stops
//! with the reason before it touches its data directory. The daemon's
//! transport that runs the messenger over verbs is not built yet (the
//! messenger carries traffic in the simulator only), so even a machine with a
//! usable device is told to use `kind = "tcp"`, with what was found.

use crate::config::RdmaSection;
use weir_transport_rdma::verbs::{Context, VerbsError};

/// Why `weir node` cannot run with `kind = "rdma"` here, naming the way out.
pub fn refusal(r: &RdmaSection) -> anyhow::Error {
    match probe(r) {
        Err(e) => anyhow::anyhow!(
            "[transport] kind = \"rdma\": {e}; use kind = \"tcp\" on a machine \
             without a usable RDMA NIC (or add a Soft-RoCE link: \
             rdma link add rxe0 type rxe netdev IFACE)"
        ),
        Ok(found) => anyhow::anyhow!(
            "[transport] kind = \"rdma\": {found} is usable, but this build's daemon \
             has no RDMA transport yet (RDMA's messenger runs in the simulator: \
             cargo xtask sim --rdma); use kind = \"tcp\""
        ),
    }
}

/// The device and ports of `r`, opened and checked: what was found.
fn probe(r: &RdmaSection) -> Result<String, VerbsError> {
    let ctx = Context::open(r.device.as_deref())?;
    let mut found = Vec::new();
    for &port in &r.ports {
        let info = ctx.active_port(port)?;
        ctx.gid(port, r.gid_index)?;
        found.push(format!(
            "port {port} ({}, MTU {})",
            if info.ethernet { "RoCE" } else { "InfiniBand" },
            info.mtu_bytes
        ));
    }
    Ok(format!("device {} {}", ctx.name(), found.join(", ")))
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, TransportKind};
    use std::path::Path;

    #[test]
    fn a_node_with_kind_rdma_stops_before_it_touches_its_data_dir() {
        let dir = std::env::temp_dir().join(format!("weir-rdma-{}", std::process::id()));
        let text = format!(
            "[node]\nid = 1\ndata_dir = {dir:?}\n[cluster]\nreplicas = 1\n\
             members = [{{ id = 1, addr = \"127.0.0.1:7491\" }}]\n\
             [transport]\nkind = \"rdma\"\n[rdma]\nports = [1, 2]\n"
        );
        let config = Config::parse(&text, Path::new("weir.toml")).unwrap();
        assert_eq!(config.transport.kind, TransportKind::Rdma);
        let rt = tokio_real::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = rt
            .block_on(crate::daemon::run(config, std::future::pending()))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("kind = \"rdma\"") && e.contains("use kind = \"tcp\""),
            "{e}"
        );
        match weir_transport_rdma::verbs::devices() {
            // This machine (no RDMA NIC): the cause is named.
            Err(_) => assert!(e.contains("no RDMA device on this machine"), "{e}"),
            Ok(_) => assert!(
                e.contains("no RDMA transport yet") || e.contains("port"),
                "{e}"
            ),
        }
        assert!(!dir.exists(), "the data directory was touched");
    }
}
