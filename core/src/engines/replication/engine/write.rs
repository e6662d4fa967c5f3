//! The write path at the primary: ordering under the range lock, versions, the
//! local device write and the forwards to every in-sync replica, acknowledgements,
//! and device-write ordering per block on every node.

use super::*;

impl Replicator {
    /// Issue device write `io` once no earlier write to overlapping blocks is still
    /// on the device.
    pub(super) fn write_device(&mut self, io: IoId, cmd: IoCmd) {
        let IoCmd::Write { data, .. } = &cmd else {
            panic!("{io:?} is not a write");
        };
        let blocks = self.blocks_of(data);
        if let Some(cmd) = self.writes.submit(io, blocks, cmd) {
            self.actions.push_back(Action::Io { io, cmd });
        }
    }

    /// Issue device read `io` once every device write to its blocks in flight
    /// now has left the device: what it returns then holds them (the versions
    /// its data goes out with count them as held).
    pub(super) fn read_device(&mut self, io: IoId, cmd: IoCmd) {
        if let Some(cmd) = self.writes.submit_read(io, cmd) {
            self.actions.push_back(Action::Io { io, cmd });
        }
    }

    /// Whether a device write to any of `[lba, lba + blocks)` is in flight here:
    /// its versions are claimed already, and a failed one breaks their grains.
    pub(super) fn writing_to(&self, lba: Lba, blocks: u64) -> bool {
        self.writes.writing_to(lba, blocks)
    }

    /// Start `ready` ops (they hold their range locks), and any that become ready
    /// because one of them failed its lease check and let go of its lock.
    pub(super) fn run_ready(&mut self, ready: Vec<OpId>) {
        let mut ready = VecDeque::from(ready);
        while let Some(op) = ready.pop_front() {
            ready.extend(self.start(op));
        }
    }

    /// `op` holds its range lock: issue its I/O, unless the lease ran out while it
    /// queued; then fail it and return the ops its lock release makes ready.
    pub(super) fn start(&mut self, op: OpId) -> Vec<OpId> {
        match self.ops.kind(op) {
            Some(Kind::Write) => self.start_within_windows(op),
            Some(Kind::Read) => self.start_read(op),
            // A copy reads the primary's own data for a replica that checks the
            // epoch itself: no lease needed. First the replica is asked which
            // blocks it lacks.
            Some(Kind::Rebuild) => self.probe_chunk(op),
            Some(Kind::Repair) => {
                self.ask_next_peer(op);
                Vec::new()
            }
            Some(Kind::Fetch) => {
                let f = &self.ops.fetches[&op];
                let cmd = IoCmd::Read {
                    lba: f.lba,
                    blocks: f.blocks,
                };
                let io = self.io(IoPurpose::Op(op));
                self.actions.push_back(Action::Io { io, cmd });
                Vec::new()
            }
            Some(Kind::WriteBack) => {
                let w = &self.ops.write_backs[&op];
                let (lba, blocks) = (w.lba, w.blocks);
                self.start_reconcile_read(op, lba, blocks);
                Vec::new()
            }
            Some(Kind::Flush) => panic!("{op} cannot be started"),
            // Failed by a map change while it waited.
            None => Vec::new(),
        }
    }

    /// Write `op` holds its range lock: send it out, unless it may not be served
    /// now or was superseded (then answered at once).
    pub(super) fn start_client_write(&mut self, op: OpId) -> Vec<OpId> {
        let w = &self.ops.writes[&op];
        let (client, req, extent, lba) = (w.client, w.req, w.extent, w.lba);
        // A write may not widen the replicas' uncertain tails past what they keep
        // (see `reconcile`): it waits for the oldest to be answered.
        let refused = self.may_serve(extent).and_then(|()| {
            if self.tail_has_room(extent) {
                Ok(())
            } else {
                Err(WeirError::Busy)
            }
        });
        if let Err(e) = refused {
            self.ops.writes.remove(&op);
            self.fail(client, req, e);
            return self.release(extent, op);
        }
        if self.superseded(client, req, lba) {
            // Answered as done: it took effect before the writes that overwrote
            // it (see `applied`). It holds the range lock, so none of those is
            // still in flight here.
            self.ops.writes.remove(&op);
            self.reply(client, req, Ok(Message::WriteOk { req }));
            return self.release(extent, op);
        }
        self.start_write(op);
        Vec::new()
    }

