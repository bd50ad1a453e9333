#!/usr/bin/env bash
# Runs fuzz targets for a fixed time, at most two at once: ./run-pair.sh SECONDS TARGET:MAXLEN...
# Corpus grows in corpus-work/<target> (seeded from corpus/<target> and seeds/<target>);
# crashes go to artifacts/<target>/, libFuzzer's log to logs/<target>.log.
set -u
cd "$(dirname "$0")"
secs=$1; shift
B=${B:-target/checked/x86_64-unknown-linux-gnu/release}
for spec in "$@"; do
    t=${spec%%:*}; ml=${spec##*:}
    mkdir -p corpus-work/$t artifacts/$t logs
    seeds=(); for d in corpus/$t seeds/$t; do [ -d $d ] && seeds+=($d); done
    dict=(); [ -f $t.dict ] && dict=(-dict=$t.dict)
    $B/$t "${dict[@]}" -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 -timeout=10 -rss_limit_mb=2048 \
        -max_total_time=$secs -max_len=$ml -print_final_stats=1 -artifact_prefix=artifacts/$t/ \
        corpus-work/$t "${seeds[@]}" > logs/$t${TAG:-}.log 2>&1 &
done
wait
