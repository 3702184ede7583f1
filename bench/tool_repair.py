"""How many broken tool-call outputs come out as the intended calls, per corruption category, and what repair
costs per call.

    python bench/tool_repair.py [--rounds 5]

The corpus is every clean answer below (one call, or several, some identical by design) written in every way
small models break it (plus the real SmolLM2 outputs in tests/data/tool_transcripts.jsonl that attempt a call,
scored and timed apart). The tools and calls are written here, after common real tool schemas (weather, search,
e-mail, timers, sampling from a distribution). Three contenders, same run:
- json.loads: parse the text as is, read {"name", "arguments"|"parameters"} (or a list of them);
- json-repair: `json_repair.loads` on the text, read the same keys;
- velo: `proxy.tools.stream.repair_message` (extract, repair, coerce, validate, dedupe).
An output is correct when it yields exactly the intended calls, in order, with the intended arguments (a
silently wrong value is a miss, not a success). Texts that hold no call count the calls invented from them.
A second corpus measures repair of broken JSON in general: random JSON values broken in the same ways, and
Velo's `parse_json` compared with `json_repair.loads` on each (agreement = equal values).
Times are per output, in microseconds, as wall clock and as the thread's CPU time.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import json_repair

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.protocol import Tool  # noqa: E402
from proxy.tools.calls import ToolCallInvalid  # noqa: E402
from proxy.tools.repair import Unrepairable, parse_json  # noqa: E402
from proxy.tools.stream import repair_message  # noqa: E402

TOOLS = [
    Tool("get_weather", "", {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}),
    Tool("search", "", {"type": "object", "properties": {
        "query": {"type": "string"}, "limit": {"type": "integer"}, "safe": {"type": "boolean"}},
        "required": ["query"]}),
    Tool("send_email", "", {"type": "object", "properties": {
        "to": {"type": "array", "items": {"type": "string"}}, "subject": {"type": "string"},
        "body": {"type": "string"}}, "required": ["to", "subject"]}),
    Tool("set_timer", "", {"type": "object", "properties": {
        "seconds": {"type": "number"}, "label": {"type": ["string", "null"]}}, "required": ["seconds"]}),
    Tool("sample_distribution", "", {"type": "object", "properties": {
        "distribution": {"type": "string", "enum": ["normal", "poisson", "uniform"]},
        "size": {"type": "integer"}, "mean": {"type": "number"}}, "required": ["distribution", "size"]}),
]
Call = tuple[str, dict]
SINGLE: list[Call] = [
    ("get_weather", {"city": "Paris", "days": 3, "unit": "celsius"}),
    ("get_weather", {"city": "São Paulo"}),
    ("search", {"query": "tallest building \"in the world\"", "limit": 5, "safe": True}),
    ("search", {"query": "it's raining", "safe": False}),
    ("send_email", {"to": ["ada@example.com"], "subject": "Hi", "body": "Line one\nLine two"}),
    ("set_timer", {"seconds": 90.5, "label": None}),
    ("sample_distribution", {"distribution": "poisson", "size": 100, "mean": 4.5}),
]
SEVERAL: list[list[Call]] = [  # parallel calls; the last two lists hold calls identical by design
    [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_weather", {"city": "Oslo", "unit": "celsius"})],
    [("search", {"query": "flights to Rome"}), ("send_email", {"to": ["bo@example.com"], "subject": "Trip"}),
     ("set_timer", {"seconds": 600, "label": "check-in"})],
    [("sample_distribution", {"distribution": "normal", "size": 50}),
     ("sample_distribution", {"distribution": "normal", "size": 50}),
     ("sample_distribution", {"distribution": "uniform", "size": 50}),
     ("sample_distribution", {"distribution": "uniform", "size": 50})],
    [("search", {"query": "weather"}), ("search", {"query": "weather"})],
]
BROKEN: dict[str, Callable[[str, str], str]] = {
    "trailing_comma": lambda j, n: j[:-1] + ",}",
    "single_quotes": lambda j, n: _single_quoted(j),
    "unquoted_keys": lambda j, n: _unquote_keys(j),
    "python_literals": lambda j, n: j.replace("true", "True").replace("false", "False").replace("null", "None"),
    "comment": lambda j, n: j[:-1] + " // done\n}",
    "truncated": lambda j, n: j[:-2],
    "truncated_string": lambda j, n: j[:j.rfind('"')] if j.rstrip("}").endswith('"') else j[:-2],
    "missing_quote_end": lambda j, n: _drop_quote(j, last=True),
    "missing_quote_mid": lambda j, n: _drop_quote(j, last=False),
    "stray_prose": lambda j, n: f"Sure! I will call {n} for you.\n{j}\nLet me know!",
    "fence": lambda j, n: f"```json\n{j}\n```",
    "hermes": lambda j, n: f"<tool_call>\n{j}\n</tool_call>",
    "llama3": lambda j, n: "<|python_tag|>" + j.replace('"arguments"', '"parameters"') + "<|eom_id|>",
    "mistral": lambda j, n: f"[TOOL_CALLS] [{j}]",
    "double_encoded": lambda j, n: _double_encoded(j),
    "string_numbers": lambda j, n: _stringify_scalars(j),
    "bare_args_value": lambda j, n: j.replace('["ada@example.com"]', '"ada@example.com"'),
    "enum_case": lambda j, n: j.replace('"celsius"', '"Celsius"'),
    "re_emitted": lambda j, n: f"<tool_call>{j}</tool_call>\nIn JSON:\n```json\n{j}\n```",
    "missing_comma": lambda j, n: j.replace(', "', ' "', 1),
}
SEVERAL_WAYS: dict[str, Callable[[list[str]], str]] = {
    "block_newlines": lambda js: "<tool_call>\n" + "\n".join(js) + "\n</tool_call>",
    "block_commas": lambda js: "<tool_call>\n" + ",\n".join(js) + "\n</tool_call>",
    "block_array": lambda js: "<tool_call>\n[" + ", ".join(js) + "]\n</tool_call>",
    "block_each": lambda js: "\n".join(f"<tool_call>\n{j}\n</tool_call>" for j in js),
    "fence_newlines": lambda js: "```json\n" + "\n".join(js) + "\n```",
    "fence_array": lambda js: "```json\n[" + ",\n".join(js) + "]\n```",
    "python_tag_semicolons": lambda js: "<|python_tag|>" + "; ".join(js) + "<|eom_id|>",
    "mistral_array": lambda js: "[TOOL_CALLS] [" + ", ".join(js) + "]",
    "bare_array": lambda js: "[" + ", ".join(js) + "]",
    "block_repeated": lambda js: 2 * ("<tool_call>\n" + "\n".join(js) + "\n</tool_call>\n"),
    "block_missing_quote": lambda js: "<tool_call>\n" + "\n".join(js[:-1] + [_drop_quote(js[-1], True)])
                                      + "\n</tool_call>",
}
NO_CALL = [
    "The weather in Paris is mild today.", '{"name": "Bob", "age": 3}', 'The config is ```json\n{"debug": true}\n```',
    "```python\nprint({'name': 'get_weather'})\n```", "Use [1, 2, 3] as the list.", "I can't call tools for that.",
    '{"city": "Paris"} is what I would look up.', "Here is a table: {a} and [b].",
]


def _unquote_keys(j: str) -> str:
    value = json.loads(j)
    args = ", ".join(f"{k}: {json.dumps(v)}" for k, v in value["arguments"].items())
    return f'{{name: "{value["name"]}", arguments: {{{args}}}}}'


def _single_quoted(j: str) -> str:
    """Python's repr style: single quotes around strings, a double quote inside one stays as it is."""
    return j.replace("'", "\\'").replace('\\"', "\0").replace('"', "'").replace("\0", '"')


