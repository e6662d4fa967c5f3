//! The cluster map as the data path sees it: the volume's shape plus the control
//! plane's state (nodes, extent -> replica set, primary, in-sync set, epoch).
//!
//! The state is [`crate::control::ClusterState`], built by applying control-plane
//! commands; every node and client holds a copy and replaces it when the control
//! plane publishes a newer one ([`ClusterMap::with_state`]).

use crate::control::state::{ClusterState, Command, ExtentState, Qos};
use crate::error::WeirError;
use crate::ids::{ExtentId, Lba, NodeId, VolumeId};
use std::collections::BTreeMap;

/// Largest request a map may allow: one request (and its replication message) must
/// fit in one wire frame.
pub const MAX_REQUEST_BYTES: u64 = 1 << 20;

/// Shape of a volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeSpec {
    /// Volume id.
    pub id: VolumeId,
    /// Block size in bytes.
    pub block_size: u32,
    /// Size in blocks.
    pub capacity_blocks: u64,
    /// Extent size in blocks; the unit of replication and placement.
    pub extent_blocks: u64,
    /// Largest client request in blocks.
    pub max_request_blocks: u32,
}

impl VolumeSpec {
    /// Largest request in bytes (bounded by [`MAX_REQUEST_BYTES`] in a valid map).
    pub fn max_request_bytes(&self) -> u32 {
        (u64::from(self.max_request_blocks) * u64::from(self.block_size)).min(u64::from(u32::MAX))
            as u32
    }
}

/// A cluster map that cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MapError {
    /// Fewer nodes than replicas per extent.
    #[error("{replicas} replicas need at least {replicas} nodes, have {nodes}")]
    TooFewNodes {
        /// Replicas requested.
        replicas: usize,
        /// Nodes available.
        nodes: usize,
    },
    /// A size is zero or not a sensible multiple.
    #[error("invalid volume shape: {0}")]
    BadShape(&'static str),
}

/// The cluster map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterMap {
    nodes: Vec<NodeId>,
    volume: VolumeSpec,
    state: ClusterState,
    /// The named volume holding each allocated pool extent: (its number, its
    /// QoS). Built from `state`, so a request finds its volume without a scan.
    named: BTreeMap<ExtentId, (u64, Qos)>,
    /// References to each pool extent in use ([`ClusterState::references`]).
    refs: BTreeMap<ExtentId, u32>,
}

/// The named volume of each allocated pool extent of `state`.
fn named_index(state: &ClusterState) -> BTreeMap<ExtentId, (u64, Qos)> {
    state
        .named
        .values()
        .flat_map(|v| v.alloc.values().map(|&e| (e, (v.id, v.qos))))
        .collect()
}

impl ClusterMap {
    /// A static map: extent `i` has its primary on `nodes[i % n]` and its other
    /// replicas on the following nodes, so primaries spread evenly.
    pub fn new_static(
        nodes: Vec<NodeId>,
        volume: VolumeSpec,
        replicas: usize,
    ) -> Result<Self, MapError> {
        if replicas == 0 || nodes.len() < replicas {
            return Err(MapError::TooFewNodes {
                replicas,
                nodes: nodes.len(),
            });
        }
        if !matches!(volume.block_size, 512 | 4096) {
            return Err(MapError::BadShape("block size must be 512 or 4096"));
        }
        if volume.capacity_blocks == 0 || volume.extent_blocks == 0 {
            return Err(MapError::BadShape("capacity and extent size must be > 0"));
        }
        let max_request_bytes = u64::from(volume.max_request_blocks) * u64::from(volume.block_size);
        if volume.max_request_blocks == 0 || max_request_bytes > MAX_REQUEST_BYTES {
            return Err(MapError::BadShape("max request must be 1 block to 1 MiB"));
        }
        let count = volume.capacity_blocks.div_ceil(volume.extent_blocks);
        let mut state = ClusterState::default();
        for &node in &nodes {
            state
                .apply(&Command::AddNode { node })
                .map_err(|_| MapError::BadShape("a node is listed twice"))?;
        }
        let replicas =
            u8::try_from(replicas).map_err(|_| MapError::BadShape("too many replicas"))?;
        state
            .apply(&Command::CreateVolume {
                volume: volume.id,
                extents: count,
                replicas,
            })
            .map_err(|_| MapError::BadShape("cannot place the volume"))?;
        let map = ClusterMap {
            nodes,
            volume,
            named: named_index(&state),
            refs: state.references(),
            state,
        };
        map.self_check();
        Ok(map)
    }

