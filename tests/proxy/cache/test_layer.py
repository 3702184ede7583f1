"""CacheLayer on its own: exact tiers, tenant scopes, persistence, counters, the semantic tier and its guard."""
from __future__ import annotations

import asyncio
import re
import sqlite3
import time

import orjson
import pytest

from adapters.protocol import ChatRequest, Chunk, CompletionRequest, Message, SamplingOptions, Usage
from proxy.cache import CacheConfig, CacheLayer
from proxy.cache.semantic import Embedder

ANSWER = [Chunk("Hel"), Chunk("lo"), Chunk(finish_reason="stop", usage=Usage(3, 2))]


def _ask(text: str, system: str = "be brief", **opts) -> ChatRequest:
    return ChatRequest("tiny", [Message("system", system), Message("user", text)],
                       options=SamplingOptions(**({"temperature": 0} | opts)))


async def test_exact_hit_replays_the_chunks_and_counts_it():
    layer = await CacheLayer.create(CacheConfig())
    req = _ask("hi")
    assert await layer.lookup(layer.asked(req, "alice")) is None
    assert await layer.store(layer.asked(req, "alice"), ANSWER)
    hit = await layer.lookup(layer.asked(req, "alice"))
    assert hit.kind == "exact" and hit.chunks == ANSWER and hit.chunks is not ANSWER
    stats = layer.stats()
    assert stats["events"]["all"]["tiny"] == {"miss": 1, "store": 1, "hit": 1}
    assert stats["events"]["memory"]["tiny"] == {"miss": 1, "hit": 1}
    assert stats["bytes"]["memory"] > 0 and stats["latency"]["exact"]["count"] == 1
    await layer.close()


async def test_tenants_never_see_each_others_answers():
    layer = await CacheLayer.create(CacheConfig())
    await layer.store(layer.asked(_ask("hi"), "alice"), ANSWER)
    assert await layer.lookup(layer.asked(_ask("hi"), "bob")) is None
    await layer.close()


async def test_refused_stores_and_bypass():
    layer = await CacheLayer.create(CacheConfig())
    assert not await layer.store(layer.asked(_ask("a", temperature=0.8), "t"), ANSWER)  # sampled
    assert not await layer.store(layer.asked(_ask("b"), "t"), [Chunk("x"), Chunk(finish_reason="error")])
    assert not await layer.store(layer.asked(_ask("c"), "t"), [Chunk("x")])  # cut off
    await layer.store(layer.asked(_ask("d"), "t"), ANSWER)
    assert await layer.lookup(layer.asked(_ask("d"), "t"), bypass=True) is None
    assert layer.stats()["events"]["all"]["tiny"] == {"skip": 3, "store": 1, "bypass": 1}
    await layer.close()


async def test_sqlite_tier_survives_a_restart_and_keeps_the_expiry(tmp_path):
    now = [time.time()]
    cfg = CacheConfig(sqlite_path=str(tmp_path / "cache.db"), ttl_s=60)
    first = await CacheLayer.create(cfg, clock=lambda: now[0])
    await first.store(first.asked(_ask("hi"), "t"), ANSWER)
    await first.close()
    second = await CacheLayer.create(cfg, clock=lambda: now[0])
    hit = await second.lookup(second.asked(_ask("hi"), "t"))
    assert hit.kind == "exact" and hit.chunks == ANSWER
    assert second.stats()["events"]["sqlite"]["tiny"] == {"hit": 1} and second.stats()["bytes"]["sqlite"] > 0
    now[0] += 61  # expired in memory (copied with its stored expiry) and on disk
    assert await second.lookup(second.asked(_ask("hi"), "t")) is None
    await second.close()


async def test_the_sqlite_tier_is_readable_by_its_owner_alone(tmp_path):
    """Cached answers are conversations: 0600 files in 0700 folders (before: 0644 and 0755)."""
    cfg = CacheConfig(sqlite_path=str(tmp_path / "new" / "folder" / "cache.db"))
    layer = await CacheLayer.create(cfg)
    await layer.store(layer.asked(_ask("hi"), "t"), ANSWER)
    files = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "new" / "folder").iterdir()}
    await layer.close()
    assert files["cache.db"] == 0o600 and all(mode == 0o600 for mode in files.values()), files
    assert [(tmp_path / f).stat().st_mode & 0o777 for f in ("new", "new/folder")] == [0o700, 0o700]
    (tmp_path / "old.db").touch(mode=0o644)  # a file from an older Velo is tightened too
    old = await CacheLayer.create(CacheConfig(sqlite_path=str(tmp_path / "old.db")))
    await old.close()
    assert (tmp_path / "old.db").stat().st_mode & 0o777 == 0o600


