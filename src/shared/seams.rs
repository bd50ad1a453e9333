//! Seams: the one place a [`StrategySet`] becomes what every stage runs.
//!
//! A *seam* is a point of a stage where the baseline (what the upstream does
//! today) and a strategy's variant are interchangeable. [`Seams::resolve`] is
//! the only function that reads a [`StrategySet`] to choose them: each stage's
//! constructor takes its part ([`WriteSeams`], [`ExportSeams`],
//! [`RenderSeams`], [`IngestSeams`]) and hands each value down to the code it
//! selects, which never asks which strategies are on. The types here say
//! *which* variant runs; what a variant does lives with its stage (the
//! `match` on it, or the `impl` beside the stage's code).
//!
//! One naming scheme: a stage's seams are `<Stage>Seams`; each field is named
//! after its type (`key_source: KeySource`); the first variant of each type is
//! the baseline, named after what the upstream does, the others after what
//! the strategy does instead.
//!
//! # Write ([`crate::write`])
//!
//! | seam | strategy | baseline | with the strategy |
//! |---|---|---|---|
//! | [`KeySource`] | `key-cache` | `EncodePerCall`: sort and form-encode the label set on every call | `CachePerProcess`: each series' key encoded once per process, the caller's label set hashed once per call (an observe writes two series of it), the key remembering its value offset once looked up |
//! | [`Lookups`] | `increment-once` | `ReadThenWrite`: an increment looks the entry up for the read and again for the write | `Once`: one lookup |
//! | [`PidSource`] | `cached-pid` | `AskOs`: `getpid` on every call | `Cached`: cached, cleared in a forked child |
//! | [`ClockReads`] | `clock-once` | `PerWrite`: `clock_gettime` for every value written | `PerOp`: one reading per locked operation, shared by its writes (an observe's bucket and sum) |
//! | [`ClockSource`] | `coarse-clock` | `Monotonic`: `CLOCK_MONOTONIC` for every metric | `CoarseUnlessCompared`: `CLOCK_MONOTONIC_COARSE` where the aggregation discards timestamps, `CLOCK_MONOTONIC` for `most_recent` |
//! | [`StoreIo`] | `mmap-store` | `Syscalls`: seek + read / write per value | `Mapped`: values through a shared mapping |
//!
//! No combined variant: the seams compose. Where two interact, it is through
//! data, not a branch: a lookup by a `CachePerProcess` key that was looked up
//! before reads the offset the key remembers, so with `key-cache` the second
//! lookup `Lookups::ReadThenWrite` makes is a field read and `increment-once`
//! saves little (`strategies/increment-once.md` has the figures); with
//! `clock-once` the one reading an observe takes comes from the clock
//! `coarse-clock` chose. The bytes on disk are the same under every
//! combination.
//!
//! # Export ([`crate::export`])
//!
//! | seam | strategy | baseline | with the strategy |
//! |---|---|---|---|
//! | [`FileRead`] | `single-read` | `EntryByEntry`: two buffered passes of per-entry reads per file (positions, then values, as `FileMappedDict` does) | `Mapped`: the file mapped, its used region walked once |
//! | [`KeyDecode`] | `decode-once` | `EveryEntry`: every entry's key decoded | `OncePerRawKey`: each distinct raw key decoded once, component by component through a cache (raw keys of 4.2.5 and 5.x differ in `~`/`*` but decode to the same label set, so series are still found by their decoded labels) |
//! | [`Unescape`] (carried by `KeyDecode`) | `fast-unescape` | `Reference`: [`crate::format::formenc::decode_key_reference`] | `Fast`: the table-driven, borrowing [`crate::format::formenc::decode_key_fast`] |
//! | [`Keep`] | `prerender` (the render strategy, applied to a long-lived exporter) | `Nothing`: every scrape starts from nothing | `Catalogue`: each metric's decoded, grouped label sets kept across scrapes with their label pairs and line prefixes rendered once, so a scrape of known keys compares raw key bytes, copies a prefix and writes the value per line |
//! | [`Listing`] | `single-read` | `PerMetric`: the directory listed once per metric (client_ruby's glob) | `OncePerScrape`: one listing, each name handed to its metric |
//! | [`Liveness`] | `fold-exited` | `AssumeLive`: every file read under its `flock` | `Leases`: a kept file whose writer has exited ([`crate::export::liveness`]) read in place without its lock; the files of exited processes folded ([`crate::export::fold`]) where the runtime allows (`promlab serve --fold-exited`, `promlab fold`) |
//!
//! Combined variants, and why they exist:
//! - `FileRead::KeptMapped` (`single-read` × `prerender`): files kept open
//!   and mapped between scrapes. Only a long-lived exporter has a next scrape
//!   to keep a mapping for, and only a mapping is worth keeping.
//! - `Listing::Watched` (`single-read` × `prerender`): the file set kept
//!   between scrapes, followed through inotify (a full listing when events
//!   are lost), for the reason above: only a long-lived exporter has one.
//! - `Liveness::Leases` takes effect on kept files (`KeptMapped`): reading a
//!   file once per scrape, its lock costs what proving its writer gone costs.
//! - `KeyDecode::OncePerRawKey(Unescape)` (`decode-once` × `fast-unescape`):
//!   not a branch of its own: the unescape seam is a value the decode seam
//!   carries, and the component cache decodes each component with it.
//!
//! # Render ([`crate::render`])
//!
//! | seam | strategy | baseline | with the strategy |
//! |---|---|---|---|
//! | [`LinePrefixes`] | `prerender` | `PerScrape`: each line of a live registry built from its label pairs in a fresh buffer, escaped byte by byte | `Prerendered`: each series' `name{labels} ` encoded once at creation, copied on every scrape |
//!
//! The store exposition's counterpart is the export stage's [`Keep`]: with
//! it, each group's label pairs and line prefixes are rendered once
//! ([`crate::render::rendered_lines`]).
//! No combined variant.
//!
//! # Ingest ([`crate::ingest`])
//!
//! | seam | strategy | baseline (the upstream per-sample shape) | with the strategy | where |
//! |---|---|---|---|---|
//! | [`WireDecode`] | `borrowed-decode` | `Owned`: prost into owned structs | `Borrowed`: walk the buffer, labels as slices | `ingest/wire/` |
//! | [`Canonicalize`] | `series-cache` | `PerRequest`: per series per request, validate, `HashMap<String,String>`, sort, `format!` series key, fingerprint, JSON population key | `Cached`: all of it once per series, keyed by its raw label bytes | `ingest/pipeline/canonical.rs` |
//! | [`Route`] | `batch-routing` | `PerSample`: per sample and aggregation, re-parse the series key, group key `String`, push into a `HashMap` of vectors | `Batched`: destinations once per series, a counting sort into one contiguous batch per destination | `ingest/pipeline/route.rs` |
//! | [`SketchUpdate`] | `bulk-sketch` | `PerSample`: per sample, find the pane, `DDSketch::add` | `Runs`: one pane lookup and one `BulkSketch::add_slice` per run of samples in one window | `ingest/window/`, `ingest/sketch.rs`, `ingest/bulk_sketch.rs` |
//!
//! Combined variants, and why they exist:
//! - `WireDecode::BorrowedDeferred` (`borrowed-decode` × `series-cache`): the
//!   cache keys on a series' raw label bytes, so the walker only steps over
//!   the label fields and they are parsed on a cache miss alone. The owned
//!   decoder has no raw bytes to key on (the cache re-encodes the labels
//!   instead), so there is no owned-deferred variant.
//! - None for the others. The two routers read the canonicalize seam's output
//!   through one interface (per-series views of the resolved request), so
//!   `series-cache` × `batch-routing` is not a path of its own: with the cache
//!   a series' destination ids are a slice of the cache, without it they are
//!   re-derived once per series per request.

