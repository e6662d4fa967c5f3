//! `weir node`: one storage node, from its config to a clean shutdown.
//!
//! Start-up, in order: lock the data directory; open the device (io_uring,
//! O_DIRECT, a file created sparse at the pool's size; or SPDK on an NVMe SSD);
//! replay the Raft log; bind the replication transport; start weir-core's `Node` (data path + control plane);
//! open the NBD front end's client endpoint; serve NBD and the admin endpoint.
//! On SIGINT or SIGTERM: stop taking NBD clients, flush the device, exit. Every
//! acknowledged write is on every in-sync replica's device already, and every Raft
//! record was synced before it was acted on, so nothing acknowledged is lost.

use crate::admin::Admin;
use crate::backend::WeirBackend;
use crate::config::Config;
use crate::logfile::LogFile;
use crate::metrics::Metrics;
use crate::net::Net;
use anyhow::Context;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use weir_core::client::Volume;
use weir_core::control::Timeouts;
use weir_core::front_end::{FrontEndParts, NodeFrontEnd};
use weir_core::map::VolumeSpec;
use weir_core::node::boot::{boot_with_front_end, BootReport, Durable, NodeSettings, Stored};
use weir_core::node::{EventLog, Events, NodeHandle};
use weir_core::replication::ReplicationConfig;
use weir_core::sched::SchedConfig;
use weir_core::{BlockDevice, ClusterMap, DevCommand, NodeId, VolumeId};
use weir_transport_tcp::{TcpConfig, TcpTransport};

/// Bytes of aligned buffers a node holds for device reads at once.
const POOL_BYTES: usize = 512 << 20;
// `register_buffers` reserves the pool by allocating whole regions.
const _: () = assert!(POOL_BYTES >= weir_core::buf::REGION_BYTES_MAX);
/// The pool's block size.
pub const BLOCK_SIZE: u32 = 4096;
/// The largest request to one primary (a wire frame carries it whole).
const MAX_REQUEST_BLOCKS: u32 = 256;

/// The pool volume every node holds replicas of; named volumes are runs of its
/// extents.
pub fn pool_spec(config: &Config) -> VolumeSpec {
    VolumeSpec {
        id: VolumeId(1),
        block_size: BLOCK_SIZE,
        capacity_blocks: config.cluster.pool_size.0 / u64::from(BLOCK_SIZE),
        extent_blocks: config.cluster.extent_size.0 / u64::from(BLOCK_SIZE),
        max_request_blocks: MAX_REQUEST_BLOCKS,
    }
}

/// Run the node of `config` until `shutdown` resolves or the node fails.
pub async fn run(
    config: Config,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    run_on(config, shutdown, None).await
}

