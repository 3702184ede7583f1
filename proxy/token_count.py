"""A request's prompt tokens: the backend's own count where it has a tokenizer (the engine, llama-server), else an
estimate of one token per 4 characters of text, tool schemas included (OpenAI's rule of thumb for English;
tokenizers of local models give 3.5-4.5 on chat text), and Ollama's 768 per image (adapters/base.py IMAGE_TOKENS)."""
from __future__ import annotations

import functools
import math
from dataclasses import replace
from typing import Awaitable, Callable


from adapters.base import IMAGE_TOKENS
from adapters.exact_json import dumps
from adapters.protocol import ChatRequest, CompletionRequest, ModelInfo, images_in, prompt_read

from .router import Target
from .tools.offer import as_offered

CHARS_PER_TOKEN = 4
# A prompt whose characters / 2 stay under a limit surely is: local tokenizers give 3.5-4.5 characters per token on
# chat and code, and 2 on lists of digits or one-letter words, so an exact count (an HTTP round trip for
# llama-server) is only asked of prompts that may be near it.
_SURELY_UNDER_CHARS_PER_TOKEN = 2
# and a chat template's own tokens around each message: Qwen's `<|im_start|>assistant\n<tool_call>\n{"name": ...,
# "arguments": ...}\n</tool_call><|im_end|>\n` wraps a call in about 20, a short tool result in about 10. An agent's
# hour of short calls and results ("ok", a path) is mostly these, and was "surely under" at 2-3 times the window.
_SURELY_UNDER_TOKENS_PER_MESSAGE = 20
# and an image's tokens, which the characters do not see and the counts only in part (vLLM's /tokenize after 0.16,
# its PR 34560; llama-server's and the estimate take Ollama's 768, adapters/base.py): Qwen2-VL's and Qwen2.5-VL's
# model cards give "4-16384" visual tokens per image by default, the most of the vision models local servers run
# (LLaVA-1.6 up to 2,880, Gemma 3 256). A chat of a short question and a screenshot was "surely under" a window of
# 4,096, and went to the backend unfitted.
_SURELY_UNDER_TOKENS_PER_IMAGE = 16384


def characters(req: ChatRequest | CompletionRequest) -> int:
    """The characters of everything the model reads: turns, calls, tool schemas (a completion: its prompt, less a raw
    one's image tags, which are images; token ids, its own or an earlier exchange's `context` before it, count as a
    token's characters each, so that `estimate` is their number: a generate of a 10,000-id context and a short prompt
    was "surely under" a window of 4,096)."""
    if isinstance(req, CompletionRequest):
        ids = (len(req.prompt_ids or ()) + len(req.context or ())) * CHARS_PER_TOKEN
        return ids + len(prompt_read(req)) + len(req.suffix or "") + len(req.system or "")
    chars = sum(len(m.content) + len(m.thinking) for m in req.messages)
    chars += sum(len(dumps(c.arguments)) + len(c.name) for m in req.messages for c in m.tool_calls)
    return chars + (len(dumps([[t.name, t.description, t.parameters] for t in req.tools])) if req.tools else 0)


def surely_under(req: ChatRequest | CompletionRequest, tokens: int) -> bool:
    wrapping = len(req.messages) * _SURELY_UNDER_TOKENS_PER_MESSAGE if isinstance(req, ChatRequest) else 0
    seen = images_in(req) * _SURELY_UNDER_TOKENS_PER_IMAGE
    return characters(req) / _SURELY_UNDER_CHARS_PER_TOKEN + wrapping + seen < tokens


def estimate(req: ChatRequest | CompletionRequest) -> int:
    """Text by its characters, and images as Ollama counts them: by its text alone, a question and a screenshot for
    a server that cannot count (SGLang, LM Studio) was a few tokens, and fit any window."""
    return math.ceil(characters(req) / CHARS_PER_TOKEN) + images_in(req) * IMAGE_TOKENS


async def count(target: Target, info: ModelInfo | None, req: ChatRequest | CompletionRequest) -> int:
    """`prompt_tokens` as a plain count (the fit stage's window, context editing's trigger)."""
    return (await prompt_tokens(target, info, req))[0]


def counter(target: Target, info: ModelInfo | None) -> Callable[[ChatRequest], Awaitable[int]]:
    """`count` for one target, as context editing takes it (proxy/context_edits.py)."""
    return functools.partial(count, target, info)


async def prompt_tokens(target: Target, info: ModelInfo | None,
                        req: ChatRequest | CompletionRequest) -> tuple[int, bool]:
    """(tokens, exact): exact when the backend counted them itself. `req` is named as the client named it, and
    counted with its tools as the model will read them (`info` says whether its template renders them). A prompt of
    token ids is their number: backends read them as they are, and their count_tokens read text."""
    if isinstance(req, CompletionRequest) and req.prompt_ids is not None:
        return len(req.prompt_ids), True
    if isinstance(req, ChatRequest):
        req = as_offered(req, info, target.backend.forces_tool_choice)[0]
    counted = await target.backend.count_tokens(replace(req, model=target.model))
    return (counted, True) if counted is not None else (estimate(req), False)
