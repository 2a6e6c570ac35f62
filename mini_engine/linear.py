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
    mini_engine C   the weight packed once for matmul.c, a kernel for a decode step's few rows
                    (bfloat16 on a CPU with AVX512_BF16 only)

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

import ctypes
import functools
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from mini_engine import native


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


# --- mini_engine's own product for a step's few rows: matmul.c --------------------------------
# Why: at 1 to 16 rows a product's floor is reading its weight once, and oneDNN, built for many
# rows as well, read it at about half the memory's speed on an AMD EPYC with AVX-512 (matmul.c
# says how this one is laid out; docs/measurements.md has the figures). bfloat16 only, on CPUs
# with AVX512_BF16 (its vdpbf16ps is the kernel's one multiply); elsewhere it is no candidate.
class MatmulPacked(NamedTuple):
    packed: torch.Tensor       # (ceil(N / 16), K / 2, 16, 2) bfloat16, the columns past N zero
    out_features: int          # N


@functools.cache
def _matmul_c() -> ctypes.CDLL | None:
    """matmul.c built for this machine, or None: no compiler, or no AVX512_BF16 here."""
    loaded = native.library("matmul.c")
    if loaded is None or not loaded.matmul_bf16_supported():
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    loaded.matmul_bf16.argtypes = [p, i64, i64, p, i64, p]
    loaded.matmul_bf16.restype = None
    return loaded


def _matmul_pack(weight: torch.Tensor) -> MatmulPacked:
    """W (N, K) in matmul.c's layout: blocks of 16 output columns, each K/2 steps of 16 x 2
    values (W[n, k], W[n, k + 1]); K padded to even and N to a multiple of 16 with zeros."""
    n, k = weight.shape
    w = F.pad(weight, (0, k % 2, 0, -n % 16))
    blocks, half = w.shape[0] // 16, w.shape[1] // 2
    return MatmulPacked(w.reshape(blocks, 16, half, 2).transpose(1, 2).contiguous(), n)


def _matmul_run(x: torch.Tensor, weight: MatmulPacked) -> torch.Tensor:
    packed, n = weight
    rows, k = x.shape
    if x.dtype != torch.bfloat16:
        raise TypeError(f"mini_engine C multiplies bfloat16 only, not {x.dtype}")
    if k % 2:
        x = F.pad(x, (0, 1))              # the packed weight's padding column is zero
    x = x.contiguous()
    if x.shape[1] != 2 * packed.shape[1]:
        raise ValueError(f"x has {k} features, the weight {2 * packed.shape[1]}")
    y = x.new_empty(rows, n)
    _matmul_c().matmul_bf16(x.data_ptr(), rows, x.shape[1], packed.data_ptr(), n, y.data_ptr())
    return y


def _matmul_works(dtype: torch.dtype) -> bool:
    """matmul.c is built, this CPU has its instruction, and it matches F.linear."""
    if dtype != torch.bfloat16 or _matmul_c() is None:
        return False
    w, x = torch.randn(40, 18).to(dtype), torch.randn(7, 18).to(dtype)
    y = _matmul_run(x, _matmul_pack(w))
    return torch.allclose(y.float(), F.linear(x.float(), w.float()), rtol=2e-2, atol=2e-2)


KERNELS = {k.name: k for k in (
    Kernel("F.linear", lambda w: w, lambda x, w: F.linear(x, w), keeps_weight=True),
    Kernel("W @ x.T", lambda w: w, lambda x, w: torch.mm(w, x.t()).t().contiguous(),
           keeps_weight=True),
    Kernel("oneDNN packed", _packed_weight, _packed_run, keeps_weight=False),
    Kernel("mini_engine C", _matmul_pack, _matmul_run, keeps_weight=False),
)}


def available_kernels(dtype: torch.dtype) -> list[Kernel]:
    """The candidates this machine can run: the public two, oneDNN's where it works, and
    matmul.c's in bfloat16 where the CPU has AVX512_BF16."""
    kernels = [KERNELS["F.linear"], KERNELS["W @ x.T"]]
    if _packed_works(dtype):
        kernels.append(KERNELS["oneDNN packed"])
    if _matmul_works(dtype):
        kernels.append(KERNELS["mini_engine C"])
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
