//! The fold's plan: which files fold into which fold file, checked exact.

use super::*;

// ---------------------------------------------------------------------------
// The plan: which files fold into which fold file, checked exact.

/// A run of exited files to fold, and its fold file's name.
#[derive(Debug)]
pub(super) struct RunPlan {
    /// Indices of the files folded (consecutive in name order).
    pub(super) files: std::ops::Range<usize>,
    /// The fold file's name, placed where the run was.
    pub(super) name: Vec<u8>,
}

/// One commit of a run: some of its files, and the fold file that then holds
/// the run's aggregate from its first file to the batch's last.
#[derive(Clone, Debug)]
pub(super) struct Batch {
    /// Indices of the files this batch moves out.
    pub(super) members: std::ops::Range<usize>,
    pub(super) name: Vec<u8>,
    /// Per series: the first raw key met (file, key span), the aggregate
    /// value and timestamp; `None` when there is no entry (the files are only
    /// removed).
    pub(super) entries: Option<Vec<FoldedEntry>>,
}

/// A run's own aggregate over `files`, series in order of first appearance.
pub(super) fn run_entries(
    files: &[FileSnapshot],
    range: std::ops::Range<usize>,
    modes: &Modes,
) -> Option<Vec<FoldedEntry>> {
    let mut run = Run {
        start: range.start,
        series: Vec::new(),
        place: HashMap::new(),
    };
    for i in range {
        add_to_run(&mut run, i, &files[i], &[], modes);
    }
    (!run.series.is_empty()).then(|| {
        run.series
            .iter()
            .map(|&(_, _, agg, key)| (key, agg.value, agg.timestamp))
            .collect()
    })
}

pub(super) struct Plan {
    pub(super) runs: Vec<RunPlan>,
    /// Exited files that stay (no exact fold, no name, odd bytes).
    pub(super) left: usize,
}

/// The run being built: files `start..`, their own aggregates, and the
/// aggregates before the run of the series they touch.
pub(super) struct Run {
    pub(super) start: usize,
    /// Per series touched: (aggregate before the run, the run's aggregate,
    /// first raw key), in order of first appearance in the run.
    pub(super) series: Vec<(usize, Option<Aggregate>, Aggregate, KeyPlace)>,
    pub(super) place: HashMap<usize, usize>,
}

/// Plans one metric's batches. Walks the files in name order, keeping every
/// series' aggregate as an exporter would; a run of exited files grows file
/// by file while, for every series the new file touches, the aggregate
/// before the run folded with the run's own aggregate is bit for bit the
/// aggregate after it. Otherwise (and at a live or odd file, or the end) the
/// run closes, and is folded if it has two files or more and a name fits
/// between its neighbours (and before its second batch, `max_batch` files in).
/// `before`: per series, its aggregate over the files an exporter reads
/// before these (the per-metric files, for the one-file-per-process layout's).
pub(super) fn plan_metric(
    files: &[FileSnapshot],
    modes: &Modes,
    max_batch: usize,
    before: Vec<Option<Aggregate>>,
) -> Plan {
    let mut state = before;
    let mut plan = Plan {
        runs: Vec::new(),
        left: 0,
    };
    let mut run: Option<Run> = None;
    // The nearest file before the run that stays (its name bounds the fold
    // file's), or the fold file of the batch just before.
    let mut prev_name: Option<Vec<u8>> = None;
    for (i, file) in files.iter().enumerate() {
        let foldable = file.state == FileState::Exited;
        if let Some(open) = &run {
            if !foldable || !extends_exactly(open, file, &state, modes) {
                let closed = run.take().expect("open");
                close_run(closed, i, files, max_batch, &mut plan, &mut prev_name);
            }
        }
        if foldable && run.is_none() {
            // A file that is not exact on its own (a label set under two
            // spellings, a sum that does not associate) starts no run.
            let fresh = Run {
                start: i,
                series: Vec::new(),
                place: HashMap::new(),
            };
            if extends_exactly(&fresh, file, &state, modes) {
                run = Some(fresh);
            } else {
                plan.left += 1;
            }
        }
        match &mut run {
            Some(open) if foldable => add_to_run(open, i, file, &state, modes),
            _ => {
                if file.state == FileState::Odd {
                    plan.left += 1;
                }
                prev_name = Some(file.name.clone());
            }
        }
        // The exporter's own aggregate, over every file.
        for &(series, value, timestamp) in &file.entries {
            if series >= state.len() {
                state.resize(series + 1, None);
            }
            fold_into(&mut state[series], modes.of(series), value, timestamp);
        }
    }
    if let Some(closed) = run {
        close_run(
            closed,
            files.len(),
            files,
            max_batch,
            &mut plan,
            &mut prev_name,
        );
    }
    plan
}

