"""Tokenizer and chat template from the model's own metadata, plus UTF-8-safe streaming detokenization.

GGUF files carry a byte-level BPE or SentencePiece vocabulary (`tokenizer.ggml.*`) that we rebuild as a
`tokenizers` pipeline; Hugging Face folders ship `tokenizer.json`. Chat templates are rendered with jinja2 in a
sandbox, the way `transformers` does (engine/chat_jinja.py).
"""

from __future__ import annotations

import json
import os
import re
from functools import cached_property

import jinja2
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from .chat_jinja import chat_template_env
from .fim import FIM_ENDS, GGUF_FIM_KEYS, FimTokens, fim_markers

# Pre-tokenizer regexes by GGUF `tokenizer.ggml.pre` (llama.cpp's names).
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = _LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
_SPLIT_REGEX = {"llama-bpe": _LLAMA3, "llama3": _LLAMA3, "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2}

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _gpt2_bytes() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character to byte: printable bytes stand for themselves, the other 68 for
    U+0100 onwards in byte order (its `bytes_to_unicode`)."""
    shown = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), 256)]
    others = [b for b in range(256) if b not in shown]
    return {**{chr(b): b for b in shown}, **{chr(256 + n): b for n, b in enumerate(others)}}


_GPT2_BYTES = _gpt2_bytes()


class Tokenizer:
    def __init__(self, tk: HFTokenizer, chat_template: str | None, bos_token: str | None,
                 eos_token: str | None, eos_token_ids: list[int], fim_token_ids: tuple[int, int, int] | None = None):
        self.tk = tk
        self.chat_template = chat_template
        self.bos_token, self.eos_token = bos_token, eos_token
        self.eos_token_ids = eos_token_ids  # tokens that end generation unless the request ignores eos
        self.fim_token_ids = fim_token_ids  # FIM markers the model file declares (GGUF metadata), if any
        self._template: jinja2.Template | None = None

    @property
    def vocab_size(self) -> int:
        return self.tk.get_vocab_size()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids; adds the BOS token if the model wants one and the text does not start with it
        (chat templates usually write it themselves)."""
        add = add_special_tokens and not (self.bos_token and text.startswith(self.bos_token))
        return self.tk.encode(text, add_special_tokens=add).ids

    @cached_property
    def start_ids(self) -> list[int]:
        """What an empty prompt starts from, "the beginning of a new document" as OpenAI's completions put it: the
        BOS token, else the first end-of-text token (what separates documents in training)."""
        bos = self.tk.token_to_id(self.bos_token) if self.bos_token else None
        return [bos] if bos is not None else self.eos_token_ids[:1] or [0]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tk.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_bytes(self, token_id: int) -> bytes | None:
        """A token's own bytes, for a token whose text alone is not whole characters (it decodes to U+FFFD): a
        byte-level vocabulary spells each byte as one character of GPT-2's table, SentencePiece's byte fallback as
        `<0xNN>`. None for a piece spelled some other way."""
        piece = self.tk.id_to_token(token_id) or ""
        if (byte := _BYTE_FALLBACK.fullmatch(piece)) is not None:
            return bytes([int(byte.group(1), 16)])
        if self._byte_level and all(ch in _GPT2_BYTES for ch in piece):
            return bytes(_GPT2_BYTES[ch] for ch in piece)
        return None

    @cached_property
    def _byte_level(self) -> bool:
        return "ByteLevel" in repr(self.tk.decoder)

    @cached_property
    def fim_tokens(self) -> FimTokens | None:
        """The model's fill-in-the-middle markers: those its file declares, else the first family in engine/fim.py's
        FIM_MARKERS whose three markers are all in the vocabulary; None if it has none (no FIM). A marker must be an
        added token, which encoding finds in running text before anything else, so a prompt's text carries it."""
        added = {t.content: i for i, t in self.tk.get_added_tokens_decoder().items()}
        if self.fim_token_ids is not None:
            found = FimTokens(*(self.tk.id_to_token(i) for i in self.fim_token_ids))
            return found if all(added.get(m) == i for m, i in zip(found, self.fim_token_ids)) else None
        return fim_markers(added.__contains__)

    @cached_property
    def fim_stop_ids(self) -> list[int]:
        """Tokens that end a fill-in-the-middle answer: EOS and those of FIM_ENDS in the vocabulary."""
        ends = (self.tk.token_to_id(t) for t in FIM_ENDS)
        return list(dict.fromkeys([*self.eos_token_ids, *(i for i in ends if i is not None)]))

    def apply_chat_template(self, messages: list[dict], tools: list[dict] | None = None,
                            add_generation_prompt: bool = True, **kwargs) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template")
        if self._template is None:
            self._template = chat_template_env().from_string(self.chat_template)
        return self._template.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                     bos_token=self.bos_token or "", eos_token=self.eos_token or "", **kwargs)

    @classmethod
    def from_hf_folder(cls, path: str) -> "Tokenizer":
        tk = HFTokenizer.from_file(os.path.join(path, "tokenizer.json"))
        conf = _read_json(os.path.join(path, "tokenizer_config.json"))
        template = conf.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = next((t["template"] for t in template if t.get("name") == "default"), template[0]["template"])
        jinja_file = os.path.join(path, "chat_template.jinja")
        if template is None and os.path.exists(jinja_file):
            with open(jinja_file) as f:
                template = f.read()
        bos, eos = _token_text(conf.get("bos_token")), _token_text(conf.get("eos_token"))
        eos_ids = _read_json(os.path.join(path, "generation_config.json")).get("eos_token_id", [])
        eos_ids = [eos_ids] if isinstance(eos_ids, int) else list(eos_ids)
        if eos is not None and tk.token_to_id(eos) is not None and tk.token_to_id(eos) not in eos_ids:
            eos_ids.append(tk.token_to_id(eos))
        return cls(tk, template, bos, eos, eos_ids)

    @classmethod
    def from_gguf(cls, reader, meta: dict) -> "Tokenizer":
        """Rebuild the vocabulary from GGUF fields: byte-level BPE (`tokenizer.ggml.model == "gpt2"`: Llama 3,
        Qwen, SmolLM) or SentencePiece BPE (`"llama"`: Llama 2, Mistral), as transformers does."""
        kind = meta.get("tokenizer.ggml.model")
        tokens = reader.fields["tokenizer.ggml.tokens"].contents()
        types = reader.fields["tokenizer.ggml.token_type"].contents()
        if kind == "gpt2":
            merges = [tuple(m.split(" ", 1)) for m in reader.fields["tokenizer.ggml.merges"].contents()]
            tk = _byte_level_bpe(tokens, merges, meta.get("tokenizer.ggml.pre", "default"))
        elif kind == "llama":
            tk = _sentencepiece_bpe(tokens, reader.fields["tokenizer.ggml.scores"].contents())
        else:
            raise ValueError(f"GGUF tokenizer {kind!r} is not supported (gpt2 or llama)")
        tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                               for t, t_type in zip(tokens, types) if t_type in (3, 4)])  # control, user-defined
        bos_id, eos_id = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
        bos = tokens[bos_id] if bos_id is not None else None
        if meta.get("tokenizer.ggml.add_bos_token", kind == "llama") and bos is not None:
            tk.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, bos_id)])
        eos_ids = [i for i in (eos_id, meta.get("tokenizer.ggml.eot_token_id")) if i is not None]
        fim = tuple(meta[k] for k in GGUF_FIM_KEYS) if all(k in meta for k in GGUF_FIM_KEYS) else None
        return cls(tk, meta.get("tokenizer.chat_template"), bos, tokens[eos_id] if eos_id is not None else None,
                   list(dict.fromkeys(eos_ids)), fim)


