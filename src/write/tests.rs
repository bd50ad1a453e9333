use super::*;

use crate::shared::event_probe::{counted, Counts, ThreadIo};
use crate::shared::strategy::{Stage, Strategy};

/// One kind of public call, repeated by [`costs_of`].
#[derive(Clone, Copy, Debug)]
enum Op {
    /// A counter's increment (aggregation `sum`).
    Increment,
    /// A histogram's observe (aggregation `sum`): two series written.
    Observe,
    /// A `most_recent` gauge's set.
    SetMostRecent,
}

const REPEATS: u64 = 10;

/// What `REPEATS` calls of `op` cost after a first one (which opens the
/// file and caches what a strategy caches): the events counted, and this
/// thread's I/O.
fn costs_of(strategies: StrategySet, op: Op) -> (Counts, ThreadIo) {
    let registry = Registry::from_json(
        r#"{"metrics": [
            {"name": "c_total", "type": "counter", "help": "h", "labels": ["l"]},
            {"name": "h_seconds", "type": "histogram", "help": "h", "labels": ["l"],
             "buckets": ["1.0"], "aggregation": "sum"},
            {"name": "g_recent", "type": "gauge", "help": "h", "labels": ["l"],
             "aggregation": "most_recent"}]}"#,
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = ClientConfig {
        dialect: Dialect::Uri,
        strategies,
        pid_override: None,
    };
    let mut client = Client::new(dir.path(), &registry, config).unwrap();
    let labels = [("l", "x")];
    let call = |client: &mut Client| match op {
        Op::Increment => {
            let id = client.metric("c_total").unwrap();
            client.increment(id, &labels, 1.0).unwrap()
        }
        Op::Observe => {
            let id = client.metric("h_seconds").unwrap();
            client.observe(id, &labels, 0.5).unwrap()
        }
        Op::SetMostRecent => {
            let id = client.metric("g_recent").unwrap();
            client.set(id, &labels, 2.0).unwrap()
        }
    };
    call(&mut client);
    let ((_, counts), io) =
        ThreadIo::of(|| counted(|| (0..REPEATS).for_each(|_| call(&mut client))));
    (counts, io)
}

/// Each write strategy has its effect, counted, under every combination
/// of the others: the key encodings, value lookups, `getpid`s, clock
/// reads (and which clock) and I/O syscalls of repeated calls.
#[test]
fn each_write_strategy_has_its_effect() {
    let n = REPEATS;
    for s in StrategySet::combinations(Stage::Write) {
        let (inc, inc_io) = costs_of(s, Op::Increment);
        let (obs, _) = costs_of(s, Op::Observe);
        let (set, _) = costs_of(s, Op::SetMostRecent);
        let clock_reads = |c: &Counts| c.get("write.clock.monotonic") + c.get("write.clock.coarse");

        // key-cache: keys encoded once per process, not per call.
        let encoded = if s.contains(Strategy::KeyCache) { 0 } else { 1 };
        assert_eq!(inc.get("write.key_encoded"), encoded * n, "{s}: {inc:?}");
        assert_eq!(
            obs.get("write.key_encoded"),
            2 * encoded * n,
            "{s}: {obs:?}"
        );

        // increment-once: one value lookup per increment, not two; a set makes one.
        let lookups = if s.contains(Strategy::IncrementOnce) {
            1
        } else {
            2
        };
        assert_eq!(inc.get("write.lookup"), lookups * n, "{s}: {inc:?}");
        assert_eq!(obs.get("write.lookup"), 2 * lookups * n, "{s}: {obs:?}");
        assert_eq!(set.get("write.lookup"), n, "{s}: {set:?}");

        // cached-pid: the pid asked of the OS once per process, not per call.
        let asked = if s.contains(Strategy::CachedPid) {
            0
        } else {
            n
        };
        assert_eq!(inc.get("write.getpid"), asked, "{s}: {inc:?}");

        // clock-once: one clock reading per observe, not one per value written.
        let per_observe = if s.contains(Strategy::ClockOnce) {
            1
        } else {
            2
        };
        assert_eq!(clock_reads(&obs), per_observe * n, "{s}: {obs:?}");
        assert_eq!(clock_reads(&inc), n, "{s}: {inc:?}");

        // coarse-clock: the coarse clock wherever timestamps are discarded
        // (sum), the precise one where they are compared (most_recent).
        let coarse = s.contains(Strategy::CoarseClock);
        for (counts, discarded) in [(&inc, true), (&obs, true), (&set, false)] {
            let (precise, rough) = (
                counts.get("write.clock.monotonic"),
                counts.get("write.clock.coarse"),
            );
            if coarse && discarded {
                assert!(precise == 0 && rough > 0, "{s}: {counts:?}");
            } else {
                assert!(precise > 0 && rough == 0, "{s}: {counts:?}");
            }
        }

        // mmap-store: values through the mapping, no read or write syscall;
        // without it a read and a write per increment.
        if s.contains(Strategy::MmapStore) {
            assert_eq!((inc_io.syscr, inc_io.syscw), (0, 0), "{s}: {inc_io:?}");
        } else {
            assert!(inc_io.syscr >= n && inc_io.syscw >= n, "{s}: {inc_io:?}");
        }
    }
}

