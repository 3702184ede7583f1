"""make_backend picks the adapter for each configured kind, importing the heavy engine only when asked."""
import subprocess
import sys

import pytest

from adapters.base import BackendConfig
from adapters.errors import BadRequest
from adapters.llamacpp import LlamaCppBackend
from adapters.ollama import OllamaBackend
from adapters.openai_compat import OpenAIBackend
from adapters.registry import make_backend


@pytest.mark.parametrize("kind,cls", [("ollama", OllamaBackend), ("llamacpp", LlamaCppBackend),
                                      ("openai", OpenAIBackend)])
def test_http_kinds(kind, cls):
    cfg = BackendConfig(name="b", kind=kind, urls=["http://127.0.0.1:1"], api_key="k")
    backend = make_backend(cfg)
    assert type(backend) is cls and backend.config is cfg and backend.name == "b"


def test_unknown_kind_names_the_known_ones():
    with pytest.raises(BadRequest) as e:
        make_backend(BackendConfig(name="x", kind="vllm"))
    assert "'vllm'" in e.value.message and "llamacpp" in e.value.message and "engine" in e.value.message


def test_http_backends_do_not_load_torch():
    code = ("import sys; from adapters.registry import make_backend; from adapters.base import BackendConfig; "
            "[make_backend(BackendConfig(name=k, kind=k, urls=['http://h'])) "
            "for k in ('ollama', 'llamacpp', 'openai')]; "
            "print(sorted(m for m in ('torch', 'adapters.engine') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
