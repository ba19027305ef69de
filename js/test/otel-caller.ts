// An OpenTelemetry-instrumented TypeScript caller for scripts/ci/otel.sh: the Node SDK
// registered as an agent registers it, one job run through the client inside an active
// span. Prints {"traceId", "spanId", "jobId"} as one JSON line; the receiver of otel.sh
// then finds the job's `execute_tool run_code` span under that span.
//
// Usage: node build/test/otel-caller.js AIRLOCK_URL
import { trace } from "@opentelemetry/api";
import { NodeTracerProvider } from "@opentelemetry/sdk-trace-node";
import { AirlockClient } from "../src/index.js";

const url = process.argv[2];
if (url === undefined) {
  console.error("usage: otel-caller.js AIRLOCK_URL");
  process.exit(2);
}
const provider = new NodeTracerProvider();
provider.register();
const client = new AirlockClient({ url });
const result = await trace.getTracer("otel-e2e-ts-agent").startActiveSpan("agent tool call", async (span) => {
  try {
    const observation = await client.run({ code: "print(3)", language: "python" });
    return { ...span.spanContext(), jobId: observation.job_id, stdout: observation.stdout };
  } finally {
    span.end();
  }
});
console.log(JSON.stringify(result));
await provider.shutdown();
