// The Vercel AI SDK side: `runCodeTool`, the server's run_code tool as an AI SDK tool,
// and `AirlockSandbox`, an `Experimental_SandboxSession` backed by an airlock session.
import { type Experimental_SandboxSession, type JSONSchema7, type JSONValue, jsonSchema, type Tool, tool } from "ai";
import { AirlockClient, type ClientOptions, type Session } from "./client.js";
import { AirlockError, ApiError } from "./errors.js";
import type { ErrorBody, Observation, OutputFile, RequestFile } from "./generated/openapi.js";

/** The arguments the model sends: the server's `run_code` parameters. */
export interface RunCodeInput {
  code: string;
  language?: string | null;
  files?: RequestFile[] | null;
  timeout_s?: number | null;
  return_files?: boolean | null;
  session?: string | null;
}

/** What a session call adds to its observation. */
export interface SessionCallInfo {
  id: string;
  call: number;
  value?: string | null;
  kernel_restarted?: string | null;
}

/**
 * What the tool returns to the host: the observation (files with their bytes as
 * `content_base64`), or the error body of a request airlock refused. The model sees
 * `modelView` of it: the same without file contents.
 */
export type RunCodeOutput = (Observation & { session?: SessionCallInfo }) | ErrorBody;

/** Options of `runCodeTool`. */
export interface RunCodeToolOptions extends ClientOptions {
  /** The client to use (default: a new one from the other options, local or AIRLOCK_URL). */
  client?: AirlockClient;
  /** Run every call in this session (a model-given `session` argument still wins). */
  session?: Session;
  /** Ask for `/out` files on every call, whatever the model sends (default: true; false leaves it to the model). */
  returnFiles?: boolean;
}

/** The tool, with the name the server gives it (use it as the key in `tools`). */
export type RunCodeTool = Tool<RunCodeInput, RunCodeOutput, Record<string, unknown>> & {
  readonly name: string;
  execute: NonNullable<Tool<RunCodeInput, RunCodeOutput, Record<string, unknown>>["execute"]>;
};

/** A file the job left in `/out`, as the host receives it. */
export interface ReleasedFile {
  path: string;
  mediaType: string;
  sha256: string;
  /** The released bytes; `undefined` when the file was past the inline cap. */
  bytes: Uint8Array | undefined;
  size: number;
}

/** Whether the output is a refusal's error body rather than a job's observation. */
function isErrorBody(output: RunCodeOutput): output is ErrorBody {
  return !("stdout" in output && "files" in output && Array.isArray(output.files));
}

/** The `/out` files of a tool result, their bytes decoded (for the host, never the model). */
export function releasedFiles(output: RunCodeOutput): ReleasedFile[] {
  if (isErrorBody(output)) return [];
  return output.files.map((file) => ({
    path: file.path,
    mediaType: file.media_type,
    sha256: file.sha256,
    size: file.bytes,
    bytes:
      typeof file.content_base64 === "string" ? new Uint8Array(Buffer.from(file.content_base64, "base64")) : undefined,
  }));
}

function fileView(file: OutputFile): JSONValue {
  return { path: file.path, bytes: file.bytes, media_type: file.media_type, sha256: file.sha256 };
}

/**
 * What the model receives for a result: the observation as it is (already bounded and
 * redacted by airlock) with each `/out` file as its name, size and media type only.
 */
export function modelView(output: RunCodeOutput): JSONValue {
  if (isErrorBody(output)) return JSON.parse(JSON.stringify(output)) as JSONValue;
  const { files, ...rest } = output;
  return { ...(JSON.parse(JSON.stringify(rest)) as Record<string, JSONValue>), files: files.map(fileView) };
}

function refusal(error: ApiError): ErrorBody {
  return error.body ?? { ok: false, outcome: "error", error: { kind: error.kind, message: error.message } };
}

