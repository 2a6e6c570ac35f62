"""The engine: add_request, step, run. A step is nano-vllm's three moves: schedule (who runs this
step, how many of their tokens within the step's token budget, their pages), run the model (one
forward over every scheduled request's tokens, then the next token of each request whose last
known token was computed), postprocess (each token handed to its request; the finished ones
leave).

Speculative decoding (EngineConfig.num_speculative_tokens): the scheduler gives each
decoding request up to k guesses of its next tokens (mini_engine/proposer.py, an n-gram lookup in
its own tokens); the forward computes its last token and the guesses after it as one chunk of
1 + g rows, their logits checked by the verifier (Sampler.verify); the request keeps the guesses
the model agrees with and one token of the model's own, and drops the rest with their K/V
(postprocess): when reading the weights bounds a step, 1 + g rows cost about what one does.

Its KV budget is given in bytes, as vLLM's kv_cache_memory_bytes, and cut into whole pages. The
pool those pages live in is the engine's (allocate_kv_cache), handed to every forward, not the
model's: as vLLM's model runner holds the KV cache beside the model, several engines may share
one loaded Llama, each with its own K/V.

The step runs in plain torch, or with mini_engine/kernels/ (EngineConfig.kernels, which sets
the engine's product, batch maker, 8-bit pool and forward). The time of each phase of a step is
the caller's to ask for (a StepProfiler, mini_engine/profiler.py); without one an engine records
each step's rows, tokens, pages and seconds (StepStats in engine.steps, kept by a StepRecorder,
mini_engine/stats.py, that the step calls around its three moves).
"""
from __future__ import annotations

import itertools
import json
import time
from itertools import accumulate
from pathlib import Path

import torch
import torch.nn.functional as F

