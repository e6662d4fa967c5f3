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

/// Run `f` over the machine's RDMA devices (each with its name and GUID),
/// while their list is held; [`VerbsError::NoDevice`] when there is none.
fn with_devices<R>(
    f: impl FnOnce(&[(*mut sys::ibv_device, DeviceInfo)]) -> Result<R, VerbsError>,
) -> Result<R, VerbsError> {
    let mut n = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below and no
    // device pointer is kept past it.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(VerbsError::NoDevice { errno: errno() });
    }
    let found: Vec<_> = (0..n.max(0) as usize)
        .map(|i| {
            // SAFETY: the list holds `n` valid device pointers until freed;
            // the name is a NUL-terminated string owned by the device.
            unsafe {
                let dev = *list.add(i);
                let name = CStr::from_ptr(sys::ibv_get_device_name(dev))
                    .to_string_lossy()
                    .into_owned();
                let guid = u64::from_be(sys::ibv_get_device_guid(dev));
                (dev, DeviceInfo { name, guid })
            }
        })
        .collect();
    let result = if found.is_empty() {
        Err(VerbsError::NoDevice { errno: 0 })
    } else {
        f(&found)
    };
    // SAFETY: `list` came from ibv_get_device_list and is freed once, after
    // the last use of its entries.
    unsafe { sys::ibv_free_device_list(list) };
    result
}

/// The machine's RDMA devices; [`VerbsError::NoDevice`] when it has none.
pub fn devices() -> Result<Vec<DeviceInfo>, VerbsError> {
    with_devices(|devs| Ok(devs.iter().map(|(_, info)| info.clone()).collect()))
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
        with_devices(|devs| {
            let chosen = devs
                .iter()
                .find(|(_, info)| name.is_none_or(|want| want == info.name));
            let Some((dev, info)) = chosen else {
                return Err(VerbsError::NotFound {
                    name: name.unwrap_or_default().to_string(),
                    available: devs.iter().map(|(_, info)| info.name.clone()).collect(),
                });
            };
            // SAFETY: `dev` is valid while the list is; the context opened
            // from it stays valid after the list is freed (verbs(3)).
            let ctx = non_null("ibv_open_device", unsafe { sys::ibv_open_device(*dev) })?;
            Ok(Arc::new(Context {
                ctx,
                name: info.name.clone(),
            }))
        })
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

    /// The most entries a completion queue of the device may have.
    pub fn max_cqe(&self) -> Result<i32, VerbsError> {
        // SAFETY: plain data.
        let mut attr: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; `attr` is a valid out-pointer.
        let rc = unsafe { sys::ibv_query_device(self.ctx.as_ptr(), &mut attr) };
        check("ibv_query_device", rc)?;
        Ok(attr.max_cqe)
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
    /// The memory, held by raw pointer, never by a Rust reference: the NIC
    /// (for a remotely writable region, a peer) may write it at any time, so
    /// it is only copied in and out through the pointer. Allocated as a boxed
    /// slice of `len` bytes, freed in `drop` after deregistration.
    buf: NonNull<u8>,
    len: usize,
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
        let buf = NonNull::new(Box::into_raw(vec![0u8; len].into_boxed_slice()).cast::<u8>())
            .expect("a boxed slice is never null");
        let flags = match access {
            Access::Local => sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE,
            Access::RemoteWrite => {
                sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
                    | sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            }
        };
        // SAFETY: `buf` is valid for `len` bytes and stays where it is (owned
        // by the region) until the region is deregistered in `drop`.
        let mr = non_null("ibv_reg_mr", unsafe {
            sys::ibv_reg_mr(pd.pd.as_ptr(), buf.as_ptr().cast(), len, flags.0 as i32)
        });
        let mr = match mr {
            Ok(mr) => mr,
            Err(e) => {
                // SAFETY: allocated above as a boxed slice of `len`, unregistered.
                drop(unsafe {
                    Box::from_raw(std::ptr::slice_from_raw_parts_mut(buf.as_ptr(), len))
                });
                return Err(e);
            }
        };
        Ok(MemoryRegion {
            mr,
            buf,
            len,
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
        (end <= self.len).then(|| Sge {
            addr: self.buf.as_ptr() as u64 + offset as u64,
            len,
            // SAFETY: registered until drop.
            lkey: unsafe { self.mr.as_ref().lkey },
        })
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A copy of `len` bytes at `offset` (which no work request may be
    /// writing). Panics past the end.
    pub fn read(&self, offset: usize, len: usize) -> bytes::Bytes {
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= self.len),
            "a read past the region"
        );
        let mut out = vec![0u8; len];
        // SAFETY: in bounds (checked); the region's memory is valid until
        // drop and never referenced, so copying through the pointer aliases
        // nothing.
        unsafe { ptr::copy_nonoverlapping(self.buf.as_ptr().add(offset), out.as_mut_ptr(), len) };
        bytes::Bytes::from(out)
    }

    /// Copy `parts` one after another to `offset` (which no work request may
    /// be reading). Panics past the end.
    pub fn write(&mut self, offset: usize, parts: &[&[u8]]) {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        assert!(
            offset.checked_add(total).is_some_and(|e| e <= self.len),
            "a write past the region"
        );
        let mut at = offset;
        for p in parts {
            // SAFETY: in bounds (checked above); as in `read`.
            unsafe { ptr::copy_nonoverlapping(p.as_ptr(), self.buf.as_ptr().add(at), p.len()) };
            at += p.len();
        }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered by `new`, deregistered once, then the memory
        // (allocated in `new` as a boxed slice of `len`) is freed, once.
        unsafe {
            sys::ibv_dereg_mr(self.mr.as_ptr());
            drop(Box::from_raw(ptr::slice_from_raw_parts_mut(
                self.buf.as_ptr(),
                self.len,
            )));
        }
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

    /// Make the channel's fd non-blocking, as tokio's `AsyncFd` needs; then
    /// [`Cq::take_event`] fails with `EAGAIN` when no event is waiting.
    pub fn set_nonblocking(&self) -> Result<(), VerbsError> {
        let fd = self.fd();
        // SAFETY: fcntl on an fd this queue's channel owns, open until drop.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(VerbsError::Call {
                call: "fcntl(F_GETFL)",
                errno: errno(),
            });
        }
        // SAFETY: as above.
        let rc = unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) };
        check("fcntl(F_SETFL)", rc)
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

mod qp;
pub use qp::{state, Qp, QpCaps, Receiving, Remote, SendOp, ACK_TIMEOUT, RETRY_COUNT};

/// Whether `/sys/class/infiniband` lists a device (the kernel's view, which
/// `cargo xtask test-rdma` checks before it runs the device tests).
pub fn sysfs_has_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some())
}

#[cfg(test)]
mod tests;
