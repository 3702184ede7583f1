"""Structured output (Ollama `format`, OpenAI `response_format`): the content is JSON matching the schema, or
a clear error. The same repair and coercion as tool arguments, applied to the whole answer."""
from __future__ import annotations

from typing import Any

import orjson

from adapters.errors import BackendError
from adapters.exact_json import dumps, loads
from adapters.fields import nests_deeper
from proxy.tools.calls import RepairReport
from proxy.tools.coerce import coerce, usable, validation_errors
from proxy.tools.repair import MAX_REPAIR_CHARS, Unrepairable, parse_json


class StructuredOutputInvalid(BackendError):
    """The model's answer cannot be made into JSON matching the requested format (status 502)."""

    kind = "invalid_structured_output"
    quotes_answer = True  # its arguments' values, or the answer's start


def repair_structured(text: str, fmt: str | dict, report: RepairReport) -> str:
    """Valid JSON for `fmt` ("json" or a JSON Schema), untouched when it already is; changes go to `report`. An
    answer too large or too deeply nested to repair or check is passed through as it is ("skipped=size")."""
    changes = len(report.repaired) + len(report.coerced)
    try:
        value = loads(text)
    except orjson.JSONDecodeError:
        if len(text) > MAX_REPAIR_CHARS:
            report.skipped.append("size")
            return text
        value = _repaired(text, report)
    if nests_deeper(value):
        report.skipped.append("size")
        return text
    schema = schema_of(fmt)
    if schema and not usable(schema):
        report.skipped.append("schema")
    elif schema:
        value = _conform(value, schema, report)
    if len(report.repaired) + len(report.coerced) == changes:
        return text
    return dumps(value).decode()


def schema_of(fmt: str | dict | None) -> dict:
    """The JSON Schema in a format; OpenAI's json_schema wrapper ({name, schema, strict}) is unwrapped."""
    if not isinstance(fmt, dict):
        return {}
    inner = fmt.get("schema")
    return inner if isinstance(inner, dict) and "type" not in fmt else fmt


def _repaired(text: str, report: RepairReport) -> Any:
    try:
        parsed = parse_json(text)
    except Unrepairable as e:
        report.invalid.append(f"not JSON: {e}")
        raise StructuredOutputInvalid(f"the model's answer is not JSON ({e}): {_preview(text)}") from e
    report.repaired += parsed.fixes
    return parsed.value


def _conform(value: Any, schema: dict, report: RepairReport) -> Any:
    value = coerce(value, schema, schema, "", report.coerced)
    errors = validation_errors(value, schema)
    if errors:
        report.invalid += errors
        raise StructuredOutputInvalid("the model's answer does not match the requested schema: " + "; ".join(errors))
    return value


def _preview(text: str) -> str:
    return repr(text[:80] + ("..." if len(text) > 80 else ""))
