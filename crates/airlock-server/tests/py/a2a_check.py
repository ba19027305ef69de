"""A2A with the official `a2a-sdk` client against a live `airlock serve` (issue 32).

Usage: a2a_check.py BASE_URL TOKEN

The client reads the Agent Card at /.well-known/agent-card.json and picks the JSON-RPC
interface from it, as an orchestrator would; then SendMessage (blocking), GetTask,
SendStreamingMessage, and CancelTask of a long job, whose job must be gone at once.
"""

import asyncio
import json
import sys
import time
import urllib.error
import urllib.request

import httpx
from a2a.client import ClientConfig, create_client
from google.protobuf import json_format
from a2a.types.a2a_pb2 import (CancelTaskRequest, GetTaskRequest, Message, Part, Role,
                               SendMessageRequest, TaskState)
from airlock_cases import Report

CODE = "print(sum(range(10)))\nopen('/out/r.txt', 'w').write('from /out')\n"
LONG = "import time\ntime.sleep(60)\n"


def message(code):
    return SendMessageRequest(message=Message(message_id=f"m-{time.monotonic_ns()}", role=Role.ROLE_USER,
                                              parts=[Part(text=code)]))


def artifacts_of(task):
    return {a.artifact_id: a for a in task.artifacts}


def in_flight(base):
    with urllib.request.urlopen(f"{base}/v1/health", timeout=10) as response:
        return json.load(response)["jobs_in_flight"]


async def main():
    base, token = sys.argv[1], sys.argv[2]
    report = Report("a2a")
    with urllib.request.urlopen(f"{base}/.well-known/agent-card.json", timeout=10) as response:
        card = json.load(response)
    report.ok([s["id"] for s in card.get("skills", [])] == ["run_code"], "the card has one skill, run_code")
    report.ok(card.get("securitySchemes", {}).get("bearer", {}).get("httpAuthSecurityScheme", {}).get("scheme") == "Bearer",
              "the card says a bearer token is needed")
    try:
        urllib.request.urlopen(urllib.request.Request(f"{base}/a2a", data=b"{}", method="POST",
                                                      headers={"content-type": "application/json"}), timeout=10)
        report.ok(False, "POST /a2a without a token is refused")
    except urllib.error.HTTPError as e:
        report.ok(e.code == 401, f"POST /a2a without a token is 401 ({e.code})")

    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        blocking = await create_client(base, ClientConfig(streaming=False, httpx_client=http))
        events = [e async for e in blocking.send_message(message(CODE))]
        task = events[-1].task if events and events[-1].HasField("task") else None
        report.ok(task is not None and task.status.state == TaskState.TASK_STATE_COMPLETED,
                  f"SendMessage: the job's task completed ({task.status if task else events})")
        if task is not None:
            found = artifacts_of(task)
            stdout = found.get("stdout")
            report.ok(stdout is not None and stdout.parts[0].text == "45\n", "SendMessage: stdout is an artifact")
            out = found.get("out/r.txt")
            report.ok(out is not None and out.parts[0].raw == b"from /out" and out.parts[0].filename == "r.txt",
                      "SendMessage: a file the job wrote to /out is an artifact with its bytes")
            observation = found.get("observation")
            data = json_format.MessageToDict(observation.parts[0].data) if observation else {}
            report.ok(data.get("ok") is True and data.get("outcome") == "exited",
                      f"SendMessage: the observation is an artifact ({str(data)[:200]})")
            again = await blocking.get_task(GetTaskRequest(id=task.id))
            report.ok(again.id == task.id and again.status.state == TaskState.TASK_STATE_COMPLETED,
                      "GetTask returns the task")

        streaming = await create_client(base, ClientConfig(streaming=True, httpx_client=http))
        events = [e async for e in streaming.send_message(message("print('streamed')"))]
        kinds = [e.WhichOneof("payload") for e in events]
        report.ok(kinds[:1] == ["task"] and kinds[-1] == "status_update", f"SendStreamingMessage: task first, status last ({kinds})")
        if events and events[-1].HasField("status_update"):
            report.ok(events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED,
                      "SendStreamingMessage: the final status is completed")
        texts = [e.artifact_update.artifact.parts[0].text for e in events
                 if e.HasField("artifact_update") and e.artifact_update.artifact.artifact_id == "stdout"]
        report.ok(texts == ["streamed\n"], f"SendStreamingMessage: stdout arrives as an artifact update ({texts})")

        polling = await create_client(base, ClientConfig(streaming=False, polling=True, httpx_client=http))
        events = [e async for e in polling.send_message(message(LONG))]
        task = events[-1].task
        report.ok(task.status.state == TaskState.TASK_STATE_WORKING, f"returnImmediately: the task is working ({task.status.state})")
        deadline = time.monotonic() + 30
        while in_flight(base) == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        report.ok(in_flight(base) >= 1, "the long job runs")
        cancelled = await polling.cancel_task(CancelTaskRequest(id=task.id))
        report.ok(cancelled.status.state == TaskState.TASK_STATE_CANCELED, "CancelTask: the task is canceled")
        # The bound is generous: the job's teardown (kill, cgroup removal) on a loaded host.
        deadline = time.monotonic() + 10
        while in_flight(base) > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        report.ok(in_flight(base) == 0, "CancelTask killed the job (nothing in flight)")
        after = await polling.get_task(GetTaskRequest(id=task.id))
        report.ok(after.status.state == TaskState.TASK_STATE_CANCELED, "GetTask after CancelTask: canceled")
    report.finish()


if __name__ == "__main__":
    asyncio.run(main())
