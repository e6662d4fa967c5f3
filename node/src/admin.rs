//! The node's admin and metrics endpoint: a few plain HTTP routes, on loopback by
//! default.
//!
//! - `GET /metrics`: Prometheus text exposition ([`crate::metrics`]).
//! - `GET /status`: the node, the cluster as this node sees it, volumes, rebuilds
//!   and recent control-plane events, as text.
//! - `GET /volumes`: one line per volume: name and size in bytes.
//! - `POST /volumes/NAME?size=SIZE`: create a volume (`SIZE` like `10G`); answers
//!   once the control plane has committed it.
//! - `POST /volumes/NAME/resize?size=SIZE`: grow a volume (at once; the new
//!   space is thin); shrinking needs `&shrink=yes`, to whole extents, on a
//!   volume without snapshots, and releases the tail. NBD clients see the new
//!   size when they connect again.
//! - `DELETE /volumes/NAME`: delete a volume.
//! - `POST /volumes/NAME/key` with the key (128 hex digits) as the body:
//!   unlock an encrypted volume on this node (the key stays in its memory;
//!   one that is not the volume's is refused). `POST /volumes/NAME?size=..
//!   &key_check=HEX` creates one: the map holds the check value, never the key.
//! - `GET /nodes`: one line per member: id, up or down, its vote, its address
//!   (for nodes that joined), the replicas it holds, and whether it is leaving.
//! - `POST /nodes/ID?addr=HOST:PORT`: add a node ([`nodes`]).
//! - `DELETE /nodes/ID`: remove a node: it starts leaving (its replicas move
//!   away, then it leaves the cluster); `GET /nodes` shows the progress.
//!
//! Errors are HTTP status codes with a one-line reason in the body.
//!
//! Authentication: a bearer token (`Authorization: Bearer TOKEN`), made at the
//! node's first start into its token file, is required for every request that
//! changes something and for every request from off loopback; one without it
//! gets 401 and no detail. `weir` reads the token from `--token-file`.

use crate::metrics::Metrics;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiny_http::{Method, Request, Response, Server};
use weir_core::control::state::{check_name, Qos};
use weir_core::control::ClusterState;
use weir_core::control::{Command, NodeStatus};
use weir_core::node::{EventLog, NodeHandle};
use weir_core::NodeId;

/// How long a volume change may take to commit before the request fails.
const COMMIT_WAIT: Duration = Duration::from_secs(10);
/// Events kept for `/status` (the node's event ring holds this many).
pub(crate) const EVENTS_KEPT: usize = 50;

/// What the endpoint serves from.
pub struct Admin {
    /// This node.
    pub me: NodeId,
    /// The running node.
    pub handle: NodeHandle,
    /// Its metrics.
    pub metrics: Arc<Metrics>,
    /// Its control-plane events (trimmed to the last [`EVENTS_KEPT`] here).
    pub events: EventLog,
    /// Bytes per extent of the pool.
    pub extent_bytes: u64,
    /// The bearer token ([`load_or_create_token`]).
    pub token: String,
    /// The front end's read window, if the congestion response is on.
    pub read_flow: Box<dyn Fn() -> Option<weir_core::flow::ReadFlowStats> + Send>,
    /// The RDMA transport's counters, with `kind = "rdma"`.
    pub rdma: Box<dyn Fn() -> Option<weir_transport_rdma::net::Counters> + Send>,
    /// The TCP transport's connections refused at set-up.
    pub tcp_refused: Box<dyn Fn() -> u64 + Send>,
    /// The encrypted volumes' keys this node was given (shared with the NBD
    /// backend).
    pub keys: crate::backend::Keys,
    /// See every primary apply a volume's latest snapshot (the front end's
    /// barrier, run to its end).
    pub barrier: Barrier,
}

/// Runs a volume's snapshot barrier to its end (the error says why not).
pub type Barrier = Box<dyn Fn(&str) -> Result<(), String> + Send>;

/// Longest request body taken (a volume key is 128 hex digits).
const BODY_MAX: u64 = 4096;

