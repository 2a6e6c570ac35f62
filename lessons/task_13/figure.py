"""Task 13's figure (task_13_compiled_step.py draws it after saving). Left, mini_engine: a decode
step's time at batch 1 and at the cap, in plain torch, with its C kernels (eager) and compiled,
each bar split into its measured parts
(the matmuls, attention, the rest of the forward, sampling and scheduling), with the two floors as
lines: one read of the weights at the measured bandwidth, and the model's matmuls timed alone.
Right, on an axis of its own, tokens/s (vLLM's phases are not timed from outside, and its
tokens/s include the prefill, so they are no decode step): task 9's workload, mini_engine and vLLM
run alike in turns, each mode; then vLLM alone at 1 request and at its batch. A bar of mini_engine
under the matmuls-alone line gets a note under its panel (floor_note): its own kernels beat
F.linear there, so the line is no floor for it. Last, part 4: a
decode step's attention against the context, both engines at 1 request and at the cap
(mini_engine's C and its torch way). A pure function of the saved record
(lessons/task_13/record.py), read by attribute."""
from __future__ import annotations

import textwrap

from common import figures

PARTS = (("matmul_s", "matmuls"), ("attention_s", "attention"),
         ("forward_other_s", "rest of the forward"), ("sampling_s", "sampling"),
         ("scheduling_s", "scheduling"))
WEIGHTS, KERNELS = "#333333", "#B22222"


def floors(ax, res, xs_by_batch: dict[int, list[float]]) -> None:
    """One read of the weights across the panel; the matmuls alone above each batch's bars."""
    ms = 1000 * res.machine.weight_read_s
    ax.axhline(ms, color=WEIGHTS, linestyle="--", linewidth=1,
               label=f"one read of the weights ({ms:.1f} ms)")
    for i, (batch, xs) in enumerate(xs_by_batch.items()):
        floor = res.machine.kernel_floor_s.get(batch)
        if floor is not None:
            ax.hlines(1000 * floor, min(xs) - 0.4, max(xs) + 0.4, color=KERNELS, linewidth=1.5,
                      label="the matmuls alone (F.linear)" if i == 0 else None)


def under_floor(bars: list[tuple[str, int, float]], floor_s: dict[int, float]) -> list[str]:
    """'compiled at 1 (17.9 < 18.0 ms)' for each bar (way, batch, ms) drawn under the line of
    the matmuls alone at its batch."""
    return [f"{way} at {batch} ({ms:.1f} < {1000 * floor_s[batch]:.1f} ms)"
            for way, batch, ms in bars if batch in floor_s and ms < 1000 * floor_s[batch]]


def floor_note(engine: str, beaten: list[str]) -> str | None:
    """The note under a panel whose bars fall under the matmuls alone; None where none does."""
    if not beaten:
        return None
    return textwrap.fill(f"Under the matmuls alone: {engine} {', '.join(beaten)}. Its own "
                         f"kernels beat F.linear's there, so that line is no floor for it.", 52)


def engine_panel(ax, res) -> None:
    modes = (([("torch", res.torch)] if res.torch else []) + [("eager", res.eager)]
             + ([("compiled", res.compiled)] if res.compiled else []))
    xs_by_batch, labels, x, bars = {}, [], 0, []
    for batch in sorted(res.eager.phases):
        for name, mode in modes:
            phases, bottom = mode.phases[batch], 0.0
            bars.append((name, batch, 1000 * phases.step_s))
            for j, (field, part) in enumerate(PARTS):
                ms = 1000 * getattr(phases, field)
                ax.bar(x, ms, 0.7, bottom=bottom, color=figures.color(j),
                       label=part if x == 0 else None, edgecolor="white", linewidth=0.5)
                bottom += ms
            ax.text(x, bottom, f"{1000 * phases.step_s:.1f}", ha="center", va="bottom",
                    fontsize=9)
            xs_by_batch.setdefault(batch, []).append(x)
            labels.append(f"{name}\nbatch {batch}")
            x += 1
        x += 0.5
    floors(ax, res, xs_by_batch)
    ax.set_xticks([x for xs in xs_by_batch.values() for x in xs], labels, fontsize=8)
    ax.set_xlabel(floor_note("mini_engine", under_floor(bars, res.machine.kernel_floor_s)) or "")
    ax.set_ylim(0, 1.6 * max(ms for _, _, ms in bars))      # room for the legend above the bars
    ax.set_ylabel("a decode step (ms)")
    ax.set_title("mini_engine: a step in its parts")
    ax.legend(loc="upper left", fontsize=8)


