//! The report: a table on stdout, Markdown and CSVs under `--out`, ending in
//! one line per check.

use super::exposition::Accounting;
use super::feeder::{CARDINALITY, FEEDER, PROBE, SIDECAR_PROBE, WRITE_PROBE};
use super::hostile::hostile_cases;
use super::server::ServerEnd;
use super::tally::Tally;
use super::{
    truncate, SoakArgs, INCREMENTS_PER_RUN, PHASES, REQUEST_TIMEOUT, SHUTDOWN_GRACE, WRITERS,
};
use crate::machine::{Host, BUILD};
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

pub(super) struct Report<'a> {
    pub(super) args: &'a SoakArgs,
    /// When the run started, UTC.
    pub(super) started_at: String,
    pub(super) elapsed: Duration,
    pub(super) tallies: BTreeMap<String, Tally>,
    pub(super) scrapes: BTreeMap<String, Tally>,
    pub(super) accounting: Accounting,
    pub(super) receiver: ServerEnd,
    pub(super) sidecar: ServerEnd,
    pub(super) writers: (u64, u64, Vec<String>),
    pub(super) final_scrape: Result<f64, String>,
    pub(super) churn: Vec<(String, String)>,
    pub(super) fifo_stuck: u32,
    pub(super) slow: String,
    pub(super) feed_ticks: u64,
    pub(super) cardinality_groups: u64,
    pub(super) cardinality_stop: String,
}

#[derive(serde::Serialize)]
struct RequestRow<'a> {
    server: &'a str,
    client: &'a str,
    requests: u64,
    outcomes: String,
    p99_ms: f64,
    samples_in_2xx: u64,
    expected: String,
    note: &'a str,
}

#[derive(serde::Serialize)]
struct CheckRow {
    check: String,
    result: &'static str,
    detail: String,
}

#[derive(serde::Serialize)]
struct ServerRow<'a> {
    server: &'a str,
    unexpected_exits: usize,
    peak_rss_mib: f64,
    rss_budget_mib: u64,
    shutdown: &'a str,
    exits: String,
}

