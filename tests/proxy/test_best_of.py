"""OpenAI's `best_of` on /v1/completions, through the official `openai` client, over the Ollama protocol double and
the OpenAI-compatible fake (tests/fakes.py): candidates generated as parts, ranked by mean logprob per token."""
from __future__ import annotations

import contextlib
import logging
import math
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from adapters.base import BackendConfig
from adapters.errors import BackendError, BadRequest
from adapters.protocol import Chunk, TokenLogprob, Usage
from proxy.app import make_app
from proxy.best_of import best, refuses_logprobs
from proxy.cache.config import CacheConfig
from proxy.config import Config
from proxy.limits import LimitsConfig
from tests.fakes import FakeOpenAI, OllamaDouble
from tests.proxy.test_metrics import samples, value

MODELS = {"ollama": "smollm2:135m", "openai": "fake-gpt"}
PATHS = {"ollama": "/api/generate", "openai": "/v1/completions"}
# (reply, each of its tokens' logprob), one per candidate: the most likely per token is the short one, and the one
# with the highest total (the least negative sum) is not the best
REPLIES = [("A one two three", -1.0), ("B four", -0.2), ("C five six", -0.5)]


@pytest.fixture(params=["ollama", "openai"])
async def velo(request):
    async with _served(request.param) as served:
        yield served


@contextlib.asynccontextmanager
async def _served(kind: str, **config: Any):
    """(an `openai` client of Velo, the backend kind, the fake upstream); Velo's cache off unless `config` says."""
    fake = OllamaDouble() if kind == "ollama" else FakeOpenAI(models=[MODELS["openai"]])
    async with fake:
        fake.script.replies = REPLIES
        cfg = Config(backends=[BackendConfig(name="up", kind=kind, urls=[fake.url])],
                     **{"cache": CacheConfig(enabled=False), **config})
        server = TestServer(make_app(cfg), host="127.0.0.1", port=0)
        await server.start_server()
        try:
            url = str(server.make_url("")).rstrip("/")
            yield openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0), kind, fake
        finally:
            await server.close()


def _asked(fake, kind: str) -> list[dict]:
    return [r.body for r in fake.requests if r.path == PATHS[kind]]


async def test_best_of_answers_the_n_most_likely_per_token_best_first(velo):
    """Before: `best_of` was dropped, so `best_of=3, n=2` asked for two samples, answered unranked."""
    client, kind, fake = velo
    out = await client.completions.create(model=MODELS[kind], prompt="Count", best_of=3, n=2, max_tokens=8)
    assert [(c.index, c.text) for c in out.choices] == [(0, "B four"), (1, "C five six")]
    assert [c.logprobs for c in out.choices] == [None, None]  # not asked for: Velo's own, for ranking
    assert out.usage.completion_tokens == 4 + 2 + 3  # every candidate's, as OpenAI bills them
    asked = _asked(fake, kind)
    assert len(asked) == 3 and all(body["logprobs"] for body in asked)


async def test_best_of_gives_the_logprobs_the_client_asked_for(velo):
    client, kind, fake = velo
    out = await client.completions.create(model=MODELS[kind], prompt="Count", best_of=3, max_tokens=8, logprobs=1)
    [choice] = out.choices
    assert choice.text == "B four" and choice.logprobs.tokens == ["B", " four"]
    assert choice.logprobs.token_logprobs == [-0.2, -0.2]


@pytest.mark.parametrize("velo", ["openai"], indirect=True)
async def test_a_backend_without_logprobs_answers_the_first_n_and_says_they_are_unranked(velo):
    """A server that drops `logprobs` (an Ollama before 0.12.11) leaves nothing to rank by: the answer is not thrown
    away, and X-Velo-Best-Of says it was not ranked."""
    client, kind, fake = velo
    fake.script.logprobs = False
    raw = await client.completions.with_raw_response.create(model=MODELS[kind], prompt="Count", best_of=3,
                                                            max_tokens=8)
    out = raw.parse()
    assert raw.headers["X-Velo-Best-Of"] == "unranked" and len(out.choices) == 1
    assert out.choices[0].text in {text for text, _ in REPLIES} and out.usage.completion_tokens == 9


async def test_a_backend_that_refuses_logprobs_is_asked_again_without_them_and_answered_unranked(velo):
    """Before: a backend that refuses `logprobs` (vLLM started with --max-logprobs 0, a provider's model without them)
    failed the whole request with its 400, though the client never asked for logprobs; Velo's own are dropped now."""
    client, kind, fake = velo
    fake.script.refused_field = "logprobs"
    raw = await client.completions.with_raw_response.create(model=MODELS[kind], prompt="Count", best_of=3, n=2,
                                                            max_tokens=8)
    out = raw.parse()
    assert raw.headers["X-Velo-Best-Of"] == "unranked" and len(out.choices) == 2
    assert {c.text for c in out.choices} <= {text for text, _ in REPLIES} and out.usage.completion_tokens == 9
    asked = _asked(fake, kind)  # each candidate refused, then asked again without them
    assert sorted(bool(body.get("logprobs")) for body in asked) == [False] * 3 + [True] * 3
    assert sum("logprobs" not in body for body in asked) == 3


