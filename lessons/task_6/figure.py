"""Task 6's figure (task_6_multi_user_load.py draws it after saving): tokens/s against users
(the median pass, bars for the range of the passes), latency per request, and the largest group
one after another against all together. A pure function of the saved MultiUserLoad."""
from __future__ import annotations

from common import figures
from lessons.task_6.record import MultiUserLoad

def draw_load_levels(res: MultiUserLoad):
    """tokens/s and latency (p50, p95, TTFT) against concurrent users; the largest group one
    after another against all together."""
    levels = [lv for lv in res.levels if lv.num_ok]
    users = [lv.num_users for lv in levels]
    fig, (tps, lat, seq) = figures.figure(4.2, 1, 3, width_ratios=[1.2, 1.2, 1])
    # black: blue, orange and green are the latency panel's series
    tps.plot(users, [lv.tokens_per_s for lv in levels], "o-", color="black")
    tops = [lv.tokens_per_s for lv in levels]       # where each value's label stands above
    if len(res.spreads) == len(res.levels) and res.num_passes > 1:   # every pass's range
        spread = [s for lv, s in zip(res.levels, res.spreads) if lv.num_ok]
        tps.errorbar(users, [lv.tokens_per_s for lv in levels], fmt="none", capsize=4,
                     color="black",
                     yerr=[[lv.tokens_per_s - s.low for lv, s in zip(levels, spread)],
                           [s.high - lv.tokens_per_s for lv, s in zip(levels, spread)]])
        tops = [max(top, s.high) for top, s in zip(tops, spread)]
    # each label above its bar's upper cap, clear of the bar; on white, where the line between
    # two close levels climbs past it
    for lv, top in zip(levels, tops):
        tps.annotate(f"{lv.tokens_per_s:.1f}", (lv.num_users, top),
                     textcoords="offset points", xytext=(0, 5), ha="center", va="bottom",
                     fontsize=9, zorder=5, bbox=dict(facecolor="white", edgecolor="none", pad=1))
    tps.set(title="Throughput", xlabel="concurrent users",
            ylabel="tokens/s (all users)" + (f"\nmedian of {res.num_passes} passes, bars: range"
                                             if res.num_passes > 1 else ""))
    for values, label, color, marker in (
            ([lv.p50_latency_s for lv in levels], "p50 latency", 4, "o"),
            ([lv.p95_latency_s for lv in levels], "p95 latency", 5, "s"),
            ([lv.mean_ttft_s for lv in levels], "mean time to first token", 2, "^")):
        lat.plot(users, values, marker=marker, color=figures.color(color), label=label)
    lat.set(title="Latency per request", xlabel="concurrent users", ylabel="seconds")
    lat.legend(fontsize=9)
    for ax in (tps, lat):
        ax.set_xticks(users)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    if tops:
        tps.set_ylim(0, 1.15 * max(tops))           # room for the highest label inside the axes
        tps.margins(x=0.1)                          # and for the first and last beside the spines
    together = max(levels, key=lambda lv: lv.num_users) if levels else None
    if res.sequential and together:
        # colours of their own: the other panels' blue, orange and green are their series
        both = [("one after\nanother", res.sequential.duration_s, figures.color(6)),
                ("all\ntogether", together.duration_s, figures.color(1))]
        bars = seq.bar([b[0] for b in both], [b[1] for b in both], color=[b[2] for b in both])
        seq.bar_label(bars, fmt="%.1f s")
        seq.set_ylim(0, 1.12 * max(b[1] for b in both))   # the labels inside the axes
        seq.set(title=f"{together.num_users} users' requests",
                ylabel="seconds until the last finished")
    else:
        seq.text(0.5, 0.5, "not measured\n(--no-sequential)", ha="center", va="center",
                 transform=seq.transAxes)
        seq.set(title="One after another", xticks=[], yticks=[])
    return figures.finish(fig, "Task 6: more users, more tokens/s (one streamed request each)",
                          res)
