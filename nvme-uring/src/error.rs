//! Why opening a device failed, and how a failed completion maps to `DevError`.

use std::io;
use std::path::PathBuf;
use weir_core::device::DevError;
use weir_core::ids::Lba;

/// Why [`UringDevice::open`](crate::UringDevice::open) failed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The options contradict themselves or the limits of this adapter.
    #[error("invalid device options: {0}")]
    BadOptions(&'static str),
    /// The path does not exist and `create` was not asked for.
    #[error("{path}: no such file (set `create` and `capacity_bytes` to create it)")]
    NotFound {
        /// The path given to `open`.
        path: PathBuf,
    },
    /// The path exists but is neither a regular file nor a block device.
    #[error("{path}: not a regular file or a block device")]
    NotFileOrBlockDevice {
        /// The path given to `open`.
        path: PathBuf,
    },
    /// The filesystem refused O_DIRECT (EINVAL on open or on the first aligned read).
    #[error(
        "{path}: the filesystem does not support O_DIRECT (or needs a larger alignment \
         than the block size); put the device file on a filesystem that supports \
         O_DIRECT, such as ext4 or xfs"
    )]
    DirectIoUnsupported {
        /// The path given to `open`.
        path: PathBuf,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// io_uring_setup failed with ENOSYS or EPERM: the kernel was built without
    /// io_uring, or it is switched off.
    #[error(
        "io_uring is not available: the kernel lacks it or it is disabled \
         (see /proc/sys/kernel/io_uring_disabled; a container's seccomp profile can \
         also block it)"
    )]
    UringUnavailable {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// The kernel's io_uring lacks an operation this adapter issues.
    #[error(
        "the kernel's io_uring lacks read, write, fsync or fallocate; \
         Linux 5.6 or newer is needed"
    )]
    KernelTooOld,
    /// io_uring_setup failed for another reason (on kernels before 5.12 the rings
    /// count against RLIMIT_MEMLOCK, so ENOMEM usually means that limit is too low).
    #[error("io_uring setup failed (on kernels before 5.12, check RLIMIT_MEMLOCK)")]
    UringSetup {
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// The kernel or the device cannot run the asked [`crate::PollMode`].
    #[error("{path}: [device] mode = \"{mode}\" is not possible here: {why}")]
    ModeUnsupported {
        /// The path given to `open`.
        path: PathBuf,
        /// The mode's name.
        mode: &'static str,
        /// Why, and what to do instead.
        why: String,
    },
    /// The namespace size is not a whole number of blocks.
    #[error("{path}: size {size_bytes} bytes is not a multiple of the block size {block_size}")]
    NotBlockMultiple {
        /// The path given to `open`.
        path: PathBuf,
        /// The size found (or asked for with `capacity_bytes`).
        size_bytes: u64,
        /// The configured block size.
        block_size: u32,
    },
    /// The file or block device holds no blocks.
    #[error("{path}: size is zero (give `capacity_bytes` to size a new file)")]
    Empty {
        /// The path given to `open`.
        path: PathBuf,
    },
    /// A block device is smaller than the requested capacity.
    #[error("{path}: {size_bytes} bytes, smaller than the requested {capacity_bytes}")]
    TooSmall {
        /// The path given to `open`.
        path: PathBuf,
        /// The device's size.
        size_bytes: u64,
        /// The requested capacity.
        capacity_bytes: u64,
    },
    /// Any other I/O error while opening, sizing or probing the file.
    #[error("{path}: {op} failed")]
    Io {
        /// The path given to `open`.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// A queue's completion thread could not be started.
    #[error("could not start the io_uring thread of queue {queue}")]
    Thread {
        /// The queue index.
        queue: u16,
        /// The OS's answer.
        #[source]
        source: io::Error,
    },
}

/// Map a failed completion (`-errno` in the CQE) to the device error the core sees.
/// `lba` is the first block the failed transfer had not yet moved.
///
/// The core distinguishes only media errors, timeouts and a gone device, so every
/// errno that means "this range could not be read or written" (EIO, ENOSPC on a
/// sparse file, EDQUOT, EILSEQ, ...) is a media error at `lba`; errnos that mean
/// the device or its file handle went away are `Gone`.
pub(crate) fn dev_error(errno: i32, lba: Lba) -> DevError {
    match errno {
        libc::ETIMEDOUT => DevError::Timeout,
        libc::ENODEV | libc::ENXIO | libc::EBADF | libc::ESHUTDOWN | libc::ENOMEDIUM => {
            DevError::Gone
        }
        _ => DevError::Media(lba),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_map_to_device_errors() {
        assert_eq!(dev_error(libc::EIO, Lba(7)), DevError::Media(Lba(7)));
        assert_eq!(dev_error(libc::ENOSPC, Lba(3)), DevError::Media(Lba(3)));
        assert_eq!(dev_error(libc::ETIMEDOUT, Lba(0)), DevError::Timeout);
        assert_eq!(dev_error(libc::ENODEV, Lba(0)), DevError::Gone);
        assert_eq!(dev_error(libc::ENXIO, Lba(0)), DevError::Gone);
    }
}
