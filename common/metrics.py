"""vLLM's Prometheus /metrics, parsed with prometheus_client's own parser.

Counters (`vllm:generation_tokens_total`) and histograms (`_sum`, `_count`) only grow while the
server lives, so a rate or a mean over a window is the difference of two snapshots, as
Prometheus' own `rate()` takes it: tokens/s = d(tokens) / d(time), mean TTFT = d(sum) / d(count).
Gauges (running, waiting, KV-cache usage) are read as they are.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import requests
from prometheus_client.parser import text_string_to_metric_families

from common.poller import Poller


def _samples(text: str) -> dict[str, list[float]]:
    """Sample name -> its values, one per label set (per engine, per histogram bucket...)."""
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values.setdefault(sample.name, []).append(sample.value)
    return values


def parse(text: str) -> dict[str, float]:
    """Sample name -> value, summed over label sets: a server with several engines (data
    parallel) reports one series per engine, and the server's figure is their sum. (A histogram's
    _bucket samples, one per `le`, sum to nothing useful; the lab reads only _sum and _count.)"""
    return {name: sum(values) for name, values in _samples(text).items()}


@dataclass(frozen=True)
class Snapshot:
    """One read of /metrics: the figures a dashboard watches, at time_s (monotonic clock)."""
    time_s: float
    generation_tokens: float   # counter vllm:generation_tokens_total
    running: int               # gauge vllm:num_requests_running
    waiting: int               # gauge vllm:num_requests_waiting
    kv_usage: float | None     # gauge vllm:kv_cache_usage_perc, a fraction 0..1 despite the name
                               # (None: not exported, e.g. an older vLLM behind --base-url)
    ttft_sum_s: float          # histogram vllm:time_to_first_token_seconds, _sum and _count
    ttft_count: float
    e2e_sum_s: float           # histogram vllm:e2e_request_latency_seconds, _sum and _count
    e2e_count: float
    preemptions: float         # counter vllm:num_preemptions_total
    prefix_queries: float = 0.0   # counter vllm:prefix_cache_queries_total: prompt tokens looked up
    prefix_hits: float = 0.0      # counter vllm:prefix_cache_hits_total: of them found cached
    # histogram vllm:inter_token_latency_seconds: the gaps between a request's tokens, stamped
    # in the engine core as each step's outputs leave it, so before the API server and HTTP
    itl_sum_s: float = 0.0
    itl_count: float = 0.0

    @property
    def mean_ttft_s(self) -> float | None:
        """Mean time to first token over the server's whole life (None before any request)."""
        return self.ttft_sum_s / self.ttft_count if self.ttft_count else None

    @property
    def mean_e2e_s(self) -> float | None:
        return self.e2e_sum_s / self.e2e_count if self.e2e_count else None

    @property
    def prefix_hit_rate(self) -> float | None:
        """Prompt tokens found in the prefix cache over the server's life (None before any)."""
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else None


# vLLM V1's name, then the name older vLLM versions used for the same fraction
KV_USAGE_NAMES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


def snapshot(text: str, time_s: float) -> Snapshot:
    """The watched figures out of one /metrics text (parsed once: the dashboard reads it every
    second). Counts are summed over engines; the KV-cache usage, a fraction, is their mean."""
    samples = _samples(text)

    def total(name: str) -> float:
        return sum(samples.get(name, [0.0]))

    kv = next((samples[name] for name in KV_USAGE_NAMES if name in samples), None)
    return Snapshot(time_s=time_s,
                    generation_tokens=total("vllm:generation_tokens_total"),
                    running=int(total("vllm:num_requests_running")),
                    waiting=int(total("vllm:num_requests_waiting")),
                    kv_usage=sum(kv) / len(kv) if kv else None,
                    ttft_sum_s=total("vllm:time_to_first_token_seconds_sum"),
                    ttft_count=total("vllm:time_to_first_token_seconds_count"),
                    e2e_sum_s=total("vllm:e2e_request_latency_seconds_sum"),
                    e2e_count=total("vllm:e2e_request_latency_seconds_count"),
                    preemptions=total("vllm:num_preemptions_total"),
                    prefix_queries=total("vllm:prefix_cache_queries_total"),
                    prefix_hits=total("vllm:prefix_cache_hits_total"),
                    itl_sum_s=total("vllm:inter_token_latency_seconds_sum"),
                    itl_count=total("vllm:inter_token_latency_seconds_count"))


