//! Opening the backing file or block device with O_DIRECT, sizing it, and setting up
//! the rings. Everything that can fail at start-up fails here, with a typed error,
//! before any thread is started.

use crate::error::OpenError;
use crate::{PollMode, UringOptions, SQPOLL_IDLE_MS};
use io_uring::{opcode, IoUring, Probe};
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use weir_core::buf::BufPool;

/// Largest queue depth accepted; bounds the ring and the in-flight table.
pub(crate) const QUEUE_DEPTH_MAX: u16 = 4096;
/// Largest single transfer accepted: a completion reports its byte count in an
/// `i32`, and the zero-fill fallback keeps one buffer of this size per queue.
/// The largest transfer: a bounce buffer for it (unaligned or gathered writes)
/// is one pool buffer, at most a pool region.
pub(crate) const MAX_TRANSFER_BYTES_MAX: u32 = weir_core::buf::REGION_BYTES_MAX as u32;

/// What backs the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackingKind {
    /// A regular file on a filesystem that supports O_DIRECT.
    File,
    /// A block device node.
    BlockDevice,
}

/// The opened file and the namespace it holds.
#[derive(Debug)]
pub(crate) struct Backing {
    pub(crate) file: File,
    pub(crate) kind: BackingKind,
    /// Namespace size in bytes, a whole number of blocks.
    pub(crate) size_bytes: u64,
}

/// Check the options against this adapter's limits.
pub(crate) fn validate(opts: &UringOptions) -> Result<(), OpenError> {
    let bs = opts.block_size;
    if !bs.is_power_of_two() || bs < 512 {
        return Err(OpenError::BadOptions(
            "block_size must be a power of two >= 512",
        ));
    }
    if opts.max_transfer_bytes < bs || !opts.max_transfer_bytes.is_multiple_of(bs) {
        return Err(OpenError::BadOptions(
            "max_transfer_bytes must be a non-zero multiple of block_size",
        ));
    }
    if opts.max_transfer_bytes > MAX_TRANSFER_BYTES_MAX {
        return Err(OpenError::BadOptions(
            "max_transfer_bytes must be at most 64 MiB",
        ));
    }
    if opts.queues == 0 {
        return Err(OpenError::BadOptions("queues must be at least 1"));
    }
    if opts.queue_depth == 0 || opts.queue_depth > QUEUE_DEPTH_MAX {
        return Err(OpenError::BadOptions("queue_depth must be in 1..=4096"));
    }
    if opts.create && opts.capacity_bytes.is_none() {
        return Err(OpenError::BadOptions("create needs capacity_bytes"));
    }
    Ok(())
}

/// Open `path` with O_DIRECT, size it, and prove that an aligned O_DIRECT read works.
pub(crate) fn open_backing(path: &Path, opts: &UringOptions) -> Result<Backing, OpenError> {
    let owned = || path.to_path_buf();
    // Check the type first: O_DIRECT on, say, a character device fails with EINVAL,
    // which would otherwise read as "filesystem without O_DIRECT".
    match std::fs::metadata(path) {
        Ok(meta) if !(meta.is_file() || meta.file_type().is_block_device()) => {
            return Err(OpenError::NotFileOrBlockDevice { path: owned() });
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound && opts.create => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(OpenError::NotFound { path: owned() })
        }
        Err(e) => return Err(io_err(path, "stat", e)),
    }
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(opts.create)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EINVAL) => OpenError::DirectIoUnsupported {
                path: owned(),
                source: e,
            },
            Some(libc::ENOENT) => OpenError::NotFound { path: owned() },
            _ => io_err(path, "open with O_DIRECT", e),
        })?;
    let meta = file.metadata().map_err(|e| io_err(path, "stat", e))?;
    let kind = if meta.file_type().is_block_device() {
        BackingKind::BlockDevice
    } else {
        BackingKind::File
    };
    let size_bytes = namespace_size(&mut file, kind, meta.len(), path, opts)?;
    probe_direct_read(&file, path, opts.block_size)?;
    Ok(Backing {
        file,
        kind,
        size_bytes,
    })
}

