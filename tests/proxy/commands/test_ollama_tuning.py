"""The Ollama settings follow the hardware: GPU or CPU, much memory or little."""
from __future__ import annotations

from proxy.commands.hardware import GiB, Cpu, Gpu, Hardware
from proxy.commands.ollama_tuning import ollama_settings


def _machine(cores: int = 8, ram_gib: float = 32, gpu_gib: float = 0) -> Hardware:
    gpus = [Gpu("GPU", int(gpu_gib * GiB), "torch")] if gpu_gib else []
    return Hardware(Cpu("cpu", cores, {}), int(ram_gib * GiB), int(ram_gib * GiB), gpus)


def _values(hw: Hardware) -> dict[str, str]:
    return {s.name: s.value for s in ollama_settings(hw)}


def test_big_gpu_runs_four_streams_with_long_contexts():
    assert _values(_machine(gpu_gib=80)) == {
        "OLLAMA_NUM_PARALLEL": "4", "OLLAMA_CONTEXT_LENGTH": "65536", "OLLAMA_KV_CACHE_TYPE": "q8_0",
        "OLLAMA_FLASH_ATTENTION": "1", "OLLAMA_KEEP_ALIVE": "30m"}


def test_small_gpu_sizes_for_its_own_memory_not_the_ram():
    values = _values(_machine(ram_gib=128, gpu_gib=6))
    assert values["OLLAMA_NUM_PARALLEL"] == "2" and values["OLLAMA_CONTEXT_LENGTH"] == "8192"
    assert values["OLLAMA_KV_CACHE_TYPE"] == "q8_0"  # 2 x 8192 tokens: 2 GiB at f16, 1.06 GiB at q8_0
    assert values["OLLAMA_KEEP_ALIVE"] == "5m"  # 6 GiB of VRAM: let idle models go


def test_small_cpu_machine_keeps_the_defaults_it_can():
    settings = {s.name: s for s in ollama_settings(_machine(cores=4, ram_gib=4))}
    unchanged = {name for name, s in settings.items() if not s.changed}
    assert unchanged == {"OLLAMA_CONTEXT_LENGTH", "OLLAMA_KV_CACHE_TYPE", "OLLAMA_FLASH_ATTENTION", "OLLAMA_KEEP_ALIVE"}
    assert settings["OLLAMA_NUM_PARALLEL"].value == "2"  # 2 x 4096 tokens of f16 cache: 1 GiB, a quarter of 4


def test_roomy_cpu_keeps_f16_and_leaves_flash_attention_to_ollama():
    settings = {s.name: s for s in ollama_settings(_machine(cores=32, ram_gib=256))}
    assert settings["OLLAMA_NUM_PARALLEL"].value == "4" and settings["OLLAMA_KV_CACHE_TYPE"].value == "f16"
    assert settings["OLLAMA_CONTEXT_LENGTH"].value == "65536"
    assert not settings["OLLAMA_FLASH_ATTENTION"].changed
    assert all(s.reason for s in settings.values())
