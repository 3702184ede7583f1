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
    skipped: int = 0  # answers passed through unrepaired: too large, or past the time budget

    def record(self, report: RepairReport) -> None:
        self.extracted += report.extracted
        self.repaired += len(report.repaired)
        self.coerced += len(report.coerced)
        self.deduped += report.deduped
        self.invalid += len(report.invalid)
        self.skipped += bool(report.skipped)


@dataclass
class ToolMetrics:
    """Counts per model label (proxy/router.py: a listed or configured name, else "other", so bounded)."""

    by_model: dict[str, ModelCounts] = field(default_factory=dict)

    def of(self, model: str) -> ModelCounts:
        return self.by_model.setdefault(model, ModelCounts())

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {model: asdict(c) for model, c in self.by_model.items()}
