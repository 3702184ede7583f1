"""Per-model repair counters, plain Python so the proxy can export them however it likes."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from proxy.tools.calls import RepairReport


@dataclass
class ModelCounts:
    extracted: int = 0  # calls found in text rather than as structured tool_calls
    repaired: int = 0  # fixes applied to JSON (one per kind per call)
    coerced: int = 0  # argument values changed to match the schema
    deduped: int = 0  # identical repeated calls dropped
    retried: int = 0  # extra backend requests made by retry.with_retry
    invalid: int = 0  # calls (or structured answers) still invalid after repair, counted per attempt


@dataclass
class ToolMetrics:
    by_model: dict[str, ModelCounts] = field(default_factory=dict)

    def record(self, model: str, report: RepairReport) -> None:
        c = self.by_model.setdefault(model, ModelCounts())
        c.extracted += report.extracted
        c.repaired += len(report.repaired)
        c.coerced += len(report.coerced)
        c.deduped += report.deduped
        c.invalid += len(report.invalid)

    def retried(self, model: str) -> None:
        self.by_model.setdefault(model, ModelCounts()).retried += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {model: asdict(c) for model, c in self.by_model.items()}
