"""What /api/show says for backends that are not Ollama: Modelfile parameters, Go templates, GGUF metadata."""
import os

import gguf
import numpy as np
import pytest

from adapters import go_template, model_card
from adapters.gguf_header import read_header, read_metadata
from engine import default_model_path
from engine.fim import FIM_MARKERS

CHATML_JINJA = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"


def test_parameters_are_ollama_modelfile_lines():
    text = model_card.parameters(8192, model_card.stop_words(CHATML_JINJA))
    assert text.splitlines() == ["num_ctx" + " " * 24 + "8192", "stop" + " " * 27 + '"<|im_start|>"',
                                 "stop" + " " * 27 + '"<|im_end|>"']
    # How Continue reads them: key, then the rest of the line; stop words unquoted
    parsed = [line.split(None, 1) for line in text.splitlines()]
    assert [(k, v.strip('"')) for k, v in parsed] == [("num_ctx", "8192"), ("stop", "<|im_start|>"),
                                                      ("stop", "<|im_end|>")]
    assert model_card.parameters(None, []) == ""


@pytest.mark.parametrize("jinja, marker", [(CHATML_JINJA, "<|im_start|>assistant"),
                                           ("<|start_header_id|>{{ role }}", "<|start_header_id|>assistant"),
                                           ("<start_of_turn>", "<start_of_turn>model"), ("{{ prompt }}", ".Prompt")])
def test_template_has_suffix_exactly_when_fim_works(jinja, marker):
    plain = model_card.go_template(jinja)
    assert marker in plain and ".Suffix" not in plain
    fim = model_card.go_template(jinja, FIM_MARKERS[0])
    assert "{{ .Suffix }}" in fim and "<|fim_prefix|>{{ .Prompt }}<|fim_suffix|>{{ .Suffix }}<|fim_middle|>" in fim
    assert marker in fim


@pytest.mark.parametrize("jinja", [CHATML_JINJA, "<|start_header_id|>{{ role }}"])
def test_every_chat_models_template_offers_tools_as_its_capabilities_say(jinja):
    """Ollama's own templates have a `.Tools` block: LiteLLM decides whether an Ollama model calls functions by
    "tools" in its template (llms/ollama/common_utils.py). /api/show says `tools` for every chat model (Velo writes
    them into the prompt where the template cannot); the template said so only where the model rendered them, and
    Open Interpreter ran the engine's SmolLM2 in text mode."""
    offered = model_card.go_template(jinja, FIM_MARKERS[0])
    assert "{{- if .Tools }}" in offered and "{{ .Suffix }}" in offered
    assert "tools" not in go_template.render(offered, "hi").lower()  # no tools asked: none offered


def test_model_info_keeps_ollama_keys_and_drops_unknown_dimensions():
    info = model_card.model_info(model_card.Shape("qwen2", 494_032_768, 32768, 896, 24, 4864, 14, 2, 151936, 1e6))
    assert info == {"general.architecture": "qwen2", "general.parameter_count": 494_032_768,
                    "qwen2.context_length": 32768, "qwen2.embedding_length": 896, "qwen2.block_count": 24,
                    "qwen2.feed_forward_length": 4864, "qwen2.attention.head_count": 14,
                    "qwen2.attention.head_count_kv": 2, "qwen2.vocab_size": 151936, "qwen2.rope.freq_base": 1e6}
    assert model_card.model_info(model_card.Shape("llama", 10, 512)) == {
        "general.architecture": "llama", "general.parameter_count": 10, "llama.context_length": 512}


def test_header_reader_matches_the_gguf_library_on_the_shipped_model():
    path = default_model_path()
    ours, tensors = read_header(path)
    reader = gguf.GGUFReader(path)
    theirs = {name: f.contents() for name, f in reader.fields.items() if not name.startswith("GGUF.")}
    assert tensors == [{"name": t.name, "type": t.tensor_type.name, "shape": [int(d) for d in t.shape]}
                       for t in reader.tensors]
    assert ours.keys() == theirs.keys()
    scalars = {k for k, v in theirs.items() if not isinstance(v, list)}
    assert {k: ours[k] for k in scalars} == {k: theirs[k] for k in scalars}
    arrays = theirs.keys() - scalars  # [] past 5 items unless asked for, as Ollama's /api/show without verbose
    assert {k: ours[k] for k in arrays} == {k: theirs[k] if len(theirs[k]) <= 5 else [] for k in arrays}
    assert read_metadata(path, whole=True) == theirs
    facts = model_card.gguf_facts(path)
    info, fim = facts.info, facts.fim
    assert fim is None and "<|im_start|>" in facts.jinja  # SmolLM2's vocabulary has no FIM tokens; ChatML
    assert info["llama.block_count"] == 30 and info["llama.attention.head_count"] == 9
    assert info["tokenizer.ggml.tokens"] == [] and "tokenizer.chat_template" not in info


def gguf_file(path: str, tokens: list[str], chat_template: str = "", **ids: int) -> str:
    """A small GGUF (a Qwen2 header with `tokens`, a chat template, the given `tokenizer.ggml.*_token_id`s)."""
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_context_length(4096)
    w.add_token_list(tokens)
    if chat_template:
        w.add_chat_template(chat_template)
    for key, value in ids.items():
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", value)
    w.add_tensor("t", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_fim_tokens_from_llama_cpp_keys_or_the_vocabulary(tmp_path):
    tokens = ["a", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<PRE>", "<SUF>", "<MID>"]
    facts = model_card.gguf_facts(gguf_file(str(tmp_path / "v.gguf"), tokens))
    info, fim = facts.info, facts.fim
    assert fim == ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>") and info["qwen2.context_length"] == 4096
    fim = model_card.gguf_facts(gguf_file(str(tmp_path / "k.gguf"), tokens, fim_pre=4, fim_suf=5, fim_mid=6)).fim
    assert fim == ("<PRE>", "<SUF>", "<MID>")  # llama.cpp's own keys win over guessing
    fim = model_card.gguf_facts(gguf_file(str(tmp_path / "n.gguf"), ["a", "b"])).fim
    assert fim is None
    assert os.path.getsize(tmp_path / "n.gguf") > 0


def test_file_context_is_read_under_the_files_architecture_or_the_family():
    assert model_card.file_context({"general.architecture": "qwen2", "qwen2.context_length": 32768,
                                    "llama.context_length": 8}) == 32768
    assert model_card.file_context({"llama.context_length": 8192}, "llama") == 8192
    assert model_card.file_context({"general.architecture": "qwen2"}) is None
