#!/usr/bin/env python3
"""Checks that /metrics reads cleanly with prometheus_client's parsers, in both formats.

Usage:
  metrics_check.py BASE TOKEN      BASE is http://HOST:PORT of a live `airlock serve`

Runs a job and sends one request with a wrong token (so the job and rejection series have
samples), then fetches /metrics with each Accept header a scraper sends and parses it:
Prometheus text 0.0.4 with prometheus_client.parser, OpenMetrics 1.0.0 with the strict
prometheus_client.openmetrics.parser. Each must give the expected families with their
types and samples, and no orphans: no family without samples (a counter whose samples
went elsewhere), none of type unknown (samples the parser could not place, such as an
`_total` outside its counter), no family twice.
"""
import sys
import urllib.request

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from airlock_cases import Report, http_json

# crates/airlock-server/src/metrics.rs: (family, type) of every series that has samples
# once a job ran and a request was rejected. The warm-pool counters only have samples with
# a warm pool; they are checked when present.
EXPECTED = {
    "airlock_jobs": "counter",
    "airlock_job_duration_seconds": "histogram",
    "airlock_queue_wait_seconds": "histogram",
    "airlock_jobs_in_flight": "gauge",
    "airlock_queue_depth": "gauge",
    "airlock_output_bytes": "counter",
    "airlock_redactions": "counter",
    "airlock_requests_rejected": "counter",
    "airlock_warm_pool_ready": "gauge",
    "airlock_audit_writable": "gauge",
    "airlock_audit_unsettled_jobs": "gauge",
    "airlock_audit_write_failures": "gauge",
    "airlock_root_cache_bytes": "gauge",
    "airlock_root_cache_copies": "gauge",
}
OPTIONAL = {
    "airlock_warm_pool_jobs": "counter",
    "airlock_warm_pool_sandboxes": "counter",
    "airlock_warm_pool_zygote": "counter",
}
TEXT_004 = "text/plain;version=0.0.4"
OPENMETRICS = "application/openmetrics-text;version=1.0.0"
# What Prometheus 2.x/3.x sends when it scrapes (OpenMetrics preferred).
PROMETHEUS_SCRAPE = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def fetch(base, token, accept):
    headers = {"Authorization": f"Bearer {token}"}
    if accept is not None:
        headers["Accept"] = accept
    request = urllib.request.Request(f"{base}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.headers.get("Content-Type", ""), response.read().decode()


def media_type(content_type):
    parts = [p.strip() for p in content_type.split(";")]
    params = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
    return parts[0].lower(), params


def family_problems(families):
    """What is wrong with the parsed families: a missing or mistyped expected family, an
    orphan, a family this check does not know, a job or rejection not counted."""
    problems = []
    names = [f.name for f in families]
    by_name = {f.name: f for f in families}
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        problems.append(f"families twice: {duplicates}")
    unknown = sorted({f.name for f in families if f.type in ("unknown", "untyped")})
    if unknown:
        problems.append(f"families of type unknown: {unknown}")
    empty = sorted({f.name for f in families if not f.samples})
    if empty:
        problems.append(f"families without samples: {empty}")
    for name, kind in EXPECTED.items():
        family = by_name.get(name)
        if family is None:
            problems.append(f"{name} missing")
        elif family.type != kind or not family.samples:
            problems.append(f"{name} is a {family.type} with {len(family.samples)} samples, not a {kind} with samples")
    for name, kind in OPTIONAL.items():
        if name in by_name and by_name[name].type != kind:
            problems.append(f"{name} is a {by_name[name].type}, not a {kind}")
    strays = sorted({n for n in by_name if n.startswith("airlock_") and n not in EXPECTED and n not in OPTIONAL}
                    - set(unknown) - set(empty))
    if strays:
        problems.append(f"families this check does not know (update EXPECTED in metrics_check.py): {strays}")
    jobs = by_name.get("airlock_jobs")
    if jobs is not None and jobs.type == "counter":
        labels = [s.labels for s in jobs.samples]
        if not any(l.get("outcome") == "exited" and l.get("backend") == "native" for l in labels):
            problems.append(f"airlock_jobs has no outcome=exited,backend=native sample ({labels[:4]})")
    rejected = by_name.get("airlock_requests_rejected")
    if rejected is not None and rejected.type == "counter":
        reasons = sorted({s.labels.get("reason") for s in rejected.samples})
        if "unauthorized" not in reasons:
            problems.append(f"airlock_requests_rejected has no reason=unauthorized sample ({reasons})")
    return problems


def main():
    base, token = sys.argv[1].rstrip("/"), sys.argv[2]
    report = Report("metrics")
    status, obs = http_json("POST", f"{base}/v1/runs", token, {"language": "python", "code": "print(1)"})
    report.ok(status == 200 and obs.get("ok") is True, f"a job ran ({status})")
    status, _ = http_json("POST", f"{base}/v1/runs", "alk_wrong", {"language": "python", "code": "1"})
    report.ok(status == 401, f"a wrong token is refused ({status})")

    seen = {}
    # A scraper that asks for a format reads the answer with that format's parser; without
    # an Accept header, with the parser of the Content-Type it got.
    for label, accept, want in (
        ("Accept text/plain 0.0.4", TEXT_004, ("text/plain", "0.0.4")),
        ("Accept OpenMetrics 1.0.0", OPENMETRICS, ("application/openmetrics-text", "1.0.0")),
        ("Prometheus's scrape Accept", PROMETHEUS_SCRAPE, ("application/openmetrics-text", "1.0.0")),
        ("no Accept", None, None),
    ):
        try:
            content_type, text = fetch(base, token, accept)
        except Exception as e:
            report.ok(False, f"{label}: GET /metrics: {type(e).__name__}: {e}")
            continue
        kind, params = media_type(content_type)
        if want is not None:
            report.ok((kind, params.get("version")) == want,
                      f"{label}: answered as {want[0]} version {want[1]} (Content-Type: {content_type})")
            kind = want[0]
        if kind == "application/openmetrics-text":
            parser, parser_name = parse_openmetrics, "the strict OpenMetrics parser"
        elif kind == "text/plain":
            parser, parser_name = parse_text, "the Prometheus text parser"
        else:
            report.ok(False, f"{label}: a metrics media type (Content-Type: {content_type})")
            continue
        try:
            families = list(parser(text))
        except Exception as e:
            report.ok(False, f"{label}: {parser_name} reads it: {type(e).__name__}: {e}")
            continue
        problems = family_problems(families)
        report.ok(not problems, f"{label}: {parser_name} reads the expected families, typed, with samples, "
                                f"no orphans ({len(families)} families) {problems}")
        seen[label] = {(f.name, f.type) for f in families}
    if len(seen) >= 2:
        first = next(iter(seen.values()))
        report.ok(all(v == first for v in seen.values()),
                  "every format gives the same families and types"
                  + ("" if all(v == first for v in seen.values()) else f" ({ {k: sorted(v) for k, v in seen.items()} })"))
    report.finish()


if __name__ == "__main__":
    main()
