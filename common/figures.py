"""The lab's pictures: the shared drawing helpers, and drawing a result's figures into PNGs.

Each task draws its own figures, with the task (its lesson package's FIGURES: `(("", draw),
("phases", draw_phases))` gives results/<name>.png and results/<name>_phases.png). A draw
function is a pure function of the task's saved, typed result: `draw(record)` returns a
matplotlib Figure, or None when the result holds nothing to draw. What a figure plots is worked
out by small functions of its task's (timeline_grid, pool_owners, ...), which tests check on
workloads worked out by hand: the matrix, never the pixels.

A script's `figures.saved(path, record, FIGURES)` draws the figures of the result it just saved
and prints `Figure: results/<name>.png` (through common.report); common/html_report.py draws
them again for the report page, from the saved results.

Style: matplotlib's Agg backend (no display needed), the Okabe-Ito palette (told apart with
every common colour-vision deficiency; Okabe & Ito, "Color Universal Design", 2008), 10 inches
wide at 120 dpi, so the text stays legible where the page shows the figure 1,000 px wide.
Every figure has a title, axes with units, and a caption line: model, dtype, machine, date.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from common import report, settings
from common.results import Result

# Okabe-Ito, black left out (it is the text colour): orange, sky blue, bluish green, yellow,
# blue, vermillion, reddish purple; then grey for an eighth.
PALETTE = ["#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7",
           "#999999"]
WIDTH_IN = 10.0
DPI = 120

Draw = Callable[[Result], object]        # a task's typed result -> a matplotlib Figure or None
Figures = tuple[tuple[str, Draw], ...]   # (file suffix, draw) of each figure a task has


def plt():
    """pyplot on the Agg backend (no display), imported on first use: a script that draws no
    figure does not pay for matplotlib's import."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    pyplot.rcParams.update({"font.size": 11, "axes.titlesize": 12, "figure.titlesize": 14,
                            "axes.spines.top": False, "axes.spines.right": False,
                            "legend.fontsize": 10, "legend.frameon": False})
    return pyplot


def figure(height_in: float, *grid, **kwargs):
    """A figure 10 inches wide, constrained layout (nothing cut off at the edges)."""
    return plt().subplots(*grid, figsize=(WIDTH_IN, height_in), dpi=DPI, layout="constrained",
                          **kwargs)


# --- the caption: model, dtype, machine, date ---------------------------------------------------
def machine_of(result: Result) -> str:
    """'CPU model, N cores' of the machine that measured this result (results.save records it)."""
    return result.measured_on.label if result.measured_on else "machine not recorded"


def caption(result: Result) -> str:
    """One line under every figure: what ran, where, when."""
    model = str(result.header.model or "model not recorded").rstrip("/").rsplit("/", 1)[-1]
    dtype = result.header.dtype or "dtype not recorded"
    when = (result.measured_at or "date not recorded")[:16].replace("T", " ")
    return f"{model}, {dtype}  |  {machine_of(result)}  |  {when}"


def finish(fig, title: str, result: Result):
    fig.suptitle(title, fontweight="bold")
    fig.supxlabel(caption(result), fontsize=9, color="#444444")
    return fig


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


# --- pieces two tasks draw: slot bars (tasks 3, 4), pages as rectangles (tasks 4, 9, 10) -------
def slot_bars(ax, rows: list[tuple[str, int, list[tuple[str, int]]]]) -> None:
    """Horizontal bars per request: each reservation (light, hatched), the slots used on top."""
    names = [f"{i}. {name}" for i, (name, _, _) in enumerate(rows, start=1)]
    num_kinds = len(rows[0][2])
    height = 0.8 / num_kinds
    for k in range(num_kinds):
        label = rows[0][2][k][0]
        y = [i + (k - (num_kinds - 1) / 2) * height for i in range(len(rows))]
        reserved = [kinds[k][1] for _, _, kinds in rows]
        used = [u for _, u, _ in rows]
        ax.barh(y, reserved, height * 0.9, color="white", edgecolor=color(k + 4),
                hatch="//", label=f"reserved, {label}")
        ax.barh(y, used, height * 0.9, color=color(2), label="slots used" if k == 0 else None)
        for yy, total, u in zip(y, reserved, used):
            ax.text(total, yy, f" {u}/{total} ({100 * (total - u) / total:.1f}% wasted)",
                    va="center", fontsize=9)
    ax.set_yticks(range(len(rows)), names)
    ax.invert_yaxis()
    ax.set_xlabel("KV-cache token slots")
    ax.set_xlim(0, max(t for _, _, kinds in rows for _, t in kinds) * 1.42)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))


def rect(x: float, y: float, w: float, color: str, hatch: str | None = None):
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, 1, facecolor=color, edgecolor="#333333", linewidth=0.6,
                     hatch=hatch)


def patch(color: str, label: str, hatch: str | None = None, edge: str = "#333333"):
    from matplotlib.patches import Patch

    return Patch(facecolor=color, edgecolor=edge, hatch=hatch, label=label)


# --- task 10: shared pages -----------------------------------------------------------------------

# --- drawing a result's figures -----------------------------------------------------------------
def png_path(name: str, suffix: str = "") -> Path:
    return settings.results_dir() / (f"{name}_{suffix}.png" if suffix else f"{name}.png")


def draw(name: str, record: Result, entries: Figures) -> list[tuple[Path, str | None]]:
    """Draw a result's figures into PNGs beside it: [(path, None if drawn, else why not)]. A
    figure that cannot be drawn (a bug, a result with nothing to draw) is reported, never
    raised: the measurement is saved already, the picture is extra."""
    out = []
    for suffix, draw_one in entries:
        path = png_path(name, suffix)
        try:
            fig = draw_one(record)
        except Exception as e:  # noqa: BLE001 - one line in the report, not a crash
            out.append((path, f"{type(e).__name__}: {e}"))
            continue
        if fig is None:
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fig.savefig(path)
            out.append((path, None))
        except OSError as e:
            out.append((path, f"{type(e).__name__}: {e}"))
        finally:
            plt().close(fig)
    return out


def saved(path, record: Result, entries: Figures = ()) -> None:
    """After results.save: draw the figures of the result just saved at path, then print
    'Saved: ...' and one 'Figure: ...' line each (common.report)."""
    report.saved(path, draw(Path(path).stem, record, entries))