/// [`run`], on the node's and its front end's endpoints if given (bound
/// already: tests run several nodes in one process on an in-process RDMA
/// fabric); otherwise on those `[transport]` names.
///
/// Longer than a step: it is the start-up sequence of the module's header,
/// in order, each step a call, and the values it makes (the device, the two
/// endpoints, the node's handle and task, the front end) all reach the
/// shutdown at its end.
pub async fn run_on(
    config: Config,
    shutdown: impl std::future::Future<Output = ()>,
    endpoints: Option<(Net, Net)>,
) -> anyhow::Result<()> {
    // RDMA's device is looked for before the data directory is touched.
    if endpoints.is_none() && config.transport.kind == crate::config::TransportKind::Rdma {
        let found = crate::rdma::check(&config.rdma)?;
        tracing::info!(%found, "RDMA transport");
    }
    let me = NodeId(config.node.id);
    let dir = config.data_dir();
    let _lock = lock_data_dir(&dir)?;
    crate::logfile::check_data_format(&dir)?;

    // The device, and the node's buffer pool that device reads land in.
    let opened = crate::device::open(&config, POOL_BYTES)?;
    let (bufs, identity, device_name) = (opened.pool, opened.identity, opened.name);
    let device = Arc::new(opened.device);
    let settings = node_settings(&config, device.geometry().optimal_io_blocks > 0)?;
    let map = settings.map.clone();
    let durable = Durable {
        raft: open_store(&dir.join("raft.log"))?,
        versions: open_store(&dir.join("versions.ckpt"))?,
        device: identity.clone(),
    };
    let client_id = weir_core::front_end::front_end_of(me);
    let (transport, client) = match endpoints {
        Some((t, c)) => (Arc::new(t), Arc::new(c)),
        None => bind(&config, client_id).await?,
    };
    let events: EventLog = Arc::new(std::sync::Mutex::new(Events::with_capacity(
        crate::admin::EVENTS_KEPT,
    )));
    // The node with its front end, the two spliced (they talk in process, not
    // over loopback TCP), the node taking the payloads the front end holds.
    let (mut node, front_end, found) = boot_with_front_end(
        &settings,
        ((transport.clone(), client.clone()), device.clone(), bufs),
        durable,
        events.clone(),
        rand::random(),
    )?;
    log_boot(me, &identity, &found);
    let handle = node.handle();
    let mut node_task = tokio_real::spawn(node.run());
    let peers_task = tokio_real::spawn(learn_peers(
        me,
        handle.clone(),
        [transport.clone(), client.clone()],
    ));

    let front = serve_front_end(&config, me, (front_end, map), &handle).await?;
    let admin = serve_admin(&config, &handle, &front, (events, [&transport, &client]))?;
    tracing::info!(
        %me,
        replication = %config.my_addr(),
        nbd = %config.nbd.listen,
        admin = %config.admin_addr(),
        device = %device_name,
        "weir node up"
    );

    let outcome = tokio_real::select! {
        biased;
        () = shutdown => {
            tracing::info!(%me, "shutting down");
            Ok(())
        }
        r = &mut node_task => match r {
            Ok(Ok(())) => Err(anyhow::anyhow!("the node stopped")),
            Ok(Err(e)) => Err(anyhow::Error::from(e).context("the node failed")),
            Err(e) => Err(anyhow::anyhow!("the node task panicked: {e}")),
        },
    };
    for task in [
        front.nbd.abort_handle(),
        front.reclaim.abort_handle(),
        peers_task.abort_handle(),
    ] {
        task.abort();
    }
    admin.0.unblock();
    settle(me, &handle, &*device, outcome.is_ok()).await;
    node_task.abort();
    transport.close();
    client.close();
    let _ = admin.1.join();
    let _ = std::fs::remove_file(dir.join("weir.pid"));
    outcome
}

/// The node's front end, serving: named volumes over its pool client, NBD,
/// and the reclaimer.
struct FrontEnd {
    named: Arc<weir_core::named::NamedVolumes<crate::splice::Spliced>>,
    volume: Arc<Volume<crate::splice::Spliced>>,
    metrics: Arc<Metrics>,
    keys: crate::backend::Keys,
    nbd: tokio_real::task::JoinHandle<std::io::Result<()>>,
    reclaim: tokio_real::task::JoinHandle<()>,
}

/// Open node `me`'s front end from its `parts` (its end of the splice, with
/// the payloads it holds for its node) over `map`, and serve NBD.
async fn serve_front_end(
    config: &Config,
    me: NodeId,
    (parts, map): (FrontEndParts<Net>, ClusterMap),
    handle: &NodeHandle,
) -> anyhow::Result<FrontEnd> {
    let options = weir_core::client::ClientOptions {
        held: None,
        flow: config.flow,
        request_timeout: std::time::Duration::from_secs(config.nbd.request_timeout_s),
    };
    let NodeFrontEnd { volume, named } =
        parts.open(map, Arc::new(handle.clone()), (rand::random(), options));
    let metrics = Arc::new(Metrics::new());
    let keys = crate::backend::Keys::default();
    let reclaim = tokio_real::spawn(crate::reclaim::run(me, handle.clone(), named.clone()));
    let backend = Arc::new(WeirBackend::new(
        named.clone(),
        handle.clone(),
        (metrics.clone(), keys.clone()),
    ));
    let listener = tokio_real::net::TcpListener::bind(config.nbd.listen)
        .await
        .with_context(|| format!("NBD listen address {}", config.nbd.listen))?;
    let nbd = tokio_real::spawn(crate::nbd::serve(listener, backend, config.nbd_tls()?));
    Ok(FrontEnd {
        named,
        volume,
        metrics,
        keys,
        nbd,
        reclaim,
    })
}

