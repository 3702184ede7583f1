"""EngineBackend through the Backend contract, on a tiny random model (and once on the shipped SmolLM2)."""
import asyncio
import dataclasses
import json
import threading
import time

import pytest

from adapters import go_template
from adapters.base import BackendConfig
from adapters.engine import DEFAULT_NAME, EngineBackend, sampling_params
from adapters.errors import BackendError, BackendTimeout, BadRequest, ModelLacks, ModelNotFound
from adapters.model_file import model_file
from adapters.protocol import (ChatRequest, CompletionRequest, EmbedRequest, Message, SamplingOptions, Tool,
                               aggregate)
from engine import LLMEngine, RequestOutput
from engine.fim import FIM_ENDS, FIM_MARKERS
from tests.engine.tiny import byte_tokenizer, engine_options, write_tiny_model
from tests.loop_watch import loop_gaps

NAME = "tiny"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return write_tiny_model(str(tmp_path_factory.mktemp("tiny")), "qwen2")


@pytest.fixture
async def backend(model_dir):
    b = EngineBackend(BackendConfig(name="engine", kind="engine", options=engine_options(model_dir)))
    await b.start()
    yield b
    await b.close()


def chat(content="Say something", **options) -> ChatRequest:
    return ChatRequest(model=NAME, messages=[Message(role="user", content=content)],
                       options=SamplingOptions(**options))


async def collect(stream):
    return [c async for c in stream]


async def test_lists_and_shows_the_model(backend, model_dir):
    [info] = await backend.list_models()
    assert (info.name, info.family, info.format, info.context_length) == (NAME, "qwen2", "safetensors", 512)
    assert (info.size, info.modified_at, info.digest) == dataclasses.astuple(model_file(model_dir))
    assert (await backend.show(f"{NAME}:latest")).name == NAME
    assert [(m.name, m.digest) for m in await backend.running()] == [(NAME, info.digest)]
    assert await backend.health() and await backend.concurrency() == 32
    with pytest.raises(ModelNotFound):
        await backend.show("llama3")


async def test_the_window_shown_is_what_the_kv_memory_holds(model_dir):
    """Continue sizes its history by /api/show's num_ctx and the fit stage trims to the listed window: a KV memory
    smaller than the model's 512 tokens is the window both must see, or the engine refuses what they send."""
    b = EngineBackend(BackendConfig(name="engine", kind="engine", options=engine_options(model_dir, kv_memory=2**15)))
    try:
        info = await b.show(NAME)
        assert info.context_length == b.engine.max_context < 512
        assert f"num_ctx {info.context_length}" in " ".join(info.parameters.split())
    finally:
        await b.close()


async def test_chat_streams_until_length_with_usage(backend):
    chunks = await collect(backend.chat(chat(max_tokens=12, temperature=0)))
    assert len(chunks) > 1 and all(c.finish_reason is None for c in chunks[:-1])
    last = aggregate(chunks)
    assert last.finish_reason == "length" and last.usage.completion_tokens == 12
    assert last.usage.prompt_tokens > 10 and last.usage.prompt_eval_ns > 0 and last.usage.eval_ns > 0


async def test_usage_counts_the_prompt_tokens_the_prefix_cache_served(backend):
    question = chat("Tell me about the sea and the sky and the stars above them", max_tokens=2, temperature=0)
    first = aggregate(await collect(backend.chat(question)))
    again = aggregate(await collect(backend.chat(question)))
    assert first.usage.cached_tokens == 0 < again.usage.cached_tokens < again.usage.prompt_tokens
    assert again.usage.cached_tokens % 4 == 0  # whole blocks of the radix cache


async def test_a_prompt_reuses_cached_prefixes_of_its_own_scope_only(backend):
    """Another key's cached prefix showed in `cached_tokens` (and in how soon the answer came): a key could probe
    what another had sent."""
    question = chat("What did the memo say about the Globex deal and its price?", max_tokens=2, temperature=0)
    alice, bob = (dataclasses.replace(question, prefix_scope=k) for k in ("alice", "bob"))
    assert aggregate(await collect(backend.chat(alice))).usage.cached_tokens == 0
    assert aggregate(await collect(backend.chat(bob))).usage.cached_tokens == 0
    assert aggregate(await collect(backend.chat(alice))).usage.cached_tokens > 0
    raw = CompletionRequest(model=NAME, prompt="The memo said the Globex price was", raw=True,
                            options=SamplingOptions(max_tokens=1), prefix_scope="alice")
    assert aggregate(await collect(backend.complete(raw))).usage.cached_tokens == 0
    assert aggregate(await collect(backend.complete(dataclasses.replace(raw, prefix_scope="bob")))).usage \
        .cached_tokens == 0
    assert aggregate(await collect(backend.complete(raw))).usage.cached_tokens > 0


