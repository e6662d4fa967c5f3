//! A switch's shared-buffer accounting and its PFC decisions, sans-IO.
//!
//! Every ingress queue (port, lossless class) owns a small reserve and a headroom;
//! beyond its reserve a queue draws on the shared buffer, up to a dynamic threshold
//! `free >> shift`, where `free` is the shared buffer not yet used (buffer less all
//! reserves and headrooms less shared use). A queue past its threshold asks its
//! upstream to pause (XOFF); what still arrives goes to its headroom. It asks to
//! resume (XON) when its headroom is empty and its shared use plus an offset is back
//! under the threshold. Only a full headroom drops a lossless packet.

/// One ingress queue.
#[derive(Clone, Debug, Default)]
struct Queue {
    /// Bytes held in reserve + shared.
    bytes: u64,
    /// Bytes held in headroom.
    headroom_used: u64,
    /// Headroom size.
    headroom: u64,
    /// Threshold shift for this port's speed.
    shift: u32,
    /// We have paused the upstream.
    pausing: bool,
}

/// Why a packet was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Lossless: the headroom overflowed (PFC reacted too late).
    HeadroomOverflow,
    /// Lossy: the shared buffer is full.
    BufferFull,
}

/// A PFC action for the upstream of an ingress queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PfcAction {
    /// Send XOFF.
    Pause,
    /// Send XON.
    Resume,
}

/// Buffer accounting of one switch.
#[derive(Clone, Debug)]
pub struct Mmu {
    buffer: u64,
    reserve: u64,
    resume_offset: u64,
    reserved_total: u64,
    shared_used: u64,
    lossy_used: u64,
    queues: Vec<Queue>,
}

impl Mmu {
    /// Accounting for `ports` ingress queues: `(headroom bytes, threshold shift)` per
    /// port.
    pub fn new(buffer: u64, reserve: u64, resume_offset: u64, ports: &[(u64, u32)]) -> Self {
        let queues: Vec<Queue> = ports
            .iter()
            .map(|&(headroom, shift)| Queue {
                headroom,
                shift,
                ..Queue::default()
            })
            .collect();
        let reserved_total = queues.iter().map(|q| q.headroom + reserve).sum();
        assert!(
            reserved_total < buffer,
            "reserves and headrooms exceed the buffer"
        );
        Mmu {
            buffer,
            reserve,
            resume_offset,
            reserved_total,
            shared_used: 0,
            lossy_used: 0,
            queues,
        }
    }

    /// The XOFF threshold of ingress queue `q` now.
    pub fn threshold(&self, q: usize) -> u64 {
        let free = self
            .buffer
            .saturating_sub(self.reserved_total + self.shared_used + self.lossy_used);
        free >> self.queues[q].shift
    }

    fn shared_of(&self, q: usize) -> u64 {
        self.queues[q].bytes.saturating_sub(self.reserve)
    }

    /// Admit a lossless packet of `size` bytes on queue `q`, or refuse it.
    pub fn admit_lossless(&mut self, q: usize, size: u64) -> Result<(), Refused> {
        let threshold = self.threshold(q);
        let queue = &self.queues[q];
        let over_threshold =
            self.shared_of(q) + size > threshold && queue.bytes + size > self.reserve;
        if over_threshold || queue.headroom_used > 0 {
            if queue.headroom_used + size > queue.headroom {
                return Err(Refused::HeadroomOverflow);
            }
            self.queues[q].headroom_used += size;
        } else {
            let before = self.shared_of(q);
            self.queues[q].bytes += size;
            self.shared_used += self.shared_of(q) - before;
        }
        Ok(())
    }

    /// Admit a lossy packet, drop-tail on the shared buffer.
    pub fn admit_lossy(&mut self, size: u64) -> Result<(), Refused> {
        let used = self.reserved_total + self.shared_used + self.lossy_used;
        if used + size > self.buffer {
            return Err(Refused::BufferFull);
        }
        self.lossy_used += size;
        Ok(())
    }

    /// A lossy packet left.
    pub fn release_lossy(&mut self, size: u64) {
        assert!(self.lossy_used >= size, "lossy accounting underflow");
        self.lossy_used -= size;
    }