/// Serve the admin and metrics endpoint on a thread of its own; the server
/// (to unblock at shutdown) and the thread.
fn serve_admin(
    config: &Config,
    handle: &NodeHandle,
    front: &FrontEnd,
    (events, nets): (EventLog, [&Arc<Net>; 2]),
) -> anyhow::Result<(Arc<tiny_http::Server>, std::thread::JoinHandle<()>)> {
    let token_path = config.admin_token_path();
    let token = crate::admin::load_or_create_token(&token_path)
        .with_context(|| format!("the admin token {}", token_path.display()))?;
    let admin_addr = config.admin_addr();
    let server = Arc::new(
        tiny_http::Server::http(admin_addr)
            .map_err(|e| anyhow::anyhow!("admin listen address {admin_addr}: {e}"))?,
    );
    let [t, c] = nets.map(Arc::clone);
    let (t2, c2) = (t.clone(), c.clone());
    let admin = Admin {
        me: NodeId(config.node.id),
        handle: handle.clone(),
        metrics: front.metrics.clone(),
        events,
        extent_bytes: config.cluster.extent_size.0,
        token,
        read_flow: {
            let volume = front.volume.clone();
            Box::new(move || volume.read_flow())
        },
        rdma: Box::new(move || crate::net::rdma_counters(&[&t, &c])),
        tcp_refused: Box::new(move || crate::net::tcp_refused(&[&t2, &c2])),
        keys: front.keys.clone(),
        barrier: {
            let (rt, named) = (tokio_real::runtime::Handle::current(), front.named.clone());
            Box::new(move |name| rt.block_on(named.barrier(name)).map_err(|e| e.to_string()))
        },
    };
    let admin_server = server.clone();
    let thread = std::thread::Builder::new()
        .name("weir-admin".into())
        .spawn(move || crate::admin::serve(admin_server, admin))?;
    Ok((server, thread))
}

/// At shutdown: write down the block versions the device holds if the node
/// stopped cleanly (so the restarted node is sent only what is written while
/// it is away), and flush the device (whatever it caches reaches media before
/// the process goes).
async fn settle(me: NodeId, handle: &NodeHandle, device: &impl BlockDevice, clean: bool) {
    if clean {
        checkpoint(me, handle).await;
    }
    if let Err(e) = device.submit(0, DevCommand::Flush).await {
        tracing::error!(error = %e, "device flush at shutdown failed");
    }
}

/// Write down the block versions the device holds.
async fn checkpoint(me: NodeId, handle: &NodeHandle) {
    match tokio_real::time::timeout(Duration::from_secs(10), handle.checkpoint()).await {
        Ok(true) => {
            tracing::info!(%me, "block-version checkpoint finished (a failed flush is logged above)")
        }
        Ok(false) => {
            tracing::info!(%me, "no block-version checkpoint (off, or the device is gone)")
        }
        Err(_) => tracing::warn!(%me, "block-version checkpoint did not finish in 10 s"),
    }
}

/// Bind node `config`'s member endpoint and its front end's (`client_id`)
/// client endpoint, over TCP or RDMA as `[transport]` says.
async fn bind(config: &Config, client_id: NodeId) -> anyhow::Result<(Arc<Net>, Arc<Net>)> {
    let me = NodeId(config.node.id);
    let peers: BTreeMap<NodeId, std::net::SocketAddr> = config
        .cluster
        .members
        .iter()
        .map(|m| (NodeId(m.id), m.addr))
        .collect();
    let tls = config.tls_identity()?;
    if tls.is_none() {
        tracing::warn!(
            "[tls] is not set: member links are not authenticated (weir cluster init-certs \
             makes a cluster CA and member certificates)"
        );
    }
    let tcp = TcpConfig {
        cluster_id: config.cluster.id,
        tls,
        ..TcpConfig::default()
    };
    let node_peers = peers
        .iter()
        .filter(|(n, _)| **n != me)
        .map(|(n, a)| (*n, *a))
        .collect();
    let (transport, client) = if config.transport.kind == crate::config::TransportKind::Rdma {
        let (t, c) = crate::rdma::bind(config, me, client_id, node_peers, peers).await?;
        (Net::Rdma(t), Net::Rdma(c))
    } else {
        let t = TcpTransport::bind(me, Some(config.my_addr()), node_peers, tcp.clone())
            .await
            .with_context(|| format!("listening on {}", config.my_addr()))?;
        let c = TcpTransport::bind(client_id, None, peers, tcp)
            .await
            .context("starting the NBD front end's client endpoint")?;
        (Net::Tcp(t), Net::Tcp(c))
    };
    Ok((Arc::new(transport), Arc::new(client)))
}

/// Take the data directory's lock (one node per directory; held while the
/// returned file is open) and write the pid.
fn lock_data_dir(dir: &std::path::Path) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating data_dir {}", dir.display()))?;
    let lock_path = dir.join("weir.lock");
    let lock = std::fs::File::create(&lock_path)
        .with_context(|| format!("creating {}", lock_path.display()))?;
    lock.try_lock().map_err(|_| {
        anyhow::anyhow!(
            "another weir node is running on {} (it holds {})",
            dir.display(),
            lock_path.display()
        )
    })?;
    std::fs::write(dir.join("weir.pid"), format!("{}\n", std::process::id()))?;
    Ok(lock)
}

