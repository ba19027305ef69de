import type { ErrorBody, ErrorKind } from "./generated/openapi.js";

/** Every error this package throws. `kind` is the server's error class when it sent one. */
export class AirlockError extends Error {
  override name = "AirlockError";
}

/**
 * The server refused the request or could not run it: a 4xx or 5xx answer with the
 * DESIGN's error body. A job that ran and failed (non-zero exit, timeout, oom) is not an
 * error: it is an observation with `ok: false`.
 */
export class ApiError extends AirlockError {
  override name = "ApiError";
  /** The HTTP status. */
  readonly status: number;
  /** The error's class, from the body (`internal` when the body had none). */
  readonly kind: ErrorKind;
  /** The whole error body: with `job_id` and the observation's fields when the engine saw the request. */
  readonly body: ErrorBody | undefined;

  constructor(status: number, kind: ErrorKind, message: string, body: ErrorBody | undefined) {
    super(`${kind} (HTTP ${status}): ${message}`);
    this.status = status;
    this.kind = kind;
    this.body = body;
  }
}

/** 400, 404, 405, 408, 413, 415: the request is malformed (or names no such thing). */
export class InvalidInput extends ApiError {
  override name = "InvalidInput";
}

/** 404 on a session's route: it ended (DELETE, ttl, idle) or belongs to another tenant. */
export class SessionNotFound extends InvalidInput {
  override name = "SessionNotFound";
}

/** 403: the request asks for more than the policy allows (a limit above its ceiling, sessions off...). */
export class PolicyDenied extends ApiError {
  override name = "PolicyDenied";
}

/** 401: no token, or one the server does not know. */
export class Unauthorized extends ApiError {
  override name = "Unauthorized";
}

/** 429 or 503: every slot busy and the queue full, or the backend cannot run jobs now. */
export class BackendUnavailable extends ApiError {
  override name = "BackendUnavailable";
}

/** 500: airlock itself failed. */
export class InternalError extends ApiError {
  override name = "InternalError";
}

/** The server could not be reached, or answered something that is not the API. */
export class TransportError extends AirlockError {
  override name = "TransportError";
}

/** Local mode: no `airlock` binary to start (AIRLOCK_BIN, or `airlock` on PATH). */
export class BinaryNotFound extends TransportError {
  override name = "BinaryNotFound";
}

const KINDS: ReadonlySet<string> = new Set<ErrorKind>([
  "invalid_input",
  "policy_denied",
  "unauthorized",
  "backend_unavailable",
  "internal",
]);

function isErrorBody(value: unknown): value is ErrorBody {
  if (typeof value !== "object" || value === null) return false;
  const error = (value as { error?: unknown }).error;
  if (typeof error !== "object" || error === null) return false;
  const { kind, message } = error as { kind?: unknown; message?: unknown };
  return typeof kind === "string" && KINDS.has(kind) && typeof message === "string";
}

/** The typed error for an error answer; `sessionRoute` makes a 404 a `SessionNotFound`. */
export function errorFromResponse(status: number, text: string, sessionRoute: boolean): ApiError {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  const body = isErrorBody(parsed) ? parsed : undefined;
  const kind: ErrorKind = body?.error.kind ?? (status >= 500 ? "internal" : "invalid_input");
  const message = body?.error.message ?? (text.slice(0, 500) || `HTTP ${status}`);
  if (status === 404 && sessionRoute) return new SessionNotFound(status, kind, message, body);
  switch (kind) {
    case "invalid_input":
      return new InvalidInput(status, kind, message, body);
    case "policy_denied":
      return new PolicyDenied(status, kind, message, body);
    case "unauthorized":
      return new Unauthorized(status, kind, message, body);
    case "backend_unavailable":
      return new BackendUnavailable(status, kind, message, body);
    case "internal":
      return new InternalError(status, kind, message, body);
  }
}
