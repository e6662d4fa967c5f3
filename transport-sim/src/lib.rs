//! weir-transport-sim: the simulated data-center fabric.
//!
//! [`engine`] is the packet-level model, sans-IO and runtime-free. Under
//! `--cfg madsim`, [`sim::Fabric`] runs it as a madsim `Simulator` plugin, one driver
//! task advancing its event queue, and [`sim::SimTransport`] implements weir-core's
//! `Transport` on it.

pub mod engine;
#[cfg(madsim)]
pub mod sim;

pub use engine::{FabricConfig, PortStats};
#[cfg(madsim)]
pub use sim::{Fabric, SimTransport};
