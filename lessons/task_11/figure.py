"""Task 11's figure (task_11_chunked_prefill.py draws it after saving): mini_engine without
chunking (top) and at the smallest budget (bottom). Left, per engine step, the tokens it computed,
stacked as decode (one a decoding request) and prefill, the budget drawn as a line; right, when
each chat's tokens came, where a long prefill shows as a gap in every chat's row, and each long
document's wait from its arrival to its first token, in a row of its own (so no line lies over
a chat's tick). mini_engine alone: vLLM's runs are in the report. Each legend sits in a band
left free above the data, so it covers no line; one colour, one meaning. A pure function of
the saved record (lessons/task_11/record.py's ChunkedPrefill), read by attribute."""
from __future__ import annotations

from common import figures

DECODE, PREFILL, BUDGET = figures.color(4), figures.color(0), figures.color(5)
FIRST_TOKEN, WAIT = figures.color(2), "#E4E4E4"


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
    ax.set_title(f"mini_engine, {run.label}: {run.num_steps} steps")
    if is_legend:
        ax.legend(loc="upper center", ncol=3, fontsize=8)


def token_times(ax, run, is_legend: bool) -> None:
    """A row per chat, a tick per token at the time it was made, drawn over everything else;
    below them a row per long document, a bar from its arrival to its first token (its TTFT);
    the documents' wait shaded behind every row, so a stall shows as a gap in the chats' rows
    and no tick lies under a line."""
    t = run.timeline
    num_chats, num_docs = len(t.chat_token_times_s), len(t.long_first_token_s)
    ax.fill_betweenx([-0.5, num_chats + num_docs - 0.5], t.long_arrival_s,
                     max(t.long_first_token_s), color=WAIT, linewidth=0, zorder=0,
                     label="the documents' wait")
    for i, times in enumerate(t.chat_token_times_s):
        ax.plot(times, [i] * len(times), "|", color=DECODE, markersize=9, zorder=3,
                label="a chat's token" if i == 0 else None)
    for j, first in enumerate(t.long_first_token_s):
        ax.plot([t.long_arrival_s, first], [num_chats + j] * 2, color=FIRST_TOKEN, linewidth=3,
                marker="o", markevery=[1], solid_capstyle="butt", zorder=2,
                label="a document: arrival to first token" if j == 0 else None)
    rows = [f"chat {i + 1}" for i in range(num_chats)] + \
        [f"doc {j + 1}" for j in range(num_docs)]
    ax.set_yticks(range(len(rows)), rows)
    ax.set_ylim(len(rows) - 0.5, -1.9)    # a free band at the top: the legend
    ax.set_xlabel("time since the first step (s)")
    ax.set_title(f"longest stall {1000 * run.latency.max_itl_s:,.0f} ms, TTFT "
                 f"{run.latency.mean_long_ttft_s:.2f} s")
    if is_legend:
        ax.legend(loc="upper center", ncol=3, fontsize=7, frameon=True, framealpha=0.9,
                  edgecolor="none", handlelength=1.5, columnspacing=1.0)


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
    return figures.finish(fig, "Task 11: mini_engine alone, the long prompts' prefill in one "
                               "step or in chunks of the budget", res)
