"""The Ollama server settings worth setting for this machine, each with the reason, from the hardware found.

Ollama's defaults (docs/faq.mdx, docs/context-length.mdx): 1 parallel request per model, models kept 5 minutes,
a 4k context below 24 GiB of VRAM, flash attention where the backend supports it, an f16 KV cache. Memory for
the KV cache grows with parallel x context; a q8_0 cache takes about half of f16's and needs flash attention.
The context is sized for a reference model, Llama-3.1-8B (32 layers x 8 KV heads x 128 dims: 128 KiB per token
at f16), whose KV cache may take a quarter of the memory the model runs from; the weights and the rest of the
machine keep the other three quarters.
"""
from __future__ import annotations

from dataclasses import dataclass

from .hardware import GiB, Hardware

KV_BYTES_PER_TOKEN = {"f16": 131072, "q8_0": 69632}  # reference 8B model; q8_0 is 34 bytes per 32 values
KV_SHARE = 0.25
CONTEXTS = (65536, 32768, 16384, 8192, 4096, 2048)


@dataclass
class Setting:
    name: str
    value: str
    default: str
    reason: str

    @property
    def changed(self) -> bool:
        return self.value != self.default


def parallel(hw: Hardware) -> tuple[int, str]:
    if hw.gpus:
        n = 4 if hw.gpu_memory >= 8 * GiB else 2
        return n, (f"a GPU decodes {n} streams for little more than the cost of one; Velo's queue holds the rest, "
                   "autocomplete first (velo doctor sets Velo's max_concurrency for Ollama to match)")
    n = 4 if hw.cpu.cores >= 16 else 2
    return n, (f"on a {hw.cpu.cores}-core CPU decoding is bound by memory bandwidth: more streams add little total "
               "speed and each gets slower (llama-server on 2 cores: 90 tok/s for one stream, 113 for eight "
               f"together); {n} lets a short autocomplete run beside a long chat, and Velo's queue holds the rest "
               "(velo doctor sets Velo's max_concurrency for Ollama to match)")


def memory_for_models(hw: Hardware) -> tuple[int, str]:
    if hw.gpus and hw.gpu_memory:
        return hw.gpu_memory, f"{hw.gpu_memory / GiB:.0f} GiB of GPU memory"
    return hw.memory_available, f"{hw.memory_available / GiB:.0f} GiB of available RAM"


def context_and_kv(hw: Hardware, slots: int) -> tuple[int, str, str]:
    """The largest context whose KV cache for `slots` streams fits the budget, f16 before q8_0 at equal size."""
    memory, described = memory_for_models(hw)
    budget = memory * KV_SHARE
    for ctx in CONTEXTS:
        for kv, per_token in KV_BYTES_PER_TOKEN.items():
            need = slots * ctx * per_token
            if need <= budget or ctx == CONTEXTS[-1] and kv == "q8_0":
                return ctx, kv, (f"{slots} x {ctx} tokens of {kv} KV cache for an 8B model take {need / GiB:.1f} "
                                 f"GiB, within a quarter of {described}")
    raise AssertionError("unreachable: the last candidate is always taken")


def ollama_settings(hw: Hardware) -> list[Setting]:
    slots, why_slots = parallel(hw)
    ctx, kv, why_ctx = context_and_kv(hw, slots)
    memory, described = memory_for_models(hw)
    roomy = memory >= 16 * GiB
    return [
        Setting("OLLAMA_NUM_PARALLEL", str(slots), "1", why_slots),
        Setting("OLLAMA_CONTEXT_LENGTH", str(ctx), "4096",
                why_ctx + "; coding tools and agents want long contexts (Ollama suggests 64k for them)"),
        Setting("OLLAMA_KV_CACHE_TYPE", kv, "f16",
                "f16 fits, and keeps full precision" if kv == "f16" else
                "q8_0 halves the KV cache for a very small loss in precision, so the context above fits"),
        Setting("OLLAMA_FLASH_ATTENTION", "1" if kv != "f16" or hw.gpus else "", "",  # "": unset, Ollama decides
                "a quantized KV cache works only with flash attention" if kv != "f16" else
                "less memory as the context grows; forced on so a backend that would not choose it still does"
                if hw.gpus else "the f16 cache does not need it; Ollama turns it on where the CPU backend supports it"),
        Setting("OLLAMA_KEEP_ALIVE", "30m" if roomy else "5m", "5m",
                f"{described} leaves room to keep a model loaded between pauses; a reload costs seconds of "
                "first-token latency" if roomy else f"with {described}, an idle model should give memory back soon"),
    ]
