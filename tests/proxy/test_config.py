from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from proxy.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]


def test_example_config_parses_and_documents_every_backend_kind():
    cfg = load_config(ROOT / "config.example.toml")
    assert {b.kind for b in cfg.backends} == {"ollama", "llamacpp", "openai", "engine"}
    assert cfg.default_backend in {b.name for b in cfg.backends}


def test_minimal_backend_and_url_shorthand():
    cfg = parse_config({"backends": [{"name": "o", "kind": "ollama", "url": "http://h:1"}]})
    assert cfg.backends[0].urls == ["http://h:1"] and cfg.server.port == 8000


@pytest.mark.parametrize("urls", [5, "http://b:1", {"http://b:1": 1}])
def test_urls_beside_the_url_shorthand_that_is_no_array_is_named(urls):
    """`url` and `urls` together: `urls = 5` was a TypeError traceback from `velo serve`, and a string was read as
    its characters (`urls[1]` 'h' is no URL)."""
    with pytest.raises(ConfigError, match=r"^backends\[0\]\.urls: must be an array"):
        parse_config({"backends": [{"name": "o", "kind": "ollama", "url": "http://a:1", "urls": urls}]})


@pytest.mark.parametrize("raw, path", [
    ({"backends": [{"name": "x", "kind": "vllm", "url": "http://u:1"}]}, "backends[0].kind"),
    ({"backends": [{"name": "x", "kind": "ollama"}]}, "backends[0].url"),
    ({"backends": [{"name": "x", "kind": "ollama", "url": "u", "colour": 1}]}, "backends[0].colour"),
    # two Authorization headers, which aiohttp refused with a 500 at each request
    ({"backends": [{"name": "x", "kind": "openai", "url": "http://me:pw@h:1", "api_key": "k"}]}, "backends[0].api_key"),
    ({"backends": [{"name": "x", "kind": "ollama", "url": "u", "max_concurrency": "4"}]},
     "backends[0].max_concurrency"),
    ({"server": {"port": "8000"}}, "server.port"),
    ({"backends": [{"name": "x", "kind": "openai", "url": "http://h:1", "idle_timeout": 0}]},
     "backends[0].idle_timeout"),
    ({"server": {"port": True}}, "server.port"),
    ({"routes": [{"match": "*", "backend": "ghost"}]}, "routes[0].backend"),
    ({"default_backend": "ghost"}, "default_backend"),
    ({"backends": [{"name": "x", "kind": "openai", "url": "127.0.0.1:8080/v1"}]}, "backends[0].url"),
    ({"backends": [{"name": "x", "kind": "openai", "urls": ["http://a:1", "ftp://b:1"]}]}, "backends[0].urls[1]"),
    ({"backends": {"name": "x"}}, "backends"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"backends": [{"name": "x", "kind": "llamacpp", "urls": ["http://a:1", "http://b:1"],
                    "options": {"affinity": "sticky"}}]}, "backends[0].options.affinity"),
    ({"cache": {"embed_precision": "int4"}}, "cache.embed_precision"),
    ({"backends": [{"name": "x", "kind": "openai", "urls": ["http://a:1", "http://b:1"],
                    "options": {"afinity": "prefix"}}]}, "backends[0].options.afinity"),
    ({"backends": [{"name": "x", "kind": "ollama", "url": "http://a:1", "options": {"ttl_s": 5}}]},
     "backends[0].options.ttl_s"),
    ({"backends": [{"name": "e", "kind": "engine", "options": {"kv_memroy": 1}}]}, "backends[0].options"),
    ({"backends": [{"name": "e", "kind": "engine",
                    "options": {"speculative": {"method": "ngram", "draft_vocab": -1}}}]},
     "backends[0].options.speculative"),
    ({"backends": [{"name": "e", "kind": "engine", "options": {"speculative": {"methd": "ngram"}}}]},
     "backends[0].options.speculative"),
    # a traceback once `velo serve` started loading it
    ({"backends": [{"name": "e", "kind": "engine", "options": {"model": "/nonexistent/x.gguf"}}]},
     "backends[0].options.model: no model file or folder at '/nonexistent/x.gguf'"),
    ({"backends": [{"name": "e", "kind": "engine", "options": {"speculative": {
        "method": "draft", "draft_model": "/nonexistent/d.gguf"}}}]}, "backends[0].options.speculative.draft_model"),
    ({"cache": {"semantic_threshold": 1.5}}, "cache.semantic_threshold"),
    ({"models": {"m": {"options": {"temprature": 0.5}}}}, "models.m.options.temprature"),
    ({"models": {"m": {"options": {"top_k": 1.5}}}}, "models.m.options.top_k"),
    ({"models": {"m": {"options": {"stop": "x"}}}}, "models.m.options.stop"),
    ({"models": {"m": {"system": "hi"}}}, "models.m.system"),
    ({"presets": {"path": 3}}, "presets.path"),
    # the engine's thread died at its first step, and every request waited for first_token_timeout
    ({"backends": [{"name": "e", "kind": "engine", "options": {"num_threads": 0}}]},
     "backends[0].options.num_threads: must be >= 1, got 0"),
    # "could not start: " with no more words, or a division by zero
    ({"backends": [{"name": "e", "kind": "engine", "options": {"max_num_seqs": 0}}]},
     "backends[0].options.max_num_seqs: must be >= 1"),
    ({"backends": [{"name": "e", "kind": "engine", "options": {"block_size": 0}}]},
     "backends[0].options.block_size: must be >= 1"),
    ({"backends": [{"name": "e", "kind": "engine", "options": {"prefill_chunk": 0}}]},
     "backends[0].options.prefill_chunk: must be >= 1"),
    ({"backends": [{"name": "e", "kind": "engine", "options": {"max_step_tokens": 0}}]},
     "backends[0].options.max_step_tokens: must be >= 1"),
    ({"backends": [{"name": "e", "kind": "engine", "options": {"kv_memory": -5}}]},
     "backends[0].options.kv_memory: must be above 0"),
    ({"backends": [{"name": "e", "kind": "engine", "options": {"dtype": "int8"}}]}, "backends[0].options.dtype"),
    ({"backends": [{"name": "e", "kind": "engine", "options": {"device": "tpu"}}]}, "backends[0].options.device"),
    # a traceback from `velo serve` once it built the engine
    ({"backends": [{"name": "e", "kind": "engine", "options": {"keep_alive": "forever"}}]},
     'backends[0].options.keep_alive: time: invalid duration "forever"'),
])
def test_errors_name_the_key_path(raw, path):
    with pytest.raises(ConfigError, match=path.replace("[", r"\[").replace("]", r"\]")):
        parse_config(raw)


