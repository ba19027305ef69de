import { AirlockError, errorFromResponse, SessionNotFound, TransportError } from "./errors.js";
import {
  type Health,
  type Observation,
  OPERATIONS,
  type OutputChunk,
  type RunRequest,
  type SessionBody,
  type SessionFiles,
  type SessionRunRequest,
  type SessionRunResponse,
} from "./generated/openapi.js";
import { LocalServer, type LocalServerOptions } from "./local.js";
import { traceHeaders } from "./trace.js";

/** Where the client sends its requests. */
export interface ClientOptions {
  /**
   * The server's base URL. Default: AIRLOCK_URL; without it, local mode: the client
   * starts its own `airlock serve` on a free loopback port (see `local`).
   */
  url?: string;
  /** Bearer token (`airlock token new`). Default: AIRLOCK_TOKEN. */
  token?: string;
  /** Local mode's server: binary, policy, extra arguments. */
  local?: LocalServerOptions;
  /** The fetch to use (default: the platform's). */
  fetch?: typeof fetch;
}

/** Per-call options. */
export interface CallOptions {
  /** Aborting cancels the request; the server kills a job whose client went away. */
  signal?: AbortSignal;
}

/** One event of `stream()`: output as the job writes it, then the observation. */
export type StreamEvent =
  | { type: "stdout"; chunk: OutputChunk }
  | { type: "stderr"; chunk: OutputChunk }
  | { type: "observation"; observation: Observation };

/** The `run_code` tool definition in the Chat Completions shape (`GET /v1/tool-schema`). */
export interface ToolDefinition {
  type: "function";
  function: {
    name: string;
    description: string;
    parameters: Record<string, unknown>;
    strict: boolean;
  };
}

type Operation = keyof typeof OPERATIONS;

function pathOf(operation: Operation, params: Record<string, string> = {}): string {
  return OPERATIONS[operation].path.replace(/\{(\w+)\}/g, (_, name: string) => {
    const value = params[name];
    if (value === undefined) throw new AirlockError(`missing path parameter ${name}`);
    // A file path keeps its slashes; each segment is encoded.
    return name === "path" ? value.split("/").map(encodeURIComponent).join("/") : encodeURIComponent(value);
  });
}

/**
 * A client of `airlock serve`'s HTTP API (docs/serve.md, docs/sessions.md). Its request
 * and answer types are generated from the server's OpenAPI document.
 */
export class AirlockClient {
  readonly #explicitUrl: string | undefined;
  readonly #token: string | undefined;
  readonly #localOptions: LocalServerOptions;
  readonly #fetch: typeof fetch;
  #local: Promise<LocalServer> | undefined;

  constructor(options: ClientOptions = {}) {
    this.#explicitUrl = (options.url ?? (process.env.AIRLOCK_URL || undefined))?.replace(/\/+$/, "");
    this.#token = options.token ?? (process.env.AIRLOCK_TOKEN || undefined);
    this.#localOptions = options.local ?? {};
    this.#fetch = options.fetch ?? globalThis.fetch;
  }

  /** Whether this client starts its own server (no URL given, no AIRLOCK_URL). */
  get isLocal(): boolean {
    return this.#explicitUrl === undefined;
  }