/// The namespace size: `capacity_bytes` if given (a regular file is extended to it,
/// sparse, and never shrunk; a block device must be at least that large), else the
/// whole file or device.
fn namespace_size(
    file: &mut File,
    kind: BackingKind,
    file_len: u64,
    path: &Path,
    opts: &UringOptions,
) -> Result<u64, OpenError> {
    let size_bytes = match kind {
        // st_size of a block device node is 0; its size is where a seek to the end lands.
        BackingKind::BlockDevice => file
            .seek(SeekFrom::End(0))
            .map_err(|e| io_err(path, "seek to the end of the block device", e))?,
        BackingKind::File => file_len,
    };
    let namespace_bytes = match opts.capacity_bytes {
        None => size_bytes,
        Some(capacity_bytes) => {
            check_blocks(path, capacity_bytes, opts.block_size)?;
            if size_bytes < capacity_bytes {
                if kind == BackingKind::BlockDevice {
                    return Err(OpenError::TooSmall {
                        path: path.to_path_buf(),
                        size_bytes,
                        capacity_bytes,
                    });
                }
                file.set_len(capacity_bytes)
                    .map_err(|e| io_err(path, "extend the file to capacity_bytes", e))?;
            }
            capacity_bytes
        }
    };
    check_blocks(path, namespace_bytes, opts.block_size)?;
    Ok(namespace_bytes)
}

fn check_blocks(path: &Path, size_bytes: u64, block_size: u32) -> Result<(), OpenError> {
    if size_bytes == 0 {
        return Err(OpenError::Empty {
            path: path.to_path_buf(),
        });
    }
    if !size_bytes.is_multiple_of(u64::from(block_size)) {
        return Err(OpenError::NotBlockMultiple {
            path: path.to_path_buf(),
            size_bytes,
            block_size,
        });
    }
    Ok(())
}

/// Read block 0 through O_DIRECT. Some filesystems accept the O_DIRECT open and
/// refuse the I/O, and a device whose logical block is larger than `block_size`
/// refuses the alignment: both show up here, at open, as EINVAL.
fn probe_direct_read(file: &File, path: &Path, block_size: u32) -> Result<(), OpenError> {
    let len = block_size as usize;
    let mut buf = BufPool::new(len)
        .alloc(len)
        .expect("a fresh pool sized for one block has room for it");
    file.read_at(buf.as_mut(), 0).map_err(|e| {
        if e.raw_os_error() == Some(libc::EINVAL) {
            OpenError::DirectIoUnsupported {
                path: path.to_path_buf(),
                source: e,
            }
        } else {
            io_err(path, "O_DIRECT read of block 0", e)
        }
    })?;
    Ok(())
}

/// One queue's rings: `main` for everything (or, in [`PollMode::Iopoll`],
/// for what cannot be polled: flushes, zeroing, the wake-up read), `poll`
/// for reads and writes in [`PollMode::Iopoll`]. Each has the device's file
/// registered at index 0 (fixed files).
pub(crate) struct Rings {
    pub(crate) main: IoUring,
    pub(crate) poll: Option<IoUring>,
}

/// The rings of one queue in `mode`, each with room for `queue_depth`
/// commands plus the wake-up read, and `file` registered.
pub(crate) fn new_rings(
    path: &Path,
    file: &File,
    queue_depth: u16,
    mode: PollMode,
) -> Result<Rings, OpenError> {
    let entries = (u32::from(queue_depth) + 1).next_power_of_two();
    let refused = |why: String| OpenError::ModeUnsupported {
        path: path.to_path_buf(),
        mode: mode.name(),
        why,
    };
    let main = match mode {
        PollMode::Sqpoll => IoUring::builder()
            .setup_sqpoll(SQPOLL_IDLE_MS)
            .build(entries)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EPERM | libc::EINVAL) => refused(format!(
                    "the kernel refused a polled submission queue ({e}); Linux 5.11 or \
                     newer lets an unprivileged process have one; use mode = \"interrupt\""
                )),
                _ => setup_error(e),
            })?,
        _ => IoUring::new(entries).map_err(setup_error)?,
    };
    if mode == PollMode::Sqpoll && !main.params().is_feature_sqpoll_nonfixed() {
        // Before 5.11 a polled submission queue takes registered files only,
        // and the wake-up read's eventfd is not one.
        return Err(refused(
            "this kernel's polled submission queue takes registered files only \
             (before Linux 5.11); use mode = \"interrupt\""
                .into(),
        ));
    }
    check_ops(&main)?;
    let poll = match mode {
        PollMode::Iopoll => Some(IoUring::builder().setup_iopoll().build(entries).map_err(
            |e| match e.raw_os_error() {
                Some(libc::EINVAL | libc::EOPNOTSUPP) => {
                    refused(format!("the kernel refused a polled ring ({e})"))
                }
                _ => setup_error(e),
            },
        )?),
        _ => None,
    };
    let fd = file.as_raw_fd();
    for ring in std::iter::once(&main).chain(poll.as_ref()) {
        ring.submitter()
            .register_files(&[fd])
            .map_err(|e| io_err(path, "register the file with io_uring", e))?;
    }
    Ok(Rings { main, poll })
}