async function runOnce(
  client: AirlockClient,
  defaultSession: Session | undefined,
  input: RunCodeInput,
  returnFiles: boolean,
  signal: AbortSignal | undefined,
): Promise<RunCodeOutput> {
  const options = signal === undefined ? {} : { signal };
  try {
    const sessionId = input.session ?? undefined;
    const session = sessionId !== undefined ? client.session(sessionId) : defaultSession;
    if (session === undefined) {
      return await client.run(
        {
          code: input.code,
          language: input.language ?? null,
          ...(input.files ? { files: input.files } : {}),
          timeout_s: input.timeout_s ?? null,
          return_files: returnFiles || input.return_files === true,
        },
        options,
      );
    }
    // A session call takes no files: they go into the session's /work first.
    for (const file of input.files ?? []) {
      const content =
        typeof file.content_base64 === "string"
          ? new Uint8Array(Buffer.from(file.content_base64, "base64"))
          : (file.content ?? "");
      await session.writeFile(file.path, content, options);
    }
    const answer = await session.run(
      { code: input.code, language: input.language ?? null, timeout_s: input.timeout_s ?? null },
      options,
    );
    return {
      ...answer.observation,
      session: {
        id: answer.session_id,
        call: answer.call,
        value: answer.value ?? null,
        kernel_restarted: answer.kernel_restarted ?? null,
      },
    };
  } catch (error) {
    // A refused request (policy, bad input, a full queue) is the model's to read and
    // correct; only an unreachable airlock is the host's problem.
    if (error instanceof ApiError) return refusal(error);
    throw error;
  }
}

/**
 * The server's `run_code` tool as a Vercel AI SDK tool: its name, description (with the
 * policy's limits) and strict JSON schema come from the server (`GET /v1/tool-schema`).
 * A job that fails (non-zero exit, timeout, oom) or a request airlock refuses comes back
 * to the model as an `error-json` result, never as an exception.
 */
export async function runCodeTool(options: RunCodeToolOptions = {}): Promise<RunCodeTool> {
  const client = options.client ?? new AirlockClient(options);
  const definition = await client.toolSchema();
  const returnFiles = options.returnFiles ?? true;
  const created = tool<RunCodeInput, RunCodeOutput, Record<string, unknown>>({
    description: definition.function.description,
    inputSchema: jsonSchema<RunCodeInput>(definition.function.parameters as JSONSchema7),
    strict: definition.function.strict,
    execute: (input: RunCodeInput, { abortSignal }): Promise<RunCodeOutput> =>
      runOnce(client, options.session, input, returnFiles, abortSignal),
    toModelOutput: ({ output }: { output: RunCodeOutput }) => {
      const value = modelView(output);
      return output.ok ? { type: "json", value } : { type: "error-json", value };
    },
  });
  return Object.assign(created, { name: definition.function.name });
}

/** Options of `createSandbox`. */
export interface SandboxOptions extends ClientOptions {
  /** The client to use (default: a new one from the other options; `close()` then closes it). */
  client?: AirlockClient;
  /** Per-command wall time in seconds (default and maximum: the policy's). */
  timeoutS?: number;
}

/** The exit code a command gets when airlock ended it (no exit code of its own). */
const EXIT_CODES: Record<string, number> = { timeout: 124, oom: 137, killed: 137, output_limit: 141, error: 126 };

const WORK = "/work";

function shellQuote(value: string): string {
  return `'${value.replaceAll("'", "'\\''")}'`;
}

function absolute(path: string): string {
  const joined = path.startsWith("/") ? path : `${WORK}/${path}`;
  const parts: string[] = [];
  for (const part of joined.split("/")) {
    if (part === "" || part === ".") continue;
    if (part === "..") parts.pop();
    else parts.push(part);
  }
  return `/${parts.join("/")}`;
}

/** The path relative to /work, or undefined when it is outside. */
function inWork(path: string): string | undefined {
  const full = absolute(path);
  return full.startsWith(`${WORK}/`) ? full.slice(WORK.length + 1) : undefined;
}

async function collect(stream: ReadableStream<Uint8Array>): Promise<Uint8Array> {
  return new Uint8Array(await new Response(stream).arrayBuffer());
}