    /// Read `op` holds its range lock: read the device, unless it may not be
    /// served now.
    fn start_read(&mut self, op: OpId) -> Vec<OpId> {
        let r = &self.ops.reads[&op];
        let (client, req, extent) = (r.client, r.req, r.extent);
        let cmd = IoCmd::Read {
            lba: r.lba,
            blocks: r.blocks,
        };
        if let Err(e) = self.may_serve(extent) {
            self.ops.reads.remove(&op);
            self.fail(client, req, e);
            return self.release(extent, op);
        }
        let io = self.io(IoPurpose::Op(op));
        self.actions.push_back(Action::Io { io, cmd });
        Vec::new()
    }

    pub(super) fn start_write(&mut self, op: OpId) {
        let (client, req, extent, lba, data, fua) = self.begin_write(op);
        let version = self.next_version(extent);
        let settled = self.settled(extent);
        let blocks = self.blocks_of(&data);
        let prev = self.grains.prev(lba, blocks);
        let placement = self.map.extent(extent).clone();
        // The client's front end may hold the data (see `front_end`), unless this
        // is a second attempt of a request this node ran already: the client timed
        // out and sent it again while the first ran, and it may start after the
        // first was answered and the front end let go of the data.
        let held_by = (self.config.front_end_payloads && self.applied.get((client, req)).is_none())
            .then_some(client);
        self.ops
            .writes
            .get_mut(&op)
            .expect("a write being started")
            .version = version;
        let forward = self.forward_to(&placement);
        // Left out for the node of the front end holding it, if in sync: only
        // an in-sync replica's ack holds the client's answer, and with it the
        // front end's payload.
        let elide = |to: NodeId| {
            held_by == Some(crate::ids::front_end_of(to)) && placement.in_sync.contains(&to)
        };
        let sent = forward
            .iter()
            .map(|&to| (to, if elide(to) { 0 } else { data.len() as u64 }))
            .collect();
        self.forwards.took(op, sent);
        self.expect_acks(op, extent, &placement, &forward);
        self.note_write(
            (client, req),
            extent,
            (lba, blocks),
            (version, prev),
            settled,
        );
        let io = self.io(IoPurpose::Op(op));
        self.write_device(
            io,
            IoCmd::Write {
                lba,
                data: data.clone(),
                fua,
            },
        );
        for &to in &forward {
            let elide = elide(to);
            let msg = Message::ReplicaWrite {
                op,
                extent,
                epoch: placement.epoch,
                version,
                prev,
                settled,
                origin: (client, req),
                lba,
                data: if elide { Bytes::new() } else { data.clone() },
                fua,
            };
            self.send(to, msg);
        }
        debug_assert!(
            self.primary[&extent].unsettled.contains(&version) && self.writing_to(lba, blocks),
            "{op} sent out but not unanswered or not on the device"
        );
    }

    /// Mark write `op` started now; its client, request, extent, first block,
    /// data and FUA flag.
    fn begin_write(&mut self, op: OpId) -> (NodeId, RequestId, ExtentId, Lba, Bytes, bool) {
        let now_ns = self.now_ns;
        let w = self.ops.writes.get_mut(&op).expect("a write being started");
        assert!(w.acks.is_none(), "{op} started twice");
        w.started_ns = now_ns;
        (w.client, w.req, w.extent, w.lba, w.data.clone(), w.fua)
    }

    /// The extent's next version, given out in order under its lock.
    fn next_version(&mut self, extent: ExtentId) -> Version {
        let state = self
            .primary
            .get_mut(&extent)
            .expect("locked extent has state");
        let version = state.last_version.next();
        debug_assert!(version > state.last_version);
        state.last_version = version;
        state.unsettled.insert(version);
        version
    }

    /// The replicas a write goes to: every in-sync and rebuilding one but this node.
    pub(super) fn forward_to(&self, placement: &crate::control::state::ExtentState) -> Vec<NodeId> {
        let mut forward: Vec<NodeId> = placement
            .replicas
            .iter()
            .copied()
            .filter(|n| {
                *n != self.me && (placement.in_sync.contains(n) || placement.rebuilding.contains(n))
            })
            .collect();
        if self.config.bugs().skip_last_replica {
            forward.pop();
        }
        forward
    }

