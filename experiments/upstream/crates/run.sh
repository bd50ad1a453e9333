#!/usr/bin/env bash
# The Rust crates' half of the upstream patches (issue #13): for each crate,
# take the published source (crates.io, or a checkout given with --src-dir),
# apply our patch in a scratch copy, run the crate's own tests and ours, and
# unless --no-bench, measure the patched crate against the published one.
#
#   run.sh [--no-bench] [--out DIR] [--src-dir DIR] [--full-tests] [--protobuf]
#
#   --no-bench    tests only (what CI runs): debug builds, the crates' test
#                 suites, no benchmark dependencies compiled.
#   --out DIR     where results go (default: experiments/upstream/results/
#                 <UTC date-time>-<host>/crates/); must not exist or be empty.
#   --src-dir DIR use your own checkouts instead of crates.io: DIR holds
#                 sketches-ddsketch[-0.4.2]/ (or rust-sketches-ddsketch/) and
#                 prometheus-client[-0.26.0]/ (or client_rust/); a crate not
#                 found there is fetched from crates.io.
#   --full-tests  prometheus-client: plain `cargo test` with all of its
#                 dev-dependencies (its examples pull in actix-web, tide,
#                 axum, hyper: slow). Default: its unit tests and doctests,
#                 with only the dev-dependencies those use (pyo3, quickcheck).
#   --protobuf    prometheus-client: also its unit tests with the protobuf
#                 features (builds prost and protox: a few minutes more).
#                 On by default unless --no-bench.
#
# Environment: CARGO_TARGET_DIR (default /tmp/promlab-crates-target, reused
# between runs), RENDER_QUEUES (10000 = 630k series), RENDER_ROUNDS (21).
# The scratch copies live in a temporary directory outside promlab's tree, so
# no workspace above them claims them; nothing here touches promlab's build.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"

bench=1
full_tests=0
protobuf=
out=""
src_dir=""
usage() { sed -n '2,29p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --no-bench) bench=0 ;;
        --full-tests) full_tests=1 ;;
        --protobuf) protobuf=1 ;;
        --out) out="${2:?--out needs a directory}"; shift ;;
        --src-dir) src_dir="$(cd "${2:?--src-dir needs a directory}" && pwd)"; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "run.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

[ -n "$protobuf" ] || protobuf=$bench
started="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
host="$(hostname -s 2>/dev/null || hostname)"
if [ -z "$out" ]; then
    out="$repo/experiments/upstream/results/$(date -u +%Y-%m-%dT%H%M%SZ)-$host/crates"
fi
if [ -e "$out" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
    echo "run.sh: $out exists and is not empty; not overwriting" >&2
    exit 1
fi
mkdir -p "$out"
out="$(cd "$out" && pwd)"

work="$(mktemp -d "${TMPDIR:-/tmp}/promlab-crates.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/tmp/promlab-crates-target}"
export CARGO_TERM_COLOR=never
cargo_home="${CARGO_HOME:-$HOME/.cargo}"

log() { printf '%s\n' "$*" | tee -a "$out/summary.md" >&2; }
note() { printf '%s\n' "$*" >&2; }

# --- sources ---------------------------------------------------------------

# fetch NAME VERSION DEST: the published .crate, through cargo (so its checksum
# is checked against the crates.io index), unpacked into DEST.
fetch() {
    local name="$1" version="$2" dest="$3" f
    mkdir -p "$work/fetch-$name/src"
    cat >"$work/fetch-$name/Cargo.toml" <<EOF
[package]
name = "fetch-$name"
version = "0.0.0"
edition = "2021"
publish = false

[workspace]

[dependencies]
$name = "=$version"
EOF
    : >"$work/fetch-$name/src/lib.rs"
    (cd "$work/fetch-$name" && cargo fetch --quiet)
    f="$(ls "$cargo_home"/registry/cache/*/"$name-$version.crate" 2>/dev/null | head -n 1)"
    [ -n "$f" ] || { echo "run.sh: $name-$version.crate not in $cargo_home/registry/cache after cargo fetch" >&2; exit 1; }
    mkdir -p "$dest"
    tar -xzf "$f" -C "$dest" --strip-components=1
    echo "crates.io ($name $version, $(sha256sum "$f" | cut -c1-16)…)"
}

# source NAME VERSION DEST [ALT_DIR_NAME]: DEST gets the crate's source.
source_crate() {
    local name="$1" version="$2" dest="$3" alt="${4:-}" d
    if [ -n "$src_dir" ]; then
        for d in "$src_dir/$name-$version" "$src_dir/$name" ${alt:+"$src_dir/$alt"}; do
            if [ -f "$d/Cargo.toml" ]; then
                mkdir -p "$dest"
                tar -C "$d" --exclude=./target --exclude=./.git -cf - . | tar -C "$dest" -xf -
                echo "checkout $d"
                return
            fi
        done
        note "$name: not found in $src_dir, fetching from crates.io"
    fi
    fetch "$name" "$version" "$dest"
}

