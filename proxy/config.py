"""config.toml -> one `Config` object passed down. Errors name the key path, as llama-swap's do."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from adapters.base import BackendConfig
from adapters.replicas import ReplicaOptions

from .batching.config import BatchingConfig, BatchingConfigError
from .cache.config import CacheConfig, CacheConfigError

BACKEND_KINDS = ("ollama", "llamacpp", "openai", "engine")


class ConfigError(ValueError):
    """A bad config.toml: the message names the offending key path."""


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 8 * 1024 * 1024
    api_keys: list[str] = field(default_factory=list)  # empty: no client authentication
    origins: list[str] = field(default_factory=list)  # browser origins allowed besides local ones (browser_guard)
    log_prompts: bool = False
    shutdown_grace_s: float = 10.0


@dataclass
class RouteConfig:
    """`match` is an exact model name or a glob; `model` optionally renames it for the backend."""

    match: str
    backend: str
    model: str | None = None


@dataclass
class ToolsConfig:
    repair: bool = True
    max_retries: int = 0


@dataclass
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    backends: list[BackendConfig] = field(default_factory=list)
    routes: list[RouteConfig] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)  # client name -> "backend:model" or "model"
    default_backend: str | None = None
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)

    def backend(self, name: str) -> BackendConfig:
        for b in self.backends:
            if b.name == name:
                return b
        raise ConfigError(f"no backend named {name!r}")


def load_config(path: str | Path) -> Config:
    try:
        raw = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from e
    return parse_config(raw)


def parse_config(raw: dict[str, Any]) -> Config:
    cfg = Config(
        server=_dataclass_from(ServerConfig, raw.get("server", {}), "server"),
        backends=[_backend_from(b, f"backends[{i}]") for i, b in enumerate(_list(raw, "backends"))],
        routes=[_dataclass_from(RouteConfig, r, f"routes[{i}]") for i, r in enumerate(_list(raw, "routes"))],
        aliases=_table(raw, "aliases"),
        default_backend=raw.get("default_backend"),
        tools=_dataclass_from(ToolsConfig, raw.get("tools", {}), "tools"),
        cache=_section(CacheConfig.from_dict, _table(raw, "cache")),
        batching=_section(BatchingConfig.from_dict, _table(raw, "batching")),
    )
    unknown = set(raw) - {f.name for f in fields(Config)}
    if unknown:
        raise ConfigError(f"unknown top-level key(s): {', '.join(sorted(unknown))}")
    _check_references(cfg)
    return cfg


def _section(parse: Any, raw: dict[str, Any]) -> Any:
    try:
        return parse(raw)
    except (CacheConfigError, BatchingConfigError, TypeError) as e:
        raise ConfigError(str(e)) from e


def _check_references(cfg: Config) -> None:
    names = [b.name for b in cfg.backends]
    if len(set(names)) != len(names):
        raise ConfigError("backends: names must be unique")
    for i, r in enumerate(cfg.routes):
        if r.backend not in names:
            raise ConfigError(f"routes[{i}].backend: no backend named {r.backend!r}")
    if cfg.default_backend is not None and cfg.default_backend not in names:
        raise ConfigError(f"default_backend: no backend named {cfg.default_backend!r}")
    for alias, target in cfg.aliases.items():
        backend, sep, _ = target.partition(":")
        if sep and backend not in names:
            raise ConfigError(f"aliases.{alias}: no backend named {backend!r}")


def _backend_from(raw: Any, path: str) -> BackendConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must be a table")
    raw = dict(raw)
    if "url" in raw:
        raw["urls"] = [raw.pop("url")] + list(raw.get("urls", []))
    cfg = _dataclass_from(BackendConfig, raw, path)
    if cfg.kind not in BACKEND_KINDS:
        raise ConfigError(f"{path}.kind: must be one of {', '.join(BACKEND_KINDS)}, got {cfg.kind!r}")
    if cfg.kind != "engine" and not cfg.urls:
        raise ConfigError(f"{path}.url: a {cfg.kind} backend needs a url")
    try:  # options are checked now, not when the backend starts or the first request needs them
        if len(cfg.urls) > 1:
            ReplicaOptions.split(cfg.options)
        if cfg.kind == "engine":
            from adapters.engine import engine_config  # only engine configs pay for importing torch
            engine_config(cfg.options)
    except ValueError as e:  # its message names the option: "options.affinity: ..."
        raise ConfigError(f"{path}.{e}") from e
    return cfg


def _dataclass_from(cls: type, raw: Any, path: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must be a table")
    known = {f.name: f for f in fields(cls)}
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"{path}.{key}: unknown key")
        _check_type(value, known[key].type, f"{path}.{key}")
    try:
        return cls(**raw)
    except TypeError as e:  # a required key is missing
        raise ConfigError(f"{path}: {e}") from e


_SCALARS = {"str": str, "int": int, "float": (int, float), "bool": bool}


def _check_type(value: Any, annotation: Any, path: str) -> None:
    """Checks the simple annotations config dataclasses use (str, int, float, bool, lists, dicts, optionals)."""
    text = str(annotation).replace(" ", "")
    if value is None and "None" in text:
        return
    head = text.split("|")[0]
    if head.startswith("list["):
        if not isinstance(value, list):
            raise ConfigError(f"{path}: must be a list")
        return
    if head.startswith("dict["):
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: must be a table")
        return
    expected = _SCALARS.get(head)
    if expected and (not isinstance(value, expected) or (head != "bool" and isinstance(value, bool))):
        raise ConfigError(f"{path}: must be {head}, got {type(value).__name__}")


def _list(raw: dict[str, Any], key: str) -> list[Any]:
    value = raw.get(key, [])
    if not isinstance(value, list):
        raise ConfigError(f"{key}: must be an array of tables ([[{key}]])")
    return value


def _table(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: must be a table")
    return value
