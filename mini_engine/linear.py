"""The linear layers' matmuls: how to hand them to this CPU's matmul library, measured at load.

The same product, x (T, in) @ W.T, can be handed to torch in several ways, and which is fastest
depends on the CPU, the dtype and the shape. On a 2-core AVX2 EPYC (fp32), (W @ x.T) ran SmolLM's
layers at 16 rows in 88 ms a step against F.linear's 170; on a 2-core AVX-512/bf16 EPYC it was the
slower of the two (24.5 vs 20.2 ms, 2026-12-01). A choice measured on one machine is a guess on
the next, so nothing is carried over: when the model loads, every candidate runs on the model's
own weight shapes at the batch sizes the engine will run (1 and its cap), and the fastest is kept
for each kind of layer, timed over all the model's layers of that kind as a forward runs them.
About two seconds on SmolLM-135M.

    F.linear        x @ W.T through torch's default path
    W @ x.T         the same product transposed: the library sees the long side (out) as M
    oneDNN packed   the weight reordered once into oneDNN's blocked layout
                    (torch.ops.mkldnn._reorder_linear_weight), then each product through
                    torch.ops.mkldnn._linear_pointwise. This is what torch's own compiler
                    (Inductor) emits for a frozen linear layer on a CPU, and what vLLM's CPU
                    backend does through its own oneDNN binding ("oneDNN linear" in its log).

Fusion is measured the same way: q, k and v as one weight (vLLM's QKVParallelLinear) or three
products concatenated, gate and up as one (MergedColumnParallelLinear) or two.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Kernel:
    name: str
    prepare: Callable          # weight (out, in) -> what run takes, made once at load
    run: Callable              # (x (T, in), prepared) -> (T, out)


def _packed_weight(weight: torch.Tensor, batch_hint: int = 16) -> torch.Tensor:
    # the hint only tunes the layout; the packed weight serves any number of rows (checked)
    return torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)


def _packed_run(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [None], "")


KERNELS = {k.name: k for k in (
    Kernel("F.linear", lambda w: w, lambda x, w: F.linear(x, w)),
    Kernel("W @ x.T", lambda w: w, lambda x, w: torch.mm(w, x.t()).t().contiguous()),
    Kernel("oneDNN packed", _packed_weight, _packed_run),
)}


class Linear:
    """One linear layer (its weight maybe given in parts, e.g. q, k, v), run by a chosen kernel,
    fused (the parts as one weight) or not (one product per part, concatenated)."""

    def __init__(self, parts: list[torch.Tensor], kernel: Kernel, fused: bool = True):
        self.kernel, self.fused = kernel, fused
        weights = [torch.cat(parts)] if fused else parts
        self.prepared = [kernel.prepare(w.contiguous()) for w in weights]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        outs = [self.kernel.run(x, w) for w in self.prepared]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    @property
    def label(self) -> str:
        return self.kernel.name + ("" if self.fused or len(self.prepared) == 1 else ", unfused")


@dataclass
class Choice:
    """What was measured for one kind of layer: seconds of each option (all the model's layers of
    that kind, summed over the batch sizes), and the fastest."""
    kind: str
    seconds: dict              # option label -> seconds, all layers of the kind, batch sizes summed
    chosen: str


def available_kernels(dtype: torch.dtype) -> list[Kernel]:
    """The candidates this torch can run here: oneDNN only where torch was built with it and the
    packed product matches F.linear on a small check."""
    kernels = [KERNELS["F.linear"], KERNELS["W @ x.T"]]
    try:
        w, x = torch.randn(8, 16).to(dtype), torch.randn(3, 16).to(dtype)
        y = _packed_run(x, _packed_weight(w))
        if torch.allclose(y.float(), F.linear(x, w).float(), rtol=2e-2, atol=2e-2):
            kernels.append(KERNELS["oneDNN packed"])
    except (RuntimeError, AttributeError):   # torch without oneDNN, or a dtype it cannot pack
        pass
    return kernels


def _time_call(fn: Callable, budget_s: float) -> float:
    """Seconds per call: the best of three short rounds (a noisy neighbour slows a round, never
    speeds one up), after a warm-up call (oneDNN builds its kernel on the first)."""
    fn()
    best = float("inf")
    for _ in range(3):
        calls, start = 0, time.perf_counter()
        while calls == 0 or time.perf_counter() - start < budget_s / 3:
            fn()
            calls += 1
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def choose(layers: dict[str, list[list[torch.Tensor]]], dtype: torch.dtype,
           batch_sizes: list[int], budget_s: float = 0.03
           ) -> tuple[dict[str, Choice], dict[str, list[Linear]]]:
    """For each kind of layer, the fastest (kernel, fusion) at these batch sizes, and that kind's
    layers built with it. layers: kind -> one list of weight parts per layer. A call runs the
    input through every layer of the kind, as a forward does: their weights do not fit the
    CPU's cache, so they are read from memory as in a real step, not timed warm in the cache.
    budget_s: time spent on each option at each batch size."""
    kernels = available_kernels(dtype)
    choices, built = {}, {}
    for kind, per_layer in layers.items():
        inputs = [torch.randn(b, per_layer[0][0].shape[1]).to(dtype) for b in batch_sizes]
        seconds = {}
        for kernel in kernels:
            for fused in ([True, False] if len(per_layer[0]) > 1 else [True]):
                linears = [Linear(parts, kernel, fused) for parts in per_layer]

                def call(x):
                    for linear in linears:
                        linear(x)

                label = linears[0].label
                seconds[label] = sum(_time_call(lambda: call(x), budget_s) for x in inputs)
                if seconds[label] == min(seconds.values()):
                    built[kind] = linears                # keep the fastest so far, drop the rest
        choices[kind] = Choice(kind, seconds, min(seconds, key=seconds.get))
    return choices, built


def build(parts: list[torch.Tensor], label: str) -> Linear:
    """The Linear a choice's label names ("oneDNN packed", "F.linear, unfused", ...)."""
    name, _, fusion = label.partition(", ")
    return Linear(parts, KERNELS[name], fused=fusion != "unfused")
