"""Task 14's figure (task_14_quantized_kv.py draws it after saving). Left, tasks 3-4's capacity
bars extended by the 8-bit cache: the tokens each format holds in the lab's 128 MiB, scales
counted. Middle, what each 8-bit format cost: the mean change of the passage's log-probabilities
(lower is closer to the model's dtype) with its margin, and the greedy answers kept, for each
engine and format. Right, what it bought: part 3's tokens/s, the model's dtype against 8 bits, in
each engine. A colour is a format on every panel; vLLM's bars are hatched. A pure function of
the saved record (lessons/task_14/record.py), read by attribute."""
from __future__ import annotations

from common import figures
from lessons.task_14.record import Shift

SHORT = {"mini_engine": "mini", "vLLM": "vLLM"}
# one colour a KV cache format on every panel (the model's dtype is bfloat16 or float32); the
# engine is told by the hatch (vLLM's bars hatched), never by a colour
FORMAT_COLORS = {"bfloat16": 4, "float32": 1, "fp8 layer": 0, "fp8 token": 2,
                 "fp8_e5m2 layer": 3, "fp8_e5m2 token": 6}
VLLM_HATCH = "//"


def format_color(name: str) -> str:
    return figures.color(FORMAT_COLORS.get(name, 7))


def tick(engine: str, name: str) -> str:
    """'mini\\nfp8\\ntoken': one word a line (fp8_e5m2 as e5m2), so six bars' labels stay apart."""
    return "\n".join([SHORT[engine], *name.replace("fp8_e5m2", "e5m2").split()])


def bars(ax, labels: list[str], values: list[float], names: list[str], texts: list[str],
         engines: list[str] | None = None, errors: list[float] | None = None,
         fontsize: float = 8) -> None:
    """A bar a row, coloured by its format, hatched where vLLM measured it; errors: a margin
    drawn on each bar (0: none)."""
    hatches = [VLLM_HATCH if e == "vLLM" else None for e in engines or [None] * len(values)]
    drawn = ax.bar(range(len(values)), values, color=[format_color(n) for n in names],
                   edgecolor="#333333", linewidth=0.6)
    for bar, hatch in zip(drawn, hatches):
        bar.set_hatch(hatch)
    if errors and any(errors):
        ax.errorbar(range(len(values)), values, yerr=errors, fmt="none", ecolor="#333333",
                    capsize=3, linewidth=1)
    tops = [v + (errors[i] if errors else 0) for i, v in enumerate(values)]
    for bar, top, text in zip(drawn, tops, texts):
        ax.text(bar.get_x() + bar.get_width() / 2, top, text, ha="center", va="bottom",
                fontsize=fontsize)
    ax.set_xticks(range(len(values)), labels, fontsize=8)
    ax.set_ylim(0, max(tops + [1e-9]) * 1.35)


def engine_legend(ax, engines: list[str]) -> None:
    """What the hatch means, where a panel has vLLM's bars."""
    if "vLLM" not in engines:
        return
    ax.legend(handles=[figures.patch("white", "mini_engine"),
                       figures.patch("white", "vLLM", hatch=VLLM_HATCH)],
              loc="upper left", fontsize=8)


def capacity_panel(ax, res) -> None:
    s = res.settings
    tokens = [c.pages * s.page_tokens for c in res.capacity]
    bars(ax, [c.name.replace(" ", "\n") for c in res.capacity], tokens,
         [c.name for c in res.capacity], [f"{n:,}\n{c.users(s)} users"
                                          for n, c in zip(tokens, res.capacity)])
    ax.set_ylabel(f"tokens in {s.kv_cache_bytes >> 20} MiB of KV")
    ax.set_title(f"Capacity (users of {s.user_tokens})")


def change_margin(x) -> float:
    """Twice the standard error of the mean |change| over the passage's tokens (0: not saved)."""
    gap = Shift.of([abs(v) for v in x.logprob_changes])
    return gap.margin if gap else 0.0


def quality_panel(ax, res) -> None:
    rows = res.quality
    bars(ax, [tick(x.engine, x.name) for x in rows], [x.mean_abs_logprob_change for x in rows],
         [x.name for x in rows],
         [f"{x.mean_abs_logprob_change:.3f}\n{x.num_identical}/{len(x.first_differences)}"
          + (f"\n{x.num_stuck} stuck" if x.num_stuck else "") for x in rows],
         [x.engine for x in rows], [change_margin(x) for x in rows], fontsize=7)
    ax.set_ylabel("mean |change| of log p a token")
    ax.set_title("Cost: log-probabilities changed\n(bar +/- 2 s.e.; text: answers kept)",
                 fontsize=10)
    engine_legend(ax, [x.engine for x in rows])


def throughput_panel(ax, res) -> None:
    runs = res.throughput
    bars(ax, [tick(t.engine, t.name) for t in runs], [t.tokens_per_s for t in runs],
         [t.name for t in runs], [f"{t.tokens_per_s:.0f}\n{t.max_running} at once"
                                  for t in runs], [t.engine for t in runs])
    ax.set_ylabel("tokens/s, many requests, small budget")
    passes = next((t.tokens_per_s_spread.num_passes for t in runs if t.tokens_per_s_spread), 1)
    ax.set_title("Gain (one pass each)" if passes < 2 else
                 f"Gain (mini_engine: median of {passes}\npasses in turns; vLLM: one pass)",
                 fontsize=10)
    engine_legend(ax, [t.engine for t in runs])


def draw_quantized_kv(res):
    panels = [capacity_panel] + ([quality_panel] if res.quality else []) + \
        ([throughput_panel] if res.throughput else [])
    fig, axes = figures.figure(5.0, 1, len(panels), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        panel(ax, res)
    return figures.finish(fig, "Task 14: half the bytes a token, and what it costs", res)
