"""Task 14's record (task_14_quantized_kv.py saves it as results/task_14_quantized_kv.json). A KV
cache format is named by its dtype and, for 8 bits, where its scales live: "bf16", "fp32",
"fp8 layer" (one scale a layer, 1.0: vLLM's), "fp8 token" (one a token, K/V and head: computed
when written), and the same for fp8_e5m2. summary_row is the summary table's cell."""
from __future__ import annotations

from dataclasses import dataclass, field

from common import results


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


def summary_row(r: QuantizedKV) -> str:
    """The summary's cell: capacity, and what 8 bits bought and cost in mini_engine."""
    base, fine = r.capacity[0], r.capacity_of("fp8 token")
    q = r.quality_of("mini_engine", "fp8 token")
    parts = [f"{fine.pages / base.pages:.2f}x tokens"]
    if r.speedup("mini_engine"):
        parts.append(f"{r.speedup('mini_engine'):.2f}x tok/s")
    if q:
        parts.append(f"{q.num_identical}/{r.settings.num_prompts} answers same")
    return ", ".join(parts)
