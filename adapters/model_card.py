"""What Ollama's `/api/show` says about a model, for backends that are not Ollama: the Modelfile `parameters` text,
an Ollama-style Go `template`, and `model_info` under Ollama's GGUF key names.

IDE clients read only `parameters` (`num_ctx`, one `stop` line per stop word) and test `template` for
`{{ .Suffix }}` to decide whether fill-in-the-middle works, so the template is written per chat family Velo knows
(recognised from the model's Jinja template by its turn markers) and carries a `.Suffix` branch exactly when the
backend can fill in the middle. The templates follow Ollama's own (`template/chatml.gotmpl`,
`llama3-instruct.gotmpl`, `gemma-instruct.gotmpl`; qwen2.5-coder's for the FIM branch).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.fim import GGUF_FIM_KEYS, FimTokens, fim_markers

from .gguf_header import SHORT, read_header, read_metadata


@dataclass(frozen=True)
class Family:
    marker: str  # what the model's Jinja template contains
    turns: str  # the Go template of a conversation, Ollama's form (range over .Messages)
    stops: tuple[str, ...]
    tools: str = ""  # the system turn that offers tools, for a model whose template renders them


FAMILIES = {
    "chatml": Family("<|im_start|>",  # Qwen, SmolLM2, Hermes ...
                     "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n"
                     "{{ end }}<|im_start|>assistant\n", ("<|im_start|>", "<|im_end|>"),
                     "{{- if .Tools }}<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist "
                     "with the user query.\n\n<tools>\n{{ .Tools }}\n</tools><|im_end|>\n{{ end }}"),
    "llama3": Family("<|start_header_id|>",
                     "{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>\n\n{{ .Content }}"
                     "<|eot_id|>\n{{- end }}<|start_header_id|>assistant<|end_header_id|>\n\n",
                     ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
                     "{{- if .Tools }}<|start_header_id|>system<|end_header_id|>\n\nYou have access to the "
                     "following functions:\n\n{{ .Tools }}<|eot_id|>\n{{- end }}"),
    "gemma": Family("<start_of_turn>",
                    "{{- range .Messages }}<start_of_turn>{{ if eq .Role \"assistant\" }}model{{ else }}{{ .Role }}"
                    "{{ end }}\n{{ .Content }}<end_of_turn>\n{{ end }}<start_of_turn>model\n", ("<end_of_turn>",)),
}
PLAIN = "{{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}"  # a base model: the prompt as it is

_PARAM_COLUMN = 30  # Ollama writes `fmt.Sprintf("%-*s %#v", 30, key, value)` (server/routes.go, GetModelInfo)


def family(jinja: str) -> Family | None:
    return next((f for f in FAMILIES.values() if f.marker in (jinja or "")), None)


def go_template(jinja: str, fim: FimTokens | None = None) -> str:
    """An Ollama-style template for a model whose chat template is `jinja`; with a `.Suffix` branch iff `fim`, and a
    `.Tools` block, as Ollama's own templates have, for every chat model: Velo writes tools into the prompt of one
    whose template cannot (adapters/tool_prompt.py), and /api/show says `tools` for all. LiteLLM decides whether an
    Ollama model calls functions by "tools" in its template (llms/ollama/common_utils.py; Open Interpreter fell
    back to text mode on the engine's SmolLM2), and agents (CrewAI) ask it before they offer tools."""
    fam = family(jinja)
    body = fam.tools + fam.turns if fam else PLAIN
    if fim is None:
        return body
    fill = fim.prompt("{{ .Prompt }}", "{{ .Suffix }}")
    return f"{{{{- if .Suffix }}}}{fill}{{{{ else }}}}{body}{{{{ end }}}}"


def stop_words(jinja: str) -> list[str]:
    fam = family(jinja)
    return list(fam.stops) if fam else []


def parameters(num_ctx: int | None, stops: list[str]) -> str:
    """Modelfile PARAMETER lines as Ollama's /api/show writes them: `num_ctx 8192`, `stop "<|im_end|>"` per word."""
    return parameter_lines({"num_ctx": num_ctx, "stop": stops} if num_ctx else {"stop": stops})


def parameter_lines(options: dict[str, Any]) -> str:
    """Options as PARAMETER lines: a line per value of a list (`stop`), none for an empty one."""
    pairs = [(key, v) for key, value in options.items() for v in (value if isinstance(value, list) else [value])]
    return "\n".join(f"{key:<{_PARAM_COLUMN}} {json.dumps(value, ensure_ascii=False)}" for key, value in pairs)


@dataclass(frozen=True)
class Shape:
    """A transformer's dimensions, as Ollama's model_info names them under `<architecture>.`."""

    architecture: str
    parameter_count: int
    context_length: int
    embedding_length: int = 0
    block_count: int = 0
    feed_forward_length: int = 0
    head_count: int = 0
    head_count_kv: int = 0
    vocab_size: int = 0
    rope_freq_base: float = 0.0


def model_info(shape: Shape) -> dict[str, Any]:
    """Ollama's keys with scalar values; dimensions a backend cannot tell (0) are left out."""
    a = shape.architecture
    keys = {"general.architecture": a, "general.parameter_count": shape.parameter_count,
            f"{a}.context_length": shape.context_length, f"{a}.embedding_length": shape.embedding_length,
            f"{a}.block_count": shape.block_count, f"{a}.feed_forward_length": shape.feed_forward_length,
            f"{a}.attention.head_count": shape.head_count, f"{a}.attention.head_count_kv": shape.head_count_kv,
            f"{a}.vocab_size": shape.vocab_size, f"{a}.rope.freq_base": shape.rope_freq_base}
    return {k: v for k, v in keys.items() if v}


def file_context(info: dict[str, Any], family: str = "") -> int | None:
    """The context a model's file says it was trained for, under Ollama's key `<architecture>.context_length`."""
    value = info.get(f"{info.get('general.architecture') or family}.context_length")
    return value if isinstance(value, int) else None


@dataclass(frozen=True)
class GgufFacts:
    """A local GGUF file as /api/show tells it: its metadata as Ollama shows it without `verbose` (an array of more
    than SHORT items, such as the vocabulary, as []; no chat template), the FIM tokens its vocabulary has, its
    chat template, and its tensors (name, type, shape), which Ollama's /api/show lists verbose or not."""

    info: dict[str, Any]
    fim: FimTokens | None
    jinja: str
    tensors: list[dict[str, Any]]


def gguf_facts(path: str) -> GgufFacts:
    info, tensors = read_header(path, arrays=frozenset({"tokenizer.ggml.tokens"}))
    vocab = info.get("tokenizer.ggml.tokens") or []
    if len(vocab) > SHORT:
        info["tokenizer.ggml.tokens"] = []
    jinja = info.pop("tokenizer.chat_template", None)
    roles = [info.get(key) for key in GGUF_FIM_KEYS]  # llama.cpp's own keys
    if all(isinstance(i, int) and 0 <= i < len(vocab) for i in roles):
        fim: FimTokens | None = FimTokens(*(vocab[i] for i in roles))
    else:
        fim = fim_markers(set(vocab).__contains__)
    return GgufFacts(info, fim, jinja if isinstance(jinja, str) else "", tensors)


def verbose_info(path: str) -> dict[str, Any]:
    """The file's metadata as Ollama's /api/show has it with `verbose`: every array whole (the vocabulary, its
    merges), no chat template. Read anew each time, not kept: a 151k-token vocabulary is tens of MB as objects."""
    info = read_metadata(path, whole=True)
    info.pop("tokenizer.chat_template", None)
    return info
