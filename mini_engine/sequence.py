"""A request as the engine sees it (nano-vllm's Sequence, vLLM's Request).

There is no prefill phase and no decode phase, only tokens known (num_tokens: the prompt and
what was generated) against tokens whose K/V is computed (num_cached), as vLLM V1 frames it. A
step computes the next num_scheduled_tokens of them; when that reaches the last known token,
its logits make the next token. A request "decodes" when one token is left to compute, the one
it just made; before that it is in its prefill (a prompt, or a preempted request's prompt and
output computed again), possibly cut into chunks across steps. With speculative decoding a
decoding request also computes its guesses (spec_token_ids) after that token; the ones the model
agrees with become its tokens, the rest are dropped with their K/V (mini_engine/engine.py)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class State(enum.Enum):
    WAITING = "waiting"        # not admitted yet
    RUNNING = "running"        # in the batch, its K/V in the pool
    PREEMPTED = "preempted"    # its pages were taken back; waits to be recomputed from its tokens
    FINISHED = "finished"


@dataclass
class Sequence:
    seq_id: int
    prompt_ids: list[int]
    max_tokens: int               # new tokens to generate
    min_tokens: int = 0           # end-of-sequence is not sampled before this many (vLLM min_tokens)
    temperature: float = 0.0      # 0 = greedy
    output_ids: list[int] = field(default_factory=list)
    page_table: list[int] = field(default_factory=list)   # logical page i -> physical page id
    num_cached: int = 0           # tokens whose K and V are in the pool
    num_cached_at_admission: int = 0   # of them, found in the prefix cache when last admitted
    num_scheduled_tokens: int = 0 # tokens this step computes: token_ids[num_cached:num_cached + n]
                                  # then its guesses (1 + len(spec_token_ids) for a decode)
    spec_token_ids: list[int] = field(default_factory=list)   # this step's guesses (task 12):
                                  # computed after its last token, not its tokens until kept
    page_hashes: list = field(default_factory=list)   # prefix hash of each full page, chained
    num_registered: int = 0       # full pages put in the prefix cache so far
    output_was_guess: list[bool] = field(default_factory=list)   # per output token: an accepted
                                  # guess (True) or the model's own token (False)
    num_draft_tokens: int = 0     # guesses verified over its life (vLLM's num_draft_tokens)
    num_accepted_tokens: int = 0  # of them, kept (vLLM's num_accepted_tokens)
    state: State = State.WAITING
    is_padding: bool = False      # static batching: finished, but its row is still computed
    num_preemptions: int = 0
    arrival_s: float = 0.0
    first_token_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)   # perf_counter at each output token
    finish_s: float | None = None

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_new_tokens(self) -> int:
        """Tokens known but not computed yet (vLLM's num_tokens - num_computed_tokens)."""
        return self.num_tokens - self.num_cached

    @property
    def is_decoding(self) -> bool:
        """One token left to compute, and it is one this request generated to go on from (a
        padding row's request is done: it is no decode)."""
        return not self.is_padding and bool(self.output_ids) and self.num_new_tokens == 1

    @property
    def is_finished(self) -> bool:
        return self.state is State.FINISHED

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def latency_s(self) -> float:
        return self.finish_s - self.arrival_s
