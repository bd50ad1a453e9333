//! Numbers as the reports print them, shared by the report's writers
//! (`dossier`, `profiles`), so neither depends on the other for them.

pub(super) fn per_unit(ns: f64) -> String {
    if ns >= 100.0 {
        format!("{ns:.0}")
    } else {
        format!("{ns:.1}")
    }
}

/// A duration in nanoseconds, readably: `1.23 s`, `4.56 ms`, `7.8 µs`, `9 ns`.
pub fn duration(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// Bytes as MiB, one decimal.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// A ratio as the reports print it: two decimals below 10, one below 100,
/// whole numbers with thousands separators above (`1.15×`, `23.4×`, `4,983×`).
pub fn ratio(x: f64) -> String {
    if x < 10.0 {
        format!("{x:.2}×")
    } else if x < 100.0 {
        format!("{x:.1}×")
    } else {
        format!("{}×", thousands(x.round() as u64))
    }
}

/// A whole number with thousands separators (`50,400`).
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let groups: Vec<&str> = digits
        .as_bytes()
        .rchunks(3)
        .rev()
        .map(|group| std::str::from_utf8(group).expect("ASCII digits"))
        .collect();
    groups.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_the_reports_print_them() {
        assert_eq!(ratio(1.154), "1.15×");
        assert_eq!(ratio(23.44), "23.4×");
        assert_eq!(ratio(4983.1), "4,983×");
        assert_eq!(thousands(987_846), "987,846");
        assert_eq!(thousands(7), "7");
        assert_eq!(duration(33_432.0), "33.4 µs");
        assert_eq!(duration(7_156_820.0), "7.16 ms");
        assert_eq!(per_unit(15.905), "15.9");
    }
}
