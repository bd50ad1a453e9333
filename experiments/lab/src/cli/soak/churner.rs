//! The store churner: one phase at a time, it truncates, deletes, grows,
//! corrupts, renames and floods the store directory the sidecar serves, and
//! cleans up after each phase.

use super::{Run, FD_LIMIT, MANY_FILES, PHASES, REGISTRY, REQUEST_TIMEOUT, TAIL, WRITERS};
use anyhow::{bail, Result};
use promlab::ingest::feed::splitmix64;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Default)]
pub(super) struct ChurnState {
    phase: AtomicUsize,
    /// Scrapes found blocked opening the FIFO (released by opening its write end).
    pub(super) fifo_stuck: AtomicU32,
    /// What each phase did, for the report.
    pub(super) notes: Mutex<Vec<(String, String)>>,
}

impl ChurnState {
    pub(super) fn phase_name(&self) -> &'static str {
        PHASES
            .get(self.phase.load(Ordering::Relaxed))
            .copied()
            .unwrap_or(TAIL)
    }

    fn note(&self, phase: &str, note: String) {
        self.notes.lock().unwrap().push((phase.to_owned(), note));
    }
}

/// A store file as client_ruby lays it out: `used`, then entries of
/// (padded length, key, padding, value, timestamp), `len` bytes in all (sparse).
fn raw_store_file(entries: &[(&[u8], f64)], len: u64) -> Vec<u8> {
    let mut bytes = promlab::format::storefile::file_bytes(entries.iter().copied());
    bytes.resize(bytes.len().max(len as usize), 0);
    bytes
}

fn victim(store: &Path, pid: u32) -> PathBuf {
    promlab::format::storefile::file_path(store, "soak_victim", pid)
}

/// One phase per slot of the first 80 % of the run, each cleaning up after itself.
pub(super) fn churner(run: &Run, store: &Path, state: &ChurnState) {
    let slot = run.length.mul_f64(0.8 / PHASES.len() as f64);
    for (i, phase) in PHASES.iter().enumerate() {
        if run.over() {
            break;
        }
        state.phase.store(i, Ordering::Relaxed);
        let end = run.start + slot * (i as u32 + 1);
        let note = match churn_phase(phase, run, store, end, &state.fifo_stuck) {
            Ok(note) => note,
            Err(e) => format!("churner error: {e:#}"),
        };
        sweep(store);
        state.note(phase, note);
    }
    state.phase.store(PHASES.len(), Ordering::Relaxed);
}

