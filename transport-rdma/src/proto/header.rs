//! The messenger's header, in front of every SEND: what kind of message it is,
//! the credits it returns and the regions it grants.
//!
//! ```text
//! byte 0     kind: 1 a frame follows, 2 a credit update (nothing follows)
//! byte 1     n, the regions granted
//! bytes 2-3  credits returned (little-endian)
//! then       n region indices, 2 bytes each (little-endian)
//! ```
//!
//! A WRITE_WITH_IMM carries no header: its immediate is the region's index.

use super::ProtoError;
use bytes::{BufMut, Bytes, BytesMut};

const KIND_FRAME: u8 = 1;
const KIND_CREDIT: u8 = 2;
const FIXED: usize = 4;

/// A decoded header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// Whether a frame follows (else a credit update).
    pub frame: bool,
    /// Receive slots the sender posted again since its last header.
    pub credits: u16,
    /// Regions of the sender's granted to the receiver.
    pub grants: Vec<u16>,
}

/// Bytes of a header granting `grants` regions.
pub fn len(grants: usize) -> usize {
    FIXED + 2 * grants
}

/// The longest header on a connection with `large_slots` regions.
pub fn max_len(large_slots: u16) -> usize {
    len(usize::from(large_slots))
}

impl Header {
    /// The header as bytes.
    pub fn encode(&self) -> Bytes {
        debug_assert!(self.grants.len() <= usize::from(u8::MAX));
        let mut b = BytesMut::with_capacity(len(self.grants.len()));
        b.put_u8(if self.frame { KIND_FRAME } else { KIND_CREDIT });
        b.put_u8(self.grants.len() as u8);
        b.put_u16_le(self.credits);
        for &g in &self.grants {
            b.put_u16_le(g);
        }
        b.freeze()
    }

    /// The header at the front of `data`, and its length.
    pub fn decode(data: &[u8]) -> Result<(Header, usize), ProtoError> {
        let Some(fixed) = data.first_chunk::<FIXED>() else {
            return Err(ProtoError::BadHeader("shorter than a header"));
        };
        let frame = match fixed[0] {
            KIND_FRAME => true,
            KIND_CREDIT => false,
            _ => return Err(ProtoError::BadHeader("unknown kind")),
        };
        let n = usize::from(fixed[1]);
        let end = len(n);
        let Some(list) = data.get(FIXED..end) else {
            return Err(ProtoError::BadHeader("grant list cut short"));
        };
        let grants = list
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect();
        let credits = u16::from_le_bytes([fixed[2], fixed[3]]);
        Ok((
            Header {
                frame,
                credits,
                grants,
            },
            end,
        ))
    }
}
