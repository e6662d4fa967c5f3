//! The ports' congestion counters as each peer's signals.

use super::{Driver, Nic, NodeId};
use std::collections::BTreeMap;

/// How often the ports' congestion counters are read while the driver works
/// (a few sysfs reads each time).
pub(super) const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_millis(1);

/// `total` shared out by `weights`, largest remainders first, so the shares
/// add up to `total` exactly (nothing when no weight).
fn share(total: u64, weights: &BTreeMap<NodeId, u64>) -> Vec<(NodeId, u64)> {
    let sum: u128 = weights.values().map(|&w| u128::from(w)).sum();
    if total == 0 || sum == 0 {
        return Vec::new();
    }
    let mut parts: Vec<(NodeId, u64, u128)> = weights
        .iter()
        .map(|(&id, &w)| {
            let exact = u128::from(total) * u128::from(w);
            (id, (exact / sum) as u64, exact % sum)
        })
        .collect();
    let mut left = total - parts.iter().map(|p| p.1).sum::<u64>();
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by(|&a, &b| parts[b].2.cmp(&parts[a].2).then(a.cmp(&b)));
    for i in order {
        if left == 0 {
            break;
        }
        parts[i].1 += 1;
        left -= 1;
    }
    parts.into_iter().map(|(id, n, _)| (id, n)).collect()
}

impl<N: Nic> Driver<N> {
    /// Read each port's congestion counters and share what they gained since
    /// the last read among the peers, as signals: CNPs and retransmissions by
    /// the bytes sent to each over the port since the last such gain, marked
    /// packets by the bytes received from each. A NIC counts these per port,
    /// not per queue pair, so the shares are an estimate.
    pub(super) fn sample(&mut self) {
        let paths = self.nic.paths();
        self.sampled.resize(usize::from(paths), None);
        for path in 0..paths {
            let Some(now) = self.nic.counters(path) else {
                continue;
            };
            let Some(before) = self.sampled[usize::from(path)].replace(now) else {
                continue;
            };
            let gained = |a: u64, b: u64| a.saturating_sub(b);
            let (cnps, retransmits, marked) = (
                gained(now.cnps, before.cnps),
                gained(now.retransmits, before.retransmits),
                gained(now.marked_in, before.marked_in),
            );
            let mut tx = BTreeMap::new();
            let mut rx = BTreeMap::new();
            for l in self.links.values_mut().filter(|l| l.path == path) {
                if cnps + retransmits > 0 {
                    *tx.entry(l.peer).or_insert(0) += std::mem::take(&mut l.tx_bytes);
                }
                if marked > 0 {
                    *rx.entry(l.peer).or_insert(0) += std::mem::take(&mut l.rx_bytes);
                }
            }
            let mut signals = crate::net::lock(&self.shared.signals);
            for (id, n) in share(cnps, &tx) {
                signals.entry(id).or_default().cnps += n;
            }
            for (id, n) in share(retransmits, &tx) {
                signals.entry(id).or_default().retransmits += n;
            }
            for (id, n) in share(marked, &rx) {
                signals.entry(id).or_default().marked_in += n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_and_follow_the_weights() {
        let w: BTreeMap<NodeId, u64> = [(NodeId(1), 300), (NodeId(2), 100)].into();
        assert_eq!(share(40, &w), vec![(NodeId(1), 30), (NodeId(2), 10)]);
        // 1 among two equal weights: the first by id, never lost.
        let even: BTreeMap<NodeId, u64> = [(NodeId(1), 5), (NodeId(2), 5)].into();
        assert_eq!(share(1, &even), vec![(NodeId(1), 1), (NodeId(2), 0)]);
        let three: BTreeMap<NodeId, u64> = [(NodeId(1), 1), (NodeId(2), 1), (NodeId(3), 1)].into();
        assert_eq!(share(100, &three).iter().map(|p| p.1).sum::<u64>(), 100);
        assert!(share(7, &BTreeMap::new()).is_empty());
        assert!(share(7, &[(NodeId(1), 0)].into()).is_empty());
    }
}
