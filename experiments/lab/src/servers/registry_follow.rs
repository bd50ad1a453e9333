//! `promlab serve --store DIR --registry FILE` follows its registry and its
//! store: a registry file that changed (replaced by a rename, or rewritten in
//! place) is read again once it has stayed the same for one check, validated,
//! and taken if it is compatible with the one served; store files of a metric
//! the registry does not name are counted and logged once per metric.
//!
//! Compatible means: every metric both registries name keeps its type, its
//! aggregation across processes and its buckets. Anything else would read
//! the same files as other values (a folded sum read as a max, bucket counts
//! under other bounds), so a scrape could go backwards; such a registry is
//! refused like an invalid one, and the old one stays. Help texts and label
//! names may change; metrics may come and go. A taken registry replaces the
//! exporter as a whole, between two scrapes, with one reading the same files
//! afresh (an export never depends on the exporter's history), and the fold
//! loop folds by it from its next run; a metric the registry dropped is no
//! longer folded, and its files are counted as unregistered.

use promlab::export::Exporter;
use promlab::format::registry::Registry;
use promlab::format::storefile::parse_file_name;
use promlab::format::text::FamilyEncoder;
use promlab::shared::strategy::StrategySet;
use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The registry in force, shared by the exporter's follower and the fold loop.
pub struct CurrentRegistry(Mutex<Arc<Registry>>);

impl CurrentRegistry {
    pub fn new(registry: Registry) -> Arc<CurrentRegistry> {
        Arc::new(CurrentRegistry(Mutex::new(Arc::new(registry))))
    }

    pub fn get(&self) -> Arc<Registry> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, registry: Arc<Registry>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = registry;
    }
}

/// The outcome of reading a changed registry (the `result` of
/// `promlab_registry_reloads_total`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Reload {
    Ok = 0,
    /// It does not parse or does not validate.
    Invalid = 1,
    /// It changes what a served metric is (type, aggregation, buckets).
    Incompatible = 2,
    /// It cannot be read (gone, not a regular file, too large, no permission).
    Unreadable = 3,
}

const RELOAD_RESULTS: [&str; 4] = ["ok", "invalid", "incompatible", "unreadable"];

/// Store files looked at every this many checks (and after every reload).
const SCAN_EVERY: u64 = 10;

/// Distinct unregistered metric names remembered for logging; past it, one
/// line says so and the rest are only counted.
const LOGGED_NAMES_MAX: usize = 10_000;

/// What the follower did, for `/metrics/promlab`.
#[derive(Default)]
pub struct FollowStats {
    reloads: [AtomicU64; RELOAD_RESULTS.len()],
    last_reload_ok: AtomicU64,
    /// f64 bits, Unix time.
    last_success: AtomicU64,
    registered: AtomicU64,
    unregistered_files: AtomicU64,
    unregistered_metrics: AtomicU64,
}

impl FollowStats {
    /// The follower's families, in the text format, onto `out`.
    pub fn render(&self, out: &mut Vec<u8>) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut family = FamilyEncoder::new(
            out,
            b"promlab_registry_reloads_total",
            "counter",
            b"Reads of a changed registry file, by result (invalid, incompatible, unreadable: the registry served before stays).",
        );
        for (name, count) in RELOAD_RESULTS.iter().zip(&self.reloads) {
            family
                .sample(b"")
                .label(b"result", name.as_bytes())
                .value()
                .integer(get(count));
        }
        for (name, help, value) in [
            (
                "promlab_registry_last_reload_successful",
                "Whether the last read of the registry file was taken (1) or refused (0).",
                get(&self.last_reload_ok),
            ),
            (
                "promlab_registry_metrics",
                "Metrics the registry in force names.",
                get(&self.registered),
            ),
            (
                "promlab_store_unregistered_files",
                "Store files, at the last look, of a metric the registry does not name (not served).",
                get(&self.unregistered_files),
            ),
            (
                "promlab_store_unregistered_metrics",
                "Metrics with store files, at the last look, that the registry does not name (not served).",
                get(&self.unregistered_metrics),
            ),
        ] {
            FamilyEncoder::new(out, name.as_bytes(), "gauge", help.as_bytes())
                .sample(b"")
                .value()
                .integer(value);
        }
        FamilyEncoder::new(
            out,
            b"promlab_registry_last_reload_success_timestamp_seconds",
            "gauge",
            b"When the registry in force was read (Unix time).",
        )
        .sample(b"")
        .value()
        .ruby_float(f64::from_bits(get(&self.last_success)));
    }

    fn taken(&self, registry: &Registry) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        self.last_success.store(now.to_bits(), Ordering::Relaxed);
        self.last_reload_ok.store(1, Ordering::Relaxed);
        self.registered
            .store(registry.metrics.len() as u64, Ordering::Relaxed);
    }
}

