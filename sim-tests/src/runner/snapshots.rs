//! The snapshot stage (`[snapshots]`): a front end on a client host of its own
//! drives a thin named volume at the pool's end through weir-core's
//! `NamedVolumes`, asking the nodes for map changes (as the workload's
//! clients do). One writer writes tagged blocks one at a time
//! while snapshots are taken (at the plan's crashes, so a primary may crash
//! during one, and spread over the run); then a clone of the first snapshot
//! is written, the other snapshots read, one deleted and an extent trimmed;
//! the freed extents are zeroed (as a node's reclaimer does) and the trimmed
//! extent written again, so it takes a zeroed one.
//!
//! The checker: a snapshot taken between `t_req` (asked) and `t_ret` (its
//! barrier done) holds, for every block, the value of the block's last write
//! acknowledged before `t_req`, or of a write of it that started before
//! `t_ret` and was not acknowledged before `t_req` (a failed write may land
//! any time later). Every read of the volume, a snapshot or the clone must
//! hold such a value; a snapshot read after the clone wrote must equal its
//! read before, and the clone must read the snapshot's blocks where it did
//! not write them.

use super::cluster::Nodes;
use crate::checker::Verdict;
use crate::history::{decode_block, encode_block, Tag, Value};
use crate::scenario::Scenario;
use bytes::{Bytes, BytesMut};
use madsim::rand::{thread_rng, Rng};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use weir_core::client::{ClientError, Volume};
use weir_core::control::state::ClusterState;
use weir_core::control::Command;
use weir_core::map::ClusterMap;
use weir_core::named::{Control, NamedVolumes, Target};
use weir_transport_sim::SimTransport;

/// The stage's volume and its clone.
const VOLUME: &str = "snap";
const CLONE: &str = "snapclone";
/// The tags' client number (the workload's clients number from 0 up).
const WRITER: u16 = 4000;
const CLONE_WRITER: u16 = 4001;
/// How long a map change may take before the stage says so.
const COMMIT_BUDGET: Duration = Duration::from_secs(5);
/// Writes into the clone.
const CLONE_WRITES: u64 = 16;
/// Writes into the trimmed extent once the freed extents are zeroed.
const REUSE_WRITES: u64 = 8;
const REUSE_WRITER: u16 = 4002;

/// One write of the writer: which block, what, when, and how it ended.
#[derive(Clone, Copy, Debug)]
struct Write {
    block: u64,
    /// `Tag::INITIAL` for a TRIM.
    tag: Tag,
    invoke_ns: u64,
    /// When acknowledged; `None` if it failed (it may land any time later).
    ack_ns: Option<u64>,
}

/// A snapshot taken: when asked and when its barrier was done (`None`: not
/// seen to finish).
#[derive(Clone, Debug)]
struct Taken {
    name: String,
    req_ns: u64,
    ret_ns: Option<u64>,
}

/// What the stage saw, for the checker.
#[derive(Debug, Default)]
struct Log {
    writes: Vec<Write>,
    taken: Vec<Taken>,
    problems: Vec<String>,
    /// Freed extents zeroed and handed back to the pool.
    reclaimed: usize,
}

impl Log {
    /// The values block `block` may hold in a snapshot asked at `req` and
    /// done at `ret` (a read of the volume is one with both at its time).
    fn allowed(&self, block: u64, req: u64, ret: u64) -> Vec<Tag> {
        let of_block: Vec<&Write> = self.writes.iter().filter(|w| w.block == block).collect();
        let base = of_block
            .iter()
            .rposition(|w| w.ack_ns.is_some_and(|a| a < req));
        let mut out = vec![base.map_or(Tag::INITIAL, |i| of_block[i].tag)];
        let after = base.map_or(0, |i| i + 1);
        out.extend(
            of_block[after..]
                .iter()
                .filter(|w| w.invoke_ns < ret)
                .map(|w| w.tag),
        );
        out
    }

    /// Check `data`, read of the volume as of (`req`, `ret`), block by block;
    /// `what` names it.
    fn check(&mut self, what: &str, data: &[u8], block_bytes: usize, (req, ret): (u64, u64)) {
        for (b, bytes) in data.chunks(block_bytes).enumerate() {
            let b = b as u64;
            let allowed = self.allowed(b, req, ret);
            match decode_block(bytes, b) {
                Value::Tag(t) if allowed.contains(&t) => {}
                got => {
                    self.problems.push(format!(
                        "{what}: block {b} holds {got}, may hold only {}",
                        allowed
                            .iter()
                            .map(|t| t.to_string())
                            .collect::<Vec<_>>()
                            .join(" or ")
                    ));
                    return;
                }
            }
        }
    }
}

