"""A managed llama-server while it is stopped: what its model file tells, without starting it."""
import gguf
import numpy as np
import pytest

from adapters import go_template
from adapters.base import BackendConfig
from adapters.llamacpp_managed import ManagedLlamaCpp
from adapters.swaps import Swaps
from engine.fim import FIM_MARKERS
from tests.adapters.test_model_card import gguf_file

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
TOOLS_CHATML = "{% if tools %}<|im_start|>system\n{{ tools | tojson }}<|im_end|>\n{% endif %}" + CHATML
CODER_VOCAB = ["a", "<|im_start|>", "<|im_end|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]


async def test_a_stopped_server_shows_the_template_and_fim_its_file_has(tmp_path):
    """Continue reads /api/show once per model, before its first request: a stopped server showed no template and
    no FIM, so Continue guessed a FIM format from the model's name for the rest of its session."""
    path = gguf_file(str(tmp_path / "coder.gguf"), CODER_VOCAB, TOOLS_CHATML)  # Qwen2.5-Coder-like: ChatML, FIM
    backend = ManagedLlamaCpp(BackendConfig(name="coder", kind="llamacpp", model=path), Swaps())
    shown = await backend.show("coder")
    assert backend.state == "stopped" and backend.process is None  # showing never starts it
    assert set(shown.capabilities) == {"completion", "tools", "insert"}
    assert "{{ .Suffix }}" in shown.template and "<|fim_prefix|>" in shown.template
    assert "<|im_start|>" in shown.template and '"<|im_end|>"' in shown.parameters
    assert shown.model_info["qwen2.context_length"] == 4096


async def test_show_gives_the_files_arrays_as_ollama_does_short_or_verbose(tmp_path):
    """Ollama's model_info has every GGUF key: an array of up to 5 items whole, a longer one as [] unless the
    request says `verbose` (server/routes.go getModelData); Velo left every array out, verbose or not, so
    `ollama show -v` had no vocabulary and no tokenizer.ggml.tokens key at all."""
    path = gguf_file(str(tmp_path / "coder.gguf"), CODER_VOCAB, TOOLS_CHATML)  # 6 tokens: past Ollama's 5
    backend = ManagedLlamaCpp(BackendConfig(name="coder", kind="llamacpp", model=path), Swaps())
    assert (await backend.show("coder")).model_info["tokenizer.ggml.tokens"] == []
    verbose = (await backend.show("coder", verbose=True)).model_info
    assert verbose["tokenizer.ggml.tokens"] == CODER_VOCAB and "tokenizer.chat_template" not in verbose
    assert (await backend.show("coder")).model_info["tokenizer.ggml.tokens"] == []  # verbose is not kept


async def test_show_lists_the_files_tensors_as_ollama_does(tmp_path):
    """Ollama's /api/show lists the GGUF's tensors (name, type, shape), verbose or not (server/routes.go
    GetModelInfo; `ollama show -v` prints them); Velo listed none, though the header it reads holds them."""
    path = gguf_file(str(tmp_path / "coder.gguf"), CODER_VOCAB, TOOLS_CHATML)  # one F32 tensor "t" of 4
    backend = ManagedLlamaCpp(BackendConfig(name="coder", kind="llamacpp", model=path), Swaps())
    assert (await backend.show("coder")).shown["tensors"] == [{"name": "t", "type": "F32", "shape": [4]}]


async def test_show_gives_the_projector_its_command_names_as_projector_info(tmp_path):
    """Ollama's /api/show has a vision model's projector keys as projector_info (server/routes.go GetModelInfo,
    long arrays [] unless verbose); Velo gave none, though the server's command names the --mmproj file."""
    model = gguf_file(str(tmp_path / "m.gguf"), CODER_VOCAB, CHATML)
    w = gguf.GGUFWriter(str(tmp_path / "mmproj.gguf"), "clip")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_array("clip.vision.image_mean", [0.5] * 6)
    w.add_tensor("v", np.zeros(2, dtype=np.float32))
    for write in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file, w.close):
        write()
    command = ["llama-server", "--mmproj", str(tmp_path / "mmproj.gguf")]
    backend = ManagedLlamaCpp(BackendConfig(name="m", kind="llamacpp", model=model, command=command), Swaps())
    short, verbose = (await backend.show("m")).shown, (await backend.show("m", verbose=True)).shown
    assert short["projector_info"]["clip.has_vision_encoder"] is True
    assert short["projector_info"]["clip.vision.image_mean"] == []
    assert verbose["projector_info"]["clip.vision.image_mean"] == [0.5] * 6


