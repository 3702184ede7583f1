"""Fits a job to its model before the cache sees it (so the cache keys what is really asked):

- an output limit where the client set none (`[server] default_max_tokens`): a looping small model otherwise runs
  to the end of its context;
- what the model cannot do (fill in the middle): Ollama's 400 `"x" does not support insert`;
- images and the thinking switch: a model that cannot see or think gets a 400 in the dialects whose servers
  refuse it (proxy/dialects RULES); in the others the switch is dropped and each image of a chat becomes a note;
- the prompt inside the context window (the model's, or a smaller `num_ctx`): Ollama's dialect drops a chat's
  oldest turns (keeping system prompts), then the start of its last turn, and trims a generate's start (an earlier
  exchange's `context` first, then the prompt's text; after its first `num_keep` tokens where the client set it;
  never a raw prompt whose "[img-N]" tags place images), as Ollama does; the others get the 400 their clients
  recognise (`context_length_exceeded`, "prompt is too long").
  A request's own `truncate` overrides its dialect's way: Ollama's `truncate: false`, Responses' `truncation:
  "auto"`, a compaction's summary (proxy/routes_responses.py). Backends that fit the context themselves (Ollama)
  are left to it, and get `truncate` as sent.
"""
from __future__ import annotations

import logging
import math
from contextlib import AsyncExitStack
from dataclasses import replace

from adapters import model_card, options
from adapters.base import Backend
from adapters.errors import ContextOverflow, ModelLacks
from adapters.protocol import ChatRequest, CompletionRequest, Message, ModelInfo, places_images
from adapters.wording import counted

from ..dialects import RULES
from ..job import Job, Request
from ..router import Target
from ..token_count import CHARS_PER_TOKEN, count, surely_under
from .base import Prepare

log = logging.getLogger("velo.fit")
_ANSWER_SHARE = 4  # a trimmed chat leaves at least 1/4 of the window (or max_tokens, if less) for the answer


def _unseen(m: Message) -> Message:
    """The message as a model that cannot see reads it: a note in place of its images, so it can say so."""
    note = f"[{counted(len(m.images), 'image')} left out: this model cannot see images]"
    return replace(m, images=[], content=f"{m.content}\n{note}" if m.content else note)


def as_seen(req: Request, info: ModelInfo, backend: Backend, dialect: str) -> Request:
    """The request as a model that cannot see gets it: each image of a chat a note, or a 400 in the dialects whose
    servers refuse images there (and for a raw prompt, which no note fits). The count endpoints read it so too."""
    if "vision" in info.capabilities or not backend.knows_capabilities:
        return req
    images = req.images if isinstance(req, CompletionRequest) else [i for m in req.messages for i in m.images]
    if not images:
        return req
    if RULES[dialect].refuses_images or isinstance(req, CompletionRequest):
        raise ModelLacks(req.model, "vision")
    return replace(req, messages=[_unseen(m) if m.images else m for m in req.messages])


def refuse_lacking(model: str, info: ModelInfo, chat: bool, inserts: bool = False) -> None:
    """Ollama's 400s for what the model cannot do, as its handlers answer them before loading it (server/routes.go):
    a model that only embeds, `"emb" does not support chat` (or `generate`); a suffix (`inserts`) for one that
    cannot fill in the middle, `does not support insert`."""
    if info.capabilities and "completion" not in info.capabilities:
        raise ModelLacks(model, "chat" if chat else "generate")
    if inserts and "insert" not in info.capabilities:
        raise ModelLacks(model, "insert")


