//! The ingest half of the chain: the plan a request sequence is checked under,
//! one ingester per strategy set against the reference, and the cluster's
//! split-and-merge path.

use super::*;

/// The verify plan for a sequence of requests: per metric name, in order of
/// first appearance, one aggregation of all its series (10 s windows) and one
/// grouped by the labels of its first series but the target's, matching
/// `job="verify"` (30 s windows).
pub fn plan_for(requests: &[WriteRequest]) -> Plan {
    let mut aggregations: Vec<Aggregation> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for series in requests.iter().flat_map(|r| &r.timeseries) {
        let Some(name) = series.labels.iter().find(|l| l.name == "__name__") else {
            continue;
        };
        if !seen.insert(name.value.clone()) {
            continue;
        }
        let agg = |id: String, group_by: Vec<String>, window_secs| Aggregation {
            id,
            metric: name.value.clone(),
            matchers: Default::default(),
            group_by,
            window_secs,
            relative_accuracy: ALPHA,
            quantiles: QUANTILES.to_vec(),
        };
        aggregations.push(agg(name.value.clone(), Vec::new(), 10));
        let by: Vec<String> = series
            .labels
            .iter()
            .map(|l| l.name.clone())
            .filter(|n| n != "__name__" && !TARGET.iter().any(|(t, _)| t == n))
            .collect();
        let mut by_labels = agg(format!("{}/by", name.value), by, 30);
        by_labels.matchers.insert("job".into(), "verify".into());
        aggregations.push(by_labels);
    }
    Plan {
        lateness_secs: 5,
        keep_windows: 1 << 20,
        aggregations,
    }
}

/// What ingest gets from an exposition sequence: the scrapes, the requests as
/// sent, the same decoded for the reference, and the plan.
pub struct IngestInput {
    pub bodies: Vec<Vec<u8>>,
    /// The same requests split over [`RECEIVERS`] receivers by hashmod of
    /// every label of a series (per receiver, its requests in order).
    pub split_bodies: Vec<Vec<Vec<u8>>>,
    pub decoded: Vec<Vec<reference::ingest::Series>>,
    pub plan: Plan,
    pub samples: usize,
    /// The reference's outcome of the requests, in order.
    pub reference: reference::ingest::Outcome,
}

/// Scrapes each exposition twice, [`SCRAPE_INTERVAL_MS`] apart, and converts.
pub fn ingest_input(sequence: &[Vec<u8>]) -> Result<IngestInput> {
    let mut scrapes = Vec::new();
    for (k, exposition) in sequence.iter().enumerate() {
        let samples = scrape_to_remote_write::parse(exposition)
            .with_context(|| format!("scraping exposition {}", k + 1))?;
        for again in 0..2 {
            let t = FIRST_SCRAPE_MS + (2 * k as i64 + again) * SCRAPE_INTERVAL_MS;
            scrapes.push((t, samples.clone()));
        }
    }
    let requests = scrape_to_remote_write::requests(&scrapes, &TARGET, MAX_SAMPLES_PER_SEND);
    let plan = plan_for(&requests);
    let bodies: Vec<Vec<u8>> = requests.iter().map(scrape_to_remote_write::body).collect();
    // What was sent, as the reference reads it (the wire drops a zero's sign:
    // a double of 0 is the field's default, so `-0.0` arrives as `0.0`).
    let decoded = bodies
        .iter()
        .map(|b| reference::ingest::decode_body(b))
        .collect::<Result<Vec<_>>>()?;
    Ok(IngestInput {
        bodies,
        split_bodies: split_by_hashmod(&requests, RECEIVERS),
        reference: reference::ingest::run(&decoded, &plan),
        decoded,
        samples: requests.iter().map(|r| r.timeseries.len()).sum(),
        plan,
    })
}

/// Receivers the split-and-merge path spreads each input's series over.
pub const RECEIVERS: usize = 3;

