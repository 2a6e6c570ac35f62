"""The machine's figures, which the summary's roofline (lessons/summary/roofline.py) and task 9's
part 3 (lessons/task_9/profile.py, tasks 9 and 13) both read: what one decode step of the model
costs (ModelCost, from its config.json), this machine's ceilings (its memory read bandwidth and
peak matmul throughput), and the model's kernel floor; measured once a run, by the first step
that needs them, and saved in results/machine.json (machine_figures, the one loader).

The bandwidth is measured the way STREAM measures it (a large array, far beyond the caches, read
in a loop), the peak compute with a square matmul: the best of a few passes each, as a ceiling
is what the machine can do (common/measure.py says why).

The kernel floor: the model's own linear layers (the weight shapes of its config.json),
multiplied alone with this machine's matmul library, same dtype and threads as the engine.
Skinny products (1 or 20 rows against 576-wide weights) run far below the square-matmul peak, so
the floor can lie well above the ceiling: the gap between the two is the matmul library on these
shapes, the gap above the floor is everything else an engine does per step.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from common import measure, results, shape
from common.shape import DTYPE_BYTES, ModelShape


@dataclass(frozen=True)
class ModelCost:
    """What one decode step costs per token, derived from the model config."""
    num_params: int              # every parameter (the embedding counted once when tied)
    matmul_params: int           # weights multiplied per token: all linear layers + the LM head
    weight_bytes: int            # weights read per step: matmul weights + norms + 1 embedding row
    kv_bytes_per_context_token: int
    attention_flops_per_context_token: int
    dtype: str
    dtype_bytes: int

    def bytes_per_token(self, context: int) -> int:
        """Bytes one request reads per step at this context: weights + its KV cache."""
        return self.weight_bytes + context * self.kv_bytes_per_context_token

    def flops_per_token(self, context: int) -> int:
        """2 per multiplied weight, plus attention (QK^T and AV) over the context."""
        return 2 * self.matmul_params + context * self.attention_flops_per_context_token


def model_cost(config: dict, dtype: str, dtype_bytes: int | None = None) -> ModelCost:
    """Counted from a Llama-style config.json (SmolLM: 30 layers, hidden 576, 9 heads of 64,
    3 KV heads, MLP 1536, vocab 49152, tied embeddings: 134,515,008 parameters)."""
    dtype_bytes = dtype_bytes or DTYPE_BYTES[dtype]   # the one dtype map (common.shape)
    m = ModelShape.from_config(config)
    h, layers, heads, kv_heads, head_dim, mlp, vocab = (m.hidden_size, m.num_layers, m.num_heads,
                                                        m.num_kv_heads, m.head_dim,
                                                        m.intermediate_size, m.vocab_size)
    tied = m.tie_word_embeddings
    # q and o: h x heads*head_dim each; k and v: h x kv_heads*head_dim each; gate, up, down: h x mlp
    linear = 2 * h * heads * head_dim + 2 * h * kv_heads * head_dim + 3 * h * mlp
    norms = 2 * h                       # input and post-attention RMSNorm
    embedding = vocab * h
    num_params = layers * (linear + norms) + h + embedding + (0 if tied else embedding)
    matmul = layers * linear + embedding   # the LM head multiplies vocab x h, tied or not
    weight_bytes = (matmul + layers * norms + h + h) * dtype_bytes   # + final norm + 1 embedding row
    return ModelCost(num_params=num_params, matmul_params=matmul, weight_bytes=weight_bytes,
                     kv_bytes_per_context_token=2 * layers * kv_heads * head_dim * dtype_bytes,
                     attention_flops_per_context_token=4 * layers * heads * head_dim,
                     dtype=dtype, dtype_bytes=dtype_bytes)


@dataclass
class Machine(results.Record):
    bandwidth_bytes_s: float                  # memory read bandwidth: the best pass
    flops_s: dict[str, float]                 # dtype -> matmul FLOP/s
    threads: int
    matmul_n: dict[str, int] | None = None    # dtype -> n of the n x n products measured
    bandwidth_passes: measure.Spread | None = None   # every pass of it, bytes/s


# --- measuring this machine (a few seconds) ---------------------------------------------------
BANDWIDTH_MIB = 256     # far larger than any CPU cache, so the reads come from memory
BANDWIDTH_REPEATS = 5   # the bandwidth is the best of this many sums
MATMUL_MAX_N = 1024     # 1024 x 1024 x 1024: 2.1 GFLOP per product
MATMUL_TARGET_S = 0.1   # a product takes about this long, even where bf16 is slow (no native bf16)


def _matmul_flops(torch, dtype) -> tuple[float, int]:
    """(FLOP/s, n) of n x n products: n = 1024, or smaller where one would take over 0.1 s
    (bf16 without native support runs at ~0.3 GFLOP/s: a 1024 product would take 7 s)."""
    a = torch.randn(256, 256).to(dtype)
    probe_s = measure.best_s(lambda: a @ a, repeats=1)
    n = int(256 * (MATMUL_TARGET_S / probe_s) ** (1 / 3)) // 64 * 64
    n = max(64, min(MATMUL_MAX_N, n))
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    return 2 * n ** 3 / measure.best_s(lambda: a @ b, repeats=3), n


def measure_bandwidth(threads: int) -> measure.Spread:
    """Read bandwidth in bytes/s, every pass: sum a 256 MiB float32 tensor (reads only, as a
    decode step reads weights), BANDWIDTH_REPEATS times after one untimed sum; the tensor is
    freed on return. The ceiling is the best pass (common/measure.py says why)."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(BANDWIDTH_MIB * 1024 * 1024 // 4, dtype=torch.float32)
    x.sum()
    passes = []
    for _ in range(BANDWIDTH_REPEATS):
        start = time.perf_counter()
        x.sum()
        passes.append(x.numel() * 4 / (time.perf_counter() - start))
    return measure.Spread.of(passes)


