//! Posting what a connection hands out: receives into free slots, sends
//! copied into the send ring.

use super::{recv_wr, send_wr, Driver, Nic};
use crate::net::nic::{Mem, SendOp};
use crate::proto::{Op, Post};

impl<N: Nic> Driver<N> {
    /// Post what connection `key` hands out, as far as the ring allows.
    pub(super) fn pump(&mut self, key: u32) {
        let ready = self
            .links
            .get(&key)
            .is_some_and(|l| l.ready && l.conn.is_some());
        if !ready {
            return;
        }
        loop {
            match self.pump_one(key) {
                Ok(true) => {}
                Ok(false) => return,
                Err(why) => {
                    tracing::warn!(key, %why, "RDMA post failed");
                    self.close(key, false);
                    return;
                }
            }
        }
    }

    /// Post one work request of connection `key`; whether there was one.
    pub(super) fn pump_one(&mut self, key: u32) -> Result<bool, String> {
        let link = self.links.get_mut(&key).expect("live");
        let conn = link.conn.as_mut().expect("started");
        let swr = if let Some(w) = link.unposted.take() {
            w
        } else {
            match conn.poll_post() {
                None => return Ok(false),
                Some(Post::Recv) => {
                    let slot = link
                        .free_slots
                        .pop()
                        .ok_or_else(|| "no free receive slot".to_string())?;
                    let slot_bytes = self.cfg.proto.params.slot_bytes;
                    let off = usize::from(slot) * slot_bytes as usize;
                    // SAFETY: the slot lies in the link's receive memory, which
                    // outlives its queue pair (field order), and is not read
                    // until the receive completes.
                    unsafe {
                        self.nic.post_recv(
                            &link.qp,
                            recv_wr(key, slot),
                            &link.recv_mem,
                            off,
                            slot_bytes,
                        )
                    }
                    .map_err(|e| e.0)?;
                    return Ok(true);
                }
                Some(Post::Send(w)) => w,
            }
        };
        let (op, parts): (SendOp, Vec<&[u8]>) = match &swr.op {
            Op::Send { header, frame, .. } => {
                let mut parts = vec![&header[..]];
                if let Some(f) = frame {
                    parts.extend([&f.head[..], &f.payload[..]]);
                }
                (SendOp::Send, parts)
            }
            Op::WriteImm { slot, frame } => {
                let (base, rkey, size) = link.remote;
                let op = SendOp::WriteImm {
                    // The peer's numbers, unchecked: a bad address fails its
                    // own connection at its NIC, never this driver.
                    remote_addr: base.wrapping_add(u64::from(*slot).wrapping_mul(u64::from(size))),
                    rkey,
                    imm: u32::from(*slot),
                };
                (op, vec![&frame.head[..], &frame.payload[..]])
            }
        };
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let Some(off) = link.ring.alloc(swr.wr, len) else {
            if link.ring.used() == 0 {
                return Err(format!("a {len}-byte send does not fit the send ring"));
            }
            link.unposted = Some(swr);
            return Ok(false);
        };
        link.send_mem.write(off, &parts);
        let inline = matches!(swr.op, Op::Send { inline: true, .. });
        // Signalled as the connection asks, and whenever the largest send
        // would not fit after this one: a send the ring refuses then always
        // has a completion coming that makes room.
        let signaled = swr.signaled || !link.ring.fits(link.max_post);
        // SAFETY: the piece of the ring stays unchanged until this send (or a
        // later signalled one) completes: the ring hands it out again only
        // after `release_through` passes it, and the memory outlives the queue
        // pair (field order).
        unsafe {
            self.nic.post_send(
                &link.qp,
                send_wr(key, swr.wr),
                op,
                &link.send_mem,
                off,
                len as u32,
                signaled,
                inline,
            )
        }
        .map_err(|e| e.0)?;
        link.tx_bytes = link.tx_bytes.saturating_add(len as u64);
        Ok(true)
    }
}
