//! Whether a store file's writer is gone: the kernel's answer, not a pid's.
//!
//! client_ruby's writer opens its process's file for writing when the
//! process first touches the metric and keeps it open until the process
//! exits (`FileMappedDict`'s `@f`; promlab's writer keeps its `File` the
//! same way, and a mapping opened for writing counts as open after its
//! descriptor is closed). So "no one has this file open for writing" means
//! its writer has exited. Linux answers exactly that with a *read lease*
//! (`fcntl(F_SETLEASE, F_RDLCK)`): it is granted only while no open file
//! description of the inode is writable, whichever process or pid namespace
//! holds it — a pid in `/proc` proves nothing across containers, and pids
//! are reused (`pid_max` is 32,768 on many hosts).
//!
//! While the lease is held, anyone opening the file for writing (a new
//! process that got the dead one's pid, or a `truncate`) blocks in `open` and
//! the lease shows a break pending ([`ReadLease::intact`] turns false); the
//! opener proceeds when the lease is released, at most `lease-break-time`
//! (45 s by default) later. Readers (client_ruby's exporter, promlab's
//! mappings) neither break nor prevent it.
//!
//! What it assumes, and where it does not hold:
//! - the lease needs the file's owner or `CAP_LEASE`, a filesystem with
//!   leases (local ones: ext4, xfs, tmpfs, overlayfs on them), and
//!   `fs.leases-enable = 1`; without them [`probe`] says
//!   [`Writers::Unknown`] and callers treat the file as live;
//! - writers on *other hosts* (a network filesystem) are invisible to it:
//!   NFS and SMB directories must not be folded;
//! - a writer that closes its file and later reopens it by path (client_ruby
//!   does not; promlab's writer does not) looks exited in between.

use std::fs::File;
use std::os::fd::AsRawFd;

/// What a lease probe found out about a file's writers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writers {
    /// No one has the file open for writing: its writer has exited.
    None,
    /// Someone has it open for writing: a live writer (or a reader that
    /// opened it read-write).
    Open,
    /// The kernel would not say (not the owner and no `CAP_LEASE`, no lease
    /// support on the filesystem, leases disabled): treat it as live.
    Unknown,
}

/// A read lease on an open file: while [`ReadLease::intact`], no one has
/// the file open for writing, and anyone who tries is waiting for it.
/// Released on drop.
#[derive(Debug)]
pub struct ReadLease<'f> {
    file: &'f File,
}

impl<'f> ReadLease<'f> {
    /// Takes a read lease on `file` (any open file; read-only is enough).
    pub fn take(file: &'f File) -> Result<ReadLease<'f>, Writers> {
        ignore_sigio();
        let fd = file.as_raw_fd();
        // SAFETY: fcntl on a descriptor `file` holds open.
        if unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_RDLCK) } != 0 {
            let err = std::io::Error::last_os_error();
            return Err(match err.raw_os_error() {
                Some(libc::EAGAIN) => Writers::Open,
                _ => Writers::Unknown,
            });
        }
        // Taking a lease makes this process the descriptor's owner, so a
        // break would send it SIGIO, whose default action ends the process.
        // No owner, no signal: breaks are polled with `intact`. (A break
        // between the two calls still signals: `ignore_sigio` covers it.)
        // SAFETY: as above.
        unsafe { libc::fcntl(fd, libc::F_SETOWN, 0) };
        Ok(ReadLease { file })
    }

    /// Whether the lease still stands: no one has started opening the file
    /// for writing since it was taken.
    pub fn intact(&self) -> bool {
        // SAFETY: fcntl on a descriptor the lease's file holds open.
        unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_GETLEASE) == libc::F_RDLCK }
    }
}

impl Drop for ReadLease<'_> {
    fn drop(&mut self) {
        // SAFETY: as above; releasing lets a waiting opener through.
        unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_SETLEASE, libc::F_UNLCK) };
    }
}

