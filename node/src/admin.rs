//! The node's admin and metrics endpoint: a few plain HTTP routes, on loopback by
//! default.
//!
//! - `GET /metrics`: Prometheus text exposition ([`crate::metrics`]).
//! - `GET /status`: the node, the cluster as this node sees it, volumes, rebuilds
//!   and recent control-plane events, as text.
//! - `GET /volumes`: one line per volume: name and size in bytes.
//! - `POST /volumes/NAME?size=SIZE`: create a volume (`SIZE` like `10G`); answers
//!   once the control plane has committed it.
//! - `DELETE /volumes/NAME`: delete a volume.
//!
//! Errors are HTTP status codes with a one-line reason in the body.

use crate::metrics::Metrics;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiny_http::{Method, Request, Response, Server};
use weir_core::control::state::{check_name, NamedVolume};
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
}

/// Serve on `server` until it is unblocked; one thread.
pub fn serve(server: Arc<Server>, admin: Admin) {
    for request in server.incoming_requests() {
        let (code, body) = admin.route(&request);
        let response = Response::from_string(body).with_status_code(code);
        if let Err(e) = request.respond(response) {
            tracing::debug!(error = %e, "admin reply not sent");
        }
    }
}

impl Admin {
    fn route(&self, request: &Request) -> (u16, String) {
        let url = request.url().to_string();
        let (path, query) = url.split_once('?').unwrap_or((&url, ""));
        match (request.method(), path) {
            (Method::Get, "/metrics") => (200, self.metrics.render(self.me, &self.handle.report())),
            (Method::Get, "/status") => (200, self.status()),
            (Method::Get, "/volumes") => (200, self.list()),
            (Method::Post, p) if p.starts_with("/volumes/") => {
                self.create(&p["/volumes/".len()..], query)
            }
            (Method::Delete, p) if p.starts_with("/volumes/") => {
                let name = &p["/volumes/".len()..];
                match check_name(name) {
                    Ok(()) => self.delete(name),
                    Err(e) => (400, format!("{e}\n")),
                }
            }
            _ => (404, format!("no route {} {path}\n", request.method())),
        }
    }

    fn list(&self) -> String {
        let report = self.handle.report();
        let mut out = String::new();
        for (name, v) in &report.state.named {
            let _ = writeln!(out, "{name} {}", v.size_bytes);
        }
        out
    }

    fn create(&self, name: &str, query: &str) -> (u16, String) {
        if let Err(e) = check_name(name) {
            return (400, format!("{e}\n"));
        }
        let size = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("size="))
            .map(crate::config::parse_size);
        let size = match size {
            Some(Ok(s)) if s > 0 && s % u64::from(crate::nbd::BLOCK) == 0 => s,
            Some(Ok(_)) => {
                return (
                    400,
                    "size must be above 0 and a multiple of 4096 bytes (4K)\n".into(),
                )
            }
            Some(Err(e)) => return (400, format!("size: {e}\n")),
            None => return (400, "say the size: ?size=10G\n".into()),
        };
        let extents = size.div_ceil(self.extent_bytes);
        let state = self.handle.report().state;
        if state.named.contains_key(name) {
            return (409, format!("volume {name:?} already exists\n"));
        }
        let free = state.free_extents();
        if extents > free {
            return (
                507,
                format!(
                    "the pool has room for {} bytes more, the volume needs {}\n",
                    free * self.extent_bytes,
                    extents * self.extent_bytes
                ),
            );
        }
        let command = Command::CreateNamed {
            name: name.to_string(),
            size_bytes: size,
            extents,
        };
        if !self.handle.request(command) {
            return (503, "the node is stopping\n".into());
        }
        match self.wait(|named| named.get(name).map(|v| v.size_bytes == size)) {
            Some(true) => (201, format!("volume {name:?} created, {size} bytes\n")),
            Some(false) => (409, format!("volume {name:?} already exists\n")),
            None => (
                504,
                format!("volume {name:?} not committed within {COMMIT_WAIT:?} (is a Raft majority up?)\n"),
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
        match self.wait(|named| (!named.contains_key(name)).then_some(true)) {
            Some(_) => (200, format!("volume {name:?} deleted\n")),
            None => (
                504,
                format!("deletion of {name:?} not committed within {COMMIT_WAIT:?}\n"),
            ),
        }
    }

    /// Poll the node's map until `done` says something, or time out.
    fn wait<R>(
        &self,
        done: impl Fn(&std::collections::BTreeMap<String, NamedVolume>) -> Option<R>,
    ) -> Option<R> {
        let deadline = Instant::now() + COMMIT_WAIT;
        while Instant::now() < deadline {
            if let Some(r) = done(&self.handle.report().state.named) {
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
        let _ = writeln!(
            out,
            "pool: {} of {total} extents given to volumes",
            state.next_free_extent
        );
        let _ = writeln!(out, "volumes: {}", state.named.len());
        for (name, v) in &state.named {
            let _ = writeln!(out, "  {name}: {} bytes", v.size_bytes);
        }
        for r in &report.rebuilds {
            let _ = writeln!(
                out,
                "rebuild {} -> {}: {} of {} bytes ({} sent, the rest already there)",
                r.extent, r.node, r.bytes_done, r.bytes_total, r.bytes_sent
            );
        }
        let events = self.events.lock().expect("event log");
        if !events.is_empty() {
            let _ = writeln!(out, "recent events (seconds since start):");
            let skip = events.len().saturating_sub(EVENTS_KEPT);
            for (at, line) in events.iter().skip(skip) {
                let _ = writeln!(out, "  {:10.3} {line}", *at as f64 / 1e9);
            }
        }
        out
    }
}