async def test_logprobs_describe_the_chosen_tokens(backend):
    chunks = await collect(backend.chat(chat(max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)))
    logprobs = [lp for c in chunks for lp in c.logprobs]
    assert len(logprobs) == 6
    for lp in logprobs:
        best = lp.top[0]
        assert len(lp.top) == 3 and (best.token, best.logprob) == (lp.token, lp.logprob)  # greedy: the chosen is best
        assert 0 >= lp.top[0].logprob >= lp.top[1].logprob >= lp.top[2].logprob


async def test_logprobs_give_the_bytes_of_a_token_that_is_part_of_a_character(backend):
    """Each byte above 0x7f is a token of its own in the tiny model's vocabulary and decodes alone to U+FFFD; its
    `bytes` must be that byte, or a client cannot rebuild the character (all of them were EF BF BD)."""
    chunks = await collect(backend.chat(chat(max_tokens=6, temperature=0, logprobs=True, top_logprobs=20)))
    alternatives = [t for c in chunks for lp in c.logprobs for t in lp.top]
    split = [t for t in alternatives if t.token == "\ufffd"]
    assert split and all(len(t.utf8) == 1 and t.utf8[0] >= 0x80 for t in split)
    for lp in (lp for c in chunks for lp in c.logprobs):
        assert len({bytes(t.utf8) for t in lp.top}) == len(lp.top)  # twenty different tokens, twenty byte strings


async def test_logprobs_describe_only_the_answers_tokens(backend):
    """Not those of text a stop string cut, nor the end-of-sequence token (it shows no text): their text is not in
    the answer, and clients joined the tokens into more than it said (as Ollama's runner truncates them)."""
    full = aggregate(await collect(backend.chat(chat(max_tokens=30, temperature=0, logprobs=True))))
    stop = full.text[12:14]
    cut = aggregate(await collect(backend.chat(chat(max_tokens=30, temperature=0, logprobs=True, stop=[stop]))))
    tokens = [lp.token for lp in cut.logprobs]
    assert cut.text == full.text[:full.text.index(stop)] and cut.finish_reason == "stop"
    assert "".join(tokens).startswith(cut.text) and len("".join(tokens[:-1])) < len(cut.text)
    assert len(cut.logprobs) < len(full.logprobs)
    eos = backend.engine.tokenizer.eos_token_ids[0]
    ended = aggregate(await collect(backend.chat(chat(max_tokens=5, logprobs=True, logit_bias={eos: 100.0}))))
    assert (ended.text, ended.finish_reason, ended.logprobs) == ("", "stop", [])


async def test_generates_context_is_the_prompt_then_the_answers_ids(backend):
    """As Ollama makes it: the end-of-sequence id and the tokens of text a stop string cut were in it, and came
    back as prompt in the next turn."""
    def complete(**options) -> CompletionRequest:
        return CompletionRequest(model=NAME, prompt="Once upon", context=[], options=SamplingOptions(**options))
    full = aggregate(await collect(backend.complete(complete(max_tokens=30, temperature=0))))
    cut = aggregate(await collect(backend.complete(complete(max_tokens=30, temperature=0, stop=[full.text[12:14]]))))
    tokenizer, prompt = backend.engine.tokenizer, full.usage.prompt_tokens
    assert cut.context[prompt:] == tokenizer.encode(cut.text, add_special_tokens=False)
    assert cut.context[:prompt] == full.context[:prompt] and len(cut.context) < len(full.context)
    eos = tokenizer.eos_token_ids[0]
    ended = aggregate(await collect(backend.complete(complete(max_tokens=5, logit_bias={eos: 100.0}))))
    assert ended.text == "" and ended.context == full.context[:prompt]


async def test_a_generates_context_is_counted_as_it_is_evaluated(backend):
    """The fit stage's count of an Ollama /api/generate: its `context` ids go before the prompt, and were left out
    of the count (a long context judged as fitting, then this adapter's 400). Byte tokens as the earlier exchange:
    the tiny model's answer may hold ids past its tokenizer's (its table has 5 more rows), which a context refuses."""
    earlier = list(range(65, 101))
    req = CompletionRequest(model=NAME, prompt="a time", context=earlier, options=SamplingOptions(max_tokens=1))
    answer = aggregate(await collect(backend.complete(req)))
    assert answer.usage.prompt_tokens == await backend.count_tokens(req) > len(earlier)


@pytest.mark.parametrize("suffix", [None, "end"])
async def test_a_generate_with_its_own_go_template_is_counted_as_that_template_renders_it(backend, suffix):
    """Ollama's per-request `template` is what `_templated` renders and evaluates, a `suffix` too; the count rendered
    the model's chat template instead (or, with a suffix, its fill-in-the-middle prompt, without the context)."""
    req = CompletionRequest(model=NAME, prompt="a time", system="be brief", suffix=suffix, context=list(range(65, 70)),
                            template="{{ .System }}|{{ .Prompt }}|{{ .Suffix }}", options=SamplingOptions(max_tokens=1))
    answer = aggregate(await collect(backend.complete(req)))
    assert answer.usage.prompt_tokens == await backend.count_tokens(req)


