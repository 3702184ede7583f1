"""The plain-Python parts: request keys, bypass signals and policy, the byte-bounded LRU, the chunk codec."""
from __future__ import annotations

from adapters.protocol import (ChatRequest, Chunk, CompletionRequest, Message, SamplingOptions, TokenLogprob,
                               Tool, ToolCall, Usage)
from proxy.cache.codec import decode_chunks, encode_chunks
from proxy.cache.keys import digest, exact_key, semantic_query
from proxy.cache.memory import MemoryLRU
from proxy.cache.policy import Policy, RoutePolicy, bypass_requested, complete_stream
from proxy.dialects import ollama, openai


def _chat(text: str = "hi", **opts) -> ChatRequest:
    return ChatRequest("tiny", [Message("system", "be brief"), Message("user", text)],
                       options=SamplingOptions(**opts))


def test_same_request_in_both_dialects_has_one_key():
    via_ollama = ollama.parse_chat({"model": "tiny", "stream": True, "keep_alive": "5m",
                                    "messages": [{"role": "user", "content": "hi"}],
                                    "options": {"temperature": 0, "num_predict": 8, "num_thread": 4}})
    via_openai = openai.parse_chat({"model": "tiny", "stream": False, "temperature": 0.0, "max_tokens": 8,
                                    "messages": [{"role": "user", "content": "hi"}]})
    assert exact_key(via_ollama, "t") == exact_key(via_openai, "t")


def test_key_changes_with_anything_that_changes_the_answer():
    base = exact_key(_chat(temperature=0), "t")
    assert exact_key(_chat(temperature=0), "other-tenant") != base
    assert exact_key(_chat("hello", temperature=0), "t") != base
    assert exact_key(_chat(temperature=0, max_tokens=5), "t") != base
    assert exact_key(_chat(temperature=0, extra={"mirostat": 1}), "t") != base
    assert exact_key(CompletionRequest("tiny", "hi", options=SamplingOptions(temperature=0)), "t") != base


def test_semantic_query_embeds_last_user_turn_and_keeps_the_rest_exact():
    text, ctx = semantic_query(_chat("how do I sort a list?"))
    assert text == "how do I sort a list?"
    other_history = ChatRequest("tiny", [Message("system", "be verbose"), Message("user", "how do I sort a list?")])
    assert semantic_query(other_history)[1] != ctx
    assert semantic_query(ChatRequest("tiny", [Message("user", "x", images=["aGk="])])) is None
    assert semantic_query(ChatRequest("tiny", [Message("user", "q"), Message("tool", "42")])) is None
    assert semantic_query(CompletionRequest("tiny", "def f(", suffix="pass")) is None


def test_bypass_signals():
    assert bypass_requested({"Cache-Control": "no-cache"}, {})
    assert bypass_requested({"cache-control": "max-age=0, no-store"}, {})
    assert bypass_requested({"Pragma": "no-cache"}, {})
    assert bypass_requested({"X-Velo-Cache": "off"}, {})
    assert bypass_requested({}, {"cache": False})
    assert bypass_requested({}, {"options": {"cache": False}})
    assert not bypass_requested({"Cache-Control": "max-age=60", "X-Velo-Cache": "on"}, {"cache": True})


def test_only_whole_successful_streams_are_complete():
    assert complete_stream([Chunk("a"), Chunk("b", finish_reason="stop")], None)
    assert complete_stream([Chunk(finish_reason="length", usage=Usage(completion_tokens=8))], 8)  # the request's cut
    assert not complete_stream([], 8)
    assert not complete_stream([Chunk("a")], 8)  # cut off: no finish reason
    assert not complete_stream([Chunk("a"), Chunk(finish_reason="error")], 8)
    assert not complete_stream([Chunk("a"), Chunk(finish_reason="cancelled")], 8)


def test_an_answer_the_context_window_cut_is_not_complete():
    """Cut before the request's max_tokens, the window (the server's) ended it: a larger one answers whole."""
    assert not complete_stream([Chunk(finish_reason="length", usage=Usage(completion_tokens=3))], 500)
    assert not complete_stream([Chunk(finish_reason="length", usage=Usage(completion_tokens=3))], None)
    assert not complete_stream([Chunk(finish_reason="length")], 500)  # no count to tell


def test_policy_is_deterministic_only_unless_a_route_says_otherwise():
    base = Policy(enabled=True, semantic=False, cache_nondeterministic=False, ttl_s=60)
    assert not base.why_not(_chat(temperature=0)) and not base.why_not(_chat(temperature=0.7, seed=1))
    assert base.why_not(_chat(temperature=0.7)).startswith("sampled") and base.why_not(_chat())
    routes = [RoutePolicy("embed-*", enabled=False), RoutePolicy("qwen*", cache_nondeterministic=True, ttl_s=5)]
    assert base.with_route(routes, "embed-small").why_not(_chat(temperature=0)) == "the cache is off for this model"
    qwen = base.with_route(routes, "qwen2.5:7b")
    assert not qwen.why_not(_chat(temperature=0.7)) and qwen.ttl_s == 5 and not qwen.semantic


