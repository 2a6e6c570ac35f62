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
from dataclasses import dataclass

from common import shape
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


@dataclass(frozen=True)
class Machine:
    bandwidth_bytes_s: float      # memory read bandwidth
    flops_s: dict                 # dtype -> matmul FLOP/s
    threads: int
    matmul_n: dict | None = None  # dtype -> n of the n x n products measured


def ceiling(cost: ModelCost, machine: Machine, batch: int, context: int) -> dict:
    """The roofline at this batch: tokens/s and which bound sets it."""
    read_s = (cost.weight_bytes + batch * context * cost.kv_bytes_per_context_token) \
        / machine.bandwidth_bytes_s
    compute_s = batch * cost.flops_per_token(context) / machine.flops_s[cost.dtype]
    return {"batch": batch, "tokens_per_s": batch / max(read_s, compute_s),
            "read_s": read_s, "compute_s": compute_s,
            "bound": "bandwidth" if read_s >= compute_s else "compute"}


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


def _best_s(fn, repeats: int, budget_s: float = float("inf")) -> float:
    """Best time of `repeats` runs after one warm-up; fewer once the runs took budget_s."""
    fn()                                   # warm-up: page faults, thread pool, kernel choice
    best, spent = float("inf"), 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
        if spent > budget_s:
            break
    return best


def _matmul_flops(torch, dtype) -> tuple[float, int]:
    """(FLOP/s, n) of n x n products: n = 1024, or smaller where one would take over 0.1 s
    (bf16 without native support runs at ~0.3 GFLOP/s: a 1024 product would take 7 s)."""
    a = torch.randn(256, 256).to(dtype)
    probe_s = _best_s(lambda: a @ a, repeats=1)
    n = int(256 * (MATMUL_TARGET_S / probe_s) ** (1 / 3)) // 64 * 64
    n = max(64, min(MATMUL_MAX_N, n))
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    return 2 * n ** 3 / _best_s(lambda: a @ b, repeats=3), n


def measure_bandwidth(threads: int) -> float:
    """Read bandwidth in bytes/s: sum a 256 MiB float32 tensor (reads only, as a decode step
    reads weights), best of BANDWIDTH_REPEATS; the tensor is freed on return."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(BANDWIDTH_MIB * 1024 * 1024 // 4, dtype=torch.float32)
    return x.numel() * 4 / _best_s(x.sum, repeats=BANDWIDTH_REPEATS)


def measure_machine(threads: int) -> Machine:
    """Read bandwidth: sum a 256 MiB float32 tensor (reads only, as a decode step reads weights);
    matmul: n x n products in float32 and bfloat16 (n up to 1024). Best of a few runs each, with
    the threads the engine uses."""
    import torch

    bandwidth = measure_bandwidth(threads)
    flops, sizes = {}, {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        flops[name], sizes[name] = _matmul_flops(torch, dtype)
    return Machine(bandwidth_bytes_s=bandwidth, flops_s=flops, threads=threads,
                   matmul_n=sizes)


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


@dataclass(frozen=True)
class KernelFloor:
    """Seconds one decode step's matmuls take alone, per batch size (requests in the step)."""
    dtype: str
    threads: int
    matmul_params: int    # the weights multiplied: tells which model's shapes were timed
    step_s: dict          # batch -> seconds of one pass over every linear layer

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
        step_s = {b: _best_s(one_step(b), FLOOR_REPEATS, FLOOR_BUDGET_S)
                  for b in sorted(set(batches))}
    return KernelFloor(dtype=dtype, threads=threads,
                       matmul_params=sum(o * i for o, i in shapes), step_s=step_s)


