"""The lab's one way of measuring: a figure is measured in several passes, and reported as the
median with its spread (the lowest and highest pass) beside it; two ways of doing the same work
take turns, pass by pass.

Why the median: it is what a learner running the script will see, where the best pass says only
what the code can do on a quiet machine. The machine's own ceilings (its memory bandwidth, its
peak matmul) and kernels timed alone are the exception and take the best pass (best_s): a
ceiling is what the machine can do, and a neighbour can only slow a pass down.

Two questions, two rules:
- two figures of one quantity, measured twice in one run (twins: one request alone in task 6's
  1-user level and in its sequential requests), AGREE when their medians are within AGREE_WITHIN
  of each other (Spread.agrees), whether or not their ranges touch;
- two ways of doing the same work (two configurations, on and off) are told apart only where
  the ranges of their passes do not overlap (Spread.overlaps): nothing measured separates them
  otherwise.

Ways that take turns (in_turns): each runs once untimed (the first pass of a process runs slower,
whichever way it is), then every way runs again, one after another, for a number of rounds, so
the drift is spread over them all instead of landing in their ratio.

A way in a process of its own is a Child here and calls serve() there: it sets up, prints READY
(and what its set-up measured, as JSON), then runs a pass each time it reads "pass" and prints
RESULT and the pass's JSON; the end of its stdin ends it. A child that measures once, in its
set-up, calls answer() there and the parent run_once() here: the lab's one way to run a child
process and read its result.

A long task's progress lines carry the time since it started (progress_clock).
"""
from __future__ import annotations

import json
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

import psutil

from common import memory, results, settings
from common.server import ServerError

T = TypeVar("T")

PASSES = 3          # passes of every figure that reaches a summary row or a KEY INSIGHT
# Twins agree when their medians are within a tenth of each other: half the fifth by which these
# machines drift within minutes (docs/measurements.md), so a gap of a fifth is always named.
AGREE_WITHIN = 0.10


def within(a: float, b: float, tolerance: float = AGREE_WITHIN) -> bool:
    """a and b within tolerance of each other: the larger at most (1 + tolerance) x the smaller."""
    low, high = sorted((a, b))
    return high <= (1 + tolerance) * low


@dataclass
class Spread(results.Record):
    """A figure measured in several passes: the median, the lowest and the highest pass."""
    median: float
    low: float
    high: float
    num_passes: int

    @classmethod
    def of(cls, values) -> "Spread":
        values = sorted(values)
        if not values:
            raise ValueError("a spread of no passes")
        # the lower middle for an even count: the pass median_index keeps, not a mean of two
        return cls(statistics.median_low(values), values[0], values[-1], len(values))

    def agrees(self, other: "Spread") -> bool:
        """Twins (one quantity measured twice): their medians are within AGREE_WITHIN."""
        return within(self.median, other.median)

    def overlaps(self, other: "Spread") -> bool:
        """Two ways: their ranges overlap, so nothing measured tells them apart."""
        return self.low <= other.high and other.low <= self.high

    def scaled(self, factor: float) -> "Spread":
        """The same passes in another unit (seconds to ms: factor 1000)."""
        return Spread(self.median * factor, self.low * factor, self.high * factor,
                      self.num_passes)

    def text(self, digits: int = 1, unit: str = "", what: str = "passes") -> str:
        """'31.3 tok/s (29.0-32.1, 3 passes)'; one pass: '31.3 tok/s (1 pass)'."""
        value = f"{self.median:,.{digits}f}{unit}"
        if self.num_passes < 2:
            return f"{value} (1 {'pass' if what == 'passes' else what.removesuffix('s')})"
        return f"{value} ({self.low:,.{digits}f}-{self.high:,.{digits}f}, {self.num_passes} {what})"


def median_pass(passes: list[T], key: Callable[[T], float]) -> T:
    """The pass whose key is the median (median_index), kept whole."""
    return passes[median_index([key(p) for p in passes])]


