//! The history of a run: every client operation with its invoke and completion times
//! and the values it wrote or read, plus the tagged block format that makes each
//! block a register with unique values.

use std::fmt;

/// A unique value written to one block: who wrote it, in which operation, and which
/// block of that operation. Tag 0 is the initial (all-zero) content.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tag(pub u64);

impl Tag {
    /// The value of a block never written.
    pub const INITIAL: Tag = Tag(0);

    /// The tag of block `index` of operation `seq` of client `client`.
    pub fn new(client: u16, seq: u64, index: u8) -> Tag {
        assert!(seq < 1 << 40, "operation sequence overflows the tag");
        Tag((u64::from(client) + 1) << 48 | seq << 8 | u64::from(index))
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Tag::INITIAL {
            return write!(f, "zeroes (never written)");
        }
        let client = (self.0 >> 48) - 1;
        let seq = (self.0 >> 8) & ((1 << 40) - 1);
        write!(f, "c{client}#{seq}.{}", self.0 & 0xff)
    }
}

/// What a block read back holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    /// A well-formed tagged block (or all zeroes: `Tag::INITIAL`).
    Tag(Tag),
    /// Bytes that are neither zeroes nor a whole tagged block of this address:
    /// torn, misplaced or corrupted data.
    Garbage,
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Tag(t) => t.fmt(f),
            Value::Garbage => write!(f, "garbage (torn, misplaced or corrupt)"),
        }
    }
}

fn filler(tag: Tag, lba: u64, i: usize) -> u8 {
    // splitmix64 of (tag, lba, word index): a pattern no other block shares.
    let mut z = tag.0 ^ lba.rotate_left(29) ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as u8
}

/// Fill `block` (one volume block at `lba`) with the content of `tag`.
pub fn encode_block(block: &mut [u8], tag: Tag, lba: u64) {
    assert!(block.len() >= 16, "blocks hold a 16-byte header");
    block[..8].copy_from_slice(&tag.0.to_le_bytes());
    block[8..16].copy_from_slice(&lba.to_le_bytes());
    for (i, b) in block[16..].iter_mut().enumerate() {
        *b = filler(tag, lba, i);
    }
}

/// Decode a block read from `lba`.
pub fn decode_block(block: &[u8], lba: u64) -> Value {
    if block.iter().all(|&b| b == 0) {
        return Value::Tag(Tag::INITIAL);
    }
    let tag = Tag(u64::from_le_bytes(block[..8].try_into().expect("8 bytes")));
    let at = u64::from_le_bytes(block[8..16].try_into().expect("8 bytes"));
    let intact = at == lba
        && tag != Tag::INITIAL
        && block[16..]
            .iter()
            .enumerate()
            .all(|(i, &b)| b == filler(tag, lba, i));
    if intact {
        Value::Tag(tag)
    } else {
        Value::Garbage
    }
}

/// Kind of a client operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// A read through the primary.
    Read,
    /// A write.
    Write,
}

/// One client operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpRecord {
    /// Client index.
    pub client: u16,
    /// Read or write.
    pub kind: OpKind,
    /// First volume block.
    pub lba: u64,
    /// Per block: the value written, or the value read (empty for a failed read).
    pub values: Vec<Value>,
    /// Invocation time, ns since the workload started.
    pub invoke_ns: u64,
    /// Completion time; `None` if the operation failed (a failed write may or may
    /// not have taken effect).
    pub complete_ns: Option<u64>,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// A replica's copy of a block, read back after the workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaRead {
    /// The block.
    pub lba: u64,
    /// The replica's node id.
    pub node: u32,
    /// What it holds; `None` if the read failed.
    pub value: Option<Value>,
}

/// Everything that happened in a run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// Client operations in completion order.
    pub ops: Vec<OpRecord>,
    /// The final read-back of every written block from every in-sync replica.
    pub replica_reads: Vec<ReplicaRead>,
    /// For each written block, how many replicas the final map counts as in sync
    /// (each must answer the read-back); blocks not listed expect every replica.
    pub expected_copies: std::collections::BTreeMap<u64, usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip_and_damage_is_detected() {
        let tag = Tag::new(3, 77, 1);
        let mut block = vec![0u8; 512];
        encode_block(&mut block, tag, 42);
        assert_eq!(decode_block(&block, 42), Value::Tag(tag));
        assert_eq!(decode_block(&block, 43), Value::Garbage, "misplaced block");
        block[300] ^= 1;
        assert_eq!(decode_block(&block, 42), Value::Garbage, "corrupt block");
        assert_eq!(decode_block(&[0u8; 512], 9), Value::Tag(Tag::INITIAL));
        assert_eq!(tag.to_string(), "c3#77.1");
    }
}
