"""Context editing as Anthropic's API defines it (`context_management.edits`, beta `context-management-2025-06-27`):
once a conversation grows past a trigger, the oldest tool results (and, if asked, the calls' inputs) are replaced by
a short note, keeping the most recent tool uses; older turns' thinking is dropped, keeping the last few. The client
keeps its whole history; the model reads the edited one. With a local model's context of 8-32k tokens, an agent's
tool results (whole files read, command output) are what fills it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable

from adapters.protocol import ChatRequest, Message, ToolCall

from .token_count import surely_under

CLEARED = "[tool result cleared to save context]"
TOOL_USES, THINKING = "clear_tool_uses_20250919", "clear_thinking_20251015"


@dataclass(frozen=True)
class ClearToolUses:
    """Anthropic's defaults: past 100,000 input tokens, keep the last 3 tool uses."""

    trigger_tokens: int | None = 100_000  # clear once the input is longer (a tool_uses trigger sets this None)
    trigger_uses: int | None = None  # or once there are more tool uses than this
    keep: int = 3
    clear_at_least: int = 0  # tokens: clear nothing unless at least this many go
    exclude: frozenset[str] = frozenset()  # tools whose uses stay
    clear_inputs: bool | frozenset[str] = False  # also empty the calls' inputs: all, or those of these tools


@dataclass(frozen=True)
class ClearThinking:
    keep: int | None = 1  # the most recent assistant turns whose thinking stays; None: all


Edit = ClearToolUses | ClearThinking


@dataclass
class Applied:
    """What one edit did, as Anthropic reports it (`context_management.applied_edits`)."""

    kind: str
    cleared: int  # tool uses, or thinking turns
    tokens: int  # input tokens it took away


@dataclass
class Edited:
    request: ChatRequest
    applied: list[Applied] = field(default_factory=list)


Count = Callable[[ChatRequest], Awaitable[int]]


async def apply(req: ChatRequest, edits: tuple[Edit, ...], count: Count, tokens: int | None = None) -> Edited:
    """The request as the model should read it, and what each edit did; edits run in the order given. Tokens are
    counted (`count`: the backend's tokenizer, an HTTP call for llama-server) only where an edit may apply, and not
    at all for `req` when the caller knows its `tokens` already."""
    out = Edited(req)

    async def counted() -> int:
        nonlocal tokens
        if tokens is None:
            tokens = await count(out.request)
        return tokens
    for edit in edits:
        if isinstance(edit, ClearToolUses):
            if not await _fires(out.request, edit, counted):
                continue
            changed, cleared = _clear_tool_uses(out.request, edit)
        else:
            changed, cleared = _clear_thinking(out.request, edit)
        if not cleared:
            continue
        before, after = await counted(), await count(changed)
        if isinstance(edit, ClearToolUses) and before - after < edit.clear_at_least:
            continue  # Anthropic: applied only if it frees at least that many
        out.request, tokens = changed, after
        out.applied.append(Applied(_kind(edit), cleared, before - after))
    return out


def _kind(edit: Edit) -> str:
    return THINKING if isinstance(edit, ClearThinking) else TOOL_USES


def _uses(req: ChatRequest) -> list[ToolCall]:
    return [c for m in req.messages if m.role == "assistant" for c in m.tool_calls]


async def _fires(req: ChatRequest, edit: ClearToolUses, counted: Callable[[], Awaitable[int]]) -> bool:
    """Past its trigger: more tool uses than it allows, or more input tokens (a prompt under half the trigger in
    characters surely is not, and is not counted)."""
    if edit.trigger_uses is not None:
        return len(_uses(req)) > edit.trigger_uses
    if edit.trigger_tokens is None or surely_under(req, edit.trigger_tokens + 1):
        return False
    return await counted() > edit.trigger_tokens


def _clear_tool_uses(req: ChatRequest, edit: ClearToolUses) -> tuple[ChatRequest, int]:
    """The oldest tool uses past the `keep` most recent (excluded tools neither count nor clear): their results
    become a note, and their inputs are emptied where asked."""
    eligible = [c for c in _uses(req) if c.name not in edit.exclude]
    doomed = {id(c) for c in eligible[:max(0, len(eligible) - edit.keep)]}
    if not doomed:
        return req, 0
    ids = {c.id for m in req.messages for c in m.tool_calls if id(c) in doomed and c.id}

    def clear_inputs(call: ToolCall) -> bool:
        wanted = edit.clear_inputs
        return id(call) in doomed and (wanted is True or (isinstance(wanted, frozenset) and call.name in wanted))

    messages = []
    for m in req.messages:
        if m.role == "tool" and m.tool_call_id in ids:
            m = replace(m, content=CLEARED, images=[])
        elif any(clear_inputs(c) for c in m.tool_calls):
            emptied = [replace(c, arguments={}, text="") if clear_inputs(c) else c for c in m.tool_calls]
            m = replace(m, tool_calls=emptied)
        messages.append(m)
    return replace(req, messages=messages), len(doomed)


def _clear_thinking(req: ChatRequest, edit: ClearThinking) -> tuple[ChatRequest, int]:
    thinking = [i for i, m in enumerate(req.messages) if m.role == "assistant" and m.thinking]
    if edit.keep is None or len(thinking) <= edit.keep:
        return req, 0
    cleared = set(thinking[:len(thinking) - edit.keep])
    messages: list[Message] = [replace(m, thinking="") if i in cleared else m for i, m in enumerate(req.messages)]
    return replace(req, messages=messages), len(cleared)
