/**
 * airlock-sandbox: run model-written code in airlock's hardened, disposable sandboxes.
 * This entry point is the HTTP client (no dependencies); `airlock-sandbox/ai` has the
 * Vercel AI SDK tool and sandbox session.
 */
export {
  AirlockClient,
  type CallOptions,
  type ClientOptions,
  parseEventStream,
  Session,
  type StreamEvent,
  type ToolDefinition,
} from "./client.js";
export {
  AirlockError,
  ApiError,
  BackendUnavailable,
  BinaryNotFound,
  InternalError,
  InvalidInput,
  PolicyDenied,
  SessionNotFound,
  TransportError,
  Unauthorized,
} from "./errors.js";
export type * from "./generated/openapi.js";
export { API_VERSION, OPERATIONS } from "./generated/openapi.js";
export { findBinary, LocalServer, type LocalServerOptions } from "./local.js";
