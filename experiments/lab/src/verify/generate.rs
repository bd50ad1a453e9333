//! Generated inputs for `promlab verify`: a registry with every metric type and
//! aggregation mode, writers in both key dialects (a rolling upgrade), label
//! values with everything that needs escaping somewhere, and values from
//! `-0.0` and subnormals to `1e20` and `Infinity` — deterministic in a seed.

use super::Case;
use promlab::format::formenc::Dialect;
use promlab::format::registry::Registry;
use promlab::ingest::feed::splitmix64;
use promlab::scenarios::op_log::{Op, OpKind, OpLog, OpValue};

/// How big a generated case is.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    pub processes: usize,
    pub ops_per_process: usize,
    /// Distinct label values in the pool (beyond the awkward ones).
    pub extra_values: usize,
}

const REGISTRY: &str = r#"{"metrics": [
  {"name": "requests_total", "type": "counter", "help": "Requests.\nSecond line with \\ and \"quotes\"",
   "labels": ["path", "code"], "aggregation": "sum"},
  {"name": "workers_busy", "type": "gauge", "help": "Busy workers", "labels": ["pool"], "aggregation": "all"},
  {"name": "queue_depth", "type": "gauge", "help": "Depth", "labels": ["queue"], "aggregation": "sum"},
  {"name": "memory_peak_bytes", "type": "gauge", "help": "Peak", "labels": [], "aggregation": "max"},
  {"name": "free_slots", "type": "gauge", "help": "", "labels": [], "aggregation": "min"},
  {"name": "last_deploy", "type": "gauge", "help": "Last", "labels": ["env"], "aggregation": "most_recent"},
  {"name": "latency_seconds", "type": "histogram", "help": "Latency", "labels": ["route"],
   "aggregation": "sum", "buckets": ["1.0e-06", "0.005", "0.1", "1", "10", "25000.0"]},
  {"name": "tiny_seconds", "type": "histogram", "help": "Tiny", "labels": [], "aggregation": "sum"},
  {"name": "job_seconds", "type": "summary", "help": "Jobs", "labels": ["job", "zone"], "aggregation": "sum"}
]}"#;

/// Label values that need escaping somewhere (form keys, exposition, protobuf).
pub const AWKWARD: [&str; 14] = [
    "",
    "plain",
    "with space",
    "a&b=c",
    "100% sure+",
    "tilde~star*",
    "café 日本",
    "quote\"back\\slash",
    "new\nline",
    "semi;colon,comma",
    "/api/v1/users/{id}?q=1#frag",
    "trailing space ",
    "\\n not a newline",
    "{}=\",",
];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(1);
        splitmix64(self.0)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Log-uniform over [lo, hi).
    fn log_uniform(&mut self, lo: f64, hi: f64) -> f64 {
        (lo.ln() + self.unit() * (hi.ln() - lo.ln())).exp()
    }
}

/// The registry of generated cases: every metric type and aggregation mode.
pub fn registry() -> Registry {
    Registry::from_json(REGISTRY).expect("built-in registry")
}

/// The choices behind one op (any values give a valid op for [`registry`]).
#[derive(Clone, Copy, Debug)]
pub struct Pick {
    pub kind: usize,
    pub labels: [usize; 2],
    pub value: f64,
    pub choice: usize,
}

/// The op of `pick` for process `pid`, label values drawn from `pool` (not empty).
pub fn op(pid: u32, pick: Pick, pool: &[String]) -> Op {
    let op = |metric: &str, op: OpKind, value: f64, labels: Vec<(&str, String)>| Op {
        pid,
        metric: metric.to_string(),
        op,
        value: OpValue::new(value),
        labels: labels
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    };
    let value = |i: usize| pool[pool_index(i, pool.len())].clone();
    let v = pick.value;
    let finite = if v.is_finite() { v } else { 1.0 };
    let c = pick.choice;
    match pick.kind % 10 {
        0 | 1 => {
            let code = ["200", "404", "500"][c % 3].to_string();
            op(
                "requests_total",
                OpKind::Inc,
                finite.abs(),
                vec![("path", value(pick.labels[0])), ("code", code)],
            )
        }
        2 => {
            let kind = [OpKind::Inc, OpKind::Dec, OpKind::Set][c % 3];
            op(
                "workers_busy",
                kind,
                v,
                vec![("pool", value(pick.labels[0]))],
            )
        }
        3 => op(
            "queue_depth",
            OpKind::Inc,
            finite,
            vec![("queue", value(pick.labels[0]))],
        ),
        4 => op("memory_peak_bytes", OpKind::Set, v, vec![]),
        5 => op("free_slots", OpKind::Set, v, vec![]),
        6 => op(
            "last_deploy",
            OpKind::Set,
            v,
            vec![("env", value(pick.labels[0]))],
        ),
        // NaN too: Ruby's `bsearch` finds no bucket for it, so it counts in `+Inf`.
        7 => op(
            "latency_seconds",
            OpKind::Observe,
            v,
            vec![("route", value(pick.labels[0]))],
        ),
        8 => op("tiny_seconds", OpKind::Observe, finite * 1e-3, vec![]),
        _ => {
            let kind = if c.is_multiple_of(6) {
                OpKind::Init
            } else {
                OpKind::Observe
            };
            let zone = ["", "eu", "us"][c % 3].to_string();
            op(
                "job_seconds",
                kind,
                finite,
                vec![("job", value(pick.labels[0])), ("zone", zone)],
            )
        }
    }
}

