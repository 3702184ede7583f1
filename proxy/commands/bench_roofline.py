"""`velo bench`'s roofline: one stream's decode rate as the memory bandwidth it achieved, as a fraction of this
machine's copy bandwidth (engine/roofline.py). A decode step at batch 1 reads every weight once, so the fraction
says how far one stream is from what the memory can give. Shown for a server that says which GGUF file on this
machine it runs (the Modelfile's `FROM` in /api/show, as Ollama writes its blob's path: the engine's, and a
llama-server's whose model file is on this machine, do).
"""
from __future__ import annotations

import os

import aiohttp
import orjson

from . import CommandError
from .client import request


async def served_gguf(session: aiohttp.ClientSession, base: str, model: str) -> str | None:
    """The GGUF file on this machine that `model` runs from, if the server says; None otherwise."""
    try:
        async with request(session, "POST", f"{base}/api/show", json={"model": model}) as resp:
            shown = orjson.loads(await resp.read())
    except (CommandError, orjson.JSONDecodeError):
        return None
    modelfile = shown.get("modelfile") if isinstance(shown, dict) else None
    lines = modelfile.splitlines() if isinstance(modelfile, str) else []
    path = next((line[5:].strip() for line in lines if line.startswith("FROM ")), "")
    return path if path.endswith(".gguf") and os.path.isfile(path) else None


def roofline_line(path: str, tok_s: float) -> str:
    """One line: the bytes a token reads (the GGUF's weights, as llama.cpp reads them) times one stream's tok/s,
    against a large copy measured now (torch is imported only here: it takes seconds)."""
    from engine.roofline import gguf_decode_bytes, memory_bandwidth
    weights, machine = gguf_decode_bytes(path), memory_bandwidth()
    achieved = tok_s * weights / 1e9
    return (f"roofline: one stream at {tok_s:.1f} tok/s reads {achieved:.2f} GB/s of weights "
            f"({weights / 1e6:.0f} MB a token), {achieved / machine:.0%} of this machine's copy bandwidth "
            f"({machine:.1f} GB/s)")
