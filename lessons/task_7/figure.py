"""Task 7's figure (task_7_tuning.py draws it after saving): configs A, B and C side by side,
tokens/s (the median pass, a line for the lowest-highest of the passes), latency per request,
and the most requests seen running and waiting. A pure function of the saved Tuning."""
from __future__ import annotations

from common import figures
from lessons.task_7.record import Tuning

# One colour, one meaning on the page: throughput grey in every config (the x axis names the
# config), the latencies and the peaks each a colour of their own.
THROUGHPUT, MEAN, P50, P95 = figures.color(7), figures.color(4), figures.color(1), figures.color(6)
RUNNING, WAITING = figures.color(2), figures.color(0)


def draw_tuning(res: Tuning):
    """Configs A, B, C side by side: tokens/s (the median pass, lowest-highest as a line),
    latency, peak running and waiting."""
    runs = res.configs
    names = [f"{r.label.split(':')[0]}\nlen {r.config.max_model_len}\nseqs {r.config.max_num_seqs}"
             for r in runs]
    x = list(range(len(runs)))
    fig, (tps, lat, peak) = figures.figure(4.4, 1, 3)
    bars = tps.bar(x, [r.level.tokens_per_s for r in runs], color=THROUGHPUT)
    spreads = [r.spread for r in runs]
    if all(s is not None and s.num_passes > 1 for s in spreads):
        tps.errorbar(x, [r.level.tokens_per_s for r in runs],
                     yerr=[[r.level.tokens_per_s - s.low for r, s in zip(runs, spreads)],
                           [s.high - r.level.tokens_per_s for r, s in zip(runs, spreads)]],
                     fmt="none", ecolor="black", capsize=5,
                     label=f"lowest-highest of {spreads[0].num_passes} passes")
        tps.set_ylim(0, 1.25 * max(s.high for s in spreads))   # room for the legend above
        tps.legend(fontsize=9, loc="upper center")
        tps.set_title(f"Throughput (median pass of {spreads[0].num_passes})")
    else:
        tps.set_title("Throughput")
    tps.bar_label(bars, fmt="%.1f", label_type="center")
    tps.set_ylabel("tokens/s")
    _grouped(lat, x, [("mean", [r.level.mean_latency_s or 0 for r in runs], MEAN),
                      ("p50", [r.level.p50_latency_s or 0 for r in runs], P50),
                      ("p95", [r.level.p95_latency_s or 0 for r in runs], P95)])
    lat.set(title="Latency per request", ylabel="seconds")
    _grouped(peak, x, [("running", [r.peak_num_requests_running for r in runs], RUNNING),
                       ("waiting", [r.peak_num_requests_waiting for r in runs], WAITING)],
             labels=True)
    peak.set(title="Requests at once (peak, /metrics)", ylabel="requests")
    for ax in (tps, lat, peak):
        ax.set_xticks(x, names, fontsize=9)
    return figures.finish(fig, f"Task 7: three server configs, {res.num_requests} concurrent "
                               f"requests each", res)


def _grouped(ax, x: list[int], groups: list[tuple[str, list[float], str]],
             labels: bool = False) -> None:
    width = 0.8 / len(groups)
    for k, (label, values, color) in enumerate(groups):
        bars = ax.bar([i + (k - (len(groups) - 1) / 2) * width for i in x], values, width,
                      color=color, label=label)
        if labels:
            ax.bar_label(bars, fontsize=9)
    ax.legend(fontsize=9)
