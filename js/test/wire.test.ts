// What needs no airlock and no root: server-sent events split anywhere, each error
// status and body mapped to its typed error, the model's view of files, finding the binary.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { modelView, releasedFiles } from "../src/ai.js";
import { errorFromResponse } from "../src/errors.js";
import {
  type ApiError,
  BackendUnavailable,
  BinaryNotFound,
  findBinary,
  InternalError,
  InvalidInput,
  LocalServer,
  type Observation,
  PolicyDenied,
  parseEventStream,
  SessionNotFound,
  TransportError,
  Unauthorized,
} from "../src/index.js";

function streamOf(chunks: string[]): ReadableStream<Uint8Array> {
  const encoder = new TextEncoder();
  return new ReadableStream({
    start(controller) {
      for (const chunk of chunks) controller.enqueue(encoder.encode(chunk));
      controller.close();
    },
  });
}

async function events(chunks: string[]) {
  const out = [];
  for await (const event of parseEventStream(streamOf(chunks))) out.push(event);
  return out;
}

test("server-sent events: split across reads, comments, CRLF, multi-line data", async () => {
  const text =
    ': keep-alive\n\nevent: stdout\ndata: {"text":"a"}\n\nevent: stderr\r\ndata: {"text":\r\ndata: "b"}\r\n\r\nevent: observation\ndata: {"ok":true}\n\n';
  const whole = await events([text]);
  assert.deepEqual(whole, [
    { event: "stdout", data: '{"text":"a"}' },
    { event: "stderr", data: '{"text":\n"b"}' },
    { event: "observation", data: '{"ok":true}' },
  ]);
  for (let cut = 0; cut <= text.length; cut += 1) {
    assert.deepEqual(await events([text.slice(0, cut), text.slice(cut)]), whole, `cut at ${cut}`);
  }
  // Every split point gives the same events, multi-byte characters included.
  const unicode = 'event: stdout\ndata: {"text":"é✓"}\n\n';
  for (let cut = 0; cut <= unicode.length; cut += 1) {
    assert.deepEqual(await events([unicode.slice(0, cut), unicode.slice(cut)]), [
      { event: "stdout", data: '{"text":"é✓"}' },
    ]);
  }
  const bytes = new TextEncoder().encode(unicode);
  for (let cut = 0; cut <= bytes.length; cut += 1) {
    const parts = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(bytes.slice(0, cut));
        controller.enqueue(bytes.slice(cut));
        controller.close();
      },
    });
    const seen = [];
    for await (const event of parseEventStream(parts)) seen.push(event);
    assert.deepEqual(seen, [{ event: "stdout", data: '{"text":"é✓"}' }]);
  }
});

test("error answers become typed errors", () => {
  const body = (kind: string) => JSON.stringify({ ok: false, outcome: "error", error: { kind, message: "m" } });
  const cases: Array<[number, string, boolean, new (...args: never[]) => ApiError]> = [
    [400, body("invalid_input"), false, InvalidInput],
    [403, body("policy_denied"), false, PolicyDenied],
    [401, body("unauthorized"), false, Unauthorized],
    [429, body("backend_unavailable"), false, BackendUnavailable],
    [500, body("internal"), false, InternalError],
    [404, body("invalid_input"), true, SessionNotFound],
    [502, "<html>bad gateway</html>", false, InternalError],
    [404, "not json", false, InvalidInput],
  ];
  for (const [status, text, sessionRoute, expected] of cases) {
    const error = errorFromResponse(status, text, sessionRoute);
    assert.ok(error instanceof expected, `${status} ${text}: ${error.name}`);
    assert.equal(error.status, status);
  }
  const denied = errorFromResponse(
    403,
    JSON.stringify({
      ok: false,
      outcome: "error",
      job_id: "j1",
      error: { kind: "policy_denied", message: "timeout above the ceiling" },
    }),
    false,
  );
  assert.equal(denied.body?.job_id, "j1");
  assert.match(denied.message, /timeout above the ceiling/);
});

test("the model's view of an observation keeps file names, sizes and types, not contents", () => {
  const observation: Observation = {
    job_id: "j",
    ok: true,
    outcome: "exited",
    exit_code: 0,
    stdout: "",
    stderr: "",
    stdout_bytes: 0,
    stderr_bytes: 0,
    stdout_truncated: false,
    stderr_truncated: false,
    redactions: 0,
    duration_ms: 1,
    backend: "native",
    policy_version: "p",
    files: [
      {
        path: "a.bin",
        bytes: 3,
        sha256: "h",
        media_type: "application/octet-stream",
        redactions: 0,
        content_base64: "AAEC",
      },
      { path: "big.bin", bytes: 9_000_000, sha256: "h2", media_type: "application/octet-stream", redactions: 0 },
    ],
  };
  assert.deepEqual(modelView(observation), {
    ...observation,
    files: [
      { path: "a.bin", bytes: 3, media_type: "application/octet-stream", sha256: "h" },
      { path: "big.bin", bytes: 9_000_000, media_type: "application/octet-stream", sha256: "h2" },
    ],
  });
  const files = releasedFiles(observation);
  assert.deepEqual(files[0]?.bytes, new Uint8Array([0, 1, 2]));
  assert.equal(files[1]?.bytes, undefined);
  const refusal = { ok: false, outcome: "error" as const, error: { kind: "policy_denied" as const, message: "no" } };
  assert.deepEqual(modelView(refusal), refusal);
  assert.deepEqual(releasedFiles(refusal), []);
});

test("local mode finds the binary: AIRLOCK_BIN, else PATH, else a clear error", async () => {
  const saved = { bin: process.env.AIRLOCK_BIN, path: process.env.PATH };
  const dir = mkdtempSync(join(tmpdir(), "airlock-js-bin-"));
  try {
    const fake = join(dir, "airlock");
    writeFileSync(fake, "#!/bin/sh\necho 'not a server' >&2\nexit 3\n", { mode: 0o755 });
    delete process.env.AIRLOCK_BIN;
    process.env.PATH = `/nonexistent:${dir}`;
    assert.equal(findBinary(), fake);
    process.env.PATH = "/nonexistent";
    assert.throws(() => findBinary(), BinaryNotFound);
    process.env.AIRLOCK_BIN = join(dir, "missing");
    assert.throws(() => findBinary(), /is not an executable file/);
    // A binary that exits before it listens: the error quotes what it said.
    await assert.rejects(LocalServer.start({ binary: fake }), (error: unknown) => {
      assert.ok(error instanceof TransportError);
      assert.match(error.message, /exited \(3\) before listening: not a server/);
      return true;
    });
  } finally {
    for (const [name, value] of [
      ["AIRLOCK_BIN", saved.bin],
      ["PATH", saved.path],
    ] as const) {
      if (value === undefined) delete process.env[name];
      else process.env[name] = value;
    }
    rmSync(dir, { recursive: true, force: true });
  }
});
