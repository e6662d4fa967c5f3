//! [`Nic`] over real verbs (rdma-core through [`crate::verbs`]): one device,
//! a protection domain per connection, one completion queue with its channel
//! for all the endpoint's queue pairs, one or two ports.
//!
//! Never run: these machines have no RDMA device. It builds in CI and is the
//! thin part of the transport; the driver above it is the one the loopback
//! NIC's tests exercise.

use super::nic::{Caps, Endpoint, Mem, Nic, NicError, PortCounters, SendOp, Wc};
use crate::verbs::{self, state, Access, Context, Cq, MemoryRegion, Pd, Qp, QpCaps, VerbsError};
use bytes::Bytes;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use tokio::io::unix::AsyncFd;

fn nic_err(e: VerbsError) -> NicError {
    NicError(e.to_string())
}

/// The completion channel's fd, for [`AsyncFd`] (owned by the [`Cq`]).
struct ChannelFd(RawFd);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// One port in use.
#[derive(Clone, Copy, Debug)]
struct Port {
    num: u8,
    gid: [u8; 16],
    mtu_bytes: u32,
}

/// A verbs device as the transport's [`Nic`].
pub struct VerbsNic {
    // Field order is drop order: the fd's registration, then the queue.
    fd: AsyncFd<ChannelFd>,
    cq: Arc<Cq>,
    ctx: Arc<Context>,
    ports: Vec<Port>,
    gid_index: u8,
    traffic_class: u8,
    /// Seeds each queue pair's first PSN.
    psn_seed: u32,
}

impl VerbsNic {
    /// Open `device` (or the first), check `ports` (active, with GID
    /// `gid_index`), and make a completion queue of `cq_entries` (at least
    /// every work request the endpoint's queue pairs can have outstanding;
    /// more than the device takes is refused). Packets carry `traffic_class`
    /// (the IP header's DSCP and ECN byte; 0 leaves the port's default, as
    /// set in the NIC's per-port `traffic_class`). Needs a tokio runtime (the
    /// channel's fd is registered with it).
    pub fn open(
        device: Option<&str>,
        ports: &[u8],
        (gid_index, traffic_class): (u8, u8),
        cq_entries: i32,
    ) -> Result<VerbsNic, NicError> {
        if ports.is_empty() || ports.len() > usize::from(crate::messenger::PATHS_MAX) {
            return Err(NicError("one or two ports".into()));
        }
        let ctx = Context::open(device).map_err(nic_err)?;
        let ports = ports
            .iter()
            .map(|&num| {
                let info = ctx.active_port(num)?;
                Ok(Port {
                    num,
                    gid: ctx.gid(num, gid_index)?,
                    mtu_bytes: info.mtu_bytes,
                })
            })
            .collect::<Result<Vec<_>, VerbsError>>()
            .map_err(nic_err)?;
        let max_cqe = ctx.max_cqe().map_err(nic_err)?;
        if cq_entries > max_cqe {
            return Err(NicError(format!(
                "the pool's connections can have {cq_entries} work requests outstanding, \
                 past the {max_cqe} completions {} can queue; lower [rdma] pool_bytes",
                ctx.name()
            )));
        }
        let cq = Cq::new(&ctx, cq_entries).map_err(nic_err)?;
        cq.set_nonblocking().map_err(nic_err)?;
        // SAFETY: the fd is the channel's, open until the queue is dropped,
        // which is after this registration (field order of `VerbsNic`).
        let fd = unsafe { AsyncFd::register(ChannelFd(cq.fd())) }
            .map_err(|e| NicError(format!("registering the completion channel: {e}")))?;
        let psn_seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.subsec_nanos());
        Ok(VerbsNic {
            fd,
            cq,
            ctx,
            ports,
            gid_index,
            traffic_class,
            psn_seed,
        })
    }
}

/// Registered memory.
pub struct VerbsMem(MemoryRegion);

impl Mem for VerbsMem {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn addr(&self, offset: usize) -> u64 {
        self.0.sge(offset, 0).map_or(0, |s| s.addr)
    }
    fn rkey(&self) -> u32 {
        self.0.rkey()
    }
    fn read(&self, offset: usize, len: usize) -> Bytes {
        self.0.read(offset, len)
    }
    fn write(&mut self, offset: usize, parts: &[&[u8]]) {
        self.0.write(offset, parts)
    }
}

/// A queue pair through its states.
pub enum VerbsQp {
    /// Receives may be posted.
    Init(Qp<state::Init>, u32),
    /// Connected.
    Rts(Qp<state::Rts>),
    /// A transition failed: the queue pair is gone.
    Gone,
}

fn sge(mem: &VerbsMem, offset: usize, len: u32) -> Result<verbs::Sge, NicError> {
    mem.0
        .sge(offset, len)
        .ok_or_else(|| NicError("a work request past its region".into()))
}

impl Nic for VerbsNic {
    type Mem = VerbsMem;
    type Qp = VerbsQp;
    type Pd = Arc<Pd>;

    fn paths(&self) -> u8 {
        self.ports.len() as u8
    }

    fn domain(&mut self) -> Result<Arc<Pd>, NicError> {
        Pd::new(&self.ctx).map_err(nic_err)
    }

