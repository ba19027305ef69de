// runCodeTool in the AI SDK's own loop: generateText with the mock language model from
// ai/test, which calls the tool once and then answers. Each test asserts what the model
// receives next: the tool-result part of the prompt of its second call.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { generateText, type JSONValue, stepCountIs } from "ai";
import {
  modelView,
  type RunCodeInput,
  type RunCodeOutput,
  type RunCodeTool,
  releasedFiles,
  runCodeTool,
} from "../src/ai.js";
import { AirlockClient } from "../src/index.js";
import { missing, type Server, skipUnlessReady, startServer } from "./helpers.js";
import { resultSeenByModel, scriptedModel } from "./model.js";

describe("runCodeTool with generateText and the mock model", () => {
  let server: Server | undefined;
  let runCode: RunCodeTool;

  before(async () => {
    if (missing() === undefined) {
      server = await startServer();
      runCode = await runCodeTool({ client: new AirlockClient({ url: server.url, token: server.token }) });
    }
  });
  after(async () => {
    await server?.stop();
  });

  async function turn(input: RunCodeInput) {
    const model = scriptedModel(runCode.name, input);
    const result = await generateText({
      model,
      tools: { [runCode.name]: runCode },
      stopWhen: stepCountIs(3),
      prompt: "go",
    });
    assert.equal(result.text, "done");
    const toolResult = result.steps[0]?.toolResults[0];
    assert.ok(toolResult, "no tool result in the first step");
    return { seen: resultSeenByModel(model), output: toolResult.output as RunCodeOutput };
  }

  test("the tool is the server's: name, description with the policy's limits, strict schema", async (t) => {
    if (skipUnlessReady(t) || server === undefined) return;
    const schema = await new AirlockClient({ url: server.url, token: server.token }).toolSchema();
    assert.equal(runCode.name, "run_code");
    assert.equal(runCode.description, schema.function.description);
    assert.match(runCode.description ?? "", /5s wall time/);
    const model = scriptedModel(runCode.name, { code: "print(1)" });
    await generateText({ model, tools: { [runCode.name]: runCode }, stopWhen: stepCountIs(3), prompt: "go" });
    const offered = model.doGenerateCalls[0]?.tools?.[0];
    assert.ok(offered && offered.type === "function");
    assert.equal(offered.name, "run_code");
    assert.deepEqual(offered.inputSchema, schema.function.parameters);
  });

  test("hello: the observation reaches the model as json", async (t) => {
    if (skipUnlessReady(t)) return;
    const { seen } = await turn({ code: "print('hello')" });
    assert.equal(seen.type, "json");
    const value = seen.value as { ok: boolean; stdout: string; outcome: string };
    assert.equal(value.ok, true);
    assert.equal(value.outcome, "exited");
    assert.equal(value.stdout, "hello\n");
  });

  test("timeout: an error-json observation, not a crash", async (t) => {
    if (skipUnlessReady(t)) return;
    const { seen } = await turn({ code: "while True: pass", timeout_s: 0.5 });
    assert.equal(seen.type, "error-json");
    const value = seen.value as { ok: boolean; outcome: string; exit_code: number | null };
    assert.equal(value.ok, false);
    assert.equal(value.outcome, "timeout");
  });

  test("a request the policy refuses reaches the model as error-json", async (t) => {
    if (skipUnlessReady(t)) return;
    const { seen } = await turn({ code: "print(1)", language: "cobol" });
    assert.equal(seen.type, "error-json");
    const value = seen.value as { ok: boolean; error: { kind: string; message: string } };
    assert.equal(value.ok, false);
    assert.equal(value.error.kind, "invalid_input");
  });

  test("flood: the model gets the bounded output and the byte count", async (t) => {
    if (skipUnlessReady(t)) return;
    const { seen } = await turn({ code: "import sys\nsys.stdout.write('x' * 5_000_000)" });
    const value = seen.value as { stdout: string; stdout_truncated: boolean; stdout_bytes: number };
    assert.equal(value.stdout_truncated, true);
    assert.equal(value.stdout_bytes, 5_000_000);
    assert.ok(value.stdout.length <= 8000, `stdout kept ${value.stdout.length} characters`);
    assert.ok(JSON.stringify(seen.value).length < 20_000);
  });

  test("a secret the job prints reaches the model redacted", async (t) => {
    if (skipUnlessReady(t)) return;
    const key = ["AKIA", "IOSFODNN7", "EXAMPLE"].join("");
    const { seen, output } = await turn({ code: `print('key=${key}')` });
    const text = JSON.stringify(seen.value);
    assert.ok(!text.includes(key), text);
    assert.ok(!JSON.stringify(output).includes(key));
    const value = seen.value as { stdout: string; redactions: number };
    assert.equal(value.stdout, "key=[REDACTED:aws-access-key-id]\n");
    assert.equal(value.redactions, 1);
  });

  test("in a session: /work and the given files persist between calls", async (t) => {
    if (skipUnlessReady(t) || server === undefined) return;
    const client = new AirlockClient({ url: server.url, token: server.token });
    const session = await client.createSession();
    try {
      const inSession = await runCodeTool({ client, session });
      const call = async (input: RunCodeInput) => {
        const model = scriptedModel(inSession.name, input);
        await generateText({ model, tools: { [inSession.name]: inSession }, stopWhen: stepCountIs(3), prompt: "go" });
        return resultSeenByModel(model).value as { stdout: string; session: { id: string; call: number } };
      };
      const first = await call({
        code: "print(open('given.txt').read()); open('state.txt', 'w').write('from call 1')",
        files: [{ path: "given.txt", content: "given", content_base64: null }],
      });
      assert.equal(first.stdout, "given\n");
      assert.deepEqual([first.session.id, first.session.call], [session.id, 1]);
      const second = await call({ code: "print(open('state.txt').read())" });
      assert.equal(second.stdout, "from call 1\n");
      assert.equal(second.session.call, 2);
    } finally {
      await session.close();
    }
  });

  test("/out files: bytes for the host, name, size and media type for the model", async (t) => {
    if (skipUnlessReady(t)) return;
    const { seen, output } = await turn({
      code: "open('/out/table.bin', 'wb').write(bytes(range(256)) * 4)\nprint('wrote')",
      return_files: true,
    });
    const value = seen.value as { files: Array<Record<string, JSONValue>> };
    assert.deepEqual(Object.keys(value.files[0] ?? {}).sort(), ["bytes", "media_type", "path", "sha256"]);
    assert.equal(value.files[0]?.path, "table.bin");
    assert.equal(value.files[0]?.bytes, 1024);
    assert.equal(value.files[0]?.media_type, "application/octet-stream");
    assert.ok(!JSON.stringify(seen.value).includes("content_base64"));
    const [file] = releasedFiles(output);
    const expected = new Uint8Array(1024).map((_, i) => i % 256);
    assert.deepEqual(file?.bytes, expected);
    assert.deepEqual(modelView(output), seen.value);
  });
});
