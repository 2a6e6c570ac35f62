"""Task 14's measurements in mini_engine, and the comparisons both engines share: greedy answers
with each KV cache format, a real text's log-probabilities read through it (teacher-forced: every
token of the passage given, each one's probability under the ones before it), and the
memory-bound workload's throughput. A format is (kv_cache_dtype, kv_scale), EngineConfig's."""
from __future__ import annotations

import math
import time

import torch

from lessons.task_14.record import Throughput
from mini_engine import EngineConfig, LLMEngine
from mini_engine.model import RequestChunk

STUCK_TAIL = 12        # an answer is stuck when its last 12 tokens repeat a cycle of 1-4 tokens


def engine(model, eos, kv: tuple[str, str], kv_bytes: int, page: int, max_len: int,
           max_batch: int = 16, kernels: str = "torch") -> LLMEngine:
    """An engine whose KV cache is in format kv. The comparisons run the torch way, so every
    format attends the same way, each context gathered and attended by SDPA: the C that reads
    pages in place takes no 8-bit pool, and would change the bf16 reference's last bits, and so
    its greedy answers, for a reason that is not the cache's format. (The C 8-bit write and read
    give torch's bits exactly.)"""
    return LLMEngine(model, eos, EngineConfig(kv_bytes=kv_bytes, page_size=page,
                                              max_batch=max_batch, max_model_len=max_len,
                                              kv_cache_dtype=kv[0], kv_scale=kv[1],
                                              kernels=kernels))


def greedy_answers(model, eos, prompts: list[list[int]], max_tokens: int, kv: tuple[str, str],
                   page: int, kv_bytes: int) -> list[list[int]]:
    """Each prompt's greedy answer, EOS allowed, all at once through a cache of format kv."""
    longest = max(len(p) for p in prompts) + max_tokens
    eng = engine(model, eos, kv, kv_bytes, page, longest, max_batch=len(prompts))
    seqs = [eng.add_request(p, max_tokens) for p in prompts]
    eng.run()
    return [s.output_ids for s in seqs]


@torch.inference_mode()
def passage_logprobs(model, ids: list[int], kv: tuple[str, str], page: int) -> list[float]:
    """log p(token i | tokens before it) for i = 1..n-1, the passage in one forward through a
    fresh engine's pools of format kv: each token's K and V are written (quantized) before any
    row attends, so every row reads its context back from the cache, as a decode would."""
    num_pages = -(-len(ids) // page)
    eng = engine(model, [], kv, (num_pages + 1) * page * 2 * model.kv_bytes_per_token, page,
                 len(ids), max_batch=1)
    batch = eng.batch_of([RequestChunk(ids, 0, list(range(num_pages)), num_logits=len(ids))])
    logits = model.forward(batch, eng.kv_cache).float()                       # (n, V)
    logp = torch.log_softmax(logits[:-1], dim=-1)
    return logp.gather(1, torch.tensor(ids[1:])[:, None]).squeeze(1).tolist()


@torch.inference_mode()
def load_run(model, eos, kv: tuple[str, str], name: str, prompts: list[list[int]],
             tokens: int, kv_bytes: int, page: int, max_batch: int,
             kernels: str = "torch") -> Throughput:
    """Every prompt at once, tokens each (EOS held off), through a KV budget that binds."""
    eng = engine(model, eos, kv, kv_bytes, page, max(len(p) for p in prompts) + tokens,
                 max_batch=max_batch, kernels=kernels)
    start = time.perf_counter()
    seqs = [eng.add_request(p, tokens, min_tokens=tokens) for p in prompts]
    eng.run()
    seconds = time.perf_counter() - start
    tpots = [(s.token_times_s[-1] - s.token_times_s[0]) / (len(s.token_times_s) - 1)
             for s in seqs if len(s.token_times_s) > 1]
    return Throughput("mini_engine", name, eng.num_pages * page,
                      max(st.num_live for st in eng.steps), eng.scheduler.num_preemptions,
                      sum(len(s.output_ids) for s in seqs), seconds,
                      sum(tpots) / len(tpots) if tpots else None)


# --- comparisons, both engines ------------------------------------------------------------------
def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two answers differ (one ending first counts); None: identical."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def is_empty(ids: list[int], eos) -> bool:
    """An answer that ends at once: nothing, or only the end-of-sequence token."""
    return not ids or (len(ids) == 1 and ids[0] in eos)


def is_stuck(ids: list[int]) -> bool:
    """The last STUCK_TAIL tokens repeat a cycle of 1 to 4 tokens: a degenerate answer."""
    tail = ids[-STUCK_TAIL:]
    return len(tail) == STUCK_TAIL and any(
        all(tail[i] == tail[i % n] for i in range(STUCK_TAIL)) for n in range(1, 5))


def mean_abs_change(reference: list[float], logprobs: list[float]) -> float:
    return sum(abs(a - b) for a, b in zip(reference, logprobs, strict=True)) / len(reference)


def perplexity(logprobs: list[float]) -> float:
    return math.exp(-sum(logprobs) / len(logprobs))
