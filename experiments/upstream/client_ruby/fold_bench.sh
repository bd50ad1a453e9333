#!/usr/bin/env bash
# The fold (patches/*/08-fold-exited.patch) measured in Ruby: client_ruby's own
# export of a many-process store directory, as it is and folded by the patched
# client_ruby, on the same directory, interleaved round by round; the fold's own
# time; and both exports compared byte for byte.
#
#   [PROMLAB_SHARED=DIR] experiments/upstream/client_ruby/fold_bench.sh [--clones N] [--rounds R]
#       [--store DIR --registry FILE] [--out DIR]
#
# Without --store: the all-types-v5-uri fixture store (42 files, 5 processes)
# cloned N times under new pids (default 1,120: 47,040 files, the #143 shape of
# promlab issue #22). Every file's process has exited (nothing holds them open),
# so the fold folds all of them. Each revision (4.2.5, 5.x) gets its own copy.
# Prints, per revision: Ruby CPU time of one export (median of R rounds, each a
# process of its own, as bench.rb measures), unfolded and folded, the speed-up,
# and the fold's wall and CPU time. Needs ruby, tar, patch, cmp.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
shared="${PROMLAB_SHARED:-$(cd "$root/.." && pwd)/shared}"
clones=1120
rounds=5
store=""
registry=""
out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --clones) clones="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --store) store="$2"; shift 2 ;;
    --registry) registry="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n 2,18p "$0"; exit 0 ;;
    *) echo "fold_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
fixtures="$shared/fixtures/ruby-dfs/all-types-v5-uri"
[ -d "$fixtures" ] || fixtures="$root/tests/fixtures/ruby-dfs/all-types-v5-uri"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
[ -n "$out" ] || out="$root/experiments/upstream/results/$(date -u +%Y-%m-%dT%H%M%SZ)-$(hostname)-fold"
mkdir -p "$out"

if [ -z "$store" ]; then
  store="$work/cloned"
  registry="$fixtures/registry.json"
  ruby -e '
    require "fileutils"
    src, dst, clones = ARGV[0], ARGV[1], Integer(ARGV[2])
    FileUtils.mkdir_p(dst)
    files = Dir.children(src).sort
    pids = files.map { |f| f[/___(\d+)\.bin\z/, 1] }.uniq.sort
    clones.times do |k|
      pids.each_with_index do |pid, j|
        files.grep(/___#{pid}\.bin\z/).each do |f|
          FileUtils.cp(File.join(src, f), File.join(dst, f.sub(/___\d+\.bin\z/, "___#{30000 + k * pids.size + j}.bin")))
        end
      end
    end' "$fixtures/store" "$store" "$clones"
fi
echo "fold_bench: $(ls "$store" | wc -l) files in $store; load average $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$out/summary.txt"

for rev in v4.2.5 5.x-uri; do
  series=$rev
  for kind in unpatched patched; do
    mkdir -p "$work/$rev-$kind"
    tar xzf "$shared/upstream/client_ruby-$rev.tar.gz" -C "$work/$rev-$kind"
  done
  (cd "$work/$rev-patched/client_ruby-$rev" && patch -s -p1 < "$here/patches/$series/08-fold-exited.patch")
  lib_plain="$work/$rev-unpatched/client_ruby-$rev/lib"
  lib_fold="$work/$rev-patched/client_ruby-$rev/lib"
  unfolded="$work/$rev-unfolded"
  folded="$work/$rev-folded"
  cp -r "$store" "$unfolded"
  cp -r "$store" "$folded"
  fold_line=$(ruby -I "$lib_fold" -e '
    require "json"; require "prometheus/client"
    require "prometheus/client/data_stores/direct_file_store"
    registry_json, dir = ARGV
    store = Prometheus::Client::DataStores::DirectFileStore.new(dir: dir)
    JSON.parse(File.read(registry_json)).fetch("metrics").each do |m|
      store.for_metric(m["name"].to_sym, metric_type: m["type"].to_sym,
                       metric_settings: { aggregation: m["aggregation"].to_sym })
    end
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    c = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID)
    n = store.fold_exited_processes
    printf("%d files folded into %d; fold %.2f s wall, %.2f s CPU\n", n,
           Dir.children(dir).grep(/\Ametric_/).size,
           Process.clock_gettime(Process::CLOCK_MONOTONIC) - t,
           Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) - c)' "$registry" "$folded")
  plain_cpu=()
  fold_cpu=()
  for r in $(seq "$rounds"); do
    # Alternate which goes first.
    for which in $( [ $((r % 2)) -eq 0 ] && echo "unfolded folded" || echo "folded unfolded"); do
      dir=$unfolded; [ "$which" = folded ] && dir=$folded
      read -r _wall cpu _lines < <(ruby -I "$lib_plain" "$here/bench.rb" export "$registry" "$dir" 1)
      if [ "$which" = folded ]; then fold_cpu+=("$cpu"); else plain_cpu+=("$cpu"); fi
    done
  done
  ruby -I "$lib_plain" "$here/export.rb" "$registry" "$unfolded" "$out/$rev-unfolded.prom"
  ruby -I "$lib_plain" "$here/export.rb" "$registry" "$folded" "$out/$rev-folded.prom"
  cmp "$out/$rev-unfolded.prom" "$out/$rev-folded.prom"
  median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  p=$(median "${plain_cpu[@]}")
  f=$(median "${fold_cpu[@]}")
  awk -v rev="$rev" -v fold="$fold_line" -v n="$rounds" -v p="$p" -v f="$f" 'BEGIN {
    printf "%s: %s; export CPU, median of %d: unfolded %.1f ms, folded %.2f ms, %.0fx; exposition identical\n",
      rev, fold, n, p / 1e6, f / 1e6, p / f }' | tee -a "$out/summary.txt"
done
echo "fold_bench: results in $out"
