"""What task 8 saves with --once (results/task_8_dashboard.json; the live page saves nothing):
the server it watched, /metrics at the end of the interval, what the server did in it, and the
load it sent; and its row in the summary's table."""
from __future__ import annotations

from dataclasses import dataclass, field

from common import metrics, results


@dataclass
class Snapshot(results.Record):
    """/metrics at the end of the interval (counters since the server started), with the batch
    (running, waiting, KV-cache usage) at its fullest read during the interval."""
    num_generation_tokens: int        # vllm:generation_tokens_total
    num_running: int                  # vllm:num_requests_running
    num_waiting: int                  # vllm:num_requests_waiting
    kv_usage_fraction: float | None   # vllm:kv_cache_usage_perc, 0..1 (None: not exported)
    ttft_sum_s: float                 # vllm:time_to_first_token_seconds _sum, and its _count:
    num_first_tokens: int             # requests that got their first token
    e2e_sum_s: float                  # vllm:e2e_request_latency_seconds _sum, and its _count:
    num_finished: int                 # requests that finished
    num_preemptions: int              # vllm:num_preemptions_total
    num_prefix_query_tokens: int      # vllm:prefix_cache_queries_total: prompt tokens looked up
    num_prefix_hit_tokens: int        # vllm:prefix_cache_hits_total: of them found cached
    mean_ttft_s: float | None = None  # None: no request yet
    mean_e2e_s: float | None = None

    @classmethod
    def of(cls, last: metrics.Snapshot, fullest: metrics.Snapshot) -> "Snapshot":
        return cls(int(last.generation_tokens), fullest.running, fullest.waiting,
                   fullest.kv_usage, last.ttft_sum_s, int(last.ttft_count), last.e2e_sum_s,
                   int(last.e2e_count), int(last.preemptions), int(last.prefix_queries),
                   int(last.prefix_hits), last.mean_ttft_s, last.mean_e2e_s)


@dataclass
class Interval(results.Record):
    """What the server did during the interval: from the header's read, before --load's first
    request, to the last read."""
    duration_s: float
    num_generation_tokens: int
    tokens_per_s: float
    num_first_tokens: int                      # requests that got their first token in it
    num_finished: int                          # requests that finished in it
    num_prefix_query_tokens: int               # prompt tokens looked up in the prefix cache
    num_prefix_hit_tokens: int                 # of them found cached
    mean_ttft_s: float | None = None           # None: no first token in it
    mean_e2e_s: float | None = None            # None: no request finished in it
    prefix_hit_fraction: float | None = None   # None: no prompt looked up in it

    @classmethod
    def of(cls, w: metrics.Window) -> "Interval":
        return cls(w.seconds, int(w.generation_tokens), w.tokens_per_s, w.num_first_tokens,
                   w.num_finished, int(w.prefix_queries), int(w.prefix_hits), w.mean_ttft_s,
                   w.mean_e2e_s, w.prefix_hit_rate)


@dataclass
class LoadSent(results.Record):
    """--load N: N concurrent requests sent as the page's button sends them, counted at the end."""
    num_requests: int
    num_succeeded: int
    num_failed: int
    max_tokens: int
    num_output_tokens: int
    num_prompt_tokens: int      # of its prompts, as the server counted them
    duration_s: float
    errors: list[str] = field(default_factory=list)   # the failed requests' errors, distinct

    @classmethod
    def of(cls, level, max_tokens: int) -> "LoadSent":
        """From the level load.run_level returned."""
        return cls(level.num_users, level.num_ok, level.num_failed, max_tokens,
                   level.num_output_tokens, sum(r.prompt_tokens for r in level.requests),
                   level.duration_s, list(level.errors))


@dataclass
class Dashboard(results.Result):
    """--once: the server watched and what its /metrics showed (the live page saves nothing)."""
    base_url: str
    server_state: str                # started, restarted, reused or external
    cache_config: dict[str, str]     # the labels of vllm:cache_config_info
    snapshot: Snapshot
    engine: str | None = None        # the lab server's settings (None: not the lab's)
    last_interval: Interval | None = None   # None: the server restarted during it
    load: LoadSent | None = None     # None: no --load


def summary_row(d: Dashboard) -> str:
    """What task 8's snapshot showed: the batch, what waited, the KV cache."""
    s = d.snapshot
    sent = f"{d.load.num_requests} sent: " if d.load else ""
    kv = "" if s.kv_usage_fraction is None else f", KV {100 * s.kv_usage_fraction:.0f}%"
    rate = f", {d.last_interval.tokens_per_s:.1f} tok/s" if d.last_interval else ""
    return f"{sent}{s.num_running:.0f} running, {s.num_waiting:.0f} waiting{rate}{kv}"