/// Bytes of randomness in a token (256 bits), written as hex.
const TOKEN_BYTES: usize = 32;

/// The admin token in `path`, made (random, mode 0600) if the file is missing.
pub fn load_or_create_token(path: &std::path::Path) -> std::io::Result<String> {
    use crate::secret::{load_or_create_hex, Length};
    load_or_create_hex(path, (TOKEN_BYTES, Length::AtLeast), "an admin token")
}

/// Whether `given` is `token`, in time that depends on the length only.
fn same(given: &[u8], token: &[u8]) -> bool {
    given.len() == token.len() && given.iter().zip(token).fold(0, |d, (a, b)| d | (a ^ b)) == 0
}

/// Whether `request` must carry the token: it changes something, or it comes
/// from off loopback.
fn needs_token(request: &Request) -> bool {
    let local = request.remote_addr().is_some_and(|a| a.ip().is_loopback());
    *request.method() != Method::Get || !local
}

/// Whether `request` carries `token` as its bearer token.
fn carries(request: &Request, token: &str) -> bool {
    request.headers().iter().any(|h| {
        h.field.equiv("Authorization")
            && h.value
                .as_str()
                .strip_prefix("Bearer ")
                .is_some_and(|t| same(t.trim().as_bytes(), token.as_bytes()))
    })
}

/// The QoS a query asks for: `iops_limit`, `bw_limit`, `iops_reservation` and
/// `weight` over `base` (0 clears a limit or reservation), checked; `size` is
/// taken (and left to the caller) only where `sized`.
fn parse_qos(query: &str, base: Qos, sized: bool) -> Result<Qos, String> {
    let mut qos = base;
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{key}: {value:?} is not a whole number\n"))
        };
        match key {
            "size" | "key_check" if sized => {}
            "iops_limit" => qos.iops_limit = number()?,
            "iops_reservation" => qos.iops_reservation = number()?,
            "bw_limit" => {
                qos.bw_limit =
                    crate::config::parse_size(value).map_err(|e| format!("bw_limit: {e}\n"))?
            }
            "weight" => {
                qos.weight = u32::try_from(number()?)
                    .map_err(|_| format!("weight: {value:?} is too large\n"))?
            }
            _ => return Err(format!("unknown setting {key:?}\n")),
        }
    }
    qos.check().map_err(|e| format!("{e}\n"))?;
    Ok(qos)
}

/// Serve on `server` until it is unblocked; one thread.
pub fn serve(server: Arc<Server>, admin: Admin) {
    for mut request in server.incoming_requests() {
        let (code, body) = admin.route(&mut request);
        let response = Response::from_string(body).with_status_code(code);
        if let Err(e) = request.respond(response) {
            tracing::debug!(error = %e, "admin reply not sent");
        }
    }
}

/// A query's `size=`: above 0 and whole 4 KiB blocks; what is wrong with
/// it, for a 400.
fn parse_size_query(query: &str) -> Result<u64, String> {
    match query
        .split('&')
        .find_map(|kv| kv.strip_prefix("size="))
        .map(crate::config::parse_size)
    {
        Some(Ok(s)) if s > 0 && s % u64::from(crate::nbd::BLOCK) == 0 => Ok(s),
        Some(Ok(_)) => Err("size must be above 0 and a multiple of 4096 bytes (4K)\n".into()),
        Some(Err(e)) => Err(format!("size: {e}\n")),
        None => Err("say the size: ?size=10G\n".into()),
    }
}

/// A volume creation's `query`: its size, QoS and key check value; what is
/// wrong with it, for a 400.
fn parse_create(query: &str) -> Result<(u64, Qos, Option<[u8; 16]>), String> {
    let size = parse_size_query(query)?;
    let qos = parse_qos(query, Qos::default(), true)?;
    // Given at most once, and then well formed: never an unencrypted
    // volume for a request that asked for an encrypted one.
    let given: Vec<&str> = query
        .split('&')
        .filter(|kv| kv.split('=').next() == Some("key_check"))
        .collect();
    let key_check = match given[..] {
        [] => None,
        [kv] => match kv
            .strip_prefix("key_check=")
            .and_then(crate::crypt::check_from_hex)
        {
            Some(check) => Some(check),
            None => return Err("key_check is 32 hex digits\n".into()),
        },
        _ => return Err("key_check is given once\n".into()),
    };
    Ok((size, qos, key_check))
}