/// What the follower follows, and how often it looks.
pub struct Follower {
    pub registry_path: PathBuf,
    pub store: PathBuf,
    pub strategies: StrategySet,
    pub every: Duration,
    pub registry: Arc<CurrentRegistry>,
    pub stats: Arc<FollowStats>,
}

/// A registry file's identity and state: a change in any part is a change.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Signature {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

fn signature(path: &std::path::Path) -> Option<Signature> {
    let meta = std::fs::metadata(path).ok()?;
    Some(Signature {
        dev: meta.dev(),
        ino: meta.ino(),
        len: meta.len(),
        mtime_ns: meta.mtime() as i128 * 1_000_000_000 + meta.mtime_nsec() as i128,
        ctime_ns: meta.ctime() as i128 * 1_000_000_000 + meta.ctime_nsec() as i128,
    })
}

/// Why `new` may not replace `old`, if it may not.
pub fn incompatibility(old: &Registry, new: &Registry) -> Option<String> {
    for def in &new.metrics {
        let Some(was) = old.get(&def.name) else {
            continue;
        };
        let what = if was.kind != def.kind {
            format!("its type from {} to {}", was.kind.name(), def.kind.name())
        } else if was.aggregation() != def.aggregation() {
            format!(
                "its aggregation from {:?} to {:?}",
                was.aggregation(),
                def.aggregation()
            )
        } else if was.buckets != def.buckets {
            format!("its buckets from {:?} to {:?}", was.buckets, def.buckets)
        } else {
            continue;
        };
        return Some(format!(
            "it changes metric {}: {what} (restart the sidecar to take it)",
            def.name
        ));
    }
    None
}

/// Installs a new exporter in place of the one serving (between two scrapes).
pub type Swap = Box<dyn Fn(Exporter) + Send>;

/// Starts the follower's thread, which hands `swap` a new exporter when it
/// takes a new registry.
pub fn start(follower: Follower, swap: Swap) -> std::io::Result<()> {
    follower.stats.taken(&follower.registry.get());
    std::thread::Builder::new()
        .name("registry".into())
        .spawn(move || follower.run(&*swap))
        .map(|_| ())
}

impl Follower {
    fn run(self, swap: &dyn Fn(Exporter)) {
        // Unknown at first: the file is read once at the start, so a change
        // between the command line's load and this thread is not missed.
        let mut loaded: Option<Option<Signature>> = None;
        // A change seen at the last check, read once it stays as it is.
        let mut pending: Option<Option<Signature>> = None;
        let mut logged: HashSet<Vec<u8>> = HashSet::new();
        let mut round = 0u64;
        loop {
            let mut rescan = round.is_multiple_of(SCAN_EVERY);
            let now = signature(&self.registry_path);
            if loaded == Some(now) {
                pending = None;
            } else if pending == Some(now) {
                pending = None;
                loaded = Some(now);
                rescan |= self.reload(swap) == Reload::Ok;
            } else {
                pending = Some(now);
            }
            if rescan {
                self.scan(&mut logged);
            }
            round += 1;
            std::thread::sleep(self.every);
        }
    }

    fn reload(&self, swap: &dyn Fn(Exporter)) -> Reload {
        let path = self.registry_path.display();
        let result = self.try_reload(swap);
        let outcome = match &result {
            Ok(None) => return Reload::Ok, // the registry in force again: nothing to count
            Ok(Some(summary)) => {
                eprintln!("promlab: registry {path} reloaded: {summary}");
                Reload::Ok
            }
            Err((outcome, why)) => {
                eprintln!(
                    "promlab: registry {path} not taken, still serving the one before: {why}"
                );
                self.stats.last_reload_ok.store(0, Ordering::Relaxed);
                *outcome
            }
        };
        self.stats.reloads[outcome as usize].fetch_add(1, Ordering::Relaxed);
        outcome
    }

