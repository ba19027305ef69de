// Test fixtures: the real `airlock` binary and a real `airlock serve` on 127.0.0.1.
// A missing prerequisite skips with the reason; AIRLOCK_REQUIRE_ALL=1 (CI) makes it a
// failure instead, so nothing is counted as passed that did not run.
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import type { TestContext } from "node:test";
import { fileURLToPath } from "node:url";

/** The repository's root (js/ is one level down; tests run from build/test/). */
export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
const REQUIRE_ALL = process.env.AIRLOCK_REQUIRE_ALL === "1";
/** Longest wait for `airlock serve` to print its address. */
const SERVER_START_MS = 30_000;

/** The binary under test: AIRLOCK_BIN, else the workspace's debug build. */
export function airlockBin(): string | undefined {
  const chosen = process.env.AIRLOCK_BIN || join(REPO, "target/debug/airlock");
  return existsSync(chosen) ? chosen : undefined;
}

/** Why the tests that need the sandbox cannot run here, or undefined when they can. */
export function missing(): string | undefined {
  if (airlockBin() === undefined) return "no airlock binary (set AIRLOCK_BIN or cargo build -p airlock-cli)";
  if (process.getuid?.() !== 0) return "the native sandbox needs root here";
  return undefined;
}

/** Skips the test with the reason, or fails it under AIRLOCK_REQUIRE_ALL=1. Returns true when skipped. */
export function skipUnlessReady(t: TestContext): boolean {
  const reason = missing();
  if (reason === undefined) return false;
  if (REQUIRE_ALL) throw new Error(`skipped under AIRLOCK_REQUIRE_ALL=1: ${reason}`);
  console.log(`# skip: ${reason}`);
  t.skip(reason);
  return true;
}

/** The built-in policy with its sessions (on by default) in workspace mode (kernel by default). */
export function sessionPolicy(dir: string): string {
  const policy = readFileSync(join(REPO, "policy/default.toml"), "utf8");
  const enabled = policy.replace(/^\[sessions\]([^[]*?)^mode = "kernel"/m, '[sessions]$1mode = "workspace"');
  if (enabled === policy) throw new Error('policy/default.toml has no [sessions] mode = "kernel" to switch');
  if (!/^\[sessions\][^[]*?^enabled = true/m.test(enabled)) throw new Error("policy/default.toml has sessions off");
  const path = join(dir, "policy.toml");
  writeFileSync(path, enabled);
  return path;
}

/** A running `airlock serve` with one tenant's token and workspace sessions enabled. */
export interface Server {
  url: string;
  token: string;
  dir: string;
  stop(): Promise<void>;
}

export async function startServer(): Promise<Server> {
  const bin = airlockBin();
  if (bin === undefined) throw new Error("no airlock binary");
  const dir = mkdtempSync(join(tmpdir(), "airlock-js-"));
  const tokens = join(dir, "tokens.toml");
  const policy = sessionPolicy(dir);
  const token = execFileSync(bin, ["token", "new", "--tenant", "js", "--tokens-file", tokens, "--policy", policy], {
    encoding: "utf8",
  }).trim();
  const child: ChildProcess = spawn(bin, ["serve", "--listen", "127.0.0.1:0", "--tokens", tokens, "--policy", policy], {
    stdio: ["ignore", "ignore", "pipe"],
    env: { ...process.env, AIRLOCK_STATE_DIR: join(dir, "state") },
  });
  let log = "";
  const url = await new Promise<string>((resolveUrl, reject) => {
    const timer = setTimeout(() => reject(new Error(`airlock serve did not listen: ${log}`)), SERVER_START_MS);
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`airlock serve exited ${code}: ${log}`));
    });
    child.stderr?.setEncoding("utf8");
    child.stderr?.on("data", (chunk: string) => {
      log = (log + chunk).slice(-20_000);
      const match = /listening on (http:\/\/[0-9.:]+)[\s(]/.exec(log);
      if (match?.[1] !== undefined) {
        clearTimeout(timer);
        resolveUrl(match[1]);
      }
    });
  });
  const exited = new Promise<void>((done) => child.once("exit", () => done()));
  return {
    url,
    token,
    dir,
    stop: async () => {
      child.kill("SIGTERM");
      await exited;
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
