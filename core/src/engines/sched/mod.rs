//! The per-device owner: every command the node gives its device passes through
//! one [`DeviceSched`], which queues, merges and splits requests ([`IoQueue`]),
//! knows what is in flight, and judges whether the device still answers. The
//! engine's device writes pass first through the node's [`WriteOrder`], which
//! keeps them in order per block.
//!
//! Sans-IO and without a runtime: inputs take `now_ns` (the node's monotonic
//! clock), and the node carries the commands out.
//!
//! Health: a device whose oldest timed command (flushes are not timed: under a
//! heavy write load a healthy device takes long to drain its cache) has been
//! outstanding past the timeout at two ticks in a row has stalled (one tick is
//! not enough: a node that was itself paused finds its commands old at its first
//! tick back); one that answered `Gone` is gone until the node restarts. A
//! device given nothing for a timeout is probed (a one-block read of its first
//! block): a node whose SSD disappeared while nothing was asked of it must
//! still find out.

use crate::buf::BufPool;
use crate::device::{DevCompletion, DevError, Geometry};
use crate::io::{IoClass, IoCmd, IoId, IoResult};
pub use admission::{
    Admission, AdmitConfig, Deltas, Submit, VolKey, VolumeAdmitStats, Who, ADMIT_DEPTH_DEFAULT,
    ADMIT_FORGET_NS, ADMIT_WAITING_MAX_DEFAULT, ADMIT_WAIT_MAX_NS, DELTAS_MAX, DELTA_MAX,
};
pub use order::{Finished, WriteOrder};
pub use queue::{
    ClassShares, CmdId, Dispatch, IoQueue, QueueFull, SchedConfig, SchedStats, Share,
    BACKGROUND_INFLIGHT_MAX, FOREGROUND_WEIGHT, MERGE_SCAN_MAX, WAITING_MAX_DEFAULT,
};
use std::collections::BTreeMap;
use std::time::Duration;

mod admission;
mod order;
mod queue;

/// What the device's health became at a tick.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// It answers within the timeout again.
    Answers,
    /// A command has been outstanding past the timeout.
    Stalled,
    /// It answered `Gone`.
    Gone,
}

/// The request id of the idle device's probe (the engine numbers its own from
/// zero up and never reaches it).
pub const PROBE_IO: IoId = IoId(u64::MAX);

/// The owner of one device's queue and health.
#[derive(Debug)]
pub struct DeviceSched {
    io: IoQueue,
    geometry: Geometry,
    timeout: Duration,
    /// Ticks in a row that found a timed command older than the timeout.
    stalled_ticks: u32,
    healthy: bool,
    gone: bool,
    /// When a request last came or a command last completed.
    active_ns: u64,
    /// Whether the probe is out.
    probing: bool,
    /// The named volume (by number) of each request in the scheduler
    /// that belongs to one.
    volume_of: BTreeMap<IoId, u64>,
    /// Merges and splits by named volume: one entry per volume that had I/O
    /// here.
    by_volume: BTreeMap<u64, VolumeSchedStats>,
}

/// The scheduler's merges and splits of one volume's requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeSchedStats {
    /// Requests that joined another's device command.
    pub merged: u64,
    /// Requests cut at the device's optimal I/O boundary.
    pub split: u64,
}

impl DeviceSched {
    /// The owner of a device of `geometry`, scheduled by `cfg`, which has
    /// stalled when a command is outstanding for `timeout`.
    pub fn new(geometry: Geometry, cfg: SchedConfig, timeout: Duration) -> Self {
        DeviceSched {
            io: IoQueue::new(geometry, cfg),
            geometry,
            timeout,
            stalled_ticks: 0,
            healthy: true,
            gone: false,
            active_ns: 0,
            probing: false,
            volume_of: BTreeMap::new(),
            by_volume: BTreeMap::new(),
        }
    }

    /// Change the scheduler's settings; only before any request.
    pub fn set_config(&mut self, cfg: SchedConfig) {
        assert!(
            self.io.inflight() == 0 && self.io.waiting() == 0,
            "the scheduler's settings change only while it is idle"
        );
        self.io = IoQueue::new(self.geometry, cfg);
    }

    /// Change the stall timeout.
    pub fn set_timeout(&mut self, timeout: Duration) {
        assert!(
            !timeout.is_zero(),
            "a device timeout of zero would stall every node"
        );
        self.timeout = timeout;
    }

    /// The stall timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Take request `io` (in device blocks) of `class` at `now_ns`; see
    /// [`IoQueue::submit_as`].
    pub fn submit(
        &mut self,
        io: IoId,
        cmd: IoCmd,
        class: IoClass,
        now_ns: u64,
    ) -> Result<(), QueueFull> {
        self.submit_for(io, cmd, (class, None), now_ns)
    }

