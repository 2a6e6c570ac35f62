"""The linear layers' products, faster than their torch reference F.linear: two packed ways, and
the one that is faster on this machine.

    matmul.c        mini_engine's own product for a step's few rows (bfloat16 on CPUs with
                    AVX512_BF16; its header says how it is laid out)
    oneDNN packed   each weight reordered once into oneDNN's blocked layout, then multiplied by
                    oneDNN directly, as inductor does for a frozen linear layer and vLLM's CPU
                    backend through its own binding

Neither wins everywhere: at one row matmul.c was the faster on both machine kinds the lab runs on;
at a batch of 16 and at a prefill's rows oneDNN was on an AMX Xeon, matmul.c on an AVX-512 EPYC;
F.linear was slower than the better of the two everywhere (benchmarks/linear_ways.py,
docs/measurements.md). So for_model times both on the model's own weights at the engine's batch
sizes, keeps the faster and drops the other: one packed copy of the weights, one product a step.

oneDNN's packed linear is reached through torch's private ops (torch.ops.mkldnn, the leading
underscore: no promise they keep their signature), so it is checked against F.linear first, and
where it is missing or refuses a dtype it is no candidate.
"""
from __future__ import annotations

import ctypes
import functools
import time
import weakref
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from mini_engine.kernels import build


# --- matmul.c -------------------------------------------------------------------------------
@functools.cache
def _library() -> ctypes.CDLL | None:
    loaded = build.library("matmul.c")
    if loaded is None or not loaded.matmul_bf16_supported():
        return None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    loaded.matmul_bf16.argtypes = [p, i64, i64, p, i64, p]
    loaded.matmul_bf16.restype = None
    return loaded


def c_pack(weight: torch.Tensor) -> tuple[torch.Tensor, int]:
    """W (N, K) in matmul.c's layout: blocks of 16 output columns, each K/2 steps of 16 x 2
    values (W[n, k], W[n, k + 1]); K padded to even and N to a multiple of 16 with zeros."""
    n, k = weight.shape
    w = F.pad(weight, (0, k % 2, 0, -n % 16))
    blocks, half = w.shape[0] // 16, w.shape[1] // 2
    return w.reshape(blocks, 16, half, 2).transpose(1, 2).contiguous(), n


def c_matmul(x: torch.Tensor, packed: tuple[torch.Tensor, int]) -> torch.Tensor:
    """x (M, K) bfloat16 @ W.T -> (M, N), W packed by c_pack."""
    blocks, n = packed
    if x.dtype != torch.bfloat16:
        raise TypeError(f"matmul.c multiplies bfloat16 only, not {x.dtype}")
    if x.shape[1] % 2:
        x = F.pad(x, (0, 1))              # the packed weight's padding column is zero
    x = x.contiguous()
    if x.shape[1] != 2 * blocks.shape[1]:
        raise ValueError(f"x has {x.shape[1]} features, the weight {2 * blocks.shape[1]}")
    y = x.new_empty(x.shape[0], n)
    _library().matmul_bf16(x.data_ptr(), x.shape[0], x.shape[1], blocks.data_ptr(), n,
                           y.data_ptr())
    return y


# --- oneDNN's packed linear -------------------------------------------------------------------
def onednn_pack(weight: torch.Tensor) -> torch.Tensor:
    # the batch hint only tunes the layout; the packed weight serves any number of rows
    return torch.ops.mkldnn._reorder_linear_weight(weight, 16)


def onednn_matmul(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [None], "")


@dataclass(frozen=True)
class Way:
    name: str
    pack: Callable
    matmul: Callable
    runs_here: Callable          # dtype -> whether this machine has what the way needs


WAYS = (Way("matmul.c", c_pack, c_matmul,
            lambda dtype: dtype == torch.bfloat16 and _library() is not None),
        Way("oneDNN packed", onednn_pack, onednn_matmul,
            lambda dtype: torch.backends.mkldnn.is_available()))


def works(way: Way, dtype: torch.dtype) -> bool:
    """This way runs here, takes this dtype, and matches F.linear on a small product."""
    if not way.runs_here(dtype):
        return False
    try:
        w, x = torch.randn(40, 18).to(dtype), torch.randn(7, 18).to(dtype)
        y = way.matmul(x, way.pack(w))
        return torch.allclose(y.float(), F.linear(x.float(), w.float()), rtol=2e-2, atol=2e-2)
    except (AttributeError, RuntimeError, NotImplementedError, TypeError):
        return False           # missing from this torch, renamed, or this dtype refused


# --- the choice, once a model ------------------------------------------------------------------
@dataclass
class Products:
    """The product an engine hands its forward, linear(x, weight), and what chose it."""
    name: str                                 # the way kept, or "F.linear" where none works
    linear: Callable                          # (x, weight) -> x @ weight.T
    ms: dict[str, dict[int, float]]           # way -> batch size -> ms of a pass over the model


def pass_ms(run: Callable, weights: list[torch.Tensor], rows: int, dtype: torch.dtype) -> float:
    """ms of one pass over every product of the model in forward order, the best of three after
    a warm-up pass: the weights stream through the caches as in a step."""
    xs = [torch.randn(rows, w.shape[1]).to(dtype) for w in weights]
    best = float("inf")
    for i in range(4):
        start = time.perf_counter()
        for x, w in zip(xs, weights):
            run(x, w)
        if i:
            best = min(best, time.perf_counter() - start)
    return 1e3 * best


def product(way: Way, packed: dict[int, object]) -> Callable:
    """linear(x, weight) through way, over the weights packed by data pointer."""
    return lambda x, weight: way.matmul(x, packed[weight.data_ptr()])


_CHOSEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def for_model(model, batch_sizes: tuple[int, ...]) -> Products:
    """Each way that works here timed on the model's weights at these batch sizes (the engine's
    1 and its cap), F.linear beside them; the fastest summed is kept (packed, where it is a
    packed way). Made once a model: engines that share a model share its packed weights."""
    if model in _CHOSEN:
        return _CHOSEN[model]
    weights = model.linear_weights()
    ms = {"F.linear": {b: pass_ms(F.linear, weights, b, model.dtype) for b in batch_sizes}}
    best = None
    with torch.inference_mode():
        for way in (w for w in WAYS if works(w, model.dtype)):
            run = product(way, {w.data_ptr(): way.pack(w) for w in weights})
            ms[way.name] = {b: pass_ms(run, weights, b, model.dtype) for b in batch_sizes}
            # the faster so far is kept; the other's packed weights go with its run
            if best is None or sum(ms[way.name].values()) < sum(ms[best[0].name].values()):
                best = (way, run)
    if best is None or sum(ms["F.linear"].values()) <= sum(ms[best[0].name].values()):
        products = Products("F.linear", F.linear, ms)
    else:
        products = Products(best[0].name, best[1], ms)
    _CHOSEN[model] = products
    return products
