//! Replication: per-extent primary copy (DESIGN.md section 4.1).
//!
//! [`engine::Replicator`] is the sans-IO state machine every node runs, in all its
//! roles at once: primary for some extents, replica for others, flush coordinator.
//! [`crate::engines::range_lock::RangeLock`] orders overlapping operations at a
//! primary.

pub mod engine;
pub mod grains;
pub mod versions;

pub(crate) use engine::BUGS_BUILT;
pub use engine::{
    Action, Audit, Bugs, IoClass, IoCmd, IoId, IoResult, RebuildProgress, ReplicationConfig,
    Replicator, DEFAULT_REPLICA_TIMEOUT_NS,
};