async def test_a_sqlite_path_naming_a_file_that_is_no_database_is_refused_and_left_alone(tmp_path):
    """Its mode was made 0600 before SQLite found it no database (`sqlite_path = "/etc/passwd"`, as root, locked
    every other user out of it), and the start said only "file is not a database", naming no file."""
    other = tmp_path / "notes.txt"
    other.write_text("not a database, " * 100)
    other.chmod(0o644)
    with pytest.raises(sqlite3.DatabaseError, match=f"^{re.escape(str(other))}: file is not a database"):
        await CacheLayer.create(CacheConfig(sqlite_path=str(other)))
    assert other.stat().st_mode & 0o777 == 0o644 and other.read_text() == "not a database, " * 100
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


async def test_semantic_hit_on_a_paraphrase_but_not_across_scopes_or_guarded_changes(embedder: Embedder):
    layer = await CacheLayer.create(CacheConfig(semantic=True), embedder=embedder)
    await layer.store(layer.asked(_ask("How do I learn Python quickly?"), "t"), ANSWER)
    hit = await layer.lookup(layer.asked(_ask("How can I learn Python fast?"), "t"))
    assert hit is not None and hit.kind == "semantic" and hit.chunks == ANSWER
    assert await layer.lookup(layer.asked(_ask("How can I learn Python fast?"), "u")) is None
    assert await layer.lookup(layer.asked(_ask("How can I learn Python fast?", system="be verbose"), "t")) is None
    assert await layer.lookup(layer.asked(_ask("How can I learn Python fast?", max_tokens=9), "t")) is None
    assert await layer.lookup(layer.asked(_ask("How do I cook rice?"), "t")) is None
    await layer.store(layer.asked(_ask("Is it safe to eat raw eggs?"), "t"), ANSWER)
    assert await layer.lookup(layer.asked(_ask("Is it not safe to eat raw eggs?"), "t")) is None
    assert layer.stats()["events"]["semantic"]["tiny"] == {"hit": 1, "miss": 5}
    await layer.close()



async def test_no_semantic_hit_for_the_same_numbers_in_another_expression(embedder: Embedder):
    """The guard compared numbers sorted, and the verifier does not read operators: "4/3 as a decimal" was served
    the answer to "3/4 as a decimal" (cosine 0.99), "3-7" the one to "7-3" (0.97)."""
    layer = await CacheLayer.create(CacheConfig(semantic=True), embedder=embedder)
    for stored, asked in (("What is 3/4 as a decimal?", "What is 4/3 as a decimal?"), ("What is 7-3?", "What is 3-7?"),
                          ("What is 100 / 4?", "What is 4 / 100?")):
        await layer.store(layer.asked(_ask(stored), "t"), ANSWER)
        assert await layer.lookup(layer.asked(_ask(asked), "t")) is None, asked
    assert (await layer.lookup(layer.asked(_ask("what is 100/4"), "t"))).kind == "semantic"
    await layer.close()


async def test_no_semantic_hit_for_a_conversion_the_other_way(embedder: Embedder):
    """"20 EUR in USD" was served the answer to "20 USD in EUR" (cosine 0.98): "in" was no direction to the
    verifier, as "to" is."""
    layer = await CacheLayer.create(CacheConfig(semantic=True), embedder=embedder)
    await layer.store(layer.asked(_ask("How much is 20 USD in EUR?"), "t"), ANSWER)
    assert await layer.lookup(layer.asked(_ask("How much is 20 EUR in USD?"), "t")) is None
    assert (await layer.lookup(layer.asked(_ask("How much are 20 USD in EUR?"), "t"))).kind == "semantic"
    await layer.close()

