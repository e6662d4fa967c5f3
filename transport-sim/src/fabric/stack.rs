//! Host network stacks: what sending and receiving a message costs the host's CPU
//! (see `weir_host_sim`), between the application and the NIC.
//!
//! A host with no stack attached costs nothing: its messages go to the NIC when
//! sent and to the application when their last packet arrives. With one:
//! - Kernel TCP, sending: the sending thread's call, copy and per-packet work run
//!   on a core; the message reaches the NIC when they end.
//! - Kernel TCP, receiving: the NIC spreads flows over receive queues (RSS), one
//!   per general core; a queue raises its interrupt `coalesce_us` after the first
//!   message of a batch is complete (its last packet in), or at once when
//!   `coalesce_packets` have arrived; the softirq then
//!   runs on the queue's core for the whole batch, and the receiving thread is
//!   woken once for it and takes each message with a call and a copy. The batch
//!   reaches the application when that ends.
//! - RDMA: a post (sending) or a poll and a re-post (receiving) on a core, and the
//!   NIC's own per-message time, serialized per host and direction: its message
//!   rate.
//!
//! Order per peer pair is kept: a message never reaches the NIC, or the
//! application, before one sent before it on the same pair.

use super::topology::{HostIdx, Path};
use super::{Engine, Event};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use weir_core::wire::Frame;
use weir_host_sim::{Affinity, Cpu, NetStack, Work};

/// Receive queues (RSS) of one host's NIC at most.
pub(super) const RX_QUEUES_MAX: usize = 64;
/// NUMA node the NIC is attached to.
const NIC_NUMA_NODE: u8 = 0;

/// Messages taken by one interrupt: (sender, frame, when it was sent).
pub(super) type Batch = Vec<((HostIdx, Path), Frame, u64)>;

#[derive(Debug, Default)]
struct RxQueue {
    pending: Batch,
    packets: u64,
    bytes: u64,
    /// When the pending batch's interrupt fires.
    irq_at: Option<u64>,
    /// When the last batch reached the application: the next is not earlier.
    last_done_ns: u64,
}

/// One host's stack and the CPU it runs on.
#[derive(Debug)]
pub(super) struct Stack {
    cpu: Arc<Mutex<Cpu>>,
    net: NetStack,
    rx: Vec<RxQueue>,
    /// Per destination: when the last message reached the NIC.
    tx_done_ns: BTreeMap<HostIdx, u64>,
    /// Per destination: bytes sent and not yet at the NIC.
    tx_bytes: BTreeMap<HostIdx, u64>,
    /// The NIC's send and receive message engines are busy until (RDMA's
    /// message rate, taken as each direction's).
    nic_tx_free_ns: u64,
    nic_rx_free_ns: u64,
}

impl Stack {
    pub(super) fn new(cpu: Arc<Mutex<Cpu>>, net: NetStack) -> Stack {
        let queues = {
            let c = cpu.lock().expect("cpu");
            let s = c.spec();
            ((s.cores - s.poll_cores) as usize).clamp(1, RX_QUEUES_MAX)
        };
        Stack {
            cpu,
            net,
            rx: (0..queues).map(|_| RxQueue::default()).collect(),
            tx_done_ns: BTreeMap::new(),
            tx_bytes: BTreeMap::new(),
            nic_tx_free_ns: 0,
            nic_rx_free_ns: 0,
        }
    }

    /// Run work arriving at `at_ns` (`now_ns` or later): when it ends.
    fn run(&self, (now_ns, at_ns): (u64, u64), cost_ns: u64, affinity: Affinity) -> u64 {
        let work = Work {
            cost_ns,
            affinity,
            numa_node: NIC_NUMA_NODE,
        };
        self.cpu
            .lock()
            .expect("cpu")
            .run_at(now_ns, at_ns, work)
            .end_ns
    }

    /// The NIC's message engine of one direction takes one message at `at_ns`:
    /// when it is done.
    fn nic_message(free_ns: &mut u64, at_ns: u64, ns_per_message: u64) -> u64 {
        let start = at_ns.max(*free_ns);
        *free_ns = start + ns_per_message;
        *free_ns
    }

    /// Bytes sent towards `dst` that have not reached the NIC yet.
    pub(super) fn tx_bytes(&self, dst: HostIdx) -> u64 {
        self.tx_bytes.get(&dst).copied().unwrap_or(0)
    }
}

impl Engine {
    /// Charge `host`'s sends and receives to `cpu` by `net`'s costs from now on.
    pub fn attach_stack(&mut self, host: HostIdx, cpu: Arc<Mutex<Cpu>>, net: NetStack) {
        assert!(host < self.attached, "unknown host");
        self.stacks[host] = Some(Stack::new(cpu, net));
    }

    fn packets_of(&self, bytes: u64) -> u64 {
        bytes.div_ceil(u64::from(self.config.nic.mtu_bytes)).max(1)
    }

