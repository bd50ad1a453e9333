//! The naive references against what real software wrote: the reference
//! exporter must print Ruby's `expected.prom` byte for byte from every
//! client_ruby store fixture, and the reference writer must give the fixture
//! stores' bytes (timestamps aside) from their op logs.

mod common;

use promlab::formenc::Dialect;
use promlab::ops::OpLog;
use promlab::reference;
use promlab::registry::Registry;
use std::path::Path;

fn assert_reference_export(case: &Path) {
    let registry = Registry::load(&case.join("registry.json")).unwrap();
    let expected = std::fs::read(case.join("expected.prom")).unwrap();
    let got = reference::exposition::export(&case.join("store"), &registry).unwrap();
    assert!(
        got == expected,
        "{}: {}",
        case.display(),
        promlab::compare::first_difference(&got, &expected, "reference", "ruby")
    );
}

#[test]
fn the_reference_exporter_prints_rubys_exposition() {
    for (case, _) in common::RUBY_CASES {
        assert_reference_export(&common::fixtures().join("ruby-dfs").join(case));
    }
    let (_tmp, large) = common::unpack_large();
    assert_reference_export(&large);
}

#[test]
fn the_reference_writer_gives_rubys_store_bytes() {
    for (case, dialect) in common::RUBY_CASES {
        let dir = common::fixtures().join("ruby-dfs").join(case);
        let registry = Registry::load(&dir.join("registry.json")).unwrap();
        let dialect: Dialect = dialect.parse().unwrap();
        let processes: Vec<(Dialect, OpLog)> = common::op_logs(&dir)
            .iter()
            .map(|p| (dialect, OpLog::load(p).unwrap()))
            .collect();
        let expected = reference::store::read_dir(&dir.join("store")).unwrap();
        let got = reference::store::files(&registry, &processes).unwrap();
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>(),
            "{case}"
        );
        for (name, bytes) in &expected {
            assert!(
                &got[name] == bytes,
                "{case}/{name}: {}",
                promlab::compare::first_difference(&got[name], bytes, "reference", "ruby")
            );
        }
    }
}