async def test_a_think_block_is_split_off_unless_the_request_keeps_it(backend, monkeypatch):
    """Ollama's `think: false` leaves the block in the text (server/routes.go makes its thinking parser only when
    think is on); it was split off into thinking whatever the request said."""
    async def thinks(ids, params, scope):
        for i, text in enumerate(["<think>", "Hmm.</think>", "\n\nHi"]):
            yield RequestOutput(0, text, [i + 1], finished=i == 2, finish_reason="stop" if i == 2 else None)
    monkeypatch.setattr(backend, "capabilities", [*backend.capabilities, "thinking"])
    monkeypatch.setattr(backend.engine, "generate", thinks)
    for answer, req in ((backend.chat, chat()), (backend.complete, CompletionRequest(model=NAME, prompt="x"))):
        split = aggregate(await collect(answer(req)))
        kept = aggregate(await collect(answer(dataclasses.replace(req, splits_thinking=False))))
        assert (split.thinking, split.text) == ("Hmm.", "Hi")
        assert (kept.thinking, kept.text) == ("", "<think>Hmm.</think>\n\nHi")


async def test_seed_reproduces_and_differs_across_seeds(backend):
    texts = [aggregate(await collect(backend.chat(chat(max_tokens=16, temperature=1.0, seed=s)))).text
             for s in (1, 1, 2, 3)]
    assert texts[0] == texts[1] and len(set(texts[1:])) > 1


async def test_stop_string_ends_the_text_before_it(backend):
    full = aggregate(await collect(backend.chat(chat(max_tokens=30, temperature=0)))).text
    stop = full[8:10]
    cut = aggregate(await collect(backend.chat(chat(max_tokens=30, temperature=0, stop=["never seen", stop]))))
    assert cut.text == full[:full.index(stop)] and cut.finish_reason == "stop"
    assert cut.stop_sequence == stop  # which stop string it was (Anthropic's stop_sequence)
    assert aggregate(await collect(backend.chat(chat(max_tokens=5, temperature=0)))).stop_sequence is None


async def test_chunks_are_whole_utf8_characters(backend):
    # byte-level tokens: a random model emits bytes that do not always form characters
    chunks = await collect(backend.chat(chat("ünïcödé ✓ 日本", max_tokens=80, temperature=1.0, seed=5)))
    joined = "".join(c.text for c in chunks)
    for c in chunks[:-1]:
        assert "\ufffd" not in c.text or "\ufffd" in joined
        c.text.encode("utf-8")


async def test_closing_the_stream_cancels_the_engine_request(backend):
    async def running_becomes(n: int) -> bool:
        deadline = time.monotonic() + 5  # metrics are a snapshot taken after each step
        while backend.engine.metrics()["running"] != n and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        return backend.engine.metrics()["running"] == n
    stream = backend.chat(chat(max_tokens=400, temperature=0))
    await stream.__anext__()
    assert await running_becomes(1)
    await stream.aclose()
    assert await running_becomes(0) and backend.engine.metrics()["kv_usage"] == 0.0
    assert backend.engine.metrics()["generated_tokens"] < 400


async def test_generation_does_not_block_the_event_loop(backend):
    _, gaps = await loop_gaps(asyncio.gather(*(collect(backend.chat(chat(str(i), max_tokens=40, temperature=0)))
                                               for i in range(4))))
    assert len(gaps) > 5 and max(gaps) < 0.25


def _slowed(monkeypatch, seconds: float) -> None:
    """The work a generation does before the engine takes it, made slow: the prompt's rendering, and the first
    constrained request's view of the tokenizer (~0.3 s for a real vocabulary)."""
    import adapters.engine as adapter
    import engine.engine as engine_loop
    render = adapter.chat_template.render

    class SlowConstrainer(engine_loop.Constrainer):
        def __init__(self, *args) -> None:
            time.sleep(seconds)
            super().__init__(*args)
    monkeypatch.setattr(adapter.chat_template, "render", lambda *a: (time.sleep(seconds), render(*a))[1])
    monkeypatch.setattr(engine_loop, "Constrainer", SlowConstrainer)


async def test_a_prompt_is_rendered_and_its_grammar_built_off_the_event_loop(backend, monkeypatch):
    """A 30k-token chat took 48 ms to render and tokenize, and the first constrained request 0.3 s to build
    llguidance's view of the tokenizer: on the event loop, every other request waited."""
    _slowed(monkeypatch, 0.3)
    stream, gaps = await loop_gaps(collect(backend.chat(ChatRequest(model=NAME, messages=[Message("user", "x")],
                                                                    format="json", options=SamplingOptions(seed=1)))))
    answer = aggregate(stream)
    assert answer.finish_reason in ("stop", "length") and max(gaps) < 0.2


