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
    let url = format!("http://{addr}{path}");
    let mut request = agent().request(method, &url);
    if let Some(token) = token {
        request = request.set("Authorization", &format!("Bearer {token}"));
    }
    match request.call() {
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
