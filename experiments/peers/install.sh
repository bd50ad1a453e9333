#!/usr/bin/env bash
# Installs the peers `promlab ablate --peers` compares against, by name from
# their package registries (nothing vendored). Idempotent: run it again to
# repair or after a pin changes.
#
#   experiments/peers/install.sh                    # every peer but chdb
#   experiments/peers/install.sh --with-clickhouse  # also chdb (~800 MB)
#
# Sections by stage, so each peer's lines stay together.
set -euo pipefail
cd "$(dirname "$0")"

with_clickhouse=false
for arg in "$@"; do
    case "$arg" in
        --with-clickhouse) with_clickhouse=true ;;
        -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
        *) echo "unknown option: $arg" >&2; exit 2 ;;
    esac
done

# One virtualenv for the Python peers (gitignored); the harness prefers its python3.
venv=.venv
if [ ! -x "$venv/bin/python3" ]; then
    python3 -m venv "$venv"
fi
pip_install() { "$venv/bin/python3" -m pip install --quiet "$@"; }

# export peers
# Python prometheus_client in multiprocess mode (peer:python-prometheus-client).
PROMETHEUS_CLIENT_VERSION=0.26.0
pip_install "prometheus_client==$PROMETHEUS_CLIENT_VERSION"
# The Rust crates (peer:prometheus-client-rs, peer:prometheus-rs) are cargo
# dependencies of promlab: nothing to install here.

# ingest peers
# prometheus: Prometheus 2.42 (its remote-write receiver; .ci/run installs it too).
# victoria-metrics: VictoriaMetrics 1.79 single-node.
# Each peer run starts its own copy on a loopback port with a scratch data
# directory. On a host where systemd runs, the packages also start their
# services (listening on all interfaces, :9090 and :8428): stop and disable
# those, so nothing but the peer runs compete for the CPU being measured.
ingest_packages=()
command -v prometheus >/dev/null 2>&1 || ingest_packages+=(prometheus)
command -v victoria-metrics >/dev/null 2>&1 || ingest_packages+=(victoria-metrics)
if [ "${#ingest_packages[@]}" -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${ingest_packages[@]}" >/dev/null
fi
if [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus.service victoria-metrics.service 2>/dev/null || true
fi
# Embedded ClickHouse (peer:chdb, experiments/peers/chdb_ingest.py), only with
# --with-clickhouse: an ~800 MB wheel.
CHDB_VERSION=4.4.0
if $with_clickhouse; then
    pip_install "chdb==$CHDB_VERSION"
fi

echo "Python peers in $(pwd)/$venv:"
"$venv/bin/python3" - <<'PY'
import importlib.metadata as m
for name in ("prometheus_client", "chdb"):
    try:
        print(f"  {name} {m.version(name)}")
    except m.PackageNotFoundError:
        pass
PY