async def test_a_schema_is_compiled_off_the_event_loop(backend, monkeypatch):
    """A 300 KB format (3,000 properties) took llguidance 86 ms to compile, on the event loop before the fix,
    after the proxy's own check had compiled it off the loop: every other request waited."""
    import adapters.engine as adapter
    compile_ = adapter.grammar_for
    monkeypatch.setattr(adapter, "grammar_for", lambda *a: (time.sleep(0.3), compile_(*a))[1])
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    stream, gaps = await loop_gaps(collect(backend.chat(ChatRequest(model=NAME, messages=[Message("user", "x")],
                                                                    format=schema, options=SamplingOptions(seed=1)))))
    assert aggregate(stream).finish_reason in ("stop", "length") and max(gaps) < 0.2


async def test_a_request_that_leaves_while_its_grammar_is_built_is_aborted(backend, monkeypatch):
    _slowed(monkeypatch, 0.3)
    long = {"type": "object", "required": ["s"], "properties": {"s": {"type": "string", "minLength": 300}}}
    before = backend.engine.metrics()["generated_tokens"]
    task = asyncio.create_task(collect(backend.chat(ChatRequest(
        model=NAME, messages=[Message("user", "x")], format=long, options=SamplingOptions(seed=1, max_tokens=400)))))
    await asyncio.sleep(0.45)  # rendered; the grammar is being built
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(0.5)  # built and added by now, then aborted: a step or two at most
    metrics = backend.engine.metrics()
    assert metrics["running"] == 0 and metrics["generated_tokens"] - before < 20


async def test_an_empty_prompt_starts_a_new_document(backend):
    """OpenAI's completions take an empty prompt ("as if from the beginning of a new document"); it was a
    context_length_exceeded of 0 tokens."""
    out = aggregate(await collect(backend.complete(CompletionRequest(
        model=NAME, prompt="", raw=True, options=SamplingOptions(max_tokens=3, temperature=0)))))
    assert out.usage.prompt_tokens == len(backend.engine.tokenizer.start_ids) == 1
    assert out.usage.completion_tokens == 3


async def test_a_prompt_of_token_ids_is_read_as_it_is(backend):
    """OpenAI's completions take the prompt as token ids (lm-eval sends them): the engine reads them with no BOS of
    its own, so they answer as the text they came from; ids the model does not have are the client's 400."""
    greedy = SamplingOptions(max_tokens=5, temperature=0)
    ids = backend.engine.tokenizer.encode("abc def")
    text = aggregate(await collect(backend.complete(CompletionRequest(NAME, "abc def", raw=True, options=greedy))))
    given = aggregate(await collect(backend.complete(CompletionRequest(NAME, "", prompt_ids=ids, raw=True,
                                                                       options=greedy))))
    assert (given.text, given.usage.prompt_tokens) == (text.text, text.usage.prompt_tokens) == (text.text, len(ids))
    with pytest.raises(BadRequest, match="token ids this model does not have") as e:
        await collect(backend.complete(CompletionRequest(NAME, "", prompt_ids=[1, backend.engine.tokenizer.vocab_size],
                                                         raw=True)))
    assert e.value.param == "prompt"


async def test_token_ids_past_the_models_embedding_are_the_clients_400(tmp_path):
    """A tokenizer may name more tokens than the model has rows (added tokens the model was never resized for): ids
    between the two passed the check against the tokenizer and indexed past the embedding table, a 502 ("index out
    of range in self") on a CPU, and on a GPU a device-side assert that ends the engine."""
    model = write_tiny_model(str(tmp_path), "qwen2", vocab_size=byte_tokenizer().get_vocab_size() - 3)
    b = EngineBackend(BackendConfig(name="engine", kind="engine", options=engine_options(model)))
    await b.start()
    try:
        past = b.engine.runner.model.cfg.vocab_size
        with pytest.raises(BadRequest, match="token ids this model does not have"):
            await collect(b.complete(CompletionRequest(NAME, "", prompt_ids=[65, past], raw=True)))
        with pytest.raises(BadRequest, match="token ids this model does not have"):
            await b.embed(EmbedRequest(model=NAME, inputs=[[65, past]]))
        out = aggregate(await collect(b.complete(CompletionRequest(NAME, "", prompt_ids=[65, past - 1], raw=True,
                                                                   options=SamplingOptions(max_tokens=2)))))
        assert out.usage.prompt_tokens == 2
    finally:
        await b.close()