/** What a command gave: its exit code and its (bounded, redacted) output. */
export interface CommandResult {
  exitCode: number;
  stdout: string;
  stderr: string;
}

/**
 * An AI SDK `Experimental_SandboxSession` on an airlock `workspace` session: each command
 * runs with bash in a fresh sandbox whose `/work` (the base directory) is the session's,
 * so files persist between commands and processes do not. A command's output arrives
 * when it ends; a command airlock stops (wall time, memory) exits 124 or 137 with the
 * reason on stderr.
 */
export class AirlockSandbox implements Experimental_SandboxSession {
  /** The airlock session. */
  readonly session: Session;
  readonly description: string;
  readonly #ownsClient: boolean;
  readonly #timeoutS: number | undefined;

  private constructor(session: Session, description: string, ownsClient: boolean, timeoutS: number | undefined) {
    this.session = session;
    this.description = description;
    this.#ownsClient = ownsClient;
    this.#timeoutS = timeoutS;
  }

  /** Opens an airlock session (the policy must enable sessions in `workspace` mode). */
  static async create(options: SandboxOptions = {}): Promise<AirlockSandbox> {
    const client = options.client ?? new AirlockClient(options);
    const session = await client.createSession();
    try {
      const info = await session.info();
      if (info.mode !== "workspace") {
        throw new AirlockError(
          `the policy's sessions are ${info.mode} sessions (Python only): set [sessions] mode = "workspace" to run commands`,
        );
      }
      const limits = (await client.toolSchema()).function.description;
      const description =
        "Commands run with bash in an airlock sandbox: a fresh, isolated Linux sandbox per command, " +
        `as an unprivileged user, in ${WORK}. Files under ${WORK} persist between commands; ` +
        "processes, /tmp and anything outside /work do not. There is no network. " +
        `The session ends at ${info.expires_at}. Limits of each command: ${limits}`;
      return new AirlockSandbox(session, description, options.client === undefined, options.timeoutS);
    } catch (error) {
      await session.close().catch(() => undefined);
      throw error;
    }
  }

