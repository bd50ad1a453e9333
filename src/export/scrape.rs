//! One scrape's aggregated values, and the grouping the renderer gets:
//! client_ruby's \`Metric#values\`.

use super::*;

/// One scrape of a metric: its series' values folded in file order, and the
/// series and groups in order of first appearance in this scrape.
#[derive(Default)]
pub(super) struct Scrape {
    /// Counts scrapes; a series or group was seen in this scrape iff its
    /// `seen` entry equals it.
    pub(super) number: u32,
    pub(super) series_seen: Vec<u32>,
    pub(super) values: Vec<Aggregate>,
    pub(super) series_order: Vec<usize>,
    /// The `series_order` the groups below were laid out from: a scrape that
    /// met the same series in the same order (a store whose files kept their
    /// entries) keeps them.
    pub(super) grouped: Vec<usize>,
    pub(super) group_seen: Vec<u32>,
    /// Per group, while grouping: how many series it has, then where its
    /// next one goes in `members`.
    pub(super) group_start: Vec<u32>,
    /// Every group's series of this scrape, group after group in
    /// `group_order`, each group's in order: one buffer, read front to back
    /// (a vector per group was a cache miss per group on a cold scrape).
    pub(super) members: Vec<usize>,
    pub(super) group_order: Vec<usize>,
    /// Per group of `group_order`: where its series are in `members`.
    pub(super) group_members: Vec<std::ops::Range<usize>>,
    /// A histogram's groups of this scrape, folded ([`Scrape::fold_histograms`]),
    /// in `group_order`; kept from scrape to scrape so a scrape allocates nothing.
    pub(super) histograms: Vec<HistogramFold>,
    /// Every group's cumulative declared buckets, back to back.
    pub(super) buckets: Vec<f64>,
    /// Every group's series of undeclared buckets (series, value), back to back.
    pub(super) others: Vec<(usize, f64)>,
}

/// One histogram group of a scrape, as client_ruby's `Metric#values` folds it.
pub(super) struct HistogramFold {
    /// Where its declared buckets start in [`Scrape::buckets`].
    pub(super) start: usize,
    /// Its undeclared buckets in [`Scrape::others`], in order of first appearance.
    pub(super) others: std::ops::Range<usize>,
    /// Where `+Inf` prints among them (see [`HistogramValue::inf_at`]).
    pub(super) inf_at: usize,
    pub(super) sum: Option<f64>,
    /// The `+Inf` count.
    pub(super) count: f64,
}

impl Scrape {
    pub(super) fn start(&mut self) {
        self.number = self.number.wrapping_add(1);
        if self.number == 0 {
            // Wrapped: forget every mark rather than trust an old one.
            self.series_seen.fill(0);
            self.group_seen.fill(0);
            self.number = 1;
        }
        self.series_order.clear();
    }

    /// Folds the staged entries of one file, in order.
    pub(super) fn add_staged(&mut self, mode: ProcessAggregation, staged: &[StagedEntry]) {
        for (series, bytes) in staged {
            let value = f64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
            let timestamp = f64::from_le_bytes(bytes[8..].try_into().expect("8 bytes"));
            self.add(*series as usize, mode, value, timestamp);
        }
    }

    #[inline]
    pub(super) fn add(
        &mut self,
        series: usize,
        mode: ProcessAggregation,
        value: f64,
        timestamp: f64,
    ) {
        if series >= self.series_seen.len() {
            self.series_seen.resize(series + 1, 0);
            self.values.resize(
                series + 1,
                Aggregate {
                    value: 0.0,
                    timestamp: 0.0,
                },
            );
        }
        if self.series_seen[series] != self.number {
            self.series_seen[series] = self.number;
            self.values[series] = Aggregate { value, timestamp };
            self.series_order.push(series);
        } else {
            self.values[series].fold(mode, value, timestamp);
        }
    }

    /// Folds each histogram group's series as client_ruby's `Metric#values`
    /// does: declared buckets by index (made cumulative, as
    /// `accumulate_buckets` does), `le="sum"`, `+Inf` (plus every declared
    /// bucket), and any other `le` in order of first appearance.
    pub(super) fn fold_histograms(&mut self, declared: usize, catalogue: &Catalogue) {
        self.histograms.clear();
        self.buckets.clear();
        self.others.clear();
        for k in 0..self.group_order.len() {
            let start = self.buckets.len();
            self.buckets.resize(start + declared, 0.0);
            let first_other = self.others.len();
            let (mut sum, mut inf) = (None, None::<(usize, f64)>);
            for at in self.group_members[k].clone() {
                let series = self.members[at];
                let value = self.values[series].value;
                match catalogue.places[series].role {
                    SlotRole::Bucket(i) => self.buckets[start + i as usize] = value,
                    SlotRole::Sum => sum = Some(value),
                    SlotRole::Inf => {
                        let at = self.others.len() - first_other;
                        inf = Some((inf.map_or(at, |(at, _)| at), value));
                    }
                    SlotRole::Count | SlotRole::Other => {
                        let le = catalogue.series[series].le();
                        match self.others[first_other..]
                            .iter_mut()
                            .find(|(other, _)| catalogue.series[*other].le() == le)
                        {
                            Some(other) => other.1 = value,
                            None => self.others.push((series, value)),
                        }
                    }
                }
            }
            let mut acc = 0.0;
            for bucket in &mut self.buckets[start..] {
                let own = *bucket;
                *bucket += acc;
                acc += own;
            }
            let (inf_at, count) = match inf {
                Some((at, value)) => (at, value + acc),
                None => (self.others.len() - first_other, acc),
            };
            self.histograms.push(HistogramFold {
                start,
                others: first_other..self.others.len(),
                inf_at,
                sum,
                count,
            });
        }
    }

