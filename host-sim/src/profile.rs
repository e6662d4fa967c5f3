//! Cost profiles: what a network stack or an NVMe driver costs the host's CPU.
//!
//! Every constant is a figure published for real hardware, named next to it; none
//! is fitted to make an experiment come out one way. Costs are nanoseconds on the
//! reference CPU ([`REFERENCE_MHZ`]); a host with another clock scales them
//! (see [`crate::cpu`]). The table of constants and sources is also in the README.

/// The clock the costs are given at: the Xeon Gold 6128 (3.4 GHz) of the kernel
/// TCP measurements below (Cai et al., SIGCOMM 2021, section 2.2). Figures
/// measured on other machines (named with each) are taken as they are, not
/// rescaled to it.
pub const REFERENCE_MHZ: u32 = 3400;

/// Cost of work on a core of the other NUMA node, percent of local: Cai et al.
/// (SIGCOMM 2021, figure 4) measure about 20% less throughput per core when the
/// network processing runs on the NUMA node remote from the NIC, i.e. 1 / 0.8.
pub const NUMA_REMOTE_COST_PCT: u32 = 125;

/// A host network stack.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NetStack {
    /// The kernel's TCP/IP stack, through sockets.
    KernelTcp(KernelTcp),
    /// RDMA verbs: the NIC moves the bytes.
    Rdma(Rdma),
}

/// Kernel TCP: a system call per message, the payload copied (and, without
/// offload, checksummed) by the CPU on both sides, per-packet protocol work in
/// softirq, interrupts coalesced by the NIC, and a wake-up of the receiving
/// thread per batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelTcp {
    /// One `sendmsg` or `recvmsg` call, excluding its copy, ns.
    pub syscall_ns: u64,
    /// Copying between user and kernel buffers, picoseconds per byte.
    pub copy_ps_per_byte: u64,
    /// Software checksum, picoseconds per byte (0 with checksum offload).
    pub checksum_ps_per_byte: u64,
    /// Protocol processing per MTU packet (TCP/IP, the driver and the interrupt
    /// that brought it, in softirq on receive, in the sending thread on
    /// transmit), ns.
    pub packet_ns: u64,
    /// Waking a thread blocked on a socket (the scheduler's wake-up and the
    /// context switch to it), ns.
    pub wakeup_ns: u64,
    /// Interrupt coalescing: the NIC waits this long after the first packet...
    pub coalesce_us: u64,
    /// ... or until this many packets have arrived, whichever is first.
    pub coalesce_packets: u64,
}

/// RDMA: posting a work request and polling its completion cost a little CPU; the
/// NIC does the rest, at most `nic_messages_per_sec` messages a second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rdma {
    /// `ibv_post_send` or `ibv_post_recv` of one work request, ns.
    pub post_ns: u64,
    /// `ibv_poll_cq` finding one completion, ns.
    pub poll_ns: u64,
    /// The NIC's message rate, messages per second (sent and received).
    pub nic_messages_per_sec: u64,
}

/// Picoseconds per byte times bytes, in ns.
fn per_byte_ns(ps_per_byte: u64, bytes: u64) -> u64 {
    (ps_per_byte * bytes).div_ceil(1000)
}

impl KernelTcp {
    /// Linux on a 100 GbE NIC (mlx5), costs from the sources named.
    pub const LINUX: KernelTcp = KernelTcp {
        // A null system call's round trip with the page-table isolation that
        // Meltdown brought: "a touch over 300 ns" on a Skylake (blog.i0.pm, "what
        // a syscall actually costs you", 2019). No peer-reviewed figure for
        // sendmsg's fixed part was found; this is its floor.
        syscall_ns: 300,
        // Cai et al., "Understanding Host Network Stack Overheads", SIGCOMM 2021:
        // one core receives about 42 Gb/s (5.25 GB/s) of one long flow, and the
        // data copy takes more than half its cycles: 0.5 / 5.25 GB/s = 95 ps/B.
        copy_ps_per_byte: 95,
        // Offloaded: the mlx5 driver advertises NETIF_F_IP_CSUM, IPV6_CSUM and
        // RXCSUM (drivers/net/ethernet/mellanox/mlx5/core/en_main.c).
        checksum_ps_per_byte: 0,
        // The other half of Cai et al.'s cycles (skb allocation, TCP/IP, driver,
        // interrupts) at their 9000 B MTU: 0.5 x 9000 B / 5.25 GB/s = 857 ns.
        packet_ns: 857,
        // Li, Ding and Shen, "Quantifying the Cost of Context Switch", ExpCS 2007:
        // a direct context switch costs 3.8 us (2.0 GHz Xeon, Linux 2.6.17).
        wakeup_ns: 3800,
        // mlx5 adaptive interrupt moderation (on by default) starts from the
        // CQE-mode profile 1: 8 us or 128 packets (lib/dim/net_dim.c,
        // NET_DIM_DEF_PROFILE_CQE).
        coalesce_us: 8,
        coalesce_packets: 128,
    };

    /// The sending thread's work for one message of `bytes` in `packets`
    /// packets: the call, the copy and checksum, the per-packet work.
    pub fn send_ns(&self, bytes: u64, packets: u64) -> u64 {
        self.syscall_ns
            + per_byte_ns(self.copy_ps_per_byte + self.checksum_ps_per_byte, bytes)
            + packets * self.packet_ns
    }

    /// Softirq work for a batch of `packets` packets of `bytes` taken in one
    /// interrupt: the per-packet work (which includes the interrupts' share,
    /// see `packet_ns`) and the checksum.
    pub fn softirq_ns(&self, bytes: u64, packets: u64) -> u64 {
        packets * self.packet_ns + per_byte_ns(self.checksum_ps_per_byte, bytes)
    }

