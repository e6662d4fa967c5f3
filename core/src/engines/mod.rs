//! The sans-IO engines: each the one owner of its state, driven by the node
//! ([`crate::node`]) with messages, device completions and the clock, and
//! answering with actions. No I/O, no clock, no tasks.
//!
//! [`replication`] the per-extent primary copy; [`control`] the cluster map as a
//! Raft-replicated state machine, the failure detector and leases; [`sched`]
//! each device's scheduler and the admission of client requests; [`flow`] the
//! response to the fabric's congestion signals per peer; [`placement`] which
//! devices hold each placement group (ranked straw2); [`range_lock`] the
//! lock over block ranges that replication and the scheduler both take;
//! [`store`] each device's store: which object each slot holds, on the device.

pub mod control;
pub mod flow;
pub mod placement;
pub mod range_lock;
pub mod replication;
pub mod sched;
pub mod store;
