//! Reading a shared file mapping without dying when the file shrinks.
//!
//! A page of a mapping past the end of its file raises `SIGBUS` when touched,
//! and the default action kills the process. The exporter maps store files
//! under their `flock` and checks `used` against the size it read under the
//! lock, but a process that does not follow the protocol (an outside
//! `truncate`, `> file`, a network filesystem's I/O error) can still shrink a
//! file mid-read. [`read_guarded`] registers the mapped region for the
//! duration of one read; a `SIGBUS` inside a registered region maps a zero
//! page over the faulting page (so the load completes and reads zeros) and
//! marks the read as failed, and the caller discards what it read. A `SIGBUS`
//! anywhere else goes to the handler that was there before (Rust's runtime
//! installs one to report stack overflows), or, if there was none, kills the
//! process as it always would.

use std::sync::atomic::{compiler_fence, AtomicBool, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Regions being read at once: one per thread reading a mapping. A reader
/// that finds none free is told so and reads another way.
const SLOTS: usize = 64;

struct Slot {
    busy: AtomicBool,
    start: AtomicUsize,
    end: AtomicUsize,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Slot = Slot {
    busy: AtomicBool::new(false),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};

static TABLE: [Slot; SLOTS] = [FREE; SLOTS];
static PAGE_SIZE: AtomicUsize = AtomicUsize::new(4096);

/// The `SIGBUS` action before ours; `None` if ours could not be installed.
static PREVIOUS: OnceLock<Option<libc::sigaction>> = OnceLock::new();

/// Why a guarded read gave no result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unguarded {
    /// A page of the region was gone (the file shrank): what was read is garbage.
    Faulted,
    /// No guard was available (all slots busy, or the handler not installed):
    /// nothing was read; read the file another way.
    Unavailable,
}

/// Runs `read` on `region` (part of a file mapping) with `SIGBUS` inside the
/// region caught: `Err(Faulted)` if a page was missing, in which case the
/// result of `read` is dropped.
pub fn read_guarded<T>(region: &[u8], read: impl FnOnce(&[u8]) -> T) -> Result<T, Unguarded> {
    if PREVIOUS.get_or_init(install).is_none() {
        return Err(Unguarded::Unavailable);
    }
    let Some(slot) = TABLE.iter().find(|slot| {
        slot.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }) else {
        return Err(Unguarded::Unavailable);
    };
    let start = region.as_ptr() as usize;
    slot.faulted.store(false, Ordering::SeqCst);
    slot.start.store(start, Ordering::SeqCst);
    slot.end.store(start + region.len(), Ordering::SeqCst);
    compiler_fence(Ordering::SeqCst);
    let out = read(region);
    compiler_fence(Ordering::SeqCst);
    let faulted = slot.faulted.load(Ordering::SeqCst);
    slot.end.store(0, Ordering::SeqCst);
    slot.start.store(0, Ordering::SeqCst);
    slot.busy.store(false, Ordering::Release);
    if faulted {
        Err(Unguarded::Faulted)
    } else {
        Ok(out)
    }
}

fn install() -> Option<libc::sigaction> {
    // SAFETY: sysconf has no preconditions; sigaction is given a zeroed,
    // then filled, struct and a handler that only touches atomics and mmap.
    unsafe {
        let page = libc::sysconf(libc::_SC_PAGESIZE);
        if page > 0 {
            PAGE_SIZE.store(page as usize, Ordering::SeqCst);
        }
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigbus as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut action.sa_mask);
        let mut previous: libc::sigaction = std::mem::zeroed();
        (libc::sigaction(libc::SIGBUS, &action, &mut previous) == 0).then_some(previous)
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel hands a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    for slot in &TABLE {
        let (start, end) = (
            slot.start.load(Ordering::SeqCst),
            slot.end.load(Ordering::SeqCst),
        );
        if start <= addr && addr < end {
            let page = addr & !(PAGE_SIZE.load(Ordering::SeqCst) - 1);
            // SAFETY: replaces one page of a mapping a reader registered; the
            // mapping's owner unmaps the whole range later, this page with it.
            let mapped = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    PAGE_SIZE.load(Ordering::SeqCst),
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if mapped != libc::MAP_FAILED {
                slot.faulted.store(true, Ordering::SeqCst);
                return;
            }
        }
    }
    // Not a guarded read: whatever would have happened without us.
    let Some(Some(previous)) = PREVIOUS.get() else {
        return;
    };
    let handler = previous.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: restores the previous action; the faulting load runs again
        // and gets it (the default: the process dies, as without us).
        unsafe { libc::sigaction(libc::SIGBUS, previous, std::ptr::null_mut()) };
    } else if previous.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler, called as it was installed.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(handler) };
        f(sig, info, context);
    } else {
        // SAFETY: as above, a plain handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
        f(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A mapping whose file is truncated under it reads as `Faulted`, and the
    /// process lives.
    #[test]
    fn shrunk_file_is_a_fault_not_a_crash() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![7u8; 64 * 1024]).unwrap();
        // SAFETY: the test's own file; the point is that it shrinks.
        let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
        assert_eq!(
            read_guarded(&map, |m| m.iter().map(|&b| b as u64).sum::<u64>()),
            Ok(7 * 64 * 1024)
        );
        file.set_len(100).unwrap();
        assert_eq!(
            read_guarded(&map, |m| m.iter().map(|&b| b as u64).sum::<u64>()),
            Err(Unguarded::Faulted)
        );
        // Within the first page the file still has its bytes.
        assert_eq!(read_guarded(&map[..100], |m| m[99]), Ok(7));
    }
}
