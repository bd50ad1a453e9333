#!/usr/bin/env bash
# promlab's sidecar on both layouts of the same data, for client_ruby#143: the per-metric layout
# (client_ruby 4.2.5, metric_<name>___<pid>.bin) and the one-file-per-process layout of the
# maintainers' poc_file_per_process branch (metrics___<pid>.bin). Stores:
#   seed-repro    the shared fixture ruby-dfs/seed-repro-v4.2.5 (per metric) and
#                 tests/fixtures/ruby-dfs-poc/seed-repro-poc (the same op logs replayed by the
#                 branch's own Ruby);
#   many-metrics  `promlab scenario-store many-metrics` (400 metrics x 100 processes), and the
#                 same with --per-process (each process's files merged into one).
# Per store: a one-shot `promlab export` (baseline strategies, and the default set), 5 runs
# each, under /usr/bin/time; and `promlab serve --store`: its first scrape, then 3 batches of
# 20 warm scrapes (wall from curl, the server's CPU from /proc ticks, per scrape). Every
# exposition is compared with the store's expected.prom. Timed under the QUIET protocol.
#
#   experiments/upstream/client_ruby/poc_sidecar.sh PROMLAB OUT_DIR
set -euo pipefail
promlab="$(realpath "$1")" out="$2"
root="$(cd "$(dirname "$0")/../../.." && pwd)"
shared="${PROMLAB_SHARED:-$root/../shared}"
quiet=/work/QUIET me="${PROMLAB_QUIET_NAME:-poc}"
mkdir -p "$out"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/poc-sidecar.XXXXXX")"
server=""
cleanup() {
  [ -n "$server" ] && kill "$server" 2>/dev/null
  rm -rf "$tmp"
  [ "$(cat "$quiet" 2>/dev/null)" = "$me" ] && rm -f "$quiet"
  true
}
trap cleanup EXIT

# The stores (outside the quiet window).
mkdir -p "$tmp/seed-repro-per-metric"
cp -a "$shared/fixtures/ruby-dfs/seed-repro-v4.2.5/." "$tmp/seed-repro-per-metric/"
tar xzf "$root/tests/fixtures/ruby-dfs-poc/seed-repro-poc.tar.gz" -C "$tmp"
mv "$tmp/seed-repro-poc" "$tmp/seed-repro-per-process"
"$promlab" scenario-store many-metrics --out "$tmp/many-metrics-per-metric" 2>>"$out/log.txt"
"$promlab" scenario-store many-metrics --per-process --out "$tmp/many-metrics-per-process" 2>>"$out/log.txt"

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "uname: $(uname -a)"
  echo "nproc: $(nproc)"
  echo "cpu: $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
  echo "memory: $(grep MemTotal /proc/meminfo)"
  echo "promlab revision: $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- src experiments/lab || echo ' (modified)')"
  echo "command: experiments/upstream/client_ruby/poc_sidecar.sh $*"
  echo "source: $shared/fixtures/ruby-dfs/seed-repro-v4.2.5, tests/fixtures/ruby-dfs-poc/seed-repro-poc.tar.gz, promlab scenario-store many-metrics"
} > "$out/machine.txt"

while [ -e "$quiet" ] && [ "$(cat "$quiet")" != "$me" ]; do sleep 30; done
echo "$me" > "$quiet"
echo "load at start of bench: $(cat /proc/loadavg)" >> "$out/machine.txt"

csv="$out/sidecar.csv"
echo "workload,layout,store_files,store_bytes,mode,strategies,rep,wall_s,cpu_s,peak_rss_kb,result" > "$csv"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
port=19471
for workload in seed-repro many-metrics; do
  for layout in per-metric per-process; do
    d="$tmp/$workload-$layout"
    files=$(find "$d/store" -type f | wc -l)
    bytes=$(du -sb "$d/store" | cut -f1)
    row="$workload,$layout,$files,$bytes"
    for strategies in none default; do
      for rep in 1 2 3 4 5; do
        /usr/bin/time -f '%e %U %S %M' -o "$tmp/time" "$promlab" export --store "$d/store" \
          --registry "$d/registry.json" --strategies "$strategies" > "$tmp/out.prom" 2>>"$out/log.txt"
        read -r wall user sys rss < "$tmp/time"
        cmp -s "$tmp/out.prom" "$d/expected.prom" && result=identical || result=DIFFERENT
        echo "$row,export,$strategies,$rep,$wall,$(echo "$user + $sys" | bc),$rss,$result" >> "$csv"
      done
    done
    port=$((port + 1))
    "$promlab" serve --listen "127.0.0.1:$port" --store "$d/store" --registry "$d/registry.json" \
      >> "$out/log.txt" 2>&1 &
    server=$!
    for _ in $(seq 1 300); do curl -sf -o /dev/null "http://127.0.0.1:$port/metrics/promlab" && break; sleep 0.2; done
    before=$(ticks "$server")
    wall=$(curl -sf -o "$tmp/scrape.prom" -w '%{time_total}' "http://127.0.0.1:$port/metrics")
    after=$(ticks "$server")
    cmp -s "$tmp/scrape.prom" "$d/expected.prom" && result=identical || result=DIFFERENT
    rss=$(awk '/VmHWM/ {print $2}' "/proc/$server/status")
    echo "$row,first-scrape,default,1,$wall,$(echo "scale=4; ($after - $before) / $hz" | bc),$rss,$result" >> "$csv"
    for rep in 1 2 3; do
      before=$(ticks "$server")
      start=$(date +%s.%N)
      result=identical
      for _ in $(seq 1 20); do
        curl -sf -o "$tmp/scrape.prom" "http://127.0.0.1:$port/metrics"
        cmp -s "$tmp/scrape.prom" "$d/expected.prom" || result=DIFFERENT
      done
      end=$(date +%s.%N)
      after=$(ticks "$server")
      rss=$(awk '/VmHWM/ {print $2}' "/proc/$server/status")
      # Per scrape; the wall includes curl and cmp (the same for both layouts).
      echo "$row,warm-scrape,default,$rep,$(echo "scale=5; ($end - $start) / 20" | bc),$(echo "scale=5; ($after - $before) / $hz / 20" | bc),$rss,$result" >> "$csv"
    done
    kill "$server"; wait "$server" 2>/dev/null || true; server=""
  done
done
rm -f "$quiet"
echo "poc_sidecar: $(grep -c identical "$csv") of $(( $(wc -l < "$csv") - 1 )) rows identical; $csv"