  /** The server's base URL (in local mode, once its server has started). */
  async baseUrl(): Promise<string> {
    if (this.#explicitUrl !== undefined) return this.#explicitUrl;
    this.#local ??= LocalServer.start(this.#localOptions);
    try {
      return (await this.#local).url;
    } catch (error) {
      this.#local = undefined;
      throw error;
    }
  }

  /** Stops local mode's server, if this client started one. Idempotent. */
  async close(): Promise<void> {
    const local = this.#local;
    this.#local = undefined;
    if (local !== undefined) await (await local.catch(() => undefined))?.stop();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  async #request(
    operation: Operation,
    init: { params?: Record<string, string>; query?: string; body?: unknown; raw?: Uint8Array; accept?: string },
    options: CallOptions,
  ): Promise<Response> {
    const base = await this.baseUrl();
    // The caller's trace context first: nothing of it may replace the client's own headers.
    const headers: Record<string, string> = await traceHeaders();
    if (this.#token !== undefined) headers.Authorization = `Bearer ${this.#token}`;
    if (init.accept !== undefined) headers.Accept = init.accept;
    let body: BodyInit | undefined;
    if (init.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(init.body);
    } else if (init.raw !== undefined) {
      headers["Content-Type"] = "application/octet-stream";
      body = new Blob([new Uint8Array(init.raw)]);
    }
    const url = `${base}${pathOf(operation, init.params)}${init.query ?? ""}`;
    let response: Response;
    try {
      response = await this.#fetch(url, {
        method: OPERATIONS[operation].method,
        headers,
        body: body ?? null,
        signal: options.signal ?? null,
      });
    } catch (error) {
      if (options.signal?.aborted) throw options.signal.reason;
      throw new TransportError(`${OPERATIONS[operation].method} ${url}: ${(error as Error).message}`, { cause: error });
    }
    if (!response.ok) {
      throw errorFromResponse(response.status, await response.text(), init.params?.id !== undefined);
    }
    return response;
  }

  async #json<T>(response: Response): Promise<T> {
    const text = await response.text();
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new TransportError(`the server answered something other than JSON: ${text.slice(0, 200)}`);
    }
  }

  /**
   * Runs one job and returns its observation. A job that ran answers with an
   * observation whatever its end (`ok`, `outcome`, `exit_code` say how); a request the
   * server refused throws the matching `ApiError`.
   */
  async run(request: RunRequest, options: CallOptions = {}): Promise<Observation> {
    return this.#json<Observation>(await this.#request("run", { body: request }, options));
  }

  /**
   * Runs one job and yields its output as the job writes it (server-sent events), then
   * the observation. Breaking out of the loop, or aborting, cancels the job.
   */
  async *stream(request: RunRequest, options: CallOptions = {}): AsyncGenerator<StreamEvent, void, undefined> {
    const controller = new AbortController();
    const forward = (): void => controller.abort(options.signal?.reason);
    options.signal?.addEventListener("abort", forward, { once: true });
    try {
      const response = await this.#request(
        "run",
        { body: request, query: "?stream=true", accept: "text/event-stream" },
        { signal: controller.signal },
      );
      if (response.body === null) throw new TransportError("the stream had no body");
      let sawObservation = false;
      for await (const event of parseEventStream(response.body)) {
        let data: unknown;
        try {
          data = JSON.parse(event.data);
        } catch {
          throw new TransportError(`an event's data is not JSON: ${event.data.slice(0, 200)}`);
        }
        if (event.event === "stdout" || event.event === "stderr") {
          yield { type: event.event, chunk: data as OutputChunk };
        } else if (event.event === "observation") {
          sawObservation = true;
          yield { type: "observation", observation: data as Observation };
          return;
        }
      }
      if (!sawObservation) throw new TransportError("the stream ended without an observation");
    } finally {
      options.signal?.removeEventListener("abort", forward);
      // Leaving early (break, throw) drops the connection, and the server kills the job.
      controller.abort();
    }
  }

  /** `GET /v1/health`. */
  async health(options: CallOptions = {}): Promise<Health> {
    return this.#json<Health>(await this.#request("health", {}, options));
  }

  /** The `run_code` tool for the caller's policy (name, description with its limits, strict parameters). */
  async toolSchema(options: CallOptions = {}): Promise<ToolDefinition> {
    return this.#json<ToolDefinition>(await this.#request("toolSchema", { query: "?format=chat" }, options));
  }

  /** Opens a session (the policy must enable sessions: 403 otherwise). */
  async createSession(options: CallOptions = {}): Promise<Session> {
    const body = await this.#json<SessionBody>(await this.#request("createSession", { body: {} }, options));
    return new Session(this, body.id, this.#sessionTransport());
  }

  /** A handle on an existing session by id (no request is made). */
  session(id: string): Session {
    return new Session(this, id, this.#sessionTransport());
  }

  #sessionTransport(): SessionTransport {
    return {
      request: (operation, init, options) => this.#request(operation, init, options),
      json: (response) => this.#json(response),
    };
  }
}

