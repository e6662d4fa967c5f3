//! The reclaimer: freed pool extents (a volume deleted, an extent trimmed)
//! are zeroed before the pool hands them out again, so a new volume never
//! reads another's data.
//!
//! It runs on every node and works only while its node leads the Raft group,
//! one extent at a time: it writes zeroes over the whole extent through the
//! node's front end (replicated like any write), then reports it
//! ([`Command::Zeroed`], naming the reign it wrote in). Each write resolves
//! the extent afresh: once it is no longer dirty in the same reign (a
//! failover, or another reclaimer finished it and the pool handed it out),
//! the zeroing stops and nothing lands on the new owner's data (the primary
//! refuses requests of an earlier reign). A reclaimer that loses the
//! leadership mid-way leaves the extent dirty; the next leader's zeroes it
//! again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use weir_core::control::{ClusterState, Command};
use weir_core::named::NamedVolumes;
use weir_core::node::NodeHandle;
use weir_core::{Epoch, ExtentId, NodeId, Transport};

/// How often an idle reclaimer looks for dirty extents.
const IDLE_EVERY: Duration = Duration::from_millis(200);
/// How long an extent whose zeroing failed is left alone.
const REST: Duration = Duration::from_secs(5);

/// The dirty extent to zero next, if this node leads: the lowest not in
/// `resting` (its zeroing failed a moment ago), with the reign it is in.
fn next_dirty(
    me: NodeId,
    leader: Option<NodeId>,
    state: &ClusterState,
    resting: &BTreeMap<ExtentId, Instant>,
) -> Option<(ExtentId, Epoch)> {
    if leader != Some(me) {
        return None;
    }
    let now = Instant::now();
    let &extent = state
        .dirty
        .iter()
        .find(|e| resting.get(e).is_none_or(|&until| until <= now))?;
    Some((extent, state.extents.get(&extent)?.primary_since))
}

/// Zero dirty extents for as long as the node runs.
pub async fn run<T: Transport>(me: NodeId, handle: NodeHandle, named: Arc<NamedVolumes<T>>) {
    // Extents whose zeroing failed (one unavailable, say), left alone for a
    // while so the others go on; bounded by the map's dirty extents.
    let mut resting: BTreeMap<ExtentId, Instant> = BTreeMap::new();
    loop {
        let report = handle.report();
        resting.retain(|e, _| report.state.dirty.contains(e));
        let Some((extent, since)) = next_dirty(me, report.leader, &report.state, &resting) else {
            tokio_real::time::sleep(IDLE_EVERY).await;
            continue;
        };
        named.pool().offer(&report.state);
        match named.zero_freed(extent, since).await {
            Ok(()) => {
                handle.request(Command::Zeroed { extent, since });
                tracing::info!(%extent, "freed extent zeroed");
                // Wait for the report to show it (or the reign to move on).
                for _ in 0..250 {
                    let state = handle.state();
                    let same = state.dirty.contains(&extent)
                        && state.extents.get(&extent).map(|e| e.primary_since) == Some(since);
                    if !same {
                        break;
                    }
                    tokio_real::time::sleep(Duration::from_millis(20)).await;
                }
            }
            Err(e) => {
                tracing::info!(%extent, error = %e, "zeroing a freed extent stopped; it is tried again later");
                resting.insert(extent, Instant::now() + REST);
            }
        }
    }
}