  /** Ends the airlock session (and stops local mode's server when this sandbox made the client). */
  async close(): Promise<void> {
    try {
      await this.session.close();
    } finally {
      if (this.#ownsClient) await this.session.client.close();
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  /**
   * This session as bash-tool's `Sandbox`, for `createBashTool({ sandbox, destination: "/work" })`:
   * its bash, readFile and writeFile tools then run on airlock.
   */
  bashToolSandbox(): BashToolSandbox {
    return {
      executeCommand: (command) => this.run({ command }),
      readFile: async (path) => {
        const text = await this.readTextFile({ path });
        if (text === null) throw new AirlockError(`${path}: no such file`);
        return text;
      },
      writeFiles: async (files) => {
        for (const file of files) {
          const content = typeof file.content === "string" ? new TextEncoder().encode(file.content) : file.content;
          await this.writeBinaryFile({ path: file.path, content });
        }
      },
    };
  }

  async #command(script: string, signal: AbortSignal | undefined): Promise<CommandResult> {
    let answer: Awaited<ReturnType<Session["run"]>>;
    try {
      answer = await this.session.run(
        { code: script, language: "bash", timeout_s: this.#timeoutS ?? null },
        signal === undefined ? {} : { signal },
      );
    } catch (error) {
      if (error instanceof ApiError && (error.kind === "invalid_input" || error.kind === "policy_denied")) {
        return {
          exitCode: 126,
          stdout: "",
          stderr: `airlock refused the command: ${error.kind}: ${error.body?.error.message ?? error.message}\n`,
        };
      }
      throw error;
    }
    const observation = answer.observation;
    if (observation.outcome === "exited" && typeof observation.exit_code === "number") {
      return { exitCode: observation.exit_code, stdout: observation.stdout, stderr: observation.stderr };
    }
    const reason = observation.error ? `${observation.error.kind}: ${observation.error.message}` : observation.outcome;
    return {
      exitCode: EXIT_CODES[observation.outcome] ?? 1,
      stdout: observation.stdout,
      stderr: `${observation.stderr}${observation.stderr === "" || observation.stderr.endsWith("\n") ? "" : "\n"}airlock: the command was stopped (${reason})\n`,
    };
  }

  #script(command: string, workingDirectory: string | undefined, env: Record<string, string> | undefined): string {
    const lines: string[] = [];
    for (const [name, value] of Object.entries(env ?? {})) {
      if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(name))
        throw new AirlockError(`env: ${JSON.stringify(name)} is not a variable name`);
      lines.push(`export ${name}=${shellQuote(value)}`);
    }
    lines.push(`cd ${shellQuote(absolute(workingDirectory ?? WORK))} || exit 1`);
    lines.push(command);
    return `${lines.join("\n")}\n`;
  }

  readonly run = async (options: {
    command: string;
    workingDirectory?: string;
    env?: Record<string, string>;
    abortSignal?: AbortSignal;
  }): Promise<CommandResult> => {
    return this.#command(this.#script(options.command, options.workingDirectory, options.env), options.abortSignal);
  };

  readonly spawn = (async (options: {
    command: string;
    workingDirectory?: string;
    env?: Record<string, string>;
    abortSignal?: AbortSignal;
    stdin?: boolean;
  }) => {
    if (options.stdin === true) {
      throw new AirlockError(
        "airlock runs each command to its end without standard input: spawn with stdin is not supported",
      );
    }
    const controller = new AbortController();
    const forward = (): void => controller.abort(options.abortSignal?.reason);
    if (options.abortSignal?.aborted) throw options.abortSignal.reason;
    options.abortSignal?.addEventListener("abort", forward, { once: true });
    const done = this.#command(
      this.#script(options.command, options.workingDirectory, options.env),
      controller.signal,
    ).finally(() => options.abortSignal?.removeEventListener("abort", forward));
    const encoder = new TextEncoder();
    const output = (pick: (result: CommandResult) => string): ReadableStream<Uint8Array> =>
      new ReadableStream<Uint8Array>({
        start: async (stream) => {
          try {
            const text = pick(await done);
            if (text !== "") stream.enqueue(encoder.encode(text));
            stream.close();
          } catch (error) {
            stream.error(error);
          }
        },
      });
    return {
      stdout: output((result) => result.stdout),
      stderr: output((result) => result.stderr),
      wait: async () => ({ exitCode: (await done).exitCode }),
      kill: async () => {
        controller.abort(new AirlockError("killed"));
        await done.catch(() => undefined);
      },
    };
  }) as unknown as Experimental_SandboxSession["spawn"];

  readonly readFile = async (options: { path: string; abortSignal?: AbortSignal }) => {
    const bytes = await this.readBinaryFile(options);
    if (bytes === null) return null;
    return new ReadableStream<Uint8Array>({
      start: (stream) => {
        stream.enqueue(bytes);
        stream.close();
      },
    });
  };

  readonly readBinaryFile = async (options: {
    path: string;
    abortSignal?: AbortSignal;
  }): Promise<Uint8Array | null> => {
    const relative = inWork(options.path);
    if (relative === undefined) {
      throw new AirlockError(
        `${options.path}: only files under ${WORK} belong to the session; read others with a command`,
      );
    }
    return this.session.readFile(relative, options.abortSignal === undefined ? {} : { signal: options.abortSignal });
  };

  readonly readTextFile = async (options: {
    path: string;
    abortSignal?: AbortSignal;
    encoding?: string;
    startLine?: number;
    endLine?: number;
  }): Promise<string | null> => {
    const bytes = await this.readBinaryFile(options);
    if (bytes === null) return null;
    const text = new TextDecoder(options.encoding ?? "utf-8").decode(bytes);
    if (options.startLine === undefined && options.endLine === undefined) return text;
    const lines = text.split("\n");
    return lines.slice((options.startLine ?? 1) - 1, options.endLine ?? lines.length).join("\n");
  };

  readonly writeFile = async (options: {
    path: string;
    content: ReadableStream<Uint8Array>;
    abortSignal?: AbortSignal;
  }) => {
    await this.writeBinaryFile({ ...options, content: await collect(options.content) });
  };