def _drop_quote(j: str, last: bool) -> str:
    """Drop the closing quote of the last (or first) string value among the arguments."""
    start = j.index('"arguments"') + len('"arguments"')
    ends = [i for i in range(start, len(j)) if j[i] == '"' and j[i - 1] != "\\" and j[i + 1:i + 2] in (",", "}", "]")]
    if not ends:
        return j
    i = ends[-1] if last else ends[0]
    return j[:i] + j[i + 1:]


def _double_encoded(j: str) -> str:
    value = json.loads(j)
    return json.dumps({"name": value["name"], "arguments": json.dumps(value["arguments"])})


def _stringify_scalars(j: str) -> str:
    value = json.loads(j)
    args = {k: json.dumps(v) if isinstance(v, (int, float, bool)) and v is not None else v
            for k, v in value["arguments"].items()}
    return json.dumps({"name": value["name"], "arguments": args})


def _text(call: Call) -> str:
    return json.dumps({"name": call[0], "arguments": call[1]}, ensure_ascii=False)


Item = tuple[str, str, list[Call]]  # category, text, the calls it must yield


def corpus() -> list[Item]:
    """Every answer written every way (breakages that leave a text unchanged are skipped)."""
    out = []
    for call in SINGLE:
        clean = _text(call)
        out.append(("clean", clean, [call]))
        out += [(cat, text, [call]) for cat, broken in BROKEN.items() if (text := broken(clean, call[0])) != clean]
    for calls in SEVERAL:
        out += [(f"several: {cat}", way([_text(c) for c in calls]), calls) for cat, way in SEVERAL_WAYS.items()]
    return out + [("no call", text, []) for text in NO_CALL + transcripts(style="json")]


