//! weir-transport-rdma: weir's transport over RDMA (RoCE v2, reliable-connected
//! queue pairs), in four parts (DESIGN.md section 2):
//!
//! - [`proto`]: the messenger, sans-IO. One [`proto::Conn`] per queue pair owns its
//!   credits, receive slots, granted regions and send queue, takes completions and
//!   hands back the work requests to post. It never touches a device, so the same
//!   code runs over real verbs and over the simulator's queue pairs, and its tests
//!   drive it through every interleaving they can draw.
//! - [`messenger`]: a node's connections, one [`proto::Conn`] per peer on one of
//!   the host's paths (NIC ports), set up, torn down, moved to the other path and
//!   set up again by a small connection manager, sans-IO too; it speaks in images
//!   for a wire that keeps order per pair of hosts and path. The simulator's
//!   fabric (weir-transport-sim) carries those images on its RC queue pairs.
//! - `verbs` (feature `verbs`): safe wrappers over rdma-core through rdma-sys,
//!   the crate's `unsafe` code with the NIC trait's posts: devices, protection
//!   domains, memory regions, completion queues with their channel, and RC
//!   queue pairs whose states are types.
//! - [`net`]: the daemon's transport, weir-core's `Transport` over verbs: one
//!   driver task runs a [`proto::Conn`] per queue pair, set up over a TCP
//!   side channel; its NIC is a trait, over real verbs or an in-process
//!   loopback on which its tests (and the daemon's) run.

// The daemon's transport needs real sockets and the real tokio; the
// simulator's build carries the messenger only.
#[cfg(not(madsim))]
extern crate tokio_real as tokio;

pub mod messenger;
#[cfg(not(madsim))]
pub mod net;
pub mod proto;
#[cfg(test)]
mod testing;
#[cfg(feature = "verbs")]
pub mod verbs;
