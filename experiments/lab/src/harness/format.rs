//! Numbers as the reports print them, shared by the report's writers
//! (`dossier`, `profiles`), so neither depends on the other for them.

pub(super) fn per_unit(ns: f64) -> String {
    if ns >= 100.0 {
        format!("{ns:.0}")
    } else {
        format!("{ns:.1}")
    }
}
