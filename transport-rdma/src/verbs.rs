//! rdma-core's verbs, made safe: the only `unsafe` code of weir's RDMA
//! transport, and the only module that names `rdma_sys` (unmaintained since
//! 2022; moving to another binding touches this file alone).
//!
//! The verbs rules are types here:
//! - every object owns its handle and destroys it on drop, and holds an `Arc`
//!   of what it was made from, so a protection domain outlives its regions and
//!   queue pairs, and a device context outlives everything;
//! - a queue pair moves RESET → INIT → RTR → RTS by consuming transitions
//!   ([`Qp::init`], [`Qp::ready_to_receive`], [`Qp::ready_to_send`]); sends
//!   exist only on [`Qp<Rts>`], receives from INIT on. A transition that fails
//!   destroys the queue pair: the connection is set up again on a fresh one;
//! - posting names memory by an [`Sge`] of a [`MemoryRegion`]; posting is
//!   `unsafe`, because the NIC reads or writes that memory until the work
//!   request completes, which no borrow can express.
//!
//! What ran where: these machines have no RDMA device, so only the device
//! check (which reports the missing device), the layout tests and the pure
//! conversions run in `cargo xtask test`; the tests that open a device are
//! `#[ignore = "requires an RDMA device"]` and run with `cargo xtask test-rdma`.

use rdma_sys as sys;
use std::ffi::CStr;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};
use std::sync::Arc;

/// Why a verbs call failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerbsError {
    /// The machine has no RDMA device (no NIC, no driver loaded, or no
    /// Soft-RoCE link).
    #[error(
        "no RDMA device on this machine (ibv_get_device_list: {})",
        std::io::Error::from_raw_os_error(*.errno)
    )]
    NoDevice {
        /// What `ibv_get_device_list` left in errno (0 for an empty list).
        errno: i32,
    },
    /// The named device is not among the machine's.
    #[error("no RDMA device named {name:?} (this machine has {available:?})")]
    NotFound {
        /// The name asked for.
        name: String,
        /// The devices there are.
        available: Vec<String>,
    },
    /// A verbs call failed.
    #[error("{call}: {}", std::io::Error::from_raw_os_error(*.errno))]
    Call {
        /// The call.
        call: &'static str,
        /// Its errno.
        errno: i32,
    },
    /// A port that is not active (link down or not configured).
    #[error("port {port} of {device} is not active")]
    PortDown {
        /// The device.
        device: String,
        /// The port.
        port: u8,
    },
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A failed call: `rc` is its return (a negative errno, a positive errno, or
/// -1 with errno set, as the verbs differ).
fn check(call: &'static str, rc: i32) -> Result<(), VerbsError> {
    match rc {
        0 => Ok(()),
        -1 => Err(VerbsError::Call {
            call,
            errno: errno(),
        }),
        rc => Err(VerbsError::Call {
            call,
            errno: rc.abs(),
        }),
    }
}

fn non_null<T>(call: &'static str, p: *mut T) -> Result<NonNull<T>, VerbsError> {
    NonNull::new(p).ok_or_else(|| VerbsError::Call {
        call,
        errno: errno(),
    })
}

/// An RDMA device of this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Its name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// Its node GUID, host byte order.
    pub guid: u64,
}

