use super::*;
use crate::format::formenc::Dialect;
use crate::shared::event_probe::{counted, Counts, ThreadIo};
use crate::shared::strategy::{Stage, Strategy};
use crate::write::{Client, ClientConfig};

const LABEL_SETS: usize = 200;

/// A store of two processes that wrote the same `LABEL_SETS` label sets
/// of one counter (with the baseline: no mapping of its own), and the
/// bytes their files use.
fn two_processes() -> (tempfile::TempDir, Registry, u64) {
    let registry = Registry::from_json(
        r#"{"metrics": [{"name": "c_total", "type": "counter", "help": "h", "labels": ["l"]}]}"#,
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut used = 0;
    for pid in [1, 2] {
        let config = ClientConfig {
            dialect: Dialect::Uri,
            strategies: StrategySet::NONE,
            pid_override: Some(pid),
        };
        let mut client = Client::new(dir.path(), &registry, config).unwrap();
        let id = client.metric("c_total").unwrap();
        for i in 0..LABEL_SETS {
            let value = format!("set {i} / {}", "x".repeat(100));
            client.increment(id, &[("l", &value)], 1.0).unwrap();
        }
        let path = crate::format::storefile::file_path(dir.path(), "c_total", pid);
        let header = std::fs::read(path).unwrap();
        used += u64::from(u32::from_le_bytes(header[..4].try_into().unwrap()));
    }
    (dir, registry, used)
}

/// One scrape: the events it counted and this thread's I/O.
fn scrape(exporter: &mut Exporter) -> (Counts, ThreadIo) {
    let mut out = Vec::new();
    let ((result, counts), io) = ThreadIo::of(|| counted(|| exporter.export_into(&mut out)));
    result.unwrap();
    assert!(exporter.last_report().is_clean());
    assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 2 + LABEL_SETS);
    (counts, io)
}

/// How many of this process's mappings are of files in `dir`.
fn mappings_of(dir: &Path) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let dir = dir.to_str().unwrap();
    maps.lines().filter(|l| l.contains(dir)).count()
}

/// Each export strategy has its effect, counted, under every combination
/// of the others: how often files are read, which mappings outlive a
/// scrape, how many keys are decoded and by which decoder, and what a
/// second scrape builds again.
#[test]
fn each_export_strategy_has_its_effect() {
    let (dir, registry, used) = two_processes();
    let entries = 2 * LABEL_SETS as u64;
    for s in StrategySet::combinations(Stage::Export) {
        let mut exporter = Exporter::new(dir.path(), registry.clone(), s);
        let (first, first_io) = scrape(&mut exporter);
        let kept_mappings = mappings_of(dir.path());
        let (second, _) = scrape(&mut exporter);

        // single-read: each file's used region read once (mapped, or
        // pread once per scrape), not twice through read(2).
        if s.contains(Strategy::SingleRead) {
            assert!(
                first_io.rchar < 2 * used,
                "{s}: {first_io:?}, {used} bytes used"
            );
        } else {
            assert!(
                first_io.rchar >= 2 * used,
                "{s}: {first_io:?}, {used} bytes used"
            );
        }

        // single-read with prerender: the mappings kept for the next
        // scrape, and the directory watched instead of listed again.
        let kept = s.contains(Strategy::SingleRead) && s.contains(Strategy::Prerender);
        assert_eq!(kept_mappings, if kept { 2 } else { 0 }, "{s}");
        assert_eq!(first.get("export.dir_listed"), 1, "{s}: {first:?}");
        let listed_again = if kept { 0 } else { 1 };
        assert_eq!(
            second.get("export.dir_listed"),
            listed_again,
            "{s}: {second:?}"
        );

        // fold-exited, with files kept: both processes have exited, so
        // the next scrape reads their files without taking their locks.
        assert_eq!(first.get("export.file_locked"), 2, "{s}: {first:?}");
        let unlocked = kept && s.contains(Strategy::FoldExited);
        let locked_again = if unlocked { 0 } else { 2 };
        assert_eq!(
            second.get("export.file_locked"),
            locked_again,
            "{s}: {second:?}"
        );

        // decode-once: each distinct raw key decoded once, not each entry;
        // with prerender, not again in the next scrape.
        let once = s.contains(Strategy::DecodeOnce);
        let decoded = if once { LABEL_SETS as u64 } else { entries };
        assert_eq!(first.get("export.key_decoded"), decoded, "{s}: {first:?}");
        let decoded_again = match (once, s.contains(Strategy::Prerender)) {
            (true, true) => 0,
            (true, false) => LABEL_SETS as u64,
            (false, _) => entries,
        };
        assert_eq!(
            second.get("export.key_decoded"),
            decoded_again,
            "{s}: {second:?}"
        );

        // fast-unescape: the fast decoder, and only it, decodes.
        let (fast, reference) = (
            first.get("export.unescape.fast"),
            first.get("export.unescape.reference"),
        );
        if s.contains(Strategy::FastUnescape) {
            assert!(fast > 0 && reference == 0, "{s}: {first:?}");
        } else {
            assert!(fast == 0 && reference > 0, "{s}: {first:?}");
        }

        // prerender: the catalogue (label sets grouped, their pairs
        // rendered) built once, kept for the next scrape.
        assert_eq!(first.get("export.group_created"), LABEL_SETS as u64, "{s}");
        let rebuilt = if s.contains(Strategy::Prerender) {
            0
        } else {
            LABEL_SETS as u64
        };
        assert_eq!(
            second.get("export.group_created"),
            rebuilt,
            "{s}: {second:?}"
        );

        drop(exporter);
        assert_eq!(mappings_of(dir.path()), 0, "{s}: dropped with the exporter");
    }
}

