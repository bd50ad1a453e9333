#!/usr/bin/env bash
# client_ruby half of issue #13: apply promlab's patches to prometheus/client_ruby, run its
# own rspec suite for each patch alone and for all of them together, check that client_ruby's
# own exporter renders every ruby-dfs fixture byte for byte as before, and (unless --no-bench)
# time export and write, unpatched vs each patch vs all, in interleaved rounds.
#
#   experiments/upstream/client_ruby/run.sh [--src DIR_OR_TARBALL ...] [--no-bench]
#       [--out DIR] [--rounds N] [--large-rounds N] [--jobs N]
#       [--many full|quick|none] [--many-rounds N] [--promlab PATH] [--only-many]
#
# --many: the benchmarks also time unpatched, list-once and all on the stores of promlab's
# many-processes and many-metrics scenarios (written by `promlab scenario-store`, default
# target/release/promlab; checked against their expected.prom first), full size by default.
# --only-many: rspec, then only that (no fixture identity, no seed/large/write timings).
#
# --src may be repeated (default: the three archives in ../shared/upstream/ beside the repo).
# The patch series is chosen from the source: one file per process (`metrics___<pid>.bin`,
# the maintainers' proof of concept) gets patches/poc-file-per-process, else `require "cgi"`
# keys (4.x) get patches/v4.2.5, `URI.encode_www_form` keys (5.x) get patches/5.x-uri. The
# fixtures are stores of one file per metric, which a one-file-per-process client does not
# read: such a source gets rspec only (options_bench.sh checks its exports). Needs ruby, rspec (ruby-rspec,
# ruby-timecop, ruby-rack, ruby-rack-test, ruby-simplecov), patch, tar.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
# `shared/` beside the repository (or beside one of its parent directories: a git worktree
# one level down), unless PROMLAB_SHARED names it.
shared="${PROMLAB_SHARED:-}"
if [ -z "$shared" ]; then
  for d in "$root/.." "$root/../.." "$root/../../.."; do
    if [ -d "$d/shared" ]; then shared="$(cd "$d/shared" && pwd)"; break; fi
  done
  shared="${shared:-$(cd "$root/.." && pwd)/shared}"
fi
fixtures="${PROMLAB_RUBY_FIXTURES:-$shared/fixtures/ruby-dfs}"

all_args="$*"
srcs=()
bench=1
out=""
rounds=7
large_rounds=3
jobs=2
many=full
many_rounds=3
promlab="$root/target/release/promlab"
only_many=0
while [ $# -gt 0 ]; do
  case "$1" in
    --src) srcs+=("$2"); shift 2 ;;
    --no-bench) bench=0; shift ;;
    --out) out="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --large-rounds) large_rounds="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --many) many="$2"; shift 2 ;;
    --many-rounds) many_rounds="$2"; shift 2 ;;
    --promlab) promlab="$2"; shift 2 ;;
    --only-many) only_many=1; shift ;;
    -h|--help) sed -n 2,20p "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ ${#srcs[@]} -eq 0 ]; then
  srcs=("$shared/upstream/client_ruby-v4.2.5.tar.gz" "$shared/upstream/client_ruby-5.x-uri.tar.gz"
        "$shared/upstream/client_ruby-poc-file-per-process.tar.gz")
fi
if [ -z "$out" ]; then
  out="$root/experiments/upstream/results/$(date -u +%Y-%m-%dT%H%M%SZ)-$(hostname)"
fi
if [ -e "$out" ]; then
  echo "run.sh: $out exists; not overwriting it" >&2
  exit 1
fi
for tool in ruby rspec patch tar cmp; do
  command -v "$tool" >/dev/null || { echo "run.sh: $tool not found" >&2; exit 1; }
done

tmp="$(mktemp -d "${TMPDIR:-/tmp}/promlab-client-ruby.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT

# The fixtures' files carry the pids that wrote them, ordinary pids this machine also hands
# out; export.rb and bench.rb move their work to a child when their own pid is one of them
# (own_pid.rb). A CI run once drew such a pid, so check that hand-off here first.
mkdir "$tmp/pid-check"
ruby -e 'require ARGV[0]; d = ARGV[1]; first = Process.pid
  File.write(File.join(d, "metric_x___#{first}.bin"), "")
  work_under_a_pid_the_store_lacks(d)
  exit(Process.pid == first ? 1 : 7)' "$here/own_pid.rb" "$tmp/pid-check" && rc=0 || rc=$?
[ "$rc" -eq 7 ] || { echo "run.sh: own_pid.rb did not hand the work to a child (exit $rc)" >&2; exit 1; }
mkdir -p "$out/rspec" "$out/exports"
started=$(date +%s)
log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