@pytest.mark.parametrize("markers", FIM_MARKERS,
                         ids=["qwen", "starcoder", "santacoder", "deepseek", "codellama", "pre", "glm"])
async def test_a_stopped_server_offers_insert_for_every_fim_family_llama_cpp_knows(tmp_path, markers):
    """llama-server fills in the middle (/infill) for every family its vocabulary scan knows (llama-vocab.cpp), in
    prefix-suffix-middle order: the stopped listing knew three (no DeepSeek-Coder, CodeLlama's ▁<PRE>, GLM, ...),
    so those said no `insert` until the server ran, and Continue decided on no FIM from its one /api/show."""
    path = gguf_file(str(tmp_path / "coder.gguf"), ["a", "<|im_start|>", "<|im_end|>", *markers], CHATML)
    backend = ManagedLlamaCpp(BackendConfig(name="coder", kind="llamacpp", model=path), Swaps())
    shown = await backend.show("coder")
    assert "insert" in shown.capabilities
    assert go_template.render(shown.template, "ab", suffix="cd") == f"{markers[0]}ab{markers[1]}cd{markers[2]}"


async def test_a_stopped_server_lists_thinking_when_its_template_thinks(tmp_path):
    """The stopped listing reads the file's template as a running server's listing reads /props: a template with
    <think> blocks is a model that thinks, so Ollama's clients offer its thinking switch either way."""
    thinking = CHATML.replace("assistant\n{% endif %}", "assistant\n<think>\n{% endif %}")
    path = gguf_file(str(tmp_path / "thinker.gguf"), ["a", "<|im_start|>", "<|im_end|>"], thinking)
    backend = ManagedLlamaCpp(BackendConfig(name="thinker", kind="llamacpp", model=path), Swaps())
    [listed] = await backend.list_models()
    assert backend.state == "stopped"
    assert listed.capabilities == ["completion", "thinking"]  # its template renders no tools


async def test_a_stopped_server_lists_tools_only_when_its_template_renders_them(tmp_path):
    """As the running server's listing says (llama-server renders the template with a tool): the stopped listing
    said tools for SmolLM2's template, so the first requests after a start sent tools natively, which its template
    drops, and the model never saw them (Codex's first turns, `X-Velo-Tools: native`). The template is rendered,
    not read, as the engine's is (adapters/chat_template.py)."""
    refuses = "{% if tools %}{{ raise_exception('no tools') }}{% endif %}" + CHATML  # names tools, renders none
    for template, listed in ((CHATML, ["completion"]), (refuses, ["completion"]),
                             (TOOLS_CHATML, ["completion", "tools"])):
        path = gguf_file(str(tmp_path / "m.gguf"), ["a", "<|im_start|>", "<|im_end|>"], template)
        backend = ManagedLlamaCpp(BackendConfig(name="m", kind="llamacpp", model=path), Swaps())
        assert (await backend.list_models())[0].capabilities == listed


def test_a_managed_server_dies_with_a_velo_killed_by_sigkill(tmp_path):
    """SIGTERM stopped it, but a Velo killed outright (SIGKILL, the OOM killer) left it running with its model's
    memory, and the next start loaded the model again beside it. Here a parent starts `sleep` as Velo starts
    llama-server, in its event loop's thread, and is killed."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import asyncio

    from adapters.llamacpp_managed import dies_with_velo
    parent = subprocess.Popen([sys.executable, "-c", f"""
import asyncio, sys
sys.path.insert(0, {os.getcwd()!r})
from adapters.llamacpp_managed import dies_with_velo
async def main():
    child = await asyncio.create_subprocess_exec(*await dies_with_velo(["sleep", "60"]))
    print(child.pid, flush=True)
    await asyncio.sleep(60)
asyncio.run(main())
"""], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    for _ in range(500):  # setpriv has set the signal once it has become `sleep` (10 s at most, on a loaded machine)
        with open(f"/proc/{child}/comm") as comm:
            if comm.read().strip() == "sleep":
                break
        time.sleep(0.02)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    for _ in range(100):
        try:
            with open(f"/proc/{child}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":  # dead, where nothing reaps orphans
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the child outlived its killed parent")
    assert asyncio.run(dies_with_velo(["no-such-llama-server"])) == ["no-such-llama-server"]  # its start error names it


async def test_a_missing_model_file_or_program_is_said_at_start(tmp_path, caplog):
    """The server starts on the first request: a missing file or program was first heard of as that request's 503."""
    import logging
    path = gguf_file(str(tmp_path / "coder.gguf"), CODER_VOCAB, CHATML)
    with caplog.at_level(logging.WARNING, logger="velo.adapters.llamacpp_managed"):
        await ManagedLlamaCpp(BackendConfig(name="ok", kind="llamacpp", model=path, command=["python3"]),
                              Swaps()).start()
        assert caplog.text == ""
        await ManagedLlamaCpp(BackendConfig(name="gone", kind="llamacpp", model=str(tmp_path / "gone.gguf"),
                                            command=["no-such-llama-server"]), Swaps()).start()
    assert "gone.gguf not found" in caplog.text and "'no-such-llama-server' is not a program on PATH" in caplog.text


