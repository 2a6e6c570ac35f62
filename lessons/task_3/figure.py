"""Task 3's figure (task_3_kv_cache_problem.py draws it after saving): per request, the slots
contiguous allocation reserved against those it used. A pure function of the saved
ContiguousKV."""
from __future__ import annotations

from common import figures


def draw_reservations(res):
    """Per request, the slots contiguous allocation reserved against those it used."""
    fig, ax = figures.figure(0.55 * len(res.requests) + 1.8)
    figures.slot_bars(ax, [(q.name, q.used_slots, [("contiguous", q.allocated_slots)])
                           for q in res.requests])
    ax.set_title(f"{res.utilization_pct}% of the {res.allocated_slots:,} reserved slots "
                 f"hold a token")
    return figures.finish(fig, "Task 3: contiguous allocation reserves the worst case", res)
