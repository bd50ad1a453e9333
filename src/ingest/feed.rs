//! The paced remote-write feeder of the seed, reproduced so runs are comparable.
//!
//! Series `n = g·S + i` (group `g`, `i`-th of `S`) has labels
//! `__name__="data", instance="i{i}", label_0="g{g}"`. Tick `t` carries, for
//! `k` in `0..samples_per_sec`, one sample of every series with index
//! `j = t·samples_per_sec + k`, timestamp `start_ms + 1000·t + k·1000/samples_per_sec`
//! and value `scale · U^(−1/shape)`, where
//! `U = ((splitmix64(seed ⊕ splitmix64(n ⊕ splitmix64(j))) >> 11) + 1) / 2^53`,
//! so any sample can be regenerated on its own. Each row (one `TimeSeries` with
//! one sample) goes into requests of `batch_rows` rows; the next tick waits
//! until every request of the previous one has returned.

use super::wire;
use anyhow::{Context, Result};
use std::ops::Range;
use std::path::Path;

/// Standard splitmix64: add the golden gamma, then the 30/27/31 shift-multiply rounds.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// What the feeder generates.
#[derive(Clone, Debug, PartialEq)]
pub struct FeedWorkload {
    pub groups: u64,
    pub series_per_group: u64,
    pub samples_per_sec: u64,
    pub pareto_shape: f64,
    pub pareto_scale: f64,
    pub seed: u64,
    pub start_ms: i64,
    pub batch_rows: usize,
}

impl FeedWorkload {
    /// The seed's benchmark workload: 1,000 groups × 100 series, 1 sample/s each.
    pub fn seed(start_ms: i64) -> Self {
        FeedWorkload {
            groups: 1000,
            series_per_group: 100,
            samples_per_sec: 1,
            pareto_shape: 1.5,
            pareto_scale: 1.0,
            seed: 42,
            start_ms,
            batch_rows: 50_000,
        }
    }

    pub fn series(&self) -> u64 {
        self.groups * self.series_per_group
    }

    pub fn samples_per_tick(&self) -> u64 {
        self.series() * self.samples_per_sec
    }

    /// The value of sample `j` of series `n`.
    pub fn value(&self, n: u64, j: u64) -> f64 {
        let bits = splitmix64(self.seed ^ splitmix64(n ^ splitmix64(j)));
        let u = ((bits >> 11) + 1) as f64 / (1u64 << 53) as f64;
        self.pareto_scale * u.powf(-1.0 / self.pareto_shape)
    }

    /// The timestamp of the `k`-th sample of tick `t`.
    pub fn timestamp(&self, t: u64, k: u64) -> i64 {
        self.start_ms + 1000 * t as i64 + (k * 1000 / self.samples_per_sec) as i64
    }

    /// Series `n`'s labels, as (name, value), in the order it sends them.
    pub fn series_labels(&self, n: u64) -> [(&'static str, String); 3] {
        let (g, i) = (n / self.series_per_group, n % self.series_per_group);
        [
            ("__name__", "data".to_string()),
            ("instance", format!("i{i}")),
            ("label_0", format!("g{g}")),
        ]
    }

    pub fn generator(&self) -> Generator {
        let labels = (0..self.series())
            .map(|n| {
                let mut out = Vec::with_capacity(48);
                for (name, value) in self.series_labels(n) {
                    wire::put_label(&mut out, name.as_bytes(), value.as_bytes());
                }
                out
            })
            .collect();
        Generator {
            workload: self.clone(),
            labels,
        }
    }
}

/// A workload with every series' label bytes encoded once.
pub struct Generator {
    pub workload: FeedWorkload,
    labels: Vec<Vec<u8>>,
}

impl Generator {
    /// Tick `t` as uncompressed `WriteRequest`s of at most `batch_rows` rows each.
    pub fn tick_raw(&self, t: u64) -> Vec<Vec<u8>> {
        self.tick_raw_of(t, |_| true)
    }

    /// [`Generator::tick_raw`] of the series `n` for which `takes(n)` holds
    /// (one of several receivers' share), in the same order.
    pub fn tick_raw_of(&self, t: u64, takes: impl Fn(u64) -> bool) -> Vec<Vec<u8>> {
        let w = &self.workload;
        let mut requests = Vec::new();
        let mut current = Vec::new();
        let mut rows = 0;
        for k in 0..w.samples_per_sec {
            let ts = w.timestamp(t, k);
            let j = t * w.samples_per_sec + k;
            for (n, labels) in self.labels.iter().enumerate() {
                if !takes(n as u64) {
                    continue;
                }
                wire::put_series_one_sample(&mut current, labels, w.value(n as u64, j), ts);
                rows += 1;
                if rows == w.batch_rows.max(1) {
                    requests.push(std::mem::take(&mut current));
                    rows = 0;
                }
            }
        }
        if rows > 0 {
            requests.push(current);
        }
        requests
    }

    /// Tick `t` as request bodies (snappy-compressed).
    pub fn tick_bodies(&self, t: u64) -> Vec<Vec<u8>> {
        self.tick_raw(t).iter().map(|r| wire::compress(r)).collect()
    }
}

/// How `feed` went.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FeedReport {
    pub ticks: u64,
    pub requests: u64,
    pub samples: u64,
    pub failed_requests: u64,
    /// Ticks that started later than their schedule because the previous one was slow.
    pub late_ticks: u64,
}

/// Writes `ticks` as files `DIR/TTTTTT-RRRR.bin` (name order = send order).
pub fn write_bodies(workload: &FeedWorkload, ticks: Range<u64>, dir: &Path) -> Result<FeedReport> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let generator = workload.generator();
    let mut report = FeedReport::default();
    for t in ticks {
        for (r, body) in generator.tick_bodies(t).iter().enumerate() {
            let path = dir.join(format!("{t:06}-{r:04}.bin"));
            std::fs::write(&path, body).with_context(|| format!("writing {}", path.display()))?;
            report.requests += 1;
        }
        report.ticks += 1;
        report.samples += workload.samples_per_tick();
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_reference_values() {
        // The first outputs of the reference generator seeded with 0 (state advances by the gamma).
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(0x9E37_79B9_7F4A_7C15), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn ticks_split_into_batches_and_values_regenerate() {
        let w = FeedWorkload {
            groups: 3,
            series_per_group: 2,
            samples_per_sec: 2,
            batch_rows: 5,
            ..FeedWorkload::seed(1_000)
        };
        let g = w.generator();
        let raw = g.tick_raw(1);
        assert_eq!(raw.len(), 3); // 12 rows in requests of 5
        let decoded: Vec<_> = raw
            .iter()
            .map(|r| wire::decode_borrowed(r).unwrap().samples)
            .collect();
        let all: Vec<_> = decoded.concat();
        assert_eq!(all.len(), 12);
        // Row 7 is k = 1, n = 1: j = 3, timestamp start + 1000 + 500.
        assert_eq!(all[7].timestamp, 2_500);
        assert_eq!(all[7].value.to_bits(), w.value(1, 3).to_bits());
        assert!(all.iter().all(|s| s.value >= 1.0));
    }
}