async def test_a_stopped_server_that_cannot_start_is_not_healthy(tmp_path):
    """config.example.toml's `coder` (no such file, no llama-server on PATH) was `true` in /ready and healthy on the
    dashboard, beside the backends that were down: it is as down as they are until its file and program are there."""
    path = gguf_file(str(tmp_path / "coder.gguf"), CODER_VOCAB, CHATML)
    for model, command, healthy in ((path, "python3", True), (str(tmp_path / "gone.gguf"), "python3", False),
                                    (path, "no-such-llama-server", False)):
        backend = ManagedLlamaCpp(BackendConfig(name="b", kind="llamacpp", model=model, command=[command]), Swaps())
        assert await backend.health() is healthy, (model, command)


async def test_a_start_that_fails_is_logged_with_its_cause(tmp_path, caplog):
    """A start that timed out was seen only as the request's 504 in the request log."""
    import pytest

    from adapters.errors import BackendUnavailable
    path = gguf_file(str(tmp_path / "coder.gguf"), CODER_VOCAB, CHATML)
    backend = ManagedLlamaCpp(BackendConfig(name="b", kind="llamacpp", model=path, first_token_timeout=0.3,
                                            command=["sh", "-c", "echo loading; sleep 30", "sh"]), Swaps())
    backend.starting()
    with caplog.at_level("WARNING", logger="velo.adapters.llamacpp_managed"), pytest.raises(BackendUnavailable):
        await backend.launch()
    await backend._following  # its output's reader ends with the killed process
    assert "llama-server was not ready within 0.3s: loading" in caplog.text


async def test_a_server_that_exits_at_start_is_quoted_to_its_last_line(tmp_path, monkeypatch):
    """A server that printed its error and exited at once: the 503 could come before its output was read (the reader
    made slow here), and said only "exited with 4: "."""
    import asyncio

    import pytest

    from adapters.errors import BackendUnavailable
    follow = ManagedLlamaCpp._follow

    async def late(self, process):
        await asyncio.sleep(0.3)
        await follow(self, process)
    monkeypatch.setattr(ManagedLlamaCpp, "_follow", late)
    path = gguf_file(str(tmp_path / "coder.gguf"), CODER_VOCAB, CHATML)
    backend = ManagedLlamaCpp(BackendConfig(name="b", kind="llamacpp", model=path, command=[
        "sh", "-c", "echo loading; echo 'error: unknown argument: --bogus'; exit 4", "sh"]), Swaps())
    backend.starting()
    with pytest.raises(BackendUnavailable) as e:
        await backend.launch()
    assert e.value.message.endswith("exited with 4: loading | error: unknown argument: --bogus")


async def test_a_file_that_is_no_gguf_is_still_listed_under_its_name(tmp_path):
    """Unlisted, its name went to the default backend, and another model answered for it."""
    bad = tmp_path / "bad.gguf"
    bad.write_text("not a model")
    backend = ManagedLlamaCpp(BackendConfig(name="b", kind="llamacpp", model=str(bad), models=["mbad"]), Swaps())
    assert [m.name for m in await backend.list_models()] == ["mbad"]


async def test_a_server_that_exits_while_another_program_answers_its_port_is_not_left_ready(tmp_path, monkeypatch):
    """Its start's last /health was answered by whatever held the port (a race between choosing the port and the
    server binding it): the exit came while "starting", which the watcher passed over, and "ready" stayed with no
    server behind it."""
    import asyncio

    async def answered(self):
        await asyncio.sleep(0.2)  # the server exits meanwhile
        return True
    monkeypatch.setattr(ManagedLlamaCpp, "healthy_now", answered)
    path = gguf_file(str(tmp_path / "coder.gguf"), CODER_VOCAB, CHATML)
    swaps = Swaps()
    backend = ManagedLlamaCpp(BackendConfig(name="b", kind="llamacpp", model=path, command=[
        "sh", "-c", "exit 1", "sh"]), swaps)
    async with swaps.use(backend):
        pass
    for _ in range(300):
        if backend.state == "stopped":
            break
        await asyncio.sleep(0.01)
    assert backend.state == "stopped"
    await backend.close()