async def test_raw_completion_and_unsupported_requests(backend):
    raw = aggregate(await collect(backend.complete(CompletionRequest(
        model=NAME, prompt="abc", raw=True, options=SamplingOptions(max_tokens=5, temperature=0)))))
    assert raw.usage.prompt_tokens == 3 and raw.usage.completion_tokens == 5
    with pytest.raises(ModelLacks, match='"tiny" does not support insert'):  # no FIM markers in its vocabulary
        await collect(backend.complete(CompletionRequest(model=NAME, prompt="a", suffix="b")))
    assert "insert" not in (await backend.show(NAME)).capabilities
    with pytest.raises(BadRequest):
        await collect(backend.chat(chat("x" * 600)))
    with pytest.raises(BadRequest, match="invalid output grammar") as bad:
        await collect(backend.chat(ChatRequest(model=NAME, messages=[Message("user", "x")], format={"type": 5})))
    assert bad.value.param == "format"
    with pytest.raises(BadRequest, match="invalid output grammar") as bad:  # the tool's schema is what is wrong
        broken = Tool("f", "", {"type": "object", "properties": {"a": {"type": 5}}})
        await collect(backend.chat(ChatRequest(model=NAME, messages=[Message("user", "x")], tool_choice="required",
                                               tools=[broken])))
    assert bad.value.param == "tools"
    for fmt in ("json", {"type": "object"}):  # with a format that compiles it was the format's 400
        with pytest.raises(BadRequest, match="invalid output grammar") as bad:
            await collect(backend.chat(ChatRequest(model=NAME, messages=[Message("user", "x")], format=fmt,
                                                   tools=[broken])))
        assert bad.value.param == "tools"


async def test_a_suffix_asks_a_fim_model_for_the_middle(tmp_path):
    """Qwen2.5-Coder's markers: the prompt is prefix-suffix-middle, generation ends at <|endoftext|> (not its EOS)
    as well, and the model reports `insert`."""
    path = write_tiny_model(str(tmp_path), "qwen2", added=("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    b = EngineBackend(BackendConfig(name="engine", kind="engine", options={"model": path, "name": NAME,
                                                                           "progress": False, "kv_memory": 2**20}))
    await b.start()
    try:
        assert "insert" in (await b.show(NAME)).capabilities
        sent = []
        generate = b.engine.generate
        b.engine.generate = lambda ids, params, scope: sent.append((ids, params)) or generate(ids, params, scope)
        req = CompletionRequest(model=NAME, prompt="ab", suffix="cd", options=SamplingOptions(max_tokens=4,
                                                                                             temperature=0))
        answer = aggregate(await collect(b.complete(req)))
        tk = b.engine.tokenizer
        [(ids, params)] = sent
        assert ids == tk.encode("<|fim_prefix|>ab<|fim_suffix|>cd<|fim_middle|>") and len(ids) == 7
        assert answer.usage.prompt_tokens == 7 == await b.count_tokens(req)
        assert {tk.tk.token_to_id("<|im_end|>"), tk.tk.token_to_id(FIM_ENDS[0])} <= set(params.stop_token_ids)
        empty = aggregate(await collect(b.complete(dataclasses.replace(req, suffix=""))))  # Ollama: no suffix
        assert empty.usage.prompt_tokens > 7  # through the chat template
    finally:
        await b.close()


@pytest.mark.parametrize("markers", FIM_MARKERS,
                         ids=["qwen", "starcoder", "santacoder", "deepseek", "codellama", "pre", "glm"])
async def test_a_fim_models_template_fills_the_middle_as_its_prompt_is_built(tmp_path, markers):
    """/api/show's `insert` and its template's `.Suffix` branch (what Ollama clients decide FIM by) come from the
    markers the prompt is built from: a DeepSeek-Coder, CodeLlama or GLM model said `insert` with no `.Suffix`."""
    path = write_tiny_model(str(tmp_path), "qwen2", added=tuple(markers))
    b = EngineBackend(BackendConfig(name="engine", kind="engine", options={"model": path, "name": NAME,
                                                                           "progress": False, "kv_memory": 2**20}))
    await b.start()
    try:
        shown, fim = await b.show(NAME), b.engine.tokenizer.fim_tokens
        assert "insert" in shown.capabilities and tuple(markers) == (fim.prefix, fim.suffix, fim.middle)
        assert go_template.render(shown.template, "ab", suffix="cd") == fim.prompt("ab", "cd")
    finally:
        await b.close()


async def test_format_and_forced_tool_calls_are_constrained(backend):
    schema = {"type": "object", "required": ["ok"], "additionalProperties": False,
              "properties": {"ok": {"type": "boolean"}}}
    answer = aggregate(await collect(backend.chat(ChatRequest(model=NAME, messages=[Message("user", "x")],
                                                              format=schema, options=SamplingOptions(seed=1)))))
    assert json.loads(answer.text)["ok"] in (True, False)
    tool = Tool("pick", parameters={"type": "object", "required": ["n"], "additionalProperties": False,
                                    "properties": {"n": {"enum": [1, 2, 3]}}})
    call = aggregate(await collect(backend.chat(ChatRequest(model=NAME, messages=[Message("user", "x")], tools=[tool],
                                                            tool_choice="required", options=SamplingOptions(seed=2)))))
    assert json.loads(call.text) in [{"name": "pick", "arguments": {"n": n}} for n in (1, 2, 3)]


