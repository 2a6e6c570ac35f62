"""The lab's pictures, drawn from the saved results (results/<script>.json) into PNGs beside them.

Every figure is a pure function of the saved results: `draw(res)` takes {result name: its saved
dict} and returns a matplotlib Figure (or None when the results hold nothing to draw). What a
figure plots is worked out by small functions of their own (timeline_grid, pool_owners,
roofline_curve, ...), which tests/test_figures.py checks on workloads worked out by hand: the
matrix, never the pixels.

Which figures a result has is part of its step's entry in common/steps.py (the one list of the
lab's steps): `figures=(("", draw), ("phases", draw_phases))` gives results/<name>.png and
results/<name>_phases.png. A script's `figures.saved(path)` draws the figures of the result it
just saved and prints `Figure: results/<name>.png` (through common.report);
common/html_report.py puts them on the report page. Adding a figure for a new task is one function here plus its step's entry.

Style: matplotlib's Agg backend (no display needed), the Okabe-Ito palette (told apart with
every common colour-vision deficiency; Okabe & Ito, "Color Universal Design", 2008), 10 inches
wide at 120 dpi, so the text stays legible where the page shows the figure 1,000 px wide.
Every figure has a title, axes with units, and a caption line: model, dtype, machine, date.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from common import settings

# Okabe-Ito, black left out (it is the text colour): orange, sky blue, bluish green, yellow,
# blue, vermillion, reddish purple; then grey for an eighth.
PALETTE = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
           "#999999"]
WIDTH_IN = 10.0
DPI = 120


def _plt():
    """pyplot on the Agg backend (no display), imported on first use: a script that draws no
    figure does not pay for matplotlib's import."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 11, "axes.titlesize": 12, "figure.titlesize": 14,
                         "axes.spines.top": False, "axes.spines.right": False,
                         "legend.fontsize": 10, "legend.frameon": False})
    return plt


def _figure(height_in: float, *grid, **kwargs):
    """A figure 10 inches wide, constrained layout (nothing cut off at the edges)."""
    plt = _plt()
    return plt.subplots(*grid, figsize=(WIDTH_IN, height_in), dpi=DPI, layout="constrained",
                        **kwargs)


# --- the caption: model, dtype, machine, date ---------------------------------------------------
def machine_of(result: dict) -> str:
    """'CPU model, N cores' of the machine that measured this result: results.save records it
    (measured_on); verify_environment's own `machine` has it too. Older results lack it."""
    for where in (result.get("measured_on"), result.get("machine")):
        if isinstance(where, dict) and where.get("cpu"):
            return f"{where['cpu']}, {where.get('cores', '?')} cores"
    return "machine not recorded"


def caption(result: dict) -> str:
    """One line under every figure: what ran, where, when."""
    model = str(result.get("model") or "model not recorded").rstrip("/").rsplit("/", 1)[-1]
    dtype = result.get("dtype") or "dtype not recorded"
    when = str(result.get("measured_at", "date not recorded"))[:16].replace("T", " ")
    return f"{model}, {dtype}  |  {machine_of(result)}  |  {when}"


def _finish(fig, title: str, result: dict):
    fig.suptitle(title, fontweight="bold")
    fig.supxlabel(caption(result), fontsize=9, color="#444444")
    return fig


def _color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


# --- tasks 3 and 4: slots reserved and used, the page pool ---------------------------------------
def reservations(res: dict):
    """Task 3: per request, the slots contiguous allocation reserved against those it used."""
    r = res["task_3_kv_cache_problem"]
    fig, ax = _figure(0.55 * len(r["requests"]) + 1.8)
    _slot_bars(ax, [(q["name"], q["used"], [("contiguous", q["allocated"])])
                    for q in r["requests"]])
    ax.set_title(f"{r['utilization_pct']}% of the {r['total_allocated']:,} reserved slots "
                 f"hold a token")
    return _finish(fig, "Task 3: contiguous allocation reserves the worst case", r)