interface SessionTransport {
  request(
    operation: Operation,
    init: { params?: Record<string, string>; body?: unknown; raw?: Uint8Array },
    options: CallOptions,
  ): Promise<Response>;
  json<T>(response: Response): Promise<T>;
}

/**
 * A session (docs/sessions.md): state across calls. In a `workspace` session every call
 * is a fresh sandbox whose `/work` is the session's; in a `kernel` session Python
 * variables persist too.
 */
export class Session {
  /** The client it belongs to. */
  readonly client: AirlockClient;
  /** Its id. */
  readonly id: string;
  readonly #transport: SessionTransport;

  /** @internal */
  constructor(client: AirlockClient, id: string, transport: SessionTransport) {
    this.client = client;
    this.id = id;
    this.#transport = transport;
  }

  /** Runs code in the session. */
  async run(request: SessionRunRequest, options: CallOptions = {}): Promise<SessionRunResponse> {
    const response = await this.#transport.request("runInSession", { params: { id: this.id }, body: request }, options);
    return this.#transport.json<SessionRunResponse>(response);
  }

  /** The session's state: mode, call count, expiry. */
  async info(options: CallOptions = {}): Promise<SessionBody> {
    return this.#transport.json<SessionBody>(
      await this.#transport.request("getSession", { params: { id: this.id } }, options),
    );
  }

  /** The regular files of its `/work`. */
  async listFiles(options: CallOptions = {}): Promise<SessionFiles> {
    const response = await this.#transport.request("listSessionFiles", { params: { id: this.id } }, options);
    return this.#transport.json<SessionFiles>(response);
  }

  /** A file of `/work` (path relative to it) as bytes; `null` when there is none. */
  async readFile(path: string, options: CallOptions = {}): Promise<Uint8Array | null> {
    try {
      const response = await this.#transport.request("readSessionFile", { params: { id: this.id, path } }, options);
      return new Uint8Array(await response.arrayBuffer());
    } catch (error) {
      // A 404 is the file's, or the session's when it is gone: info() tells them apart
      // (it throws SessionNotFound for a gone session).
      if (error instanceof SessionNotFound) {
        await this.info(options);
        return null;
      }
      throw error;
    }
  }

  /** Writes a file of `/work` (path relative to it), whole: it appears at once, never half written. */
  async writeFile(path: string, content: Uint8Array | string, options: CallOptions = {}): Promise<void> {
    const raw = typeof content === "string" ? new TextEncoder().encode(content) : content;
    await this.#transport.request("writeSessionFile", { params: { id: this.id, path }, raw }, options);
  }

  /** Ends the session: its sandbox is killed and its `/work` removed. */
  async close(options: CallOptions = {}): Promise<void> {
    await this.#transport.request("deleteSession", { params: { id: this.id } }, options);
  }
}

interface ServerSentEvent {
  event: string;
  data: string;
}

/** Splits a text/event-stream body into events (comments and ids ignored). */
export async function* parseEventStream(body: ReadableStream<Uint8Array>): AsyncGenerator<ServerSentEvent> {
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "message";
  let data: string[] = [];
  const reader = body.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
      let newline = buffer.search(/\r\n|\r|\n/);
      // A CR that ends the buffer may be the first half of a CRLF: wait for the next read.
      while (newline >= 0 && !(newline === buffer.length - 1 && buffer.endsWith("\r") && !done)) {
        const line = buffer.slice(0, newline);
        buffer = buffer.slice(newline + (buffer.startsWith("\r\n", newline) ? 2 : 1));
        if (line === "") {
          if (data.length > 0) yield { event, data: data.join("\n") };
          event = "message";
          data = [];
        } else if (!line.startsWith(":")) {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let value = colon < 0 ? "" : line.slice(colon + 1);
          if (value.startsWith(" ")) value = value.slice(1);
          if (field === "event") event = value;
          else if (field === "data") data.push(value);
        }
        newline = buffer.search(/\r\n|\r|\n/);
      }
      if (done) break;
    }
    if (data.length > 0) yield { event, data: data.join("\n") };
  } finally {
    reader.releaseLock();
  }
}
