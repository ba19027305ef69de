// The package as a user gets it: `npm pack`, then an install of the tarball with `ai`
// into an empty project, which runs each example of README.md against a live server.
// The examples that need a model get `model` defined before them: the AI SDK's mock
// model, scripted to make the tool call a real model would.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { missing, REPO, type Server, skipUnlessReady, startServer } from "./helpers.js";

const JS = join(REPO, "js");
/** How long npm may take to pack or install (a cold cache downloads `ai`). */
const NPM_TIMEOUT_MS = 300_000;
/** How long one example may run. */
const EXAMPLE_TIMEOUT_MS = 120_000;

function scriptedModel(toolName: string, input: unknown): string {
  return `import { MockLanguageModelV4 as ScriptedModel } from "ai/test";
const usage = { inputTokens: { total: 1, noCache: 1 }, outputTokens: { total: 1, text: 1 } };
let calls = 0;
const model = new ScriptedModel({
  doGenerate: async () => (++calls === 1
    ? { content: [{ type: "tool-call", toolCallId: "call-1", toolName: ${JSON.stringify(toolName)}, input: ${JSON.stringify(JSON.stringify(input))} }],
        finishReason: { unified: "tool-calls", raw: "tool_calls" }, usage, warnings: [] }
    : { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: "stop" }, usage, warnings: [] }),
});
`;
}

/** Per README example: what defines `model` before it, and what it must print. */
const EXAMPLES: Record<string, { preamble: string; expect: RegExp }> = {
  client: { preamble: "", expect: /^true exited "45\\n"\n0\n1\n2\ntrue\n$/ },
  "ai-tool": {
    preamble: scriptedModel("run_code", {
      code: "a, b = 0, 1\nfor _ in range(20): a, b = b, a + b\nprint(a)\nopen('/out/fib.txt', 'w').write(str(a))",
      language: "python",
    }),
    expect: /^6765\n \[ \[ 'fib\.txt', 4 \] \]\n$/,
  },
  "bash-tool": {
    preamble: scriptedModel("bash", { command: "nproc >/dev/null && echo counted" }),
    expect: /^\{ exitCode: 0, stdout: 'counted\\n', stderr: '' \}\n$/,
  },
  sandbox: {
    preamble: scriptedModel("bash", { command: "echo hi > a.txt && cat a.txt" }),
    expect: /^\{ exitCode: 0, stdout: 'hi\\n', stderr: '' \}\n$/,
  },
};

function readmeExamples(): Map<string, string> {
  const readme = readFileSync(join(JS, "README.md"), "utf8");
  const found = new Map<string, string>();
  for (const match of readme.matchAll(/<!-- example: (\S+) -->\n```js\n([\s\S]*?)```/g)) {
    if (match[1] !== undefined && match[2] !== undefined) found.set(match[1], match[2]);
  }
  return found;
}

describe("npm pack, install into an empty project, run the README's examples", () => {
  let server: Server | undefined;
  let project: string;

  before(async () => {
    if (missing() !== undefined) return;
    server = await startServer();
    project = mkdtempSync(join(tmpdir(), "airlock-js-pack-"));
    execFileSync("npm", ["pack", "--pack-destination", project], { cwd: JS, stdio: "pipe", timeout: NPM_TIMEOUT_MS });
    const tarball = readdirSync(project).find((name) => name.endsWith(".tgz"));
    assert.ok(tarball, "npm pack made no tarball");
    const manifest = JSON.parse(readFileSync(join(JS, "package.json"), "utf8")) as {
      devDependencies: Record<string, string>;
    };
    writeFileSync(
      join(project, "package.json"),
      JSON.stringify({ name: "readme-examples", private: true, type: "module" }),
    );
    execFileSync(
      "npm",
      [
        "install",
        "--no-audit",
        "--no-fund",
        `./${tarball}`,
        `ai@${manifest.devDependencies.ai}`,
        `bash-tool@${manifest.devDependencies["bash-tool"]}`,
      ],
      {
        cwd: project,
        stdio: "pipe",
        timeout: NPM_TIMEOUT_MS,
      },
    );
  });
  after(async () => {
    await server?.stop();
    if (project !== undefined) rmSync(project, { recursive: true, force: true });
  });

  test("the README has exactly the examples this test runs", (t) => {
    if (skipUnlessReady(t)) return;
    assert.deepEqual([...readmeExamples().keys()].sort(), Object.keys(EXAMPLES).sort());
  });

  for (const [name, { preamble, expect }] of Object.entries(EXAMPLES)) {
    test(`README example "${name}" runs from the installed tarball`, (t) => {
      if (skipUnlessReady(t) || server === undefined) return;
      const code = readmeExamples().get(name);
      assert.ok(code, `README.md has no example ${name}`);
      const file = join(project, `${name}.mjs`);
      writeFileSync(file, preamble + code);
      const stdout = execFileSync(process.execPath, [file], {
        cwd: project,
        encoding: "utf8",
        timeout: EXAMPLE_TIMEOUT_MS,
        env: { ...process.env, AIRLOCK_URL: server.url, AIRLOCK_TOKEN: server.token },
      });
      assert.match(stdout, expect);
    });
  }
});
