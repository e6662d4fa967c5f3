//! weir's declarations of the SPDK functions it calls, and of its C glue.
//!
//! Handles (controller, namespace, queue pair) are opaque. The one struct
//! crossing the boundary by pointer is the NVMe specification's completion
//! entry, with its size asserted. Checked
//! against SPDK's include/spdk/nvme.h, env.h and nvme_spec.h (v26.09-pre).

use std::ffi::{c_char, c_int, c_void};

/// `struct spdk_nvme_ctrlr`.
#[repr(C)]
pub(crate) struct Ctrlr {
    _opaque: [u8; 0],
}

/// `struct spdk_nvme_ns`.
#[repr(C)]
pub(crate) struct Ns {
    _opaque: [u8; 0],
}

/// `struct spdk_nvme_qpair`.
#[repr(C)]
pub(crate) struct Qpair {
    _opaque: [u8; 0],
}

/// `struct spdk_nvme_cpl`: an NVMe completion queue entry.
#[repr(C)]
pub(crate) struct Cpl {
    pub(crate) cdw0: u32,
    pub(crate) cdw1: u32,
    pub(crate) sqhd: u16,
    pub(crate) sqid: u16,
    pub(crate) cid: u16,
    /// Phase, SC, SCT, CRD, More, DNR: see [`crate::NvmeStatus::from_raw`].
    pub(crate) status_raw: u16,
}
const _: () = assert!(std::mem::size_of::<Cpl>() == 16);

/// `spdk_nvme_cmd_cb`.
pub(crate) type CmdCb = unsafe extern "C" fn(ctx: *mut c_void, cpl: *const Cpl);
/// `spdk_nvme_req_reset_sgl_cb`.
pub(crate) type ResetSglCb = unsafe extern "C" fn(ctx: *mut c_void, offset: u32);
/// `spdk_nvme_req_next_sge_cb`.
pub(crate) type NextSgeCb =
    unsafe extern "C" fn(ctx: *mut c_void, address: *mut *mut c_void, length: *mut u32) -> c_int;

/// `SPDK_NVME_IO_FLAGS_FORCE_UNIT_ACCESS`.
pub(crate) const IO_FLAGS_FUA: u32 = 1 << 30;
/// Write Zeroes' Deallocate bit (DEAC, command dword 12 bit 25): SPDK passes
/// io_flags' upper half into dword 12 (`SPDK_NVME_IO_FLAGS_CDW12_MASK`).
pub(crate) const IO_FLAGS_WRITE_ZEROES_DEAC: u32 = 1 << 25;
/// `SPDK_MALLOC_DMA`.
pub(crate) const MALLOC_DMA: u32 = 0x01;
/// `SPDK_ENV_NUMA_ID_ANY`.
pub(crate) const NUMA_ID_ANY: c_int = -1;

/// Capability bits from `weir_spdk_ns_caps` (csrc/weir_spdk_glue.c).
pub(crate) mod caps {
    pub(crate) const WRITE_ZEROES: u32 = 0x2;
    pub(crate) const FLUSH: u32 = 0x4;
    pub(crate) const WRITE_ZEROES_DEALLOCATE: u32 = 0x10;
}

unsafe extern "C" {
    // weir's glue.
    pub(crate) fn weir_spdk_env_init(
        name: *const c_char,
        core_mask: *const c_char,
        mem_size_mb: c_int,
        no_huge: bool,
        no_pci: bool,
    ) -> c_int;
    pub(crate) fn weir_spdk_connect(trid: *const c_char, err: *mut c_int) -> *mut Ctrlr;
    pub(crate) fn weir_spdk_ns_caps(ns: *mut Ns) -> u32;
    pub(crate) fn weir_spdk_identity(
        ctrlr: *mut Ctrlr,
        ns: *mut Ns,
        nsid: u32,
        out: *mut c_char,
        cap: usize,
    );

    // SPDK.
    pub(crate) fn spdk_zmalloc(
        size: usize,
        align: usize,
        unused: *mut u64,
        numa_id: c_int,
        flags: u32,
    ) -> *mut c_void;
    pub(crate) fn spdk_free(buf: *mut c_void);
    pub(crate) fn spdk_nvme_detach(ctrlr: *mut Ctrlr) -> c_int;
    pub(crate) fn spdk_nvme_ctrlr_get_ns(ctrlr: *mut Ctrlr, nsid: u32) -> *mut Ns;
    pub(crate) fn spdk_nvme_ns_is_active(ns: *mut Ns) -> bool;
    pub(crate) fn spdk_nvme_ns_get_sector_size(ns: *mut Ns) -> u32;
    pub(crate) fn spdk_nvme_ns_get_num_sectors(ns: *mut Ns) -> u64;
    pub(crate) fn spdk_nvme_ns_get_max_io_xfer_size(ns: *mut Ns) -> u32;
    pub(crate) fn spdk_nvme_ns_get_optimal_io_boundary(ns: *mut Ns) -> u32;
    pub(crate) fn spdk_nvme_ns_get_md_size(ns: *mut Ns) -> u32;
    pub(crate) fn spdk_nvme_ns_get_extended_sector_size(ns: *mut Ns) -> u32;
    /// `enum spdk_nvme_pi_type`: 0 is none.
    pub(crate) fn spdk_nvme_ns_get_pi_type(ns: *mut Ns) -> c_int;
    pub(crate) fn spdk_nvme_ctrlr_process_admin_completions(ctrlr: *mut Ctrlr) -> i32;
    pub(crate) fn spdk_nvme_ctrlr_alloc_io_qpair(
        ctrlr: *mut Ctrlr,
        opts: *const c_void,
        opts_size: usize,
    ) -> *mut Qpair;
    pub(crate) fn spdk_nvme_ctrlr_free_io_qpair(qpair: *mut Qpair) -> c_int;
    pub(crate) fn spdk_nvme_qpair_process_completions(qpair: *mut Qpair, max: u32) -> i32;
    pub(crate) fn spdk_nvme_ns_cmd_read(
        ns: *mut Ns,
        qpair: *mut Qpair,
        payload: *mut c_void,
        lba: u64,
        lba_count: u32,
        cb: CmdCb,
        cb_arg: *mut c_void,
        io_flags: u32,
    ) -> c_int;
    pub(crate) fn spdk_nvme_ns_cmd_write(
        ns: *mut Ns,
        qpair: *mut Qpair,
        payload: *mut c_void,
        lba: u64,
        lba_count: u32,
        cb: CmdCb,
        cb_arg: *mut c_void,
        io_flags: u32,
    ) -> c_int;
    pub(crate) fn spdk_nvme_ns_cmd_writev(
        ns: *mut Ns,
        qpair: *mut Qpair,
        lba: u64,
        lba_count: u32,
        cb: CmdCb,
        cb_arg: *mut c_void,
        io_flags: u32,
        reset_sgl: ResetSglCb,
        next_sge: NextSgeCb,
    ) -> c_int;
    pub(crate) fn spdk_nvme_ns_cmd_flush(
        ns: *mut Ns,
        qpair: *mut Qpair,
        cb: CmdCb,
        cb_arg: *mut c_void,
    ) -> c_int;
    pub(crate) fn spdk_nvme_ns_cmd_write_zeroes(
        ns: *mut Ns,
        qpair: *mut Qpair,
        lba: u64,
        lba_count: u32,
        cb: CmdCb,
        cb_arg: *mut c_void,
        io_flags: u32,
    ) -> c_int;
}