def _slot_bars(ax, rows: list[tuple[str, int, list[tuple[str, int]]]]) -> None:
    """Horizontal bars per request: each reservation (light, hatched), the slots used on top."""
    names = [f"{i}. {name}" for i, (name, _, _) in enumerate(rows, start=1)]
    num_kinds = len(rows[0][2])
    height = 0.8 / num_kinds
    for k in range(num_kinds):
        label = rows[0][2][k][0]
        y = [i + (k - (num_kinds - 1) / 2) * height for i in range(len(rows))]
        reserved = [kinds[k][1] for _, _, kinds in rows]
        used = [u for _, u, _ in rows]
        ax.barh(y, reserved, height * 0.9, color="white", edgecolor=_color(k + 4),
                hatch="//", label=f"reserved, {label}")
        ax.barh(y, used, height * 0.9, color=_color(2), label="slots used" if k == 0 else None)
        for yy, total, u in zip(y, reserved, used):
            ax.text(total, yy, f" {u}/{total} ({100 * (total - u) / total:.1f}% wasted)",
                    va="center", fontsize=9)
    ax.set_yticks(range(len(rows)), names)
    ax.invert_yaxis()
    ax.set_xlabel("KV-cache token slots")
    ax.set_xlim(0, max(t for _, _, kinds in rows for _, t in kinds) * 1.42)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))


def pool_owners(requests: list[dict], num_pool_pages: int) -> list[list[tuple[int, int]]]:
    """For each physical page of the pool: (request index, logical page) of every request that
    held it, first holder first. A page is held by one request at a time and handed out again
    only after its holder finished, so the holders of one page run in order of finishing."""
    owners: list[list[tuple[int, int]]] = [[] for _ in range(num_pool_pages)]
    order = sorted(range(len(requests)), key=lambda i: requests[i]["finish_step"])
    for i in order:
        for logical, page in enumerate(requests[i]["page_ids"]):
            owners[page].append((i, logical))
    return owners


def pages(res: dict):
    """Task 4: per request, contiguous reservation vs whole pages vs used; then the pool, each
    physical page coloured by the request(s) that held it, with its logical page number."""
    r = res["task_4_paged_attention"]
    reqs, max_len = r["requests"], r["settings"]["max_len"]
    num_pool = r["paged"]["pool_pages"]
    cols = 8
    rows = math.ceil(num_pool / cols)
    fig, (top, grid) = _figure(0.55 * len(reqs) + 0.6 * rows + 2.4, 2, 1,
                               height_ratios=[0.55 * len(reqs) + 0.6, 0.6 * rows + 0.4])
    _slot_bars(top, [(q["name"], q["tokens"], [("contiguous", max_len),
                                               ("paged", q["allocated"])]) for q in reqs])
    top.set_title(f"Per request: {r['contiguous']['utilization_pct']}% of contiguous slots used, "
                  f"{r['paged']['utilization_pct']}% of paged")
    for page, held in enumerate(pool_owners(reqs, num_pool)):
        x, y = page % cols, page // cols
        if not held:
            grid.add_patch(_rect(x, y, 1, "white"))
        for k, (i, logical) in enumerate(held):   # a page held twice: split, first on the left
            w = 1 / len(held)
            grid.add_patch(_rect(x + k * w, y, w, _color(i)))
            grid.text(x + (k + 0.5) * w, y + 0.5, f"R{i + 1}\np{logical}", ha="center",
                      va="center", fontsize=8 if len(held) == 1 else 7)
        grid.text(x + 0.04, y + 0.06, str(page), fontsize=7, va="top", color="#333333")
    grid.set_xlim(0, cols)
    grid.set_ylim(rows, 0)
    grid.axis("off")
    grid.set_title(f"The pool: {num_pool} physical pages (corner: page id). A cell: request Rn's "
                   f"logical page pN;\na split cell was freed by its first request and handed "
                   f"out again")
    grid.legend(handles=[_patch(_color(i), f"R{i + 1} {q['name']}") for i, q in enumerate(reqs)],
                loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _finish(fig, "Task 4: pages handed out as tokens arrive, anywhere in the pool", r)


def _rect(x: float, y: float, w: float, color: str, hatch: str | None = None):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, 1, facecolor=color, edgecolor="#333333", linewidth=0.6,
                     hatch=hatch)


