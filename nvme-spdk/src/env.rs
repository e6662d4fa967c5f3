//! SPDK's environment (once per process) and its DMA memory as a source of
//! buffer-pool regions.

use crate::error::OpenError;
use crate::ffi;
use crate::EnvOptions;
use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Mutex;
use weir_core::buf::{RegionSource, BUF_ALIGN};

/// The options the environment was set up with once it is, or the error its
/// set-up failed with (DPDK starts once per process: it is not tried again).
static ENV: Mutex<Option<Result<EnvOptions, i32>>> = Mutex::new(None);

/// Set SPDK's environment up with `opts`, unless it already is: then `opts`
/// must be what it was set up with.
pub(crate) fn init(opts: &EnvOptions) -> Result<(), OpenError> {
    let mut env = ENV
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(current) = &*env {
        let current = current.as_ref().map_err(|&rc| OpenError::Env(rc))?;
        if current != opts {
            return Err(OpenError::EnvMismatch(format!(
                "set up with {current:?}, asked for {opts:?}"
            )));
        }
        return Ok(());
    }
    if opts.no_huge && opts.mem_mb == 0 {
        return Err(OpenError::Options(
            "no_huge needs mem_mb, the memory to reserve instead of hugepages".into(),
        ));
    }
    let text = |s: &str, what: &str| {
        CString::new(s).map_err(|_| OpenError::Options(format!("{what} holds a NUL byte")))
    };
    // SPDK keeps pointers to these strings for the life of the process.
    let name: &'static CString = Box::leak(Box::new(text(&opts.name, "env name")?));
    let mask: Option<&'static CString> = match &opts.core_mask {
        Some(mask) => Some(Box::leak(Box::new(text(mask, "core_mask")?))),
        None => None,
    };
    let mem_mb = i32::try_from(opts.mem_mb)
        .map_err(|_| OpenError::Options(format!("mem_mb {} is too large", opts.mem_mb)))?;
    // SAFETY: the strings are NUL-terminated and live for the process; the glue
    // copies the scalars into SPDK's options struct.
    let rc = unsafe {
        ffi::weir_spdk_env_init(
            name.as_ptr(),
            mask.map_or(std::ptr::null(), |m| m.as_ptr()),
            mem_mb,
            opts.no_huge,
            false,
        )
    };
    if rc != 0 {
        *env = Some(Err(rc));
        return Err(OpenError::Env(rc));
    }
    *env = Some(Ok(opts.clone()));
    Ok(())
}

/// Buffer-pool regions from SPDK's DMA allocator.
#[derive(Debug)]
pub(crate) struct DmaSource;

impl RegionSource for DmaSource {
    fn alloc(&self, bytes: usize) -> Option<NonNull<u8>> {
        // SAFETY: `unused` must be null; any size and a power-of-two alignment
        // are accepted. A null return is "no memory".
        let ptr = unsafe {
            ffi::spdk_zmalloc(
                bytes,
                BUF_ALIGN,
                std::ptr::null_mut(),
                ffi::NUMA_ID_ANY,
                ffi::MALLOC_DMA,
            )
        };
        NonNull::new(ptr.cast())
    }

    unsafe fn free(&self, ptr: NonNull<u8>, _bytes: usize) {
        // SAFETY: the caller guarantees `ptr` came from `alloc` above and is no
        // longer used.
        unsafe { ffi::spdk_free(ptr.as_ptr().cast()) }
    }
}
