//! The control plane (DESIGN.md section 4.1): the cluster map as a replicated state
//! machine. [`state`] is the deterministic state machine; the Raft group that
//! replicates its commands, the failure detector and the lease logic build on it.

pub mod plane;
pub mod qos;
pub mod raft;
pub mod state;

pub use plane::{ControlPlane, PlaneAction, Timeouts, DEFAULT_LEASE_NS};
pub use raft::{MapRaft, RaftAction, RaftError};
pub use state::{ClusterState, Command, NodeStatus, Refusal};
