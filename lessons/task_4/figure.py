"""Task 4's figure (task_4_paged_attention.py draws it after saving): per request, the slots
contiguous allocation reserves against the whole blocks PagedAttention hands out and the slots
used; then the block pool at its peak (the step at which most blocks were in use), each block
held then coloured by its request, the rest free. A pure function of the saved result (task 4's PagedKV:
its requests, settings, paged, contiguous), read by attribute; pool_at_peak works out what the
pool plots (tests/test_kv_tasks.py checks it on the source's five requests)."""
from __future__ import annotations

import math

from common import figures

# the pool's colour per request: none of the three the panel above uses (slot_bars: used, and
# the two reservations), so that a colour means one thing on the page; past five, they repeat
REQUEST_COLOURS = [figures.color(i) for i in (0, 1, 3, 6, 7)]


def request_colour(i: int) -> str:
    return REQUEST_COLOURS[i % len(REQUEST_COLOURS)]


def pool_at_peak(requests: list, num_pool_pages: int) -> list[tuple[int, int] | None]:
    """For each physical page of the pool: (request index, logical page) of the request that
    held it at the pool's peak (task 4's PagedRequest.page_ids_at_peak), None where it was free
    then. A page has one holder at a time."""
    held: list[tuple[int, int] | None] = [None] * num_pool_pages
    for i, q in enumerate(requests):
        for logical, page in enumerate(q.page_ids_at_peak):
            held[page] = (i, logical)
    return held


def pool_title(paged) -> str:
    """What the grid shows, and what it cannot (blocks handed out again), from the run's
    figures: one whole template a case."""
    peak = (f"The pool at its peak, step {paged.peak_step}: {paged.num_pages_peak} of "
            f"{paged.num_pool_pages} blocks in use, the rest free (corner: block id).")
    reused = paged.num_pages_reused
    if reused == 1:
        return (f"{peak}\nA cell: request Rn's logical block bN; over the run, one freed block "
                "went to a request still growing")
    if reused:
        return (f"{peak}\nA cell: request Rn's logical block bN; over the run, {reused} freed "
                "blocks went to requests still growing")
    return f"{peak}\nA cell: request Rn's logical block bN; no freed block was handed out again"


def draw_pages(res):
    """Per request, contiguous reservation vs whole blocks vs used; then the pool at its peak,
    each block held then coloured by its request, with its logical block number."""
    reqs, num_pool, cols = res.requests, res.paged.num_pool_pages, 8
    rows = math.ceil(num_pool / cols)
    fig, (top, grid) = figures.figure(0.55 * len(reqs) + 0.6 * rows + 2.4, 2, 1,
                                      height_ratios=[0.55 * len(reqs) + 0.6, 0.6 * rows + 0.4])
    figures.slot_bars(top, [(q.name, q.num_tokens, [("contiguous", res.settings.max_len_slots),
                                                    ("in blocks", q.allocated_slots)]) for q in reqs])
    top.set_title(f"Per request: {res.contiguous.utilization_pct}% of contiguous slots used, "
                  f"{res.paged.utilization_pct}% of those in blocks")
    pool = pool_at_peak(reqs, num_pool)
    for page, held in enumerate(pool):
        x, y = page % cols, page // cols
        grid.add_patch(figures.rect(x, y, 1, "white" if held is None else request_colour(held[0])))
        if held is not None:
            grid.text(x + 0.5, y + 0.5, f"R{held[0] + 1}\nb{held[1]}", ha="center", va="center",
                      fontsize=8)
        grid.text(x + 0.04, y + 0.06, str(page), fontsize=7, va="top", color="#333333")
    grid.set_xlim(0, cols)
    grid.set_ylim(rows, 0)
    grid.axis("off")
    grid.set_title(pool_title(res.paged))
    holders = sorted({held[0] for held in pool if held is not None})   # the legend: as drawn
    grid.legend(handles=[figures.patch(request_colour(i), f"R{i + 1} {reqs[i].name}")
                         for i in holders] + [figures.patch("white", "free at the peak")],
                loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return figures.finish(fig, "Task 4: blocks handed out as tokens arrive, anywhere in the pool",
                          res)