pub(super) fn fold_into(
    slot: &mut Option<Aggregate>,
    mode: ProcessAggregation,
    value: f64,
    timestamp: f64,
) {
    match slot {
        Some(agg) => agg.fold(mode, value, timestamp),
        None => *slot = Some(Aggregate { value, timestamp }),
    }
}

/// Whether `file` can join `run` with every series still exact.
pub(super) fn extends_exactly(
    run: &Run,
    file: &FileSnapshot,
    state: &[Option<Aggregate>],
    modes: &Modes,
) -> bool {
    // The file's effect on the series it touches, both ways.
    let mut seq: HashMap<usize, Option<Aggregate>> = HashMap::new();
    let mut own: HashMap<usize, (Option<Aggregate>, Aggregate)> = HashMap::new();
    for &(series, value, timestamp) in &file.entries {
        let mode = modes.of(series);
        let slot = seq
            .entry(series)
            .or_insert_with(|| state.get(series).copied().flatten());
        fold_into(slot, mode, value, timestamp);
        match own.get_mut(&series) {
            Some((_, agg)) => agg.fold(mode, value, timestamp),
            None => {
                let (before, mut agg) = match run.place.get(&series) {
                    Some(&at) => (run.series[at].1, run.series[at].2),
                    None => (
                        state.get(series).copied().flatten(),
                        Aggregate { value, timestamp },
                    ),
                };
                if run.place.contains_key(&series) {
                    agg.fold(mode, value, timestamp);
                }
                own.insert(series, (before, agg));
            }
        }
    }
    own.iter().all(|(&series, (before, agg))| {
        let mode = modes.of(series);
        let mut combined = *before;
        fold_into(&mut combined, mode, agg.value, agg.timestamp);
        same(combined, seq[&series], mode)
    })
}

/// Whether two aggregates print alike and fold alike from here on.
pub(super) fn same(a: Option<Aggregate>, b: Option<Aggregate>, mode: ProcessAggregation) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => {
            a.value.to_bits() == b.value.to_bits()
                && (mode != ProcessAggregation::MostRecent
                    || a.timestamp.to_bits() == b.timestamp.to_bits())
        }
        (None, None) => true,
        _ => false,
    }
}

pub(super) fn add_to_run(
    run: &mut Run,
    index: usize,
    file: &FileSnapshot,
    state: &[Option<Aggregate>],
    modes: &Modes,
) {
    for (&(series, value, timestamp), &key) in file.entries.iter().zip(&file.keys) {
        let mode = modes.of(series);
        match run.place.get(&series) {
            Some(&at) => {
                let agg = &mut run.series[at].2;
                agg.fold(mode, value, timestamp);
                if mode != ProcessAggregation::MostRecent {
                    // Informational: the newest write folded in.
                    agg.timestamp = agg.timestamp.max(timestamp);
                }
            }
            None => {
                run.place.insert(series, run.series.len());
                run.series.push((
                    series,
                    state.get(series).copied().flatten(),
                    Aggregate { value, timestamp },
                    (index, key),
                ));
            }
        }
    }
}