    /// The receiving thread's work for a batch of `messages` messages of `bytes`:
    /// one wake-up, a call and a copy per message.
    pub fn receive_ns(&self, bytes: u64, messages: u64) -> u64 {
        self.wakeup_ns + messages * self.syscall_ns + per_byte_ns(self.copy_ps_per_byte, bytes)
    }
}

impl Rdma {
    /// A 100 GbE RDMA NIC driven through verbs, costs from the sources named.
    pub const VERBS: Rdma = Rdma {
        // eRPC (Kalia et al., NSDI 2019) does about 10 M small RPCs per second on
        // one core over RDMA-class NICs: at most 100 ns of CPU per message, all
        // of its logic included; split evenly between the post and the poll (no
        // separate figure for either was found).
        post_ns: 50,
        poll_ns: 50,
        // NVIDIA ConnectX-6 EN: "215 million messages per second" (user manual,
        // introduction; product brief).
        nic_messages_per_sec: 215_000_000,
    };

    /// Sending one message: one post (the completion is polled in batches by
    /// selective signalling, so it costs a poll only every so often; counted here
    /// as one poll per message, the upper bound).
    pub fn send_ns(&self) -> u64 {
        self.post_ns + self.poll_ns
    }

    /// Receiving one message: its completion polled, a receive posted again.
    pub fn receive_ns(&self) -> u64 {
        self.poll_ns + self.post_ns
    }

    /// The NIC's time per message, ns.
    pub fn nic_ns_per_message(&self) -> u64 {
        1_000_000_000u64.div_ceil(self.nic_messages_per_sec.max(1))
    }
}

/// An NVMe driver.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum NvmeDriver {
    /// The kernel's: a system call and the block layer to submit, an interrupt
    /// and a wake-up to complete.
    Kernel(KernelNvme),
    /// A user-space polled driver (SPDK): a dedicated core polls the completion
    /// queues all the time; submitting and completing cost only their own work.
    Polled(PolledNvme),
}

/// The kernel NVMe path.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KernelNvme {
    /// Submission: the system call, the block layer and the driver's queueing, ns.
    pub submit_ns: u64,
    /// Completion: the interrupt, the block layer's completion, and the waiting
    /// thread woken to reap it, ns.
    pub complete_ns: u64,
}

/// The polled user-space NVMe path.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PolledNvme {
    /// Building and ringing one command, ns.
    pub submit_ns: u64,
    /// Finding and handling one completion, ns.
    pub complete_ns: u64,
}

impl KernelNvme {
    /// Linux's NVMe driver with interrupts, one per completion (the NVMe
    /// Interrupt Coalescing feature resets to 0h, no aggregation: NVMe Base
    /// Specification 2.1, section 5.1.25.2.2).
    pub const LINUX: KernelNvme = KernelNvme {
        // Axboe, "Efficient IO with io_uring" (2019), section 9: libaio, the
        // classic interrupt-driven path, peaks at 608K 4 KiB IOPS per core: 1,645
        // ns of CPU per I/O, split evenly between submission and completion.
        submit_ns: 822,
        complete_ns: 823,
    };
}

impl PolledNvme {
    /// SPDK's NVMe driver.
    pub const SPDK: PolledNvme = PolledNvme {
        // SPDK, "80 Million I/O Per Second with a Standard 2U Intel Xeon SP
        // Server" (spdk.io, 2021-05-06): 13.85 M IOPS on one core (Xeon Platinum
        // 8380): 72 ns per I/O, split evenly between submission and completion.
        submit_ns: 36,
        complete_ns: 36,
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_tcp_costs_add_up() {
        let t = KernelTcp {
            syscall_ns: 1000,
            copy_ps_per_byte: 100,
            checksum_ps_per_byte: 50,
            packet_ns: 300,
            wakeup_ns: 2000,
            coalesce_us: 8,
            coalesce_packets: 64,
        };
        // 8 KiB in two packets: 1000 + 8192 * 0.15 + 2 * 300.
        assert_eq!(t.send_ns(8192, 2), 1000 + 1229 + 600);
        // A batch of 3 packets, 10,000 bytes: the packets and the checksum.
        assert_eq!(t.softirq_ns(10_000, 3), 900 + 500);
        // Two messages: one wake-up, two calls, the copy.
        assert_eq!(t.receive_ns(10_000, 2), 2000 + 2000 + 1000);
        // Nothing is free in the kernel profile, and per-byte work grows with size.
        let l = KernelTcp::LINUX;
        assert!(l.send_ns(4096, 1) > l.syscall_ns && l.send_ns(1 << 20, 256) > l.send_ns(4096, 1));
        assert!(l.coalesce_us > 0 && l.coalesce_packets > 0);
    }

    #[test]
    fn rdma_costs_do_not_grow_with_size() {
        let r = Rdma::VERBS;
        assert_eq!(r.send_ns(), r.post_ns + r.poll_ns);
        assert_eq!(r.receive_ns(), r.post_ns + r.poll_ns);
        assert!(r.nic_ns_per_message() > 0);
        // The CPU cost of an RDMA message is below that of the smallest kernel
        // TCP message.
        assert!(r.send_ns() < KernelTcp::LINUX.send_ns(64, 1));
    }

    #[test]
    fn the_polled_driver_costs_less_per_command() {
        let k = KernelNvme::LINUX;
        let p = PolledNvme::SPDK;
        assert!(p.submit_ns + p.complete_ns < k.submit_ns + k.complete_ns);
        assert!(p.submit_ns > 0 && p.complete_ns > 0);
    }
}
