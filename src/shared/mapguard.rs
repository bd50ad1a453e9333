//! Reading and writing shared file mappings without dying when the file shrinks.
//!
//! A page of a mapping past the end of its file raises `SIGBUS` when touched,
//! and the default action kills the process. The exporter maps store files
//! under their `flock` and checks `used` against the size it read under the
//! lock, and the writer (`mmap-store`) maps its own files, but a process that
//! does not follow the protocol (an outside `truncate`, `> file`, a network
//! filesystem's I/O error) can still shrink a file under either.
//!
//! A [`Guard`] registers a mapped region. A `SIGBUS` whose `si_code` is
//! `BUS_ADRERR` (the kernel's "no page behind this address", which is what
//! touching a mapping past the end of its file gives) at an address inside a
//! registered region maps an anonymous zero page over the faulting page — read
//! only for a reader's region, writable for a writer's — so the faulting
//! access completes (a load reads zeros, a store lands in a page no file
//! holds), and marks the guard as faulted; its owner discards what it read,
//! or (the writer) repairs its file. There is no `longjmp`: the access simply
//! completes. Any other `SIGBUS` — another code (`BUS_ADRALN`, a hardware
//! memory error's `BUS_MCEERR_*`), an address outside every registered region,
//! or one sent by `kill` — goes to the action that was there before (Rust's
//! runtime installs one to report stack overflows), or, if there was none,
//! kills the process as it always would. The handler saves `errno` on entry
//! and restores it on the way out, so the interrupted code never sees it
//! change.
//!
//! A guard is a value with a `Drop` that releases its registration: a read
//! that panics ([`read_guarded`]) or a writer that is dropped unregisters its
//! region during unwinding, so a later `SIGBUS` at an address the region once
//! covered (by then perhaps another mapping's, or nothing) is never mistaken
//! for a guarded one and zero-filled.
//!
//! Registrations live in a list of slots that only grows (one slot per region
//! registered at once: a reading thread's region, each writer's mapping) and
//! whose slots are reused; slots are never freed, so the handler can walk the
//! list at any moment without a lock.

use std::sync::atomic::{compiler_fence, AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Most regions registered at once (a bound on the slots ever allocated).
const MAX_SLOTS: usize = 1 << 16;

struct Slot {
    busy: AtomicBool,
    start: AtomicUsize,
    end: AtomicUsize,
    writable: AtomicBool,
    faulted: AtomicBool,
    /// The next slot of the list (set once, before the slot is published).
    next: AtomicPtr<Slot>,
}

/// The first slot of the list; slots are leaked, never freed.
static HEAD: AtomicPtr<Slot> = AtomicPtr::new(std::ptr::null_mut());
static SLOTS: AtomicUsize = AtomicUsize::new(0);
static PAGE_SIZE: AtomicUsize = AtomicUsize::new(4096);

/// The `SIGBUS` action before ours; `None` if ours could not be installed.
static PREVIOUS: OnceLock<Option<libc::sigaction>> = OnceLock::new();

/// Why a guarded access gave no result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unguarded {
    /// A page of the region was gone (the file shrank): what was read is
    /// garbage, what was written went nowhere.
    Faulted,
    /// No guard was available (the handler could not be installed, or
    /// [`MAX_SLOTS`] regions are registered): nothing was accessed; use the
    /// file another way.
    Unavailable,
}

/// How a guarded region is accessed, and so what a faulting page is replaced with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A zero page, read only.
    Read,
    /// A zero page that takes stores (which then reach no file).
    Write,
}

/// A registered region (see the module doc); dropping it unregisters the region.
pub struct Guard {
    slot: &'static Slot,
}