def test_lru_is_bounded_by_bytes_and_evicts_least_recently_used():
    lru = MemoryLRU(max_bytes=100)
    for key in "abc":
        assert lru.put(key, key, 40, ttl_s=60)
    assert lru.get("a") is None and lru.bytes_used == 80  # a went when c arrived
    lru.get("b")
    lru.put("d", "d", 40, ttl_s=60)
    assert lru.get("c") is None and lru.get("b") == "b" and lru.bytes_used == 80
    assert not lru.put("huge", "x", 101, ttl_s=60) and lru.bytes_used == 80


def test_lru_entries_expire():
    now = [1000.0]
    lru = MemoryLRU(max_bytes=100, clock=lambda: now[0])
    lru.put("a", "a", 10, ttl_s=5)
    now[0] += 4.9
    assert lru.get("a") == "a"
    now[0] += 0.2
    assert lru.get("a") is None and lru.bytes_used == 0 and len(lru) == 0


def test_codec_round_trips_every_chunk_field():
    split = TokenLogprob("\ufffd", -0.3, raw=b"\xe6\x97")  # the first two bytes of a character
    chunks = [Chunk("Hel", thinking="hm", logprobs=[TokenLogprob("Hel", -0.1, [TokenLogprob("Hel", -0.1), split])]),
              Chunk(logprobs=[split]),
              Chunk(tool_calls=[ToolCall("f", {"x": [1, 2]}, id="call_1")], finish_reason="tool_calls",
                    usage=Usage(5, 2, 100), context=[1, 2, 3])]
    assert decode_chunks(encode_chunks(chunks)) == chunks


def test_codec_reads_alternatives_as_entries_before_raw_bytes_were_kept():
    old = b'[{"text":"Hel","thinking":"","tool_calls":[],' \
          b'"logprobs":[{"token":"Hel","logprob":-0.1,"top":[["He",-2.0]]}],' \
          b'"finish_reason":null,"usage":null,"context":null}]'
    assert decode_chunks(old)[0].logprobs == [TokenLogprob("Hel", -0.1, [TokenLogprob("He", -2.0)])]