async def test_an_answer_that_carries_its_prompt_is_no_semantic_entry(embedder: Embedder):
    """Ollama's /api/generate answer ends with `context`: its prompt's token ids and its own, which the client sends
    back as the next turn's start. Served on a semantic hit, another question's ids went back to the client, and its
    next turn went on from a prompt it never sent. Only the exact tier, the same prompt, may replay it."""
    layer = await CacheLayer.create(CacheConfig(semantic=True), embedder=embedder)
    ask = lambda text: CompletionRequest("tiny", text, options=SamplingOptions(temperature=0))  # noqa: E731
    carried = [Chunk("Hel"), Chunk("lo", finish_reason="stop", usage=Usage(3, 2), context=[7, 8, 9])]
    await layer.store(layer.asked(ask("How do I learn Python quickly?"), "t"), carried)
    assert await layer.lookup(layer.asked(ask("How can I learn Python fast?"), "t")) is None
    assert (await layer.lookup(layer.asked(ask("How do I learn Python quickly?"), "t"))).kind == "exact"
    await layer.store(layer.asked(ask("How do I learn Rust quickly?"), "t"), ANSWER)  # none: the tier is open to it
    assert (await layer.lookup(layer.asked(ask("How can I learn Rust fast?"), "t"))).kind == "semantic"
    await layer.close()


async def test_a_miss_works_out_its_key_and_semantic_query_once(embedder: Embedder, monkeypatch):
    """A miss's lookup, skip reason and store used to compute the canonical form and its hash again each (108 µs a
    time for an agent's 13-turn chat, bench/cache_keys.py), the semantic tier's query twice more."""
    from proxy.cache import layer as layer_module
    calls = {"exact_key": 0, "semantic_query": 0}

    def counted(name):
        real = getattr(layer_module, name)

        def count(*args):
            calls[name] += 1
            return real(*args)
        return count
    for name in calls:
        monkeypatch.setattr(layer_module, name, counted(name))
    layer = await CacheLayer.create(CacheConfig(semantic=True), embedder=embedder)
    await layer.store(layer.asked(_ask("How do I learn Python quickly?"), "t"), ANSWER)
    asked = layer.asked(_ask("What is the capital of France?"), "t")
    calls.update(exact_key=0, semantic_query=0)
    assert await layer.lookup(asked) is None and asked.skip_reason == ""
    assert await layer.store(asked, ANSWER)
    assert calls == {"exact_key": 1, "semantic_query": 1}
    assert (await layer.lookup(layer.asked(_ask("What is the capital of France?"), "t"))).kind == "exact"
    await layer.close()


async def test_a_text_one_key_sent_is_embedded_again_for_another(embedder: Embedder, monkeypatch):
    """The memo of recent vectors was shared by every key: a key's semantic hit came back in 0.3 ms for a text
    another key had sent and in 13 ms for one nobody had (its prompt_eval_duration says which), so a key could
    test guesses of another's prompts."""
    encoded: list[str] = []
    real = embedder.encode
    monkeypatch.setattr(embedder, "encode", lambda texts: encoded.extend(texts) or real(texts))
    layer = await CacheLayer.create(CacheConfig(semantic=True), embedder=embedder)
    await layer.store(layer.asked(_ask("What is the capital of France?"), "bob"), ANSWER)
    secret = "Which harbour does Alice's ship leave from on Tuesday?"
    await layer.store(layer.asked(_ask(secret), "alice"), ANSWER)
    encoded.clear()
    await layer.lookup(layer.asked(_ask(secret), "bob"))
    assert encoded == [secret]
    await layer.close()


async def test_a_scope_past_hnsw_above_gets_its_graph_in_the_background(embedder: Embedder):
    layer = await CacheLayer.create(CacheConfig(semantic=True, hnsw_above=2), embedder=embedder)
    for question in ("How do I learn Python quickly?", "What is the capital of France?", "How do I cook rice?"):
        await layer.store(layer.asked(_ask(question), "t"), ANSWER)
    assert layer.building  # started by the third store, not awaited by it
    await asyncio.gather(*layer.building)
    (index,) = layer.indexes.values()
    assert index.is_hnsw and index.graphed == 3
    assert (await layer.lookup(layer.asked(_ask("How can I learn Python fast?"), "t"))).kind == "semantic"
    await layer.close()


