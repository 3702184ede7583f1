"""The JSON Schema of one call of a request's tools, `{"name": ..., "arguments": {...}}`: what the engine's grammar
and a backend's forced call (adapters/tool_prompt.py) constrain output to. Torch-free, so the proxy may build it.

Each tool's `$defs` (or `definitions`) move to the root under a name of the tool's own, and its `$ref`s follow:
inside the wrapper, `#/$defs/Unit` pointed at a root that no longer held it, and every tool built from pydantic
with a nested model or an Enum (instructor's response models, pydantic-ai's tools) was a 400. What moves loses its
`$id`: a subschema with an `$id` is the base its refs resolve against, so `#/$defs/t0.C` inside it named nothing."""
from __future__ import annotations

from typing import Any

_DEFS = ("$defs", "definitions")
_BASE = "$id"  # a subschema's own base URI: its `#/...` refs resolve against it, not against the wrapper's root


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
    rewritten to the new name. A schema whose refs point anywhere else in it (`#` itself: a recursive tree;
    `#/properties/a`) moves whole into the definitions, its refs after it: inside the wrapper `#` was the call, so
    a tree's children had to be calls, and `#/properties/a` named nothing (a 400)."""
    local = {name: d for key in _DEFS if isinstance(schema.get(key), dict) for name, d in schema[key].items()}
    whole = prefix.rstrip(".")
    elsewhere = any(ref == "#" or (ref.startswith("#/") and not ref.startswith(tuple(f"#/{k}/" for k in _DEFS)))
                    for ref in _refs(schema))
    if not local and not elsewhere:
        return schema, {}

    def moved(node: Any) -> Any:
        if isinstance(node, list):
            return [moved(v) for v in node]
        if not isinstance(node, dict):
            return node
        out = {k: moved(v) for k, v in node.items()}
        ref = out.get("$ref")
        if isinstance(ref, str) and (ref == "#" or ref.startswith("#/")):
            key = next((k for k in _DEFS if ref.startswith(f"#/{k}/")), None)
            out["$ref"] = f"#/$defs/{prefix}{ref[len(key) + 3:]}" if key else f"#/$defs/{whole}{ref[1:]}"
        return out

    body = moved({k: v for k, v in schema.items() if k not in _DEFS and k != _BASE})
    defs = {prefix + name: moved(_unbased(d)) for name, d in local.items()}
    if elsewhere:
        defs[whole], body = body, {"$ref": f"#/$defs/{whole}"}
    return body, defs


def _unbased(node: Any) -> Any:
    """A definition without its `$id` (a `true`/`false` one as it is)."""
    return {k: v for k, v in node.items() if k != _BASE} if isinstance(node, dict) else node


def _refs(node: Any) -> list[str]:
    """Every `$ref` string in `node`."""
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    if not isinstance(node, dict):
        return []
    own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
    return own + [r for v in node.values() for r in _refs(v)]
