//! Invariant checkers over the nodes' audit facts (`weir_core::replication::Audit`),
//! which the simulator collects from every node at once.
//!
//! - Leases: at no instant may two nodes both be entitled to serve one extent, at
//!   most one node serves an extent in a given epoch, and the epochs an extent is
//!   served in only grow. A node's entitlement is what it claimed: from the moment it
//!   may serve (its map says primary, the old lease has run out) to the end of its
//!   lease, or to the first crash after the claim was made if that comes first (a
//!   dead process serves nothing, and a restarted one claims anew). A claim made
//!   ahead of its start (a new primary waiting out the old lease) by an
//!   incarnation that crashed before the start is void: campaign seed 43849265
//!   once counted such a claim of a node that lost power against the primary
//!   that took over at its restart. Checking entitlements rather than the
//!   operations served catches a violation even when no client happened to read
//!   in the overlap.
//! - Acknowledged means persisted everywhere: when a primary acknowledges a write,
//!   every replica its map counts as in sync has already reported that write on its
//!   device. This is the invariant behind "any in-sync replica holds every
//!   acknowledged write", checked at the moment of each ack rather than only in the
//!   read-back at the end.
//!
//! - Epochs only grow: no replica takes a write carrying an older epoch than its own
//!   map's for that extent (the fence against a deposed primary).
//!
//! Times in the messages are milliseconds since `base_ns` (the run's start).

use crate::checker::Verdict;
use std::collections::BTreeMap;
use weir_core::replication::Audit;
use weir_core::{Epoch, ExtentId, Lba, NodeId};

fn ms(at_ns: u64, base_ns: u64) -> String {
    format!("{:.3} ms", at_ns.saturating_sub(base_ns) as f64 / 1e6)
}

/// One node's right to serve an extent.
#[derive(Clone, Copy, Debug)]
struct Claim {
    node: NodeId,
    epoch: Epoch,
    from_ns: u64,
    until_ns: u64,
}

/// Check the lease invariants over every node's claims; `crashes` are the times
/// (cluster clock) nodes were killed.
pub fn check_leases(audit: &[(NodeId, Audit)], crashes: &[(NodeId, u64)], base_ns: u64) -> Verdict {
    let mut claims = claims(audit, crashes);
    let count: usize = claims.values().map(Vec::len).sum();
    let mut violations = Vec::new();
    for (extent, list) in &mut claims {
        list.sort_by_key(|c| (c.from_ns, c.node, c.until_ns));
        check_claims(*extent, list, base_ns, &mut violations);
    }
    Verdict {
        name: "leases",
        scope: format!("{count} claims on {} extents", claims.len()),
        violations,
    }
}

/// Every node's claims, by extent, each cut short at its node's next crash
/// (a claim ends with the incarnation that made it).
fn claims(audit: &[(NodeId, Audit)], crashes: &[(NodeId, u64)]) -> BTreeMap<ExtentId, Vec<Claim>> {
    let mut claims: BTreeMap<ExtentId, Vec<Claim>> = BTreeMap::new();
    for (node, fact) in audit {
        if let Audit::Claim {
            extent,
            epoch,
            made_ns,
            from_ns,
            until_ns,
        } = *fact
        {
            // A claim ends with the incarnation that made it.
            let until_ns = crashes
                .iter()
                .filter(|&&(n, at)| n == *node && at >= made_ns)
                .map(|&(_, at)| at)
                .fold(until_ns, u64::min);
            if until_ns <= from_ns {
                continue; // That incarnation never reached the start.
            }
            claims.entry(extent).or_default().push(Claim {
                node: *node,
                epoch,
                from_ns,
                until_ns,
            });
        }
    }
    claims
}

