"""Task 10's figure (task_10_prefix_caching.py draws it after saving): the first requests' block
tables at the step that held the most blocks, cache on, the blocks several requests point at in
one colour; beside them, the blocks held against what the same tables would hold unshared. A pure
function of the saved record (lessons/task_10/record.py's PrefixCaching), read by attribute."""
from __future__ import annotations

from common import figures

SHARED, OWN = figures.color(4), figures.color(0)   # blue: one copy in the pool; orange: its own


def draw_shared_pages(res):
    """A row per request, a cell per logical block with its physical block id (and ref count
    when shared); bars: blocks held then, shared and unshared, and mini_engine's peaks off and
    on. None when the record holds no block tables."""
    off, on = res.mini_engine
    peak = on.peak
    if peak is None or not peak.page_tables:
        return None
    page = res.settings.page_size_tokens
    tables, shared = peak.page_tables, peak.shared_pages
    cols = max(map(len, tables.values()))
    fig, (grid, bars) = figures.figure(0.6 * len(tables) + 2.8, 1, 2, width_ratios=[3, 1.3])
    for y, (seq_id, table) in enumerate(tables.items()):
        for x, page_id in enumerate(table):
            is_shared = page_id in shared
            grid.add_patch(figures.rect(x, y, 1, SHARED if is_shared else OWN))
            grid.text(x + 0.5, y + 0.5,
                      f"{page_id}" + (f"\nx{peak.ref_counts[page_id]}" if is_shared else ""),
                      ha="center", va="center", fontsize=8, color="white" if is_shared else "black")
        grid.text(-0.15, y + 0.5, f"request {seq_id + 1}", ha="right", va="center")
    grid.set_xlim(-1.6, cols)
    grid.set_ylim(len(tables), 0)
    grid.set_xticks([i + 0.5 for i in range(cols)], [str(i) for i in range(cols)])
    grid.set_xlabel(f"logical block (tokens {page}i to {page}i+{page - 1})")
    grid.tick_params(left=False, labelleft=False)
    for side in ("left", "right", "top"):
        grid.spines[side].set_visible(False)
    grid.set_title(f"Block tables at step {peak.step} (cell: physical block id; xN: its ref "
                   "count)")
    grid.legend(handles=[figures.patch(SHARED, "shared prefix block (one copy in the pool)"),
                         figures.patch(OWN, "the request's own block")],
                loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    labels = ["held, shared", "if unshared", "peak, cache on", "peak, cache off"]
    values = [peak.num_pages_held, peak.num_pages_unshared, on.num_pages_peak, off.num_pages_peak]
    bars.barh(labels, values, color=[SHARED, OWN, SHARED, OWN], edgecolor="#333333")
    for y, v in enumerate(values):
        bars.text(v, y, f" {v}", va="center")
    bars.invert_yaxis()
    bars.set_xlabel(f"KV blocks of {page} tokens")
    bars.set_xlim(0, max(values) * 1.25)
    bars.set_title(f"{peak.num_running} requests running")
    return figures.finish(fig, "Task 10: requests with the same system prompt point at the same "
                               "blocks", res)