    /// A lossless packet of `size` from queue `q` left the switch; headroom drains
    /// first.
    pub fn release_lossless(&mut self, q: usize, size: u64) {
        let from_headroom = self.queues[q].headroom_used.min(size);
        self.queues[q].headroom_used -= from_headroom;
        let rest = size - from_headroom;
        assert!(self.queues[q].bytes >= rest, "ingress accounting underflow");
        let before = self.shared_of(q);
        self.queues[q].bytes -= rest;
        self.shared_used -= before - self.shared_of(q);
    }

    /// What queue `q` must tell its upstream now, if anything.
    pub fn pfc_action(&mut self, q: usize) -> Option<PfcAction> {
        let threshold = self.threshold(q);
        let shared = self.shared_of(q);
        let queue = &mut self.queues[q];
        if !queue.pausing && (queue.headroom_used > 0 || shared >= threshold) {
            queue.pausing = true;
            return Some(PfcAction::Pause);
        }
        if queue.pausing
            && queue.headroom_used == 0
            && (shared == 0 || shared + self.resume_offset <= threshold)
        {
            queue.pausing = false;
            return Some(PfcAction::Resume);
        }
        None
    }

    /// True while queue `q` holds its upstream paused.
    pub fn pausing(&self, q: usize) -> bool {
        self.queues[q].pausing
    }

    /// Bytes buffered in all.
    pub fn used_bytes(&self) -> u64 {
        self.shared_used
            + self.lossy_used
            + self
                .queues
                .iter()
                .map(|q| q.bytes.min(self.reserve) + q.headroom_used)
                .sum::<u64>()
    }

    /// Forget everything (a reboot); returns the queues that were pausing.
    pub fn reset(&mut self) -> Vec<usize> {
        let pausing = (0..self.queues.len())
            .filter(|&q| self.queues[q].pausing)
            .collect();
        for q in &mut self.queues {
            q.bytes = 0;
            q.headroom_used = 0;
            q.pausing = false;
        }
        self.shared_used = 0;
        self.lossy_used = 0;
        pausing
    }

    /// Assert the accounting invariants.
    pub fn self_check(&self) {
        let shared: u64 = (0..self.queues.len()).map(|q| self.shared_of(q)).sum();
        assert_eq!(shared, self.shared_used, "shared-use accounting drifted");
        for q in &self.queues {
            assert!(q.headroom_used <= q.headroom, "headroom over its size");
        }
        assert!(self.used_bytes() <= self.buffer, "buffer over its size");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_pauses_past_its_threshold_uses_headroom_and_resumes() {
        // 1 MiB buffer, two ports with 40 KB headroom, shift 3.
        let mut m = Mmu::new(1 << 20, 4096, 3072, &[(40_000, 3), (40_000, 3)]);
        let t0 = m.threshold(0);
        let mut sent = 0;
        while m.pfc_action(0).is_none() {
            m.admit_lossless(0, 1000).unwrap();
            sent += 1000;
            m.self_check();
        }
        assert!(m.pausing(0));
        assert!(
            sent as u64 <= t0 + 4096 + 1000,
            "paused late: {sent} vs {t0}"
        );
        // In flight after XOFF lands in headroom until it is full.
        let mut in_flight = 0;
        while m.admit_lossless(0, 1000).is_ok() {
            in_flight += 1000;
        }
        // The packet that crossed the threshold may itself have gone to headroom.
        assert!((39_000..=40_000).contains(&in_flight), "{in_flight}");
        assert_eq!(m.admit_lossless(0, 1000), Err(Refused::HeadroomOverflow));
        m.self_check();
        // Draining empties the headroom first, then resumes.
        let mut drained = 0;
        loop {
            m.release_lossless(0, 1000);
            drained += 1000;
            if let Some(a) = m.pfc_action(0) {
                assert_eq!(a, PfcAction::Resume);
                break;
            }
        }
        assert!(drained > 40_000);
        m.self_check();
        assert_eq!(m.reset(), Vec::<usize>::new());
    }

    #[test]
    fn the_threshold_shrinks_as_the_shared_buffer_fills() {
        let mut m = Mmu::new(1 << 20, 0, 3072, &[(10_000, 3), (10_000, 3)]);
        let before = m.threshold(1);
        for _ in 0..100 {
            m.admit_lossless(0, 1000).unwrap();
        }
        assert!(m.threshold(1) < before);
        assert_eq!(m.used_bytes(), 100_000);
    }
}
