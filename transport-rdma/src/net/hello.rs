//! The connection manager's hello: what two sides exchange over the side
//! channel (a TCP connection) to set up one queue pair.
//!
//! ```text
//! magic "WRDM" u32, version u16, cluster id u64, node id u32, path u8,
//! params: recv_slots u16, slot_bytes u32, large_slots u16, large_bytes u32,
//! endpoint: qpn u32, psn u32, gid [u8; 16], MTU u32,
//! regions: base address u64, rkey u32 (region k at base + k * large_bytes)
//! ```
//!
//! Little-endian, 71 bytes, fixed. The dialer sends its hello, the acceptor
//! answers with its own, the dialer sends [`READY`] once its queue pair can
//! receive; from then on the side channel carries nothing, and its end (EOF or
//! an error on either side) ends the connection.

use super::nic::Endpoint;
use crate::proto::Params;
use weir_core::NodeId;

/// The hello's first four bytes.
pub const MAGIC: u32 = u32::from_le_bytes(*b"WRDM");
/// The version of this exchange.
pub const VERSION: u16 = 1;
/// A hello's length.
pub const LEN: usize = 71;
/// The dialer's byte after the exchange: its queue pair is ready to receive,
/// so the acceptor may send.
pub const READY: u8 = 0x52;

/// One side's hello.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    /// The cluster (both sides must agree).
    pub cluster_id: u64,
    /// The sender.
    pub node: NodeId,
    /// The path (port index) the connection lives on.
    pub path: u8,
    /// What the sender receives with.
    pub params: Params,
    /// The sender's queue pair.
    pub endpoint: Endpoint,
    /// Its granted regions: the first one's address.
    pub regions_addr: u64,
    /// Their key.
    pub regions_rkey: u32,
}

/// Why a hello was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HelloError {
    /// Not a weir RDMA hello.
    #[error("not a weir RDMA hello (magic {0:#x})")]
    Magic(u32),
    /// Another version of the exchange.
    #[error("RDMA connection manager version {0}, this node speaks {VERSION}")]
    Version(u16),
    /// From another cluster.
    #[error("hello from cluster {theirs}, this is cluster {ours}")]
    Cluster {
        /// The hello's.
        theirs: u64,
        /// This node's.
        ours: u64,
    },
    /// From an unexpected node.
    #[error("hello from node {0}, which is not who it should be")]
    Node(NodeId),
    /// A path this host does not have.
    #[error("hello for path {path}; this host has {paths}")]
    Path {
        /// The hello's.
        path: u8,
        /// This host's.
        paths: u8,
    },
    /// A shape refused.
    #[error("{0}")]
    Params(crate::proto::ProtoError),
}

impl Hello {
    /// The hello's bytes.
    pub fn encode(&self) -> [u8; LEN] {
        let mut b = Vec::with_capacity(LEN);
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&self.cluster_id.to_le_bytes());
        b.extend_from_slice(&self.node.0.to_le_bytes());
        b.push(self.path);
        let p = &self.params;
        b.extend_from_slice(&p.recv_slots.to_le_bytes());
        b.extend_from_slice(&p.slot_bytes.to_le_bytes());
        b.extend_from_slice(&p.large_slots.to_le_bytes());
        b.extend_from_slice(&p.large_bytes.to_le_bytes());
        b.extend_from_slice(&self.endpoint.qpn.to_le_bytes());
        b.extend_from_slice(&self.endpoint.psn.to_le_bytes());
        b.extend_from_slice(&self.endpoint.gid);
        b.extend_from_slice(&self.endpoint.mtu.to_le_bytes());
        b.extend_from_slice(&self.regions_addr.to_le_bytes());
        b.extend_from_slice(&self.regions_rkey.to_le_bytes());
        b.try_into().expect("a hello is LEN bytes")
    }

    /// The hello in `b`, checked against this side: its cluster, its paths
    /// and the shapes it accepts. (Who sent it is the caller's to check.)
    pub fn decode(b: &[u8; LEN], cluster_id: u64, paths: u8) -> Result<Hello, HelloError> {
        let mut at = 0;
        let mut take = |n: usize| {
            let s = &b[at..at + n];
            at += n;
            s
        };
        let u16_ = |s: &[u8]| u16::from_le_bytes(s.try_into().expect("2 bytes"));
        let u32_ = |s: &[u8]| u32::from_le_bytes(s.try_into().expect("4 bytes"));
        let u64_ = |s: &[u8]| u64::from_le_bytes(s.try_into().expect("8 bytes"));
        let magic = u32_(take(4));
        if magic != MAGIC {
            return Err(HelloError::Magic(magic));
        }
        let version = u16_(take(2));
        if version != VERSION {
            return Err(HelloError::Version(version));
        }
        let theirs = u64_(take(8));
        if theirs != cluster_id {
            return Err(HelloError::Cluster {
                theirs,
                ours: cluster_id,
            });
        }
        let node = NodeId(u32_(take(4)));
        let path = take(1)[0];
        if path >= paths {
            return Err(HelloError::Path { path, paths });
        }
        let params = Params {
            recv_slots: u16_(take(2)),
            slot_bytes: u32_(take(4)),
            large_slots: u16_(take(2)),
            large_bytes: u32_(take(4)),
        };
        params.validate().map_err(HelloError::Params)?;
        let endpoint = Endpoint {
            qpn: u32_(take(4)),
            psn: u32_(take(4)),
            gid: take(16).try_into().expect("16 bytes"),
            mtu: u32_(take(4)),
        };
        Ok(Hello {
            cluster_id,
            node,
            path,
            params,
            endpoint,
            regions_addr: u64_(take(8)),
            regions_rkey: u32_(take(4)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hello() -> Hello {
        Hello {
            cluster_id: 7,
            node: NodeId(3),
            path: 1,
            params: Params::default(),
            endpoint: Endpoint {
                qpn: 0x12_3456,
                psn: 0xab_cdef,
                gid: [9; 16],
                mtu: 4096,
            },
            regions_addr: 0x7f00_0000_1000,
            regions_rkey: 0xdead,
        }
    }

    #[test]
    fn a_hello_round_trips_and_each_check_refuses_its_own_fault() {
        let h = hello();
        assert_eq!(Hello::decode(&h.encode(), 7, 2), Ok(h));
        assert_eq!(
            Hello::decode(&h.encode(), 8, 2),
            Err(HelloError::Cluster { theirs: 7, ours: 8 })
        );
        assert_eq!(
            Hello::decode(&h.encode(), 7, 1),
            Err(HelloError::Path { path: 1, paths: 1 })
        );
        let mut b = h.encode();
        b[0] ^= 1;
        assert!(matches!(Hello::decode(&b, 7, 2), Err(HelloError::Magic(_))));
        let mut b = h.encode();
        b[4] = 2;
        assert_eq!(Hello::decode(&b, 7, 2), Err(HelloError::Version(2)));
        let bad = Hello {
            params: Params {
                recv_slots: 1,
                ..Params::default()
            },
            ..h
        };
        assert!(matches!(
            Hello::decode(&bad.encode(), 7, 2),
            Err(HelloError::Params(_))
        ));
    }

    proptest! {
        /// Any bytes behind a good magic, version and cluster decode to a hello or a typed refusal, never a panic;
        /// what decodes encodes back to the same bytes.
        #[test]
        fn any_bytes_decode_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), LEN)) {
            let mut b: [u8; LEN] = bytes.try_into().unwrap();
            b[..14].copy_from_slice(&hello().encode()[..14]);
            if let Ok(h) = Hello::decode(&b, 7, 2) {
                prop_assert_eq!(h.encode(), b);
            }
        }
    }
}
