// The AI SDK's mock language model from ai/test, scripted to call one tool once.
import assert from "node:assert/strict";
import { MockLanguageModelV4 } from "ai/test";

const USAGE = {
  inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 1, text: 1, reasoning: undefined },
};

/** A model that calls `toolName` with `input`, then says "done"; it records every prompt. */
export function scriptedModel(toolName: string, input: unknown): MockLanguageModelV4 {
  let calls = 0;
  return new MockLanguageModelV4({
    doGenerate: async () => {
      calls += 1;
      if (calls === 1) {
        return {
          content: [{ type: "tool-call", toolCallId: "call-1", toolName, input: JSON.stringify(input) }],
          finishReason: { unified: "tool-calls", raw: "tool_calls" },
          usage: USAGE,
          warnings: [],
        };
      }
      return {
        content: [{ type: "text", text: "done" }],
        finishReason: { unified: "stop", raw: "stop" },
        usage: USAGE,
        warnings: [],
      };
    },
  });
}

/** The tool result the model got in its second call: `{ type, value }`. */
export function resultSeenByModel(model: MockLanguageModelV4): { type: string; value: unknown } {
  const prompt = model.doGenerateCalls[1]?.prompt;
  assert.ok(prompt, "the model was not called a second time");
  for (const message of prompt) {
    if (message.role !== "tool") continue;
    for (const part of message.content) {
      if (part.type === "tool-result") return part.output as { type: string; value: unknown };
    }
  }
  assert.fail(`no tool result in the prompt: ${JSON.stringify(prompt)}`);
}
