//! An in-process NIC: queue pairs of several [`LoopNic`]s on one
//! [`LoopFabric`] reach each other as RC queue pairs do, so the daemon's
//! transport runs its tests here, where there is no RDMA NIC. It keeps the
//! rules a real NIC enforces on a peer: a SEND needs a posted receive (none:
//! the sender's queue pair fails, as with `rnr_retry` 0), a WRITE_WITH_IMM
//! lands only inside a region the receiver registered for remote writes and
//! consumes a receive, a queue pair in error fails (flushes) everything posted
//! on it, and a queue pair whose peer is gone fails at its next send, as when
//! RC's retries run out. Work is done at once, at post time, in order.

use super::nic::{Caps, Endpoint, Mem, Nic, NicError, PortCounters, SendOp, Wc};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::Notify;

/// Several [`LoopNic`]s' wire.
#[derive(Debug, Default)]
pub struct LoopFabric {
    inner: Mutex<Fabric>,
}

#[derive(Debug, Default)]
struct Fabric {
    next_nic: u32,
    next_qpn: u32,
    next_rkey: u32,
    next_pd: u32,
    nics: BTreeMap<u32, NicState>,
    qps: BTreeMap<u32, QpState>,
    /// By key: the region's protection domain, whether peers may write it,
    /// its bytes.
    mems: BTreeMap<u32, (u32, bool, Buf)>,
}

type Buf = Arc<Mutex<Box<[u8]>>>;

#[derive(Debug)]
struct NicState {
    cq: VecDeque<Wc>,
    notify: Arc<Notify>,
    /// Paths (ports) that are down.
    down: BTreeSet<u8>,
    /// Congestion counters by path, as a test sets them.
    counters: BTreeMap<u8, PortCounters>,
}

#[derive(Debug)]
struct QpState {
    nic: u32,
    pd: u32,
    path: u8,
    remote: Option<u32>,
    /// Posted receives: work request, region key, offset, length.
    recvs: VecDeque<(u64, u32, usize, u32)>,
    error: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl LoopFabric {
    /// A fabric with no NICs.
    pub fn new() -> Arc<LoopFabric> {
        Arc::new(LoopFabric::default())
    }

    /// A NIC on it with `paths` ports.
    pub fn nic(self: &Arc<Self>, paths: u8) -> LoopNic {
        let mut f = lock(&self.inner);
        f.next_nic += 1;
        let id = f.next_nic;
        let notify = Arc::new(Notify::new());
        f.nics.insert(
            id,
            NicState {
                cq: VecDeque::new(),
                notify: notify.clone(),
                down: BTreeSet::new(),
                counters: BTreeMap::new(),
            },
        );
        LoopNic {
            fabric: self.clone(),
            id,
            paths,
            notify,
        }
    }

    /// Take port `path` of NIC `nic` down (or up again): its queue pairs fail
    /// and flush their receives, and sends through it fail.
    pub fn set_port_down(&self, nic: u32, path: u8, down: bool) {
        let mut f = lock(&self.inner);
        let Fabric { nics, qps, .. } = &mut *f;
        let Some(n) = nics.get_mut(&nic) else { return };
        if !down {
            n.down.remove(&path);
            return;
        }
        n.down.insert(path);
        for q in qps.values_mut().filter(|q| q.nic == nic && q.path == path) {
            q.error = true;
            for (wr_id, ..) in q.recvs.drain(..) {
                n.cq.push_back(Wc {
                    wr_id,
                    ok: false,
                    byte_len: 0,
                    imm: None,
                });
            }
        }
        n.notify.notify_one();
    }
}

impl LoopFabric {
    /// Add `more` to the congestion counters of NIC `nic`'s port `path` (the
    /// loopback wire marks nothing by itself).
    pub fn add_counters(&self, nic: u32, path: u8, more: PortCounters) {
        let mut f = lock(&self.inner);
        if let Some(n) = f.nics.get_mut(&nic) {
            let c = n.counters.entry(path).or_default();
            c.cnps += more.cnps;
            c.marked_in += more.marked_in;
            c.retransmits += more.retransmits;
        }
    }
}

impl Fabric {
    fn complete(&mut self, nic: u32, wc: Wc) {
        if let Some(n) = self.nics.get_mut(&nic) {
            n.cq.push_back(wc);
            n.notify.notify_one();
        }
    }

    fn port_up(&self, nic: u32, path: u8) -> bool {
        self.nics.get(&nic).is_some_and(|n| !n.down.contains(&path))
    }

