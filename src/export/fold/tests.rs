//! A batch rolled back while a source's name was created again: built
//! step by step, in both layouts, so the shape that the concurrent test
//! (`tests/fold_concurrent.rs`) meets only on some seeds runs every time.

use super::*;
use crate::format::formenc::Dialect;
use crate::shared::strategy::{Stage, StrategySet};
use crate::write::{Client, ClientConfig, Layout};

const REGISTRY: &str = r#"{"metrics": [
    {"name": "jobs_total", "type": "counter", "help": "Jobs", "labels": ["queue"]}
]}"#;

/// Process `pid`'s client (its file open while it lives), having written
/// `jobs` jobs.
fn process(dir: &Path, registry: &Registry, layout: Layout, pid: u32, jobs: u32) -> Client {
    let config = ClientConfig {
        dialect: Dialect::Uri,
        strategies: StrategySet::NONE,
        pid_override: Some(pid),
    };
    let mut client = Client::new_in_layout(dir, registry, config, layout).unwrap();
    let jobs_total = client.metric("jobs_total").unwrap();
    for _ in 0..jobs {
        client
            .increment(jobs_total, &[("queue", "default")], 1.0)
            .unwrap();
    }
    client
}

fn file_name(layout: Layout, pid: u32) -> String {
    match layout {
        Layout::PerMetric => format!("metric_jobs_total___{pid}.bin"),
        Layout::PerProcess => format!("metrics___{pid}.bin"),
    }
}

