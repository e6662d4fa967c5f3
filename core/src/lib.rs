//! weir-core: the brain of weir.
//!
//! Sans-IO state machines (replication today; congestion response and I/O scheduling
//! next) plus the async [`node::Node`] driver that runs them over any [`Transport`]
//! and [`BlockDevice`]. Nothing in this crate opens a socket or a file, reads the
//! wall clock or spawns a thread: time and tasks come from `madsim-tokio`, so the
//! same code runs on real tokio and on the deterministic simulator.

pub mod buf;
pub mod client;
pub mod congestion;
pub mod control;
pub mod copies;
pub mod device;
pub mod error;
pub mod events;
pub mod flow;
pub mod front_end;
pub mod ids;
pub mod map;
pub mod named;
pub mod node;
pub mod record;
pub mod replication;
pub mod sched;
pub mod time;
pub mod transport;
pub mod wire;

pub use buf::{Buf, BufPool, RegionSource};
pub use device::{BlockDevice, DevCommand, DevCompletion, DevError, Geometry};
pub use error::WeirError;
pub use events::Event;
pub use ids::{Epoch, ExtentId, Lba, NodeId, OpId, RequestId, Version, VolumeId};
pub use map::ClusterMap;
pub use transport::{CongestionSignals, SendError, Transport, TransportError};
