"""The linear layers' matmuls: how to hand them to this CPU's matmul library, measured, not assumed.

The same product, x (T, in) @ W.T, can be handed to torch in several ways, and which is fastest
depends on the CPU (its vector units, its cache sizes), the dtype and the shape: W @ x.T has
beaten F.linear on one EPYC and lost to it on another (docs/measurements.md). A choice
measured on one machine is a guess on the next, so nothing is carried over and nothing is
assumed: Llama.choose_kernels, an explicit warm-up the caller asks for (it costs time), runs every
candidate on the model's own weights at the batch sizes the engine will run (1 and its cap) and
keeps the fastest for each kind of layer. Until then every layer runs F.linear.

    F.linear        x @ W.T through torch's default path
    W @ x.T         the same product transposed: the library sees the long side (out) as M
    oneDNN packed   the weight reordered once into oneDNN's blocked layout, then each product
                    through oneDNN directly: private torch ops, see _packed_weight below

Fusion is measured the same way: q, k and v as one weight (vLLM's QKVParallelLinear) or three
products, gate and up as one (MergedColumnParallelLinear) or two.

Each candidate is timed inside a pass over all the model's layers in forward order (q/k/v, o,
gate/up, down of each decoder layer, then the LM head), each layer's product timed on its own: the
weights then stream through the caches as in a real step. Timing one kind's layers back to back
alone, as this file once did, lets a kind whose weights fit the last-level cache run from it,
faster than it ever runs in a step, where the other kinds' weights pass through the cache between
its calls; a kind far larger than the cache times the same either way. How many kinds fit
depends on the CPU's cache, so a ranking made kind by kind is not the step's, and the pass is
what is timed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Kernel:
    name: str
    prepare: Callable          # weight (out, in) -> what run takes, made once when built
    run: Callable              # (x (T, in), prepared) -> (T, out)
    keeps_weight: bool         # prepare returns the weight itself (so it can be built again)


# --- oneDNN's packed linear: private torch ops ------------------------------------------------
# Why: reordering the weight once into oneDNN's blocked layout and calling oneDNN directly is what
# torch's own compiler (Inductor) emits for a frozen linear layer on a CPU, and what vLLM's CPU
# backend does through its own oneDNN binding ("oneDNN linear" in its log). Whether it beats
# F.linear on this CPU is measured at the warm-up like any candidate, not assumed.
# Private: torch.ops.mkldnn._reorder_linear_weight and _linear_pointwise are internal (the leading
# underscore): no documentation, no promise that they keep their signature or exist in the next
# torch release. So they are used only here, checked against F.linear on a small product before
# they become a candidate (available_kernels), and wherever they are missing or refuse a dtype
# the candidate is dropped and the choice is made among the public ones.
def _packed_weight(weight: torch.Tensor, batch_hint: int = 16) -> torch.Tensor:
    # the hint only tunes the layout; the packed weight serves any number of rows (checked)
    return torch.ops.mkldnn._reorder_linear_weight(weight, batch_hint)


def _packed_run(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [None], "")


def _packed_works(dtype: torch.dtype) -> bool:
    """The private ops exist in this torch, take this dtype, and match F.linear."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        w, x = torch.randn(8, 16).to(dtype), torch.randn(3, 16).to(dtype)
        y = _packed_run(x, _packed_weight(w))
        return torch.allclose(y.float(), F.linear(x, w).float(), rtol=2e-2, atol=2e-2)
    except (AttributeError, RuntimeError, NotImplementedError, TypeError):
        return False           # missing from this torch, renamed, or this dtype refused


KERNELS = {k.name: k for k in (
    Kernel("F.linear", lambda w: w, lambda x, w: F.linear(x, w), keeps_weight=True),
    Kernel("W @ x.T", lambda w: w, lambda x, w: torch.mm(w, x.t()).t().contiguous(),
           keeps_weight=True),
    Kernel("oneDNN packed", _packed_weight, _packed_run, keeps_weight=False),
)}


def available_kernels(dtype: torch.dtype) -> list[Kernel]:
    """The candidates this torch can run here: the public two, and oneDNN's where it works."""
    kernels = [KERNELS["F.linear"], KERNELS["W @ x.T"]]
    if _packed_works(dtype):
        kernels.append(KERNELS["oneDNN packed"])
    return kernels


# --- one linear layer ---------------------------------------------------------------------------
class Linear:
    """One linear layer (its weight maybe given in parts, e.g. q, k, v), run by a kernel, fused
    (the parts as one weight) or not (one product per part, concatenated)."""

    def __init__(self, parts: list[torch.Tensor], kernel: Kernel, fused: bool = True):
        self.kernel, self.fused = kernel, fused
        self.sizes = [p.shape[0] for p in parts]       # out features of each part
        weights = [torch.cat(parts)] if fused and len(parts) > 1 else parts
        self.prepared = [kernel.prepare(w.contiguous()) for w in weights]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        outs = [self.kernel.run(x, w) for w in self.prepared]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)

    @property
    def label(self) -> str:
        return self.kernel.name + ("" if self.fused or len(self.prepared) == 1 else ", unfused")

    def parts(self) -> list[torch.Tensor]:
        """The weight in its parts, to build the layer again with another kernel: views of the
        weight this layer runs (no copy), where its kernel keeps the weight as given."""
        if not self.kernel.keeps_weight:
            raise ValueError(f"a {self.label} layer holds its weight in oneDNN's layout only")
        if len(self.prepared) == 1:
            return list(self.prepared[0].split(self.sizes))
        return list(self.prepared)


