"""What task 3 saves (results/task_3_kv_cache_problem.json): the simulation's settings, each
request's slots used against those reserved, the totals, the users that fit, and the same in
bytes for the model the lab runs; and its row in the summary's table."""
from __future__ import annotations

from dataclasses import dataclass

from common import kv, results


@dataclass
class ContiguousRequest(results.Record):
    """One request under contiguous allocation: the slots it used of those reserved for it."""
    name: str
    used_slots: int
    allocated_slots: int
    waste_pct: float


@dataclass
class ContiguousKV(results.Result):
    settings: kv.Simulation
    requests: list[ContiguousRequest]
    allocated_slots: int
    used_slots: int
    utilization_pct: float
    waste_pct: float
    mean_used_slots: int      # what a request needs with no waste: the mean it really used
    users_contiguous: int     # users that fit in --total-slots, max_len each
    users_ideal: int          # ...and mean_used_slots each
    in_bytes: kv.InBytes


def summary_row(res: ContiguousKV) -> str:
    return f"utilisation {res.utilization_pct}%"
