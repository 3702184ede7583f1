"""How a chat's tools reach the model (X-Velo-Tools; proxy/stages/offer_tools.py says what each way means), decided
in one place for the request that goes out and for every count of its prompt: tools written into the prompt are
a large share of it (Claude Code sends some 25 tools on every turn), so a count without them misled the fit stage,
`count_tokens` and context editing's trigger."""
from __future__ import annotations

from dataclasses import replace

from adapters.protocol import ChatRequest, ModelInfo
from adapters.tool_prompt import call_schema

from .stream import demands_a_call, offered_tools


def as_offered(req: ChatRequest, info: ModelInfo | None, forces_tool_choice: bool) -> tuple[ChatRequest, str | None]:
    """The request as the adapter gets it, and how its tools go: "native", "prompt" or "grammar" (None: none)."""
    tools = offered_tools(req)
    if not tools:
        return req, None
    native = info is None or "tools" in info.capabilities  # a model nobody describes takes them as it can
    forced = demands_a_call(req)
    if forced and not forces_tool_choice:
        return replace(req, tools=tools, tools_in_prompt=True, format=call_schema(tools)), "grammar"
    how = "grammar" if forced else "native" if native else "prompt"
    return (req if native else replace(req, tools_in_prompt=True)), how
