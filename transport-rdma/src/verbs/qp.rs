//! RC queue pairs whose verbs states are types: RESET → INIT → RTR → RTS by
//! consuming transitions, sends on [`Qp<Rts>`] only.

use super::{check, mtu_enum, non_null, sys, Cq, Pd, Sge, VerbsError};
use state::{Init, Reset, Rtr, Rts};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::Arc;

/// A queue pair's states (RC). Sends exist in [`Rts`] only.
pub mod state {
    /// Just created.
    #[derive(Debug)]
    pub struct Reset;
    /// Bound to a port; receives may be posted.
    #[derive(Debug)]
    pub struct Init;
    /// Ready to receive from its peer.
    #[derive(Debug)]
    pub struct Rtr;
    /// Ready to send.
    #[derive(Debug)]
    pub struct Rts;
}

/// States in which receives may be posted.
pub trait Receiving {}
impl Receiving for Init {}
impl Receiving for Rtr {}
impl Receiving for Rts {}

/// The far end of a connection, as the connection manager learnt it: the
/// daemon transport's [`Endpoint`](crate::net::nic::Endpoint).
pub use crate::net::nic::Endpoint as Remote;

/// Queue pair sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send work requests outstanding.
    pub send: u32,
    /// Receive work requests posted.
    pub recv: u32,
    /// Bytes a send may carry inline.
    pub inline: u32,
}

/// An RC queue pair in state `S`.
#[derive(Debug)]
pub struct Qp<S> {
    qp: NonNull<sys::ibv_qp>,
    _cq: Arc<Cq>,
    _pd: Arc<Pd>,
    _state: PhantomData<S>,
}

// SAFETY: see `Context`.
unsafe impl<S> Send for Qp<S> {}
// SAFETY: see `Context`.
unsafe impl<S> Sync for Qp<S> {}

/// A send work request's operation (the daemon transport's).
pub use crate::net::nic::SendOp;

impl<S> Qp<S> {
    /// Its number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: valid until drop.
        unsafe { self.qp.as_ref().qp_num }
    }

    fn modify(
        self,
        call: &'static str,
        attr: &mut sys::ibv_qp_attr,
        mask: u32,
    ) -> Result<Self, VerbsError> {
        // SAFETY: the queue pair is valid; `attr` is initialised for `mask`.
        let rc = unsafe { sys::ibv_modify_qp(self.qp.as_ptr(), attr, mask as i32) };
        check(call, rc).map(|()| self)
    }

    fn into_state<T>(self) -> Qp<T> {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped; its fields move into the new value
        // exactly once.
        unsafe {
            Qp {
                qp: me.qp,
                _cq: ptr::read(&me._cq),
                _pd: ptr::read(&me._pd),
                _state: PhantomData,
            }
        }
    }
}

fn qp_attr() -> sys::ibv_qp_attr {
    // SAFETY: plain data; zero is every field's "unset".
    unsafe { std::mem::zeroed() }
}

impl Qp<Reset> {
    /// A new RC queue pair on `pd`, both queues completing on `cq`.
    pub fn new(pd: &Arc<Pd>, cq: &Arc<Cq>, caps: QpCaps) -> Result<Qp<Reset>, VerbsError> {
        // SAFETY: plain data.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.cq.as_ptr();
        init.recv_cq = cq.cq.as_ptr();
        init.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        init.cap.max_send_wr = caps.send;
        init.cap.max_recv_wr = caps.recv;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.cap.max_inline_data = caps.inline;
        // Selective signalling: only the requests that ask for it complete.
        init.sq_sig_all = 0;
        // SAFETY: `pd` and `cq` are valid and outlive the queue pair (Arcs).
        let qp = non_null("ibv_create_qp", unsafe {
            sys::ibv_create_qp(pd.pd.as_ptr(), &mut init)
        })?;
        Ok(Qp {
            qp,
            _cq: cq.clone(),
            _pd: pd.clone(),
            _state: PhantomData,
        })
    }

    /// RESET → INIT on `port`; the peer may write into regions of this domain.
    pub fn init(self, port: u8) -> Result<Qp<Init>, VerbsError> {
        use sys::ibv_qp_attr_mask as m;
        let mut attr = qp_attr();
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = port;
        attr.qp_access_flags = sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        let mask = m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS;
        self.modify("ibv_modify_qp(INIT)", &mut attr, mask.0)
            .map(Qp::into_state)
    }
}

