"""Task 15's figure: each server's largest level as timelines, one panel a server, one row a
request: a grey line from when it was sent to its first token (waiting and prefill), then a tick
at every streamed chunk. Equal x axes, so the panels compare by eye: the server whose rows end
first served the level first. A pure function of the saved ThreeServers."""
from __future__ import annotations

from common import figures
from lessons.task_15.record import ThreeServers


def draw_timelines(res: ThreeServers):
    ran = [s for s in res.servers if s.timeline and s.timeline.sent_s]
    fig, axes = figures.figure(2.2 + 1.6 * max(1, len(ran)), max(1, len(ran)), 1,
                               sharex=True, squeeze=False)
    if not ran:
        axes[0][0].text(0.5, 0.5, "no server ran", ha="center", va="center",
                        transform=axes[0][0].transAxes)
        return figures.finish(fig, "Task 15: three servers, one load", res)
    for i, (ax, run) in enumerate(zip([a[0] for a in axes], ran)):
        t = run.timeline
        for row, (sent, chunks) in enumerate(zip(t.sent_s, t.chunk_s)):
            first = chunks[0] if chunks else sent
            ax.plot([sent, first], [row, row], color="#bbbbbb", linewidth=2,
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
    axes[-1][0].set_xlabel("seconds from the first request sent (grey: waiting for the first "
                           "token; a tick: a streamed chunk)")
    return figures.finish(fig, f"Task 15: {res.largest} users at once, three servers "
                               f"({res.max_tokens} tokens each)", res)