    fn register(
        &mut self,
        pd: &Arc<Pd>,
        len: usize,
        remote_write: bool,
    ) -> Result<VerbsMem, NicError> {
        let access = if remote_write {
            Access::RemoteWrite
        } else {
            Access::Local
        };
        MemoryRegion::new(pd, len, access)
            .map(VerbsMem)
            .map_err(nic_err)
    }

    fn create_qp(
        &mut self,
        pd: &Arc<Pd>,
        path: u8,
        caps: Caps,
    ) -> Result<(VerbsQp, Endpoint), NicError> {
        let port = *self
            .ports
            .get(usize::from(path))
            .ok_or_else(|| NicError(format!("no path {path}")))?;
        let qp = Qp::new(
            pd,
            &self.cq,
            QpCaps {
                send: caps.send,
                recv: caps.recv,
                inline: caps.inline,
            },
        )
        .and_then(|q| q.init(port.num))
        .map_err(nic_err)?;
        // A fresh PSN per queue pair, so a stale packet of an old one never
        // fits a new one's sequence.
        self.psn_seed = self
            .psn_seed
            .wrapping_mul(1_103_515_245)
            .wrapping_add(12_345);
        let psn = self.psn_seed & 0xFF_FFFF;
        let ep = Endpoint {
            qpn: qp.qpn(),
            psn,
            gid: port.gid,
            mtu: port.mtu_bytes,
        };
        Ok((VerbsQp::Init(qp, psn), ep))
    }

    fn connect(&mut self, qp: &mut VerbsQp, path: u8, remote: &Endpoint) -> Result<(), NicError> {
        let port = self.ports[usize::from(path)];
        let VerbsQp::Init(q, psn) = std::mem::replace(qp, VerbsQp::Gone) else {
            return Err(NicError("connect on a queue pair not in INIT".into()));
        };
        let rts = q
            .ready_to_receive(
                remote,
                port.num,
                (self.gid_index, self.traffic_class),
                remote.mtu.min(port.mtu_bytes),
            )
            .and_then(|q| q.ready_to_send(psn))
            .map_err(nic_err)?;
        *qp = VerbsQp::Rts(rts);
        Ok(())
    }

    unsafe fn post_recv(
        &mut self,
        qp: &VerbsQp,
        wr_id: u64,
        mem: &VerbsMem,
        offset: usize,
        len: u32,
    ) -> Result<(), NicError> {
        let sge = sge(mem, offset, len)?;
        // SAFETY: the caller's promise (this trait method's # Safety).
        unsafe {
            match qp {
                VerbsQp::Init(q, _) => q.post_recv(wr_id, sge),
                VerbsQp::Rts(q) => q.post_recv(wr_id, sge),
                VerbsQp::Gone => return Err(NicError("the queue pair is gone".into())),
            }
        }
        .map_err(nic_err)
    }

    unsafe fn post_send(
        &mut self,
        qp: &VerbsQp,
        wr_id: u64,
        op: SendOp,
        mem: &VerbsMem,
        offset: usize,
        len: u32,
        signaled: bool,
        inline: bool,
    ) -> Result<(), NicError> {
        let VerbsQp::Rts(q) = qp else {
            return Err(NicError("a send on a queue pair not connected".into()));
        };
        let sge = sge(mem, offset, len)?;
        // SAFETY: the caller's promise (this trait method's # Safety).
        unsafe { q.post_send(wr_id, op, sge, signaled, inline) }.map_err(nic_err)
    }

    /// Read from sysfs, `/sys/class/infiniband/DEV/ports/N/hw_counters/`
    /// (mlx5's names; a counter the driver lacks reads as 0, a port with no
    /// `hw_counters` as none).
    fn counters(&self, path: u8) -> Option<PortCounters> {
        let port = self.ports.get(usize::from(path))?;
        let dir = std::path::Path::new("/sys/class/infiniband")
            .join(self.ctx.name())
            .join("ports")
            .join(port.num.to_string())
            .join("hw_counters");
        if !dir.is_dir() {
            return None;
        }
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        Some(PortCounters {
            cnps: read("rp_cnp_handled"),
            marked_in: read("np_ecn_marked_roce_packets"),
            retransmits: read("packet_seq_err") + read("local_ack_timeout_err"),
        })
    }

    fn poll(&mut self, out: &mut Vec<Wc>) -> Result<(), NicError> {
        let mut wcs = Vec::with_capacity(16);
        loop {
            wcs.clear();
            let n = self.cq.poll(&mut wcs, 16).map_err(nic_err)?;
            out.extend(wcs.iter().map(|w| Wc {
                wr_id: w.wr_id,
                ok: w.status.is_ok(),
                byte_len: w.byte_len,
                imm: w.imm,
            }));
            if n < 16 {
                return Ok(());
            }
        }
    }

    fn arm(&mut self) -> Result<(), NicError> {
        self.cq.arm().map_err(nic_err)
    }

    async fn wait(&self) -> Result<(), NicError> {
        loop {
            let mut guard = self
                .fd
                .readable()
                .await
                .map_err(|e| NicError(e.to_string()))?;
            match self.cq.take_event() {
                Ok(()) => return Ok(()),
                Err(VerbsError::Call { errno, .. }) if errno == libc::EAGAIN => {
                    guard.clear_ready();
                }
                Err(e) => return Err(nic_err(e)),
            }
        }
    }
}