/// A durable store of the data directory, and what it holds.
fn open_store(path: &std::path::Path) -> anyhow::Result<Stored> {
    let (store, bytes) =
        LogFile::open(path).with_context(|| format!("opening {}", path.display()))?;
    Ok(Stored {
        store: Box::new(store),
        bytes,
    })
}

/// The node `config` describes, for [`boot_with_front_end`]; `split` when the device names
/// an optimal I/O boundary to split requests at (an NVMe namespace's NOIOB,
/// through SPDK; io_uring names none).
fn node_settings(config: &Config, split: bool) -> anyhow::Result<NodeSettings> {
    // In id order on every node, whatever order each config lists them in: the
    // first 3 or 5 vote, and every node must agree which.
    let mut members: Vec<NodeId> = config
        .cluster
        .members
        .iter()
        .map(|m| NodeId(m.id))
        .collect();
    members.sort_unstable();
    let replicas = config.cluster.replicas;
    let map = ClusterMap::new_static(members, pool_spec(config), usize::from(replicas))
        .context("building the cluster map")?;
    let t = &config.timeouts;
    Ok(NodeSettings {
        map,
        replicas,
        replication: ReplicationConfig {
            scrub_bytes_per_sec: config.device.scrub_rate.0,
            checkpoint_every_ns: config.device.checkpoint_ms * 1_000_000,
            lease_margin_ns: t.lease_margin_ns(),
            replica_timeout_ns: t.replica_ms * 1_000_000,
            front_end_payloads: true,
            // The daemon keeps the default version grain (every node must
            // use the same).
            ..ReplicationConfig::default()
        },
        timeouts: Timeouts {
            lease_ns: t.lease_ms * 1_000_000,
            detect_ns: t.detect_ms * 1_000_000,
            replace_ns: t.replace_after_s.saturating_mul(1_000_000_000),
        },
        tick: Duration::from_millis(t.tick_ms),
        device_timeout: Duration::from_millis(t.device_ms),
        sched: SchedConfig {
            merge: config.device.merge,
            split,
            depth_per_queue: config.device.sched_depth,
            classes: config.device.classes,
            shares: weir_core::sched::ClassShares {
                rebuild: weir_core::sched::Share {
                    weight: 1,
                    reservation: config.device.rebuild_reservation,
                },
                ..Default::default()
            },
            ..SchedConfig::default()
        },
        flow: config.flow,
        admit: weir_core::sched::AdmitConfig {
            depth: config.qos.admit_depth,
            ..weir_core::sched::AdmitConfig::default()
        },
        snapshot_entries: None,
    })
}

/// Say what the node found in its data directory.
fn log_boot(me: NodeId, device: &str, found: &BootReport) {
    if found.restarted {
        tracing::info!(%me, bytes = found.raft_bytes, "restarted from the raft log");
    }
    if let Some(other) = &found.foreign_versions {
        tracing::warn!(
            this = %device,
            other = %other,
            "block-version checkpoints describe another device; ignored (a rebuild sends every block)"
        );
    } else if found.version_records > 0 {
        tracing::info!(
            grains = found.version_grains,
            records = found.version_records,
            "block versions restored from checkpoints"
        );
    }
}

/// How often a node looks for members' addresses it has not used yet.
const PEERS_EVERY: Duration = Duration::from_millis(200);

/// Give `nets` the address of every member that joined (the map holds them;
/// the first members' come from the config), as the map learns them.
async fn learn_peers(me: NodeId, handle: NodeHandle, nets: [Arc<Net>; 2]) {
    let mut known: BTreeMap<NodeId, String> = BTreeMap::new();
    loop {
        let state = handle.report().state;
        for (&node, addr) in &state.addrs {
            if node == me || known.get(&node) == Some(addr) {
                continue;
            }
            let Ok(at) = addr.parse::<std::net::SocketAddr>() else {
                tracing::warn!(%node, addr, "a member's address is no IP:PORT; not dialed");
                known.insert(node, addr.clone());
                continue;
            };
            if nets.iter().all(|n| n.set_peer(node, at)) {
                tracing::info!(%node, %at, "member address learned");
                known.insert(node, addr.clone());
            }
        }
        tokio_real::time::sleep(PEERS_EVERY).await;
    }
}
