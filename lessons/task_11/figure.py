"""Task 11's figure (task_11_chunked_prefill.py draws it after saving): mini_engine without
chunking (top) and at the smallest budget (bottom). Left, per engine step, the tokens it computed,
stacked as decode (one a decoding request) and prefill, the budget drawn as a line; right, when
each chat's tokens came, where a long prefill shows as a gap in every row. Each legend sits in a
band left free above the data, so it covers no line; one colour, one meaning. A pure function of
the saved record (lessons/task_11/record.py's ChunkedPrefill), read by attribute."""
from __future__ import annotations

from common import figures

DECODE, PREFILL, BUDGET = figures.color(4), figures.color(0), figures.color(5)
FIRST_TOKEN, ARRIVAL = figures.color(2), "#333333"


def step_bars(ax, run, is_legend: bool) -> None:
    """One bar per step: decode tokens at the bottom, prefill tokens on top; the budget; the
    biggest step's tokens written over it."""
    t = run.timeline
    x = range(1, len(t.decode_tokens) + 1)
    ax.bar(x, t.decode_tokens, 1.0, color=DECODE, label="decode (1 per request)")
    ax.bar(x, t.prefill_tokens, 1.0, bottom=t.decode_tokens, color=PREFILL,
           label="prefill (prompt tokens)")
    ax.axhline(run.budget_tokens, color=BUDGET, linestyle="--", linewidth=1.2,
               label="the step's budget")
    ax.annotate(f"budget {run.budget_tokens:,}", (1, run.budget_tokens),
                xycoords=("axes fraction", "data"), xytext=(-2, 2), textcoords="offset points",
                ha="right", va="bottom", fontsize=8, color=BUDGET)
    ax.set_xlabel("engine step")
    ax.set_ylabel("tokens computed")
    ax.set_xlim(0.5, len(t.decode_tokens) + 0.5)
    top = max(run.budget_tokens, run.max_step_tokens)
    ax.set_ylim(0, top * (1.4 if is_legend else 1.12))    # the legend's band above the budget
    biggest = max(range(len(t.decode_tokens)), key=lambda i: t.decode_tokens[i] +
                  t.prefill_tokens[i])
    ax.annotate(f"{run.max_step_tokens:,} tokens in step {biggest + 1}", (biggest + 1,
                run.max_step_tokens), xytext=(6, 2), textcoords="offset points", fontsize=8)
    ax.set_title(f"{run.label}: {run.num_steps} steps")
    if is_legend:
        ax.legend(loc="upper center", ncol=3, fontsize=8)


def token_times(ax, run, is_legend: bool) -> None:
    """A row per chat, a tick per token at the time it was made; the long documents' arrival
    and first tokens as vertical lines."""
    t = run.timeline
    for i, times in enumerate(t.chat_token_times_s):
        ax.plot(times, [i] * len(times), "|", color=DECODE, markersize=9)
    ax.axvline(t.long_arrival_s, color=ARRIVAL, linestyle="--", linewidth=1,
               label="long documents arrive")
    for j, first in enumerate(t.long_first_token_s):
        ax.axvline(first, color=FIRST_TOKEN, linewidth=1.5,
                   label="their first tokens" if j == 0 else None)
    ax.set_yticks(range(len(t.chat_token_times_s)),
                  [f"chat {i + 1}" for i in range(len(t.chat_token_times_s))])
    ax.set_ylim(len(t.chat_token_times_s) - 0.5, -1.5)    # a free band at the top: the legend
    ax.set_xlabel("time since the first step (s)")
    ax.set_title(f"longest stall {1000 * run.latency.max_itl_s:,.0f} ms, TTFT "
                 f"{run.latency.mean_long_ttft_s:.2f} s")
    if is_legend:
        ax.legend(loc="upper center", ncol=2, fontsize=8, frameon=True, framealpha=0.9,
                  edgecolor="none")     # a line crossing the band passes behind it


def draw_chunking(res):
    """None when the record holds no chunked run."""
    if len(res.mini_engine) < 2:
        return None
    runs = [res.mini_engine[0], res.smallest]
    fig, axes = figures.figure(7.5, 2, 2, width_ratios=[1.25, 1])
    for i, (row, run) in enumerate(zip(axes, runs)):
        step_bars(row[0], run, i == 0)
        token_times(row[1], run, i == 0)
    axes[1][1].sharex(axes[0][1])
    return figures.finish(fig, "Task 11: the long prompts' prefill in one step, or in chunks of "
                               "the step's budget", res)