def _byte_level_bpe(tokens: list[str], merges: list[tuple[str, str]], pre: str) -> HFTokenizer:
    tk = HFTokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, ignore_merges=False))
    tk.pre_tokenizer = _gguf_pre_tokenizer(pre)
    tk.decoder = decoders.ByteLevel()
    return tk


def _sentencepiece_bpe(tokens: list[str], scores: list[float]) -> HFTokenizer:
    """SentencePiece BPE as a `tokenizers` BPE: merges recovered from the scored vocabulary (each piece
    is a merge of any two pieces it splits into, higher score first), `<0xNN>` byte fallback, `▁` spaces."""
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = []
    for piece, score in zip(tokens, scores):
        splits = [(piece[:i], piece[i:], score) for i in range(1, len(piece))
                  if piece[:i] in vocab and piece[i:] in vocab]
        merges += sorted(splits, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)  # stable: ties keep vocabulary order
    tk = HFTokenizer(models.BPE(vocab, [(a, b) for a, b, _ in merges], fuse_unk=True, byte_fallback=True))
    tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(" ", 1, 0)])
    return tk


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas that never end inside a UTF-8 character:
    a delta is held back while the decoded tail is still a replacement character (vLLM's scheme,
    decoding only a short window so the cost per token stays constant)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = self.read = 0  # window [prefix, read) is already emitted text

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        decode = self.tokenizer.decode
        emitted = decode(self.ids[self.prefix:self.read])
        text = decode(self.ids[self.prefix:])
        if len(text) <= len(emitted) or text.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(emitted):]

    def flush(self) -> str:
        """Whatever is still held back, at the end of a request, but a character its output limit cut in two: the
        bytes of it that came are dropped, as Ollama drops them, where they went out as a broken character."""
        emitted = self.tokenizer.decode(self.ids[self.prefix:self.read])
        text = self.tokenizer.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return text[len(emitted):].rstrip("\ufffd")


def _gguf_pre_tokenizer(pre: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre not in _SPLIT_REGEX)
    if pre in _SPLIT_REGEX:
        split = pre_tokenizers.Split(Regex(_SPLIT_REGEX[pre]), behavior="isolated")
        return pre_tokenizers.Sequence([split, byte_level])
    if pre in ("smollm", "starcoder", "refact"):
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    return byte_level  # "gpt2", "default": GPT-2's own regex


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _token_text(token) -> str | None:
    return token.get("content") if isinstance(token, dict) else token
