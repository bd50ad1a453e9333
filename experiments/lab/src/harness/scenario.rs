//! Scenarios as typed data: a generator and its parameters at two sizes,
//! each with the digest of the answer every strategy combination must give.

use anyhow::{bail, Context, Result};
use promlab::shared::strategy::Stage;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One workload, as a scenario file describes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    pub description: String,
    pub quick: Size,
    pub full: Size,
}

/// The generator's parameters at one size, and the answer to expect.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Size {
    /// Which generator builds the workload, with its parameters.
    pub params: Generator,
    /// How many timed rounds (each runs every arm once).
    pub repeats: usize,
    /// SHA-256 (hex) of the output every strategy combination must produce.
    pub expected: String,
}

/// A workload generator and its parameters (`params = { generator = "asap", groups = 50, … }`).
/// It serializes back to the same form (`promlab arm-rss --params` takes it as JSON).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(tag = "generator", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Generator {
    /// Write: `steps` × (histogram observe + counter increment), 195-character label.
    LongLabel { steps: usize },
    /// Export: the slow-export report's repro, written by promlab's writer.
    SeedRepro { processes: usize, statements: usize },
    /// Export: the larger case, generated.
    Large {
        processes: usize,
        statements: usize,
        max_len: usize,
    },
    /// Export: a store client_ruby wrote (a fixture case), with Ruby's exposition.
    RubyStore { case: String },
    /// Export: a small store client_ruby wrote (`all-types-*`) cloned under
    /// new pids, `processes` writer processes ([`clones`]): client_ruby#143's
    /// directory of exited workers' files.
    RubyClones { case: String, processes: usize },
    /// Export: `metrics` counters × `processes` processes, one entry per file,
    /// written by promlab's writer ([`promlab::scenarios::store_workloads::many_metrics`]).
    ManyMetrics { metrics: usize, processes: usize },
    /// Render: RabbitMQ's per-object scrape of `queues` queues.
    Rabbitmq {
        queues: usize,
        #[serde(default)]
        awkward_names: bool,
    },
    /// Ingest: the feeder's workload, `ticks` seconds of it.
    Asap {
        groups: u64,
        series_per_group: u64,
        ticks: u64,
    },
    /// Ingest: the feeder's workload with series churn: every tick,
    /// `new_series_per_tick` of its series (taken in turn) are replaced by new
    /// ones in the same groups ([`workloads::churn_bodies`]).
    AsapChurn {
        groups: u64,
        series_per_group: u64,
        ticks: u64,
        new_series_per_tick: u64,
    },
    /// Ingest across cores: the feeder's workload through a laned ingester of
    /// `lanes` lanes, fed by as many threads at once (`workloads::Laned`).
    AsapLanes {
        groups: u64,
        series_per_group: u64,
        ticks: u64,
        lanes: usize,
    },
    /// Ingest: the requests a real Prometheus sent, `passes` times over.
    PrometheusCaptures { passes: usize },
    /// Query: the quantiles of every group's last closed window, after the
    /// feeder's workload (`ticks` seconds of it) was ingested.
    AsapQuery {
        groups: u64,
        series_per_group: u64,
        ticks: u64,
    },
}

impl Generator {
    /// The stage whose seam the generated workload runs.
    pub fn stage(&self) -> Stage {
        match self {
            Generator::LongLabel { .. } => Stage::Write,
            Generator::Rabbitmq { .. } => Stage::Render,
            Generator::SeedRepro { .. }
            | Generator::Large { .. }
            | Generator::RubyStore { .. }
            | Generator::RubyClones { .. }
            | Generator::ManyMetrics { .. } => Stage::Export,
            Generator::Asap { .. }
            | Generator::AsapChurn { .. }
            | Generator::AsapLanes { .. }
            | Generator::PrometheusCaptures { .. }
            | Generator::AsapQuery { .. } => Stage::Ingest,
        }
    }
}

impl Scenario {
    /// The stage of the scenario's generator (the same at both sizes: [`load_scenario`] checks).
    pub fn stage(&self) -> Stage {
        self.quick.params.stage()
    }

    pub fn size(&self, quick: bool) -> &Size {
        if quick {
            &self.quick
        } else {
            &self.full
        }
    }
}

