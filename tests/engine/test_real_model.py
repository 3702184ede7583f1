"""The shipped SmolLM2-135M GGUF against transformers' own GGUF loader: same tokens in, same tokens out."""

from __future__ import annotations

import os

import pytest
import torch

from engine import SamplingParams, default_model_path
from tests.engine.conftest import collect, submit, tokens_of

pytestmark = pytest.mark.slow
TEXTS = ["Hello, world!", "  two  spaces\tand\ttabs\n\nnew lines", "Digits 1234567 and 3.14159",
         "ünïcödé, 日本語, emoji 🙂", "<|im_start|>user\nhi<|im_end|>\n"]


@pytest.fixture(scope="module")
def hf():
    import transformers
    os.environ["HF_HUB_OFFLINE"] = "1"
    folder, name = os.path.split(default_model_path())
    return (transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name),
            transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name).eval())


def test_tokenizer_and_greedy_generation_match_transformers(engine_factory, hf):
    hf_tok, hf_model = hf
    eng = engine_factory(default_model_path(), kv_memory=64 * 2**20)
    assert [eng.tokenizer.encode(t) for t in TEXTS] == [hf_tok(t)["input_ids"] for t in TEXTS]
    questions = ["What is the capital of France?", "Write a haiku about the sea."]
    prompts = [eng.tokenizer.encode(eng.tokenizer.apply_chat_template([{"role": "user", "content": q}]))
               for q in questions]
    assert prompts[0] == hf_tok(hf_tok.apply_chat_template([{"role": "user", "content": questions[0]}],
                                                           tokenize=False, add_generation_prompt=True))["input_ids"]
    queues = [submit(eng, p, SamplingParams(max_tokens=24, temperature=0, ignore_eos=True))[1] for p in prompts]
    ours = [tokens_of(collect(q)) for q in queues]  # the two run batched
    for prompt, got in zip(prompts, ours):
        ids = torch.tensor([prompt])  # an explicit mask: else HF takes the <|im_end|> tokens (= pad) for padding
        ref = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                                eos_token_id=None)
        assert got == ref[0, len(prompt):].tolist()
