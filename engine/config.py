"""The engine's settings."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


def _doc(default, doc: str, **more):
    """A field whose `doc` metadata config.example.toml is rendered from (proxy/config_example.py)."""
    return field(default=default, metadata={"doc": doc, **more})


@dataclass
class SpeculativeConfig:
    """Speculative decoding (options.speculative): draft tokens cheaply, verify them in one pass of the model."""

    method: str = _doc("ngram", '"ngram" drafts from the prompt (prompt lookup: code edits, RAG; 2.18x on SmolLM2); '
                       '"draft" drafts with a smaller model of the same tokenizer (Qwen2.5-Coder 0.5B -> 1.5B: 2.05x '
                       "with int4_weights = false, ~1.0x with int4 weights, which make plain decoding 2.25x faster "
                       "there; bench/spec_decode.py)")
    num_tokens: int = _doc(4, "most draft tokens per step (k)")
    draft_model: str | None = _doc(None, '.gguf file or Hugging Face folder, for method "draft"',
                                   default_doc="none")
    ngram_max: int = _doc(4, "longest suffix prompt lookup tries to match")
    ngram_min: int = _doc(2, "shortest suffix prompt lookup tries to match")
    token_cost: float = _doc(0.1, "cost of verifying one more token, relative to a plain decode step")
    draft_cost: float | None = _doc(None, "cost of one draft-model step, likewise",
                                    default_doc="its share of the target's parameters")
    max_batch: int = _doc(8, "speculate only while at most this many sequences decode: a bigger batch keeps the "
                          "matmuls busy, so verified drafts cost as much as plain tokens")
    draft_vocab: int = _doc(32768, "the draft model scores only token ids below this, plus those already in the "
                            "sequence (1.88x -> 2.05x on Qwen2.5-Coder 0.5B -> 1.5B); 0: the whole vocabulary")

    def __post_init__(self) -> None:
        if self.method not in ("ngram", "draft") or self.num_tokens < 1 or not 1 <= self.ngram_min <= self.ngram_max \
                or self.max_batch < 1 or self.draft_vocab < 0:
            raise ValueError(f"invalid speculative config: {self}")
        if self.method == "draft" and not self.draft_model:
            raise ValueError("speculative method 'draft' needs draft_model")


_DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclass
class EngineConfig:
    """How the engine runs (the rest of an engine backend's options)."""

    device: str = _doc("cpu", '"cpu" or "cuda"')
    dtype: str | torch.dtype = _doc("auto", '"auto": bfloat16 on CUDA and on CPUs with native bf16 (AVX512-BF16 '
                                    '/ AMX), else float32; or "bfloat16", "float16", "float32"')
    kv_memory: int | float = _doc(512 * 2**20, "KV cache size: bytes if > 1, else a fraction of the memory free at "
                                  "start")
    block_size: int = _doc(16, "tokens per KV cache block", min=1)
    max_num_seqs: int = _doc(32, "sequences decoded together at most (continuous batching)", min=1)
    max_step_tokens: int = _doc(2048, "tokens per forward step (decodes + prefill chunks)", min=1)
    prefill_chunk: int = _doc(512, "longest piece of one prompt per step (chunked prefill)", min=1)
    enable_prefix_cache: bool = _doc(True, "reuse the KV of prompt prefixes seen before (radix cache)")
    seed: int | None = _doc(None, "seed for requests without their own", default_doc="random")
    progress: bool = _doc(True, "progress bar while loading")
    num_threads: int | None = _doc(None, "the most CPU threads a step uses; each step uses no more than the cores "
                                   "other processes leave free (an IDE, a browser), since a thread that loses its "
                                   "core stalls the rest", default_doc="all cores", min=1)
    int4_weights: bool = _doc(True, "on CPU, Q4_0/Q4_1/Q4_K layer matrices of a GGUF stay 4-bit for decode steps "
                              "on few rows (torch's int4 kernel): 1.6-2.3x decode tok/s measured. Q5/Q6_K/Q8_0 ones "
                              "become per-row int8, and the LM head is quantized too (a Q8_0 head exactly, as two "
                              "4-bit planes): 1.12x a decode step on SmolLM2-135M and Qwen2.5-Coder-1.5B. Prompts "
                              "still run on a dense copy, so these matrices take ~1.3x the memory. false: dequantize "
                              "everything")
    kv_dtype: str = _doc("auto", '"auto" (the compute dtype) or "int8": the KV cache in blocks of 32 int8 values '
                         "with a float16 scale (llama.cpp's q8_0), 0.53x the bytes a token, so ~1.9x the tokens fit "
                         "in kv_memory; perplexity +0.2% on SmolLM2-135M (bench/kv_int8.py)")
    compile: bool = _doc(False, "decode steps through torch.compile (inductor C++), compiled while the engine "
                         "loads (1-4 minutes on 2 cores the first time, cached on disk after): SmolLM2's decode step "
                         "1.8x faster (20.1 -> 11.1 ms)")
    cuda_graphs: bool = _doc(True, "on CUDA, decode steps are replayed as CUDA graphs, one per batch size bucket "
                             "(1, 2, 4, ..., 256), captured while the engine loads (a draft model's as well)")
    speculative: SpeculativeConfig | None = _doc(None, "speculative decoding for eligible requests, exact (greedy "
                                                 "output unchanged in float32; in bfloat16 a near-tie may break "
                                                 "the other way); a table of the speculative keys below",
                                                 default_doc="off")

    def __post_init__(self) -> None:
        if self.kv_memory <= 0:  # -5 served a context window of 17 tokens
            raise ValueError(f"kv_memory: must be above 0 (bytes, or a fraction of free memory), got {self.kv_memory}")
        if self.kv_dtype not in ("auto", "int8"):
            raise ValueError(f"kv_dtype must be 'auto' or 'int8', not {self.kv_dtype!r}")
        # each was "could not start: module 'torch' has no attribute 'bogus'" (or torch's list of its device types)
        if isinstance(self.dtype, str) and self.dtype not in _DTYPES:
            raise ValueError(f"dtype: must be one of {', '.join(map(repr, _DTYPES))}, got {self.dtype!r}")
        try:
            device = torch.device(self.device)
        except RuntimeError as e:
            raise ValueError(f'device: not a torch device ("cpu", "cuda", "cuda:1", ...), got {self.device!r}') from e
        if device.type == "cuda" and (device.index or 0) >= (torch.cuda.device_count() if torch.cuda.is_available()
                                                             else 0):
            # was "could not start: Torch not compiled with CUDA enabled", with no word of which setting asked
            raise ValueError(f"device: {self.device!r} asked, but {_cuda_here()}")

    @property
    def kv_int8(self) -> bool:
        return self.kv_dtype == "int8"

    def torch_dtype(self) -> torch.dtype:
        if isinstance(self.dtype, torch.dtype):
            return self.dtype
        if self.dtype == "auto":
            return torch.bfloat16 if torch.device(self.device).type == "cuda" or _cpu_has_bf16() else torch.float32
        return getattr(torch, self.dtype)


def _cuda_here() -> str:
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is a CPU-only build; use \"cpu\" or install a CUDA build of torch"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return f"torch sees {count} CUDA device{'s' * (count != 1)} here" + ("; use \"cpu\"" if not count else "")


def _cpu_has_bf16() -> bool:
    """AVX512-BF16 / AMX: bf16 matmuls run natively, halving the weight bytes each decode step reads (a
    memory-bound step on CPU: 68 -> 35 ms for SmolLM2-135M on 2 cores); without them bf16 is emulated and slower."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
