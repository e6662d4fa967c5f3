//! The admin routes of snapshots and clones: take, list and delete a
//! snapshot, clone a volume from one, roll a volume back to one.
//!
//! A snapshot is taken when its command commits; the route answers once
//! this node has seen every primary of the extents it froze apply it (see
//! weir-core's `control::state::snapshots`), so no write that starts after
//! the answer lands in it. It answers with the time that took.

use super::{Admin, COMMIT_WAIT};
use std::fmt::Write as _;
use std::time::Instant;
use weir_core::control::state::check_name;
use weir_core::control::Command;

/// `VOL@SNAP`, both names checked.
pub(super) fn split_snapshot(text: &str) -> Result<(&str, &str), (u16, String)> {
    let Some((name, snap)) = text.split_once('@') else {
        return Err((400, format!("{text:?} is no VOL@SNAP\n")));
    };
    for n in [name, snap] {
        check_name(n).map_err(|e| (400, format!("{n:?}: {e}\n")))?;
    }
    Ok((name, snap))
}

impl Admin {
    /// One line per snapshot (of `volume`, or of every volume):
    /// `VOL@SNAP SIZE`.
    pub(super) fn snapshots(&self, volume: Option<&str>) -> (u16, String) {
        let state = self.handle.state();
        if let Some(name) = volume.filter(|n| !state.named.contains_key(*n)) {
            return (404, format!("no volume named {name:?}\n"));
        }
        let mut out = String::new();
        for (name, v) in &state.named {
            if volume.is_some_and(|n| n != name) {
                continue;
            }
            for snap in v.snapshots.keys() {
                let _ = writeln!(out, "{name}@{snap} {}", v.size_bytes);
            }
        }
        (200, out)
    }

    /// Take snapshot `name@snap`.
    pub(super) fn take_snapshot(&self, text: &str) -> (u16, String) {
        let (name, snap) = match split_snapshot(text) {
            Ok(n) => n,
            Err(e) => return e,
        };
        let started = Instant::now();
        let state = self.handle.state();
        let Some(v) = state.named.get(name) else {
            return (404, format!("no volume named {name:?}\n"));
        };
        if v.snapshots.contains_key(snap) {
            return (
                409,
                format!("volume {name:?} already has a snapshot {snap:?}\n"),
            );
        }
        let command = Command::Snapshot {
            name: name.to_string(),
            snap: snap.to_string(),
        };
        if !self.handle.request(command) {
            return (503, "the node is stopping\n".into());
        }
        let taken = self.wait(|s| match s.named.get(name) {
            Some(v) => v.snapshots.contains_key(snap).then_some(true),
            None => Some(false),
        });
        match taken {
            Some(true) => {}
            Some(false) => return (404, format!("volume {name:?} was deleted meanwhile\n")),
            None => {
                return (
                    504,
                    format!("snapshot {name}@{snap} not committed within {COMMIT_WAIT:?} (too many snapshots, or no Raft majority?)\n"),
                )
            }
        }
        if let Err(e) = (self.barrier)(name) {
            return (
                503,
                format!("snapshot {name}@{snap} taken, but not every primary was seen to apply it: {e}\n"),
            );
        }
        (
            201,
            format!(
                "snapshot {name}@{snap} taken in {:.1} ms\n",
                started.elapsed().as_secs_f64() * 1e3
            ),
        )
    }

    /// Delete snapshot `name@snap`.
    pub(super) fn delete_snapshot(&self, text: &str) -> (u16, String) {
        let (name, snap) = match split_snapshot(text) {
            Ok(n) => n,
            Err(e) => return e,
        };
        let gone = |s: &weir_core::control::ClusterState| {
            s.named
                .get(name)
                .is_none_or(|v| !v.snapshots.contains_key(snap))
        };
        if gone(&self.handle.state()) {
            return (404, format!("no snapshot {name}@{snap}\n"));
        }
        let command = Command::DeleteSnapshot {
            name: name.to_string(),
            snap: snap.to_string(),
        };
        if !self.handle.request(command) {
            return (503, "the node is stopping\n".into());
        }
        match self.wait(|s| gone(s).then_some(())) {
            Some(()) => (200, format!("snapshot {name}@{snap} deleted\n")),
            None => (
                504,
                format!("deletion not committed within {COMMIT_WAIT:?}\n"),
            ),
        }
    }

    /// Make volume `new` a clone of `from` (`VOL@SNAP`).
    pub(super) fn clone_volume(&self, new: &str, from: &str) -> (u16, String) {
        if let Err(e) = check_name(new) {
            return (400, format!("{e}\n"));
        }
        let (name, snap) = match split_snapshot(from) {
            Ok(n) => n,
            Err(e) => return e,
        };
        let state = self.handle.state();
        if state.named.contains_key(new) {
            return (409, format!("volume {new:?} already exists\n"));
        }
        if state
            .named
            .get(name)
            .is_none_or(|v| !v.snapshots.contains_key(snap))
        {
            return (404, format!("no snapshot {name}@{snap}\n"));
        }
        let command = Command::Clone {
            name: name.to_string(),
            snap: snap.to_string(),
            new: new.to_string(),
        };
        if !self.handle.request(command) {
            return (503, "the node is stopping\n".into());
        }
        let origin = format!("{name}@{snap}");
        match self.wait(|s| {
            s.named
                .get(new)
                .map(|v| v.origin.as_deref() == Some(&origin))
        }) {
            Some(true) => (201, format!("volume {new:?} cloned from {origin}\n")),
            Some(false) => (409, format!("volume {new:?} already exists\n")),
            None => (504, format!("clone not committed within {COMMIT_WAIT:?}\n")),
        }
    }

    /// Roll volume `name` back to its snapshot `snap`.
    pub(super) fn rollback(&self, name: &str, snap: &str) -> (u16, String) {
        let text = format!("{name}@{snap}");
        if let Err(e) = split_snapshot(&text) {
            return e;
        }
        let state = self.handle.state();
        let Some(v) = state.named.get(name) else {
            return (404, format!("no volume named {name:?}\n"));
        };
        if !v.snapshots.contains_key(snap) {
            return (404, format!("no snapshot {text}\n"));
        }
        let generation = v.generation;
        let command = Command::Rollback {
            name: name.to_string(),
            snap: snap.to_string(),
        };
        if !self.handle.request(command) {
            return (503, "the node is stopping\n".into());
        }
        let done = |s: &weir_core::control::ClusterState| match s.named.get(name) {
            Some(v) => (v.generation > generation).then_some(true),
            None => Some(false),
        };
        match self.wait(done) {
            Some(true) => (200, format!("volume {name:?} rolled back to {text}\n")),
            Some(false) => (404, format!("volume {name:?} was deleted meanwhile\n")),
            None => (
                504,
                format!("rollback not committed within {COMMIT_WAIT:?}\n"),
            ),
        }
    }
}
