//! History checkers.
//!
//! Per-block linearizability: every write puts a unique tag in each block, so each
//! block is a register whose values are unique. For such registers linearizability is
//! decidable in O(n log n) by zones (Gibbons and Korach, "Testing shared memories",
//! 1997): group each write with the reads that returned its value (a cluster); its
//! zone runs from the earliest completion to the latest invocation in the cluster. It
//! is a forward zone if the earliest completion comes first, else a backward zone.
//! The history is linearizable iff every read returns a value written before it ended,
//! no two forward zones overlap, and no backward zone lies inside a forward zone.
//!
//! No acknowledged write lost: after the workload every replica of every written
//! block is read back directly. Each must hold the value of a write that no other
//! write certainly followed (one that completed before the other began).

use crate::history::{History, OpKind, OpRecord, Tag, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Most violations spelled out in a verdict; the rest are counted.
pub const VIOLATIONS_SHOWN_MAX: usize = 10;

/// A checker's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Checker name.
    pub name: &'static str,
    /// What was checked (e.g. "28193 blocks, 61234 ops").
    pub scope: String,
    /// Violations found, described; empty means pass.
    pub violations: Vec<String>,
}

impl Verdict {
    /// True if nothing was violated.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// One line, plus the first violations on their own lines.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if self.passed() {
            let _ = write!(out, "{:<26} PASS  ({})", self.name, self.scope);
        } else {
            let _ = write!(
                out,
                "{:<26} FAIL  ({}): {} violations",
                self.name,
                self.scope,
                self.violations.len()
            );
            for v in self.violations.iter().take(VIOLATIONS_SHOWN_MAX) {
                let _ = write!(out, "\n    - {v}");
            }
        }
        out
    }
}

/// One operation's view of one block.
#[derive(Clone, Copy, Debug)]
struct BlockOp {
    write: bool,
    value: Value,
    invoke_ns: u64,
    /// `u64::MAX` for a write that failed: it may take effect at any later time.
    complete_ns: u64,
}

/// Describe a write by its tag for messages.
fn describe_write(tag: Tag, w: Option<&BlockOp>) -> String {
    match w {
        Some(w) if w.complete_ns == u64::MAX => {
            format!("{tag} (invoked {} ns, never acknowledged)", w.invoke_ns)
        }
        Some(w) => format!(
            "{tag} (invoked {} ns, acknowledged {} ns)",
            w.invoke_ns, w.complete_ns
        ),
        None => tag.to_string(),
    }
}

fn per_block(history: &History) -> BTreeMap<u64, Vec<BlockOp>> {
    let mut blocks: BTreeMap<u64, Vec<BlockOp>> = BTreeMap::new();
    for op in &history.ops {
        let OpRecord {
            kind,
            lba,
            values,
            invoke_ns,
            complete_ns,
            ..
        } = op;
        let write = *kind == OpKind::Write;
        if !write && complete_ns.is_none() {
            continue; // A failed read observed nothing.
        }
        for (i, value) in values.iter().enumerate() {
            // Times shift by 1 ns so the initial value (a write over [0, 0]) comes
            // strictly before any operation, even one invoked at 0.
            blocks.entry(lba + i as u64).or_default().push(BlockOp {
                write,
                value: *value,
                invoke_ns: invoke_ns + 1,
                complete_ns: complete_ns.map_or(u64::MAX, |t| t + 1),
            });
        }
    }
    blocks
}

/// Check per-block linearizability of the client operations.
pub fn check_linearizable(history: &History) -> Verdict {
    let blocks = per_block(history);
    let mut violations = Vec::new();
    for (&lba, ops) in &blocks {
        check_register(lba, ops, &mut violations);
    }
    Verdict {
        name: "per-block linearizability",
        scope: format!("{} blocks, {} ops", blocks.len(), history.ops.len()),
        violations,
    }
}

