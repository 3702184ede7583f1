"""Anthropic's own client tools: bash, the text editor and memory. Claude knows their input schemas without being
told and the client runs them, so a request names only `type` and `name`. A local model must be told: each becomes
a tool with the schema Anthropic documents (its tool-use guides), under the name the client gave it, and the
model's calls go back as the `tool_use` blocks the client runs. Computer use needs screenshots and a model trained
for it: it is left out, with the server tools."""
from __future__ import annotations

from typing import Any

from adapters.fields import get
from adapters.protocol import Tool

_STRING = {"type": "string"}
_LINE = {"type": "integer"}
_RANGE = {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2,
          "description": "[first line, last line] to view, from 1; -1 as the last means to the end"}
_UNDO_UNTIL = "20250429"  # the text editor's undo_edit went with that version (Claude 4's tools)


def client_tool(raw: dict[str, Any]) -> Tool | None:
    """The tool for one of Anthropic's client tool types (`bash_20250124`, `text_editor_20250728`, ...); None for
    any other type."""
    kind, _, version = str(raw.get("type")).rpartition("_")
    if kind not in ("bash", "text_editor", "memory"):
        return None
    name = get(raw, "name", str, required=True)
    if kind == "bash":
        return Tool(name, "Run a command in a bash shell that keeps its state between calls; `restart: true` "
                    "starts a fresh shell.", _object({"command": _STRING, "restart": {"type": "boolean"}}))
    if kind == "memory":
        return Tool(name, "Your memory directory, /memories, kept between conversations: view a file or directory, "
                    "create a file with file_text, str_replace old_str (found once) with new_str, insert "
                    "insert_text after line insert_line, delete a path, rename old_path to new_path.",
                    _object({"command": _commands("view", "create", "str_replace", "insert", "delete", "rename"),
                             "path": _STRING, "view_range": _RANGE, "file_text": _STRING, "old_str": _STRING,
                             "new_str": _STRING, "insert_line": _LINE, "insert_text": _STRING, "old_path": _STRING,
                             "new_path": _STRING}, "command"))
    undo = ("undo_edit",) if version < _UNDO_UNTIL else ()
    return Tool(name, "View, create and edit text files: view shows a file with line numbers (or lists a directory), "
                "create writes file_text to a new file, str_replace replaces old_str (which must occur exactly once) "
                "with new_str, insert puts new_str after line insert_line (0: at the top)"
                + ("; undo_edit reverts the last edit of path." if undo else "."),
                _object({"command": _commands("view", "create", "str_replace", "insert", *undo), "path": _STRING,
                         "view_range": _RANGE, "file_text": _STRING, "old_str": _STRING, "new_str": _STRING,
                         "insert_line": _LINE}, "command", "path"))


def _commands(*names: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(names)}


def _object(properties: dict[str, Any], *required: str) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}
