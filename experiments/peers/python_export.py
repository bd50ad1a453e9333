"""Export peer: Python prometheus_client in multiprocess mode.

    python_export.py WORKDIR REPEATS

WORKDIR (written by promlab's peer, src/harness/peers/python_export.rs) holds
  registry.json      the scenario's metrics (promlab's registry format)
  ops/ops-<pid>.jsonl one op log per writer process (src/scenarios/op_log.rs)
  promlab.prom       promlab's exposition of the same workload

One real process per op log (multiprocessing, spawn) replays its ops through
prometheus_client's own metrics with PROMETHEUS_MULTIPROC_DIR=WORKDIR/store, so
the .db files are prometheus_client's. This process then times REPEATS exports
(MultiProcessCollector + generate_latest, after one untimed warm-up), checks
that every sample equals promlab's, and prints one JSON object on stdout.
A mismatch exits non-zero with the differences on stderr.
"""

import json
import math
import multiprocessing
import os
import re
import resource
import sys
import time


def peak_rss_kib():
    """This process's peak resident set size, in KiB.

    VmHWM, not ru_maxrss: Linux keeps ru_maxrss across execve, so a process
    started by a large parent (promlab, holding 630k series) would report the
    parent's peak. VmHWM belongs to the address space, which exec replaces.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def make_metrics(registry_path):
    """The scenario's metrics as prometheus_client objects, by promlab name."""
    from prometheus_client import Counter, Histogram

    with open(registry_path) as f:
        defs = json.load(f)["metrics"]
    metrics = {}
    for d in defs:
        kind, name, labels = d["type"], d["name"], d["labels"]
        # registry=None: the values live in the .db files, not in a registry.
        if kind == "counter":
            metrics[name] = Counter(name, d["help"], labels, registry=None)
        elif kind == "histogram":
            buckets = [float(b) for b in d["buckets"]]
            metrics[name] = Histogram(name, d["help"], labels, buckets=buckets, registry=None)
        else:
            raise ValueError(f"metric {name}: type {kind} has no mapping in this peer")
    return metrics


def write_process(registry_path, ops_path):
    """One writer process: replays an op log the way an application calls the client."""
    metrics = make_metrics(registry_path)
    with open(ops_path) as f:
        for line in f:
            if not line.strip():
                continue
            op = json.loads(line)
            child = metrics[op["metric"]].labels(**op["labels"])
            # float() reads the op log's "Infinity"/"-Infinity"/"NaN" too.
            value = float(op["value"])
            kind = op["op"]
            if kind == "observe":
                child.observe(value)
            elif kind == "inc":
                child.inc(value)
            else:
                raise ValueError(f"op {kind} has no mapping in this peer")


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')
UNESCAPE = re.compile(r"\\(.)")


def parse_exposition(text):
    """Sample lines → {(name, sorted labels): value}; `le` compared as a number."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            raise ValueError(f"unparsable sample line: {line[:200]}")
        name, label_text, value = m.groups()
        labels = []
        pos = 0
        label_text = label_text or ""
        while pos < len(label_text):
            lm = LABEL.match(label_text, pos)
            if not lm:
                raise ValueError(f"unparsable labels: {label_text[pos:pos + 200]}")
            key = lm.group(1)
            val = UNESCAPE.sub(lambda e: "\n" if e.group(1) == "n" else e.group(1), lm.group(2))
            if key == "le":
                val = float(val)
            labels.append((key, val))
            pos = lm.end()
        key = (name, tuple(sorted(labels)))
        if key in samples:
            raise ValueError(f"duplicate sample {key}")
        samples[key] = float(value)
    return samples


def compare(ours, theirs):
    """Differences between two parsed expositions (empty when they agree)."""
    problems = []
    missing = [k for k in ours if k not in theirs]
    extra = [k for k in theirs if k not in ours]
    if missing:
        problems.append(f"{len(missing)} of promlab's samples missing, e.g. {missing[0]}")
    if extra:
        problems.append(f"{len(extra)} samples promlab does not have, e.g. {extra[0]}")
    # Sums may differ in the last bits: the processes are added in another order.
    differ = [
        k for k in ours
        if k in theirs and not math.isclose(ours[k], theirs[k], rel_tol=1e-9, abs_tol=1e-12)
    ]
    if differ:
        k = differ[0]
        problems.append(f"{len(differ)} values differ, e.g. {k}: promlab {ours[k]!r}, prometheus_client {theirs[k]!r}")
    return problems


def main():
    workdir, repeats = sys.argv[1], int(sys.argv[2])
    store = os.path.join(workdir, "store")
    os.makedirs(store, exist_ok=True)
    # Before prometheus_client is imported anywhere: it picks its value class
    # (mmap'd files or plain floats) at import. Spawned writers inherit it.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = store
    registry_path = os.path.join(workdir, "registry.json")
    ops_dir = os.path.join(workdir, "ops")
    logs = sorted(os.path.join(ops_dir, n) for n in os.listdir(ops_dir) if n.endswith(".jsonl"))

    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=write_process, args=(registry_path, log)) for log in logs]
    try:
        for w in writers:
            w.start()
        for w in writers:
            w.join()
    finally:
        # Leave nothing running, whatever happened.
        for w in writers:
            if w.is_alive():
                w.terminate()
                w.join()
    failed = [w.exitcode for w in writers if w.exitcode != 0]
    if failed:
        sys.exit(f"{len(failed)} writer processes failed (exit codes {failed})")

    from importlib.metadata import version
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=store)
    text = generate_latest(registry)
    # Peak after one export, to tell one export's footprint from growth over repeats.
    rss_first_kib = peak_rss_kib()
    samples_ns = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        generate_latest(registry)
        samples_ns.append(time.perf_counter_ns() - start)
    # The exporter's peak (the writers were other processes), before the check
    # below parses both expositions.
    rss_kib = peak_rss_kib()

    with open(os.path.join(workdir, "promlab.prom"), encoding="utf-8") as f:
        ours = parse_exposition(f.read())
    theirs = parse_exposition(text.decode("utf-8"))
    problems = compare(ours, theirs)
    if problems:
        sys.exit("prometheus_client's exposition differs from promlab's:\n  " + "\n  ".join(problems))

    files = [os.path.join(store, n) for n in os.listdir(store)]
    json.dump(
        {
            "prometheus_client": version("prometheus_client"),
            "python": sys.version.split()[0],
            "samples_ns": samples_ns,
            "lines": text.count(b"\n"),
            "samples": len(theirs),
            "processes": len(writers),
            "db_files": len(files),
            "store_bytes": sum(os.path.getsize(p) for p in files),
            "rss_kib": rss_kib,
            "rss_first_kib": rss_first_kib,
        },
        sys.stdout,
    )
    print()


if __name__ == "__main__":
    main()