fn setup_error(e: io::Error) -> OpenError {
    match e.raw_os_error() {
        Some(libc::ENOSYS | libc::EPERM | libc::EACCES) => {
            OpenError::UringUnavailable { source: e }
        }
        _ => OpenError::UringSetup { source: e },
    }
}

/// The ring's kernel has every operation this adapter issues.
fn check_ops(ring: &IoUring) -> Result<(), OpenError> {
    let mut probe = Probe::new();
    // register_probe itself arrived in 5.6, with IORING_OP_READ/WRITE/FALLOCATE.
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|_| OpenError::KernelTooOld)?;
    let needed = [
        opcode::Read::CODE,
        opcode::Write::CODE,
        opcode::Fsync::CODE,
        opcode::Fallocate::CODE,
    ];
    if !needed.iter().all(|&code| probe.is_supported(code)) {
        return Err(OpenError::KernelTooOld);
    }
    Ok(())
}

/// Whether the block device under `file` polls: its queue's `io_poll` in
/// sysfs (1 when the driver has polled queues: NVMe with the nvme module's
/// `poll_queues` above 0). A file on a file system polls if its block device
/// does; one on no block device (tmpfs, overlayfs) cannot. Anything else is
/// refused here, at open, rather than failing every read later (a probe read
/// would not do: a hole in a sparse file reads without touching the device).
pub(crate) fn check_iopoll(file: &File, path: &Path, kind: BackingKind) -> Result<(), OpenError> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata().map_err(|e| io_err(path, "stat", e))?;
    let dev = match kind {
        BackingKind::BlockDevice => meta.rdev(),
        BackingKind::File => meta.dev(),
    };
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let refuse = |why: String| OpenError::ModeUnsupported {
        path: path.to_path_buf(),
        mode: PollMode::Iopoll.name(),
        why: format!("{why}; use mode = \"interrupt\" or \"sqpoll\""),
    };
    // The device's directory; a partition's queue is its disk's.
    let dir = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let dir = std::fs::canonicalize(&dir).map_err(|_| {
        refuse(format!(
            "its file system names no block device (device {major}:{minor}: a memory, \
             overlay or multi-device file system such as btrfs), and only a block \
             device's driver can poll"
        ))
    })?;
    let flag = [dir.join("queue/io_poll"), dir.join("../queue/io_poll")]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok());
    let name = dir
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    match flag.as_deref().map(str::trim) {
        Some("1") => Ok(()),
        Some(_) => Err(refuse(format!(
            "polled completions need a block device whose driver has polled queues, \
             and {name} has none (queue/io_poll is 0; for NVMe, set the nvme module's \
             poll_queues above 0)"
        ))),
        None => Err(refuse(format!(
            "{name} does not say whether it polls (no queue/io_poll)"
        ))),
    }
}

fn io_err(path: &Path, op: &'static str, source: io::Error) -> OpenError {
    OpenError::Io {
        path: PathBuf::from(path),
        op,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked() {
        let ok = UringOptions::default();
        assert!(validate(&ok).is_ok());
        let bad = [
            UringOptions {
                block_size: 1000,
                ..ok.clone()
            },
            UringOptions {
                max_transfer_bytes: 6000,
                ..ok.clone()
            },
            UringOptions {
                queues: 0,
                ..ok.clone()
            },
            UringOptions {
                queue_depth: 0,
                ..ok.clone()
            },
            UringOptions {
                queue_depth: QUEUE_DEPTH_MAX + 1,
                ..ok.clone()
            },
            UringOptions {
                create: true,
                capacity_bytes: None,
                ..ok.clone()
            },
        ];
        for opts in bad {
            assert!(
                matches!(validate(&opts), Err(OpenError::BadOptions(_))),
                "{opts:?} accepted"
            );
        }
    }
}