def attribute_step(ceiling_ms: float, floor_ms: float, step_ms: float) -> dict:
    """One measured step on three rungs: the physical ceiling, the kernel floor, the step.
    The gaps, in ms and in % of the step (ceiling + both gaps = the step):
      library = floor - ceiling: the matmul library on the model's shapes, below the peak;
      engine  = step - floor:    everything else the engine does per step.
    larger_gap names the larger of the two; engine < 0 means the engine multiplied faster than
    the floor's kernels (it has its own: read the floor as an upper bound)."""
    library_ms, engine_ms = floor_ms - ceiling_ms, step_ms - floor_ms
    return {"ceiling_ms": ceiling_ms, "floor_ms": floor_ms, "step_ms": step_ms,
            "library_ms": library_ms, "engine_ms": engine_ms,
            "ceiling_pct": 100 * ceiling_ms / step_ms,
            "library_pct": 100 * library_ms / step_ms,
            "engine_pct": 100 * engine_ms / step_ms,
            "larger_gap": "library" if library_ms >= engine_ms else "engine"}


# --- the lab's steps under this machine's roofline (the summary's section) ---------------------
def roofline_inputs(res: dict) -> tuple[dict, str, int] | None:
    """(model config, dtype, context) of the run that tasks 1, 2 and 6 measured, or None.
    res: the saved results, typed (common.results)."""
    import json

    one = res.get("task_2_vllm_inference") or res.get("task_1_hf_baseline")
    if not one or not one.header.model_path or not one.header.dtype:
        return None
    try:
        with open(f"{one.header.model_path}/config.json") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    if one.prompt_tokens is None or one.generated_tokens is None:
        return None
    # mean context while decoding: the prompt plus half the new tokens
    return config, one.header.dtype, one.prompt_tokens + one.generated_tokens // 2


def step_ms(level) -> float:
    """A load level's decode step: its measured TPOT (requests / tok/s where it is missing)."""
    if level.mean_tpot_s:
        return 1000 * level.mean_tpot_s
    return 1000 * level.users / level.throughput_tok_s


def _levels(res: dict) -> list:
    six = res.get("task_6_multi_user_load")
    return [lv for lv in six.levels if lv.throughput_tok_s] if six else []


def floor_batches(res: dict) -> list[int]:
    """The batch sizes the measured steps ran: 1 (tasks 1, 2, task 6's one user) and task 6's
    largest level."""
    users = [lv.users for lv in _levels(res)]
    return sorted({1, max(users)}) if users else [1]


def place(res: dict, cost: ModelCost, machine: Machine, context: int,
          floor: KernelFloor | None = None) -> dict:
    """Tasks 1, 2 and 6 (res: their typed results) placed under this machine's ceilings (every
    figure from the inputs), and, with the kernel floor, every measured step on three rungs
    (attribute_step). Time per decode step: total time / generated tokens for one request; for
    the server, task 6's measured time per output token (TPOT), which is the step time while a
    batch decodes."""
    from dataclasses import asdict

    single = ceiling(cost, machine, 1, context)
    top = compute_ceiling(cost, machine, context)
    placed = {}
    for step, label in (("task_1_hf_baseline", "HF, 1 request"),
                        ("task_2_vllm_inference", "vLLM, 1 request")):
        one = res.get(step)
        if one and one.tokens_per_s:
            tps = one.tokens_per_s
            # the saved tok/s is rounded: the step from the unrounded time where it is saved
            ms = (1000 * one.total_time_s / one.generated_tokens
                  if one.total_time_s and one.generated_tokens else 1000 / tps)
            placed[step] = {"label": label, "users": 1, "tokens_per_s": tps,
                            "step_ms": ms, "step_from": "time / tokens",
                            "pct_of_bandwidth_ceiling": 100 * tps / single["tokens_per_s"]}
    levels = _levels(res)
    if levels:
        lv = max(levels, key=lambda lv: lv.users)
        at_batch = ceiling(cost, machine, lv.users, context)
        placed["task_6_multi_user_load"] = {
            "label": f"server, {lv.users} users", "users": lv.users,
            "tokens_per_s": lv.throughput_tok_s,
            "step_ms": step_ms(lv), "step_from": "measured TPOT",
            "pct_of_compute_ceiling": 100 * lv.throughput_tok_s / top,
            "roofline_at_users": at_batch,
            "pct_of_roofline_at_users": 100 * lv.throughput_tok_s / at_batch["tokens_per_s"]}
        one = min(levels, key=lambda lv: lv.users)
        if one.users == 1 and lv.users > 1:
            placed["task_6_multi_user_load"]["one_user"] = {
                "tokens_per_s": one.throughput_tok_s, "step_ms": step_ms(one)}
    steps = [(p["label"], p["users"], p["step_ms"]) for p in placed.values()]
    six = placed.get("task_6_multi_user_load", {})
    if "one_user" in six:
        steps.insert(-1, ("server, 1 user", 1, six["one_user"]["step_ms"]))
    rungs = []
    if floor is not None and floor.covers(cost, {users for _, users, _ in steps}):
        for label, users, ms in steps:
            # the ceiling's step: one read of the weights (+ KV) or the batch's FLOPs at peak
            ceiling_ms = 1000 * users / ceiling(cost, machine, users, context)["tokens_per_s"]
            rungs.append({"label": label, "users": users,
                          **attribute_step(ceiling_ms, 1000 * floor.step_s[users], ms)})
    return {"kernel_floor": asdict(floor) if floor else None, "rungs": rungs,
            "bandwidth_gb_s": machine.bandwidth_bytes_s / 1e9,
            "matmul_gflop_s": {k: v / 1e9 for k, v in machine.flops_s.items()},
            "matmul_n": machine.matmul_n, "threads": machine.threads,
            "dtype": cost.dtype, "context": context,
            "num_params": cost.num_params, "weight_bytes": cost.weight_bytes,
            "weight_read_ms": 1000 * cost.weight_bytes / machine.bandwidth_bytes_s,
            "bytes_per_token": cost.bytes_per_token(context),
            "flops_per_token": cost.flops_per_token(context),
            "bandwidth_ceiling_tok_s": single["tokens_per_s"], "compute_ceiling_tok_s": top,
            "ridge_batch": ridge_batch(cost, machine, context), "placed": placed}