/// Each request's series spread over `receivers` requests by Prometheus's
/// `hashmod` of every label's value (in the series' order, joined by `;`),
/// as `write_relabel_configs` on `receivers` endpoints would send them.
pub(super) fn split_by_hashmod(requests: &[WriteRequest], receivers: usize) -> Vec<Vec<Vec<u8>>> {
    let mut out = vec![Vec::new(); receivers];
    let mut joined = Vec::new();
    for request in requests {
        let mut parts = vec![WriteRequest::default(); receivers];
        for series in &request.timeseries {
            joined.clear();
            for (i, label) in series.labels.iter().enumerate() {
                if i > 0 {
                    joined.extend_from_slice(hashmod::DEFAULT_SEPARATOR);
                }
                joined.extend_from_slice(label.value.as_bytes());
            }
            let k = hashmod::hashmod(&joined, receivers as u64) as usize;
            parts[k].timeseries.push(series.clone());
        }
        for (k, part) in parts.iter().enumerate() {
            if !part.timeseries.is_empty() {
                out[k].push(scrape_to_remote_write::body(part));
            }
        }
    }
    out
}

/// The split-and-merge path: the input's series spread over
/// [`RECEIVERS`] ingesters of the ingest subset `i`, every window closed,
/// each receiver's panes written as the cluster's rows, read back and
/// merged as the cluster's query merges them, must be the single ingester's closed windows: the same
/// groups, bins, zero counts and extremes (of `0.0` and `-0.0` either may be
/// kept), and every quantile bit for bit. Returns the windows compared.
pub fn split_and_merge_check(input: &IngestInput, i: StrategySet) -> Result<usize, String> {
    let ingest = |bodies: &[Vec<u8>]| -> Result<Ingester, String> {
        let mut ingester = Ingester::new(input.plan.clone(), i).with_cache_capacity(64);
        for (n, body) in bodies.iter().enumerate() {
            ingester
                .handle(body)
                .map_err(|e| format!("request {} refused: {e}", n + 1))?;
        }
        ingester.flush();
        Ok(ingester)
    };
    let single = ingest(&input.bodies)?;
    let parts: Vec<Ingester> = input
        .split_bodies
        .iter()
        .map(|bodies| ingest(bodies))
        .collect::<Result<_, _>>()?;
    // A sample late in one receiver but not in another would make them differ
    // for a reason of time, not of bins: the inputs have none.
    let late: u64 = parts.iter().map(|p| p.totals().late).sum();
    if single.totals().late > 0 || late > 0 {
        return Err(format!(
            "late samples (single {}, split {late}): the split cannot be compared",
            single.totals().late
        ));
    }
    let mut windows = 0;
    for agg in &input.plan.aggregations {
        let want = single.closed_bins(&agg.id).expect("the plan's aggregation");
        let mut rows: BTreeMap<(i64, Vec<u8>), Vec<PaneRows>> = BTreeMap::new();
        let mut dropped: BTreeMap<i64, u64> = BTreeMap::new();
        for (k, part) in parts.iter().enumerate() {
            // Each receiver's panes written as the cluster's rows and read back as the query reads them.
            let who = Origin {
                receiver: format!("r{k}"),
                incarnation: 1,
            };
            let mut batch = Batch::default();
            for w in part.closed_bins(&agg.id).expect("the plan's aggregation") {
                *dropped.entry(w.start).or_default() += w.dropped;
                for (labels, bins) in &w.groups {
                    let key = group_key(agg, labels);
                    let pane = PaneRows::of(bins);
                    batch.pane(&who, &agg.id, w.start, &key, agg.relative_accuracy, &pane);
                }
            }
            let mut r = Reader::new(&batch.panes.buf);
            while !r.is_done() {
                let row = PaneRow::read(&mut r).map_err(|e| format!("{}: {e}", agg.id))?;
                rows.entry((row.window_start, row.group_key.to_vec()))
                    .or_default()
                    .push(row.pane);
            }
        }
        let config = promlab::ingest::bins::sketch_config(agg.relative_accuracy);
        let mut seen = 0;
        for w in &want {
            windows += 1;
            if dropped.get(&w.start).copied().unwrap_or(0) != w.dropped {
                return Err(format!(
                    "{} window {}: dropped samples differ",
                    agg.id, w.start
                ));
            }
            for (labels, bins) in &w.groups {
                let key = (w.start, group_key(agg, labels));
                let merged = rows.get(&key).map(merge_as_rows).ok_or_else(|| {
                    format!(
                        "{} window {} group {labels:?}: no receiver wrote it",
                        agg.id, w.start
                    )
                })?;
                seen += 1;
                let same = merged.positive == bins.positive
                    && merged.negative == bins.negative
                    && merged.zero_count == bins.zero_count
                    && merged.dropped == bins.dropped
                    && merged.min == bins.min
                    && merged.max == bins.max
                    && agg.quantiles.iter().all(|&q| {
                        let (a, b) = (merged.quantile(&config, q), bins.quantile(&config, q));
                        if q == 0.0 || q == 1.0 {
                            a == b
                        } else {
                            a.map(f64::to_bits) == b.map(f64::to_bits)
                        }
                    });
                if !same {
                    return Err(format!(
                        "{} window {} group {labels:?}: merged from {RECEIVERS} receivers {merged:?}, one receiver {bins:?}",
                        agg.id, w.start
                    ));
                }
            }
        }
        if seen != rows.len() {
            return Err(format!(
                "{}: the receivers wrote {} panes, one receiver has {seen}",
                agg.id,
                rows.len()
            ));
        }
    }
    Ok(windows)
}

