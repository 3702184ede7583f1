"""What `velo doctor` finds out about the machine: CPU, memory, GPUs.

Linux files first (/proc/cpuinfo, /proc/meminfo, the cgroup memory limit a container sets), portable fallbacks
after. GPUs from torch (what Velo's engine would use) and from nvidia-smi (what the driver sees, which also
covers a CPU-only torch on a GPU machine). `detect()` blocks (importing torch takes ~2 s): run it in a thread.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

GiB = 1024 ** 3

# Feature -> the /proc/cpuinfo flags (x86 `flags`, Arm `Features`) that show it.
CPU_FEATURES = {
    "AVX2": ("avx2",),
    "AVX-512": ("avx512f",),
    "AMX": ("amx_tile",),
    "bf16": ("avx512_bf16", "amx_bf16", "bf16"),  # native bf16 matmuls: the engine then runs in bfloat16
}


@dataclass
class Cpu:
    model: str
    cores: int  # logical cores this process may use
    features: dict[str, bool]


@dataclass
class Gpu:
    name: str
    memory_bytes: int
    source: str  # "torch" or "nvidia-smi"


@dataclass
class Hardware:
    cpu: Cpu
    memory_total: int
    memory_available: int
    gpus: list[Gpu] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def gpu_memory(self) -> int:
        return sum(g.memory_bytes for g in self.gpus)


def parse_cpuinfo(text: str) -> tuple[str, set[str]]:
    """The CPU's model name and its feature flags (the first processor's: all cores of a machine match)."""
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return model, flags


def read_cpu() -> Cpu:
    cpuinfo = Path("/proc/cpuinfo")
    model, flags = parse_cpuinfo(cpuinfo.read_text(errors="replace")) if cpuinfo.exists() else ("", set())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return Cpu(model=model or platform.processor() or platform.machine(), cores=cores,
               features={name: bool(flags & set(names)) for name, names in CPU_FEATURES.items()})


def parse_meminfo(text: str) -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo (whose figures are kB)."""
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if rest.split():
            values[key] = int(rest.split()[0]) * 1024
    total = values.get("MemTotal", 0)
    return total, values.get("MemAvailable", total)


def read_memory() -> tuple[int, int]:
    """(total, available) bytes, capped by a cgroup v2 limit: in a container that is what the models get."""
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        total, available = parse_meminfo(meminfo.read_text())
    else:
        total = available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = Path("/sys/fs/cgroup/memory.max")
    if limit.exists() and limit.read_text().strip().isdigit():
        cap = int(limit.read_text())
        total, available = min(total, cap), min(available, cap)
    return total, available


def parse_nvidia_smi(csv: str) -> list[Gpu]:
    """Lines of `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits` (memory in MiB)."""
    gpus = []
    for line in csv.strip().splitlines():
        name, _, mib = line.rpartition(",")
        if name and mib.strip().isdigit():
            gpus.append(Gpu(name=name.strip(), memory_bytes=int(mib) * 1024 ** 2, source="nvidia-smi"))
    return gpus


def nvidia_smi_gpus() -> list[Gpu] | None:
    """None when nvidia-smi is not installed (or fails)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_nvidia_smi(out)


def torch_gpus() -> tuple[list[Gpu], str]:
    """GPUs torch can use, and a note on what torch is (missing, a CPU build, its version)."""
    try:
        import torch
    except ImportError:
        return [], "torch is not installed"
    if torch.cuda.is_available():
        gpus = [Gpu(name=p.name, memory_bytes=p.total_memory, source="torch")
                for p in map(torch.cuda.get_device_properties, range(torch.cuda.device_count()))]
        return gpus, f"torch {torch.__version__} (CUDA {torch.version.cuda or torch.version.hip})"
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return [Gpu(name="Apple GPU (MPS, shares system memory)", memory_bytes=0, source="torch")], \
            f"torch {torch.__version__} (MPS)"
    build = "a CPU-only build" if torch.version.cuda is None and torch.version.hip is None else "no usable GPU"
    return [], f"torch {torch.__version__}: {build}"


def detect() -> Hardware:
    total, available = read_memory()
    gpus, torch_note = torch_gpus()
    smi = nvidia_smi_gpus()
    notes = [torch_note]
    if smi is None:
        notes.append("nvidia-smi: not found")
    elif smi and not gpus:
        notes.append(f"nvidia-smi sees {len(smi)} GPU(s) that torch cannot use: the engine would run on the CPU")
        gpus = smi
    return Hardware(cpu=read_cpu(), memory_total=total, memory_available=available, gpus=gpus, notes=notes)
