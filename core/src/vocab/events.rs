//! What nodes report about themselves and the cluster, as typed events: the
//! control plane's decisions (reported by the Raft leader), the engine's finished
//! work (rebuilds, repairs, reconciliations) and the driver's view of its device.
//! Whoever shows them (the simulator's report, `/status`, the logs) prints their
//! [`Display`](std::fmt::Display) line; whoever checks them (the runner, tests)
//! matches on the variant.

use crate::ids::{ExtentId, Lba, NodeId};
use std::fmt;

/// Something a node did or saw, worth a line in a report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The leader declared `node` down.
    NodeDown {
        /// The silent node.
        node: NodeId,
        /// Extents whose primary moved to another replica.
        failovers: usize,
        /// Extents that lost a replica (the node was one of their copies).
        lost_replica: usize,
        /// Extents left with no in-sync copy.
        unavailable: usize,
    },
    /// The leader heard from `node` again.
    NodeUp {
        /// The returning node.
        node: NodeId,
        /// Extents it rebuilds.
        rebuilding: usize,
    },
    /// `node` left `extent`'s in-sync set for silence.
    ReplicaDropped {
        /// The silent replica.
        node: NodeId,
        /// The extent.
        extent: ExtentId,
    },
    /// A named volume was created.
    VolumeCreated {
        /// Its name.
        name: String,
        /// Its size.
        size_bytes: u64,
    },
    /// A named volume was deleted.
    VolumeDeleted {
        /// Its name.
        name: String,
    },
    /// A named volume's QoS changed.
    VolumeQos {
        /// Its name.
        name: String,
        /// The new setting.
        qos: crate::control::qos::Qos,
    },
    /// A restarted `node` moved its extents to new epochs.
    Restarted {
        /// The restarted node.
        node: NodeId,
        /// Extents moved to a new epoch.
        moved: usize,
        /// Of those, extents whose primary moved.
        failovers: usize,
    },
    /// A node down too long was replaced by spares.
    Replaced {
        /// The node given up on.
        node: NodeId,
        /// Extents that rebuild on spares.
        rebuilding: usize,
    },
    /// A primary finished copying `extent` to `node`, now in sync.
    Rebuilt {
        /// The rebuilt replica.
        node: NodeId,
        /// The extent.
        extent: ExtentId,
        /// Bytes copied.
        bytes: u64,
        /// Bytes the replica already had (probed, not sent).
        skipped: u64,
        /// How long the copy took.
        took_ns: u64,
    },
    /// `node` repaired blocks its device could not read, from a peer.
    Repaired {
        /// The node whose device failed the read.
        node: NodeId,
        /// Blocks written back.
        blocks: u64,
        /// The first of them.
        lba: Lba,
        /// Their extent.
        extent: ExtentId,
        /// The peer that supplied them.
        from: NodeId,
    },
    /// `node`'s background scrubber met a media error.
    ScrubFound {
        /// The scrubbing node.
        node: NodeId,
        /// The extent.
        extent: ExtentId,
        /// The first unreadable block of the run read.
        lba: Lba,
        /// Blocks in the run.
        blocks: u64,
    },
    /// A new primary made its replicas agree on the blocks unanswered writes may
    /// have touched.
    Reconciled {
        /// The new primary.
        node: NodeId,
        /// Blocks written back.
        blocks: u64,
        /// Extents reconciled.
        extents: u64,
        /// How long it took.
        took_ns: u64,
    },
    /// A restarted node read its block versions back from its checkpoints.
    VersionsRestored {
        /// The node.
        node: NodeId,
        /// Blocks whose versions it restored.
        blocks: usize,
        /// Their bytes.
        bytes: u64,
    },
    /// `node`'s device has a command outstanding past the timeout.
    DeviceStalled {
        /// The node.
        node: NodeId,
        /// The device timeout.
        timeout: std::time::Duration,
    },
    /// `node`'s device answered `Gone`.
    DeviceGone {
        /// The node.
        node: NodeId,
    },
    /// `node`'s device answers in time again.
    DeviceAnswers {
        /// The node.
        node: NodeId,
    },
    /// `node` was behind the leader's compacted log and installed its snapshot
    /// of the map instead of the entries.
    MapInstalled {
        /// The node.
        node: NodeId,
        /// Log index of the snapshot.
        index: u64,
        /// Bytes of the encoded map.
        bytes: usize,
    },
    /// A membership change: a node joined, started leaving or left, its vote
    /// changed, or a replica moved off a leaving node.
    Member {
        /// The node.
        node: NodeId,
        /// What changed.
        change: MemberChange,
    },
    /// The simulator cut `node`'s power (its SSD's volatile cache is lost).
    PowerLost {
        /// The node.
        node: NodeId,
        /// Written blocks the cache held, now gone.
        dropped_blocks: u64,
    },
}

