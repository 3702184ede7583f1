"""A managed llama-server while it is stopped: what its model file tells, without starting it."""
import gguf
import numpy as np

from adapters.base import BackendConfig
from adapters.llamacpp_managed import ManagedLlamaCpp
from adapters.swaps import Swaps

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _coder_gguf(path: str) -> str:
    """A Qwen2.5-Coder-like header: ChatML and FIM tokens in the vocabulary."""
    w = gguf.GGUFWriter(path, "qwen2")
    w.add_context_length(4096)
    w.add_token_list(["a", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"])
    w.add_chat_template(CHATML)
    w.add_tensor("t", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


async def test_a_stopped_server_shows_the_template_and_fim_its_file_has(tmp_path):
    """Continue reads /api/show once per model, before its first request: a stopped server showed no template and
    no FIM, so Continue guessed a FIM format from the model's name for the rest of its session."""
    path = _coder_gguf(str(tmp_path / "coder.gguf"))
    backend = ManagedLlamaCpp(BackendConfig(name="coder", kind="llamacpp", model=path), Swaps())
    shown = await backend.show("coder")
    assert backend.state == "stopped" and backend.process is None  # showing never starts it
    assert set(shown.capabilities) == {"completion", "tools", "insert"}
    assert "{{ .Suffix }}" in shown.template and "<|fim_prefix|>" in shown.template
    assert "<|im_start|>" in shown.template and '"<|im_end|>"' in shown.parameters
    assert shown.model_info["qwen2.context_length"] == 4096
