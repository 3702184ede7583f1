"""Tools each of its own name, and a `tool_choice` the tools can satisfy. Forcing a call with no tools, or naming a
tool that was not given, is the 400 OpenAI and Anthropic answer: passed on, it forced the model into a call it has no
tool for (the engine's grammar then wrote a call to another tool). A choice that forces only tools Velo left out (a
hosted or server tool, named in X-Velo-Tools-Ignored) becomes "auto", as those tools did: the model answers without
them."""
from __future__ import annotations

from collections.abc import Collection
from typing import Any

from adapters.errors import BadRequest
from adapters.protocol import Tool


def checked(choice: Any, tools: list[Tool], ignored: Collection[str] = ()) -> Any:
    """`choice` in the internal form (None, "none", "required", {"type": "function", "function": {"name"}})."""
    if choice in (None, "none"):
        return choice
    name = choice["function"]["name"] if isinstance(choice, dict) else None
    if name in ignored or (not tools and ignored):
        return None
    if not tools:
        raise BadRequest("tool_choice: a tool call is required, but no tools are given", param="tool_choice")
    if name is not None and name not in {t.name for t in tools}:
        raise BadRequest(f"tool_choice: the tool {name!r} is not among the tools given", param="tool_choice")
    return choice


def allowed(tools: list[Tool], names: Collection[str], mode: Any) -> tuple[list[Tool], Any]:
    """An `allowed_tools` choice (OpenAI chat's and the Responses API's): only the tools it names are offered, and a
    call among them is required where `mode` is "required", left to the model where "auto"; any other mode (none
    given, a misspelt one) is OpenAI's 400, where the Responses API's was taken for auto."""
    if mode not in ("auto", "required"):
        raise BadRequest(f"tool_choice: an allowed_tools mode must be 'auto' or 'required', got {mode!r}",
                         param="tool_choice")
    return [t for t in tools if t.name in names], "required" if mode == "required" else None


def named_apart(tools: list[Tool]) -> None:
    """The 400 (Anthropic's, OpenAI's) for a tool without a name or with another's: a call names its tool, and the
    schema it is checked (and constrained) against is the one of that name."""
    seen: set[str] = set()
    for tool in tools:
        if not tool.name:
            raise BadRequest("tools: a tool's name must not be empty", param="tools")
        if tool.name in seen:
            raise BadRequest(f"tools: tool names must be unique, {tool.name!r} is given twice", param="tools")
        seen.add(tool.name)
