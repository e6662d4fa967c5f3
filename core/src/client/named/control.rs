//! How a front end has its node's control plane commit a step of a request
//! (allocate, redirect, fill, trim) and waits for the map to show it: the
//! [`Control`] port, and the asking and waiting of [`NamedVolumes`].

use super::NamedVolumes;
use crate::client::{Attempts, ClientError};
use crate::control::state::{ClusterState, Command};
use crate::node::NodeHandle;
use crate::transport::Transport;
use std::sync::Arc;
use std::time::Duration;

/// How often a front end with no node to watch (the simulator's stand-in)
/// looks at the map while it waits for a command; a node's own front end is
/// woken by the node's reports instead.
const POLL: Duration = Duration::from_millis(2);
/// How often a front end asks again for a command its node's map does not
/// show yet: a proposal is lost when the Raft leader it went to fails or
/// hands over, and asking again is harmless for Allocate, Redirect and
/// Filled (the map refuses one that is done already). Not for Trim, which
/// frees whatever extent the index holds when it applies: a second Trim
/// still in flight after the first applied could free an extent written
/// since (through another node), so a Trim is asked once.
const ASK_AGAIN: Duration = Duration::from_millis(250);
/// What the front end needs of its node's control plane.
pub trait Control: Send + Sync + 'static {
    /// The latest map the node applied.
    fn state(&self) -> Arc<ClusterState>;
    /// Ask for a command (false: the node is stopping or its queue is full).
    fn request(&self, command: Command) -> bool;
    /// The node's reports as they change, to wait on for a map that shows a
    /// command applied; `None` where there is no one node to watch (the
    /// front end then looks every [`POLL`]).
    fn watch(&self) -> Option<tokio::sync::watch::Receiver<crate::node::NodeReport>> {
        None
    }
}

impl Control for NodeHandle {
    fn state(&self) -> Arc<ClusterState> {
        NodeHandle::state(self)
    }

    fn request(&self, command: Command) -> bool {
        NodeHandle::request(self, command)
    }

    fn watch(&self) -> Option<tokio::sync::watch::Receiver<crate::node::NodeReport>> {
        Some(NodeHandle::watch(self))
    }
}

impl<T: Transport> NamedVolumes<T> {
    /// Ask for `command` and wait until this node's map shows `done`, asking
    /// again every [`ASK_AGAIN`], for as long as `attempts` allow; a write
    /// needing space in a full pool fails with [`ClientError::NoSpace`].
    pub(super) async fn commit(
        &self,
        command: Command,
        done: impl Fn(&ClusterState) -> bool,
        mut attempts: Attempts,
    ) -> Result<(), ClientError> {
        let needs_space = matches!(command, Command::Allocate { .. } | Command::Redirect { .. });
        let once = matches!(command, Command::Trim { .. });
        let mut again = crate::time::now();
        // Seen before each look at the map, so a change after it wakes us.
        let mut watch = self.control.watch();
        loop {
            if let Some(w) = &mut watch {
                w.borrow_and_update();
            }
            let state = self.sync();
            if done(&state) {
                return Ok(());
            }
            let free = state.free_extents();
            if needs_space && free == 0 && state.dirty.is_empty() {
                return Err(ClientError::NoSpace(format!(
                    "the pool is full: {} extents in use",
                    state.allocated_extents()
                )));
            }
            if attempts.spent() && attempts.made() > 0 {
                return Err(if needs_space && free == 0 {
                    ClientError::NoSpace(format!(
                        "no free extent within {:?} ({} freed, being zeroed)",
                        attempts.bound(),
                        state.dirty.len()
                    ))
                } else {
                    attempts.give_up(ClientError::Unmapped(format!(
                        "the control plane did not apply {}",
                        command.kind()
                    )))
                });
            }
            // Asked at first and again every ASK_AGAIN (the proposal may
            // have been lost, or refused for want of a free extent); a Trim
            // again only if the node did not take it.
            if crate::time::now() >= again {
                again = self.ask(&command, once);
                attempts.note_attempt();
            }
            let next = again.saturating_duration_since(crate::time::now());
            match &mut watch {
                Some(w) => {
                    // Woken by the next report (a new map), or to ask again.
                    if let Ok(Err(_)) = tokio::time::timeout(next, w.changed()).await {
                        watch = None; // The node stopped: look, as without one.
                    }
                }
                None => tokio::time::sleep(POLL.min(next)).await,
            }
        }
    }

    /// Ask the control plane for `command` unless it was asked within
    /// [`ASK_AGAIN`] (by this request or another); when to ask again (never,
    /// for a command asked `once` that the node took).
    fn ask(&self, command: &Command, once: bool) -> tokio::time::Instant {
        let now = crate::time::now();
        let key = format!("{command:?}");
        let mut asked = self.asked.lock().expect("asked");
        asked.retain(|_, at| now.saturating_duration_since(*at) < ASK_AGAIN);
        if let Some(&at) = asked.get(&key) {
            return at + ASK_AGAIN;
        }
        if !self.control.request(command.clone()) {
            tracing::debug!(command = command.kind(), "the node took no command now");
            return now + ASK_AGAIN;
        }
        asked.insert(key, now);
        if once {
            // Far beyond any request's bound: not asked again.
            return now + crate::client::REQUEST_TIMEOUT_MAX * 2;
        }
        now + ASK_AGAIN
    }
}
