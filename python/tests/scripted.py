"""Scripted models, one per framework, for running each framework's own agent loop with
no model service: the model asks for one `run_code` call (`Script.arguments`), keeps what
the framework hands it back (`Script.handed`, the framework's own objects), then answers
(`Script.answer`). Used by test_tools.py, test_frameworks.py and test_readme.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from airlock.tools import ARGUMENT_NAMES


@dataclass
class Script:
    """One scripted conversation: a `run_code` call, then an answer."""

    arguments: dict[str, Any]
    echo_stdout: bool = False
    """Answer with the job's stdout (as a model reading the result would) instead of "done"."""
    handed: list[Any] = field(default_factory=list)
    """What the framework handed the model after the call, in the framework's own types."""
    tools: list[Any] = field(default_factory=list)
    """The tool definitions the framework gave the model, where the test reads them."""

    def strict_arguments(self) -> dict[str, Any]:
        """The arguments as a strict-mode model sends them: every property, null if unused."""
        return {name: self.arguments.get(name) for name in sorted(ARGUMENT_NAMES)}

    def answer(self, tool_result: str) -> str:
        """The final answer, given the tool result text the model was handed."""
        if not self.echo_stdout:
            return "done"
        return str(observation_in(tool_result)["stdout"]).strip()


def observation_in(text: str) -> dict[str, Any]:
    """The last observation JSON object in `text` (a transcript or a tool result)."""
    start = text.rfind('{"job_id"')
    assert start >= 0, text[-2000:]
    found, _ = json.JSONDecoder().raw_decode(text[start:])
    assert isinstance(found, dict)
    return found


def langchain_model(script: Script) -> Any:
    """A LangChain chat model (with `bind_tools`) for LangGraph's agent."""
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class ScriptedChatModel(BaseChatModel):
        def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
            results = [m for m in messages if isinstance(m, ToolMessage)]
            if not results:
                call = {"name": "run_code", "args": script.arguments, "id": "call-1"}
                message = AIMessage(content="", tool_calls=[call])
            else:
                script.handed.extend(results)
                message = AIMessage(content=script.answer(str(results[-1].content)))
            return ChatResult(generations=[ChatGeneration(message=message)])

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    return ScriptedChatModel()


def crewai_llm(script: Script) -> Any:
    """A ReAct-text CrewAI LLM; `handed` holds the transcript of its second call."""
    from crewai.llms.base_llm import BaseLLM

    calls: list[str] = []

    class ScriptedLLM(BaseLLM):
        def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
            if isinstance(messages, str):
                text = messages
            else:
                text = "\n".join(str(m.get("content", "")) for m in messages)
            calls.append(text)
            if len(calls) == 1:
                return (
                    "Thought: I will run the program.\nAction: run_code\n"
                    f"Action Input: {json.dumps(script.arguments)}"
                )
            script.handed.append(text)
            return f"Thought: I have the result.\nFinal Answer: {script.answer(text)}"

    return ScriptedLLM(model="scripted")


