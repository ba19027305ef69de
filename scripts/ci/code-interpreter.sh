#!/usr/bin/env bash
# The code-interpreter-v1 template's root (issue 31), end to end, as root on Debian 12:
# downloads the pinned, hashed wheelhouse of images/code-interpreter-v1/requirements.txt
# (cached in ${AIRLOCK_CI_CACHE:-/var/cache/airlock-ci}, keyed on the file), builds the
# image with `airlock image build` (its debootstrap base cached beside the other images'),
# then starts `airlock serve` on 127.0.0.1 with a kernel-session policy whose root is that
# image and runs a notebook's calls on it: IPython itself (a magic, !cmd), a pandas
# DataFrame's HTML, a matplotlib figure as a PNG result, display(). Then E2B's code
# interpreter SDK (the venv of scripts/ci/e2b.sh) against a server whose code-interpreter-v1
# template names that image (crates/airlock-e2b/tests/sdk/test_code_interpreter_image.py and
# the run_code tests of test_python_sdk.py). Stops only the servers it started, by pid.
set -euo pipefail
cd "$(dirname "$0")/../.."

. scripts/ci/lib.sh
ci_begin code-interpreter.sh "debootstrap, chroot, the native sandbox"
spec_dir="images/code-interpreter-v1"
need=()
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v curl >/dev/null || need+=(curl)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
ci_install "${need[@]}"

# 1. The wheelhouse: exactly the hashed wheels, for Debian 12's python3 (3.11) on x86_64.
key="$(sha256sum "$spec_dir/requirements.txt" | cut -c1-16)"
wheels="$cache/wheelhouse-code-interpreter-$key"
if [ ! -f "$wheels/.airlock-complete" ]; then
  log "downloading the wheelhouse into $wheels"
  rm -rf "$wheels.tmp"
  PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip download -q --disable-pip-version-check \
    --no-deps --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any \
    --require-hashes -r "$spec_dir/requirements.txt" -d "$wheels.tmp" >&2
  rm -rf "$wheels"
  mv "$wheels.tmp" "$wheels"
  touch "$wheels/.airlock-complete"
fi

# 2. The image: the spec as committed, its wheelhouse the cached one.
work="$(mktemp -d /tmp/airlock-code-interpreter.XXXXXX)"
chmod 755 "$work"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$work"
}
trap cleanup EXIT
cp "$spec_dir/code-interpreter.toml" "$spec_dir/requirements.txt" "$work/"
ln -s "$wheels" "$work/wheels"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
ci_airlock_bin
airlock="$AIRLOCK_BIN"
store="$work/store"
mkdir -p "$cache/images"
log "airlock image build $spec_dir/code-interpreter.toml"
id=$("$airlock" image --store "$store" build "$work/code-interpreter.toml" --cache "$cache/images")
log "image airlock-code-interpreter:v1@$id"

# 3. A kernel session on it, through the HTTP API.
# A free port (another server on this machine must not answer for ours).
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
cat >"$work/policy.toml" <<POLICY
version = "code-interpreter-ci"
[filesystem]
rootfs = "image:airlock-code-interpreter:v1@$id"
[images]
store = "$store"
[limits]
memory = "1GiB"
timeout = "60s"
[sessions]
enabled = true
mode = "kernel"
POLICY
"$airlock" serve --listen "127.0.0.1:$port" --policy "$work/policy.toml" >"$work/serve.log" 2>&1 &
server_pid=$!
for _ in $(seq 1 200); do
  curl -sf "http://127.0.0.1:$port/v1/health" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "http://127.0.0.1:$port/v1/health" >/dev/null && kill -0 "$server_pid" 2>/dev/null \
  || { cat "$work/serve.log" >&2; exit 1; }
AIRLOCK_URL="http://127.0.0.1:$port" python3 - <<'CHECK'
import json, os, urllib.error, urllib.request

url = os.environ["AIRLOCK_URL"]

def post(path, body):
    request = urllib.request.Request(url + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.load(response)
    except urllib.error.HTTPError as e:
        raise SystemExit("POST %s: %s %s" % (path, e.code, e.read().decode(errors="replace")))

session = post("/v1/sessions", {})["id"]
def run(code, **extra):
    answer = post("/v1/sessions/%s/runs" % session, dict(code=code, timeout_s=60, **extra))
    assert answer["observation"]["outcome"] == "exited", answer
    return answer

run("import numpy as np, pandas as pd, matplotlib.pyplot as plt, IPython")
ipython = run("!echo from-a-shell\n%time total = sum(range(10))\ntotal")
assert "from-a-shell" in ipython["observation"]["stdout"], ipython
assert ipython["value"] == "45", ipython
table = run("pd.DataFrame({'x': [1, 2, 3], 'y': [4.0, 5.5, 6.25]})", html=True)
main = table["results"][-1]
assert main["is_main_result"] and "<table" in main["html"], table
chart = run("plt.plot(np.arange(10), np.arange(10) ** 2)\nplt.show()\ndisplay(IPython.display.HTML('<b>x</b>'))")
kinds = [sorted(k for k in r if r[k] and k != "is_main_result") for r in chart["results"]]
assert kinds == [["png", "text"], ["html", "text"]], chart
import base64
assert base64.b64decode(chart["results"][0]["png"])[:8] == b"\x89PNG\r\n\x1a\n", chart
print("code-interpreter-v1: IPython, pandas HTML, a matplotlib PNG and display() on the image")
CHECK
kill "$server_pid" 2>/dev/null || true
for _ in $(seq 1 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
server_pid=""

# 4. E2B's code interpreter SDK, unmodified (the current pair of scripts/ci/e2b.sh), on a
# server whose code-interpreter-v1 template names the image (conftest.py writes
# rootfs = "image:…" and memory = "1GiB" into the template; the policy's own root stays
# the host's): IPython magics, !cmd, pandas HTML, a matplotlib PNG, display(), then the
# code-interpreter tests of test_python_sdk.py on the image.
venv="$(scripts/ci/e2b.sh --venv current)"
log "E2B SDK on the image: $("$venv/bin/pip" list 2>/dev/null | awk '/^e2b(-code-interpreter)? /{printf "%s %s  ", $1, $2}')"
(
  cd crates/airlock-e2b/tests/sdk
  AIRLOCK_BIN="$airlock" PYTHONDONTWRITEBYTECODE=1 \
    AIRLOCK_E2B_TEMPLATE_IMAGE="image:airlock-code-interpreter:v1@$id" \
    AIRLOCK_E2B_IMAGE_STORE="$store" \
    "$venv/bin/python" -m pytest -p no:cacheprovider -rs -q test_code_interpreter_image.py \
    test_python_sdk.py::test_run_code_on_the_kernel \
    test_python_sdk.py::test_run_code_returns_charts_and_tables \
    test_python_sdk.py::test_code_contexts_display_and_tracebacks \
    test_python_sdk.py::test_display_results_arrive_as_the_cell_makes_them
)
log "passed"
