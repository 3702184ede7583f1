"""Embeddings shaped Ollama's own way (server/routes.go, EmbedHandler) for backends that cannot do it themselves:
`dimensions` (when 0 < dimensions < the vector's length, keep the first `dimensions` values and L2-normalise again;
otherwise the vector is left as it is), and the `num_ctx` an input is cut to."""
from __future__ import annotations

import math
from typing import Any


def shorten(vectors: list[list[float]], dimensions: int | None) -> list[list[float]]:
    if not dimensions or dimensions < 1:
        return vectors
    return [normalized(v[:dimensions]) if dimensions < len(v) else v for v in vectors]


def normalized(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else vector


def num_ctx(options: dict[str, Any]) -> int | None:
    """The client's `options.num_ctx`: EmbedHandler embeds at most that many tokens of an input (fewer where the
    model's context is shorter); None where it sets none (or no count of at least 1)."""
    n = options.get("num_ctx")
    return int(n) if isinstance(n, (int, float)) and not isinstance(n, bool) and n >= 1 else None