  readonly writeBinaryFile = async (options: { path: string; content: Uint8Array; abortSignal?: AbortSignal }) => {
    const relative = inWork(options.path);
    if (relative === undefined) {
      throw new AirlockError(`${options.path}: only files under ${WORK} persist in the session; write there`);
    }
    await this.session.writeFile(
      relative,
      options.content,
      options.abortSignal === undefined ? {} : { signal: options.abortSignal },
    );
  };

  readonly writeTextFile = async (options: {
    path: string;
    content: string;
    abortSignal?: AbortSignal;
    encoding?: string;
  }) => {
    if (options.encoding !== undefined && !/^utf-?8$/i.test(options.encoding)) {
      throw new AirlockError(`encoding ${options.encoding}: only utf-8 is supported`);
    }
    await this.writeBinaryFile({ ...options, content: new TextEncoder().encode(options.content) });
  };

  readonly stat = async (options: { path: string; abortSignal?: AbortSignal }) => {
    const path = shellQuote(absolute(options.path));
    const result = await this.#command(
      `if [ -d ${path} ]; then echo directory; elif [ -f ${path} ]; then echo "file $(stat -L -c %s ${path})"; ` +
        `elif [ -e ${path} ]; then echo other; else echo missing; fi\n`,
      options.abortSignal,
    );
    const [type, size] = result.stdout.trim().split(" ");
    if (result.exitCode !== 0 || type === undefined)
      throw new AirlockError(`stat ${options.path}: ${result.stderr.trim()}`);
    if (type === "missing") return null;
    return { type: type === "directory" || type === "file" ? type : "other", size: Number(size ?? 0) } as const;
  };

  readonly listDirectory = async (options: { path: string; abortSignal?: AbortSignal }) => {
    const path = shellQuote(absolute(options.path));
    const result = await this.#command(
      `[ -e ${path} ] || exit 3\n[ -d ${path} ] || exit 4\nfind ${path} -mindepth 1 -maxdepth 1 -printf '%y %f\\n'\n`,
      options.abortSignal,
    );
    if (result.exitCode === 3) return null;
    if (result.exitCode === 4) throw new AirlockError(`${options.path} is not a directory`);
    if (result.exitCode !== 0) throw new AirlockError(`list ${options.path}: ${result.stderr.trim()}`);
    const kinds: Record<string, "file" | "directory" | "symlink"> = { f: "file", d: "directory", l: "symlink" };
    return result.stdout
      .split("\n")
      .filter((line) => line.length > 2)
      .map((line) => ({ name: line.slice(2), type: kinds[line[0] ?? ""] ?? ("other" as const) }));
  };

  readonly deleteFile = async (options: { path: string; abortSignal?: AbortSignal }) => {
    const path = shellQuote(absolute(options.path));
    const result = await this.#command(
      `if [ -d ${path} ] && [ ! -L ${path} ]; then exit 4; fi\nif [ -e ${path} ] || [ -L ${path} ]; then rm -f ${path}; else exit 3; fi\n`,
      options.abortSignal,
    );
    if (result.exitCode === 3) return false;
    if (result.exitCode === 4) throw new AirlockError(`${options.path} is a directory`);
    if (result.exitCode !== 0) throw new AirlockError(`delete ${options.path}: ${result.stderr.trim()}`);
    return true;
  };
}

/**
 * The `Sandbox` shape of bash-tool's `createBashTool` (npm `bash-tool`): give it as
 * `sandbox` with `destination: "/work"`.
 */
export interface BashToolSandbox {
  executeCommand(command: string): Promise<CommandResult>;
  readFile(path: string): Promise<string>;
  writeFiles(files: Array<{ path: string; content: string | Uint8Array }>): Promise<void>;
}

/** Opens an `AirlockSandbox` (an airlock `workspace` session) for `generateText({ experimental_sandbox })`. */
export function createSandbox(options: SandboxOptions = {}): Promise<AirlockSandbox> {
  return AirlockSandbox.create(options);
}
