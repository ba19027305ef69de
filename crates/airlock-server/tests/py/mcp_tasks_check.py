#!/usr/bin/env python3
"""Checks airlock's MCP tasks (the io.modelcontextprotocol/tasks extension of MCP
2026-07-28) with the official `mcp` client package: its modern (server/discover) session,
its extension capability ad and its result-claim parsing of `resultType: "task"`; the
extension's methods (`tasks/get`, `tasks/cancel`) go through the session's send_request.

Usage:
  mcp_tasks_check.py stdio AIRLOCK_BIN POLICY          spawns `AIRLOCK_BIN mcp --policy POLICY`
  mcp_tasks_check.py http URL TOKEN OTHER_TOKEN        a server started with POLICY (URL is .../mcp)

POLICY is the one scripts/ci/server.sh writes: [limits] timeout = "90s" (a 60 s job runs
until the check cancels it), [mcp] task_after = "1s", tasks_per_tenant = 3, task_ttl = "5s".

Cases: a long run_code call answers with a task at once (the job still running); tasks/get
shows working, then completed with the same CallToolResult a plain call gives; tasks/cancel
kills the job (process, job directory and cgroups gone) and the task reads cancelled;
another tenant's token gets "not found" for get and cancel (HTTP); the per-tenant bound
refuses one task more with a clear error while another tenant is unaffected; a finished
task is gone after its TTL; a client without the extension still gets plain results.
"""
import asyncio
import contextlib
import json
import os
import sys
import time
import uuid
from typing import Any, Literal

from airlock_cases import Report
from mcp_check import find_job, http_transport, leftovers, marker_code

TASKS = "io.modelcontextprotocol/tasks"
TASK_AFTER_S = 1.0
TASKS_PER_TENANT = 3
TASK_TTL_S = 5.0
TIMEOUT = 60.0


def task_types():
    """The extension's shapes as pydantic models on the SDK's own base classes."""
    import mcp_types as types
    from pydantic import ConfigDict, Field

    class CreateTaskResult(types.Result):
        model_config = ConfigDict(extra="allow", populate_by_name=True)
        result_type: Literal["task"] = Field(alias="resultType")
        task_id: str = Field(alias="taskId")
        status: str
        ttl_ms: int | None = Field(default=None, alias="ttlMs")
        poll_interval_ms: int | None = Field(default=None, alias="pollIntervalMs")

    class TaskIdParams(types.RequestParams):
        task_id: str = Field(alias="taskId")

    class GetTaskRequest(types.Request[TaskIdParams, Literal["tasks/get"]]):
        method: Literal["tasks/get"] = "tasks/get"
        params: TaskIdParams
        name_param = "taskId"

    class CancelTaskRequest(types.Request[TaskIdParams, Literal["tasks/cancel"]]):
        method: Literal["tasks/cancel"] = "tasks/cancel"
        params: TaskIdParams
        name_param = "taskId"

    class AnyResult(types.Result):
        model_config = ConfigDict(extra="allow")

    return CreateTaskResult, TaskIdParams, GetTaskRequest, CancelTaskRequest, AnyResult


class Tasks:
    """One client of the extension over a modern session."""

    def __init__(self, session, report, where):
        (self.CreateTaskResult, self.TaskIdParams, self.GetTaskRequest,
         self.CancelTaskRequest, self.AnyResult) = task_types()
        self.session = session
        self.report = report
        self.where = where

    async def call(self, code):
        """run_code; returns ("task", CreateTaskResult) or ("result", CallToolResult)."""
        import mcp_types as types
        result = await self.session.call_tool("run_code", {"language": "python", "code": code},
                                              read_timeout_seconds=TIMEOUT, allow_claimed=True)
        if isinstance(result, types.CallToolResult):
            return "result", result
        return "task", result

    async def get(self, task_id) -> dict[str, Any]:
        result = await self.session.send_request(
            self.GetTaskRequest(params=self.TaskIdParams(taskId=task_id)), self.AnyResult,
            request_read_timeout_seconds=TIMEOUT)
        return result.model_dump(by_alias=True, mode="json", exclude_none=True)

    async def cancel(self, task_id):
        await self.session.send_request(
            self.CancelTaskRequest(params=self.TaskIdParams(taskId=task_id)), self.AnyResult,
            request_read_timeout_seconds=TIMEOUT)

    async def refused(self, coroutine):
        """The JSON-RPC error a call got (None when it succeeded)."""
        from mcp import MCPError
        try:
            await coroutine
        except MCPError as e:
            return e.error
        return None