impl Qp<Init> {
    /// INIT → RTR towards `remote` over RoCE v2 (a global route from local GID
    /// `gid_index`, IP traffic class `traffic_class`: 0 leaves the port's
    /// default), path MTU `mtu_bytes` (the smaller of the two ports').
    pub fn ready_to_receive(
        self,
        remote: &Remote,
        port: u8,
        (gid_index, traffic_class): (u8, u8),
        mtu_bytes: u32,
    ) -> Result<Qp<Rtr>, VerbsError> {
        use sys::ibv_qp_attr_mask as m;
        let mut attr = qp_attr();
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = mtu_enum(mtu_bytes).unwrap_or(sys::ibv_mtu::IBV_MTU_1024);
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = remote.psn & 0xFF_FFFF;
        attr.max_dest_rd_atomic = 1;
        // RNR never happens under credits; should it, wait 0.64 ms (value 14).
        attr.min_rnr_timer = 14;
        attr.ah_attr.is_global = 1;
        attr.ah_attr.port_num = port;
        attr.ah_attr.grh.dgid = sys::ibv_gid { raw: remote.gid };
        attr.ah_attr.grh.sgid_index = gid_index;
        attr.ah_attr.grh.hop_limit = 64;
        attr.ah_attr.grh.traffic_class = traffic_class;
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_AV
            | m::IBV_QP_PATH_MTU
            | m::IBV_QP_DEST_QPN
            | m::IBV_QP_RQ_PSN
            | m::IBV_QP_MAX_DEST_RD_ATOMIC
            | m::IBV_QP_MIN_RNR_TIMER;
        self.modify("ibv_modify_qp(RTR)", &mut attr, mask.0)
            .map(Qp::into_state)
    }
}

/// RC retry settings: the local ACK timeout is 4.096 us x 2^`timeout`; after
/// `retry_cnt` retries (at most 7) the QP fails with an error completion.
pub const ACK_TIMEOUT: u8 = 14;
/// See [`ACK_TIMEOUT`].
pub const RETRY_COUNT: u8 = 7;

impl Qp<Rtr> {
    /// RTR → RTS, sending from PSN `psn` (random per connection).
    pub fn ready_to_send(self, psn: u32) -> Result<Qp<Rts>, VerbsError> {
        use sys::ibv_qp_attr_mask as m;
        let mut attr = qp_attr();
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
        attr.sq_psn = psn & 0xFF_FFFF;
        attr.timeout = ACK_TIMEOUT;
        attr.retry_cnt = RETRY_COUNT;
        // No RNR retries: credits mean a receive is always posted, and one that
        // is not is a bug to see, not to wait out.
        attr.rnr_retry = 0;
        attr.max_rd_atomic = 1;
        let mask = m::IBV_QP_STATE
            | m::IBV_QP_SQ_PSN
            | m::IBV_QP_TIMEOUT
            | m::IBV_QP_RETRY_CNT
            | m::IBV_QP_RNR_RETRY
            | m::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify("ibv_modify_qp(RTS)", &mut attr, mask.0)
            .map(Qp::into_state)
    }
}

impl<S: Receiving> Qp<S> {
    /// Post a receive of `sge`, completing with `wr_id`.
    ///
    /// # Safety
    ///
    /// `sge` must lie in a [`MemoryRegion`](super::MemoryRegion) of this queue pair's protection
    /// domain that stays alive, and that nothing else reads or writes, until
    /// the receive completes (or the queue pair is destroyed).
    pub unsafe fn post_recv(&self, wr_id: u64, sge: Sge) -> Result<(), VerbsError> {
        let mut sg = sys::ibv_sge {
            addr: sge.addr,
            length: sge.len,
            lkey: sge.lkey,
        };
        let mut wr = sys::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sg,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: `wr` and `sg` are valid for the call (the NIC copies the
        // request); the memory they name is the caller's promise.
        check("ibv_post_recv", unsafe {
            sys::ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad)
        })
    }
}

impl Qp<Rts> {
    /// Post one send work request.
    ///
    /// # Safety
    ///
    /// Unless `inline` (the NIC copies the bytes during the call), `sge` must
    /// lie in a [`MemoryRegion`](super::MemoryRegion) of this queue pair's protection domain that
    /// stays alive and unchanged until the request completes: signalled, or
    /// covered by a later signalled request's completion (RC completes in
    /// order), or flushed.
    pub unsafe fn post_send(
        &self,
        wr_id: u64,
        op: SendOp,
        sge: Sge,
        signaled: bool,
        inline: bool,
    ) -> Result<(), VerbsError> {
        let mut sg = sys::ibv_sge {
            addr: sge.addr,
            length: sge.len,
            lkey: sge.lkey,
        };
        // SAFETY: plain data.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sg;
        wr.num_sge = 1;
        let mut flags = 0;
        if signaled {
            flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if inline {
            flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        wr.send_flags = flags;
        match op {
            SendOp::Send => wr.opcode = sys::ibv_wr_opcode::IBV_WR_SEND,
            SendOp::WriteImm {
                remote_addr,
                rkey,
                imm,
            } => {
                wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                wr.wr.rdma = sys::rdma_t { remote_addr, rkey };
            }
        }
        let mut bad = ptr::null_mut();
        // SAFETY: the request is valid for the call; the memory is the
        // caller's promise.
        check("ibv_post_send", unsafe {
            sys::ibv_post_send(self.qp.as_ptr(), &mut wr, &mut bad)
        })
    }
}

impl<S> Drop for Qp<S> {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once (`into_state` never drops
        // the value it moves out of).
        unsafe { sys::ibv_destroy_qp(self.qp.as_ptr()) };
    }
}
