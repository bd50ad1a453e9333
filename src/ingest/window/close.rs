//! Closing a window: its panes as bins ([`WindowBins`]), every lane's
//! converted at once and merged, and what a closed window keeps.

use super::OpenWindow;
use crate::ingest::bins::PaneBins;
use std::sync::{Arc, OnceLock};

/// One window's panes as bins, by group id (ascending), and the samples
/// refused for groups with no pane there: what a closed window keeps, what
/// merging lanes (or receivers) adds up.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WindowBins {
    pub start: i64,
    pub panes: Vec<(u32, PaneBins)>,
    pub dropped: u64,
}

impl WindowBins {
    /// Group `gid`'s pane.
    pub fn pane(&self, gid: u32) -> Option<&PaneBins> {
        // Ids are distinct and ascending, so group `gid` is at most at index
        // `gid`, and there when every lower id has a pane too (a window every
        // group reported to): an answer visits the groups in label order, and
        // a binary search over all the panes for each would miss the cache a
        // dozen times or more per group at a million groups.
        if let Some((g, pane)) = self.panes.get(gid as usize) {
            if *g == gid {
                return Some(pane);
            }
        }
        let below = self.panes.len().min(gid as usize + 1);
        let i = self.panes[..below]
            .binary_search_by_key(&gid, |(g, _)| *g)
            .ok()?;
        Some(&self.panes[i].1)
    }

    /// Bins held.
    pub fn cost(&self) -> usize {
        self.panes.iter().map(|(_, p)| p.cost()).sum()
    }

    /// Adds `other`'s panes (group by group, exactly) and dropped samples.
    pub fn merge(&mut self, other: WindowBins) {
        self.dropped += other.dropped;
        if other.panes.is_empty() {
            return;
        }
        if self.panes.is_empty() {
            self.panes = other.panes;
            return;
        }
        let mut merged = Vec::with_capacity(self.panes.len().max(other.panes.len()));
        let mut theirs = other.panes.into_iter().peekable();
        for (gid, mut pane) in self.panes.drain(..) {
            while let Some((g, p)) = theirs.next_if(|(g, _)| *g < gid) {
                merged.push((g, p));
            }
            if let Some((_, p)) = theirs.next_if(|(g, _)| *g == gid) {
                pane.merge(&p);
            }
            merged.push((gid, pane));
        }
        merged.extend(theirs);
        self.panes = merged;
    }
}

/// A closed window: its panes never change again, so its query answer is
/// encoded once, on the first query, and kept.
pub(super) struct ClosedWindow {
    pub(super) bins: WindowBins,
    pub(super) answer: OnceLock<Arc<[u8]>>,
}

/// The panes lanes' windows must hold between them before closing them
/// takes a thread per lane: a thread costs tens of microseconds, a pane
/// about one.
const PANES_PER_CLOSING_THREAD: usize = 256;

/// Lanes' windows `start` as bins, in order, each converted and dropped on a
/// thread of its own (the first on this one) when they hold enough panes.
/// A close holds every lane, so on one thread the other lanes' senders
/// would wait out every lane's conversion. Where a thread cannot be had, its
/// window is converted here.
pub(super) fn windows_as_bins(start: i64, windows: Vec<OpenWindow>) -> Vec<WindowBins> {
    let panes: usize = windows.iter().map(|w| w.panes.len()).sum();
    if windows.len() < 2 || panes < PANES_PER_CLOSING_THREAD {
        return windows.iter().map(|w| w.to_bins(start)).collect();
    }
    let mut windows = windows.into_iter();
    let first = windows.next().expect("two windows at least");
    std::thread::scope(|scope| {
        // Shared until the thread is had: its copy is then the last, and
        // the window is freed there too.
        let spawned: Vec<_> = windows
            .map(|window| {
                let window = std::sync::Arc::new(window);
                let theirs = std::sync::Arc::clone(&window);
                std::thread::Builder::new()
                    .name("promlab-close".into())
                    .spawn_scoped(scope, move || theirs.to_bins(start))
                    .map_err(|_| window)
            })
            .collect();
        let mut bins = vec![first.to_bins(start)];
        drop(first);
        for thread in spawned {
            bins.push(match thread {
                Ok(thread) => thread
                    .join()
                    .unwrap_or_else(|e| std::panic::resume_unwind(e)),
                Err(window) => window.to_bins(start),
            });
        }
        bins
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A closed window's pane is found by its group id, whichever ids have one.
    #[test]
    fn panes_are_found_by_group_id() {
        for gids in [
            vec![],
            vec![0, 1, 2, 3],
            vec![0, 1, 2, 5, 9, 10],
            vec![3, 4, 7],
        ] {
            let panes: Vec<(u32, PaneBins)> = gids
                .iter()
                .map(|&g| {
                    let pane = PaneBins {
                        zero_count: u64::from(g) + 1,
                        ..PaneBins::default()
                    };
                    (g, pane)
                })
                .collect();
            let bins = WindowBins {
                start: 0,
                panes,
                dropped: 0,
            };
            for gid in 0..12 {
                let expected = bins.panes.iter().find(|(g, _)| *g == gid).map(|(_, p)| p);
                assert_eq!(bins.pane(gid), expected, "{gids:?}, {gid}");
            }
        }
    }
}
