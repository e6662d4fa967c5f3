//! [`Nic`]: the verbs the daemon's transport uses, as a trait with two
//! implementations: real verbs (`verbs_nic::VerbsNic`, feature
//! `verbs`) and an in-process loopback ([`super::loopback::LoopNic`]) on which
//! the transport's own tests run, since these machines have no RDMA NIC.

use std::future::Future;

/// Where a queue pair is, as the connection manager exchanges it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Its queue pair number.
    pub qpn: u32,
    /// The first PSN it sends with (random per connection).
    pub psn: u32,
    /// Its port's GID.
    pub gid: [u8; 16],
    /// Its port's active MTU, bytes (the connection uses the smaller side's).
    pub mtu: u32,
}

/// Queue pair sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Send work requests outstanding.
    pub send: u32,
    /// Receive work requests posted.
    pub recv: u32,
    /// Bytes a send may carry inline.
    pub inline: u32,
}

/// A send work request's operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// SEND into the peer's next posted receive.
    Send,
    /// RDMA WRITE_WITH_IMM at `remote_addr` of the peer's region `rkey`,
    /// consuming a posted receive there that completes with `imm`.
    WriteImm {
        /// Where.
        remote_addr: u64,
        /// The peer's region key.
        rkey: u32,
        /// The immediate.
        imm: u32,
    },
}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wc {
    /// The work request's id.
    pub wr_id: u64,
    /// Whether it succeeded (an error or a flush fails the queue pair).
    pub ok: bool,
    /// Bytes received (receives).
    pub byte_len: u32,
    /// The immediate of a WRITE_WITH_IMM that consumed the receive.
    pub imm: Option<u32>,
}

/// A port's congestion counters, cumulative since the NIC started (a RoCE
/// NIC counts them per port, not per queue pair; mlx5's `hw_counters`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortCounters {
    /// CNPs the port received and acted on (`rp_cnp_handled`).
    pub cnps: u64,
    /// RoCE packets that arrived ECN-marked (`np_ecn_marked_roce_packets`).
    pub marked_in: u64,
    /// Retransmission episodes: NAKs for a sequence error and ACK timeouts
    /// (`packet_seq_err` + `local_ack_timeout_err`).
    pub retransmits: u64,
}

/// A failure of the NIC itself (not of a connection's protocol).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NicError(pub String);

/// Registered memory.
pub trait Mem: Send + 'static {
    /// Its length.
    fn len(&self) -> usize;
    /// Whether it is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The address a peer writes to at `offset`.
    fn addr(&self, offset: usize) -> u64;
    /// The key a peer names it by.
    fn rkey(&self) -> u32;
    /// A copy of `len` bytes at `offset` (no work request may be writing them).
    fn read(&self, offset: usize, len: usize) -> bytes::Bytes;
    /// Copy `parts` one after another to `offset` (no work request may be
    /// reading them).
    fn write(&mut self, offset: usize, parts: &[&[u8]]);
}

/// The verbs the transport's driver uses. One driver task owns the NIC.
pub trait Nic: Send + 'static {
    /// Registered memory.
    type Mem: Mem;
    /// A reliable-connected queue pair.
    type Qp: Send + 'static;
    /// A protection domain: a queue pair reaches only memory of its own, so a
    /// peer that names another connection's region and key is refused by
    /// the NIC.
    type Pd: Send + 'static;

    /// How many paths (ports) it has.
    fn paths(&self) -> u8;
    /// A new protection domain (one per connection).
    fn domain(&mut self) -> Result<Self::Pd, NicError>;
    /// Register `len` zeroed bytes in `pd`; `remote_write` lets the peer of
    /// `pd`'s queue pair write into them.
    fn register(
        &mut self,
        pd: &Self::Pd,
        len: usize,
        remote_write: bool,
    ) -> Result<Self::Mem, NicError>;
    /// A queue pair in `pd` on `path`, ready for receives (INIT), and its
    /// endpoint.
    fn create_qp(
        &mut self,
        pd: &Self::Pd,
        path: u8,
        caps: Caps,
    ) -> Result<(Self::Qp, Endpoint), NicError>;
    /// Connect `qp` to `remote` (RTR, then RTS).
    fn connect(&mut self, qp: &mut Self::Qp, path: u8, remote: &Endpoint) -> Result<(), NicError>;
    /// Post a receive of `len` bytes at `offset` of `mem`.
    ///
    /// # Safety
    ///
    /// `mem` must stay alive, and those bytes untouched, until the receive
    /// completes or `qp` is dropped (drop the queue pair before its memory).
    unsafe fn post_recv(
        &mut self,
        qp: &Self::Qp,
        wr_id: u64,
        mem: &Self::Mem,
        offset: usize,
        len: u32,
    ) -> Result<(), NicError>;
    /// Post a send of `len` bytes at `offset` of `mem` (connected queue pairs
    /// only).
    ///
    /// # Safety
    ///
    /// Unless `inline`, `mem` must stay alive and those bytes unchanged until
    /// the send completes (signalled, or before a signalled one: RC completes
    /// in order) or `qp` is dropped.
    #[allow(clippy::too_many_arguments)]
    unsafe fn post_send(
        &mut self,
        qp: &Self::Qp,
        wr_id: u64,
        op: SendOp,
        mem: &Self::Mem,
        offset: usize,
        len: u32,
        signaled: bool,
        inline: bool,
    ) -> Result<(), NicError>;
    /// Path `path`'s congestion counters, if the NIC reports them.
    fn counters(&self, path: u8) -> Option<PortCounters>;
    /// Append completions to `out`; never blocks.
    fn poll(&mut self, out: &mut Vec<Wc>) -> Result<(), NicError>;
    /// Ask to be woken at the next completion (then poll once more: one may
    /// have come in between).
    fn arm(&mut self) -> Result<(), NicError>;
    /// Resolves once a completion came after [`Nic::arm`].
    fn wait(&self) -> impl Future<Output = Result<(), NicError>> + Send + '_;
}