impl Report<'_> {
    /// Writes the report and prints it; returns how many checks failed.
    pub(super) fn write(&self, out: &Path) -> Result<usize> {
        let cases = hostile_cases();
        let expected_of = |name: &str| {
            cases
                .iter()
                .find(|c| c.name == name)
                .map(|c| {
                    c.expected
                        .iter()
                        .map(u16::to_string)
                        .collect::<Vec<_>>()
                        .join("/")
                })
                .unwrap_or_else(|| match name {
                    FEEDER | CARDINALITY => "2xx (429 counted as dropped)".into(),
                    PROBE | SIDECAR_PROBE => "200, median ≤ 1 s, worst ≤ 2 s".into(),
                    WRITE_PROBE => "2xx, median ≤ 1 s, worst ≤ 2 s".into(),
                    _ => String::new(),
                })
        };
        let mut requests = Vec::new();
        for (name, t) in &self.tallies {
            requests.push(RequestRow {
                server: if name == SIDECAR_PROBE {
                    "sidecar"
                } else {
                    "receiver"
                },
                client: name,
                requests: t.requests(),
                outcomes: t.outcomes_text(),
                p99_ms: round2(t.p99_ms()),
                samples_in_2xx: t.samples_ok,
                expected: expected_of(name),
                note: &t.note,
            });
        }
        let phase_order = |name: &str| {
            PHASES
                .iter()
                .position(|p| *p == name)
                .unwrap_or(PHASES.len())
        };
        let mut phases: Vec<(&String, &Tally)> = self.scrapes.iter().collect();
        phases.sort_by_key(|(name, _)| phase_order(name));
        for (name, t) in &phases {
            requests.push(RequestRow {
                server: "sidecar",
                client: name,
                requests: t.requests(),
                outcomes: t.outcomes_text(),
                p99_ms: round2(t.p99_ms()),
                samples_in_2xx: 0,
                expected: format!(
                    "200; {} out of bounds, {} invalid",
                    t.out_of_bounds, t.invalid
                ),
                note: &t.note,
            });
        }
        let servers = [
            (&self.receiver, self.args.receiver_rss_budget_mib),
            (&self.sidecar, self.args.sidecar_rss_budget_mib),
        ];
        let server_rows: Vec<ServerRow> = servers
            .iter()
            .map(|(s, budget)| ServerRow {
                server: s.name,
                unexpected_exits: s.exits.len(),
                peak_rss_mib: round2(s.peak_rss_kib as f64 / 1024.0),
                rss_budget_mib: *budget,
                shutdown: match s.graceful {
                    Some(true) => "exited on SIGTERM",
                    Some(false) => "hung after SIGTERM, killed",
                    None => "not running",
                },
                exits: s.exits.join(" / "),
            })
            .collect();
        let checks = self.checks();

        let csv_out = |name: &str,
                       write: &dyn Fn(&mut csv::Writer<std::fs::File>) -> Result<()>|
         -> Result<()> {
            let path = out.join(name);
            let mut w = csv::Writer::from_path(&path)
                .with_context(|| format!("writing {}", path.display()))?;
            write(&mut w)?;
            w.flush()?;
            Ok(())
        };
        csv_out("requests.csv", &|w| {
            requests
                .iter()
                .try_for_each(|r| w.serialize(r).map_err(Into::into))
        })?;
        csv_out("servers.csv", &|w| {
            server_rows
                .iter()
                .try_for_each(|r| w.serialize(r).map_err(Into::into))
        })?;
        csv_out("checks.csv", &|w| {
            checks
                .iter()
                .try_for_each(|r| w.serialize(r).map_err(Into::into))
        })?;

        let md = self.markdown(&requests, &server_rows, &checks);
        std::fs::write(out.join("summary.md"), &md)?;
        print!("{md}");
        eprintln!("promlab soak: report in {}", out.display());
        Ok(checks.iter().filter(|c| c.result == "FAIL").count())
    }

    fn lost(&self) -> Option<(f64, f64, f64)> {
        if self.accounting.error.is_some() || !self.receiver.exits.is_empty() {
            return None;
        }
        let sent: u64 = self.tallies.values().map(|t| t.samples_ok).sum();
        let counted = self
            .accounting
            .counters
            .get("promlab_ingest_samples_total")
            .copied()
            .unwrap_or(0.0);
        let dispositions: f64 = self
            .accounting
            .counters
            .iter()
            .filter(|(k, _)| *k != "promlab_ingest_samples_total")
            .map(|(_, v)| v)
            .sum();
        Some((sent as f64, counted, sent as f64 - dispositions))
    }

    fn checks(&self) -> Vec<CheckRow> {
        let mut checks = Vec::new();
        let mut check = |name: &str, pass: bool, detail: String| {
            checks.push(CheckRow {
                check: name.to_owned(),
                result: if pass { "PASS" } else { "FAIL" },
                detail,
            })
        };
        let limit = self.args.secs as f64 + 60.0;
        check(
            "soak.completes-in-time",
            self.elapsed.as_secs_f64() <= limit,
            format!("{:.1} s (limit {limit:.0} s)", self.elapsed.as_secs_f64()),
        );
        for (s, budget) in [
            (&self.receiver, self.args.receiver_rss_budget_mib),
            (&self.sidecar, self.args.sidecar_rss_budget_mib),
        ] {
            check(
                &format!("{}.no-crash", s.name),
                s.exits.is_empty(),
                if s.exits.is_empty() {
                    "no unexpected exit".into()
                } else {
                    format!(
                        "{} unexpected exits: {}",
                        s.exits.len(),
                        truncate(&s.exits[0], 300)
                    )
                },
            );
            let peak = s.peak_rss_kib as f64 / 1024.0;
            check(
                &format!("{}.rss-within-budget", s.name),
                peak <= budget as f64,
                format!("peak RSS {peak:.1} MiB, budget {budget} MiB"),
            );
            check(
                &format!("{}.graceful-shutdown", s.name),
                s.graceful == Some(true),
                format!(
                    "SIGTERM → exit within {} s: {:?}",
                    SHUTDOWN_GRACE.as_secs(),
                    s.graceful
                ),
            );
        }
        // The receiver.
        match self.lost() {
            Some((sent, counted, lost)) => check(
                "receiver.no-lost-samples",
                lost == 0.0 && sent == counted,
                format!(
                    "samples in 2xx answers {sent}, receiver counted {counted}, accounted for by {} (dropped by reason: {}); lost {lost}",
                    self.accounting
                        .counters
                        .iter()
                        .filter(|(k, _)| *k != "promlab_ingest_samples_total")
                        .map(|(k, v)| format!("{} {v}", short(k)))
                        .collect::<Vec<_>>()
                        .join(", "),
                    self.accounting
                        .dropped_by_reason
                        .iter()
                        .map(|(reason, v)| format!("{reason} {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ),
            None => check(
                "receiver.no-lost-samples",
                false,
                format!(
                    "cannot account: {}",
                    self.accounting
                        .error
                        .clone()
                        .unwrap_or_else(|| "the receiver restarted (its counters reset)".into())
                ),
            ),
        }
        let late = self
            .accounting
            .counters
            .get("promlab_ingest_samples_late_total")
            .copied()
            .unwrap_or(0.0);
        check(
            "receiver.on-time-samples-not-late",
            late == 0.0 && self.accounting.error.is_none(),
            format!("{late} samples counted late (every client sends current timestamps; the far-future cases go in the last 20 %)"),
        );
        for name in [FEEDER, CARDINALITY] {
            let t = self.tallies.get(name);
            let five = t.map_or(0, |t| t.count(|k| k.starts_with('5')));
            let unanswered = t.map_or(0, |t| t.count(|k| k == "timeout" || k == "no answer"));
            let bad = t.map_or(0, |t| t.count(|k| !(k.starts_with('2') || k == "429")));
            check(
                &format!(
                    "receiver.good-data.{}",
                    name.split(' ').next().unwrap_or(name)
                ),
                t.is_some_and(|t| t.requests() > 0) && bad == 0,
                format!(
                    "{} requests: {}; {five} 5xx, {unanswered} unanswered",
                    t.map_or(0, Tally::requests),
                    t.map_or(String::new(), Tally::outcomes_text)
                ),
            );
        }
        for case in hostile_cases() {
            let t = self.tallies.get(case.name);
            let wrong = t.map_or(0, |t| {
                t.count(|k| {
                    !(case.expected.iter().any(|e| e.to_string() == k)
                        || case.closed_is_refusal && k == "no answer")
                })
            });
            check(
                &format!("receiver.hostile.{}", slug(case.name)),
                t.is_some_and(|t| t.requests() > 0) && wrong == 0,
                format!(
                    "expected {:?}, got {}",
                    case.expected,
                    t.map_or("no request sent".into(), Tally::outcomes_text)
                ),
            );
        }
        // Under the slow crowd a normal scrape or write is
        // answered within 1 s at the median and 2 s at worst.
        for (check_name, probe, ok_status) in [
            ("receiver.slow-clients-do-not-block", PROBE, "200"),
            (
                "receiver.slow-clients-do-not-block-writes",
                WRITE_PROBE,
                "2",
            ),
            ("sidecar.slow-clients-do-not-block", SIDECAR_PROBE, "200"),
        ] {
            let t = self.tallies.get(probe);
            let (median, worst) =
                t.map_or((0.0, 0.0), |t| (t.quantile_ms(0.5), t.quantile_ms(1.0)));
            check(
                check_name,
                t.is_some_and(|t| {
                    t.requests() > 0
                        && t.count(|k| k.starts_with(ok_status)) == t.requests()
                        && median <= 1000.0
                        && worst <= 2000.0
                }),
                format!(
                    "fresh-connection probes: {}; median {median:.0} ms, worst {worst:.0} ms; {}",
                    t.map_or("none".into(), Tally::outcomes_text),
                    self.slow
                ),
            );
        }
        // The sidecar.
        let all = |f: &dyn Fn(&Tally) -> u64| self.scrapes.values().map(f).sum::<u64>();
        let failing_phases = |f: &dyn Fn(&Tally) -> u64| {
            let mut v: Vec<String> = self
                .scrapes
                .iter()
                .filter(|(_, t)| f(t) > 0)
                .map(|(p, t)| format!("{p} {}", f(t)))
                .collect();
            v.sort();
            v.join(", ")
        };
        let five = |t: &Tally| t.count(|k| k.starts_with('5'));
        let unanswered = |t: &Tally| t.count(|k| k == "timeout");
        let refused = |t: &Tally| t.count(|k| k == "no answer");
        check(
            "sidecar.no-5xx",
            all(&five) == 0,
            format!(
                "{} of {} scrapes 5xx; by phase: {}",
                all(&five),
                all(&Tally::requests),
                failing_phases(&five)
            ),
        );
        check(
            "sidecar.scrapes-answered",
            all(&unanswered) == 0,
            format!(
                "{} scrapes unanswered within {} s; by phase: {} (and {} refused or cut off, by phase: {})",
                all(&unanswered),
                REQUEST_TIMEOUT.as_secs(),
                failing_phases(&unanswered),
                all(&refused),
                failing_phases(&refused),
            ),
        );
        let stuck = self.fifo_stuck;
        check(
            "sidecar.fifo-does-not-block",
            stuck == 0,
            format!("{stuck} scrapes found blocked opening a FIFO named like a store file (released by the suite)"),
        );
        let oob = |t: &Tally| t.out_of_bounds;
        check(
            "sidecar.good-total-within-bounds",
            all(&oob) == 0,
            format!("{} scrapes with the good counter outside what the writers had written; by phase: {}", all(&oob), failing_phases(&oob)),
        );
        let invalid = |t: &Tally| t.invalid;
        check(
            "sidecar.exposition-valid",
            all(&invalid) == 0,
            format!(
                "{} scrapes with a line Prometheus rejects; by phase: {}",
                all(&invalid),
                failing_phases(&invalid)
            ),
        );
        let (started, completed, failures) = &self.writers;
        check(
            "writers.all-runs-succeeded",
            failures.is_empty() && *completed > 0,
            format!(
                "{completed} of {started} writer runs completed; failures: {}",
                failures.first().map_or("none".into(), |f| truncate(f, 200))
            ),
        );
        let expected = completed * INCREMENTS_PER_RUN;
        check(
            "sidecar.final-total-exact",
            self.final_scrape == Ok(expected as f64),
            format!(
                "final scrape {:?}, writers wrote {expected}",
                self.final_scrape
            ),
        );
        checks
    }

    fn markdown(
        &self,
        requests: &[RequestRow],
        servers: &[ServerRow],
        checks: &[CheckRow],
    ) -> String {
        let host = Host::read();
        let mut md = String::new();
        let mut line = |s: String| {
            md.push_str(&s);
            md.push('\n');
        };
        line("# promlab soak".into());
        line(String::new());
        line(format!(
            "Started {} on {} ({} cores, {} MiB, {}), promlab {} ({}), strategies `{}`, {} s of load ({:.0} s in all).",
            self.started_at,
            host.hostname.as_deref().unwrap_or("?"),
            host.cores,
            host.memory_kib.unwrap_or(0) / 1024,
            host.cpu.as_deref().unwrap_or("?"),
            BUILD.git_revision,
            BUILD.profile,
            self.args.strategies,
            self.args.secs,
            self.elapsed.as_secs_f64()
        ));
        line(String::new());
        let failed = checks.iter().filter(|c| c.result == "FAIL").count();
        line(format!(
            "## Checks: {} passed, {failed} failed",
            checks.len() - failed
        ));
        line(String::new());
        line("| check | result | detail |".into());
        line("|---|---|---|".into());
        for c in checks {
            line(format!(
                "| {} | {} | {} |",
                c.check,
                c.result,
                md_cell(&c.detail)
            ));
        }
        line(String::new());
        line("## Servers".into());
        line(String::new());
        line("| server | unexpected exits | peak RSS (MiB) | budget (MiB) | shutdown |".into());
        line("|---|---:|---:|---:|---|".into());
        for s in servers {
            line(format!(
                "| {} | {} | {:.1} | {} | {} |",
                s.server, s.unexpected_exits, s.peak_rss_mib, s.rss_budget_mib, s.shutdown
            ));
        }
        line(String::new());
        line("## Requests".into());
        line(String::new());
        line(format!(
            "Receiver: the feeder started {} ticks of {} samples ({}× the paced asap-1e5 rate) and got {:.0} samples/s answered 2xx over the {} s; the cardinality client sent {} fresh groups and {}. Sidecar: scrapes by churn phase (the first problem seen in each).",
            self.feed_ticks,
            self.args.overload.max(1) * 100_000,
            self.args.overload,
            self.tallies.get(FEEDER).map_or(0, |t| t.samples_ok) as f64 / self.args.secs.max(1) as f64,
            self.args.secs,
            self.cardinality_groups,
            self.cardinality_stop,
        ));
        line(String::new());
        line("| server | client / phase | requests | answered | p99 (ms) | samples in 2xx | expected | last problem |".into());
        line("|---|---|---:|---|---:|---:|---|---|".into());
        for r in requests {
            line(format!(
                "| {} | {} | {} | {} | {:.2} | {} | {} | {} |",
                r.server,
                r.client,
                r.requests,
                r.outcomes,
                r.p99_ms,
                r.samples_in_2xx,
                r.expected,
                md_cell(&truncate(r.note, 160))
            ));
        }
        line(String::new());
        line("## Receiver accounting (its own /metrics at the end)".into());
        line(String::new());
        line("| counter | value |".into());
        line("|---|---:|".into());
        let sent: u64 = self.tallies.values().map(|t| t.samples_ok).sum();
        line(format!("| samples in 2xx answers (clients) | {sent} |"));
        for (k, v) in &self.accounting.counters {
            line(format!("| {k} | {v} |"));
        }
        for (reason, v) in &self.accounting.dropped_by_reason {
            line(format!(
                "| promlab_receiver_samples_dropped_total{{reason=\"{reason}\"}} | {v} |"
            ));
        }
        match self.lost() {
            Some((_, _, lost)) => line(format!("| lost (sent − accounted for) | {lost} |")),
            None => line(format!(
                "| lost | unknown: {} |",
                md_cell(
                    self.accounting
                        .error
                        .as_deref()
                        .unwrap_or("the receiver restarted")
                )
            )),
        }
        line(String::new());
        line("## Sidecar".into());
        line(String::new());
        let (started, completed, _) = &self.writers;
        line(format!(
            "{WRITERS} writer processes (`promlab replay-one`, {INCREMENTS_PER_RUN} increments a run): {completed} of {started} runs completed; final scrape {:?}, expected {}.",
            self.final_scrape,
            completed * INCREMENTS_PER_RUN
        ));
        line(String::new());
        for (phase, note) in &self.churn {
            line(format!("- {phase}: {}", md_cell(note)));
        }
        md
    }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

fn short(counter: &str) -> &str {
    counter
        .strip_prefix("promlab_ingest_samples_")
        .or_else(|| counter.strip_prefix("promlab_receiver_samples_"))
        .and_then(|s| s.strip_suffix("_total"))
        .unwrap_or(counter)
}

fn slug(name: &str) -> String {
    let mut s = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() {
            s.push(c.to_ascii_lowercase());
        } else if !s.ends_with('-') {
            s.push('-');
        }
    }
    s.trim_matches('-').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names() {
        assert_eq!(
            slug("content type application/x-protobufXYZ"),
            "content-type-application-x-protobufxyz"
        );
    }
}