    /// Groups this scrape's series, in order of first appearance, unless
    /// the last scrape grouped the same series in the same order (a series'
    /// group never changes).
    pub(super) fn group(&mut self, catalogue: &Catalogue) {
        if self.series_order == self.grouped {
            return;
        }
        self.grouped.clone_from(&self.series_order);
        self.group_order.clear();
        let groups = catalogue.groups.len();
        self.group_seen.resize(groups, 0);
        self.group_start.resize(groups, 0);
        // Count each group's series (in `group_start`), then lay the groups
        // out in order of first appearance, then place each series.
        for &series in &self.series_order {
            let group = catalogue.places[series].group;
            if self.group_seen[group] != self.number {
                self.group_seen[group] = self.number;
                self.group_start[group] = 0;
                self.group_order.push(group);
            }
            self.group_start[group] += 1;
        }
        let mut next = 0;
        self.group_members.clear();
        for &group in &self.group_order {
            let count = self.group_start[group];
            self.group_start[group] = next;
            self.group_members
                .push(next as usize..(next + count) as usize);
            next += count;
        }
        self.members.clear();
        self.members.resize(next as usize, 0);
        for &series in &self.series_order {
            let at = &mut self.group_start[catalogue.places[series].group];
            self.members[*at as usize] = series;
            *at += 1;
        }
    }
}

// ---------------------------------------------------------------------------
// What the renderer gets: client_ruby's `Metric#values`.

/// One scrape's values, grouped as client_ruby's `Metric#values` does, in
/// `buffers`' vectors.
pub(super) fn metric_values<'t>(
    def: &MetricDef,
    catalogue: &'t Catalogue,
    scrape: &'t Scrape,
    buffers: &mut ValuesBuffers,
) -> MetricValues<'t> {
    match def.kind {
        MetricType::Counter | MetricType::Gauge => {
            let mut series: Vec<(&Group, f64)> = std::mem::take(&mut buffers.scalar);
            series.extend(scrape.series_order.iter().map(|&series| {
                let group = &catalogue.groups[catalogue.places[series].group];
                (group, scrape.values[series].value)
            }));
            MetricValues::Scalar(series)
        }
        MetricType::Histogram => {
            let mut groups: Vec<HistogramValue> = std::mem::take(&mut buffers.histogram);
            groups.extend(
                scrape
                    .group_order
                    .iter()
                    .zip(&scrape.histograms)
                    .map(|(&g, fold)| HistogramValue {
                        labels: &catalogue.groups[g],
                        buckets: &scrape.buckets[fold.start..fold.start + def.buckets.len()],
                        others: scrape.others[fold.others.clone()]
                            .iter()
                            .map(|&(series, value)| (catalogue.series[series].le(), value))
                            .collect(),
                        inf_at: fold.inf_at,
                        sum: fold.sum,
                        count: fold.count,
                    }),
            );
            MetricValues::Histogram(groups)
        }
        MetricType::Summary => {
            let mut groups: Vec<SummaryValue> = std::mem::take(&mut buffers.summary);
            groups.extend(scrape.group_order.iter().zip(&scrape.group_members).map(
                |(&g, members)| {
                    let mut value = SummaryValue {
                        labels: &catalogue.groups[g],
                        sum: 0.0,
                        count: 0.0,
                    };
                    for &series in &scrape.members[members.clone()] {
                        let v = scrape.values[series].value;
                        match catalogue.places[series].role {
                            SlotRole::Sum => value.sum = v,
                            SlotRole::Count => value.count = v,
                            _ => {}
                        }
                    }
                    value
                },
            ));
            MetricValues::Summary(groups)
        }
    }
}

/// The vectors [`metric_values`] builds in, kept empty between metrics, so a
/// scrape of many small metrics does not allocate and free two vectors a
/// metric.
#[derive(Default)]
pub(super) struct ValuesBuffers {
    pub(super) scalar: Vec<(&'static Group, f64)>,
    pub(super) histogram: Vec<HistogramValue<'static>>,
    pub(super) summary: Vec<SummaryValue<'static>>,
}

impl ValuesBuffers {
    /// Takes back the vector of values rendered.
    pub(super) fn keep(&mut self, values: MetricValues<'_>) {
        match values {
            MetricValues::Scalar(v) => self.scalar = emptied(v),
            MetricValues::Histogram(v) => self.histogram = emptied(v),
            MetricValues::Summary(v) => self.summary = emptied(v),
        }
    }
}

/// `v`'s allocation, emptied, for elements of the same layout (here: the
/// same type borrowing for another lifetime). Collecting an empty vector's
/// `into_iter` through `map` reuses its allocation: the standard library
/// collects in place when the layouts match (`emptied_keeps_the_allocation`
/// checks it).
pub(super) fn emptied<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().map(|_| unreachable!("cleared")).collect()
}