fn churn_phase(
    phase: &str,
    run: &Run,
    store: &Path,
    end: Instant,
    fifo_stuck: &AtomicU32,
) -> Result<String> {
    let until_end = || !run.over() && Instant::now() < end;
    let pause = |ms| run.sleep(Duration::from_millis(ms));
    let keys: Vec<Vec<u8>> = (0..1000).map(|k| format!("k=v{k}").into_bytes()).collect();
    let many: Vec<(&[u8], f64)> = keys.iter().map(|k| (k.as_slice(), 1.0)).collect();
    Ok(match phase {
        "quiet" => {
            run.sleep(end.saturating_duration_since(Instant::now()));
            "nothing abused".into()
        }
        "truncate" => {
            // 20,000 entries (~700 KiB used) in a 2 MiB file, cut to 4 KiB and restored
            // every few milliseconds without the lock: an outside `truncate` or `> file`
            // racing the reader's walk of its mapping.
            use std::os::unix::fs::FileExt;
            let path = victim(store, 900_001);
            let keys: Vec<Vec<u8>> = (0..20_000)
                .map(|k| format!("k=t{k}").into_bytes())
                .collect();
            let entries: Vec<(&[u8], f64)> = keys.iter().map(|k| (k.as_slice(), 1.0)).collect();
            let full = raw_store_file(&entries, 2 << 20);
            std::fs::write(&path, &full)?;
            let file = std::fs::OpenOptions::new().write(true).open(&path)?;
            let mut cuts = 0;
            while until_end() {
                pause(3);
                file.set_len(4096)?;
                cuts += 1;
                pause(3);
                file.write_all_at(&full[4096..], 4096)?;
            }
            format!("{cuts} cuts of a 2 MiB store file (20,000 entries) to 4 KiB and back")
        }
        "delete" => {
            let mut rounds = 0;
            while until_end() {
                for pid in 910_000..910_020 {
                    std::fs::write(victim(store, pid), raw_store_file(&many[..10], 4096))?;
                }
                pause(10);
                for pid in 910_000..910_020 {
                    std::fs::remove_file(victim(store, pid))?;
                }
                pause(10);
                rounds += 1;
            }
            format!("{rounds} rounds of 20 files created, then deleted")
        }
        "grow" => {
            // A real writer adding new series as fast as it can: the file grows past 1 MiB.
            let registry = promlab::format::registry::Registry::from_json(REGISTRY)?;
            let config = promlab::write::ClientConfig {
                pid_override: Some(920_001),
                ..Default::default()
            };
            let mut client = promlab::write::Client::new(store, &registry, config)?;
            let id = client.metric("soak_victim")?;
            let mut n = 0u64;
            while until_end() && n < 60_000 {
                for _ in 0..200 {
                    let value = format!("grow{n}");
                    client.increment(id, &[("k", value.as_str())], 1.0)?;
                    n += 1;
                }
                pause(5);
            }
            let len = std::fs::metadata(victim(store, 920_001)).map_or(0, |m| m.len());
            format!("{n} series written, the file grew to {} KiB", len / 1024)
        }
        "garbage" => {
            // Bad files of the good metric: each must be skipped, never fail the scrape.
            let good = |pid| promlab::format::storefile::file_path(store, "soak_jobs_total", pid);
            let random: Vec<u8> = (0..4096u64).map(|i| splitmix64(i ^ 0xbad) as u8).collect();
            let mut past_end = raw_store_file(&[(b"queue=default", 5.0)], 4096);
            past_end[..4].copy_from_slice(&100_000i32.to_le_bytes());
            let mut torn = raw_store_file(&[(b"queue=default", 5.0)], 0);
            let torn_len = torn.len() - 10;
            torn.truncate(torn_len);
            let mut bad_length = raw_store_file(&[(b"queue=default", 5.0)], 4096);
            bad_length[8..12].copy_from_slice(&(-8i32).to_le_bytes());
            std::fs::write(good(930_001), &random)?;
            std::fs::write(good(930_002), b"")?;
            std::fs::write(good(930_003), &past_end)?;
            std::fs::write(good(930_004), &torn)?;
            std::fs::write(good(930_005), &bad_length)?;
            run.sleep(end.saturating_duration_since(Instant::now()));
            "5 bad files of the good metric: random bytes, empty, used past the end, a torn entry, a negative entry length".into()
        }
        "odd-names" => {
            use std::os::unix::ffi::OsStrExt;
            let zero = raw_store_file(&[(b"queue=default", 0.0)], 4096);
            std::fs::write(store.join("metric_soak_jobs_total___.bin"), &zero)?;
            std::fs::write(store.join("metric_soak_jobs_total___abc.bin"), &zero)?;
            std::fs::write(store.join("metric_soak_victim___1\n2.bin"), &zero)?;
            std::fs::write(
                store.join(std::ffi::OsStr::from_bytes(
                    b"metric_soak_victim___\xff\xfe.bin",
                )),
                &zero,
            )?;
            std::fs::write(store.join("metric_.bin"), &zero)?;
            std::fs::write(store.join("metric_soak_victim___940001.bin.tmp"), &zero)?;
            std::fs::write(
                store.join(format!("metric_{}___1.bin", "x".repeat(230))),
                &zero,
            )?;
            std::fs::create_dir(victim(store, 940_002))?;
            std::os::unix::fs::symlink("/nonexistent/promlab-soak", victim(store, 940_003))?;
            std::os::unix::fs::symlink(victim(store, 940_004), victim(store, 940_004))?;
            run.sleep(end.saturating_duration_since(Instant::now()));
            "odd names (empty, non-numeric, newline and non-UTF-8 pids, 255 bytes), a directory, a dangling symlink, a symlink loop".into()
        }
        "prefix-clash" => {
            // A file of metric `soak_jobs_total___b`: counted under soak_jobs_total by a glob.
            let clash = store.join("metric_soak_jobs_total___b___950001.bin");
            std::fs::write(clash, raw_store_file(&[(b"queue=default", 1e9)], 4096))?;
            run.sleep(end.saturating_duration_since(Instant::now()));
            "metric_soak_jobs_total___b___950001.bin with 1e9 in the good series".into()
        }
        "bad-keys" => {
            // First an invalid label name (a valid key, an exposition Prometheus rejects),
            // then keys that do not decode.
            let path = victim(store, 960_001);
            std::fs::write(
                &path,
                raw_store_file(&[(b"k=ok", 1.0), (b"co%20de=x", 1.0)], 4096),
            )?;
            run.sleep((end.saturating_duration_since(Instant::now())) / 2);
            std::fs::write(
                &path,
                raw_store_file(
                    &[
                        (b"k=ok", 1.0),
                        (b"k=%ZZ", 1.0),
                        (b"=x", 1.0),
                        (b"k=\xff", 1.0),
                    ],
                    4096,
                ),
            )?;
            run.sleep(end.saturating_duration_since(Instant::now()));
            "a label name with a space (co%20de), then a bad escape, an empty label name, a non-ASCII byte".into()
        }
        "many-files" => {
            let one = raw_store_file(&[(b"k=many", 1.0)], 4096);
            for pid in 0..MANY_FILES {
                std::fs::write(victim(store, 970_000 + pid), &one)?;
            }
            run.sleep(end.saturating_duration_since(Instant::now()));
            format!(
                "{MANY_FILES} valid files at once (the sidecar's open-file limit is {FD_LIMIT})"
            )
        }
        "fifo" => {
            let path = victim(store, 980_001);
            mkfifo(&path)?;
            // Held past a scrape's timeout, so a scrape stuck opening it shows as one.
            run.sleep(REQUEST_TIMEOUT + Duration::from_secs(1));
            let stuck = release_fifo(store, &path)?;
            fifo_stuck.store(stuck, Ordering::Relaxed);
            run.sleep(end.saturating_duration_since(Instant::now()));
            format!("a FIFO named like a store file; readers found blocked opening it: {stuck}")
        }
        other => bail!("unknown phase {other}"),
    })
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &Path) -> Result<()> {
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: a valid C string; mkfifo only creates a node.
    if unsafe { libc::mkfifo(name.as_ptr(), 0o644) } != 0 {
        bail!("mkfifo: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// Moves a FIFO out of the store and opens its write end a few times, so a reader
/// blocked opening it (a hung scrape) wakes up; returns how many were found blocked.
fn release_fifo(store: &Path, path: &Path) -> Result<u32> {
    let aside = store.with_extension("fifo-aside");
    std::fs::rename(path, &aside)?;
    // The sidecar scrapes thousands of times a second, and each scrape opens the
    // FIFO without blocking, sees it is no regular file and closes it: a write
    // end opened right after the rename could meet such a reader between its
    // open and close and count it as blocked (it did once, in a run of the
    // suite). Once renamed, no new reader finds it; a blocked one stays
    // blocked, so it is still found after this pause, and a passing one is gone.
    std::thread::sleep(Duration::from_millis(500));
    let name = std::ffi::CString::new(aside.as_os_str().as_encoded_bytes())?;
    let mut stuck = 0;
    for _ in 0..20 {
        // SAFETY: a valid C string; the descriptor is closed right away.
        let fd = unsafe { libc::open(name.as_ptr(), libc::O_WRONLY | libc::O_NONBLOCK) };
        if fd >= 0 {
            stuck += 1;
            // SAFETY: our own descriptor.
            unsafe { libc::close(fd) };
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::remove_file(&aside)?;
    Ok(stuck)
}

/// Removes everything in the store but the writers' own files.
pub(super) fn sweep(store: &Path) {
    let Ok(entries) = std::fs::read_dir(store) else {
        return;
    };
    let writers: Vec<PathBuf> = (0..WRITERS)
        .map(|w| promlab::format::storefile::file_path(store, "soak_jobs_total", 700_001 + w))
        .collect();
    for entry in entries.flatten() {
        let path = entry.path();
        if writers.contains(&path) {
            continue;
        }
        let meta = std::fs::symlink_metadata(&path);
        let _ = match meta {
            Ok(m) if m.file_type().is_dir() => std::fs::remove_dir_all(&path),
            Ok(m) if std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type()) => {
                release_fifo(store, &path)
                    .map(drop)
                    .map_err(std::io::Error::other)
            }
            _ => std::fs::remove_file(&path),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_store_files_read_back() {
        let bytes = raw_store_file(&[(b"k=a", 2.5), (b"k=bb", 1.0)], 4096);
        assert_eq!(bytes.len(), 4096);
        let used =
            promlab::format::storefile::check_used(bytes[..4].try_into().unwrap(), 4096).unwrap();
        let entries: Vec<_> = promlab::format::storefile::entries(&bytes, used)
            .map(|e| e.unwrap())
            .map(|e| {
                (
                    promlab::format::storefile::strip_padding(e.key()).to_vec(),
                    e.value(),
                )
            })
            .collect();
        assert_eq!(entries, [(b"k=a".to_vec(), 2.5), (b"k=bb".to_vec(), 1.0)]);
    }

    /// The pause after the rename must not hide a reader that is really
    /// blocked opening the FIFO, and a reader that is gone is not counted.
    #[test]
    fn release_fifo_finds_a_blocked_reader_and_not_a_passing_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        std::fs::create_dir(&store).unwrap();
        let path = store.join("fifo_blocked.bin");
        mkfifo(&path).unwrap();
        let reader = {
            let path = path.clone();
            // A blocking open: it returns only once a writer opens the FIFO.
            std::thread::spawn(move || std::fs::File::open(path).map(drop))
        };
        std::thread::sleep(Duration::from_millis(200));
        // At least once: the reader, woken, may still hold it at the next probe.
        assert!(release_fifo(&store, &path).unwrap() >= 1);
        reader.join().unwrap().unwrap();
        assert!(!path.exists());

        let path = store.join("fifo_passing.bin");
        mkfifo(&path).unwrap();
        {
            use std::os::unix::fs::OpenOptionsExt;
            let passing = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
                .unwrap();
            drop(passing);
        }
        assert_eq!(release_fifo(&store, &path).unwrap(), 0);
    }
}
