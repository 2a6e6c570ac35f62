"""The summary's figure (summary.py draws it after saving): the roofline of this machine,
tokens/s against requests per step, log-log, with the kernel floor, the lab's measured steps and
task 9's own engine placed on it. A pure function of the saved Summary, read by attribute."""
from __future__ import annotations

from common import figures
from lessons.summary.roofline import EnginePoint, Placement


def roofline_curve(r: Placement, batches: list[float]) -> tuple[list[float], list[float], float]:
    """Per batch B, the bandwidth bound (tokens/s if a step took only its bytes: the weights
    once + B requests' KV, at the measured bandwidth) and the compute roof (tokens/s at the peak
    matmul rate). The roofline is the lower of the two."""
    bandwidth = r.bandwidth_gb_s * 1e9
    kv_bytes = r.bytes_per_token - r.weight_bytes   # one request's KV at the mean context
    flops = r.matmul_gflop_s[r.dtype] * 1e9
    read = [b * bandwidth / (r.weight_bytes + b * kv_bytes) for b in batches]
    return read, [flops / r.flops_per_token] * len(batches), flops / r.flops_per_token


def roofline_points(r: Placement, engine: EnginePoint | None = None
                    ) -> list[tuple[str, float, float, str]]:
    """(label, batch, tokens/s, kind) of every point on the roofline: kind 'floor' for the
    kernel floor (the model's matmuls alone, batch b in its step: b tokens per step), 'measured'
    for the steps the lab measured, 'engine' for the lab's own engine."""
    floor = r.kernel_floor.step_s if r.kernel_floor else {}
    points = [(f"kernel floor, batch {b}", b, b / s, "floor") for b, s in sorted(floor.items())]
    for p in r.placed.values():
        if p.one_user:
            points.append(("server, 1 user", 1, p.one_user.tokens_per_s, "measured"))
        points.append((p.label, p.users, p.tokens_per_s, "measured"))
    if engine:
        points.append((engine.label, engine.batch, engine.tokens_per_s, "engine"))
    return points


def draw_roofline(summary):
    """The summary (a record with `roofline`, a Placement, and `engine_point`): tokens/s against
    requests per step, log-log. One step reads the weights once for the whole batch, so the
    bandwidth bound climbs with the batch (slope 1) until the compute roof; the kernel floor and
    the measured steps sit below."""
    import math

    from matplotlib.ticker import FuncFormatter

    r = summary.roofline
    if r is None:
        return None
    points = roofline_points(r, summary.engine_point)
    top_batch = max([b for _, b, _, _ in points] + [1])
    ridge = r.ridge_batch or top_batch
    x_max = min(1e4, max(4 * top_batch, 2 * ridge if math.isfinite(ridge) else 0, 64))
    batches = [10 ** (i / 50) for i in range(int(50 * math.log10(x_max)) + 1)]
    read, compute, roof = roofline_curve(r, batches)
    fig, ax = figures.figure(5.6)
    color = figures.color
    ax.plot(batches, read, "--", color=color(1), label="bandwidth bound: the weights read\n"
                                                       "once per step, for the whole batch")
    ax.plot(batches, compute, "--", color=color(5), label=f"compute roof: peak {r.dtype} matmul")
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
        ax.plot(batch * dodge, tps, markers[kind], color=color(k + 4 if k < 4 else k - 4),
                markersize=14 if kind == "engine" else 10, markeredgecolor="#333333",
                label=f"{label}: {tps:,.1f} tok/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")   # 1, 10, 100 (not 10^0, 10^1)
    ax.xaxis.set_major_formatter(plain)
    ax.yaxis.set_major_formatter(plain)
    ax.set_xlim(0.8, x_max)
    low = min([tps for _, _, tps, _ in points] + [read[0]])
    ax.set_ylim(low / 2, roof * 2)
    ax.set_xlabel("requests decoded in one step (batch), log scale")
    ax.set_ylabel("tokens/s, log scale")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=9)
    ax.set_title(f"{r.bandwidth_gb_s:.1f} GB/s read, {r.matmul_gflop_s[r.dtype]:,.0f} "
                 f"GFLOP/s {r.dtype} matmul; {r.num_params / 1e6:.0f}M parameters, "
                 f"context {r.context}", fontsize=10)
    return figures.finish(fig, "Summary: the roofline of decoding on this machine", summary)
