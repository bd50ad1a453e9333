//! The one-file-per-process layout (client_ruby's `poc_file_per_process`
//! branch; [`promlab::export::split_metric_name`]) in `promlab verify`:
//! - the stores that branch's own Ruby wrote (`all-types-poc` built in;
//!   `seed-repro-poc` from a checkout's `tests/fixtures`, unless quick),
//!   exported under every export subset (folded first with `fold-exited`),
//!   one-shot and by a long-lived exporter scraped twice, must print the
//!   branch's `expected.prom`, and so must the reference exporter;
//! - each generated input's store (the reference writer's bytes), with its
//!   even processes and then all of them merged into the layout
//!   ([`promlab::scenarios::per_process_layout`]), must export under every
//!   export subset as the reference exporter prints it.
//!
//! The generated stores are exported unfolded under every subset.

use super::*;

/// The branch's `all-types` case, built in: (relative path, bytes).
const ALL_TYPES: [(&str, &[u8]); 7] = [
    (
        "registry.json",
        include_bytes!("../../../../tests/fixtures/ruby-dfs-poc/all-types-poc/registry.json"),
    ),
    (
        "expected.prom",
        include_bytes!("../../../../tests/fixtures/ruby-dfs-poc/all-types-poc/expected.prom"),
    ),
    (
        "store/metrics___15688.bin",
        include_bytes!(
            "../../../../tests/fixtures/ruby-dfs-poc/all-types-poc/store/metrics___15688.bin"
        ),
    ),
    (
        "store/metrics___15702.bin",
        include_bytes!(
            "../../../../tests/fixtures/ruby-dfs-poc/all-types-poc/store/metrics___15702.bin"
        ),
    ),
    (
        "store/metrics___15703.bin",
        include_bytes!(
            "../../../../tests/fixtures/ruby-dfs-poc/all-types-poc/store/metrics___15703.bin"
        ),
    ),
    (
        "store/metrics___15705.bin",
        include_bytes!(
            "../../../../tests/fixtures/ruby-dfs-poc/all-types-poc/store/metrics___15705.bin"
        ),
    ),
    (
        "store/metrics___15708.bin",
        include_bytes!(
            "../../../../tests/fixtures/ruby-dfs-poc/all-types-poc/store/metrics___15708.bin"
        ),
    ),
];

/// What the layout's checks covered.
#[derive(Default)]
pub struct Report {
    /// (case, store files) of the branch's own stores checked.
    pub ruby_cases: Vec<(String, usize)>,
    /// Generated stores checked in a mix of both layouts and in this one alone.
    pub generated: usize,
    /// Exports compared.
    pub exports: usize,
}

/// Runs the checks (see the module's documentation).
pub fn check(
    sets: &[StrategySet],
    cases: &[Case],
    fixtures: Option<&Path>,
    quick: bool,
    tmp: &Path,
) -> Result<Report> {
    let exports = subsets(sets, Stage::Export);
    let mut report = Report::default();
    let built_in = tmp.join("all-types-poc");
    for (path, bytes) in ALL_TYPES {
        let path = built_in.join(path);
        std::fs::create_dir_all(path.parent().expect("a file in the case"))?;
        std::fs::write(&path, bytes)?;
    }
    let mut ruby = vec![built_in];
    if let Some(f) = fixtures.filter(|f| f.join("ruby-dfs-poc").is_dir() && !quick) {
        let archive = std::fs::File::open(f.join("ruby-dfs-poc/seed-repro-poc.tar.gz"))?;
        tar::Archive::new(flate2::read::GzDecoder::new(archive)).unpack(tmp)?;
        ruby.push(tmp.join("seed-repro-poc"));
    }
    for case in &ruby {
        let name = case
            .file_name()
            .expect("named")
            .to_string_lossy()
            .into_owned();
        let registry = Registry::load(&case.join("registry.json"))?;
        let expected = std::fs::read(case.join("expected.prom"))?;
        let store = case.join("store");
        // The store folded (every file's writer exited), for `fold-exited`.
        let folded = tmp.join(format!("{name}-folded"));
        std::fs::create_dir_all(&folded)?;
        for entry in std::fs::read_dir(&store)? {
            let entry = entry?;
            std::fs::copy(entry.path(), folded.join(entry.file_name()))?;
        }
        promlab::export::fold::fold_store(
            &folded,
            &registry,
            &promlab::export::fold::FoldConfig {
                grace: std::time::Duration::ZERO,
                durable: false,
                ..promlab::export::fold::FoldConfig::default()
            },
        )?;
        let stores = Stores {
            plain: &store,
            folded: Some(&folded),
        };
        report.exports += check_store(&name, stores, &registry, &expected, &exports)?;
        report
            .ruby_cases
            .push((name, std::fs::read_dir(&store)?.count()));
    }
    for (n, case) in cases.iter().filter(|c| c.ruby.is_none()).enumerate() {
        let dir = tmp.join(format!("generated-{n}"));
        std::fs::create_dir_all(&dir)?;
        for (name, bytes) in reference::store::files(&case.registry, &case.processes)? {
            std::fs::write(dir.join(name), bytes)?;
        }
        for half in [true, false] {
            for (i, (dialect, log)) in case.processes.iter().enumerate() {
                if !half || i % 2 == 0 {
                    let id = log.pid.to_string();
                    promlab::scenarios::per_process_layout::merge_process(
                        &dir,
                        &case.registry,
                        &id,
                        *dialect,
                    )?;
                }
            }
            let expected = reference::exposition::export(&dir, &case.registry)?;
            let what = format!(
                "{} ({})",
                case.name,
                if half { "both layouts" } else { "per process" }
            );
            let stores = Stores {
                plain: &dir,
                folded: None,
            };
            report.exports += check_store(&what, stores, &case.registry, &expected, &exports)?;
        }
        report.generated += 1;
        std::fs::remove_dir_all(&dir).ok();
    }
    Ok(report)
}

/// A store, and its folded twin for the subsets with `fold-exited`.
#[derive(Clone, Copy)]
struct Stores<'a> {
    plain: &'a Path,
    folded: Option<&'a Path>,
}

/// The store under every export subset (one-shot, and long-lived scraped
/// twice) and the reference exporter must print `expected`; returns the
/// number of exports compared.
fn check_store(
    name: &str,
    stores: Stores<'_>,
    registry: &Registry,
    expected: &[u8],
    exports: &[StrategySet],
) -> Result<usize> {
    let r = reference::exposition::export(stores.plain, registry)?;
    if r != expected {
        bail!(
            "{name}: the reference exporter differs from the expected exposition {}",
            first_difference(&r, expected, "reference", "expected")
        );
    }
    let mut compared = 1;
    let mut out = Vec::new();
    for &e in exports {
        let store = match stores.folded {
            Some(folded) if e.contains(Strategy::FoldExited) => folded,
            _ => stores.plain,
        };
        let one_shot = export::export(store, registry, e)?;
        let mut exporter = Exporter::new(store, registry.clone(), e);
        let mut got = vec![("one-shot export", one_shot)];
        for _ in 0..2 {
            exporter.export_into(&mut out)?;
            got.push(("long-lived exporter", out.clone()));
        }
        for (what, got) in got {
            compared += 1;
            if got != expected {
                bail!(
                    "{name}: {what} with {e} differs from the expected exposition {}",
                    first_difference(&got, expected, "promlab", "expected")
                );
            }
        }
    }
    Ok(compared)
}
