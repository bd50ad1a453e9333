//! Render peers: the Rust crates a Rust exporter would use instead of
//! promlab's renderer — `prometheus-client` (the Prometheus project's crate,
//! OpenMetrics text) and `prometheus` (rust-prometheus, text format 0.0.4) —
//! holding the same families and series as RabbitMQ's per-object scenario, with
//! the same values, encoding them to text the way their users do.
//!
//! The registries are built once (untimed); a run is one encode (or gather and
//! encode) into a reused buffer, as our render arms reuse theirs. The same
//! construction serves `benches/render.rs`.

use super::{Measure, Peer, PeerContext, PeerOutcome, PeerResult};
use crate::harness::Generator;
use anyhow::{bail, Context, Result};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use promlab::format::registry::MetricType;
use promlab::render::live::SeriesId;
use promlab::scenarios::rabbitmq::RabbitMqNode;
use promlab::shared::strategy::StrategySet;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

/// A series' labels as owned strings (both crates key series by strings).
fn labels_of(s: &RabbitMqNode, id: SeriesId) -> Result<Vec<(String, String)>> {
    let reg = s.registry();
    reg.label_names(id.family)
        .zip(reg.label_values(id))
        .map(|(k, v)| {
            let v = String::from_utf8(v.to_vec()).context("a label value is not UTF-8")?;
            Ok((k.to_owned(), v))
        })
        .collect()
}

fn series_of(
    s: &RabbitMqNode,
    f: promlab::render::live::FamilyId,
) -> impl Iterator<Item = SeriesId> {
    (0..s.registry().values(f).len() as u32).map(move |index| SeriesId { family: f, index })
}

/// The scenario's families in a `prometheus-client` registry, same values.
pub fn prometheus_client_registry(
    s: &RabbitMqNode,
) -> Result<prometheus_client::registry::Registry> {
    let mut registry = prometheus_client::registry::Registry::default();
    let reg = s.registry();
    for f in reg.family_ids() {
        let name = reg.family_name(f);
        let help = reg.family_help(f);
        match reg.family_kind(f) {
            MetricType::Counter => {
                let family = Family::<Vec<(String, String)>, Counter<f64, AtomicU64>>::default();
                // The crate appends `_total` to counter names itself.
                registry.register(
                    name.strip_suffix("_total").unwrap_or(name),
                    help,
                    family.clone(),
                );
                for id in series_of(s, f) {
                    family.get_or_create(&labels_of(s, id)?).inc_by(reg.get(id));
                }
            }
            _ => {
                let family = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
                registry.register(name, help, family.clone());
                for id in series_of(s, f) {
                    family.get_or_create(&labels_of(s, id)?).set(reg.get(id));
                }
            }
        }
    }
    Ok(registry)
}

/// The scenario's families in a `prometheus` (rust-prometheus) registry, same values.
pub fn prometheus_registry(s: &RabbitMqNode) -> Result<prometheus::Registry> {
    let registry = prometheus::Registry::new();
    let reg = s.registry();
    for f in reg.family_ids() {
        let opts = prometheus::Opts::new(reg.family_name(f), reg.family_help(f));
        let label_names: Vec<&str> = reg.label_names(f).collect();
        match reg.family_kind(f) {
            MetricType::Counter => {
                let vec = prometheus::CounterVec::new(opts, &label_names)?;
                registry.register(Box::new(vec.clone()))?;
                for id in series_of(s, f) {
                    let labels = labels_of(s, id)?;
                    let values: Vec<&str> = labels.iter().map(|(_, v)| v.as_str()).collect();
                    vec.with_label_values(&values).inc_by(reg.get(id));
                }
            }
            _ => {
                let vec = prometheus::GaugeVec::new(opts, &label_names)?;
                registry.register(Box::new(vec.clone()))?;
                for id in series_of(s, f) {
                    let labels = labels_of(s, id)?;
                    let values: Vec<&str> = labels.iter().map(|(_, v)| v.as_str()).collect();
                    vec.with_label_values(&values).set(reg.get(id));
                }
            }
        }
    }
    Ok(registry)
}

/// Checks a crate's exposition against the scenario: one sample line per
/// series, and the same values (their sum, to a relative 1e-9: the crates
/// print floats their own way). Returns the number of lines.
pub fn check_exposition(text: &[u8], s: &RabbitMqNode, who: &str) -> Result<u64> {
    let text = std::str::from_utf8(text).with_context(|| format!("{who} printed non-UTF-8"))?;
    let (mut samples, mut sum) = (0usize, 0.0f64);
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        // Label values are escaped (no raw newline), so the value is the last field.
        let value = line.rsplit(' ').next().unwrap_or_default();
        sum += value
            .parse::<f64>()
            .with_context(|| format!("{who}: no value in `{line}`"))?;
        samples += 1;
    }
    let reg = s.registry();
    let (mut expected, mut magnitude) = (0.0f64, 0.0f64);
    for f in reg.family_ids() {
        for v in reg.values(f) {
            expected += v;
            magnitude += v.abs();
        }
    }
    if samples != s.series_count() {
        bail!(
            "{who} printed {samples} samples, promlab has {} series",
            s.series_count()
        );
    }
    if (sum - expected).abs() > 1e-9 * magnitude.max(1.0) {
        bail!("{who}'s values sum to {sum}, promlab's to {expected}");
    }
    Ok(text.bytes().filter(|&b| b == b'\n').count() as u64)
}

