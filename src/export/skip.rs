//! Why a file or an entry was left out of a scrape.

use super::*;

// ---------------------------------------------------------------------------
// The read seam: how one file's entries are read.

/// Why a store file was left out of a scrape (the `reason` of
/// `promlab_store_files_skipped_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FileSkip {
    /// Listed, then gone before it could be opened (deleted during the scrape).
    Vanished,
    /// Not a regular file (a FIFO, a directory, a device), by that name.
    NotRegular,
    /// Its `flock` stayed held through both of its waits ([`LOCK_WAIT`],
    /// then [`LOCK_RETRY_WAIT`] after the metric's other files), or the
    /// scrape's [`LOCK_WAIT_BUDGET`] was spent.
    Locked,
    /// Its bytes are not a store file: a bad `used`, an entry that runs past
    /// it, or a file that shrank while read.
    Corrupt,
    /// Opening or reading it failed (permissions, out of descriptors, I/O).
    Unreadable,
    /// The scrape's time budget ran out before it was read, or while it was
    /// walked.
    Deadline,
}

impl FileSkip {
    pub const ALL: [FileSkip; 6] = [
        FileSkip::Vanished,
        FileSkip::NotRegular,
        FileSkip::Locked,
        FileSkip::Corrupt,
        FileSkip::Unreadable,
        FileSkip::Deadline,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FileSkip::Vanished => "vanished",
            FileSkip::NotRegular => "not_regular",
            FileSkip::Locked => "locked",
            FileSkip::Corrupt => "corrupt",
            FileSkip::Unreadable => "unreadable",
            FileSkip::Deadline => "deadline",
        }
    }
}

/// Why one entry was left out of a scrape (the `reason` of
/// `promlab_store_entries_skipped_total`): its series would make Prometheus
/// reject the whole exposition (a real Prometheus 2.42 drops every series of
/// the target for one such line), or has no label set at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EntrySkip {
    /// The key does not decode (not ASCII, a bad `%`-escape, an empty or
    /// repeated label name), or is padded with more than the eight spaces
    /// client_ruby writes at most.
    BadKey,
    /// A decoded label name outside `[a-zA-Z_][a-zA-Z0-9_]*`.
    InvalidLabelName,
    /// A decoded label name starting with `__` (`__name__` included):
    /// reserved for Prometheus's own use, and never written by client_ruby,
    /// whose label validation refuses them.
    ReservedLabelName,
    /// A decoded label value that is not UTF-8 (`path=%FF%FE`).
    InvalidLabelValue,
    /// An entry of a one-file-per-process file ([`crate::export::per_process`])
    /// whose key has no `___metric_name` label.
    NoMetricName,
    /// An entry of a one-file-per-process file naming a metric the registry
    /// does not have (client_ruby's exporter prints registered metrics only).
    UnregisteredMetric,
}

impl EntrySkip {
    pub const ALL: [EntrySkip; 6] = [
        EntrySkip::BadKey,
        EntrySkip::InvalidLabelName,
        EntrySkip::ReservedLabelName,
        EntrySkip::InvalidLabelValue,
        EntrySkip::NoMetricName,
        EntrySkip::UnregisteredMetric,
    ];

    pub fn name(self) -> &'static str {
        match self {
            EntrySkip::BadKey => "bad_key",
            EntrySkip::InvalidLabelName => "invalid_label_name",
            EntrySkip::ReservedLabelName => "reserved_label_name",
            EntrySkip::InvalidLabelValue => "invalid_label_value",
            EntrySkip::NoMetricName => "no_metric_name",
            EntrySkip::UnregisteredMetric => "unregistered_metric",
        }
    }
}