/// Zone check of one register.
fn check_register(lba: u64, ops: &[BlockOp], violations: &mut Vec<String>) {
    // Clusters: write tag -> (write, min completion, max invocation).
    let initial = BlockOp {
        write: true,
        value: Value::Tag(Tag::INITIAL),
        invoke_ns: 0,
        complete_ns: 0,
    };
    let mut writes: BTreeMap<Tag, BlockOp> = BTreeMap::new();
    writes.insert(Tag::INITIAL, initial);
    for op in ops.iter().filter(|o| o.write) {
        let Value::Tag(tag) = op.value else {
            unreachable!("writes always carry a tag")
        };
        if writes.insert(tag, *op).is_some() {
            violations.push(format!(
                "block {lba}: tag {tag} written twice (a checker-input bug)"
            ));
        }
    }
    let mut zones: BTreeMap<Tag, (u64, u64)> = writes
        .iter()
        .map(|(&t, w)| (t, (w.complete_ns, w.invoke_ns)))
        .collect();
    for read in ops.iter().filter(|o| !o.write) {
        let tag = match read.value {
            Value::Tag(tag) => tag,
            Value::Garbage => {
                violations.push(format!(
                    "block {lba}: read at {}..{} ns returned {}",
                    read.invoke_ns, read.complete_ns, read.value
                ));
                continue;
            }
        };
        let Some(w) = writes.get(&tag) else {
            violations.push(format!(
                "block {lba}: read at {}..{} ns returned {tag}, which was never written there",
                read.invoke_ns, read.complete_ns
            ));
            continue;
        };
        if w.invoke_ns > read.complete_ns {
            violations.push(format!(
                "block {lba}: read ending at {} ns returned {}, from the future",
                read.complete_ns,
                describe_write(tag, Some(w))
            ));
        }
        let zone = zones.get_mut(&tag).expect("every write has a zone");
        zone.0 = zone.0.min(read.complete_ns);
        zone.1 = zone.1.max(read.invoke_ns);
    }
    check_zones(lba, &writes, &zones, violations);
}

/// The zones of block `lba`'s `writes` (from its first read's completion to
/// its last's invocation) must not overlap as no register's history can.
fn check_zones(
    lba: u64,
    writes: &BTreeMap<Tag, BlockOp>,
    zones: &BTreeMap<Tag, (u64, u64)>,
    violations: &mut Vec<String>,
) {
    // Forward zones [f, s] (f < s), sorted by start; backward zones [s, f].
    let mut forward: Vec<(u64, u64, Tag)> = Vec::new();
    let mut backward: Vec<(u64, u64, Tag)> = Vec::new();
    for (&tag, &(f, s)) in zones {
        if f < s {
            forward.push((f, s, tag));
        } else {
            backward.push((s, f, tag));
        }
    }
    forward.sort_unstable();
    for pair in forward.windows(2) {
        let ((_, end_a, a), (start_b, _, b)) = (pair[0], pair[1]);
        if start_b < end_a {
            violations.push(format!(
                "block {lba}: values {} and {} were each observed after the other was \
                 overwritten (a stale read)",
                describe_write(a, writes.get(&a)),
                describe_write(b, writes.get(&b))
            ));
        }
    }
    for &(s, f, tag) in &backward {
        let at = forward.partition_point(|&(start, ..)| start < s);
        if let Some(&(_, end, outer)) = at.checked_sub(1).map(|i| &forward[i]) {
            if f < end && tag != outer {
                violations.push(format!(
                    "block {lba}: {} was visible only inside the interval in which {} \
                     must have been the value",
                    describe_write(tag, writes.get(&tag)),
                    describe_write(outer, writes.get(&outer))
                ));
            }
        }
    }
}

/// No client error within tolerance: while the plan stays within what the
/// cluster tolerates (`within`; `plan` says which), every client request must
/// succeed, however long it waited. Beyond it, errors are allowed (and
/// counted).
pub fn check_availability(history: &History, within: bool, plan: &str) -> Verdict {
    let failed: Vec<&OpRecord> = history
        .ops
        .iter()
        .filter(|o| o.complete_ns.is_none())
        .collect();
    let violations = if within {
        failed
            .iter()
            .map(|o| {
                format!(
                    "client {} {:?} of block {} invoked at {} ns failed: {}",
                    o.client,
                    o.kind,
                    o.lba,
                    o.invoke_ns,
                    o.error.as_deref().unwrap_or("(no error recorded)")
                )
            })
            .collect()
    } else {
        Vec::new()
    };
    Verdict {
        name: "availability",
        scope: format!(
            "{} requests, {} failed; {plan}",
            history.ops.len(),
            failed.len()
        ),
        violations,
    }
}

/// Check that every replica holds, for every written block, the latest acknowledged
/// write (one not certainly followed by another write).
pub fn check_no_lost_writes(history: &History, replicas: usize) -> Verdict {
    let blocks = per_block(history);
    let mut violations = Vec::new();
    let mut reads_by_block: BTreeMap<u64, Vec<(u32, Option<Value>)>> = BTreeMap::new();
    for r in &history.replica_reads {
        reads_by_block
            .entry(r.lba)
            .or_default()
            .push((r.node, r.value));
    }
    let mut written = 0usize;
    for (&lba, ops) in &blocks {
        if !ops.iter().any(|o| o.write) {
            continue;
        }
        written += 1;
        let block_start = violations.len();
        let copies = reads_by_block.get(&lba).map(Vec::as_slice).unwrap_or(&[]);
        let expected = history
            .expected_copies
            .get(&lba)
            .copied()
            .unwrap_or(replicas);
        check_copies(lba, ops, (copies, expected), &mut violations);
        check_final(lba, ops, copies, block_start, &mut violations);
    }
    Verdict {
        name: "no acknowledged write lost",
        scope: format!(
            "{written} blocks, {} in-sync copies read back",
            history.replica_reads.len()
        ),
        violations,
    }
}

