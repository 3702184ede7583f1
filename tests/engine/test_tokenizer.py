"""Fill-in-the-middle markers read from a vocabulary, and the FIM prompt built from them; text made token by token."""

from __future__ import annotations

import gguf
import pytest
from tokenizers import AddedToken

from engine import default_model_path
from engine.fim import FIM_MARKERS, FimTokens
from engine.tokenizer import IncrementalDetokenizer, Tokenizer
from tests.engine.tiny import byte_tokenizer

QWEN = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
STARCODER = ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")


def tokenizer_with(*added: str, special: bool = True) -> Tokenizer:
    tk = byte_tokenizer()
    tk.add_tokens([AddedToken(t, special=special, normalized=False) for t in added])
    return Tokenizer(tk, None, None, "<|im_end|>", [tk.token_to_id("<|im_end|>")])


@pytest.fixture(scope="module")
def shipped() -> tuple[gguf.GGUFReader, dict]:
    reader = gguf.GGUFReader(default_model_path())
    vocab = {f"tokenizer.ggml.{k}" for k in ("tokens", "merges", "token_type", "scores")}
    return reader, {k: f.contents() for k, f in reader.fields.items() if k not in vocab}


@pytest.mark.parametrize("markers", [QWEN, STARCODER, ("\u2581<PRE>", "\u2581<SUF>", "\u2581<MID>")],
                         ids=["qwen", "starcoder", "codellama"])
def test_fim_markers_are_found_in_the_vocabulary_and_build_the_prompt(markers):
    tok = tokenizer_with("<|endofprompt|>", *markers)
    fim = tok.fim_tokens
    assert fim == FimTokens(*markers)
    text = fim.prompt("def area(w, h):\n    return ", "\n\nprint(area(2, 3))\n")
    assert text == f"{markers[0]}def area(w, h):\n    return {markers[1]}\n\nprint(area(2, 3))\n{markers[2]}"
    pre, suf, mid = (tok.tk.token_to_id(m) for m in markers)
    ids = tok.encode(text)
    assert ids[0] == pre and ids[-1] == mid and ids.count(suf) == 1  # each marker is one token, in PSM order
    assert tok.decode(ids[1:ids.index(suf)]) == "def area(w, h):\n    return "


def test_qwen_markers_win_over_others_and_all_three_are_needed():
    assert tokenizer_with(*STARCODER, *QWEN).fim_tokens == FimTokens(*QWEN)
    assert tokenizer_with(*QWEN[:2]).fim_tokens is None  # no middle marker: no FIM
    assert tokenizer_with(*QWEN, special=False).fim_tokens == FimTokens(*QWEN)  # added tokens match in text
    assert tokenizer_with().fim_tokens is None


def test_a_middle_ends_at_eos_and_at_the_end_of_text_markers_the_vocabulary_has():
    tok = tokenizer_with(*QWEN, "<|fim_pad|>")
    ids = {t: tok.tk.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>", "<|fim_pad|>")}
    assert tok.fim_stop_ids == list(ids.values())  # EOS first; <|file_sep|> and the rest are not in this vocabulary


def test_the_shipped_smollm2_has_no_fim_markers(shipped):
    """SmolLM2-135M-Instruct's specials are ChatML and StarCoder's repository tokens, without <fim_*>: no FIM."""
    tok = Tokenizer.from_gguf(*shipped)
    assert tok.fim_token_ids is None and tok.fim_tokens is None
    assert [m for family in FIM_MARKERS for m in family if tok.tk.token_to_id(m) is not None] == []


def test_markers_a_gguf_declares_come_first(shipped):
    """llama.cpp reads tokenizer.ggml.fim_*_token_id before scanning the vocabulary (llama-server's
    --override-kv sets them); here the shipped file's <repo_name>, <file_sep>, <filename> stand in."""
    reader, meta = shipped
    keys = ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.fim_mid_token_id")
    tok = Tokenizer.from_gguf(reader, meta | dict(zip(keys, (3, 5, 6))))
    assert tok.fim_tokens == FimTokens("<repo_name>", "<file_sep>", "<filename>")
    assert tok.encode(tok.fim_tokens.prompt("a", "b")) == [3, *tok.encode("a"), 5, *tok.encode("b"), 6]
    assert Tokenizer.from_gguf(reader, meta | dict(zip(keys, (3, 5, 40)))).fim_tokens is None  # 40 is plain text


def test_a_character_the_output_limit_cuts_in_two_is_dropped_not_sent_broken():
    tokenizer = tokenizer_with()
    ids = tokenizer.encode("hi \U0001F600", add_special_tokens=False)  # the emoji is four byte tokens
    detok = IncrementalDetokenizer(tokenizer)
    sent = "".join(detok.push(i) for i in ids[:-1])  # its last byte never comes
    assert sent + detok.flush() == "hi "
    detok = IncrementalDetokenizer(tokenizer)
    assert "".join(detok.push(i) for i in ids) + detok.flush() == "hi \U0001F600"


def test_a_tokens_own_bytes_where_it_is_part_of_a_character(shipped):
    """SmolLM2 writes 日 as two tokens; each decodes alone to U+FFFD, and only its bytes say which part it is."""
    tok = Tokenizer.from_gguf(*shipped)
    first, second = tok.encode("日", add_special_tokens=False)
    assert tok.decode([first]) == tok.decode([second]) == "\ufffd"
    assert (tok.token_bytes(first), tok.token_bytes(second)) == (b"\xe6\x97", b"\xa5")
    assert tok.token_bytes(tok.encode(" é", add_special_tokens=False)[0]) == " é".encode()


def test_sentencepiece_byte_fallback_pieces_are_their_byte():
    from engine.tokenizer import _sentencepiece_bpe
    pieces = ["<unk>", "a", *(f"<0x{b:02X}>" for b in range(256))]
    tok = Tokenizer(_sentencepiece_bpe(pieces, [0.0] * len(pieces)), None, None, None, [])
    ids = tok.encode("日a", add_special_tokens=False)  # "▁日a": ▁ and 日 are not pieces, so bytes
    assert [tok.token_bytes(i) for i in ids][-4:] == [b"\xe6", b"\x97", b"\xa5", None]  # "a" is no byte