/// The scenarios that ship with promlab (`experiments/scenarios/`), in run order.
pub const BUILT_IN: [(&str, &str); 11] = [
    (
        "write-long-label",
        include_str!("../../../scenarios/write-long-label.toml"),
    ),
    (
        "seed-repro",
        include_str!("../../../scenarios/seed-repro.toml"),
    ),
    ("large", include_str!("../../../scenarios/large.toml")),
    (
        "large-ruby",
        include_str!("../../../scenarios/large-ruby.toml"),
    ),
    (
        "many-processes",
        include_str!("../../../scenarios/many-processes.toml"),
    ),
    (
        "many-processes-5k",
        include_str!("../../../scenarios/many-processes-5k.toml"),
    ),
    (
        "many-metrics",
        include_str!("../../../scenarios/many-metrics.toml"),
    ),
    (
        "rabbitmq-per-object",
        include_str!("../../../scenarios/rabbitmq-per-object.toml"),
    ),
    ("asap-1e5", include_str!("../../../scenarios/asap-1e5.toml")),
    (
        "prometheus-captures",
        include_str!("../../../scenarios/prometheus-captures.toml"),
    ),
    (
        "asap-query",
        include_str!("../../../scenarios/asap-query.toml"),
    ),
];

/// A definition, parsed: a built-in one by name, else the file at that path
/// (scenarios here, scaling axes in `scale`). `what` names the kind of
/// definition in errors, `or` the other ways to name one.
pub(super) fn load_definition<T: serde::de::DeserializeOwned>(
    name_or_path: &str,
    built_in: &[(&str, &str)],
    what: &str,
    or: &str,
) -> Result<T> {
    let text = match built_in.iter().find(|(name, _)| *name == name_or_path) {
        Some((_, text)) => text.to_string(),
        None if Path::new(name_or_path).is_file() => std::fs::read_to_string(name_or_path)?,
        None => {
            let names: Vec<&str> = built_in.iter().map(|(n, _)| *n).collect();
            bail!(
                "unknown {what} `{name_or_path}` (built in: {}; {or})",
                names.join(", ")
            )
        }
    };
    toml::from_str(&text).with_context(|| format!("{what} {name_or_path} does not parse"))
}

/// A built-in scenario by name, or a scenario file by path.
pub fn load_scenario(name_or_path: &str) -> Result<Scenario> {
    let scenario: Scenario = load_definition(
        name_or_path,
        &BUILT_IN,
        "scenario",
        "or a path to a .toml file",
    )?;
    if scenario.quick.params.stage() != scenario.full.params.stage() {
        bail!(
            "scenario {name_or_path}: its quick size runs the {} stage but its full size the {}",
            scenario.quick.params.stage(),
            scenario.full.params.stage()
        );
    }
    Ok(scenario)
}

/// The scenarios `names` names, or `defaults` when it names none.
pub fn load_scenarios(names: &[String], defaults: &[&str]) -> Result<Vec<Scenario>> {
    if names.is_empty() {
        defaults.iter().map(|n| load_scenario(n)).collect()
    } else {
        names.iter().map(|n| load_scenario(n)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_scenarios_are_typed() {
        let stages: Vec<(Stage, Stage)> = BUILT_IN
            .iter()
            .map(|(name, _)| {
                let s = load_scenario(name).unwrap();
                (s.stage(), s.full.params.stage())
            })
            .collect();
        use Stage::*;
        let expected = [
            Write, Export, Export, Export, Export, Export, Export, Render, Ingest, Ingest, Ingest,
        ];
        assert_eq!(stages, expected.map(|s| (s, s)));
        let asap = load_scenario("asap-1e5").unwrap();
        assert_eq!(
            asap.quick.params,
            Generator::Asap {
                groups: 50,
                series_per_group: 100,
                ticks: 65
            }
        );
    }

    #[test]
    fn bad_scenarios_are_errors() {
        let scenario = |quick: &str, full: &str| {
            format!("name = \"x\"\ndescription = \"d\"\n[quick]\nparams = {quick}\nrepeats = 1\nexpected = \"\"\n[full]\nparams = {full}\nrepeats = 1\nexpected = \"\"\n")
        };
        let parse = |text: String| toml::from_str::<Scenario>(&text);
        let ok = "{ generator = \"long-label\", steps = 3 }";
        assert!(parse(scenario(ok, ok)).is_ok());
        for bad in [
            "{ generator = \"long-label\" }",
            "{ generator = \"long-label\", steps = 3, extra = 1 }",
            "{ generator = \"long-label\", steps = -3 }",
            "{ generator = \"nope\", steps = 3 }",
            "{ steps = 3 }",
        ] {
            assert!(parse(scenario(bad, ok)).is_err(), "{bad}");
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mixed.toml");
        std::fs::write(
            &path,
            scenario(ok, "{ generator = \"prometheus-captures\", passes = 1 }"),
        )
        .unwrap();
        let err = load_scenario(path.to_str().unwrap()).unwrap_err();
        assert!(err.to_string().contains("stage"), "{err}");
    }
}
