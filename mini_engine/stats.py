"""What each step did: its rows, tokens, pages and seconds (StepStats), kept by a StepRecorder
that the engine calls around the step. The record-keeping lives here, not in the step, so that
LLMEngine.step reads as nano-vllm's does: schedule, run the model, postprocess. Timing the
phases of a step is the profiler's (mini_engine/profiler.py), handed in by whoever asks: the
recorder starts and ends the profiler's step with its own, and keeps the phases it returns.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mini_engine.block_manager import BlockManager
    from mini_engine.profiler import NoProfiler, StepProfiler
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
    # task 12, speculative decoding: guesses computed this step (counted in num_decode_tokens:
    # a decoding row computes its last token and its guesses), of them kept, and the tokens
    # each row gained (1 to 1 + its guesses for a decode; 0 for a chunk or a padding row)
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_output_tokens: tuple = ()


class StepRecorder:
    """One StepStats a step, appended to steps, from three calls: start_step before the step
    schedules, before_postprocess once the model has run, end_step after postprocess."""

    def __init__(self, block_manager: BlockManager, profiler: StepProfiler | NoProfiler):
        self.block_manager, self.profiler = block_manager, profiler
        self.steps: list[StepStats] = []
        self._start_s = 0.0
        self._stats: StepStats | None = None
        self._num_outputs: list[int] = []
        self._num_accepted = 0

    def start_step(self) -> None:
        self._start_s = time.perf_counter()
        self.profiler.start_step()

    def before_postprocess(self, seqs: list[Sequence], num_tokens: int) -> None:
        """The step as scheduled, read before postprocess changes it: a request that finishes
        in this step made its token here (so it is not padding yet) and still holds its pages.
        Padding rows count among the decode tokens (one each, as the budget counts them)."""
        padding_ids = tuple(s.seq_id for s in seqs if s.is_padding)
        num_decode = sum(s.num_scheduled_tokens for s in seqs if s.is_padding or s.is_decoding)
        self._stats = StepStats(
            num_rows=len(seqs), num_live=len(seqs) - len(padding_ids), num_tokens=num_tokens,
            num_pages_used=self.block_manager.num_used, seconds=0.0,
            seq_ids=tuple(s.seq_id for s in seqs), padding_ids=padding_ids,
            num_prefill_tokens=num_tokens - num_decode, num_decode_tokens=num_decode,
            num_scheduled_tokens=tuple(s.num_scheduled_tokens for s in seqs),
            num_draft_tokens=sum(len(s.spec_token_ids) for s in seqs))
        # what postprocess hands out is read as a difference, per row and in all
        self._num_outputs = [len(s.output_ids) for s in seqs]
        self._num_accepted = sum(s.num_accepted_tokens for s in seqs)

    def end_step(self, seqs: list[Sequence]) -> None:
        """The step's record completed by what postprocess gave each row, and appended."""
        phases = self.profiler.end_step()
        end_s = time.perf_counter()
        self.steps.append(replace(
            self._stats, seconds=end_s - self._start_s, phases=phases, end_s=end_s,
            num_accepted_tokens=sum(s.num_accepted_tokens for s in seqs) - self._num_accepted,
            num_output_tokens=tuple(len(s.output_ids) - n
                                    for s, n in zip(seqs, self._num_outputs))))