class Fit(Prepare):
    async def prepare(self, job: Job, held: AsyncExitStack) -> Job:
        assert job.target is not None
        info = await self._with_window(await self.services.router.model_info(job.target), job.target)
        req = self._capped(job.request, info)
        if info is not None:  # a model the backend cannot describe is left to the backend
            self._check_insert(req, info, job)
            seen = as_seen(req, info, job.target.backend, job.dialect)
            req = await self._in_window(self._thinking(seen, info, job), info, job)
        return job if req is job.request else replace(job, request=req)

    async def _with_window(self, info: ModelInfo | None, target: Target) -> ModelInfo | None:
        """A managed llama-server that never ran has no window to fit a prompt to: it is started now (this request
        would start it next) and the router asks it again. A long chat went to it unfitted, llama-server's 400 where
        Ollama trims, also while the router kept what the server said before it started (30 s)."""
        backend = target.backend
        if info is None or info.context_length or not backend.window_once_started \
                or "completion" not in info.capabilities:
            return info
        await backend.load(target.model, None)  # None: the server's own ttl_s; the request's keep_alive at its end
        return await self.services.router.model_info_now(target)

    def _capped(self, req: Request, info: ModelInfo | None) -> Request:
        """Velo's default output limit where the client set none. Ollama's -1 (until done), -2 (fill the context)
        and 0 (no limit: its runners stop only at a limit above 0) run to the window's end, which bounds them, or
        where Velo knows no window to the backend's own limit: n8n and Dify send -1, and the default ended their
        long answers at 4,096 tokens; llama-server read 0 as no tokens at all."""
        asked, cap = req.options.max_tokens, self.services.config.server.default_max_tokens
        if asked is not None and asked <= 0:
            return replace(req, options=replace(req.options, max_tokens=_window(info, req)))
        if asked is not None or cap == 0:
            return req
        return replace(req, options=replace(req.options, max_tokens=cap))

    @staticmethod
    def _check_insert(req: Request, info: ModelInfo, job: Job) -> None:
        """Ollama's 400s for what the model cannot do, where the backend's capabilities are facts: fill in the
        middle, or generate at all (an embedding model was sent chats)."""
        assert job.target is not None
        if not job.target.backend.knows_capabilities:
            return
        refuse_lacking(req.model, info, isinstance(req, ChatRequest),
                       isinstance(req, CompletionRequest) and req.suffix is not None)

    @staticmethod
    def _thinking(req: Request, info: ModelInfo, job: Job) -> Request:
        if req.think in (None, False) or "thinking" in info.capabilities:
            return req
        if RULES[job.dialect].refuses_thinking:
            raise ModelLacks(req.model, "thinking")
        return replace(req, think=None)

    async def _in_window(self, req: Request, info: ModelInfo, job: Job) -> Request:
        """An output limit past the window's end is cut to what the window leaves where the backend would refuse it
        (vLLM, SGLang): the engine, llama-server and Ollama stop at the window's end, and so the answer does on
        every backend. opencode sends max_tokens 32000 with every request, and Velo adds its default to those
        without one; on an 8k vLLM both were a 400 every turn, worded as a prompt overflow."""
        assert job.target is not None
        # a client's num_ctx narrows a window Velo knows and never invents one: where the backend lists none (an
        # OpenAI-compatible server other than vLLM), it cannot apply num_ctx either, and keeps its own window. Zed
        # sends a fallback 4096 for a model whose /api/show has no context, and its agent's prompt was a 400 here.
        limit = _window(info, req)
        if limit is None or job.target.backend.fits_context:
            return req
        room = req.options.max_tokens is not None and job.target.backend.refuses_output_past_window
        if surely_under(req, limit - req.options.max_tokens if room else limit):
            return req
        tokens = await count(job.target, info, req)
        if tokens >= limit:
            if not (RULES[job.dialect].trims_context if req.truncate is None else req.truncate):
                raise ContextOverflow(tokens, limit, _field(req))
            if (asked := _num_ctx(req)) is not None and tokens < _granted(info, asked):
                # Ollama would load the model with that num_ctx and answer whole; a trim here dropped the file
                # Aider sized num_ctx to hold, and Aider wrote the model's guess over it
                raise ContextOverflow(tokens, limit, _field(req), f", which num_ctx {req.options.num_ctx} would hold "
                                      "but the backend cannot give (a llama-server slot is its -c over its -np)")
            req, tokens = await _trimmed(job, info, req, tokens, limit)
        return _output_within(req, limit - tokens) if room else req


