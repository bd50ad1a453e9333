#!/usr/bin/env python3
"""Writes the seed corpora (fuzz/seeds/<target>/) from the repository's real fixtures.

`cargo fuzz cmin` then keeps the seeds that add coverage in fuzz/corpus/<target>/.
Run from the repository's root: python3 fuzz/seeds.py
"""
import glob, json, os, re, struct

OUT = "fuzz/seeds"
FIX = "tests/fixtures"

def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

def snappy_decompress(b):
    """The snappy block format (raw, no framing)."""
    n, shift, i = 0, 0, 0
    while True:
        c = b[i]; i += 1
        n |= (c & 0x7F) << shift; shift += 7
        if c < 0x80:
            break
    out = bytearray()
    while i < len(b):
        tag = b[i]; i += 1
        kind = tag & 3
        if kind == 0:
            ln = tag >> 2
            if ln >= 60:
                nb = ln - 59
                ln = int.from_bytes(b[i:i + nb], "little"); i += nb
            ln += 1
            out += b[i:i + ln]; i += ln
            continue
        if kind == 1:
            ln = ((tag >> 2) & 7) + 4
            off = ((tag >> 5) << 8) | b[i]; i += 1
        elif kind == 2:
            ln = (tag >> 2) + 1
            off = int.from_bytes(b[i:i + 2], "little"); i += 2
        else:
            ln = (tag >> 2) + 1
            off = int.from_bytes(b[i:i + 4], "little"); i += 4
        for _ in range(ln):
            out.append(out[-off])
    assert len(out) == n
    return bytes(out)

def snappy_literals(raw):
    """A snappy block of literals only (valid, if not compressed)."""
    out, n = bytearray(), len(raw)
    while True:
        out.append((n & 0x7F) | (0x80 if n >= 0x80 else 0)); n >>= 7
        if not n:
            break
    for i in range(0, len(raw), 60):
        chunk = raw[i:i + 60]
        out.append((len(chunk) - 1) << 2)
        out += chunk
    return bytes(out)

# Selector byte of promlab::fuzzing::store_file: bits 0-2 the metric's type and aggregation.
SELECTOR = {("counter", "sum"): 0, ("gauge", "all"): 1, ("gauge", "sum"): 2, ("gauge", "max"): 3,
            ("gauge", "min"): 4, ("gauge", "most_recent"): 5, ("histogram", "sum"): 6,
            ("summary", "sum"): 7}

keys = set()
for case in sorted(glob.glob(f"{FIX}/ruby-dfs/*/")):
    name = os.path.basename(case.rstrip("/"))
    reg = json.load(open(os.path.join(case, "registry.json")))
    put("registry_json", f"{name}.json", open(os.path.join(case, "registry.json"), "rb").read())
    for m in reg["metrics"]:
        agg = m.get("aggregation") or ("all" if m["type"] == "gauge" else "sum")
        sel = SELECTOR[(m["type"], agg)]
        files = sorted(glob.glob(os.path.join(case, "store", f"metric_{m['name']}___*.bin")))
        for k, path in enumerate(files[:2]):
            data = open(path, "rb").read()
            used = struct.unpack_from("<i", data)[0]
            data = data[:max(used, 8)]  # the rest is zeros
            put("store_file", f"{name}-{m['name']}-{k}", bytes([sel | (8 if k else 0)]) + data)
            # A small variant of a big file: its first few entries, `used` rewritten.
            if used > 4096:
                pos = 8
                for _ in range(6):
                    pos += 4 + struct.unpack_from("<i", data, pos)[0] + 16
                small = struct.pack("<i", pos) + data[4:pos]
                put("store_file", f"{name}-{m['name']}-{k}-small", bytes([sel]) + small)
            pos = 8
            while pos + 4 <= used:
                ln = struct.unpack_from("<i", data, pos)[0]
                keys.add(data[pos + 4:pos + 4 + ln].rstrip(b" "))
                pos += 4 + ln + 16
for i, key in enumerate(sorted(keys)[:200]):
    put("form_key", f"key-{i:03}", key)

for path in sorted(glob.glob(f"{FIX}/remote-write/prometheus-2.42/*.bin")):
    body = open(path, "rb").read()
    n = os.path.basename(path)[:-4]
    put("remote_write", f"body-{n}", b"\x00" + body)
    if n in ("0000", "0001", "0005"):
        raw = snappy_decompress(body)
        put("remote_write", f"raw-{n}", b"\x01" + raw)
        # A small variant: the request's first few top-level fields (series, metadata).
        pos, fields = 0, 0
        while pos < len(raw) and fields < 4:
            pos += 1
            ln, shift = 0, 0
            while True:
                c = raw[pos]; pos += 1
                ln |= (c & 0x7F) << shift; shift += 7
                if c < 0x80:
                    break
            pos += ln; fields += 1
        put("remote_write", f"raw-{n}-small", b"\x01" + raw[:pos])
        put("remote_write", f"body-{n}-small", b"\x00" + snappy_literals(raw[:pos]))

for path in sorted(glob.glob("experiments/plans/*.toml") + glob.glob("experiments/scenarios/*.toml")):
    put("plan_toml", os.path.basename(os.path.dirname(path)) + "-" + os.path.basename(path),
        open(path, "rb").read())
put("plan_toml", "default.toml", b"""lateness_secs = 5
keep_windows = 10
[[aggregation]]
id = "data"
metric = "data"
group_by = ["label_0"]
window_secs = 60
relative_accuracy = 0.01
quantiles = [0.5, 0.9, 0.99]
match = { job = "feeder" }
""")

for i, q in enumerate([b"agg=scrape_duration", b"agg=gc_pause&window=1700000060000",
                       b"agg=data&window=-1", b"agg=scrape%5Finterval&window=+5",
                       b"window=0&agg=data&agg=x", b"agg=d%C3%A9j%C3%A0+vu"]):
    put("quantiles_query", f"query-{i}", q)
