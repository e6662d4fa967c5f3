//! Why a device could not be opened.

/// Why [`SpdkDevice::open`](crate::SpdkDevice::open) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The crate was built without the `spdk` feature.
    #[error("weir was built without SPDK; rebuild with --features spdk where SPDK is installed")]
    NotBuilt,
    /// Built with the feature, but SPDK was not found at build time.
    #[error(
        "weir was built with --features spdk, but pkg-config found no SPDK then ({0}); install \
         SPDK 24.09 or later with its pkg-config files (PKG_CONFIG_PATH) and rebuild"
    )]
    NotFound(&'static str),
    /// The options cannot work.
    #[error("invalid SPDK device options: {0}")]
    Options(String),
    /// SPDK's environment did not start (hugepages, permissions, PCI access).
    #[error(
        "SPDK's environment did not start ({}); are hugepages reserved (scripts/setup.sh) and is \
         weir running as root?", errno_name(*.0)
    )]
    Env(i32),
    /// SPDK's environment was already set up with other options.
    #[error("SPDK's environment is already set up in this process with other options: {0}")]
    EnvMismatch(String),
    /// No controller at this transport id, or it would not attach.
    #[error(
        "no NVMe controller attached at \"{trid}\" ({}); is it bound to vfio-pci or uio \
         (SPDK's scripts/setup.sh) and not already in use?", errno_name(*.code)
    )]
    Connect {
        /// The transport id.
        trid: String,
        /// The negative errno.
        code: i32,
    },
    /// The namespace does not exist or is not active.
    #[error("namespace {nsid} of \"{trid}\" is not active")]
    Namespace {
        /// The transport id.
        trid: String,
        /// The namespace id.
        nsid: u32,
    },
    /// The namespace's shape does not suit weir.
    #[error("namespace {nsid}: {why}")]
    Shape {
        /// The namespace id.
        nsid: u32,
        /// What is wrong.
        why: String,
    },
    /// DMA memory could not be had.
    #[error("SPDK gave no DMA memory for {0} bytes; raise the hugepage reservation (mem_mb)")]
    Dma(usize),
    /// A queue pair could not be allocated.
    #[error("SPDK allocated no I/O queue pair for queue {queue}; the controller has fewer")]
    Qpair {
        /// Which queue.
        queue: u16,
    },
    /// A polling thread could not be started or pinned.
    #[error("queue {queue}'s polling thread: {source}")]
    Thread {
        /// Which queue.
        queue: u16,
        /// What the system said.
        source: std::io::Error,
    },
}

/// `ENODEV (-19)`-style text for a negative errno.
pub(crate) fn errno_name(code: i32) -> String {
    let err = std::io::Error::from_raw_os_error(code.saturating_abs());
    format!("{err}, errno {code}")
}