#[test]
fn emptied_keeps_the_allocation() {
    let group = Group {
        labels: Vec::new(),
        rendered: None,
    };
    let mut v: Vec<(&Group, f64)> = Vec::with_capacity(100);
    v.extend((0..100).map(|i| (&group, f64::from(i))));
    let at = v.as_ptr() as usize;
    let back: Vec<(&'static Group, f64)> = emptied(v);
    assert!(back.is_empty());
    assert_eq!((back.as_ptr() as usize, back.capacity()), (at, 100));
}

/// A long-lived exporter with leases probes exited processes' files again
/// in turn (a new process given a dead one's pid may reopen one), but not
/// fold files, whose ids no process has: a folded store's warm scrape
/// opens no file.
#[test]
fn fold_files_are_not_probed_again() {
    let (dir, registry, _) = two_processes();
    let all = StrategySet::all().restrict(Stage::Export);
    let reprobes = |exporter: &mut Exporter| {
        scrape(exporter);
        (0..3)
            .map(|_| scrape(exporter).0.get("export.exited_reprobed"))
            .sum::<u64>()
    };
    let mut unfolded = Exporter::new(dir.path(), registry.clone(), all);
    assert!(reprobes(&mut unfolded) > 0);
    drop(unfolded);

    let config = crate::export::fold::FoldConfig {
        grace: Duration::ZERO,
        durable: false,
        ..crate::export::fold::FoldConfig::default()
    };
    crate::export::fold::fold_store(dir.path(), &registry, &config).unwrap();
    let files = std::fs::read_dir(dir.path()).unwrap().flatten();
    assert_eq!(
        files.filter(|f| f.path().is_file()).count(),
        1,
        "folded into one file"
    );
    let mut folded = Exporter::new(dir.path(), registry, all);
    assert_eq!(reprobes(&mut folded), 0);
}

/// Exited processes' files are replayed (their entries staged from where
/// they were, keys compared, nothing walked) while each file's `used` and
/// keys stay put: a value changed in place is read, a file whose `used`
/// moved is walked again, and every scrape prints what a fresh baseline
/// export prints. A scrape whose listing did not change since a clean one
/// runs that scrape's plan instead ([`plan`]); a file closed after writing
/// (as each change here is) changes the listing.
#[test]
fn exited_files_are_replayed_while_their_keys_stay_put() {
    use std::os::unix::fs::FileExt;
    let (dir, registry, _) = two_processes();
    let all = StrategySet::all().restrict(Stage::Export);
    let mut exporter = Exporter::new(dir.path(), registry.clone(), all);
    let check = |exporter: &mut Exporter| {
        let expected = export(dir.path(), &registry, StrategySet::NONE).unwrap();
        let mut out = Vec::new();
        let (result, counts) = counted(|| exporter.export_into(&mut out));
        result.unwrap();
        assert!(exporter.last_report().is_clean());
        assert_eq!(
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&expected)
        );
        (
            counts.get("export.file_replayed"),
            counts.get("export.scrape_planned"),
        )
    };
    assert_eq!(check(&mut exporter), (0, 0), "first read: walked");
    assert_eq!(check(&mut exporter), (0, 1), "nothing changed: planned");

    // Written in place and closed (a file held open for writing has a
    // writer, and is read under its lock).
    let path = crate::format::storefile::file_path(dir.path(), "c_total", 1);
    let write_at = |at: usize, bytes: &[u8]| {
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(bytes, at as u64).unwrap();
    };
    let bytes = std::fs::read(&path).unwrap();
    let len = u32::from_le_bytes(bytes[HEADER_SIZE..HEADER_SIZE + 4].try_into().unwrap());
    write_at(HEADER_SIZE + 4 + len as usize, &41.5f64.to_le_bytes());
    assert_eq!(check(&mut exporter), (2, 0), "a value changed in place");
    assert!(export(dir.path(), &registry, StrategySet::NONE)
        .unwrap()
        .windows(5)
        .any(|w| w == b"42.5\n"));

    // The last entry given up: `used` moved, so that file is walked.
    let bytes = std::fs::read(&path).unwrap();
    let used = check_used(bytes[..4].try_into().unwrap(), bytes.len() as u64).unwrap();
    let last = entries(&bytes, used).last().unwrap().unwrap().offset() as u32;
    write_at(0, &last.to_le_bytes());
    assert_eq!(check(&mut exporter), (1, 0), "one file walked again");
    assert_eq!(check(&mut exporter), (0, 1), "and planned after");
}
