"""Task 15's figure, a pure function of the saved ThreeServers. On top, its main claim: each
server's tokens/s through the server beside its own engine's offline, on the same requests, at
the fewest and at the most users (a panel each, served over offline written above each pair).
Below, each server's largest level as timelines, one panel a server, one row a request: a grey
line from when it was sent to its first token (waiting and prefill), then a tick at every
streamed chunk. Equal x axes, so those panels compare by eye: the server whose rows end first
served the level first."""
from __future__ import annotations

from common import figures, fmt
from lessons.task_15.record import ThreeServers

OFFLINE_COLOR = "#bbbbbb"


def door_bars(res: ThreeServers, num_users: int) -> list[tuple[str, float | None, float | None]]:
    """(server, offline tok/s or None, served tok/s or None) of each server that ran, at
    num_users: what a door panel draws."""
    out = []
    for run in res.servers:
        if run.skipped:
            continue
        alone, served = run.offline_at(num_users), run.level(num_users)
        out.append((run.way, alone.median if alone else None,
                    served.tokens_per_s if served and served.num_ok else None))
    return out


def draw_door(ax, res: ThreeServers, num_users: int, legend: bool = False) -> None:
    """One panel: offline (grey) and served (the server's colour) tokens/s, a pair a server,
    served over offline written above each pair; with no offline run at all, served alone."""
    bars = door_bars(res, num_users)
    any_offline = any(alone is not None for _, alone, _ in bars)
    width = 0.38 if any_offline else 0.5
    for i, (way, alone, served) in enumerate(bars):
        if alone is not None:
            ax.bar(i - width / 2, alone, width, color=OFFLINE_COLOR, edgecolor="#333333",
                   linewidth=0.6)
        if served is not None:
            ax.bar(i + width / 2 if any_offline else i, served, width, color=figures.color(i),
                   edgecolor="#333333", linewidth=0.6)
        if any_offline:
            top = max(v for v in (alone, served, 0.0) if v is not None)
            text = fmt.times(served / alone) if served is not None and alone else "no offline"
            ax.text(i, top * 1.03, text, ha="center", va="bottom", fontsize=10)
    ax.set_xticks(range(len(bars)), [way for way, _, _ in bars])
    # room above the bars for the ratios and the legend
    ax.set_ylim(0, 1.45 * max([v for _, a, s in bars for v in (a, s) if v is not None] or [1]))
    ax.set_ylabel("tokens/s")
    ax.set_title(f"{num_users} user{'s' * (num_users != 1)}: served over offline" if any_offline
                 else f"{num_users} user{'s' * (num_users != 1)}: served (offline not run)",
                 loc="left", fontsize=11)
    ax.grid(axis="y", alpha=0.3)
    if legend:
        handles = [figures.patch(figures.color(0), "served (through its server)")]
        if any_offline:
            handles.insert(0, figures.patch(OFFLINE_COLOR, "offline (its engine alone)"))
        ax.legend(handles=handles, loc="upper left", ncol=2)


def draw_timeline(ax, res: ThreeServers, run, i: int) -> None:
    t = run.timeline
    for row, (sent, chunks) in enumerate(zip(t.sent_s, t.chunk_s)):
        first = chunks[0] if chunks else sent
        ax.plot([sent, first], [row, row], color=OFFLINE_COLOR, linewidth=2,
                solid_capstyle="butt")
        ax.plot(chunks, [row] * len(chunks), "|", color=figures.color(i), markersize=5,
                markeredgewidth=1)
    level = run.level(res.largest)
    ax.set_title(f"{run.way}: {len(t.sent_s)} requests, {level.tokens_per_s:.0f} tokens/s, "
                 f"mean TTFT {level.mean_ttft_s:.2f} s", loc="left", fontsize=11)
    ax.set_ylabel("request")
    ax.set_ylim(-1, len(t.sent_s))
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)


def draw_servers(res: ThreeServers):
    ran = [s for s in res.servers if not s.skipped]
    timed = [s for s in ran if s.timeline and s.timeline.sent_s]
    counts = sorted({min(res.users), res.largest})
    rows = [["door"] * 2 if len(counts) == 1 else [f"door{n}" for n in counts]]
    rows += [[f"t{i}"] * 2 for i in range(len(timed))]
    fig = figures.plt().figure(figsize=(figures.WIDTH_IN, 3.2 + 1.6 * len(timed)),
                               dpi=figures.DPI, layout="constrained")
    axes = fig.subplot_mosaic(rows, height_ratios=[2.0] + [1.6] * len(timed))
    if not ran:
        ax = axes[rows[0][0]]
        ax.text(0.5, 0.5, "no server ran", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return figures.finish(fig, "Task 15: three servers, one load", res)
    for n in counts:
        draw_door(axes["door" if len(counts) == 1 else f"door{n}"], res, n, legend=n == counts[0])
    colors = {run.way: i for i, run in enumerate(ran)}
    timelines = [axes[f"t{i}"] for i in range(len(timed))]
    for ax, run in zip(timelines, timed):
        draw_timeline(ax, res, run, colors[run.way])
        if ax is not timelines[0]:
            ax.sharex(timelines[0])
        if ax is not timelines[-1]:
            ax.tick_params(labelbottom=False)
    if timelines:
        timelines[-1].set_xlabel("seconds from the first request sent (grey: waiting for the "
                                 "first token; a tick: a streamed chunk)")
    offline = any(s.offline for s in ran)
    title = (f"Task 15: each server against its engine offline, and {res.largest} users at "
             f"once ({res.max_tokens} tokens each)" if offline else
             f"Task 15: {res.largest} users at once, {res.max_tokens} tokens each (offline "
             "not run)")
    return figures.finish(fig, title, res)