def observation(result) -> dict[str, Any]:
    """The observation of a CallToolResult, as a model or as its wire dict."""
    if isinstance(result, dict):
        structured = result.get("structuredContent")
        text = "".join(c.get("text", "") for c in result.get("content", []) if c.get("type") == "text")
    else:
        structured = result.structured_content
        text = "".join(getattr(c, "text", "") for c in result.content if getattr(c, "type", "") == "text")
    return structured if isinstance(structured, dict) else json.loads(text or "{}")


async def poll_until_terminal(tasks, task_id, limit=TIMEOUT):
    """tasks/get until a terminal status; returns every status seen, in order, and the last task."""
    seen, task = [], {}
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        task = await tasks.get(task_id)
        if not seen or seen[-1] != task.get("status"):
            seen.append(task.get("status"))
        if task.get("status") in ("completed", "failed", "cancelled"):
            break
        await asyncio.sleep(max(0.05, min(1.0, task.get("pollIntervalMs", 500) / 1000)))
    return seen, task


async def long_task(tasks, report, where, label):
    """Starts a 60 s job as a task; returns (task id, marker, job dir, cgroups)."""
    marker = f"airlock-task-{label}-{uuid.uuid4().hex}"
    found = asyncio.ensure_future(find_job(marker))
    kind, answer = await tasks.call(marker_code(marker))
    job, cgroups = await found
    if not report.ok(kind == "task", f"{where}: a 60 s job answers with a task ({kind}: {str(answer)[:200]})"):
        return None, marker, job, cgroups
    report.ok(answer.status == "working" and answer.result_type == "task",
              f"{where}: the task is working, resultType task ({answer.status}, {answer.result_type})")
    report.ok(job is not None, f"{where}: the task's job runs after the call was answered (job dir {job})")
    return answer.task_id, marker, job, cgroups


async def check_tasks(tasks, report, where, plain=None, other=None):
    # The server advertises the extension.
    discovered = tasks.session._discover_result
    capabilities = discovered.capabilities if discovered is not None else None
    extensions = getattr(capabilities, "extensions", None) or {}
    report.ok(TASKS in extensions, f"{where}: server/discover advertises {TASKS} ({extensions})")

    # A long job: a task at once; working; another tenant cannot see or cancel it; its
    # owner's cancel kills the job.
    task_id, marker, job, cgroups = await long_task(tasks, report, where, "cancel")
    if task_id is not None:
        task = await tasks.get(task_id)
        report.ok(task.get("status") == "working" and task.get("resultType") == "complete",
                  f"{where}: tasks/get shows it working ({task})")
        if other is not None:
            error = await other.refused(other.get(task_id))
            report.ok(error is not None and error.code == -32602 and "not found" in error.message,
                      f"{where}: another tenant's tasks/get gets not found ({error})")
            error = await other.refused(other.cancel(task_id))
            report.ok(error is not None and error.code == -32602,
                      f"{where}: another tenant's tasks/cancel gets not found ({error})")
            task = await tasks.get(task_id)
            report.ok(task.get("status") == "working",
                      f"{where}: after the other tenant's cancel the task still works ({task.get('status')})")
        error = await tasks.refused(tasks.cancel(task_id))
        report.ok(error is None, f"{where}: tasks/cancel is acknowledged ({error})")
        _, task = await poll_until_terminal(tasks, task_id, limit=15)
        report.ok(task.get("status") == "cancelled", f"{where}: the task reads cancelled ({task})")
        left = await leftovers(marker, job, cgroups, 5.0)
        report.ok(job is not None and not left,
                  f"{where}: tasks/cancel killed the job: nothing of it remains ({left}, job dir {job})")

    # A job past task_after that ends: working, then completed with the result a plain
    # call gives.
    code = f"import time\ntime.sleep({TASK_AFTER_S + 2})\nprint('done')\n"
    kind, answer = await tasks.call(code)
    if report.ok(kind == "task", f"{where}: a {TASK_AFTER_S + 2}s job answers with a task ({kind})"):
        seen, task = await poll_until_terminal(tasks, answer.task_id)
        report.ok(seen[:1] == ["working"] and seen[-1] == "completed",
                  f"{where}: tasks/get shows working then completed ({seen})")
        result = task.get("result") or {}
        obs = observation(result)
        report.ok(obs.get("ok") is True and obs.get("stdout") == "done\n",
                  f"{where}: the completed task's result is the job's observation ({str(obs)[:300]})")
        import mcp_types as types
        try:
            types.CallToolResult.model_validate(result, by_alias=True)
            report.ok(True, f"{where}: the task's result parses as the SDK's CallToolResult")
        except Exception as e:  # noqa: BLE001 - the failure is the report
            report.ok(False, f"{where}: the task's result parses as the SDK's CallToolResult: {e}")
        if plain is not None:
            direct = await plain.call_tool("run_code", {"language": "python", "code": code},
                                           read_timeout_seconds=TIMEOUT)
            direct_obs = observation(direct)
            same = {k: (obs.get(k), direct_obs.get(k)) for k in ("ok", "outcome", "exit_code", "stdout", "stderr")}
            report.ok(all(a == b for a, b in same.values()) and set(obs) == set(direct_obs)
                      and result.get("isError") == direct.is_error
                      and [c.get("type") for c in result.get("content", [])] == [c.type for c in direct.content],
                      f"{where}: the task's result is the CallToolResult a plain call gives ({same})")
        # Kept for the TTL, then gone.
        await asyncio.sleep(TASK_TTL_S + 1.5)
        error = await tasks.refused(tasks.get(answer.task_id))
        report.ok(error is not None and error.code == -32602,
                  f"{where}: {TASK_TTL_S}s after it ended the task is gone ({error})")

    # A short job within task_after is answered directly.
    kind, answer = await tasks.call("print('quick')")
    if kind == "result":
        report.ok(observation(answer).get("stdout") == "quick\n", f"{where}: a quick job's result comes directly")

    # The per-tenant bound: three long tasks held, the fourth refused; another tenant is not.
    held = []
    for i in range(TASKS_PER_TENANT):
        task_id, marker, job, cgroups = await long_task(tasks, report, f"{where}: bound {i + 1}", "bound")
        held.append((task_id, marker, job, cgroups))
    kind, answer = await tasks.call("print('one too many')")
    obs = observation(answer) if kind == "result" else {}
    message = (obs.get("error") or {}).get("message", "")
    report.ok(kind == "result" and answer.is_error and (obs.get("error") or {}).get("kind") == "policy_denied"
              and "tasks_per_tenant" in message,
              f"{where}: one task more than tasks_per_tenant is refused with a clear error ({kind}: {message or answer})")
    if other is not None:
        kind, answer = await other.call("print('other tenant')")
        obs = observation(answer) if kind == "result" else {}
        report.ok(kind == "task" or obs.get("stdout") == "other tenant\n",
                  f"{where}: another tenant is not held to the first one's bound ({kind}: {str(obs)[:200]})")
    for task_id, marker, job, cgroups in held:
        if task_id is not None:
            await tasks.cancel(task_id)
    for task_id, marker, job, cgroups in held:
        left = await leftovers(marker, job, cgroups, 5.0)
        report.ok(not left, f"{where}: the bound's cancelled job is gone ({left})")