# apply CRATE_DIR PATCH
apply() {
    (cd "$1" && patch -p1 --batch --forward --no-backup-if-mismatch --quiet <"$2") || {
        echo "run.sh: $(basename "$2") does not apply to $1" >&2
        exit 1
    }
}

# append_toml DIR TEXT: append TEXT to DIR/Cargo.toml (our dev-dependencies
# and bench targets; they are not in the patch, so that it applies to both
# the published, normalized Cargo.toml and a repository's own).
append_toml() { printf '\n%s\n' "$2" >>"$1/Cargo.toml"; }
own_workspace() { grep -q '^\[workspace\]' "$1/Cargo.toml" || append_toml "$1" '[workspace]'; }

# run_tests LABEL LOG CMD...: runs, appends to LOG, fails the script on failure.
run_tests() {
    local label="$1" logf="$2"; shift 2
    note "$label: $*"
    if ! "$@" >>"$logf" 2>&1; then
        tail -n 60 "$logf" >&2
        echo "run.sh: $label failed (log: $logf)" >&2
        exit 1
    fi
}
passed() { grep -E '^test result: ok\.' "$1" | sed -E 's/.* ok\. ([0-9]+) passed.*/\1/' | awk '{ s += $1 } END { print s + 0 }'; }
added() { grep -cE "$2" "$1" || true; }

# --- header ----------------------------------------------------------------

{
    echo "# Rust crates: patched against published"
    echo
    echo "- started: $started; host: $host; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ //'), load average at start $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "- $(rustc --version); $(cargo --version)"
    echo "- command: experiments/upstream/crates/run.sh $([ $bench = 0 ] && echo --no-bench) $([ $full_tests = 1 ] && echo --full-tests) $([ "$protobuf" = 1 ] && echo '(protobuf tests on)') ${src_dir:+--src-dir $src_dir}"
    echo "- promlab commit: $(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo
} >"$out/summary.md"

# --- sketches-ddsketch -----------------------------------------------------

dd="$work/sketches-ddsketch"
log "## sketches-ddsketch 0.4.2: \`DDSketch::add_slice\`"
log ""
from="$(source_crate sketches-ddsketch 0.4.2 "$dd" rust-sketches-ddsketch)"
log "- source: $from"
apply "$dd" "$here/sketches-ddsketch-0.4.2.patch"
own_workspace "$dd"
append_toml "$dd" '[dev-dependencies.proptest]
version = "1"'
if [ $bench = 1 ]; then
    append_toml "$dd" '[dev-dependencies.criterion]
version = "0.8"
default-features = false
features = ["cargo_bench_support"]

[[bench]]
name = "add_slice"
harness = false'
fi
dd_log="$out/sketches-ddsketch-test.log"
run_tests "sketches-ddsketch tests" "$dd_log" cargo test --manifest-path "$dd/Cargo.toml"
dd_passed="$(passed "$dd_log")"
dd_added="$(added "$dd_log" '^test ddsketch::add_slice_tests::.* \.\.\. ok$')"
log "- tests: \`cargo test\`: $dd_passed passed, of which $dd_added are the patch's (\`ddsketch::add_slice_tests\`, proptest); log: sketches-ddsketch-test.log"

# --- prometheus-client -----------------------------------------------------

pc="$work/prometheus-client"
log ""
log "## prometheus-client 0.26.0: \`encoding::CachedLabelSet\`"
log ""
from="$(source_crate prometheus-client 0.26.0 "$pc" client_rust)"
log "- source: $from"
apply "$pc" "$here/prometheus-client-0.26.0.patch"
own_workspace "$pc"
pc_log="$out/prometheus-client-test.log"

# Its text tests parse our output with the Python prometheus_client (via pyo3).
if ! python3 -c 'import prometheus_client' 2>/dev/null; then
    note "prometheus-client tests: installing the Python prometheus_client (PyPI) into the scratch directory"
    python3 -m pip install --quiet --disable-pip-version-check --target "$work/pylib" prometheus_client >>"$pc_log" 2>&1
    export PYTHONPATH="$work/pylib${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYO3_PYTHON="${PYO3_PYTHON:-python3}"

if [ $full_tests = 1 ]; then
    run_tests "prometheus-client tests" "$pc_log" cargo test --manifest-path "$pc/Cargo.toml"
    pc_how="\`cargo test\` (all targets, all dev-dependencies)"
else
    # Only pyo3 and quickcheck are used by the unit tests and doctests; the
    # rest serve the examples and benches, which are not tests.
    removed=()
    for d in async-std axum futures http-types rand tide actix-web tokio hyper hyper-util http-body-util criterion; do
        if (cd "$pc" && cargo remove --dev --quiet "$d" >/dev/null 2>&1); then removed+=("$d"); fi
    done
    run_tests "prometheus-client unit tests" "$pc_log" cargo test --manifest-path "$pc/Cargo.toml" --lib
    run_tests "prometheus-client doctests" "$pc_log" cargo test --manifest-path "$pc/Cargo.toml" --doc
    pc_how="\`cargo test --lib\` and \`cargo test --doc\` (examples and benches not built; dev-dependencies they alone need removed in the scratch copy: ${removed[*]:-none})"