/// Plans a closed run (files `run.start..end`) when it has two files or
/// more and a fold file's name fits between its neighbours.
pub(super) fn close_run(
    run: Run,
    end: usize,
    files: &[FileSnapshot],
    max_batch: usize,
    plan: &mut Plan,
    prev_name: &mut Option<Vec<u8>>,
) {
    let members = &files[run.start..end];
    // The fold file sorts before the files of the run's later batches, which
    // are still there while the first batch is its only part folded.
    let next_name = files
        .get(end.min(run.start + max_batch.max(1)))
        .map(|f| f.name.as_slice());
    let first_batch = &members[..members.len().min(max_batch.max(1))];
    let name = if members.len() >= 2 {
        fold_file_name(first_batch, prev_name.as_deref(), next_name)
    } else {
        None
    };
    match name {
        Some(name) => {
            *prev_name = Some(name.clone());
            plan.runs.push(RunPlan {
                files: run.start..end,
                name,
            });
        }
        None => {
            // A lone exited file stays (no fold file would be fewer files).
            plan.left += members.len();
            *prev_name = members.last().map(|f| f.name.clone());
        }
    }
}

/// A fold file's name for a run: strictly between `prev` and `next` (the
/// names that stay around it) so the run's place in name order is kept, and
/// with an id of [`FOLD_ID_DIGITS`] digits or more. A fold file of the run
/// keeps its name (and is replaced in one rename); otherwise a run member's
/// id followed by zeros, the first name after it in name order that no
/// process can have (in either layout: `metric_<name>___<id>.bin`,
/// `metrics___<id>.bin`).
pub(super) fn fold_file_name(
    members: &[FileSnapshot],
    prev: Option<&[u8]>,
    next: Option<&[u8]>,
) -> Option<Vec<u8>> {
    let fits = |name: &[u8]| prev.is_none_or(|p| p < name) && next.is_none_or(|n| name < n);
    if let Some(own) = members
        .iter()
        .find(|f| file_id(&f.name).is_some_and(is_fold_id))
    {
        return fits(&own.name).then(|| own.name.clone());
    }
    members.iter().find_map(|member| {
        let id = file_id(&member.name)?;
        let zeros = FOLD_ID_DIGITS.saturating_sub(id.len()).max(1);
        // The name up to its id (`metric_<name>___` or `metrics___`), the
        // id, zeros, `.bin`.
        let before_id = member.name.len() - b".bin".len() - id.len();
        let mut name = member.name[..before_id + id.len()].to_vec();
        name.resize(name.len() + zeros, b'0');
        name.extend_from_slice(b".bin");
        fits(&name).then_some(name)
    })
}

/// Names to put a source back under when a file was created at its own
/// name since its batch committed (a new process given the dead one's pid),
/// best first. All are fold files' names (ids of [`FOLD_ID_DIGITS`] digits
/// or more: no process opens one, every exporter reads one, a later fold
/// folds it). First the name just before `name` in name order, after
/// `before` (the store's file before it): the source is then read where it
/// was, before the new file, so the sums over the files already there are
/// added in the order they were. Where no such name fits (`name`'s id is
/// `before`'s followed by zeros), names just after `name`, read after the
/// new file (an order of adding like any other store's; nothing is lost).
pub(super) fn aside_names(name: &str, before: Option<&str>) -> Vec<String> {
    let Some(id) = file_id(name.as_bytes()) else {
        return Vec::new();
    };
    let id = std::str::from_utf8(id).expect("digits");
    let prefix = &name[..name.len() - b".bin".len() - id.len()];
    let mut names = Vec::new();
    // Before: the id's last non-zero digit one less, then nines, as many as
    // it takes to come after `before` (more nines sort later, and every name
    // of the group with this stem comes before one with more nines).
    if let Some(k) = id.rfind(|c: char| c != '0') {
        let lower = char::from(id.as_bytes()[k] - 1);
        let stem = format!("{prefix}{}{lower}", &id[..k]);
        let fewest = FOLD_ID_DIGITS.saturating_sub(k + 1).max(1);
        let most = fewest + before.map_or(0, str::len) + 1;
        let fits = (fewest..=most)
            .map(|nines| format!("{stem}{}.bin", "9".repeat(nines)))
            .find(|aside| before.is_none_or(|b| b < aside.as_str()));
        names.extend(fits);
    }
    // After: the id followed by zeros (a fold file may have the first).
    let zeros = FOLD_ID_DIGITS.saturating_sub(id.len()).max(1);
    names.extend((zeros..zeros + 8).map(|z| format!("{prefix}{id}{}.bin", "0".repeat(z))));
    names
}