# ---------------------------------------------------------------- sources and patch sets
revs=()       # every source
file_revs=()  # the sources that write one file per metric (the fixtures' layout)
for src in "${srcs[@]}"; do
  name="$(basename "$src")"
  name="${name%.tar.gz}"; name="${name%.tgz}"; name="${name#client_ruby-}"
  [ -d "$tmp/src/$name" ] && { echo "run.sh: two sources named $name" >&2; exit 2; }
  mkdir -p "$tmp/src/$name"
  if [ -d "$src" ]; then
    (cd "$src" && tar cf - --exclude=.git --exclude=coverage .) | tar xf - -C "$tmp/src/$name"
  else
    tar xzf "$src" -C "$tmp/src/$name" --strip-components=1
  fi
  lib="$tmp/src/$name/lib/prometheus/client/data_stores/direct_file_store.rb"
  [ -f "$lib" ] || { echo "run.sh: $src has no $lib" >&2; exit 1; }
  if grep -q '"metrics___' "$lib"; then series=poc-file-per-process
  elif grep -q 'URI.encode_www_form' "$lib"; then series=5.x-uri
  elif grep -q 'CGI::escape' "$lib"; then series=v4.2.5
  else echo "run.sh: cannot tell which patch series fits $src" >&2; exit 1; fi
  echo "$series" > "$tmp/src/$name.series"
  revs+=("$name")
  [ "$series" = poc-file-per-process ] || file_revs+=("$name")
done