async def test_embeddings_are_normalised_and_per_text(backend):
    one = await backend.embed(EmbedRequest(model=NAME, inputs=["hello"]))
    two = await backend.embed(EmbedRequest(model=NAME, inputs=["hello", "something else"]))
    assert len(two.embeddings) == 2 and len(two.embeddings[0]) == 64
    assert two.embeddings[0] == pytest.approx(one.embeddings[0], abs=1e-5)
    assert sum(x * x for x in two.embeddings[1]) == pytest.approx(1.0, abs=1e-4)
    assert two.embeddings[0] != pytest.approx(two.embeddings[1], abs=1e-3)


async def test_token_ids_embed_as_their_text_does(backend):
    """OpenAI's token input: the engine embeds the ids as they are (its tokenizer gave them for the text); ids the
    model does not have are the client's 400, not an index past the embedding table."""
    ids = backend.engine.tokenizer.encode("hello there")
    text = await backend.embed(EmbedRequest(model=NAME, inputs=["hello there"]))
    given = await backend.embed(EmbedRequest(model=NAME, inputs=[ids, ids[:1]]))
    assert given.embeddings[0] == pytest.approx(text.embeddings[0], abs=1e-5)
    assert given.input_tokens == [len(ids), 1] and given.prompt_tokens == len(ids) + 1
    with pytest.raises(BadRequest, match="token ids this model does not have") as e:
        await backend.embed(EmbedRequest(model=NAME, inputs=[[1, backend.engine.tokenizer.vocab_size]]))
    assert e.value.param == "input"


async def test_an_input_longer_than_the_context_is_cut_unless_truncate_is_false(backend):
    """Ollama's /api/embed: `truncate` (default true) cuts each input to the context; false is its 400."""
    long = "word " * 600  # the tiny model's context is 512 tokens
    cut = await backend.embed(EmbedRequest(model=NAME, inputs=[long, "hello"]))
    assert len(cut.embeddings) == 2 and cut.prompt_tokens <= 512 + len(backend.engine.tokenizer.encode("hello"))
    with pytest.raises(BadRequest, match="the input length exceeds the context length"):
        await backend.embed(EmbedRequest(model=NAME, inputs=["hello", long], truncate=False))


async def test_num_ctx_narrows_what_is_embedded(backend):
    """As Ollama's /api/embed: the inputs are cut to a `num_ctx` smaller than the context (before, it was ignored),
    and with `truncate: false` a longer one is its 400."""
    text = "one two three four five six seven eight nine ten eleven twelve"
    assert len(backend.engine.tokenizer.encode(text)) > 8
    whole = await backend.embed(EmbedRequest(model=NAME, inputs=[text]))
    cut = await backend.embed(EmbedRequest(model=NAME, inputs=[text], options={"num_ctx": 8}))
    assert cut.prompt_tokens == 8 < whole.prompt_tokens and cut.embeddings != whole.embeddings
    with pytest.raises(BadRequest, match="the input length exceeds the context length"):
        await backend.embed(EmbedRequest(model=NAME, inputs=[text], options={"num_ctx": 8}, truncate=False))


@pytest.mark.parametrize("given, read", [
    ({"temperature": -1.0}, {"temperature": 0.0}),
    ({"top_p": 1.0001}, {"top_p": 1.0}),
    ({"top_p": 0.0, "temperature": 0.7}, {"temperature": 0.0, "top_p": 1.0}),
    ({"min_p": 2.0, "temperature": 0.7}, {"temperature": 0.0, "min_p": 0.0}),
    ({"min_p": -0.5, "temperature": 0.7}, {"temperature": 0.7, "min_p": 0.0}),
    ({"top_p": 0.5, "min_p": 0.1, "temperature": 0.7}, {"temperature": 0.7, "top_p": 0.5, "min_p": 0.1}),
    ({"repeat_penalty": 0.0}, {"repetition_penalty": 1.0}),
    ({"repeat_penalty": -1.5}, {"repetition_penalty": 1.0}),
    ({"repeat_penalty": 0.5}, {"repetition_penalty": 0.5}),
])
def test_knobs_out_of_range_are_read_as_llama_cpp_reads_them(given, read):
    """Ollama passes any value to llama.cpp's sampler and its dialect does too; before, the engine answered a 400
    that dumped its whole SamplingParams."""
    params = sampling_params(SamplingOptions(**given), 4096)
    assert {k: getattr(params, k) for k in read} == read


async def test_a_load_whose_request_left_is_kept_not_loaded_again(model_dir, monkeypatch):
    """Continue drops an autocomplete request on each keystroke: one dropped while the model loads must not lose
    the model its thread goes on loading (the next request loaded a second copy, the first held in memory)."""
    gate, loads, real = threading.Event(), [], LLMEngine.from_pretrained

    def held_load(*args, **kwargs):
        loads.append(1)
        gate.wait(30)
        return real(*args, **kwargs)
    monkeypatch.setattr(LLMEngine, "from_pretrained", held_load)
    b = EngineBackend(BackendConfig(name="engine", kind="engine", options=engine_options(model_dir)))
    left = asyncio.ensure_future(b.load(NAME, None))
    while not loads:
        await asyncio.sleep(0.01)
    left.cancel()  # the client went away while its model loads
    gate.set()
    try:
        await b.load(NAME, None)
        assert len(loads) == 1 and b.engine is not None and [m.name for m in await b.running()] == [NAME]
    finally:
        await b.close()



