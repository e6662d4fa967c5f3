//! Client requests at the primary: admission (primary, epoch and lease checks),
//! then reads, writes, flushes and scrub reads are queued under the extent's
//! range lock.

use super::*;

impl Replicator {
    /// Validate a data-path request aimed at the primary of its extent.
    pub(super) fn check_primary(
        &self,
        volume: VolumeId,
        epoch: Epoch,
        lba: Lba,
        blocks: u64,
    ) -> Result<ExtentId, WeirError> {
        let extent = self.map.locate(volume, lba, blocks)?;
        let placement = self.map.extent(extent);
        if placement.primary != self.me || !placement.in_sync.contains(&self.me) {
            return Err(WeirError::NotPrimary(self.me));
        }
        // A client's older map is no harm if it is from this primary's reign
        // (this map, and the lease, are what make it the primary; a replica
        // dropped or rebuilt moves the epoch without moving the primary, and
        // should not cost every client a retry). One from before the reign may
        // be a request delayed past writes acknowledged since, and is refused; a
        // newer one means this node's map lags: it may have been deposed since.
        if epoch > placement.epoch || epoch < placement.primary_since {
            return Err(WeirError::StaleEpoch {
                got: epoch,
                current: placement.epoch,
            });
        }
        self.may_serve(extent)?;
        if self.ops.len() >= MAX_OPS_IN_FLIGHT {
            return Err(WeirError::Busy);
        }
        debug_assert!(
            self.now_ns < self.lease_end() && lba.offset(blocks) <= self.map.extent_end(extent),
            "admitted past the lease or the extent"
        );
        Ok(extent)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn client_write(
        &mut self,
        client: NodeId,
        req: RequestId,
        volume: VolumeId,
        epoch: Epoch,
        lba: Lba,
        data: Bytes,
        fua: bool,
    ) {
        let checked = self
            .map
            .blocks_in(data.len())
            .and_then(|blocks| Ok((blocks, self.check_primary(volume, epoch, lba, blocks)?)));
        let (blocks, extent) = match checked {
            Ok(ok) => ok,
            Err(e) => return self.fail(client, req, e),
        };
        // Back-pressure: a write would add a forward to each in-sync replica's
        // queue; while one of them is full, the client waits and retries.
        let in_sync = &self.map.extent(extent).in_sync;
        if self.congested.iter().any(|peer| in_sync.contains(peer)) {
            return self.fail(client, req, WeirError::Busy);
        }
        let op = self.op_id();
        let write = WriteOp::new((client, req), extent, lba, data, fua);
        self.ops.writes.insert(op, write);
        let lock = &mut self.primary_state(extent).lock;
        if lock.acquire(op, lba, lba.offset(blocks), Mode::Exclusive) {
            self.run_ready(vec![op]);
        }
    }

    pub(super) fn client_read(
        &mut self,
        client: NodeId,
        req: RequestId,
        volume: VolumeId,
        epoch: Epoch,
        lba: Lba,
        blocks: u64,
    ) {
        let extent = match self.check_primary(volume, epoch, lba, blocks) {
            Ok(extent) => extent,
            Err(e) => return self.fail(client, req, e),
        };
        let op = self.op_id();
        let read = ReadOp {
            client,
            req,
            extent,
            lba,
            blocks,
        };
        self.ops.reads.insert(op, read);
        let lock = &mut self.primary_state(extent).lock;
        if lock.acquire(op, lba, lba.offset(blocks), Mode::Shared) {
            self.run_ready(vec![op]);
        }
    }

    pub(super) fn client_flush(&mut self, client: NodeId, req: RequestId, volume: VolumeId) {
        if volume != self.map.volume().id {
            return self.fail(client, req, WeirError::UnknownVolume(volume));
        }
        if self.ops.len() >= MAX_OPS_IN_FLIGHT {
            return self.fail(client, req, WeirError::Busy);
        }
        let op = self.op_id();
        // Every node holds replicas of the one volume, so a flush reaches every node
        // that is up.
        let nodes = self.map.state().up_nodes();
        let flush = FlushOp {
            client,
            req,
            acks: Acks::new(nodes.clone(), Vec::new()),
        };
        self.ops.flushes.insert(op, flush);
        for node in nodes {
            if node == self.me {
                let io = self.io(IoPurpose::Op(op));
                self.actions.push_back(Action::Io {
                    io,
                    cmd: IoCmd::Flush,
                });
            } else {
                self.send(node, Message::ReplicaFlush { op });
            }
        }
    }

    pub(super) fn scrub_read(
        &mut self,
        client: NodeId,
        req: RequestId,
        volume: VolumeId,
        lba: Lba,
        blocks: u64,
    ) {
        let extent = match self.map.locate(volume, lba, blocks) {
            Ok(extent) => extent,
            Err(e) => return self.fail(client, req, e),
        };
        if !self.map.extent(extent).replicas.contains(&self.me) {
            return self.fail(client, req, WeirError::NotPrimary(self.me));
        }
        if self.ios.len() >= MAX_OPS_IN_FLIGHT {
            return self.fail(client, req, WeirError::Busy);
        }
        let io = self.io(IoPurpose::Scrub {
            client,
            req,
            extent,
            lba,
            blocks,
        });
        self.actions.push_back(Action::Io {
            io,
            cmd: IoCmd::Read { lba, blocks },
        });
    }

    pub(super) fn reply_read(&mut self, client: NodeId, req: RequestId, result: IoResult) {
        match result {
            IoResult::Read(data) => self.send(client, Message::ReadOk { req, data }),
            IoResult::Failed(e) => self.fail(client, req, e),
            IoResult::Done => panic!("a read for {client} {req} completed without data"),
        }
    }
}