fn pool_index(i: usize, len: usize) -> usize {
    i % len.max(1)
}

/// The ops every process starts with: registering unlabeled metrics writes their zero series.
pub fn registration(pid: u32) -> Vec<Op> {
    ["memory_peak_bytes", "free_slots", "tiny_seconds"]
        .into_iter()
        .map(|m| Op {
            pid,
            metric: m.to_string(),
            op: OpKind::Init,
            value: OpValue::new(0.0),
            labels: Vec::new(),
        })
        .collect()
}

/// A value from `-0.0` and subnormals to `1e20`, `±Infinity` and `NaN`.
fn awkward_value(rng: &mut Rng) -> f64 {
    let v = match rng.below(12) {
        0 => 0.0,
        1 => -0.0,
        2 => 1e20,
        3 => 5e-324,
        4 => (1u64 << 60) as f64,
        5 => 0.1,
        _ => rng.log_uniform(1e-7, 1e7),
    };
    match rng.below(24) {
        0 => f64::INFINITY,
        1 => f64::NEG_INFINITY,
        2 => f64::NAN,
        3..=5 => -v,
        _ => v,
    }
}

/// An in-memory registry's families from `seed`, for the live renderer: a
/// counter and a gauge labelled with every awkward value (and non-UTF-8
/// bytes), an unlabeled gauge, help with `\` and newlines; values as the
/// generated cases draw them.
pub fn live_families(seed: u64) -> Vec<promlab::reference::live::Family> {
    use promlab::format::registry::MetricType;
    use promlab::reference::live::Family;
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x11fe);
    let mut values: Vec<Vec<u8>> = AWKWARD.iter().map(|s| s.as_bytes().to_vec()).collect();
    values.push(vec![0xff, 0xc3, b'"']);
    let mut pairs = Vec::new();
    for a in &values {
        for b in ["200", "404"] {
            pairs.push((
                vec![a.clone(), b.as_bytes().to_vec()],
                awkward_value(&mut rng).abs(),
            ));
        }
    }
    let gauges = values
        .iter()
        .map(|v| (vec![v.clone()], awkward_value(&mut rng)))
        .collect();
    vec![
        Family {
            name: "http_requests_total".into(),
            kind: MetricType::Counter,
            help: "Requests.\nSecond line with \\ and \"quotes\"".into(),
            label_names: vec!["path".into(), "code".into()],
            series: pairs,
        },
        Family {
            name: "queue_depth".into(),
            kind: MetricType::Gauge,
            help: "Depth é".into(),
            label_names: vec!["queue".into()],
            series: gauges,
        },
        Family {
            name: "up".into(),
            kind: MetricType::Gauge,
            help: String::new(),
            label_names: Vec::new(),
            series: vec![(Vec::new(), awkward_value(&mut rng))],
        },
    ]
}

/// A case from `seed`.
pub fn case(seed: u64, size: Size) -> Case {
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut pool: Vec<String> = AWKWARD.iter().map(|s| s.to_string()).collect();
    pool.extend((0..size.extra_values).map(|i| format!("v{i}-{}", seed % 97)));
    let processes = (0..size.processes)
        .map(|p| {
            let pid = 31_000 + p as u32 * 7;
            // Alternate dialects: a store written during a rolling upgrade.
            let dialect = if p % 2 == 0 {
                Dialect::Uri
            } else {
                Dialect::Cgi
            };
            let mut ops = registration(pid);
            for _ in 0..size.ops_per_process {
                let value = awkward_value(&mut rng);
                let pick = Pick {
                    kind: rng.below(10),
                    labels: [rng.below(pool.len()), rng.below(pool.len())],
                    value,
                    choice: rng.below(6),
                };
                ops.push(op(pid, pick, &pool));
            }
            (dialect, OpLog { pid, ops })
        })
        .collect();
    Case {
        name: format!("generated-{seed}"),
        registry: registry(),
        processes,
        ruby: None,
        export_each_writer: true,
    }
}
