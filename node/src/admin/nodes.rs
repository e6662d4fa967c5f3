//! The admin routes of membership: list the members, add a node, remove one.
//!
//! Adding a node puts it in the map (down, holding nothing) with its
//! replication address, which every member then dials; the node itself is
//! started with a configuration naming the cluster's first members and its own
//! address (`[node] addr`), and a certificate of the cluster's CA. Removing a
//! node marks it leaving: the leader moves its replicas to other nodes (each
//! new copy rebuilds before the old one goes), hands its vote to another node,
//! and takes it out of the cluster once it holds nothing.

use super::{Admin, COMMIT_WAIT};
use std::fmt::Write as _;
use weir_core::control::state::MAX_ADDR_BYTES;
use weir_core::control::{Command, NodeStatus};
use weir_core::NodeId;

/// A node id from a path segment.
fn node_id(text: &str) -> Result<NodeId, (u16, String)> {
    let id = text.strip_prefix('n').unwrap_or(text);
    match id.parse::<u32>() {
        Ok(n) if n > 0 && n < crate::CLIENT_ID_BASE => Ok(NodeId(n)),
        _ => Err((
            400,
            format!(
                "{text:?} is no node id (1 to {})\n",
                crate::CLIENT_ID_BASE - 1
            ),
        )),
    }
}

impl Admin {
    /// One line per member: `ID up|down voter|learner|- [addr=ADDR]
    /// replicas=N moving=M [leaving]`.
    pub(super) fn nodes(&self) -> String {
        let state = self.handle.report().state;
        let mut out = String::new();
        for (node, status) in &state.nodes {
            let status = if *status == NodeStatus::Up {
                "up"
            } else {
                "down"
            };
            let vote = if state.voters.contains(node) {
                "voter"
            } else if state.learners.contains(node) {
                "learner"
            } else {
                "joining"
            };
            let (held, moving) = state.replicas_on(*node);
            let _ = write!(out, "{node} {status} {vote}");
            if let Some(addr) = state.addrs.get(node) {
                let _ = write!(out, " addr={addr}");
            }
            let _ = write!(out, " replicas={held} moving={moving}");
            if state.leaving.contains(node) {
                let _ = write!(out, " leaving");
            }
            out.push('\n');
        }
        out
    }

    /// `POST /nodes/ID?addr=HOST:PORT`.
    pub(super) fn add_node(&self, id: &str, query: &str) -> (u16, String) {
        let node = match node_id(id) {
            Ok(n) => n,
            Err(e) => return e,
        };
        let Some(addr) = query.split('&').find_map(|kv| kv.strip_prefix("addr=")) else {
            return (400, "say its replication address: ?addr=HOST:PORT\n".into());
        };
        if addr.len() > MAX_ADDR_BYTES || addr.parse::<std::net::SocketAddr>().is_err() {
            return (400, format!("{addr:?} is no IP:PORT address\n"));
        }
        if self.handle.report().state.nodes.contains_key(&node) {
            return (409, format!("{node} is already a member\n"));
        }
        let command = Command::JoinNode {
            node,
            addr: addr.to_string(),
        };
        if !self.handle.request(command) {
            return (503, "the node is stopping\n".into());
        }
        match self.wait(|s| s.nodes.contains_key(&node).then_some(())) {
            Some(()) => (
                201,
                format!("{node} added at {addr}; it takes replicas as they move to it\n"),
            ),
            None => (
                504,
                format!("{node} not committed within {COMMIT_WAIT:?} (is a Raft majority up?)\n"),
            ),
        }
    }

    /// `DELETE /nodes/ID`: answers once the node is leaving.
    pub(super) fn remove_node(&self, id: &str) -> (u16, String) {
        let node = match node_id(id) {
            Ok(n) => n,
            Err(e) => return e,
        };
        let state = self.handle.report().state;
        if let Err(refusal) = state.check_remove(node) {
            let code = match refusal {
                weir_core::control::Refusal::UnknownNode(_) => 404,
                _ => 409,
            };
            return (code, format!("{refusal}\n"));
        }
        if !self.handle.request(Command::RemoveNode { node }) {
            return (503, "the node is stopping\n".into());
        }
        let leaving = |s: &weir_core::control::ClusterState| {
            (s.leaving.contains(&node) || !s.nodes.contains_key(&node)).then_some(())
        };
        match self.wait(leaving) {
            Some(()) => {
                let (held, _) = self.handle.report().state.replicas_on(node);
                (
                    202,
                    format!("{node} is leaving: {held} replicas to move, then it leaves\n"),
                )
            }
            None => (
                504,
                format!("removal of {node} not committed within {COMMIT_WAIT:?}\n"),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_checked() {
        assert_eq!(node_id("3").unwrap(), NodeId(3));
        assert_eq!(node_id("n12").unwrap(), NodeId(12));
        for bad in ["0", "x", "", "-1", "99999999999"] {
            assert_eq!(node_id(bad).unwrap_err().0, 400, "{bad}");
        }
    }
}
