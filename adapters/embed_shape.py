"""Embedding `dimensions` for backends that cannot shorten vectors themselves, Ollama's own way (server/routes.go,
EmbedHandler): when 0 < dimensions < the vector's length, keep the first `dimensions` values and L2-normalise
again; otherwise the vector is left as it is."""
from __future__ import annotations

import math


def shorten(vectors: list[list[float]], dimensions: int | None) -> list[list[float]]:
    if not dimensions or dimensions < 1:
        return vectors
    return [normalized(v[:dimensions]) if dimensions < len(v) else v for v in vectors]


def normalized(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else vector
