// The SDK's agents on AirlockSandbox: bash-tool's createBashTool (npm `bash-tool`, the
// bash tool made for the AI SDK) with the session as its sandbox, inside generateText and
// inside a ToolLoopAgent that is given the session as `experimental_sandbox`. Each test
// asserts what the model receives next.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { generateText, jsonSchema, stepCountIs, Experimental_Agent as ToolLoopAgent, tool } from "ai";
import { createBashTool } from "bash-tool";
import { AirlockSandbox } from "../src/ai.js";
import { AirlockClient } from "../src/index.js";
import { missing, type Server, skipUnlessReady, startServer } from "./helpers.js";
import { resultSeenByModel, scriptedModel } from "./model.js";

interface BashResult {
  exitCode: number;
  stdout: string;
  stderr: string;
}

describe("bash-tool's createBashTool and ToolLoopAgent on AirlockSandbox", () => {
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

  async function bashToolTurn(toolName: string, input: unknown) {
    const { tools } = await createBashTool({ sandbox: sandbox.bashToolSandbox(), destination: "/work" });
    const model = scriptedModel(toolName, input);
    const result = await generateText({ model, tools, stopWhen: stepCountIs(3), prompt: "go" });
    assert.equal(result.text, "done");
    return resultSeenByModel(model);
  }

  test("createBashTool: hello, in /work", async (t) => {
    if (skipUnlessReady(t)) return;
    const seen = await bashToolTurn("bash", { command: "echo hello; pwd" });
    assert.equal(seen.type, "json");
    assert.deepEqual(seen.value, { stdout: "hello\n/work\n", stderr: "", exitCode: 0 });
  });

  test("createBashTool: a timeout is exit code 124 with the reason", async (t) => {
    if (skipUnlessReady(t)) return;
    const seen = await bashToolTurn("bash", { command: "sleep 30" });
    const value = seen.value as BashResult;
    assert.equal(value.exitCode, 124);
    assert.match(value.stderr, /stopped \(timeout\)/);
  });

  test("createBashTool: a flood is bounded by airlock", async (t) => {
    if (skipUnlessReady(t)) return;
    const seen = await bashToolTurn("bash", { command: "yes | head -c 3000000" });
    const value = seen.value as BashResult;
    assert.equal(value.exitCode, 0);
    assert.ok(value.stdout.length <= 8000, `${value.stdout.length}`);
  });

  test("createBashTool: a printed secret is redacted", async (t) => {
    if (skipUnlessReady(t)) return;
    const key = ["AKIA", "IOSFODNN7", "EXAMPLE"].join("");
    const seen = await bashToolTurn("bash", { command: `echo ${key}` });
    assert.equal((seen.value as BashResult).stdout, "[REDACTED:aws-access-key-id]\n");
  });

  test("createBashTool: writeFile and readFile tools go through the session's files", async (t) => {
    if (skipUnlessReady(t)) return;
    await bashToolTurn("writeFile", { path: "notes/a.txt", content: "from the model\n" });
    assert.equal(await sandbox.readTextFile({ path: "/work/notes/a.txt" }), "from the model\n");
    const seen = await bashToolTurn("readFile", { path: "notes/a.txt" });
    assert.deepEqual(seen.value, { content: "from the model\n" });
  });

  test("ToolLoopAgent: experimental_sandbox reaches the tools", async (t) => {
    if (skipUnlessReady(t)) return;
    const shell = tool({
      description: "Run a shell command.",
      inputSchema: jsonSchema<{ command: string }>({
        type: "object",
        properties: { command: { type: "string" } },
        required: ["command"],
      }),
      execute: async ({ command }, { experimental_sandbox: session }) => {
        if (session === undefined) throw new Error("no sandbox");
        return session.run({ command });
      },
    });
    const model = scriptedModel("shell", { command: "echo agent > agent.txt; cat agent.txt; exit 5" });
    const agent = new ToolLoopAgent({ model, tools: { shell }, stopWhen: stepCountIs(3) });
    const result = await agent.generate({ prompt: "go", experimental_sandbox: sandbox });
    assert.equal(result.text, "done");
    const seen = resultSeenByModel(model);
    assert.deepEqual(seen.value, { exitCode: 5, stdout: "agent\n", stderr: "" });
  });
});