def _unit_vectors(n: int, seed: int = 0):
    import numpy as np
    vectors = np.random.default_rng(seed).normal(size=(n, 16)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


async def test_scope_index_switches_to_hnsw_and_compacts_when_full():
    from concurrent.futures import ThreadPoolExecutor

    from proxy.cache.semantic import Embedded, Entry, ScopeIndex
    from proxy.cache.verifier import read

    vectors = _unit_vectors(12)
    index = ScopeIndex(dim=16, hnsw_above=4, max_entries=10)
    for i, v in enumerate(vectors[:10]):
        index.add(v, Entry(f"k{i}", read("q"), expires_at=100.0 if i < 3 else 200.0), now=0.0)
        if index.wants_graph:
            with ThreadPoolExecutor(1) as graphs:
                await index.build_graph(graphs)
        if i == 6:  # 5 in the graph, 2 searched flat: both are searched
            assert [e.key for e in index.search(Embedded(vectors[2], read("q")), 0.99, now=0.0)] == ["k2"]
            assert [e.key for e in index.search(Embedded(vectors[6], read("q")), 0.99, now=0.0)] == ["k6"]
    assert index.is_hnsw and len(index) == 10 and index.graphed == 10  # built at the 5th, again at the 10th
    assert [e.key for e in index.search(Embedded(vectors[7], read("q")), 0.99, now=0.0)] == ["k7"]
    assert index.search(Embedded(vectors[7], read("q")), 0.99, now=300.0) == []  # expired
    index.add(vectors[10], Entry("k10", read("q"), 200.0), now=150.0)  # full: the 3 expired go first
    q10 = Embedded(vectors[10], read("q"))
    assert len(index) == 8 and [e.key for e in index.search(q10, 0.99, now=150.0)] == ["k10"]
    assert index.search(Embedded(vectors[0], read("q")), 0.99, now=150.0) == []
    assert not index.is_hnsw and index.wants_graph  # searched flat until the next graph


async def test_a_scopes_graph_is_built_off_the_event_loop_while_searches_go_on(monkeypatch):
    """Built on the event loop, a graph of 2,049 vectors stalled every request for 0.2 s, and the rebuild after a
    compaction (50,000 vectors) for 22 s."""
    import asyncio
    import time
    from concurrent.futures import ThreadPoolExecutor

    from proxy.cache import semantic
    from proxy.cache.semantic import Embedded, Entry, ScopeIndex
    from proxy.cache.verifier import read

    build = semantic._hnsw
    monkeypatch.setattr(semantic, "_hnsw", lambda *a: (time.sleep(0.3), build(*a))[1])
    vectors = _unit_vectors(8, seed=1)
    index = ScopeIndex(dim=16, hnsw_above=4, max_entries=100)
    for i, v in enumerate(vectors[:6]):
        index.add(v, Entry(f"k{i}", read("q"), 200.0), now=0.0)
    gaps, last = [], time.monotonic()
    with ThreadPoolExecutor(1) as graphs:
        building = asyncio.create_task(index.build_graph(graphs))
        while not building.done():
            await asyncio.sleep(0.01)
            gaps.append(time.monotonic() - last)
            last = time.monotonic()
            if len(gaps) == 5:  # meanwhile: searched flat, and a new entry comes
                assert index.building and not index.is_hnsw and not index.wants_graph
                assert [e.key for e in index.search(Embedded(vectors[3], read("q")), 0.99, 0.0)] == ["k3"]
                index.add(vectors[6], Entry("k6", read("q"), 200.0), now=0.0)
    assert max(gaps) < 0.2 and len(gaps) > 10
    assert index.is_hnsw and index.graphed == 6  # what it held when the build began; k6 is searched flat
    for i in (3, 6):
        assert [e.key for e in index.search(Embedded(vectors[i], read("q")), 0.99, 0.0)] == [f"k{i}"]


def test_an_empty_schema_is_a_format_not_its_absence():
    """`format = {}` asks for any JSON (a grammar on the backend): it shared its key with an answer in free text."""
    free = _chat(temperature=0)
    schema = ChatRequest("tiny", free.messages, options=free.options, format={})
    assert exact_key(schema, "t") != exact_key(free, "t")
    assert semantic_query(schema)[1] != semantic_query(free)[1]
    assert exact_key(_chat(temperature=0, logit_bias={}), "t") == exact_key(free, "t")  # a field's own default


def _results(*answers: tuple[str, str]) -> ChatRequest:
    calls = [ToolCall("weather", {"city": "Paris"}, "call_a"), ToolCall("weather", {"city": "London"}, "call_b")]
    return ChatRequest("tiny", [Message("user", "weather?"), Message("assistant", tool_calls=calls),
                                *[Message("tool", text, tool_call_id=cid) for cid, text in answers],
                                Message("user", "So how warm is Paris?")], options=SamplingOptions(temperature=0))


def test_which_call_a_tool_result_answers_is_in_the_key_and_the_ids_are_not():
    base = _results(("call_a", "20C"), ("call_b", "5C"))
    swapped = _results(("call_b", "20C"), ("call_a", "5C"))  # the same texts, each answering the other call
    assert exact_key(swapped, "t") != exact_key(base, "t")
    assert semantic_query(swapped)[1] != semantic_query(base)[1]
    renamed = _results(("x1", "20C"), ("x2", "5C"))
    for msg, cid in zip(renamed.messages[1].tool_calls, ("x1", "x2")):
        msg.id = cid
    assert exact_key(renamed, "t") == exact_key(base, "t")  # other clients' made-up ids, the same conversation


def test_num_keep_is_in_the_key_and_the_speed_knobs_are_not():
    base = exact_key(_chat(temperature=0), "t")
    assert exact_key(_chat(temperature=0, extra={"num_keep": 5}), "t") != base  # which tokens a context shift keeps
    assert exact_key(_chat(temperature=0, extra={"num_thread": 4, "num_batch": 64}), "t") == base


def test_a_turn_of_more_words_than_the_window_is_neither_split_whole_nor_tokenized():
    """A 1.8 MB turn took 34 ms to split (the GIL held from the event loop) and 1.9 s to tokenize, only to learn it
    was too long."""
    from proxy.cache.encoders import fits

    class Counting:
        def __call__(self, text: str, truncation: bool = False) -> dict:
            raise AssertionError("tokenized")
    assert not fits(Counting(), 256, "word " * 300_000)
    assert not fits(Counting(), 256, "word " * 255)  # 255 word pieces and the two special tokens: 257
    assert not fits(Counting(), 256, "a" * 101)  # one [UNK], unread
    assert fits(Counting(), 256, "How do I learn Python quickly?")  # shorter in characters than the window


def test_the_order_of_a_schemas_properties_is_in_the_key_and_that_of_options_is_not():
    """A backend writes an object's keys in its schema's order (llguidance, llama.cpp's grammar), and a chat template
    renders a tool's parameters as listed: {"reasoning", "answer"} has the model reason before it answers, {"answer",
    "reasoning"} after. The key was of sorted JSON, and the second was served the first's answer."""
    free = _chat(temperature=0)
    props = [("reasoning", {"type": "string"}), ("answer", {"type": "string"})]
    ask = lambda order: ChatRequest("tiny", free.messages, options=free.options,  # noqa: E731
                                    format={"type": "object", "properties": dict(order)},
                                    tools=[Tool("f", parameters={"type": "object", "properties": dict(order)})])
    assert exact_key(ask(props), "t") != exact_key(ask(props[::-1]), "t")
    assert digest(semantic_query(ask(props))[1]) != digest(semantic_query(ask(props[::-1]))[1])  # its scope
    knobs = exact_key(_chat(temperature=0, extra={"mirostat": 1, "mirostat_tau": 4.0}, logit_bias={1: -5, 2: 3}), "t")
    assert exact_key(_chat(temperature=0, extra={"mirostat_tau": 4.0, "mirostat": 1}, logit_bias={2: 3, 1: -5}),
                     "t") == knobs
