"""The boxed report every script prints, so all of them look alike and grade alike.

    =================================================================
               Task 1: Naive HuggingFace Inference - The Baseline
    =================================================================
    Model:                    SmolLM2-135M-Instruct (offline fallback: ...)
    --- RESULTS ---
    Generated tokens:         50
    ...
    =================================================================
    KEY INSIGHT:
    - ...
    =================================================================
"""
from __future__ import annotations

import os
import textwrap
from pathlib import Path
from typing import Sequence

from common import settings


WIDTH = 65
LABEL_WIDTH = 34


def rule(char: str = "=") -> None:
    print(char * WIDTH)


def title(text: str) -> None:
    rule()
    print(f"{text:^{WIDTH}}".rstrip())
    rule()


def section(name: str) -> None:
    print()
    note(f"--- {name} ---", hang=4)


def _wrap(text: str, width: int, indent: int = 0, hang: int = 0,
          break_long_words: bool = True) -> list[str]:
    """text in lines of at most width columns (a word longer than a line is cut only when
    break_long_words), the first indented by indent, the others by indent + hang."""
    return textwrap.wrap(text, width, initial_indent=" " * indent,
                         subsequent_indent=" " * (indent + hang), break_on_hyphens=False,
                         break_long_words=break_long_words) or [""]


def row(label: str, value: object, indent: int = 0) -> None:
    """A label/value line; the label carries the unit, values line up at one column.

    Nothing leaves the report's WIDTH or that column: a label too long for its column gets a
    line of its own, the value starting on the next; a long value wraps under itself; a value
    with a word too long for the value column (a path) goes on the next lines, indented by 4.
    """
    head, value = " " * indent + label + ":", str(value)
    lines = _wrap(value, WIDTH - LABEL_WIDTH, break_long_words=False)
    if any(len(line) > WIDTH - LABEL_WIDTH for line in lines):
        print(head)
        print("\n".join(_wrap(value, WIDTH, indent + 4)))
        return
    if len(head) >= LABEL_WIDTH:
        print(head)
        head = ""
    print(f"{head:<{LABEL_WIDTH}}{lines[0]}".rstrip())
    for line in lines[1:]:
        print(" " * LABEL_WIDTH + line)


def note(text: str, indent: int = 0, hang: int = 2) -> None:
    """A line of the report, wrapped to its width; continuation lines indented hang more."""
    print("\n".join(_wrap(text, WIDTH, indent, hang)), flush=True)   # progress shows at once


def paragraph(text: str, indent: int = 0) -> None:
    """Prose wrapped to the report's width."""
    note(text, indent, hang=0)


def table(headers: Sequence[str], rows: Sequence[Sequence[object]],
          widths: Sequence[int], align_left: Sequence[int] = (0,)) -> None:
    """A fixed-width table: first column (or those in align_left) left, the rest right. The
    widths fit the report (sum <= WIDTH); a cell longer than its column wraps inside it, so the
    columns stay in line."""
    assert sum(widths) <= WIDTH, f"table of {sum(widths)} columns in a {WIDTH}-column report"

    def fmt(cells: Sequence[object]) -> list[str]:
        # one space between columns: a cell wraps at its width - 1 (the last at its width)
        wrapped = [_wrap(str(c), w - (i < len(widths) - 1)) for i, (c, w) in
                   enumerate(zip(cells, widths))]
        lines = []
        for n in range(max(map(len, wrapped))):
            parts = [(cell[n] if n < len(cell) else "", i, w)
                     for i, (cell, w) in enumerate(zip(wrapped, widths))]
            lines.append("".join(f"{c:<{w}}" if i in align_left else f"{c:>{w}}"
                                 for c, i, w in parts).rstrip())
        return lines

    print("\n".join(fmt(headers)))
    print("-" * sum(widths))
    for r in rows:
        print("\n".join(fmt(r)))


# `make lab` sets this, so that what ran is printed in full once and each later report says
# only what differs; a script run alone prints it all.
ONCE_A_RUN = "LAB_WHAT_RAN_ONCE"


def what_ran_path() -> Path:
    return settings.results_dir() / "what_ran.txt"


def forget_what_ran() -> None:
    """A new `make lab`: its first report prints what ran in full again."""
    what_ran_path().unlink(missing_ok=True)
    os.environ[ONCE_A_RUN] = "1"       # for the steps it starts


def run_info(model, dtype, threads: int, **engine_settings: object) -> None:
    """What ran: every report states the model, dtype, threads, machine and engine settings. In
    `make lab` the model, dtype, threads and machine are printed in full by the first report
    only, and again wherever they differ from it."""
    rows = [("Model", model.name), ("  from", model.source), ("  path", model.path),
            ("dtype", f"{dtype.dtype} ({dtype.reason})"), ("Threads (cores used)", threads),
            ("Machine", f"{settings.cpu_model_name()} ({settings.cpu_vector_units()})")]
    said = "\n".join(f"{label}: {value}" for label, value in rows)
    path = what_ran_path()
    if os.environ.get(ONCE_A_RUN) and path.exists() and path.read_text() == said:
        row("Model, dtype, threads", f"{model.name}, {dtype.dtype}, {threads} (as in the "
                                     "first report of this run)")
    else:
        for label, value in rows:
            row(label, value)
        if os.environ.get(ONCE_A_RUN) and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(said)
    for key, value in engine_settings.items():
        row(key, value)


def insight(lines: Sequence[str]) -> None:
    rule()
    print("KEY INSIGHT:")
    for line in lines:
        note(f"- {line}")
    rule()


def saved(path, drawn: Sequence[tuple[Path, str | None]] = ()) -> None:
    """'Saved: results/<script>.json', relative to the folder the script runs in when inside it;
    then each figure drawn from it (common.figures.saved draws them), one line each:
    'Figure: results/<script>.png', or why it was not drawn (the result is saved all the same)."""
    path_line("Saved", path)
    for png, error in drawn:
        if error is None:
            path_line("Figure", png)
        else:
            note(f"Figure {Path(png).name} not drawn: {error}")


def path_line(label: str, path) -> None:
    """'label: path', the path relative to the current folder when inside it."""
    try:
        path = Path(path).resolve().relative_to(Path.cwd())
    except ValueError:
        pass
    if len(f"{label}: {path}") <= WIDTH:
        print(f"{label}: {path}")
    else:   # a long path on lines of its own, cut only where it must be
        print(f"{label}:")
        note(str(path), indent=2, hang=0)


def bar(used: int, total: int, width: int = 50) -> str:
    """[####......]: one '#' per full 1/width of total that is used (truncated, as the source)."""
    filled = used * width // total
    return "[" + "#" * filled + "." * (width - filled) + "]"