/// A [`ReadLease`] that owns its file, so that many can be held at once
/// without borrowing (a fold's commit round holds its sources' leases from
/// their reading to the end of its grace period). Released on drop.
#[derive(Debug)]
pub struct HeldLease {
    file: File,
}

impl HeldLease {
    /// Takes a read lease on `file`, as [`ReadLease::take`]; gives the file
    /// back with the refusal.
    pub fn take(file: File) -> Result<HeldLease, (File, Writers)> {
        let taken = ReadLease::take(&file).map(|lease| {
            // Released by this lease's own drop.
            std::mem::forget(lease)
        });
        match taken {
            Ok(()) => Ok(HeldLease { file }),
            Err(writers) => Err((file, writers)),
        }
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    /// [`ReadLease::intact`].
    pub fn intact(&self) -> bool {
        std::mem::ManuallyDrop::new(ReadLease { file: &self.file }).intact()
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        drop(ReadLease { file: &self.file });
    }
}

/// Sets SIGIO to be ignored if it has its default action (which ends the
/// process), once per process. `F_SETLEASE` makes the caller the file's
/// owner before [`ReadLease::take`] can clear it, so a writer opening the
/// file in between sends SIGIO: under a soak's writers that killed the
/// sidecar three times in a minute. Breaks are polled, never signalled, so
/// nothing here needs the signal; a handler the host installed is left as it
/// is.
fn ignore_sigio() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: sigaction with a zeroed struct to read the current action,
        // then `signal` to install SIG_IGN only where the default stood.
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGIO, std::ptr::null(), &mut current) == 0
                && current.sa_sigaction == libc::SIG_DFL
            {
                libc::signal(libc::SIGIO, libc::SIG_IGN);
            }
        }
    });
}

/// Whether `file`'s writer is gone, now: a read lease taken and released.
pub fn probe(file: &File) -> Writers {
    match ReadLease::take(file) {
        Ok(_lease) => Writers::None,
        Err(writers) => writers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease break that lands before `F_SETOWN` clears the owner sends
    /// SIGIO; after a probe, SIGIO no longer ends the process.
    #[test]
    fn after_a_probe_sigio_does_not_end_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        std::fs::write(&path, b"x").unwrap();
        let file = File::open(&path).unwrap();
        let _ = probe(&file);
        // SAFETY: raising a signal whose action is now SIG_IGN (or the
        // host's own handler, which a test process does not have).
        assert_eq!(unsafe { libc::raise(libc::SIGIO) }, 0);
    }

    #[test]
    fn a_file_open_for_writing_has_a_writer_until_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        let writer = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let reader = File::open(&path).unwrap();
        assert_eq!(probe(&reader), Writers::Open);
        // A writable shared mapping keeps its file open for writing after
        // the descriptor is closed.
        writer.set_len(4096).unwrap();
        // SAFETY: the test's own file.
        let map = unsafe { memmap2::MmapMut::map_mut(&writer).unwrap() };
        drop(writer);
        assert_eq!(probe(&reader), Writers::Open);
        drop(map);
        assert_eq!(probe(&reader), Writers::None);
        // Other readers do not count.
        let other_reader = File::open(&path).unwrap();
        assert_eq!(probe(&reader), Writers::None);
        drop(other_reader);
    }

    #[test]
    fn a_held_lease_sees_a_writer_coming() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        std::fs::write(&path, b"x").unwrap();
        let reader = File::open(&path).unwrap();
        let lease = ReadLease::take(&reader).unwrap();
        assert!(lease.intact());
        let opener = {
            let path = path.clone();
            std::thread::spawn(move || {
                // Blocks until the lease is released.
                std::fs::OpenOptions::new().write(true).open(path).unwrap()
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while lease.intact() {
            assert!(std::time::Instant::now() < deadline, "no break seen");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        drop(lease);
        let writer = opener.join().unwrap();
        assert_eq!(probe(&reader), Writers::Open);
        drop(writer);
    }
}
