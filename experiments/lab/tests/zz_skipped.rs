//! The last test binary of `cargo test` (test binaries run in name order, the
//! lab's after the library's): one line that sums up the checks skipped in this
//! run because something was missing (see `tests/common/mod.rs::skip`). Under
//! `CI` there are none: a skip there fails the test that skipped.

#[path = "../../../tests/common/mod.rs"]
mod common;

#[test]
fn summary_of_skipped_checks() {
    let file = common::skips_file();
    let skipped = std::fs::read_to_string(&file).unwrap_or_default();
    let _ = std::fs::remove_file(&file);
    let lines: Vec<&str> = skipped.lines().collect();
    let summary = if lines.is_empty() {
        "skipped checks: none\n".to_string()
    } else {
        format!("skipped checks: {}: {}\n", lines.len(), lines.join("; "))
    };
    // Past the harness's capture, so it shows on a passing run.
    let _ = std::io::Write::write_all(&mut std::io::stderr(), summary.as_bytes());
}
