//! The render floor ([`RenderFloor`]): prerendered text copied, each value formatted.

/// Render: the scrape's text prerendered around its values; a scrape copies
/// the text and formats each value, nothing else. The text between two values
/// (a line's newline, any comment lines, the next line's `name{labels} `) is
/// one piece, so a line costs one copy and one value: the least a scrape whose
/// values change can do.
pub struct RenderFloor {
    /// The pieces back to back: piece `i` precedes value `i`; the last, after
    /// the last value, ends the text.
    text: Vec<u8>,
    /// The end of each piece in `text` but the last (one per value).
    ends: Vec<u32>,
    values: Vec<f64>,
    lines: u64,
    /// The scrape's buffer, at its largest size (see [`RenderFloor::run`]).
    out: Vec<u8>,
    /// Whether the floor's bytes are the exposition's (every value's shortest
    /// form is the one the exposition prints).
    pub same_bytes: bool,
}

impl RenderFloor {
    /// The lines of an exposition (already verified) and their values.
    pub fn new(exposition: &[u8]) -> RenderFloor {
        let mut text = Vec::new();
        let mut ends = Vec::new();
        let mut values = Vec::new();
        for line in exposition.split_inclusive(|&b| b == b'\n') {
            let body = line.strip_suffix(b"\n").unwrap_or(line);
            let value = match body.iter().rposition(|&b| b == b' ') {
                Some(at) if !body.starts_with(b"#") => std::str::from_utf8(&body[at + 1..])
                    .ok()
                    .and_then(|v| v.parse::<f64>().ok())
                    .map(|v| (at + 1, v)),
                _ => None,
            };
            match value {
                Some((at, value)) => {
                    text.extend_from_slice(&body[..at]);
                    ends.push(u32::try_from(text.len()).expect("a scrape under 4 GiB"));
                    values.push(value);
                    text.extend_from_slice(&line[body.len()..]);
                }
                None => text.extend_from_slice(line),
            }
        }
        let lines = exposition.iter().filter(|&&b| b == b'\n').count() as u64;
        let mut floor = RenderFloor {
            text,
            ends,
            values,
            lines,
            out: Vec::new(),
            same_bytes: false,
        };
        floor.same_bytes = floor.run() == exposition;
        floor
    }

    pub fn lines(&self) -> u64 {
        self.lines
    }

    /// One scrape into the floor's own buffer.
    pub fn run(&mut self) -> &[u8] {
        let mut out = std::mem::take(&mut self.out);
        self.run_into(&mut out);
        self.out = out;
        &self.out
    }

    /// One scrape into `out` (cleared first). The ablation passes the buffer
    /// its arms scrape into, so the floor's writes meet the caches theirs do
    /// (a buffer of its own is cold after the other arms' runs).
    pub fn run_into(&mut self, out: &mut Vec<u8>) {
        out.clear();
        out.reserve(self.text.len() + self.values.len() * MAX_VALUE_LEN);
        let mut start = 0;
        let (mut ints, mut floats) = (itoa::Buffer::new(), ryu::Buffer::new());
        for (&end, &value) in self.ends.iter().zip(&self.values) {
            out.extend_from_slice(&self.text[start..end as usize]);
            start = end as usize;
            // An integral value as an integer and `.0` (what `ryu` prints for
            // it, without its general path; a cast round trip tests that
            // without libm's `trunc`); any other with `ryu`. (-0.0 is not:
            // `ryu` prints its sign.)
            if value.abs() < 1e15
                && (value as i64) as f64 == value
                && value.to_bits() != (-0.0f64).to_bits()
            {
                out.extend_from_slice(ints.format(value as i64).as_bytes());
                out.extend_from_slice(b".0");
            } else {
                out.extend_from_slice(floats.format(value).as_bytes());
            }
        }
        out.extend_from_slice(&self.text[start..]);
    }
}

/// The longest value `RenderFloor` writes: `ryu`'s longest form (24 bytes).
const MAX_VALUE_LEN: usize = 24;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_floor_copies_lines_and_formats_values() {
        let text = b"# HELP a x\n# TYPE a gauge\na{q=\"1 2\"} 3.0\nb 0.25\nc 1.0e-05\n";
        let floor = RenderFloor::new(text);
        assert_eq!(floor.lines(), 5);
        // ryu prints 1e-5 where Ruby prints 1.0e-05: not the same bytes.
        assert!(!floor.same_bytes);
        let floor = RenderFloor::new(&text[..text.len() - 10]);
        assert!(floor.same_bytes);
    }
}