def build(parts: list[torch.Tensor], label: str) -> Linear:
    """The Linear a label names ("oneDNN packed", "F.linear, unfused", ...)."""
    name, _, fusion = label.partition(", ")
    return Linear(parts, KERNELS[name], fused=fusion != "unfused")


# --- the choice ----------------------------------------------------------------------------------
@dataclass
class Choice:
    """What was measured for one kind of layer: seconds of each option (all the model's layers of
    that kind, in forward-order passes, summed over the batch sizes), and the fastest."""
    kind: str
    seconds: dict              # option label -> seconds, all layers of the kind, batch sizes summed
    chosen: str
    chosen_s: dict = field(default_factory=dict)   # batch size -> seconds of the chosen option


def _options(kernels: list[Kernel], num_parts: int) -> list[tuple[Kernel, bool]]:
    return [(k, fused) for k in kernels for fused in ([True, False] if num_parts > 1 else [True])]


def _forward_order(built: dict[str, list[Linear]]) -> list[tuple[str, Linear]]:
    """(kind, layer) in the order a forward runs them: the kinds that repeat in every decoder
    layer, interleaved layer by layer, then the ones that come once (the LM head)."""
    depth = max(len(layers) for layers in built.values())
    repeated = [kind for kind, layers in built.items() if len(layers) == depth]
    order = [(kind, built[kind][i]) for i in range(depth) for kind in repeated]
    return order + [(kind, layer) for kind, layers in built.items() if kind not in repeated
                    for layer in layers]


def _time_passes(order: list[tuple[str, Linear]], inputs: dict[str, torch.Tensor],
                 budget_s: float) -> dict[str, float]:
    """Seconds of each kind's products in one pass over every layer: for each kind the best of at
    least three passes (a noisy neighbour slows a pass, never speeds one up), after a warm-up pass
    (oneDNN builds its kernels on the first)."""
    for kind, layer in order:
        layer(inputs[kind])
    best = {kind: float("inf") for kind, _ in order}
    num_passes, start = 0, time.perf_counter()
    while num_passes < 3 or time.perf_counter() - start < budget_s:
        spent = dict.fromkeys(best, 0.0)
        for kind, layer in order:
            t = time.perf_counter()
            layer(inputs[kind])
            spent[kind] += time.perf_counter() - t
        best = {kind: min(best[kind], spent[kind]) for kind in best}
        num_passes += 1
    return best


def choose(layers: dict[str, list[list[torch.Tensor]]], dtype: torch.dtype,
           batch_sizes: list[int], budget_s: float = 0.03
           ) -> tuple[dict[str, Choice], dict[str, list[Linear]]]:
    """For each kind of layer, the fastest (kernel, fusion) at these batch sizes, and that kind's
    layers built with it. layers: kind -> one list of weight parts per layer.

    The options take turns: pass i runs every kind's i-th option together (a kind with fewer
    options runs its fastest so far), so every option is timed between the other kinds' products,
    in forward order, as a step runs it. budget_s: time of the passes of each turn at each batch
    size (at least three passes)."""
    kernels = available_kernels(dtype)
    options = {kind: _options(kernels, len(per_layer[0])) for kind, per_layer in layers.items()}
    inputs = {b: {kind: torch.randn(b, per_layer[0][0].shape[1]).to(dtype)
                  for kind, per_layer in layers.items()} for b in batch_sizes}
    seconds = {kind: {} for kind in layers}
    at_batch: dict[str, dict[str, dict[int, float]]] = {kind: {} for kind in layers}
    fastest: dict[str, list[Linear]] = {}
    for turn in range(max(len(o) for o in options.values())):
        built = {kind: [Linear(parts, *options[kind][turn]) for parts in per_layer]
                 if turn < len(options[kind]) else fastest[kind]
                 for kind, per_layer in layers.items()}
        timed = {b: _time_passes(_forward_order(built), inputs[b], budget_s) for b in batch_sizes}
        for kind, linears in built.items():
            if turn >= len(options[kind]):
                continue                       # a kind's fastest, run again between the others
            label = linears[0].label
            at_batch[kind][label] = {b: timed[b][kind] for b in batch_sizes}
            seconds[kind][label] = sum(at_batch[kind][label].values())
            if seconds[kind][label] == min(seconds[kind].values()):
                fastest[kind] = linears        # keep the fastest so far, drop the rest
        del built
    choices = {}
    for kind in layers:
        chosen = min(seconds[kind], key=seconds[kind].get)
        choices[kind] = Choice(kind, seconds[kind], chosen, at_batch[kind][chosen])
    return choices, fastest
