//! weir's daemon: one storage node over TCP (weir-transport-tcp) and io_uring
//! (weir-nvme-uring), with the control plane, an NBD front end, and an admin and
//! metrics endpoint; plus the local cluster that `weir cluster up` starts.
//!
//! The data path and the control plane are weir-core's `Node` driver, exactly as
//! the simulator runs them; this crate only wires real adapters around it
//! (DESIGN.md section 6).

pub mod admin;
pub mod admin_client;
pub mod backend;
pub mod certs;
pub mod cluster;
pub mod config;
pub mod crypt;
pub mod daemon;
pub mod device;
pub mod logfile;
pub mod metrics;
pub mod nbd;
pub mod net;
pub mod rdma;
pub mod reclaim;
pub mod secret;
pub mod splice;

/// Node ids from here up are the NBD front ends' client endpoints (node `n`'s is
/// `CLIENT_ID_BASE + n`, [`weir_core::front_end::front_end_of`]); members are below.
pub const CLIENT_ID_BASE: u32 = weir_core::front_end::FRONT_END_ID_BASE;
