"""The four dialects Velo speaks (one converter module each), and where their APIs differ in what they ask of Velo
beyond the request itself."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

SSE_KEEPALIVE = b": keepalive\n\n"  # an SSE comment: every SSE parser skips it, every read timeout sees bytes


def new_id(prefix: str) -> str:
    """An id for what Velo makes in an answer (`msg_...`, `resp_...`, `toolu_...`): its API's prefix, 24 random hex."""
    return f"{prefix}_{os.urandom(12).hex()}"


@dataclass(frozen=True)
class Rules:
    trims_context: bool  # a chat longer than the context loses its oldest turns (Ollama), else a 400 the client knows
    # Asking a model to think, or to see a chat's images, when it cannot is a 400; else that part is left out (the
    # thinking switch left to the model, each image replaced by a note) and the model answers without it.
    refuses_thinking: bool
    refuses_images: bool


RULES = {
    # Ollama refuses thinking but passes images on unchecked (server/routes.go); a chat keeps its images in every
    # later turn (Continue and Open WebUI send them again), so a 400 failed the rest of the session: a note instead.
    "ollama": Rules(trims_context=True, refuses_thinking=True, refuses_images=False),
    # "context_length_exceeded" makes agents compact; OpenAI refuses an image to a model that cannot see.
    "openai": Rules(trims_context=False, refuses_thinking=True, refuses_images=True),
    # Ollama relaxes thinking for its Anthropic API so Claude Code (thinking: adaptive or enabled) runs on any model;
    # Codex sends reasoning.effort on every request, so the Responses API gets the same. An agent's history keeps
    # what it was sent (Claude Code's Read of a picture is an image in a tool result): a 400 there fails every later
    # turn of the session, so these two leave images out too.
    "anthropic": Rules(trims_context=False, refuses_thinking=False, refuses_images=False),
    "responses": Rules(trims_context=False, refuses_thinking=False, refuses_images=False),
}


# llama-server's own, passed on (proxy/routes_llama.py); /slots also as /slots/<id>. /embedding is its embeddings
# route that is not OpenAI's (`content`, each prompt's vectors in an array of results, pooling `none` too).
LLAMA_SERVER_PATHS = ("/infill", "/completion", "/tokenize", "/detokenize", "/apply-template", "/props", "/slots",
                      "/embedding", "/rerank", "/reranking", "/v1/rerank", "/v1/reranking")


# OpenAI's routes as llama-server also answers them, without /v1 (crush's llamacpp provider calls them so)
UNVERSIONED = ("/models", "/chat/completions", "/completions", "/embeddings")


def dialect_of(path: str, headers: Mapping[str, str]) -> str:
    """By the URL path; a /v1 path that is not OpenAI's own by `anthropic-version`, which Anthropic's clients send on
    every request and OpenAI's never do: `/v1/models`, which OpenAI and Anthropic share, and a path no route serves
    (Anthropic's files API, /v1/v1/messages from a base URL given with its /v1), whose 404 or 401 the anthropic
    SDK reads as Anthropic's (`e.type`). llama-server's own routes answer errors as it does, in OpenAI's shape."""
    if path.startswith("/v1/responses"):
        return "responses"
    llama_servers = path in LLAMA_SERVER_PATHS or path.startswith("/slots/")
    openais = path != "/v1/models" and path.removeprefix("/v1") in UNVERSIONED or llama_servers
    if path.startswith("/v1/messages") or (path.startswith("/v1/") and "anthropic-version" in headers and not openais):
        return "anthropic"
    openai = path.startswith("/v1/") or path == "/v1" or path in UNVERSIONED or llama_servers
    return "openai" if openai else "ollama"
