"""What reading attached PDFs (proxy/dialects/documents.py) costs an agent's conversation, whose history brings the
same PDF again every turn: an Anthropic request holding a `--pages`-page PDF, parsed `--turns` times through one
`Documents` reader. Baselines, same run:
- the same parse with the reading done every turn (a fresh reader each time, nothing kept);
- the same first parse done on the event loop (no reader: what a large PDF would hold every other client for),
  against the reader's, which moves it to its own thread: the longest gap a 1 ms ticker on the loop sees.

    python bench/documents.py [--pages 40] [--turns 10]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.dialects import anthropic as anthropic_dialect  # noqa: E402
from proxy.dialects import documents  # noqa: E402
from tests.proxy.test_documents import b64, pdf  # noqa: E402


def _body(data: str) -> dict:
    return {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": data}},
        {"type": "text", "text": "What does it say about page 3?"}]}]}


async def _longest_gap(parse) -> float:  # noqa: ANN001 - a coroutine function
    """The longest gap a 1 ms ticker on the event loop sees while `parse()` runs, in ms."""
    gaps, done = [], False

    async def tick() -> None:
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0.01)
    gaps.clear()
    await parse()
    done = True
    await ticker
    return max(gaps) * 1000


async def main(pages: int, turns: int) -> None:
    body = _body(b64(pdf(*(f"Page {n}: the quarterly figures, line by line, as the auditors read them." * 3
                           for n in range(pages)))))
    kept_reader = documents.Documents()
    kept, fresh = [], []
    for _ in range(turns):
        started = time.perf_counter()
        await kept_reader.parse(anthropic_dialect.parse_messages, body)
        kept.append(time.perf_counter() - started)
        reader = documents.Documents()
        started = time.perf_counter()
        await reader.parse(anthropic_dialect.parse_messages, body)
        fresh.append(time.perf_counter() - started)
        reader.close()
    later_kept, later_fresh = statistics.median(kept[1:]), statistics.median(fresh[1:])
    print(f"{pages}-page PDF, {turns} turns: first parse {kept[0] * 1e3:.1f} ms; each later turn "
          f"{later_kept * 1e3:.3f} ms with the text kept against {later_fresh * 1e3:.1f} ms read again "
          f"({later_kept / later_fresh:.3f}x)")

    async def on_loop() -> None:
        anthropic_dialect.parse_messages(body)  # no reader: the PDF is read where the parse runs

    async def apart() -> None:
        await documents.Documents().parse(anthropic_dialect.parse_messages, body)
    loop_gap, apart_gap = await _longest_gap(on_loop), await _longest_gap(apart)
    print(f"longest gap of a 1 ms ticker on the event loop during the first parse: {apart_gap:.1f} ms with the "
          f"reader's thread against {loop_gap:.1f} ms on the loop ({apart_gap / loop_gap:.2f}x)")
    kept_reader.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=40)
    ap.add_argument("--turns", type=int, default=10)
    args = ap.parse_args()
    asyncio.run(main(args.pages, args.turns))
