//! `weir`: run a node, a local cluster, and manage volumes.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use weir_node::{admin_client, cluster, config, daemon};

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "weir: a replicated block store with an NBD front end"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one node (`weir node --config F`: control plane member, replica
    /// server, NBD server, /metrics), or add, remove and list nodes.
    #[command(args_conflicts_with_subcommands = true)]
    Node {
        #[command(subcommand)]
        command: Option<NodeCmd>,
        /// The node's config file (TOML; see the README for every key).
        #[arg(long)]
        config: Option<PathBuf>,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// A local cluster on loopback with file-backed devices.
    Cluster {
        #[command(subcommand)]
        command: ClusterCmd,
    },
    /// Create, list and delete volumes.
    Volume {
        #[command(subcommand)]
        command: VolumeCmd,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// Take, list and delete snapshots of volumes.
    Snapshot {
        #[command(subcommand)]
        command: SnapshotCmd,
        #[command(flatten)]
        admin: AdminArgs,
    },
    /// The cluster as a node sees it.
    Status {
        /// A node's admin address.
        #[arg(long, env = "WEIR_ADMIN", default_value = "127.0.0.1:9401")]
        admin: String,
        /// The node's admin token (a local cluster's: DIR/admin.token).
        #[arg(
            long,
            env = "WEIR_ADMIN_TOKEN_FILE",
            default_value = "./weir-data/admin.token"
        )]
        token_file: PathBuf,
    },
}

/// Which node's admin endpoint to ask, and its token.
#[derive(clap::Args)]
struct AdminArgs {
    /// A node's admin address.
    #[arg(
        long,
        global = true,
        env = "WEIR_ADMIN",
        default_value = "127.0.0.1:9401"
    )]
    admin: String,
    /// The node's admin token (a local cluster's: DIR/admin.token).
    #[arg(
        long,
        global = true,
        env = "WEIR_ADMIN_TOKEN_FILE",
        default_value = "./weir-data/admin.token"
    )]
    token_file: PathBuf,
}

#[derive(Subcommand)]
enum NodeCmd {
    /// Add a node: start it first with a config naming the cluster's first
    /// members and its own address (`[node] addr`); replicas move to it as
    /// nodes leave or are replaced.
    Add {
        /// Its node id.
        id: u32,
        /// Its replication address, IP:PORT.
        addr: String,
    },
    /// Remove a node: its replicas move to the others (each new copy in sync
    /// before the old one goes), its vote to another node, then it leaves.
    /// Shows the progress until it has left.
    Remove {
        /// Its node id.
        id: u32,
        /// Return once it is leaving; `weir node list` shows the progress.
        #[arg(long)]
        no_wait: bool,
    },
    /// The members: up or down, vote, replicas held, leaving.
    List,
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Start the cluster and keep it up until Ctrl-C.
    Up {
        /// Number of nodes.
        #[arg(long, default_value_t = 3)]
        nodes: u32,
        /// Where the nodes keep their data.
        #[arg(long, default_value = "./weir-data")]
        dir: PathBuf,
        /// Size of the replicated pool that volumes are carved from (sparse files).
        #[arg(long, default_value = "64G")]
        pool_size: String,
        /// Replicas per extent (default: 3, or the node count if smaller).
        #[arg(long)]
        replicas: Option<u8>,
        /// Added to every port, to run several clusters on one host.
        #[arg(long, default_value_t = 0)]
        port_offset: u16,
        /// NBD over TLS: off, on (offered) or require (written into the node
        /// configs at the first start).
        #[arg(long, default_value = "off")]
        nbd_tls: String,
    },
    /// Make the cluster's CA (unless DIR has one) and a certificate and key
    /// for each member that has none, for `[tls]`.
    InitCerts {
        /// Where the CA and the certificates go.
        dir: PathBuf,
        /// The members' node ids, like 1,2,3.
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<u32>,
        /// Names the NBD front ends' certificate carries (what clients dial).
        #[arg(long, value_delimiter = ',', default_value = "localhost,127.0.0.1")]
        nbd_names: Vec<String>,
    },
}

#[derive(Subcommand)]
enum SnapshotCmd {
    /// Take a snapshot of a volume (crash-consistent; served read-only as
    /// the NBD export VOL@NAME).
    Create {
        /// The volume.
        volume: String,
        /// The snapshot's name.
        name: String,
    },
    /// List the snapshots (of one volume, or of all).
    List {
        /// The volume.
        volume: Option<String>,
    },
    /// Delete a snapshot (what a clone of it shares stays).
    Delete {
        /// VOL@NAME.
        snapshot: String,
    },
}