use crate::shared::strategy::{Strategy, StrategySet};

/// Every stage's seams, resolved from one [`StrategySet`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seams {
    pub write: WriteSeams,
    pub export: ExportSeams,
    pub render: RenderSeams,
    pub ingest: IngestSeams,
}

impl Seams {
    /// The seams `strategies` select, for every stage. The only function
    /// that asks which strategies are on.
    pub fn resolve(strategies: StrategySet) -> Seams {
        let on = |s| strategies.contains(s);
        let keep = if on(Strategy::Prerender) {
            Keep::Catalogue
        } else {
            Keep::Nothing
        };
        let unescape = if on(Strategy::FastUnescape) {
            Unescape::Fast
        } else {
            Unescape::Reference
        };
        Seams {
            write: WriteSeams {
                key_source: if on(Strategy::KeyCache) {
                    KeySource::CachePerProcess
                } else {
                    KeySource::EncodePerCall
                },
                lookups: if on(Strategy::IncrementOnce) {
                    Lookups::Once
                } else {
                    Lookups::ReadThenWrite
                },
                pid_source: if on(Strategy::CachedPid) {
                    PidSource::Cached
                } else {
                    PidSource::AskOs
                },
                clock_reads: if on(Strategy::ClockOnce) {
                    ClockReads::PerOp
                } else {
                    ClockReads::PerWrite
                },
                clock_source: if on(Strategy::CoarseClock) {
                    ClockSource::CoarseUnlessCompared
                } else {
                    ClockSource::Monotonic
                },
                store_io: if on(Strategy::MmapStore) {
                    StoreIo::Mapped
                } else {
                    StoreIo::Syscalls
                },
            },
            export: ExportSeams {
                file_read: match (on(Strategy::SingleRead), keep) {
                    (false, _) => FileRead::EntryByEntry,
                    (true, Keep::Nothing) => FileRead::Mapped,
                    (true, Keep::Catalogue) => FileRead::KeptMapped,
                },
                listing: match (on(Strategy::SingleRead), keep) {
                    (false, _) => Listing::PerMetric,
                    (true, Keep::Nothing) => Listing::OncePerScrape,
                    (true, Keep::Catalogue) => Listing::Watched,
                },
                liveness: if on(Strategy::FoldExited) {
                    Liveness::Leases
                } else {
                    Liveness::AssumeLive
                },
                key_decode: if on(Strategy::DecodeOnce) {
                    KeyDecode::OncePerRawKey(unescape)
                } else {
                    KeyDecode::EveryEntry(unescape)
                },
                keep,
            },
            render: RenderSeams {
                line_prefixes: if on(Strategy::Prerender) {
                    LinePrefixes::Prerendered
                } else {
                    LinePrefixes::PerScrape
                },
            },
            ingest: IngestSeams {
                wire_decode: match (on(Strategy::BorrowedDecode), on(Strategy::SeriesCache)) {
                    (false, _) => WireDecode::Owned,
                    (true, false) => WireDecode::Borrowed,
                    (true, true) => WireDecode::BorrowedDeferred,
                },
                canonicalize: if on(Strategy::SeriesCache) {
                    Canonicalize::Cached
                } else {
                    Canonicalize::PerRequest
                },
                route: if on(Strategy::BatchRouting) {
                    Route::Batched
                } else {
                    Route::PerSample
                },
                sketch_update: if on(Strategy::BulkSketch) {
                    SketchUpdate::Runs
                } else {
                    SketchUpdate::PerSample
                },
            },
        }
    }
}

