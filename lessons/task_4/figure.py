"""Task 4's figure (task_4_paged_attention.py draws it after saving): per request, the slots
contiguous allocation reserves against the whole pages paging hands out and the slots used;
then the page pool, each physical page coloured by the request(s) that held it. A pure
function of the saved result (task 4's PagedKV: its requests, settings, paged, contiguous),
read by attribute; pool_owners works out what the pool plots (tests/test_kv_tasks.py checks it
on the source's five requests)."""
from __future__ import annotations

import math

from common import figures


def pool_owners(requests: list, num_pool_pages: int) -> list[list[tuple[int, int]]]:
    """For each physical page of the pool: (request index, logical page) of every request (task
    4's PagedRequest: page_ids, finish_step) that held it, first holder first. A page is held by
    one request at a time and handed out again only after its holder finished, so the holders
    of one page run in order of finishing."""
    owners: list[list[tuple[int, int]]] = [[] for _ in range(num_pool_pages)]
    for i in sorted(range(len(requests)), key=lambda i: requests[i].finish_step):
        for logical, page in enumerate(requests[i].page_ids):
            owners[page].append((i, logical))
    return owners


def draw_pages(res):
    """Per request, contiguous reservation vs whole pages vs used; then the pool, each physical
    page coloured by the request(s) that held it, with its logical page number."""
    reqs, num_pool, cols = res.requests, res.paged.num_pool_pages, 8
    rows = math.ceil(num_pool / cols)
    fig, (top, grid) = figures.figure(0.55 * len(reqs) + 0.6 * rows + 2.4, 2, 1,
                                      height_ratios=[0.55 * len(reqs) + 0.6, 0.6 * rows + 0.4])
    figures.slot_bars(top, [(q.name, q.num_tokens, [("contiguous", res.settings.max_len_slots),
                                                    ("paged", q.allocated_slots)]) for q in reqs])
    top.set_title(f"Per request: {res.contiguous.utilization_pct}% of contiguous slots used, "
                  f"{res.paged.utilization_pct}% of paged")
    for page, held in enumerate(pool_owners(reqs, num_pool)):
        x, y = page % cols, page // cols
        if not held:
            grid.add_patch(figures.rect(x, y, 1, "white"))
        for k, (i, logical) in enumerate(held):   # a page held twice: split, first on the left
            w = 1 / len(held)
            grid.add_patch(figures.rect(x + k * w, y, w, figures.color(i)))
            grid.text(x + (k + 0.5) * w, y + 0.5, f"R{i + 1}\np{logical}", ha="center",
                      va="center", fontsize=8 if len(held) == 1 else 7)
        grid.text(x + 0.04, y + 0.06, str(page), fontsize=7, va="top", color="#333333")
    grid.set_xlim(0, cols)
    grid.set_ylim(rows, 0)
    grid.axis("off")
    grid.set_title(f"The pool: {num_pool} physical pages (corner: page id). A cell: request Rn's "
                   f"logical page pN;\na split cell was freed by its first request and handed "
                   f"out again")
    grid.legend(handles=[figures.patch(figures.color(i), f"R{i + 1} {q.name}")
                         for i, q in enumerate(reqs)], loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return figures.finish(fig, "Task 4: pages handed out as tokens arrive, anywhere in the pool",
                          res)