def transcripts(style: str = "prefill") -> list[str]:
    """Real SmolLM2 outputs: "prefill" ones attempt a call, "json" ones were asked for one and hold none."""
    path = ROOT / "tests" / "data" / "tool_transcripts.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r["output"] for r in records if r["style"] == style]


def _baseline(parse: Callable[[str], Any]) -> Callable[[str], list[Call]]:
    def run(text: str) -> list[Call]:
        try:
            value = parse(text)
        except ValueError:
            return []
        out = []
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                args = item.get("arguments", item.get("parameters"))
                out.append((item["name"], json.loads(args) if isinstance(args, str) else args))
        return out
    return run


def _velo(text: str) -> list[Call]:
    try:
        _, calls, _ = repair_message(text, [], TOOLS)
    except ToolCallInvalid:
        return []
    return [(c.name, c.arguments) for c in calls]


CONTENDERS = {"json.loads": _baseline(json.loads), "json-repair": _baseline(json_repair.loads), "velo": _velo}


def _safe(run: Callable[[str], list], text: str) -> list:
    try:
        return run(text)
    except Exception:  # noqa: BLE001 - a baseline that crashes on an output simply did not make it valid
        return []


def _canon(calls: list[Call]) -> list[str]:
    return [json.dumps(c, sort_keys=True) for c in calls]


def scores(items: list[Item], run: Callable[[str], list]) -> tuple[dict[str, list[int]], int, int]:
    """category -> [correct, total]; the calls invented from texts that hold none; the texts with calls that
    yielded calls, but not the intended ones (silently wrong, where nothing at all would have been reported)."""
    table: dict[str, list[int]] = {}
    invented = wrong = 0
    for cat, text, want in items:
        got = _safe(run, text)
        row = table.setdefault(cat, [0, 0])
        right = _canon(got) == _canon(want)
        row[0] += right
        row[1] += 1
        invented += len(got) if not want else 0
        wrong += bool(want and got and not right)
    return table, invented, wrong


def times_us(texts: list[str], run: Callable[[str], list], rounds: int) -> tuple[float, ...]:
    """p50 and p99 per output in microseconds, of wall time and of the thread's CPU time (the second leaves out
    the pauses a shared machine's scheduler adds, which dominate a wall-clock p99 there)."""
    wall, cpu = [], []
    for _ in range(rounds):
        for text in texts:
            w0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            _safe(run, text)
            cpu.append((time.thread_time_ns() - c0) / 1000)
            wall.append((time.perf_counter_ns() - w0) / 1000)
    qw, qc = statistics.quantiles(wall, n=100), statistics.quantiles(cpu, n=100)
    return qw[49], qw[98], qc[49], qc[98]


def random_json(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.choice(["obj", "obj", "list", "str", "num", "lit"] if depth < 3 else ["str", "num", "lit"])
    if kind == "obj":
        return {rng.choice(WORDS) + str(i): random_json(rng, depth + 1) for i in range(rng.randint(1, 4))}
    if kind == "list":
        return [random_json(rng, depth + 1) for _ in range(rng.randint(1, 4))]
    if kind == "str":
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4))) + rng.choice(["", ", ok", "'s", "!"])
    if kind == "num":
        return rng.choice([rng.randint(-100, 10_000), round(rng.uniform(-10, 10), 3)])
    return rng.choice([True, False, None])


