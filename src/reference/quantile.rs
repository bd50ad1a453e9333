//! Exact quantiles from raw values, and the DDSketch guarantee checked naively.
//!
//! Rank definition (DDSketch's, and the crate's): for `n` values and
//! `0 ≤ q ≤ 1` the answer is the value at 0-based rank `floor(q · (n − 1))` of
//! the values sorted ascending; `q = 0` and `q = 1` are the exact minimum and
//! maximum. The guarantee: the answer is within relative error α of that value.
//! Two places where a sketch with a zero bucket and a bin limit answers
//! otherwise, both written out here from the sketch's definition rather than
//! from its code:
//! - values with `|v| ≤ min_value` fall in the zero bucket and answer `0`;
//! - with more distinct bin indexes than the bin limit `L`, the lowest bins
//!   (smallest magnitudes) of each sign are merged into the lowest kept one,
//!   `k_max − L + 1`: a value there answers as that bin, above it.

/// The value at rank `floor(q · (n − 1))` of `sorted` (ascending), `None` when empty.
pub fn exact(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * (sorted.len() as f64 - 1.0)) as usize;
    Some(sorted[rank.min(sorted.len() - 1)])
}

/// A sketch's parameters: relative accuracy, bin limit, zero-bucket bound.
#[derive(Clone, Copy, Debug)]
pub struct SketchParams {
    pub alpha: f64,
    pub max_bins: u32,
    pub min_value: f64,
}

impl SketchParams {
    /// What the ingester configures (`Aggregation::sketch_config`): α, as many
    /// bins as the normal range has keys (so no bins merge), and a zero bucket
    /// of `±0` and the subnormals — the numbers written out here, not taken
    /// from the code under test.
    pub fn ingest(alpha: f64) -> SketchParams {
        let gamma_ln = ((1.0 + alpha) / (1.0 - alpha)).ln();
        let index = |v: f64| (v.ln() / gamma_ln).floor() as i64;
        SketchParams {
            alpha,
            max_bins: (index(f64::MAX) - index(f64::MIN_POSITIVE) + 1) as u32,
            // The largest subnormal.
            min_value: f64::MIN_POSITIVE - f64::from_bits(1),
        }
    }

    /// The crate's defaults, which the ingester used before (2,048 bins, 1e-9).
    pub fn crate_defaults(alpha: f64) -> SketchParams {
        SketchParams {
            alpha,
            max_bins: 2048,
            min_value: 1e-9,
        }
    }

    fn gamma(&self) -> f64 {
        (1.0 + self.alpha) / (1.0 - self.alpha)
    }

    /// The bin index of a magnitude: `floor(log_γ |v|)`.
    fn index(&self, magnitude: f64) -> i64 {
        (magnitude.ln() / self.gamma().ln()).floor() as i64
    }
}

/// Whether a sketch fed `values` merges bins: more distinct bin indexes of
/// one sign than the bin limit.
pub fn merges_bins(values: &[f64], p: SketchParams) -> bool {
    [true, false].into_iter().any(|positive| {
        let indexes = values
            .iter()
            .filter(|v| v.abs() > p.min_value && (**v > 0.0) == positive)
            .map(|v| p.index(v.abs()));
        match (indexes.clone().min(), indexes.max()) {
            (Some(lo), Some(hi)) => hi - lo + 1 > p.max_bins as i64,
            _ => false,
        }
    })
}

/// Checks one answer of a sketch fed `sorted` (ascending, finite) at `q`.
/// `Err` says why the answer breaks the guarantee.
pub fn check(sorted: &[f64], q: f64, answer: f64, p: SketchParams) -> Result<(), String> {
    let Some(x) = exact(sorted, q) else {
        return Err("no values, but an answer".into());
    };
    let slack = 1.0 + 1e-9; // floating-point rounding in log/exp
    let within = |a: f64, x: f64| (a - x).abs() <= p.alpha * x.abs() * slack;
    if q == 0.0 || q == 1.0 {
        return if answer == x {
            Ok(())
        } else {
            Err(format!(
                "q = {q}: answer {answer:e}, exact {x:e} (the extreme is kept exactly)"
            ))
        };
    }
    if x.abs() <= p.min_value {
        return if answer == 0.0 {
            Ok(())
        } else {
            Err(format!(
                "q = {q}: exact {x:e} is in the zero bucket, answer {answer:e}"
            ))
        };
    }
    // The lowest kept bin index of x's sign: bins below it are merged into it.
    let same_sign = sorted
        .iter()
        .filter(|v| v.abs() > p.min_value && (**v > 0.0) == (x > 0.0));
    let top = same_sign
        .map(|v| p.index(v.abs()))
        .max()
        .expect("x is one of them");
    let lowest_kept = top - p.max_bins as i64 + 1;
    let k = p.index(x.abs());
    let beyond = || {
        format!(
            "q = {q}: answer {answer:e}, exact {x:e}, beyond α = {}",
            p.alpha
        )
    };
    if k > lowest_kept {
        return if within(answer, x) {
            Ok(())
        } else {
            Err(beyond())
        };
    }
    // At or below the lowest kept index (one index of margin for rounding in
    // the log): merged, the answer is that bin's value, of x's sign, no
    // smaller in magnitude than x.
    let bin_top = p.gamma().powf((lowest_kept + 2) as f64) * (1.0 + p.alpha);
    let same_sign = (answer > 0.0) == (x > 0.0);
    let merged = same_sign
        && answer.abs() >= x.abs() * (1.0 - p.alpha) / slack
        && answer.abs() <= bin_top * slack;
    if within(answer, x) || merged {
        Ok(())
    } else {
        Err(format!(
            "{} (x may be in a merged bin: lowest kept index {lowest_kept})",
            beyond()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_and_extremes() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(exact(&v, 0.0), Some(1.0));
        assert_eq!(exact(&v, 0.5), Some(2.0));
        assert_eq!(exact(&v, 0.99), Some(3.0));
        assert_eq!(exact(&v, 1.0), Some(4.0));
        assert_eq!(exact(&[], 0.5), None);
    }

    #[test]
    fn the_crate_meets_the_guarantee_with_and_without_merged_bins() {
        let p = SketchParams::crate_defaults(0.01);
        for values in [
            (1..2000).map(|i| i as f64 * 0.37).collect::<Vec<_>>(),
            (0..3000).map(|i| 1.03f64.powi(i) * 1e-8).collect(), // spans more than 2,048 bins
            (0..500)
                .map(|i| -(i as f64) * 1e-10 + 1e-3 * (i % 3) as f64)
                .collect(),
        ] {
            let mut sketch =
                sketches_ddsketch::DDSketch::new(sketches_ddsketch::Config::new(0.01, 2048, 1e-9));
            values.iter().for_each(|&v| sketch.add(v));
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            for q in [0.0, 0.01, 0.1, 0.25, 0.5, 0.9, 0.99, 1.0] {
                let answer = sketch.quantile(q).unwrap().unwrap();
                check(&sorted, q, answer, p).unwrap();
            }
        }
        assert!(check(&[1.0, 2.0, 3.0], 0.5, 2.1, p).is_err());
        assert!(merges_bins(&[1e-8, 1e20], p));
        assert!(!merges_bins(&[1e-8, 1e8, -1e-8, -1e8], p));
        // What the ingester configures merges nothing in the normal range.
        let ingest = SketchParams::ingest(0.01);
        assert!(!merges_bins(
            &[f64::MIN_POSITIVE, f64::MAX, -1e-300, -1e300],
            ingest
        ));
        assert_eq!(ingest.min_value.to_bits(), 0x000f_ffff_ffff_ffff);
    }
}
