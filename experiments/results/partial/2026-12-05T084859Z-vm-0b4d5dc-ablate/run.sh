#!/usr/bin/env bash
# Issue 26's full run: one binary, the commands one after the other, each logged.
set -u
cd /work/main
R="$1"
B=/tmp/promlab-run
mkdir -p "$R"
echo "binary: target/release/promlab built at $(git rev-parse --short HEAD) ($(git rev-parse HEAD)), copied to $B before the first command" > "$R/commands.log"
step() {
  local log="$1"; shift
  echo "== $(date -u +%H:%M:%S) start: promlab $*" >> "$R/commands.log"
  echo "      $(uptime)" >> "$R/commands.log"
  "$B" "$@" > "$R/$log" 2>&1
  local rc=$?
  echo "== $(date -u +%H:%M:%S) end ($rc): promlab $*" >> "$R/commands.log"
  echo "      $(uptime)" >> "$R/commands.log"
}
step log-ablate.txt ablate seed-repro large large-ruby many-processes-5k many-metrics many-processes prometheus-captures write-long-label rabbitmq-per-object asap-query --peers --peak-rss --out "$R"
step log-ablate-asap-1e5.txt ablate asap-1e5 --quick --peers --peak-rss --out "$R"
step log-scale-quick.txt scale --quick --peak-rss --out "$R/quick"
step log-profiles.txt profiles --quick --seconds 3 --out "$R"
step log-scale.txt scale export-files export-series-per-file render-series ingest-lanes ingest-churn ingest-groups --out "$R"
step log-scale-query.txt scale query-groups --out "$R"
echo "== $(date -u +%H:%M:%S) all done" >> "$R/commands.log"
echo "      $(uptime)" >> "$R/commands.log"