fi
if [ "$protobuf" = 1 ]; then
    run_tests "prometheus-client unit tests with the protobuf features" "$pc_log" \
        cargo test --manifest-path "$pc/Cargo.toml" --lib --features prometheus_protobuf,openmetrics_protobuf,protobuf-protox
    pc_how="$pc_how, then \`cargo test --lib --features prometheus_protobuf,openmetrics_protobuf,protobuf-protox\` (counted again)"
fi
pc_passed="$(passed "$pc_log")"
pc_added="$(added "$pc_log" '^test (encoding::text::cached_label_set_tests::.*|src/encoding\.rs - encoding::CachedLabelSet .*) \.\.\. ok$')"
log "- tests: $pc_how: $pc_passed passed, of which $pc_added are the patch's (\`encoding::text::cached_label_set_tests\` and the \`CachedLabelSet\` doctest); log: prometheus-client-test.log"

if [ $bench = 0 ]; then
    log ""
    echo "crates: 2 patches applied, tests passed ($dd_passed sketches-ddsketch, $pc_passed prometheus-client; $((dd_added + pc_added)) of them added by the patches); benches skipped (--no-bench); summary: $out/summary.md"
    exit 0
fi

# --- benches ---------------------------------------------------------------

log ""
log "## Benchmarks"
log ""
log "### sketches-ddsketch: \`add\` one at a time against \`add_slice\`"
log ""
log "\`cargo bench --bench add_slice\` (criterion, wall time; alpha = 0.01, 2048 bins, min 1e-9; sketch warmed with 10,000 values; log-uniform values over 1e-3..1e3; both arms in one run). Started $(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)."
log ""
CRITERION_HOME="$out/criterion" cargo bench --manifest-path "$dd/Cargo.toml" --bench add_slice \
    >"$out/sketches-ddsketch-bench.log" 2>&1 || { tail -n 40 "$out/sketches-ddsketch-bench.log" >&2; exit 1; }
python3 - "$out/criterion" >>"$out/summary.md" <<'EOF'
import json, sys, os
root = sys.argv[1]
def est(arm, n):
    with open(os.path.join(root, "add", arm, str(n), "new", "estimates.json")) as f:
        m = json.load(f)["median"]
    return m["point_estimate"], m["confidence_interval"]["lower_bound"], m["confidence_interval"]["upper_bound"]
print("| values per call | one at a time (median) | add_slice (median) | per value: one / slice | speed-up |")
print("| ---: | ---: | ---: | ---: | ---: |")
def fmt(ns):
    return f"{ns/1e3:,.2f} µs" if ns >= 1e4 else f"{ns:,.0f} ns"
for n in (100, 10000):
    a, alo, ahi = est("one_at_a_time", n)
    b, blo, bhi = est("add_slice", n)
    print(f"| {n:,} | {fmt(a)} ({fmt(alo)}–{fmt(ahi)}) | {fmt(b)} ({fmt(blo)}–{fmt(bhi)}) | {a/n:.2f} / {b/n:.2f} ns | {a/b:.2f}× |")
print("\n(brackets: criterion's 95% interval of the median)")
EOF
tail -n 6 "$out/summary.md" >&2

rb="$work/render-bench"
cp -r "$here/render-bench" "$rb"
rm -rf "$rb/target"
queues="${RENDER_QUEUES:-10000}"
rounds="${RENDER_ROUNDS:-21}"
log ""
log "### prometheus-client: RabbitMQ per-object scrape, published against patched"
log ""
note "render-bench: building (release; the published crate and the patched copy in one binary)"
cargo build --release --quiet --manifest-path "$rb/Cargo.toml" >"$out/render-bench-build.log" 2>&1 || { tail -n 40 "$out/render-bench-build.log" >&2; exit 1; }
log "\`render-bench --queues $queues --rounds $rounds\` (release build; promlab's \`rabbitmq-per-object\` shape with awkward names, families built as \`src/harness/peers/crates_render.rs\` builds them; one \`encoding::text::encode\` per scrape into a reused String; arms: the published crate, the patched crate with the same \`Vec<(String, String)>\` keys, the patched crate with \`CachedLabelSet\` keys; interleaved, medians of wall time). Started $(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)."
log ""
"$CARGO_TARGET_DIR/release/render-bench" --queues "$queues" --rounds "$rounds" --out "$out/render-bench.csv" \
    >"$out/render-bench.md" 2>"$out/render-bench.log" || { cat "$out/render-bench.log" >&2; exit 1; }
cat "$out/render-bench.md" >>"$out/summary.md"
{ echo; sed 's/^/- /' "$out/render-bench.log"; } >>"$out/summary.md"
cat "$out/render-bench.md" >&2
log ""
log "- finished $(date -u +%Y-%m-%dT%H:%M:%SZ)"

echo "crates: 2 patches applied, tests passed ($dd_passed sketches-ddsketch, $pc_passed prometheus-client; $((dd_added + pc_added)) of them added by the patches); benches done; summary: $out/summary.md"
