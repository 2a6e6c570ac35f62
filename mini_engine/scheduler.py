"""Who runs in this step: the one place where continuous and static batching differ.

continuous  at every step, admit waiting requests while a batch slot and the pages their tokens
            need are free; a finished request leaves at once and its slot is refilled next step
            (Orca's iteration-level scheduling, vLLM's scheduler).
static      take up to max_batch requests and run that batch until its longest request is done;
            only then admit the next batch. With pad_finished (transformers `generate`, the
            classic serving systems) a finished request stays in the batch as padding: its row is
            still computed and its tokens thrown away. Without it, finished rows leave the
            compute but their slots stay idle until the batch ends.

Both: before admitting anyone, every running request gets room for its next token; when the
pool is short, a padding row is dropped first (it loses nothing), else the newest running request
is preempted (its pages freed, itself requeued at the front to be recomputed from its tokens), as
vLLM does.

When is a static batch over? When none of its rows is live: every request in it has finished (and
stays, if at all, only as padding) or was preempted back to the queue. Its padding rows then go and
the next batch is admitted. The rule is checked wherever a row stops being live (a request
finishes, a request is preempted), so a batch of padding alone is never computed.

Progress: every step computes at least one live request (the pool holds one request of
max_model_len, and an emptied batch admits the head of the queue), and every live row computed
adds one token to its request. So a workload ends within sum(max_tokens) steps.
"""
from __future__ import annotations

from collections import deque

from mini_engine.block_manager import BlockManager
from mini_engine.config import EngineConfig
from mini_engine.sequence import Sequence, State


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        self.block_manager = block_manager
        self.max_batch = config.max_batch
        self.policy = config.policy          # checked by EngineConfig
        self.pad_finished = config.pad_finished and config.policy == "static"
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []      # in admission order: the newest is last
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Sequence]:
        """The sequences this step computes (live and padding rows), pages allocated."""
        self._make_room_for_running()
        if self.policy == "continuous" or not self.running:
            self._admit()
        return list(self.running)

    @property
    def num_live(self) -> int:
        """Running requests whose tokens are kept (the rest are padding rows)."""
        return sum(not s.is_padding for s in self.running)

    def _make_room_for_running(self) -> None:
        """A page for every live request's next token; when short, drop or preempt rows."""
        for seq in list(self.running):
            if seq not in self.running or seq.is_padding:   # preempted meanwhile / needs no room
                continue
            while not self.block_manager.can_allocate(seq, seq.num_tokens):
                self._preempt(self._victim())
                if seq not in self.running:
                    break
            else:
                self.block_manager.allocate(seq, seq.num_tokens)

    def _victim(self) -> Sequence:
        """Who gives up their pages: the newest padding row (dropping it loses nothing), else the
        newest live request (vLLM preempts the lowest-priority, i.e. latest, request)."""
        padding = [s for s in self.running if s.is_padding]
        return (padding or self.running)[-1]

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_batch:
            seq = self.waiting[0]
            if not self.block_manager.can_admit(seq):
                break          # first come, first served: nobody overtakes the head of the line
            self.waiting.popleft()
            self.block_manager.admit(seq)      # its cached prefix shared, new pages for the rest
            seq.state = State.RUNNING
            self.running.append(seq)

    def _remove(self, seq: Sequence) -> None:
        """seq leaves the batch and gives its pages back."""
        self.running.remove(seq)
        self.block_manager.free(seq)

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

    def _end_batch_if_over(self) -> None:
        """A batch with no live row is over: its padding rows go (static batching; under the
        continuous policy no row is ever padding, so this never fires there)."""
        if self.num_live == 0:
            for padding in list(self.running):
                self._remove(padding)
