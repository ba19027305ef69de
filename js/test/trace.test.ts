// The caller's OpenTelemetry context goes with each request (docs/telemetry.md): the real
// `@opentelemetry/api` with the real Node SDK (`@opentelemetry/sdk-trace-node`, spans of
// `@opentelemetry/sdk-trace-base`), jobs run on a real `airlock serve`, and the headers
// each request carried are read as sent, through the client's `fetch` option. That the
// job's exported span then continues the trace is checked end to end by
// scripts/ci/otel.sh, whose receiver decodes what airlock exports.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { context, propagation, trace } from "@opentelemetry/api";
import { InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { NodeTracerProvider } from "@opentelemetry/sdk-trace-node";
import { AirlockClient } from "../src/index.js";
import { missing, type Server, skipUnlessReady, startServer } from "./helpers.js";

const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-01$/;

describe("the caller's trace context on each request", () => {
  let server: Server | undefined;
  let client: AirlockClient;
  const sent: Headers[] = [];
  const exporter = new InMemorySpanExporter();
  const provider = new NodeTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });

  before(async () => {
    if (missing() === undefined) {
      server = await startServer();
      const recording: typeof fetch = (input, init) => {
        sent.push(new Headers(init?.headers));
        return fetch(input, init);
      };
      client = new AirlockClient({ url: server.url, token: server.token, fetch: recording });
    }
  });
  after(async () => {
    await server?.stop();
    await provider.shutdown();
    trace.disable();
    context.disable();
    propagation.disable();
  });

  /** Runs a job and returns the headers its request carried. */
  async function runJob(): Promise<Headers> {
    sent.length = 0;
    const observation = await client.run({ code: "print(6 * 7)" });
    assert.equal(observation.stdout, "42\n");
    assert.equal(sent.length, 1);
    const headers = sent[0];
    assert.ok(headers !== undefined);
    return headers;
  }

  test("without a tracer provider nothing is added and the job runs", async (t) => {
    if (skipUnlessReady(t)) return;
    const headers = await runJob();
    assert.equal(headers.get("traceparent"), null);
    assert.equal(headers.get("baggage"), null);
  });

  test("a span active in the caller: its traceparent and baggage go with the request", async (t) => {
    if (skipUnlessReady(t)) return;
    // What an instrumented agent does once at start: the SDK, with W3C propagation.
    provider.register();
    const tracer = trace.getTracer("agent");
    const baggage = propagation.createBaggage({ "agent.turn": { value: "7 of 9" } });
    const { headers, traceId, spanId } = await context.with(propagation.setBaggage(context.active(), baggage), () =>
      tracer.startActiveSpan("tool call run_code", async (span) => {
        try {
          return { headers: await runJob(), ...span.spanContext() };
        } finally {
          span.end();
        }
      }),
    );
    const match = TRACEPARENT.exec(headers.get("traceparent") ?? "");
    assert.ok(match, `traceparent ${headers.get("traceparent")}`);
    assert.equal(match[1], traceId);
    assert.equal(match[2], spanId);
    assert.equal(headers.get("baggage"), "agent.turn=7%20of%209");
    // The caller's span is the SDK's own, exported as ever.
    assert.deepEqual(
      exporter.getFinishedSpans().map((s) => [s.name, s.spanContext().traceId]),
      [["tool call run_code", traceId]],
    );
    // Outside the span, nothing again.
    assert.equal((await runJob()).get("traceparent"), null);
  });

  test("an active span with no propagator registered still goes as W3C Trace Context", async (t) => {
    if (skipUnlessReady(t)) return;
    // The API's default propagator writes nothing; the client writes the W3C headers.
    propagation.disable();
    const tracer = trace.getTracer("agent");
    const { headers, traceId, spanId } = await tracer.startActiveSpan("tool call", async (span) => {
      try {
        return { headers: await runJob(), ...span.spanContext() };
      } finally {
        span.end();
      }
    });
    assert.equal(headers.get("traceparent"), `00-${traceId}-${spanId}-01`);
  });
});
