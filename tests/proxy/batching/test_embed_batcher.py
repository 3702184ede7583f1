"""EmbedBatcher on its own: merging rules, the window, splitting, errors and callers that leave."""
from __future__ import annotations

import asyncio

import pytest

from adapters.errors import BackendError, BadRequest, NonFiniteEmbedding, Overloaded
from adapters.protocol import EmbedRequest, EmbedResult, Usage
from proxy.batching import EmbedBatcher


class Recorder:
    def __init__(self, fail: bool = False, short: bool = False):
        self.calls: list[EmbedRequest] = []
        self.fail, self.short = fail, short
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, req: EmbedRequest) -> EmbedResult:
        self.calls.append(req)
        await self.release.wait()
        if self.fail:
            raise BackendError("embedder down")
        vectors = [[float(len(s))] for s in req.inputs]
        return EmbedResult(embeddings=vectors[:-1] if self.short else vectors, prompt_tokens=10 * len(req.inputs))


def req(*inputs: str, model: str = "e", dimensions: int | None = None) -> EmbedRequest:
    return EmbedRequest(model=model, inputs=list(inputs), dimensions=dimensions)


async def test_requests_within_the_window_share_one_call_and_get_their_own_slice():
    call = Recorder()
    batcher = EmbedBatcher(call, window_ms=20, max_inputs=64)
    a, b = await asyncio.gather(batcher.embed(req("x", "yyy")), batcher.embed(req("zz")))
    assert len(call.calls) == 1 and call.calls[0].inputs == ["x", "yyy", "zz"]
    assert a.embeddings == [[1.0], [3.0]] and b.embeddings == [[2.0]]
    assert a.prompt_tokens + b.prompt_tokens == 30 and a.prompt_tokens == 20  # shared out by input length


async def test_different_models_or_options_are_never_merged():
    call = Recorder()
    batcher = EmbedBatcher(call, window_ms=20)
    await asyncio.gather(batcher.embed(req("a")), batcher.embed(req("b", model="other")),
                         batcher.embed(req("c", dimensions=8)), batcher.embed(req("d")))
    assert sorted(len(c.inputs) for c in call.calls) == [1, 1, 2]


async def test_token_ids_and_texts_are_never_merged():
    """vLLM takes texts or token ids in a request, never both (its `input` is one of OpenAI's four shapes)."""
    call = Recorder()
    batcher = EmbedBatcher(call, window_ms=20)
    ids = [EmbedRequest(model="e", inputs=[[1, 2]]), EmbedRequest(model="e", inputs=[[3]])]
    a, b, *_ = await asyncio.gather(*map(batcher.embed, [req("a"), req("bb"), *ids]))
    assert [c.inputs for c in call.calls if isinstance(c.inputs[0], str)] == [["a", "bb"]]
    assert [c.inputs for c in call.calls if isinstance(c.inputs[0], list)] == [[[1, 2], [3]]]
    assert a.embeddings == [[1.0]] and b.embeddings == [[2.0]]


async def test_a_full_batch_goes_at_once_without_waiting_for_the_window():
    call = Recorder()
    batcher = EmbedBatcher(call, window_ms=10_000, max_inputs=3)
    results = await asyncio.wait_for(asyncio.gather(*[batcher.embed(req(str(i))) for i in range(3)]), 1)
    assert len(call.calls) == 1 and [r.embeddings for r in results] == [[[1.0]]] * 3


async def test_backend_error_and_wrong_counts_reach_every_caller():
    batcher = EmbedBatcher(Recorder(fail=True), window_ms=5)
    results = await asyncio.gather(batcher.embed(req("a")), batcher.embed(req("b")), return_exceptions=True)
    assert all(isinstance(r, BackendError) for r in results)
    batcher = EmbedBatcher(Recorder(short=True), window_ms=5)
    results = await asyncio.gather(batcher.embed(req("a")), batcher.embed(req("b")), return_exceptions=True)
    assert all(isinstance(r, BackendError) and "2 inputs" in str(r) for r in results)


@pytest.mark.parametrize("bad_input, error", [
    # a client's mistake (Ollama's truncate: false on an input past the context): a 400 for that client alone
    (lambda s: len(s) > 3, BadRequest("the input length exceeds the context length")),
    # Ollama refuses a batch with one vector of NaN in it (server/routes.go, normalize): each caller was told the
    # backend failed and not to retry
    (lambda s: s == "nnnn", NonFiniteEmbedding("backend 'o' embedded an input to NaN or infinite values"))],
    ids=["400", "nan"])
async def test_one_callers_input_fails_only_that_caller(bad_input, error):
    """The batch is asked again one caller at a time, and the callers who shared it get their vectors."""
    async def embed(r: EmbedRequest) -> EmbedResult:
        if any(map(bad_input, r.inputs)):
            raise error
        return EmbedResult(embeddings=[[float(len(s))] for s in r.inputs], prompt_tokens=len(r.inputs))
    batcher = EmbedBatcher(embed, window_ms=20)
    good, bad, other = await asyncio.gather(batcher.embed(req("a", "bb")), batcher.embed(req("nnnn")),
                                            batcher.embed(req("ccc")), return_exceptions=True)
    assert good.embeddings == [[1.0], [2.0]] and other.embeddings == [[3.0]] and bad is error
    assert batcher.calls.n == 4  # the shared call, then each caller alone


