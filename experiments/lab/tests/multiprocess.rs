//! Real OS processes writing the same counters and histograms concurrently,
//! each into its own file, while the parent exports under `flock`: the
//! exported sums are exact. Children are forked from a client that already
//! wrote, so this also proves the cached pid (`cached-pid`) is refreshed
//! after `fork` and every child writes its own file.

use promlab::format::registry::Registry;
use promlab::shared::strategy::StrategySet;
use promlab::write::{Client, ClientConfig};

const CHILDREN: usize = 6;
const INCREMENTS: usize = 2_000;

fn registry() -> Registry {
    Registry::from_json(
        r#"{"metrics": [
            {"name": "jobs_total", "type": "counter", "help": "Jobs", "labels": ["queue"], "aggregation": "sum"},
            {"name": "job_seconds", "type": "histogram", "help": "Job time", "labels": ["queue"],
             "aggregation": "sum", "buckets": ["0.5", "1", "2.5"]},
            {"name": "busy", "type": "gauge", "help": "Busy", "labels": [], "aggregation": "all"}
        ]}"#,
    )
    .unwrap()
}

fn run(strategies: StrategySet) {
    let dir = tempfile::tempdir().unwrap();
    let registry = registry();
    let config = ClientConfig {
        strategies,
        ..ClientConfig::default()
    };
    let mut client = Client::new(dir.path(), &registry, config).unwrap();
    let jobs = client.metric("jobs_total").unwrap();
    let seconds = client.metric("job_seconds").unwrap();
    let busy = client.metric("busy").unwrap();
    // The parent writes first, so its pid and keys are cached before the fork.
    client
        .increment(jobs, &[("queue", "default")], 1.0)
        .unwrap();
    client.set(busy, &[], 1.0).unwrap();

    let mut pids = Vec::new();
    for child in 0..CHILDREN {
        // SAFETY: the child only uses the client and then `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let mut ok = true;
            for i in 0..INCREMENTS {
                ok &= client.increment(jobs, &[("queue", "default")], 1.0).is_ok();
                ok &= client
                    .observe(seconds, &[("queue", "default")], (i % 4) as f64)
                    .is_ok();
            }
            ok &= client.set(busy, &[], child as f64).is_ok();
            // SAFETY: leaves the child without running the parent's destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        pids.push(pid);
    }
    // Export while the children write: never an error, never a torn histogram.
    for _ in 0..20 {
        let text = promlab::export::export(dir.path(), &registry, strategies).unwrap();
        assert!(text.starts_with(b"# TYPE jobs_total counter"));
    }
    for pid in &pids {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(*pid, &mut status, 0) }, *pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child {pid} failed"
        );
    }

    for pid in &pids {
        let file = promlab::format::storefile::file_path(dir.path(), "jobs_total", *pid as u32);
        assert!(file.exists(), "child {pid} did not write its own file");
    }
    let text =
        String::from_utf8(promlab::export::export(dir.path(), &registry, strategies).unwrap())
            .unwrap();
    let total = 1 + CHILDREN * INCREMENTS;
    assert!(
        text.contains(&format!("jobs_total{{queue=\"default\"}} {total}.0\n")),
        "{strategies}:\n{text}"
    );
    let observed = CHILDREN * INCREMENTS;
    assert!(
        text.contains(&format!(
            "job_seconds_count{{queue=\"default\"}} {observed}.0\n"
        )),
        "{text}"
    );
    // Values 0,1,2,3 in turn: 0.5 gets the 0s, 1 also the 1s, 2.5 also the 2s.
    let quarter = observed / 4;
    assert!(text.contains(&format!(
        "job_seconds_bucket{{queue=\"default\",le=\"1\"}} {}.0\n",
        2 * quarter
    )));
    assert!(text.contains(&format!(
        "job_seconds_sum{{queue=\"default\"}} {}.0\n",
        quarter * 6
    )));
    // `all` keeps one series per process: the parent and every child.
    assert_eq!(text.matches("busy{pid=").count(), 1 + CHILDREN, "{text}");
}

#[test]
fn concurrent_processes_sum_exactly_under_every_write_strategy() {
    for strategies in StrategySet::combinations(promlab::shared::strategy::Stage::Write) {
        run(strategies);
    }
}
