"""OpenAI's `best_of` on /v1/completions: `best_of` candidates per prompt, generated as parts of the request as `n`'s
choices are (routes_openai.py), each asked for its tokens' log-probabilities on every backend whatever the client
asked; the `n` with the highest mean log-probability per token are answered, best first, as OpenAI ranks them."""
from __future__ import annotations

import contextlib
import math
from dataclasses import replace
from typing import AsyncIterator, Callable

from adapters.errors import BadRequest
from adapters.protocol import Chunk, CompletionRequest

# Said where a backend gave no logprobs (an Ollama before 0.12.11, an OpenAI-compatible server that drops them, one
# that refuses them: `refuses_logprobs`): each prompt's first `n` candidates are answered as they came, unranked.
UNRANKED = {"X-Velo-Best-Of": "unranked"}


def candidates(req: CompletionRequest, best_of: int) -> CompletionRequest:
    """One prompt's request for its `best_of` candidates, each with its tokens' logprobs to rank it by."""
    return replace(req, n=best_of, options=replace(req.options, logprobs=True))


async def ranked_or_not(complete: Callable[[CompletionRequest], AsyncIterator[Chunk]],
                        req: CompletionRequest) -> AsyncIterator[Chunk]:
    """A candidate whose logprobs are Velo's own (Job.own_logprobs, the call backend stage), with them, or asked
    again without them where the backend refuses them, to be answered unranked (`best`) as where it drops them: a
    400 for a field the client never sent left it nothing to fix. Asked again within its job, it is the one request
    the client made: asked again by the route, the refusal and the retry were two to the key's limits, /metrics and
    the request log (a key allowed one request a minute had its best_of refused 429 by the retry). Its answer is
    cached as the candidate asked, as one from a backend that drops logprobs is: a repeat is answered unranked again,
    from the cache."""
    try:
        async with contextlib.aclosing(complete(req)) as chunks:
            async for chunk in chunks:
                yield chunk
        return
    except BadRequest as e:  # a backend refuses before it answers
        if not refuses_logprobs(e):
            raise
    async with contextlib.aclosing(complete(replace(req, options=replace(req.options, logprobs=False)))) as chunks:
        async for chunk in chunks:
            yield chunk


def refuses_logprobs(e: Exception) -> bool:
    """The backend's 400 or 422 (a BadRequest, adapters/http.py) refused the request for its logprobs, in words that
    name them: vLLM's "Requested sample logprobs of 1, which is greater than max allowed: 0" (--max-logprobs 0),
    OpenAI's "This model does not support the 'logprobs' parameter." and "Unrecognized request argument supplied:
    logprobs", Groq's "logprobs is not supported with this model", a pydantic server's extra_forbidden at ('body',
    'logprobs'). Their status alone says nothing of why; the candidates' only logprobs are Velo's own where the client
    asked for none, so a refusal naming them is of those."""
    return isinstance(e, BadRequest) and "logprob" in e.message.lower()


def best(answers: list[Chunk], best_of: int, n: int, logprobs: bool) -> tuple[list[Chunk], dict[str, str]]:
    """The `n` best of each prompt's `best_of` answers (prompts in order), best first, with their logprobs only where
    the client asked for them; and the response's headers. A prompt whose answers cannot all be scored keeps its
    first `n` as generated (UNRANKED): failing the request would throw away what the backend has already generated
    and billed, and each of those is as good a sample as `n` alone answers; the header says they are unranked."""
    choices: list[Chunk] = []
    headers: dict[str, str] = {}
    for start in range(0, len(answers), best_of):
        group = answers[start:start + best_of]
        scores = [s for s in map(_score, group) if s is not None]
        if len(scores) < len(group):
            headers = UNRANKED
        else:  # a stable sort: equally likely answers stay in the order they were generated
            group = [a for _, a in sorted(zip(scores, group), key=lambda pair: -pair[0])]
        choices += [a if logprobs else replace(a, logprobs=[]) for a in group[:n]]
    return choices, headers


def _score(answer: Chunk) -> float | None:
    """The mean logprob per token; None for text that came without logprobs. An empty answer (an end of text first)
    has no token to score and ranks last; so does one a backend scored NaN."""
    if not answer.logprobs:
        return None if answer.text else -math.inf
    mean = math.fsum(lp.logprob for lp in answer.logprobs) / len(answer.logprobs)
    return -math.inf if math.isnan(mean) else mean
