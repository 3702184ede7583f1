"""config.toml -> one `Config` object passed down. Every table is a dataclass built by adapters.schema, so every
bad key or value gets the same error naming its key path, and the defaults documented in config.example.toml
are rendered from these classes (proxy/config_example.py)."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from yarl import URL

from adapters import options
from adapters.base import BackendConfig
from adapters.errors import BadRequest
from adapters.http import is_server_url
from adapters.protocol import SamplingOptions
from adapters.registry import KINDS
from adapters.replicas import ReplicaOptions
from adapters.schema import SchemaError, build, setting

from .batching.config import BatchingConfig
from .cache.config import CacheConfig
from .limits import LimitsConfig
from .presets import PresetsConfig
from .responses_store import ResponsesConfig


class ConfigError(ValueError):
    """A bad config.toml: the message names the offending key path."""


@dataclass
class ServerConfig:
    """How Velo itself listens."""

    host: str = setting("127.0.0.1", "address to bind. Keep 127.0.0.1 unless clients on other machines need Velo")
    port: int = setting(8000, "where clients connect instead of Ollama's 11434", min=1, max=65535)
    # Anthropic's own request limit, where Ollama has none: 8 MiB refused Open WebUI chats with two phone photos
    # (it sends every image again, as base64, with each turn).
    max_body_bytes: int = setting(32 * 1024 * 1024, "larger request bodies get 413 in the client's dialect", min=1)
    api_keys: list[str] = setting(factory=list, doc="when set, every /api and /v1 call needs `Authorization: "
                                  "Bearer <key>` (or `x-api-key`); cache entries are scoped per key, and so are "
                                  "prompt prefixes in the engine's and vLLM's prefix caches (llama-server, Ollama "
                                  "and SGLang share theirs: a key can tell from its cached_tokens, or how soon its "
                                  "answer starts, what another key sent)",
                                  default_doc="[] (no authentication; a client that sends a key still gets its own "
                                              "cache scope)", secret=True)
    admin_keys: list[str] = setting(factory=list, doc="when keys belong to different people: the keys that alone "
                                    "open the dashboard (/ui, with its recent requests), list or cancel every key's "
                                    "requests in flight (/velo/requests), manage models (/api/create, /api/copy, "
                                    "/api/delete: presets every key gets, under any name; /api/pull, /api/push) "
                                    "and reach llama-server's /slots (other keys' tasks and caches); other keys get "
                                    "403 there (401 on /ui, where the browser then asks for another key). Each is "
                                    "an API key too",
                                    default_doc="[] (every API key may; in /velo/requests, each key its own "
                                                "requests alone)", secret=True)
    origins: list[str] = setting(factory=list, doc="browser origins allowed to call Velo (CORS), besides Ollama's "
                                 "defaults: http(s) on localhost, 127.0.0.1 and 0.0.0.0 at any port, app://, file://, "
                                 'tauri://, vscode-webview://, vscode-file://. `*` is a wildcard '
                                 '("https://*.example.org"; "*" allows every origin). OLLAMA_ORIGINS '
                                 "(comma-separated) is honoured too. Other origins get 403, as with Ollama")
    log_prompts: bool = setting(False, "log prompt and answer text (off: only sizes and timings are logged)")
    default_max_tokens: int = setting(4096, "output limit of a request that sets none (most clients send none): a "
                                      "small model that loops would otherwise run to the end of its context, holding "
                                      "a backend slot for minutes (seen: 297 s for one answer); the answer then ends "
                                      "with the dialect's length reason. 0: no limit", min=0)
    shutdown_grace_s: float = setting(10.0, "on SIGTERM, in-flight requests get this long to finish; streams still "
                                      "running then end with the dialect's error event (503, shutting down)", min=0)
    header_timeout_s: float = setting(15.0, "a connection must send a request's headers within this long of opening "
                                      "(or of its previous answer), else it is closed: slow clients cannot hold "
                                      "connections open; idle keep-alive connections close after it too", min=0.1)
    body_timeout_s: float = setting(60.0, "a request's whole body must arrive within this long, else 408", min=0.1)
    # nginx's send_timeout, 60 s: a client that takes nothing of a stream for that long is not reading it
    send_timeout_s: float = setting(60.0, "a stream's client must take each piece of it within this long, else it "
                                    "is taken for gone: its connection is closed and its backend work cancelled "
                                    "(a client that kept its connection but stopped reading held a backend slot "
                                    "for good)", min=0.1)
    # Clients' read timeouts: the openai Agents SDK was seen to give up on a held call at 300 s, as Node's fetch
    # (the AI SDK, Continue) would; nginx's proxy_read_timeout is 60 s, Cloudflare's 100 s.
    heartbeat_s: float = setting(15.0, "a stream that has sent nothing for this long (waiting for a backend's slot, "
                                 "a backend reading a long prompt, a tool call or JSON held back to be checked "
                                 "while the model writes it) gets its headers and then the dialect's empty event "
                                 "this often, so that no client or proxy read timeout ends it; what fails after "
                                 "that is an error inside the stream, not an error status. 0: none", min=0)
    long_request_s: float = setting(300.0, "a request running longer than this is logged once with its id, model, "
                                    "client and tokens so far (`GET /velo/requests` lists every one, `DELETE "
                                    "/velo/requests/{id}` cancels one). 0: never logged", min=0)

    def __post_init__(self) -> None:
        """A key no header can carry (empty, spaces at an end, which HTTP strips, or a control character) locked
        every client out without a word; the key itself is never said (the error is logged)."""
        for name in ("api_keys", "admin_keys"):
            for i, key in enumerate(getattr(self, name)):
                if not key or key != key.strip() or not key.isprintable():
                    raise ValueError(f"{name}: key {i + 1} is empty, or has a space at an end or a control character "
                                     "inside, which no client's header can carry")

    @property
    def keys(self) -> list[str]:
        """Every key that may call Velo: the API keys and the admin keys (each an API key too)."""
        return [*self.api_keys, *self.admin_keys]


@dataclass
class RouteConfig:
    """Which backend serves which model, tried in order (exact names first, then globs)."""

    match: str = setting(doc='a model name or a glob ("qwen*")')
    backend: str = setting(doc="a backend name")
    model: str | None = setting(None, "the name the backend knows the model by", default_doc="the same name")


@dataclass
class ToolsConfig:
    """Tool-call and structured-output repair for every backend."""

    repair: bool = setting(True, "extract, repair, validate and coerce tool calls and JSON output")
    max_retries: int = setting(0, "ask the backend again (with the validation error) when a call stays invalid",
                               min=0)
    repair_budget_s: float = setting(2.0, "seconds of a repair thread one answer's repair may take; past it the "
                                     "answer is passed through unrepaired (X-Velo-Repair: skipped=budget), and not "
                                     "cached. Answers over 256 KB of broken JSON are never repaired (skipped=size)",
                                     min=0.01)


@dataclass
class ModelConfig:
    """Settings for one model, by the name clients use (a listed model, an alias or a preset)."""

    options: dict[str, int | float | list[str]] = setting(
        factory=dict, doc='sampling options in Ollama\'s names (`{ temperature = 0.6, repeat_penalty = 1.2 }`), over '
        "the defaults each dialect's own server applies; a request's options and a preset's parameters come first")

    def sampling(self) -> SamplingOptions:
        return options.read("ollama", self.options)


@dataclass
class Config:
    default_backend: str | None = setting(None, "the backend for models no route, alias or listing claims",
                                          default_doc="the only backend, if one (a llama-server only for the "
                                                      "names it lists); else unknown models get 404")
    server: ServerConfig = setting(factory=ServerConfig)
    backends: list[BackendConfig] = setting(factory=list, doc="one table per model server")
    routes: list[RouteConfig] = setting(factory=list)
    aliases: dict[str, str] = setting(factory=dict, doc='extra model names clients may use: "backend:model", or '
                                      'just "model" (routed as usual)')
    tools: ToolsConfig = setting(factory=ToolsConfig)
    cache: CacheConfig = setting(factory=CacheConfig)
    batching: BatchingConfig = setting(factory=BatchingConfig)
    limits: LimitsConfig = setting(factory=LimitsConfig)
    responses: ResponsesConfig = setting(factory=ResponsesConfig)
    presets: PresetsConfig = setting(factory=PresetsConfig)
    models: dict[str, ModelConfig] = setting(factory=dict, doc="per-model settings, one table per model name")

    def backend(self, name: str) -> BackendConfig:
        for b in self.backends:
            if b.name == name:
                return b
        raise ConfigError(f"no backend named {name!r}")


def load_config(path: str | Path) -> Config:
    """The file's config; a byte-order mark (Notepad writes one) is read past."""
    try:
        raw = tomllib.loads(Path(path).read_bytes().decode("utf-8-sig"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: {e}") from e
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from e
    return parse_config(raw)


def parse_config(raw: dict[str, Any]) -> Config:
    try:
        cfg = build(Config, _with_urls(raw), "")
        for i, backend in enumerate(cfg.backends):
            _check_backend(backend, f"backends[{i}]")
    except SchemaError as e:
        raise ConfigError(str(e)) from e
    _check_references(cfg)
    return cfg


def _with_urls(raw: dict[str, Any]) -> dict[str, Any]:
    """`url = "..."` is shorthand for the first of `urls`."""
    backends = raw.get("backends")
    if not isinstance(backends, list):
        return raw
    return {**raw, "backends": [_url_shorthand(b) for b in backends]}


def _url_shorthand(raw: Any) -> Any:
    if not isinstance(raw, dict) or "url" not in raw:
        return raw
    rest = {k: v for k, v in raw.items() if k != "url"}
    urls = rest.get("urls", [])  # one that is no array is left for the schema's error naming it
    return {**rest, "urls": [raw["url"], *urls] if isinstance(urls, list) else urls}


def _check_backend(cfg: BackendConfig, path: str) -> None:
    """What depends on the kind: a url, and the kind's own options, checked now rather than at first use."""
    if cfg.kind not in KINDS:
        raise SchemaError(f"{path}.kind: must be one of {', '.join(KINDS)}, got {cfg.kind!r}")
    if cfg.model == "":
        raise SchemaError(f"{path}.model: empty; name a GGUF file, or leave it out and give a url")
    if cfg.model is not None and (cfg.kind != "llamacpp" or cfg.urls):
        raise SchemaError(f"{path}.model: only a llamacpp backend without a url runs its own server from a model file")
    if cfg.model is not None and not cfg.command:
        raise SchemaError(f"{path}.command: must name the server program (default [\"llama-server\"])")
    if cfg.kind != "engine" and not cfg.urls and cfg.model is None:
        raise SchemaError(f"{path}.url: a {cfg.kind} backend needs a url" +
                          (" (or a GGUF `model` that Velo serves itself)" if cfg.kind == "llamacpp" else ""))
    for i, url in enumerate(cfg.urls):
        if not is_server_url(url):
            where = f"{path}.url" if len(cfg.urls) == 1 else f"{path}.urls[{i}]"
            parsed = URL(url)  # quoted as written ("not a url" was said as 'not%20a%20url'), less its password
            raise SchemaError(f"{where}: must be an http:// or https:// URL with a host, got "
                              f"{str(parsed.with_password('***')) if parsed.password else url!r}")
    if cfg.api_key and any(URL(u).user for u in cfg.urls):  # both are an Authorization header: aiohttp refused
        raise SchemaError(f"{path}.api_key: the url carries a user and password already; use one of the two")
    options = cfg.options
    if len(cfg.urls) > 1:
        _, options = ReplicaOptions.split(cfg.options, f"{path}.options")
    if cfg.kind == "engine":
        from adapters.engine import engine_config  # only engine configs pay for importing torch
        engine_config(options, f"{path}.options")
    elif options:  # only the engine and replica sets read options: a misspelt `afinity` was taken without a word
        takes = f"one of: {', '.join(f.name for f in fields(ReplicaOptions))}" if len(cfg.urls) > 1 else \
            f"a {cfg.kind} backend with one url takes none"
        raise SchemaError(f"{path}.options.{sorted(options)[0]}: unknown key ({takes})")


def _check_references(cfg: Config) -> None:
    names = [b.name for b in cfg.backends]
    if len(set(names)) != len(names):
        raise ConfigError("backends: names must be unique")
    for i, r in enumerate(cfg.routes):
        if r.backend not in names:
            raise ConfigError(f"routes[{i}].backend: no backend named {r.backend!r}")
    if cfg.default_backend is not None and cfg.default_backend not in names:
        raise ConfigError(f"default_backend: no backend named {cfg.default_backend!r}")
    # An alias's target is "backend:model" where it starts with a backend's name, else a model name as clients send
    # it ("smollm2:135m"), as the router reads it: one that names no backend was refused as a missing backend.
    for model, settings in cfg.models.items():
        _check_options(settings, f"models.{model}.options")


def _check_options(settings: ModelConfig, path: str) -> None:
    if unknown := sorted(settings.options.keys() - options.names("ollama")):
        raise ConfigError(f"{path}.{unknown[0]}: unknown option (expected one of: "
                          f"{', '.join(sorted(options.names('ollama')))})")
    try:
        settings.sampling()
    except BadRequest as e:
        raise ConfigError(f"{path}.{e.param}: {e.message}") from e
