"""Who runs in this step, and how many of their tokens: one token budget a step, as vLLM V1's
schedule() spends it (max_num_batched_tokens). There is no prefill or decode phase, only each
request's tokens computed so far against its tokens known so far (mini_engine/sequence.py).

The budget, in this order:
1. running requests that decode take one token each (and static batching's padding rows, which
   recompute one token: they cost one token of budget, like a decode, since their row is
   computed like one). EngineConfig refuses a budget below the batch cap, so this always fits:
   a request streaming its answer never waits for someone's prompt (Sarathi's stall-free batch);
2. running requests still in their prefill take their next chunk, min(tokens left, budget left),
   in admission order;
3. with speculative decoding (task 12, num_speculative_tokens k > 0), each decoding request
   gets up to k guesses from the proposer (mini_engine/proposer.py), verified after its last
   token in the same forward. They come after the prefill chunks, so a guess never takes the
   budget a prompt's chunk had (the progress argument below holds unchanged), and they are cut
   so that all they may keep fits: the budget left, max_tokens and max_model_len (the g guesses
   and the model's token after them), and the pages free now: a guess never preempts anyone.
   They are not registered in the prefix cache: only the request's known tokens are;
4. waiting requests are admitted first come, first served, while a batch slot, budget and the
   pages of what they compute are left, each with its first chunk. Its prefix-cache hit is
   resolved first, so the chunk starts after the cached pages (a chunk sized before the hit is
   known would be cut too short, or start at the wrong token).
With enable_chunked_prefill off, a request in its prefill is scheduled only if its whole
remainder fits the budget left (vLLM's --no-enable-chunked-prefill); so a prompt is computed in
one step, and the config holds a budget of at least max_model_len.

A request samples a token only in the step that computes its last known token; the steps of its
earlier chunks make none. Pages are allocated for what a step computes, and a page is registered
in the prefix cache in the step that computes it (mini_engine/block_manager.py says why that is
safe in the same forward), after the running requests have their pages: a request preempted in
a step registers nothing in it.

continuous  at every step, admit waiting requests as above; a finished request leaves at once
            and its slot is refilled next step (Orca's iteration-level scheduling, vLLM's).
static      take up to max_batch requests and run that batch until its longest request is done;
            only then admit the next batch. With pad_finished (transformers `generate`, the
            classic serving systems) a finished request stays in the batch as padding: its row is
            still computed and its tokens thrown away. Without it, finished rows leave the
            compute but their slots stay idle until the batch ends. A small budget admits fewer
            requests into a batch (the budget is spent on the first ones' chunks).

Both: a running request gets the pages of its tokens this step before anyone is admitted; when
the pool is short, a padding row is dropped first (it loses nothing), else the newest running
request is preempted (its pages freed, itself requeued at the front to be recomputed from its
tokens, where its own pages may still be cached), as vLLM does. Unlike vLLM, which admits no
one in a step that preempted, the waiting queue is still served after a preemption (its head,
the request just preempted, may fit again at once), as mini_engine did before the budget.

When is a static batch over? When none of its rows is live: every request in it has finished (and
stays, if at all, only as padding) or was preempted back to the queue. Its padding rows then go and
the next batch is admitted. The rule is checked wherever a row stops being live (a request
finishes, a request is preempted), so a batch of padding alone is never computed.

Progress. The live requests stay in arrival order: the running ones first (in admission order),
then the waiting queue (admission moves its head to the back of running, preemption the newest
running request to its front). So the oldest unfinished request r is the first running one, or,
if it waits, nothing live runs and it is admitted (the pool holds one request of max_model_len,
the budget at least one token, or without chunks a whole max_model_len). It is never preempted:
only the newest is, and r alone fits the pool. With a budget B and a cap M, each step computes
r's one decode token, or at least d = B - M + 1 tokens of its prefill (or all that are left):
its chunk comes first after at most M - 1 decodes and padding rows. Had r made k tokens before
a preemption, its prefill is p + k tokens (p its prompt): at most ceil((p + k) / d) <= ceil(p /
d) + k steps, its (k + 1)-th token made in the last, then one step for each of its n - k - 1
tokens left. So while r is the oldest, at most ceil(p / d) + n - 1 steps pass, and a workload
ends within

    step_bound = sum over requests of ceil(len(prompt) / (B - M + 1)) + max_tokens - 1 steps:

sum(max_tokens) when B - M + 1 is at least the longest prompt (each prompt in one step: the bound
of tasks 9 and 10, every step makes a token), sum(len(prompt) + max_tokens - 1) at B = M = 1.
Speculative decoding keeps the bound: guesses take only budget left after the chunks and pages
left free, and a decode that verifies guesses still makes at least its one token (it may make
more, so a workload can only end sooner).
"""
from __future__ import annotations