# --- the machine's figures: saved once (results/machine.json), read by the summary and task 9 ---
@dataclass(frozen=True)
class MachineFigures:
    machine: Machine
    floor: KernelFloor | None   # the model's kernel floor at the batches asked for, or None
    source: str                 # 'measured 2026-12-01 03:10 on host' / 'measured now on host'


def machine_figures(config: dict, dtype: str, batches, threads: int, *, measure: bool = False,
                    measure_floor: bool = False, save: bool = False) -> MachineFigures:
    """The one loader of the machine's figures: the ceilings saved in results/machine.json
    (measured once, on the machine the lab ran on), or measured now when none are saved (or
    measure). The kernel floor: the saved one when it covers this model, dtype and batches,
    else measured now when measure or measure_floor, else None. save writes what was measured
    to results/machine.json (the summary does; task 9 reads it)."""
    import socket

    from common import results, settings

    try:
        saved = None if measure else results.load("machine")
    except results.StaleResult:
        saved = None   # from an older lab: measured again
    cost = model_cost(config, dtype)
    if saved is not None:
        machine = Machine(saved.bandwidth_bytes_s, saved.flops_s, saved.threads, saved.matmul_n)
        floor = None
        if saved.kernel_floor:   # JSON keys are strings: the batch sizes back to numbers
            floor = KernelFloor(**saved.kernel_floor | {"step_s": {
                int(b): t for b, t in saved.kernel_floor["step_s"].items()}})
        if floor is None or not floor.covers(cost, batches):
            floor = measure_kernel_floor(config, dtype, threads, batches) if measure_floor else floor
        return MachineFigures(machine, floor, f"measured {saved.measured_at[:16].replace('T', ' ')}"
                                              f" on {saved.host}")
    machine = measure_machine(threads)
    floor = measure_kernel_floor(config, dtype, threads, batches)
    if save:
        from dataclasses import asdict

        results.save("machine", asdict(machine) | {"kernel_floor": asdict(floor),
                                                    "host": socket.gethostname(),
                                                    "cpu": settings.cpu_model_name()})
    return MachineFigures(machine, floor, f"measured now on {socket.gethostname()}")