    /// This map with the control plane's newer `state` (same volume). A state that
    /// does not hold this volume's extents yet (the bootstrap is still being
    /// applied) is refused.
    pub fn with_state(&self, state: ClusterState) -> Result<ClusterMap, MapError> {
        let count = self
            .volume
            .capacity_blocks
            .div_ceil(self.volume.extent_blocks);
        if state.extents.len() as u64 != count {
            return Err(MapError::BadShape(
                "the state does not place this volume yet",
            ));
        }
        // A state from the network is checked, never trusted: a bad one is refused.
        if state.validate().is_err() {
            return Err(MapError::BadShape("the state breaks the map's invariants"));
        }
        let map = ClusterMap {
            nodes: state.nodes.keys().copied().collect(),
            volume: self.volume,
            named: named_index(&state),
            refs: state.references(),
            state,
        };
        map.self_check();
        Ok(map)
    }

    /// This map with a named volume's command applied (`CreateNamed`, `SetQos`,
    /// `DeleteNamed`): a static map's volumes, as its bootstrap creates them.
    pub fn with_named(&self, cmd: &Command) -> Result<ClusterMap, MapError> {
        if !matches!(
            cmd,
            Command::CreateNamed { .. } | Command::SetQos { .. } | Command::DeleteNamed { .. }
        ) {
            return Err(MapError::BadShape("not a named volume's command"));
        }
        let mut state = self.state.clone();
        state
            .apply(cmd)
            .map_err(|_| MapError::BadShape("the volume's command is refused"))?;
        self.with_state(state)
    }

    /// The named volume holding pool extent `extent`: its number and its QoS.
    pub fn named_at(&self, extent: ExtentId) -> Option<(u64, Qos)> {
        self.named.get(&extent).copied()
    }

    /// Whether pool extent `extent` may not be written in place (see
    /// [`crate::control::state::snapshots`]).
    pub fn frozen(&self, extent: ExtentId) -> bool {
        self.state.frozen(&self.refs, extent)
    }

    /// The QoS of the named volume numbered `volume`, if it exists.
    pub fn qos_of(&self, volume: u64) -> Option<Qos> {
        self.state
            .named
            .values()
            .find(|v| v.id == volume)
            .map(|v| v.qos)
    }

    /// Whether any named volume asks for QoS.
    pub fn any_qos(&self) -> bool {
        self.state.named.values().any(|v| v.qos.is_set())
    }

    /// The control plane's state behind this map.
    pub fn state(&self) -> &ClusterState {
        &self.state
    }

    /// Assert the map's invariants: the control state's own, and one extent per
    /// `extent_blocks` of the volume.
    pub fn self_check(&self) {
        self.state.self_check();
        assert_eq!(self.named, named_index(&self.state), "named volume index");
        assert_eq!(self.refs, self.state.references(), "reference counts");
        let count = self
            .volume
            .capacity_blocks
            .div_ceil(self.volume.extent_blocks);
        assert_eq!(self.state.extents.len() as u64, count, "extent count");
    }

    /// Storage nodes, in id order.
    pub fn nodes(&self) -> &[NodeId] {
        &self.nodes
    }

    /// The volume.
    pub fn volume(&self) -> &VolumeSpec {
        &self.volume
    }

    /// Number of extents.
    pub fn extent_count(&self) -> u64 {
        self.state.extents.len() as u64
    }

    /// Placement of `extent`. Panics if the extent does not exist: ids come from
    /// [`ClusterMap::locate`], which checks them.
    pub fn extent(&self, extent: ExtentId) -> &ExtentState {
        &self.state.extents[&extent]
    }

    /// The extent holding `lba`, without bounds checks beyond the volume's.
    pub fn extent_of(&self, lba: Lba) -> ExtentId {
        ExtentId(lba.0 / self.volume.extent_blocks)
    }

    /// The first block of `extent`.
    pub fn extent_start(&self, extent: ExtentId) -> Lba {
        Lba(extent.0 * self.volume.extent_blocks)
    }

    /// First block past the end of `extent`.
    pub fn extent_end(&self, extent: ExtentId) -> Lba {
        Lba(((extent.0 + 1) * self.volume.extent_blocks).min(self.volume.capacity_blocks))
    }

