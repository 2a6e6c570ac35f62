"""The roofline of decoding on this machine: why one request is bound by memory bandwidth and a
batch moves toward the compute bound.

The model is the roofline of Williams, Waterman and Patterson ("Roofline: an insightful visual
performance model for multicore architectures", CACM 52(4), 2009): attainable speed = min(peak
compute, bandwidth x arithmetic intensity). The bandwidth is measured the way STREAM measures it
(a large array, far beyond the caches, read in a loop), the peak compute with a square matmul.

Per decode step the engine reads every weight once, whatever the batch, and each request in the
batch does ~2 FLOPs per weight (a multiply and an add). So with B requests a step reads
weight_bytes + B x kv_bytes and computes B x flops_per_token; it cannot take less than either
takes at the machine's measured bandwidth and matmul throughput:

    step_s  = max(bytes_read / bandwidth, B x flops_per_token / flops_per_s)
    tokens/s <= B / step_s

B = 1 gives the single-request (bandwidth) ceiling; B large gives the compute ceiling
flops_per_s / flops_per_token.

Between the ceiling and the step an engine measures sits the kernel floor: the model's own
linear layers (the weight shapes of its config.json), multiplied alone with this machine's matmul
library, same dtype and threads as the engine. Skinny products (1 or 20 rows against 576-wide
weights) run far below the square-matmul peak, so the floor can lie well above the ceiling. Every
measured step then splits into three rungs (attribute_step): the ceiling, the floor - ceiling gap
(the matmul library on these shapes), and the step - floor gap (everything else the engine does
per step: attention, sampling, scheduling, HTTP).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

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

    def bandwidth_text(self) -> str:
        """'23.6 GB/s (best of 5 passes: 21.0-23.6)', for every report that reads it."""
        p = self.bandwidth_passes
        if p is None or p.num_passes < 2:
            return f"{self.bandwidth_bytes_s / 1e9:.1f} GB/s"
        return (f"{self.bandwidth_bytes_s / 1e9:.1f} GB/s (best of {p.num_passes} passes: "
                f"{p.low / 1e9:.1f}-{p.high / 1e9:.1f})")


@dataclass
class Ceiling(results.Record):
    """The roofline at one batch size: tokens/s and which bound sets it."""
    batch: int
    tokens_per_s: float
    read_s: float
    compute_s: float
    bound: str           # "bandwidth" or "compute"


def ceiling(cost: ModelCost, machine: Machine, batch: int, context: int) -> Ceiling:
    """The roofline at this batch: tokens/s and which bound sets it."""
    read_s = (cost.weight_bytes + batch * context * cost.kv_bytes_per_context_token) \
        / machine.bandwidth_bytes_s
    compute_s = batch * cost.flops_per_token(context) / machine.flops_s[cost.dtype]
    return Ceiling(batch, batch / max(read_s, compute_s), read_s, compute_s,
                   "bandwidth" if read_s >= compute_s else "compute")


def compute_ceiling(cost: ModelCost, machine: Machine, context: int) -> float:
    return machine.flops_s[cost.dtype] / cost.flops_per_token(context)


def ridge_batch(cost: ModelCost, machine: Machine, context: int) -> float:
    """The batch at which reading the weights and computing take equally long."""
    read_s = cost.weight_bytes / machine.bandwidth_bytes_s
    per_request_s = (cost.flops_per_token(context) / machine.flops_s[cost.dtype]
                     - context * cost.kv_bytes_per_context_token / machine.bandwidth_bytes_s)
    return read_s / per_request_s if per_request_s > 0 else float("inf")


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
    as a step does (SmolLM in fp32: 538 MB). Takes a few seconds: on a 2-core AMD EPYC (AVX2,
    fp32, 2026-11-30) one pass took 65 ms at batch 1 and 137 ms at batch 20, 3.3 s in all."""
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


