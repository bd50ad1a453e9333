#!/usr/bin/env python3
"""The embedded-ClickHouse ingest peer (PyPI `chdb`), run by `promlab ablate --peers
--with-clickhouse` (src/harness/peers/chdb.rs), which writes the feed's samples as
RowBinary files of 100,000 rows each and reads this script's JSON answer.

Each batch file goes into a `Null` table through `INSERT … SELECT FROM file(…, RowBinary)`;
a materialized view keeps `quantilesDDState(0.01, 0.5, 0.9, 0.99)` and a count per
(label_0, minute) in an AggregatingMergeTree, as promlab keeps a DDSketch per group per
window. The CPU time of this process (all of chDB's threads run in it) is read around each
insert; at the end the minute asked for is merged and printed per group.

usage: chdb_ingest.py --session DIR --minute-ms W BATCH.bin...
prints: {"batch_cpu_ns": [...], "max_rss_kib": N,
         "groups": {"g0": {"count": n, "quantiles": [p50, p90, p99]}, ...}}
"""

import argparse
import json
import resource
import sys

from chdb import session as chs

SCHEMA = "label_0 String, instance String, ts DateTime64(3, 'UTC'), value Float64"


def literal(text):
    """A ClickHouse string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def cpu_ns():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return int((usage.ru_utime + usage.ru_stime) * 1e9)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--session", required=True, help="chDB's data directory")
    parser.add_argument("--minute-ms", type=int, required=True, help="the minute to answer")
    parser.add_argument("batches", nargs="+")
    args = parser.parse_args()

    db = chs.Session(args.session)
    db.query("CREATE DATABASE IF NOT EXISTS lab")
    db.query(f"CREATE TABLE lab.samples ({SCHEMA}) ENGINE = Null")
    db.query(
        "CREATE TABLE lab.minutes (label_0 String, minute DateTime('UTC'), "
        "n AggregateFunction(count), "
        "q AggregateFunction(quantilesDD(0.01, 0.5, 0.9, 0.99), Float64)) "
        "ENGINE = AggregatingMergeTree ORDER BY (label_0, minute)"
    )
    db.query(
        "CREATE MATERIALIZED VIEW lab.per_minute TO lab.minutes AS "
        "SELECT label_0, toStartOfMinute(ts) AS minute, countState() AS n, "
        "quantilesDDState(0.01, 0.5, 0.9, 0.99)(value) AS q "
        "FROM lab.samples GROUP BY label_0, minute"
    )

    batch_cpu_ns = []
    for path in args.batches:
        before = cpu_ns()
        db.query(
            f"INSERT INTO lab.samples SELECT * FROM file({literal(path)}, 'RowBinary', {literal(SCHEMA)})"
        )
        batch_cpu_ns.append(cpu_ns() - before)

    minute_s = args.minute_ms // 1000
    result = db.query(
        "SELECT label_0, countMerge(n) AS count, "
        "quantilesDDMerge(0.01, 0.5, 0.9, 0.99)(q) AS quantiles FROM lab.minutes "
        f"WHERE minute = toDateTime({minute_s}, 'UTC') GROUP BY label_0",
        "JSONEachRow",
    )
    groups = {}
    for line in result.bytes().decode().splitlines():
        if line.strip():
            row = json.loads(line)
            groups[row["label_0"]] = {
                "count": int(row["count"]),
                "quantiles": [float(v) for v in row["quantiles"]],
            }
    db.close()
    json.dump(
        {
            "batch_cpu_ns": batch_cpu_ns,
            "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "groups": groups,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
