//! weir-sim: seeded scenarios on the simulated fabric and SSDs.
//!
//! A [`scenario::Scenario`] describes the cluster, the fabric and a fio-like
//! workload. Under `--cfg madsim`, [`runner::run`] plays it for one seed, records a
//! [`history::History`] of every client operation, checks it with [`checker`] and
//! measures it into a [`report::Report`]. Same seed, same report, byte for byte.
//! An [`experiment::Experiment`] runs a matrix of scenarios and measures each
//! into one table, SVG plots and JSON.

pub mod checker;
pub mod experiment;
pub mod history;
pub mod invariants;
pub mod report;
#[cfg(madsim)]
pub mod runner;
pub mod scenario;
pub mod telemetry;