impl Admin {
    /// One table, argued long: an arm per method and path, each a call.
    fn route(&self, request: &mut Request) -> (u16, String) {
        if needs_token(request) && !carries(request, &self.token) {
            tracing::info!(
                method = %request.method(),
                from = ?request.remote_addr(),
                "admin request refused: no or wrong token"
            );
            self.metrics.admin_refused();
            return (401, String::new());
        }
        let url = request.url().to_string();
        let (path, query) = url.split_once('?').unwrap_or((&url, ""));
        let volume_action = path
            .strip_prefix("/volumes/")
            .and_then(|r| r.split_once('/'));
        match (request.method(), path) {
            (Method::Get, "/metrics") => {
                self.metrics.set_read_window((self.read_flow)());
                self.metrics.set_rdma((self.rdma)());
                self.metrics.set_tcp_refused((self.tcp_refused)());
                (200, self.metrics.render(self.me, &self.handle.report()))
            }
            (Method::Get, "/status") => (200, self.status()),
            (Method::Get, "/volumes") => (200, self.list()),
            (Method::Get, "/snapshots") => {
                self.snapshots(query.strip_prefix("volume=").filter(|v| !v.is_empty()))
            }
            (Method::Post, p) if p.starts_with("/snapshots/") => {
                self.take_snapshot(&p["/snapshots/".len()..])
            }
            (Method::Delete, p) if p.starts_with("/snapshots/") => {
                self.delete_snapshot(&p["/snapshots/".len()..])
            }
            (Method::Post, p) if p.starts_with("/volumes/") && query.starts_with("clone=") => {
                self.clone_volume(&p["/volumes/".len()..], &query["clone=".len()..])
            }
            // POST /volumes/NAME/ACTION.
            (Method::Post, _) if volume_action.is_some_and(|(_, a)| a == "rollback") => {
                let (name, _) = volume_action.unwrap_or_default();
                self.rollback(name, query.strip_prefix("to=").unwrap_or(""))
            }
            (Method::Post, _) if volume_action.is_some_and(|(_, a)| a == "resize") => {
                let (name, _) = volume_action.unwrap_or_default();
                self.resize(name, query)
            }
            (Method::Post, p) if p.starts_with("/volumes/") => {
                let rest = &p["/volumes/".len()..];
                match rest.strip_suffix("/key") {
                    Some(name) => {
                        let mut body = zeroize::Zeroizing::new(String::new());
                        let read = std::io::Read::read_to_string(
                            &mut std::io::Read::take(request.as_reader(), BODY_MAX),
                            &mut body,
                        );
                        match read {
                            Ok(_) => self.unlock(name, &body),
                            Err(_) => (400, "the body is not text\n".into()),
                        }
                    }
                    None => self.create(rest, query),
                }
            }
            (Method::Put, p) if p.starts_with("/volumes/") => {
                self.set_qos(&p["/volumes/".len()..], query)
            }
            (Method::Delete, p) if p.starts_with("/volumes/") => {
                let name = &p["/volumes/".len()..];
                match check_name(name) {
                    Ok(()) => self.delete(name),
                    Err(e) => (400, format!("{e}\n")),
                }
            }
            (Method::Get, "/nodes") => (200, self.nodes()),
            (Method::Post, p) if p.starts_with("/nodes/") => {
                self.add_node(&p["/nodes/".len()..], query)
            }
            (Method::Delete, p) if p.starts_with("/nodes/") => {
                self.remove_node(&p["/nodes/".len()..])
            }
            _ => (404, format!("no route {} {path}\n", request.method())),
        }
    }

