//! Newtypes for every identifier, so a block address can never be passed where a
//! version is expected.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
        )]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id_type!(
    /// A host on the fabric: a storage node or a client.
    NodeId(u32),
    "n"
);
id_type!(
    /// A storage device of the cluster (a store), unique over every node's.
    DeviceId(u32),
    "d"
);
id_type!(
    /// A placement group of a pool: the unit of placement.
    PgId(u32),
    "pg"
);
id_type!(
    /// A block volume.
    VolumeId(u32),
    "vol"
);
id_type!(
    /// An extent: a fixed-size slice of a volume, the unit of replication.
    ExtentId(u64),
    "ext"
);
id_type!(
    /// Cluster-map epoch of an extent; bumped by every map change of that extent.
    Epoch(u64),
    "e"
);
id_type!(
    /// Per-extent write version assigned by the primary, strictly increasing.
    Version(u64),
    "v"
);
id_type!(
    /// Logical block address, in units of the volume's block size.
    Lba(u64),
    "lba"
);
id_type!(
    /// A client request id, unique per client node; replies echo it.
    RequestId(u64),
    "req"
);
id_type!(
    /// A replication operation id, unique per primary node; acks echo it.
    OpId(u64),
    "op"
);

impl Version {
    /// The version after this one.
    pub fn next(self) -> Version {
        Version(self.0 + 1)
    }

    /// The floor of the versions a primary gives out in `epoch`: the epoch in the
    /// high 32 bits. A primary that takes over an extent in a newer epoch numbers its
    /// writes above every version an earlier primary gave out (even one that reached
    /// only some replicas before it failed), so no replica ever refuses them as a
    /// regression.
    pub fn epoch_floor(epoch: Epoch) -> Version {
        Version(epoch.0 << 32)
    }
}

impl Epoch {
    /// The epoch after this one.
    pub fn next(self) -> Epoch {
        Epoch(self.0 + 1)
    }
}

impl Lba {
    /// This address plus `blocks`.
    pub fn offset(self, blocks: u64) -> Lba {
        Lba(self.0 + blocks)
    }
}

/// Front ends' ids are this plus their node's id; members' ids are below it
/// (a node's own front end: [`crate::front_end`]).
pub const FRONT_END_ID_BASE: u32 = 1 << 20;

/// The client id of `node`'s own front end.
pub fn front_end_of(node: NodeId) -> NodeId {
    assert!(node.0 < FRONT_END_ID_BASE, "{node} is a front end's id");
    NodeId(FRONT_END_ID_BASE + node.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_end_ids_lie_above_every_member() {
        assert_eq!(front_end_of(NodeId(3)), NodeId(FRONT_END_ID_BASE + 3));
        assert!(std::panic::catch_unwind(|| front_end_of(NodeId(FRONT_END_ID_BASE))).is_err());
    }
}