/// Times `encode` (which clears and fills `out`) `repeats` times after one
/// untimed warm-up; returns the samples and the output's line count, checked.
fn measure<B: Default + AsRef<[u8]>>(
    s: &RabbitMqNode,
    who: &str,
    repeats: usize,
    mut encode: impl FnMut(&mut B) -> Result<()>,
) -> Result<(Vec<Duration>, u64)> {
    let mut out = B::default();
    encode(&mut out)?;
    let lines = check_exposition(out.as_ref(), s, who)?;
    let mut samples = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let start = Instant::now();
        encode(&mut out)?;
        samples.push(start.elapsed());
        std::hint::black_box(out.as_ref().len());
    }
    Ok((samples, lines))
}

/// The scenario at the context's size, as our baseline arm holds it.
fn scenario(cx: &PeerContext<'_>) -> Result<RabbitMqNode> {
    let Generator::Rabbitmq {
        queues,
        awkward_names,
    } = cx.size.params
    else {
        anyhow::bail!("generator {:?} is not rabbitmq", cx.size.params);
    };
    RabbitMqNode::build(queues, awkward_names, StrategySet::NONE)
}

const RENDER_SCENARIO: &str = "rabbitmq-per-object";

/// `prometheus-client` (the Prometheus project's Rust crate).
pub struct PrometheusClientCrate;

impl Peer for PrometheusClientCrate {
    fn arm(&self) -> &'static str {
        "peer:crate-prometheus-client"
    }

    fn runs(&self, scenario: &str) -> bool {
        scenario == RENDER_SCENARIO
    }

    fn run(&self, cx: &PeerContext<'_>) -> Result<PeerOutcome> {
        let s = scenario(cx)?;
        let registry = prometheus_client_registry(&s)?;
        let (samples, lines) = measure(&s, self.arm(), cx.repeats, |text: &mut String| {
            text.clear();
            prometheus_client::encoding::text::encode(text, &registry)?;
            Ok(())
        })?;
        Ok(in_process(self.arm(), samples, lines, format!(
            "prometheus-client {PROMETHEUS_CLIENT_VERSION} in-process (RSS not attributed): OpenMetrics text (counters get `_total` appended, `# EOF`), its own float format; series in a Family hash map keyed by owned label strings"
        )))
    }
}

/// `prometheus` (rust-prometheus, the TiKV crate).
pub struct PrometheusCrate;

impl Peer for PrometheusCrate {
    fn arm(&self) -> &'static str {
        "peer:crate-prometheus"
    }

    fn runs(&self, scenario: &str) -> bool {
        scenario == RENDER_SCENARIO
    }

    fn run(&self, cx: &PeerContext<'_>) -> Result<PeerOutcome> {
        let s = scenario(cx)?;
        let registry = prometheus_registry(&s)?;
        let encoder = prometheus::TextEncoder::new();
        let (samples, lines) = measure(&s, self.arm(), cx.repeats, |out: &mut Vec<u8>| {
            out.clear();
            // A scrape gathers (snapshots every series into protobuf-shaped
            // structs, sorted) and then encodes: both are the crate's cost.
            prometheus::Encoder::encode(&encoder, &registry.gather(), out)?;
            Ok(())
        })?;
        Ok(in_process(self.arm(), samples, lines, format!(
            "prometheus {PROMETHEUS_VERSION} in-process (RSS not attributed): gather() copies every series into MetricFamily structs and sorts them, then TextEncoder (format 0.0.4) prints them with its own float format"
        )))
    }
}

/// A crate's measured renders: wall time, lines, no RSS of its own (it runs in
/// promlab's process).
fn in_process(
    arm: &str,
    samples: Vec<std::time::Duration>,
    lines: u64,
    note: String,
) -> PeerOutcome {
    PeerOutcome::Measured(PeerResult {
        arm: arm.to_string(),
        measure: Measure::Wall,
        samples,
        units: (lines, "lines".to_string()),
        rss_kib: None,
        note,
    })
}

/// The crates' versions, as Cargo.toml pins them (for the notes).
const PROMETHEUS_CLIENT_VERSION: &str = "0.26";
const PROMETHEUS_VERSION: &str = "0.14";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_check_accepts_each_crate_and_rejects_a_changed_value() {
        let s = RabbitMqNode::build(3, true, StrategySet::NONE).unwrap();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(
            &mut text,
            &prometheus_client_registry(&s).unwrap(),
        )
        .unwrap();
        let lines = check_exposition(text.as_bytes(), &s, "prometheus-client").unwrap();
        assert_eq!(lines as usize, text.lines().count());

        let mut out = Vec::new();
        let registry = prometheus_registry(&s).unwrap();
        prometheus::Encoder::encode(
            &prometheus::TextEncoder::new(),
            &registry.gather(),
            &mut out,
        )
        .unwrap();
        check_exposition(&out, &s, "prometheus").unwrap();

        // One value off: caught by the sum; one sample dropped: caught by the count.
        let at = text.find("} ").unwrap() + 2;
        let changed = format!("{}1{}", &text[..at], &text[at..]);
        assert!(check_exposition(changed.as_bytes(), &s, "x").is_err());
        let first_sample = text.lines().position(|l| !l.starts_with('#')).unwrap();
        let dropped: String = text
            .lines()
            .enumerate()
            .filter(|&(i, _)| i != first_sample)
            .map(|(_, l)| format!("{l}\n"))
            .collect();
        assert!(check_exposition(dropped.as_bytes(), &s, "x").is_err());
    }
}
