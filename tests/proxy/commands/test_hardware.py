"""Reading CPU, memory and GPUs: the parsers on real file shapes, and detection on this machine."""
from __future__ import annotations

from proxy.commands.hardware import GiB, detect, parse_cpuinfo, parse_meminfo, parse_nvidia_smi, read_cpu

X86 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme sse sse2 avx avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
"""
ARM = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp bf16 i8mm
CPU implementer\t: 0x41
"""


def test_cpuinfo_x86_and_arm():
    model, flags = parse_cpuinfo(X86)
    assert model == "Intel(R) Xeon(R) Platinum 8480+" and {"avx2", "avx512f", "amx_tile", "avx512_bf16"} <= flags
    model, flags = parse_cpuinfo(ARM)
    assert model == "" and "bf16" in flags and "avx2" not in flags


def test_meminfo_in_bytes():
    text = "MemTotal:       24576000 kB\nMemFree:         1000000 kB\nMemAvailable:   20480000 kB\n"
    assert parse_meminfo(text) == (24576000 * 1024, 20480000 * 1024)
    assert parse_meminfo("MemTotal: 1000 kB\n") == (1024000, 1024000)  # old kernels: no MemAvailable


def test_nvidia_smi_csv():
    csv = "NVIDIA H100 80GB HBM3, 81559\nNVIDIA GeForce RTX 4090, 24564\n"
    gpus = parse_nvidia_smi(csv)
    assert [(g.name, g.memory_bytes // 1024 ** 2, g.source) for g in gpus] == [
        ("NVIDIA H100 80GB HBM3", 81559, "nvidia-smi"), ("NVIDIA GeForce RTX 4090", 24564, "nvidia-smi")]
    assert parse_nvidia_smi("No devices were found\n") == []


def test_this_machine():
    hw = detect()
    assert hw.cpu.cores >= 1 and set(hw.cpu.features) == {"AVX2", "AVX-512", "AMX", "bf16"}
    assert 0 < hw.memory_available <= hw.memory_total
    assert hw.notes and hw.notes[0].startswith("torch")  # what torch is, GPU or not
    flags = open("/proc/cpuinfo").read()
    assert read_cpu().features["AVX2"] == (" avx2" in flags)
    assert hw.memory_total > 0.1 * GiB
