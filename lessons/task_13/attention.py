"""Part 4: what attention costs a decode step as the context grows, in both engines.

A decode step attends once a layer: each request's one new query over its whole context. The
matmuls cost the same at any context; attention's cost grows with it. Here B requests (1, then
the cap) each have a context of L tokens (128 to 1,024 by default), their pages scattered over a
pool of random values (the kernels do the same work whatever the values), one pool a layer, as
in a step. Timed: the attention call of every layer, the step's attention without its
matmuls. Both engines, each with its own layout and kernel (mini_engine's call also writes the
step's new K and V; vLLM writes them in an op of its own, not timed here):

    mini_engine   Llama.attention as the engine runs it: with its kernels, each request's pages
                  read in place, in one pass of C (mini_engine/kernels/paged_attention.c); the
                  torch way, its context gathered and attended by torch's SDPA, the batch padded
                  to its longest context, in calls of a bounded size (mini_engine/model.py)
    vLLM          its CPU attention kernel (ops.cpu_attention_with_kv_cache), which reads the
                  pages where they are, through the block table

Both compiled forwards call these same kernels: mini_engine's graph calls its attention as an
op of its own (mini_engine/kernels/compiled.py), and vLLM registers attention on a CPU as one opaque op
that its graph calls (vllm/platforms/cpu.py, opaque_attention_op), so one measurement serves
eager and compiled alike.
"""
from __future__ import annotations

import random

import torch

from common import measure

REPEATS = 5                    # the best of five steps (a step is 30 calls)
PAGE = 16                      # block size, both engines (the lab's)


def page_tables(batch: int, context: int, seed: int) -> tuple[list[list[int]], int]:
    """Each request's pages, scattered over the pool (as a pool some while in use has them);
    the number of pages in it."""
    per = -(-context // PAGE)
    pages = list(range(batch * per))
    random.Random(seed).shuffle(pages)
    return [pages[i * per:(i + 1) * per] for i in range(batch)], batch * per


def best_step(attend_layer, num_layers: int) -> float:
    """Seconds of one step's attention: every layer's call, the best of REPEATS after one
    untimed step (measure.best_s: a kernel timed alone)."""
    def step() -> None:
        for layer in range(num_layers):
            attend_layer(layer)
    return measure.best_s(step, REPEATS)


def mini_engine_ms(model, batch: int, context: int, in_place: bool) -> float:
    """Milliseconds of a decode step's attention in mini_engine: B requests at position
    context - 1, each writing its new K/V and attending over its context, in place (the C) or
    gathered (the torch way)."""
    from mini_engine.kernels.attention import in_place_groups
    from mini_engine.model import RequestChunk, make_batch

    tables, num_pages = page_tables(batch, context, seed=context)
    steps = make_batch([RequestChunk([0], context - 1, t) for t in tables], PAGE,
                       model.heads_per_kv, model.dtype,
                       in_place=in_place_groups if in_place else None)
    shape = model.kv_cache_shape(num_pages, PAGE)
    pools = [torch.empty(shape, dtype=model.dtype).uniform_(-1, 1)
             for _ in range(model.shape.num_layers)]
    H, KVH, D = model.num_heads, model.num_kv_heads, model.head_dim
    q = torch.randn(batch, H, D, dtype=model.dtype)
    k, v = torch.randn(2, batch, KVH, D, dtype=model.dtype)
    with torch.inference_mode():
        return 1e3 * best_step(lambda i: model.attention(q, k, v, steps, pools[i]),
                               model.shape.num_layers)


def vllm_ms(num_layers: int, num_heads: int, num_kv_heads: int, head_dim: int,
            dtype: torch.dtype, batch: int, context: int) -> float:
    """Milliseconds of a decode step's attention in vLLM's CPU kernel, with its cache layout
    (blocks of [kv_heads, 2 x block, head_dim]: K's rows, then V's) and the scheduling metadata
    its backend makes (vllm/v1/attention/backends/cpu_attn.py). Only where vLLM is imported
    (its child process)."""
    from vllm import _custom_ops as ops
    from vllm import envs
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    tables, num_pages = page_tables(batch, context, seed=context)
    isa = _get_attn_isa(dtype, PAGE, head_dim, "auto")
    seq_lens = torch.full((batch,), context, dtype=torch.int32)
    starts = torch.arange(batch + 1, dtype=torch.int32)            # one query a request
    block_table = torch.tensor(tables, dtype=torch.int32)
    meta = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=batch, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
        seq_lens=seq_lens, dtype=dtype, query_start_loc=starts, causal=True,
        sliding_window_size=-1, isa=isa, enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV)
    layout = (num_pages, num_kv_heads, PAGE * 2, head_dim)      # K then V in each block
    caches = [torch.empty(layout, dtype=dtype).uniform_(-1, 1) for _ in range(num_layers)]
    q = torch.randn(batch, num_heads, head_dim, dtype=dtype)
    out = torch.empty(batch, num_heads, head_dim, dtype=dtype)

    def attend(layer: int) -> None:
        key_cache, value_cache = caches[layer].chunk(2, dim=2)
        ops.cpu_attention_with_kv_cache(
            query=q, key_cache=key_cache, value_cache=value_cache, output=out,
            query_start_loc=starts, seq_lens=seq_lens, scale=head_dim ** -0.5, causal=True,
            alibi_slopes=None, sliding_window=-1, block_table=block_table, softcap=0,
            scheduler_metadata=meta, s_aux=None)
    with torch.inference_mode():
        return 1e3 * best_step(attend, num_layers)


def mini_engine_sweep(model, batches: list[int], contexts: list[int]) -> tuple[dict, dict]:
    """(torch, in place): batch -> ms at each context, mini_engine's attention. The two
    ways alternate point by point, so that a drift of the machine's speed is not read as a
    difference between them."""
    one: dict[int, list[float]] = {b: [] for b in batches}
    in_place: dict[int, list[float]] = {b: [] for b in batches}
    for b in batches:
        for L in contexts:
            one[b].append(mini_engine_ms(model, b, L, in_place=False))
            in_place[b].append(mini_engine_ms(model, b, L, in_place=True))
    return one, in_place


def vllm_sweep(model_path: str, dtype: torch.dtype, batches: list[int],
               contexts: list[int]) -> dict:
    """batch -> ms at each context, vLLM's kernel, with the model's shape (config.json)."""
    import json
    from pathlib import Path

    from mini_engine.model import LlamaShape

    shape = LlamaShape.from_config(json.loads((Path(model_path) / "config.json").read_text()))
    return {b: [vllm_ms(shape.num_layers, shape.num_heads, shape.num_kv_heads, shape.head_dim,
                        dtype, b, L) for L in contexts] for b in batches}


def main() -> None:
    """vLLM's side, in a process of its own (vLLM's kernels load with vLLM), so that part 3's
    processes measure vLLM's memory alone: answers the sweep (measure.answer).

        python -m lessons.task_13.attention --model PATH --dtype D --batches 1,16
            --contexts 128,256,512,1024
    """
    import argparse

    from common import settings

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", required=True)
    parser.add_argument("--batches", required=True)
    parser.add_argument("--contexts", required=True)
    args = parser.parse_args()
    settings.apply_cpu_engine_env()            # as vLLM's engine would run: its threads, its env
    torch.set_num_threads(settings.num_cores())
    batches, contexts = ([int(n) for n in text.split(",")] for text in (args.batches,
                                                                         args.contexts))
    measure.answer(vllm_sweep(args.model, getattr(torch, args.dtype), batches, contexts))


if __name__ == "__main__":
    main()
