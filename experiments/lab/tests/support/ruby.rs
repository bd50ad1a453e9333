//! Ruby and client_ruby for the tests that run them: the workplace's pristine
//! client_ruby sources unpacked per revision, and its own exporter.
//! Included (`#[path]`) by tests that also include `tests/common`.

#![allow(dead_code)] // each test binary uses its own part of this module

use crate::common;
use std::path::{Path, PathBuf};
use std::process::Command;

/// client_ruby's own exporter on a store (`export.rb REGISTRY_JSON STORE_DIR [OUT]`).
pub fn export_rb() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../upstream/client_ruby/export.rb")
}

/// The shared directory when Ruby and client_ruby's sources are both there;
/// else `None`, the skip said (a failure under CI).
pub fn ruby_and_client_ruby() -> Option<PathBuf> {
    let Some(shared) = shared_dir() else {
        common::skip(
            "client_ruby sources (../shared/upstream/client_ruby-*.tar.gz beside the repository, or PROMLAB_SHARED)",
            "the shared/ directory of the workplace",
        );
        return None;
    };
    if Command::new("ruby").arg("-v").output().is_err() {
        common::skip("ruby", "apt-get install ruby");
        return None;
    }
    Some(shared)
}

/// client_ruby `revision` unpacked into `into`; its `lib/`.
pub fn client_ruby_lib(shared: &Path, revision: &str, into: &Path) -> PathBuf {
    let status = Command::new("tar")
        .arg("xzf")
        .arg(shared.join(format!("upstream/client_ruby-{revision}.tar.gz")))
        .arg("-C")
        .arg(into)
        .status()
        .unwrap();
    assert!(status.success());
    into.join(format!("client_ruby-{revision}/lib"))
}

/// The workplace's shared directory (client_ruby's sources): `PROMLAB_SHARED`,
/// or `shared/` beside the repository.
pub fn shared_dir() -> Option<PathBuf> {
    let candidates = std::env::var_os("PROMLAB_SHARED")
        .map(PathBuf::from)
        .into_iter()
        .chain([Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared")]);
    candidates
        .into_iter()
        .find(|dir| dir.join("upstream/client_ruby-5.x-uri.tar.gz").is_file())
}

/// promlab's Ruby library (`ruby/lib` of this repository), for `ruby -I`.
pub fn promlab_ruby_lib() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ruby/lib")
}