impl Event {
    /// The node the event is about.
    pub fn node(&self) -> Option<NodeId> {
        match self {
            Event::NodeDown { node, .. }
            | Event::NodeUp { node, .. }
            | Event::ReplicaDropped { node, .. }
            | Event::Restarted { node, .. }
            | Event::Replaced { node, .. }
            | Event::Rebuilt { node, .. }
            | Event::Repaired { node, .. }
            | Event::ScrubFound { node, .. }
            | Event::Reconciled { node, .. }
            | Event::VersionsRestored { node, .. }
            | Event::DeviceStalled { node, .. }
            | Event::DeviceGone { node }
            | Event::DeviceAnswers { node }
            | Event::MapInstalled { node, .. }
            | Event::Member { node, .. }
            | Event::PowerLost { node, .. } => Some(*node),
            Event::VolumeCreated { .. } | Event::VolumeDeleted { .. } | Event::VolumeQos { .. } => {
                None
            }
        }
    }
}

/// What a [`Event::Member`] changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberChange {
    /// Joined the map (`weir node add`).
    Joined,
    /// Started leaving (`weir node remove`): holding `extents` replicas.
    Leaving {
        /// Replicas it holds.
        extents: usize,
    },
    /// Started moving its replica of `extent` to `to`.
    MoveStarted {
        /// The extent.
        extent: ExtentId,
        /// The new replica.
        to: NodeId,
    },
    /// Its replica of `extent` moved to `to` (now in sync there).
    Moved {
        /// The extent.
        extent: ExtentId,
        /// The new replica.
        to: NodeId,
    },
    /// Now votes in the Raft group.
    Voter,
    /// Now learns the map without a vote (joined, or its vote went to another).
    Learner,
    /// Out of the group and the map.
    Gone,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

/// One table, argued long: an arm per event, each its one report line.
impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::NodeDown {
                node,
                failovers,
                lost_replica,
                unavailable,
            } => write!(
                f,
                "{node} down: {failovers} extents fail over, {lost_replica} lose a replica, \
                 {unavailable} unavailable"
            ),
            Event::NodeUp { node, rebuilding } => {
                write!(f, "{node} up: rebuilding {rebuilding} extents")
            }
            Event::ReplicaDropped { node, extent } => write!(
                f,
                "{node} dropped from {extent}'s in-sync set (silent past the replica timeout)"
            ),
            Event::VolumeCreated { name, size_bytes } => {
                write!(f, "volume {name:?} created ({size_bytes} bytes)")
            }
            Event::VolumeDeleted { name } => write!(f, "volume {name:?} deleted"),
            Event::VolumeQos { name, qos } => write!(f, "volume {name:?} QoS set: {qos}"),
            Event::Restarted {
                node,
                moved,
                failovers,
            } => write!(
                f,
                "{node} restarted: {moved} extents move to a new epoch, {failovers} fail over"
            ),
            Event::Member { node, change } => match change {
                MemberChange::Joined => write!(f, "{node} joined"),
                MemberChange::Leaving { extents } => {
                    write!(f, "{node} leaving: {extents} replicas to move")
                }
                MemberChange::MoveStarted { extent, to } => {
                    write!(f, "{node}'s replica of {extent} moving to {to}")
                }
                MemberChange::Moved { extent, to } => {
                    write!(f, "{node}'s replica of {extent} moved to {to}")
                }
                MemberChange::Voter => write!(f, "{node} votes"),
                MemberChange::Learner => write!(f, "{node} learns the map, without a vote"),
                MemberChange::Gone => write!(f, "{node} left the cluster"),
            },
            Event::Replaced { node, rebuilding } => {
                write!(f, "{node} replaced: {rebuilding} extents rebuild on spares")
            }
            Event::Rebuilt {
                node,
                extent,
                bytes,
                skipped,
                took_ns,
            } => write!(
                f,
                "{node} rebuilt in {extent}: {:.1} MiB in {:.1} ms ({:.0} MB/s), \
                 {:.1} MiB it had not sent",
                mib(*bytes),
                *took_ns as f64 / 1e6,
                *bytes as f64 * 1e3 / (*took_ns).max(1) as f64,
                mib(*skipped),
            ),
            Event::Repaired {
                node,
                blocks,
                lba,
                extent,
                from,
            } => write!(
                f,
                "{node} repaired {blocks} blocks at {lba} of {extent} from {from} after a media error"
            ),
            Event::ScrubFound {
                node,
                extent,
                lba,
                blocks,
            } => write!(
                f,
                "{node} scrub found a media error in {extent} at block {} (+{blocks})",
                lba.0
            ),
            Event::Reconciled {
                node,
                blocks,
                extents,
                took_ns,
            } => write!(
                f,
                "{node} reconciled {blocks} blocks of {extents} extents with their replicas \
                 in {:.1} ms",
                *took_ns as f64 / 1e6
            ),
            Event::VersionsRestored {
                node,
                blocks,
                bytes,
            } => write!(
                f,
                "{node} restored the versions of {blocks} blocks ({:.1} MiB) from its checkpoints",
                mib(*bytes)
            ),
            Event::MapInstalled { node, index, bytes } => write!(
                f,
                "{node} installed the leader's snapshot of the map at log index {index} \
                 ({bytes} bytes)"
            ),
            Event::DeviceStalled { node, timeout } => write!(
                f,
                "{node}'s device stalled past {timeout:?}: its extents fail over"
            ),
            Event::DeviceGone { node } => {
                write!(f, "{node}'s device is gone: its extents fail over")
            }
            Event::DeviceAnswers { node } => write!(f, "{node}'s device answers again"),
            Event::PowerLost {
                node,
                dropped_blocks,
            } => write!(
                f,
                "{node} lost power: {dropped_blocks} unflushed blocks dropped"
            ),
        }
    }
}

