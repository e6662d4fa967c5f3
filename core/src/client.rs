//! The client library: a volume as seen by an application.
//!
//! `Volume::read/write/flush` find the primary of each extent from the cluster map,
//! split requests at extent boundaries, send them with fresh request ids and match
//! replies by id. One task receives all replies and hands each to its waiter.

use crate::error::WeirError;
use crate::ids::{Lba, NodeId, RequestId};
use crate::map::ClusterMap;
use crate::transport::{Transport, TransportError};
use crate::wire::{EncodeError, Message};
use bytes::{Bytes, BytesMut};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Why a client request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The cluster answered with an error.
    #[error(transparent)]
    Weir(#[from] WeirError),
    /// The request could not be sent.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// The request could not be encoded (too large).
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The reply did not match the request (a protocol violation by the node).
    #[error("unexpected reply {0}")]
    UnexpectedReply(&'static str),
    /// The reply task stopped: the transport closed.
    #[error("client closed")]
    Closed,
}

/// Requests waiting for a reply: the node asked, and where the reply goes. `None`
/// once the reply task has stopped, so later calls fail at once instead of waiting.
type Waiters = Arc<Mutex<Option<BTreeMap<RequestId, (NodeId, oneshot::Sender<Message>)>>>>;

/// A handle on one volume.
pub struct Volume<T> {
    transport: Arc<T>,
    map: ClusterMap,
    next_req: AtomicU64,
    waiters: Waiters,
}

impl<T: Transport> Volume<T> {
    /// Open the map's volume over `transport`. Spawns the reply task.
    pub fn open(transport: Arc<T>, map: ClusterMap) -> Arc<Self> {
        let waiters: Waiters = Arc::new(Mutex::new(Some(BTreeMap::new())));
        let volume = Arc::new(Volume {
            transport: transport.clone(),
            map,
            next_req: AtomicU64::new(1),
            waiters: waiters.clone(),
        });
        tokio::spawn(async move {
            while let Ok((from, frame)) = transport.recv().await {
                let msg = match Message::decode(&frame) {
                    Ok(msg) => msg,
                    Err(e) => {
                        tracing::warn!(%from, error = %e, "undecodable reply dropped");
                        continue;
                    }
                };
                let req = match &msg {
                    Message::ReadOk { req, .. }
                    | Message::WriteOk { req }
                    | Message::FlushOk { req }
                    | Message::Failed { req, .. } => *req,
                    _ => {
                        tracing::warn!(%from, "non-reply message sent to a client; dropped");
                        continue;
                    }
                };
                let mut guard = waiters.lock().expect("waiters lock");
                let map = guard.as_mut().expect("open while the task runs");
                match map.get(&req) {
                    Some((asked, _)) if *asked == from => {
                        let (_, tx) = map.remove(&req).expect("present");
                        let _ = tx.send(msg);
                    }
                    Some((asked, _)) => {
                        tracing::warn!(%from, %asked, %req, "reply from a node not asked; dropped")
                    }
                    None => tracing::warn!(%from, %req, "reply to no request; dropped"),
                }
            }
            // Dropping the senders wakes every waiter with `Closed`; later calls fail.
            waiters.lock().expect("waiters lock").take();
        });
        volume
    }

    /// The cluster map in use.
    pub fn map(&self) -> &ClusterMap {
        &self.map
    }

    /// Block size in bytes.
    pub fn block_size(&self) -> usize {
        self.map.volume().block_size as usize
    }

    /// Write `data` (whole blocks) at `lba`.
    pub async fn write(&self, lba: Lba, data: Bytes, fua: bool) -> Result<(), ClientError> {
        let blocks = (data.len() / self.block_size()) as u64;
        if data.is_empty() || !data.len().is_multiple_of(self.block_size()) {
            let v = self.map.volume();
            return Err(WeirError::BadLength {
                len: data.len() as u64,
                block_size: v.block_size,
                max_bytes: v.max_request_bytes(),
            }
            .into());
        }
        for (start, count) in self.split(lba, blocks)? {
            let from = ((start.0 - lba.0) as usize) * self.block_size();
            let chunk = data.slice(from..from + count as usize * self.block_size());
            let extent = self.map.extent(self.map.extent_of(start));
            let (to, epoch) = (extent.primary, extent.epoch);
            let reply = self
                .call(to, |req| Message::Write {
                    req,
                    volume: self.map.volume().id,
                    epoch,
                    lba: start,
                    data: chunk,
                    fua,
                })
                .await?;
            match reply {
                Message::WriteOk { .. } => {}
                _ => return Err(ClientError::UnexpectedReply("to a write")),
            }
        }
        Ok(())
    }

    /// Read `blocks` blocks at `lba` from the primaries.
    pub async fn read(&self, lba: Lba, blocks: u64) -> Result<Bytes, ClientError> {
        let mut out = BytesMut::new();
        for (start, count) in self.split(lba, blocks)? {
            let extent = self.map.extent(self.map.extent_of(start));
            let (to, epoch) = (extent.primary, extent.epoch);
            let reply = self
                .call(to, |req| Message::Read {
                    req,
                    volume: self.map.volume().id,
                    epoch,
                    lba: start,
                    blocks: count as u32,
                })
                .await?;
            out.extend_from_slice(&self.expect_data(reply, count)?);
        }
        Ok(out.freeze())
    }

    /// Read `blocks` blocks at `lba` from `node`'s own replica, bypassing the primary.
    /// The range must lie in one extent that `node` holds.
    pub async fn scrub_read(
        &self,
        node: NodeId,
        lba: Lba,
        blocks: u64,
    ) -> Result<Bytes, ClientError> {
        self.map.locate(self.map.volume().id, lba, blocks)?;
        let reply = self
            .call(node, |req| Message::ScrubRead {
                req,
                volume: self.map.volume().id,
                lba,
                blocks: blocks as u32,
            })
            .await?;
        self.expect_data(reply, blocks)
    }

    /// Flush every replica of the volume.
    pub async fn flush(&self) -> Result<(), ClientError> {
        let to = self.map.nodes()[0];
        let reply = self
            .call(to, |req| Message::Flush {
                req,
                volume: self.map.volume().id,
            })
            .await?;
        match reply {
            Message::FlushOk { .. } => Ok(()),
            _ => Err(ClientError::UnexpectedReply("to a flush")),
        }
    }

    /// Split `[lba, lba + blocks)` at extent boundaries and request-size limits,
    /// after checking the whole range is inside the volume.
    fn split(&self, lba: Lba, blocks: u64) -> Result<Vec<(Lba, u64)>, WeirError> {
        let v = self.map.volume();
        match lba.0.checked_add(blocks) {
            Some(end) if blocks > 0 && end <= v.capacity_blocks => {}
            _ => {
                return Err(WeirError::OutOfRange {
                    lba,
                    blocks,
                    capacity: v.capacity_blocks,
                })
            }
        }
        let mut parts = Vec::new();
        let (mut at, end) = (lba, lba.offset(blocks));
        while at < end {
            let stop = self
                .map
                .extent_end(self.map.extent_of(at))
                .min(end)
                .min(at.offset(u64::from(v.max_request_blocks)));
            parts.push((at, stop.0 - at.0));
            at = stop;
        }
        Ok(parts)
    }

    fn expect_data(&self, reply: Message, blocks: u64) -> Result<Bytes, ClientError> {
        match reply {
            Message::ReadOk { data, .. } if data.len() == blocks as usize * self.block_size() => {
                Ok(data)
            }
            Message::ReadOk { .. } => Err(ClientError::UnexpectedReply("read of the wrong length")),
            _ => Err(ClientError::UnexpectedReply("to a read")),
        }
    }

    /// Send one request and wait for its reply; `Failed` becomes an error.
    async fn call(
        &self,
        to: NodeId,
        make: impl FnOnce(RequestId) -> Message,
    ) -> Result<Message, ClientError> {
        let req = RequestId(self.next_req.fetch_add(1, Ordering::Relaxed));
        let frame = make(req).encode()?;
        let (tx, rx) = oneshot::channel();
        match self.waiters.lock().expect("waiters lock").as_mut() {
            Some(map) => map.insert(req, (to, tx)),
            None => return Err(ClientError::Closed),
        };
        if let Err(e) = self.transport.send(to, frame).await {
            if let Some(map) = self.waiters.lock().expect("waiters lock").as_mut() {
                map.remove(&req);
            }
            return Err(e.into());
        }
        match rx.await.map_err(|_| ClientError::Closed)? {
            Message::Failed { error, .. } => Err(error.into()),
            reply => Ok(reply),
        }
    }
}