    /// [`DeviceSched::submit`] of a request of `volume`: its merges and splits
    /// are counted for the volume too.
    pub fn submit_for(
        &mut self,
        io: IoId,
        cmd: IoCmd,
        (class, volume): (IoClass, VolKey),
        now_ns: u64,
    ) -> Result<(), QueueFull> {
        assert_ne!(
            io, PROBE_IO,
            "the engine's requests stay below the probe's id"
        );
        self.active_ns = self.active_ns.max(now_ns);
        let split_before = self.io.stats().split;
        self.io.submit_as(io, cmd, class, now_ns)?;
        if let Some(volume) = volume {
            let split = self.io.stats().split - split_before;
            self.by_volume.entry(volume).or_default().split += split;
            self.volume_of.insert(io, volume);
        }
        Ok(())
    }

    /// Merges and splits by named volume (by number).
    pub fn volume_stats(&self) -> Vec<(u64, VolumeSchedStats)> {
        self.by_volume.iter().map(|(&v, &s)| (v, s)).collect()
    }

    /// The next command for the device, if any may go now.
    pub fn poll(&mut self, now_ns: u64, pool: &BufPool) -> Option<Dispatch> {
        let d = self.io.poll(now_ns, pool)?;
        // Every request after the first joined the first's command.
        for io in d.requests.iter().skip(1) {
            if let Some(v) = self.volume_of.get(io) {
                self.by_volume.entry(*v).or_default().merged += 1;
            }
        }
        Some(d)
    }

    /// Command `cmd` completed at `now_ns` (the node's clock) with `result`.
    /// Panics if `cmd` was not issued.
    pub fn complete(&mut self, cmd: CmdId, result: Result<DevCompletion, DevError>, now_ns: u64) {
        self.active_ns = self.active_ns.max(now_ns);
        // Gone stays gone: the node serves nothing until restarted.
        self.gone |= matches!(result, Err(DevError::Gone));
        self.io.complete(cmd, result);
    }

    /// The next request finished, with its result (the probe's stays here).
    pub fn poll_finished(&mut self) -> Option<(IoId, IoResult)> {
        loop {
            let (io, result) = self.io.poll_finished()?;
            if io != PROBE_IO {
                self.volume_of.remove(&io);
                return Some((io, result));
            }
            // Only its completion mattered (`Gone`, or a stall while it is out).
            self.probing = false;
        }
    }

    /// The node's tick at `now_ns`: judge the device, and probe it if it has
    /// been given nothing for a timeout (the node then dispatches). Returns its
    /// new health if that changed.
    pub fn tick(&mut self, now_ns: u64) -> Option<Health> {
        let timeout_ns = self.timeout.as_nanos() as u64;
        let idle = self.io.inflight() == 0 && self.io.waiting() == 0;
        if idle
            && !self.probing
            && !self.gone
            && now_ns.saturating_sub(self.active_ns) >= timeout_ns
        {
            let probe = IoCmd::Read {
                lba: crate::ids::Lba(0),
                blocks: 1,
            };
            if self.io.submit(PROBE_IO, probe, now_ns).is_ok() {
                self.probing = true;
                self.active_ns = now_ns;
            }
        }
        // The device is judged by its oldest timed command; with none in
        // flight (only flushes), by the oldest request waiting behind them: a
        // device that hangs holding flushes must not hide behind the queue.
        let oldest = self
            .io
            .oldest_timed_ns()
            .or_else(|| self.io.oldest_waiting_ns());
        let stalled = oldest.is_some_and(|t| now_ns.saturating_sub(t) >= timeout_ns);
        self.stalled_ticks = if stalled { self.stalled_ticks + 1 } else { 0 };
        let healthy = self.stalled_ticks < 2 && !self.gone;
        if healthy == self.healthy {
            return None;
        }
        self.healthy = healthy;
        Some(if healthy {
            Health::Answers
        } else if self.gone {
            Health::Gone
        } else {
            Health::Stalled
        })
    }

    /// Whether the device answered in time at the last tick (and is not gone).
    pub fn healthy(&self) -> bool {
        self.healthy
    }

    /// Commands in flight.
    pub fn inflight(&self) -> usize {
        self.io.inflight()
    }

    /// Pieces of requests waiting for room on the device.
    pub fn waiting(&self) -> usize {
        self.io.waiting()
    }

    /// The scheduler's counters.
    pub fn stats(&self) -> SchedStats {
        self.io.stats()
    }

    /// Assert the invariants: the queue's, and a device judged healthy had
    /// not stalled at two ticks in a row.
    pub fn self_check(&self) {
        self.io.self_check();
        // `gone` is set between ticks and judged at the next one, so only the
        // tick's own verdict is checked.
        assert!(
            !(self.healthy && self.stalled_ticks >= 2),
            "a stalled device judged healthy"
        );
    }
}

#[cfg(test)]
mod admission_tests;
#[cfg(test)]
mod tests;
