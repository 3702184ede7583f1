"""What Anthropic's context editing through Velo buys a long agent session: the next turn with the whole history
(the baseline, measured in the same run) against the same turn with `clear_tool_uses_20250919` (the oldest tool
results replaced by a note, the last `--keep` kept), and what the edit itself costs when it does not fire (the same
request with and without `context_management`, a trigger above its size).

    python bench/context_edits.py [--files 6] [--chars 2000] [--keep 2] [--reps 3]

The session is a coding agent's after reading this repository's files (a `read_file` call per file, its first
`--chars` characters as the result), through the official `anthropic` client, on `velo serve` with the embedded
engine and the shipped SmolLM2-135M (an 8,192-token context). Every turn starts with its own line, so no turn reuses
another's prompt cache; the reps alternate. Prints the next turn's prompt tokens and time (8 answer tokens) as
ratios, and what an edit costs when it is counted and does not fire: `count_tokens` of a one-file turn with and
without it (one more exact count by the engine's tokenizer), alternated.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anthropic

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.compaction import FILES  # noqa: E402
from tests.velo_serve import velo_serve  # noqa: E402

MODEL = "smollm2:135m"
READ = {"name": "read_file", "description": "Read a file", "input_schema": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
CONFIG = '[[backends]]\nname = "engine"\nkind = "engine"\noptions = { progress = false }\n'


def session(files: int, chars: int, nonce: int) -> list[dict]:
    out: list[dict] = [{"role": "user", "content": f"({nonce}) Find where Velo decides that a request does not fit "
                                                   "the model's context, and add a log line."}]
    for n, name in enumerate(FILES[:files]):
        out += [{"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{n}", "name": "read_file",
                                                   "input": {"path": name}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{n}",
                                              "content": (ROOT / name).read_text()[:chars]}]}]
    return out + [{"role": "user", "content": "Go on."}]


def turn(client: anthropic.Anthropic, messages: list[dict], edits: dict | None) -> tuple[int, float, list]:
    """Prompt tokens, seconds and applied edits of one next turn."""
    extra = {"context_management": edits, "betas": ["context-management-2025-06-27"]} if edits else {}
    started = time.perf_counter()
    msg = client.beta.messages.create(model=MODEL, max_tokens=8, messages=messages, tools=[READ],
                                      extra_body={"temperature": 0}, extra_headers={"Cache-Control": "no-cache"},
                                      **extra)
    applied = msg.context_management.applied_edits if msg.context_management else []
    return msg.usage.input_tokens, time.perf_counter() - started, applied


def count_ms(client: anthropic.Anthropic, messages: list[dict], edits: dict | None) -> float:
    extra = {"context_management": edits, "betas": ["context-management-2025-06-27"]} if edits else {}
    started = time.perf_counter()
    client.beta.messages.count_tokens(model=MODEL, messages=messages, tools=[READ], **extra)
    return (time.perf_counter() - started) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=6)
    ap.add_argument("--chars", type=int, default=2000, help="of each file the tool result shows")
    ap.add_argument("--keep", type=int, default=2, help="tool uses the edit keeps")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    clear = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 1000},
                        "keep": {"type": "tool_uses", "value": args.keep}}]}
    one = session(1, args.chars, 0)
    # A trigger above the turn's tokens (3.5-4.5 characters each) but under half its characters: counted, then left
    idle = {"edits": [{"type": "clear_tool_uses_20250919", "trigger": {
        "type": "input_tokens", "value": int(len(str(one)) / 2.5)}}]}
    runs: dict[str, list[tuple[int, float]]] = {"whole": [], "cleared": []}
    costs: dict[str, list[float]] = {"plain": [], "idle": []}
    with tempfile.TemporaryDirectory() as folder, velo_serve(Path(folder), CONFIG) as url:
        client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=600)
        turn(client, session(1, 100, -1), None)  # load the model
        for nonce in range(2 * args.reps):  # alternating, each turn its own first line
            name, edits = (("whole", None), ("cleared", clear))[nonce % 2]
            tokens, seconds, applied = turn(client, session(args.files, args.chars, nonce + 1), edits)
            assert (name == "cleared") == bool(applied), (name, applied)
            runs[name].append((tokens, seconds))
        for _ in range(20 * args.reps):
            costs["plain"].append(count_ms(client, one, None))
            costs["idle"].append(count_ms(client, one, idle))

    def median(name: str, i: int) -> float:
        return statistics.median(r[i] for r in runs[name])
    plain, idle_ms = statistics.median(costs["plain"]), statistics.median(costs["idle"])
    print(f"context edits  {args.files} files read, {MODEL}, keep {args.keep}, {args.reps} reps: next turn's prompt "
          f"{median('whole', 0):.0f} -> {median('cleared', 0):.0f} tokens "
          f"({median('cleared', 0) / median('whole', 0):.2f}x); its time {median('whole', 1):.2f} -> "
          f"{median('cleared', 1):.2f} s ({median('cleared', 1) / median('whole', 1):.2f}x); an edit that is counted "
          f"and does not fire: count_tokens {plain:.1f} -> {idle_ms:.1f} ms ({idle_ms - plain:+.1f} ms)")


if __name__ == "__main__":
    main()
