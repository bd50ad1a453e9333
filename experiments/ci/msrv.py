#!/usr/bin/env python3
"""The true minimum Rust version, derived from the lockfile.

For each workspace package: the highest `rust-version` declared by anything it
builds with (normal, build and dev dependencies, transitively, as locked). The
package's own `rust-version` must be at least that; otherwise it promises a
toolchain its locked dependencies refuse. Exits 1 on a false promise.
Usage: python3 experiments/ci/msrv.py   (from anywhere in the repository)
"""
import json
import subprocess
import sys


def version(text):
    parts = [int(part) for part in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def show(v):
    return ".".join(map(str, v[:2] if v[2] == 0 else v))


meta = json.loads(subprocess.run(
    ["cargo", "metadata", "--format-version", "1", "--locked"],
    check=True, capture_output=True, text=True).stdout)
packages = {p["id"]: p for p in meta["packages"]}
deps = {node["id"]: [d["pkg"] for d in node["deps"]] for node in meta["resolve"]["nodes"]}

failed = False
for member in meta["workspace_members"]:
    seen, stack = set(), [member]
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.add(pid)
            # The resolve lists a member's dev-dependencies too (its tests need
            # them), and for every other package only what its build needs.
            stack.extend(deps.get(pid, []))
    needed = max(
        ((version(packages[p]["rust_version"]), packages[p]["name"])
         for p in seen - {member} if packages[p].get("rust_version")),
        default=((1, 0, 0), "nothing"))
    pkg = packages[member]
    declared = version(pkg["rust_version"]) if pkg.get("rust_version") else (1, 0, 0)
    verdict = "ok" if declared >= needed[0] else "TOO LOW"
    failed |= declared < needed[0]
    print(f"{pkg['name']}: rust-version {show(declared)}, locked dependencies need "
          f"{show(needed[0])} ({needed[1]}): {verdict}")
sys.exit(1 if failed else 0)
