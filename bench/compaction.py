"""What Codex's remote compaction through Velo buys: the next turn of a long agent session with its whole history
(the baseline, measured in the same run) against the same turn after compaction, as Codex asks for it (a
`compaction_trigger` ending the input, streamed) and keeps its result (the user's messages and the compaction item).

    python bench/compaction.py [--files 10] [--chars 2500] [--model PATH.gguf]

The session is the one a coding agent has after reading this repository's own files: a task, then per file an
`exec_command` call (`cat FILE`) whose output is the file's first `--chars` characters and a one-line note, then the
next user turn (no tools offered: the bench times prompts, not calls). Velo runs as `velo serve` over a managed
llama-server with Qwen2.5-Coder-1.5B (the file the test command assembles; any GGUF with `--model`), one slot;
the two next turns share no prefix but the task, so each reads its prompt cold. Prints the next turn's prompt
tokens and time (16 answer tokens) with the whole history and after compaction, as ratios; the compaction's own
time against the whole-history turn, and how long it took to its first summary piece (its prompt is that turn's
with another last line: llama-server may reuse the prefix it keeps); and the summary.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.llama_server import binary  # noqa: E402
from tests.velo_serve import velo_serve  # noqa: E402

QWEN = ROOT / ".build/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
FILES = ["proxy/stages/fit.py", "proxy/stages/cache.py", "proxy/router.py", "proxy/streams.py", "proxy/metrics.py",
         "proxy/http_io.py", "proxy/limits.py", "proxy/residency.py", "proxy/inflight.py", "proxy/reload.py",
         "adapters/http.py", "adapters/options.py"]


def session(files: int, chars: int) -> list[dict]:
    items: list[dict] = [{"role": "user", "content": "Find where Velo decides that a request does not fit the "
                                                     "model's context, and add a log line with the model's name."}]
    for n, name in enumerate(FILES[:files]):
        items += [{"type": "function_call", "call_id": f"c{n}", "name": "exec_command",
                   "arguments": json.dumps({"cmd": f"cat {name}"})},
                  {"type": "function_call_output", "call_id": f"c{n}", "output": (ROOT / name).read_text()[:chars]},
                  {"role": "assistant", "content": f"Read {name}."}]
    return items


def turn(client: openai.OpenAI, model: str, items: list[dict]) -> tuple[int, float]:
    """Prompt tokens and seconds of one next turn over `items`."""
    started = time.perf_counter()
    out = client.responses.create(model=model, input=items + [{"role": "user", "content": "Go on."}],
                                  max_output_tokens=16, store=False)
    return out.usage.input_tokens, time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10)
    ap.add_argument("--chars", type=int, default=2500, help="of each file the tool output shows")
    ap.add_argument("--model", default=str(QWEN), help="a GGUF file (default: the Qwen the test command assembles)")
    args = ap.parse_args()
    if not Path(args.model).is_file():
        sys.exit(f"{args.model} is missing: run scripts/fetch-qwen-pair.sh 1.5b")
    command = json.dumps([binary(), "-c", "16384", "-np", "1", "-t", "2"])
    config = f'[[backends]]\nname = "llama"\nkind = "llamacpp"\nmodel = "{args.model}"\ncommand = {command}\n'
    model = Path(args.model).stem
    items = session(args.files, args.chars)
    with tempfile.TemporaryDirectory() as folder, velo_serve(Path(folder), config) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=1800)
        whole_tokens, whole_s = turn(client, model, items)
        first_s, compact_s, done = compact(url, model, items)
        kept = [i for i in items if i.get("role") == "user"] + [done["output"][0]]  # what Codex keeps
        after_tokens, after_s = turn(client, model, kept)
    print(f"compaction     {args.files} files read, {model}: next turn's prompt {whole_tokens} -> {after_tokens} "
          f"tokens ({after_tokens / whole_tokens:.2f}x); its time {whole_s:.1f} -> {after_s:.1f} s "
          f"({after_s / whole_s:.2f}x); the compaction {compact_s:.1f} s ({compact_s / whole_s:.2f}x of the "
          f"whole-history turn; first summary piece after {first_s:.1f} s), summary "
          f"{done['usage']['output_tokens']} tokens")
    print("summary:", json.loads(done["output"][0]["encrypted_content"])["summary"])


def compact(url: str, model: str, items: list[dict]) -> tuple[float, float, dict]:
    """Codex's compaction v2 (a trailing compaction_trigger, streamed): seconds to the first summary piece and to
    the end, and the completed response."""
    started, first = time.perf_counter(), None
    body = {"model": model, "input": items + [{"type": "compaction_trigger"}], "stream": True, "store": False}
    with httpx.stream("POST", url + "/v1/responses", json=body, timeout=1800) as resp:
        for line in resp.iter_lines():
            if line == "event: response.compaction.compacting" and first is None:
                first = time.perf_counter() - started
            if line.startswith("data: ") and '"response.completed"' in line[:60]:
                done = json.loads(line[6:])["response"]
    return first or 0.0, time.perf_counter() - started, done


if __name__ == "__main__":
    main()
