//! The map's size budget: the map travels whole in one frame, so a command
//! that adds to it is refused once it would no longer fit with the room kept
//! for the commands never refused (`ClusterState::apply`).

use super::ClusterState;

/// Most bytes the encoded map may ever take: it travels whole in one frame (a
/// client's `MapState`, a Raft snapshot message), whose body is at most
/// [`crate::wire::MAX_BODY_BYTES`]; 32 KiB are left for the message around it
/// (a snapshot's configuration of up to [`super::MAX_MEMBERS`] members, 6 bytes
/// each in at most four lists).
pub const MAP_FRAME_BYTES: usize = (1 << 20) - (32 << 10);

/// What a member's entry may still grow by through commands never refused
/// for size (its incarnation's varint, its status).
pub const MEMBER_RESERVE_BYTES: usize = 16;

/// Widest a node id encodes (ids are below [`crate::ids::FRONT_END_ID_BASE`],
/// 2^20: three varint bytes).
const NODE_ID_MAX_BYTES: usize = 3;
/// Widest an epoch encodes: a version is its epoch shifted 32 bits, so an
/// epoch stays below 2^32 (five varint bytes).
const EPOCH_MAX_BYTES: usize = 5;
/// Widest a time in nanoseconds encodes (below 2^63: nine varint bytes).
const NS_MAX_BYTES: usize = 9;

/// Bytes of `v` as a postcard varint.
fn varint_len(v: u64) -> usize {
    (64 - v.leading_zeros() as usize).max(1).div_ceil(7)
}

impl ClusterState {
    /// Bytes kept free in the map's frame for what the commands never
    /// refused for size (failure handling, rebuild, deletions: `Growth::Kept`)
    /// may still add: the room left in each field they may widen, to its
    /// widest. For an extent: `serve_after_ns` (to 9 bytes), its epoch and
    /// reign (to 5 each), each node id in its replica list and as primary
    /// (to 3), and its in-sync and rebuilding sets filled with every replica
    /// (3 bytes each); for a redirect row, its chunk bits (to 10); for a
    /// member, [`MEMBER_RESERVE_BYTES`]. As those commands use it, the room
    /// left shrinks by what the map grew, so the sum stays the same.
    pub fn size_reserve(&self) -> usize {
        let room = |max: usize, v: u64| max.saturating_sub(varint_len(v));
        let extents: usize = self
            .extents
            .values()
            .map(|e| {
                let ids: usize = e
                    .replicas
                    .iter()
                    .chain([&e.primary])
                    .map(|n| room(NODE_ID_MAX_BYTES, u64::from(n.0)))
                    .sum();
                let sets: usize = e
                    .in_sync
                    .iter()
                    .chain(&e.rebuilding)
                    .map(|n| varint_len(u64::from(n.0)))
                    .sum();
                room(NS_MAX_BYTES, e.serve_after_ns)
                    + room(EPOCH_MAX_BYTES, e.epoch.0)
                    + room(EPOCH_MAX_BYTES, e.primary_since.0)
                    + ids
                    + (NODE_ID_MAX_BYTES * e.replicas.len()).saturating_sub(sets)
            })
            .sum();
        let rows: usize = self.rows.values().map(|r| room(10, r.filled)).sum();
        extents + rows + MEMBER_RESERVE_BYTES * self.nodes.len()
    }

    /// Bytes the map encodes to.
    pub fn encoded_len(&self) -> usize {
        postcard::serialize_with_flavor(self, postcard::ser_flavors::Size::default())
            .expect("a cluster state always encodes")
    }
}
