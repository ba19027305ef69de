#!/usr/bin/env bash
# The crate graph stays as docs/architecture.md draws it:
# - No backend crate depends on another backend crate, by any kind of dependency (normal,
#   build or dev): what they share lives in airlock-host (or airlock-core), so a backend
#   can be built, changed and reviewed on its own, its tests included (airlock-kube's fake
#   kubelet is airlock-testkit's, which depends on no backend).
# - No source file is compiled through `#[path]` outside a crate's tests/ directory: code
#   that two crates run is a crate both depend on (as airlock-init is), so it shows in the
#   graph and is checked as a crate's.
# Exits 1 naming each offending edge and file.
set -euo pipefail
cd "$(dirname "$0")/../.."

cargo metadata --format-version 1 --no-deps --locked | python3 -c '
import json, re, subprocess, sys

BACKENDS = {"airlock-native", "airlock-docker", "airlock-kube"}
metadata = json.load(sys.stdin)
failed = False
edges = sorted(
    (package["name"], dep["name"], dep["kind"] or "normal")
    for package in metadata["packages"]
    if package["name"] in BACKENDS
    for dep in package["dependencies"]
    if dep["name"] in BACKENDS
)
for source, target, kind in edges:
    print(f"crate-graph: backend {source} depends on backend {target} ({kind} dependency)", file=sys.stderr)
    failed = True
missing = BACKENDS - {package["name"] for package in metadata["packages"]}
for name in sorted(missing):
    print(f"crate-graph: backend {name} is not a workspace member (renamed? update this script)", file=sys.stderr)
    failed = True

# Every tracked Rust file outside a crate'"'"'s tests/ directory.
sources = subprocess.run(
    ["git", "ls-files", "-z", "--", "*.rs"], check=True, capture_output=True, text=True
).stdout.split("\0")
path_attribute = re.compile(r"#\s*\[\s*path\s*=")
for source in sorted(filter(None, sources)):
    if re.match(r"crates/[^/]+/tests/", source):
        continue
    with open(source, encoding="utf-8") as text:
        for number, line in enumerate(text, 1):
            if path_attribute.search(line.split("//", 1)[0]):
                print(f"crate-graph: {source}:{number}: #[path] outside tests (make the shared code a crate)", file=sys.stderr)
                failed = True
sys.exit(1 if failed else 0)
'
