#!/usr/bin/env bash
# Per strategy feature (and `all`): build the benches with it and run each
# bench of the feature's stage in criterion's --test mode — every arm the
# feature asks for (baseline, alone, all-but-one, all) runs once, after its
# output is verified against the scenario's expected answer. A feature only
# changes the default strategy set (src/strategy.rs), so this is what it can
# break: the arm list and its verification.
#
# Usage: experiments/ci/features.sh [--all-stages] [FEATURE...]
#   FEATURE...     the features to check (default: every strategy feature, then `all`)
#   --all-stages   run all four stage benches per feature, not just the feature's own stage(s)
# Each feature set rebuilds the two workspace crates (the dependencies are shared).
set -euo pipefail
cd "$(dirname "$0")/../.."

all_stages=0
if [[ "${1:-}" == "--all-stages" ]]; then
    all_stages=1
    shift
fi

# feature → the stage benches it changes (prerender: render, and export's long-lived exporter).
declare -A STAGES=(
    [key-cache]="write" [increment-once]="write" [cached-pid]="write" [clock-once]="write"
    [coarse-clock]="write" [mmap-store]="write"
    [single-read]="export" [decode-once]="export" [fast-unescape]="export" [fold-exited]="export"
    [prerender]="render export"
    [borrowed-decode]="ingest" [series-cache]="ingest" [batch-routing]="ingest" [bulk-sketch]="ingest"
    [all]="write export render ingest"
)
ORDER=(key-cache increment-once cached-pid clock-once coarse-clock mmap-store
       single-read decode-once fast-unescape fold-exited prerender
       borrowed-decode series-cache batch-routing bulk-sketch all)

features=("$@")
if [[ ${#features[@]} -eq 0 ]]; then
    features=("${ORDER[@]}")
fi

# Smaller render and ingest scales: --test runs each arm once; the verification is the point.
export PROMLAB_BENCH_QUEUES="${PROMLAB_BENCH_QUEUES:-1000}"
# A feature set rebuilds only the two workspace crates and the benches; at opt-level 1 that
# takes a fraction of a full optimisation (the dependencies stay as the release build made them).
# Timings mean nothing here: --test runs each arm once, to verify it.
opt=(--config 'profile.bench.package.promlab.opt-level=1'
     --config 'profile.bench.package."promlab-lab".opt-level=1')

start=$(date +%s)
for feature in "${features[@]}"; do
    stages="${STAGES[$feature]:-}"
    if [[ -z "$stages" ]]; then
        echo "unknown feature: $feature" >&2
        exit 2
    fi
    if [[ $all_stages -eq 1 ]]; then
        stages="write export render ingest"
    fi
    t0=$(date +%s)
    # Every bench (iai included) must build with the feature.
    cargo bench "${opt[@]}" -p promlab-lab --features "$feature" \
        --bench write --bench export --bench render --bench ingest --bench iai --no-run
    for stage in $stages; do
        echo "== --features $feature --bench $stage -- --test"
        cargo bench "${opt[@]}" -p promlab-lab --features "$feature" --bench "$stage" -- --test
    done
    echo "== $feature: $(($(date +%s) - t0)) s"
done
echo "== features.sh: ${#features[@]} feature sets in $(($(date +%s) - start)) s"
