//! `weir cluster up`: a local cluster on loopback with file-backed devices, the
//! embedded default that needs no setup.
//!
//! Each node gets `DIR/nodeN/` with its `weir.toml` (written once, kept across
//! restarts), its device file, Raft log and `weir.log`. Node `N` listens on
//! 127.0.0.1: replication 7400+N, NBD 10808+N (node 1: the standard 10809), admin
//! 9400+N (all moved up by `--port-offset`). The command stays in the foreground: it waits for the cluster to elect a
//! leader, prints where to connect, and on Ctrl-C (or SIGTERM) stops every node
//! cleanly. Starting it again on the same directory brings back the same cluster,
//! its volumes and their data. The nodes share one admin token, `DIR/admin.token`
//! (made at the first start), copied into each node's directory; `weir volume`
//! and `weir status` read it from `./weir-data/admin.token` by default. The
//! members authenticate one another by TLS under a CA of the cluster's own,
//! made at the first start in `DIR/certs` (`weir cluster init-certs`).

use anyhow::{bail, Context};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What `weir cluster up` was asked for.
#[derive(Clone, Debug)]
pub struct ClusterUp {
    /// Node count (1 to 5).
    pub nodes: u32,
    /// Where the nodes keep their data.
    pub dir: PathBuf,
    /// Size of the replicated pool, bytes.
    pub pool_size: u64,
    /// Replicas per extent.
    pub replicas: u8,
    /// Added to every port (to run several clusters on one host).
    pub port_offset: u16,
    /// NBD over TLS for the front ends (client certificates in
    /// `DIR/certs/nbd-client`).
    pub nbd_tls: crate::config::NbdTlsMode,
}

impl ClusterUp {
    /// Replication port of node `n`.
    pub fn replication_port(&self, n: u32) -> u16 {
        7400 + n as u16 + self.port_offset
    }
    /// NBD port of node `n`.
    pub fn nbd_port(&self, n: u32) -> u16 {
        10808 + n as u16 + self.port_offset
    }
    /// Admin port of node `n`.
    pub fn admin_port(&self, n: u32) -> u16 {
        9400 + n as u16 + self.port_offset
    }
}

/// The config of node `n` of a local cluster.
pub fn node_config(up: &ClusterUp, n: u32) -> String {
    let members: Vec<String> = (1..=up.nodes)
        .map(|m| {
            format!(
                "  {{ id = {m}, addr = \"127.0.0.1:{}\" }},",
                up.replication_port(m)
            )
        })
        .collect();
    format!(
        "# Node {n} of a local weir cluster (weir cluster up). Every key is documented\n\
         # in the README; the defaults are used for the rest.\n\
         [node]\nid = {n}\n\n\
         [cluster]\nreplicas = {replicas}\npool_size = {pool}\nmembers = [\n{members}\n]\n\n\
         [nbd]\nlisten = \"127.0.0.1:{nbd}\"\n{nbd_tls}\n\
         [admin]\nlisten = \"127.0.0.1:{admin}\"\n\n\
         # Member links: mutual TLS under the cluster's CA (DIR/certs).\n\
         [tls]\nca = \"../certs/ca.pem\"\ncert = \"../certs/node-{n}.pem\"\n\
         key = \"../certs/node-{n}.key\"\n",
        replicas = up.replicas,
        pool = up.pool_size,
        members = members.join("\n"),
        nbd = up.nbd_port(n),
        nbd_tls = match up.nbd_tls {
            crate::config::NbdTlsMode::Off => String::new(),
            mode => format!(
                "tls = \"{}\"\ntls_cert = \"../certs/nbd-server.pem\"\n\
                 tls_key = \"../certs/nbd-server.key\"\ntls_client_ca = \"../certs/ca.pem\"\n",
                if mode == crate::config::NbdTlsMode::On {
                    "on"
                } else {
                    "require"
                }
            ),
        },
        admin = up.admin_port(n),
    )
}

/// Start the cluster and keep it up until `stop` resolves.
pub async fn up(up: ClusterUp, stop: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
    check(&up)?;
    std::fs::create_dir_all(&up.dir).with_context(|| format!("creating {}", up.dir.display()))?;
    let exe = std::env::current_exe().context("finding the weir binary")?;
    let token_path = up.dir.join("admin.token");
    let token = crate::admin::load_or_create_token(&token_path)
        .with_context(|| format!("the admin token {}", token_path.display()))?;
    // The cluster's CA and the members' certificates, made at the first start.
    let members: Vec<u32> = (1..=up.nodes).collect();
    crate::certs::init(&up.dir.join("certs"), &members).context("the cluster's certificates")?;
    crate::certs::init_nbd(
        &up.dir.join("certs"),
        &["localhost".into(), "127.0.0.1".into()],
    )
    .context("the NBD front ends' certificates")?;
    let mut children = start_nodes(&up, &exe, &token)?;
    if let Err(e) = wait_ready(&up, &mut children).await {
        stop_all(&mut children);
        return Err(e);
    }
    print_cluster(&up, &token_path);
    watch(&mut children, stop).await;
    println!("weir: stopping the cluster");
    stop_all(&mut children);
    Ok(())
}