    fn list(&self) -> String {
        let report = self.handle.report();
        let mut keys = self.keys.lock().expect("keys");
        crate::backend::prune_keys(&mut keys, &report.state);
        let mut out = String::new();
        for (name, v) in &report.state.named {
            let allocated = v.alloc.len() as u64 * self.extent_bytes;
            let _ = write!(out, "{name} {} allocated={allocated}", v.size_bytes);
            if !v.snapshots.is_empty() {
                let _ = write!(out, " snapshots={}", v.snapshots.len());
            }
            if let Some(origin) = &v.origin {
                let _ = write!(out, " clone-of={origin}");
            }
            if v.qos.is_set() {
                let _ = write!(out, " {}", v.qos);
            }
            if v.key_check.is_some() {
                let here = if keys.contains_key(name) {
                    "unlocked here"
                } else {
                    "locked here"
                };
                let _ = write!(out, " encrypted ({here})");
            }
            out.push('\n');
        }
        out
    }

    /// Give this node an encrypted volume's key (checked against the map).
    fn unlock(&self, name: &str, key_hex: &str) -> (u16, String) {
        if let Err(e) = check_name(name) {
            return (400, format!("{e}\n"));
        }
        let state = self.handle.report().state;
        let Some(volume) = state.named.get(name) else {
            return (404, format!("no volume named {name:?}\n"));
        };
        let Some(check) = volume.key_check else {
            return (409, format!("volume {name:?} is not encrypted\n"));
        };
        let key = crate::crypt::VolumeKey::from_hex(key_hex).and_then(|k| k.verified(&check, name));
        match key {
            Ok(key) => {
                let mut keys = self.keys.lock().expect("keys");
                crate::backend::prune_keys(&mut keys, &state);
                keys.insert(name.to_string(), Arc::new(key));
                tracing::info!(volume = name, "encrypted volume unlocked");
                (200, format!("volume {name:?} unlocked on {}\n", self.me))
            }
            Err(e) => (403, format!("{e}\n")),
        }
    }

    fn create(&self, name: &str, query: &str) -> (u16, String) {
        if let Err(e) = check_name(name) {
            return (400, format!("{e}\n"));
        }
        let (size, qos, key_check) = match parse_create(query) {
            Ok(asked) => asked,
            Err(e) => return (400, e),
        };
        let extents = size.div_ceil(self.extent_bytes);
        let state = self.handle.report().state;
        if state.named.contains_key(name) {
            return (409, format!("volume {name:?} already exists\n"));
        }
        // One key, one volume: two volumes under one key would show where
        // they hold the same data at the same block.
        if let Some((other, _)) =
            key_check.and_then(|c| state.named.iter().find(|(_, v)| v.key_check == Some(c)))
        {
            return (
                409,
                format!("that key is volume {other:?}'s; give each volume a key of its own\n"),
            );
        }
        // Thin: the pool may be over-committed; a write that finds it full
        // gets ENOSPC. The table's bound is the only limit.
        if extents > weir_core::control::state::MAX_VOLUME_EXTENTS {
            return (
                400,
                format!(
                    "a volume spans at most {} extents of {} bytes\n",
                    weir_core::control::state::MAX_VOLUME_EXTENTS,
                    self.extent_bytes
                ),
            );
        }
        let command = Command::CreateNamed {
            name: name.to_string(),
            size_bytes: size,
            extents,
            qos,
            key_check,
            thin: true,
        };
        if !self.handle.request(command) {
            return (503, "the node is stopping\n".into());
        }
        match self.wait(|s| s.named.get(name).map(|v| v.size_bytes == size)) {
            Some(true) => (201, format!("volume {name:?} created, {size} bytes\n")),
            Some(false) => (409, format!("volume {name:?} already exists\n")),
            None => (
                504,
                format!("volume {name:?} not committed within {COMMIT_WAIT:?} (is a Raft majority up?)\n"),
            ),
        }
    }

