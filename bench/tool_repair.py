"""How many broken tool-call outputs come out as valid calls, and what repair costs per call.

    python bench/tool_repair.py [--rounds 5]

The corpus is every clean call below written in every way small models break it (plus the real SmolLM2 outputs
in tests/data/tool_transcripts.jsonl that attempt a call, scored and timed apart). Three contenders, same run:
- json.loads: parse the text as is, read {"name", "arguments"|"parameters"};
- json-repair: `json_repair.loads` on the text, read the same keys;
- velo: `proxy.tools.stream.repair_message` (extract, repair, coerce, validate).
An output counts as valid when it yields a call to the intended tool whose arguments pass the tool's JSON Schema.
Times are per output, in microseconds, as wall clock and as the thread's CPU time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import json_repair
from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.protocol import Tool  # noqa: E402
from proxy.tools.calls import ToolCallInvalid  # noqa: E402
from proxy.tools.stream import repair_message  # noqa: E402

TOOLS = [
    Tool("get_weather", "", {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}),
    Tool("search", "", {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"type": "integer"}, "safe": {"type": "boolean"}}, "required": ["query"]}),
    Tool("send_email", "", {"type": "object", "properties": {
        "to": {"type": "array", "items": {"type": "string"}}, "subject": {"type": "string"},
        "body": {"type": "string"}}, "required": ["to", "subject"]}),
    Tool("set_timer", "", {"type": "object", "properties": {
        "seconds": {"type": "number"}, "label": {"type": ["string", "null"]}}, "required": ["seconds"]}),
]
CLEAN = [
    ("get_weather", {"city": "Paris", "days": 3, "unit": "celsius"}),
    ("get_weather", {"city": "São Paulo"}),
    ("search", {"query": "tallest building \"in the world\"", "limit": 5, "safe": True}),
    ("search", {"query": "it's raining", "safe": False}),
    ("send_email", {"to": ["ada@example.com"], "subject": "Hi", "body": "Line one\nLine two"}),
    ("set_timer", {"seconds": 90.5, "label": None}),
]
BROKEN: dict[str, Callable[[str, str], str]] = {
    "trailing_comma": lambda j, n: j[:-1] + ",}",
    "single_quotes": lambda j, n: j.replace("'", "\\'").replace('"', "'") if "\\n" not in j else j,
    "unquoted_keys": lambda j, n: _unquote_keys(j),
    "python_literals": lambda j, n: j.replace("true", "True").replace("false", "False").replace("null", "None"),
    "comment": lambda j, n: j[:-1] + " // done\n}",
    "truncated": lambda j, n: j[:-2],
    "truncated_string": lambda j, n: j[:j.rfind('"')] if j.rstrip("}").endswith('"') else j[:-2],
    "stray_prose": lambda j, n: f"Sure! I will call {n} for you.\n{j}\nLet me know!",
    "fence": lambda j, n: f"```json\n{j}\n```",
    "hermes": lambda j, n: f"<tool_call>\n{j}\n</tool_call>",
    "llama3": lambda j, n: "<|python_tag|>" + j.replace('"arguments"', '"parameters"') + "<|eom_id|>",
    "mistral": lambda j, n: f"[TOOL_CALLS] [{j}]",
    "double_encoded": lambda j, n: _double_encoded(j),
    "string_numbers": lambda j, n: _stringify_scalars(j),
    "bare_args_value": lambda j, n: j.replace('["ada@example.com"]', '"ada@example.com"'),
    "enum_case": lambda j, n: j.replace('"celsius"', '"Celsius"'),
    "duplicate": lambda j, n: f"[{j}, {j}]",
    "missing_comma": lambda j, n: j.replace(', "', ' "', 1),
}


def _unquote_keys(j: str) -> str:
    value = json.loads(j)
    args = ", ".join(f"{k}: {json.dumps(v)}" for k, v in value["arguments"].items())
    return f'{{name: "{value["name"]}", arguments: {{{args}}}}}'


def _double_encoded(j: str) -> str:
    value = json.loads(j)
    return json.dumps({"name": value["name"], "arguments": json.dumps(value["arguments"])})


def _stringify_scalars(j: str) -> str:
    value = json.loads(j)
    args = {k: json.dumps(v) if isinstance(v, (int, float, bool)) and v is not None else v
            for k, v in value["arguments"].items()}
    return json.dumps({"name": value["name"], "arguments": args})


def synthetic() -> list[tuple[str, str | None]]:
    """(text, intended tool) for every clean call broken every way (breakages that leave it unchanged skipped)."""
    out = []
    for name, args in CLEAN:
        clean = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
        out += [(text, name) for text in (broken(clean, name) for broken in BROKEN.values()) if text != clean]
    return out


def transcripts() -> list[tuple[str, str | None]]:
    """The real SmolLM2 outputs that attempt a call (the prefilled ones); any offered tool counts."""
    path = ROOT / "tests" / "data" / "tool_transcripts.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [(r["output"], None) for r in records if r["style"] == "prefill"]


SCHEMAS = {t.name: Draft202012Validator(t.parameters) for t in TOOLS}


def _baseline(parse: Callable[[str], Any]) -> Callable[[str], list[tuple[str, Any]]]:
    def run(text: str) -> list[tuple[str, Any]]:
        try:
            value = parse(text)
        except ValueError:
            return []
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            return []
        args = value.get("arguments", value.get("parameters"))
        return [(value["name"], json.loads(args) if isinstance(args, str) else args)]
    return run


def _velo(text: str) -> list[tuple[str, Any]]:
    try:
        _, calls, _ = repair_message(text, [], TOOLS)
    except ToolCallInvalid:
        return []
    return [(c.name, c.arguments) for c in calls]


CONTENDERS = {"json.loads": _baseline(json.loads), "json-repair": _baseline(json_repair.loads), "velo": _velo}


def _valid(calls: list[tuple[str, Any]], name: str | None) -> bool:
    return any(n == (name or n) and n in SCHEMAS and SCHEMAS[n].is_valid(a) for n, a in calls)


def _safe(run: Callable[[str], list], text: str) -> list:
    try:
        return run(text)
    except Exception:  # noqa: BLE001 - a baseline that crashes on an output simply did not make it valid
        return []


def valid_share(items: list[tuple[str, str | None]], run: Callable[[str], list]) -> float:
    return sum(_valid(_safe(run, text), name) for text, name in items) / len(items)


def times_us(items: list[tuple[str, str | None]], run: Callable[[str], list], rounds: int) -> tuple[float, ...]:
    """p50 and p99 per output in microseconds, of wall time and of the thread's CPU time (the second leaves out
    the pauses a shared machine's scheduler adds, which dominate a wall-clock p99 there)."""
    wall, cpu = [], []
    for _ in range(rounds):
        for text, _name in items:
            w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            _safe(run, text)
            cpu.append((time.thread_time_ns() - c0) / 1000)
            wall.append((time.perf_counter_ns() - w0) / 1000)
    qw, qc = statistics.quantiles(wall, n=100), statistics.quantiles(cpu, n=100)
    return qw[49], qw[98], qc[49], qc[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    corpora = {"broken": synthetic(), "real": transcripts()}
    print(f"corpus: {len(corpora['broken'])} broken tool-call outputs, {len(corpora['real'])} real SmolLM2-135M "
          f"attempts; {args.rounds} rounds; time per output in us, wall clock [thread CPU time]")
    for corpus, items in corpora.items():
        for label, run in CONTENDERS.items():
            p50, p99, best50, best99 = times_us(items, run, args.rounds)
            print(f"{corpus:6s} {label:11s} valid {valid_share(items, run):6.1%}   "
                  f"p50 {p50:6.1f}  p99 {p99:8.1f}   [p50 {best50:6.1f}  p99 {best99:6.1f}]")

if __name__ == "__main__":
    main()