async def test_embedding_runs_off_the_event_loop(embedder: Embedder, monkeypatch):
    slow_encode = embedder.encode

    def encode(texts: list[str]):
        time.sleep(0.3)  # a slow forward pass, on the embedder's thread
        return slow_encode(texts)

    monkeypatch.setattr(embedder, "encode", encode)
    layer = await CacheLayer.create(CacheConfig(semantic=True), embedder=embedder)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    await layer.store(layer.asked(_ask("a question nobody asked before"), "t"), ANSWER)
    task.cancel()
    assert ticks >= 15  # the loop kept turning through the 0.3 s encode
    await layer.close()


LOOK_ALIKES = [  # stored, asked: the embedding scores each pair above 0.95, the answers differ
    ("How do I convert rows to columns in Excel?", "How do I convert columns to rows in Excel?"),
    ("How do I increase my metabolism?", "How do I decrease my metabolism?"),
    ("Is Python faster than Java?", "Is Java faster than Python?"),
    ("How do I translate English to French?", "How do I translate French to English?"),
    ("Why can't I sleep when I am tired?", "Why can I sleep when I am not tired?"),
]


async def test_semantic_tier_never_serves_an_opposite_a_swap_or_a_moved_negation(embedder: Embedder):
    layer = await CacheLayer.create(CacheConfig(semantic=True), embedder=embedder)
    for i, (stored, asked) in enumerate(LOOK_ALIKES):
        await layer.store(layer.asked(_ask(stored), f"t{i}"), ANSWER)
        assert await layer.lookup(layer.asked(_ask(asked), f"t{i}")) is None, asked
    assert (await layer.lookup(layer.asked(_ask("How can I increase my metabolism?"), "t1"))).kind == "semantic"
    await layer.close()


async def test_semantic_scopes_are_bounded(embedder: Embedder):
    layer = await CacheLayer.create(CacheConfig(semantic=True, semantic_max_entries=3), embedder=embedder)
    for system in ["a", "b", "c", "d"]:
        await layer.store(layer.asked(_ask("How do I learn Python quickly?", system=system), "t"), ANSWER)
    assert layer.stats()["bytes"]["semantic_entries"] == 3 and len(layer.indexes) == 3
    await layer.close()


async def test_sqlite_tier_is_bounded_by_bytes_keeping_the_newest(tmp_path):
    from proxy.cache.sqlite_store import _PRUNE_EVERY, SqliteStore
    store = await SqliteStore.open(str(tmp_path / "c.db"), max_bytes=1000, clock=time.time)
    for i in range(_PRUNE_EVERY):
        await store.put(f"k{i}", b"x" * 100, time.time() + 60)
    assert store.bytes_used == 1000
    assert await store.get(f"k{_PRUNE_EVERY - 1}") is not None and await store.get("k0") is None
    await store.close()
    reopened = await SqliteStore.open(str(tmp_path / "c.db"), max_bytes=1000)
    assert reopened.bytes_used == 1000
    await reopened.close()


def test_embedding_uses_one_torch_thread_and_leaves_the_callers_alone(embedder: Embedder):
    import torch
    before = torch.get_num_threads()
    worker = Embedder(embedder.model, embedder.dim)
    assert worker._pool.submit(torch.get_num_threads).result() == 1
    assert torch.get_num_threads() == before
    worker._pool.shutdown()


async def test_a_failing_embedding_model_costs_a_miss_not_the_request(embedder: Embedder, monkeypatch):
    def broken(texts: list[str]):
        raise RuntimeError("model gone")

    layer = await CacheLayer.create(CacheConfig(semantic=True), embedder=Embedder(embedder.model, embedder.dim))
    await layer.store(layer.asked(_ask("How do I learn Python quickly?"), "t"), ANSWER)
    monkeypatch.setattr(layer.embedder, "encode", broken)
    assert await layer.lookup(layer.asked(_ask("How can I learn Python fast?"), "t")) is None
    fresh = layer.asked(_ask("a fresh question about failures"), "t")
    assert await layer.store(fresh, ANSWER)  # the exact tiers still take it
    assert (await layer.lookup(layer.asked(_ask("a fresh question about failures"), "t"))).kind == "exact"
    assert layer.stats()["events"]["semantic"]["tiny"] == {"error": 2}
    await layer.close()