impl Guard {
    /// Registers `len` bytes from `start`, part of a file mapping that
    /// outlives the guard (the owner drops the guard before it unmaps).
    pub fn register(start: *const u8, len: usize, access: Access) -> Result<Guard, Unguarded> {
        if PREVIOUS.get_or_init(install).is_none() {
            return Err(Unguarded::Unavailable);
        }
        let slot = take_slot().ok_or(Unguarded::Unavailable)?;
        let start = start as usize;
        // Relaxed, then a compiler fence: a fault in the region is raised on
        // the thread touching it, and a thread the guard's owner hands the
        // region to gets these stores with the hand-over (a lock, a spawn).
        // Sequentially consistent stores would cost a locked instruction
        // each, and a folded store's scrape registers a region per file.
        slot.faulted.store(false, Ordering::Relaxed);
        slot.writable
            .store(access == Access::Write, Ordering::Relaxed);
        slot.start.store(start, Ordering::Relaxed);
        slot.end.store(start.saturating_add(len), Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        Ok(Guard { slot })
    }

    /// Whether a page of the region faulted since it was registered or the
    /// last [`Guard::clear_fault`]. The compiler fence keeps the accesses
    /// written before the call before the check (the handler runs on this
    /// thread, inside the faulting access).
    #[inline]
    pub fn faulted(&self) -> bool {
        compiler_fence(Ordering::SeqCst);
        self.slot.faulted.load(Ordering::Relaxed)
    }

    pub fn clear_fault(&self) {
        self.slot.faulted.store(false, Ordering::SeqCst);
    }

    /// Moves the guard to `len` bytes from `start` (as [`Guard::register`]
    /// would take them), its fault cleared. The region is emptied before it
    /// moves, as dropping the guard would, so no moment covers a span that
    /// is neither region.
    fn cover(&mut self, start: *const u8, len: usize) {
        compiler_fence(Ordering::SeqCst);
        self.slot.end.store(0, Ordering::Relaxed);
        self.slot.start.store(0, Ordering::Relaxed);
        self.slot.faulted.store(false, Ordering::Relaxed);
        let start = start as usize;
        self.slot.start.store(start, Ordering::Relaxed);
        self.slot
            .end
            .store(start.saturating_add(len), Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
    }
}

/// [`read_guarded`] for a reader of many regions in turn (a scrape's
/// files): one slot, moved from region to region, rather than one taken and
/// released per region (the slot's compare-and-swap and stores were a third
/// of a warm scrape of one small file per metric). Every region read must
/// stay mapped until the next read or the drop.
#[derive(Default)]
pub struct GuardedReads {
    guard: Option<Guard>,
}

impl GuardedReads {
    /// [`read_guarded`] of `region`.
    #[inline]
    pub fn read<T>(
        &mut self,
        region: &[u8],
        read: impl FnOnce(&[u8]) -> T,
    ) -> Result<T, Unguarded> {
        let guard = match &mut self.guard {
            Some(guard) => {
                guard.cover(region.as_ptr(), region.len());
                guard
            }
            None => self.guard.insert(Guard::register(
                region.as_ptr(),
                region.len(),
                Access::Read,
            )?),
        };
        read_under(guard, region, read)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        compiler_fence(Ordering::SeqCst);
        self.slot.end.store(0, Ordering::Relaxed);
        self.slot.start.store(0, Ordering::Relaxed);
        // Release: the thread that takes the slot next sees it cleared.
        self.slot.busy.store(false, Ordering::Release);
    }
}

/// A free slot, marked busy: a reused one, or a new one pushed on the list.
fn take_slot() -> Option<&'static Slot> {
    let mut at = HEAD.load(Ordering::Acquire);
    // SAFETY: every pointer in the list is a leaked, never freed `Slot`.
    while let Some(slot) = unsafe { at.as_ref() } {
        if slot
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return Some(slot);
        }
        at = slot.next.load(Ordering::Acquire);
    }
    if SLOTS.fetch_add(1, Ordering::Relaxed) >= MAX_SLOTS {
        SLOTS.fetch_sub(1, Ordering::Relaxed);
        return None;
    }
    let slot: &'static Slot = Box::leak(Box::new(Slot {
        busy: AtomicBool::new(true),
        start: AtomicUsize::new(0),
        end: AtomicUsize::new(0),
        writable: AtomicBool::new(false),
        faulted: AtomicBool::new(false),
        next: AtomicPtr::new(std::ptr::null_mut()),
    }));
    let ptr = slot as *const Slot as *mut Slot;
    let mut head = HEAD.load(Ordering::Acquire);
    loop {
        slot.next.store(head, Ordering::Release);
        match HEAD.compare_exchange(head, ptr, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return Some(slot),
            Err(now) => head = now,
        }
    }
}

