"""The forward compiled: torch.compile, with its inductor backend, on the decoder layers of one
step, all 30 of them in one graph. EngineConfig.kernels "compiled" turns it on; the engine
compiles at its warm-up (LLMEngine.warm_up) and never in a step. Its reference is the eager
forward, Llama.forward, with the same kernels.

What is compiled, and what is not. A layer is RMSNorm, the q/k/v product, RoPE, attention, the o
product, the residual add, RMSNorm, gate/up, SiLU x up, down, the residual add. Inductor fuses the
pointwise work (the norms, RoPE, SiLU, the adds) into loops of its own, written in C++, and the
whole stack runs as one call a step, where the eager forward dispatches each of its ~600 small
operations from Python. Two things inside it stay as they are, as custom ops that the graph calls
the way it calls a library's kernel (declared with torch.library, opaque to inductor):
- the linear products, through the engine's product (F.linear, or kernels/linear.py's C over
  its packed weights, which inductor could not take as inputs);
- attention over the paged pool, which writes the pool in place and reads the step's page tables
  and groups (any number of calls, each with its own requests, queries and context length: shapes
  that a graph would have to guard on). It reads them from the step's context, set for the call
  (forward_context), as vLLM's attention op reads its metadata from its forward context.
This is vLLM's own design: its compiled graph calls attention as a custom op
(unified_attention_with_output) that reads the step's metadata from get_forward_context().

Shapes. Only the step's rows T change. torch._dynamo.maybe_mark_dynamic makes T a symbol, and a
step of one row runs as two (torch specializes a size of 1 into a graph of its own), so one graph
serves every step and the warm-up compiles once. Everything else is a constant of the graph
(dynamic=False: with dynamic=True the model's number and shape, ints, would become symbols too,
and they must stay constants, the ops' arguments and the graph's sizes). The weights are not graph inputs: a linear op
names its model, layer and kind by number, and the norms' weights are arguments, so a second
engine on the same model runs the same graph. vLLM on a CPU also compiles once with the token
dimension dynamic; on a GPU it then captures CUDA graphs at fixed batch sizes and pads a step up
to the next size; the padding of one row to two here is the same idea at its smallest.

The warm-up (LLMEngine.warm_up) runs a forward at T = 1 and T = 2 into the engine's scratch page,
so the graph exists before the first step. From then on every call runs under torch's
"fail_on_recompile" stance: a shape the warm-up missed is an error, not a compile in the middle of
a run.

What changes in the numbers. The products are the same calls. The fused loops may add and round
in another order than torch's own kernels, so the logits may differ in their last bits. The tests
hold the tokens to the eager engine's (tests/engine/test_compiled.py).

Needs: torch.compile enabled in this process (TORCHDYNAMO_DISABLE unset; the lab sets it only in
the processes that run vLLM) and a C++ compiler for inductor.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import os
import shutil
import time
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
import torch._dynamo
import torch.nn.functional as F

from mini_engine.model import Batch, DecoderLayer, Linear, Llama
from mini_engine.profiler import NoProfiler

if TYPE_CHECKING:
    from mini_engine.profiler import StepProfiler

# --- what the compiled graph calls: the model's own kernels and attention ---------------------
# The models the graphs run, by number (a number, not the model, goes into a graph), and the
# step's context: its batch, profiler and product, set around each call of the graph.
_MODELS: weakref.WeakValueDictionary[int, Llama] = weakref.WeakValueDictionary()
_STEP = {"batch": None, "profiler": NoProfiler(), "linear": F.linear}


_NUMBERS = itertools.count()


def model_number(model: Llama) -> int:
    """The model's number in _MODELS, given once and never again: a graph is made for a model's
    number (compiled_layers), so a number freed with its model must not name another model."""
    for number, known in _MODELS.items():
        if known is model:
            return number
    number = next(_NUMBERS)
    _MODELS[number] = model
    return number


@contextlib.contextmanager
def forward_context(batch: Batch, profiler: StepProfiler | NoProfiler, linear: Linear):
    _STEP.update(batch=batch, profiler=profiler, linear=linear)
    try:
        yield
    finally:
        _STEP.update(batch=None, profiler=NoProfiler(), linear=F.linear)


# The two ops are declared by their schema (torch.library.Library), not with
# torch.library.custom_op: a custom_op checks at every call that its output aliases none of its
# inputs, which nearly doubles a call's cost from a compiled graph, and a step makes 150 calls
# (docs/measurements.md). The schema says what that check guarded: pool is written in place
# ("Tensor(a!)"), the outputs are new tensors.
_LIBRARY = torch.library.Library("mini_engine", "DEF")
_LIBRARY.define("linear(Tensor x, int model, int layer, int kind) -> Tensor")
_LIBRARY.define("paged_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) pool, int model) "
                "-> Tensor")


def linear_op(x: torch.Tensor, model: int, layer: int, kind: int) -> torch.Tensor:
    """x times layer `layer`'s weight of kind DecoderLayer.LINEARS[kind], by the step's product."""
    weight = getattr(_MODELS[model].layers[layer], DecoderLayer.LINEARS[kind])
    return _STEP["profiler"].timed("matmul", _STEP["linear"])(x, weight)


def attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pool: torch.Tensor,
                 model: int) -> torch.Tensor:
    """Llama.attention on the step's batch (forward_context): writes k and v into the pool."""
    m, batch = _MODELS[model], _STEP["batch"]
    n = batch.num_rows            # q has one row more where the step had one (CompiledForward)
    out = _STEP["profiler"].timed("attention", m.attention)(q[:n], k[:n], v[:n], batch, pool)
    return out if n == q.shape[0] else torch.cat([out, out.new_zeros(q.shape[0] - n, out.shape[1])])


