//! What the crate's tests share: frames that say which they are.

use bytes::Bytes;
use weir_core::wire::{Frame, Message};
use weir_core::OpId;

/// A frame of `op` with `n` payload bytes.
pub(crate) fn frame(op: u64, n: usize) -> Frame {
    Message::fetched(OpId(op), Ok(Bytes::from(vec![op as u8; n])))
        .encode()
        .expect("encodes")
}

/// The `op` a frame of [`frame`] was made with.
pub(crate) fn op_of(f: &Frame) -> u64 {
    match Message::decode(f.clone()).expect("decodes") {
        Message::FetchBlocksOk { op, .. } => op.0,
        m => panic!("unexpected {m:?}"),
    }
}
