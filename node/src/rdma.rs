//! `[transport] kind = "rdma"`: the node's and its front end's endpoints over
//! weir-transport-rdma's verbs. The device and ports the config names are
//! checked first, before the node touches its data directory, so a machine
//! without a usable RDMA NIC is told so at once, with the way out.

use crate::config::{Config, RdmaSection};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use weir_core::NodeId;
use weir_transport_rdma::net::verbs_nic::VerbsNic;
use weir_transport_rdma::net::{RdmaConfig, RdmaTransport};
use weir_transport_rdma::verbs::{Context, VerbsError};

/// Why `weir node` cannot run with `kind = "rdma"` here, naming the way out.
fn refusal(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!(
        "[transport] kind = \"rdma\": {e}; use kind = \"tcp\" on a machine \
         without a usable RDMA NIC (or add a Soft-RoCE link: \
         rdma link add rxe0 type rxe netdev IFACE)"
    )
}

/// Check the device and ports of `r`: what was found, or why it cannot run.
pub fn check(r: &RdmaSection) -> anyhow::Result<String> {
    probe(r).map_err(refusal)
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

/// The transport's settings from the config.
pub fn settings(config: &Config) -> anyhow::Result<RdmaConfig> {
    let security = config.tls_identity()?.map(|tls| {
        Arc::new(TlsSide(tls)) as Arc<dyn weir_transport_rdma::net::secure::SideSecurity>
    });
    Ok(RdmaConfig {
        cluster_id: config.cluster.id,
        pool_bytes: config.rdma.pool_bytes.0 as usize,
        security,
        ..RdmaConfig::default()
    })
}

/// The RDMA side channels under the members' TLS (`[tls]`), as member links
/// over TCP are.
#[derive(Debug)]
struct TlsSide(weir_transport_tcp::TlsIdentity);

impl weir_transport_rdma::net::secure::SideSecurity for TlsSide {
    fn connect(
        &self,
        tcp: tokio_real::net::TcpStream,
        to: NodeId,
    ) -> weir_transport_rdma::net::secure::Setup<weir_transport_rdma::net::secure::Side> {
        let tls = self.0.clone();
        Box::pin(async move {
            let stream = tls.connect_member(tcp, to).await?;
            Ok(Box::new(stream) as weir_transport_rdma::net::secure::Side)
        })
    }

    fn accept(
        &self,
        tcp: tokio_real::net::TcpStream,
    ) -> weir_transport_rdma::net::secure::Setup<(
        weir_transport_rdma::net::secure::Side,
        weir_transport_rdma::net::secure::Certifies,
    )> {
        let tls = self.0.clone();
        Box::pin(async move {
            let stream = tls.accept_member(tcp).await?;
            let names = weir_transport_tcp::peer_names(&stream);
            Ok((
                Box::new(stream) as weir_transport_rdma::net::secure::Side,
                Box::new(names) as weir_transport_rdma::net::secure::Certifies,
            ))
        })
    }
}

/// Completion queue entries for an endpoint of `cfg`: every work request
/// that the connections its pool holds can have outstanding.
fn cq_entries(cfg: &RdmaConfig) -> i32 {
    let p = cfg.proto.params;
    let links = (cfg.pool_bytes / cfg.link_bytes()).max(1);
    let per_link = usize::from(cfg.proto.send_queue) + usize::from(p.recv_slots);
    (links * per_link).clamp(256, 1 << 22) as i32
}

/// The node's endpoint (listening on its member address) and its front end's
/// (dialing only), each with its own completion queue and pool.
pub async fn bind(
    config: &Config,
    me: NodeId,
    client_id: NodeId,
    node_peers: BTreeMap<NodeId, SocketAddr>,
    peers: BTreeMap<NodeId, SocketAddr>,
) -> anyhow::Result<(Arc<RdmaTransport>, Arc<RdmaTransport>)> {
    let cfg = settings(config)?;
    cfg.validate().map_err(|e| anyhow::anyhow!("[rdma]: {e}"))?;
    let r = &config.rdma;
    let nic = || {
        let class = (r.gid_index, r.traffic_class);
        VerbsNic::open(r.device.as_deref(), &r.ports, class, cq_entries(&cfg)).map_err(refusal)
    };
    let node = RdmaTransport::bind(me, Some(config.my_addr()), node_peers, cfg.clone(), nic()?)
        .await
        .map_err(|e| anyhow::anyhow!("listening on {}: {e}", config.my_addr()))?;
    let client = RdmaTransport::bind(client_id, None, peers, cfg.clone(), nic()?).await?;
    Ok((node, client))
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
        if weir_transport_rdma::verbs::devices().is_ok_and(|d| !d.is_empty()) {
            // A machine with a device runs the node: nothing to check here.
            return;
        }
        let rt = tokio_real::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = rt
            .block_on(crate::daemon::run(config, std::future::pending()))
            .unwrap_err()
            .to_string();
        // This machine (no RDMA NIC): the cause and the way out are named.
        assert!(
            e.contains("kind = \"rdma\"")
                && e.contains("use kind = \"tcp\"")
                && e.contains("no RDMA device on this machine"),
            "{e}"
        );
        assert!(!dir.exists(), "the data directory was touched");
    }

    #[test]
    fn the_cq_holds_every_work_request_the_pool_allows() {
        let cfg = weir_transport_rdma::net::RdmaConfig::default();
        // 256 MiB holds 39 connections of 6.5 MiB, each up to 256 sends and
        // 64 receives outstanding.
        assert_eq!(super::cq_entries(&cfg), 39 * (256 + 64));
    }
}
