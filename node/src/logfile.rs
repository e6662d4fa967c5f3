//! The node's metadata files: its Raft log (records appended and made durable,
//! `fdatasync`, before the node acts on them; see weir-core's
//! `control::raft::persist`) and its block-version checkpoints (deltas appended
//! the same way, a full checkpoint written aside and renamed over the file; see
//! weir-core's `replication::versions`).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// An append-only, synced log file.
#[derive(Debug)]
pub struct LogFile {
    file: File,
    path: PathBuf,
}

impl LogFile {
    /// Open (creating) the log at `path` and return it with its contents.
    pub fn open(path: &Path) -> std::io::Result<(LogFile, Vec<u8>)> {
        let existed = path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        if !existed {
            // A new file's directory entry must survive a power loss too.
            sync_parent(path)?;
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok((
            LogFile {
                file,
                path: path.to_path_buf(),
            },
            bytes,
        ))
    }
}

impl weir_core::node::LogStore for LogFile {
    /// Cut a torn tail: keep the first `len` bytes.
    fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        if self.file.metadata()?.len() > len {
            tracing::warn!(path = %self.path.display(), len, "torn or untrusted tail cut");
            self.file.set_len(len)?;
            self.file.sync_data()?;
        }
        Ok(())
    }

    fn append(&mut self, record: &[u8]) -> std::io::Result<()> {
        self.file.write_all(record)?;
        self.file.sync_data()
    }

    /// Write `record` to a file beside this one, sync it, rename it over this one
    /// and sync the directory: a crash leaves the old file or the new one, whole.
    fn replace(&mut self, record: &[u8]) -> std::io::Result<()> {
        let mut aside = self.path.clone().into_os_string();
        aside.push(".new");
        let aside = PathBuf::from(aside);
        {
            let mut f = File::create(&aside)?;
            f.write_all(record)?;
            f.sync_all()?;
        }
        std::fs::rename(&aside, &self.path)?;
        sync_parent(&self.path)?;
        self.file = OpenOptions::new().append(true).open(&self.path)?;
        Ok(())
    }
}

/// Sync the directory holding `path`, so an entry created or renamed in it
/// survives a power loss.
fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// A name for the device at `path` that changes when the device is replaced, so
/// block-version checkpoints of one device are never trusted for another: a
/// block device's WWID or serial (from sysfs; its major:minor if neither is
/// readable), a file's filesystem and inode; with the capacity in bytes.
pub fn device_identity(path: &Path, capacity_bytes: u64) -> std::io::Result<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path)?;
    let name = if meta.file_type().is_block_device() {
        let (major, minor) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
        let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
        let read = |p: PathBuf| {
            std::fs::read_to_string(p)
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        };
        read(sys.join("wwid"))
            .or_else(|| read(sys.join("device/wwid")))
            .or_else(|| read(sys.join("device/serial")))
            .map_or(format!("block {major}:{minor}"), |id| format!("block {id}"))
    } else {
        format!("file {}:{}", meta.dev(), meta.ino())
    };
    Ok(format!("{name}, {capacity_bytes} bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::node::LogStore;

    /// An empty directory of this test process's own.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("weir-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn records_survive_reopening_and_a_torn_tail_is_cut() {
        let dir = scratch("log");
        let path = dir.join("raft.log");
        let (mut log, bytes) = LogFile::open(&path).unwrap();
        assert!(bytes.is_empty());
        log.append(b"first").unwrap();
        log.append(b"second").unwrap();
        drop(log);
        let (mut log, bytes) = LogFile::open(&path).unwrap();
        assert_eq!(bytes, b"firstsecond");
        log.truncate(5).unwrap();
        log.append(b"third").unwrap();
        drop(log);
        let (_, bytes) = LogFile::open(&path).unwrap();
        assert_eq!(bytes, b"firstthird");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_replaced_file_holds_only_the_new_record_and_takes_appends() {
        use weir_core::node::LogStore;
        let dir = scratch("ckpt");
        let path = dir.join("versions.ckpt");
        let (mut f, _) = LogFile::open(&path).unwrap();
        f.append(b"delta").unwrap();
        f.replace(b"full").unwrap();
        f.append(b"+1").unwrap();
        drop(f);
        assert_eq!(std::fs::read(&path).unwrap(), b"full+1");
        assert!(!dir.join("versions.ckpt.new").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_recreated_device_file_has_another_identity() {
        let dir = scratch("ident");
        let path = dir.join("device.img");
        std::fs::write(&path, b"").unwrap();
        let first = device_identity(&path, 1 << 20).unwrap();
        assert_eq!(first, device_identity(&path, 1 << 20).unwrap());
        assert_ne!(first, device_identity(&path, 2 << 20).unwrap());
        // A new file in its place (a new inode while the old one is still held).
        let held = std::fs::File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"").unwrap();
        assert_ne!(first, device_identity(&path, 1 << 20).unwrap());
        drop(held);
        assert!(device_identity(&dir.join("missing"), 1).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