@dataclass
class Rung(results.Record):
    """One measured step on three rungs: the physical ceiling, the kernel floor, the step.
    The gaps, in ms and in % of the step (ceiling + both gaps = the step):
      library = floor - ceiling: the matmul library on the model's shapes, below the peak;
      engine  = step - floor:    everything else the engine does per step.
    larger_gap names the larger of the two; engine < 0 means the engine multiplied faster than
    the floor's kernels (it has its own: read the floor as an upper bound)."""
    ceiling_ms: float
    floor_ms: float
    step_ms: float
    library_ms: float
    engine_ms: float
    ceiling_pct: float
    library_pct: float
    engine_pct: float
    larger_gap: str            # "library" or "engine"
    label: str = ""
    users: int = 1


def attribute_step(ceiling_ms: float, floor_ms: float, step_ms: float, label: str = "",
                   users: int = 1) -> Rung:
    """The three rungs of one step (Rung says what each gap is)."""
    library_ms, engine_ms = floor_ms - ceiling_ms, step_ms - floor_ms
    return Rung(ceiling_ms=ceiling_ms, floor_ms=floor_ms, step_ms=step_ms,
                library_ms=library_ms, engine_ms=engine_ms,
                ceiling_pct=100 * ceiling_ms / step_ms, library_pct=100 * library_ms / step_ms,
                engine_pct=100 * engine_ms / step_ms,
                larger_gap="library" if library_ms >= engine_ms else "engine",
                label=label, users=users)


# --- the lab's steps under this machine's roofline (the summary's section) ---------------------
@dataclass(frozen=True)
class MeasuredStep:
    """A decode step the lab measured, as the roofline reads it (summary.py builds these from
    tasks 1, 2 and 6's results)."""
    name: str             # the result it came from
    label: str            # 'HF, 1 request', 'server, 20 users'
    users: int            # requests in the batch
    tokens_per_s: float
    step_ms: float        # time per decode step
    step_from: str        # how step_ms was found: 'time / tokens', 'measured TPOT'
    core_ms: float | None = None   # a server's: its engine core's own step, of step_ms


@dataclass
class OneUser(results.Record):
    tokens_per_s: float
    step_ms: float
    core_ms: float | None = None


@dataclass
class Placed(results.Record):
    """A measured step placed under the ceilings: one request against the bandwidth ceiling, a
    batch against the compute ceiling and the roofline at its own batch size."""
    label: str
    users: int
    tokens_per_s: float
    step_ms: float
    step_from: str
    pct_of_bandwidth_ceiling: float | None = None
    pct_of_compute_ceiling: float | None = None
    roofline_at_users: Ceiling | None = None
    pct_of_roofline_at_users: float | None = None
    one_user: OneUser | None = None      # the same server's 1-user level, beside its batch
    core_ms: float | None = None         # a server's engine core's own step (vLLM's ITL)

    @property
    def is_batch(self) -> bool:
        return self.pct_of_compute_ceiling is not None

    @property
    def pct_of_its_ceiling(self) -> float:
        return self.pct_of_compute_ceiling if self.is_batch else self.pct_of_bandwidth_ceiling


@dataclass
class Placement(results.Record):
    """The roofline of this machine and the lab's steps under it (the summary's section)."""
    bandwidth_gb_s: float
    matmul_gflop_s: dict[str, float]
    threads: int
    dtype: str
    context: int                 # mean context while decoding (tokens)
    num_params: int
    weight_bytes: int
    weight_read_ms: float
    bytes_per_token: int
    flops_per_token: int
    bandwidth_ceiling_tok_s: float
    compute_ceiling_tok_s: float
    ridge_batch: float
    placed: dict[str, Placed] = field(default_factory=dict)
    rungs: list[Rung] = field(default_factory=list)
    kernel_floor: KernelFloor | None = None
    matmul_n: dict[str, int] | None = None
    bandwidth_low_gb_s: float | None = None   # the slowest of the bandwidth's passes


def floor_batches(steps: list[MeasuredStep]) -> list[int]:
    """The batch sizes the measured steps ran: 1 (tasks 1, 2, task 6's one user) and task 6's
    largest level."""
    return sorted({1} | {s.users for s in steps})


