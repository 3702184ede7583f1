"""GGUF loading on a tiny file written in the test: SentencePiece vocabulary (Llama 2 / Mistral style) and
llama.cpp's q/k row order, both checked against transformers' own GGUF loader."""

from __future__ import annotations

import os

import pytest
import torch

from engine import SamplingParams
from tests.engine.conftest import generate, tokens_of
from tests.engine.tiny import write_tiny_spm_gguf

CORPUS = "the cat sat in the hat and the other cat ate the rest of the bread"
TEXTS = ["the cat sat", "  leading spaces and the end ", "ünseen chars fall back to bytes: é, 日",
         "the hat</s> again"]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> str:
    return write_tiny_spm_gguf(str(tmp_path_factory.mktemp("gguf") / "tiny-spm.gguf"), CORPUS)


@pytest.fixture(scope="module")
def hf(gguf_file):
    import transformers
    os.environ["HF_HUB_OFFLINE"] = "1"
    folder, name = os.path.split(gguf_file)
    return (transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name),
            transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name).eval())


def test_sentencepiece_tokenizer_matches_transformers(gguf_file, engine_factory, hf):
    tk = engine_factory(gguf_file).tokenizer
    for text in TEXTS:
        ids = tk.encode(text)
        assert ids == hf[0](text)["input_ids"]
        assert tk.decode(ids) == hf[0].decode(ids, skip_special_tokens=True)
    assert any(3 <= i < 259 for i in tk.encode(TEXTS[2]))  # byte fallback was exercised
    assert tk.encode("<s>the hat").count(1) == 1  # a text that brings its own BOS gets no second one


def test_greedy_from_gguf_matches_transformers(gguf_file, engine_factory, hf):
    eng = engine_factory(gguf_file, block_size=4)
    prompt = eng.tokenizer.encode(CORPUS)
    ours = tokens_of(generate(eng, prompt, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)))
    ids = torch.tensor([prompt])
    ref = hf[1].generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    assert ours == ref[0, len(prompt):].tolist()