// ---------------------------------------------------------------------------
// Write.

/// The write stage's seams ([`crate::write::Client`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteSeams {
    pub key_source: KeySource,
    pub lookups: Lookups,
    pub pid_source: PidSource,
    pub clock_reads: ClockReads,
    pub clock_source: ClockSource,
    pub store_io: StoreIo,
}

/// Where a series' store key comes from (`key-cache`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeySource {
    EncodePerCall,
    CachePerProcess,
}

/// How many entry lookups an increment makes (`increment-once`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookups {
    /// client_ruby's `read_value` then `write_value`: a lookup each.
    ReadThenWrite,
    Once,
}

/// Where the pid comes from (`cached-pid`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PidSource {
    AskOs,
    /// Cached; a `pthread_atfork` child handler clears the cache.
    Cached,
}

/// How often the monotonic clock is read for the timestamps written beside
/// values (`clock-once`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockReads {
    /// For every value written, as client_ruby's `write_value` does.
    PerWrite,
    /// Once per locked operation: an observe's bucket and sum get the same
    /// reading, taken under the lock. No reader can tell: the lock hides the
    /// time between the two writes, and only `most_recent` (gauges, one write
    /// per operation) compares timestamps.
    PerOp,
}

/// Which clock the timestamps written beside values come from
/// (`coarse-clock`), resolved per metric by the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockSource {
    /// `CLOCK_MONOTONIC` for every metric, as client_ruby's
    /// `Process.clock_gettime(Process::CLOCK_MONOTONIC)`.
    Monotonic,
    /// `CLOCK_MONOTONIC_COARSE` (the same clock as of the last tick: a vDSO
    /// read without the TSC, 5 ns instead of 31–37 here) for metrics whose
    /// aggregation discards timestamps, `CLOCK_MONOTONIC` for `most_recent`,
    /// the one aggregation that compares them.
    CoarseUnlessCompared,
}