def place(steps: list[MeasuredStep], cost: ModelCost, machine: Machine, context: int,
          floor: KernelFloor | None = None) -> Placement:
    """The measured steps placed under this machine's ceilings (every figure from the inputs),
    and, with the kernel floor, each on three rungs (attribute_step). One request is read
    against the bandwidth ceiling; a batch against the compute ceiling and the roofline at its
    batch size, with the same server's 1-user step beside it when one was measured."""
    single = ceiling(cost, machine, 1, context)
    top = compute_ceiling(cost, machine, context)
    placed: dict[str, Placed] = {}
    batched = _batched(steps)
    ones = {s.name: s for s in steps if s.users == 1}
    for s in steps:
        if s.users == 1 and s.name in batched:
            continue     # a batch's own 1-user level goes beside it (one_user)
        p = Placed(s.label, s.users, s.tokens_per_s, s.step_ms, s.step_from, core_ms=s.core_ms)
        if s.users == 1:
            p.pct_of_bandwidth_ceiling = 100 * s.tokens_per_s / single.tokens_per_s
        else:
            at_batch = ceiling(cost, machine, s.users, context)
            p.pct_of_compute_ceiling = 100 * s.tokens_per_s / top
            p.roofline_at_users = at_batch
            p.pct_of_roofline_at_users = 100 * s.tokens_per_s / at_batch.tokens_per_s
            if s.name in ones:
                one = ones[s.name]
                p.one_user = OneUser(one.tokens_per_s, one.step_ms, one.core_ms)
        placed[s.name] = p
    rungs = []
    if floor is not None and floor.covers(cost, {s.users for s in steps}):
        batched = _batched(steps)
        # one request first, then the server's 1 user just before its batch, as the table reads
        for s in sorted(steps, key=lambda s: (s.name in batched, s.users)):
            # the ceiling's step: one read of the weights (+ KV) or the batch's FLOPs at peak
            ceiling_ms = 1000 * s.users / ceiling(cost, machine, s.users, context).tokens_per_s
            label = "server, 1 user" if s.name in batched and s.users == 1 else s.label
            rungs.append(attribute_step(ceiling_ms, 1000 * floor.step_s[s.users], s.step_ms,
                                        label, s.users))
    return Placement(
        bandwidth_gb_s=machine.bandwidth_bytes_s / 1e9,
        matmul_gflop_s={k: v / 1e9 for k, v in machine.flops_s.items()},
        threads=machine.threads, dtype=cost.dtype, context=context,
        num_params=cost.num_params, weight_bytes=cost.weight_bytes,
        weight_read_ms=1000 * cost.weight_bytes / machine.bandwidth_bytes_s,
        bytes_per_token=cost.bytes_per_token(context), flops_per_token=cost.flops_per_token(context),
        bandwidth_ceiling_tok_s=single.tokens_per_s, compute_ceiling_tok_s=top,
        ridge_batch=ridge_batch(cost, machine, context), placed=placed, rungs=rungs,
        kernel_floor=floor, matmul_n=machine.matmul_n,
        bandwidth_low_gb_s=(machine.bandwidth_passes.low / 1e9 if machine.bandwidth_passes
                            else None))


def _batched(steps: list[MeasuredStep]) -> set[str]:
    """Results that measured a batch (more than one request at once)."""
    return {s.name for s in steps if s.users > 1}


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
    source: str                 # 'measured 2026-12-01 03:10 on host' / 'measured now on host'


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


# --- the summary's figure: the roofline ----------------------------------------------------------
@dataclass
class EnginePoint(results.Record):
    """The lab's own engine on the roofline (task 9, continuous batching): its batch is the
    mean tokens per step."""
    label: str
    batch: float
    tokens_per_s: float


def roofline_curve(r: Placement, batches: list[float]) -> tuple[list[float], list[float], float]:
    """Per batch B, the bandwidth bound (tokens/s if a step took only its bytes: the weights
    once + B requests' KV, at the measured bandwidth) and the compute roof (tokens/s at the peak
    matmul rate). The roofline is the lower of the two."""
    bandwidth = r.bandwidth_gb_s * 1e9
    kv_bytes = r.bytes_per_token - r.weight_bytes   # one request's KV at the mean context
    flops = r.matmul_gflop_s[r.dtype] * 1e9
    read = [b * bandwidth / (r.weight_bytes + b * kv_bytes) for b in batches]
    return read, [flops / r.flops_per_token] * len(batches), flops / r.flops_per_token


