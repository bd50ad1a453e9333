//! Reading a configuration file (an aggregation plan, a registry) without
//! letting the file decide how long or how much: servers read these at start
//! and on `POST /-/reload`, from paths anyone with write access to the
//! directory can swap.
//!
//! [`read`] opens the path non-blocking (`open` on a FIFO with no writer
//! would wait for one), takes only a regular file (a FIFO, a device such as
//! `/dev/zero`, a directory or a socket is an error naming what it is), and
//! reads at most [`MAX_BYTES`] (a file larger than that, or growing past it
//! while read, is an error, not a partial read).

use anyhow::{bail, Context, Result};
use std::io::Read;
use std::path::Path;

/// The largest configuration file read: far above any plan (1,000
/// aggregations of 32 quantiles are ~0.5 MB) or registry.
pub const MAX_BYTES: u64 = 16 << 20;

/// The text of the regular file at `path`, at most `max_bytes` long; `what`
/// names the file in errors ("plan", "registry").
pub fn read(path: &Path, what: &str, max_bytes: u64) -> Result<String> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let shown = path.display();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .with_context(|| format!("cannot open {what} {shown}"))?;
    let meta = file
        .metadata()
        .with_context(|| format!("cannot stat {what} {shown}"))?;
    let kind = meta.file_type();
    if !kind.is_file() {
        let is = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else if kind.is_dir() {
            "a directory"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "not a file"
        };
        bail!("{what} {shown} is {is}, not a regular file");
    }
    if meta.len() > max_bytes {
        bail!(
            "{what} {shown} is {} bytes, more than the {max_bytes} a {what} may be",
            meta.len()
        );
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {what} {shown}"))?;
    if bytes.len() as u64 > max_bytes {
        bail!("{what} {shown} grew past {max_bytes} bytes while it was read");
    }
    String::from_utf8(bytes).with_context(|| format!("{what} {shown} is not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("plan.toml");
        std::fs::write(&plain, "lateness_secs = 5\n").unwrap();
        assert_eq!(read(&plain, "plan", 100).unwrap(), "lateness_secs = 5\n");
        let err = format!("{:#}", read(&plain, "plan", 10).unwrap_err());
        assert!(err.contains("more than the 10"), "{err}");

        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo on a path we own.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let started = std::time::Instant::now();
        let err = format!("{:#}", read(&fifo, "plan", 100).unwrap_err());
        assert!(err.contains("is a FIFO"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5));

        let zero = dir.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let err = format!("{:#}", read(&zero, "registry", MAX_BYTES).unwrap_err());
        assert!(err.contains("character device"), "{err}");
        let err = format!("{:#}", read(dir.path(), "plan", 100).unwrap_err());
        assert!(err.contains("directory"), "{err}");
        let err = format!(
            "{:#}",
            read(&dir.path().join("nope"), "plan", 100).unwrap_err()
        );
        assert!(err.contains("cannot open plan"), "{err}");
    }
}