/// How values reach a store file (`mmap-store`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreIo {
    /// Seek + read / seek + write per value, as client_ruby does.
    Syscalls,
    /// A shared writable mapping of the whole file.
    Mapped,
}

// ---------------------------------------------------------------------------
// Export.

/// The export stage's seams ([`crate::export::Exporter`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportSeams {
    pub file_read: FileRead,
    pub key_decode: KeyDecode,
    pub keep: Keep,
    pub listing: Listing,
    pub liveness: Liveness,
}

/// How one store file's entries are read (`single-read`, and `prerender`
/// with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileRead {
    /// Two buffered passes of per-entry reads (`FileMappedDict`).
    EntryByEntry,
    /// `single-read`: map the file, walk its used region once.
    Mapped,
    /// `single-read` × `prerender`: as `Mapped`, through files kept open and
    /// mapped between scrapes. Combined because only a long-lived exporter
    /// (what `prerender` is about) has a next scrape to keep a mapping for.
    KeptMapped,
}

/// How entries' keys become label sets (`decode-once`), each variant
/// carrying the [`Unescape`] its decoder runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyDecode {
    /// Every entry's key decoded whole.
    EveryEntry(Unescape),
    /// `decode-once`: each distinct raw key decoded once, component by
    /// component through a cache of decoded components.
    OncePerRawKey(Unescape),
}

/// Which decoder turns a key, or one component of it, into bytes
/// (`fast-unescape`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unescape {
    /// [`crate::format::formenc::decode_key_reference`]: every byte looked at, every
    /// component owned.
    Reference,
    /// [`crate::format::formenc::decode_key_fast`]: table-driven, borrowing
    /// components without escapes.
    Fast,
}

/// How a metric's files are found (`single-read`, and `prerender` with it;
/// [`crate::export::fileset`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listing {
    /// The directory listed once per metric, as client_ruby's
    /// `Dir.glob("metric_<name>___*")` in `MetricStore#all_values`.
    PerMetric,
    /// `single-read`: the directory listed once per scrape, each name parsed
    /// once and handed to its metric.
    OncePerScrape,
    /// `single-read` × `prerender`: listed once, then kept up to date from
    /// inotify events, with a full listing as the fallback. Combined for the
    /// reason `FileRead::KeptMapped` is: only a long-lived exporter has a
    /// next scrape to keep a file set for.
    Watched,
}

/// Whether the exporter knows which files' writers have exited
/// (`fold-exited`; [`crate::export::liveness`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Every file may have a live writer, so every read takes its `flock`
    /// (client_ruby's protocol).
    AssumeLive,
    /// `fold-exited`: a kept file whose writer has exited (a read lease
    /// says no one has it open for writing) cannot change, so it is read in
    /// place without its lock; files with a live writer keep client_ruby's
    /// protocol; and the files of exited processes can be folded
    /// ([`crate::export::fold`]), where the runtime allows it.
    Leases,
}

/// What a long-lived exporter keeps between scrapes (`prerender`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Every scrape starts from nothing.
    Nothing,
    /// `prerender`: each metric's catalogue is kept across scrapes, with
    /// every group's label pairs and line prefixes rendered once.
    Catalogue,
}

// ---------------------------------------------------------------------------
// Render.

/// The render stage's seams ([`crate::render::live::LiveRegistry`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenderSeams {
    pub line_prefixes: LinePrefixes,
}

/// How each series' `name{labels} ` prefix reaches a scrape (`prerender`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinePrefixes {
    /// Nothing kept; every scrape renders each prefix afresh, escaping byte
    /// by byte (RabbitMQ before "Pre-render prometheus labels").
    PerScrape,
    /// `prerender`: every prefix rendered once at series creation.
    Prerendered,
}