#[derive(Subcommand)]
enum VolumeCmd {
    /// Create a volume.
    Create {
        /// Its name (the NBD export name).
        name: String,
        /// Its size, like 10G.
        #[arg(long)]
        size: String,
        #[command(flatten)]
        qos: QosArgs,
        /// Encrypt it at rest (XTS-AES-256) with the key in --key-file, made
        /// there (mode 0600) if the file does not exist. The node asked is
        /// unlocked; others need `weir volume unlock`.
        #[arg(long, requires = "key_file")]
        encrypt: bool,
        /// The volume's key: 128 hex digits (512 bits).
        #[arg(long)]
        key_file: Option<PathBuf>,
    },
    /// Give a node an encrypted volume's key, so its NBD front end serves the
    /// volume (until it restarts; the key stays in its memory only).
    Unlock {
        /// Its name.
        name: String,
        /// The volume's key file.
        #[arg(long)]
        key_file: PathBuf,
    },
    /// Change a volume's QoS (the settings given; the rest stay).
    Set {
        /// Its name.
        name: String,
        #[command(flatten)]
        qos: QosArgs,
    },
    /// Change a volume's size: growing takes effect at once; shrinking drops
    /// the data past the new end, so it needs --shrink, ends on an extent
    /// boundary and needs a volume without snapshots. NBD clients see the new
    /// size when they connect again.
    Resize {
        /// Its name.
        name: String,
        /// Its new size, like 20G.
        #[arg(long)]
        size: String,
        /// Allow the size to go down (the tail's data is dropped).
        #[arg(long)]
        shrink: bool,
    },
    /// List the volumes.
    List,
    /// Make a new volume from a snapshot: writable, sharing the snapshot's
    /// data until it writes.
    Clone {
        /// VOL@SNAP.
        snapshot: String,
        /// The new volume's name.
        name: String,
    },
    /// Bring a volume back to one of its snapshots (disconnect its clients
    /// first: their writes in flight may land after it).
    Rollback {
        /// VOL@SNAP.
        snapshot: String,
    },
    /// Delete a volume.
    Delete {
        /// Its name.
        name: String,
    },
}

/// A volume's quality of service (dmClock), over the whole cluster.
#[derive(clap::Args)]
struct QosArgs {
    /// Most I/O requests per second (0: none).
    #[arg(long)]
    iops_limit: Option<u64>,
    /// Most bytes per second, like 200M (0: none).
    #[arg(long)]
    bw_limit: Option<String>,
    /// I/O requests per second the volume gets whatever else runs (0: none).
    #[arg(long)]
    iops_reservation: Option<u64>,
    /// Its share of what is left beyond reservations (default 100).
    #[arg(long)]
    weight: Option<u32>,
}