/// Block `lba`'s copies read back (`expected` of them, one per in-sync
/// replica) each hold a value the block's operations `ops` allow: the
/// latest acknowledged write's, or one not certainly overwritten.
fn check_copies(
    lba: u64,
    ops: &[BlockOp],
    (copies, expected): (&[(u32, Option<Value>)], usize),
    violations: &mut Vec<String>,
) {
    let writes: Vec<&BlockOp> = ops.iter().filter(|o| o.write).collect();
    // The latest completed write: every final value must be at least this new.
    let latest = writes
        .iter()
        .filter(|w| w.complete_ns != u64::MAX)
        .max_by_key(|w| w.complete_ns);
    let acknowledged = writes.iter().any(|w| w.complete_ns != u64::MAX);
    let allowed = |v: &Value| -> bool {
        if *v == Value::Tag(Tag::INITIAL) {
            return !acknowledged;
        }
        let Some(w) = writes.iter().find(|w| w.value == *v) else {
            return false;
        };
        // Not certainly followed by another acknowledged write.
        !writes
            .iter()
            .any(|o| o.complete_ns != u64::MAX && w.complete_ns < o.invoke_ns)
    };
    if copies.len() != expected || expected == 0 {
        violations.push(format!(
            "block {lba}: read back from {} in-sync replicas, expected {expected} (at least 1)",
            copies.len()
        ));
    }
    for &(node, value) in copies {
        match value {
            None => violations.push(format!("block {lba}: replica n{node} could not be read")),
            Some(v) if !allowed(&v) => {
                let lost = latest.map(|w| {
                    let Value::Tag(t) = w.value else {
                        unreachable!()
                    };
                    describe_write(t, Some(w))
                });
                violations.push(format!(
                    "block {lba}: replica n{node} holds {v}, but acknowledged write {} \
                     is the latest: lost",
                    lost.unwrap_or_else(|| "(none acknowledged)".into())
                ));
            }
            Some(_) => {}
        }
    }
}

