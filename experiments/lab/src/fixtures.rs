//! The fixtures real software wrote that the lab's scenarios use, built into the
//! binary so that an installed `promlab` runs `ablate` and `verify` from any
//! directory (the repository's copies under `tests/fixtures/` are the source).

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// client_ruby's large store case (the slow-export report's "larger case").
const LARGE_V5_URI: &[u8] = include_bytes!("../../../tests/fixtures/ruby-dfs/large-v5-uri.tar.gz");

/// The 27 remote-write request bodies a real Prometheus 2.42 sent, in order.
pub const PROMETHEUS_CAPTURES: [&[u8]; 27] = [
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0000.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0001.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0002.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0003.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0004.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0005.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0006.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0007.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0008.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0009.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0010.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0011.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0012.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0013.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0014.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0015.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0016.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0017.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0018.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0019.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0020.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0021.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0022.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0023.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0024.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0025.bin"),
    include_bytes!("../../../tests/fixtures/remote-write/prometheus-2.42/0026.bin"),
];

/// Unpacks a packed store case client_ruby wrote into `into` and returns the
/// case's directory: `registry.json`, `store/`, `expected.prom`.
pub fn unpack_ruby_case(case: &str, into: &Path) -> Result<PathBuf> {
    let archive = match case {
        "large-v5-uri" => LARGE_V5_URI,
        other => anyhow::bail!("no packed ruby case named `{other}` (known: large-v5-uri)"),
    };
    tar::Archive::new(flate2::read::GzDecoder::new(archive))
        .unpack(into)
        .with_context(|| format!("unpacking {case} into {}", into.display()))?;
    Ok(into.join(case))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_large_case_unpacks_with_its_expected_exposition() {
        let tmp = tempfile::tempdir().unwrap();
        let case = super::unpack_ruby_case("large-v5-uri", tmp.path()).unwrap();
        assert!(case.join("expected.prom").is_file());
        assert!(case.join("registry.json").is_file());
        assert!(super::unpack_ruby_case("nope", tmp.path()).is_err());
    }
}