@pytest.mark.parametrize("kind", ["ollama", "openai"])
async def test_a_retry_without_logprobs_is_still_the_one_request_the_client_made(kind, caplog):
    """Before: the refused candidates and those asked again were two requests to the key's limits, /metrics and the
    request log: a key allowed one request a minute had its best_of refused 429 by Velo's own retry, and the refusal
    was counted and logged as the candidates' 400s."""
    async with _served(kind, limits=LimitsConfig(requests_per_minute=1)) as (client, kind, fake):
        fake.script.refused_field = "logprobs"
        with caplog.at_level(logging.INFO, logger="velo.requests"):
            raw = await client.completions.with_raw_response.create(model=MODELS[kind], prompt="Count", best_of=3,
                                                                    max_tokens=8)
        assert raw.headers["X-Velo-Best-Of"] == "unranked" and raw.headers["x-ratelimit-remaining-requests"] == "0"
        async with aiohttp.ClientSession() as http:
            found = samples(await (await http.get(str(client.base_url).removesuffix("v1/") + "metrics")).text())
    counted = {"endpoint": "/v1/completions", "model": MODELS[kind], "backend": "up"}
    assert value(found, "velo_requests_total", **counted, status="200") == 3  # each candidate's, as `n`'s choices
    assert value(found, "velo_requests_total", **counted, status="400") == 0
    logged = [r.getMessage() for r in caplog.records if r.name == "velo.requests"]
    assert len(logged) == 3 and all(": done (" in line for line in logged), logged


async def test_a_logprobs_refusal_the_client_asked_for_is_its_400(velo):
    client, kind, fake = velo
    fake.script.refused_field = "logprobs"
    with pytest.raises(openai.BadRequestError) as err:
        await client.completions.create(model=MODELS[kind], prompt="Count", best_of=3, max_tokens=8, logprobs=1)
    assert "'logprobs' is not supported" in err.value.message and err.value.type == "invalid_request_error"
    assert all(body["logprobs"] for body in _asked(fake, kind))


@pytest.mark.parametrize("error, refused", [
    (BadRequest("Requested sample logprobs of 1, which is greater than max allowed: 0"), True),  # vLLM
    (BadRequest("This model does not support the 'logprobs' parameter."), True),  # OpenAI
    (BadRequest("Unrecognized request argument supplied: logprobs"), True),  # OpenAI
    (BadRequest("[{'type': 'extra_forbidden', 'loc': ('body', 'logprobs'), 'msg': 'Extra inputs'}]"), True),
    (BadRequest("max_tokens must be at least 1, got 0."), False),  # refused for something else: no retry cures it
    (BackendError("backend 'up' answered 500 on /v1/completions: logprobs"), False),  # a failure, not a refusal
])
def test_a_refusal_is_of_logprobs_where_its_words_name_them(error, refused):
    assert refuses_logprobs(error) is refused


@pytest.mark.parametrize("velo", ["openai"], indirect=True)
@pytest.mark.parametrize("asked, message", [
    ({"best_of": 1, "n": 2}, "best_of must be greater than or equal to n, got n=2 and best_of=1."),
    ({"best_of": 2, "stream": True}, "Cannot stream results with best_of > 1"),
    ({"best_of": 21}, "best_of must be between 1 and 20, got 21"),
    ({"best_of": 0}, "best_of must be between 1 and 20, got 0"),
    ({"best_of": 20, "prompt": ["a", "b", "c", "d"]}, "at most 64 choices a request (prompts × best_of), got 80"),
])
async def test_a_best_of_openai_refuses_is_a_400_naming_it(velo, asked, message):
    client, kind, fake = velo
    with pytest.raises(openai.BadRequestError) as err:
        await client.completions.create(**{"model": MODELS[kind], "prompt": "Count", "max_tokens": 8, **asked})
    assert err.value.param == "best_of" and err.value.type == "invalid_request_error"
    assert message in err.value.message and _asked(fake, kind) == []


@pytest.mark.parametrize("velo", ["openai"], indirect=True)
async def test_best_of_one_streams_and_asks_no_logprobs(velo):
    client, kind, fake = velo
    stream = await client.completions.create(model=MODELS[kind], prompt="Count", best_of=1, stream=True,
                                             max_tokens=8)
    assert "".join([c.choices[0].text async for c in stream if c.choices]) == "A one two three"
    assert "logprobs" not in _asked(fake, kind)[0]


def _answer(text: str, *logprobs: float) -> Chunk:
    return Chunk(text=text, logprobs=[TokenLogprob(text, lp) for lp in logprobs], finish_reason="stop",
                 usage=Usage(prompt_tokens=3, completion_tokens=len(logprobs)))


def test_each_prompt_of_a_batch_keeps_the_best_of_its_own_candidates():
    """Candidates come prompt by prompt (best_of each); an empty one (an end of text first) and one scored NaN rank
    last, and equally likely ones stay in the order they came."""
    first = [_answer("a1", -2.0), _answer("a2", -0.1, -0.3), _answer("")]
    second = [_answer("b1", math.nan), _answer("b2", -1.0), _answer("b3", -1.0)]
    choices, headers = best(first + second, 3, 2, logprobs=True)
    assert [c.text for c in choices] == ["a2", "a1", "b2", "b3"] and headers == {}
    assert choices[0].logprobs and not best(first, 3, 1, logprobs=False)[0][0].logprobs