/// A file cut under its writer, to nothing and inside an entry, under
/// every write combination: the writer repairs it in place, the entries
/// the cut reached start again from zero, the others keep their values,
/// and the write that met the cut is made (see [`StoreFile`]).
#[test]
fn a_file_cut_under_its_writer_is_repaired_in_place() {
    let registry = Registry::from_json(
        r#"{"metrics": [{"name": "c_total", "type": "counter", "help": "h", "labels": ["l"]}]}"#,
    )
    .unwrap();
    for strategies in StrategySet::combinations(Stage::Write) {
        let dir = tempfile::tempdir().unwrap();
        let config = ClientConfig {
            dialect: Dialect::Uri,
            strategies,
            pid_override: Some(99),
        };
        let mut client = Client::new(dir.path(), &registry, config).unwrap();
        let c = client.metric("c_total").unwrap();
        let path = storefile::file_path(dir.path(), "c_total", 99);
        let values = || -> Vec<(Vec<u8>, f64)> {
            let bytes = std::fs::read(&path).unwrap();
            crate::reference::exposition::read_entries(&bytes)
                .unwrap()
                .into_iter()
                .map(|e| (e.key, e.value))
                .collect()
        };
        let cut = |len: u64| {
            OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(len)
                .unwrap()
        };
        for _ in 0..10 {
            client.increment(c, &[("l", "a")], 1.0).unwrap();
        }
        client.increment(c, &[("l", "b")], 5.0).unwrap();
        let before = truncations();
        cut(0);
        client.increment(c, &[("l", "a")], 1.0).unwrap();
        assert_eq!(
            values(),
            [(b"l=a".to_vec(), 1.0), (b"l=b".to_vec(), 0.0)],
            "{strategies}"
        );
        assert_eq!(std::fs::metadata(&path).unwrap().len(), INITIAL_FILE_SIZE);
        // Inside b's key: a is whole; noticed before the next entry is appended.
        cut(8 + 16 + 8 + 6);
        client.increment(c, &[("l", "a")], 1.0).unwrap();
        client.increment(c, &[("l", "c")], 1.0).unwrap();
        client.increment(c, &[("l", "b")], 2.0).unwrap();
        assert_eq!(
            values(),
            [
                (b"l=a".to_vec(), 2.0),
                (b"l=b".to_vec(), 2.0),
                (b"l=c".to_vec(), 1.0)
            ],
            "{strategies}"
        );
        let after = truncations();
        // Other tests' writers may count too; this one repaired twice.
        assert!(
            after.files_repaired >= before.files_repaired + 2,
            "{strategies}"
        );
        assert!(
            after.entries_reset >= before.entries_reset + 3,
            "{strategies}"
        );
    }
}

