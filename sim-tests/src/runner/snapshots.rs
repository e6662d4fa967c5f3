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
    let c = &scenario.cluster;
    let extent_bytes = c.extent_mib << 20;
    let bs = u64::from(c.block_size);
    let blocks = scenario.snapshots.extents * extent_bytes / bs;
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
    let named = Arc::new(named);
    let mut log = Log::default();
    let scope = |log: &Log| {
        format!(
            "{} writes, {} snapshots, a clone, {} freed extents zeroed, a volume of {blocks} blocks",
            log.writes.len(),
            log.taken.len(),
            log.reclaimed
        )
    };
    let create = Command::CreateNamed {
        name: VOLUME.into(),
        size_bytes: blocks * bs,
        extents: scenario.snapshots.extents,
        qos: Default::default(),
        key_check: None,
        thin: true,
    };
    if !commit(&control, create, |s| s.named.contains_key(VOLUME)).await {
        log.problems
            .push("the stage's volume was not created".into());
    }
    let log = Arc::new(std::sync::Mutex::new(log));

    // The writer, until the deadline.
    let writer = {
        let (named, log) = (named.clone(), log.clone());
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
    // The snapshots, while it writes.
    for (i, after) in at.iter().enumerate() {
        weir_core::time::sleep_until_exact(epoch + *after).await;
        let name = format!("s{i}");
        let req_ns = ns_since(epoch);
        let command = Command::Snapshot {
            name: VOLUME.into(),
            snap: name.clone(),
        };
        let taken = commit(&control, command, |s| {
            s.named
                .get(VOLUME)
                .is_some_and(|v| v.snapshots.contains_key(&name))
        })
        .await;
        let ret_ns = match taken {
            true => named.barrier(VOLUME).await.ok().map(|()| ns_since(epoch)),
            false => None,
        };
        log.lock().expect("log").taken.push(Taken {
            name,
            req_ns,
            ret_ns,
        });
    }
    writer.await.expect("the writer");
    let mut log = Arc::try_unwrap(log)
        .expect("the writer is done")
        .into_inner()
        .expect("log");
    let taken: Vec<Taken> = log.taken.clone();
    let exists = |snap: &str| {
        control
            .state()
            .named
            .get(VOLUME)
            .is_some_and(|v| v.snapshots.contains_key(snap))
    };
    let read = |target: Target| {
        let named = named.clone();
        async move {
            let mut tries = 0;
            loop {
                match named.read(&target, 0, blocks * bs).await {
                    Ok(data) => return Ok(data),
                    // Faults may still be healing: the stage's reads wait.
                    Err(e) if tries < 10 => {
                        tries += 1;
                        tracing::debug!(error = %e, "snapshot stage read retried");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => return Err::<Bytes, ClientError>(e),
                }
            }
        }
    };
    let snap = |name: &str| Target {
        name: VOLUME.into(),
        snap: Some(name.into()),
        id: None,
    };
    let mut first: Option<(Taken, Bytes)> = None;
    for t in &taken {
        if !exists(&t.name) {
            continue; // Asked, never committed.
        }
        match read(snap(&t.name)).await {
            Ok(data) => {
                let ret = t.ret_ns.unwrap_or(u64::MAX);
                log.check(
                    &format!("snapshot {}", t.name),
                    &data,
                    bs as usize,
                    (t.req_ns, ret),
                );
                if first.is_none() {
                    first = Some((t.clone(), data));
                }
            }
            Err(e) => log
                .problems
                .push(format!("snapshot {} unreadable: {e}", t.name)),
        }
    }
    // A clone of the first snapshot, written: its writes show in neither the
    // snapshot nor the volume.
    if let Some((t, before)) = first {
        let clone = Command::Clone {
            name: VOLUME.into(),
            snap: t.name.clone(),
            new: CLONE.into(),
        };
        if commit(&control, clone, |s| s.named.contains_key(CLONE)).await {
            let mut written = BTreeMap::new();
            for seq in 1..=CLONE_WRITES {
                let block = thread_rng().gen_range(0..blocks);
                let tag = Tag::new(CLONE_WRITER, seq, 0);
                let mut data = BytesMut::zeroed(bs as usize);
                encode_block(&mut data, tag, block);
                let clone = Target {
                    name: CLONE.into(),
                    snap: None,
                    id: None,
                };
                match named.write(&clone, block * bs, data.freeze(), false).await {
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
            let target = Target {
                name: CLONE.into(),
                snap: None,
                id: None,
            };
            match read(target).await {
                Ok(data) => {
                    for (b, bytes) in data.chunks(bs as usize).enumerate() {
                        let b = b as u64;
                        let want = match written.get(&b) {
                            Some(&tag) => Value::Tag(tag),
                            None => {
                                decode_block(&before[b as usize * bs as usize..][..bs as usize], b)
                            }
                        };
                        let got = decode_block(bytes, b);
                        if got != want {
                            log.problems
                                .push(format!("clone: block {b} holds {got}, should hold {want}"));
                            break;
                        }
                    }
                }
                Err(e) => log.problems.push(format!("the clone unreadable: {e}")),
            }
            match read(snap(&t.name)).await {
                Ok(again) if again != before => log.problems.push(format!(
                    "snapshot {} changed after its clone was written",
                    t.name
                )),
                Ok(_) => {}
                Err(e) => log
                    .problems
                    .push(format!("snapshot {} unreadable: {e}", t.name)),
            }
        } else {
            log.problems.push("the clone was not created".into());
        }
    }
    // Delete the last snapshot, trim the volume's first extent: the volume
    // reads zeroes there, and the writer's last values elsewhere.
    if let Some(t) = taken.last().filter(|t| exists(&t.name)) {
        let delete = Command::DeleteSnapshot {
            name: VOLUME.into(),
            snap: t.name.clone(),
        };
        let name = t.name.clone();
        if !commit(&control, delete, |s| {
            s.named
                .get(VOLUME)
                .is_some_and(|v| !v.snapshots.contains_key(&name))
        })
        .await
        {
            log.problems
                .push(format!("snapshot {name} was not deleted"));
        }
    }
    let invoke_ns = ns_since(epoch);
    let extent_blocks = extent_bytes / bs;
    match named
        .zero(&the_volume(), (0, extent_bytes), |_, _| async { Ok(()) })
        .await
    {
        Ok(()) => {
            let ack_ns = Some(ns_since(epoch));
            for block in 0..extent_blocks {
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
    // Reclaim what was freed, as a node's reclaimer does (zeroes, then
    // `Zeroed`), and write into the trimmed extent again: it takes a zeroed
    // extent and must read none of what the freed ones held.
    let state = control.state();
    let dirty: Vec<_> = state
        .dirty
        .iter()
        .filter_map(|&e| Some((e, state.extents.get(&e)?.primary_since)))
        .collect();
    let mut reclaimed = 0;
    for (extent, since) in dirty {
        if named.zero_freed(extent, since).await.is_ok()
            && commit(&control, Command::Zeroed { extent, since }, |s| {
                !s.dirty.contains(&extent)
            })
            .await
        {
            reclaimed += 1;
        }
    }
    for seq in 1..=REUSE_WRITES {
        let block = thread_rng().gen_range(0..extent_blocks.min(blocks));
        let tag = Tag::new(REUSE_WRITER, seq, 0);
        log.writes
            .push(tagged_write(&named, tag, (block, bs), epoch).await);
    }
    let now = ns_since(epoch);
    match read(the_volume()).await {
        Ok(data) => log.check("the volume", &data, bs as usize, (now, now)),
        Err(e) => log.problems.push(format!("the volume unreadable: {e}")),
    }
    log.reclaimed = reclaimed;
    Verdict {
        name: "snapshots",
        scope: scope(&log),
        violations: log.problems,
    }
}
