"""Task 10's record (task_10_prefix_caching.py saves it as results/task_10_prefix_caching.json):
everything the task measured, typed, each unit in its field's name. Every list of runs is in one
order, cache off then cache on: mini_engine's, the control workload's and vLLM's server alike.
Figures that follow from the counts (hit fraction, prompt tokens computed) are properties, so a
saved file cannot disagree with itself. summary_row is the summary table's cell for the task."""
from __future__ import annotations

from dataclasses import dataclass, field

from common import load, measure, results

LABELS = ("cache off", "cache on")   # the order of every list of runs in the record


@dataclass
class Settings(results.Record):
    """What the task ran with: its flags, and the max_model_len it chose for them."""
    num_requests: int
    num_system_tokens: int      # --system-tokens: the instruction text's first tokens
    num_output_tokens: int      # --output: tokens each answer generates, EOS held off
    seed: int                   # of the control workload's shuffles
    page_size_tokens: int       # mini_engine's pages and vLLM's blocks
    max_num_seqs: int           # the batch cap: mini_engine's max_batch, the server's max_num_seqs
    max_model_len: int          # tokens: the lab's 128, or 256 when 128 cannot hold a request
    kv_cache_bytes: int         # mini_engine's KV budget, cut into pages
    port: int                   # the lab's vLLM server
    is_vllm_measured: bool      # False with --no-vllm (part 4 skipped)
    kernels: str = "c"          # --kernels: mini_engine's EngineConfig.kernels


@dataclass
class WorkloadShape(results.Record):
    """The chat workload's prompts, counted (the control's are the same tokens, shuffled)."""
    num_shared_tokens: int      # tokens every prompt starts with
    num_prompt_tokens: int      # of all prompts together
    min_prompt_tokens: int
    max_prompt_tokens: int

    def whole_page_tokens(self, page_size_tokens: int) -> int:
        """The shared tokens that fill whole pages: only those can be shared."""
        return self.num_shared_tokens // page_size_tokens * page_size_tokens


@dataclass
class Correctness(results.Record):
    """Part 1, fp32 and greedy: every request with the cache against without it, and the first
    few against transformers' generate."""
    num_requests: int
    num_identical: int          # requests with every token the same, cache on vs off
    cached_prompt_tokens: int   # prompt tokens the cache-on run took from the cache
    prompt_tokens: int
    num_checked_hf: int         # the first requests, checked against transformers (cache on)
    num_identical_hf: int


@dataclass
class PageSnapshot(results.Record):
    """The running requests' page tables at the step that held the most pages (part 2, and the
    figure): the first few tables in full, each page's ref count."""
    step: int                         # the step's index
    num_pages_held: int
    num_pages_unshared: int           # what the running requests' tables would hold unshared
    num_running: int
    page_tables: dict[int, list[int]]   # seq_id -> its physical page ids, in logical order
    ref_counts: dict[int, int]          # page id -> the page tables that hold it

    @property
    def shared_pages(self) -> set[int]:
        return {page for page, n in self.ref_counts.items() if n > 1}


@dataclass
class EngineRun(results.Record):
    """One workload through mini_engine, every request added at once, stepped to the end."""
    label: str                  # "cache off" or "cache on"
    duration_s: float
    tokens_per_s: float         # new tokens, all requests together
    prompt_tokens: int          # looked up in the cache (vLLM's prefix_cache_queries)
    cached_prompt_tokens: int   # of them found there (prefix_cache_hits): not computed
    mean_ttft_s: float
    p95_ttft_s: float
    num_pages_peak: int         # the most pages in use at one step
    bookkeeping_s: float        # the steps' scheduling phase: admission, look-ups, page hashes
    peak: PageSnapshot | None = None   # the page tables at that step
    # every pass's figures, where the run is the median pass of several (None: one pass)
    tokens_per_s_spread: measure.Spread | None = None
    ttft_spread: measure.Spread | None = None          # mean TTFT, seconds
    outputs: list[list[int]] = field(default_factory=list, init=False, repr=False,
                                     compare=False)   # each request's tokens; not saved

    @property
    def computed_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_prompt_tokens

    @property
    def hit_fraction(self) -> float:
        """Prompt tokens taken from the cache, of all prompt tokens."""
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class ServerRun(results.Record):
    """The chat workload through the lab's vLLM server, every request at once, streamed."""
    label: str                      # "cache off" or "cache on"
    level: load.LoadLevel           # tokens/s, TTFT mean and p95, requests ok and failed
    prefix_cache_query_tokens: int  # change of vllm:prefix_cache_queries over the load
    prefix_cache_hit_tokens: int    # change of vllm:prefix_cache_hits
    startup_s: float | None = None  # None: a server already running was used

    @property
    def hit_fraction(self) -> float | None:
        """None: no prompt token was looked up (the cache off)."""
        if not self.prefix_cache_query_tokens:
            return None
        return self.prefix_cache_hit_tokens / self.prefix_cache_query_tokens


@dataclass
class OfflineRequest(results.Record):
    """One request through vllm.LLM.generate, prefix caching on: its RequestOutput's counts."""
    prompt_tokens: int
    num_cached_tokens: int


@dataclass
class PrefixCaching(results.Result):
    settings: Settings
    workload: WorkloadShape
    correct: Correctness
    num_identical_in_dtype: int     # part 3's requests identical, cache on vs off, in its dtype
    mini_engine: list[EngineRun]    # the chat workload, [cache off, cache on]
    control: list[EngineRun]        # the control workload (no page shared), [cache off, cache on]
    vllm: list[ServerRun] | None = None   # [cache off, cache on]; None with --no-vllm
    offline: dict[str, OfflineRequest] | None = None   # "first request", "request 2", ...


def summary_row(res: PrefixCaching) -> str:
    """The engine's hit rate and TTFT without and with the cache, vLLM's hit rate."""
    off, on = res.mini_engine
    vllm = res.vllm[1].hit_fraction if res.vllm else None
    vllm_text = "" if vllm is None else f", vLLM hit {100 * vllm:.0f}%"
    return f"hit {100 * on.hit_fraction:.0f}%, TTFT {ttft(off)} -> {ttft(on)} s{vllm_text}"


def ttft(run: EngineRun) -> str:
    """'2.22' for one pass; '2.22 (2.10-2.31)' for the median of several."""
    s = run.ttft_spread
    if s is None or s.num_passes < 2:
        return f"{run.mean_ttft_s:.2f}"
    return f"{run.mean_ttft_s:.2f} ({s.low:.2f}-{s.high:.2f})"