async def test_a_close_while_the_model_loads_waits_for_nothing_and_shuts_that_engine_down(model_dir, monkeypatch):
    """A shutdown during a load waited for all of it (its thread cannot be stopped; `velo serve` exits without
    it); the engine the load makes after the close is shut down, not kept running on a closed backend."""
    gate, made, real = threading.Event(), [], LLMEngine.from_pretrained

    def held_load(*args, **kwargs):
        gate.wait(30)
        made.append(real(*args, **kwargs))
        return made[-1]
    monkeypatch.setattr(LLMEngine, "from_pretrained", held_load)
    b = EngineBackend(BackendConfig(name="engine", kind="engine", options={"model": model_dir, "name": NAME,
                                                                         "progress": False}))
    asking = asyncio.ensure_future(b.load(NAME, None))
    await asyncio.sleep(0.1)
    assert b.loading
    await asyncio.wait_for(b.close(), 1)
    gate.set()
    with pytest.raises(BackendError, match="closed while its model loaded"):
        await asking
    assert b.engine is None and not b.loading and not made[0]._thread.is_alive()

def test_unknown_option_is_named():
    with pytest.raises(BadRequest, match="kv_memroy"):
        EngineBackend(BackendConfig(name="e", kind="engine", options={"kv_memroy": 1}))


@pytest.mark.slow
async def test_default_backend_serves_the_shipped_model():
    b = EngineBackend(BackendConfig(name="engine", kind="engine", options={"progress": False}))
    try:
        [info] = await b.list_models()
        assert (info.name, info.family, info.format) == (DEFAULT_NAME, "llama", "gguf")
        req = ChatRequest(model=DEFAULT_NAME, messages=[Message("user", "What is 2+2?")],
                          options=SamplingOptions(max_tokens=200, temperature=0))
        answer = aggregate(await collect(b.chat(req)))
        assert answer.finish_reason == "stop" and answer.text.strip()  # ended on <|im_end|>, said something
        assert "<|im_end|>" not in answer.text
    finally:
        await b.close()



async def test_the_engine_answers_under_the_timeouts_every_backend_has(model_dir):
    """total_timeout, idle_timeout and first_token_timeout were read by the HTTP backends only: an engine answer ran
    to its end past total_timeout, and a stalled engine held the request for ever. A prompt read in chunks reports
    its progress, each report a new wait for the first token, as llama-server's do."""
    def engine(**timeouts: float) -> EngineBackend:
        return EngineBackend(BackendConfig(name="engine", kind="engine", **timeouts, options={
            "model": model_dir, "name": NAME, "progress": False, "kv_memory": 8 * 2**20}))

    b = engine(total_timeout=0.3, first_token_timeout=30, idle_timeout=30)
    await b.start()
    try:
        eos = b.engine.tokenizer.eos_token_ids[0]
        started = time.monotonic()
        with pytest.raises(BackendTimeout, match="did not finish within 0.3s"):
            await collect(b.chat(chat(max_tokens=400, logit_bias={eos: -100.0})))
        assert time.monotonic() - started < 3
    finally:
        await b.close()
    b = engine(total_timeout=30, first_token_timeout=0.2, idle_timeout=0.2)
    await b.start()
    try:
        real = b.engine.generate

        def paced(before: list[float], after: float):
            """The real outputs, after progress reports `before` seconds apart, then `after` seconds apart."""
            async def generate(ids, params, scope):
                for pause in before:
                    await asyncio.sleep(pause)
                    yield RequestOutput(0, "", [])
                async for out in real(ids, params, scope):
                    yield out
                    await asyncio.sleep(after)
            return generate
        b.engine.generate = paced([0.5], 0)
        with pytest.raises(BackendTimeout, match="sent no first token within 0.2s"):
            await collect(b.chat(chat(max_tokens=5)))
        b.engine.generate = paced([], 0.5)
        with pytest.raises(BackendTimeout, match="sent no token for 0.2s"):
            await collect(b.chat(chat(max_tokens=5)))
        b.engine.generate = real
        for _ in range(100):  # each timed-out request was aborted, its KV memory given back
            if not b.engine.scheduler.running and not b.engine.scheduler.waiting:
                break
            await asyncio.sleep(0.05)
        assert not b.engine.scheduler.running and not b.engine.scheduler.waiting
    finally:
        await b.close()
    b = engine(total_timeout=30, first_token_timeout=1.0, idle_timeout=30)  # room for a loaded machine's first token
    await b.start()
    try:
        real = b.engine.generate

        async def progressing(ids, params, scope):
            for _ in range(3):  # 1.5 s of progress: each report a new 1-s wait for the first token
                await asyncio.sleep(0.5)
                yield RequestOutput(0, "", [])
            async for out in real(ids, params, scope):
                yield out
        b.engine.generate = progressing
        assert aggregate(await collect(b.chat(chat(max_tokens=5, temperature=0)))).usage.completion_tokens == 5
    finally:
        await b.close()