WORDS = "city name value items count total label path mode note user id key".split()
JSON_BREAKS: dict[str, Callable[[str], str]] = {
    "trailing_comma": lambda j: re.sub(r"([}\]])$", r",\1", j),
    "single_quotes": lambda j: j.replace("'", "").replace('"', "'"),
    "unquoted_keys": lambda j: re.sub(r'"(\w+)":', r"\1:", j),
    "python_literals": lambda j: j.replace("true", "True").replace("false", "False").replace("null", "None"),
    "comment": lambda j: j[:-1] + " // end\n" + j[-1],
    "truncated": lambda j: j[:max(2, len(j) * 2 // 3)],
    "missing_comma": lambda j: j.replace(", ", " ", 1),
    "missing_quote_end": lambda j: j[:j.rfind('"')] + j[j.rfind('"') + 1:] if j.endswith(('"}', '"]')) else j,
    "stray_prose": lambda j: f"Here it is:\n{j}\nHope this helps.",
    "newline_in_string": lambda j: j.replace(" ", "\n", 1) if '"' in j else j,
}


def json_agreement(n: int) -> tuple[dict[str, list[int]], list[str]]:
    """break -> [Velo equals json_repair, total] on random JSON values broken each way."""
    rng = random.Random(0)
    table: dict[str, list[int]] = {}
    texts = []
    for _ in range(n):
        value = random_json(rng)
        if not isinstance(value, (dict, list)):
            continue
        clean = json.dumps(value)
        for name, brk in JSON_BREAKS.items():
            text = brk(clean)
            if text == clean:
                continue
            texts.append(text)
            row = table.setdefault(name, [0, 0])
            row[0] += _velo_json(text) == _library_json(text)
            row[1] += 1
    return table, texts


def _velo_json(text: str) -> Any:
    try:
        return parse_json(text).value
    except Unrepairable:
        return None


def _library_json(text: str) -> Any:
    value = json_repair.loads(text)
    return value if isinstance(value, (dict, list)) and value not in ({}, []) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=int, default=300, help="random JSON values for the agreement corpus")
    args = parser.parse_args()
    items = corpus()
    real = transcripts()
    print(f"corpus: {len(items)} outputs ({sum(1 for i in items if not i[2])} hold no call), {len(real)} real "
          f"SmolLM2-135M attempts; {args.rounds} rounds; time per output in us, wall clock [thread CPU time]")
    results = {label: scores(items, run) for label, run in CONTENDERS.items()}
    print(f"{'category':34s} " + " ".join(f"{label:>12s}" for label in CONTENDERS))
    for cat in results["velo"][0]:
        cells = [results[label][0][cat] for label in CONTENDERS]
        print(f"{cat:34s} " + " ".join(f"{c / t:11.1%} " for c, t in cells) + f"  (n={cells[0][1]})")
    for label, (table, invented, wrong) in results.items():
        calls = {c: v for c, v in table.items() if c != "no call"}
        worst = min(calls, key=lambda c: calls[c][0] / calls[c][1])
        total = [sum(v[i] for v in calls.values()) for i in (0, 1)]
        print(f"{label:11s} correct {total[0] / total[1]:6.1%} of texts with calls; worst category {worst} "
              f"{calls[worst][0] / calls[worst][1]:.1%}; silently wrong {wrong}; invented from texts with none: "
              f"{invented}")
    for label, run in CONTENDERS.items():
        p50, p99, best50, best99 = times_us([t for _, t, _ in items] + real, run, args.rounds)
        print(f"time {label:11s} p50 {p50:6.1f}  p99 {p99:8.1f}   [p50 {best50:6.1f}  p99 {best99:6.1f}]")
    agree, texts = json_agreement(args.json)
    print(f"broken JSON in general ({len(texts)} texts from {args.json} random values): Velo parse_json equal to "
          f"json_repair.loads")
    for name, (same, total) in agree.items():
        print(f"  {name:20s} {same / total:6.1%}  (n={total})")
    same, total = (sum(v[i] for v in agree.values()) for i in (0, 1))
    print(f"  {'all':20s} {same / total:6.1%}")


if __name__ == "__main__":
    main()