/// `extent`'s claims `list` (sorted by start): one node per epoch, never two
/// nodes entitled at once, epochs only grow.
fn check_claims(extent: ExtentId, list: &[Claim], base_ns: u64, violations: &mut Vec<String>) {
    // Per epoch, the one node that served it.
    let mut served_by: BTreeMap<Epoch, NodeId> = BTreeMap::new();
    // Per node, the latest end of its claims so far, and that claim's epoch.
    let mut latest: BTreeMap<NodeId, (u64, Epoch)> = BTreeMap::new();
    let mut top_epoch = Epoch(0);
    for c in list.iter() {
        let owner = *served_by.entry(c.epoch).or_insert(c.node);
        if owner != c.node {
            violations.push(format!(
                "{extent}: {} and {} both served at {}",
                owner, c.node, c.epoch
            ));
        }
        for (&other, &(until, epoch)) in &latest {
            if other != c.node && until > c.from_ns {
                violations.push(format!(
                    "{extent}: {} may serve at {} from {}, but {} may serve it \
                     (at {}) until {}",
                    c.node,
                    c.epoch,
                    ms(c.from_ns, base_ns),
                    other,
                    epoch,
                    ms(until, base_ns)
                ));
            }
        }
        if c.epoch < top_epoch {
            violations.push(format!(
                "{extent}: {} serves at {} from {}, after {} was served",
                c.node,
                c.epoch,
                ms(c.from_ns, base_ns),
                top_epoch
            ));
        }
        top_epoch = top_epoch.max(c.epoch);
        let e = latest.entry(c.node).or_insert((0, c.epoch));
        if c.until_ns >= e.0 {
            *e = (c.until_ns, c.epoch);
        }
    }
}

/// Check that every acknowledged write was persisted by every in-sync replica first.
pub fn check_acks_persisted(audit: &[(NodeId, Audit)], base_ns: u64) -> Verdict {
    // (node, first block, version) -> when that node's device completed the write.
    let mut persisted: BTreeMap<(NodeId, Lba, weir_core::Version), u64> = BTreeMap::new();
    for (node, fact) in audit {
        if let Audit::Persisted {
            lba,
            version,
            at_ns,
            ..
        } = *fact
        {
            let e = persisted.entry((*node, lba, version)).or_insert(at_ns);
            *e = (*e).min(at_ns);
        }
    }
    let mut acks = 0usize;
    let mut violations = Vec::new();
    for (primary, fact) in audit {
        let Audit::Acked {
            extent,
            lba,
            blocks,
            version,
            at_ns,
            in_sync,
        } = fact
        else {
            continue;
        };
        acks += 1;
        for node in in_sync {
            let done = persisted.get(&(*node, *lba, *version)).copied();
            if done.is_none_or(|t| t > *at_ns) {
                violations.push(format!(
                    "{extent}: {primary} acknowledged {version} of blocks {}..{} at {}, \
                     but in-sync {node} {}",
                    lba.0,
                    lba.0 + blocks,
                    ms(*at_ns, base_ns),
                    done.map_or("never persisted it".to_string(), |t| format!(
                        "persisted it only at {}",
                        ms(t, base_ns)
                    )),
                ));
            }
        }
    }
    Verdict {
        name: "acked-means-persisted",
        scope: format!("{acks} acknowledged writes"),
        violations,
    }
}

