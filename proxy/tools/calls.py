"""One assistant turn in, valid tool calls out: extract from text, repair, coerce, validate, dedupe.

Nothing is invented: a call to a tool that was not offered, or arguments the schema rejects after safe coercion,
is reported in `RepairReport.invalid` and never returned as a call; its text stays in the content.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import orjson

from adapters.errors import BackendError
from adapters.exact_json import dumps
from adapters.protocol import Chunk, Tool, ToolCall
from proxy.tools.coerce import check_arguments, usable
from proxy.tools.extract import RawCall, Region, raw_calls
from proxy.tools.repair import decode_arguments

_PREFIXES = ("functions.", "function.", "tools.", "tool.")
_MARKERS = {"tag": "<tool_call>", "python_tag": "<|python_tag|>", "mistral": "[TOOL_CALLS]", "function": "<function=>"}


class ToolCallInvalid(BackendError):
    """The model answered only with tool calls that cannot be made valid (status 502)."""

    kind = "tool_call_invalid"
    quotes_answer = True  # its arguments' values, or the answer's start


@dataclass
class RepairReport:
    """What repair did to one answer: counts for metrics, strings for a response header or a log line."""

    extracted: int = 0
    repaired: list[str] = field(default_factory=list)
    coerced: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    unoffered: int = 0  # of `invalid`: calls in the text to a tool that was not offered (the model's JSON answer)
    deduped: int = 0
    skipped: list[str] = field(default_factory=list)  # why something passed unrepaired: "size", "budget", "schema"

    @property
    def changed(self) -> bool:
        return bool(self.extracted or self.repaired or self.coerced or self.invalid or self.deduped or self.skipped)

    def summary(self) -> str:
        """One line for the `X-Velo-Repair` header or a log: what changed, never argument values."""
        parts = [f"extracted={self.extracted}"] if self.extracted else []
        if self.repaired:
            parts.append("repaired=" + ",".join(sorted({r.split(": ", 1)[-1] for r in self.repaired})))
        parts += [f"{k}={len(v)}" for k, v in (("coerced", self.coerced), ("invalid", self.invalid)) if v]
        parts += [f"deduped={self.deduped}"] if self.deduped else []
        parts += ["skipped=" + ",".join(dict.fromkeys(self.skipped))] if self.skipped else []
        return "; ".join(parts)

    def failed(self, must_call: bool) -> bool:
        """Whether the answer holds a failed call: text naming no offered tool is the model's JSON answer, a failure
        only where the request demands a call (proxy/tools/stream.py)."""
        return len(self.invalid) > self.unoffered or (must_call and bool(self.invalid))

    def error(self) -> ToolCallInvalid:
        return ToolCallInvalid("the model's tool call is invalid: " + " | ".join(self.invalid))


CallKey = tuple[str, bytes]  # name and sorted-key arguments: the same call whatever its key order


@dataclass
class _Accepted:
    call: ToolCall
    fixes: list[str]
    changes: list[str]

    @property
    def key(self) -> CallKey:
        return self.call.name, dumps(self.call.arguments, option=orjson.OPT_SORT_KEYS)


@dataclass
class CallRepairer:
    """Per-turn state: the offered tools and the blocks already accepted (for dedupe across a stream).

    Dedupe drops only what the model wrote again: a call already sent in another wire form (the backend's
    structured calls, or a block of another kind: a fence after a tag), or a block of several calls repeated
    whole. Identical calls listed as items of one answer (one array, one block, or consecutive blocks of one
    kind, as Hermes lists parallel calls) are all kept: "two samples of each" is four calls."""

    tools: list[Tool]
    report: RepairReport = field(default_factory=RepairReport)
    seen: dict[CallKey, str] = field(default_factory=dict)  # call -> the kind of block it came in first
    blocks: set[tuple[CallKey, ...]] = field(default_factory=set)  # blocks of two or more calls
    forced: bool = False  # a call decoded under the call grammar because the request demands one

    def __post_init__(self) -> None:
        self.by_name = {t.name: t for t in self.tools}
        # what a call with flattened arguments may begin with (extract.could_be_call)
        self.arg_names = frozenset(k for t in self.tools if isinstance(props := t.parameters.get("properties"), dict)
                                   for k in props)

    def structured(self, calls: list[ToolCall]) -> list[ToolCall]:
        """Validate calls the backend already returned as structured `tool_calls`."""
        accepted = [a for a in (self._accept(RawCall(tc.name, tc.arguments, text=tc.text), tc.id) for tc in calls)
                    if a]
        return self._keep(accepted, "structured")

    def region(self, region: Region, cut: bool = False) -> list[ToolCall] | None:
        """Calls in a complete text region, or None when the region is not (or not only) valid calls. In a turn
        `cut` by its token limit (or a stop string of the client's), a call that needed any repair is the cut's, not
        the model's: its arguments end mid-value (a `bio` ending "a software engineer with"), and a tool run on them
        is run on a guess. A string cut before a closing brace reads as a quote missing mid-text, not as a cut:
        OpenAI-wire arguments `{"cmd": "cat no` (made whole text by the adapter) were closed to `cat no`, and Codex
        ran it."""
        attempts = [r for r in raw_calls(region) if self._is_attempt(r, region)]
        if not attempts:
            if region.kind in _MARKERS:  # a call marker is an attempt even when nothing after it parses
                self.report.invalid.append(f"no parsable call after {_MARKERS[region.kind]}")
            return None
        accepted = [a for a in (self._accept(r, "") for r in attempts) if a is not None]
        if cut and any(a.fixes for a in accepted):
            self.report.invalid.append("a call cut off by the token limit or a stop string")
            return None
        self.report.unoffered += sum(self.resolve(r.name) is None for r in attempts)
        valid = self._keep(accepted, region.kind)
        self.report.extracted += len(valid)
        return valid if accepted else None

    def _keep(self, accepted: list[_Accepted], kind: str) -> list[ToolCall]:
        """The calls of one block that are not a re-emission, with their fixes reported."""
        keys = tuple(a.key for a in accepted)
        if len(keys) > 1 and keys in self.blocks:
            self.report.deduped += len(keys)
            return []
        kept = []
        for a in accepted:
            first = self.seen.setdefault(a.key, kind)
            if first != kind:
                self.report.deduped += 1
                continue
            kept.append(a.call)
            self.report.repaired += [f"{a.call.name}: {f}" for f in dict.fromkeys(a.fixes)]
            self.report.coerced += [f"{a.call.name}.{c}" for c in a.changes]
        if len(keys) > 1:
            self.blocks.add(keys)
        return kept

    def _is_attempt(self, raw: RawCall, region: Region) -> bool:
        """Bare JSON in prose is only a call when it names an offered tool or has an arguments key, and never
        when its "arguments" are a JSON Schema: small models echo a tool's definition back (seen from
        Qwen2.5-Coder-0.5B: the read_file signature in a json fence instead of a call). A `forced` call is one
        whatever its arguments: the grammar held them to the tool's schema, and the request wants a call
        (smolagents and instructor got none for a tool whose schema allows any object)."""
        if region.kind not in ("json", "fence"):
            return True
        if _is_schema(raw.arguments) and not self.forced:
            return False
        return self.resolve(raw.name) is not None or "flattened_arguments" not in raw.fixes

    def resolve(self, name: str) -> str | None:
        if name in self.by_name:
            return name
        bare = name.strip()
        for p in _PREFIXES:
            bare = bare[len(p):] if bare.startswith(p) else bare
        folded = [n for n in self.by_name if n.lower() == bare.lower()]
        return folded[0] if len(folded) == 1 else None

    def _accept(self, raw: RawCall, call_id: str) -> _Accepted | None:
        name = self.resolve(raw.name)
        if name is None:
            offered = ", ".join(self.by_name) or "none"
            self.report.invalid.append(f"{raw.name}: not an offered tool (offered: {offered})")
            return None
        fixes = list(raw.fixes) + ([f"name {raw.name!r}"] if name != raw.name else [])
        args = decode_arguments(raw.arguments, fixes)
        if args is None:
            args, fixes = {}, fixes + ["null_arguments"]
        changes: list[str] = []
        schema = self.by_name[name].parameters
        if not usable(schema):
            self.report.skipped.append("schema")
            schema = {}
        args, errors = check_arguments(args, schema, changes)
        if not isinstance(args, dict):
            errors = errors or ["arguments are not a JSON object"]
        if errors:
            self.report.invalid.append(f"{name}: " + "; ".join(errors))
            return None
        # repair and coercion make new objects, never change one in place: the same object is still the text's value
        text = raw.text if args is raw.arguments and not changes else ""
        return _Accepted(ToolCall(name, args, call_id or new_call_id(), text), fixes, changes)


def _is_schema(value: object) -> bool:
    return isinstance(value, dict) and value.get("type") == "object" and isinstance(value.get("properties"), dict)


def new_call_id() -> str:
    return "call_" + os.urandom(12).hex()


def with_new_ids(chunk: Chunk) -> Chunk:
    """The chunk's tool calls with ids of their own, for an answer given again (a cache hit, a coalesced request's
    share of another's call): an agent pairs results with calls by id, and two clients held the same ids. A copy
    where it has calls: the chunk given again is shared."""
    if not chunk.tool_calls:
        return chunk
    return replace(chunk, tool_calls=[replace(call, id=new_call_id()) for call in chunk.tool_calls])