/// The copies of block `lba` are linearizable with what clients read in
/// `ops` (reported only when nothing else was for the block, from
/// `block_start`), and agree.
fn check_final(
    lba: u64,
    ops: &[BlockOp],
    copies: &[(u32, Option<Value>)],
    block_start: usize,
    violations: &mut Vec<String>,
) {
    // The read-backs come after every operation: they must also be linearizable
    // with what clients read (a replica may not keep a value that a read has
    // already seen overwritten).
    let mut with_final = ops.to_vec();
    for &(_, value) in copies {
        if let Some(value) = value {
            with_final.push(BlockOp {
                write: false,
                value,
                invoke_ns: u64::MAX - 2,
                complete_ns: u64::MAX - 1,
            });
        }
    }
    let mut order = Vec::new();
    check_register(lba, &with_final, &mut order);
    // Reported only when the plainer checks above found nothing for this block.
    if violations.len() == block_start && !order.is_empty() {
        violations.push(format!(
            "block {lba}: the replicas' final value contradicts what clients read: {}",
            order[0]
        ));
    }
    let mut values = copies.iter().filter_map(|(_, v)| *v);
    if let Some(first) = values.next() {
        if values.any(|v| v != first) {
            let all: Vec<String> = copies
                .iter()
                .map(|(n, v)| format!("n{n}: {}", v.map_or("unreadable".into(), |v| v.to_string())))
                .collect();
            violations.push(format!(
                "block {lba}: replicas diverge ({})",
                all.join(", ")
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::ReplicaRead;

    fn w(client: u16, seq: u64, lba: u64, inv: u64, comp: u64) -> OpRecord {
        OpRecord {
            client,
            kind: OpKind::Write,
            lba,
            values: vec![Value::Tag(Tag::new(client, seq, 0))],
            invoke_ns: inv,
            complete_ns: Some(comp),
            error: None,
        }
    }

    fn r(value: Value, lba: u64, inv: u64, comp: u64) -> OpRecord {
        OpRecord {
            client: 9,
            kind: OpKind::Read,
            lba,
            values: vec![value],
            invoke_ns: inv,
            complete_ns: Some(comp),
            error: None,
        }
    }

    fn t(client: u16, seq: u64) -> Value {
        Value::Tag(Tag::new(client, seq, 0))
    }

    fn hist(ops: Vec<OpRecord>) -> History {
        History {
            ops,
            replica_reads: vec![],
            expected_copies: Default::default(),
        }
    }

    #[test]
    fn a_linearizable_history_passes() {
        let h = hist(vec![
            r(Value::Tag(Tag::INITIAL), 5, 1, 3),
            w(0, 1, 5, 2, 10),
            r(t(0, 1), 5, 4, 6), // concurrent with the write: may see it
            r(t(0, 1), 5, 11, 12),
            w(1, 1, 5, 13, 20),
            w(0, 2, 5, 14, 18), // concurrent writes: either order
            r(t(1, 1), 5, 21, 22),
            r(t(1, 1), 5, 23, 24),
        ]);
        let v = check_linearizable(&h);
        assert!(v.passed(), "{}", v.render());
    }

    #[test]
    fn a_stale_read_fails() {
        let h = hist(vec![
            w(0, 1, 5, 0, 10),
            w(0, 2, 5, 11, 20),
            r(t(0, 1), 5, 21, 22),
        ]);
        let v = check_linearizable(&h);
        assert!(!v.passed());
        assert!(v.violations[0].contains("block 5"), "{}", v.render());
    }

    #[test]
    fn a_new_old_inversion_fails() {
        // The write is concurrent with both reads, but once one read saw the new
        // value a later read may not see the old one.
        let h = hist(vec![
            w(0, 1, 5, 0, 100),
            r(t(0, 1), 5, 10, 20),
            r(Value::Tag(Tag::INITIAL), 5, 30, 40),
        ]);
        assert!(!check_linearizable(&h).passed());
    }

    #[test]
    fn reads_of_the_future_and_garbage_fail() {
        let h = hist(vec![r(t(0, 1), 5, 0, 5), w(0, 1, 5, 10, 20)]);
        assert!(check_linearizable(&h).violations[0].contains("from the future"));
        let h = hist(vec![r(Value::Garbage, 5, 0, 5)]);
        assert!(!check_linearizable(&h).passed());
        let h = hist(vec![r(t(3, 3), 5, 0, 5)]);
        assert!(check_linearizable(&h).violations[0].contains("never written"));
    }

    #[test]
    fn a_replica_missing_the_last_write_is_named() {
        let mut h = hist(vec![w(0, 1, 7, 0, 10), w(1, 1, 7, 20, 30)]);
        for node in [1, 2] {
            h.replica_reads.push(ReplicaRead {
                lba: 7,
                node,
                value: Some(t(1, 1)),
            });
        }
        h.replica_reads.push(ReplicaRead {
            lba: 7,
            node: 3,
            value: Some(t(0, 1)),
        });
        let v = check_no_lost_writes(&h, 3);
        assert_eq!(v.violations.len(), 2, "{}", v.render());
        assert!(
            v.violations[1].contains("replicas diverge"),
            "{}",
            v.render()
        );
        let msg = &v.violations[0];
        assert!(msg.contains("block 7") && msg.contains("n3"), "{msg}");
        assert!(
            msg.contains("holds c0#1.0") && msg.contains("c1#1.0"),
            "{msg}"
        );
    }

    #[test]
    fn a_final_value_older_than_what_a_client_read_is_lost() {
        // W1 and W2 overlap, a read then sees W2, yet every replica holds W1.
        let mut h = hist(vec![
            w(0, 1, 7, 0, 10),
            w(1, 1, 7, 5, 12),
            r(t(1, 1), 7, 20, 21),
        ]);
        for node in 1..=3 {
            h.replica_reads.push(ReplicaRead {
                lba: 7,
                node,
                value: Some(t(0, 1)),
            });
        }
        let v = check_no_lost_writes(&h, 3);
        assert!(!v.passed());
        assert!(v.violations[0].contains("contradicts"), "{}", v.render());
    }

    #[test]
    fn zeroes_are_fine_when_no_write_was_acknowledged() {
        let mut failed = w(0, 1, 7, 0, 10);
        failed.complete_ns = None;
        let mut h = hist(vec![failed]);
        for node in 1..=3 {
            h.replica_reads.push(ReplicaRead {
                lba: 7,
                node,
                value: Some(Value::Tag(Tag::INITIAL)),
            });
        }
        assert!(check_no_lost_writes(&h, 3).passed());
    }

    #[test]
    fn a_stale_read_of_the_initial_value_at_time_zero_fails() {
        let h = hist(vec![
            w(0, 1, 5, 0, 10),
            r(Value::Tag(Tag::INITIAL), 5, 20, 30),
        ]);
        assert!(!check_linearizable(&h).passed());
    }

    #[test]
    fn concurrent_final_writes_may_either_win() {
        let mut h = hist(vec![w(0, 1, 7, 0, 10), w(1, 1, 7, 5, 12)]);
        for node in 1..=3 {
            h.replica_reads.push(ReplicaRead {
                lba: 7,
                node,
                value: Some(t(0, 1)),
            });
        }
        assert!(check_no_lost_writes(&h, 3).passed());
    }
}
