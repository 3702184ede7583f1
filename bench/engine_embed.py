"""What embedding one input per engine call costs against all of a request's inputs in one call, in the same run,
on the shipped SmolLM2-135M: the adapter hands the engine one input at a time (adapters/engine.py `embed`), so a
client that leaves stops the rest and generations run between inputs. Also how long a generation waits behind a
40-input embedding either way (the figure one call made 46 s for a larger model).

    python bench/engine_embed.py [--inputs 40] [--rounds 3]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from adapters.base import BackendConfig  # noqa: E402
from adapters.engine import EngineBackend  # noqa: E402
from adapters.protocol import ChatRequest, EmbedRequest, Message, SamplingOptions  # noqa: E402


async def main(inputs: int, rounds: int) -> None:
    backend = EngineBackend(BackendConfig(name="e", kind="engine", options={"progress": False}))
    await backend.start()
    engine, _ = await backend._waited(backend.model_name)  # loaded once, outside the timings
    texts = [f"sentence number {i} about the weather in a city" for i in range(inputs)]
    window = engine.model_info["context_length"]
    per_input, whole, waits_per_input, waits_whole = [], [], [], []
    for _ in range(rounds):
        started = time.perf_counter()
        await backend.embed(EmbedRequest(model=backend.model_name, inputs=texts))
        per_input.append(time.perf_counter() - started)
        started = time.perf_counter()
        await asyncio.to_thread(engine.embed, texts, True, window)
        whole.append(time.perf_counter() - started)
        for waits, embed in ((waits_per_input, lambda: backend.embed(EmbedRequest(model=backend.model_name,
                                                                                   inputs=texts))),
                             (waits_whole, lambda: asyncio.to_thread(engine.embed, texts, True, window))):
            embedding = asyncio.ensure_future(embed())
            await asyncio.sleep(0.05)
            started = time.perf_counter()
            chat = ChatRequest(model=backend.model_name, messages=[Message("user", "hi")],
                               options=SamplingOptions(max_tokens=1, temperature=0))
            [c async for c in backend.chat(chat)]
            waits.append(time.perf_counter() - started)
            await embedding
    await backend.close()
    p, w = statistics.median(per_input), statistics.median(whole)
    print(f"{inputs} inputs: one a call {p * 1e3:.0f} ms, all in one call {w * 1e3:.0f} ms: {p / w:.2f}x")
    pw, ww = statistics.median(waits_per_input), statistics.median(waits_whole)
    print(f"a 1-token generation started meanwhile waited {pw * 1e3:.0f} ms against {ww * 1e3:.0f} ms: "
          f"{pw / ww:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.inputs, args.rounds))