#[test]
fn key_cache_finds_each_label_set_whichever_came_last() {
    let mut cache = KeyCache::default();
    let ok = || Ok(());
    let a = cache
        .label_set(&[("statement", "SELECT 1")], 1, ok)
        .unwrap();
    let b = cache
        .label_set(&[("statement", "SELECT 2")], 1, ok)
        .unwrap();
    assert_ne!(a, b);
    // The last set is compared, not trusted: same length, other bytes.
    assert_eq!(
        cache
            .label_set(&[("statement", "SELECT 1")], 1, ok)
            .unwrap(),
        a
    );
    assert_eq!(
        cache
            .label_set(&[("statement", "SELECT 1")], 1, ok)
            .unwrap(),
        a
    );
    assert_eq!(
        cache
            .label_set(&[("statement", "SELECT 2")], 1, ok)
            .unwrap(),
        b
    );
    let mut reused = String::from("SELECT 1");
    assert_eq!(
        cache.label_set(&[("statement", &reused)], 1, ok).unwrap(),
        a
    );
    reused.replace_range(7.., "2");
    assert_eq!(
        cache.label_set(&[("statement", &reused)], 1, ok).unwrap(),
        b
    );
    assert_eq!(cache.sets.len(), 2);
}

/// The timestamps of a histogram's bucket and sum after each of three observes.
fn observe_timestamps(strategies: StrategySet) -> Vec<(f64, f64)> {
    let registry = Registry::from_json(
        r#"{"metrics": [{"name": "t_seconds", "type": "histogram", "help": "h",
            "labels": ["l"], "buckets": ["1.0"], "aggregation": "sum"}]}"#,
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = ClientConfig {
        dialect: Dialect::Uri,
        strategies,
        pid_override: Some(4242),
    };
    let mut client = Client::new(dir.path(), &registry, config).unwrap();
    let id = client.metric("t_seconds").unwrap();
    let path = file_path(dir.path(), "t_seconds", 4242);
    (0..3)
        .map(|_| {
            client.observe(id, &[("l", "x")], 0.5).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            let used = i32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
            let stamps: Vec<f64> = entries(&bytes, used)
                .map(|e| e.unwrap().timestamp())
                .collect();
            // Series `le=1.0` (the bucket observed), `+Inf`, `sum`, in order of first write.
            assert_eq!(stamps.len(), 2, "bucket and sum");
            (stamps[0], stamps[1])
        })
        .collect()
}

/// Ruby's `buckets.bsearch { |b| b >= value }` finds no bucket for NaN, so
/// client_ruby counts a NaN observation in `+Inf` (and the sum turns NaN).
#[test]
fn a_nan_observation_counts_in_the_inf_bucket_as_in_client_ruby() {
    let registry = Registry::from_json(
        r#"{"metrics": [{"name": "t_seconds", "type": "histogram", "help": "h",
            "labels": ["l"], "buckets": ["0.5", "1.0"], "aggregation": "sum"}]}"#,
    )
    .unwrap();
    for strategies in StrategySet::combinations(Stage::Write) {
        let dir = tempfile::tempdir().unwrap();
        let config = ClientConfig {
            dialect: Dialect::Uri,
            strategies,
            pid_override: Some(4242),
        };
        let mut client = Client::new(dir.path(), &registry, config).unwrap();
        let id = client.metric("t_seconds").unwrap();
        client.observe(id, &[("l", "x")], f64::NAN).unwrap();
        client.observe(id, &[("l", "x")], 0.75).unwrap();
        let bytes = std::fs::read(file_path(dir.path(), "t_seconds", 4242)).unwrap();
        let used = i32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
        let written: Vec<(String, f64)> = entries(&bytes, used)
            .map(|e| e.unwrap())
            .map(|e| (String::from_utf8_lossy(e.key()).into_owned(), e.value()))
            .collect();
        let le = |key: &str| key.rsplit("le=").next().unwrap().to_owned();
        let les: Vec<String> = written.iter().map(|(k, _)| le(k)).collect();
        assert_eq!(les, ["%2BInf", "sum", "1.0"], "{strategies:?}: {written:?}");
        assert_eq!(written[0].1, 1.0);
        assert!(written[1].1.is_nan());
    }
}