@pytest.mark.parametrize("table", ["cache", "responses"])
def test_a_redis_url_redis_cannot_open_is_named_and_not_repeated(table):
    """`velo serve` said only "could not start: Redis URL must specify one of the following schemes", the same for
    [cache] and [responses]; the URL is not repeated, since it may carry a password."""
    with pytest.raises(ConfigError) as e:
        parse_config({table: {"redis_url": "reddis://:hunter2@db:6379/0"}})
    assert str(e.value) == f"{table}.redis_url: must be a redis://, rediss:// or unix:// URL"
    for url in ("redis://db:6379/0", "rediss://:pw@db", "unix:///run/redis.sock"):
        assert getattr(getattr(parse_config({table: {"redis_url": url}}), table), "redis_url") == url


def test_a_semantic_model_folder_that_is_not_there_is_named(tmp_path):
    """sentence-transformers took a missing folder for a new model's name: `velo serve` said "could not start:
    Unrecognized model in /models/x. Should have a `model_type` key in its config.json", naming no key."""
    missing = str(tmp_path / "all-MiniLM-L6-v2")
    with pytest.raises(ConfigError) as e:
        parse_config({"cache": {"semantic": True, "embed_model_path": missing}})
    assert str(e.value) == f"cache.embed_model_path: no model folder at {missing!r}"
    assert parse_config({"cache": {"embed_model_path": str(tmp_path)}}).cache.embed_model_path == str(tmp_path)


def test_a_pg_dsn_libpq_cannot_read_is_named():
    """`velo serve` loaded the semantic model, then said only 'could not start: missing "=" after "velo-db" in
    connection info string', naming no key."""
    pytest.importorskip("psycopg")
    with pytest.raises(ConfigError, match=r'^cache\.pg_dsn: not a PostgreSQL connection string or URL: missing "="'):
        parse_config({"cache": {"semantic": True, "pg_dsn": "velo-db"}})
    for dsn in ("postgresql://velo@127.0.0.1:5432/velo", "host=db dbname=velo"):
        assert parse_config({"cache": {"pg_dsn": dsn}}).cache.pg_dsn == dsn


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine whose torch has no CUDA device")
def test_an_engine_on_cuda_where_torch_has_none_is_a_config_error_naming_the_key():
    """It was `velo serve`'s "could not start: Torch not compiled with CUDA enabled", naming no setting."""
    with pytest.raises(ConfigError, match=r"backends\[0\]\.options\.device: 'cuda' asked, but .*use \"cpu\""):
        parse_config({"backends": [{"name": "e", "kind": "engine", "options": {"device": "cuda"}}]})
    with pytest.raises(ConfigError, match=r"backends\[0\]\.options\.device: 'cuda:1' asked"):
        parse_config({"backends": [{"name": "e", "kind": "engine", "options": {"device": "cuda:1"}}]})


