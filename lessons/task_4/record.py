"""What task 4 saves (results/task_4_paged_attention.json): the simulation's settings, each
request's pages, the pool's figures, contiguous allocation's beside them, and the users that fit;
and its row in the summary's table. task_4_paged_attention.py builds it from its page
allocator's run; the figure (lessons/task_4/figure.py) and the summary read it by attribute."""
from __future__ import annotations

from dataclasses import dataclass

from common import kv, results


@dataclass
class PagedSimulation(kv.Simulation):
    page_size_tokens: int


@dataclass
class PagedRequest(results.Record):
    """One request's pages: its page table, the slots they hold, when it gave them back, and
    those it held when the pool was fullest (the figure draws the pool then)."""
    name: str
    num_tokens: int
    num_pages: int
    page_ids: list[int]
    allocated_slots: int
    waste_pct: float
    finish_step: int
    page_ids_at_peak: list[int]     # logical page i -> physical page id, at the pool's peak


@dataclass
class Slots(results.Record):
    """An allocation's token slots: reserved, used, the share used."""
    allocated_slots: int
    used_slots: int
    utilization_pct: float


@dataclass
class PagedFigures(Slots):
    """...and what the page pool went through (PagedRun's figures)."""
    num_pool_pages: int
    num_pages_peak: int
    num_pages_reused: int
    num_preempted: int
    num_pages_free_after: int
    peak_step: int                  # the first decode step with num_pages_peak pages in use


@dataclass
class PagedKV(results.Result):
    settings: PagedSimulation
    requests: list[PagedRequest]
    paged: PagedFigures
    contiguous: Slots
    slots_saved: int
    memory_ratio: float       # contiguous slots / paged slots
    mean_paged_slots: int     # what a request holds on average, in whole pages' slots
    users_contiguous: int     # users that fit in --total-slots, max_len each
    users_paged: int          # ...and mean_paged_slots each
    in_bytes: kv.InBytes
    users_ratio: float | None = None   # None: not one user fits contiguously


def summary_row(res: PagedKV) -> str:
    return f"utilisation {res.paged.utilization_pct}%, users {res.users_ratio}x"
