// The official TypeScript MCP SDK as a client of `airlock mcp` (stdio) and of the
// server's /mcp (streamable HTTP): list the tools, call run_code, close cleanly.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { airlockBin, missing, type Server, skipUnlessReady, startServer } from "./helpers.js";

interface TextContent {
  type: string;
  text?: string;
}

async function exercise(client: Client): Promise<void> {
  const { tools } = await client.listTools();
  const runCode = tools.find((t) => t.name === "run_code");
  assert.ok(runCode, `no run_code in ${tools.map((t) => t.name).join(", ")}`);
  assert.deepEqual((runCode.inputSchema.required ?? []).includes("code"), true);

  const hello = await client.callTool({ name: "run_code", arguments: { code: "print(6 * 7)", language: "python" } });
  assert.notEqual(hello.isError, true);
  const structured = hello.structuredContent as { ok: boolean; stdout: string } | undefined;
  assert.equal(structured?.ok, true);
  assert.equal(structured?.stdout, "42\n");
  const text = (hello.content as TextContent[]).find((c) => c.type === "text")?.text ?? "";
  assert.equal((JSON.parse(text) as { stdout: string }).stdout, "42\n");

  const failed = await client.callTool({ name: "run_code", arguments: { code: "import sys; sys.exit(4)" } });
  assert.equal(failed.isError, true);
  assert.equal((failed.structuredContent as { exit_code: number }).exit_code, 4);
}

describe("@modelcontextprotocol/sdk client", () => {
  let server: Server | undefined;

  before(async () => {
    if (missing() === undefined) server = await startServer();
  });
  after(async () => {
    await server?.stop();
  });

  test("over stdio: airlock mcp", async (t) => {
    if (skipUnlessReady(t)) return;
    const transport = new StdioClientTransport({ command: airlockBin() ?? "airlock", args: ["mcp"], stderr: "ignore" });
    const client = new Client({ name: "airlock-js-test", version: "0.0.0" });
    await client.connect(transport);
    try {
      await exercise(client);
    } finally {
      await client.close();
    }
    assert.equal(transport.pid, null, "airlock mcp is still running after close");
  });

  test("over streamable HTTP: /mcp on airlock serve, with the bearer token", async (t) => {
    if (skipUnlessReady(t) || server === undefined) return;
    const transport = new StreamableHTTPClientTransport(new URL(`${server.url}/mcp`), {
      requestInit: { headers: { Authorization: `Bearer ${server.token}` } },
    });
    const client = new Client({ name: "airlock-js-test", version: "0.0.0" });
    await client.connect(transport);
    try {
      await exercise(client);
      await transport.terminateSession();
    } finally {
      await client.close();
    }
  });

  test("over streamable HTTP without a token: 401", async (t) => {
    if (skipUnlessReady(t) || server === undefined) return;
    const client = new Client({ name: "airlock-js-test", version: "0.0.0" });
    await assert.rejects(
      client.connect(new StreamableHTTPClientTransport(new URL(`${server.url}/mcp`))),
      /401|nauthorized/,
    );
  });
});
