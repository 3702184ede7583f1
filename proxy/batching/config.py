"""The `[batching]` table of config.toml: coalescing, embedding micro-batches and per-backend queues."""
from __future__ import annotations

from dataclasses import dataclass

from adapters.schema import setting


@dataclass
class BatchingConfig:
    """Traffic shaping in front of every backend."""

    coalesce: bool = setting(True, "identical in-flight deterministic requests (temperature 0 or a seed, same API "
                             "key) share one backend call; each client still gets its own stream in its own dialect "
                             "from the first token")
    embed_window_ms: float = setting(5.0, "how long an embedding request waits for others to the same model to "
                                     "share one backend call", min=0)
    embed_max_inputs: int = setting(64, "a batch is sent as soon as it holds this many inputs", min=1)
    max_queue: int = setting(256, "requests that may wait per backend beyond its max_concurrency; more get 429 "
                             "with Retry-After", min=0)
    # 300 s: as long as a running request may wait for its first token (first_token_timeout's default), so a client
    # has its first token or an error within 600 s, the openai and anthropic SDKs' own timeout, after which they ask
    # again; less would turn away requests that a slow backend (a CPU, 4 slots) serves in turn, to queue again last.
    queue_timeout_s: float = setting(300.0, "seconds a request may wait for a backend slot (the backend's timeouts "
                                     "start once it runs); then 429 with Retry-After, as for a full queue. A "
                                     "background response, which its client polls, waits up to its backend's "
                                     "total_timeout where that is longer", min=0.001)
    supersede_autocomplete: bool = setting(True, "a newer fill-in-the-middle request from the same client "
                                           "(X-Velo-Client header, else its API key or address) at the same place "
                                           "(the lines around the cursor's) cancels the older one, queued or running")