    /// Carry one send from `qpn`: `Err` fails the sender's queue pair.
    fn carry(&mut self, qpn: u32, op: SendOp, data: &[u8]) -> Result<(), ()> {
        let q = self.qps.get(&qpn).ok_or(())?;
        if q.error || !self.port_up(q.nic, q.path) {
            return Err(());
        }
        let to = q.remote.ok_or(())?;
        let r = self.qps.get(&to).ok_or(())?;
        let live = !r.error && r.remote == Some(qpn) && self.port_up(r.nic, r.path);
        if !live {
            return Err(());
        }
        let rnic = r.nic;
        let (byte_len, imm) = match op {
            SendOp::Send => {
                let &(_, rkey, offset, len) = r.recvs.front().ok_or(())?;
                if data.len() > len as usize {
                    return Err(());
                }
                let (_, _, buf) = self.mems.get(&rkey).ok_or(())?;
                lock(buf)[offset..offset + data.len()].copy_from_slice(data);
                (data.len() as u32, None)
            }
            SendOp::WriteImm {
                remote_addr,
                rkey,
                imm,
            } => {
                r.recvs.front().ok_or(())?;
                let (pd, remote_write, buf) = self.mems.get(&rkey).ok_or(())?;
                if *pd != r.pd || !remote_write {
                    return Err(());
                }
                let base = base_addr(rkey);
                let mut b = lock(buf);
                let start = remote_addr.checked_sub(base).ok_or(())? as usize;
                let end = start.checked_add(data.len()).ok_or(())?;
                if end > b.len() {
                    return Err(());
                }
                b[start..end].copy_from_slice(data);
                (data.len() as u32, Some(imm))
            }
        };
        let r = self.qps.get_mut(&to).expect("checked");
        let (wr_id, ..) = r.recvs.pop_front().expect("checked");
        self.complete(
            rnic,
            Wc {
                wr_id,
                ok: true,
                byte_len,
                imm,
            },
        );
        Ok(())
    }
}

/// The address region `rkey` starts at (each its own address space).
fn base_addr(rkey: u32) -> u64 {
    u64::from(rkey) << 32
}

/// A NIC on a [`LoopFabric`].
#[derive(Debug)]
pub struct LoopNic {
    fabric: Arc<LoopFabric>,
    id: u32,
    paths: u8,
    notify: Arc<Notify>,
}

impl LoopNic {
    /// Its number on the fabric (for [`LoopFabric::set_port_down`]).
    pub fn id(&self) -> u32 {
        self.id
    }
}

/// Memory registered on a [`LoopNic`].
#[derive(Debug)]
pub struct LoopMem {
    rkey: u32,
    buf: Buf,
    len: usize,
    fabric: Arc<LoopFabric>,
}

impl Drop for LoopMem {
    fn drop(&mut self) {
        lock(&self.fabric.inner).mems.remove(&self.rkey);
    }
}

impl Mem for LoopMem {
    fn len(&self) -> usize {
        self.len
    }
    fn addr(&self, offset: usize) -> u64 {
        base_addr(self.rkey) + offset as u64
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn read(&self, offset: usize, len: usize) -> Bytes {
        Bytes::copy_from_slice(&lock(&self.buf)[offset..offset + len])
    }
    fn write(&mut self, mut offset: usize, parts: &[&[u8]]) {
        let mut b = lock(&self.buf);
        for p in parts {
            b[offset..offset + p.len()].copy_from_slice(p);
            offset += p.len();
        }
    }
}

/// A protection domain of a [`LoopFabric`].
#[derive(Debug)]
pub struct LoopPd(u32);

/// A queue pair of a [`LoopNic`]; dropping it destroys it.
#[derive(Debug)]
pub struct LoopQp {
    qpn: u32,
    fabric: Arc<LoopFabric>,
}

impl Drop for LoopQp {
    fn drop(&mut self) {
        lock(&self.fabric.inner).qps.remove(&self.qpn);
    }
}

impl Nic for LoopNic {
    type Mem = LoopMem;
    type Qp = LoopQp;
    type Pd = LoopPd;

    fn paths(&self) -> u8 {
        self.paths
    }

    fn domain(&mut self) -> Result<LoopPd, NicError> {
        let mut f = lock(&self.fabric.inner);
        f.next_pd += 1;
        Ok(LoopPd(f.next_pd))
    }

    fn register(
        &mut self,
        pd: &LoopPd,
        len: usize,
        remote_write: bool,
    ) -> Result<LoopMem, NicError> {
        let mut f = lock(&self.fabric.inner);
        f.next_rkey += 1;
        let rkey = f.next_rkey;
        let buf: Buf = Arc::new(Mutex::new(vec![0u8; len].into_boxed_slice()));
        f.mems.insert(rkey, (pd.0, remote_write, buf.clone()));
        Ok(LoopMem {
            rkey,
            buf,
            len,
            fabric: self.fabric.clone(),
        })
    }

