"""The forward compiled (task 13): torch.compile, with its inductor backend, on what every decoder
layer does around its attention. EngineConfig.compile_model turns it on; the engine compiles at
its warm-up (LLMEngine.warm_up) and never in a step.

Where the boundary is, and why. A layer is: RMSNorm, the q/k/v product, RoPE | attention | the
o product, the residual add, RMSNorm, gate/up, SiLU x up, down, the residual add. The two sides
of the bar are the same code at every step and in every layer, with one size that changes, the
step's rows T: they are compiled (layer_in, layer_out). Attention is not. Its inputs are the
step's page tables and groups: one or two groups, each with its own requests, queries and context
length (mini_engine/model.py), so a compiled attention would see new shapes in three more
dimensions and a Python list whose length changes, each a guard that can ask for a new graph;
and it is where the paged KV cache is written in place. It runs eager, as it does in the eager
forward, between the two compiled halves. (vLLM draws the same line on a GPU: its compiled graph
is split at every attention, which runs outside the captured pieces.)

Shapes. The weights are arguments of the compiled functions, not constants inside them, so one
graph serves all 30 layers. dynamic=True makes T a symbol: one graph for every T of 2 or more,
and one for T = 1 (torch specializes sizes 0 and 1), so each function has two graphs, four in all
for a model. That is vLLM's choice on a CPU too: one compile with the token dimension dynamic. On
a GPU it then captures CUDA graphs at fixed batch sizes and pads a step up to the next size; a
CPU has no graphs to capture, so nothing is padded here.

The warm-up (LLMEngine.warm_up) runs a forward at T = 1 and T = 2 into the engine's scratch page,
so every graph exists before the first step. From then on every call runs under torch's
"fail_on_recompile" stance: a shape the warm-up missed is an error, not a compile in the middle
of a run. The graphs are kept by torch per process, keyed by the model's shapes and dtype, so a
second engine on a model of the same shapes compiles nothing.

What changes in the numbers. The matmuls are the same calls (inductor hands F.linear to the same
library). The pointwise work, RMSNorm's sum and the adds, is fused into loops inductor writes in
C++, which may add in another order than torch's own kernels: the logits may differ in their last
bits. The tests hold the tokens to the eager engine's (tests/test_compiled.py).

Needs: torch.compile enabled in this process (TORCHDYNAMO_DISABLE unset; the lab sets it for
vLLM only, in the processes that run vLLM) and a C++ compiler for inductor.
"""
from __future__ import annotations

import functools
import os
import shutil
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F

from mini_engine.model import Batch, Llama

if TYPE_CHECKING:
    from mini_engine.profiler import StepProfiler


def layer_in(x, norm, qkv_weight, cos, sin_signed, eps: float, heads: int, kv_heads: int):
    """RMSNorm, the q/k/v product and RoPE of one layer: x (T, C) -> q (T, H, D), k, v (T, KVH,
    D). The same formulas as Llama.forward."""
    h = F.rms_norm(x, (x.shape[-1],), norm, eps)
    qkv = F.linear(h, qkv_weight).unflatten(-1, (heads + 2 * kv_heads, -1))
    qk = Llama.rope(qkv[:, :heads + kv_heads], cos, sin_signed)
    return qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads:]


def layer_out(x, attn, o_weight, post_norm, gate_up_weight, down_weight, eps: float):
    """The rest of the layer after attention: x (T, C) and attention's output (T, H*D) -> x."""
    x = x + F.linear(attn, o_weight)
    h = F.rms_norm(x, (x.shape[-1],), post_norm, eps)
    gate, up = F.linear(h, gate_up_weight).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, down_weight)                          # SwiGLU


@functools.cache
def compiled_halves() -> tuple[Callable, Callable]:
    """layer_in and layer_out compiled, once per process (torch keeps the graphs with them): every
    CompiledForward shares them, whatever engine or model of the same shapes it runs. Made on
    first use, once why_not_compiled has found nothing against it: torch.compile reads
    TORCHDYNAMO_DISABLE when it is called, and with it set returns the function as it was."""
    return torch.compile(layer_in, dynamic=True), torch.compile(layer_out, dynamic=True)


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


@dataclass(frozen=True)
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@dataclass
class WarmUp:
    """What the warm-up cost: seconds of its forwards (compiling included) and the graphs made."""
    seconds: float
    graphs: int


class CompiledForward:
    """Llama.forward with each layer's two halves around attention compiled (layer_in,
    layer_out). The model's weights are read, not copied, where its linear layers keep them as
    one tensor each (the F.linear kernel, fused q/k/v and gate/up: how Llama loads them);
    choose_kernels' oneDNN layout cannot be handed to torch.compile, so a model whose kernels
    were chosen is refused: the compiled forward is the other answer to the same question."""

    def __init__(self, model: Llama):
        why = why_not_compiled()
        if why:
            raise RuntimeError(f"compile_model: {why}")
        if model.linear_choices:
            raise ValueError("compile_model: this model's linear kernels were chosen "
                             "(choose_kernels); load it again without choosing to compile it")
        self.model = model
        self.layers = [LayerWeights(layer.input_norm, layer.qkv.weight(), layer.o.weight(),
                                    layer.post_norm, layer.gate_up.weight(), layer.down.weight())
                       for layer in model.layers]
        self.warm = False

    def forward(self, batch: Batch, kv_cache: list[torch.Tensor],
                profiler: StepProfiler | None = None) -> torch.Tensor:
        """Logits (S, V), as Llama.forward. After the warm-up no call compiles: a graph it would
        need is an error (torch's fail_on_recompile). A profiler times the attention; the
        compiled halves, matmuls inside, count as the rest of the forward."""
        stance = "fail_on_recompile" if self.warm else "default"
        with torch.compiler.set_stance(stance):
            return self._forward(batch, kv_cache, profiler)

    def _forward(self, batch: Batch, kv_cache: list[torch.Tensor],
                 profiler: StepProfiler | None) -> torch.Tensor:
        m = self.model
        attention = m.attention if profiler is None else profiler.timed("attention", m.attention)
        first, then = compiled_halves()
        x = m.embed[batch.input_ids]                                                  # (T, C)
        cos = m.cos[batch.positions][:, None]
        sin = m.sin_signed[batch.positions][:, None]
        for w, pool in zip(self.layers, kv_cache, strict=True):
            q, k, v = first(x, w.input_norm, w.qkv, cos, sin, m.eps, m.num_heads,
                            m.num_kv_heads)
            x = then(x, attention(q, k, v, batch, pool), w.o, w.post_norm, w.gate_up, w.down,
                     m.eps)
        if not len(batch.logit_rows):
            return torch.empty(0, m.shape.vocab_size)
        x = m.rms_norm(x[batch.logit_rows], m.final_norm)
        return m.lm_head(x).float()

    def warm_up(self, batches: list[Batch], kv_cache: list[torch.Tensor]) -> WarmUp:
        """Run these batches (the engine's: rows that write only its scratch page), compiling
        what they need; from then on nothing compiles."""
        graphs, start = num_graphs(), time.perf_counter()
        for batch in batches:
            self.forward(batch, kv_cache)
        self.warm = True
        return WarmUp(time.perf_counter() - start, num_graphs() - graphs)
