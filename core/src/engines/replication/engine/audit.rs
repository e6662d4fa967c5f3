//! What the engine did, for the simulator's invariant checkers ([`Audit`]):
//! claims to serve, acknowledged and persisted writes, accepted replica writes,
//! finished rebuilds.

use super::*;

/// What the engine did, for invariant checkers that see every node at once. Times
/// are the cluster clock (ns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Audit {
    /// This node may serve `extent` at `epoch` as its primary from `from_ns` until
    /// `until_ns` (its lease at that moment); it said so at `made_ns` (the start
    /// may lie ahead: a new primary waits out the old one's lease).
    Claim {
        /// The extent.
        extent: ExtentId,
        /// The map epoch it serves.
        epoch: Epoch,
        /// When the claim was made.
        made_ns: u64,
        /// Start of the right to serve.
        from_ns: u64,
        /// End of the right to serve.
        until_ns: u64,
    },
    /// This primary acknowledged `version` of `[lba, lba + blocks)` to the client at
    /// `at_ns`, when the map's in-sync set of the extent was `in_sync`.
    Acked {
        /// The extent.
        extent: ExtentId,
        /// First block.
        lba: Lba,
        /// Blocks written.
        blocks: u64,
        /// The write's version.
        version: Version,
        /// When.
        at_ns: u64,
        /// Every replica that must hold it.
        in_sync: Vec<NodeId>,
    },
    /// This replica took a write of `extent` sent at `epoch`, when its own map was
    /// at `map_epoch`.
    Accepted {
        /// The extent.
        extent: ExtentId,
        /// The epoch the write carried.
        epoch: Epoch,
        /// This replica's epoch of the extent then.
        map_epoch: Epoch,
        /// When.
        at_ns: u64,
    },
    /// This primary's copy of `extent` to `node` finished: `bytes` copied from
    /// `started_ns` until `at_ns`, when the node joined the in-sync set.
    Rebuilt {
        /// The extent.
        extent: ExtentId,
        /// The replica rebuilt.
        node: NodeId,
        /// Bytes copied.
        bytes: u64,
        /// Bytes the primary holds that the replica already had (not sent).
        skipped: u64,
        /// When the copy began.
        started_ns: u64,
        /// When the replica was in sync again.
        at_ns: u64,
    },
    /// This node's device completed `version` of `[lba, lba + blocks)` at `at_ns`.
    Persisted {
        /// First block.
        lba: Lba,
        /// Blocks written.
        blocks: u64,
        /// The write's version.
        version: Version,
        /// When.
        at_ns: u64,
    },
}

impl Audit {
    /// The same fact with every time passed through `f` (a node's clock to the
    /// true time, for checkers that compare nodes).
    pub fn map_times(self, f: impl Fn(u64) -> u64) -> Audit {
        match self {
            Audit::Claim {
                extent,
                epoch,
                made_ns,
                from_ns,
                until_ns,
            } => Audit::Claim {
                extent,
                epoch,
                made_ns: f(made_ns),
                from_ns: f(from_ns),
                until_ns: f(until_ns),
            },
            Audit::Acked {
                extent,
                lba,
                blocks,
                version,
                at_ns,
                in_sync,
            } => Audit::Acked {
                extent,
                lba,
                blocks,
                version,
                at_ns: f(at_ns),
                in_sync,
            },
            Audit::Accepted {
                extent,
                epoch,
                map_epoch,
                at_ns,
            } => Audit::Accepted {
                extent,
                epoch,
                map_epoch,
                at_ns: f(at_ns),
            },
            Audit::Rebuilt {
                extent,
                node,
                bytes,
                skipped,
                started_ns,
                at_ns,
            } => Audit::Rebuilt {
                extent,
                node,
                bytes,
                skipped,
                started_ns: f(started_ns),
                at_ns: f(at_ns),
            },
            Audit::Persisted {
                lba,
                blocks,
                version,
                at_ns,
            } => Audit::Persisted {
                lba,
                blocks,
                version,
                at_ns: f(at_ns),
            },
        }
    }
}
