//! The command line's side of the admin endpoint ([`crate::admin`]).

use std::time::Duration;

/// Why an admin call failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// No node answered at the address.
    #[error("no weir node answers at {addr} ({reason}); is the cluster up? (weir cluster up)")]
    Unreachable {
        /// The admin address.
        addr: String,
        /// The connection error.
        reason: String,
    },
    /// The node refused the request; its reason.
    #[error("{0}")]
    Refused(String),
    /// The node wants its admin token, and none or a wrong one was sent.
    #[error(
        "the node at {addr} refused the request: it needs its admin token \
         (--token-file or WEIR_ADMIN_TOKEN_FILE; a local cluster's is DIR/admin.token, \
         ./weir-data/admin.token by default; a node's is data_dir/admin.token)"
    )]
    Unauthorized {
        /// The admin address.
        addr: String,
    },
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(2))
        .timeout(Duration::from_secs(30))
        .build()
}

/// The token in `path`, if the file is there.
pub fn read_token(path: &std::path::Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

fn call(method: &str, addr: &str, token: Option<&str>, path: &str) -> Result<String, AdminError> {
    call_with(method, addr, token, path, None)
}

fn call_with(
    method: &str,
    addr: &str,
    token: Option<&str>,
    path: &str,
    body: Option<&str>,
) -> Result<String, AdminError> {
    let url = format!("http://{addr}{path}");
    let mut request = agent().request(method, &url);
    if let Some(token) = token {
        request = request.set("Authorization", &format!("Bearer {token}"));
    }
    let sent = match body {
        Some(body) => request.send_string(body),
        None => request.call(),
    };
    match sent {
        Ok(r) => Ok(r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(401, _)) => Err(AdminError::Unauthorized {
            addr: addr.to_string(),
        }),
        Err(ureq::Error::Status(_, r)) => Err(AdminError::Refused(
            r.into_string().unwrap_or_default().trim().to_string(),
        )),
        Err(e) => Err(AdminError::Unreachable {
            addr: addr.to_string(),
            reason: e.to_string(),
        }),
    }
}

/// GET `path` from the node at `addr` (with `token`, which a node wants when
/// the request is not from loopback).
pub fn get(addr: &str, token: Option<&str>, path: &str) -> Result<String, AdminError> {
    call("GET", addr, token, path)
}

/// POST to `path` at `addr`.
pub fn post(addr: &str, token: Option<&str>, path: &str) -> Result<String, AdminError> {
    call("POST", addr, token, path)
}

/// POST `body` to `path` at `addr` (a secret goes in a body, never a URL).
pub fn post_body(
    addr: &str,
    token: Option<&str>,
    path: &str,
    body: &str,
) -> Result<String, AdminError> {
    call_with("POST", addr, token, path, Some(body))
}

/// PUT to `path` at `addr`.
pub fn put(addr: &str, token: Option<&str>, path: &str) -> Result<String, AdminError> {
    call("PUT", addr, token, path)
}

/// DELETE `path` at `addr`.
pub fn delete(addr: &str, token: Option<&str>, path: &str) -> Result<String, AdminError> {
    call("DELETE", addr, token, path)
}

/// The value of sample `name` (with its labels, as `/metrics` prints them) at
/// the node at `addr`; `None` if it exports no such sample.
pub fn metric(addr: &str, name: &str) -> Result<Option<u64>, AdminError> {
    let text = get(addr, None, "/metrics")?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok()))
}

/// Follow node `id`'s removal at the node at `addr`: print its replicas left
/// whenever that changes, until it has left the cluster. (Ctrl-C stops the
/// watching, not the removal.)
pub fn follow_removal(addr: &str, token: Option<&str>, id: u32) -> Result<(), AdminError> {
    let me = format!("n{id} ");
    // The node leaving never hears that it has left (the group stops
    // sending to it): asked itself, it is followed until it holds nothing.
    let asked_itself = get(addr, token, "/status")?
        .lines()
        .next()
        .is_some_and(|l| l.trim() == format!("node n{id}"));
    let mut last = String::new();
    loop {
        let list = get(addr, token, "/nodes")?;
        let Some(line) = list.lines().find(|l| l.starts_with(&me)) else {
            println!("n{id} left the cluster");
            return Ok(());
        };
        if asked_itself && line.contains(" replicas=0 moving=0") {
            println!(
                "n{id} holds no replicas and leaves the cluster next; it will not hear \
                 that it has left: ask another node (weir node list --admin ...)"
            );
            return Ok(());
        }
        let progress: String = line
            .split(' ')
            .filter(|w| w.starts_with("replicas=") || w.starts_with("moving="))
            .collect::<Vec<_>>()
            .join(" ");
        if progress != last {
            println!("n{id}: {progress}");
            last = progress;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