def read(base_url: str) -> Snapshot | None:
    """A snapshot now, or None where the server has no /metrics (an external server)."""
    try:
        return snapshot(fetch(base_url), time.monotonic())
    except (requests.RequestException, ValueError):
        return None


def engine_itl_s(old: Snapshot | None, new: Snapshot | None) -> float | None:
    """The engine core's mean inter-token latency between two snapshots: its own step time while
    requests decode, without the API server's and HTTP's part of what a client measures (None:
    a snapshot is missing, or no token came in between)."""
    if old is None or new is None or new.itl_count <= old.itl_count:
        return None
    return (new.itl_sum_s - old.itl_sum_s) / (new.itl_count - old.itl_count)


@dataclass(frozen=True)
class Window:
    """What happened between two snapshots."""
    seconds: float
    generation_tokens: float
    tokens_per_s: float
    num_first_tokens: int           # requests that got their first token in the window
    mean_ttft_s: float | None       # None: no request got its first token in the window
    num_finished: int               # requests that finished in the window
    mean_e2e_s: float | None        # None: no request finished in the window
    prefix_hit_rate: float | None = None   # hits / queries of the prefix cache in the window
                                           # (None: no prompt was looked up in the window)
    prefix_queries: float = 0.0     # prompt tokens looked up in the prefix cache in the window
    prefix_hits: float = 0.0        # of them found cached


def window(old: Snapshot, new: Snapshot) -> Window | None:
    """Rates and means between two snapshots; None when a counter went backwards (the server
    restarted in between, so the difference means nothing) or no time passed."""
    seconds = new.time_s - old.time_s
    counters = [(old.generation_tokens, new.generation_tokens), (old.ttft_count, new.ttft_count),
                (old.e2e_count, new.e2e_count)]
    if seconds <= 0 or any(b < a for a, b in counters):
        return None
    tokens = new.generation_tokens - old.generation_tokens
    num_first = int(new.ttft_count - old.ttft_count)
    num_finished = int(new.e2e_count - old.e2e_count)
    queries = new.prefix_queries - old.prefix_queries
    return Window(seconds=seconds, generation_tokens=tokens, tokens_per_s=tokens / seconds,
                  num_first_tokens=num_first,
                  mean_ttft_s=(new.ttft_sum_s - old.ttft_sum_s) / num_first if num_first else None,
                  num_finished=num_finished,
                  mean_e2e_s=(new.e2e_sum_s - old.e2e_sum_s) / num_finished if num_finished else None,
                  prefix_hit_rate=(new.prefix_hits - old.prefix_hits) / queries
                                  if queries > 0 else None,
                  prefix_queries=queries, prefix_hits=new.prefix_hits - old.prefix_hits)


def info_labels(text: str, name: str) -> dict[str, str]:
    """The labels of an *_info gauge, e.g. vllm:cache_config_info (block size, KV tokens...)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (name, name + "_info") or family.name == name:
                return dict(sample.labels)
    return {}


def fetch(base_url: str, timeout: float = 5) -> str:
    resp = requests.get(f"{base_url}/metrics", timeout=timeout)
    resp.raise_for_status()
    return resp.text


class Sampler(Poller):
    """Samples running/waiting requests from /metrics in the background during a load run."""

    def __init__(self, base_url: str, interval_s: float = 0.2):
        super().__init__(interval_s)
        self.base_url = base_url
        self.max_running = 0
        self.max_waiting = 0
        self.num_samples = 0

    def poll(self) -> None:
        try:
            values = parse(fetch(self.base_url, timeout=2))
        except (requests.RequestException, ValueError):
            return
        self.num_samples += 1
        self.max_running = max(self.max_running, int(values.get("vllm:num_requests_running", 0)))
        self.max_waiting = max(self.max_waiting, int(values.get("vllm:num_requests_waiting", 0)))
