#!/usr/bin/env bash
# Installs the peer systems `promlab ablate --peers` compares against, each by
# name from its package registry (nothing vendored). Run as root on Debian 12.
# A peer that is not installed is skipped by the run, with the reason.
# `install.sh --with-clickhouse` adds the optional peers of `--with-clickhouse` (~800 MB).
set -euo pipefail

apt_install() {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

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
    apt_install "${ingest_packages[@]}"
fi
if [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus.service victoria-metrics.service 2>/dev/null || true
fi
# chdb (optional, --with-clickhouse): embedded ClickHouse for Python, ~800 MB;
# experiments/peers/chdb_ingest.py runs it.
case " $* " in *" --with-clickhouse "*) with_chdb=true ;; *) with_chdb=false ;; esac
if $with_chdb && ! python3 -c 'import chdb' 2>/dev/null; then
    python3 -m pip install --quiet chdb
fi
