"""Tool-call and structured-output repair on the way back (proxy/tools/), with optional re-asking
(`[tools] max_retries`): a retry runs the rest of the pipeline again with the corrected conversation."""
from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import AsyncIterator, Iterator

from prometheus_client.core import CounterMetricFamily

from adapters.output_format import check_format, check_tools
from adapters.protocol import Chunk, Tool

from ..job import Job, Request
from ..tools.budget import Budget, repair_threads
from ..tools.metrics import ToolMetrics
from ..tools.retry import with_retry
from ..tools.stream import offered_tools
from .base import Next, Services, Stage


class Repair(Stage):
    def __init__(self, services: Services) -> None:
        super().__init__(services)
        self.metrics, _ = services.lease.hold("metrics:tools", ToolMetrics)
        self.threads = repair_threads()
        services.registry.register(self)

    async def close(self) -> None:
        self.threads.shutdown(wait=False, cancel_futures=True)

    def wraps(self, job: Job) -> bool:
        """Whether the job offers tools or asks for a format: nothing else is repaired."""
        return job.request.format is not None or bool(offered_tools(job.request))

    def __call__(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        """A schema no answer or call can match (a format's, an offered tool's parameters) is a 400 here, whatever the
        backend (adapters/output_format.py), before the request waits for a backend's slot."""
        tools = offered_tools(job.request)
        if isinstance(job.request.format, dict) or tools:
            return self._checked(job, next, tools)
        return self._repaired(job, next)

    async def _checked(self, job: Job, next: Next, tools: list[Tool]) -> AsyncIterator[Chunk]:
        await check_format(job.request.format)
        await check_tools(tools)
        async with contextlib.aclosing(self._repaired(job, next)) as rest:
            async for chunk in rest:
                yield chunk

    def _repaired(self, job: Job, next: Next) -> AsyncIterator[Chunk]:
        tools = self.services.config.tools
        if not tools.repair:
            return next(job)

        def run(request: Request) -> AsyncIterator[Chunk]:
            return next(job if request is job.request else replace(job, request=request))
        assert job.target is not None
        budget = Budget(tools.repair_budget_s, self.threads)
        return _timed(with_retry(run, job.request, tools.max_retries, self.metrics.of(job.target.label),
                                 job.outcome.repairs, budget, job.target.backend.constrains_format, job.outcome.calls),
                      budget, job)

    def collect(self) -> Iterator[CounterMetricFamily]:
        repairs = CounterMetricFamily("velo_tool_repairs", "Tool-call and structured-output repairs",
                                      labels=["model", "kind"])
        for model, counts in self.metrics.snapshot().items():
            for kind, n in counts.items():
                repairs.add_metric([model, kind], n)
        yield repairs


async def _timed(chunks: AsyncIterator[Chunk], budget: Budget, job: Job) -> AsyncIterator[Chunk]:
    """`chunks`, then whether repair ran out of time on them (Outcome.unrepaired), which the cache stage reads."""
    async with contextlib.aclosing(chunks):  # type: ignore[type-var]
        async for chunk in chunks:
            yield chunk
    job.outcome.unrepaired = budget.spent
