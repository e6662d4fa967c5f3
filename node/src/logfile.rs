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

/// The layout of a node's data directory this weir reads and writes: its
/// files (`raft.log`, `versions.ckpt`, the device) and what their records
/// hold (Raft's entries, its snapshots of the cluster map, the version
/// checkpoints). Raised whenever any of them changes; on the wire, the map
/// and commands travel under weir-core's `WIRE_VERSION` instead.
pub const DATA_FORMAT: u32 = 1;

/// The file in a data directory that names its format.
const FORMAT_FILE: &str = "FORMAT";

/// Check that the data directory `dir` is of [`DATA_FORMAT`], and stamp it if
/// it is new. A directory of weir's metadata without the file was written
/// before formats were named, in format 1. Another format is refused, naming
/// both: nothing converts a directory yet.
pub fn check_data_format(dir: &Path) -> anyhow::Result<()> {
    let path = dir.join(FORMAT_FILE);
    let found = match std::fs::read_to_string(&path) {
        Ok(text) => {
            let text = text.trim();
            let n = text
                .strip_prefix("weir data directory format ")
                .and_then(|n| n.parse::<u32>().ok())
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "{} does not name a weir data format: {text:?}",
                        path.display()
                    )
                })?;
            Some(n)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(anyhow::Error::new(e).context(format!("reading {}", path.display()))),
    };
    match found {
        Some(DATA_FORMAT) => Ok(()),
        Some(other) => anyhow::bail!(
            "data directory {} is in format {other}; this weir reads format {DATA_FORMAT} only \
             (no conversion exists yet: run the weir that wrote it, or start this node on an \
             empty directory)",
            dir.display()
        ),
        None => {
            // New, or of weir before formats were named (the same layout).
            let tmp = dir.join(format!("{FORMAT_FILE}.new"));
            let mut f = File::create(&tmp)?;
            writeln!(f, "weir data directory format {DATA_FORMAT}")?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            sync_parent(&path)?;
            Ok(())
        }
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
    fn a_data_directory_of_another_format_is_refused_naming_both() {
        let dir = scratch("format");
        // New: stamped, then accepted again.
        check_data_format(&dir).unwrap();
        let text = std::fs::read_to_string(dir.join(FORMAT_FILE)).unwrap();
        assert_eq!(text, format!("weir data directory format {DATA_FORMAT}\n"));
        check_data_format(&dir).unwrap();
        // Another format.
        std::fs::write(dir.join(FORMAT_FILE), "weir data directory format 7\n").unwrap();
        let e = check_data_format(&dir).unwrap_err().to_string();
        assert!(
            e.contains("format 7") && e.contains(&format!("format {DATA_FORMAT} only")),
            "{e}"
        );
        // Not a format at all.
        std::fs::write(dir.join(FORMAT_FILE), "hello\n").unwrap();
        let e = check_data_format(&dir).unwrap_err().to_string();
        assert!(e.contains("does not name a weir data format"), "{e}");
        // Written before formats were named: format 1, stamped.
        std::fs::remove_file(dir.join(FORMAT_FILE)).unwrap();
        std::fs::write(dir.join("raft.log"), b"").unwrap();
        check_data_format(&dir).unwrap();
        assert!(std::fs::read_to_string(dir.join(FORMAT_FILE))
            .unwrap()
            .contains("format 1"));
        std::fs::remove_dir_all(&dir).unwrap();
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
