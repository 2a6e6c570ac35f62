"""Task 14's record (task_14_quantized_kv.py saves it as results/task_14_quantized_kv.json). A KV
cache format is named by its dtype and, for 8 bits, where its scales live: "bf16", "fp32",
"fp8 layer" (one scale a layer, 1.0: vLLM's), "fp8 token" (one a token, K/V and head: computed
when written), and the same for fp8_e5m2. summary_row is the summary table's cell.

What the run can tell apart: the passage is read once and deterministically, so its spread is
over its tokens: a mean change is told apart from another (or from none) when the two differ by
more than twice the standard error of their per-token difference (shift, change_gap). Greedy
answers are told apart by a sign test on the prompts only one of two formats kept
(answers_told_apart): with 8 prompts that takes 6 such prompts, all one way."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from common import measure, results


def label(kv_cache_dtype: str, kv_scale: str, model_dtype: str) -> str:
    """'bfloat16' for the model's own dtype, else 'fp8 token', 'fp8_e5m2 layer'..."""
    return model_dtype if kv_cache_dtype == "auto" else f"{kv_cache_dtype} {kv_scale}"


@dataclass
class Settings(results.Record):
    page_tokens: int                # mini_engine's pages and vLLM's blocks (32: vLLM's CPU
                                    # cache refuses 8 bits in blocks of 16)
    kv_cache_bytes: int             # part 1's budget (the lab's 128 MiB)
    user_tokens: int                # part 1: a user's request, prompt and answer (max_model_len)
    num_prompts: int                # part 2: chat prompts, greedy
    max_tokens: int                 # part 2: tokens an answer at most (EOS allowed)
    passage_tokens: int             # part 2: tokens of the GPL-3 passage, teacher-forced
    max_model_len: int              # parts 2-3, both engines: their longest request
    load_kv_bytes: int              # part 3: the small budget where memory binds
    load_requests: int              # part 3: requests, all sent at once
    load_prompt_tokens: int         # part 3: each prompt, a window of the text
    load_tokens: int                # part 3: tokens an answer, EOS held off
    port: int
    is_vllm_measured: bool
    kv_read: str = "four passes of torch"   # how mini_engine wrote and read its 8-bit pages
    kernels: str = "c"              # --kernels: part 3's EngineConfig.kernels (the comparisons
                                    # of part 2 run the torch way, whose bits the C's equal)


@dataclass
class Capacity(results.Record):
    """Part 1, one format: a token's bytes (scales included), derived and read from the engines."""
    name: str
    bytes_per_token: int
    pages: int                      # whole pages of page_tokens in kv_cache_bytes, derived
    load_pages: int                 # the same in part 3's budget (load_kv_bytes), derived
    mini_engine_pages: int | None = None   # read from an LLMEngine with kv_cache_bytes
    vllm_blocks: int | None = None         # read from vLLM's server at load_kv_bytes
                                           # (cache_config_info); None: not run, or no such format

    def users(self, s: Settings) -> int:
        """Requests of s.user_tokens that fit at once."""
        return self.pages * s.page_tokens // s.user_tokens


@dataclass
class Quality(results.Record):
    """Part 2, one engine and format against the same engine with the model's dtype."""
    engine: str                     # "mini_engine" or "vLLM"
    name: str
    num_identical: int              # greedy answers identical token for token
    first_differences: list[int | None]   # per prompt: the first position that differs (None:
                                          # identical)
    num_empty: int                  # answers that end at once (EOS first)
    num_stuck: int                  # answers whose last 12 tokens repeat a cycle of 1-4 tokens
    mean_abs_logprob_change: float  # teacher-forced passage: mean |log p - log p (model dtype)|
    perplexity: float               # of the passage, through this cache
    logprob_changes: list[float] = field(default_factory=list)   # per passage token: log p -
                                    # log p (model dtype), the spread of the two figures above

    @property
    def kept(self) -> list[bool]:
        """Per prompt: the answer identical to the model's dtype's."""
        return [f is None for f in self.first_differences]


@dataclass
class Throughput(results.Record):
    """Part 3, one engine and format: the memory-bound workload at once."""
    engine: str
    name: str
    capacity_tokens: int            # tokens its KV budget holds
    max_running: int                # requests running at once, at most
    num_preemptions: int | None
    num_tokens: int
    seconds: float
    mean_tpot_s: float | None       # time per output token after the first
    tokens_per_s_spread: measure.Spread | None = None   # every pass's, where this is the median

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds


@dataclass
class QuantizedKV(results.Result):
    settings: Settings
    capacity: list[Capacity]
    reference_perplexity: dict[str, float]       # engine -> the passage's perplexity, model dtype
    reference_empty: dict[str, int]              # engine -> empty answers, model dtype
    quality: list[Quality] = field(default_factory=list)
    throughput: list[Throughput] = field(default_factory=list)
    vllm_skipped: str | None = None              # why vLLM's side, or part of it, did not run
    reference_stuck: dict[str, int] = field(default_factory=dict)   # engine -> stuck answers,
                                                                    # model dtype

    def capacity_of(self, name: str) -> Capacity:
        return next(c for c in self.capacity if c.name == name)

    def quality_of(self, engine: str, name: str) -> Quality | None:
        return next((q for q in self.quality if (q.engine, q.name) == (engine, name)), None)

    def speedup(self, engine: str) -> float | None:
        """8-bit (its first format measured) over the model's dtype, tokens/s, part 3."""
        runs = [t for t in self.throughput if t.engine == engine]
        if len(runs) < 2:
            return None
        return runs[1].tokens_per_s / runs[0].tokens_per_s

    def speedup_range(self, engine: str) -> tuple[float, float] | None:
        """The speed-up from the ends of the two formats' passes (slowest 8-bit pass over the
        fastest base one, and the other way); None where either ran one pass."""
        runs = [t for t in self.throughput if t.engine == engine][:2]
        if len(runs) < 2 or not all(t.tokens_per_s_spread for t in runs):
            return None
        base, fp8 = (t.tokens_per_s_spread for t in runs)
        return fp8.low / base.high, fp8.high / base.low


# --- what the run can tell apart ------------------------------------------------------------------
MARGIN_SE = 2           # a mean told apart beyond 2 standard errors (about 95 % for many tokens)
SIGN_TEST_P = 0.05      # answers told apart where a sign test says this little of chance
# A perplexity is called changed only past this share of the model dtype's, and past its margin
# (perplexity_change). One passage is one sample of text, and its tokens are not independent:
# their standard error says what this passage tells, not what another text would; a move of a
# few per cent either way (an 8-bit cache "lowering" it by 3 % on 255 tokens) is no finding.
PERPLEXITY_BOUND = 0.05


@dataclass
class Shift:
    """A mean over the passage's tokens and its margin (MARGIN_SE standard errors of it)."""
    mean: float
    margin: float

    @classmethod
    def of(cls, values: list[float]) -> "Shift | None":
        """None without at least two values: nothing to tell apart with."""
        if len(values) < 2:
            return None
        return cls(statistics.fmean(values),
                   MARGIN_SE * statistics.stdev(values) / math.sqrt(len(values)))

    @property
    def is_told_apart(self) -> bool:
        """Farther from zero than its margin: the passage tells it from no difference."""
        return abs(self.mean) > self.margin


def shift(q: Quality) -> Shift | None:
    """The mean change of the passage's log-probabilities, signed: below zero, the cache made the
    text less likely (its perplexity is the model dtype's times exp(-mean))."""
    return Shift.of(q.logprob_changes)


def perplexity_change(q: Quality, reference: float) -> float | None:
    """q's perplexity over the model dtype's, less one, where it is a change: past
    PERPLEXITY_BOUND and past the margin of the per-token shift; 0.0 where it is not (no change
    measured); None where no per-token changes were saved to judge by."""
    move = shift(q)
    if move is None:
        return None
    ratio = q.perplexity / reference - 1
    return ratio if move.is_told_apart and abs(ratio) > PERPLEXITY_BOUND else 0.0


def change_gap(a: Quality, b: Quality) -> Shift | None:
    """a's |change| minus b's, token by token: below zero, a changed the passage less."""
    if not a.logprob_changes or len(a.logprob_changes) != len(b.logprob_changes):
        return None
    return Shift.of([abs(x) - abs(y) for x, y in zip(a.logprob_changes, b.logprob_changes)])


def answers_told_apart(a: Quality, b: Quality) -> bool:
    """A two-sided sign test on the prompts whose answer one of a and b kept and the other did
    not: told apart when so one-sided a split is less likely than SIGN_TEST_P by chance."""
    only_a = sum(x and not y for x, y in zip(a.kept, b.kept))
    only_b = sum(y and not x for x, y in zip(a.kept, b.kept))
    n = only_a + only_b
    tail = sum(math.comb(n, k) for k in range(min(only_a, only_b) + 1)) / 2 ** n
    return n > 0 and min(1.0, 2 * tail) < SIGN_TEST_P


def summary_row(r: QuantizedKV) -> str:
    """The summary's cell: capacity, and what 8 bits bought and cost in mini_engine."""
    base, fine = r.capacity[0], r.capacity_of("fp8 token")
    q = r.quality_of("mini_engine", "fp8 token")
    parts = [f"{fine.pages / base.pages:.2f}x tokens"]
    if r.speedup("mini_engine"):
        ends = r.speedup_range("mini_engine")
        parts.append(f"{r.speedup('mini_engine'):.2f}x tok/s"
                     + (f" ({ends[0]:.2f}-{ends[1]:.2f})" if ends else ""))
    if q:
        parts.append(f"{q.num_identical}/{r.settings.num_prompts} answers same")
    return ", ".join(parts)