    /// Who write `op` waits for: the client's ack waits for the in-sync replicas
    /// and this node (and a rebuilt replica about to join); the rebuilding ones
    /// get it too but are not counted on.
    fn expect_acks(
        &mut self,
        op: OpId,
        extent: ExtentId,
        placement: &crate::control::state::ExtentState,
        forward: &[NodeId],
    ) {
        let mut expect: Vec<NodeId> = forward
            .iter()
            .copied()
            .filter(|n| placement.in_sync.contains(n))
            .collect();
        expect.push(self.me);
        let extra = forward
            .iter()
            .copied()
            .filter(|n| !expect.contains(n))
            .collect();
        let mut acks = Acks::new(expect, extra);
        for node in self.rebuild.joining(extent) {
            acks.promote(node);
        }
        for &node in &acks.extra {
            self.rebuild.forwarded(node, op, extent, self.now_ns);
        }
        let w = self.ops.writes.get_mut(&op).expect("a write being started");
        w.acks = Some(acks);
    }

    /// Record write `origin` of `version` to `blocks` at `lba` (`prev`: the
    /// grains' versions before it): its grains' versions, its place in the
    /// uncertain tail and, in the applied log, its request (so a retry is not
    /// applied twice).
    fn note_write(
        &mut self,
        origin: (NodeId, RequestId),
        extent: ExtentId,
        (lba, blocks): (Lba, u64),
        (version, prev): (Version, (Version, Version)),
        settled: Version,
    ) {
        if let Err(e) = self.grains.claim(lba, blocks, version, prev) {
            // The primary gives out versions in order under the lock; a regression
            // here means its own state is corrupt.
            panic!("primary {} version regression at {lba}: {e}", self.me);
        }
        let internal = origin.0 == self.me;
        if !internal {
            // Should this node be deposed, the new primary learns of it.
            self.reconcile
                .note_tail(extent, version, lba, blocks, settled);
        }
        self.note_applied(origin, self.me, lba, blocks, version);
    }

    /// Log write `origin` of `version` to `blocks` at `lba` as applied here. A
    /// write-back (from `primary` itself) carries the version of its data as its
    /// request id: that is the version its blocks' data has.
    pub(super) fn note_applied(
        &mut self,
        origin: (NodeId, RequestId),
        primary: NodeId,
        lba: Lba,
        blocks: u64,
        version: Version,
    ) {
        let internal = origin.0 == primary;
        let write = applied::Applied {
            lba,
            blocks,
            version: if internal {
                Version(origin.1 .0)
            } else {
                version
            },
        };
        let origin = (!internal).then_some(origin);
        self.applied.note(origin, write, self.now_ns);
    }

    pub(super) fn local_io_done(&mut self, op: OpId, result: IoResult) {
        match self.ops.kind(op) {
            Some(Kind::Write) => {
                let w = &self.ops.writes[&op];
                let result = io_unit(result);
                if result.is_ok() {
                    let fact = Audit::Persisted {
                        lba: w.lba,
                        blocks: self.blocks_of(&w.data),
                        version: w.version,
                        at_ns: self.now_ns,
                    };
                    self.audit(fact);
                }
                self.write_acked(self.me, op, result)
            }
            Some(Kind::Flush) => self.flush_acked(self.me, op, io_unit(result)),
            Some(Kind::Read) => {
                if let IoResult::Failed(e @ WeirError::Device(DevError::Media(_))) = &result {
                    return self.repair_read(op, e.clone());
                }
                let r = self.ops.reads.remove(&op).expect("a read");
                self.reply_read(r.client, r.req, result);
                self.unlock(r.extent, op);
            }
            Some(Kind::Rebuild) => self.rebuild_read_done(op, result),
            Some(Kind::Repair) => self.repair_written(op, result),
            Some(Kind::Fetch) => self.fetch_read_done(op, result),
            Some(Kind::WriteBack) => self.reconcile_read_done(op, result),
            // The op was failed by a map change while its I/O ran.
            None => tracing::debug!(%op, "completion for an op already failed"),
        }
    }

    /// One replica (or the local device) reported on write `op`.
    pub(super) fn write_acked(&mut self, from: NodeId, op: OpId, result: Result<(), WeirError>) {
        self.forwards.answered(op, from);
        self.count_write_ack(from, op, result);
        // The answer made room in `from`'s window.
        self.start_waiting_forwards();
    }