@contextlib.asynccontextmanager
async def tasks_session(streams):
    from mcp import ClientSession
    from mcp.client.extension import ResultClaim
    CreateTaskResult = task_types()[0]

    async def no_resolve(result, context):  # allow_claimed returns the task itself
        raise RuntimeError("not resolved transparently")
    claim = ResultClaim(result_type="task", model=CreateTaskResult, resolve=no_resolve)
    async with ClientSession(streams[0], streams[1], extensions={TASKS: {}},
                             result_claims={TASKS: [claim]}) as session:
        await session.discover()
        yield session


async def main():
    mode = sys.argv[1]
    report = Report("mcp-tasks")
    from mcp import ClientSession
    if mode == "stdio":
        from mcp.client.stdio import StdioServerParameters, stdio_client
        airlock, policy = sys.argv[2], sys.argv[3]
        params = StdioServerParameters(command=airlock, args=["mcp", "--policy", policy, "--max-in-flight", "8"],
                                       env=dict(os.environ))
        async with (stdio_client(params) as streams, tasks_session(streams) as session,
                    stdio_client(params) as plain_streams,
                    ClientSession(plain_streams[0], plain_streams[1]) as plain):
            await plain.initialize()
            await check_tasks(Tasks(session, report, "stdio"), report, "stdio", plain=plain)
            # A client without the extension gets plain results, however long the job.
            result = await plain.call_tool("run_code", {"code": f"import time; time.sleep({TASK_AFTER_S + 1}); print(1)"},
                                           read_timeout_seconds=TIMEOUT)
            report.ok(observation(result).get("stdout") == "1\n",
                      "stdio: a client without the extension gets the result, not a task")
    elif mode == "http":
        url, token, other_token = sys.argv[2], sys.argv[3], sys.argv[4]
        async with (http_transport(url, token) as streams, tasks_session(streams) as session,
                    http_transport(url, other_token) as other_streams, tasks_session(other_streams) as other,
                    http_transport(url, token) as plain_streams,
                    ClientSession(plain_streams[0], plain_streams[1]) as plain):
            await plain.initialize()
            await check_tasks(Tasks(session, report, "http"), report, "http", plain=plain,
                              other=Tasks(other, report, "http (other tenant)"))
    else:
        raise SystemExit(f"unknown mode {mode}")
    report.finish()


if __name__ == "__main__":
    asyncio.run(main())