    fn create_qp(
        &mut self,
        pd: &LoopPd,
        path: u8,
        _caps: Caps,
    ) -> Result<(LoopQp, Endpoint), NicError> {
        if path >= self.paths {
            return Err(NicError(format!("no path {path}")));
        }
        let mut f = lock(&self.fabric.inner);
        f.next_qpn += 1;
        let qpn = f.next_qpn;
        f.qps.insert(
            qpn,
            QpState {
                nic: self.id,
                pd: pd.0,
                path,
                remote: None,
                recvs: VecDeque::new(),
                error: false,
            },
        );
        let mut gid = [0; 16];
        gid[..4].copy_from_slice(&self.id.to_le_bytes());
        gid[4] = path;
        let ep = Endpoint {
            qpn,
            psn: 0,
            gid,
            mtu: 4096,
        };
        Ok((
            LoopQp {
                qpn,
                fabric: self.fabric.clone(),
            },
            ep,
        ))
    }

    fn connect(&mut self, qp: &mut LoopQp, path: u8, remote: &Endpoint) -> Result<(), NicError> {
        let mut f = lock(&self.fabric.inner);
        if !f.port_up(self.id, path) {
            return Err(NicError(format!("port {path} is down")));
        }
        let q = f.qps.get_mut(&qp.qpn).expect("a live queue pair");
        q.remote = Some(remote.qpn);
        Ok(())
    }

    unsafe fn post_recv(
        &mut self,
        qp: &LoopQp,
        wr_id: u64,
        mem: &LoopMem,
        offset: usize,
        len: u32,
    ) -> Result<(), NicError> {
        assert!(
            offset + len as usize <= mem.len,
            "a receive past its region"
        );
        let mut f = lock(&self.fabric.inner);
        let mem_pd = f.mems.get(&mem.rkey).map(|m| m.0);
        let q = f.qps.get_mut(&qp.qpn).expect("a live queue pair");
        // A receive into memory of another domain fails, as on a NIC (a
        // local protection error).
        if q.error || mem_pd != Some(q.pd) {
            f.complete(
                self.id,
                Wc {
                    wr_id,
                    ok: false,
                    byte_len: 0,
                    imm: None,
                },
            );
        } else {
            q.recvs.push_back((wr_id, mem.rkey, offset, len));
        }
        Ok(())
    }

    unsafe fn post_send(
        &mut self,
        qp: &LoopQp,
        wr_id: u64,
        op: SendOp,
        mem: &LoopMem,
        offset: usize,
        len: u32,
        signaled: bool,
        _inline: bool,
    ) -> Result<(), NicError> {
        let data = mem.read(offset, len as usize);
        let mut f = lock(&self.fabric.inner);
        let ok = f.carry(qp.qpn, op, &data).is_ok();
        if !ok {
            // The queue pair fails: this request and every receive posted.
            let q = f.qps.get_mut(&qp.qpn).expect("a live queue pair");
            q.error = true;
            let flushed: Vec<u64> = q.recvs.drain(..).map(|r| r.0).collect();
            for id in std::iter::once(wr_id).chain(flushed) {
                f.complete(
                    self.id,
                    Wc {
                        wr_id: id,
                        ok: false,
                        byte_len: 0,
                        imm: None,
                    },
                );
            }
        } else if signaled {
            f.complete(
                self.id,
                Wc {
                    wr_id,
                    ok: true,
                    byte_len: 0,
                    imm: None,
                },
            );
        }
        Ok(())
    }

    fn counters(&self, path: u8) -> Option<PortCounters> {
        let f = lock(&self.fabric.inner);
        let n = f.nics.get(&self.id)?;
        Some(n.counters.get(&path).copied().unwrap_or_default())
    }

    fn poll(&mut self, out: &mut Vec<Wc>) -> Result<(), NicError> {
        let mut f = lock(&self.fabric.inner);
        if let Some(n) = f.nics.get_mut(&self.id) {
            out.extend(n.cq.drain(..));
        }
        Ok(())
    }

    fn arm(&mut self) -> Result<(), NicError> {
        Ok(())
    }

    async fn wait(&self) -> Result<(), NicError> {
        self.notify.notified().await;
        Ok(())
    }
}

impl Drop for LoopNic {
    fn drop(&mut self) {
        lock(&self.fabric.inner).nics.remove(&self.id);
    }
}
