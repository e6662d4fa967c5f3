//! weir-transport-rdma: weir's transport over RDMA (RoCE v2, reliable-connected
//! queue pairs), in three parts (DESIGN.md section 2):
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
//!   fabric (weir-transport-sim) carries those images on its RC queue pairs:
//!   that is where the messenger carries weir's traffic today.
//! - `verbs` (feature `verbs`): safe wrappers over rdma-core through rdma-sys,
//!   the only `unsafe` code of the crate: devices, protection domains, memory
//!   regions, completion queues with their channel, and RC queue pairs whose
//!   states are types.
//!
//! Not built yet: the daemon's transport that runs the messenger over `verbs`
//! (connection set-up over librdmacm, completions by hybrid polling). Until it
//! is, `weir node` with `kind = "rdma"` checks for a device and stops.

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
