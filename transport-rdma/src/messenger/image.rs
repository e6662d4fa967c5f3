//! Images: what the simulated RC queue pairs carry, one per work request or
//! connection-manager message.
//!
//! ```text
//! tag 1 Connect   gen u64, delivered u64, params
//! tag 2 Accept    gen u64, to u64, delivered u64, params
//! tag 3 Reset     to u64
//! tag 4 SEND      from u64, to u64, the messenger's header and the frame's head
//! tag 5 WRITE_IMM from u64, to u64, immediate u32, the frame's head
//! tag 6 probe     from u64, to u64 (a zero-length RDMA WRITE)
//! params: recv_slots u16, slot_bytes u32, large_slots u16, large_bytes u32
//! ```
//!
//! Integers are little-endian. A work request's payload segment travels as the
//! image's payload, so the wire carries it without a copy. At the receiver the
//! simulated NIC places a SEND's bytes in one receive slot and a WRITE_WITH_IMM's
//! in the granted region, as a real NIC's DMA does; that placement is the
//! simulator's, not a copy weir makes.

use crate::proto::{Completion, Conn, Incoming, Op, Params, ProtoError};
use bytes::{BufMut, Bytes, BytesMut};
use weir_core::wire::Frame;

const CONNECT: u8 = 1;
const ACCEPT: u8 = 2;
const RESET: u8 = 3;
const SEND: u8 = 4;
const WRITE_IMM: u8 = 5;
const PROBE: u8 = 6;

/// A frame from the wire that is no image (only a broken or hostile host sends
/// one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not an image")]
pub struct NotAnImage;

/// A work request as it left, or as it arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    /// Leaving: the operation posted.
    Op(Op),
    /// Arrived: a SEND's bytes, as a receive slot holds them.
    Send(Bytes),
    /// Arrived: a WRITE_WITH_IMM's immediate and bytes, as the region holds them.
    Write {
        /// The immediate.
        imm: u32,
        /// The bytes written.
        data: Bytes,
    },
}

/// One image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Image {
    /// Asks for a connection.
    Connect {
        /// The asking side's connection number.
        gen: u64,
        /// Frames it delivered from the receiver's incarnation so far (so the
        /// receiver sends again only those that never arrived).
        delivered: u64,
        /// Its shape.
        params: Params,
    },
    /// Answers a `Connect`.
    Accept {
        /// The answering side's connection number.
        gen: u64,
        /// The connection number it answers.
        to: u64,
        /// Frames it delivered from the asking side's incarnation so far.
        delivered: u64,
        /// Its shape.
        params: Params,
    },
    /// The connection `to` does not exist (any more) here.
    Reset {
        /// The receiver's connection number.
        to: u64,
    },
    /// A zero-length RDMA WRITE on the connection `from` to `to`: consumes no
    /// receive, and is answered only if `to` is gone.
    Probe {
        /// The sender's connection number.
        from: u64,
        /// The receiver's.
        to: u64,
    },
    /// A work request on the connection `from` (the sender's) to `to`.
    Work {
        /// The sender's connection number.
        from: u64,
        /// The receiver's.
        to: u64,
        /// The work request.
        op: Work,
    },
}

fn put_params(b: &mut BytesMut, p: &Params) {
    b.put_u16_le(p.recv_slots);
    b.put_u32_le(p.slot_bytes);
    b.put_u16_le(p.large_slots);
    b.put_u32_le(p.large_bytes);
}

/// A cursor over an image's head.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], NotAnImage> {
        let (a, rest) = self.0.split_first_chunk::<N>().ok_or(NotAnImage)?;
        self.0 = rest;
        Ok(*a)
    }
    fn u16(&mut self) -> Result<u16, NotAnImage> {
        self.take().map(u16::from_le_bytes)
    }
    fn u32(&mut self) -> Result<u32, NotAnImage> {
        self.take().map(u32::from_le_bytes)
    }
    fn u64(&mut self) -> Result<u64, NotAnImage> {
        self.take().map(u64::from_le_bytes)
    }
    fn params(&mut self) -> Result<Params, NotAnImage> {
        Ok(Params {
            recv_slots: self.u16()?,
            slot_bytes: self.u32()?,
            large_slots: self.u16()?,
            large_bytes: self.u32()?,
        })
    }
}

