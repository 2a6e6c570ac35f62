"""Several ways of doing the same work, timed taking turns: task 13's two mini_engine ways on one
model, and benchmarks/long_context.py's ways, each in a process of its own.

Each way runs once untimed (the first pass of a process ran slower, whichever way it was: its
matmuls too; docs/measurements.md, issue 29), then every way runs again, one after another, for
a number of rounds. This machine's speed drifts by a fifth within minutes (the same file): ways
timed one after the other would carry that drift into their ratio, where taking turns spreads it
over them all. The callers keep each way's fastest pass: a noisy neighbour slows a pass, never
speeds one up.
"""
from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")


def in_turns(ways: dict[str, Callable[[], T]], timed_rounds: int,
             on_pass: Callable[[str, int], None] | None = None) -> dict[str, list[T]]:
    """way -> what its timed passes returned, in order. ways: name -> a pass of its work. Round 0
    is untimed (its results dropped), rounds 1..timed_rounds are kept. on_pass(name, round), if
    given, is called before each pass (a progress line)."""
    found: dict[str, list[T]] = {name: [] for name in ways}
    for round_ in range(timed_rounds + 1):
        for name, one_pass in ways.items():
            if on_pass is not None:
                on_pass(name, round_)
            result = one_pass()
            if round_:
                found[name].append(result)
    return found
