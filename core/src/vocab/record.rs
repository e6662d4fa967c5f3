//! Framed records: the unit of weir's durable metadata files (a member's Raft log,
//! a node's block-version checkpoints).
//!
//! ```text
//! | len: u32 LE | crc32 of payload: u32 LE | payload |
//! ```
//!
//! A file is a sequence of records, appended and made durable one at a time. A
//! crash in the middle of an append leaves a torn or corrupt tail: reading stops
//! at the first record that does not check, and [`Frames::valid_len`] says where
//! the intact records end, so the owner can cut the file there.

/// Bytes of a record's header (length and checksum).
pub const RECORD_HEADER: usize = 8;
/// Largest payload a reader accepts (a bound on what a corrupt length can ask).
pub const MAX_RECORD_BYTES: usize = 64 << 20;

/// One record holding `payload`.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEADER + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// The intact records of a file's bytes, in order.
#[derive(Debug)]
pub struct Frames<'a> {
    bytes: &'a [u8],
    /// Bytes of the records returned so far.
    valid_len: usize,
}

impl<'a> Frames<'a> {
    /// Read records from `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Frames {
            bytes,
            valid_len: 0,
        }
    }

    /// Bytes from the start up to the end of the last record returned.
    pub fn valid_len(&self) -> usize {
        self.valid_len
    }
}

impl<'a> Iterator for Frames<'a> {
    type Item = &'a [u8];

    /// The next record's payload; `None` at the end or at the first torn, corrupt
    /// or oversized record.
    fn next(&mut self) -> Option<&'a [u8]> {
        let at = self.valid_len;
        let header = self.bytes.get(at..at + RECORD_HEADER)?;
        let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        if len > MAX_RECORD_BYTES {
            return None;
        }
        let payload = self
            .bytes
            .get(at + RECORD_HEADER..at + RECORD_HEADER + len)?;
        if crc32fast::hash(payload) != crc {
            return None;
        }
        self.valid_len = at + RECORD_HEADER + len;
        Some(payload)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_until_a_torn_or_corrupt_one() {
        let mut file = frame(b"one");
        file.extend(frame(b""));
        file.extend(frame(b"three"));
        let intact = file.len();
        let got: Vec<&[u8]> = Frames::new(&file).collect();
        assert_eq!(got, vec![&b"one"[..], b"", b"three"]);

        let torn = frame(b"four");
        file.extend_from_slice(&torn[..torn.len() - 1]);
        let mut frames = Frames::new(&file);
        assert_eq!(frames.by_ref().count(), 3);
        assert_eq!(frames.valid_len(), intact);

        let mut flipped = frame(b"one");
        *flipped.last_mut().unwrap() ^= 1;
        let mut frames = Frames::new(&flipped);
        assert_eq!(frames.next(), None);
        assert_eq!(frames.valid_len(), 0);

        let mut huge = u32::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(&[0; 12]);
        assert_eq!(Frames::new(&huge).next(), None);
        assert_eq!(Frames::new(&[1, 2, 3]).next(), None);
    }
}