/// The stage's volume.
fn the_volume() -> Target {
    Target {
        name: VOLUME.into(),
        snap: None,
        id: None,
    }
}

/// Write block `block` (of `bs` bytes) of the stage's volume with `tag`;
/// the write as the log keeps it.
async fn tagged_write(
    named: &NamedVolumes<SimTransport>,
    tag: Tag,
    (block, bs): (u64, u64),
    epoch: Instant,
) -> Write {
    let mut data = BytesMut::zeroed(bs as usize);
    encode_block(&mut data, tag, block);
    let invoke_ns = ns_since(epoch);
    let r = named
        .write(&the_volume(), block * bs, data.freeze(), false)
        .await;
    Write {
        block,
        tag,
        invoke_ns,
        ack_ns: r.is_ok().then(|| ns_since(epoch)),
    }
}

fn ns_since(epoch: Instant) -> u64 {
    Instant::now().saturating_duration_since(epoch).as_nanos() as u64
}

/// Ask for `command` until the map shows `done` (or the budget runs out).
async fn commit(control: &Nodes, command: Command, done: impl Fn(&ClusterState) -> bool) -> bool {
    let deadline = Instant::now() + COMMIT_BUDGET;
    let mut ask = Instant::now();
    while Instant::now() < deadline {
        if done(&control.state()) {
            return true;
        }
        // Asked every 20 ms (a request can be lost with its node), looked
        // for every millisecond (a snapshot's return time bounds the writes
        // that may be in it).
        if Instant::now() >= ask {
            control.request(command.clone());
            ask = Instant::now() + Duration::from_millis(20);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    false
}

/// Run the stage from `epoch` until `deadline`, snapshots at `at` (from
/// `epoch`); its verdict.
pub(super) async fn run(
    (transport, handles, map): (Arc<SimTransport>, super::cluster::Handles, ClusterMap),
    scenario: &Scenario,
    (epoch, deadline): (Instant, Instant),
    at: Vec<Duration>,
) -> Verdict {
    let stage = Stage::open((transport, handles, map), scenario, epoch);
    let mut log = Log::default();
    let create = Command::CreateNamed {
        name: VOLUME.into(),
        size_bytes: stage.blocks * stage.bs,
        extents: scenario.snapshots.extents,
        qos: Default::default(),
        key_check: None,
        thin: true,
    };
    if !commit(&stage.control, create, |s| s.named.contains_key(VOLUME)).await {
        log.problems
            .push("the stage's volume was not created".into());
    }
    let mut log = stage.write_while_snapshotting(log, deadline, at).await;
    let taken: Vec<Taken> = log.taken.clone();
    if let Some(first) = stage.read_snapshots(&mut log, &taken).await {
        stage.write_a_clone(&mut log, first).await;
    }
    stage.delete_and_trim(&mut log, taken.last()).await;
    log.reclaimed = stage.reclaim_and_reuse(&mut log).await;
    let now = ns_since(epoch);
    match stage.read(the_volume()).await {
        Ok(data) => log.check("the volume", &data, stage.bs as usize, (now, now)),
        Err(e) => log.problems.push(format!("the volume unreadable: {e}")),
    }
    Verdict {
        name: "snapshots",
        scope: format!(
            "{} writes, {} snapshots, a clone, {} freed extents zeroed, a volume of {} blocks",
            log.writes.len(),
            log.taken.len(),
            log.reclaimed,
            stage.blocks
        ),
        violations: log.problems,
    }
}

/// The stage's front end and its volume's geometry.
struct Stage {
    named: Arc<NamedVolumes<SimTransport>>,
    control: Arc<Nodes>,
    /// Blocks of the volume, bytes of a block and of an extent.
    blocks: u64,
    bs: u64,
    extent_bytes: u64,
    /// Times count from here.
    epoch: Instant,
}

impl Stage {
    /// The stage's front end on `transport`, asking the nodes of `handles`.
    fn open(
        (transport, handles, map): (Arc<SimTransport>, super::cluster::Handles, ClusterMap),
        scenario: &Scenario,
        epoch: Instant,
    ) -> Stage {
        let c = &scenario.cluster;
        let extent_bytes = c.extent_mib << 20;
        let bs = u64::from(c.block_size);
        let control = Arc::new(Nodes(handles));
        let options = weir_core::client::ClientOptions {
            flow: scenario.flow,
            ..Default::default()
        };
        let volume = Volume::open_with(transport, map, thread_rng().gen(), options);
        let mut named = NamedVolumes::new(volume, control.clone(), extent_bytes);
        if scenario.bugs.leak_into_snapshot {
            named = named.with_bug_leak_into_snapshot();
        }
        Stage {
            named: Arc::new(named),
            control,
            blocks: scenario.snapshots.extents * extent_bytes / bs,
            bs,
            extent_bytes,
            epoch,
        }
    }

    /// The writer writes until `deadline` while snapshots are taken at `at`.
    async fn write_while_snapshotting(
        &self,
        log: Log,
        deadline: Instant,
        at: Vec<Duration>,
    ) -> Log {
        let log = Arc::new(std::sync::Mutex::new(log));
        let (epoch, blocks, bs) = (self.epoch, self.blocks, self.bs);
        let writer = {
            let (named, log) = (self.named.clone(), log.clone());
            tokio::spawn(async move {
                let mut seq = 0u64;
                while Instant::now() < deadline {
                    seq += 1;
                    let block = thread_rng().gen_range(0..blocks);
                    let write =
                        tagged_write(&named, Tag::new(WRITER, seq, 0), (block, bs), epoch).await;
                    log.lock().expect("log").writes.push(write);
                }
            })
        };
        for (i, after) in at.iter().enumerate() {
            weir_core::time::sleep_until_exact(epoch + *after).await;
            let taken = self.snapshot(format!("s{i}")).await;
            log.lock().expect("log").taken.push(taken);
        }
        writer.await.expect("the writer");
        Arc::try_unwrap(log)
            .expect("the writer is done")
            .into_inner()
            .expect("log")
    }

    /// Take snapshot `name` of the volume and wait out its barrier.
    async fn snapshot(&self, name: String) -> Taken {
        let req_ns = ns_since(self.epoch);
        let command = Command::Snapshot {
            name: VOLUME.into(),
            snap: name.clone(),
        };
        let taken = commit(&self.control, command, |s| {
            s.named
                .get(VOLUME)
                .is_some_and(|v| v.snapshots.contains_key(&name))
        })
        .await;
        let ret_ns = match taken {
            true => (self.named.barrier(VOLUME).await.ok()).map(|()| ns_since(self.epoch)),
            false => None,
        };
        Taken {
            name,
            req_ns,
            ret_ns,
        }
    }

    /// Whether the volume has snapshot `snap` now.
    fn exists(&self, snap: &str) -> bool {
        self.control
            .state()
            .named
            .get(VOLUME)
            .is_some_and(|v| v.snapshots.contains_key(snap))
    }

    /// Read all of `target`, waiting out faults that may still be healing.
    async fn read(&self, target: Target) -> Result<Bytes, ClientError> {
        let mut tries = 0;
        loop {
            match self.named.read(&target, 0, self.blocks * self.bs).await {
                Ok(data) => return Ok(data),
                Err(e) if tries < 10 => {
                    tries += 1;
                    tracing::debug!(error = %e, "snapshot stage read retried");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Read and check every snapshot committed; the first, with its contents.
    async fn read_snapshots(&self, log: &mut Log, taken: &[Taken]) -> Option<(Taken, Bytes)> {
        let mut first: Option<(Taken, Bytes)> = None;
        for t in taken {
            if !self.exists(&t.name) {
                continue; // Asked, never committed.
            }
            match self.read(snap(&t.name)).await {
                Ok(data) => {
                    let ret = t.ret_ns.unwrap_or(u64::MAX);
                    let what = format!("snapshot {}", t.name);
                    log.check(&what, &data, self.bs as usize, (t.req_ns, ret));
                    if first.is_none() {
                        first = Some((t.clone(), data));
                    }
                }
                Err(e) => log
                    .problems
                    .push(format!("snapshot {} unreadable: {e}", t.name)),
            }
        }
        first
    }

    /// A clone of snapshot `t` (which read `before`), written: its writes
    /// show in neither the snapshot nor the volume.
    async fn write_a_clone(&self, log: &mut Log, (t, before): (Taken, Bytes)) {
        let clone = Command::Clone {
            name: VOLUME.into(),
            snap: t.name.clone(),
            new: CLONE.into(),
        };
        if !commit(&self.control, clone, |s| s.named.contains_key(CLONE)).await {
            log.problems.push("the clone was not created".into());
            return;
        }
        let written = self.write_clone(log).await;
        match self.read(clone_target()).await {
            Ok(data) => self.check_clone(log, &data, &written, &before),
            Err(e) => log.problems.push(format!("the clone unreadable: {e}")),
        }
        match self.read(snap(&t.name)).await {
            Ok(again) if again != before => log.problems.push(format!(
                "snapshot {} changed after its clone was written",
                t.name
            )),
            Ok(_) => {}
            Err(e) => log
                .problems
                .push(format!("snapshot {} unreadable: {e}", t.name)),
        }
    }

    /// Write tagged blocks into the clone; the tags, by block.
    async fn write_clone(&self, log: &mut Log) -> BTreeMap<u64, Tag> {
        let bs = self.bs;
        let mut written = BTreeMap::new();
        for seq in 1..=CLONE_WRITES {
            let block = thread_rng().gen_range(0..self.blocks);
            let tag = Tag::new(CLONE_WRITER, seq, 0);
            let mut data = BytesMut::zeroed(bs as usize);
            encode_block(&mut data, tag, block);
            let clone = clone_target();
            match self
                .named
                .write(&clone, block * bs, data.freeze(), false)
                .await
            {
                Ok(()) => {
                    written.insert(block, tag);
                }
                Err(e) => {
                    log.problems
                        .push(format!("a write of the clone failed: {e}"));
                    break;
                }
            }
        }
        written
    }

    /// The clone holds what was `written` into it, and its snapshot's
    /// contents `before` elsewhere.
    fn check_clone(&self, log: &mut Log, data: &[u8], written: &BTreeMap<u64, Tag>, before: &[u8]) {
        let bs = self.bs as usize;
        for (b, bytes) in data.chunks(bs).enumerate() {
            let want = match written.get(&(b as u64)) {
                Some(&tag) => Value::Tag(tag),
                None => decode_block(&before[b * bs..][..bs], b as u64),
            };
            let got = decode_block(bytes, b as u64);
            if got != want {
                log.problems
                    .push(format!("clone: block {b} holds {got}, should hold {want}"));
                break;
            }
        }
    }

    /// Delete the `last` snapshot, trim the volume's first extent: the
    /// volume reads zeroes there, and the writer's last values elsewhere.
    async fn delete_and_trim(&self, log: &mut Log, last: Option<&Taken>) {
        if let Some(t) = last.filter(|t| self.exists(&t.name)) {
            let delete = Command::DeleteSnapshot {
                name: VOLUME.into(),
                snap: t.name.clone(),
            };
            let name = t.name.clone();
            let deleted = commit(&self.control, delete, |s| {
                s.named
                    .get(VOLUME)
                    .is_some_and(|v| !v.snapshots.contains_key(&name))
            });
            if !deleted.await {
                log.problems
                    .push(format!("snapshot {name} was not deleted"));
            }
        }
        let invoke_ns = ns_since(self.epoch);
        let volume = the_volume();
        let trim = self
            .named
            .zero(&volume, (0, self.extent_bytes), |_, _| async { Ok(()) });
        match trim.await {
            Ok(()) => {
                let ack_ns = Some(ns_since(self.epoch));
                for block in 0..self.extent_bytes / self.bs {
                    log.writes.push(Write {
                        block,
                        tag: Tag::INITIAL,
                        invoke_ns,
                        ack_ns,
                    });
                }
            }
            Err(e) => log.problems.push(format!("a trim failed: {e}")),
        }
    }

    /// Reclaim what was freed, as a node's reclaimer does (zeroes, then
    /// `Zeroed`), and write into the trimmed extent again: it takes a zeroed
    /// extent and must read none of what the freed ones held. The extents
    /// reclaimed.
    async fn reclaim_and_reuse(&self, log: &mut Log) -> usize {
        let state = self.control.state();
        let dirty: Vec<_> = state
            .dirty
            .iter()
            .filter_map(|&e| Some((e, state.extents.get(&e)?.primary_since)))
            .collect();
        let mut reclaimed = 0;
        for (extent, since) in dirty {
            if self.named.zero_freed(extent, since).await.is_ok()
                && commit(&self.control, Command::Zeroed { extent, since }, |s| {
                    !s.dirty.contains(&extent)
                })
                .await
            {
                reclaimed += 1;
            }
        }
        let extent_blocks = self.extent_bytes / self.bs;
        for seq in 1..=REUSE_WRITES {
            let block = thread_rng().gen_range(0..extent_blocks.min(self.blocks));
            let tag = Tag::new(REUSE_WRITER, seq, 0);
            let write = tagged_write(&self.named, tag, (block, self.bs), self.epoch).await;
            log.writes.push(write);
        }
        reclaimed
    }
}

/// Snapshot `name` of the stage's volume.
fn snap(name: &str) -> Target {
    Target {
        name: VOLUME.into(),
        snap: Some(name.into()),
        id: None,
    }
}

/// The clone.
fn clone_target() -> Target {
    Target {
        name: CLONE.into(),
        snap: None,
        id: None,
    }
}
