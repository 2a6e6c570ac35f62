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

import textwrap
from typing import Sequence

WIDTH = 65
LABEL_WIDTH = 34


def rule(char: str = "=") -> None:
    print(char * WIDTH)


def title(text: str) -> None:
    rule()
    print(f"{text:^{WIDTH}}".rstrip())
    rule()


def section(name: str) -> None:
    print(f"\n--- {name} ---")


def row(label: str, value: object, indent: int = 0) -> None:
    """A label/value line; the label carries the unit, values line up at one column."""
    pad = " " * indent
    print(f"{pad}{label + ':':<{LABEL_WIDTH - indent - 1}} {value}")


def note(text: str, indent: int = 0) -> None:
    print(" " * indent + text)


def paragraph(text: str, indent: int = 0) -> None:
    """Prose wrapped to the report's width."""
    pad = " " * indent
    print(textwrap.fill(text, WIDTH, initial_indent=pad, subsequent_indent=pad))


def table(headers: Sequence[str], rows: Sequence[Sequence[object]],
          widths: Sequence[int], align_left: Sequence[int] = (0,)) -> None:
    """A fixed-width table: first column (or those in align_left) left, the rest right."""
    def fmt(cells: Sequence[object]) -> str:
        return "".join(f"{str(c):<{w}}" if i in align_left else f"{str(c):>{w}}"
                       for i, (c, w) in enumerate(zip(cells, widths)))
    print(fmt(headers))
    print("-" * sum(widths))
    for r in rows:
        print(fmt(r))


def run_info(model, dtype, threads: int, **engine_settings: object) -> None:
    """What ran: every report states the model, dtype, threads and engine settings."""
    row("Model", model.name)
    row("  from", model.source)
    row("  path", model.path)
    row("dtype", f"{dtype.dtype} ({dtype.reason})")
    row("Threads (cores used)", threads)
    for key, value in engine_settings.items():
        row(key, value)


def insight(lines: Sequence[str]) -> None:
    rule()
    print("KEY INSIGHT:")
    for line in lines:
        print(f"- {line}")
    rule()


def bar(used: int, total: int, width: int = 50) -> str:
    """[####......]: one '#' per full 1/width of total that is used (truncated, as the source)."""
    filled = used * width // total
    return "[" + "#" * filled + "." * (width - filled) + "]"


MIB = 1024 * 1024


def kv_bytes_section(model, model_kv, budget_bytes: int, slots: Sequence[tuple[str, int]],
                     users: Sequence[tuple[str, int]]) -> dict:
    """Tasks 3-4: token slots turned into bytes for the model that would run, and into the
    lab's KV budget. Returns the figures it printed."""
    bpt = model_kv.bytes_per_token
    section(f"IN BYTES: {model.name}, {model_kv.dtype}")
    row("Model", model.describe())
    row("  path", model.path)
    row("KV bytes per token", f"{bpt:,} B = {model_kv.formula()}")
    for label, num_slots in slots:
        row(label, f"{num_slots:,} slots x {bpt:,} B = {num_slots * bpt / MIB:,.2f} MiB")
    budget_tokens = budget_bytes // bpt
    row("KV budget of the lab", f"{budget_bytes / MIB:,.0f} MiB = {budget_tokens:,} token slots")
    fits = {}
    for label, slots_per_user in users:
        fits[label] = budget_tokens // slots_per_user
        row(f"  {label}", f"{fits[label]:,} users ({budget_tokens:,} // {slots_per_user} slots)")
    return {"kv_bytes_per_token": bpt, "budget_bytes": budget_bytes,
            "budget_token_slots": budget_tokens, "users_in_budget": fits}