async def test_a_batch_that_found_no_slot_is_not_asked_again_caller_by_caller():
    """A 429 for the batch's wait (queue_timeout_s) is no caller's input: each caller asked alone waited as long
    again before its own 429."""
    calls = []

    async def busy(r: EmbedRequest) -> EmbedResult:
        calls.append(r)
        raise Overloaded("no slot of the backend came free within 300 s", retry_after=1)
    batcher = EmbedBatcher(busy, window_ms=20)
    results = await asyncio.gather(batcher.embed(req("a")), batcher.embed(req("b")), return_exceptions=True)
    assert all(isinstance(r, Overloaded) for r in results) and len(calls) == 1


async def test_a_caller_that_leaves_before_the_flush_is_left_out():
    call = Recorder()
    batcher = EmbedBatcher(call, window_ms=30)
    leaver = asyncio.create_task(batcher.embed(req("gone")))
    stayer = asyncio.create_task(batcher.embed(req("here")))
    await asyncio.sleep(0)
    leaver.cancel()
    assert (await stayer).embeddings == [[4.0]]
    assert call.calls[0].inputs == ["here"]


async def test_the_backend_call_stops_once_every_caller_has_left_and_not_before():
    """Callers gone, the batch's call ran on for nobody: a client could pile up backend work while its key's
    concurrency count, released as each caller left, said it ran nothing."""
    call = Recorder()
    call.release.clear()
    batcher = EmbedBatcher(call, window_ms=1)
    first, second = (asyncio.create_task(batcher.embed(req(s))) for s in ("a", "b"))
    await asyncio.sleep(0.02)
    [running] = batcher._tasks
    first.cancel()
    await asyncio.sleep(0.01)
    assert not running.done()  # one caller still waits for it
    second.cancel()
    await asyncio.sleep(0.01)
    assert running.cancelled() and not batcher._tasks


async def test_close_cancels_batches_in_flight():
    call = Recorder()
    call.release.clear()
    batcher = EmbedBatcher(call, window_ms=1)
    waiting = asyncio.create_task(batcher.embed(req("a")))
    await asyncio.sleep(0.02)
    await batcher.close()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not batcher._tasks


def test_requests_that_differ_in_any_field_but_their_inputs_never_merge():
    """The key listed EmbedRequest's fields by hand: one added later and forgotten there would merge requests that
    differ in it."""
    from dataclasses import fields, replace

    from proxy.batching.embed_batcher import _batch_key

    base = EmbedRequest("m", ["a"])
    changed = {"model": "n", "truncate": False, "dimensions": 8, "options": {"num_ctx": 64}, "keep_alive": "5m",
               "normalize": False}
    assert set(changed) == {f.name for f in fields(EmbedRequest)} - {"inputs"}
    assert _batch_key(replace(base, inputs=["b", "c"])) == _batch_key(base)
    assert all(_batch_key(replace(base, **{name: value})) != _batch_key(base) for name, value in changed.items())


async def test_a_result_that_cannot_be_shared_out_fails_its_callers_rather_than_hanging_them():
    """An answer whose count could not be shared out killed the batch's task after the call, and its callers waited
    for ever (a backend's `prompt_eval_count: null`, before the adapters read counts leniently)."""
    async def odd(request: EmbedRequest) -> EmbedResult:
        return EmbedResult(embeddings=[[1.0] for _ in request.inputs], prompt_tokens="many")  # type: ignore[arg-type]
    batcher = EmbedBatcher(odd, window_ms=5, max_inputs=64)
    results = await asyncio.wait_for(asyncio.gather(batcher.embed(req("a")), batcher.embed(req("bb")),
                                                    return_exceptions=True), 5)
    assert all(isinstance(r, TypeError) for r in results)


def test_a_servers_odd_counts_are_read_as_none_reported():
    """A null or a string where a server reports a count reached arithmetic later: a 500 (Anthropic's usage,
    OpenAI's stream), or an embedding request that never got its answer."""
    from adapters import ollama, openai_wire
    assert ollama.usage_from_wire({"prompt_eval_count": None, "eval_count": "5", "total_duration": 7}) == Usage(0, 0)
    assert openai_wire.usage_from_wire({"prompt_tokens": None, "completion_tokens": 3}, None) == Usage(0, 3)
    assert openai_wire.usage_from_wire(None, {"prompt_n": "x", "prompt_ms": None, "predicted_ms": 2.5}) == Usage(
        0, 0, eval_ns=2_500_000)
    assert openai_wire.embeddings_from_wire({"data": [{"embedding": [1.0]}], "usage": {"prompt_tokens": None}}) \
        == EmbedResult(embeddings=[[1.0]], prompt_tokens=0)
