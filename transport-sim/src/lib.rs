//! weir-transport-sim: the simulated data-center fabric.
//!
//! [`fabric`] is the packet-level RoCE v2 model (PFC, ECN, DCQCN, go-back-N), sans-IO
//! and runtime-free. Under `--cfg madsim`, [`sim::Fabric`] runs it as a madsim
//! `Simulator` plugin, one driver task advancing its event queue, and
//! [`sim::SimTransport`] implements weir-core's `Transport` on it.
//! [`congestion`] is the NICs' and hosts' congestion response (DCQCN, and TCP's
//! Reno, DCTCP and Cubic) that the fabric runs per queue pair or connection.

pub mod congestion;
pub mod fabric;
#[cfg(madsim)]
pub mod sim;

pub use fabric::config::FabricConfig;
pub use fabric::telemetry::{Counters, PortStats};
#[cfg(madsim)]
pub use sim::{Fabric, SimTransport};
