"""The engine: add_request, step, run. A step is nano-vllm's three moves: schedule (who runs this
step, how many of their tokens within the step's token budget, their pages), run the model (one
forward over every scheduled request's tokens, then the next token of each request whose last
known token was computed), postprocess (each token handed to its request; the finished ones
leave).

Its KV budget is given in bytes, as vLLM's kv_cache_memory_bytes, and cut into whole pages of
the model's KV bytes per token x page_size (task 2 shows vLLM doing the same with its blocks).

Two things are the caller's to ask for, because they cost time: the linear layers' kernel choice
(model.choose_kernels, a warm-up of about a second; until then they run F.linear), and the
time of each phase of a step (a StepProfiler, mini_engine/profiler.py). Without one an engine
records each step's rows, tokens, pages and seconds.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from mini_engine.block_manager import BlockManager, cdiv
from mini_engine.config import EngineConfig
from mini_engine.model import Llama, RequestChunk, make_batch
from mini_engine.profiler import NoProfiler, StepProfiler
from mini_engine.sampler import Sampler
from mini_engine.scheduler import Scheduler
from mini_engine.sequence import Sequence


@dataclass
class StepStats:
    num_rows: int           # requests computed this step (padding rows included)
    num_live: int           # of them, live requests (not padding): each kept what it computed
    num_tokens: int         # tokens computed: num_prefill_tokens + num_decode_tokens
    num_pages_used: int
    seconds: float
    seq_ids: tuple = ()     # the request of each row computed this step, in batch order
    padding_ids: tuple = () # those of them that were padding rows (finished, output thrown away)
    phases: dict = field(default_factory=dict)   # phase -> seconds (profiler.PHASES), if profiled
    num_prefill_tokens: int = 0   # prompt tokens (chunks, and preempted requests' recompute)
    num_decode_tokens: int = 0    # one a decoding request; padding rows count here (one each)
    end_s: float = 0.0            # time.perf_counter() at the end of the step
    num_scheduled_tokens: tuple = ()   # tokens of each row, in batch order (seq_ids')


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
    def __init__(self, model: Llama, eos_ids: list[int], config: EngineConfig,
                 profiler: StepProfiler | None = None):
        """eos_ids: the tokens that end a request (eos_token_ids(folder)); profiler: None, or a
        StepProfiler that times the phases of every step."""
        self.model, self.config = model, config
        page_size = config.page_size
        self.num_pages = config.kv_bytes // (model.kv_bytes_per_token * page_size)
        if self.num_pages < cdiv(config.max_model_len, page_size):
            raise ValueError(f"a KV budget of {config.kv_bytes:,} B holds {self.num_pages} pages "
                             f"of {page_size} tokens: not one request of {config.max_model_len} "
                             "tokens")
        # one page more than the budget's: a scratch page that static batching's padding rows
        # write into, so they never write into a page another request may share
        model.allocate_kv_cache(self.num_pages + 1, page_size)
        self.scratch_slot = self.num_pages * page_size
        self.block_manager = BlockManager(self.num_pages, page_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager)
        self.sampler = Sampler(eos_ids, config.seed)
        self.profiler = profiler or NoProfiler()
        self.sequences: list[Sequence] = []
        self.steps: list[StepStats] = []

    def add_request(self, prompt_ids: list[int], max_tokens: int, min_tokens: int = 0,
                    temperature: float = 0.0) -> Sequence:
        if len(prompt_ids) + max_tokens > self.config.max_model_len:
            raise ValueError(f"{len(prompt_ids)} prompt + {max_tokens} new tokens exceed "
                             f"max_model_len {self.config.max_model_len}")
        seq = Sequence(len(self.sequences), list(prompt_ids), max_tokens, min_tokens, temperature,
                       arrival_s=time.perf_counter())
        self.sequences.append(seq)
        self.scheduler.add(seq)
        return seq

    @torch.inference_mode()
    def step(self) -> list[Sequence]:
        """Schedule, run the model, postprocess; returns the requests that finished."""
        start = time.perf_counter()
        self.profiler.start_step()
        seqs = self.schedule()
        self.profiler.mark("scheduled")
        num_tokens, token_ids = self.run_model(seqs)
        stats = self.stats_of(seqs, num_tokens)       # as scheduled, before the finished leave
        finished = self.postprocess(seqs, token_ids)
        phases = self.profiler.end_step()
        end = time.perf_counter()
        self.steps.append(replace(stats, seconds=end - start, phases=phases, end_s=end))
        return finished

    def schedule(self) -> list[Sequence]:
        """The rows of this step (live and padding), each with its num_scheduled_tokens, their
        pages allocated."""
        seqs = self.scheduler.schedule()
        if all(s.is_padding for s in seqs):   # a step that keeps no token only repeats itself
            raise RuntimeError(self._stuck_message(seqs))
        return seqs

    def run_model(self, seqs: list[Sequence]) -> tuple[int, list[int | None]]:
        """One forward over every row's tokens, then the next token of each row that makes one:
        (tokens computed, a token id or None per row). A live request computes its next
        num_scheduled_tokens (all its tokens after admission or preemption when they fit the
        budget, a chunk of them when not, else the last one); it makes a token only if they
        reach its last known token (the logits of an earlier chunk's last row are not even
        computed). A padding row recomputes its last cached token, writing its K/V into the
        scratch slot; it is sampled like a decode (its token thrown away), so that a seeded
        sampler draws as it did before the token budget existed."""
        chunks, is_sampled = [], []
        for s in seqs:
            if s.is_padding:
                chunks.append(RequestChunk(s.token_ids[s.num_cached - 1:s.num_cached],
                                           s.num_cached - 1, s.page_table, self.scratch_slot))
                is_sampled.append(True)
            else:
                end = s.num_cached + s.num_scheduled_tokens
                is_sampled.append(end == s.num_tokens)
                chunks.append(RequestChunk(s.token_ids[s.num_cached:end], s.num_cached,
                                           s.page_table, is_sampled=is_sampled[-1]))
        batch = make_batch(chunks, self.config.page_size, self.model.heads_per_kv,
                           self.model.dtype)
        logits = self.model.forward(batch, self.profiler)          # (rows sampled, V)
        self.profiler.mark("forwarded")
        sampled = [s for s, yes in zip(seqs, is_sampled) if yes]
        new_ids = iter(self.sampler(logits, [s.temperature for s in sampled],
                                    [len(s.output_ids) >= s.min_tokens for s in sampled]))
        self.profiler.mark("sampled")
        return batch.num_rows, [next(new_ids) if yes else None for yes in is_sampled]

    def postprocess(self, seqs: list[Sequence], token_ids: list[int | None]) -> list[Sequence]:
        """Each live row's computed tokens counted in its pool, and its token, if it made one,
        handed to it (a padding row's is thrown away); the requests that made their last token
        finish and leave (or stay as padding)."""
        now = time.perf_counter()
        finished = []
        for seq, token_id in zip(seqs, token_ids):
            if seq.is_padding:
                continue
            seq.num_cached += seq.num_scheduled_tokens
            if token_id is None:             # a chunk of its prefill: no token yet
                continue
            seq.output_ids.append(token_id)
            seq.token_times_s.append(now)
            if seq.first_token_s is None:
                seq.first_token_s = now
            if (len(seq.output_ids) >= seq.max_tokens
                    or seq.num_tokens >= self.config.max_model_len
                    or (token_id in self.sampler.eos_ids and len(seq.output_ids) >= seq.min_tokens)):
                seq.finish_s = now
                finished.append(seq)
        for seq in finished:
            self.scheduler.finish(seq)
        return finished

    def stats_of(self, seqs: list[Sequence], num_tokens: int) -> StepStats:
        """The step's record as scheduled: a request that finishes in this step made its token
        here (so it is not padding yet), and its pages are still held. Padding rows count among
        the decode tokens (one each, as the budget counts them)."""
        padding_ids = tuple(s.seq_id for s in seqs if s.is_padding)
        num_decode = sum(s.num_scheduled_tokens for s in seqs if s.is_padding or s.is_decoding)
        return StepStats(num_rows=len(seqs), num_live=len(seqs) - len(padding_ids),
                         num_tokens=num_tokens, num_pages_used=self.block_manager.num_used,
                         seconds=0.0, seq_ids=tuple(s.seq_id for s in seqs),
                         padding_ids=padding_ids, num_prefill_tokens=num_tokens - num_decode,
                         num_decode_tokens=num_decode,
                         num_scheduled_tokens=tuple(s.num_scheduled_tokens for s in seqs))

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