from mini_engine import kv_quant
from mini_engine.block_manager import BlockManager, cdiv
from mini_engine.config import EngineConfig
from mini_engine.model import Llama, RequestChunk, make_batch
from mini_engine.profiler import NoProfiler, StepProfiler
from mini_engine.sampler import Sampler
from mini_engine.scheduler import Scheduler
from mini_engine.sequence import Sequence
from mini_engine.stats import StepRecorder, StepStats


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
        # a token's bytes follow from the cache's dtype, its scales included
        self.kv_bytes_per_token = kv_quant.bytes_per_token(
            model.num_layers, model.num_kv_heads, model.head_dim, config.kv_cache_dtype,
            config.kv_scale, model.dtype)
        self.num_pages = config.kv_bytes // (self.kv_bytes_per_token * page_size)
        if self.num_pages < cdiv(config.max_model_len, page_size):
            raise ValueError(f"a KV budget of {config.kv_bytes:,} B holds {self.num_pages} pages "
                             f"of {page_size} tokens: not one request of {config.max_model_len} "
                             "tokens")
        # the torch way; EngineConfig.kernels swaps in mini_engine/kernels/ where they build
        self.linear, self.in_place, self.compiled, self.products = F.linear, None, None, None
        self.quantized_pool = kv_quant.QuantizedPool
        if config.kernels != "torch":
            from mini_engine import kernels
            kernels.take(self)
        # one page more than the budget's: a scratch page that static batching's padding rows
        # write into, so they never write into a page another request may share
        self.kv_cache = self.allocate_kv_cache(self.num_pages + 1)
        self.scratch_slot = self.num_pages * page_size
        self.forward = self.compiled.forward if self.compiled else model.forward
        self.block_manager = BlockManager(self.num_pages, page_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager)
        self.sampler = Sampler(eos_ids, config.seed)
        self.profiler = profiler or NoProfiler()
        self.recorder = StepRecorder(self.block_manager, self.profiler)
        self.sequences: list[Sequence] = []
        self._ids = itertools.count()   # a request's id, never reused
        self.steps: list[StepStats] = self.recorder.steps

    def kernels_used(self) -> dict[str, str]:
        """What this engine runs, part by part, for a report."""
        torch_pool = self.quantized_pool is kv_quant.QuantizedPool
        return {"attention": "C, blocks in place" if self.in_place else "torch, gathered + SDPA",
                "products": self.products.name if self.products else "F.linear",
                "8-bit cache": ("-" if self.config.kv_cache_dtype == "auto" else
                                "torch" if torch_pool else "C"),
                "forward": "compiled" if self.compiled else "eager"}

    def allocate_kv_cache(self, num_pages: int) -> list[torch.Tensor]:
        """This engine's own pools, one a layer (Llama.kv_cache_shape), handed to every forward.
        The engine holds them and the model none, as vLLM's model runner does: a second engine on
        the same Llama allocates its own and leaves this one's K/V alone."""
        c, m = self.config, self.model
        if c.kv_cache_dtype != "auto":        # 8-bit values, and their scales
            return [self.quantized_pool.allocate(num_pages * c.page_size, m.num_kv_heads,
                                                 m.head_dim, c.kv_cache_dtype, c.kv_scale)
                    for _ in m.layers]
        shape = m.kv_cache_shape(num_pages, c.page_size)
        return [torch.zeros(shape, dtype=m.dtype) for _ in m.layers]

    def warm_up(self):
        """kernels "compiled": compile the graph every step runs before the first step, by running
        a forward of 1 row and one of 2 (kernels/compiled.py: one row runs as two, so both are
        the graph for T >= 2) into the scratch page, which no request reads. Returns its WarmUp
        (seconds, graphs made); None otherwise, where there is nothing to warm."""
        if self.compiled is None:
            return None
        page_size, scratch_page = self.config.page_size, self.num_pages
        batches = [self.batch_of([RequestChunk(list(range(n)), 0,
                                               [scratch_page] * cdiv(n, page_size),
                                               self.scratch_slot)])
                   for n in (1, 2)]
        with torch.inference_mode():
            return self.compiled.warm_up(batches, self.kv_cache, self.linear)

    def add_request(self, prompt_ids: list[int], max_tokens: int, min_tokens: int = 0,
                    temperature: float = 0.0) -> Sequence:
        if len(prompt_ids) + max_tokens > self.config.max_model_len:
            raise ValueError(f"{len(prompt_ids)} prompt + {max_tokens} new tokens exceed "
                             f"max_model_len {self.config.max_model_len}")
        seq = Sequence(next(self._ids), list(prompt_ids), max_tokens, min_tokens, temperature,
                       arrival_s=time.perf_counter())
        self.sequences.append(seq)
        self.scheduler.add(seq)
        return seq

    @torch.inference_mode()
    def step(self) -> list[Sequence]:
        """Schedule, run the model, postprocess; returns the requests that finished. The
        recorder (mini_engine/stats.py) keeps the step's StepStats in self.steps."""
        self.recorder.start_step()
        seqs = self.schedule()
        num_tokens, new_ids = self.run_model(seqs)
        self.recorder.before_postprocess(seqs, num_tokens)  # before the finished leave
        finished = self.postprocess(seqs, new_ids)
        self.recorder.end_step(seqs)
        return finished

    def schedule(self) -> list[Sequence]:
        """The rows of this step (live and padding), each with its num_scheduled_tokens, their
        pages allocated."""
        seqs = self.scheduler.schedule()
        if all(s.is_padding for s in seqs):   # a step that keeps no token only repeats itself
            raise RuntimeError(self._stuck_message(seqs))
        self.profiler.mark("scheduled")
        return seqs

    def run_model(self, seqs: list[Sequence]) -> tuple[int, list[list[int]]]:
        """One forward over every row's tokens, then the tokens each row makes: (tokens
        computed, the new tokens of each row). A live request computes its next
        num_scheduled_tokens (all its tokens after admission or preemption when they fit the
        budget, a chunk of them when not, else the last one); it makes a token only if they
        reach its last known token (the logits of an earlier chunk's last row are not even
        computed): [] for a chunk short of it. A decoding request with guesses
        computes its last token and the guesses after it, and keeps 1 to g + 1 tokens
        (Sampler.verify). A padding row recomputes its last cached token, writing its K/V into
        the scratch slot; it is sampled like a decode (its token thrown away), so that a seeded
        sampler draws as it did before the token budget existed."""
        chunks = []
        for s in seqs:
            if s.is_padding:
                chunks.append(RequestChunk(s.token_ids[s.num_cached - 1:s.num_cached],
                                           s.num_cached - 1, s.page_table, self.scratch_slot))
                continue
            num_known = s.num_scheduled_tokens - len(s.spec_token_ids)
            end = s.num_cached + num_known
            num_logits = 1 + len(s.spec_token_ids) if end == s.num_tokens else 0
            chunks.append(RequestChunk(s.token_ids[s.num_cached:end] + s.spec_token_ids,
                                       s.num_cached, s.page_table, num_logits=num_logits))
        batch = self.batch_of(chunks)
        logits = self.forward(batch, self.kv_cache, self.profiler, self.linear)   # (rows, V)
        self.profiler.mark("forwarded")
        new_ids = self.sample(seqs, chunks, logits)
        self.profiler.mark("sampled")
        return batch.num_rows, new_ids

    def batch_of(self, chunks: list[RequestChunk]):
        """The forward's inputs for these chunks, attending as this engine's settings say."""
        return make_batch(chunks, self.config.page_size, self.model.heads_per_kv,
                          self.model.dtype, in_place=self.in_place)

    def sample(self, seqs: list[Sequence], chunks: list[RequestChunk], logits: torch.Tensor
               ) -> list[list[int]]:
        """The tokens of each row from its logits: the rows without guesses in one call of the
        sampler (as before speculative decoding, so a seeded sampler draws the same), then each
        row with guesses verified on its own 1 + g rows of logits."""
        first = list(accumulate((c.num_logits for c in chunks), initial=0))  # each row's first
        plain = [i for i, c in enumerate(chunks) if c.num_logits == 1]
        eos_ok = [len(seqs[i].output_ids) >= seqs[i].min_tokens for i in plain]
        rows = [first[i] for i in plain]
        # without guesses every row is plain, in order: its logits need no copy
        tokens = self.sampler(logits if rows == list(range(len(logits))) else logits[rows],
                              [seqs[i].temperature for i in plain], eos_ok)
        new_ids = [[] for _ in seqs]
        for i, token in zip(plain, tokens):
            new_ids[i] = [token]
        for i, (seq, chunk) in enumerate(zip(seqs, chunks)):
            if chunk.num_logits > 1:
                rows = logits[first[i]:first[i] + chunk.num_logits]
                # row j makes output token len(output) + j: EOS allowed from min_tokens on
                new_ids[i] = self.sampler.verify(
                    rows, seq.spec_token_ids, seq.temperature,
                    [len(seq.output_ids) + j >= seq.min_tokens for j in range(chunk.num_logits)])
        return new_ids

    def postprocess(self, seqs: list[Sequence], new_ids: list[list[int]]) -> list[Sequence]:
        """Each live row's computed tokens counted in its pool, and its new tokens handed to it
        (a padding row's are thrown away); the requests that made their last token finish and
        leave (or stay as padding). A row that verified guesses keeps the K/V of its last token
        and of the guesses it kept; the rest are rejected: its cached length goes back to
        num_tokens - 1, as after any decode, and the pages only they were written into go back
        to the pool (their K/V is overwritten before anyone reads it: a position is attended only
        once it is computed again)."""
        now = time.perf_counter()
        finished = []
        for seq, tokens in zip(seqs, new_ids):
            if seq.is_padding:
                continue
            seq.num_cached += seq.num_scheduled_tokens - len(seq.spec_token_ids)
            if not tokens:                   # a chunk of its prefill: no token yet
                continue
            # the verifier keeps the guesses it agrees with, then one token of the model's own;
            # an end of sequence among them cuts the run there
            kept = self._cut_at_eos(seq, tokens)
            guessed, tokens = min(len(tokens) - 1, len(kept)), kept
            if seq.spec_token_ids:
                seq.num_draft_tokens += len(seq.spec_token_ids)
                seq.num_accepted_tokens += guessed
                seq.num_cached += guessed    # the kept guesses' K/V is computed and right
                self.block_manager.roll_back(seq, seq.num_cached)
            seq.output_ids += tokens
            seq.output_was_guess += [True] * guessed + [False] * (len(tokens) - guessed)
            seq.token_times_s += [now] * len(tokens)
            if seq.first_token_s is None:
                seq.first_token_s = now
            if (len(seq.output_ids) >= seq.max_tokens
                    or seq.num_tokens >= self.config.max_model_len
                    or (tokens[-1] in self.sampler.eos_ids
                        and len(seq.output_ids) >= seq.min_tokens)):
                seq.finish_s = now
                finished.append(seq)
        for seq in finished:
            self.scheduler.finish(seq)
        return finished

    def abort(self, seq: Sequence) -> None:
        """Stop seq between steps: it makes no more tokens, and its pages go back."""
        if not seq.is_finished:
            self.scheduler.abort(seq)

    def _cut_at_eos(self, seq: Sequence, tokens: list[int]) -> list[int]:
        """The tokens up to and with the first end-of-sequence the request may end at (from
        min_tokens on): a kept run of guesses stops there, as one token a step would have."""
        for j, token in enumerate(tokens):
            if token in self.sampler.eos_ids and len(seq.output_ids) + j + 1 >= seq.min_tokens:
                return tokens[:j + 1]
        return tokens

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