def _window(info: ModelInfo | None, req: Request) -> int | None:
    """The window the request gets where Velo knows the model's: a client's num_ctx narrows it, never widens it."""
    if info is None or not info.context_length:
        return None
    return min(info.context_length, _num_ctx(req) or info.context_length)


def _num_ctx(req: Request) -> int | None:
    """The client's num_ctx as Ollama reads it (adapters/options.py), which the engine's adapter reads too."""
    return options.num_ctx(req.options.num_ctx)


def _granted(info: ModelInfo, num_ctx: int) -> int:
    """The window Ollama would load the model with: num_ctx, up to the context the model was trained for where
    its file says (Ollama caps it there, server/sched.go)."""
    trained = model_card.file_context(info.model_info, info.family)
    return num_ctx if trained is None else min(num_ctx, trained)


def _output_within(req: Request, left: int) -> Request:
    cap = req.options.max_tokens
    return req if cap is None or cap <= left else replace(req, options=replace(req.options, max_tokens=left))


async def _trimmed(job: Job, info: ModelInfo, req: Request, tokens: int, limit: int) -> tuple[Request, int]:
    """Drops what Ollama drops until the prompt leaves room for an answer; a 400 when even the least it keeps
    (system prompts and the last turn) does not fit, or for a raw prompt whose "[img-N]" tags place its images:
    Ollama cuts no prompt with images (llm/llama_server.go completionPromptForRequest, since v0.30.0), and
    llama-server, whose projector turns its context shift off, refuses one over its window with its 400. A cut of
    the text lost the images before it, or left half a tag ("describe [im") as text."""
    assert job.target is not None
    if isinstance(req, CompletionRequest) and places_images(req):
        raise ContextOverflow(tokens, limit, _field(req), ": a prompt with images is not cut, as Ollama cuts none")
    room = limit - min(req.options.max_tokens or limit, limit // _ANSWER_SHARE)
    asked, before, head = req, tokens, _head(req, room)
    while tokens > room:
        if head is None:
            shorter = _context_out(req, tokens - room) or _shorter(req, room / tokens)
        else:
            assert isinstance(req, CompletionRequest)
            shorter = _after_head(req, head, tokens - room, room / tokens)
        if shorter is None:
            raise ContextOverflow(tokens, limit, _field(req))
        req = shorter
        tokens = await count(job.target, info, req)
    what = _went(asked, req)
    job.outcome.trimmed = f"{what} ({before} -> {counted(tokens, 'token')})"
    log.info("%s: the prompt of %d tokens did not fit the context of %d: dropped %s", req.model, before, limit, what)
    return req, tokens


def _went(asked: Request, sent: Request) -> str:
    """What trimming took: messages, and characters from the start of the last one (or of each tool result that
    ends the chat), of the system prompts, or of a raw prompt."""
    if isinstance(asked, CompletionRequest) and isinstance(sent, CompletionRequest):
        if asked.prompt_ids is not None and sent.prompt_ids is not None:
            return counted(len(asked.prompt_ids) - len(sent.prompt_ids), "token id")
        ids, chars = len(asked.context or ()) - len(sent.context or ()), len(asked.prompt) - len(sent.prompt)
        return " and ".join([f"{counted(ids, 'token id')} of the context"] * bool(ids)
                            + [counted(chars, "character")] * bool(chars))
    assert isinstance(asked, ChatRequest) and isinstance(sent, ChatRequest)
    dropped = _turns(asked) - _turns(sent)
    system_cut = _system_chars(asked) - _system_chars(sent)
    turn = len(sent.messages) - _last_turn(sent.messages)
    pairs = list(zip(asked.messages[-turn:], sent.messages[-turn:]))
    cut = sum(len(a.content) - len(s.content) for a, s in pairs)
    shortened = sum(a.content != s.content for a, s in pairs)
    last = f"the last {counted(shortened, 'tool result')}" if shortened > 1 else "the last"
    return " and ".join([counted(dropped, "message")] * bool(dropped)
                        + [f"{counted(cut, 'character')} of {last}"] * bool(cut)
                        + [f"{counted(system_cut, 'character')} of the system prompts"] * bool(system_cut))


def _turns(req: ChatRequest) -> int:
    return sum(m.role != "system" for m in req.messages)


def _system_chars(req: ChatRequest) -> int:
    return sum(len(m.content) for m in req.messages if m.role == "system")


def _field(req: Request) -> str:
    """The request field an overflow names (OpenAI's `param`)."""
    return "prompt" if isinstance(req, CompletionRequest) else "messages"


def _context_out(req: Request, over: int) -> Request | None:
    """A generate less the first `over` ids of its `context` (an earlier exchange's, which goes before its prompt):
    Ollama renders the context's text first and its runner keeps the end of the whole (llm/llama_server.go), so the
    oldest of the conversation goes first; None when no context is left to drop."""
    if not isinstance(req, CompletionRequest) or not req.context:
        return None
    return replace(req, context=req.context[over:])


def _head(req: Request, room: int) -> int | None:
    """The tokens at a generate's start that Ollama's `num_keep` keeps when its runner cuts the prompt to the window
    (llm/llama_server.go completionPromptForRequest; runner/llamarunner and ollamarunner before v0.30): as many as
    fit for a negative one, and at most one fewer than the room, as Ollama keeps at most one fewer than its window;
    None where the client set none (Velo keeps the end alone, not Ollama's default of 4) or the request is a chat."""
    value = req.options.extra.get("num_keep")
    if isinstance(req, ChatRequest) or isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        return None
    return room - 1 if value < 0 else min(int(value), room - 1)


def _after_head(req: CompletionRequest, head: int, over: int, keep: float) -> CompletionRequest | None:
    """A generate less `over` tokens right after its first `head` (its `context` ids first, then its prompt's), as
    Ollama's runner keeps the first num_keep and drops from after them. Token ids are cut exactly; a text prompt's
    tokens are not known here, so its head is `CHARS_PER_TOKEN` characters a token, and where fewer than the cut
    follow it (a head estimated too long) the head's end goes too. None when nothing more can go."""
    if req.prompt_ids is not None:
        ids = req.prompt_ids
        start = max(0, min(head, len(ids) - over))
        return replace(req, prompt_ids=ids[:start] + ids[start + over:]) if over < len(ids) else None
    if req.context and len(req.context) > head:
        return replace(req, context=req.context[:head] + req.context[head + over:])
    cut = _cut(len(req.prompt), keep)
    if cut >= len(req.prompt):
        return None
    start = max(0, min((head - len(req.context or ())) * CHARS_PER_TOKEN, len(req.prompt) - cut))
    return replace(req, prompt=req.prompt[:start] + req.prompt[start + cut:])


def _shorter(req: Request, keep: float) -> Request | None:
    """`req` cut to about `keep` of its size: a chat's oldest non-system turns, then the start of its last message
    (of each tool result, where an agent's loop ends it), or the start of a raw prompt (its text or its token ids);
    None when nothing more can go. Ollama, too, keeps the end of a prompt that its last turn alone overflows unless
    asked not to shift (llm/llama_server.go), which a user pasting a whole file into one message meets."""
    if isinstance(req, CompletionRequest) and req.prompt_ids is not None:  # counted exactly: no recount to undo
        kept_ids = math.floor(len(req.prompt_ids) * keep)
        return replace(req, prompt_ids=req.prompt_ids[-kept_ids:]) if 0 < kept_ids < len(req.prompt_ids) else None
    if isinstance(req, CompletionRequest):
        cut = _cut(len(req.prompt), keep)
        return replace(req, prompt=req.prompt[cut:]) if cut < len(req.prompt) else None
    kept, start = req.messages, _last_turn(req.messages)
    if (fewer := _oldest_out(kept, start, keep)) is not None:
        return replace(req, messages=fewer)
    if req.shift is False:  # Ollama's `shift: false` asks for the 400 instead
        return None
    cut = _cut(sum(len(m.content) + 1 for m in kept), keep)
    if (turn := _ends(kept[start:], cut)) is not None:
        return replace(req, messages=[*kept[:start], *turn])
    systems = _cut_start(kept[:start], cut)
    return None if systems is None else replace(req, messages=[*systems, *kept[start:]])


def _oldest_out(messages: list[Message], start: int, keep: float) -> list[Message] | None:
    """The chat less its oldest non-system turns before `start` (the last turn's) down to about `keep` of its
    characters, at least one; None when none can go. One pass: finding the last turn again for each turn dropped
    took 7 ms for a 2,000-message agent loop and 0.9 s for 20,000 (quadratic), now 0.3 ms and 3.3 ms."""
    total = sum(len(m.content) + 1 for m in messages)
    goal, dropped, stop = total * keep, 0, start
    for i, m in enumerate(messages[:start]):
        if m.role == "system":
            continue
        if dropped and total <= goal and m.role != "tool":  # a tool answer goes with its call
            stop = i
            break
        total -= len(m.content) + 1
        dropped += 1
    return [*(m for m in messages[:stop] if m.role == "system"), *messages[stop:]] if dropped else None


def _last_turn(messages: list[Message]) -> int:
    """Where the last turn starts: at the assistant's call when the chat ends in its tool results (an agent's loop),
    which stays with them: a result without its call is a 400 from vLLM and breaks chat templates."""
    start = len(messages) - 1
    while start > 0 and messages[start].role == "tool":
        start -= 1
    if start < len(messages) - 1 and messages[start].role == "assistant" and messages[start].tool_calls:
        return start
    return len(messages) - 1


def _ends(turn: list[Message], cut: int) -> list[Message] | None:
    """The last turn less `cut` characters from the start of its message, or of the results of an agent's tool calls
    (its call stays whole): an agent reading three files, each over the window, could lose only the last one's
    start, and got the 400. The longest results are cut to one length and the shorter ones kept whole (shared in
    proportion, a 10-character error beside two 6,000-character files kept 1 of them). Each keeps its end, as the
    last message does: a command's latest output, a file's last lines. None when they hold no more than `cut`."""
    first = 1 if len(turn) > 1 else 0  # past the call, only results follow (_last_turn)
    sizes = [len(m.content) for m in turn[first:]]
    if cut >= sum(sizes):
        return None
    longest = _level(sizes, sum(sizes) - cut)
    return [*turn[:first], *(replace(m, content=m.content[-longest:] if longest else "") if len(m.content) > longest
                             else m for m in turn[first:])]


def _level(sizes: list[int], room: int) -> int:
    """The longest any one may be so that together they fit `room`, those shorter kept whole (water-filling)."""
    left = len(sizes)
    for size in sorted(sizes):
        if size * left > room:
            return room // left
        room, left = room - size, left - 1
    return max(sizes)


def _cut_start(messages: list[Message], cut: int) -> list[Message] | None:
    """System prompts that alone leave no room, without their first `cut` characters: Ollama's runner keeps a
    prompt's end whatever it holds (an agent's system prompt and tools are 2,000+ tokens, over a small num_ctx or a
    llama-server slot), where a 400 failed every turn of Roo Code and Cline. None when nothing would be left."""
    kept = list(messages)
    while kept and cut >= len(kept[0].content):
        cut -= len(kept.pop(0).content) + 1
    if not kept:
        return None
    return [replace(kept[0], content=kept[0].content[max(cut, 0):]), *kept[1:]]


def _cut(total: int, keep: float) -> int:
    """Characters to cut from the start of a prompt's text, of `total` in all, to leave about `keep` of it (5% under,
    so that one recount mostly suffices)."""
    return max(1, total - math.floor(total * keep * 0.95))