    /// The application on `src` sends `frame` to `dst`: straight to the NIC, or
    /// through the stack's CPU work first.
    pub(super) fn app_send(&mut self, src: HostIdx, dst: HostIdx, path: Path, frame: Frame) {
        let now = self.now_ns;
        let bytes = frame.len() as u64;
        let packets = self.packets_of(bytes);
        let Some(stack) = self.stacks[src].as_mut() else {
            return self.host_send(src, dst, path, frame);
        };
        let mut done = match stack.net {
            NetStack::KernelTcp(tcp) => {
                stack.run((now, now), tcp.send_ns(bytes, packets), Affinity::Any)
            }
            NetStack::Rdma(rdma) => {
                let posted = stack.run((now, now), rdma.send_ns(), Affinity::Any);
                Stack::nic_message(&mut stack.nic_tx_free_ns, posted, rdma.nic_ns_per_message())
            }
        };
        let last = stack.tx_done_ns.entry(dst).or_default();
        done = done.max(*last);
        *last = done;
        *stack.tx_bytes.entry(dst).or_default() += bytes;
        self.schedule(
            done,
            Event::StackTx {
                src,
                dst,
                path,
                frame,
            },
        );
    }

    /// The stack's send work for `frame` ended: it goes to the NIC.
    pub(super) fn stack_tx(&mut self, src: HostIdx, dst: HostIdx, path: Path, frame: Frame) {
        let stack = self.stacks[src].as_mut().expect("a stack sent it");
        let bytes = stack.tx_bytes.get_mut(&dst).expect("counted when sent");
        *bytes -= frame.len() as u64;
        if *bytes == 0 {
            stack.tx_bytes.remove(&dst);
        }
        self.host_send(src, dst, path, frame);
    }

    /// The last packet of `frame` reached `dst`: to the application, or through
    /// the stack's receive path first.
    pub(super) fn stack_receive(
        &mut self,
        (src, path): (HostIdx, Path),
        dst: HostIdx,
        frame: Frame,
        sent_ns: u64,
    ) {
        let now = self.now_ns;
        let bytes = frame.len() as u64;
        let packets = self.packets_of(bytes);
        let Some(stack) = self.stacks[dst].as_mut() else {
            return self.deliver((src, path), dst, frame, sent_ns);
        };
        let q = (Self::flow_hash_of(src, dst) % stack.rx.len() as u64) as usize;
        match stack.net {
            NetStack::KernelTcp(tcp) => {
                let queue = &mut stack.rx[q];
                queue.pending.push(((src, path), frame, sent_ns));
                queue.packets += packets;
                queue.bytes += bytes;
                if queue.packets >= tcp.coalesce_packets {
                    self.stack_interrupt(dst, q);
                } else if queue.irq_at.is_none() {
                    let at = now + tcp.coalesce_us * 1000;
                    queue.irq_at = Some(at);
                    self.schedule(
                        at,
                        Event::StackIrq {
                            host: dst,
                            queue: q,
                            at,
                        },
                    );
                }
            }
            NetStack::Rdma(rdma) => {
                let seen =
                    Stack::nic_message(&mut stack.nic_rx_free_ns, now, rdma.nic_ns_per_message());
                let done = stack.run((now, seen), rdma.receive_ns(), Affinity::Core(q));
                self.stack_ready(dst, q, done, vec![((src, path), frame, sent_ns)]);
            }
        }
    }

    /// Receive queue `q` of `host` interrupts: its softirq takes the batch, then
    /// the receiving thread is woken for it. A stale timer (the batch was taken
    /// when it filled) does nothing.
    pub(super) fn stack_interrupt_timer(&mut self, host: HostIdx, q: usize, at: u64) {
        let stack = self.stacks[host].as_ref().expect("a stack armed it");
        if stack.rx[q].irq_at == Some(at) {
            self.stack_interrupt(host, q);
        }
    }

    fn stack_interrupt(&mut self, host: HostIdx, q: usize) {
        let now = self.now_ns;
        let stack = self.stacks[host].as_mut().expect("a stack took it");
        let NetStack::KernelTcp(tcp) = stack.net else {
            unreachable!("only kernel TCP coalesces interrupts")
        };
        let queue = &mut stack.rx[q];
        let batch = std::mem::take(&mut queue.pending);
        let (bytes, packets) = (queue.bytes, queue.packets);
        queue.bytes = 0;
        queue.packets = 0;
        queue.irq_at = None;
        debug_assert!(!batch.is_empty());
        let softirq = stack.run(
            (now, now),
            tcp.softirq_ns(bytes, packets),
            Affinity::Core(q),
        );
        let receive = tcp.receive_ns(bytes, batch.len() as u64);
        let done = stack.run((now, softirq), receive, Affinity::Any);
        self.stack_ready(host, q, done, batch);
    }

    /// Receive queue `q` of `dst` finished its work on `batch` at `done_ns`: it
    /// reaches the application then, never before the queue's previous batch.
    fn stack_ready(&mut self, dst: HostIdx, q: usize, done_ns: u64, batch: Batch) {
        let queue = &mut self.stacks[dst].as_mut().expect("a stack took it").rx[q];
        let done = done_ns.max(queue.last_done_ns);
        queue.last_done_ns = done;
        self.schedule(done, Event::StackDeliver { dst, batch });
    }

    /// A received batch reaches the application.
    pub(super) fn stack_deliver(&mut self, dst: HostIdx, batch: Batch) {
        for (from, frame, sent_ns) in batch {
            self.deliver(from, dst, frame, sent_ns);
        }
    }
}
