// Local mode: without AIRLOCK_URL the client starts its own `airlock serve` on a free
// loopback port (no tokens: the server then refuses any address but loopback and checks
// Host and Origin, see docs/serve.md) and stops it on close() or when this process exits.
// One private server gives local mode the whole API (streaming, sessions), where one
// `airlock run --json` per job (the Python package's way) would give runs only.
import { type ChildProcess, spawn } from "node:child_process";
import { accessSync, constants, statSync } from "node:fs";
import { delimiter, join } from "node:path";
import { BinaryNotFound, TransportError } from "./errors.js";

/** How long `airlock serve` gets to print its address. */
const SERVER_START_MS = 30_000;
/** How long the server gets to kill its jobs and remove their sandboxes after SIGTERM. */
const SERVER_STOP_GRACE_MS = 10_000;
/** Bytes of the server's stderr kept for an error message. */
const STDERR_QUOTE_BYTES = 2000;

function isExecutableFile(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return statSync(path).isFile();
  } catch {
    return false;
  }
}

/** The `airlock` binary: `explicit`, else AIRLOCK_BIN, else `airlock` on PATH. */
export function findBinary(explicit?: string): string {
  const chosen = explicit ?? (process.env.AIRLOCK_BIN || undefined);
  if (chosen !== undefined) {
    if (!isExecutableFile(chosen))
      throw new BinaryNotFound(`airlock binary ${JSON.stringify(chosen)} is not an executable file`);
    return chosen;
  }
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    if (dir === "") continue;
    const candidate = join(dir, "airlock");
    if (isExecutableFile(candidate)) return candidate;
  }
  throw new BinaryNotFound(
    "no airlock binary: put airlock on PATH, set AIRLOCK_BIN to a binary, or set AIRLOCK_URL to use a server",
  );
}

/** Options of the private server local mode starts. */
export interface LocalServerOptions {
  /** The binary (default: AIRLOCK_BIN, else `airlock` on PATH). */
  binary?: string;
  /** A policy file for the jobs (default: the binary's built-in policy). */
  policy?: string;
  /** Extra arguments for `airlock serve` (e.g. `["--backend", "docker"]`). */
  args?: readonly string[];
}

const running = new Set<ChildProcess>();
let exitHookInstalled = false;

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  // A script that never called close() still stops its server; SIGTERM lets the server
  // kill its jobs and remove their sandboxes on its own.
  process.on("exit", () => {
    for (const child of running) child.kill("SIGTERM");
  });
}

/** A running private `airlock serve`. */
export class LocalServer {
  /** Its base URL, `http://127.0.0.1:PORT`. */
  readonly url: string;
  readonly #child: ChildProcess;
  readonly #exited: Promise<void>;

  private constructor(url: string, child: ChildProcess, exited: Promise<void>) {
    this.url = url;
    this.#child = child;
    this.#exited = exited;
  }

  /** Starts `airlock serve --listen 127.0.0.1:0` and waits for its address. */
  static async start(options: LocalServerOptions = {}): Promise<LocalServer> {
    const binary = findBinary(options.binary);
    const args = ["serve", "--listen", "127.0.0.1:0"];
    if (options.policy !== undefined) args.push("--policy", options.policy);
    args.push(...(options.args ?? []));
    const child = spawn(binary, args, { stdio: ["ignore", "ignore", "pipe"] });
    running.add(child);
    installExitHook();
    const exited = new Promise<void>((resolve) => {
      child.once("exit", () => {
        running.delete(child);
        resolve();
      });
    });
    let stderr = "";
    try {
      const url = await new Promise<string>((resolve, reject) => {
        const timer = setTimeout(() => {
          reject(new TransportError(`airlock serve printed no address within ${SERVER_START_MS} ms: ${stderr.trim()}`));
        }, SERVER_START_MS);
        child.once("error", (error) => {
          clearTimeout(timer);
          reject(new BinaryNotFound(`start ${binary}: ${error.message}`));
        });
        child.once("exit", (code, signal) => {
          clearTimeout(timer);
          reject(new TransportError(`airlock serve exited (${signal ?? code}) before listening: ${stderr.trim()}`));
        });
        child.stderr?.setEncoding("utf8");
        child.stderr?.on("data", (chunk: string) => {
          // Read always, so the server never blocks on a full pipe; keep only the tail.
          stderr = (stderr + chunk).slice(-STDERR_QUOTE_BYTES);
          const match = /listening on (http:\/\/[0-9.:[\]]+)[\s(]/.exec(stderr);
          if (match?.[1] !== undefined) {
            clearTimeout(timer);
            resolve(match[1]);
          }
        });
      });
      // The server must not keep this process alive: the exit hook stops it.
      child.unref();
      (child.stderr as { unref?: () => void } | null)?.unref?.();
      return new LocalServer(url, child, exited);
    } catch (error) {
      child.kill("SIGKILL");
      throw error;
    }
  }

  /** Stops the server (SIGTERM: it kills running jobs and removes their sandboxes). */
  async stop(): Promise<void> {
    if (this.#child.exitCode !== null || this.#child.signalCode !== null) return;
    this.#child.kill("SIGTERM");
    const timer = setTimeout(() => this.#child.kill("SIGKILL"), SERVER_STOP_GRACE_MS);
    await this.#exited;
    clearTimeout(timer);
  }
}