/// `head` then `payload` in one piece: the simulated NIC's placement.
fn placed(head: &[u8], payload: &Bytes) -> Bytes {
    let mut b = BytesMut::with_capacity(head.len() + payload.len());
    b.put_slice(head);
    b.put_slice(payload);
    b.freeze()
}

impl Image {
    /// The image as a frame for the wire. Only a leaving work request encodes.
    pub fn encode(&self) -> Frame {
        let mut b = BytesMut::with_capacity(64);
        let mut payload = Bytes::new();
        match self {
            Image::Connect {
                gen,
                delivered,
                params,
            } => {
                b.put_u8(CONNECT);
                b.put_u64_le(*gen);
                b.put_u64_le(*delivered);
                put_params(&mut b, params);
            }
            Image::Accept {
                gen,
                to,
                delivered,
                params,
            } => {
                b.put_u8(ACCEPT);
                b.put_u64_le(*gen);
                b.put_u64_le(*to);
                b.put_u64_le(*delivered);
                put_params(&mut b, params);
            }
            Image::Reset { to } => {
                b.put_u8(RESET);
                b.put_u64_le(*to);
            }
            Image::Probe { from, to } => {
                b.put_u8(PROBE);
                b.put_u64_le(*from);
                b.put_u64_le(*to);
            }
            Image::Work { from, to, op } => {
                let Work::Op(op) = op else {
                    panic!("an arrived work request is not sent again")
                };
                match op {
                    Op::Send { header, frame, .. } => {
                        b.put_u8(SEND);
                        b.put_u64_le(*from);
                        b.put_u64_le(*to);
                        b.put_slice(header);
                        if let Some(f) = frame {
                            b.put_slice(&f.head);
                            payload = f.payload.clone();
                        }
                    }
                    Op::WriteImm { slot, frame } => {
                        b.put_u8(WRITE_IMM);
                        b.put_u64_le(*from);
                        b.put_u64_le(*to);
                        b.put_u32_le(u32::from(*slot));
                        b.put_slice(&frame.head);
                        payload = frame.payload.clone();
                    }
                }
            }
        }
        Frame {
            head: b.freeze(),
            payload,
            local: None,
        }
    }

    /// The image a frame from the wire holds; `Err` if it is none.
    pub fn decode(frame: Frame) -> Result<Image, NotAnImage> {
        let mut r = Reader(&frame.head);
        let [tag] = r.take::<1>()?;
        let image = match tag {
            CONNECT => Image::Connect {
                gen: r.u64()?,
                delivered: r.u64()?,
                params: r.params()?,
            },
            ACCEPT => Image::Accept {
                gen: r.u64()?,
                to: r.u64()?,
                delivered: r.u64()?,
                params: r.params()?,
            },
            RESET => Image::Reset { to: r.u64()? },
            PROBE => Image::Probe {
                from: r.u64()?,
                to: r.u64()?,
            },
            SEND => {
                let (from, to) = (r.u64()?, r.u64()?);
                Image::Work {
                    from,
                    to,
                    op: Work::Send(placed(r.0, &frame.payload)),
                }
            }
            WRITE_IMM => {
                let (from, to, imm) = (r.u64()?, r.u64()?, r.u32()?);
                Image::Work {
                    from,
                    to,
                    op: Work::Write {
                        imm,
                        data: placed(r.0, &frame.payload),
                    },
                }
            }
            _ => return Err(NotAnImage),
        };
        let trailing = !matches!(image, Image::Work { .. }) && !r.0.is_empty();
        if trailing {
            return Err(NotAnImage);
        }
        Ok(image)
    }
}

/// An arrived work request, through `conn` (a receive consumed): the frame it
/// completes, if any.
pub(super) fn receive(conn: &mut Conn, work: Work) -> Result<Option<Frame>, ProtoError> {
    match work {
        Work::Op(_) => Err(ProtoError::BadHeader("not an arrived work request")),
        Work::Send(data) => match conn.complete(Completion::Recv { data })? {
            Some(Incoming::Frame(f)) => Ok(Some(f)),
            _ => Ok(None),
        },
        Work::Write { imm, data } => {
            let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
            match conn.complete(Completion::RecvImm { imm, len })? {
                Some(Incoming::Large { slot, .. }) => {
                    // The region's bytes are the image's own, so the region is
                    // free again as soon as the frame is taken.
                    let f = conn.take_large(slot, data)?;
                    conn.release(slot);
                    Ok(Some(f))
                }
                _ => Ok(None),
            }
        }
    }
}