// ---------------------------------------------------------------------------
// Ingest.

/// The ingest stage's seams ([`crate::ingest::pipeline::Ingester`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IngestSeams {
    pub wire_decode: WireDecode,
    pub canonicalize: Canonicalize,
    pub route: Route,
    pub sketch_update: SketchUpdate,
}

/// How a decompressed `WriteRequest` becomes a batch (`borrowed-decode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WireDecode {
    /// prost into owned structs.
    Owned,
    /// `borrowed-decode`: labels as slices of the buffer.
    Borrowed,
    /// `borrowed-decode` × `series-cache`: label fields stepped over,
    /// parsed on a cache miss.
    BorrowedDeferred,
}

/// How a request's series get their canonical form and destinations
/// (`series-cache`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Canonicalize {
    /// Validated and canonicalized per series per request.
    PerRequest,
    /// `series-cache`: once per series, keyed by its raw label bytes.
    Cached,
}

/// How routed samples reach their destinations (`batch-routing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// Per sample and aggregation, string keys into a `HashMap` of vectors.
    PerSample,
    /// `batch-routing`: destinations once per series, a counting sort per request.
    Batched,
}

/// How a destination's samples reach their panes (`bulk-sketch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SketchUpdate {
    /// Per sample, find the pane, `DDSketch::add`.
    PerSample,
    /// `bulk-sketch`: per run of samples in one window, one pane lookup and a slice add.
    Runs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::strategy::Stage;

    /// No strategy is a no-op, and no two combinations of a stage's
    /// strategies run the same code: each resolves to seams of its own.
    /// (What each seam does is tested by its effect, in its stage.)
    #[test]
    fn every_combination_of_a_stage_resolves_to_its_own_seams() {
        for stage in Stage::ALL {
            let all: Vec<Seams> = StrategySet::combinations(stage)
                .into_iter()
                .map(Seams::resolve)
                .collect();
            for (i, a) in all.iter().enumerate() {
                assert!(all[i + 1..].iter().all(|b| a != b), "{stage}: {a:?} twice");
            }
        }
    }

    /// A stage's seams depend on its own strategies only.
    #[test]
    fn other_stages_strategies_change_nothing() {
        for stage in Stage::ALL {
            for set in StrategySet::combinations(stage) {
                let own = |s: Seams| match stage {
                    Stage::Write => format!("{:?}", s.write),
                    Stage::Export => format!("{:?}", s.export),
                    Stage::Render => format!("{:?}", s.render),
                    Stage::Ingest => format!("{:?}", s.ingest),
                };
                let others = StrategySet::all()
                    .iter()
                    .filter(|s| !s.applies_to(stage))
                    .collect::<StrategySet>();
                let with_others = others.iter().fold(set, StrategySet::with);
                assert_eq!(
                    own(Seams::resolve(set)),
                    own(Seams::resolve(with_others)),
                    "{stage}: {set}"
                );
            }
        }
    }

    #[test]
    fn the_baseline_is_the_first_variant_of_every_seam() {
        let none = Seams::resolve(StrategySet::NONE);
        assert_eq!(
            none,
            Seams {
                write: WriteSeams {
                    key_source: KeySource::EncodePerCall,
                    lookups: Lookups::ReadThenWrite,
                    pid_source: PidSource::AskOs,
                    clock_reads: ClockReads::PerWrite,
                    clock_source: ClockSource::Monotonic,
                    store_io: StoreIo::Syscalls,
                },
                export: ExportSeams {
                    file_read: FileRead::EntryByEntry,
                    key_decode: KeyDecode::EveryEntry(Unescape::Reference),
                    keep: Keep::Nothing,
                    listing: Listing::PerMetric,
                    liveness: Liveness::AssumeLive,
                },
                render: RenderSeams {
                    line_prefixes: LinePrefixes::PerScrape,
                },
                ingest: IngestSeams {
                    wire_decode: WireDecode::Owned,
                    canonicalize: Canonicalize::PerRequest,
                    route: Route::PerSample,
                    sketch_update: SketchUpdate::PerSample,
                },
            }
        );
    }
}
