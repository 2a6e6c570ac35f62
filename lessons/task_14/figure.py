"""Task 14's figure (task_14_quantized_kv.py draws it after saving). Left, tasks 3-4's capacity
bars extended by the 8-bit cache: the tokens each format holds in the lab's 128 MiB, scales
counted. Middle, what each 8-bit format cost: the mean change of the passage's log-probabilities
(lower is better), with the greedy answers kept, for each engine and format. Right, what it
bought: part 3's tokens/s, the model's dtype against 8 bits, in each engine. A pure function of
the saved record (lessons/task_14/record.py), read by attribute."""
from __future__ import annotations

from common import figures

SHORT = {"mini_engine": "mini", "vLLM": "vLLM"}


def tick(engine: str, name: str) -> str:
    """'mini\\nfp8\\ntoken': one word a line (fp8_e5m2 as e5m2), so six bars' labels stay apart."""
    return "\n".join([SHORT[engine], *name.replace("fp8_e5m2", "e5m2").split()])


def bars(ax, labels: list[str], values: list[float], colors: list[int], texts: list[str]) -> None:
    drawn = ax.bar(range(len(values)), values, color=[figures.color(c) for c in colors])
    for bar, text in zip(drawn, texts):
        ax.text(bar.get_x() + bar.get_width() / 2, bar.get_height(), text, ha="center",
                va="bottom", fontsize=8)
    ax.set_xticks(range(len(values)), labels, fontsize=8)
    ax.set_ylim(0, max(values + [1e-9]) * 1.3)


def capacity_panel(ax, res) -> None:
    s = res.settings
    tokens = [c.pages * s.page_tokens for c in res.capacity]
    bars(ax, [c.name.replace(" ", "\n") for c in res.capacity], tokens,
         list(range(len(tokens))), [f"{n:,}\n{c.users(s)} users"
                                    for n, c in zip(tokens, res.capacity)])
    ax.set_ylabel(f"tokens in {s.kv_cache_bytes >> 20} MiB of KV")
    ax.set_title(f"Capacity (users of {s.user_tokens})")


def quality_panel(ax, res) -> None:
    rows = res.quality
    bars(ax, [tick(x.engine, x.name) for x in rows], [x.mean_abs_logprob_change for x in rows],
         [0 if x.engine == "mini_engine" else 6 for x in rows],
         [f"{x.mean_abs_logprob_change:.3f}\n{x.num_identical}/{len(x.first_differences)}"
          for x in rows])
    ax.set_ylabel("mean |change| of log-probabilities")
    ax.set_title("Cost (answers kept)")


def throughput_panel(ax, res) -> None:
    runs = res.throughput
    bars(ax, [tick(t.engine, t.name) for t in runs], [t.tokens_per_s for t in runs],
         [0 if t.engine == "mini_engine" else 6 for t in runs],
         [f"{t.tokens_per_s:.0f}\n{t.max_running} at once" for t in runs])
    ax.set_ylabel("tokens/s, many requests, small budget")
    ax.set_title("Gain")


def draw_quantized_kv(res):
    panels = [capacity_panel] + ([quality_panel] if res.quality else []) + \
        ([throughput_panel] if res.throughput else [])
    fig, axes = figures.figure(5.0, 1, len(panels), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        panel(ax, res)
    return figures.finish(fig, "Task 14: half the bytes a token, and what it costs", res)
