"""What the summary saves (results/summary.json): the section-10 table as it printed it, what
ran, the roofline with the lab's steps placed under it, and the lab's last run."""
from __future__ import annotations

from dataclasses import dataclass, field

from common import results, steps
from lessons.summary.roofline import EnginePoint, Placement


@dataclass
class Summary(results.Result):
    """results/summary.json: the table, the roofline, the lab's last run."""
    rows: list[steps.SummaryRow] = field(default_factory=list)
    model: str | None = None
    dtype: str | None = None
    cores: int | None = None
    roofline: Placement | None = None
    engine_point: EnginePoint | None = None   # task 9's engine on the roofline figure
    lab_run: results.LabRun | None = None
    cross_checks: list[str] = field(default_factory=list)   # the same thing measured twice