/// Check that no replica took a write from an epoch older than its map's.
pub fn check_epochs(audit: &[(NodeId, Audit)], base_ns: u64) -> Verdict {
    let mut accepted = 0usize;
    let mut violations = Vec::new();
    for (node, fact) in audit {
        if let Audit::Accepted {
            extent,
            epoch,
            map_epoch,
            at_ns,
        } = *fact
        {
            accepted += 1;
            if epoch < map_epoch {
                violations.push(format!(
                    "{extent}: {node} took a write of {epoch} at {}, when its map was at {map_epoch}",
                    ms(at_ns, base_ns)
                ));
            }
        }
    }
    Verdict {
        name: "epochs only grow",
        scope: format!("{accepted} replica writes"),
        violations,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(node: u32, epoch: u64, from_ns: u64, until_ns: u64) -> (NodeId, Audit) {
        made_ahead(node, epoch, from_ns, from_ns, until_ns)
    }

    fn made_ahead(
        node: u32,
        epoch: u64,
        made_ns: u64,
        from_ns: u64,
        until_ns: u64,
    ) -> (NodeId, Audit) {
        (
            NodeId(node),
            Audit::Claim {
                extent: ExtentId(0),
                epoch: Epoch(epoch),
                made_ns,
                from_ns,
                until_ns,
            },
        )
    }

    #[test]
    fn a_handover_after_the_lease_passes_and_an_overlap_fails() {
        let ok = [
            claim(1, 1, 0, 100),
            claim(1, 1, 50, 150),
            claim(2, 2, 150, 300),
        ];
        assert!(check_leases(&ok, &[], 0).passed());
        let overlap = [
            claim(1, 1, 0, 100),
            claim(1, 1, 50, 150),
            claim(2, 2, 120, 300),
        ];
        let v = check_leases(&overlap, &[], 0);
        assert_eq!(v.violations.len(), 1, "{v:?}");
        assert!(v.violations[0].contains("n1 may serve it (at e1)"), "{v:?}");
        // n1 crashed at 110: its lease ended with it. A crash after the takeover
        // does not excuse the overlap.
        assert!(check_leases(&overlap, &[(NodeId(1), 110)], 0).passed());
        assert!(!check_leases(&overlap, &[(NodeId(1), 130)], 0).passed());
        let shared_epoch = [claim(1, 1, 0, 100), claim(2, 1, 100, 200)];
        assert!(!check_leases(&shared_epoch, &[], 0).passed());
        let back = [claim(1, 2, 0, 100), claim(2, 1, 100, 200)];
        assert!(!check_leases(&back, &[], 0).passed());
    }

    #[test]
    fn a_claim_ahead_of_its_start_ends_with_the_incarnation_that_made_it() {
        // n2 takes over at 100, once n1's lease ran out, and says so at 40; it
        // crashes at 60 and restarts, and n3 takes over from 100 instead.
        let claims = [
            claim(1, 1, 0, 100),
            made_ahead(2, 2, 40, 100, 250),
            claim(3, 3, 100, 300),
        ];
        assert!(check_leases(&claims, &[(NodeId(2), 60)], 0).passed());
        // Had it lived (or crashed only once it served), the overlap is a violation.
        assert!(!check_leases(&claims, &[], 0).passed());
        assert!(!check_leases(&claims, &[(NodeId(2), 120)], 0).passed());
    }

    #[test]
    fn a_write_from_an_older_epoch_fails() {
        let took = |epoch: u64, map_epoch: u64| {
            (
                NodeId(2),
                Audit::Accepted {
                    extent: ExtentId(1),
                    epoch: Epoch(epoch),
                    map_epoch: Epoch(map_epoch),
                    at_ns: 5,
                },
            )
        };
        assert!(check_epochs(&[took(3, 3), took(4, 3)], 0).passed());
        let v = check_epochs(&[took(3, 3), took(2, 3)], 0);
        assert_eq!(v.violations.len(), 1);
        assert!(v.violations[0].contains("n2 took a write of e2"), "{v:?}");
    }

    #[test]
    fn an_ack_before_a_replica_persisted_fails() {
        let write = |node: u32, at_ns: u64| {
            (
                NodeId(node),
                Audit::Persisted {
                    lba: Lba(8),
                    blocks: 2,
                    version: weir_core::Version(3),
                    at_ns,
                },
            )
        };
        let ack = (
            NodeId(1),
            Audit::Acked {
                extent: ExtentId(0),
                lba: Lba(8),
                blocks: 2,
                version: weir_core::Version(3),
                at_ns: 100,
                in_sync: vec![NodeId(1), NodeId(2), NodeId(3)],
            },
        );
        let ok = [write(1, 50), write(2, 90), write(3, 100), ack.clone()];
        assert!(check_acks_persisted(&ok, 0).passed());
        let late = [write(1, 50), write(2, 90), write(3, 101), ack.clone()];
        let v = check_acks_persisted(&late, 0);
        assert!(v.violations[0].contains("n3 persisted it only at"), "{v:?}");
        let never = [write(1, 50), write(2, 90), ack];
        assert!(!check_acks_persisted(&never, 0).passed());
    }
}
