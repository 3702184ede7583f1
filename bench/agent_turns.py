"""What an agent's next turn finds of the turn before in the engine's prefix cache, through Velo: a Claude Code-like
session (its billing header with a hash that changes every request, a long system prompt, three tools, the model's
own answers and tool calls sent back, a tool result after each call) on the engine with the radix prefix cache,
against the same session on a second engine without it (the baseline, same run, alternated).

    python bench/agent_turns.py [--turns 6] [--system-tokens 2000] [--reps 2]

Through the official `anthropic` client on `velo serve`, the shipped SmolLM2-135M, greedy, 30 answer tokens a turn.
Each session opens with its own line, so none reuses another's prompt. Prints each turn's cached share of its
prompt and the median time of the turns after the first, cached against uncached.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anthropic

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.velo_serve import velo_serve  # noqa: E402

CONFIG = "".join(f'[[backends]]\nname = "{name}"\nkind = "engine"\noptions = {{ progress = false, name = "{name}"'
                 f'{extra} }}\n' for name, extra in (("cached", ""), ("uncached", ", enable_prefix_cache = false")))
TOOLS = [{"name": name, "description": text, "input_schema": {"type": "object", "properties": {
    arg: {"type": "string"}}, "required": [arg]}} for name, text, arg in (
    ("read_file", "Read the contents of a file", "path"), ("list_dir", "List the files in a directory", "path"),
    ("run_command", "Run a shell command", "command"))]
RULE = "Rule {i}: keep each edit small, run the tests after it, and explain the change to the user. "


def system(session: int, tokens: int) -> list[dict]:
    """Claude Code's three blocks: the billing header (its `cch` new each request), who it is, its instructions."""
    rules = "".join(RULE.format(i=i) for i in range(tokens // 20))
    return [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.37.0d9; cc_entrypoint=cli; "
                                     f"cch={os.urandom(3).hex()[:5]};"},
            {"type": "text", "text": f"(session {session}) You are Claude Code, Anthropic's official CLI for Claude."},
            {"type": "text", "text": rules, "cache_control": {"type": "ephemeral"}}]


def session(client: anthropic.Anthropic, model: str, number: int, turns: int,
            tokens: int) -> list[tuple[int, int, float]]:
    """(prompt tokens, cached tokens, seconds) of each turn."""
    messages: list[dict] = [{"role": "user", "content": "Look at this project and tell me what it does."}]
    out = []
    for _ in range(turns):
        started = time.perf_counter()
        msg = client.messages.create(model=model, max_tokens=30, system=system(number, tokens), messages=messages,
                                     tools=TOOLS, extra_body={"temperature": 0},
                                     extra_headers={"Cache-Control": "no-cache"})
        cached = msg.usage.cache_read_input_tokens or 0
        out.append((msg.usage.input_tokens + cached, cached, time.perf_counter() - started))
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
        calls = [b for b in msg.content if b.type == "tool_use"]
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": c.id, "content": f"1\tthe output of {c.name}\n2\tand more"}
            for c in calls] or "Go on."})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system-tokens", type=int, default=2000, help="of the instructions block, roughly")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    runs: dict[str, list[list[tuple[int, int, float]]]] = {"cached": [], "uncached": []}
    with tempfile.TemporaryDirectory() as folder, velo_serve(Path(folder), CONFIG) as url:
        client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=900)
        for model in runs:  # load both engines
            client.messages.create(model=model, max_tokens=1, messages=[{"role": "user", "content": "hi"}])
        for number in range(2 * args.reps):
            model = ("cached", "uncached")[number % 2]
            runs[model].append(session(client, model, number, args.turns, args.system_tokens))
    later = {m: statistics.median(t for r in rs for _, _, t in r[1:]) for m, rs in runs.items()}
    shares = [statistics.median(r[i][1] / r[i][0] for r in runs["cached"]) for i in range(args.turns)]
    prompts = [statistics.median(r[i][0] for r in runs["cached"]) for i in range(args.turns)]
    print(f"agent turns  {args.turns} Claude Code-like turns, SmolLM2-135M on the engine, {args.reps} reps: prompt "
          f"{prompts[0]:.0f} -> {prompts[-1]:.0f} tokens; cached share by turn "
          f"{', '.join(f'{s:.2f}' for s in shares)}; a later turn {later['cached']:.2f} s against "
          f"{later['uncached']:.2f} s without the prefix cache ({later['cached'] / later['uncached']:.2f}x)")


if __name__ == "__main__":
    main()
