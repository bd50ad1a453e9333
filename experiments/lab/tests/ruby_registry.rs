//! promlab's Ruby library writes the sidecar's registry from client_ruby's
//! own registry (`ruby/lib/promlab`), under client_ruby 4.2.5 and 5.x: the
//! fixtures' app registered again gives their registry.json, and with it the
//! sidecar prints the fixture's exposition; an app with every kind of metric
//! (preset labels, every gauge aggregation, integer, float and default
//! buckets, a summary, a metric registered by a worker after the fork) is
//! served byte for byte as client_ruby's own exporter prints the same store;
//! and `gem build` makes the gem.

#[path = "../../../tests/common/mod.rs"]
mod common;
#[path = "support/ruby.rs"]
mod ruby;
mod support;

use std::path::Path;
use std::process::Command;

fn app(lib: &Path, args: &[&Path]) {
    let out = Command::new("ruby")
        .arg("-I")
        .arg(lib)
        .arg("-I")
        .arg(ruby::promlab_ruby_lib())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/registry_app.rb"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "registry_app.rb {args:?}: {out:?}");
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn same(got: &[u8], want: &[u8], what: &str) {
    assert!(
        got == want,
        "{what}: {}",
        promlab::reference::first_difference::first_difference(got, want, "sidecar", "ruby")
    );
}

#[test]
fn the_written_registry_serves_what_client_ruby_prints() {
    let Some(shared) = ruby::ruby_and_client_ruby() else {
        return;
    };
    for (revision, case) in [
        ("v4.2.5", "all-types-v4.2.5"),
        ("5.x-uri", "all-types-v5-uri"),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let lib = ruby::client_ruby_lib(&shared, revision, tmp.path());

        // The fixture's app, registered again: its registry, and its exposition.
        let scratch = tmp.path().join("fixture");
        app(&lib, &[Path::new("fixture"), &scratch]);
        let written = scratch.join("registry.json");
        let fixture = common::fixtures().join("ruby-dfs").join(case);
        assert_eq!(
            json(&written),
            json(&fixture.join("registry.json")),
            "{revision}"
        );
        let out = Command::new(env!("CARGO_BIN_EXE_promlab"))
            .arg("export")
            .arg("--store")
            .arg(fixture.join("store"))
            .arg("--registry")
            .arg(&written)
            .output()
            .unwrap();
        assert!(out.status.success(), "{revision}: {out:?}");
        let expected = std::fs::read(fixture.join("expected.prom")).unwrap();
        same(&out.stdout, &expected, revision);

        // Every kind of metric, written by forked workers; served by the sidecar.
        let store = tmp.path().join("store");
        let ruby_out = tmp.path().join("ruby.prom");
        app(&lib, &[Path::new("app"), &store, &ruby_out]);
        let registry = store.join("registry.json");
        let names: Vec<String> = json(&registry)["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            names.last().map(String::as_str),
            Some("late_registered"),
            "{revision}: the worker's metric merged in: {names:?}"
        );
        let server = support::serve(&[
            "--store",
            store.to_str().unwrap(),
            "--registry",
            registry.to_str().unwrap(),
        ]);
        let scraped = support::get(server.addr, "/metrics", &[]).body;
        let want = std::fs::read(&ruby_out).unwrap();
        same(&scraped, &want, revision);
        let text = String::from_utf8(want).unwrap();
        for series in [
            "tenant_jobs_total{queue=\"q0\",tenant=\"acme\"} 15.0",
            "region_up{region=\"eu-west\"} ",
            "child_total{kind=\"sub\",path=\"/a\"} 15.0",
            "late_registered{pool=\"web\"} 7.0",
            "tiny_seconds_bucket{le=\"1.0e-06\"} 3.0",
            "payload_bytes_bucket{route=\"/a\",le=\"25000.0\"} ",
        ] {
            assert!(text.contains(series), "{revision}: no {series} in\n{text}");
        }
    }
}

/// `gem build` makes the gem, with the library, the Puma plugin and the launcher.
#[test]
fn the_gem_builds() {
    if Command::new("gem").arg("--version").output().is_err() {
        common::skip(
            "gem (RubyGems), so the gem is not built",
            "apt-get install ruby",
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let gem = tmp.path().join("promlab.gem");
    let out = Command::new("gem")
        .arg("build")
        .arg("-C")
        .arg(ruby::promlab_ruby_lib().join(".."))
        .arg("promlab.gemspec")
        .arg("--output")
        .arg(&gem)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let files = Command::new("gem")
        .args(["spec"])
        .arg(&gem)
        .arg("files")
        .output()
        .unwrap();
    let files = String::from_utf8(files.stdout).unwrap();
    for file in [
        "lib/promlab.rb",
        "lib/promlab/registry_file.rb",
        "lib/promlab/sidecar.rb",
        "lib/puma/plugin/promlab.rb",
        "exe/promlab-sidecar",
    ] {
        assert!(files.contains(file), "{file} not in the gem: {files}");
    }
}
