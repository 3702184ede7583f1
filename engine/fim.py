"""Fill-in-the-middle markers by model family: the one table both the engine's prompts (engine/tokenizer.py) and
what /api/show tells of a llama-server model (adapters/model_card.py) are read from.

Plain Python with no imports beyond typing, so adapters read the table without loading `tokenizers` or torch.
The families are the ones llama.cpp's vocabulary scan knows (llama-vocab.cpp, FIM_PRE/SUF/MID), each triple as the
tokenizer spells its special tokens.
"""

from __future__ import annotations

from typing import Callable, NamedTuple


class FimTokens(NamedTuple):
    """A model's fill-in-the-middle markers, each the text of one special token of its vocabulary."""
    prefix: str
    suffix: str
    middle: str

    def prompt(self, prefix: str, suffix: str) -> str:
        """The prompt asking for the text between prefix and suffix, in prefix-suffix-middle order as llama.cpp's
        /infill builds it; the model's BOS is added when it is encoded."""
        return f"{self.prefix}{prefix}{self.suffix}{suffix}{self.middle}"


# Most specific first: a vocabulary with Qwen's markers and StarCoder's is Qwen's. Each is written prefix-suffix-
# middle (FimTokens.prompt), as llama-server's /infill writes every family unless started with --spm-infill.
FIM_MARKERS = (
    FimTokens("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, CodeGemma
    FimTokens("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, Granite
    FimTokens("<fim-prefix>", "<fim-suffix>", "<fim-middle>"),  # SantaCoder
    FimTokens("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>", "<\uff5cfim\u2581end\uff5c>"),  # DeepSeek
    FimTokens("\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>"),  # CodeLlama (SentencePiece pieces)
    FimTokens("<PRE>", "<SUF>", "<MID>"),
    FimTokens("<|code_prefix|>", "<|code_suffix|>", "<|code_middle|>"),  # GLM-4.5
)
# Tokens that end a fill-in-the-middle answer besides EOS, as in llama.cpp's end-of-generation set: Qwen2.5-Coder
# ends a middle with <|endoftext|>, which its EOS (<|im_end|>) is not, and goes on with more code otherwise.
FIM_ENDS = ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<file_sep>", "<EOT>", "\u2581<EOT>",
            "<\uff5cend\u2581of\u2581sentence\uff5c>")
# The markers a GGUF file declares (llama.cpp reads them before scanning the vocabulary), prefix, suffix, middle.
GGUF_FIM_KEYS = tuple(f"tokenizer.ggml.fim_{k}_token_id" for k in ("pre", "suf", "mid"))


def fim_markers(has_token: Callable[[str], bool]) -> FimTokens | None:
    """The first family whose three markers the vocabulary has, or None (no FIM)."""
    return next((family for family in FIM_MARKERS if all(has_token(t) for t in family)), None)
