// AirlockSandbox as the AI SDK's Experimental_SandboxSession: generateText passes it to
// tools as `experimental_sandbox`; a bash tool written the SDK's way (it runs the model's
// command on whatever sandbox the call has) runs on airlock. Each test asserts what the
// model receives next.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { generateText, jsonSchema, stepCountIs, tool } from "ai";
import { AirlockSandbox } from "../src/ai.js";
import { AirlockClient } from "../src/index.js";
import { missing, type Server, skipUnlessReady, startServer } from "./helpers.js";
import { resultSeenByModel, scriptedModel } from "./model.js";

/** A bash tool as an application writes it against the SDK's sandbox interface. */
const bash = tool({
  description: "Run a bash command in the sandbox.",
  inputSchema: jsonSchema<{ command: string }>({
    type: "object",
    properties: { command: { type: "string" } },
    required: ["command"],
    additionalProperties: false,
  }),
  execute: async ({ command }, { experimental_sandbox: sandbox, abortSignal }) => {
    if (sandbox === undefined) throw new Error("no sandbox");
    return sandbox.run(abortSignal === undefined ? { command } : { command, abortSignal });
  },
  toModelOutput: ({ output }) =>
    output.exitCode === 0 ? { type: "json", value: output } : { type: "error-json", value: output },
});

describe("AirlockSandbox with generateText and the mock model", () => {
  let server: Server | undefined;
  let sandbox: AirlockSandbox;

  before(async () => {
    if (missing() === undefined) {
      server = await startServer();
      sandbox = await AirlockSandbox.create({
        client: new AirlockClient({ url: server.url, token: server.token }),
        timeoutS: 1,
      });
    }
  });
  after(async () => {
    await sandbox?.close();
    await server?.stop();
  });

  async function turn(command: string) {
    const model = scriptedModel("bash", { command });
    const result = await generateText({
      model,
      tools: { bash },
      experimental_sandbox: sandbox,
      stopWhen: stepCountIs(3),
      prompt: "go",
    });
    assert.equal(result.text, "done");
    return resultSeenByModel(model) as { type: string; value: { exitCode: number; stdout: string; stderr: string } };
  }

  test("hello, and files under /work persist between commands", async (t) => {
    if (skipUnlessReady(t)) return;
    const first = await turn("echo hello; pwd; echo kept > note.txt");
    assert.equal(first.type, "json");
    assert.deepEqual(first.value, { exitCode: 0, stdout: "hello\n/work\n", stderr: "" });
    const second = await turn("cat note.txt");
    assert.equal(second.value.stdout, "kept\n");
    assert.match(sandbox.description, /airlock/);
  });

  test("a failing command is its exit code and stderr", async (t) => {
    if (skipUnlessReady(t)) return;
    const seen = await turn("echo oops >&2; exit 7");
    assert.equal(seen.type, "error-json");
    assert.deepEqual(seen.value, { exitCode: 7, stdout: "", stderr: "oops\n" });
  });

  test("timeout: exit code 124 and the reason on stderr", async (t) => {
    if (skipUnlessReady(t)) return;
    const seen = await turn("echo started; sleep 30");
    assert.equal(seen.type, "error-json");
    assert.equal(seen.value.exitCode, 124);
    assert.equal(seen.value.stdout, "started\n");
    assert.match(seen.value.stderr, /airlock: the command was stopped \(timeout\)/);
  });

  test("flood: the model gets the bounded output", async (t) => {
    if (skipUnlessReady(t)) return;
    const seen = await turn("head -c 5000000 /dev/zero | tr '\\0' x");
    assert.equal(seen.value.exitCode, 0);
    assert.ok(seen.value.stdout.length > 0 && seen.value.stdout.length <= 8000, `${seen.value.stdout.length}`);
  });

  test("a secret the command prints reaches the model redacted", async (t) => {
    if (skipUnlessReady(t)) return;
    const key = ["AKIA", "IOSFODNN7", "EXAMPLE"].join("");
    const seen = await turn(`echo key=${key}`);
    assert.equal(seen.value.stdout, "key=[REDACTED:aws-access-key-id]\n");
  });

  test("files: bytes written by the host and by commands round-trip", async (t) => {
    if (skipUnlessReady(t)) return;
    const bytes = new Uint8Array(512).map((_, i) => (i * 7) % 256);
    await sandbox.writeBinaryFile({ path: "in/data.bin", content: bytes });
    const seen = await turn("cp in/data.bin /work/copy.bin && wc -c < copy.bin");
    assert.equal(seen.value.stdout.trim(), "512");
    assert.deepEqual(await sandbox.readBinaryFile({ path: "/work/copy.bin" }), bytes);
    assert.equal(await sandbox.readBinaryFile({ path: "missing.bin" }), null);
    assert.deepEqual(await sandbox.stat({ path: "copy.bin" }), { type: "file", size: 512 });
    assert.deepEqual(await sandbox.stat({ path: "in" }), { type: "directory", size: 0 });
    assert.equal(await sandbox.stat({ path: "nothing" }), null);
    const entries = await sandbox.listDirectory({ path: "in" });
    assert.deepEqual(entries, [{ name: "data.bin", type: "file" }]);
    assert.equal(await sandbox.deleteFile({ path: "copy.bin" }), true);
    assert.equal(await sandbox.deleteFile({ path: "copy.bin" }), false);
    await sandbox.writeTextFile({ path: "lines.txt", content: "a\nb\nc\n" });
    assert.equal(await sandbox.readTextFile({ path: "lines.txt", startLine: 2, endLine: 3 }), "b\nc");
  });

  test("spawn: output and exit code; abort kills the command", async (t) => {
    if (skipUnlessReady(t)) return;
    const process = await sandbox.spawn({ command: "echo out; echo err >&2; exit 2" });
    const [stdout, stderr, status] = await Promise.all([
      new Response(process.stdout).text(),
      new Response(process.stderr).text(),
      process.wait(),
    ]);
    assert.deepEqual([stdout, stderr, status.exitCode], ["out\n", "err\n", 2]);
    const controller = new AbortController();
    const running = sandbox.run({ command: "sleep 30", abortSignal: controller.signal });
    controller.abort(new Error("stop"));
    await assert.rejects(running, /stop/);
  });
});
