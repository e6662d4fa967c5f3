//! weir-core: the brain of weir.
//!
//! Sans-IO state machines (replication, the control plane, device scheduling,
//! flow control) plus the async [`node::Node`] driver that runs them over any
//! [`Transport`] and [`BlockDevice`], and the client side. Nothing in this crate
//! opens a socket or a file, reads the wall clock or spawns a thread: time and
//! tasks come from `madsim-tokio`, so the same code runs on real tokio and on the
//! deterministic simulator.
//!
//! The folders are the layers (docs/architecture.md), each using only those
//! above it:
//!
//! - [`vocab`]: the shared vocabulary: ids, the wire, buffers, the I/O types,
//!   errors, events, time, the map as the data path reads it, and the two seams
//!   (`Transport`, `BlockDevice`).
//! - [`engines`]: the sans-IO owners: replication, the control plane, the
//!   device scheduler, flow control, and the range lock two of them share.
//! - [`node`] (`node.rs` and `node/`): the async driver, and the node's assembly.
//! - [`client`] (`client.rs` and `client/`): the client side: the pool's
//!   `Volume`, named volumes over it, and a node's own front end.
//!
//! Each module is also reachable at the crate's root (`weir_core::wire`,
//! `weir_core::replication`), as before the layers had folders.

pub mod client;
pub mod engines;
pub mod node;
pub mod vocab;

pub use client::{front_end, named, splice};
pub use engines::{control, flow, placement, replication, sched, store};
pub use vocab::{buf, copies, device, error, events, ids, io, map, record, time, transport, wire};

pub use buf::{Buf, BufPool, RegionSource};
pub use device::{BlockDevice, DevCommand, DevCompletion, DevError, Geometry};
pub use error::WeirError;
pub use events::Event;
pub use ids::{Epoch, ExtentId, Lba, NodeId, OpId, RequestId, Version, VolumeId};
pub use map::ClusterMap;
pub use transport::{CongestionSignals, SendError, Transport, TransportError};
