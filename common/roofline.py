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
"""
from __future__ import annotations

import time
from dataclasses import dataclass


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


def model_cost(config: dict, dtype: str, dtype_bytes: int) -> ModelCost:
    """Counted from a Llama-style config.json (SmolLM: 30 layers, hidden 576, 9 heads of 64,
    3 KV heads, MLP 1536, vocab 49152, tied embeddings: 134,515,008 parameters)."""
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or h // heads
    mlp, vocab = config["intermediate_size"], config["vocab_size"]
    tied = config.get("tie_word_embeddings", True)
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
MATMUL_MAX_N = 1024     # 1024 x 1024 x 1024: 2.1 GFLOP per product
MATMUL_TARGET_S = 0.1   # a product takes about this long, even where bf16 is slow (no native bf16)


def _best_s(fn, repeats: int) -> float:
    fn()                                   # warm-up: page faults, thread pool, kernel choice
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
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


def measure_machine(threads: int) -> Machine:
    """Read bandwidth: sum a 256 MiB float32 tensor (reads only, as a decode step reads weights);
    matmul: n x n products in float32 and bfloat16 (n up to 1024). Best of a few runs each, with
    the threads the engine uses."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(BANDWIDTH_MIB * 1024 * 1024 // 4, dtype=torch.float32)
    bandwidth = x.numel() * 4 / _best_s(x.sum, repeats=5)
    x = None   # give the 256 MiB back before the matmuls
    flops, sizes = {}, {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        flops[name], sizes[name] = _matmul_flops(torch, dtype)
    return Machine(bandwidth_bytes_s=bandwidth, flops_s=flops, threads=threads,
                   matmul_n=sizes)
