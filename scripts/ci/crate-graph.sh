#!/usr/bin/env bash
# No backend crate depends on another backend crate: what they share lives in airlock-host
# (or airlock-core), so a backend can be built, changed and reviewed on its own. Normal and
# build dependencies count; dev-dependencies do not (airlock-kube's tests drive a fake
# kubelet through airlock-docker's Engine API client, which no airlock binary links).
# Exits 1 naming each offending edge.
set -euo pipefail
cd "$(dirname "$0")/../.."

cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, sys

BACKENDS = {"airlock-native", "airlock-docker", "airlock-kube"}
metadata = json.load(sys.stdin)
edges = sorted(
    (package["name"], dep["name"], dep["kind"] or "normal")
    for package in metadata["packages"]
    if package["name"] in BACKENDS
    for dep in package["dependencies"]
    if dep["name"] in BACKENDS and dep["kind"] != "dev"
)
for source, target, kind in edges:
    print(f"crate-graph: backend {source} depends on backend {target} ({kind} dependency)", file=sys.stderr)
missing = BACKENDS - {package["name"] for package in metadata["packages"]}
for name in sorted(missing):
    print(f"crate-graph: backend {name} is not a workspace member (renamed? update this script)", file=sys.stderr)
sys.exit(1 if edges or missing else 0)
'
