//! Completions: sends done, receives fed to their connection, frames handed
//! to the application or held while its inbox is full.

use super::{Driver, Nic, NodeId, KEY_SHIFT, LOW_MASK, RECV_BIT};
use crate::net::nic::{Mem, Wc};
use crate::proto::{Completion, Incoming};
use tokio::sync::mpsc;
use weir_core::wire::Frame;

impl<N: Nic> Driver<N> {
    /// One completion.
    pub(super) fn completion(&mut self, wc: Wc) {
        let key = (wc.wr_id >> KEY_SHIFT) as u32;
        let Some(link) = self.links.get_mut(&key) else {
            // A connection closed since: its flushes.
            return;
        };
        let Some(conn) = link.conn.as_mut() else {
            return;
        };
        let low = wc.wr_id & LOW_MASK;
        let is_recv = wc.wr_id & RECV_BIT != 0;
        if !wc.ok {
            let _ = conn.complete(Completion::Error {
                wr: if is_recv { 0 } else { low },
            });
            self.close(key, false);
            return;
        }
        if !is_recv {
            let Some(wr) = link.ring.full_wr(low, LOW_MASK) else {
                // Not a send of this connection's in flight: a NIC fault.
                tracing::warn!(key, low, "completion of a send not in flight");
                self.close(key, false);
                return;
            };
            link.ring.release_through(wr);
            if conn.complete(Completion::Sent { wr }).is_err() {
                self.close(key, false);
            } else {
                self.pump(key);
            }
            return;
        }
        let slot = low as u16;
        let p = self.cfg.proto.params;
        let c = match wc.imm {
            None => {
                let off = usize::from(slot) * p.slot_bytes as usize;
                let len = (wc.byte_len as usize).min(p.slot_bytes as usize);
                Completion::Recv {
                    data: link.recv_mem.read(off, len),
                }
            }
            Some(imm) => Completion::RecvImm {
                imm,
                len: wc.byte_len,
            },
        };
        link.free_slots.push(slot);
        link.rx_bytes = link.rx_bytes.saturating_add(u64::from(wc.byte_len));
        let carries_frame = match &c {
            Completion::Recv { data } => {
                crate::proto::header::Header::decode(data).is_ok_and(|(h, _)| h.frame)
            }
            _ => true,
        };
        // Once one receive is parked every later one is too, frame or not:
        // the connection checks credits in arrival order.
        if !link.parked.is_empty() || (carries_frame && !self.held.is_empty()) {
            link.parked.push_back(c);
            return;
        }
        self.received(key, c);
    }

    /// Feed a receive completion of connection `key` to its [`Conn`].
    fn received(&mut self, key: u32, c: Completion) {
        let p = self.cfg.proto.params;
        let link = self.links.get_mut(&key).expect("live");
        let conn = link.conn.as_mut().expect("started");
        let peer = link.peer;
        let frame = match conn.complete(c) {
            Ok(Some(Incoming::Frame(f))) => Some(Ok(f)),
            Ok(Some(Incoming::Large { slot, len })) => {
                let off = self.cfg.slots_bytes() + usize::from(slot) * p.large_bytes as usize;
                let data = link.recv_mem.read(off, len as usize);
                let f = conn.take_large(slot, data);
                if f.is_ok() {
                    conn.release(slot);
                }
                Some(f)
            }
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        };
        match frame {
            Some(Ok(f)) => self.deliver(peer, f),
            Some(Err(e)) => {
                tracing::warn!(peer = %peer, %e, "RDMA peer broke the protocol");
                self.close(key, true);
                return;
            }
            None => {}
        }
        self.pump(key);
    }

    /// Hand a frame to the application, or hold it while the inbox is full.
    fn deliver(&mut self, from: NodeId, f: Frame) {
        if !self.held.is_empty() {
            self.held.push_back((from, f));
            return;
        }
        match self.inbox.try_send((from, f)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(d)) => self.held.push_back(d),
            Err(mpsc::error::TrySendError::Closed(_)) => self.inbox_closed = true,
        }
    }

    /// Move held frames into the inbox as it has room, then feed parked
    /// receives while it still has; whether anything moved.
    pub(super) fn unhold(&mut self) -> bool {
        let mut moved = false;
        while let Some(d) = self.held.pop_front() {
            match self.inbox.try_send(d) {
                Ok(()) => moved = true,
                Err(mpsc::error::TrySendError::Full(d)) => {
                    self.held.push_front(d);
                    return moved;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    self.inbox_closed = true;
                    return moved;
                }
            }
        }
        let parked: Vec<u32> = self
            .links
            .iter()
            .filter(|(_, l)| !l.parked.is_empty())
            .map(|(k, _)| *k)
            .collect();
        for key in parked {
            while self.held.is_empty() {
                let Some(c) = self.links.get_mut(&key).and_then(|l| l.parked.pop_front()) else {
                    break;
                };
                moved = true;
                self.received(key, c);
            }
        }
        moved
    }
}