ENGINE_COLORS = {"mini_engine": 0, "vLLM": 6}


def vllm_panel(ax, res) -> None:
    """Tokens/s, on an axis of its own: vLLM's are measured from outside, prefill included, and
    are no decode step. Task 9's workload, each mode, mini_engine and vLLM run alike (in turns);
    then vLLM alone at 1 request and at its batch. Colour: the engine; hatched: compiled."""
    s, x, seen, ticks, labels = res.settings, 0, set(), [], []
    groups = [("task 9's workload, alike",
               [(who, mode, tok_s) for mode, v in res.vllm.items()
                for who, tok_s in (("mini_engine", v.mini_tokens_per_s),
                                   ("vLLM", v.workload_tokens_per_s))])]
    groups += [(f"vLLM, {batch} at once",
                [("vLLM", mode, v.one_tokens_per_s if batch == 1 else v.batch_tokens_per_s)
                 for mode, v in res.vllm.items()]) for batch in (1, s.vllm_requests)]
    for name, bars in groups:
        first = x
        for who, mode, tok_s in bars:
            ax.bar(x, tok_s, 0.7, color=figures.color(ENGINE_COLORS[who]), edgecolor="white",
                   hatch="//" if mode == "compiled" else None,
                   label=who if who not in seen else None)
            seen.add(who)
            ax.text(x, tok_s, f"{tok_s:.0f}", ha="center", va="bottom", fontsize=8)
            ticks.append(x)
            labels.append(mode)
            x += 1
        ax.text((first + x - 1) / 2, -0.13, name, transform=ax.get_xaxis_transform(),
                ha="center", va="top", fontsize=8)
        x += 0.6
    ax.set_xticks(ticks, labels, fontsize=7)
    ax.set_ylim(0, 1.3 * ax.get_ylim()[1])      # room for the legend above the bars
    ax.set_ylabel("tokens/s, prefill included")
    ax.set_title("Tokens/s, not a step (hatched: compiled)")
    ax.legend(loc="upper left", fontsize=8)


def attention_panel(ax, res) -> None:
    """Part 4: a decode step's attention (ms) against the context, one line a way and batch."""
    a = res.attention
    cap = a.cap
    # mini_engine's attention in the colour of its attention phase above, vLLM's in vLLM's
    lines = [("torch", 1, "mini_engine torch, 1 request, gathered", 1, ":"),
             ("mini", 1, "mini_engine C, 1 request", 1, "-"),
             ("vllm", 1, "vLLM, 1 request", 6, "-"),
             ("torch", cap, f"mini_engine torch, {cap}, gathered", 1, ":"),
             ("mini", cap, f"mini_engine C, {cap} requests", 1, "--"),
             ("vllm", cap, f"vLLM, {cap} requests", 6, "--")]
    for which, batch, label, color, style in lines:
        ms = [a.at(which, batch, L) for L in a.contexts]
        if None not in ms:
            ax.plot(a.contexts, ms, style, marker="o", color=figures.color(color), label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(a.contexts, [f"{L:,}" for L in a.contexts])
    ax.set_xlabel("context of each request (tokens)")
    ax.set_yscale("log")         # batch 1 and the cap, two orders of magnitude apart
    ax.set_ylabel("a decode step's attention (ms, log scale)")
    ax.set_title("Attention as the context grows")
    ax.legend(loc="upper left", fontsize=8)


def draw_step(res):
    """mini_engine's panel and vLLM's side by side; part 4's below them, as wide as both."""
    rows, cols = 1 + bool(res.attention), 1 + bool(res.vllm)
    fig = figures.plt().figure(figsize=(figures.WIDTH_IN, 5.0 * rows), dpi=figures.DPI,
                               layout="constrained")
    grid = fig.add_gridspec(rows, cols)
    top = [fig.add_subplot(grid[0, c]) for c in range(cols)]
    engine_panel(top[0], res)
    if res.vllm:             # tokens/s on an axis of its own: no decode step's ms
        vllm_panel(top[1], res)
    if res.attention:
        attention_panel(fig.add_subplot(grid[1, :]), res)
    return figures.finish(fig, "Task 13: a decode step: torch, its C, compiled; attention as the "
                          "context grows", res)
