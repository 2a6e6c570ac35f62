"""The engine's step loop, apart from the event loop, and one output queue a request (vLLM's
AsyncLLM, its engine core and its output handler, folded into one process).

The step never runs in the event loop: a step takes tens of milliseconds, and the HTTP server
must go on taking requests, streaming tokens and noticing clients that leave while it runs.
So one thread owns the LLMEngine alone and steps it, and the event loop, in a thread of its
own, talks to it through an inbox:

    event loop                              step loop
    add(request)     -- Add(request) -->    engine.add_request, before the next step
    abort(request)   -- Abort(request) -->  engine.abort: its pages go back at once
    stop()           -- Stop() -->          the loop returns (close() answers what is left)
    request.queue    <-- one call a step -- each request's new tokens, and how it ended

The inbox carries those three messages, each a small dataclass: the step loop tells them apart
by their class, not by a string tag, and each names what it carries.

A request that arrives while a step runs joins the batch at the next one (continuous
batching). The step loop also keeps /metrics (ServerMetrics): it is where the figures happen.

The step loop runs in the process's main thread and uvicorn's event loop in a second one
(__main__.py), not the other way round: the same engine stepped from a second thread made 400
tokens/s where the main thread made 600 (torch's OpenMP threads, on this 2-core machine;
docs/server.md).
"""
from __future__ import annotations

import asyncio
import queue
import time
import traceback
from dataclasses import dataclass, field

from mini_engine.engine import LLMEngine
from mini_engine.sequence import Sequence, State
from mini_engine.server.metrics import ServerMetrics


@dataclass
class Output:
    """What one step gave one request."""
    token_ids: list[int]
    finish_reason: str | None = None   # "stop" (end of sequence), "length", "abort" or None
    error: str | None = None           # the engine failed; the request is over


@dataclass
class Request:
    """A request as the front door holds it: what it asked for, and its own output queue
    (asyncio's, read by its HTTP handler; written only through the event loop)."""
    prompt_ids: list[int]
    max_tokens: int
    min_tokens: int = 0
    temperature: float = 0.0
    arrival_s: float = field(default_factory=time.perf_counter)
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    seq: Sequence | None = None        # the engine's, once the step loop has added it
    num_sent: int = 0                  # output tokens handed to the queue
    num_drafts: int = 0                # guesses verified so far (for the speculation counters)
    admitted: bool = False             # its prompt counted in the prefix cache's lookups
    last_token_s: float = 0.0


# --- the inbox's messages (event loop -> step loop) -------------------------------------------
@dataclass
class Add:
    """A new request: it joins the engine before the next step."""
    request: Request


@dataclass
class Abort:
    """A request ended early, and why (AsyncEngine.abort names the reasons)."""
    request: Request
    reason: str = "abort"


@dataclass
class Stop:
    """The step loop returns (the server is stopping)."""


InboxMessage = Add | Abort | Stop   # what the inbox carries


class EngineDead(RuntimeError):
    """The engine's step failed: the server can take no more requests."""


