"""The four dialects Velo speaks (one converter module each), and where their APIs differ in what they ask of Velo
beyond the request itself."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Rules:
    trims_context: bool  # a chat longer than the context loses its oldest turns (Ollama), else a 400 the client knows
    # Asking a model for what it cannot do (think, see images) is a 400; else that part is left out (the thinking
    # switch left to the model, each image replaced by a note) and the model answers without it.
    strict_capabilities: bool


RULES = {
    "ollama": Rules(trims_context=True, strict_capabilities=True),  # Ollama's own behaviour, both
    "openai": Rules(trims_context=False, strict_capabilities=True),  # "context_length_exceeded" makes agents compact
    # Ollama relaxes thinking for its Anthropic API so Claude Code (thinking: adaptive or enabled) runs on any model;
    # Codex sends reasoning.effort on every request, so the Responses API gets the same. An agent's history keeps
    # what it was sent (Claude Code's Read of a picture is an image in a tool result): a 400 there fails every later
    # turn of the session, so these two leave images out too.
    "anthropic": Rules(trims_context=False, strict_capabilities=False),
    "responses": Rules(trims_context=False, strict_capabilities=False),
}


def dialect_of(path: str, headers: Mapping[str, str]) -> str:
    """By the URL path; `/v1/models`, which OpenAI and Anthropic share, by `anthropic-version`, which Anthropic's
    clients send on every request and OpenAI's never do."""
    if path.startswith("/v1/messages") or (path.startswith("/v1/models") and "anthropic-version" in headers):
        return "anthropic"
    if path.startswith("/v1/responses"):
        return "responses"
    return "openai" if path.startswith("/v1/") or path == "/v1" else "ollama"
