//! Secrets kept in files: random bytes written as hex, mode 0600, made at
//! first use (the admin token, volume keys).

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// How long a secret read from a file may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Length {
    /// Exactly the bytes asked for (a key).
    Exact,
    /// At least them (a token an operator may have made longer).
    AtLeast,
}

/// The hex secret of `bytes` random bytes in `path`, made if the file is
/// missing; `what` names it in the error for a file that holds something else.
pub fn load_or_create_hex(
    path: &Path,
    (bytes, length): (usize, Length),
    what: &str,
) -> std::io::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let secret = text.trim().to_string();
            let long_enough = match length {
                Length::Exact => secret.len() == 2 * bytes,
                Length::AtLeast => secret.len() >= 2 * bytes,
            };
            if !long_enough || !secret.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "{}: not {what} ({} hex digits expected); delete it to make a new one",
                        path.display(),
                        2 * bytes
                    ),
                ));
            }
            Ok(secret)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let secret: String = (0..bytes)
                .map(|_| format!("{:02x}", rand::random::<u8>()))
                .collect();
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)?;
            writeln!(f, "{secret}")?;
            f.sync_all()?;
            Ok(secret)
        }
        Err(e) => Err(e),
    }
}