    /// Validate a client request and find its extent: the volume must exist, the
    /// range must be non-empty, inside the volume, within the request limit, and in
    /// one extent.
    pub fn locate(&self, volume: VolumeId, lba: Lba, blocks: u64) -> Result<ExtentId, WeirError> {
        let v = &self.volume;
        if volume != v.id {
            return Err(WeirError::UnknownVolume(volume));
        }
        if blocks == 0 || blocks > u64::from(v.max_request_blocks) {
            return Err(WeirError::BadLength {
                len: blocks.saturating_mul(u64::from(v.block_size)),
                block_size: v.block_size,
                max_bytes: v.max_request_bytes(),
            });
        }
        match lba.0.checked_add(blocks) {
            Some(end) if end <= v.capacity_blocks => {}
            _ => {
                return Err(WeirError::OutOfRange {
                    lba,
                    blocks,
                    capacity: v.capacity_blocks,
                })
            }
        }
        let extent = self.extent_of(lba);
        if lba.offset(blocks) > self.extent_end(extent) {
            return Err(WeirError::CrossesExtent);
        }
        Ok(extent)
    }

    /// Check a payload length and turn it into a block count.
    pub fn blocks_in(&self, len: usize) -> Result<u64, WeirError> {
        let v = &self.volume;
        let bs = v.block_size as usize;
        if len == 0 || !len.is_multiple_of(bs) || len > (v.max_request_blocks as usize) * bs {
            return Err(WeirError::BadLength {
                len: len as u64,
                block_size: v.block_size,
                max_bytes: v.max_request_bytes(),
            });
        }
        Ok((len / bs) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> ClusterMap {
        let nodes = (1..=4).map(NodeId).collect();
        let volume = VolumeSpec {
            id: VolumeId(1),
            block_size: 4096,
            capacity_blocks: 1000,
            extent_blocks: 256,
            max_request_blocks: 64,
        };
        ClusterMap::new_static(nodes, volume, 3).unwrap()
    }

    #[test]
    fn primaries_spread_and_replicas_distinct() {
        let m = map();
        assert_eq!(m.extent_count(), 4);
        let primaries: Vec<_> = (0..4).map(|e| m.extent(ExtentId(e)).primary).collect();
        assert_eq!(primaries, vec![NodeId(1), NodeId(2), NodeId(3), NodeId(4)]);
        assert_eq!(
            m.extent(ExtentId(3)).replicas,
            vec![NodeId(4), NodeId(1), NodeId(2)]
        );
        assert_eq!(m.extent_end(ExtentId(3)), Lba(1000));
    }

    #[test]
    fn locate_rejects_bad_requests() {
        let m = map();
        assert_eq!(m.locate(VolumeId(1), Lba(255), 1), Ok(ExtentId(0)));
        assert_eq!(
            m.locate(VolumeId(1), Lba(255), 2),
            Err(WeirError::CrossesExtent)
        );
        assert_eq!(
            m.locate(VolumeId(2), Lba(0), 1),
            Err(WeirError::UnknownVolume(VolumeId(2)))
        );
        assert!(matches!(
            m.locate(VolumeId(1), Lba(999), 2),
            Err(WeirError::OutOfRange { .. })
        ));
        assert!(matches!(
            m.locate(VolumeId(1), Lba(u64::MAX), 1),
            Err(WeirError::OutOfRange { .. })
        ));
        assert!(matches!(
            m.locate(VolumeId(1), Lba(0), 0),
            Err(WeirError::BadLength { .. })
        ));
        assert!(matches!(
            m.locate(VolumeId(1), Lba(0), 65),
            Err(WeirError::BadLength { .. })
        ));
        assert!(m.blocks_in(4095).is_err());
        assert_eq!(m.blocks_in(8192), Ok(2));
    }

    #[test]
    fn requests_larger_than_a_frame_are_refused() {
        let mut volume = map().volume;
        volume.max_request_blocks = 1 << 20;
        let nodes = (1..=3).map(NodeId).collect();
        assert!(matches!(
            ClusterMap::new_static(nodes, volume, 3),
            Err(MapError::BadShape(_))
        ));
    }

    #[test]
    fn a_broken_state_from_the_network_is_refused_not_trusted() {
        let m = map();
        let mut state = m.state().clone();
        let ext = state.extents.get_mut(&ExtentId(1)).unwrap();
        ext.primary = NodeId(77);
        assert!(m.with_state(state).is_err());
        let mut state = m.state().clone();
        let ext = state.extents.remove(&ExtentId(0)).unwrap();
        state.extents.insert(ExtentId(9), ext);
        assert!(m.with_state(state).is_err(), "extent ids with a hole");
        assert!(m.with_state(m.state().clone()).is_ok());
    }

    #[test]
    fn too_few_nodes_is_an_error() {
        let volume = map().volume;
        let err = ClusterMap::new_static(vec![NodeId(1), NodeId(2)], volume, 3).unwrap_err();
        assert_eq!(
            err,
            MapError::TooFewNodes {
                replicas: 3,
                nodes: 2
            }
        );
    }
}