/// The count every exporter reads (they must agree), with and without leases.
fn jobs(dir: &Path, registry: &Registry) -> f64 {
    let sets = [
        StrategySet::NONE,
        StrategySet::all().restrict(Stage::Export),
    ];
    let counts: Vec<f64> = sets
        .iter()
        .map(|&set| {
            let out = crate::export::export(dir, registry, set).unwrap();
            let text = String::from_utf8(out).unwrap();
            let line = text.lines().find(|l| l.starts_with("jobs_total{"));
            line.map_or(0.0, |l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
        })
        .collect();
    assert_eq!(counts[0], counts[1], "exporters disagree");
    counts[0]
}

/// What `.fold/` holds besides its locks and `trash/`.
fn fold_leftovers(dir: &Path) -> Vec<String> {
    let mut left: Vec<String> = std::fs::read_dir(dir.join(FOLD_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| ![LOCK_FILE, RUN_LOCK_FILE, TRASH_DIR].contains(&n.as_str()))
        .collect();
    left.extend(
        std::fs::read_dir(dir.join(FOLD_DIR).join(TRASH_DIR))
            .unwrap()
            .map(|e| format!("trash/{}", e.unwrap().file_name().into_string().unwrap())),
    );
    left
}

/// Processes 1001 (1 job) and 1002 (2 jobs) have exited; their files are
/// folded into one batch, committed and moved to `trash/`. Returns the
/// batch (its leases held) and the store's group key.
fn committed_batch(dir: &Path, registry: &Registry, layout: Layout) -> (FoldDir, Prepared) {
    drop(process(dir, registry, layout, 1001, 1));
    drop(process(dir, registry, layout, 1002, 2));
    let fold_dir = FoldDir::create(dir, false).unwrap();
    let files: Vec<(Vec<u8>, u64)> = [1001, 1002]
        .iter()
        .map(|&pid| {
            let name = file_name(layout, pid);
            let ino = ino_of(&dir.join(&name)).unwrap();
            (name.into_bytes(), ino)
        })
        .collect();
    let mut ids = match layout {
        Layout::PerMetric => SeriesIds::default(),
        Layout::PerProcess => SeriesIds::per_process(registry),
    };
    let config = FoldConfig {
        durable: false,
        ..FoldConfig::default()
    };
    let snapshot = read_metric(dir, &files, &config, &mut ids).unwrap();
    let before = vec![None; ids.ids.len()];
    let modes = ids.modes(ProcessAggregation::Sum);
    let plan = plan_metric(&snapshot, &modes, config.max_batch, before);
    let run = &plan.runs[0];
    let batch = Batch {
        members: run.files.clone(),
        name: run.name.clone(),
        entries: run_entries(&snapshot, run.files.clone(), &modes),
    };
    let prepared = fold_dir
        .prepare(
            batch_key(group_key(layout), 0),
            &snapshot,
            &batch,
            &mut None,
        )
        .unwrap()
        .expect("prepared");
    fold_dir
        .commit_and_trash(std::slice::from_ref(&prepared), &mut None)
        .unwrap();
    assert!(!dir.join(file_name(layout, 1001)).exists());
    assert_eq!(jobs(dir, registry), 3.0, "the fold file holds both");
    (fold_dir, prepared)
}

/// One more job written into an open store file (its one entry's value
/// incremented in place, as a writer does).
fn add_job(file: &std::fs::File) {
    use std::os::unix::fs::FileExt;
    let bytes = read_used(file).unwrap();
    let entry = storefile::entries(&bytes, bytes.len())
        .next()
        .unwrap()
        .unwrap();
    let value = entry.value() + 1.0;
    file.write_all_at(&value.to_le_bytes(), entry.value_offset as u64)
        .unwrap();
}

/// The journal key of the batches of the store's group in `layout`.
fn group_key(layout: Layout) -> &'static str {
    match layout {
        Layout::PerMetric => "jobs_total",
        Layout::PerProcess => PER_PROCESS_KEY,
    }
}

/// Runs `check` in each layout on a fresh store holding a committed batch
/// ([`committed_batch`]).
fn in_each_layout(check: impl Fn(&Path, &Registry, Layout, FoldDir, Prepared)) {
    for layout in [Layout::PerMetric, Layout::PerProcess] {
        let tmp = tempfile::tempdir().unwrap();
        let registry = Registry::from_json(REGISTRY).unwrap();
        let (fold_dir, batch) = committed_batch(tmp.path(), &registry, layout);
        check(tmp.path(), &registry, layout, fold_dir, batch);
    }
}

/// A writer that looked `name` up before the commit moved it: its `open`
/// (of the file now in `trash/`) breaks the batch's lease and waits until
/// the fold releases it. Returns once the lease shows broken.
fn break_lease(dir: &Path, name: &str, batch: &Prepared) -> std::thread::JoinHandle<std::fs::File> {
    let trashed = dir.join(FOLD_DIR).join(TRASH_DIR).join(name);
    let opener = std::thread::spawn(move || {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(trashed)
            .unwrap()
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while batch.intact() {
        assert!(Instant::now() < deadline, "the lease never broke");
        std::thread::sleep(Duration::from_millis(1));
    }
    opener
}

/// The lease of one source (1001) breaks while the other's name (1002) was
/// created again by a new process: the rollback puts 1001 back at its
/// name, 1002's old file beside the new one, and every job written — before
/// the fold, by the writer that broke the lease, by the new process — is
/// counted once, then and after the next fold.
#[test]
fn a_rollback_puts_back_a_source_whose_name_was_created_again() {
    in_each_layout(|dir, registry, layout, fold_dir, batch| {
        let reused = process(dir, registry, layout, 1002, 5);
        let opener = break_lease(dir, &file_name(layout, 1001), &batch);
        let settled = fold_dir.settle(vec![batch], &mut None).unwrap();
        assert_eq!(settled, vec![(0, false)], "{layout:?}: rolled back");
        let opened = opener.join().unwrap();
        assert_eq!(
            opened.metadata().unwrap().ino(),
            ino_of(&dir.join(file_name(layout, 1001))).unwrap(),
            "{layout:?}: the writer's file is back at its name"
        );
        assert_eq!(fold_leftovers(dir), Vec::<String>::new(), "{layout:?}");
        // The writer that broke the lease writes on (into the file it opened).
        let resumed = process(dir, registry, layout, 1001, 4);
        assert_eq!(jobs(dir, registry), 1.0 + 2.0 + 5.0 + 4.0, "{layout:?}");
        drop((opened, resumed, reused));
        let config = FoldConfig {
            grace: Duration::ZERO,
            durable: false,
            ..FoldConfig::default()
        };
        let report = fold_store(dir, registry, &config).unwrap();
        assert!(report.files_folded >= 2, "{layout:?}: {report:?}");
        assert_eq!(jobs(dir, registry), 12.0, "{layout:?}: after the next fold");
    });
}

/// A fold that died in the middle of a rollback (its marker written, one
/// source back) is rolled back by the next fold's recovery, not forward,
/// even once the writer that broke the lease has exited: what it wrote
/// after the fold read its file stays counted.
#[test]
fn recovery_finishes_a_rollback_a_crash_interrupted() {
    in_each_layout(|dir, registry, layout, fold_dir, batch| {
        let reused = process(dir, registry, layout, 1002, 5);
        let name = file_name(layout, 1001);
        let opener = break_lease(dir, &name, &batch);
        // The rollback began (its marker) and put 1001 back; then the fold
        // died (its leases went with it).
        let key = batch_key(group_key(layout), 0);
        std::fs::write(fold_dir.rollback_path(&key), b"").unwrap();
        std::fs::rename(fold_dir.trash_path(&name), dir.join(&name)).unwrap();
        drop(batch);
        let opened = opener.join().unwrap();
        let resumed = process(dir, registry, layout, 1001, 4);
        drop((opened, resumed, reused));
        assert_eq!(fold_dir.recover().unwrap(), 1, "{layout:?}");
        assert_eq!(jobs(dir, registry), 12.0, "{layout:?}");
        assert_eq!(fold_leftovers(dir), Vec::<String>::new(), "{layout:?}");
    });
}

/// A fold that died in the grace period, while a writer was on its way into
/// a source's `open` (its lease broken): the writer gets the file in
/// `trash/`, writes, and exits before the next fold. Recovery sees the
/// source no longer holds what was folded and rolls the batch back.
#[test]
fn recovery_rolls_back_a_batch_whose_source_was_written_after_a_crash() {
    in_each_layout(|dir, registry, layout, fold_dir, batch| {
        let name = file_name(layout, 1001);
        let opener = break_lease(dir, &name, &batch);
        drop(batch);
        let opened = opener.join().unwrap();
        // It writes one more job into the file it opened, and exits.
        add_job(&opened);
        drop(opened);
        assert_eq!(fold_dir.recover().unwrap(), 1, "{layout:?}");
        assert_eq!(jobs(dir, registry), 4.0, "{layout:?}");
        assert_eq!(fold_leftovers(dir), Vec::<String>::new(), "{layout:?}");
    });
}

/// The names a source goes back under sort just before its own (after the
/// file before it) where one fits, else just after it; all are fold files'.
#[test]
fn aside_names_sort_next_to_the_source_name() {
    for (name, before) in [
        ("metrics___1002.bin", Some("metrics___1001.bin")),
        ("metrics___1002.bin", Some("metrics___10019999999.bin")),
        ("metric_jobs_total___1002.bin", None),
        ("metrics___1000.bin", Some("metrics___0999.bin")),
    ] {
        let asides = aside_names(name, before);
        let first = &asides[0];
        assert!(before.is_none_or(|b| b < first.as_str()) && first.as_str() < name);
        for aside in &asides {
            assert!(file_id(aside.as_bytes()).is_some_and(is_fold_id), "{aside}");
        }
    }
    // No name fits between `metrics___100.bin` and `metrics___1000.bin`.
    let asides = aside_names("metrics___1000.bin", Some("metrics___100.bin"));
    assert_eq!(asides[0], "metrics___10000000.bin");
}
