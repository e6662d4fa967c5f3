//! weir-host-sim: the simulated host's CPU, which the fabric's network stacks and
//! the SSD model's drivers charge their work to.
//!
//! - [`cpu`]: a host's cores as single servers (with NUMA and polling cores):
//!   work arrives, waits for its core, runs, and the caller learns when it ended.
//! - [`profile`]: what each network stack (kernel TCP, RDMA) and each NVMe driver
//!   (the kernel's interrupt-driven one, a polled user-space one) costs per
//!   message, byte, packet and command, every constant with its published source.
//!
//! Sans-IO and runtime-free: callers pass the time in. One host is shared by its
//! NIC and its devices (`Arc<Mutex<Cpu>>`), so network and storage work compete
//! for the same cores, as they do on a storage server.

pub mod cpu;
pub mod profile;

pub use cpu::{Affinity, Cpu, HostSpec, Ran, Usage, Work};
pub use profile::{NetStack, NvmeDriver};
