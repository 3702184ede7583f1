"""Which model servers answer on this machine, what they are and what models they serve.

Each port gets the same handful of GETs at once (then `/props`, below), with a short timeout, and is named by its
answers, not by its number (a llama-server may well listen on 8000):
- `/` says "Ollama is running" and `/metrics` has `velo_` series: a Velo (it imitates Ollama; never configure
  a Velo as its own backend); without those series: Ollama (`/api/version`, `/api/tags`);
- `/props` with `default_generation_settings`: llama.cpp's llama-server (slots and context from it), asked only
  of what is neither: a Velo passes `/props` on to its llama-server, which that started if it was stopped;
- `/v1/models` with a `data` list (or 401: it wants a key): an OpenAI-compatible server (vLLM, SGLang, LM Studio).
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from adapters.openai_compat import OWNERS

from .client import listed_names

# The usual port of each server: (product, kind). An OpenAI-compatible server whose answers do not name it is
# called after its port's usual product.
USUAL_PORTS = {11434: ("Ollama", "ollama"), 8080: ("llama-server", "llamacpp"), 8000: ("vLLM", "openai"),
               30000: ("SGLang", "openai"), 1234: ("LM Studio", "openai")}
PROBED_PATHS = ("/", "/api/version", "/api/tags", "/v1/models", "/metrics")


@dataclass
class Answer:
    status: int  # 0: no answer (refused, timed out)
    body: bytes = b""

    def json(self) -> Any:
        if self.status != 200:
            return None
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None


@dataclass
class Server:
    port: int
    url: str
    kind: str  # "velo" | "ollama" | "llamacpp" | "openai" | "unknown"
    product: str  # what to call it: "Ollama", "llama-server", "vLLM", "OpenAI API", "Velo"
    models: list[str] = field(default_factory=list)
    version: str = ""
    slots: int | None = None
    context: int | None = None
    needs_key: bool = False  # answered 401/403 without an API key
    note: str = ""


async def _get(session: aiohttp.ClientSession, url: str) -> Answer:
    try:
        async with session.get(url, allow_redirects=False) as resp:
            return Answer(resp.status, await resp.read())
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return Answer(0)


def _openai_product(port: int, models: list[dict[str, Any]]) -> str:
    owner = next((OWNERS[m["owned_by"]] for m in models if m.get("owned_by") in OWNERS), None)
    product, kind = USUAL_PORTS.get(port, ("", ""))
    return owner or (product if kind == "openai" else "OpenAI API")


def _imitates_ollama(root: Answer) -> bool:
    return root.status == 200 and root.body.startswith(b"Ollama is running")


def identify(port: int, url: str, answers: dict[str, Answer]) -> Server | None:
    """What answered on `port`, from the answers to PROBED_PATHS and `/props`; None if nothing did."""
    if all(a.status == 0 for a in answers.values()):
        return None
    tags = listed_names(answers["/api/tags"].json(), "models", "name")
    if _imitates_ollama(answers["/"]):
        if answers["/metrics"].status == 200 and b"velo_" in answers["/metrics"].body:
            return Server(port, url, "velo", "Velo", tags, note="a Velo gateway: not configured as a backend of itself")
        version = answers["/api/version"].json()
        return Server(port, url, "ollama", "Ollama", tags,
                      version=str(version.get("version", "")) if isinstance(version, dict) else "")
    ids = listed_names(answers["/v1/models"].json(), "data", "id")
    props = answers["/props"].json()
    if isinstance(props, dict) and isinstance(props.get("default_generation_settings"), dict):
        files = [os.path.basename(i) for i in ids or [props.get("model_path", "")] if i]
        return Server(port, url, "llamacpp", "llama-server", files, slots=props.get("total_slots"),
                      context=props["default_generation_settings"].get("n_ctx"))
    if answers["/v1/models"].status in (401, 403):
        return Server(port, url, "openai", _openai_product(port, []), needs_key=True,
                      note="it asks for an API key: set api_key in its [[backends]] entry")
    listing = answers["/v1/models"].json()
    if isinstance(listing, dict) and isinstance(listing.get("data"), list):
        models = [m for m in listing["data"] if isinstance(m, dict)]
        return Server(port, url, "openai", _openai_product(port, models), ids)
    return Server(port, url, "unknown", "unknown", note="answers HTTP but speaks none of the model-server APIs")


async def probe_port(session: aiohttp.ClientSession, host: str, port: int) -> Server | None:
    url = f"http://{_in_url(host)}:{port}"
    answers = dict(zip(PROBED_PATHS, await asyncio.gather(*(_get(session, url + path) for path in PROBED_PATHS))))
    answers["/props"] = Answer(0) if _imitates_ollama(answers["/"]) else await _get(session, url + "/props")
    return identify(port, url, answers)


def _in_url(host: str) -> str:
    """An IPv6 address in brackets, as a URL has it: `--host ::1` made no URL, and every port read as empty."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


async def find_servers(host: str = "127.0.0.1", ports: list[int] | None = None, timeout: float = 1.5) -> list[Server]:
    """The servers answering on `ports` (default: the usual ones), in the order of `ports`, each port once: a port
    named twice would give two backends of one name, a config.toml Velo refuses."""
    ports = list(dict.fromkeys(ports or USUAL_PORTS))
    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=client_timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        found = await asyncio.gather(*(probe_port(session, host, p) for p in ports))
    return [s for s in found if s is not None]
