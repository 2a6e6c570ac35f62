"""Task 13's record: what it measured, saved as results/task_13_compiled_step.json and read back
by the summary, the figure and the report page."""
from __future__ import annotations

from dataclasses import dataclass, field

from common import results
from lessons.task_9.record import MachineBounds, Phases


@dataclass
class Settings(results.Record):
    requests: int                 # task 9's workload: requests, all arriving at once
    mean_output: int              # their mean output length (exponential, seed 0)
    max_batch: int                # the cap, and the batch of the step at the cap
    kv_cache_bytes: int
    page_size: int
    vllm_requests: int            # part 3: requests at once (its second level; the first is 1)
    vllm_tokens: int              # part 3: tokens an answer (EOS held off)


@dataclass
class EngineMode(results.Record):
    """mini_engine one way: torch (EngineConfig.kernels "torch"), eager (its C kernels, "c") or
    compiled (the same kernels, the decoder layers one graph of torch.compile)."""
    warm_up_s: float              # a first engine; compiled: its compile too (same model)
    warm_up_added_bytes: int      # RSS the warm-up added (its first engine's KV pool included)
    num_graphs: int               # graphs torch.compile made (0: eager)
    phases: dict[int, Phases]     # batch (1 and the cap) -> a decode step's phases
    tokens_per_s: float           # task 9's workload, continuous batching
    num_tokens: int
    duration_s: float
    kernels: dict[str, str] = field(default_factory=dict)   # what it ran, part by part
    # the packed ways and F.linear, timed on the model's weights when the engine chose its
    # product: way -> ms of a pass over every product at batch 1 and at the cap
    products_ms: dict[str, list[float]] = field(default_factory=dict)


@dataclass
class VllmMode(results.Record):
    """vLLM offline in a fresh process, one way (lessons/task_13/vllm_run.py); its passes of task
    9's workload taken in turns with mini_engine's, run the same way, in another process."""
    enforce_eager: bool           # True: the source's (and TORCHDYNAMO_DISABLE=1); False: -O2
    startup_s: float              # LLM(...) until it returns: load, profile, compile, warm-up
    peak_pss_bytes: int           # the process's PSS, sampled while it ran
    one_tokens_per_s: float       # one request (the median of three)
    batch_tokens_per_s: float     # settings.vllm_requests at once
    texts: list[str]              # the greedy answers of the batch
    workload_tokens_per_s: float  # task 9's workload, as mini_engine ran it (cap: max_batch)
    mini_tokens_per_s: float      # mini_engine run the same way, its median pass of the rounds
                                  # in which it took turns with this one


@dataclass
class AttentionSweep(results.Record):
    """Part 4: a decode step's attention, every layer's call, in ms, as the context grows: B
    requests (1 and the cap) each over a context of L tokens (lessons/task_13/attention.py)."""
    contexts: list[int]                    # L, tokens
    torch_ms: dict[int, list[float]]       # batch -> ms at each L: mini_engine's torch way,
                                           # contexts gathered, padded, attended by SDPA
    mini_ms: dict[int, list[float]]        # mini_engine's C: the pages read in place
    vllm_ms: dict[int, list[float]] | None = None   # vLLM's CPU kernel; None: vLLM not run

    @property
    def cap(self) -> int:
        """The larger batch measured: the engine's cap (--max-batch)."""
        return max(self.mini_ms)

    def at(self, which: str, batch: int, context: int) -> float | None:
        """ms of one way ("torch", "mini", "vllm") at this batch and context."""
        by_batch = getattr(self, f"{which}_ms")
        if not by_batch or batch not in by_batch:
            return None
        return by_batch[batch][self.contexts.index(context)]


@dataclass
class CompiledStep(results.Result):
    settings: Settings
    machine: MachineBounds        # one read of the weights; the matmuls alone (kernel floor)
    eager: EngineMode
    compiled: EngineMode | None = None     # None: not compiled here (compile_skipped says why)
    compile_skipped: str | None = None
    num_identical: int = 0                 # task 9's requests with the same greedy tokens
    num_requests: int = 0
    vllm: dict[str, VllmMode] | None = None   # "eager", "compiled"; None: --no-vllm
    vllm_skipped: str | None = None           # why a vLLM mode did not run, where one did not
    attention: AttentionSweep | None = None   # part 4
    torch: EngineMode | None = None           # part 1: the torch way, no kernels

    @property
    def cap(self) -> int:
        return max(self.eager.phases)

    def step_ratio(self, batch: int) -> float | None:
        """The compiled decode step's time over the eager one's at this batch."""
        if self.compiled is None:
            return None
        return self.compiled.phases[batch].step_s / self.eager.phases[batch].step_s

    def kernels_ratio(self, batch: int) -> float | None:
        """The eager decode step with its C kernels over the torch way's, at this batch."""
        if self.torch is None:
            return None
        return self.eager.phases[batch].step_s / self.torch.phases[batch].step_s

    def fusion_floor(self, batch: int) -> float:
        """The least a compile that fuses only the rest of the forward could take the eager
        decode step to at this batch: the step less all of its rest, over the step (the
        products, attention, sampling and scheduling left as they are)."""
        eager = self.eager.phases[batch]
        return (eager.step_s - eager.forward_other_s) / eager.step_s

    @property
    def speedup(self) -> float | None:
        """mini_engine compiled over eager, tokens/s on task 9's workload."""
        return self.compiled.tokens_per_s / self.eager.tokens_per_s if self.compiled else None

    def over_vllm(self, mode: str) -> float | None:
        """mini_engine over vLLM run the same way ("eager" or "compiled"), tokens/s on task 9's
        workload, in the same rounds of turns; None where vLLM did not run that way."""
        if not self.vllm or mode not in self.vllm:
            return None
        return self.vllm[mode].mini_tokens_per_s / self.vllm[mode].workload_tokens_per_s

    @property
    def vllm_speedup(self) -> float | None:
        """vLLM compiled over eager, tokens/s with its requests at once."""
        if not self.vllm or len(self.vllm) < 2:
            return None
        return self.vllm["compiled"].batch_tokens_per_s / self.vllm["eager"].batch_tokens_per_s


def summary_row(r: CompiledStep) -> str:
    """The summary's cell: what compiling bought each engine, in tokens/s."""
    parts = [f"mini_engine {r.speedup:.2f}x" if r.speedup else "mini_engine not compiled"]
    if r.vllm_speedup:
        mem = (r.vllm["compiled"].peak_pss_bytes - r.vllm["eager"].peak_pss_bytes) / 1e9
        parts.append(f"vLLM {r.vllm_speedup:.2f}x ({mem:+.2f} GB)")
    return ", ".join(parts)
