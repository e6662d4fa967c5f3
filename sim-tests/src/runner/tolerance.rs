//! Whether a fault plan stays within what the cluster tolerates, so that no
//! client may see an error: the availability checker's premise.
//!
//! weir promises that a request waits, rather than fails, through any fault a
//! retry can outlive, within the client's request bound. It can keep that
//! promise while the control plane can act (a Raft majority of the voters is
//! up, to move primaries and hand out leases) and every extent keeps an
//! in-sync replica on a working node. The campaign's node faults strike fewer
//! distinct nodes than there are replicas (the scenario refuses more), so the
//! second holds while the first does, and the judgement is over the voters:
//! at no instant may a majority of them be out. A node is out while it is
//! crashed (for good, from the crash), down before its restart, paused or
//! cut off; a removed node counts as out from its removal (its vote moves to
//! another node, which may be one of the faulty ones). Device faults, link
//! errors and flaps leave the control plane whole: a wait, within tolerance.
//!
//! The judgement is of the plan, drawn before the run, so it cannot be bent
//! by what the run did.

use super::plan::{Fault, FaultPlan};
use weir_core::NodeId;

/// A plan's verdict: within tolerance, or why not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tolerance {
    /// No instant of the plan has a majority of the voters out.
    Within,
    /// From `at_us` (from the workload's start) these voters are out at once.
    Beyond {
        /// When the majority is first lost.
        at_us: u64,
        /// The voters out then.
        out: Vec<NodeId>,
        /// How many voters there are.
        voters: usize,
    },
}

impl std::fmt::Display for Tolerance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tolerance::Within => write!(f, "within tolerance"),
            Tolerance::Beyond { at_us, out, voters } => {
                let names: Vec<String> = out.iter().map(ToString::to_string).collect();
                write!(
                    f,
                    "beyond tolerance: {} of {voters} voters out at once from {:.3} ms",
                    names.join(", "),
                    *at_us as f64 / 1e3
                )
            }
        }
    }
}

/// When `fault` puts its node out of the control plane: `[from, to)` in us
/// from the workload's start (`u64::MAX`: for good), if it does.
fn outage(at_us: u64, fault: &Fault) -> Option<(NodeId, u64, u64)> {
    match *fault {
        Fault::Crash { node } | Fault::Remove { node } => Some((node, at_us, u64::MAX)),
        Fault::Pause { node, for_us } | Fault::Partition { node, for_us } => {
            Some((node, at_us, at_us + for_us))
        }
        Fault::Restart { node, after_us, .. } => Some((node, at_us, at_us + after_us)),
        Fault::LinkErrors { .. }
        | Fault::LinkFlap { .. }
        | Fault::DeviceHang { .. }
        | Fault::DeviceLoss { .. }
        | Fault::MediaErrors { .. }
        | Fault::Join { .. } => None,
    }
}

/// Judge `plan` against the Raft group `voters` (the first members').
pub fn judge(plan: &FaultPlan, voters: &[NodeId]) -> Tolerance {
    let outages: Vec<(NodeId, u64, u64)> = plan
        .faults
        .iter()
        .filter_map(|p| outage(p.at_us, &p.fault))
        .filter(|(node, ..)| voters.contains(node))
        .collect();
    let majority = voters.len() / 2 + 1;
    // The count of voters out changes only where an outage starts: look there.
    let mut starts: Vec<u64> = outages.iter().map(|&(_, from, _)| from).collect();
    starts.sort_unstable();
    for at_us in starts {
        let mut out: Vec<NodeId> = outages
            .iter()
            .filter(|&&(_, from, to)| from <= at_us && at_us < to)
            .map(|&(node, ..)| node)
            .collect();
        out.sort_unstable();
        out.dedup();
        if out.len() >= majority {
            return Tolerance::Beyond {
                at_us,
                out,
                voters: voters.len(),
            };
        }
    }
    Tolerance::Within
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::plan::Planned;

    fn plan(faults: Vec<(u64, Fault)>) -> FaultPlan {
        FaultPlan {
            faults: faults
                .into_iter()
                .map(|(at_us, fault)| Planned { at_us, fault })
                .collect(),
        }
    }

    #[test]
    fn a_majority_of_voters_out_at_once_is_beyond_tolerance() {
        let voters = [NodeId(1), NodeId(2), NodeId(3)];
        let pause = |node, for_us| Fault::Pause {
            node: NodeId(node),
            for_us,
        };
        // One voter out at a time: within.
        let apart = plan(vec![(0, pause(1, 100)), (100, pause(2, 100))]);
        assert_eq!(judge(&apart, &voters), Tolerance::Within);
        // Two overlapping: beyond, from when the second starts.
        let together = plan(vec![(0, pause(1, 100)), (50, pause(2, 100))]);
        assert_eq!(
            judge(&together, &voters),
            Tolerance::Beyond {
                at_us: 50,
                out: vec![NodeId(1), NodeId(2)],
                voters: 3
            }
        );
        // A crash lasts: a pause of another voter any time later is beyond.
        let crash = plan(vec![
            (0, Fault::Crash { node: NodeId(3) }),
            (900, pause(1, 5)),
        ]);
        assert!(matches!(
            judge(&crash, &voters),
            Tolerance::Beyond { at_us: 900, .. }
        ));
        // A non-voter's outage and device faults do not count.
        let others = plan(vec![
            (0, pause(4, 100)),
            (0, pause(1, 100)),
            (
                10,
                Fault::DeviceHang {
                    node: NodeId(2),
                    for_us: 100,
                },
            ),
        ]);
        assert_eq!(judge(&others, &voters), Tolerance::Within);
        // Five voters take two out.
        let five: Vec<NodeId> = (1..=5).map(NodeId).collect();
        assert_eq!(judge(&together, &five), Tolerance::Within);
    }
}