impl QosArgs {
    /// The settings given, as query parameters (each starting with `&`).
    fn query(&self) -> anyhow::Result<String> {
        let mut q = String::new();
        if let Some(n) = self.iops_limit {
            q += &format!("&iops_limit={n}");
        }
        if let Some(b) = &self.bw_limit {
            let bytes = config::parse_size(b).map_err(|e| anyhow::anyhow!("--bw-limit: {e}"))?;
            q += &format!("&bw_limit={bytes}");
        }
        if let Some(n) = self.iops_reservation {
            q += &format!("&iops_reservation={n}");
        }
        if let Some(w) = self.weight {
            q += &format!("&weight={w}");
        }
        Ok(q)
    }
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed here, before the
/// future is first polled: a signal that comes while a node or a local cluster
/// is still starting must stop it cleanly, not kill the process by the
/// default action (which left `weir cluster up`'s nodes running, orphaned).
fn signalled(rt: &tokio_real::runtime::Runtime) -> impl std::future::Future<Output = ()> {
    use tokio_real::signal::unix::{signal, SignalKind};
    let handlers = {
        let _in_runtime = rt.enter();
        (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        )
    };
    async move {
        let (Ok(mut term), Ok(mut int)) = handlers else {
            std::future::pending::<()>().await;
            return;
        };
        tokio_real::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Cmd::Node {
            command: None,
            config: Some(config),
            ..
        } => {
            let config = config::Config::load(&config)?;
            let rt = runtime()?;
            let stop = signalled(&rt);
            rt.block_on(daemon::run(config, stop))
        }
        Cmd::Node {
            command: None,
            config: None,
            ..
        } => anyhow::bail!("say what to do: weir node --config FILE, or weir node add|remove|list"),
        Cmd::Node {
            command: Some(command),
            admin,
            ..
        } => node_admin(command, admin),
        Cmd::Cluster { command } => cluster(command),
        Cmd::Volume { command, admin } => volume(command, admin),
        Cmd::Snapshot { command, admin } => snapshot(command, admin),
        Cmd::Status { admin, token_file } => {
            let token = admin_client::read_token(&token_file);
            print!(
                "{}",
                admin_client::get(&admin, token.as_deref(), "/status")?
            );
            Ok(())
        }
    }
}

/// `weir node add|remove|list`.
fn node_admin(command: NodeCmd, admin: AdminArgs) -> anyhow::Result<()> {
    let token = admin_client::read_token(&admin.token_file);
    let (addr, token) = (admin.admin.as_str(), token.as_deref());
    match command {
        NodeCmd::Add { id, addr: at } => {
            at.parse::<std::net::SocketAddr>()
                .map_err(|e| anyhow::anyhow!("address {at:?}: {e} (IP:PORT)"))?;
            print!(
                "{}",
                admin_client::post(addr, token, &format!("/nodes/{id}?addr={at}"))?
            );
        }
        NodeCmd::Remove { id, no_wait } => {
            print!(
                "{}",
                admin_client::delete(addr, token, &format!("/nodes/{id}"))?
            );
            if !no_wait {
                admin_client::follow_removal(addr, token, id)?;
            }
        }
        NodeCmd::List => print!("{}", admin_client::get(addr, token, "/nodes")?),
    }
    Ok(())
}

/// `weir cluster up|init-certs`.
fn cluster(command: ClusterCmd) -> anyhow::Result<()> {
    match command {
        ClusterCmd::Up {
            nodes,
            dir,
            pool_size,
            replicas,
            port_offset,
            nbd_tls,
        } => {
            let pool_size =
                config::parse_size(&pool_size).map_err(|e| anyhow::anyhow!("--pool-size: {e}"))?;
            let nbd_tls = match nbd_tls.as_str() {
                "off" => config::NbdTlsMode::Off,
                "on" => config::NbdTlsMode::On,
                "require" => config::NbdTlsMode::Require,
                other => anyhow::bail!("--nbd-tls {other}: off, on or require"),
            };
            let up = cluster::ClusterUp {
                nodes,
                dir,
                pool_size,
                replicas: replicas.unwrap_or(3.min(nodes as u8)),
                port_offset,
                nbd_tls,
            };
            let rt = runtime()?;
            let stop = signalled(&rt);
            rt.block_on(cluster::up(up, stop))
        }
        ClusterCmd::InitCerts {
            dir,
            nodes,
            nbd_names,
        } => {
            let made = weir_node::certs::init(&dir, &nodes)?;
            weir_node::certs::init_nbd(&dir, &nbd_names)?;
            println!(
                "{}: CA ca.pem (its key ca.key issues more; keep it safe), certificates for {:?}",
                dir.display(),
                made
            );
            println!(
                "  NBD front ends: nbd-server.pem/.key ([nbd] tls_cert, tls_key); client \
                 certificates in {}",
                dir.join("nbd-client").display()
            );
            for n in &made {
                println!(
                    "  node {n}: [tls] ca = \"{}\", cert = \"{}\", key = \"{}\"",
                    weir_node::certs::ca_file(&dir).display(),
                    weir_node::certs::member_files(&dir, *n).0.display(),
                    weir_node::certs::member_files(&dir, *n).1.display()
                );
            }
            Ok(())
        }
    }
}

/// `weir volume ...`.
fn volume(command: VolumeCmd, AdminArgs { admin, token_file }: AdminArgs) -> anyhow::Result<()> {
    let token = admin_client::read_token(&token_file);
    let token = token.as_deref();
    // A name is checked here too, before it goes into a URL.
    let check = |name: &str| {
        weir_core::control::state::check_name(name)
            .map_err(|e| anyhow::anyhow!("volume name {name:?}: {e}"))
    };
    let out = match command {
        VolumeCmd::Create {
            name,
            size,
            qos,
            encrypt,
            key_file,
        } => {
            check(&name)?;
            let key_file = match (encrypt, &key_file) {
                (false, Some(_)) => anyhow::bail!("--key-file goes with --encrypt"),
                (true, f) => f.as_deref(),
                (false, None) => None,
            };
            create_volume((&admin, token), &name, &size, &qos, key_file)?
        }
        VolumeCmd::Unlock { name, key_file } => {
            check(&name)?;
            let (hex, _) = read_key(&key_file, false)?;
            admin_client::post_body(&admin, token, &format!("/volumes/{name}/key"), &hex)?
        }
        VolumeCmd::Set { name, qos } => {
            check(&name)?;
            let query = qos.query()?;
            if query.is_empty() {
                anyhow::bail!(
                    "say what to set: --iops-limit, --bw-limit, --iops-reservation or --weight"
                );
            }
            let path = format!("/volumes/{name}?{}", &query[1..]);
            admin_client::put(&admin, token, &path)?
        }
        VolumeCmd::Resize { name, size, shrink } => {
            check(&name)?;
            let bytes = config::parse_size(&size).map_err(|e| anyhow::anyhow!("--size: {e}"))?;
            let also = if shrink { "&shrink=yes" } else { "" };
            admin_client::post(
                &admin,
                token,
                &format!("/volumes/{name}/resize?size={bytes}{also}"),
            )?
        }
        VolumeCmd::List => admin_client::get(&admin, token, "/volumes")?,
        VolumeCmd::Clone { snapshot, name } => {
            check(&name)?;
            let (vol, snap) = split_snapshot(&snapshot)?;
            let path = format!("/volumes/{name}?clone={vol}@{snap}");
            admin_client::post(&admin, token, &path)?
        }
        VolumeCmd::Rollback { snapshot } => {
            let (vol, snap) = split_snapshot(&snapshot)?;
            let path = format!("/volumes/{vol}/rollback?to={snap}");
            admin_client::post(&admin, token, &path)?
        }
        VolumeCmd::Delete { name } => {
            check(&name)?;
            admin_client::delete(&admin, token, &format!("/volumes/{name}"))?
        }
    };
    print!("{out}");
    Ok(())
}

/// `weir volume create`: a volume `name` of `size` with `qos`, encrypted
/// with the key in `key_file` (made if missing) if one is given.
fn create_volume(
    (admin, token): (&str, Option<&str>),
    name: &str,
    size: &str,
    qos: &QosArgs,
    key_file: Option<&std::path::Path>,
) -> anyhow::Result<String> {
    let bytes = config::parse_size(size).map_err(|e| anyhow::anyhow!("--size: {e}"))?;
    let mut path = format!("/volumes/{name}?size={bytes}{}", qos.query()?);
    let key = key_file.map(|f| read_key(f, true)).transpose()?;
    let Some((hex, key)) = &key else {
        return Ok(admin_client::post(admin, token, &path)?);
    };
    path += &format!("&key_check={}", weir_node::crypt::check_hex(&key.check()));
    let made = admin_client::post(admin, token, &path)?;
    let path = format!("/volumes/{name}/key");
    let unlocked = admin_client::post_body(admin, token, &path, hex).map_err(|e| {
        anyhow::anyhow!(
            "volume {name:?} was created, encrypted, but the node was not \
             given its key ({e}); weir volume unlock {name} --key-file ..."
        )
    })?;
    Ok(made + &unlocked)
}

/// `weir snapshot ...`.
fn snapshot(
    command: SnapshotCmd,
    AdminArgs { admin, token_file }: AdminArgs,
) -> anyhow::Result<()> {
    let token = admin_client::read_token(&token_file);
    let token = token.as_deref();
    let out = match command {
        SnapshotCmd::Create { volume, name } => {
            let (vol, snap) = split_snapshot(&format!("{volume}@{name}"))?;
            admin_client::post(&admin, token, &format!("/snapshots/{vol}@{snap}"))?
        }
        SnapshotCmd::List { volume } => {
            if let Some(v) = &volume {
                weir_core::control::state::check_name(v)
                    .map_err(|e| anyhow::anyhow!("volume name {v:?}: {e}"))?;
            }
            let path = format!("/snapshots?volume={}", volume.unwrap_or_default());
            admin_client::get(&admin, token, &path)?
        }
        SnapshotCmd::Delete { snapshot } => {
            let (vol, snap) = split_snapshot(&snapshot)?;
            admin_client::delete(&admin, token, &format!("/snapshots/{vol}@{snap}"))?
        }
    };
    print!("{out}");
    Ok(())
}

/// A volume key from `path` (made there first if `make` and it is missing):
/// its hex and the key.
fn read_key(
    path: &std::path::Path,
    make: bool,
) -> anyhow::Result<(String, weir_node::crypt::VolumeKey)> {
    use weir_node::crypt::{VolumeKey, KEY_BYTES};
    if !make && !path.exists() {
        anyhow::bail!("{}: no such key file", path.display());
    }
    let existed = path.exists();
    use weir_node::secret::{load_or_create_hex, Length};
    let hex = load_or_create_hex(path, (KEY_BYTES, Length::Exact), "a volume key")
        .with_context(|| format!("the key file {}", path.display()))?;
    if !existed {
        eprintln!(
            "{}: a new volume key (keep it: without it the volume cannot be read)",
            path.display()
        );
    }
    let key = VolumeKey::from_hex(&hex).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok((hex, key))
}

fn runtime() -> anyhow::Result<tokio_real::runtime::Runtime> {
    tokio_real::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// `VOL@SNAP`, both names checked before they go into a URL.
fn split_snapshot(text: &str) -> anyhow::Result<(String, String)> {
    let (vol, snap) = text
        .split_once('@')
        .ok_or_else(|| anyhow::anyhow!("{text:?}: say VOLUME@SNAPSHOT"))?;
    for n in [vol, snap] {
        weir_core::control::state::check_name(n).map_err(|e| anyhow::anyhow!("{n:?}: {e}"))?;
    }
    Ok((vol.to_string(), snap.to_string()))
}