async def test_a_request_preempted_for_kv_memory_waits_under_the_first_token_timeout(model_dir):
    """Two answers in a KV pool that holds 1.2 of them: the newer is preempted and waits for the other to finish.
    It was held to idle_timeout meanwhile, as if the engine had stalled: a 504 "sent no token for 0.5s" after 281
    of its tokens, while the engine ran the other answer (the same on a CPU with the default 60 s and answers that
    take minutes)."""
    def engine(kv_memory: int) -> EngineBackend:
        return EngineBackend(BackendConfig(name="engine", kind="engine", first_token_timeout=60, idle_timeout=0.3,
                                           options=engine_options(model_dir, kv_memory=kv_memory, dtype="float32")))
    probe = engine(8 * 2**20)
    await probe.start()
    slot = probe.engine.runner.kv[:, :, 0].numel() * probe.engine.runner.kv.element_size()
    await probe.close()
    b = engine(slot * 4 * 150)  # 600 tokens
    await b.start()
    execute = b.engine.runner.execute

    def paced(*args, **kw):  # a step of 5 ms or more: the other answer's last ~200 steps take over a second
        time.sleep(0.005)
        return execute(*args, **kw)
    b.engine.runner.execute = paced
    try:
        eos = b.engine.tokenizer.eos_token_ids[0]
        answers = await asyncio.gather(*(collect(b.chat(chat(f"hi {i}", max_tokens=480, temperature=0,
                                                                  logit_bias={eos: -100.0}))) for i in range(2)))
        assert [aggregate(a).usage.completion_tokens for a in answers] == [480, 480]
        assert b.engine.metrics()["preemptions"] > 0
    finally:
        await b.close()


async def test_unloading_the_model_gives_its_memory_back_once_the_engine_is_gone(model_dir, monkeypatch):
    """keep_alive and config reloads unload and load the model again: glibc kept what each copy freed, ~300 MB more
    resident after each cycle of SmolLM2 (696 -> 1,051 -> 1,363 MB); engine/heap.py gives it back, which only works
    once nothing holds the engine."""
    import weakref
    b = EngineBackend(BackendConfig(name="engine", kind="engine", options=engine_options(model_dir)))
    await b.start()
    engine, given_back = weakref.ref(b.engine), []
    monkeypatch.setattr("adapters.engine.heap.give_back", lambda: given_back.append(engine() is None))
    await b.close()
    assert given_back == [True]


async def test_an_embedding_whose_client_left_stops_and_lets_generations_run(backend, monkeypatch):
    """The inputs went to the engine thread as one call, which ran to its end whatever happened: 40 inputs held it
    46 s after their client had gone, and every generation waited. Each input also says its own token count."""
    from engine import LLMEngine
    real, done = LLMEngine._embed, []

    def slow(self, texts, normalize, window):
        time.sleep(0.05)  # on the engine thread: a larger model's input
        done.extend(texts)
        return real(self, texts, normalize, window)
    monkeypatch.setattr(LLMEngine, "_embed", slow)
    counted = await backend.embed(EmbedRequest(model=NAME, inputs=["hello", "something else"]))
    assert counted.input_tokens == [len(backend.engine.tokenizer.encode(t)) for t in ("hello", "something else")]
    done.clear()
    embedding = asyncio.create_task(backend.embed(EmbedRequest(model=NAME, inputs=[f"text {i}" for i in range(40)])))
    await asyncio.sleep(0.3)
    embedding.cancel()
    await asyncio.gather(embedding, return_exceptions=True)
    answer = await asyncio.wait_for(collect(backend.chat(chat(max_tokens=2, temperature=0))), 5)
    assert answer and len(done) < 20


@pytest.mark.parametrize("max_tokens", [None, -1, 1000])
async def test_an_answer_ends_where_prompt_and_answer_fill_num_ctx(backend, max_tokens):
    """As Ollama's runner: the answer ends at num_ctx tokens in all, done_reason "length", whatever max_tokens asks
    past it. The engine went on to its own context (SmolLM2, num_ctx 512: 431 prompt tokens + 105 answered)."""
    req = chat(temperature=0, ignore_eos=True, num_ctx=96, max_tokens=max_tokens)
    last = aggregate(await collect(backend.chat(req)))
    assert last.finish_reason == "length" and 0 < last.usage.completion_tokens
    assert last.usage.prompt_tokens + last.usage.completion_tokens == 96