_LIBRARY.impl("linear", linear_op, "CPU")
_LIBRARY.impl("paged_attention", attention_op, "CPU")


@torch.library.register_fake("mini_engine::linear", lib=_LIBRARY)
def _(x, model, layer, kind):
    weight = getattr(_MODELS[model].layers[layer], DecoderLayer.LINEARS[kind])
    return x.new_empty(x.shape[0], weight.shape[0])


@torch.library.register_fake("mini_engine::paged_attention", lib=_LIBRARY)
def _(q, k, v, pool, model):
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])


QKV, O, GATE_UP, DOWN = range(4)      # DecoderLayer.LINEARS, by number


def decoder_layers(x, cos, sin_signed, kv_cache: list, norms: list, model: int, eps: float,
                   heads: int, kv_heads: int):
    """Every decoder layer over x (T, C), as Llama.forward computes them; norms: each layer's
    input and post-attention RMSNorm weights, in turn."""
    linear, attention = torch.ops.mini_engine.linear, torch.ops.mini_engine.paged_attention
    for i, pool in enumerate(kv_cache):
        h = F.rms_norm(x, (x.shape[-1],), norms[2 * i], eps)
        qkv = linear(h, model, i, QKV).unflatten(-1, (heads + 2 * kv_heads, -1))
        qk = Llama.rope(qkv[:, :heads + kv_heads], cos, sin_signed)
        attn = attention(qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads:], pool, model)
        x = x + linear(attn, model, i, O)
        h = F.rms_norm(x, (x.shape[-1],), norms[2 * i + 1], eps)
        gate, up = linear(h, model, i, GATE_UP).chunk(2, dim=-1)
        x = x + linear(F.silu(gate) * up, model, i, DOWN)                         # SwiGLU
    return x


# Graphs torch may keep for decoder_layers, all models of the process together: 1 a model, 2
# where an engine's page size is 1 (a dimension of 1 is specialized too). Past it,
# torch would run the function eager with a warning; here it is an error instead (forward).
RECOMPILE_LIMIT = 32


@functools.cache
def compiled_layers(model: int, eps: float, heads: int, kv_heads: int) -> Callable:
    """decoder_layers of one model compiled, made once per process (torch keeps its graphs with
    the function). The model's number and shape are constants of the graph, closed over; the
    rows T are marked dynamic at each call (CompiledForward.forward). Made on first use, once
    why_not_compiled has found nothing against it: torch.compile reads TORCHDYNAMO_DISABLE when
    it is called, and with it set returns the function as it was."""
    why = why_not_compiled()
    if why:              # checked again: a refusal must not be cached as an uncompiled function
        raise RuntimeError(f"kernels 'compiled': {why}")

    def layers(x, cos, sin_signed, kv_cache, norms):
        return decoder_layers(x, cos, sin_signed, kv_cache, norms, model, eps, heads, kv_heads)
    return torch.compile(layers, dynamic=False, recompile_limit=RECOMPILE_LIMIT)