from collections import deque

from mini_engine.block_manager import BlockManager, cdiv
from mini_engine.config import EngineConfig
from mini_engine.proposer import NgramProposer
from mini_engine.sequence import Sequence, State


def step_bound(prompt_lens: list[int], max_tokens: list[int], budget: int, max_batch: int) -> int:
    """The most steps a workload takes (the module docstring proves it): each request's prefill
    at B - M + 1 tokens a step at least, then one step for each token after its first."""
    per_step = budget - max_batch + 1
    return sum(cdiv(p, per_step) + n - 1 for p, n in zip(prompt_lens, max_tokens))


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        self.block_manager = block_manager
        self.max_batch = config.max_batch
        self.policy = config.policy          # checked by EngineConfig
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.enable_chunked_prefill = config.enable_chunked_prefill
        self.token_budget = config.max_num_batched_tokens   # left in the step being scheduled
        self.pad_finished = config.pad_finished and config.policy == "static"
        self.max_model_len = config.max_model_len
        self.proposer = (NgramProposer(config.num_speculative_tokens, config.prompt_lookup_min,
                                       config.prompt_lookup_max)
                         if config.num_speculative_tokens else None)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []      # in admission order: the newest is last
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Sequence]:
        """The sequences this step computes (live and padding rows), in admission order, each
        with its num_scheduled_tokens and the pages for them."""
        for seq in self.running:
            seq.num_scheduled_tokens = 0
            seq.spec_token_ids = []
        self.token_budget = self.max_num_batched_tokens       # left to spend in this step
        for seq in list(self.running):                        # 1. decodes and padding rows
            if seq in self.running and (seq.is_padding or seq.is_decoding):
                self._schedule_running(seq, 1)
        for seq in list(self.running):                        # 2. the next chunk of a prefill
            if seq in self.running and not (seq.is_padding or seq.is_decoding):
                num_tokens = self._chunk(seq.num_new_tokens)
                if num_tokens:
                    self._schedule_running(seq, num_tokens)
        for seq in self.running:      # no one is preempted past here: what runs is known
            if seq.num_scheduled_tokens and not seq.is_padding:
                self.block_manager.register_full_pages(
                    seq, seq.num_cached + seq.num_scheduled_tokens)
        if self.proposer:             # after the registration: no guess enters the cache
            for seq in self.running:
                if seq.num_scheduled_tokens and seq.is_decoding:
                    self._schedule_guesses(seq)
        if self.policy == "continuous" or not self.running:
            self._admit()                                     # 4. waiting requests
        return [seq for seq in self.running if seq.num_scheduled_tokens]

    @property
    def num_live(self) -> int:
        """Running requests whose tokens are kept (the rest are padding rows)."""
        return sum(not s.is_padding for s in self.running)

    def _chunk(self, num_new_tokens: int) -> int:
        """Tokens of a prefill this step computes: as many as the budget left allows, or,
        without chunking, all of them or none."""
        if self.enable_chunked_prefill:
            return min(num_new_tokens, self.token_budget)
        return num_new_tokens if num_new_tokens <= self.token_budget else 0

    def _schedule_running(self, seq: Sequence, num_tokens: int) -> None:
        """num_tokens of a running request this step, and their pages (a padding row writes into
        the scratch slot: none). When the pool is short, drop or preempt rows, the newest first;
        if that is seq itself, it is not scheduled."""
        if not seq.is_padding:
            while not self.block_manager.can_allocate(seq, seq.num_cached + num_tokens):
                victim = self._victim()
                self._preempt(victim)
                if victim is seq:
                    return
            self.block_manager.allocate(seq, seq.num_cached + num_tokens)
        seq.num_scheduled_tokens = num_tokens
        self.token_budget -= num_tokens

    def _schedule_guesses(self, seq: Sequence) -> None:
        """A decoding request's guesses, verified in this step after its last token (task 12).
        They are cut so that everything the step may keep fits: all g guesses and the model's
        token after them within max_tokens and max_model_len; g tokens of the budget left; the
        pages free now (a guess never preempts anyone: it is only a guess)."""
        limit = min(self.token_budget, seq.max_tokens - len(seq.output_ids) - 1,
                    self.max_model_len - seq.num_tokens - 1)
        guesses = self.proposer.propose(seq.token_ids, limit) if limit > 0 else []
        while guesses and not self.block_manager.can_allocate(
                seq, seq.num_cached + 1 + len(guesses)):
            guesses.pop()
        if guesses:
            self.block_manager.allocate(seq, seq.num_cached + 1 + len(guesses))
            seq.spec_token_ids = guesses
            seq.num_scheduled_tokens += len(guesses)
            self.token_budget -= len(guesses)

    def _victim(self) -> Sequence:
        """Who gives up their pages: the newest padding row (dropping it loses nothing), else the
        newest live request (vLLM preempts the lowest-priority, i.e. latest, request)."""
        padding = [s for s in self.running if s.is_padding]
        return (padding or self.running)[-1]

    def _admit(self) -> None:
        """Waiting requests, first come first served, each with its first chunk, sized after its
        prefix-cache hit: nobody overtakes the head of the line."""
        page_size = self.block_manager.page_size
        while self.waiting and len(self.running) < self.max_batch and self.token_budget > 0:
            seq = self.waiting[0]
            num_hit = len(self.block_manager.cached_prefix(seq)) * page_size
            num_tokens = self._chunk(seq.num_tokens - num_hit)
            if not num_tokens or not self.block_manager.can_admit(seq, num_hit + num_tokens):
                break
            self.waiting.popleft()
            # its cached prefix shared, pages for the chunk, the chunk's full pages registered
            self.block_manager.admit(seq, num_hit + num_tokens)
            seq.state = State.RUNNING
            seq.num_scheduled_tokens = num_tokens
            self.token_budget -= num_tokens
            self.running.append(seq)

    def _remove(self, seq: Sequence) -> None:
        """seq leaves the batch and gives its pages back (and, while a step is scheduled, the
        budget of its tokens)."""
        self.running.remove(seq)
        self.block_manager.free(seq)
        self.token_budget += seq.num_scheduled_tokens
        seq.num_scheduled_tokens = 0
        seq.spec_token_ids = []

    def _preempt(self, seq: Sequence) -> None:
        self._remove(seq)
        if not seq.is_padding:      # a padding row is already finished: nothing to recompute
            seq.state = State.PREEMPTED
            seq.num_preemptions += 1
            self.num_preemptions += 1
            self.waiting.appendleft(seq)
        self._end_batch_if_over()

    def finish(self, seq: Sequence) -> None:
        """seq made its last token: it leaves (and its pages go back), or stays as padding."""
        seq.state = State.FINISHED
        if self.pad_finished:
            seq.is_padding = True
        else:
            self._remove(seq)
        self._end_batch_if_over()

    def abort(self, seq: Sequence) -> None:
        """seq is stopped before its end (its client went away): it leaves the line or the
        batch, and its pages go back at once."""
        if seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.running:
            self._remove(seq)
            self._end_batch_if_over()
        seq.state = State.FINISHED

    def _end_batch_if_over(self) -> None:
        """A batch with no live row is over: its padding rows go (static batching; under the
        continuous policy no row is ever padding, so this never fires there)."""
        if self.num_live == 0:
            for padding in list(self.running):
                self._remove(padding)