def test_bad_toml_is_a_config_error(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[server\nport = 1")
    with pytest.raises(ConfigError):
        load_config(p)


def test_a_url_that_is_not_one_is_quoted_as_written():
    """The error said 'not%20a%20url' for "not a url": the user looked for a value their file does not hold."""
    with pytest.raises(ConfigError) as e:
        parse_config({"backends": [{"name": "x", "kind": "ollama", "url": "not a url"}]})
    assert str(e.value) == "backends[0].url: must be an http:// or https:// URL with a host, got 'not a url'"


def test_a_managed_llamacpp_backend_needs_a_model_or_a_url_never_both():
    from proxy.config import ConfigError, parse_config
    ok = parse_config({"backends": [{"name": "m", "kind": "llamacpp", "model": "/m.gguf", "ttl_s": 5}]})
    assert ok.backends[0].command == ["llama-server"] and ok.backends[0].max_loaded == 1
    for bad, where in (({"kind": "llamacpp"}, "backends[0].url"),
                       # an empty path (a template's unset variable) started a backend with neither: no model, ever
                       ({"kind": "llamacpp", "model": ""}, "backends[0].model"),
                       ({"kind": "llamacpp", "model": "/m.gguf", "command": []}, "backends[0].command"),
                       ({"kind": "llamacpp", "model": "/m.gguf", "url": "http://x"}, "backends[0].model"),
                       ({"kind": "ollama", "model": "/m.gguf"}, "backends[0].model")):
        with pytest.raises(ConfigError) as refused:
            parse_config({"backends": [{"name": "m", **bad}]})
        assert str(refused.value).startswith(where)


def test_an_alias_may_name_a_model_as_clients_send_it():
    cfg = parse_config({"backends": [{"name": "oll", "kind": "ollama", "url": "http://h:1"}],
                        "aliases": {"gpt-4o-mini": "smollm2:135m", "fast": "oll:smollm2:135m"}})
    assert cfg.aliases == {"gpt-4o-mini": "smollm2:135m", "fast": "oll:smollm2:135m"}


@pytest.mark.parametrize("raw, path", [
    ({"server": {"body_timeout_s": float("nan")}}, "server.body_timeout_s"),
    ({"backends": [{"name": "x", "kind": "openai", "url": "http://h:1", "first_token_timeout": float("nan")}]},
     "backends[0].first_token_timeout"),
    ({"cache": {"ttl_s": float("nan")}}, "cache.ttl_s"),
])
def test_nan_is_no_number_a_setting_takes(raw, path):
    """TOML's `nan` compares false with every bound: a `body_timeout_s = nan` was taken, and every request read with
    it was a 500 (uvloop cannot schedule a timer at nan)."""
    with pytest.raises(ConfigError, match=rf"^{re.escape(path)}: must be a number, got nan"):
        parse_config(raw)


@pytest.mark.parametrize("raw, path", [
    ({"server": {"api_keys": ["ok", 48151623]}}, "server.api_keys[1]"),
    ({"server": {"admin_keys": [48151623]}}, "server.admin_keys[0]"),
    ({"backends": [{"name": "x", "kind": "openai", "url": "http://h:1", "api_key": 48151623}]}, "backends[0].api_key")])
def test_a_key_of_the_wrong_type_is_refused_without_saying_it(raw, path):
    """A key written as a number (no quotes) was said in the error ("got int 48151623"), which the log keeps: a
    config reload that is refused is logged."""
    with pytest.raises(ConfigError, match=rf"^{re.escape(path)}: must be a string") as refused:
        parse_config(raw)
    assert "48151623" not in str(refused.value)


@pytest.mark.parametrize("keys", [[""], ["team-a "], ["ok", "tab\tinside"]])
def test_an_api_key_no_header_can_carry_is_refused_without_saying_it(keys):
    """HTTP strips the spaces around a header's value, and no client sends an empty key: every API client got 401."""
    for name in ("api_keys", "admin_keys"):
        with pytest.raises(ConfigError, match=rf"^server.{name}: key {len(keys)} is empty, or has a space") as refused:
            parse_config({"server": {name: keys}})
        assert "team-a" not in str(refused.value)
