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
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(2))
        .timeout(Duration::from_secs(30))
        .build()
}

fn call(method: &str, addr: &str, path: &str) -> Result<String, AdminError> {
    let url = format!("http://{addr}{path}");
    match agent().request(method, &url).call() {
        Ok(r) => Ok(r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(_, r)) => Err(AdminError::Refused(
            r.into_string().unwrap_or_default().trim().to_string(),
        )),
        Err(e) => Err(AdminError::Unreachable {
            addr: addr.to_string(),
            reason: e.to_string(),
        }),
    }
}

/// GET `path` from the node at `addr`.
pub fn get(addr: &str, path: &str) -> Result<String, AdminError> {
    call("GET", addr, path)
}

/// POST to `path` at `addr`.
pub fn post(addr: &str, path: &str) -> Result<String, AdminError> {
    call("POST", addr, path)
}

/// DELETE `path` at `addr`.
pub fn delete(addr: &str, path: &str) -> Result<String, AdminError> {
    call("DELETE", addr, path)
}

/// The value of sample `name` (with its labels, as `/metrics` prints them) at
/// the node at `addr`; `None` if it exports no such sample.
pub fn metric(addr: &str, name: &str) -> Result<Option<u64>, AdminError> {
    let text = get(addr, "/metrics")?;
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok()))
}
