//! The node's Raft log file: records appended and made durable (`fdatasync`)
//! before the node acts on them (see weir-core's `control::raft::persist`).

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
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                File::open(dir)?.sync_all()?;
            }
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

    /// Cut a torn tail: keep the first `len` bytes.
    pub fn truncate(&mut self, len: u64) -> std::io::Result<()> {
        if self.file.metadata()?.len() > len {
            tracing::warn!(path = %self.path.display(), len, "raft log had a torn tail; cut");
            self.file.set_len(len)?;
            self.file.sync_data()?;
        }
        Ok(())
    }
}

impl weir_core::node::LogStore for LogFile {
    fn append(&mut self, record: &[u8]) -> std::io::Result<()> {
        self.file.write_all(record)?;
        self.file.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weir_core::node::LogStore;

    #[test]
    fn records_survive_reopening_and_a_torn_tail_is_cut() {
        let dir = std::env::temp_dir().join(format!("weir-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("raft.log");
        let _ = std::fs::remove_file(&path);
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
}