/// Refuse what `weir cluster up` cannot run.
fn check(up: &ClusterUp) -> anyhow::Result<()> {
    if up.nodes == 0 || up.nodes > crate::config::MAX_MEMBERS as u32 {
        bail!(
            "--nodes {}: 1 to {} nodes are supported",
            up.nodes,
            crate::config::MAX_MEMBERS
        );
    }
    if up.replicas == 0 || u32::from(up.replicas) > up.nodes {
        bail!(
            "--replicas {}: must be 1 to --nodes ({})",
            up.replicas,
            up.nodes
        );
    }
    if up.port_offset > 50_000 {
        bail!(
            "--port-offset {}: at most 50000 (ports stay below 65536)",
            up.port_offset
        );
    }
    Ok(())
}

/// Start every node of `up` (`exe` is the weir binary), each with its data
/// directory, the admin `token` and its config (written at the first start);
/// none is left running if one fails to start.
fn start_nodes(up: &ClusterUp, exe: &Path, token: &str) -> anyhow::Result<Vec<(u32, Child)>> {
    let mut children: Vec<(u32, Child)> = Vec::new();
    for n in 1..=up.nodes {
        let dir = up.dir.join(format!("node{n}"));
        std::fs::create_dir_all(&dir)?;
        write_token(&dir.join("admin.token"), token)?;
        let config = dir.join("weir.toml");
        if !config.exists() {
            std::fs::write(&config, node_config(up, n))?;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("weir.log"))?;
        let child = Command::new(exe)
            .arg("node")
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn();
        match child {
            Ok(child) => children.push((n, child)),
            Err(e) => {
                // Leave no node of a half-started cluster running.
                stop_all(&mut children);
                return Err(anyhow::Error::from(e).context(format!("starting node {n}")));
            }
        }
    }
    Ok(children)
}

/// Say where the cluster's nodes listen and how to go on.
fn print_cluster(up: &ClusterUp, token_path: &Path) {
    println!("weir: {} nodes up in {}", up.nodes, up.dir.display());
    for n in 1..=up.nodes {
        println!(
            "  node {n}: nbd://127.0.0.1:{}/VOLUME  admin http://127.0.0.1:{}  log {}",
            up.nbd_port(n),
            up.admin_port(n),
            up.dir.join(format!("node{n}/weir.log")).display()
        );
    }
    if up.nbd_tls != crate::config::NbdTlsMode::Off {
        println!(
            "NBD over TLS: client certificates in {} (qemu: --object \
             tls-creds-x509,id=tls0,endpoint=client,dir=...; libnbd: nbds://...?tls-certificates=...)",
            up.dir.join("certs/nbd-client").display()
        );
    }
    let token_flag = if up.dir == Path::new("./weir-data") {
        String::new()
    } else {
        format!(" --token-file {}", token_path.display())
    };
    println!(
        "create a volume:  weir volume create NAME --size 1G --admin 127.0.0.1:{}{token_flag}",
        up.admin_port(1)
    );
    println!(
        "Ctrl-C stops the cluster; starting it again on {} brings it back.",
        up.dir.display()
    );
}

/// Report nodes that exit until `stop`.
async fn watch(children: &mut [(u32, Child)], stop: impl std::future::Future<Output = ()>) {
    tokio_real::pin!(stop);
    let mut exited = vec![false; children.len()];
    loop {
        tokio_real::select! {
            biased;
            () = &mut stop => break,
            () = tokio_real::time::sleep(Duration::from_millis(500)) => {}
        }
        for ((n, child), seen) in children.iter_mut().zip(exited.iter_mut()) {
            if let Ok(Some(status)) = child.try_wait() {
                if !std::mem::replace(seen, true) {
                    eprintln!("weir: node {n} exited ({status}); the others go on");
                }
            }
        }
    }
}

/// Put the cluster's token where node `path`'s directory keeps its own (mode
/// 0600).
fn write_token(path: &Path, token: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    writeln!(f, "{token}")?;
    Ok(())
}

/// Wait until every node answers on its admin port and knows a Raft leader.
async fn wait_ready(up: &ClusterUp, children: &mut [(u32, Child)]) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut ready = vec![false; children.len()];
    while ready.iter().any(|r| !r) {
        if Instant::now() > deadline {
            bail!("the cluster did not come up within 60 s; see the nodes' weir.log");
        }
        for (i, (n, child)) in children.iter_mut().enumerate() {
            if let Ok(Some(status)) = child.try_wait() {
                let log = up.dir.join(format!("node{n}/weir.log"));
                bail!("node {n} exited ({status}) while starting:\n{}", tail(&log));
            }
            if !ready[i] {
                let addr = format!("127.0.0.1:{}", up.admin_port(*n));
                ready[i] = crate::admin_client::get(&addr, None, "/status")
                    .is_ok_and(|s| !s.contains("raft leader: none"));
            }
        }
        tokio_real::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// SIGTERM every node, wait for each (15 s), then kill what is left.
fn stop_all(children: &mut [(u32, Child)]) {
    for (_, child) in children.iter_mut() {
        // Only children not yet reaped: a reaped child's pid may be reused.
        if matches!(child.try_wait(), Ok(None)) {
            // SAFETY: kill(2) on a running child's pid; no memory is involved.
            unsafe {
                libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    for (n, child) in children.iter_mut() {
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    eprintln!("weir: node {n} did not stop in time; killing it");
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
    }
}