/// Ingests under one ingest subset, checks every pane against the
/// reference, then every query path ([`query`]). Returns the panes (for the
/// bit-identity walk) and how many answers were compared.
pub fn ingest_and_check(
    input: &IngestInput,
    want: &BTreeMap<reference::ingest::PaneKey, Vec<f64>>,
    i: StrategySet,
) -> Result<(Vec<PaneReport>, usize), String> {
    let mut ingester = Ingester::new(input.plan.clone(), i).with_cache_capacity(64);
    for (n, body) in input.bodies.iter().enumerate() {
        ingester
            .handle(body)
            .map_err(|e| format!("request {} of {} refused: {e}", n + 1, input.bodies.len()))?;
    }
    let panes = ingester.snapshot();
    check_panes(&panes, want, &input.plan)?;
    let answers = query::check(&mut ingester, &input.plan, &input.reference)?;
    Ok((panes, answers))
}

/// `panes` hold exactly the reference's panes and counts (`want`, values
/// sorted), every quantile within the aggregation's α of the exact one.
pub(crate) fn check_panes(
    panes: &[PaneReport],
    want: &BTreeMap<reference::ingest::PaneKey, Vec<f64>>,
    plan: &Plan,
) -> Result<(), String> {
    if want.is_empty() {
        return Err("the reference has no pane: there is nothing to check".into());
    }
    let got: BTreeMap<reference::ingest::PaneKey, &PaneReport> = panes
        .iter()
        .map(|p| {
            (
                (p.aggregation.clone(), p.group.clone(), p.window_start_ms),
                p,
            )
        })
        .collect();
    if got.len() != panes.len() || got.keys().ne(want.keys()) {
        let missing = want.keys().find(|k| !got.contains_key(*k));
        let extra = got.keys().find(|k| !want.contains_key(*k));
        return Err(format!(
            "{} panes, the reference {} (first missing {missing:?}, first extra {extra:?})",
            panes.len(),
            want.len()
        ));
    }
    for (key, values) in want {
        let pane = got[key];
        if pane.count != values.len() as u64 {
            return Err(format!(
                "pane {key:?}: count {}, the reference {}",
                pane.count,
                values.len()
            ));
        }
        let agg = plan
            .aggregations
            .iter()
            .find(|a| a.id == key.0)
            .ok_or_else(|| format!("pane {key:?} of no aggregation of the plan"))?;
        if pane.quantile_bits.len() != agg.quantiles.len() {
            return Err(format!(
                "pane {key:?}: {} answers for {} quantiles",
                pane.quantile_bits.len(),
                agg.quantiles.len()
            ));
        }
        let params = reference::quantile::SketchParams::ingest(agg.relative_accuracy);
        for (q, bits) in agg.quantiles.iter().zip(&pane.quantile_bits) {
            let Some(bits) = bits else {
                return Err(format!("pane {key:?}: no answer at q = {q}"));
            };
            reference::quantile::check(values, *q, f64::from_bits(*bits), params)
                .map_err(|e| format!("pane {key:?} ({} values): {e}", values.len()))?;
        }
    }
    Ok(())
}
