//! Where two byte strings first differ, shown as the lines around it: what every
//! equivalence check prints on a mismatch.

/// Where two outputs first differ: byte offset, line number, and that line of
/// each (at most 300 bytes), named `a_name` and `b_name`.
pub fn first_difference(a: &[u8], b: &[u8], a_name: &str, b_name: &str) -> String {
    let at = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    let line = a[..at].iter().filter(|&&c| c == b'\n').count() + 1;
    let show = |s: &[u8]| {
        let start = s[..at.min(s.len())]
            .iter()
            .rposition(|&c| c == b'\n')
            .map_or(0, |i| i + 1);
        let end = s[start..]
            .iter()
            .position(|&c| c == b'\n')
            .map_or(s.len(), |i| start + i)
            .min(start + 300);
        String::from_utf8_lossy(&s[start..end]).into_owned()
    };
    format!(
        "at byte {at} (line {line}):\n  {a_name}: {}\n  {b_name}: {}",
        show(a),
        show(b)
    )
}