    /// The new registry taken (`Some(what changed)`; `None` when it is the
    /// one in force), or why not.
    fn try_reload(&self, swap: &dyn Fn(Exporter)) -> Result<Option<String>, (Reload, String)> {
        let text = promlab::shared::config_file::read(
            &self.registry_path,
            "registry",
            promlab::shared::config_file::MAX_BYTES,
        )
        .map_err(|e| (Reload::Unreadable, format!("{e:#}")))?;
        let new = Registry::from_json(&text).map_err(|e| (Reload::Invalid, format!("{e:#}")))?;
        let old = self.registry.get();
        if new == *old {
            self.stats.last_reload_ok.store(1, Ordering::Relaxed);
            return Ok(None);
        }
        if let Some(why) = incompatibility(&old, &new) {
            return Err((Reload::Incompatible, why));
        }
        let names = |r: &Registry, other: &Registry| {
            r.metrics
                .iter()
                .filter(|m| other.get(&m.name).is_none())
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let summary = format!(
            "{} metrics (added: [{}]; removed: [{}])",
            new.metrics.len(),
            names(&new, &old),
            names(&old, &new)
        );
        swap(Exporter::new(&self.store, new.clone(), self.strategies));
        self.stats.taken(&new);
        self.registry.set(Arc::new(new));
        Ok(Some(summary))
    }

    /// Counts the store files of metrics the registry does not name, and
    /// logs each such metric once (again if it returns after being registered).
    fn scan(&self, logged: &mut HashSet<Vec<u8>>) {
        let Ok(entries) = std::fs::read_dir(&self.store) else {
            return; // the scrape and /-/ready say so
        };
        let registry = self.registry.get();
        let mut files = 0u64;
        let mut metrics: HashSet<Vec<u8>> = HashSet::new();
        for entry in entries.filter_map(|e| e.ok()) {
            let name = entry.file_name();
            let Some((metric, _)) = parse_file_name(name.as_encoded_bytes()) else {
                continue;
            };
            let known = std::str::from_utf8(metric).is_ok_and(|m| registry.get(m).is_some());
            if !known {
                files += 1;
                if metrics.len() < LOGGED_NAMES_MAX * 10 {
                    metrics.insert(metric.to_vec());
                }
            }
        }
        self.stats
            .unregistered_files
            .store(files, Ordering::Relaxed);
        self.stats
            .unregistered_metrics
            .store(metrics.len() as u64, Ordering::Relaxed);
        logged.retain(|m| metrics.contains(m));
        let mut sorted: Vec<&Vec<u8>> = metrics.iter().filter(|m| !logged.contains(*m)).collect();
        sorted.sort();
        for metric in sorted {
            if logged.len() == LOGGED_NAMES_MAX {
                eprintln!(
                    "promlab: more than {LOGGED_NAMES_MAX} metrics in {} are not in the registry; \
                     the rest are only counted (promlab_store_unregistered_metrics)",
                    self.store.display()
                );
                logged.insert(Vec::new());
                break;
            }
            if logged.len() > LOGGED_NAMES_MAX {
                break;
            }
            eprintln!(
                "promlab: store {} has files of metric {} that registry {} does not name: not served",
                self.store.display(),
                String::from_utf8_lossy(metric),
                self.registry_path.display()
            );
            logged.insert(metric.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(json: &str) -> Registry {
        Registry::from_json(json).unwrap()
    }

    #[test]
    fn compatible_changes_and_not() {
        let old = registry(
            r#"{"metrics":[{"name":"c","type":"counter","help":"x"},
                {"name":"h","type":"histogram","buckets":["1","2"]}]}"#,
        );
        let more = registry(
            r#"{"metrics":[{"name":"c","type":"counter","help":"other","labels":["a"]},
                {"name":"g","type":"gauge"}]}"#,
        );
        assert_eq!(incompatibility(&old, &more), None);
        let kind = registry(r#"{"metrics":[{"name":"c","type":"gauge"}]}"#);
        assert!(incompatibility(&old, &kind).unwrap().contains("type"));
        let agg = registry(r#"{"metrics":[{"name":"c","type":"counter","aggregation":"max"}]}"#);
        assert!(incompatibility(&old, &agg).unwrap().contains("aggregation"));
        let buckets = registry(r#"{"metrics":[{"name":"h","type":"histogram","buckets":["1"]}]}"#);
        assert!(incompatibility(&old, &buckets).unwrap().contains("buckets"));
    }
}
