#!/usr/bin/env python3
"""Checks that a client generated with openapi-python-client from the served OpenAPI
document handles every outcome and every error body airlock sends.

Usage:
  openapi_client_check.py BASE TOKEN      BASE is http://HOST:PORT of a live `airlock serve`

Generates the client from BASE/v1/openapi.json into a temporary directory (the generator
is the `openapi-python-client` next to this venv's python), imports it, and with it posts
runs that end `exited`, `timeout` and `oom`, and requests refused as invalid_input (400,
413), policy_denied (403) and unauthorized (401): each response must parse into the
generated typed models without raising, with the right outcome or error kind.
"""
import importlib
import os
import subprocess
import sys
import tempfile
import urllib.request

from airlock_cases import Report

PACKAGE = "airlock_generated_client"
# Above the server's default --max-body (16MiB): the 413 body.
TOO_LARGE_BYTES = 17 * 1024 * 1024


def generate(base, workdir, report):
    """Generates the client package under workdir; returns True when it did."""
    spec = os.path.join(workdir, "openapi.json")
    with urllib.request.urlopen(f"{base}/v1/openapi.json", timeout=30) as response, open(spec, "wb") as f:
        f.write(response.read())
    config = os.path.join(workdir, "config.yml")
    with open(config, "w") as f:
        f.write(f"project_name_override: airlock-generated-client\npackage_name_override: {PACKAGE}\n")
    bindir = os.path.dirname(sys.executable)
    # The generator runs ruff (its own dependency, in this venv's bin) over the output.
    env = {**os.environ, "PATH": bindir + os.pathsep + os.environ.get("PATH", "")}
    result = subprocess.run(
        [os.path.join(bindir, "openapi-python-client"), "generate", "--path", spec, "--config", config,
         "--meta", "none", "--output-path", os.path.join(workdir, PACKAGE)],
        capture_output=True, text=True, env=env, timeout=300)
    output = (result.stdout + result.stderr).strip()
    report.ok(result.returncode == 0, f"openapi-python-client generates a client (exit {result.returncode})")
    # Warnings name what the generator left out; only the metrics text body may be missing
    # (a plain-text exposition has no model to generate).
    warnings = [block for block in output.split("\n\n") if block.strip().startswith("WARNING")]
    others = [w for w in warnings if "/metrics" not in w]
    report.ok(not others, f"the generator warns about nothing but /metrics ({' | '.join(others)[:1500]})")
    if output:
        print(output[:3000], flush=True)
    return result.returncode == 0


def main():
    base, token = sys.argv[1].rstrip("/"), sys.argv[2]
    report = Report("openapi-python-client")
    with tempfile.TemporaryDirectory(prefix="airlock-openapi-client-") as workdir:
        if not generate(base, workdir, report):
            report.finish()
        sys.path.insert(0, workdir)
        client_module = importlib.import_module(PACKAGE)
        models = importlib.import_module(f"{PACKAGE}.models")
        run_api = importlib.import_module(f"{PACKAGE}.api.default.run")
        exercise(base, token, report, client_module, models, run_api)
    report.finish()


