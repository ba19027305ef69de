// The caller's OpenTelemetry context on each request (docs/telemetry.md): when the
// application has `@opentelemetry/api` (an optional peer dependency, loaded on first use,
// never required), the current W3C context (`traceparent`, `tracestate`, `baggage`) goes
// with the request, so the job's span joins the agent's trace with no code.

/** The parts of `@opentelemetry/api` used here (typed locally: the package is optional). */
interface SpanContext {
  traceId: string;
  spanId: string;
  traceFlags: number;
  traceState?: { serialize(): string };
}

interface OtelApi {
  context: { active(): unknown };
  propagation: {
    inject(context: unknown, carrier: Record<string, string>): void;
    getBaggage(context: unknown): { getAllEntries(): [string, { value: string }][] } | undefined;
  };
  trace: {
    getSpanContext(context: unknown): SpanContext | undefined;
    isSpanContextValid(spanContext: SpanContext): boolean;
  };
}

/** The module's name in a variable, so that TypeScript and bundlers leave it unresolved. */
const OTEL_API = "@opentelemetry/api";

let loaded: Promise<OtelApi | undefined> | undefined;

function isOtelApi(value: unknown): value is OtelApi {
  const api = value as Partial<OtelApi> | undefined;
  return (
    typeof api?.context?.active === "function" &&
    typeof api.propagation?.inject === "function" &&
    typeof api.trace?.getSpanContext === "function"
  );
}

/** `@opentelemetry/api`, or undefined when the application does not have it. Loaded once. */
function otelApi(): Promise<OtelApi | undefined> {
  loaded ??= import(OTEL_API).then(
    (module: unknown) => {
      // Node's ESM view of the package's CommonJS build may keep it under `default`.
      if (isOtelApi(module)) return module;
      const fallback = (module as { default?: unknown }).default;
      return isOtelApi(fallback) ? fallback : undefined;
    },
    () => undefined,
  );
  return loaded;
}

/**
 * The caller's current trace context as W3C headers: what the application's registered
 * propagator writes, and where that writes no `traceparent` (no propagator registered:
 * the API's default does nothing) but a span is active, its W3C Trace Context and
 * Baggage written here. Empty without `@opentelemetry/api` or an active span.
 */
export async function traceHeaders(): Promise<Record<string, string>> {
  const api = await otelApi();
  if (api === undefined) return {};
  const active = api.context.active();
  const carrier: Record<string, string> = {};
  api.propagation.inject(active, carrier);
  if (carrier.traceparent !== undefined) return carrier;
  const span = api.trace.getSpanContext(active);
  if (span === undefined || !api.trace.isSpanContextValid(span)) return carrier;
  carrier.traceparent = `00-${span.traceId}-${span.spanId}-${(span.traceFlags & 0xff).toString(16).padStart(2, "0")}`;
  const state = span.traceState?.serialize();
  if (state) carrier.tracestate = state;
  const baggage = api.propagation.getBaggage(active)?.getAllEntries() ?? [];
  if (baggage.length > 0) {
    carrier.baggage = baggage.map(([key, entry]) => `${key}=${encodeURIComponent(entry.value)}`).join(",");
  }
  return carrier;
}
