"""The engine: add_request, step, run. One step = schedule, compute every scheduled request's
new tokens in one forward, sample, then hand each token to its request.

Its KV budget is given in bytes, as vLLM's kv_cache_memory_bytes, and cut into whole pages of
the model's KV bytes per token x page_size (task 2 shows vLLM doing the same with its blocks).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from common.kv import cdiv
from mini_engine.block_manager import BlockManager
from mini_engine.model import Llama, make_batch
from mini_engine.sampler import Sampler
from mini_engine.scheduler import Scheduler
from mini_engine.sequence import Sequence

PHASES = ("matmul", "attention", "forward_other", "sampling", "scheduling")


@dataclass
class StepStats:
    num_rows: int           # requests computed this step (padding rows included)
    num_live: int           # requests whose token was kept
    num_tokens: int         # tokens computed (prefill and decode)
    num_pages_used: int
    seconds: float
    phases: dict            # phase -> seconds (PHASES)
    seq_ids: tuple = ()     # the request of each row computed this step, in batch order
    padding_ids: tuple = () # those of them that were padding rows (finished, output thrown away)


def eos_token_ids(folder: str) -> list[int]:
    """End-of-sequence ids from generation_config.json (else config.json), as transformers reads them."""
    for name in ("generation_config.json", "config.json"):
        path = Path(folder) / name
        if path.is_file():
            eos = json.loads(path.read_text()).get("eos_token_id")
            if eos is not None:
                return eos if isinstance(eos, list) else [eos]
    return []


class LLMEngine:
    def __init__(self, model: Llama, eos_ids: list[int], kv_bytes: int, page_size: int = 16,
                 max_batch: int = 16, max_model_len: int = 128, policy: str = "continuous",
                 pad_finished: bool = True, seed: int = 0, enable_prefix_caching: bool = False):
        self.model = model
        self.page_size = page_size
        self.max_model_len = max_model_len
        self.num_pages = kv_bytes // (model.kv_bytes_per_token * page_size)
        if self.num_pages < cdiv(max_model_len, page_size):
            raise ValueError(f"a KV budget of {kv_bytes:,} B holds {self.num_pages} pages of "
                             f"{page_size} tokens: not one request of {max_model_len} tokens")
        # one page more than the budget's: a scratch page that static batching's padding rows
        # write into, so they never write into a page another request may share
        model.allocate_kv_cache(self.num_pages + 1, page_size)
        self.scratch_slot = self.num_pages * page_size
        self.block_manager = BlockManager(self.num_pages, page_size, enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, max_batch, policy, pad_finished)
        self.sampler = Sampler(eos_ids, seed)
        self.sequences: list[Sequence] = []
        self.steps: list[StepStats] = []
        self.start_s = time.perf_counter()

    def add_request(self, prompt_ids: list[int], max_tokens: int, min_tokens: int = 0,
                    temperature: float = 0.0) -> Sequence:
        if len(prompt_ids) + max_tokens > self.max_model_len:
            raise ValueError(f"{len(prompt_ids)} prompt + {max_tokens} new tokens exceed "
                             f"max_model_len {self.max_model_len}")
        seq = Sequence(len(self.sequences), list(prompt_ids), max_tokens, min_tokens, temperature,
                       arrival_s=time.perf_counter())
        self.sequences.append(seq)
        self.scheduler.add(seq)
        return seq

    @torch.inference_mode()
    def step(self) -> list[Sequence]:
        """One forward over every scheduled request; returns the requests that finished."""
        start = time.perf_counter()
        seqs = self.scheduler.schedule()
        num_live = self.scheduler.num_live
        # padding as scheduled: a request that finishes in this step made its token here
        padding_ids = tuple(s.seq_id for s in seqs if s.is_padding)
        if num_live == 0:   # a step that keeps no token can only repeat itself: never spin
            raise RuntimeError(self._stuck_message(seqs))
        scheduled = time.perf_counter()
        # a live request computes its tokens not yet cached (all of them after admission or
        # preemption, else the last one); a padding row recomputes its last cached token
        inputs = [(seq.token_ids[seq.num_cached - 1:seq.num_cached], seq.num_cached - 1,
                   seq.page_table, self.scratch_slot)
                  if seq.is_padding else
                  (seq.token_ids[seq.num_cached:], seq.num_cached, seq.page_table, None)
                  for seq in seqs]
        self.model.times = dict.fromkeys(self.model.times, 0.0)
        logits = self.model.forward(make_batch(inputs, self.page_size, self.model.heads_per_kv,
                                               self.model.dtype))
        forwarded = time.perf_counter()
        next_ids = self.sampler(logits, [s.temperature for s in seqs],
                                [len(s.output_ids) >= s.min_tokens for s in seqs])
        sampled = time.perf_counter()
        finished = []
        for seq, token_id in zip(seqs, next_ids):
            if seq.is_padding:
                continue                               # the padding row's token is thrown away
            seq.num_cached = seq.num_tokens
            self.block_manager.register_full_pages(seq, seq.num_cached)   # pages now full
            seq.output_ids.append(token_id)
            if seq.first_token_s is None:
                seq.first_token_s = sampled
            if (len(seq.output_ids) >= seq.max_tokens or seq.num_tokens >= self.max_model_len
                    or (token_id in self.sampler.eos_ids and len(seq.output_ids) >= seq.min_tokens)):
                seq.finish_s = sampled
                finished.append(seq)
        num_pages_used = self.block_manager.num_used   # before the finished give theirs back
        for seq in finished:
            self.scheduler.finish(seq)
        end = time.perf_counter()
        matmul, attention = self.model.times["matmul"], self.model.times["attention"]
        self.steps.append(StepStats(
            num_rows=len(seqs), num_live=num_live,
            num_tokens=sum(len(ids) for ids, _, _, _ in inputs), num_pages_used=num_pages_used,
            seconds=end - start,
            phases={"matmul": matmul, "attention": attention,
                    "forward_other": forwarded - scheduled - matmul - attention,
                    "sampling": sampled - forwarded,
                    "scheduling": (scheduled - start) + (end - sampled)},
            seq_ids=tuple(s.seq_id for s in seqs),
            padding_ids=padding_ids))
        return finished

    def _stuck_message(self, seqs: list[Sequence]) -> str:
        sched, pages = self.scheduler, self.block_manager
        head = sched.waiting[0] if sched.waiting else None
        need = pages.num_pages_needed(head, head.num_tokens) if head else 0
        return (f"scheduler bug: a step with no live request ({sched.policy} policy, "
                f"{len(seqs)} padding rows, {len(sched.waiting)} waiting, "
                f"{pages.num_free}/{pages.num_pages} pages free, the head of the queue needs {need})")

    def run(self) -> list[Sequence]:
        """Step until every request has finished; the requests in the order they were added."""
        while self.scheduler.has_work:
            self.step()
        return self.sequences