sets_of() {  # the patch sets of revision $1: unpatched, each patch, all (if more than one)
  local series; series="$(cat "$tmp/src/$1.series")"
  echo unpatched
  for p in "$here/patches/$series"/*.patch; do b="$(basename "$p" .patch)"; echo "${b#[0-9][0-9]-}"; done
  [ "$(ls "$here/patches/$series"/*.patch | wc -l)" -gt 1 ] && echo all
  return 0
}

for rev in "${revs[@]}"; do
  series="$(cat "$tmp/src/$rev.series")"
  for set in $(sets_of "$rev"); do
    d="$tmp/arms/$rev/$set"
    mkdir -p "$d"
    cp -a "$tmp/src/$rev/." "$d/"
    case "$set" in
      unpatched) ;;
      all) for p in "$here/patches/$series"/*.patch; do patch -s -p1 -d "$d" --no-backup-if-mismatch < "$p"; done ;;
      *) patch -s -p1 -d "$d" --no-backup-if-mismatch < "$(ls "$here/patches/$series"/[0-9][0-9]-"$set".patch)" ;;
    esac
  done
done
log "patches applied: ${revs[*]}"

# ---------------------------------------------------------------- rspec (serial: the suite uses /tmp/prometheus_test)
echo "revision,set,examples,failures" > "$out/rspec.csv"
rspec_failed=0
for rev in "${revs[@]}"; do
  for set in $(sets_of "$rev"); do
    d="$tmp/arms/$rev/$set"
    status=0
    (cd "$d" && rspec > "$out/rspec/$rev-$set.log" 2>&1) || status=$?
    summary="$(grep -Eo '[0-9]+ examples?, [0-9]+ failures?' "$out/rspec/$rev-$set.log" | tail -1 || true)"
    examples="$(echo "$summary" | grep -Eo '^[0-9]+' || echo 0)"
    failures="$(echo "$summary" | grep -Eo '[0-9]+ failure' | grep -Eo '[0-9]+' || echo '?')"
    echo "$rev,$set,$examples,$failures" >> "$out/rspec.csv"
    if [ "$status" -ne 0 ] || [ "$failures" != 0 ] || [ "$examples" = 0 ]; then
      echo "run.sh: rspec FAILED for $rev $set (see $out/rspec/$rev-$set.log)" >&2
      rspec_failed=1
    fi
    log "rspec $rev $set: $examples examples, $failures failures"
  done
done
[ "$rspec_failed" -eq 0 ] || exit 1

# ---------------------------------------------------------------- fixtures
fx="$tmp/fixtures"
mkdir -p "$fx"
cases=()
for c in seed-repro-v4.2.5 seed-repro-v5-uri all-types-v4.2.5 all-types-v5-uri; do
  ln -s "$fixtures/$c" "$fx/$c"
  cases+=("$c")
done
tar xzf "$fixtures/large-v5-uri.tar.gz" -C "$fx"
cases+=(large-v5-uri)
# A rolling upgrade: both all-types stores in one directory (no expected.prom: the reference
# is the unpatched revision's own output)
mkdir -p "$fx/mixed-all-types/store"
for c in all-types-v4.2.5 all-types-v5-uri; do
  for f in "$fixtures/$c/store"/*; do
    [ -e "$fx/mixed-all-types/store/$(basename "$f")" ] && { echo "run.sh: $f collides in the mixed directory" >&2; exit 1; }
    ln -s "$f" "$fx/mixed-all-types/store/"
  done
done
cmp -s "$fixtures/all-types-v4.2.5/registry.json" "$fixtures/all-types-v5-uri/registry.json" ||
  { echo "run.sh: the two all-types registries differ" >&2; exit 1; }
ln -s "$fixtures/all-types-v4.2.5/registry.json" "$fx/mixed-all-types/registry.json"
cases+=(mixed-all-types)

# A private directory of symlinks per export: registering unlabeled metrics makes the
# exporting process write its own file, which export.rb removes before it renders.
scratch_store() {
  local d; d="$(mktemp -d "$tmp/store.XXXXXX")"
  cp -as "$fx/$1/store/." "$d/"
  echo "$d"
}

export_one() {  # rev set case -> $out/exports/<rev>/<set>/<case>.prom
  local rev="$1" set="$2" c="$3" d t0 t1
  mkdir -p "$out/exports/$rev/$set"
  d="$(scratch_store "$c")"
  t0=$(date +%s%N)
  ruby -I "$tmp/arms/$rev/$set/lib" "$here/export.rb" "$fx/$c/registry.json" "$d" \
    "$out/exports/$rev/$set/$c.prom"
  t1=$(date +%s%N)
  rm -rf "$d"
  echo "$rev,$set,$c,$(( (t1 - t0) / 1000000 ))" >> "$tmp/export-times.csv"
}

# ---------------------------------------------------------------- byte identity
: > "$tmp/export-times.csv"
export -f export_one scratch_store
export tmp out here fx
checked=0
if [ "$only_many" -eq 0 ]; then
log "byte identity: ${#cases[@]} stores x every set, $jobs at a time"
joblist="$tmp/jobs"
: > "$joblist"
for rev in "${file_revs[@]}"; do
  for set in $(sets_of "$rev"); do
    for c in "${cases[@]}"; do echo "$rev $set $c" >> "$joblist"; done
  done
done
xargs -r -P "$jobs" -L 1 bash -c 'export_one "$0" "$1" "$2"' < "$joblist"

echo "revision,set,case,reference,result,export_ms" > "$out/identity.csv"
identity_failed=0
while read -r rev set c; do
  got="$out/exports/$rev/$set/$c.prom"
  if [ -f "$fx/$c/expected.prom" ]; then ref="$fx/$c/expected.prom"; refname=expected.prom
  else ref="$out/exports/$rev/unpatched/$c.prom"; refname="unpatched $rev"; fi
  if cmp -s "$got" "$ref"; then result=identical; else result=DIFFERENT; identity_failed=1; fi
  ms="$(grep "^$rev,$set,$c," "$tmp/export-times.csv" | cut -d, -f4)"
  echo "$rev,$set,$c,$refname,$result,$ms" >> "$out/identity.csv"
  checked=$((checked + 1))
done < "$joblist"
if [ "$identity_failed" -ne 0 ]; then
  grep DIFFERENT "$out/identity.csv" >&2
  echo "run.sh: exposition DIFFERS (see $out/identity.csv)" >&2
  exit 1
fi
# Every output equals its reference: keep only the references that are not fixture files
# (the unpatched revisions' renderings of the mixed directory)
for rev in "${file_revs[@]}"; do
  for set in $(sets_of "$rev"); do [ "$set" = unpatched ] || rm -rf "$out/exports/$rev/$set"; done
  find "$out/exports/$rev/unpatched" -name '*.prom' ! -name 'mixed-all-types.prom' -delete
done
log "byte identity: $checked exports identical"
fi

# ---------------------------------------------------------------- machine
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "uname: $(uname -a)"
  echo "nproc: $(nproc)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
  echo "memory: $(grep MemTotal /proc/meminfo)"
  echo "ruby: $(ruby -v)"
  echo "rspec: $(rspec --version 2>/dev/null | tr '\n' ' ')"
  echo "promlab revision: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet 2>/dev/null || echo -dirty)"
  echo "command: $0 $all_args"
  for src in "${srcs[@]}"; do echo "source: $src"; done
  echo "load at start of bench: $(cat /proc/loadavg)"
} > "$out/machine.txt"

# ---------------------------------------------------------------- benchmarks
if [ "$bench" -eq 1 ]; then
  echo "revision,task,arm,round,wall_ns,cpu_ns,units,unit" > "$out/timings.csv"
fi
seed_case() { if [ "$(cat "$tmp/src/$1.series")" = v4.2.5 ]; then echo seed-repro-v4.2.5; else echo seed-repro-v5-uri; fi; }
bench_export() {  # rev arm case reps round
  local d r; d="$(scratch_store "$3")"
  r="$(ruby -I "$tmp/arms/$1/$2/lib" "$here/bench.rb" export "$fx/$3/registry.json" "$d" "$4")"
  rm -rf "$d"
  echo "$1,export $3,$2,$5,${r// /,},lines" >> "$out/timings.csv"
}
bench_write() {  # rev arm steps round
  local d r; d="$(mktemp -d "$tmp/write.XXXXXX")"
  r="$(ruby -I "$tmp/arms/$1/$2/lib" "$here/bench.rb" write "$d" "$3")"
  rm -rf "$d"
  echo "$1,write long label,$2,$4,${r// /,},steps" >> "$out/timings.csv"
}
if [ "$bench" -eq 1 ] && [ "$only_many" -eq 0 ]; then
  for round in $(seq 1 "$rounds"); do
    for rev in "${file_revs[@]}"; do
      mapfile -t arms < <(sets_of "$rev")
      n=${#arms[@]}
      for i in $(seq 0 $((n - 1))); do  # rotate the order every round
        arm="${arms[$(( (i + round) % n ))]}"
        bench_export "$rev" "$arm" "$(seed_case "$rev")" 3 "$round"
        bench_write "$rev" "$arm" 20000 "$round"
        if [ "$round" -le "$large_rounds" ]; then
          bench_export "$rev" "$arm" large-v5-uri 1 "$round"
        fi
      done
    done
    log "bench round $round/$rounds done"
  done
fi

# ---------------------------------------------------------------- many-file stores
# client_ruby lists the store directory once per metric (`Dir.glob` in stores_for_metric);
# 07-list-once lists it once per export. Timed on the stores promlab's many-processes
# (client_ruby#143's directory of exited workers' files) and many-metrics scenarios scrape,
# for unpatched, list-once and all only (a full-size many-metrics export takes Ruby ~15 s).
if [ "$bench" -eq 1 ] && [ "$many" != none ]; then
  if [ ! -x "$promlab" ]; then
    echo "run.sh: no promlab binary at $promlab (cargo build --release -p promlab-lab, or --promlab PATH, or --many none)" >&2
    exit 1
  fi
  many_cases=()
  for sc in many-processes many-metrics; do
    size_flag=(); [ "$many" = quick ] && size_flag=(--quick)
    "$promlab" scenario-store "$sc" "${size_flag[@]}" --out "$fx/$sc" 2>>"$out/many-stores.log"
    many_cases+=("$sc")
  done
  many_arms=(unpatched list-once all)
  # Each timed export writes its exposition, compared with the store's expected.prom. The
  # generated store is private to this run, so Ruby reads it in place (a symlink copy of
  # 50,000 files per export would cost more than the export).
  echo "revision,set,case,round,reference,result" > "$out/identity-many.csv"
  for round in $(seq 1 "$many_rounds"); do
    for rev in "${file_revs[@]}"; do
      n=${#many_arms[@]}
      for i in $(seq 0 $((n - 1))); do
        arm="${many_arms[$(( (i + round) % n ))]}"
        for c in "${many_cases[@]}"; do
          got="$tmp/many-$rev-$arm-$c.prom"
          r="$(ruby -I "$tmp/arms/$rev/$arm/lib" "$here/bench.rb" export "$fx/$c/registry.json" "$fx/$c/store" 1 "$got")"
          echo "$rev,export $c,$arm,$round,${r// /,},lines" >> "$out/timings.csv"
          if cmp -s "$got" "$fx/$c/expected.prom"; then result=identical; else result=DIFFERENT; fi
          echo "$rev,$arm,$c,$round,expected.prom,$result" >> "$out/identity-many.csv"
          [ "$result" = identical ] || { echo "run.sh: $rev $arm exports $c DIFFERENTLY ($got)" >&2; exit 1; }
          rm -f "$got"
        done
      done
    done
    log "many-file round $round/$many_rounds done"
  done
fi

elapsed=$(( $(date +%s) - started ))
ruby "$here/summarize.rb" "$out" "$root/experiments/results/2026-11-30-vm-full-2" "$elapsed" > "$out/summary.md"
nsets=$(sets_of "${revs[0]}" | grep -vc unpatched)
log "results in $out ($elapsed s)"
many_checked=0
[ -f "$out/identity-many.csv" ] && many_checked=$(( $(wc -l < "$out/identity-many.csv") - 1 ))
echo "client_ruby: $nsets patch sets × ${#file_revs[@]} revisions and $(( ${#revs[@]} - ${#file_revs[@]} )) one-file-per-process source(s): rspec passed, exposition identical ($checked exports$( [ "$many_checked" -gt 0 ] && echo ", $many_checked of the many-file stores"))$( [ "$bench" -eq 1 ] && echo ", benchmarks in $out/summary.md")"
