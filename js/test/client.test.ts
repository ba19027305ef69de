import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import {
  AirlockClient,
  PolicyDenied,
  SessionNotFound,
  type StreamEvent,
  TransportError,
  Unauthorized,
} from "../src/index.js";
import { airlockBin, missing, REPO, type Server, sessionPolicy, skipUnlessReady, startServer } from "./helpers.js";

test("the generated types are the server's OpenAPI snapshot's", () => {
  // Fails when the snapshot changed and `npm run gen` was not run.
  execFileSync(process.execPath, [join(REPO, "js/scripts/gen-types.mjs"), "--check"], { stdio: "pipe" });
});

describe("AirlockClient against airlock serve", () => {
  let server: Server | undefined;
  let client: AirlockClient;

  before(async () => {
    if (missing() === undefined) {
      server = await startServer();
      client = new AirlockClient({ url: server.url, token: server.token });
    }
  });
  after(async () => {
    await server?.stop();
  });

  test("the live server's OpenAPI document is the snapshot the types come from", async (t) => {
    if (skipUnlessReady(t) || server === undefined) return;
    const live: unknown = await (await fetch(`${server.url}/v1/openapi.json`)).json();
    const snapshot: unknown = JSON.parse(
      readFileSync(join(REPO, "crates/airlock-server/src/snapshots/openapi.json"), "utf8"),
    );
    assert.deepEqual(live, snapshot);
  });

  test("run: a hello job's observation", async (t) => {
    if (skipUnlessReady(t)) return;
    const observation = await client.run({ code: "print('hello from airlock')", language: "python" });
    assert.equal(observation.ok, true);
    assert.equal(observation.outcome, "exited");
    assert.equal(observation.exit_code, 0);
    assert.equal(observation.stdout, "hello from airlock\n");
  });

  test("run: a failed job is an observation, not an error", async (t) => {
    if (skipUnlessReady(t)) return;
    const observation = await client.run({ code: "import sys; print('bye', file=sys.stderr); sys.exit(3)" });
    assert.equal(observation.ok, false);
    assert.equal(observation.outcome, "exited");
    assert.equal(observation.exit_code, 3);
    assert.equal(observation.stderr, "bye\n");
  });

  test("run: refusals are typed errors", async (t) => {
    if (skipUnlessReady(t) || server === undefined) return;
    await assert.rejects(client.run({ code: "print(1)", timeout_s: 3600 }), (error: unknown) => {
      assert.ok(error instanceof PolicyDenied, String(error));
      assert.equal(error.status, 403);
      assert.equal(error.kind, "policy_denied");
      return true;
    });
    const anonymous = new AirlockClient({ url: server.url, token: "alk_not-a-token" });
    await assert.rejects(anonymous.run({ code: "print(1)" }), Unauthorized);
    const nowhere = new AirlockClient({ url: "http://127.0.0.1:9", token: "x" });
    await assert.rejects(nowhere.run({ code: "print(1)" }), TransportError);
  });

  test("stream: output as written, then the observation", async (t) => {
    if (skipUnlessReady(t)) return;
    const events: StreamEvent[] = [];
    for await (const event of client.stream({
      code: "import sys\nprint('one')\nprint('two', file=sys.stderr)\nprint('three')",
    })) {
      events.push(event);
    }
    const last = events.at(-1);
    assert.equal(last?.type, "observation");
    assert.ok(last?.type === "observation");
    assert.equal(last.observation.stdout, "one\nthree\n");
    const stdout = events.flatMap((e) => (e.type === "stdout" ? [e.chunk.text] : [])).join("");
    const stderr = events.flatMap((e) => (e.type === "stderr" ? [e.chunk.text] : [])).join("");
    assert.equal(stdout, "one\nthree\n");
    assert.equal(stderr, "two\n");
  });

  test("stream: leaving the loop early kills the job", async (t) => {
    if (skipUnlessReady(t) || server === undefined) return;
    const { url, token } = server;
    // Jobs finished, by outcome: a killed job ends as `error` (the client went away), one
    // left running as `timeout` at its wall time. Whichever comes first tells.
    const finished = async (): Promise<Record<string, number>> => {
      const text = await (await fetch(`${url}/metrics`, { headers: { Authorization: `Bearer ${token}` } })).text();
      const counts: Record<string, number> = {};
      for (const match of text.matchAll(/^airlock_jobs_total\{outcome="(\w+)"[^}]*\} (\d+)$/gm)) {
        counts[match[1] ?? ""] = (counts[match[1] ?? ""] ?? 0) + Number(match[2]);
      }
      return counts;
    };
    const before = await finished();
    for await (const event of client.stream({
      code: "import time\nprint('started', flush=True)\ntime.sleep(60)",
      timeout_s: 5,
    })) {
      assert.equal(event.type, "stdout");
      break;
    }
    let after = await finished();
    while ((after.error ?? 0) === (before.error ?? 0) && (after.timeout ?? 0) === (before.timeout ?? 0)) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      after = await finished();
    }
    assert.equal(after.timeout ?? 0, before.timeout ?? 0, "the job ran to its wall time");
    assert.equal(after.error, (before.error ?? 0) + 1);
  });

  test("sessions: files persist across calls, bytes round-trip, a closed session is gone", async (t) => {
    if (skipUnlessReady(t)) return;
    const session = await client.createSession();
    const bytes = new Uint8Array(256).map((_, i) => i);
    await session.writeFile("data/in.bin", bytes);
    const first = await session.run({
      code: "d = open('data/in.bin', 'rb').read()\nopen('out.bin', 'wb').write(d[::-1])\nprint(len(d))",
    });
    assert.equal(first.observation.stdout, "256\n");
    assert.equal(first.call, 1);
    const back = await session.readFile("out.bin");
    assert.deepEqual(back, bytes.slice().reverse());
    assert.equal(await session.readFile("no-such-file"), null);
    const listing = await session.listFiles();
    const paths = listing.files.map((f) => f.path);
    assert.ok(paths.includes("data/in.bin") && paths.includes("out.bin"), paths.join(", "));
    await session.close();
    await assert.rejects(session.run({ code: "print(1)" }), SessionNotFound);
  });
});

describe("local mode", () => {
  test("without a URL the client starts its own airlock serve and stops it on close", async (t) => {
    if (skipUnlessReady(t)) return;
    const saved = process.env.AIRLOCK_URL;
    delete process.env.AIRLOCK_URL;
    const dir = (await import("node:fs")).mkdtempSync(join((await import("node:os")).tmpdir(), "airlock-js-local-"));
    const client = new AirlockClient({ local: { binary: airlockBin() ?? "", policy: sessionPolicy(dir) } });
    try {
      assert.equal(client.isLocal, true);
      const observation = await client.run({ code: "echo local", language: "bash" });
      assert.equal(observation.stdout, "local\n");
      const url = await client.baseUrl();
      assert.match(url, /^http:\/\/127\.0\.0\.1:\d+$/);
      const session = await client.createSession();
      await session.writeFile("x.txt", "kept");
      assert.equal((await session.run({ code: "cat x.txt", language: "bash" })).observation.stdout, "kept");
      await client.close();
      await assert.rejects(fetch(`${url}/v1/health`));
    } finally {
      await client.close();
      if (saved !== undefined) process.env.AIRLOCK_URL = saved;
    }
  });
});
