//! A store file truncated under a writing process: the
//! writer — a real child process, `promlab replay-one -` fed ops on its
//! stdin — survives, repairs the file in place and makes the write that met
//! the cut again (`promlab::write::StoreFile`'s doc), under the baseline's
//! `read(2)`/`write(2)` and `mmap-store`'s guarded mapping alike.

use promlab::reference::exposition::read_entries;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PID: u32 = 4711;
const REGISTRY: &str = r#"{"metrics": [
  {"name": "c_total", "type": "counter", "help": "h", "labels": ["k"], "aggregation": "sum"}]}"#;

struct Writer {
    child: Child,
    store: PathBuf,
}

impl Writer {
    fn start(dir: &Path, strategies: &str) -> Writer {
        let registry = dir.join("registry.json");
        std::fs::write(&registry, REGISTRY).unwrap();
        let store = dir.join("store");
        let child = Command::new(env!("CARGO_BIN_EXE_promlab"))
            .args(["replay-one", "--dialect", "uri", "--strategies", strategies])
            .arg("--registry")
            .arg(&registry)
            .arg("--store")
            .arg(&store)
            .arg("-")
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Writer { child, store }
    }

    fn file(&self) -> PathBuf {
        promlab::format::storefile::file_path(&self.store, "c_total", PID)
    }

    fn inc(&mut self, key: &str, by: f64, times: usize) {
        let line = format!(
            "{{\"pid\":{PID},\"metric\":\"c_total\",\"op\":\"inc\",\"value\":{by},\"labels\":{{\"k\":\"{key}\"}}}}\n"
        );
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(line.repeat(times).as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    /// Waits (generously: the machine may be loaded) until the file holds
    /// exactly `want` (key → value), as the reference reader reads it.
    fn wait_for(&mut self, want: &[(&str, f64)]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("the writer exited ({status}) while {want:?} was awaited");
            }
            seen = values(&self.file());
            if seen.len() == want.len()
                && want.iter().all(|(k, v)| {
                    seen.iter()
                        .any(|(key, value)| key == &format!("k={k}") && value == v)
                })
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("the file holds {seen:?}, not {want:?}");
    }

    /// Closes stdin; the writer must exit 0. Returns its stderr.
    fn finish(mut self) -> String {
        drop(self.child.stdin.take());
        let out = self.child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "the writer failed: {stderr}");
        stderr
    }
}

/// (key, value) of every entry, or nothing while the file is unreadable.
fn values(file: &Path) -> Vec<(String, f64)> {
    let Ok(bytes) = std::fs::read(file) else {
        return Vec::new();
    };
    read_entries(&bytes)
        .map(|entries| {
            entries
                .into_iter()
                .map(|e| (String::from_utf8_lossy(&e.key).into_owned(), e.value))
                .collect()
        })
        .unwrap_or_default()
}

/// Where the entry of `key` starts in `file`.
fn entry_start(file: &Path, key: &str) -> u64 {
    let bytes = std::fs::read(file).unwrap();
    let mut pos = 8;
    loop {
        let len = i32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        if bytes[pos + 4..pos + 4 + len].starts_with(key.as_bytes()) {
            return pos as u64;
        }
        pos += 4 + len + 16;
    }
}

fn truncate(file: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(file)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// Cut to nothing, then inside an entry: every write after a cut lands, the
/// entries the cut reached start again from zero, the others keep their
/// values, and the writer says what it repaired.
#[test]
fn a_writer_survives_its_file_being_cut_and_repairs_it() {
    for strategies in ["none", "mmap-store", "all"] {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = Writer::start(dir.path(), strategies);
        writer.inc("a", 1.0, 100);
        writer.inc("b", 5.0, 1);
        writer.wait_for(&[("a", 100.0), ("b", 5.0)]);
        let size = std::fs::metadata(writer.file()).unwrap().len();

        // Cut to nothing (`> file`): with a mapping, the next increment touches
        // a page the file no longer has.
        truncate(&writer.file(), 0);
        writer.inc("a", 1.0, 7);
        writer.wait_for(&[("a", 7.0), ("b", 0.0)]);
        assert_eq!(
            std::fs::metadata(writer.file()).unwrap().len(),
            size,
            "{strategies}: re-extended"
        );

        // Cut inside b's key: a's entry is whole and keeps its value; the cut
        // is noticed before the next new entry is appended.
        let b = entry_start(&writer.file(), "k=b");
        truncate(&writer.file(), b + 6);
        writer.inc("a", 1.0, 1);
        writer.inc("c", 1.0, 1);
        writer.inc("b", 1.0, 2);
        writer.wait_for(&[("a", 8.0), ("b", 2.0), ("c", 1.0)]);

        let stderr = writer.finish();
        assert!(
            stderr.contains("cut under this writer and repaired 2 time(s)"),
            "{strategies}: {stderr}"
        );
    }
}

/// Cut again and again, anywhere, while the writer writes: it never dies,
/// and what it leaves is a whole store file the reference exporter reads.
#[test]
fn a_writer_survives_repeated_cuts() {
    for strategies in ["none", "mmap-store"] {
        let dir = tempfile::tempdir().unwrap();
        let mut writer = Writer::start(dir.path(), strategies);
        writer.inc("warm", 1.0, 1);
        writer.wait_for(&[("warm", 1.0)]);
        let file = writer.file();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let cuts = std::thread::scope(|s| {
            let cutter = s.spawn(|| {
                let mut cuts = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    cuts += 1;
                    truncate(&file, [0, 7, 100, 300, 4096, 5000][cuts as usize % 6]);
                    std::thread::sleep(Duration::from_millis(3));
                }
                cuts
            });
            for round in 0..200 {
                for key in [
                    "x",
                    "y",
                    "z",
                    "a-much-longer-label-value-to-spread-the-entries",
                ] {
                    writer.inc(&format!("{key}{}", round % 7), 1.0, 20);
                }
            }
            // Let the cuts run while the writer works through its input.
            std::thread::sleep(Duration::from_millis(300));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            cutter.join().unwrap()
        });
        // After the last cut, one more write: the file is whole again.
        writer.inc("last", 1.0, 3);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !values(&file)
            .iter()
            .any(|(k, v)| k == "k=last" && *v == 3.0)
        {
            assert!(
                Instant::now() < deadline,
                "{strategies}: the last write never landed"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let stderr = writer.finish();
        assert!(cuts > 10, "{cuts} cuts");
        assert!(stderr.contains("repaired"), "{strategies}: {stderr}");
        let bytes = std::fs::read(&file).unwrap();
        let entries = read_entries(&bytes).unwrap();
        assert!(entries.len() >= 2, "{entries:?}");
        let registry = promlab::format::registry::Registry::from_json(REGISTRY).unwrap();
        let text =
            promlab::reference::exposition::export(&writer_store(dir.path()), &registry).unwrap();
        assert!(
            String::from_utf8_lossy(&text).contains("c_total{k=\"last\"} 3.0"),
            "{strategies}: {}",
            String::from_utf8_lossy(&text)
        );
    }
}

fn writer_store(dir: &Path) -> PathBuf {
    dir.join("store")
}
