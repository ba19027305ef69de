import json, os, urllib.error, urllib.request

AIRLOCK = os.environ.get("AIRLOCK_URL", "http://127.0.0.1:8700")
TOKEN = os.environ.get("AIRLOCK_TOKEN")  # from `airlock token new`; unset without --tokens

def run_in_container(source: str, language: str = "python", timeout_s: float = 5) -> dict:
    """Runs `source` in a fresh airlock sandbox and returns the observation."""
    body = json.dumps({"language": language, "code": source, "timeout_s": timeout_s}).encode()
    headers = {"Content-Type": "application/json"}
    if TOKEN:
        headers["Authorization"] = f"Bearer {TOKEN}"
    request = urllib.request.Request(f"{AIRLOCK}/v1/runs", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s + 120) as response:
            return json.load(response)
    except urllib.error.HTTPError as e:  # 4xx/5xx bodies have the same JSON shape
        return json.load(e)

if __name__ == "__main__":
    obs = run_in_container("print(sum(range(10)))")
    print(obs["ok"], obs["outcome"], repr(obs["stdout"]))
    assert obs["ok"] and obs["stdout"] == "45\n", obs
