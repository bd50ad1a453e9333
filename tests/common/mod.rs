//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The repository's `tests/fixtures`: the library's tests run from the repository's
/// root, the lab's (which include this file too) from `experiments/lab`.
pub fn fixtures() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = if here.join("tests/fixtures").is_dir() {
        here.to_path_buf()
    } else {
        here.join("../..")
    };
    root.join("tests/fixtures")
}

/// The ruby-dfs cases kept unpacked, with the key dialect that wrote them.
pub const RUBY_CASES: [(&str, &str); 4] = [
    ("all-types-v4.2.5", "cgi"),
    ("all-types-v5-uri", "uri"),
    ("seed-repro-v4.2.5", "cgi"),
    ("seed-repro-v5-uri", "uri"),
];

/// The one-file-per-process cases (`ruby-dfs-poc/`), written by client_ruby's
/// `poc_file_per_process` branch: a temporary directory holding them all
/// (the seed repro unpacked), and each case's directory in it.
pub fn per_process_cases() -> (tempfile::TempDir, Vec<PathBuf>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = fixtures().join("ruby-dfs-poc");
    let archive = std::fs::File::open(root.join("seed-repro-poc.tar.gz")).unwrap();
    tar::Archive::new(flate2::read::GzDecoder::new(archive))
        .unpack(tmp.path())
        .expect("unpack");
    let all_types = tmp.path().join("all-types-poc");
    copy_dir(&root.join("all-types-poc"), &all_types);
    let cases = vec![all_types, tmp.path().join("seed-repro-poc")];
    (tmp, cases)
}

/// Copies a directory tree.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// Unpacks the large case into a temporary directory.
pub fn unpack_large() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let archive = std::fs::File::open(fixtures().join("ruby-dfs/large-v5-uri.tar.gz")).unwrap();
    tar::Archive::new(flate2::read::GzDecoder::new(archive))
        .unpack(tmp.path())
        .expect("unpack");
    let case = tmp.path().join("large-v5-uri");
    (tmp, case)
}

/// The op logs of a case, sorted.
pub fn op_logs(case: &Path) -> Vec<PathBuf> {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(case)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("ops-"))
        .collect();
    logs.sort();
    logs
}

/// A store file's used region with every entry's timestamp zeroed, and its length.
pub fn comparable(bytes: &[u8]) -> (Vec<u8>, usize) {
    let used = i32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize;
    let mut region = bytes[..used].to_vec();
    let mut pos = 8;
    while pos < used {
        let len = i32::from_le_bytes(region[pos..pos + 4].try_into().unwrap()) as usize;
        let ts = pos + 4 + len + 8;
        region[ts..ts + 8].fill(0);
        pos = ts + 8;
    }
    (region, bytes.len())
}

/// Asserts two store directories hold the same files with the same bytes,
/// timestamps aside. Fixture files may be trimmed after their used region;
/// where both are whole, their sizes must match too, and promlab's files must
/// be zero after `used`.
pub fn assert_same_store(expected: &Path, actual: &Path, what: &str) {
    let names = |dir: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert!(
        !names(expected).is_empty(),
        "{what}: no store file to compare"
    );
    assert_eq!(names(expected), names(actual), "{what}: file sets differ");
    for name in names(expected) {
        let e = std::fs::read(expected.join(&name)).unwrap();
        let a = std::fs::read(actual.join(&name)).unwrap();
        let (e_region, e_len) = comparable(&e);
        let (a_region, a_len) = comparable(&a);
        assert!(
            e_region == a_region,
            "{what}: {name} differs in its used region"
        );
        assert_eq!(
            a_len as u64 % promlab::format::storefile::INITIAL_FILE_SIZE,
            0,
            "{what}: {name} size"
        );
        if e_len > e_region.len() {
            assert_eq!(e_len, a_len, "{what}: {name} size");
        }
        assert!(
            a[a_region.len()..].iter().all(|&b| b == 0),
            "{what}: {name} has bytes after used"
        );
    }
}

/// A check that cannot run here because `what` is missing (`install` says how to
/// get it). Under `CI` that is a failure: CI installs everything the tests need,
/// so a skip there is a hole in the suite. Elsewhere the test goes on without
/// the check, says so on the terminal (past the test harness's capture, which
/// would hide it), and records it for the one-line summary that
/// `experiments/lab/tests/zz_skipped.rs` prints at the end of `cargo test`.
pub fn skip(what: &str, install: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{what} is missing, and CI must run every check ({install})");
    }
    let line = format!("{what} (install: {install})\n");
    // Raw writes to the standard error stream are not captured, unlike eprintln!.
    let _ = std::io::Write::write_all(
        &mut std::io::stderr(),
        format!("SKIPPED: {line}").as_bytes(),
    );
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(skips_file())
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
}

/// Where one `cargo test` run's skips are kept: every test binary of a run is a
/// child of the same cargo process, so its pid names the run.
pub fn skips_file() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "test-skips-{}.txt",
        std::os::unix::process::parent_id()
    ))
}
