//! Export peer: client_ruby's own exporter (`Formats::Text.marshal` over its
//! `DirectFileStore`) reading the very directory our export arms scrape, in
//! Ruby, pristine, at two revisions: `peer:client_ruby-4.2.5` (tag v4.2.5,
//! CGI-escaped keys) and `peer:client_ruby-5.x` (main with PR #330, URI keys).
//!
//! The sources are the pristine archives of `../shared/upstream/` (what
//! `experiments/upstream/` patches; see [`upstream_archive`]). The peer
//! unpacks one into its scratch directory, writes the scenario's store there
//! with the generator our arms use ([`crate::harness::workloads::write_store`])
//! and runs `experiments/peers/client_ruby_export.rb` in one Ruby process:
//! one untimed export, checked byte for byte against the scenario's verified
//! digest, then `repeats` timed ones. Measured: the Ruby process's CPU time
//! per export (`CLOCK_PROCESS_CPUTIME_ID`), as `experiments/upstream/` does.

use super::{Measure, Peer, PeerContext, PeerOutcome, PeerResult};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The script, carried in the binary so a copied `promlab` still runs it.
const SCRIPT: &str = include_str!("../../../../peers/client_ruby_export.rb");
/// What the script requires beside it: its work moves to a child whose pid
/// the store's file names lack.
const OWN_PID: &str = include_str!("../../../../upstream/client_ruby/own_pid.rb");

/// Longest one Ruby run (the untimed export and the timed ones) may take.
const TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// The scenarios the client_ruby peers have an arm in.
pub const SCENARIOS: [&str; 3] = ["many-processes", "many-processes-5k", "many-metrics"];

/// What the script prints.
#[derive(Deserialize)]
struct ScriptReport {
    ruby: String,
    /// `[wall ns, CPU ns]` per timed export.
    samples: Vec<(u64, u64)>,
    lines: u64,
    rss_kib: u64,
}

/// client_ruby, pristine, at one revision.
pub struct ClientRuby {
    arm: &'static str,
    /// The archive's name in the upstream directory.
    archive: &'static str,
}

/// `peer:client_ruby-4.2.5` and `peer:client_ruby-5.x`.
pub fn peers() -> [ClientRuby; 2] {
    [
        ClientRuby {
            arm: "peer:client_ruby-4.2.5",
            archive: "client_ruby-v4.2.5.tar.gz",
        },
        ClientRuby {
            arm: "peer:client_ruby-5.x",
            archive: "client_ruby-5.x-uri.tar.gz",
        },
    ]
}

/// The pristine client_ruby archive `name`: in `$PROMLAB_UPSTREAM` if set,
/// else in the first `shared/upstream/` beside the repository or one of its
/// ancestors (`../shared/upstream/` for a checkout beside `shared/`, as
/// `experiments/upstream/client_ruby/run.sh` looks).
pub fn upstream_archive(name: &str) -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("PROMLAB_UPSTREAM") {
        let path = Path::new(&dir).join(name);
        return path.is_file().then_some(path);
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    repo.canonicalize()
        .ok()?
        .ancestors()
        .skip(1)
        .map(|dir| dir.join("shared/upstream").join(name))
        .find(|path| path.is_file())
}

fn ruby_installed() -> bool {
    super::runs_cleanly("ruby", &["-e", "exit 0"])
}

/// Unpacks a `git archive` tarball into `into`, dropping its top directory.
fn unpack(archive: &Path, into: &Path) -> Result<()> {
    let file = std::fs::File::open(archive)?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
    for entry in tar.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let inner: PathBuf = path.components().skip(1).collect();
        if inner.as_os_str().is_empty() {
            continue;
        }
        let dest = into.join(inner);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)?;
        }
        entry.unpack(dest)?;
    }
    Ok(())
}

/// Runs the script to completion, or kills its process group at [`TIMEOUT`].
fn run_script(dir: &Path, repeats: usize) -> Result<ScriptReport> {
    let mut command = Command::new("ruby");
    command
        .arg("-I")
        .arg(dir.join("client_ruby/lib"))
        .arg(dir.join("client_ruby_export.rb"))
        .arg(dir.join("registry.json"))
        .arg(dir.join("store"))
        .arg(repeats.to_string())
        .arg(dir.join("client_ruby.prom"));
    super::run_script(command, "client_ruby_export.rb", dir, TIMEOUT)
}

impl Peer for ClientRuby {
    fn arm(&self) -> &'static str {
        self.arm
    }

    fn runs(&self, scenario: &str) -> bool {
        SCENARIOS.contains(&scenario)
    }

    fn run(&self, cx: &PeerContext<'_>) -> Result<PeerOutcome> {
        if !ruby_installed() {
            return Ok(PeerOutcome::Skipped(
                "ruby not installed (Debian: apt-get install ruby)".into(),
            ));
        }
        let Some(archive) = upstream_archive(self.archive) else {
            return Ok(PeerOutcome::Skipped(format!(
                "{} not found: set PROMLAB_UPSTREAM to the directory holding it \
                 (default: shared/upstream/ beside the repository)",
                self.archive
            )));
        };
        let dir = &cx.workdir;
        unpack(&archive, &dir.join("client_ruby"))
            .with_context(|| format!("unpacking {}", archive.display()))?;
        let store = dir.join("store");
        std::fs::create_dir_all(&store)?;
        let registry = crate::harness::workloads::write_store(&cx.size.params, &store)?;
        let files = std::fs::read_dir(&store)?.count();
        std::fs::write(dir.join("registry.json"), registry.to_json())?;
        std::fs::write(dir.join("client_ruby_export.rb"), SCRIPT)?;
        std::fs::write(dir.join("own_pid.rb"), OWN_PID)?;
        let report = run_script(dir, cx.repeats)?;
        let expected = if cx.size.expected.is_empty() {
            crate::harness::digest(&crate::harness::expected_answer(&cx.size.params)?)
        } else {
            cx.size.expected.clone()
        };
        let got = std::fs::read(dir.join("client_ruby.prom"))?;
        let digest = crate::harness::digest(&got);
        if digest != expected {
            bail!(
                "client_ruby's exposition (digest {digest}) is not the verified one ({expected})"
            );
        }
        if report.samples.is_empty() {
            bail!("client_ruby_export.rb timed no export");
        }
        let wall_ms = {
            let mut wall: Vec<u64> = report.samples.iter().map(|s| s.0).collect();
            wall.sort();
            wall[(wall.len() - 1) / 2] as f64 / 1e6
        };
        Ok(PeerOutcome::Measured(PeerResult {
            arm: self.arm.to_string(),
            measure: Measure::Cpu,
            samples: report
                .samples
                .iter()
                .map(|&(_, cpu)| Duration::from_nanos(cpu))
                .collect(),
            units: (report.lines, "lines".to_string()),
            rss_kib: Some(report.rss_kib),
            note: format!(
                "client_ruby {} (pristine, {}) in Ruby {}: Formats::Text.marshal over the same {files} store files, \
                 one process, after one untimed export whose bytes equal the verified exposition; \
                 CPU time of the Ruby process per export (median wall {wall_ms:.1} ms)",
                self.arm.trim_start_matches("peer:client_ruby-"),
                self.archive,
                report.ruby,
            ),
        }))
    }
}
