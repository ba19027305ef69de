"""`airlock.langchain.RunCodeTool`: the same tool as `airlock.tools.langchain`."""

from .tools.langchain import RunCodeTool, SessionRunCodeTool

__all__ = ["RunCodeTool", "SessionRunCodeTool"]
