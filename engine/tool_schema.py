"""The JSON Schema of one call of a request's tools, `{"name": ..., "arguments": {...}}`: what the engine's grammar
and a backend's forced call (adapters/tool_prompt.py) constrain output to. Torch-free, so the proxy may build it.

Each tool's `$defs` (or `definitions`) move to the root under a name of the tool's own, and its `$ref`s follow:
inside the wrapper, `#/$defs/Unit` pointed at a root that no longer held it, and every tool built from pydantic
with a nested model or an Enum (instructor's response models, pydantic-ai's tools) was a 400."""
from __future__ import annotations

from typing import Any

_DEFS = ("$defs", "definitions")


def tool_call_schema(tools: list[dict]) -> dict:
    """A call of one of `tools` ({"name", "parameters"} each)."""
    defs: dict[str, Any] = {}
    options = []
    for i, tool in enumerate(tools):
        arguments, own = _hoisted(tool.get("parameters") or {"type": "object"}, f"t{i}.")
        defs |= own
        options.append({"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                        "properties": {"name": {"const": tool["name"]}, "arguments": arguments}})
    return {"anyOf": options, **({"$defs": defs} if defs else {})}


def _hoisted(schema: dict, prefix: str) -> tuple[dict, dict[str, Any]]:
    """`schema` without its definitions, and those definitions named `prefix` + name, every local `$ref` to them
    rewritten to the new name."""
    local = {name: d for key in _DEFS if isinstance(schema.get(key), dict) for name, d in schema[key].items()}
    if not local:
        return schema, {}

    def moved(node: Any) -> Any:
        if isinstance(node, list):
            return [moved(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {k: moved(v) for k, v in node.items()}
        ref = out.get("$ref")
        for key in _DEFS:
            if isinstance(ref, str) and ref.startswith(f"#/{key}/"):
                out["$ref"] = f"#/$defs/{prefix}{ref[len(key) + 3:]}"
        return out

    body = moved({k: v for k, v in schema.items() if k not in _DEFS})
    return body, {prefix + name: moved(d) for name, d in local.items()}
