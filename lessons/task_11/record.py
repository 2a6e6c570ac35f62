"""Task 11's record (task_11_chunked_prefill.py saves it as results/task_11_chunked_prefill.json):
everything the task measured, typed, each unit in its field's name. Every list of runs is in one
order: no chunking first, then the budgets as --budgets gave them, mini_engine's and vLLM's
alike. Figures that follow from others (a run's mean TTFT, the largest step of vLLM's histogram)
are properties, so a saved file cannot disagree with itself. summary_row is the summary table's
cell for the task."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from common import load, measure, results

NO_CHUNKING = "no chunking"


def label_of(budget_tokens: int | None, is_chunked: bool) -> str:
    """'no chunking', 'budget 128', or 'its own' (a --base-url server: its setting unknown)."""
    if budget_tokens is None:
        return "its own"
    return f"budget {budget_tokens}" if is_chunked else NO_CHUNKING


@dataclass
class Settings(results.Record):
    """What the task ran with: its flags, and the sizes it chose for them."""
    num_chats: int
    chat_output_tokens: int     # --chat-output: tokens each chat answer streams, EOS held off
    num_long_docs: int
    long_tokens: int            # --long-tokens: tokens of the text in each long document
    long_output_tokens: int     # --long-output
    arrive_after_tokens: int    # the long documents arrive once every chat has made this many
    budgets_tokens: list[int]   # --budgets: max_num_batched_tokens of the chunked runs
    page_size_tokens: int       # mini_engine's pages and vLLM's blocks
    max_num_seqs: int           # the batch cap: mini_engine's max_batch, the server's max_num_seqs
    max_model_len: int          # also the budget without chunking (it must hold a whole prompt)
    kv_cache_bytes: int         # the whole workload at once, in fp32
    port: int
    is_vllm_measured: bool      # False with --no-vllm
    base_url: str | None = None  # --base-url: vLLM's part ran there, at that server's setting
    num_passes: int = 1         # --passes: of no chunking and the smallest budget, in each engine
    kernels: str = "c"          # --kernels: mini_engine's EngineConfig.kernels


@dataclass
class WorkloadShape(results.Record):
    source: str                 # the text the long documents are cut from
    num_source_tokens: int
    min_chat_prompt_tokens: int
    max_chat_prompt_tokens: int
    min_long_prompt_tokens: int
    max_long_prompt_tokens: int
    num_long_prompt_tokens: int     # of all the long documents together


@dataclass
class Correctness(results.Record):
    """fp32, greedy: every request at each budget against the same without chunking, and a few
    against transformers' generate."""
    num_requests: int
    num_identical: list[int]    # per budget (the order of Settings.budgets_tokens)
    num_checked_hf: int         # the first chat and the first long document, smallest budget
    num_identical_hf: int


@dataclass
class Latency(results.Record):
    """What a user of one run felt: the chats' gaps between tokens (inter-token latency, ITL)
    and the long documents' time to first token."""
    mean_itl_s: float
    p99_itl_s: float
    max_itl_s: float            # the chats' longest stall
    long_ttft_s: list[float]    # each long document's, from its arrival

    @classmethod
    def of(cls, chat_token_times_s: list[list[float]], long_ttft_s: list[float]) -> "Latency":
        gaps = [b - a for times in chat_token_times_s for a, b in zip(times, times[1:])]
        return cls(statistics.fmean(gaps), load.percentile(gaps, 99), max(gaps),
                   list(long_ttft_s))

    @property
    def mean_long_ttft_s(self) -> float:
        return statistics.fmean(self.long_ttft_s)


@dataclass
class Passes(results.Record):
    """The figures of one setting that the summary row and the KEY INSIGHT read, over its
    passes: the chats' longest stall and the documents' mean TTFT (the run keeps the median
    pass by the stall, whole)."""
    max_itl_s: measure.Spread
    mean_long_ttft_s: measure.Spread

    @classmethod
    def of(cls, latencies: list[Latency]) -> "Passes":
        return cls(measure.Spread.of([x.max_itl_s for x in latencies]),
                   measure.Spread.of([x.mean_long_ttft_s for x in latencies]))


def compared(off, on, what: str) -> tuple[float, float, bool | None]:
    """(off's figure, on's figure, whether their spreads overlap) for what ('max_itl_s' or
    'mean_long_ttft_s') of two runs (EngineRun or ServerRun): the medians of their passes where
    both ran several; else the run's own figure, and None (measured once: nothing to tell them
    apart by)."""
    a, b = (getattr(r.passes, what) if r.passes else None for r in (off, on))
    if a is None or b is None or min(a.num_passes, b.num_passes) < 2:
        return getattr(off.latency, what), getattr(on.latency, what), None
    return a.median, b.median, a.overlaps(b)