/// Runs `read` on `region` (part of a file mapping) with `SIGBUS` inside the
/// region caught: `Err(Faulted)` if a page was missing, in which case the
/// result of `read` is dropped. The region is unregistered when `read`
/// returns or panics.
pub fn read_guarded<T>(region: &[u8], read: impl FnOnce(&[u8]) -> T) -> Result<T, Unguarded> {
    let guard = Guard::register(region.as_ptr(), region.len(), Access::Read)?;
    read_under(&guard, region, read)
}

/// `read` of `region`, which `guard` covers: `Err(Faulted)` if a page of it
/// was missing.
#[inline]
fn read_under<T>(
    guard: &Guard,
    region: &[u8],
    read: impl FnOnce(&[u8]) -> T,
) -> Result<T, Unguarded> {
    compiler_fence(Ordering::SeqCst);
    let out = read(region);
    if guard.faulted() {
        Err(Unguarded::Faulted)
    } else {
        Ok(out)
    }
}

fn install() -> Option<libc::sigaction> {
    // SAFETY: sysconf has no preconditions; sigaction is given a zeroed,
    // then filled, struct and a handler that only touches atomics, mmap and errno.
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
    // SAFETY: errno is this thread's; read on entry, put back on the way out.
    let errno = unsafe { *libc::__errno_location() };
    if !zero_fill(info) {
        pass_on(sig, info, context);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Maps a zero page over the faulting page if the fault is a missing page
/// (`BUS_ADRERR`) of a registered region; whether it did.
fn zero_fill(info: *mut libc::siginfo_t) -> bool {
    // SAFETY: the kernel hands a valid siginfo to an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code != libc::BUS_ADRERR {
        return false;
    }
    let mut at = HEAD.load(Ordering::Acquire);
    // SAFETY: every pointer in the list is a leaked, never freed `Slot`.
    while let Some(slot) = unsafe { at.as_ref() } {
        let (start, end) = (
            slot.start.load(Ordering::SeqCst),
            slot.end.load(Ordering::SeqCst),
        );
        if start <= addr && addr < end {
            let page_size = PAGE_SIZE.load(Ordering::SeqCst);
            let page = addr & !(page_size - 1);
            let protection = if slot.writable.load(Ordering::SeqCst) {
                libc::PROT_READ | libc::PROT_WRITE
            } else {
                libc::PROT_READ
            };
            // SAFETY: replaces one page of a mapping its owner registered; the
            // owner unmaps the whole range later, this page with it.
            let mapped = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    page_size,
                    protection,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if mapped != libc::MAP_FAILED {
                slot.faulted.store(true, Ordering::SeqCst);
                return true;
            }
            return false;
        }
        at = slot.next.load(Ordering::Acquire);
    }
    false
}

/// Whatever would have happened without us.
fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    let Some(Some(previous)) = PREVIOUS.get() else {
        return;
    };
    let handler = previous.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        // SAFETY: restores the previous action. A fault runs its access again
        // and gets it (the default: the process dies, as without us); a
        // signal sent by a process (`si_code` <= 0) is raised again, to be
        // delivered with that action once this handler returns.
        unsafe {
            libc::sigaction(libc::SIGBUS, previous, std::ptr::null_mut());
            if (*info).si_code <= 0 {
                libc::raise(libc::SIGBUS);
            }
        }
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

    fn sum(m: &[u8]) -> u64 {
        m.iter().map(|&b| b as u64).sum()
    }

    /// A mapping whose file is truncated under it reads as `Faulted`, and the
    /// process lives.
    #[test]
    fn shrunk_file_is_a_fault_not_a_crash() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![7u8; 64 * 1024]).unwrap();
        // SAFETY: the test's own file; the point is that it shrinks.
        let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
        assert_eq!(read_guarded(&map, sum), Ok(7 * 64 * 1024));
        file.set_len(100).unwrap();
        assert_eq!(read_guarded(&map, sum), Err(Unguarded::Faulted));
        // Within the first page the file still has its bytes.
        assert_eq!(read_guarded(&map[..100], |m| m[99]), Ok(7));
    }

    /// A read that panics releases its slot: the region is no longer guarded.
    #[test]
    fn a_panicking_read_releases_its_region() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![1u8; 16 * 1024]).unwrap();
        // SAFETY: the test's own file.
        let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            read_guarded(&map, |_| panic!("a read that panics"))
        }));
        assert!(caught.is_err());
        let range = map.as_ptr() as usize..map.as_ptr() as usize + map.len();
        assert!(
            !registered(&range),
            "the panicking read left its region registered"
        );
        // And the next read is guarded again, and unregistered after.
        assert_eq!(read_guarded(&map, sum), Ok(16 * 1024));
        assert!(!registered(&range));
    }

    /// One slot read in turn over several mappings: a fault in one is that
    /// read's alone (the next reads clean), and a region left behind is no
    /// longer covered.
    #[test]
    fn guarded_reads_move_one_slot_from_region_to_region() {
        let maps: Vec<(std::fs::File, memmap2::Mmap)> = (0..3)
            .map(|_| {
                let mut file = tempfile::tempfile().unwrap();
                file.write_all(&vec![2u8; 16 * 1024]).unwrap();
                // SAFETY: the test's own files; one of them shrinks.
                let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
                (file, map)
            })
            .collect();
        let range = |map: &memmap2::Mmap| map.as_ptr() as usize..map.as_ptr() as usize + map.len();
        maps[1].0.set_len(100).unwrap();
        let mut reads = GuardedReads::default();
        assert_eq!(reads.read(&maps[0].1, sum), Ok(2 * 16 * 1024));
        assert!(registered(&range(&maps[0].1)));
        assert_eq!(reads.read(&maps[1].1, sum), Err(Unguarded::Faulted));
        assert!(
            !registered(&range(&maps[0].1)),
            "the first region left behind"
        );
        assert_eq!(reads.read(&maps[2].1, sum), Ok(2 * 16 * 1024));
        drop(reads);
        assert!(maps.iter().all(|(_, map)| !registered(&range(map))));
    }

    /// Whether any registered region overlaps `range`.
    fn registered(range: &std::ops::Range<usize>) -> bool {
        let mut at = HEAD.load(Ordering::Acquire);
        while let Some(slot) = unsafe { at.as_ref() } {
            let (start, end) = (
                slot.start.load(Ordering::SeqCst),
                slot.end.load(Ordering::SeqCst),
            );
            if start < range.end && range.start < end {
                return true;
            }
            at = slot.next.load(Ordering::Acquire);
        }
        false
    }

    /// A writer's region: a store to a page past the end lands in a zero page
    /// that takes it, the guard says so, and the file is untouched.
    #[test]
    fn a_store_past_the_end_is_caught_and_reaches_no_file() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(64 * 1024).unwrap();
        // SAFETY: the test's own file; the point is that it shrinks.
        let mut map = unsafe { memmap2::MmapMut::map_mut(&file).unwrap() };
        let guard = Guard::register(map.as_ptr(), map.len(), Access::Write).unwrap();
        map[40_000] = 9;
        assert!(!guard.faulted());
        file.set_len(4096).unwrap();
        map[40_000] = 9;
        assert!(guard.faulted());
        assert_eq!(map[40_000], 9, "the store landed in the zero page");
        guard.clear_fault();
        map[100] = 3;
        assert!(!guard.faulted());
        drop(guard);
        let bytes = std::fs::read(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&file)
        ))
        .unwrap();
        assert_eq!((bytes.len(), bytes[100]), (4096, 3));
    }

    /// `errno` is the interrupted code's after a caught fault.
    #[test]
    fn errno_is_the_interrupted_codes_after_a_fault() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(64 * 1024).unwrap();
        // SAFETY: the test's own file.
        let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
        file.set_len(0).unwrap();
        let seen = std::cell::Cell::new(0);
        let read = read_guarded(&map, |m| {
            // SAFETY: this thread's errno.
            unsafe { *libc::__errno_location() = libc::EINTR };
            std::hint::black_box(m[8192]);
            seen.set(unsafe { *libc::__errno_location() });
        });
        assert_eq!(read, Err(Unguarded::Faulted));
        assert_eq!(seen.get(), libc::EINTR);
    }

    /// The fault part of a `siginfo_t` (Linux: three ints, then the address).
    #[repr(C)]
    struct Fault {
        signo: libc::c_int,
        errno: libc::c_int,
        code: libc::c_int,
        addr: *mut libc::c_void,
    }

    fn info(code: libc::c_int, addr: usize) -> libc::siginfo_t {
        // SAFETY: a zeroed siginfo, its fault fields written where the kernel puts them.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let fault = &mut info as *mut libc::siginfo_t as *mut Fault;
            (*fault).signo = libc::SIGBUS;
            (*fault).code = code;
            (*fault).addr = addr as *mut libc::c_void;
            info
        }
    }

    /// Only a missing page (`BUS_ADRERR`) inside a registered region is
    /// zero-filled: not another code there, not the same code elsewhere.
    #[test]
    fn only_a_missing_page_of_a_registered_region_is_zero_filled() {
        // Anonymous mappings of our own: one registered, whose pages may be
        // replaced, and one no test registers (tests run side by side).
        let map = memmap2::MmapMut::map_anon(4 * 4096).unwrap();
        let elsewhere = memmap2::MmapMut::map_anon(4096).unwrap();
        let at = map.as_ptr() as usize + 4096;
        let guard = Guard::register(map.as_ptr(), map.len(), Access::Read).unwrap();
        assert!(!zero_fill(&mut info(libc::BUS_ADRALN, at)));
        assert!(!zero_fill(&mut info(libc::BUS_OBJERR, at)));
        assert!(!zero_fill(&mut info(0 /* SI_USER: kill */, at)));
        assert!(!zero_fill(&mut info(
            libc::BUS_ADRERR,
            elsewhere.as_ptr() as usize
        )));
        assert!(!guard.faulted());
        assert!(zero_fill(&mut info(libc::BUS_ADRERR, at)));
        assert!(guard.faulted());
        drop(guard);
        assert!(!zero_fill(&mut info(libc::BUS_ADRERR, at)), "unregistered");
    }

    /// A fault outside every registered region still kills, by `SIGBUS`.
    #[test]
    fn an_unguarded_fault_still_kills_the_process() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(64 * 1024).unwrap();
        // SAFETY: the test's own file.
        let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
        // Our handler is installed, and guards another region meanwhile.
        let other = memmap2::MmapMut::map_anon(4096).unwrap();
        let _guard = Guard::register(other.as_ptr(), other.len(), Access::Read).unwrap();
        file.set_len(0).unwrap();
        // SAFETY: the child only touches memory and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            std::hint::black_box(map[8192]);
            // SAFETY: leaves without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGBUS,
            "status {status:#x}"
        );
    }
}
