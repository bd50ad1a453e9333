#!/usr/bin/env bash
# promlab's sidecar on the stores of options_bench.rb's churn, beside the Ruby figures: a
# one-shot `promlab export` (the baseline strategies and the default set) and a warm scrape of
# `promlab serve --store`, each exposition compared with client_ruby 4.2.5's.
#
#   options_sidecar.sh CHURN_DIR REFERENCE_PROM PROMLAB OUT_CSV
#
# CHURN_DIR holds per-metric/, per-metric-folded/, poc/, poc-folded/ (each store/ and
# registry.json; options_bench.rb --keep-churn DIR keeps them). Each measurement reads a
# hard-linked copy, so nothing the sidecar might write reaches the next one. Timed inside the
# QUIET protocol when PROMLAB_QUIET names the lock file. Loopback only.
set -euo pipefail
churn="$1" reference="$2" promlab="$3" out="$4"
quiet="${PROMLAB_QUIET:-}" me="${PROMLAB_QUIET_NAME:-options_sidecar}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/promlab-sidecar.XXXXXX")"
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$tmp"; [ -n "$quiet" ] && [ "$(cat "$quiet" 2>/dev/null)" = "$me" ] && rm -f "$quiet"; true; }
trap cleanup EXIT

if [ -n "$quiet" ]; then
  while [ -e "$quiet" ] && [ "$(cat "$quiet")" != "$me" ]; do sleep 30; done
  echo "$me" > "$quiet"
fi
echo "store,mode,strategies,rep,wall_s,cpu_s,peak_rss_kb,result" > "$out"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
port=19431
for s in per-metric per-metric-folded poc poc-folded; do
  for strategies in none default; do
    for rep in 1 2 3; do
      copy="$tmp/$s-$strategies-$rep"; mkdir -p "$copy"; cp -al "$churn/$s/store" "$copy/store"
      /usr/bin/time -f '%e %U %S %M' -o "$tmp/time" "$promlab" export --store "$copy/store" \
        --registry "$churn/$s/registry.json" --strategies "$strategies" > "$tmp/out.prom" 2>"$tmp/err"
      read -r wall user sys rss < "$tmp/time"
      cmp -s "$tmp/out.prom" "$reference" && result=identical || result=DIFFERENT
      echo "$s,export,$strategies,$rep,$wall,$(echo "$user + $sys" | bc),$rss,$result" >> "$out"
      rm -rf "$copy"
    done
  done
  copy="$tmp/$s-serve"; mkdir -p "$copy"; cp -al "$churn/$s/store" "$copy/store"
  port=$((port + 1))
  "$promlab" serve --listen "127.0.0.1:$port" --store "$copy/store" --registry "$churn/$s/registry.json" \
    > "$tmp/serve.log" 2>&1 &
  server=$!
  for _ in $(seq 1 300); do curl -sf -o /dev/null "http://127.0.0.1:$port/metrics/promlab" && break; sleep 0.2; done
  for rep in 0 1 2 3 4 5; do  # 0: the first scrape; 1-5 warm
    before=$(ticks "$server")
    wall=$(curl -sf -o "$tmp/scrape.prom" -w '%{time_total}' "http://127.0.0.1:$port/metrics")
    after=$(ticks "$server")
    cmp -s "$tmp/scrape.prom" "$reference" && result=identical || result=DIFFERENT
    rss=$(awk '/VmHWM/ {print $2}' "/proc/$server/status")
    echo "$s,serve,default,$rep,$wall,$(echo "scale=3; ($after - $before) / $hz" | bc),$rss,$result" >> "$out"
  done
  kill "$server"; wait "$server" 2>/dev/null || true; server=""
  rm -rf "$copy"
done
echo "options_sidecar: $(grep -c identical "$out") of $(( $(wc -l < "$out") - 1 )) expositions identical; $out"