@dataclass
class Timeline(results.Record):
    """One mini_engine run step by step, for the figure: seconds from the first step's start."""
    decode_tokens: list[int]            # per step: one for each request decoding
    prefill_tokens: list[int]           # per step: prompt tokens computed (chunks)
    step_end_s: list[float]
    chat_token_times_s: list[list[float]]   # per chat, when each of its tokens was made
    long_arrival_s: float
    long_first_token_s: list[float]


@dataclass
class EngineRun(results.Record):
    """The workload through mini_engine at one setting."""
    label: str                  # "no chunking" or "budget N"
    budget_tokens: int          # max_num_batched_tokens (max_model_len without chunking)
    is_chunked: bool
    latency: Latency
    duration_s: float
    tokens_per_s: float         # new tokens, all requests together
    num_steps: int
    max_step_tokens: int        # the most tokens any step computed
    timeline: Timeline
    passes: Passes | None = None        # None: this setting ran once
    outputs: list[list[int]] = field(default_factory=list, init=False, repr=False,
                                     compare=False)   # each request's tokens; not saved


@dataclass
class IterationTokens(results.Record):
    """vLLM's histogram vllm:iteration_tokens_total over one load: steps and tokens counted."""
    num_steps: int
    num_tokens: int
    steps_by_bucket: dict[int, int]     # bucket's upper bound -> steps in it (not cumulative)

    def steps_over(self, tokens: int) -> int:
        """Steps in buckets above tokens (exact where tokens is a bucket bound, as 64-4096)."""
        return self.num_steps - sum(n for le, n in self.steps_by_bucket.items() if le <= tokens)


@dataclass
class ServerRun(results.Record):
    """The workload through vLLM's server at one setting."""
    label: str                  # "no chunking", "budget N", or "its own" (--base-url)
    budget_tokens: int | None   # None: a --base-url server, its setting unknown here
    is_chunked: bool
    level: load.LoadLevel       # every request: tokens/s, requests ok and failed
    latency: Latency | None = None          # None: a request failed
    steps: IterationTokens | None = None    # None: the server exports no histogram
    # the steps the long documents' prefill took, as the chats' streams show them: a chat's
    # tokens that came between the documents' arrival and their last first token, but the first
    # (lessons/task_11/load.py; None: a chat had finished before, or a request failed)
    num_prefill_steps: int | None = None
    num_chat_tokens_at_arrival: int | None = None   # the fewest any chat had streamed then
    startup_s: float | None = None          # None: a server already running was used
    passes: Passes | None = None            # None: this setting ran once


@dataclass
class ChunkedPrefill(results.Result):
    """The whole run: the settings and workload, part 1's check, and parts 2-3's runs."""
    settings: Settings
    workload: WorkloadShape
    correct: Correctness
    num_identical_in_dtype: list[int]   # per budget, against no chunking, in the run's dtype
    mini_engine: list[EngineRun]        # [no chunking, budget, ...]
    vllm: list[ServerRun] | None = None     # the same order; None with --no-vllm

    @property
    def smallest(self) -> EngineRun:
        """The chunked mini_engine run of the smallest budget."""
        return min(self.mini_engine[1:], key=lambda r: r.budget_tokens)


def change(new: float, old: float) -> str:
    return f"{100 * (new / old - 1):+.0f}%"


def side(name: str, off, on, what: str) -> str:
    """'stall -87%', or 'stall not told apart' where the spreads of the passes overlap."""
    a, b, overlap = compared(off, on, what)
    return f"{name} not told apart" if overlap else f"{name} {change(b, a)}"


def summary_row(res: ChunkedPrefill) -> str:
    """What chunking at the smallest budget did to the chats' longest stall and the long
    documents' mean TTFT against no chunking, both sides of the trade, mini_engine's then
    vLLM's: 'stall -87%, TTFT +40% (vLLM stall -91%, TTFT +47%)'; a side whose spreads overlap
    is 'not told apart'."""
    off, on = res.mini_engine[0], res.smallest
    row = f"{side('stall', off, on, 'max_itl_s')}, {side('TTFT', off, on, 'mean_long_ttft_s')}"
    vllm = [r for r in res.vllm or [] if r.latency and r.budget_tokens]
    if len(vllm) > 1 and not vllm[0].is_chunked:
        v_off, v_on = vllm[0], min(vllm[1:], key=lambda r: r.budget_tokens)
        row += (f" (vLLM {side('stall', v_off, v_on, 'max_itl_s')}, "
                f"{side('TTFT', v_off, v_on, 'mean_long_ttft_s')})")
    return row