/// The default bound of an [`Events`] ring.
pub const EVENTS_MAX: usize = 1024;

/// The latest events of a node, oldest first, each with the time since the node
/// started (ns): a ring of a fixed capacity, so a log nobody reads stays bounded.
#[derive(Debug)]
pub struct Events {
    capacity: usize,
    lines: std::collections::VecDeque<(u64, Event)>,
    dropped: u64,
}

impl Default for Events {
    fn default() -> Self {
        Events::with_capacity(EVENTS_MAX)
    }
}

impl Events {
    /// A ring that keeps the latest `capacity` events (at least one).
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Events {
            capacity,
            lines: std::collections::VecDeque::with_capacity(capacity.min(EVENTS_MAX)),
            dropped: 0,
        }
    }

    /// Keep `event`, at `at_ns`; the oldest event goes if the ring is full.
    pub fn push(&mut self, at_ns: u64, event: Event) {
        if self.lines.len() == self.capacity {
            self.lines.pop_front();
            self.dropped += 1;
        }
        self.lines.push_back((at_ns, event));
        debug_assert!(self.lines.len() <= self.capacity);
    }

    /// The events kept, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &(u64, Event)> + '_ {
        self.lines.iter()
    }

    /// How many events the ring holds.
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    /// Whether the ring holds none.
    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Events pushed out of the ring so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_read_as_before_and_name_their_node() {
        let down = Event::NodeDown {
            node: NodeId(2),
            failovers: 3,
            lost_replica: 1,
            unavailable: 0,
        };
        assert_eq!(
            down.to_string(),
            "n2 down: 3 extents fail over, 1 lose a replica, 0 unavailable"
        );
        assert_eq!(down.node(), Some(NodeId(2)));
        let rebuilt = Event::Rebuilt {
            node: NodeId(1),
            extent: ExtentId(4),
            bytes: 2 << 20,
            skipped: 1 << 20,
            took_ns: 2_000_000,
        };
        assert_eq!(
            rebuilt.to_string(),
            format!(
                "n1 rebuilt in {}: 2.0 MiB in 2.0 ms (1049 MB/s), 1.0 MiB it had not sent",
                ExtentId(4)
            )
        );
        let created = Event::VolumeCreated {
            name: "vol".into(),
            size_bytes: 4096,
        };
        assert_eq!(created.to_string(), "volume \"vol\" created (4096 bytes)");
        assert_eq!(created.node(), None);
    }

    #[test]
    fn the_event_ring_keeps_the_latest_and_counts_what_it_dropped() {
        let mut events = Events::with_capacity(3);
        for i in 0..5u64 {
            events.push(
                i,
                Event::DeviceAnswers {
                    node: NodeId(i as u32),
                },
            );
        }
        let kept: Vec<u64> = events.iter().map(|(at, _)| *at).collect();
        assert_eq!(kept, [2, 3, 4], "oldest first, the latest three");
        assert_eq!(events.dropped(), 2);
        assert_eq!(events.len(), 3);
        let one = Events::with_capacity(0);
        assert!(one.is_empty());
        assert_eq!(one.capacity, 1, "a ring holds at least one event");
    }
}
