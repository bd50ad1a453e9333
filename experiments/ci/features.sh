#!/usr/bin/env bash
# Per strategy feature (and `all`): build the benches with it and run each
# bench of the feature's stage in criterion's --test mode — every arm the
# feature asks for (baseline, alone, all-but-one, all) runs once, after its
# output is verified against the scenario's expected answer. A feature only
# changes the default strategy set (src/shared/strategy.rs), so this is what it can
# break: the arm list and its verification.
#
# Usage: experiments/ci/features.sh [--all-stages] [--one-per-build] [FEATURE...]
#   FEATURE...       the features to check (default: every strategy feature, then `all`)
#   --all-stages     run all four stage benches per feature, not just the feature's own stage(s)
#   --one-per-build  one build per feature, as `cargo bench --features S` does
#
# By default, features of different stages share a build: a stage bench ablates only the
# build's features of its own stage (harness::configured), so `--features
# key-cache,single-read,borrowed-decode --bench write` runs exactly the arms of `--features
# key-cache --bench write`, and the export and ingest benches those of the other two. Each
# build holds at most one feature per stage (prerender counts for render and export), so every
# feature's own ablation runs, verified, in 7 builds instead of 17. Each build rebuilds the two
# workspace crates (the dependencies are shared).
set -euo pipefail
cd "$(dirname "$0")/../.."

all_stages=0
one_per_build=0
while [[ "${1:-}" == --* ]]; do
    case "$1" in
        --all-stages) all_stages=1 ;;
        --one-per-build) one_per_build=1 ;;
        *) echo "unknown option: $1" >&2; exit 2 ;;
    esac
    shift
done

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
for feature in "${features[@]}"; do
    if [[ -z "${STAGES[$feature]:-}" ]]; then
        echo "unknown feature: $feature" >&2
        exit 2
    fi
done

# The builds: each feature joins the first build that has none of its stages yet (`all`, and
# every feature with --all-stages or --one-per-build, gets a build of its own).
builds=()
build_stages=()
for feature in "${features[@]}"; do
    stages="${STAGES[$feature]}"
    placed=0
    if [[ $all_stages -eq 0 && $one_per_build -eq 0 && "$feature" != all ]]; then
        for i in "${!builds[@]}"; do
            clash=0
            for stage in $stages; do
                [[ " ${build_stages[$i]} " == *" $stage "* ]] && clash=1
            done
            if [[ $clash -eq 0 && "${builds[$i]}" != all ]]; then
                builds[$i]="${builds[$i]},$feature"
                build_stages[$i]="${build_stages[$i]} $stages"
                placed=1
                break
            fi
        done
    fi
    if [[ $placed -eq 0 ]]; then
        builds+=("$feature")
        build_stages+=("$stages")
    fi
done

# Smaller render and ingest scales: --test runs each arm once; the verification is the point.
export PROMLAB_BENCH_QUEUES="${PROMLAB_BENCH_QUEUES:-1000}"
# A feature set rebuilds only the two workspace crates and the benches; at opt-level 1 that
# takes a fraction of a full optimisation (the dependencies stay as the release build made them).
# Timings mean nothing here: --test runs each arm once, to verify it.
opt=(--config 'profile.bench.package.promlab.opt-level=1'
     --config 'profile.bench.package."promlab-lab".opt-level=1')

start=$(date +%s)
for i in "${!builds[@]}"; do
    set_="${builds[$i]}"
    stages="${build_stages[$i]}"
    if [[ $all_stages -eq 1 ]]; then
        stages="write export render ingest"
    fi
    t0=$(date +%s)
    # Every bench (iai included) must build with the features.
    cargo bench "${opt[@]}" -p promlab-lab --features "$set_" \
        --bench write --bench export --bench render --bench ingest --bench iai --no-run
    for stage in $(tr ' ' '\n' <<<"$stages" | awk 'NF && !seen[$0]++'); do
        echo "== --features $set_ --bench $stage -- --test"
        cargo bench "${opt[@]}" -p promlab-lab --features "$set_" --bench "$stage" -- --test
    done
    echo "== $set_: $(($(date +%s) - t0)) s"
done
echo "== features.sh: ${#features[@]} features in ${#builds[@]} builds, $(($(date +%s) - start)) s"