def exercise(base, token, report, client_module, models, run_api):
    for name in ("RunRequest", "Observation", "ErrorBody", "RequestFile"):
        report.ok(hasattr(models, name), f"the client has a {name} model")
    run_request = getattr(models, "RunRequest", None)
    client = client_module.AuthenticatedClient(base_url=base, token=token, raise_on_unexpected_status=True,
                                               timeout=60.0)
    bad_client = client_module.AuthenticatedClient(base_url=base, token="alk_wrong", raise_on_unexpected_status=True,
                                                   timeout=60.0)

    def post(what, body, expect_status, check, via=client, typed=True):
        """Posts `body` through the generated client (as a RunRequest when there is one)
        and checks the typed result; a parse error is a failure of `what`."""
        try:
            if typed and run_request is not None:
                request = run_request.from_dict(body)
                report.ok(request.to_dict() == body, f"{what}: RunRequest round-trips the body ({request.to_dict()})")
                response = run_api.sync_detailed(client=via, body=request)
            elif run_request is not None:
                # A body RunRequest cannot hold (an unknown field, one too large to bother):
                # sent as is, the answer parsed by the generated code.
                raw = via.get_httpx_client().post("/v1/runs", json=body)
                response = run_api._build_response(client=via, response=raw)
            else:
                response = run_api.sync_detailed(client=via, body=body)
        except Exception as e:  # the generated code raised: the document does not fit what was sent
            report.ok(False, f"{what}: the generated client raised {type(e).__name__}: {str(e)[:600]}")
            return
        parsed = response.parsed
        report.ok(int(response.status_code) == expect_status,
                  f"{what}: status {int(response.status_code)} (expected {expect_status}): {response.content[:300]!r}")
        try:
            problems = check(parsed)
        except Exception as e:
            problems = [f"{type(e).__name__}: {e}"]
        report.ok(not problems, f"{what}: parsed into {type(parsed).__name__} {problems}")

    def observation(outcome):
        def check(parsed):
            problems = []
            if not isinstance(parsed, models.Observation):
                return [f"not an Observation: {parsed!r:.300}"]
            if parsed.outcome != outcome:
                problems.append(f"outcome {parsed.outcome!r}")
            # Every nested model parsed too.
            for f in parsed.files or []:
                if not isinstance(f, models.OutputFile):
                    problems.append(f"files entry {f!r:.100}")
            parsed.to_dict()
            return problems
        return check

    def error(kind):
        def check(parsed):
            if not isinstance(parsed, models.ErrorBody):
                return [f"not an ErrorBody: {parsed!r:.300}"]
            problems = []
            if parsed.ok is not False:
                problems.append(f"ok {parsed.ok!r}")
            if parsed.outcome != "error":
                problems.append(f"outcome {parsed.outcome!r}")
            if not isinstance(parsed.error, models.ErrorInfo) or parsed.error.kind != kind:
                problems.append(f"error {parsed.error!r:.300}")
            parsed.to_dict()
            return problems
        return check

    post("exited", {"language": "python", "code": "print('hi')"}, 200, observation("exited"))
    post("timeout", {"language": "python", "code": "import time\ntime.sleep(30)", "timeout_s": 1}, 200,
         observation("timeout"))
    post("oom", {"language": "python", "memory": "64MiB",
                 "code": "chunks = []\nwhile True:\n    chunks.append(b'x' * (8 << 20))"}, 200, observation("oom"))
    def returned_file(parsed):
        problems = observation("exited")(parsed)
        if problems:
            return problems
        import base64
        files = [f for f in parsed.files or [] if f.path.endswith("r.txt")]
        if len(files) != 1:
            return [f"r.txt not among the files ({parsed.files!r:.300})"]
        content = getattr(files[0], "content_base64", None) or files[0].additional_properties.get("content_base64")
        if not isinstance(content, str) or base64.b64decode(content) != b"r":
            return [f"r.txt's content_base64 is {content!r:.100}, not base64 of 'r'"]
        return []

    post("exited with a returned /out file",
         {"language": "python", "code": "open('/out/r.txt', 'w').write('r')", "return_files": True}, 200,
         returned_file)
    post("invalid_input (unknown language)", {"language": "cobol", "code": "x"}, 400, error("invalid_input"))
    post("invalid_input (unknown field)", {"language": "python", "code": "1", "no_such_field": 1}, 400,
         error("invalid_input"), typed=False)
    post("policy_denied (memory above the ceiling)", {"language": "python", "code": "1", "memory": "64GiB"}, 403,
         error("policy_denied"))
    post("policy_denied (timeout_s 1e9)", {"language": "python", "code": "1", "timeout_s": 1e9}, 403,
         error("policy_denied"))
    post("unauthorized (a wrong token)", {"language": "python", "code": "1"}, 401, error("unauthorized"),
         via=bad_client)
    post("invalid_input (a body over --max-body, 413)", {"language": "python", "code": "#" * TOO_LARGE_BYTES}, 413,
         error("invalid_input"), typed=False)


if __name__ == "__main__":
    main()