def roofline_points(r: Placement, engine: EnginePoint | None = None
                    ) -> list[tuple[str, float, float, str]]:
    """(label, batch, tokens/s, kind) of every point on the roofline: kind 'floor' for the
    kernel floor (the model's matmuls alone, batch b in its step: b tokens per step), 'measured'
    for the steps the lab measured, 'engine' for the lab's own engine."""
    floor = r.kernel_floor.step_s if r.kernel_floor else {}
    points = [(f"kernel floor, batch {b}", b, b / s, "floor") for b, s in sorted(floor.items())]
    for p in r.placed.values():
        if p.one_user:
            points.append(("server, 1 user", 1, p.one_user.tokens_per_s, "measured"))
        points.append((p.label, p.users, p.tokens_per_s, "measured"))
    if engine:
        points.append((engine.label, engine.batch, engine.tokens_per_s, "engine"))
    return points


def figure(summary):
    """The summary (a record with `roofline`, a Placement, and `engine_point`): tokens/s against
    requests per step, log-log. One step reads the weights once for the whole batch, so the
    bandwidth bound climbs with the batch (slope 1) until the compute roof; the kernel floor and
    the measured steps sit below."""
    import math

    from matplotlib.ticker import FuncFormatter

    from common import figures

    r = summary.roofline
    if r is None:
        return None
    points = roofline_points(r, summary.engine_point)
    top_batch = max([b for _, b, _, _ in points] + [1])
    ridge = r.ridge_batch or top_batch
    x_max = min(1e4, max(4 * top_batch, 2 * ridge if math.isfinite(ridge) else 0, 64))
    batches = [10 ** (i / 50) for i in range(int(50 * math.log10(x_max)) + 1)]
    read, compute, roof = roofline_curve(r, batches)
    fig, ax = figures.figure(5.6)
    color = figures.color
    ax.plot(batches, read, "--", color=color(1), label="bandwidth bound: the weights read\n"
                                                       "once per step, for the whole batch")
    ax.plot(batches, compute, "--", color=color(5), label=f"compute roof: peak {r.dtype} matmul")
    ax.plot(batches, [min(a, b) for a, b in zip(read, compute)], color="#333333", linewidth=3,
            alpha=0.3, label="the roofline (the lower of the two)")
    # every point its own colour and a legend line with its value; points at the same batch
    # are drawn side by side (dodged a few % in x) so none hides another
    markers = {"floor": "X", "measured": "o", "engine": "*"}
    same_batch = {b: [p for p in points if p[1] == b] for _, b, _, _ in points}
    for k, point in enumerate(points):
        label, batch, tps, kind = point
        group = same_batch[batch]
        dodge = 1.07 ** (group.index(point) - (len(group) - 1) / 2)
        ax.plot(batch * dodge, tps, markers[kind], color=color(k + 4 if k < 4 else k - 4),
                markersize=14 if kind == "engine" else 10, markeredgecolor="#333333",
                label=f"{label}: {tps:,.1f} tok/s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")   # 1, 10, 100 (not 10^0, 10^1)
    ax.xaxis.set_major_formatter(plain)
    ax.yaxis.set_major_formatter(plain)
    ax.set_xlim(0.8, x_max)
    low = min([tps for _, _, tps, _ in points] + [read[0]])
    ax.set_ylim(low / 2, roof * 2)
    ax.set_xlabel("requests decoded in one step (batch), log scale")
    ax.set_ylabel("tokens/s, log scale")
    ax.grid(alpha=0.3, which="both")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=9)
    ax.set_title(f"{r.bandwidth_gb_s:.1f} GB/s read, {r.matmul_gflop_s[r.dtype]:,.0f} "
                 f"GFLOP/s {r.dtype} matmul; {r.num_params / 1e6:.0f}M parameters, "
                 f"context {r.context}", fontsize=10)
    return figures.finish(fig, "Summary: the roofline of decoding on this machine", summary)