def measure_machine(threads: int) -> Machine:
    """Read bandwidth: sum a 256 MiB float32 tensor (reads only, as a decode step reads weights);
    matmul: n x n products in float32 and bfloat16 (n up to 1024). The best of a few passes each
    (they are ceilings), with the threads the engine uses."""
    import torch

    bandwidth = measure_bandwidth(threads)
    flops, sizes = {}, {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        flops[name], sizes[name] = _matmul_flops(torch, dtype)
    return Machine(bandwidth_bytes_s=bandwidth.high, flops_s=flops, threads=threads,
                   matmul_n=sizes, bandwidth_passes=bandwidth)


# --- the kernel floor: the model's own matmuls on this machine's library ----------------------
FLOOR_REPEATS = 3        # best of 3 passes per batch size, after one warm-up pass
FLOOR_BUDGET_S = 2.0     # fewer repeats where a pass is slow (bf16 on a CPU without native bf16)


def linear_shapes(config: dict) -> list[tuple[int, int]]:
    """(out_features, in_features) of every weight one decode step multiplies, in the order the
    model runs them: per layer q, k, v, o, gate, up, down; then the LM head (vocab x hidden).
    Their sizes add up to ModelCost.matmul_params."""
    m = ModelShape.from_config(config)
    h, mlp = m.hidden_size, m.intermediate_size
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    layer = [(q, h), (kv, h), (kv, h), (h, q), (mlp, h), (mlp, h), (h, mlp)]
    return layer * m.num_layers + [(m.vocab_size, h)]


@dataclass
class KernelFloor(results.Record):
    """Seconds one decode step's matmuls take alone, per batch size (requests in the step)."""
    dtype: str
    threads: int
    matmul_params: int          # the weights multiplied: tells which model's shapes were timed
    step_s: dict[int, float]    # batch -> seconds of one pass over every linear layer

    def covers(self, cost: ModelCost, batches) -> bool:
        """Measured for this model's shapes and dtype, at every one of these batch sizes."""
        return (self.dtype == cost.dtype and self.matmul_params == cost.matmul_params
                and all(b in self.step_s for b in batches))


def measure_kernel_floor(config: dict, dtype: str, threads: int, batches) -> KernelFloor:
    """Time torch.nn.functional.linear over the model's weight shapes (linear_shapes), a batch of
    rows at a time, as a decode step multiplies them: best of FLOOR_REPEATS passes per batch size.
    One weight tensor per layer, as the model holds them, so a pass reads every weight from memory
    as a step does (SmolLM in fp32: 538 MB). Takes a few seconds (docs/measurements.md)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch_dtype = shape.torch_dtype(dtype)
    shapes = linear_shapes(config)
    # any values will do (the kernels do not look at them); filled, so every page is touched
    weights = [torch.full(shape, 0.01, dtype=torch_dtype) for shape in shapes]

    def one_step(batch: int):
        inputs = {n: torch.full((batch, n), 0.01, dtype=torch_dtype) for _, n in set(shapes)}

        def run():
            for w in weights:
                F.linear(inputs[w.shape[1]], w)
        return run

    with torch.inference_mode():
        step_s = {b: measure.best_s(one_step(b), FLOOR_REPEATS, FLOOR_BUDGET_S)
                  for b in sorted(set(batches))}
    return KernelFloor(dtype=dtype, threads=threads,
                       matmul_params=sum(o * i for o, i in shapes), step_s=step_s)


# --- the machine's figures: measured once a run (results/machine.json), read by every step ---
@dataclass
class SavedMachine(results.Result):
    """results/machine.json: the ceilings and the kernel floor, measured once (`make lab`)."""
    machine: Machine
    kernel_floor: KernelFloor | None = None
    host: str = "?"


@dataclass(frozen=True)
class MachineFigures:
    machine: Machine
    floor: KernelFloor | None   # the model's kernel floor at the batches asked for, or None
    source: str                 # 'measured <date> <time> on <host>' / 'measured now on <host>'


def machine_figures(config: dict, dtype: str, batches, threads: int, *, measure: bool = False,
                    measure_floor: bool = False) -> MachineFigures:
    """The one loader of the machine's figures, so that every task of a run and the summary read
    the same ones: the ceilings saved in results/machine.json (measured once, by the first step
    that needs them; `make lab` clears the file when it starts), or measured now when none are
    saved (or measure). The kernel floor: the saved one where it covers this model, dtype and
    batches; else, with measure_floor, the missing batch sizes measured now and added. Whatever
    was measured now is saved for the steps after."""
    import socket

    try:
        saved = None if measure else results.load("machine", SavedMachine, "make lab")
    except results.StaleResult:
        saved = None   # from an older lab: measured again
    cost = model_cost(config, dtype)
    if saved is None:
        machine = measure_machine(threads)
        saved = SavedMachine(machine=machine, kernel_floor=None, host=socket.gethostname())
        source = f"measured now on {saved.host}"
        measure_floor = True
    else:
        source = f"measured {saved.measured_at[:16].replace('T', ' ')} on {saved.host}"
    floor = saved.kernel_floor
    if measure_floor and (floor is None or not floor.covers(cost, batches)):
        known = floor.step_s if floor is not None and floor.covers(cost, ()) else {}
        missing = [b for b in batches if b not in known]
        found = measure_kernel_floor(config, dtype, threads, missing)
        floor = KernelFloor(dtype, threads, found.matmul_params, {**known, **found.step_s})
        saved.kernel_floor = floor
        results.save("machine", saved)
    return MachineFigures(saved.machine, floor, source)