/// The machine's RDMA devices; [`VerbsError::NoDevice`] when it has none.
pub fn devices() -> Result<Vec<DeviceInfo>, VerbsError> {
    let mut n = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below and no
    // device pointer is kept past it.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(VerbsError::NoDevice { errno: errno() });
    }
    let mut found = Vec::with_capacity(n.max(0) as usize);
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` valid device pointers until freed; the
        // name is a NUL-terminated string owned by the device.
        unsafe {
            let dev = *list.add(i);
            let name = CStr::from_ptr(sys::ibv_get_device_name(dev))
                .to_string_lossy()
                .into_owned();
            let guid = u64::from_be(sys::ibv_get_device_guid(dev));
            found.push(DeviceInfo { name, guid });
        }
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { sys::ibv_free_device_list(list) };
    if found.is_empty() {
        return Err(VerbsError::NoDevice { errno: 0 });
    }
    Ok(found)
}

/// An open device.
#[derive(Debug)]
pub struct Context {
    ctx: NonNull<sys::ibv_context>,
    name: String,
}

// SAFETY: libibverbs' objects may be used from any thread (rdma-core's
// "thread safety" guarantee of the verbs API); weir never shares one
// mutably without a lock of its own.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

/// The state of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortInfo {
    /// Up and usable.
    pub active: bool,
    /// The active MTU, bytes.
    pub mtu_bytes: u32,
    /// Ethernet (RoCE) rather than InfiniBand.
    pub ethernet: bool,
}

/// verbs.h's `IBV_LINK_LAYER_ETHERNET` (an anonymous enum the bindings leave out).
const LINK_LAYER_ETHERNET: u8 = 2;

/// Bytes of a verbs MTU enum value (`IBV_MTU_256` = 1 ... `IBV_MTU_4096` = 5).
pub fn mtu_bytes(mtu: u32) -> Option<u32> {
    (1..=5).contains(&mtu).then(|| 128 << mtu)
}

/// The verbs MTU enum value of `bytes` (256 to 4096, a power of two).
pub fn mtu_enum(bytes: u32) -> Option<u32> {
    (1..=5).find(|&m| 128 << m == bytes)
}

impl Context {
    /// Open device `name`, or the first one.
    pub fn open(name: Option<&str>) -> Result<Arc<Context>, VerbsError> {
        let mut n = 0;
        // SAFETY: as in `devices`.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        if list.is_null() || n == 0 {
            let errno = if list.is_null() { errno() } else { 0 };
            if !list.is_null() {
                // SAFETY: freed once.
                unsafe { sys::ibv_free_device_list(list) };
            }
            return Err(VerbsError::NoDevice { errno });
        }
        let mut names = Vec::new();
        let mut chosen = None;
        for i in 0..n as usize {
            // SAFETY: `n` valid entries until the list is freed.
            let (dev, dev_name) = unsafe {
                let dev = *list.add(i);
                let dev_name = CStr::from_ptr(sys::ibv_get_device_name(dev))
                    .to_string_lossy()
                    .into_owned();
                (dev, dev_name)
            };
            if chosen.is_none() && name.is_none_or(|want| want == dev_name) {
                chosen = Some((dev, dev_name.clone()));
            }
            names.push(dev_name);
        }
        let result = match chosen {
            // SAFETY: `dev` is valid while the list is; the context opened
            // from it stays valid after the list is freed (verbs(3)).
            Some((dev, name)) => non_null("ibv_open_device", unsafe { sys::ibv_open_device(dev) })
                .map(|ctx| Arc::new(Context { ctx, name })),
            None => Err(VerbsError::NotFound {
                name: name.unwrap_or_default().to_string(),
                available: names,
            }),
        };
        // SAFETY: freed once, after the last use of its entries.
        unsafe { sys::ibv_free_device_list(list) };
        result
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The state of port `port` (numbered from 1).
    pub fn port(&self, port: u8) -> Result<PortInfo, VerbsError> {
        // SAFETY: a zeroed ibv_port_attr is a valid out-parameter (plain data).
        let mut attr: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `attr` is a valid out-pointer.
        let rc = unsafe { sys::___ibv_query_port(self.ctx.as_ptr(), port, &mut attr) };
        check("ibv_query_port", rc)?;
        Ok(PortInfo {
            active: attr.state == sys::ibv_port_state::IBV_PORT_ACTIVE,
            mtu_bytes: mtu_bytes(attr.active_mtu).unwrap_or(0),
            ethernet: attr.link_layer == LINK_LAYER_ETHERNET,
        })
    }

    /// Port `port`, which must be active.
    pub fn active_port(&self, port: u8) -> Result<PortInfo, VerbsError> {
        let info = self.port(port)?;
        if !info.active {
            return Err(VerbsError::PortDown {
                device: self.name.clone(),
                port,
            });
        }
        Ok(info)
    }

    /// Entry `index` of port `port`'s GID table (for RoCE v2, the index of the
    /// port's IPv4- or IPv6-derived GID).
    pub fn gid(&self, port: u8, index: u8) -> Result<[u8; 16], VerbsError> {
        // SAFETY: plain data.
        let mut gid: sys::ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `gid` is a valid out-pointer.
        let rc = unsafe { sys::ibv_query_gid(self.ctx.as_ptr(), port, i32::from(index), &mut gid) };
        check("ibv_query_gid", rc)?;
        // SAFETY: every bit pattern of the union is a valid `raw`.
        Ok(unsafe { gid.raw })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by `open`, closed once; everything made from it holds
        // an Arc of it, so nothing outlives it.
        unsafe { sys::ibv_close_device(self.ctx.as_ptr()) };
    }
}

/// A protection domain: memory regions and queue pairs of one domain only
/// reach each other (weir makes one per connection, so a peer's rkeys are good
/// for that connection's regions alone).
#[derive(Debug)]
pub struct Pd {
    pd: NonNull<sys::ibv_pd>,
    _ctx: Arc<Context>,
}

// SAFETY: see `Context`.
unsafe impl Send for Pd {}
// SAFETY: see `Context`.
unsafe impl Sync for Pd {}

impl Pd {
    /// A new protection domain on `ctx`.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Pd>, VerbsError> {
        // SAFETY: the context is open.
        let pd = non_null("ibv_alloc_pd", unsafe {
            sys::ibv_alloc_pd(ctx.ctx.as_ptr())
        })?;
        Ok(Arc::new(Pd {
            pd,
            _ctx: ctx.clone(),
        }))
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated by `new`, freed once, after every region and queue
        // pair of it (they hold an Arc of it).
        unsafe { sys::ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// What a peer may do to a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Only this host's NIC uses it (send buffers).
    Local,
    /// The peer may RDMA WRITE into it (granted regions, receive slots).
    RemoteWrite,
}

/// A registered region of owned, pinned memory (the transport's pool).
#[derive(Debug)]
pub struct MemoryRegion {
    mr: NonNull<sys::ibv_mr>,
    /// The memory: boxed so it never moves while registered.
    buf: Box<[u8]>,
    _pd: Arc<Pd>,
}

// SAFETY: see `Context`; the buffer is only reached through `&self`/`&mut self`.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

/// A piece of a region, as a work request names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Address.
    pub addr: u64,
    /// Length, bytes.
    pub len: u32,
    /// The region's local key.
    pub lkey: u32,
}

impl MemoryRegion {
    /// Register `len` zeroed bytes on `pd`.
    pub fn new(pd: &Arc<Pd>, len: usize, access: Access) -> Result<MemoryRegion, VerbsError> {
        let mut buf = vec![0u8; len].into_boxed_slice();
        let flags = match access {
            Access::Local => sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE,
            Access::RemoteWrite => {
                sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                    | sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            }
        };
        // SAFETY: `buf` is valid for `len` bytes and stays where it is (boxed,
        // owned by the region) until the region is deregistered in `drop`.
        let mr = non_null("ibv_reg_mr", unsafe {
            sys::ibv_reg_mr(pd.pd.as_ptr(), buf.as_mut_ptr().cast(), len, flags.0 as i32)
        })?;
        Ok(MemoryRegion {
            mr,
            buf,
            _pd: pd.clone(),
        })
    }

    /// The key a peer names this region by.
    pub fn rkey(&self) -> u32 {
        // SAFETY: registered until drop.
        unsafe { self.mr.as_ref().rkey }
    }

    /// `len` bytes at `offset`, for a work request; `None` past the end.
    pub fn sge(&self, offset: usize, len: u32) -> Option<Sge> {
        let end = offset.checked_add(len as usize)?;
        (end <= self.buf.len()).then(|| Sge {
            addr: self.buf.as_ptr() as u64 + offset as u64,
            len,
            // SAFETY: registered until drop.
            lkey: unsafe { self.mr.as_ref().lkey },
        })
    }

    /// The memory (no work request may be writing it).
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The memory, to fill before a send.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by `new`, deregistered once, before `buf` is freed
        // (fields drop after this body).
        unsafe { sys::ibv_dereg_mr(self.mr.as_ptr()) };
    }
}

/// A completion queue with its completion channel (the fd to wait on once
/// spinning found nothing).
#[derive(Debug)]
pub struct Cq {
    cq: NonNull<sys::ibv_cq>,
    channel: NonNull<sys::ibv_comp_channel>,
    _ctx: Arc<Context>,
}

// SAFETY: see `Context`.
unsafe impl Send for Cq {}
// SAFETY: see `Context`.
unsafe impl Sync for Cq {}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wc {
    /// The work request's id.
    pub wr_id: u64,
    /// Success, or the failure (`ibv_wc_status`).
    pub status: Result<(), u32>,
    /// Bytes received (receives).
    pub byte_len: u32,
    /// The immediate of a WRITE_WITH_IMM or SEND_WITH_IMM, host byte order.
    pub imm: Option<u32>,
}

impl Cq {
    /// A completion queue of `entries` on `ctx`.
    pub fn new(ctx: &Arc<Context>, entries: i32) -> Result<Arc<Cq>, VerbsError> {
        // SAFETY: the context is open.
        let channel = non_null("ibv_create_comp_channel", unsafe {
            sys::ibv_create_comp_channel(ctx.ctx.as_ptr())
        })?;
        // SAFETY: the context and channel are valid; no cq_context is used.
        let cq = unsafe {
            sys::ibv_create_cq(
                ctx.ctx.as_ptr(),
                entries,
                ptr::null_mut(),
                channel.as_ptr(),
                0,
            )
        };
        let cq = match non_null("ibv_create_cq", cq) {
            Ok(cq) => cq,
            Err(e) => {
                // SAFETY: created above, unused.
                unsafe { sys::ibv_destroy_comp_channel(channel.as_ptr()) };
                return Err(e);
            }
        };
        Ok(Arc::new(Cq {
            cq,
            channel,
            _ctx: ctx.clone(),
        }))
    }

    /// Append up to `max` completions (at most 16 a call) to `out`; how many.
    /// Never blocks.
    pub fn poll(&self, out: &mut Vec<Wc>, max: usize) -> Result<usize, VerbsError> {
        const BATCH: usize = 16;
        // SAFETY: plain data.
        let mut wcs: [sys::ibv_wc; BATCH] = unsafe { std::mem::zeroed() };
        let want = max.min(BATCH) as i32;
        // SAFETY: the queue is valid; `wcs` has room for `want` entries.
        let n = unsafe { sys::ibv_poll_cq(self.cq.as_ptr(), want, wcs.as_mut_ptr()) };
        if n < 0 {
            return Err(VerbsError::Call {
                call: "ibv_poll_cq",
                errno: -n,
            });
        }
        for wc in &wcs[..n as usize] {
            let with_imm = wc.wc_flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
            out.push(Wc {
                wr_id: wc.wr_id,
                status: if wc.status == sys::ibv_wc_status::IBV_WC_SUCCESS {
                    Ok(())
                } else {
                    Err(wc.status)
                },
                byte_len: wc.byte_len,
                // SAFETY: with IBV_WC_WITH_IMM the union holds the immediate.
                imm: with_imm
                    .then(|| u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })),
            });
        }
        Ok(n as usize)
    }

    /// Ask for an event on the channel at the next completion (then poll once
    /// more: one may have come in between).
    pub fn arm(&self) -> Result<(), VerbsError> {
        // SAFETY: the queue is valid.
        check("ibv_req_notify_cq", unsafe {
            sys::ibv_req_notify_cq(self.cq.as_ptr(), 0)
        })
    }

    /// The channel's fd, to wait on (tokio's `AsyncFd`) after [`Cq::arm`].
    pub fn fd(&self) -> std::os::fd::RawFd {
        // SAFETY: the channel is valid until drop.
        unsafe { self.channel.as_ref().fd }
    }

    /// Take the event the fd announced and acknowledge it.
    pub fn take_event(&self) -> Result<(), VerbsError> {
        let mut cq = ptr::null_mut();
        let mut cq_ctx = ptr::null_mut();
        // SAFETY: the channel is valid; the out-pointers are.
        let rc = unsafe { sys::ibv_get_cq_event(self.channel.as_ptr(), &mut cq, &mut cq_ctx) };
        check("ibv_get_cq_event", rc)?;
        // SAFETY: the event is of this queue (one queue per channel).
        unsafe { sys::ibv_ack_cq_events(cq, 1) };
        Ok(())
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once, after every queue pair
        // using it (they hold an Arc of it); then its channel.
        unsafe {
            sys::ibv_destroy_cq(self.cq.as_ptr());
            sys::ibv_destroy_comp_channel(self.channel.as_ptr());
        }
    }
}

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
use state::{Init, Reset, Rtr, Rts};

/// States in which receives may be posted.
pub trait Receiving {}
impl Receiving for Init {}
impl Receiving for Rtr {}
impl Receiving for Rts {}

/// The far end of a connection, as the connection manager learnt it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remote {
    /// Its queue pair number.
    pub qpn: u32,
    /// The first PSN it sends with (random per connection).
    pub psn: u32,
    /// Its port's GID.
    pub gid: [u8; 16],
}

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

/// A send work request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// SEND into the peer's next posted receive.
    Send,
    /// RDMA WRITE_WITH_IMM into the peer's region (consumes a posted receive
    /// there, which completes with `imm`).
    WriteImm {
        /// Where in the peer's region.
        remote_addr: u64,
        /// The peer's region key.
        rkey: u32,
        /// The immediate, host byte order.
        imm: u32,
    },
}

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
    /// `gid_index`), path MTU `mtu_bytes`.
    pub fn ready_to_receive(
        self,
        remote: &Remote,
        port: u8,
        gid_index: u8,
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
    /// `sge` must lie in a [`MemoryRegion`] of this queue pair's protection
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
    /// lie in a [`MemoryRegion`] of this queue pair's protection domain that
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

/// Whether `/sys/class/infiniband` lists a device (the kernel's view, which
/// `cargo xtask test-rdma` checks before it runs the device tests).
pub fn sysfs_has_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[cfg(test)]
mod tests;