def _patch(color: str, label: str, hatch: str | None = None, edge: str = "#333333"):
    from matplotlib.patches import Patch

    return Patch(facecolor=color, edgecolor=edge, hatch=hatch, label=label)


# --- task 10: shared pages -----------------------------------------------------------------------
def shared_pages(res: dict):
    """Task 10: the first requests' page tables at the step that held the most pages (cache on):
    a row per request, a cell per logical page with its physical page id; the pages several
    requests point at in one colour, each request's own pages in another. Beside it, the pages
    held then against the pages the same tables would hold unshared, and mini_engine's peak
    pages with the cache off and on."""
    r = res["task_10_prefix_caching"]
    off, on = r["mini_engine"]
    peak = on["peak"]
    tables = peak["tables"]
    refs = {int(p): n for p, n in peak["ref_counts"].items()}
    cols = max(map(len, tables.values()))
    fig, (grid, bars) = _figure(0.6 * len(tables) + 2.8, 1, 2, width_ratios=[3, 1.3])
    for y, (seq_id, table) in enumerate(tables.items()):
        for x, page in enumerate(table):
            shared = refs.get(page, 1) > 1
            grid.add_patch(_rect(x, y, 1, PALETTE[4] if shared else PALETTE[0]))
            grid.text(x + 0.5, y + 0.5, f"{page}" + (f"\nx{refs[page]}" if shared else ""),
                      ha="center", va="center", fontsize=8,
                      color="white" if shared else "black")
        grid.text(-0.15, y + 0.5, f"request {int(seq_id) + 1}", ha="right", va="center")
    grid.set_xlim(-1.6, cols)
    grid.set_ylim(len(tables), 0)
    grid.set_xticks([i + 0.5 for i in range(cols)], [str(i) for i in range(cols)])
    grid.set_xlabel("logical page (tokens 16i to 16i+15)")
    grid.tick_params(left=False, labelleft=False)
    for side in ("left", "right", "top"):
        grid.spines[side].set_visible(False)
    grid.set_title(f"Page tables at step {peak['step']} (cell: physical page id; xN: its ref "
                   f"count)")
    grid.legend(handles=[_patch(PALETTE[4], "shared prefix page (one copy in the pool)"),
                         _patch(PALETTE[0], "the request's own page")],
                loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    labels = ["held, shared", "if unshared", "peak, cache on", "peak, cache off"]
    values = [peak["pages_held"], peak["pages_unshared"], on["peak_pages"], off["peak_pages"]]
    bars.barh(labels, values, color=[PALETTE[4], PALETTE[0], PALETTE[4], PALETTE[0]],
              edgecolor="#333333")
    for y, v in enumerate(values):
        bars.text(v, y, f" {v}", va="center")
    bars.invert_yaxis()
    bars.set_xlabel("KV pages of 16 tokens")
    bars.set_xlim(0, max(values) * 1.25)
    bars.set_title(f"{peak['running']} requests running")
    return _finish(fig, "Task 10: requests with the same system prompt point at the same pages", r)


# --- task 6: concurrent users -------------------------------------------------------------------
def load_levels(res: dict):
    """Task 6: tokens/s and latency (p50, p95, TTFT) against concurrent users; the largest
    group one after another against all together."""
    r = res["task_6_multi_user_load"]
    levels = [lv for lv in r["levels"] if lv.get("succeeded")]
    users = [lv["users"] for lv in levels]
    fig, (tps, lat, seq) = _figure(4.2, 1, 3, width_ratios=[1.2, 1.2, 1])
    tps.plot(users, [lv["throughput_tok_s"] for lv in levels], "o-", color=_color(4))
    for u, lv in zip(users, levels):
        tps.annotate(f"{lv['throughput_tok_s']:.1f}", (u, lv["throughput_tok_s"]),
                     textcoords="offset points", xytext=(0, 7), ha="center", fontsize=9)
    tps.set(title="Throughput", xlabel="concurrent users", ylabel="tokens/s (all users)")
    for key, label, color, marker in (("p50_latency_s", "p50 latency", 4, "o"),
                                      ("p95_latency_s", "p95 latency", 5, "s"),
                                      ("mean_ttft_s", "mean time to first token", 2, "^")):
        lat.plot(users, [lv[key] for lv in levels], marker=marker, color=_color(color),
                 label=label)
    lat.set(title="Latency per request", xlabel="concurrent users", ylabel="seconds")
    lat.legend(fontsize=9)
    for ax in (tps, lat):
        ax.set_xticks(users)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    together = max(levels, key=lambda lv: lv["users"]) if levels else None
    if r.get("sequential") and together:
        both = [("one after\nanother", r["sequential"]["duration_s"], _color(5)),
                ("all\ntogether", together["duration_s"], _color(2))]
        bars = seq.bar([b[0] for b in both], [b[1] for b in both], color=[b[2] for b in both])
        seq.bar_label(bars, fmt="%.1f s")
        seq.set(title=f"{together['users']} users' requests", ylabel="seconds until the last "
                                                                     "finished")
    else:
        seq.text(0.5, 0.5, "not measured\n(--no-sequential)", ha="center", va="center",
                 transform=seq.transAxes)
        seq.set(title="One after another", xticks=[], yticks=[])
    return _finish(fig, "Task 6: more users, more tokens/s (one streamed request each)", r)


# --- task 7: three server configs -----------------------------------------------------------------
def tuning(res: dict):
    """Task 7: configs A, B, C side by side: tokens/s, latency, peak running and waiting."""
    r = res["task_7_tuning"]
    configs = r["configs"]
    names = [f"{c['label'].split(':')[0]}\nlen {c['max_model_len']}\nseqs {c['max_num_seqs']}"
             for c in configs]
    x = list(range(len(configs)))
    fig, (tps, lat, peak) = _figure(4.4, 1, 3)
    bars = tps.bar(x, [c["throughput_tok_s"] for c in configs],
                   color=[_color(i + 4) for i in x])
    tps.bar_label(bars, fmt="%.1f")
    tps.set(title="Throughput", ylabel="tokens/s")
    _grouped(lat, x, [("mean", [c.get("mean_latency_s") or 0 for c in configs], 4),
                      ("p50", [c.get("p50_latency_s") or 0 for c in configs], 1),
                      ("p95", [c.get("p95_latency_s") or 0 for c in configs], 5)])
    lat.set(title="Latency per request", ylabel="seconds")
    _grouped(peak, x, [("running", [c["peak_running"] for c in configs], 2),
                       ("waiting", [c["peak_waiting"] for c in configs], 0)], labels=True)
    peak.set(title="Requests at once (peak, /metrics)", ylabel="requests")
    for ax in (tps, lat, peak):
        ax.set_xticks(x, names, fontsize=9)
    return _finish(fig, f"Task 7: three server configs, {r['settings']['requests']} concurrent "
                        f"requests each", r)


def _grouped(ax, x: list[int], groups: list[tuple[str, list[float], int]],
             labels: bool = False) -> None:
    width = 0.8 / len(groups)
    for k, (label, values, color) in enumerate(groups):
        bars = ax.bar([i + (k - (len(groups) - 1) / 2) * width for i in x], values, width,
                      color=_color(color), label=label)
        if labels:
            ax.bar_label(bars, fontsize=9)
    ax.legend(fontsize=9)


# --- task 9: the batching timeline ----------------------------------------------------------------
def timeline_record(steps) -> dict:
    """An engine's step records (StepStats) in a compact form for its saved result: per step,
    the request ids of its rows in batch order, space-separated, and those that were padding.
    (A list per step would take a line per number in the indented JSON.)"""
    return {"seq_ids": [" ".join(map(str, s.seq_ids)) for s in steps],
            "padding_ids": [" ".join(map(str, s.padding_ids)) for s in steps]}


def _ids(rows: list[str]) -> list[list[int]]:
    return [[int(i) for i in row.split()] for row in rows]


@dataclass(frozen=True)
class Timeline:
    """Batch slots over steps: ids[slot][step] is the request computed in that slot at that
    step (None: the slot was idle); is_padding[slot][step] says its row was padding (a finished
    request, computed and its token thrown away)."""
    ids: list[list[int | None]]
    is_padding: list[list[bool]]

    @property
    def num_steps(self) -> int:
        return len(self.ids[0]) if self.ids else 0


def timeline_grid(steps_seq_ids: list[list[int]], steps_padding_ids: list[list[int]],
                  max_batch: int) -> Timeline:
    """Which batch slot each computed row sat in. A request keeps its slot from admission until
    it leaves the batch (it is not computed at a step); a newcomer takes the lowest free slot.
    The engine itself has no slots, only a list of rows: this is the picture a learner draws."""
    num_steps = len(steps_seq_ids)
    ids: list[list[int | None]] = [[None] * num_steps for _ in range(max_batch)]
    is_padding = [[False] * num_steps for _ in range(max_batch)]
    slot_of: dict[int, int] = {}
    for step, (row_ids, padding_ids) in enumerate(zip(steps_seq_ids, steps_padding_ids)):
        for seq_id in [s for s in slot_of if s not in row_ids]:   # left: its slot is free
            del slot_of[seq_id]
        for seq_id in row_ids:
            if seq_id not in slot_of:
                free = sorted(set(range(max_batch)) - set(slot_of.values()))
                if not free:
                    raise ValueError(f"step {step} computed {len(row_ids)} rows, more than "
                                     f"the {max_batch} slots")
                slot_of[seq_id] = free[0]
            ids[slot_of[seq_id]][step] = seq_id
            is_padding[slot_of[seq_id]][step] = seq_id in padding_ids
    return Timeline(ids, is_padding)


def runs_of(row: list, flags: list[bool]) -> list[tuple[int, int, object, bool]]:
    """(start, length, value, flag) of each stretch of equal cells in one slot's row."""
    out: list[tuple[int, int, object, bool]] = []
    for step, (value, flag) in enumerate(zip(row, flags)):
        if out and out[-1][2] == value and out[-1][3] == flag and out[-1][0] + out[-1][1] == step:
            start, length, _, _ = out[-1]
            out[-1] = (start, length + 1, value, flag)
        else:
            out.append((step, 1, value, flag))
    return out


POLICY_ORDER = ("static", "static no-pad", "continuous")


def batching_timeline(res: dict):
    """Task 9: x the engine step, y the batch slot, a colour per request; padding hatched, idle
    slots empty; one panel per policy on the same x scale, so the lengths compare at a glance."""
    r = res["task_9_build_your_own_engine"]
    timelines = r.get("timelines")
    if not timelines:
        return None   # saved by a task 9 older than the figures
    max_batch = r["settings"]["max_batch"]
    labels = sorted(timelines, key=lambda k: POLICY_ORDER.index(k) if k in POLICY_ORDER else 9)
    grids = {k: timeline_grid(_ids(timelines[k]["seq_ids"]), _ids(timelines[k]["padding_ids"]),
                              max_batch) for k in labels}
    num_steps = max(g.num_steps for g in grids.values())
    panel_in = 0.16 * max_batch + 0.9
    fig, axes = _figure(panel_in * len(labels) + 1.6, len(labels), 1, sharex=True, squeeze=False)
    cell_px = 0.8 * WIDTH_IN * DPI / max(num_steps, 1)   # a step's width on the page, roughly
    for ax, label in zip(axes[:, 0], labels):
        grid = grids[label]
        for slot, (row, flags) in enumerate(zip(grid.ids, grid.is_padding)):
            for start, length, seq_id, padded in runs_of(row, flags):
                if seq_id is None:
                    continue
                ax.barh(slot, length, 1, left=start, color=_color(seq_id),
                        alpha=0.35 if padded else 1, hatch="////" if padded else None,
                        edgecolor="#333333", linewidth=0.4)
                if not padded and length * cell_px >= 18 and max_batch <= 32:
                    ax.text(start + length / 2, slot, str(seq_id), ha="center", va="center",
                            fontsize=7)
        policy = r.get("policies", {}).get(label, {})
        made = (f"; {100 * policy['slot_utilization']:.0f}% of slot-steps made a token"
                if "slot_utilization" in policy else "")
        ax.set_title(f"{label}: {grid.num_steps} steps{made}", loc="left")
        ax.set_ylim(max_batch - 0.5, -0.5)
        ax.set_ylabel("batch slot")
        ax.set_yticks(range(0, max_batch, max(1, max_batch // 8)))
        ax.set_xlim(0, num_steps)
    axes[-1, 0].set_xlabel("engine step (one forward over the batch)")
    # under the last panel's axis label (a figure legend would sit on the title or caption)
    axes[-1, 0].legend(handles=[_patch(_color(0), "a request's token (colour: request, "
                                                  "number: its id)"),
                                _patch(_color(0) + "59", "padding: finished, computed, "
                                                         "thrown away", hatch="////"),
                                _patch("white", "idle slot")],
                       loc="upper center", bbox_to_anchor=(0.5, -0.65 / panel_in), ncols=3,
                       fontsize=9)
    n = len(r.get("workload_output_lengths", []))
    return _finish(fig, f"Task 9: the batching timeline, {n} requests, batch cap {max_batch}", r)


PHASE_NAMES = {"matmul": "matmuls", "attention": "attention", "forward_other": "rest of forward",
               "sampling": "sampling", "scheduling": "scheduling"}


def step_phases(res: dict):
    """Task 9: the engine's decode step split into its phases at batch 1 and at the cap, beside
    the kernel floor (its matmuls timed alone) and one read of the weights at the bandwidth."""
    r = res["task_9_build_your_own_engine"]
    phases, machine = r.get("phases"), r.get("machine")
    if not phases or not machine:
        return None
    batches = sorted(phases, key=int)
    fig, ax = _figure(4.6)
    width, ticks, names = 0.8, [], []
    for g, b in enumerate(batches):
        x0 = g * 4
        bottom = 0.0
        for k, (phase, name) in enumerate(PHASE_NAMES.items()):
            ms = 1000 * phases[b].get(phase, 0)
            ax.bar(x0, ms, width, bottom=bottom, color=_color(k),
                   label=name if g == 0 else None)
            bottom += ms
        ax.text(x0, bottom, f"{bottom:.1f}", ha="center", va="bottom", fontsize=9)
        floor = 1000 * machine["kernel_floor_s"][b]
        read = 1000 * machine["weight_read_s"]
        ax.bar(x0 + 1, floor, width, color="white", edgecolor=_color(4), hatch="xx",
               label="kernel floor (the model's matmuls alone)" if g == 0 else None)
        ax.bar(x0 + 2, read, width, color="white", edgecolor=_color(5), hatch="..",
               label="one read of the weights (bandwidth)" if g == 0 else None)
        for x, v in ((x0 + 1, floor), (x0 + 2, read)):
            ax.text(x, v, f"{v:.1f}", ha="center", va="bottom", fontsize=9)
        ticks += [x0, x0 + 1, x0 + 2]
        names += [f"engine step\nbatch {b}", "kernel\nfloor", "weights\nread"]
    ax.set_xticks(ticks, names, fontsize=9)
    ax.set_ylabel("ms per decode step")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(f"Weights {machine['weight_bytes'] / 1e6:,.0f} MB at "
                 f"{machine['bandwidth_bytes_s'] / 1e9:.1f} GB/s")
    return _finish(fig, "Task 9: where a decode step's time goes", r)


# --- the summary: the roofline ---------------------------------------------------------------------
def roofline_curve(r: dict, batches: list[float]) -> tuple[list[float], list[float], float]:
    """From the summary's saved roofline r: per batch B, the bandwidth bound (tokens/s if a step
    took only its bytes: the weights once + B requests' KV, at the measured bandwidth) and the
    compute roof (tokens/s at the peak matmul rate). The roofline is the lower of the two."""
    bandwidth = r["bandwidth_gb_s"] * 1e9
    kv_bytes = r["bytes_per_token"] - r["weight_bytes"]   # one request's KV at the mean context
    flops = r["matmul_gflop_s"][r["dtype"]] * 1e9
    read = [b * bandwidth / (r["weight_bytes"] + b * kv_bytes) for b in batches]
    return read, [flops / r["flops_per_token"]] * len(batches), flops / r["flops_per_token"]


def roofline_points(res: dict) -> list[tuple[str, float, float, str]]:
    """(label, batch, tokens/s, kind) of every point on the roofline: kind 'floor' for the
    kernel floor (the model's matmuls alone, batch b in its step: b tokens per step), 'measured'
    for the steps the lab measured, 'engine' for the lab's own engine (task 9, continuous; its
    batch is the mean tokens per step)."""
    r = res["summary"]["roofline"]
    points = [(f"kernel floor, batch {b}", int(b), int(b) / s, "floor")
              for b, s in sorted((r.get("kernel_floor") or {}).get("step_s", {}).items(),
                                 key=lambda kv: int(kv[0]))]
    for p in r["placed"].values():
        if "one_user" in p:
            points.append(("server, 1 user", 1, p["one_user"]["tokens_per_s"], "measured"))
        points.append((p["label"], p["users"], p["tokens_per_s"], "measured"))
    t9 = res.get("task_9_build_your_own_engine") or {}
    cont = (t9.get("policies") or {}).get("continuous")
    if cont and cont.get("num_steps") and t9.get("dtype") == r["dtype"]:
        points.append(("own engine (task 9), continuous", cont["num_tokens"] / cont["num_steps"],
                       cont["tokens_per_s"], "engine"))
    return points


def _plain_numbers():
    """Log-axis tick labels as 1, 10, 100 (not 10^0, 10^1, 10^2)."""
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda value, _: f"{value:g}")


def roofline(res: dict):
    """The summary: tokens/s against requests per step, log-log. One step reads the weights
    once for the whole batch, so the bandwidth bound climbs with the batch (slope 1) until the
    compute roof; the kernel floor and the measured steps sit below."""
    s = res.get("summary") or {}
    r = s.get("roofline")
    if not r:
        return None
    points = roofline_points(res)
    top_batch = max([b for _, b, _, _ in points] + [1])
    ridge = r.get("ridge_batch") or top_batch
    x_max = min(1e4, max(4 * top_batch, 2 * ridge if math.isfinite(ridge) else 0, 64))
    batches = [10 ** (i / 50) for i in range(int(50 * math.log10(x_max)) + 1)]
    read, compute, roof = roofline_curve(r, batches)
    fig, ax = _figure(5.6)
    ax.plot(batches, read, "--", color=_color(1), label="bandwidth bound: the weights read\n"
                                                        "once per step, for the whole batch")
    ax.plot(batches, compute, "--", color=_color(5), label=f"compute roof: peak {r['dtype']} "
                                                           f"matmul")
    ax.plot(batches, [min(a, b) for a, b in zip(read, compute)], color="#333333", linewidth=3,
            alpha=0.3, label="the roofline (the lower of the two)")
    # every point its own colour and a legend line with its value; points at the same batch
    # are drawn side by side (dodged a few % in x) so none hides another
    markers = {"floor": "X", "measured": "o", "engine": "*"}
    same_batch = {b: [p for p in points if p[1] == b] for _, b, _, _ in points}
    for k, point in enumerate(points):
        label, batch, tps, kind = point
        group = same_batch[batch]
        dodge = 1.07 ** (group.index(point) - (len(group) - 1) / 2)
        ax.plot(batch * dodge, tps, markers[kind], color=_color(k + 4 if k < 4 else k - 4),
                markersize=14 if kind == "engine" else 10, markeredgecolor="#333333",
                label=f"{label}: {tps:,.1f} tok/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = _plain_numbers()
    ax.xaxis.set_major_formatter(plain)
    ax.yaxis.set_major_formatter(plain)
    ax.set_xlim(0.8, x_max)
    low = min([tps for _, _, tps, _ in points] + [read[0]])
    ax.set_ylim(low / 2, roof * 2)
    ax.set_xlabel("requests decoded in one step (batch), log scale")
    ax.set_ylabel("tokens/s, log scale")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=9)
    ax.set_title(f"{r['bandwidth_gb_s']:.1f} GB/s read, {r['matmul_gflop_s'][r['dtype']]:,.0f} "
                 f"GFLOP/s {r['dtype']} matmul; {r['num_params'] / 1e6:.0f}M parameters, "
                 f"context {r['context']}", fontsize=10)
    return _finish(fig, "Summary: the roofline of decoding on this machine", s)


# --- which figures a result has: common/steps.py (each step's `figures`) ------------------------


def png_path(name: str, suffix: str = "") -> Path:
    return settings.results_dir() / (f"{name}_{suffix}.png" if suffix else f"{name}.png")


def load_results() -> dict[str, dict]:
    """Every saved result, by name, as saved (results.load_raw: the figures read the JSON the
    grader sees; a figure may read another step's, as the roofline does). A broken file is left
    out: its step's figure then says why it is not drawn."""
    from common import results

    res = {}
    for path in sorted(settings.results_dir().glob("*.json")):
        try:
            data = results.load_raw(path.stem)
        except results.StaleResult:
            continue
        if data is not None:
            res[path.stem] = data
    return res


def save_figures(name: str, res: dict | None = None) -> list[tuple[Path, str | None]]:
    """Draw the figures of one result into PNGs beside it: [(path, None if drawn, else why
    not)]. A figure that cannot be drawn (a result from an older lab, a bug) is reported, never
    raised: the measurement is saved already, the picture is extra."""
    from common import steps   # steps.py imports this module for its figures' functions

    entries = steps.figures_of(name)
    if not entries:
        return []
    res = load_results() if res is None else res
    out = []
    for suffix, draw in entries if name in res else []:
        path = png_path(name, suffix)
        try:
            fig = draw(res)
        except Exception as e:  # noqa: BLE001 - one line in the report, not a crash
            out.append((path, f"{type(e).__name__}: {e}"))
            continue
        if fig is None:
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path)
            out.append((path, None))
        except OSError as e:
            out.append((path, f"{type(e).__name__}: {e}"))
        finally:
            _plt().close(fig)
    return out


def saved(path) -> None:
    """After results.save: draw the figures of the result at path (its step's entry in
    common/steps.py) and print 'Saved: ...' and one 'Figure: ...' line each (common.report)."""
    from common import report

    report.saved(path, save_figures(Path(path).stem))