def num_graphs() -> int:
    """Graphs torch.compile has made in this process so far (torch._dynamo's own count)."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"]


def why_not_compiled() -> str | None:
    """None where torch.compile can run here; else one line saying why not."""
    if os.environ.get("TORCHDYNAMO_DISABLE") == "1":
        return ("torch.compile is off in this process (TORCHDYNAMO_DISABLE=1; the lab sets it "
                "only where vLLM runs)")
    if not any(shutil.which(cc) for cc in ("g++", "c++", "clang++")):
        return "no C++ compiler (g++) on this machine: inductor writes its kernels in C++"
    return None


@dataclass
class WarmUp:
    """What the warm-up cost: seconds of its forwards (compiling included) and the graphs made."""
    seconds: float
    graphs: int


class CompiledForward:
    """Llama.forward with its decoder layers compiled into one graph (decoder_layers). The
    embedding, the final norm and the LM head, over the rows whose logits are wanted, run as in
    the eager forward."""

    def __init__(self, model: Llama):
        why = why_not_compiled()
        if why:
            raise RuntimeError(f"kernels 'compiled': {why}")
        self.model, self.number = model, model_number(model)
        self.norms = [w for layer in model.layers for w in (layer.input_norm, layer.post_norm)]
        self.warm = False

    def forward(self, batch: Batch, kv_cache: list[torch.Tensor],
                profiler: StepProfiler | None = None, linear: Linear = F.linear) -> torch.Tensor:
        """Logits (S, V), as Llama.forward, once warmed up: no call compiles, a graph it would
        need is an error (torch's fail_on_recompile). A profiler times the products and the
        attention inside the graph (the custom ops time themselves); the rest of the graph, the
        fused pointwise work, is the rest of the forward."""
        if not self.warm:
            raise RuntimeError("kernels 'compiled': call engine.warm_up() before the first step "
                               "(a step never compiles)")
        with torch.compiler.set_stance("fail_on_recompile"):
            return self._forward(batch, kv_cache, profiler, linear)

    def _forward(self, batch: Batch, kv_cache: list[torch.Tensor],
                 profiler: StepProfiler | None, linear: Linear) -> torch.Tensor:
        m, profiler = self.model, profiler or NoProfiler()
        # a step of one row runs as two (the second a copy, its attention and K/V left out), so
        # that one graph, compiled for T >= 2, serves every step: torch would specialize T = 1
        copies = 1 if batch.num_rows > 1 else 2
        x, cos, sin = m.embed_rows(batch.input_ids.repeat(copies), batch.positions.repeat(copies))
        with (torch._dynamo.config.patch(fail_on_recompile_limit_hit=True),
              forward_context(batch, profiler, linear)):
            layers = compiled_layers(self.number, m.eps, m.num_heads, m.num_kv_heads)
            for t in (x, cos, sin):
                torch._dynamo.maybe_mark_dynamic(t, 0)          # the rows T
            for pool in kv_cache:                               # pages and page size: the
                torch._dynamo.maybe_mark_dynamic(pool, 0)       # engine's, not the graph's
                torch._dynamo.maybe_mark_dynamic(pool, 1)
            x = layers(x, cos, sin, kv_cache, self.norms)
        return m.logits(x, batch.logit_rows, profiler.timed("matmul", linear))

    def warm_up(self, batches: list[Batch], kv_cache: list[torch.Tensor],
                linear: Linear = F.linear) -> WarmUp:
        """Run these batches (the engine's: rows that write only its scratch page), compiling
        what they need; from then on nothing compiles."""
        graphs, start = num_graphs(), time.perf_counter()
        for batch in batches:
            self._forward(batch, kv_cache, None, linear)
        self.warm = True
        return WarmUp(time.perf_counter() - start, num_graphs() - graphs)
