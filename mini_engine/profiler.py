"""Where a step's time goes, for whoever asks: the engine tells a profiler where each part of a
step ends, and the model lets it time the matmuls and the attention. Measuring lives here, around
the step, not inside it (nano-vllm's step is schedule, run, postprocess): an engine without a
profiler records each step's seconds only.

A step's phases (seconds), as task 9 prints them:
    matmul         the linear layers' products (121 a step on SmolLM-135M)
    attention      writing K/V through the slot mapping, gathering each context, attending
    forward_other  the rest of the forward: making the batch, norms, RoPE, the adds, the logits
    sampling       picking each request's next token from its logits
    scheduling     before the forward (who runs, pages) and after sampling (tokens handed out,
                   finished requests leave)

Timing costs two clock reads around each of a step's 151 products and attentions, which is why
it is the caller's to ask for (docs/measurements.md has what it cost).
"""
from __future__ import annotations

import time
from typing import Callable

PHASES = ("matmul", "attention", "forward_other", "sampling", "scheduling")
TIMED_INSIDE = ("matmul", "attention")          # timed call by call inside the forward


class StepProfiler:
    """Phases of one step at a time: start_step, mark("scheduled"), mark("forwarded"),
    mark("sampled"), then end_step returns the step's PHASES in seconds."""

    def __init__(self):
        self._marks: dict[str, float] = {}
        self._inside = dict.fromkeys(TIMED_INSIDE, 0.0)

    def start_step(self) -> None:
        self._inside.update(dict.fromkeys(TIMED_INSIDE, 0.0))   # in place: timed() holds it
        self._marks = {"start": time.perf_counter()}

    def mark(self, point: str) -> None:
        """Where a part of the step ends: "scheduled", "forwarded", "sampled"."""
        self._marks[point] = time.perf_counter()

    def timed(self, phase: str, fn: Callable) -> Callable:
        """fn, its seconds added to phase (one of TIMED_INSIDE) at every call."""
        inside = self._inside

        def timed_fn(*args):
            start = time.perf_counter()
            out = fn(*args)
            inside[phase] += time.perf_counter() - start
            return out
        return timed_fn

    def end_step(self) -> dict[str, float]:
        m, end = self._marks, time.perf_counter()
        matmul, attention = self._inside["matmul"], self._inside["attention"]
        return {"matmul": matmul, "attention": attention,
                "forward_other": m["forwarded"] - m["scheduled"] - matmul - attention,
                "sampling": m["sampled"] - m["forwarded"],
                "scheduling": (m["scheduled"] - m["start"]) + (end - m["sampled"])}


class NoProfiler:
    """What an engine without a profiler calls: nothing is timed, no phases are recorded."""

    def start_step(self) -> None:
        pass

    def mark(self, point: str) -> None:
        pass

    def timed(self, phase: str, fn: Callable) -> Callable:
        return fn              # untimed: the forward calls fn itself, at no cost

    def end_step(self) -> dict[str, float]:
        return {}
