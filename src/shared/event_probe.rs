//! Counts of the events strategies exist to change (value lookups, `getpid`s,
//! clock reads by clock, key encodings and decodings, prefix renderings), so a
//! unit test can prove that a strategy has its effect — not merely that it
//! maps to some seam value.
//!
//! Counted only in this crate's own unit tests (`cfg(test)`), per thread, so
//! tests running side by side do not see each other's events; in every other
//! build `probe!` expands to nothing.

#[cfg(test)]
use std::cell::RefCell;
#[cfg(test)]
use std::collections::BTreeMap;

/// Counts one event (in this crate's unit tests; nothing otherwise).
macro_rules! probe {
    ($event:literal) => {
        #[cfg(test)]
        $crate::shared::event_probe::hit($event);
    };
}
pub(crate) use probe;

#[cfg(test)]
thread_local! {
    static COUNTS: RefCell<BTreeMap<&'static str, u64>> = const { RefCell::new(BTreeMap::new()) };
}

#[cfg(test)]
pub(crate) fn hit(event: &'static str) {
    COUNTS.with(|c| *c.borrow_mut().entry(event).or_default() += 1);
}

/// The events `f` caused on this thread.
#[cfg(test)]
pub(crate) fn counted<T>(f: impl FnOnce() -> T) -> (T, Counts) {
    let before = COUNTS.with(|c| c.borrow().clone());
    let out = f();
    let after = COUNTS.with(|c| c.borrow().clone());
    let counts = after
        .into_iter()
        .map(|(event, n)| (event, n - before.get(event).copied().unwrap_or(0)))
        .filter(|&(_, n)| n > 0)
        .collect();
    (out, Counts(counts))
}

/// Events counted by [`counted`].
#[cfg(test)]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Counts(BTreeMap<&'static str, u64>);

#[cfg(test)]
impl Counts {
    pub(crate) fn get(&self, event: &str) -> u64 {
        self.0.get(event).copied().unwrap_or(0)
    }
}

/// This thread's I/O so far, from `/proc/thread-self/io`: read and write
/// syscalls, bytes read and written through them (a mapping's loads and
/// stores are not counted: that is what the mapped seams change).
#[cfg(test)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ThreadIo {
    pub syscr: u64,
    pub syscw: u64,
    pub rchar: u64,
    pub wchar: u64,
}

#[cfg(test)]
impl ThreadIo {
    pub(crate) fn now() -> ThreadIo {
        let text = std::fs::read_to_string("/proc/thread-self/io")
            .expect("/proc/thread-self/io (Linux task I/O accounting) is needed by this test");
        let field = |name: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(": "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("no {name} in /proc/thread-self/io: {text}"))
        };
        ThreadIo {
            syscr: field("syscr"),
            syscw: field("syscw"),
            rchar: field("rchar"),
            wchar: field("wchar"),
        }
    }

    /// The I/O `f` did on this thread. Reading the counters is I/O of its
    /// own: what one reading costs (measured right after) is taken off.
    pub(crate) fn of<T>(f: impl FnOnce() -> T) -> (T, ThreadIo) {
        let before = ThreadIo::now();
        let out = f();
        let after = ThreadIo::now();
        let again = ThreadIo::now();
        let field = |get: fn(&ThreadIo) -> u64| {
            (get(&after) - get(&before)).saturating_sub(get(&again) - get(&after))
        };
        let io = ThreadIo {
            syscr: field(|io| io.syscr),
            syscw: field(|io| io.syscw),
            rchar: field(|io| io.rchar),
            wchar: field(|io| io.wchar),
        };
        (out, io)
    }
}