def median_index(values: list[float]) -> int:
    """The index of the median pass (the lower of the two middle ones for an even count), so a
    record can keep that pass whole, every figure of it from one and the same pass."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order[(len(values) - 1) // 2]


def progress_clock() -> Callable[[str], None]:
    """A progress printer for a long task: one line per part, with the time since it was made."""
    start = time.perf_counter()

    def progress(text: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {text}", flush=True)
    return progress


def best_s(fn: Callable[[], object], repeats: int, budget_s: float = float("inf")) -> float:
    """Seconds of fn's fastest run of `repeats`, after one untimed run (page faults, the thread
    pool, the kernel's choice); fewer runs once they took budget_s. For the machine's ceilings
    and kernels timed alone (the kernel floor, task 13's attention) only: what the code can do
    (the module's docstring says why)."""
    fn()
    best, spent = float("inf"), 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
        if spent > budget_s:
            break
    return best


READY, RESULT = "turns: ready ", "turns: result "     # what a child's stdout says


def in_turns(ways: dict[str, Callable[[], T]], timed_rounds: int,
             on_pass: Callable[[str, int], None] | None = None,
             warm_up: bool = True) -> dict[str, list[T]]:
    """way -> what its timed passes returned, in order. ways: name -> a pass of its work. Round 0
    is untimed (its results dropped), rounds 1..timed_rounds are kept; warm_up=False leaves
    round 0 out, where the caller warmed every way up already. on_pass(name, round), if given,
    is called before each pass (a progress line)."""
    found: dict[str, list[T]] = {name: [] for name in ways}
    for round_ in range(0 if warm_up else 1, timed_rounds + 1):
        for name, one_pass in ways.items():
            if on_pass is not None:
                on_pass(name, round_)
            result = one_pass()
            if round_:
                found[name].append(result)
    return found


# --- a way in a process of its own -------------------------------------------------------------
def serve(one_pass: Callable[[], dict], ready: dict | None = None) -> None:
    """The child's side: say it is ready (with what its set-up measured), then run a pass each
    time the parent writes "pass"; stop at anything else or at the end of stdin."""
    print(READY + json.dumps(ready or {}), flush=True)
    for line in sys.stdin:
        if line.strip() != "pass":
            break
        print(RESULT + json.dumps(one_pass()), flush=True)


def answer(found: dict) -> None:
    """The child's side of run_once: what it measured, said once; then it may exit."""
    print(READY + json.dumps(found), flush=True)


def run_once(way: str, args: list[str], timeout_s: float,
             unset: tuple[str, ...] = ()) -> tuple[dict, int]:
    """`python <args>` in a fresh process that answer()s (or serve()s): (what it said, its peak
    PSS). A failure or the timeout is a ServerError of one line; nothing is left running."""
    with Child(way, args, timeout_s, unset) as child:
        found = child.ready()
    return found, child.peak_bytes


class Child:
    """`python <args>`, a way in a fresh process that serve()s, its memory sampled while it
    lives. Its stdout is read by a thread of its own (vLLM prints there too), so a wait can time
    out; its stderr goes to a file, whose last line is the error shown if it fails (a
    ServerError, one line). unset: environment variables it must not inherit. Ready: what its
    set-up said; peak_bytes, once closed: its peak PSS."""

    def __init__(self, way: str, args: list[str], timeout_s: float,
                 unset: tuple[str, ...] = ()):
        self.way, self.timeout_s, self.err = way, timeout_s, tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen([sys.executable, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     env=memory.child_env(unset), cwd=settings.REPO_DIR)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.peak = memory.PeakMemory(self.proc.pid).start()
        self.peak_bytes = 0

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)                       # the child closed its stdout: it ended

    def _json_after(self, prefix: str) -> dict:
        """The JSON of the child's next line that starts with prefix."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._kill()
                raise ServerError(f"{self.way} ran over {self.timeout_s:.0f} s and was "
                                  "stopped") from None
            if line is None:
                self.err.seek(0)
                last = (self.err.read().strip().splitlines() or ["no output"])[-1]
                raise ServerError(f"{self.way} exited with code {self.proc.wait()}: {last}")
            if line.startswith(prefix):
                try:
                    return json.loads(line[len(prefix):])
                except json.JSONDecodeError:
                    raise ServerError(f"{self.way} printed a line that is not JSON: "
                                      f"{line[:200]}") from None

    def ready(self) -> dict:
        """Wait for the child's set-up: what it measured there."""
        return self._json_after(READY)

    def run_pass(self) -> dict:
        try:
            self.proc.stdin.write("pass\n")
            self.proc.stdin.flush()
        except OSError:               # it has ended: _json_after says how, from its stderr
            pass
        return self._json_after(RESULT)

    def _kill(self) -> None:
        """The child and what it started (vLLM's engine core), killed."""
        try:
            tree = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            tree = []
        for process in tree:
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """End the child (asked first, killed with what it started if it does not go) and its
        memory's sampling."""
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self._kill()
        self.peak.stop()
        self.peak_bytes = self.peak.peak_bytes
        self.err.close()