def openai_agents_model(script: Script) -> Any:
    """An Agents SDK `Model`; `handed` holds the `function_call_output` input items."""
    from agents import ModelResponse, Usage
    from agents.models.interface import Model
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    class ScriptedModel(Model):
        async def get_response(
            self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
        ) -> Any:
            script.tools[:] = args[2] if len(args) > 2 else kwargs.get("tools", [])
            outputs = [
                item
                for item in input
                if isinstance(item, dict) and item.get("type") == "function_call_output"
            ]
            output: Any
            if not outputs:
                output = ResponseFunctionToolCall(
                    type="function_call",
                    id="fc-1",
                    call_id="call-1",
                    name="run_code",
                    arguments=json.dumps(script.arguments),
                    status="completed",
                )
            else:
                script.handed.extend(outputs)
                text = script.answer(str(outputs[-1]["output"]))
                output = ResponseOutputMessage(
                    id="msg-1",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
                )
            return ModelResponse(output=[output], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    return ScriptedModel()


def pydantic_ai_model(script: Script) -> Any:
    """A Pydantic AI `FunctionModel`; `handed` holds the `ToolReturnPart`s, `tools` the
    parameter schemas it was given."""
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        script.tools[:] = [t.parameters_json_schema for t in info.function_tools]
        results = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
        if not results:
            call = ToolCallPart("run_code", json.dumps(script.arguments), "call-1")
            return ModelResponse(parts=[call])
        script.handed.extend(results)
        return ModelResponse(parts=[TextPart(script.answer(str(results[-1].content)))])

    return FunctionModel(respond)


def llamaindex_function_llm(script: Script) -> Any:
    """A function-calling LlamaIndex LLM (for `FunctionAgent`); `handed` holds the tool
    `ChatMessage`s."""
    from llama_index.core.base.llms.types import ToolCallBlock
    from llama_index.core.llms import ChatMessage, MessageRole
    from llama_index.core.llms.mock import MockFunctionCallingLLM

    def respond(messages: list[ChatMessage], **kwargs: Any) -> ChatMessage:
        results = [m for m in messages if m.role == MessageRole.TOOL]
        if not results:
            block = ToolCallBlock(
                tool_call_id="call-1", tool_name="run_code", tool_kwargs=script.arguments
            )
            return ChatMessage(role=MessageRole.ASSISTANT, blocks=[block])
        script.handed.extend(results)
        answer = script.answer(str(results[-1].content))
        return ChatMessage(role=MessageRole.ASSISTANT, content=answer)

    return MockFunctionCallingLLM(response_generator=respond, is_chat_model=True)


def llamaindex_react_llm(script: Script) -> Any:
    """A text-completion LlamaIndex LLM in the ReAct format (for `ReActAgent`); `handed`
    holds the prompt of its second call."""
    from llama_index.core.base.llms.types import (
        CompletionResponse,
        CompletionResponseGen,
        LLMMetadata,
    )
    from llama_index.core.llms.custom import CustomLLM

    prompts: list[str] = []

    class ScriptedReActLLM(CustomLLM):
        @property
        def metadata(self) -> LLMMetadata:
            return LLMMetadata()

        def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> Any:
            prompts.append(prompt)
            if len(prompts) == 1:
                return CompletionResponse(
                    text="Thought: I need to run code.\nAction: run_code\n"
                    f"Action Input: {json.dumps(script.arguments)}"
                )
            script.handed.append(prompt)
            # The observation is the prompt's last "Observation:" line.
            answer = script.answer(prompt.rpartition("Observation: ")[2])
            return CompletionResponse(
                text=f"Thought: I can answer without using any more tools.\nAnswer: {answer}"
            )

        def stream_complete(
            self, prompt: str, formatted: bool = False, **kwargs: Any
        ) -> CompletionResponseGen:
            text = self.complete(prompt).text
            yield CompletionResponse(text=text, delta=text)

    return ScriptedReActLLM()


def agent_framework_client(script: Script) -> Any:
    """An Agent Framework chat client with function invocation; it sends the strict
    arguments; `handed` holds the `function_result` contents."""
    from agent_framework import (
        BaseChatClient,
        ChatResponse,
        Content,
        FunctionInvocationLayer,
        Message,
    )

    class ScriptedChatClient(FunctionInvocationLayer[Any], BaseChatClient[Any]):
        def _inner_get_response(
            self, *, messages: Any, stream: bool, options: Any, **kwargs: Any
        ) -> Any:
            async def respond() -> ChatResponse:
                results = [c for m in messages for c in m.contents if c.type == "function_result"]
                if not results:
                    call = Content.from_function_call(
                        call_id="call-1",
                        name="run_code",
                        arguments=json.dumps(script.strict_arguments()),
                    )
                    return ChatResponse(messages=[Message(role="assistant", contents=[call])])
                script.handed.extend(results)
                answer = script.answer(str(results[-1].result))
                return ChatResponse(messages=[Message(role="assistant", contents=[answer])])

            return respond()

    return ScriptedChatClient()