async def test_a_turn_longer_than_the_encoders_window_is_left_to_the_exact_tier(embedder: Embedder):
    """The encoder reads 256 word pieces: the same pasted page followed by two different instructions had one vector
    (its end cut, unseen), and the second was served the first one's answer."""
    page = " ".join(f"The harbour town of Vell{i} trades salt, wool and amber with its neighbours." for i in range(30))
    layer = await CacheLayer.create(CacheConfig(semantic=True), embedder=embedder)
    await layer.store(layer.asked(_ask(page + "\nGive a short summary of the text above."), "t"), ANSWER)
    assert await layer.lookup(layer.asked(_ask(page + "\nList every spelling mistake in the text above."), "t")) is None
    summary = layer.asked(_ask(page + "\nGive a short summary of the text above."), "t")
    assert (await layer.lookup(summary)).kind == "exact"
    assert layer.stats()["events"]["semantic"]["tiny"] == {"skip": 1, "miss": 1}  # stored in no index: no lookup
    short = "How do I learn Python quickly?"
    assert embedder.model.reads_whole(short) and embedder.model.reads_whole("word " * 250)
    assert not embedder.model.reads_whole("word " * 260)
    assert not embedder.model.reads_whole("what is " + "x" * 150)  # one [UNK] to the encoder: unseen
    await layer.close()


async def test_a_turn_past_the_window_is_neither_encoded_read_nor_kept(embedder: Embedder, monkeypatch):
    """Reading a 200 KB turn for the verifier took 9 s of the one thread every semantic lookup shares, and the memo
    kept its reading, ~65x its size."""
    encoded: list[str] = []
    real = embedder.encode
    monkeypatch.setattr(embedder, "encode", lambda texts: encoded.extend(texts) or real(texts))
    long_turn = "The harbour town trades salt and amber. " * 5000
    started = time.perf_counter()
    embedded = await embedder.embed(long_turn)
    assert not embedded.whole and time.perf_counter() - started < 2.0
    assert encoded == [] and ("", long_turn) not in embedder._memo
    short = "Which harbour town trades amber for wool this winter?"  # asked nowhere else: not in the memo yet
    assert (await embedder.embed(short)).whole and encoded == [short]


async def test_the_memory_tier_holds_no_more_than_its_max_bytes():
    """It counted answers by their encoded bytes and kept them decoded: 8.5 MiB counted held 19.4 MiB."""
    import tracemalloc
    layer = await CacheLayer.create(CacheConfig(max_bytes=2 * 2**20))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(300):
            answer = [Chunk(f" word{i}") for i in range(200)] + [Chunk(finish_reason="stop", usage=Usage(3, 200))]
            assert await layer.store(layer.asked(_ask(f"question {n}"), "t"), answer)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
        await layer.close()
    assert held < 1.3 * 2 * 2**20, held


async def test_an_entry_another_velo_wrote_is_a_miss_not_the_requests_error(tmp_path, caplog):
    """A shared tier (SQLite here, Redis and PostgreSQL alike) may hold an entry a newer or an older Velo wrote, or
    bytes that are no answer at all: reading one raised (a TypeError for a field this version does not know), and
    the request that looked it up failed with a 500. Now a field it does not know is passed over, and an entry it
    cannot read at all is counted as the tier's error, a miss, and stored again once answered."""
    cfg = CacheConfig(sqlite_path=str(tmp_path / "cache.db"))
    layer = await CacheLayer.create(cfg)
    newer, unreadable = layer.asked(_ask("newer"), "t"), layer.asked(_ask("garbage"), "t")
    call = {"name": "f", "arguments": {"a": 1}, "id": "c", "text": '{"a": 1}', "later": True}
    entry = {"text": "", "thinking": "", "tool_calls": [call], "logprobs": [], "finish_reason": "tool_calls",
             "usage": None, "context": None, "stop_sequence": None, "later": 1}
    sqlite = layer.stores[0]
    await sqlite.put(newer.key, orjson.dumps([entry]), time.time() + 60)
    await sqlite.put(unreadable.key, b'[{"text": 1}]', time.time() + 60)
    hit = await layer.lookup(newer)
    assert hit.chunks[0].tool_calls[0].arguments_json() == '{"a": 1}'
    assert await layer.lookup(unreadable) is None
    assert layer.stats()["events"]["sqlite"]["tiny"] == {"hit": 1, "error": 1}
    assert "an entry in the sqlite tier that this Velo cannot read" in caplog.text
    assert await layer.store(unreadable, ANSWER) and (await layer.lookup(unreadable)).chunks == ANSWER
    await layer.close()