class AsyncEngine:
    def __init__(self, engine: LLMEngine, metrics: ServerMetrics):
        self.engine, self.metrics = engine, metrics
        self.inbox: queue.SimpleQueue[InboxMessage] = queue.SimpleQueue()
        self.active: dict[int, Request] = {}                  # by id(request), in the engine
        self.loop: asyncio.AbstractEventLoop | None = None
        self.error: str | None = None      # why new requests are refused (None: they are not)
        self.failed: str | None = None     # a step failed: why
        self.preemptions_seen = 0          # the scheduler's count /metrics has counted

    # --- the event loop's side ----------------------------------------------------------------
    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop the outputs go to (the server's, once it runs)."""
        self.loop = loop

    def stop(self) -> None:
        """The step loop returns (from any thread)."""
        self.inbox.put(Stop())

    def add(self, request: Request) -> None:
        if self.error:
            raise EngineDead(self.error)
        self.inbox.put(Add(request))

    def abort(self, request: Request, reason: str = "abort") -> None:
        """The request is over before its end: its client left ("abort"), or a stop string
        ended it ("stop", as /metrics counts it)."""
        self.inbox.put(Abort(request, reason))

    # --- the step loop ----------------------------------------------------------------------------
    def run(self) -> None:
        """Step while there is work, wait for the inbox while there is none, until stop()."""
        try:
            while True:
                # wait while there is nothing to step (a timeout, so Ctrl-C is heard); otherwise
                # take what came, and step
                messages: list[InboxMessage] = []
                while not messages and not self.engine.scheduler.has_work:
                    try:
                        messages.append(self.inbox.get(timeout=0.5))
                    except queue.Empty:
                        pass
                while not self.inbox.empty():
                    messages.append(self.inbox.get())
                if any(isinstance(m, Stop) for m in messages):
                    for m in messages:            # back in the inbox: close() answers them
                        self.inbox.put(m)
                    return
                for m in messages:
                    if isinstance(m, Add):
                        self._add(m.request)
                    else:
                        self._abort(m.request, m.reason)
                self._update_gauges()         # an abort frees pages even with no step after it
                if self.engine.scheduler.has_work:
                    self._step()
        except Exception as e:   # a failed step: every request is told, the server stops
            traceback.print_exc()
            self.failed = f"the engine failed: {type(e).__name__}: {e}"
            self.close(self.failed)

    def close(self, why: str = "the server is shutting down") -> None:
        """No more steps: every request still running or still in the inbox ends with this error;
        new ones are refused."""
        self.error = why
        waiting = []
        while not self.inbox.empty():
            if isinstance(m := self.inbox.get(), Add):
                waiting.append(m.request)
        self._send([(r, Output([], "abort", why)) for r in [*self.active.values(), *waiting]])
        self.active.clear()

    def _add(self, request: Request) -> None:
        seq = self.engine.add_request(request.prompt_ids, request.max_tokens,
                                      request.min_tokens, request.temperature)
        seq.arrival_s = request.arrival_s     # TTFT counts from when the server got it
        request.seq = seq
        self.active[id(request)] = request
        self.metrics.prompt_tokens.inc(len(request.prompt_ids))

    def _abort(self, request: Request, reason: str = "abort") -> None:
        if self.active.pop(id(request), None) is None:
            return                    # it had finished already
        self.engine.abort(request.seq)
        self._leave(request, reason)

    def _leave(self, request: Request, reason: str) -> None:
        """The request is done: the engine forgets it, and /metrics counts it."""
        self.engine.sequences.remove(request.seq)
        self.metrics.finished[reason].inc()
        self.metrics.e2e.observe(time.perf_counter() - request.arrival_s)

    def _step(self) -> None:
        self.engine.step()
        stats = self.engine.steps.pop()       # the server keeps no history of steps
        self.metrics.iteration_tokens.observe(stats.num_tokens)
        if self.metrics.spec_drafts:
            self.metrics.spec_draft_tokens.inc(stats.num_draft_tokens)
            self.metrics.spec_accepted.inc(stats.num_accepted_tokens)
        outputs = []
        for request in list(self.active.values()):
            seq = request.seq
            if not request.admitted and seq.state is not State.WAITING:
                request.admitted = True       # its prompt was looked up in the prefix cache
                self.metrics.prefix_queries.inc(len(seq.prompt_ids))
                self.metrics.prefix_hits.inc(seq.num_cached_at_admission)
            new = seq.output_ids[request.num_sent:]
            if new:
                self._count_tokens(request, len(new))
            if seq.is_finished:
                del self.active[id(request)]
                reason = "stop" if seq.output_ids[-1] in self.engine.sampler.eos_ids else "length"
                self._leave(request, reason)
                outputs.append((request, Output(new, reason)))
            elif new:
                outputs.append((request, Output(new)))
        self._update_gauges()
        self._send(outputs)

    def _count_tokens(self, request: Request, num_new: int) -> None:
        seq, now = request.seq, time.perf_counter()
        if not request.num_sent:
            self.metrics.ttft.observe(now - request.arrival_s)
        else:
            self.metrics.itl.observe(now - request.last_token_s)
        request.num_sent += num_new
        request.last_token_s = now
        self.metrics.generation_tokens.inc(num_new)
        if self.metrics.spec_drafts and seq.num_draft_tokens > request.num_drafts:
            self.metrics.spec_drafts.inc()
            request.num_drafts = seq.num_draft_tokens

    def _update_gauges(self) -> None:
        scheduler, pages = self.engine.scheduler, self.engine.block_manager
        self.metrics.running.set(scheduler.num_live)
        self.metrics.waiting.set(len(scheduler.waiting))
        self.metrics.kv_usage.set(pages.num_used / pages.num_pages)
        self.metrics.preemptions.inc(scheduler.num_preemptions - self.preemptions_seen)
        self.preemptions_seen = scheduler.num_preemptions

    def _send(self, outputs: list[tuple[Request, Output]]) -> None:
        """Hand a step's outputs to their queues, in one call into the event loop."""
        if outputs and self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(_deliver, outputs)


def _deliver(outputs: list[tuple[Request, Output]]) -> None:
    for request, output in outputs:
        request.queue.put_nowait(output)
