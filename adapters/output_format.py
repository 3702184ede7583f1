"""A structured-output schema checked before any backend gets it, as Velo's engine compiles it (engine/grammar.py,
llguidance): a schema no output can match (`minLength` 5 with `maxLength` 2) is the client's 400 on every backend.
llama-server took one and grew by 0.5 GB a second building its grammar while the client waited for a 504, which the
SDKs retry. A tool's parameters are checked alike: llama-server builds the grammar of a call from them (a forced call,
or its lazy grammar for tool calls), and one no call can match killed it. What llguidance only cannot compile (a
look-around `pattern`, a remote `$ref`) is left to the backend, which may."""
from __future__ import annotations

from engine.grammar import grammar_for

from .errors import BadRequest, UnusableFormat
from .exact_json import dumps
from .per_schema import PerSchema
from .protocol import OutputFormat, Tool

_UNSATISFIABLE = "Unsatisfiable schema"  # llguidance's words for a schema no value matches


async def check_format(fmt: OutputFormat) -> None:
    """UnusableFormat when `fmt` is a JSON Schema no output can match; a large one is compiled off the
    event loop (PerSchema.off_loop)."""
    if isinstance(fmt, dict) and (why := await _unsatisfiable.off_loop(fmt)):
        raise UnusableFormat(why)


async def check_tools(tools: list[Tool]) -> None:
    """BadRequest (param `tools`) naming the first tool whose parameters are a JSON Schema no call can match. A
    call's arguments are a JSON object, so parameters of another `type` match none, as Anthropic and OpenAI answer
    them (a 400): the engine's forced call was written as that type and the client got a 502."""
    for tool in tools:
        if why := _not_an_object(tool.parameters) or await _unsatisfiable.off_loop(tool.parameters):
            raise BadRequest(f"tool {tool.name!r}: {why}", param="tools")


def _not_an_object(schema: dict) -> str | None:
    """Why no call's arguments can match: a `type` that leaves out "object" (none says nothing of the type)."""
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if kind is None or "object" in kinds:
        return None
    return f'its parameters must be a JSON Schema of type "object", got type {dumps(kind).decode()}'


def _verdict(schema: dict) -> str | None:
    """Why no output can match the schema, or None. Kept per schema: clients send the same one with each request,
    and compiling it costs ~230 us, 27x the parse of the request itself (bench/schema_check.py)."""
    try:
        grammar_for(schema)
    except ValueError as e:
        return str(e) if _UNSATISFIABLE in str(e) else None
    return None


_unsatisfiable = PerSchema(_verdict)