    /// Grow a volume, or shrink it when the query says `shrink=yes`.
    fn resize(&self, name: &str, query: &str) -> (u16, String) {
        if let Err(e) = check_name(name) {
            return (400, format!("{e}\n"));
        }
        let size = match parse_size_query(query) {
            Ok(s) => s,
            Err(e) => return (400, e),
        };
        let shrink = query.split('&').any(|kv| kv == "shrink=yes");
        let Some(v) = self.handle.report().state.named.get(name).cloned() else {
            return (404, format!("no volume named {name:?}\n"));
        };
        let extents = size.div_ceil(self.extent_bytes);
        if extents > weir_core::control::state::MAX_VOLUME_EXTENTS {
            return (
                400,
                format!(
                    "a volume spans at most {} extents\n",
                    weir_core::control::state::MAX_VOLUME_EXTENTS
                ),
            );
        }
        if size == v.size_bytes {
            return (200, format!("volume {name:?} is {size} bytes already\n"));
        }
        if size < v.size_bytes {
            if !shrink {
                return (
                    409,
                    format!(
                        "volume {name:?} is {} bytes: shrinking to {size} drops its data past \
                         there; say shrink=yes (weir volume resize --shrink) to do it\n",
                        v.size_bytes
                    ),
                );
            }
            if !v.snapshots.is_empty() {
                return (
                    409,
                    format!("volume {name:?} has snapshots: delete them to shrink it\n"),
                );
            }
            if !size.is_multiple_of(self.extent_bytes) {
                return (
                    400,
                    format!(
                        "a volume shrinks to whole extents only ({} bytes each)\n",
                        self.extent_bytes
                    ),
                );
            }
        }
        let command = Command::Resize {
            name: name.to_string(),
            size_bytes: size,
            extents,
            extent_bytes: self.extent_bytes,
        };
        if !self.handle.request(command) {
            return (503, "the node is stopping\n".into());
        }
        let done = |s: &ClusterState| match s.named.get(name) {
            Some(v) => (v.size_bytes == size).then_some(true),
            None => Some(false),
        };
        match self.wait(done) {
            Some(true) => (
                200,
                format!("volume {name:?} is now {size} bytes (NBD clients see it when they connect again)\n"),
            ),
            Some(false) => (404, format!("volume {name:?} was deleted meanwhile\n")),
            None => (
                504,
                format!(
                    "resize of {name:?} not committed within {COMMIT_WAIT:?}: no Raft majority, or \
                     refused (the map full, a snapshot taken meanwhile: see the nodes' logs)\n"
                ),
            ),
        }
    }

    /// Change a volume's QoS: the settings the query names; the rest stay.
    fn set_qos(&self, name: &str, query: &str) -> (u16, String) {
        if let Err(e) = check_name(name) {
            return (400, format!("{e}\n"));
        }
        let Some(current) = self.handle.report().state.named.get(name).map(|v| v.qos) else {
            return (404, format!("no volume named {name:?}\n"));
        };
        let qos = match parse_qos(query, current, false) {
            Ok(q) => q,
            Err(e) => return (400, e),
        };
        let command = Command::SetQos {
            name: name.to_string(),
            qos,
        };
        if !self.handle.request(command) {
            return (503, "the node is stopping\n".into());
        }
        // Done when the map holds the new setting (or the volume is gone).
        match self.wait(|s| match s.named.get(name) {
            Some(v) => (v.qos == qos).then_some(true),
            None => Some(false),
        }) {
            Some(true) => (200, format!("volume {name:?}: {qos}\n")),
            Some(false) => (404, format!("volume {name:?} was deleted meanwhile\n")),
            None => (
                504,
                format!("QoS of {name:?} not committed within {COMMIT_WAIT:?}\n"),
            ),
        }
    }

