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

import contextlib
import io
import os
import textwrap
from pathlib import Path
from typing import Iterator, Sequence

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


# --- the limits of a report a learner reads -----------------------------------------------------
MAX_LINES = 100             # a report fits about two screens
MAX_INSIGHT_LINES = 12      # its KEY INSIGHT, at most MAX_INSIGHT_BULLETS whole claims
MAX_INSIGHT_BULLETS = 5

# --- what a learner does not need to follow the lesson ----------------------------------------
# `make lab` sets DETAIL_TO to results/<script>.detail.txt for each step: the report page shows
# what went there below the report. --detail (every script has it: common.cli) prints it here.
DETAIL_TO = "LAB_DETAIL_TO"
_show_detail = False
_held_back = False          # detail() kept something off the terminal in this run


def show_detail(on: bool) -> None:
    global _show_detail
    _show_detail = on


@contextlib.contextmanager
def detail() -> Iterator[None]:
    """What is printed inside goes to the terminal only with --detail; otherwise to the file
    DETAIL_TO names (make lab: the report page), or nowhere. The figures stay in the JSON."""
    if _show_detail:
        yield
        return
    global _held_back
    kept = io.StringIO()
    with contextlib.redirect_stdout(kept):
        yield
    _held_back = _held_back or bool(kept.getvalue())
    path = os.environ.get(DETAIL_TO)
    if path and kept.getvalue():
        with open(path, "a") as f:
            f.write(kept.getvalue())


def detail_hint() -> None:
    """The report's last line where it left detail out (only where it did)."""
    if not _show_detail and _held_back:
        note("More (each pass, each request): --detail, or the report page.")


# --- a term, said in a few words where the run first uses it ----------------------------------
# Each is an entry of docs/glossary.md (tests/lab/test_layout.py checks), in a few words.
TERMS = {
    "prefill": "computing the prompt's tokens, all at once, before the first new token",
    "decode step": "one forward pass that makes one new token for every running request",
    "preemption": "a running request put back, its blocks freed, when the KV cache runs out",
    "p50 / p95": "the latency half / 95 % of the requests stayed under",
    "PSS": "a process's memory, each shared page split among the processes sharing it",
    "inductor": "torch.compile's code generator, which writes C++ and compiles it",
    "oneDNN": "Intel's kernel library, which torch and vLLM call for CPU matmuls",
    "SDPA": "torch's scaled_dot_product_attention, the reference attention kernel",
    "teacher-forced": "the model reads a fixed text, not its own output",
    "TTFT": "time to first token",
    "TPOT": "time per output token, after the first",
    "ITL": "inter-token latency, the gap between two streamed tokens",
    "front door": "what a server puts in front of its engine: HTTP, tokenizing, streaming",
    "SSE": "server-sent events, the data: lines a streamed HTTP answer arrives in",
    "abort": "a request stopped before its end, its blocks freed before the next step",
    "continuous batching": "requests join and leave the running batch at every step",
    "static batching": "a batch starts together and ends when its longest request ends",
    "chunked prefill": "a long prompt computed a budget's worth at a time",
    "token budget": "the most tokens one step computes, max_num_batched_tokens",
    "greedy": "always the most likely next token, temperature 0",
    "prefix caching": "full blocks of a prompt an earlier request computed are reused",
    "speculative decoding": "guess k tokens cheaply, check them all in one step",
    "perplexity": "exp of the mean negative log-probability of a fixed text",
    "eager": "the model run op by op from Python, nothing compiled",
    "fp8": "an 8-bit float, 4 exponent and 3 mantissa bits (e4m3)",
    "block": "a fixed run of token slots of the KV cache (the paper's page)",
}
TERMS_SAID = "terms_said.txt"       # in make lab: the terms an earlier report of the run defined
_said: set[str] = set()


def term(name: str) -> str:
    """name, with its few words in brackets the first time this run (make lab: any report of
    it; a script alone: this script) says it; name alone after that."""
    path = settings.results_dir() / TERMS_SAID
    in_lab = bool(os.environ.get(ONCE_A_RUN))
    said = set(path.read_text().splitlines()) if in_lab and path.exists() else _said
    if name in said:
        return name
    said.add(name)
    if in_lab:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(sorted(said)))
    return f"{name} ({TERMS[name]})"


# `make lab` sets this, so that what ran is printed in full once and each later report says
# only what differs; a script run alone prints it all.
ONCE_A_RUN = "LAB_WHAT_RAN_ONCE"


def what_ran_path() -> Path:
    return settings.results_dir() / "what_ran.txt"


def forget_what_ran() -> None:
    """A new `make lab`: its first report prints what ran in full again, and defines its terms."""
    what_ran_path().unlink(missing_ok=True)
    (settings.results_dir() / TERMS_SAID).unlink(missing_ok=True)
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
    """The KEY INSIGHT: at most MAX_INSIGHT_BULLETS claims, each a whole sentence or two."""
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