/// An observe's bucket and sum carry one reading with `clock-once`,
/// and timestamps never go back.
#[test]
fn timestamps_are_clock_readings_once_per_op_with_clock_once() {
    for strategies in StrategySet::combinations(Stage::Write) {
        let per_op = strategies.contains(Strategy::ClockOnce);
        let stamps = observe_timestamps(strategies);
        let mut last = 0.0;
        for &(bucket, sum) in &stamps {
            assert!(
                bucket > 0.0 && sum >= bucket && bucket >= last,
                "{stamps:?}"
            );
            if per_op {
                assert_eq!(bucket, sum, "one reading per observe: {stamps:?}");
            }
            last = sum;
        }
    }
}

/// `coarse-clock`: every metric's clock is the coarse one but
/// `most_recent`'s, the one aggregation that compares timestamps.
#[test]
fn only_most_recent_keeps_the_precise_clock() {
    let registry = Registry::from_json(
        r#"{"metrics": [
            {"name": "g_sum", "type": "gauge", "aggregation": "sum"},
            {"name": "g_max", "type": "gauge", "aggregation": "max"},
            {"name": "g_min", "type": "gauge", "aggregation": "min"},
            {"name": "g_all", "type": "gauge", "aggregation": "all"},
            {"name": "g_recent", "type": "gauge", "aggregation": "most_recent"},
            {"name": "c_total", "type": "counter"},
            {"name": "h_seconds", "type": "histogram"}]}"#,
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    for strategies in StrategySet::combinations(Stage::Write) {
        let config = ClientConfig {
            strategies,
            ..ClientConfig::default()
        };
        let client = Client::new(dir.path(), &registry, config).unwrap();
        let coarse = strategies.contains(Strategy::CoarseClock);
        for metric in &client.metrics {
            let expected = if coarse && metric.aggregation != ProcessAggregation::MostRecent {
                Clock::MonotonicCoarse
            } else {
                Clock::Monotonic
            };
            assert_eq!(
                metric.stamps, expected,
                "{} under {strategies}",
                metric.def.name
            );
        }
    }
}

#[test]
fn the_coarse_clock_is_the_monotonic_clock_as_of_its_last_tick() {
    for _ in 0..1000 {
        let coarse = Clock::MonotonicCoarse.seconds();
        let precise = Clock::Monotonic.seconds();
        let coarse_after = Clock::MonotonicCoarse.seconds();
        assert!(coarse > 0.0 && coarse <= precise, "{coarse} {precise}");
        // One tick (1–10 ms) behind at most.
        assert!(precise - coarse < 0.05, "{coarse} {precise}");
        assert!(coarse_after >= coarse, "{coarse} {coarse_after}");
    }
}

mod bucket_of {
    use super::super::bucket_of;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// Counting the bounds below the value (or the binary search, past
        /// 32 bounds) finds client_ruby's bucket, the first bound >= value,
        /// on sorted bounds with repeats, values on the bounds, NaN, ±inf.
        #[test]
        fn equals_the_binary_search(
            mut bounds in proptest::collection::vec(
                prop_oneof![-1e3f64..1e3, (-4i32..4).prop_map(f64::from)], 0..48),
            pick in any::<prop::sample::Index>(),
            value in prop_oneof![
                -2e3f64..2e3,
                (-4i32..4).prop_map(f64::from),
                Just(f64::NAN),
                Just(f64::INFINITY),
                Just(f64::NEG_INFINITY),
            ],
            on_a_bound in any::<bool>(),
        ) {
            bounds.sort_by(f64::total_cmp);
            let value = if on_a_bound && !bounds.is_empty() {
                bounds[pick.index(bounds.len())]
            } else {
                value
            };
            // client_ruby: `buckets.bsearch { |b| b >= value }`, else +Inf.
            prop_assert_eq!(
                bucket_of(&bounds, value),
                bounds.iter().position(|&bound| bound >= value).unwrap_or(bounds.len())
            );
        }
    }
}
