//! The limits an ingester holds to ([`Capacity`]), what it holds of them
//! ([`Held`]), and the [`Budget`] that counts one against the other for
//! every lane of an ingester (shared with its groups: [`super::groups`]).
//!
//! **The budget** is four counters (groups, group-key bytes, pane slots,
//! bins) taken and given back atomically: a lane takes what it needs before
//! it holds it (the bins a value needs before it is added), so what every
//! lane holds together never passes the limits, whatever the lanes do at
//! once. Pane bins may reach twice their limit — only for panes that already
//! exist (a flood of new groups cannot starve the groups already there).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// How much of each bounded resource an ingester may hold, across its
/// aggregations and, for a [laned](super::lanes) one, across its lanes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Groups (distinct group-by value tuples), over all aggregations.
    pub groups: usize,
    /// Bytes of the groups: each key twice (as key and as labels in the answers) and
    /// [`GROUP_BYTES`](super::groups::GROUP_BYTES) for the group itself.
    pub group_bytes: usize,
    /// Pane slots: per open window and lane, one per group id up to the
    /// highest that has a pane there; per closed window, one per pane.
    pub pane_slots: usize,
    /// Sketch bins (8 bytes each), over every pane, each pane's own structure
    /// counted too ([`PANE_BINS`](super::sketch::PANE_BINS) open,
    /// [`CLOSED_PANE_BINS`](super::bins::CLOSED_PANE_BINS) closed). Past this,
    /// no new pane is made, but panes that exist still take samples, up to
    /// twice this: a flood of new groups cannot starve the groups already
    /// there. A value whose bins would pass the limit that applies is refused.
    pub bins: usize,
}

impl Capacity {
    pub const UNBOUNDED: Capacity = Capacity {
        groups: usize::MAX,
        group_bytes: usize::MAX,
        pane_slots: usize::MAX,
        bins: usize::MAX,
    };
}

/// What an ingester holds of what [`Capacity`] bounds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub groups: usize,
    pub group_bytes: usize,
    pub pane_slots: usize,
    pub bins: usize,
}

impl Held {
    pub fn merge(&mut self, o: &Held) {
        self.groups += o.groups;
        self.group_bytes += o.group_bytes;
        self.pane_slots += o.pane_slots;
        self.bins += o.bins;
    }
}

/// The limits and what is held of them, shared by the lanes (see the module doc).
#[derive(Debug)]
pub struct Budget {
    pub capacity: Capacity,
    groups: AtomicUsize,
    group_bytes: AtomicUsize,
    pane_slots: AtomicUsize,
    bins: AtomicUsize,
    /// Groups reclaimed since start.
    pub(super) reclaimed: AtomicU64,
}

/// Takes `n` from `counter` if that keeps it at most `limit`.
fn try_take(counter: &AtomicUsize, n: usize, limit: usize) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            held.checked_add(n).filter(|&after| after <= limit)
        })
        .is_ok()
}

/// Gives `n` back to `counter`. Nothing to give writes nothing: the lanes
/// share these counters, and a write (even of the same value) takes the cache
/// line from the other cores — every (group, request) add gives back what its
/// pane did not grow, usually 0.
fn give(counter: &AtomicUsize, n: usize) {
    if n == 0 {
        return;
    }
    let _ = counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
        Some(held.saturating_sub(n))
    });
}

impl Budget {
    pub fn new(capacity: Capacity) -> Self {
        Budget {
            capacity,
            groups: AtomicUsize::new(0),
            group_bytes: AtomicUsize::new(0),
            pane_slots: AtomicUsize::new(0),
            bins: AtomicUsize::new(0),
            reclaimed: AtomicU64::new(0),
        }
    }

    /// What is held now, over every lane.
    pub fn held(&self) -> Held {
        Held {
            groups: self.groups.load(Ordering::Acquire),
            group_bytes: self.group_bytes.load(Ordering::Acquire),
            pane_slots: self.pane_slots.load(Ordering::Acquire),
            bins: self.bins.load(Ordering::Acquire),
        }
    }

    /// Groups reclaimed since start.
    pub fn reclaimed(&self) -> u64 {
        self.reclaimed.load(Ordering::Relaxed)
    }

    /// One more group of `bytes` key bytes, if both fit.
    pub(super) fn try_take_group(&self, bytes: usize) -> bool {
        if !try_take(&self.groups, 1, self.capacity.groups) {
            return false;
        }
        if !try_take(&self.group_bytes, bytes, self.capacity.group_bytes) {
            give(&self.groups, 1);
            return false;
        }
        true
    }

    pub(super) fn give_group(&self, bytes: usize) {
        give(&self.groups, 1);
        give(&self.group_bytes, bytes);
    }

    /// `n` more pane slots, if they fit.
    pub fn try_take_slots(&self, n: usize) -> bool {
        try_take(&self.pane_slots, n, self.capacity.pane_slots)
    }

    /// `n` more pane slots, whatever the limit (a closing window's, paid for by the open one).
    pub fn take_slots(&self, n: usize) {
        self.pane_slots.fetch_add(n, Ordering::AcqRel);
    }

    pub fn give_slots(&self, n: usize) {
        give(&self.pane_slots, n);
    }

    /// Pane slots held (every lane).
    pub fn slots(&self) -> usize {
        self.pane_slots.load(Ordering::Acquire)
    }

    /// `n` more bins, if that keeps them at most `limit`.
    pub fn try_take_bins(&self, n: usize, limit: usize) -> bool {
        try_take(&self.bins, n, limit)
    }

    /// `n` more bins, whatever the limit (a closing window's, paid for by the open one).
    pub fn take_bins(&self, n: usize) {
        self.bins.fetch_add(n, Ordering::AcqRel);
    }

    pub fn give_bins(&self, n: usize) {
        give(&self.bins, n);
    }

    /// Bins held (every lane).
    pub fn bins(&self) -> usize {
        self.bins.load(Ordering::Acquire)
    }

    /// Sets the pane slots and bins held to what is recounted (after a plan change).
    pub fn set_panes(&self, held: Held) {
        self.pane_slots.store(held.pane_slots, Ordering::Release);
        self.bins.store(held.bins, Ordering::Release);
    }
}