    fn delete(&self, name: &str) -> (u16, String) {
        if !self.handle.report().state.named.contains_key(name) {
            return (404, format!("no volume named {name:?}\n"));
        }
        let command = Command::DeleteNamed {
            name: name.to_string(),
        };
        if !self.handle.request(command) {
            return (503, "the node is stopping\n".into());
        }
        match self.wait(|s| (!s.named.contains_key(name)).then_some(true)) {
            Some(_) => (200, format!("volume {name:?} deleted\n")),
            None => (
                504,
                format!("deletion of {name:?} not committed within {COMMIT_WAIT:?}\n"),
            ),
        }
    }

    /// Poll the node's map until `done` says something, or time out.
    fn wait<R>(&self, done: impl Fn(&ClusterState) -> Option<R>) -> Option<R> {
        let deadline = Instant::now() + COMMIT_WAIT;
        while Instant::now() < deadline {
            if let Some(r) = done(&self.handle.report().state) {
                return Some(r);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn status(&self) -> String {
        let report = self.handle.report();
        let state = &report.state;
        let mut out = String::new();
        let _ = writeln!(out, "node {}", self.me);
        let leader = report.leader.map_or("none".to_string(), |l| l.to_string());
        let _ = writeln!(out, "raft leader: {leader}");
        let _ = writeln!(
            out,
            "device: {}, {} commands in flight",
            if report.device_healthy {
                "healthy"
            } else {
                "STALLED"
            },
            report.device_inflight
        );
        let nodes: Vec<String> = state
            .nodes
            .iter()
            .map(|(n, s)| format!("{n} {}", if *s == NodeStatus::Up { "up" } else { "DOWN" }))
            .collect();
        let _ = writeln!(out, "members: {}", nodes.join(", "));
        let total = state.extents.len();
        let full = state
            .extents
            .values()
            .filter(|e| e.in_sync.len() == e.replicas.len())
            .count();
        let _ = writeln!(
            out,
            "extents: {total} ({} bytes each); {full} with every replica in sync, {} degraded",
            self.extent_bytes,
            total - full
        );
        let (allocated, dirty) = (state.allocated_extents(), state.dirty.len() as u64);
        let eb = self.extent_bytes;
        let _ = writeln!(
            out,
            "pool: {} of {} bytes allocated to volumes, {} free, {} freed and being zeroed",
            allocated * eb,
            total as u64 * eb,
            state.free_extents() * eb,
            dirty * eb
        );
        let _ = writeln!(out, "volumes: {}", state.named.len());
        for (name, v) in &state.named {
            let _ = writeln!(
                out,
                "  {name}: {} bytes, {} allocated",
                v.size_bytes,
                v.alloc.len() as u64 * eb
            );
        }
        for r in &report.rebuilds {
            let _ = writeln!(
                out,
                "rebuild {} -> {}: {} of {} bytes ({} sent, the rest already there)",
                r.extent, r.node, r.bytes_done, r.bytes_total, r.bytes_sent
            );
        }
        self.recent_events(&mut out);
        out
    }

    /// The node's recent events, for the status page.
    fn recent_events(&self, out: &mut String) {
        let events = self.events.lock().expect("event log");
        if !events.is_empty() {
            let _ = writeln!(out, "recent events (seconds since start):");
            let skip = events.len().saturating_sub(EVENTS_KEPT);
            for (at, line) in events.iter().skip(skip) {
                let _ = writeln!(out, "  {:10.3} {line}", *at as f64 / 1e9);
            }
        }
    }
}

mod nodes;
mod snapshots;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_token_is_made_once_private_and_read_back_and_a_bad_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("weir-token-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("admin.token");
        let token = load_or_create_token(&path).unwrap();
        assert_eq!(token.len(), 2 * TOKEN_BYTES);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load_or_create_token(&path).unwrap(), token, "kept");
        let other = dir.join("other.token");
        assert_ne!(load_or_create_token(&other).unwrap(), token, "random");
        std::fs::write(&path, "short\n").unwrap();
        let e = load_or_create_token(&path).unwrap_err().to_string();
        assert!(e.contains("not an admin token"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"abcd", b"abcd"));
        assert!(!same(b"abce", b"abcd"));
        assert!(!same(b"abc", b"abcd"));
        assert!(!same(b"", b"abcd"));
    }
}