    fn count_write_ack(&mut self, from: NodeId, op: OpId, result: Result<(), WeirError>) {
        if self.rebuild_replica_acked(from, op, result.is_err()) && !self.ops.contains(op) {
            return; // A rebuilding replica's late ack of a finished write.
        }
        let Some(WriteOp {
            acks: Some(acks),
            extent,
            ..
        }) = self.ops.writes.get_mut(&op)
        else {
            tracing::warn!(%from, %op, "ack for no running write; dropped");
            return;
        };
        if from != self.me
            && matches!(
                result,
                Err(WeirError::Device(_) | WeirError::PayloadNotHeld | WeirError::Busy)
            )
            && acks.waiting.contains(&from)
        {
            // A replica whose device failed the write (or is gone), whose device
            // queue refused it (`Busy`: the scheduler's bound), or that lacks its
            // data (its front end gave the request up), does not fail it for the
            // client: like a silent one, it is dropped from the in-sync set, and
            // the write is acknowledged without it (it rebuilds later). Kept in
            // sync, it would lack a write the others hold.
            let (extent, epoch) = (*extent, self.map.extent(*extent).epoch);
            return self.ask_drop(extent, epoch, from, "it could not apply a write");
        }
        if let Some(outcome) = acks.count(from, op, result) {
            return self.finish_write(op, outcome);
        }
        if self.config.bugs().ack_before_slowest && acks.waiting.len() == 1 && acks.error.is_none()
        {
            if let Some(outcome) = acks.retain(|_| false) {
                self.finish_write(op, outcome);
            }
        }
    }

    /// Every in-sync replica has answered write `op`: reply and release its range.
    pub(super) fn finish_write(&mut self, op: OpId, outcome: Result<(), WeirError>) {
        let WriteOp {
            client,
            req,
            extent,
            lba,
            data,
            version,
            ..
        } = self.ops.writes.remove(&op).expect("a running write");
        self.forwards.ended(op);
        if outcome.is_ok() {
            let placement = self.map.extent(extent);
            let fact = Audit::Acked {
                extent,
                lba,
                blocks: self.blocks_of(&data),
                version,
                at_ns: self.now_ns,
                in_sync: placement.in_sync.iter().copied().collect(),
            };
            self.audit(fact);
        }
        if let Some(state) = self.primary.get_mut(&extent) {
            state.unsettled.remove(&version);
        }
        if client == self.me {
            // A reconciliation's write-back.
            self.reconcile_pushed(extent);
        } else {
            self.reply(client, req, outcome.map(|()| Message::WriteOk { req }));
        }
        self.unlock(extent, op);
        self.start_waiting_forwards();
    }

    pub(super) fn flush_acked(&mut self, from: NodeId, op: OpId, result: Result<(), WeirError>) {
        let Some(FlushOp { acks, .. }) = self.ops.flushes.get_mut(&op) else {
            tracing::warn!(%from, %op, "ack for no running flush; dropped");
            return;
        };
        let Some(outcome) = acks.count(from, op, result) else {
            return;
        };
        let FlushOp { client, req, .. } = self.ops.flushes.remove(&op).expect("found above");
        self.reply(client, req, outcome.map(|()| Message::FlushOk { req }));
    }

    /// The primary state of `extent`, created on first use. A node that becomes
    /// primary (at start, or by failover) numbers its writes above the extent's
    /// epoch floor and above the highest version it holds, so versions never go
    /// back.
    pub(super) fn primary_state(&mut self, extent: ExtentId) -> &mut PrimaryExtent {
        if !self.primary.contains_key(&extent) {
            let start = self.map.extent_start(extent);
            let end = self.map.extent_end(extent);
            let mut epoch = self.map.extent(extent).epoch;
            if let Some(&restored) = self.restored.get(&extent) {
                epoch = epoch.max(restored.next());
            }
            let floor = Version::epoch_floor(epoch);
            let (from, to) = (self.grains.grain_of(start), self.grains.grain_of(end));
            let last_version = self.grains.max_version(from, to).max(floor);
            let state = PrimaryExtent {
                last_version,
                lock: RangeLock::default(),
                unsettled: Default::default(),
            };
            self.primary.insert(extent, state);
        }
        self.primary.get_mut(&extent).expect("inserted above")
    }

    pub(super) fn unlock(&mut self, extent: ExtentId, op: OpId) {
        let ready = self.release(extent, op);
        self.run_ready(ready);
    }

    /// Release `op`'s range lock; returns the ops that now hold theirs.
    pub(super) fn release(&mut self, extent: ExtentId, op: OpId) -> Vec<OpId> {
        let state = self
            .primary
            .get_mut(&extent)
            .expect("locked extent has state");
        let ready = state.lock.release(op);
        debug_assert!({
            state.lock.self_check();
            true
        });
        ready
    }
}
