//! weir-transport-rdma: weir's transport over RDMA (RoCE v2, reliable-connected
//! queue pairs), in three parts (DESIGN.md section 2):
//!
//! - [`proto`]: the messenger, sans-IO. One [`proto::Conn`] per queue pair owns its
//!   credits, receive slots, granted regions and send queue, takes completions and
//!   hands back the work requests to post. It never touches a device, so the same
//!   code runs over real verbs and over the simulator's queue pairs, and its tests
//!   drive it through every interleaving they can draw.
//! - [`messenger`]: a node's connections, one [`proto::Conn`] per peer, set up,
//!   torn down and set up again by a small connection manager, sans-IO too; it
//!   speaks in images for a wire that keeps order per pair of hosts.
//! - `verbs` (not built yet): the safe wrappers over rdma-sys, the only `unsafe`
//!   code of the crate.
//! - `sim` (not built yet): the simulated fabric's RC queue pairs as a verbs
//!   provider.
//!
//! Until `verbs` and `sim` exist, nothing here carries weir's traffic: the
//! messenger is proven only by its own tests.

pub mod messenger;
pub mod proto;
#[cfg(test)]
mod testing;
